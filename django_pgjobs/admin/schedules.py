"""The schedule admin: every schedule with its last tick, next ticks and last job; operators'
schedules created and edited here; pause, resume and run-now behind their own permissions.

Schedules declared in code or in PGJOBS_SCHEDULES are read-only here (the sync at worker start
owns their definition); operators may still pause, resume and run them. Every save and every
action is audited in its own transaction (``schedules``), and payloads show redacted to anyone
without ``pgjobs.view_raw_payload``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.forms import ModelForm
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import schedules, transitions
from ..conf import settings
from ..enqueuing import encode_payload
from ..exceptions import EnqueueError, PayloadNotJSON
from ..models import Job, OperatorAction, Schedule
from ..payloads import INT_MAX_ABS
from ..registry import redactor_for, registry
from ..status import ScheduleSource
from ..ticks import zone
from ..validation import nesting_problem
from .actions import (
    SCHEDULE_ACTION_STATES,
    SCHEDULE_ACTIONS,
    SCHEDULE_BUTTONS,
    Action,
    schedule_states,
)
from .base import OwnLookupsOnly, RefuseForgedActions
from .display import duration_text, exact_id, parse_ids, pretty, searchable, time_column, time_text

NEXT_TICKS_SHOWN = 5
ACTION_MAX_SCHEDULES = 1000
# The list shows this much of a failing schedule's error; its page shows all of it.
ERROR_SHOWN_MAX_CHARS = 120
_STATUS_FIELDS = ("state_shown", "last_error_shown", "source", "next_ticks_shown",
                  "last_tick_shown", "last_job", "ticks_enqueued", "ticks_missed",
                  "ticks_skipped", "last_skipped_at_shown", "last_skip_reason",
                  "operator_history", "created_at_shown", "updated_at_shown")
# An integer of more digits than this is beyond INT_MAX_ABS (JSON writes no leading zeros).
_INT_MAX_DIGITS = len(str(INT_MAX_ABS))


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("active", "active"), ("paused", "paused"), ("retired", "retired"),
                ("failing", "failing")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value == "active":
            return queryset.filter(paused_at__isnull=True, retired_at__isnull=True)
        if value == "paused":
            return queryset.filter(paused_at__isnull=False, retired_at__isnull=True)
        if value == "retired":
            return queryset.filter(retired_at__isnull=False)
        if value == "failing":  # no index: schedules are few, and this reads them all
            return queryset.exclude(last_error="")
        return queryset


def _integer(text: str) -> int:
    # int() refuses more than 4,300 digits (a ValueError, not a parse error). Any integer longer
    # than INT_MAX_ABS is beyond it: the bound stands in, and enqueue's rule refuses it by path.
    if len(text.lstrip("-")) > _INT_MAX_DIGITS:
        return -INT_MAX_ABS if text.startswith("-") else INT_MAX_ABS
    return int(text)


class PayloadDecoder(json.JSONDecoder):
    """JSON's reader, but an integer too long for ``int()`` is read as the bound it passes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "parse_int": _integer})


class PayloadField(forms.JSONField):
    """A payload typed as JSON, held as it is read to enqueue's rule (``encode_payload``).

    Python's reader alone would fail the request on an integer of thousands of digits or text
    nested thousands deep; a refused payload shows again as typed, since a lone surrogate read
    from its escape could not be written into the page.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(decoder=PayloadDecoder, **kwargs)

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:  # near 1,000 levels: PGJOBS_MAX_PAYLOAD_DEPTH is at most that
            raise forms.ValidationError(str(PayloadNotJSON(
                "payload", nesting_problem(settings.MAX_PAYLOAD_DEPTH)))) from None

    def validate(self, value: Any) -> None:
        super().validate(value)
        try:
            encode_payload(value)
        except EnqueueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        try:
            value = self.to_python(data)
            self.validate(value)
        except forms.ValidationError:
            return InvalidJSONInput(data)
        return value


class ScheduleForm(ModelForm):
    """An operator's schedule, held to the rules of a declared one before it is saved."""

    task = forms.ChoiceField(help_text="A registered handler.")
    payload = PayloadField(required=False, initial=dict,
                           help_text="JSON. Each job of the schedule gets this payload.")

    class Meta:
        model = Schedule
        fields = ("name", "task", "cron", "timezone", "payload", "queue", "priority", "misfire",
                  "catch_up_limit", "overlap")
        help_texts = {
            "cron": "5 fields (minute hour day month weekday), or 6 with seconds first.",
            "timezone": "An IANA zone, e.g. Europe/Paris. Ticks are computed in it.",
            "queue": "Empty: the handler's queue.",
            "priority": "Empty: the handler's priority.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "task" in self.fields:
            names = set(registry.names())
            if self.instance.task:
                names.add(self.instance.task)
            self.fields["task"].choices = [(n, n) for n in sorted(names)]  # type: ignore[attr-defined]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        row = Schedule(**{**{f: getattr(self.instance, f) for f in ("name", *schedules.DEFINITION)},
                          **{k: v for k, v in data.items()}})
        if row.payload is None:
            row.payload = {}
            data["payload"] = {}
        problem = schedules.row_problem(row)
        if problem is not None:
            raise forms.ValidationError(problem)
        return data


