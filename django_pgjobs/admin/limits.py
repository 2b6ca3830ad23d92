"""Limits set by operators: one key's max_running, or one rate key's rate, in place of its
handler's (docs/limits.md).

Its list shows every limit key in use first (holders, limit, waiting jobs, the oldest wait),
then the operators' rows. Adding or changing one needs Django's ``add_keylimit`` or
``change_keylimit`` permission, and goes through ``transitions.set_key_limit`` (or
``set_key_rate``): the key's slots follow, a raised limit readies waiting jobs at once, a rate's
next job is timed again, and the change is audited with its reason.
Nothing is deleted here: a lowered limit is how an operator gives a key less.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from .. import stats, transitions
from ..exceptions import InvalidJobOption
from ..limits import Rate
from ..models import KeyLimit
from ..registry import registry
from ..validation import MAX_RUNNING_LIMIT, limit_key_problem, max_running_problem
from .display import duration_text, time_text

KEYS_SHOWN = 100


class KeyLimitForm(forms.ModelForm):
    reason = forms.CharField(required=False, max_length=500,
                             help_text="Kept in the audit log with the change.")

    class Meta:
        model = KeyLimit
        fields = ["key", "max_running", "rate_count", "rate_per_seconds", "rate_burst"]
        help_texts = {
            "key": "A job's limit key: the limit's name, ':' and the key "
                   "(exports.run:acme). pgjobs_stats lists the keys in use.",
            "max_running": f"A Limit's key: at most this many of the key's jobs ready or running "
                           f"at once (1 to {MAX_RUNNING_LIMIT}).",
            "rate_count": "A Rate's key: at most this many starts...",
            "rate_per_seconds": "...per this many seconds...",
            "rate_burst": "...and this many at once after a quiet spell (1: evenly spaced).",
        }

    def clean_key(self) -> str:
        key = self.cleaned_data["key"]
        problem = limit_key_problem(key)
        if problem is not None:
            raise forms.ValidationError(f"key {problem}")
        return str(key)

    def clean_max_running(self) -> int | None:
        value = self.cleaned_data["max_running"]
        if value is None:
            return None
        problem = max_running_problem(value)
        if problem is not None:
            raise forms.ValidationError(f"max_running {problem}")
        return int(value)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        key = data.get("key") or (self.instance.key if self.instance.pk else None)
        rate = [data.get(name) for name in ("rate_count", "rate_per_seconds", "rate_burst")]
        if key is None:
            return data
        if registry.rate_of(key) is not None:
            count, per, burst = rate
            if data.get("max_running") is not None or count is None or per is None:
                raise forms.ValidationError(
                    "This is a Rate's key: give its rate (starts per seconds, and a burst), "
                    "not a max_running.")
            try:
                Rate(count, per=per, burst=1 if burst is None else burst)
            except InvalidJobOption as exc:
                raise forms.ValidationError(str(exc)) from exc
            data["rate_burst"] = 1 if rate[2] is None else rate[2]
        elif data.get("max_running") is None or any(v is not None for v in rate):
            raise forms.ValidationError(
                "This is a Limit's key: give its max_running, and no rate.")
        return data


@admin.register(KeyLimit)
class KeyLimitAdmin(admin.ModelAdmin):
    form = KeyLimitForm
    list_display = ("key", "max_running", "rate_shown", "changed_by", "changed")
    search_fields = ("key",)
    ordering = ("key",)

    @admin.display(description="rate")
    def rate_shown(self, row: KeyLimit) -> str:
        return row.rate or "-"

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
        actor = transitions.Actor.of(request.user)
        reason = form.cleaned_data.get("reason", "")
        if obj.max_running is None:
            assert obj.rate_count is not None and obj.rate_per_seconds is not None
            transitions.set_key_rate(obj.key, obj.rate_count, obj.rate_per_seconds,
                                     burst=obj.rate_burst or 1, actor=actor, reason=reason)
        else:
            transitions.set_key_limit(obj.key, obj.max_running, actor=actor, reason=reason)
        obj.refresh_from_db()


def _seconds_text(seconds: float | None) -> str:
    return "-" if seconds is None else duration_text(seconds)
