"""Limits set by operators: one key's max_running in place of its handler's (docs/limits.md).

Its list shows every limit key in use first (holders, limit, waiting jobs, the oldest wait),
then the operators' rows. Adding or changing one needs Django's ``add_keylimit`` or
``change_keylimit`` permission, and goes through ``transitions.set_key_limit``: the key's slots
follow, a raised limit readies waiting jobs at once, and the change is audited with its reason.
Nothing is deleted here: a lowered limit is how an operator gives a key less.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from .. import stats, transitions
from ..models import KeyLimit
from ..validation import MAX_RUNNING_LIMIT, limit_key_problem, max_running_problem
from .display import duration_text, time_text

KEYS_SHOWN = 100


class KeyLimitForm(forms.ModelForm):
    reason = forms.CharField(required=False, max_length=500,
                             help_text="Kept in the audit log with the change.")

    class Meta:
        model = KeyLimit
        fields = ["key", "max_running"]
        help_texts = {
            "key": "A job's limit key: the limit's name, ':' and the key "
                   "(exports.run:acme). pgjobs_stats lists the keys in use.",
            "max_running": f"At most this many of the key's jobs ready or running at once "
                           f"(1 to {MAX_RUNNING_LIMIT}).",
        }

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        problem = limit_key_problem(key)
        if problem is not None:
            raise forms.ValidationError(f"key {problem}")
        return str(key)

    def clean_max_running(self) -> int:
        value = self.cleaned_data["max_running"]
        problem = max_running_problem(value)
        if problem is not None:
            raise forms.ValidationError(f"max_running {problem}")
        return int(value)


@admin.register(KeyLimit)
class KeyLimitAdmin(admin.ModelAdmin):
    form = KeyLimitForm
    list_display = ("key", "max_running", "changed_by", "changed")
    search_fields = ("key",)
    ordering = ("key",)

    @admin.display(description="changed", ordering="changed_at")
    def changed(self, row: KeyLimit) -> str:
        return time_text(row.changed_at)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Above the operators' rows: every key in use, as pgjobs_stats lists them.
        keys = [{**asdict(key), "rate": key.rate,
                 "oldest_waiting": _seconds_text(key.oldest_waiting_seconds),
                 "next_start": ("now" if key.rate and not key.next_start_seconds
                                else _seconds_text(key.next_start_seconds)),
                 "held_back": _seconds_text(key.held_back_seconds)}
                for key in stats.key_limits(limit=KEYS_SHOWN)]
        return super().changelist_view(request, {
            **(extra_context or {}), "keys_in_use": keys, "keys_shown": KEYS_SHOWN})

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return ("key",) if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: KeyLimit, form: Any, change: bool) -> None:
        # The transition writes the row, its slots and the audit in one transaction.
        transitions.set_key_limit(obj.key, obj.max_running,
                                  actor=transitions.Actor.of(request.user),
                                  reason=form.cleaned_data.get("reason", ""))
        obj.refresh_from_db()


def _seconds_text(seconds: float | None) -> str:
    return "-" if seconds is None else duration_text(seconds)