def schedule_action(action: Action) -> Any:
    """The admin action of one entry of ``SCHEDULE_ACTIONS``: it asks, then confirms."""

    def run(modeladmin: ScheduleAdmin, request: HttpRequest, queryset: QuerySet[Schedule]) -> Any:
        return modeladmin.confirm(request, queryset, action)

    run.__name__ = action.name
    return admin.action(permissions=[action.permission], description=action.description)(run)


@admin.register(Schedule)
class ScheduleAdmin(OwnLookupsOnly, RefuseForgedActions, admin.ModelAdmin):
    form = ScheduleForm
    # One line a schedule where it can: the next tick here, the next five on its page.
    list_display = ("name", "task", "when", "state_shown", "last_tick_shown", "next_tick_shown",
                    "last_job", "not_run")
    list_filter = (StateFilter, "source", "misfire", "overlap")
    search_fields = ("=name", "=task")
    search_help_text = "The first characters of a schedule's name or task, or its id."
    ordering = ("name",)
    list_per_page = 50
    actions = [schedule_action(a) for a in SCHEDULE_ACTIONS.values()]

    # --- permissions ---

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A declared schedule's definition is its code's or its settings': read-only here.
        if obj is not None and obj.source != ScheduleSource.ADMIN:
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # retired or paused, never deleted: jobs name their schedule

    def has_pause_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.pause_schedule")

    def has_resume_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.resume_schedule")

    def has_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.run_schedule")

    def sees_raw_payloads(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.view_raw_payload")

    # --- list and detail ---

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        # The last job's status in the same query: one row per schedule, no query per row.
        status = Job.objects.filter(pk=OuterRef("last_job_id")).values("status")[:1]
        return super().get_queryset(request).annotate(last_job_status=Subquery(status))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Schedule], search_term: str
    ) -> tuple[QuerySet[Schedule], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not searchable(term):
            return queryset.none(), False
        # One row per schedule: a prefix match reads a small table.
        condition = Q(name__startswith=term) | Q(task__startswith=term)
        if exact_id(term) is not None:
            condition |= Q(pk=exact_id(term))
        return queryset.filter(condition), False

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        definition = ["name", "task", "cron", "timezone", "payload", "queue", "priority",
                      "misfire", "catch_up_limit", "overlap"]
        if obj is not None and not self._payload_editable(request, obj):
            definition[definition.index("payload")] = "payload_shown"
        return definition if obj is None else [*definition, *_STATUS_FIELDS]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        if obj is None:
            return []
        readonly = list(_STATUS_FIELDS)
        if not self._payload_editable(request, obj):
            readonly.append("payload_shown")
        if not self.has_change_permission(request, obj):
            readonly += ["name", "task", "cron", "timezone", "payload", "queue", "priority",
                         "misfire", "catch_up_limit", "overlap"]
        elif not self.sees_raw_payloads(request) and _hides_values(obj):
            # The task says what its payload hides: another task would show what this editor
            # may not see, to them, to every viewer and on the jobs it makes.
            readonly.append("task")
        return readonly

    def _payload_editable(self, request: HttpRequest, obj: Schedule) -> bool:
        return self.has_change_permission(request, obj) and self.sees_raw_payloads(request)

    last_skipped_at_shown = time_column("last_skipped_at")
    created_at_shown = time_column("created_at")
    updated_at_shown = time_column("updated_at")

    @admin.display(description="when")
    def when(self, schedule: Schedule) -> str:
        return f"{schedule.cron} ({schedule.timezone})"

    @admin.display(description="state")
    def state_shown(self, schedule: Schedule) -> str:
        if not schedule.last_error:
            return schedule.state
        error = schedule.last_error
        if len(error) > ERROR_SHOWN_MAX_CHARS:
            error = error[: ERROR_SHOWN_MAX_CHARS - 1] + "…"
        return format_html('{}<br><span class="pgjobs-failing">failing: {} ({})</span>',
                           schedule.state, error, time_text(schedule.last_error_at))

    @admin.display(description="last error")
    def last_error_shown(self, schedule: Schedule) -> str:
        if not schedule.last_error:
            return "-"
        return format_html("{} ({})", schedule.last_error, time_text(schedule.last_error_at))

    @admin.display(description="last tick", ordering="last_tick_at")
    def last_tick_shown(self, schedule: Schedule) -> str:
        return time_text(schedule.last_tick_at, zone(schedule.timezone))

    @admin.display(description=f"next {NEXT_TICKS_SHOWN} ticks")
    def next_ticks_shown(self, schedule: Schedule) -> str:
        if schedule.state != "active":
            return schedule.state  # a paused or retired schedule has no next tick
        ticks = schedules.upcoming_ticks(schedule, NEXT_TICKS_SHOWN, timezone.now())
        if not ticks:
            return "-"
        return format_html_join(mark_safe("<br>"), "{}",
                                ((time_text(t, zone(schedule.timezone)),) for t in ticks))

    @admin.display(description="next tick")
    def next_tick_shown(self, schedule: Schedule) -> str:
        if schedule.state != "active":
            return schedule.state
        now = timezone.now()
        ticks = schedules.upcoming_ticks(schedule, 1, now)
        if not ticks:
            return "-"
        return format_html("{}<br><small>in {}</small>",
                           time_text(ticks[0], zone(schedule.timezone)),
                           duration_text((ticks[0] - now).total_seconds()))

    @admin.display(description="jobs")
    def last_job(self, schedule: Schedule) -> str:
        every = f"{reverse('admin:pgjobs_job_changelist')}?{urlencode({'schedule': schedule.pk})}"
        if schedule.last_job_id is None:
            return format_html('<a href="{}">all</a>', every)
        status = getattr(schedule, "last_job_status", None) or "pruned"
        url = reverse("admin:pgjobs_job_change", args=[schedule.last_job_id])
        return format_html('last <a href="{}">#{}</a> {}<br><a href="{}">all</a>', url,
                           schedule.last_job_id, status, every)

    @admin.display(description="missed, skipped")
    def not_run(self, schedule: Schedule) -> str:
        return f"{schedule.ticks_missed} / {schedule.ticks_skipped}"

    @admin.display(description="payload (redacted)")
    def payload_shown(self, schedule: Schedule) -> str:
        return format_html("<pre>{}</pre>",
                           pretty(redactor_for(schedule.task).payload(schedule.payload)))

    @admin.display(description="history")
    def operator_history(self, schedule: Schedule) -> str:
        actions = OperatorAction.objects.filter(
            schedule_ids__contains=[schedule.pk]).order_by("-id")[:20]
        rows = [(time_text(a.created_at), a.get_action_display(),
                 a.actor_name or "(code)", a.reason or "") for a in actions]
        if not rows:
            return "-"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{} {} by {} {}</li>", rows))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {"schedule_actions": self._schedule_actions(request, object_id),
                   **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def _schedule_actions(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        """The actions this user may take on this schedule in its state, as buttons: each
        opens the same plan and confirmation as from the list."""
        schedule = Schedule.objects.filter(pk=object_id).only("paused_at", "retired_at").first() \
            if object_id.isdigit() else None
        if schedule is None:
            return []
        allowed = self.get_actions(request)
        return [(name, label) for name, label in SCHEDULE_BUTTONS.items()
                if schedule.state in SCHEDULE_ACTION_STATES[name] and name in allowed]

    # --- saving ---

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        before = None
        if change:
            stored = Schedule.objects.get(pk=obj.pk)
            before = {f: getattr(stored, f) for f in schedules.DEFINITION}
        schedules.save_schedule(obj, created=not change, before=before,
                               actor=transitions.Actor.of(request.user))

    # --- actions ---

    def confirm(
        self, request: HttpRequest, queryset: QuerySet[Schedule], action: Action
    ) -> HttpResponse | None:
        """Show what ``action`` will do; on the confirming POST, do it and return None."""
        if action.name not in self.get_actions(request):
            raise PermissionDenied
        confirming = request.POST.get("pgjobs_confirm") == "yes"
        if confirming:
            requested = parse_ids(request.POST.get("pgjobs_ids", ""))
            ids = list(Schedule.objects.filter(pk__in=requested[:ACTION_MAX_SCHEDULES + 1])
                       .order_by("id").values_list("id", flat=True))
        else:
            ids = list(queryset.order_by("id").values_list("id", flat=True)[
                : ACTION_MAX_SCHEDULES + 1])
        if len(ids) > ACTION_MAX_SCHEDULES:
            self.message_user(request, f"Select at most {ACTION_MAX_SCHEDULES} schedules.",
                              messages.ERROR)
            return None
        if not ids:
            self.message_user(request, "No schedule selected.", messages.WARNING)
            return None
        form = action.form(request.POST if confirming else None, jobs=len(ids))
        if confirming and form.is_valid():
            try:
                text = action.apply(ids, form.cleaned_data, transitions.Actor.of(request.user))
            except ValueError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
            self.message_user(request, text, messages.SUCCESS)
            return None
        plan = action.plan(ids, schedule_states(ids))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": plan.title,
            "plan": plan, "form": form, "action": action.name, "ids": ",".join(map(str, ids)),
            "first_id": ids[0], "selected": len(ids), "noun": "schedule",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/pgjobs/job/confirm_action.html", context)


def _hides_values(schedule: Schedule) -> bool:
    """Whether ``schedule``'s payload has values its task's redaction hides."""
    return bool(redactor_for(schedule.task).payload(schedule.payload) != schedule.payload)
