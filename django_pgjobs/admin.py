"""Read-only admins for jobs, attempts, receipts and the audit trail, and operator actions.

Nothing here writes a job: every action confirms what it will do, then calls an operator
transition in ``transitions.py``, which applies it under its state guard and writes the audit
row in the same transaction. Payloads, results, errors and tracebacks are shown redacted; the
raw payload is a separate, permissioned and audited page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import EmptyResultSet, PermissionDenied
from django.core.paginator import Paginator
from django.db import connections, transaction
from django.db.models import Count, Q, QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    JsonResponse,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join

from . import sql, transitions
from .conf import settings
from .models import Attempt, IdempotencyReceipt, Job, OperatorAction
from .registry import redactor_for, registry
from .status import JobStatus

# The most jobs one action may touch: their ids travel in the confirmation page.
ACTION_MAX_JOBS = 10_000
# Above this many rows (by the planner's estimate) the changelist shows the estimate.
EXACT_COUNT_MAX_ROWS = 100_000
PREVIEW_MAX_CHARS = 80
RECEIPTS_SHOWN = 50

_WAITING = (JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RETRYING)
_FINISHED = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)
_RETRYABLE = (JobStatus.DEAD, JobStatus.CANCELLED)


# --- display helpers --------------------------------------------------------------------------


def duration_text(seconds: float) -> str:
    """Say a duration the way an operator reads it: ``45s``, ``12m 5s``, ``3h 20m``, ``2d 4h``."""
    seconds = int(max(seconds, 0))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _is(n: int) -> str:
    return "is" if n == 1 else "are"


def _states(counts: dict[str, int], statuses: Iterable[str]) -> tuple[int, str]:
    """Total and ``"3 dead, 1 cancelled"`` for the given statuses, in state-machine order."""
    parts = [(s, counts[s]) for s in JobStatus.values if s in statuses and counts.get(s)]
    return sum(n for _, n in parts), ", ".join(f"{n} {s}" for s, n in parts)


class EstimatedCountPaginator(Paginator):
    """Count exactly when the planner expects few rows; beyond that, show its estimate.

    count(*) reads every matching row: over a big history that is seconds per page view.
    """

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if isinstance(queryset, QuerySet):
            estimate = planner_rows(queryset)
            if estimate > EXACT_COUNT_MAX_ROWS:
                return estimate
        return super().count


def planner_rows(queryset: QuerySet[Any]) -> int:
    """The number of rows the planner expects ``queryset`` to return (nothing is read)."""
    try:
        select_sql, params = queryset.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:  # queryset.none(), a search that cannot match: no query to plan
        return 0
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql.query("planner_rows").replace("{query}", select_sql), params)
        row = cursor.fetchone()
    assert row is not None
    plan = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return int(plan[0]["Plan"]["Plan Rows"])


# --- filters ----------------------------------------------------------------------------------


class _KnownNamesFilter(admin.SimpleListFilter):
    """Filter on a name column, offering the names the code knows (plus the one chosen).

    Known names, not SELECT DISTINCT: that would read every row of a big table.
    """

    def known_names(self) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = self.known_names()
        if self.value():
            names.add(str(self.value()))
        return [(n, n) for n in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(**{str(self.parameter_name): value}) if value else queryset


class QueueFilter(_KnownNamesFilter):
    title = "queue"
    parameter_name = "queue"

    def known_names(self) -> set[str]:
        if settings.QUEUES is not None:
            return set(settings.QUEUES)
        names = {settings.QUEUE, *transitions.ready_queues()}
        return names | {h.queue for h in map(registry.get, registry.names()) if h and h.queue}


class TaskFilter(_KnownNamesFilter):
    title = "task"
    parameter_name = "task"

    def known_names(self) -> set[str]:
        return set(registry.names())


# --- action confirmation ----------------------------------------------------------------------


class ReasonForm(forms.Form):
    def __init__(self, *args: Any, jobs: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.jobs = jobs

    reason = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Recorded in the audit trail with your name.",
    )


class DeadLetterForm(ReasonForm):
    reason = forms.CharField(
        required=True, max_length=1000, widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text="Required. Stored as the jobs' last error and in the audit trail.",
    )


class ReplayForm(ReasonForm):
    KEEP, NEW, NONE = "keep", "new", "none"
    key_choice = forms.ChoiceField(
        label="Idempotency key", widget=forms.RadioSelect,
        choices=[
            (KEEP, "Keep it: the key moves from the original to the replay, so a later "
                   "enqueue with that key returns the replay."),
            (NEW, "Change it to the new key below (one job only)."),
            (NONE, "No key: the original keeps its key, so a later enqueue with it still "
                   "returns the original and does not run again."),
        ],
    )
    new_key = forms.CharField(required=False, max_length=255, label="New key")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("key_choice") == self.NEW:
            if self.jobs != 1:
                raise forms.ValidationError("A new key can be given to one replay at a time.")
            if not data.get("new_key", "").strip():
                raise forms.ValidationError("Type the new idempotency key.")
        return data


@dataclass
class Plan:
    """What an action will do, said before it is done."""

    title: str
    changes: list[str]
    unchanged: list[str]
    notes: list[str] = field(default_factory=list)
    receipts: list[tuple[str, str]] = field(default_factory=list)


def retry_plan(counts: dict[str, int]) -> Plan:
    n, states = _states(counts, _RETRYABLE)
    k, others = _states(counts, set(JobStatus.values) - set(_RETRYABLE))
    changes = [
        f"{_jobs(n)} ({states}) will go back to ready now, with attempts reset to 0 and a "
        "fresh max age." if n else "No selected job is dead or cancelled: nothing will change."
    ]
    unchanged = (
        [f"{_jobs(k)} ({others}) {_is(k)} not dead or cancelled and will not change."] if k else []
    )
    notes = ["Idempotency receipts are kept: a side effect these jobs completed under a receipt "
             "will not repeat."]
    return Plan("Retry jobs", changes, unchanged, notes)


def cancel_plan(counts: dict[str, int], already_asked: int) -> Plan:
    n, states = _states(counts, _WAITING)
    running = counts.get(JobStatus.RUNNING, 0) - already_asked
    k, finished = _states(counts, _FINISHED)
    changes = []
    if n:
        changes.append(f"{_jobs(n)} ({states}) will be cancelled now and will not run.")
    if running:
        changes.append(
            f"{_jobs(running)} (running) will be asked to stop. A handler sees the request as "
            "ctx.cancel_requested after its next heartbeat and decides how to stop; its worker "
            "still settles the job. A handler without heartbeats, or that ignores the request, "
            "runs to its end."
        )
    if not changes:
        changes.append("No selected job is waiting or running: nothing will change.")
    unchanged = []
    if already_asked:
        was = "was" if already_asked == 1 else "were"
        unchanged.append(f"{_jobs(already_asked)} (running) {was} already asked to stop.")
    if k:
        unchanged.append(f"{_jobs(k)} ({finished}) {_is(k)} finished and will not change.")
    return Plan("Cancel jobs", changes, unchanged)


def dead_letter_plan(counts: dict[str, int]) -> Plan:
    n, states = _states(counts, _WAITING)
    k, others = _states(counts, set(JobStatus.values) - set(_WAITING))
    changes = [
        f"{_jobs(n)} ({states}) will move to dead now with the reason below; an operator can "
        "retry them later." if n else "No selected job is waiting: nothing will change."
    ]
    unchanged = [
        f"{_jobs(k)} ({others}) will not change: running jobs are left to their workers, "
        "finished jobs stay as they are."
    ] if k else []
    return Plan("Dead-letter jobs", changes, unchanged)


def replay_plan(counts: dict[str, int], receipts: Sequence[IdempotencyReceipt]) -> Plan:
    n, states = _states(counts, _FINISHED)
    k, others = _states(counts, set(JobStatus.values) - set(_FINISHED))
    again = "a new job" if n == 1 else f"{n} new jobs"
    changes = [
        f"{_jobs(n)} ({states}) will be enqueued again as {again} with the same payload, queue, "
        "priority and limits; the originals do not change (except that keeping the key moves "
        "it)." if n else "No selected job is finished: nothing will be replayed."
    ]
    unchanged = [
        f"{_jobs(k)} ({others}) {_is(k)} not finished and will not be replayed: retry or "
        "cancel instead."
    ] if k else []
    notes = [
        "Receipts are taken by the handler under a scope and key it computes; the job's "
        "idempotency key does not choose them, so this choice does not change which receipts "
        "protect the replay. A receipt protects it only if the handler computes the same scope "
        "and key from the payload (not from the job id, which is new) and the receipt has not "
        "expired when the replay runs."
    ]
    now = timezone.now()
    shown = []
    for receipt in receipts[:RECEIPTS_SHOWN]:
        if receipt.expires_at <= now:
            verdict = f"will not protect it: expired at {receipt.expires_at:%Y-%m-%d %H:%M:%S}"
        else:
            verdict = (
                f"protects it until {receipt.expires_at:%Y-%m-%d %H:%M:%S} if the handler "
                "computes the same key"
            )
        shown.append((f"{receipt.scope}:{receipt.key} (job {receipt.job_id})", verdict))
    if not receipts:
        notes.append("The selected jobs wrote no receipts: nothing protects their side effects "
                     "from repeating.")
    elif len(receipts) > RECEIPTS_SHOWN:
        notes.append(f"Only the first {RECEIPTS_SHOWN} receipts are listed.")
    return Plan("Replay jobs", changes, unchanged, notes, shown)


def _parse_ids(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    ids = {exact_id(part) for part in parts}
    if None in ids:
        raise PermissionDenied("malformed job ids")
    return sorted(i for i in ids if i is not None)


def _status_counts(ids: Sequence[int]) -> dict[str, int]:
    rows = Job.objects.filter(pk__in=ids).values_list("status").annotate(n=Count("id"))
    return dict(rows)


def _actor(request: HttpRequest) -> transitions.Actor:
    return transitions.Actor.of(request.user)


# --- admins ------------------------------------------------------------------------------------


class AttemptInline(admin.TabularInline):
    model = Attempt
    fk_name = "job"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("number",)
    fields = ("number", "worker_id", "outcome", "failure_class", "duration", "claimed_at",
              "finished_at", "error_shown")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attempt]:
        # The job is needed to scrub its payload's secrets out of each error.
        return super().get_queryset(request).select_related("job")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("pgjobs.view_job")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        return "-" if attempt.duration_ms is None else f"{attempt.duration_ms} ms"

    @admin.display(description="error")
    def error_shown(self, attempt: Attempt) -> str:
        return attempt_error_html(attempt, attempt.job)


def attempt_error_html(attempt: Attempt, job: Job) -> str:
    """The attempt's error and collapsed traceback, with the job's secrets scrubbed out."""
    redactor = redactor_for(job.task)
    error = redactor.text(attempt.error, job.payload)
    if not attempt.traceback:
        return format_html("{}", error or "-")
    return format_html(
        '{}<details><summary>traceback</summary><pre class="pgjobs-traceback">{}</pre></details>',
        error or "-", redactor.text(attempt.traceback, job.payload),
    )


def searchable(term: str) -> bool:
    """Whether a search term can be sent as a parameter at all (PostgreSQL text has no NUL)."""
    return "\x00" not in term


def exact_id(term: str) -> int | None:
    """``term`` as a primary key, or None when it is not one (``"²"`` is a digit but no id)."""
    if term.isascii() and term.isdigit() and int(term) < 2**63:
        return int(term)
    return None


class ReadOnlyAdmin(admin.ModelAdmin):
    """Visible with the view permission; nothing can be added, changed or deleted here.

    The list accepts only the query-string lookups its own filters produce. Django's default
    lets any viewer filter on any field (``?payload__password__startswith=P``), which would read
    redacted values one character at a time and scan the whole history; anything else is
    refused with 400, the way Django refuses a disallowed lookup.
    """

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in self.allowed_lookups(request)

    def allowed_lookups(self, request: HttpRequest | None) -> set[str]:
        """The query-string parameters this admin's list filters and date hierarchy use."""
        allowed: set[str] = set()
        filters = self.get_list_filter(request) if request is not None else self.list_filter
        for item in filters:
            if isinstance(item, type) and issubclass(item, admin.SimpleListFilter):
                allowed.add(str(item.parameter_name))
                continue
            name = item[0] if isinstance(item, list | tuple) else item
            # A field's list filter (choices, boolean, all values) says field__exact and
            # field__isnull; nothing more.
            allowed |= {f"{name}__exact", f"{name}__isnull"}
        if self.date_hierarchy:
            allowed |= {f"{self.date_hierarchy}__{part}" for part in ("year", "month", "day")}
        return allowed

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = ("id", "task", "queue", "status", "attempts_used", "age", "lease",
                    "failure_class", "payload_preview")
    list_filter = ("status", QueueFilter, TaskFilter, "failure_class")
    search_fields = ("=id", "=idempotency_key", "=trace_id")
    search_help_text = "Exact job id, idempotency key or trace id."
    ordering = ("-id",)
    inlines = [AttemptInline]
    actions = ["retry_selected", "replay_selected", "cancel_selected", "dead_letter_selected",
               "export_selected"]
    readonly_fields = ("payload_shown", "result_shown", "error_shown", "operator_history")
    fieldsets = (
        (None, {"fields": ("id", "task", "queue", "status", "terminal_reason", "failure_class",
                           "priority", "base_priority")}),
        ("Payload (redacted)", {"fields": ("payload_shown", "payload_version", "result_shown")}),
        ("Last error (redacted)", {"fields": ("error_shown",)}),
        ("Attempts and times", {"fields": ("attempts", "max_attempts", "snoozes", "run_at",
                                           "deadline", "created_at", "started_at", "finished_at",
                                           "updated_at")}),
        ("Lease", {"fields": ("lease_owner", "lease_token", "lease_seconds", "lease_expires_at",
                              "heartbeat_at", "cancel_requested_at")}),
        ("Identity", {"fields": ("idempotency_key", "trace_id", "fairness_key")}),
        ("Operator actions", {"fields": ("operator_history",)}),
    )

    # --- permissions (the action decorators name these) ---

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.retry_job")

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.replay_job")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.cancel_job")

    def has_deadletter_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("pgjobs.deadletter_job")

    def has_raw_payload_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request) and request.user.has_perm(
            "pgjobs.view_raw_payload"
        )

    # --- list ---

    @admin.display(description="attempts", ordering="attempts")
    def attempts_used(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="age", ordering="created_at")
    def age(self, job: Job) -> str:
        return duration_text((timezone.now() - job.created_at).total_seconds())

    @admin.display(description="lease expiry", ordering="lease_expires_at")
    def lease(self, job: Job) -> str:
        if job.lease_expires_at is None:
            return "-"
        left = (job.lease_expires_at - timezone.now()).total_seconds()
        return f"in {duration_text(left)}" if left >= 0 else f"expired {duration_text(-left)} ago"

    @admin.display(description="payload (redacted)")
    def payload_preview(self, job: Job) -> str:
        text = json.dumps(redactor_for(job.task).payload(job.payload), ensure_ascii=False)
        return text if len(text) <= PREVIEW_MAX_CHARS else text[: PREVIEW_MAX_CHARS - 1] + "…"

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not searchable(term):
            return queryset.none(), False
        # Exact matches only, each answered by an index: the primary key, the trace index, and
        # the idempotency-key index probed once per task.
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(sql.query("jobs_by_idempotency_key"), [term])
            keyed = [row[0] for row in cursor.fetchall()]
        condition = Q(trace_id=term) | Q(pk__in=keyed)
        job_id = exact_id(term)
        if job_id is not None:
            condition |= Q(pk=job_id)
        return queryset.filter(condition), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST":
            # Django answers an action it does not offer with a "no action selected" message;
            # a forged POST for an action this user may not run is refused outright.
            allowed = self.get_actions(request)
            if any(name and name not in allowed for name in request.POST.getlist("action")):
                raise PermissionDenied
        context = {"dashboard_url": reverse("admin:pgjobs_job_dashboard"), **(extra_context or {})}
        return super().changelist_view(request, context)

    # --- detail ---

    @admin.display(description="payload")
    def payload_shown(self, job: Job) -> str:
        return format_html("<pre>{}</pre>", _pretty(redactor_for(job.task).payload(job.payload)))

    @admin.display(description="result")
    def result_shown(self, job: Job) -> str:
        if job.result is None:
            return "-"
        return format_html("<pre>{}</pre>", _pretty(redactor_for(job.task).payload(job.result)))

    @admin.display(description="last error")
    def error_shown(self, job: Job) -> str:
        text = redactor_for(job.task).text(job.last_error, job.payload)
        return format_html("<pre>{}</pre>", text) if text else "-"

    @admin.display(description="history")
    def operator_history(self, job: Job) -> str:
        actions = OperatorAction.objects.filter(job_ids__contains=[job.pk]).order_by("-id")[:20]
        rows = [
            (a.created_at.strftime("%Y-%m-%d %H:%M:%S"), a.get_action_display(),
             a.actor_name or "(code)", a.reason or "")
            for a in actions
        ]
        if not rows:
            return "-"
        return format_html(
            "<ul>{}</ul>", format_html_join("", "<li>{} {} by {} {}</li>", rows)
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {"can_view_raw_payload": self.has_raw_payload_permission(request),
                   **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[URLPattern]:
        site = self.admin_site
        return [
            path("dashboard/", site.admin_view(self.dashboard_view),
                 name="pgjobs_job_dashboard"),
            path("<path:object_id>/raw-payload/", site.admin_view(self.raw_payload_view),
                 name="pgjobs_job_raw_payload"),
            *super().get_urls(),
        ]

    def raw_payload_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Show one job's unredacted payload and result; the look is audited.

        A GET (or HEAD) only asks; the payload is shown on the POST that answers, under the
        CSRF check, so a link from elsewhere or a prefetch cannot write audit rows.
        """
        if not self.has_raw_payload_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        job = self.get_object(request, object_id)
        if job is None:
            raise Http404("no such job")
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "opts": self.opts, "job": job,
            "title": f"Raw payload of job {job.pk}", "revealed": request.method == "POST",
        }
        if request.method == "POST":
            transitions.record_raw_payload_view(job.pk, actor=_actor(request))
            context["payload"] = _pretty(job.payload)
            context["result"] = None if job.result is None else _pretty(job.result)
        return TemplateResponse(request, "admin/pgjobs/job/raw_payload.html", context)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The operations dashboard."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        from .dashboard import dashboard_context

        context = {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": "Job queue dashboard", **dashboard_context(),
        }
        return TemplateResponse(request, "admin/pgjobs/job/dashboard.html", context)

    # --- actions ---

    @admin.action(permissions=["retry"], description="Retry selected dead or cancelled jobs")
    def retry_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        return self._confirm(request, queryset, "retry_selected", ReasonForm)

    @admin.action(permissions=["replay"], description="Replay selected finished jobs as new jobs")
    def replay_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        return self._confirm(request, queryset, "replay_selected", ReplayForm)

    @admin.action(permissions=["cancel"], description="Cancel selected jobs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        return self._confirm(request, queryset, "cancel_selected", ReasonForm)

    @admin.action(permissions=["deadletter"], description="Dead-letter selected waiting jobs")
    def dead_letter_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        return self._confirm(request, queryset, "dead_letter_selected", DeadLetterForm)

    @admin.action(permissions=["view"], description="Export selected jobs as JSON (redacted)")
    def export_selected(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse:
        rows = []
        for job in queryset.order_by("id")[:ACTION_MAX_JOBS]:
            redactor = redactor_for(job.task)
            rows.append({
                "id": job.pk, "task": job.task, "queue": job.queue, "status": job.status,
                "attempts": job.attempts, "max_attempts": job.max_attempts,
                "failure_class": job.failure_class, "terminal_reason": job.terminal_reason,
                "idempotency_key": job.idempotency_key, "trace_id": job.trace_id,
                "created_at": job.created_at, "finished_at": job.finished_at,
                "payload": redactor.payload(job.payload),
                "result": redactor.payload(job.result),
                "last_error": redactor.text(job.last_error, job.payload),
            })
        response = JsonResponse({"jobs": rows}, json_dumps_params={"indent": 2})
        response["Content-Disposition"] = 'attachment; filename="pgjobs-jobs.json"'
        return response

    def _confirm(
        self, request: HttpRequest, queryset: QuerySet[Job], action: str,
        form_class: type[ReasonForm],
    ) -> HttpResponse | None:
        """Show what ``action`` will do; on the confirming POST, do it and return None."""
        if action not in self.get_actions(request):
            raise PermissionDenied
        confirming = request.POST.get("pgjobs_confirm") == "yes"
        if confirming:
            # Ids of jobs that do not exist (pruned since the confirmation page, or forged) are
            # dropped here, so the audit row names only jobs the action could have touched.
            requested = _parse_ids(request.POST.get("pgjobs_ids", ""))[: ACTION_MAX_JOBS + 1]
            ids = requested if len(requested) > ACTION_MAX_JOBS else list(
                Job.objects.filter(pk__in=requested).order_by("id").values_list("id", flat=True)
            )
        else:
            ids = list(queryset.order_by("id").values_list("id", flat=True)[: ACTION_MAX_JOBS + 1])
        if len(ids) > ACTION_MAX_JOBS:
            self.message_user(request, f"Select at most {ACTION_MAX_JOBS} jobs for one action "
                              "(narrow the filter).", messages.ERROR)
            return None
        if not ids:
            self.message_user(request, "No job selected.", messages.WARNING)
            return None
        counts = _status_counts(ids)
        form = form_class(request.POST if confirming else None, jobs=len(ids))
        if confirming and form.is_valid():
            try:
                text = self._apply(request, action, ids, form.cleaned_data)
            except ValueError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
            self.message_user(request, text, messages.SUCCESS)
            return None
        if action == "retry_selected":
            plan = retry_plan(counts)
        elif action == "cancel_selected":
            asked = Job.objects.filter(
                pk__in=ids, status=JobStatus.RUNNING, cancel_requested_at__isnull=False
            ).count()
            plan = cancel_plan(counts, asked)
        elif action == "dead_letter_selected":
            plan = dead_letter_plan(counts)
        else:
            finished = list(
                Job.objects.filter(pk__in=ids, status__in=_FINISHED).values_list("id", flat=True)
            )
            receipts = list(
                IdempotencyReceipt.objects.filter(job_id__in=finished)
                .order_by("id")[: RECEIPTS_SHOWN + 1]
            )
            plan = replay_plan(counts, receipts)
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": plan.title,
            "plan": plan, "form": form, "action": action, "ids": ",".join(map(str, ids)),
            "first_id": ids[0], "selected": len(ids),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/pgjobs/job/confirm_action.html", context)

    def _apply(
        self, request: HttpRequest, action: str, ids: list[int], data: dict[str, Any]
    ) -> str:
        actor, reason = _actor(request), data.get("reason", "").strip()
        if action == "retry_selected":
            n = transitions.retry_jobs(ids, actor=actor, reason=reason)
            return f"Retried {_jobs(n)}: ready now with a fresh attempt budget."
        if action == "cancel_selected":
            cancelled, asked = transitions.cancel_jobs(ids, actor=actor, reason=reason)
            return f"Cancelled {_jobs(cancelled)}; asked {_jobs(asked)} (running) to stop."
        if action == "dead_letter_selected":
            n = transitions.dead_letter_jobs(ids, reason, actor=actor)
            return f"Moved {_jobs(n)} to dead."
        return self._replay(ids, data, actor, reason)

    def _replay(
        self, ids: list[int], data: dict[str, Any], actor: transitions.Actor, reason: str
    ) -> str:
        choice = data["key_choice"]
        key: str | object | None = {
            ReplayForm.KEEP: transitions.KEEP_KEY, ReplayForm.NONE: None,
        }.get(choice, data.get("new_key", "").strip())
        originals = list(Job.objects.filter(pk__in=ids, status__in=_FINISHED).order_by("id"))
        # All or none: a key that turns out to be taken rolls back the replays before it.
        with transaction.atomic():
            replays = [
                transitions.replay_job(job, idempotency_key=key, actor=actor, reason=reason)
                for job in originals
            ]
        made = ", ".join(f"{o.pk} → {r.pk}" for o, r in zip(originals, replays, strict=True))
        return f"Replayed {_jobs(len(replays))} as new jobs ({made})." if replays else (
            "No selected job is finished: nothing was replayed."
        )


@admin.register(Attempt)
class AttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "job_link", "task", "number", "worker_id", "outcome", "failure_class",
                    "duration", "claimed_at")
    list_filter = ("outcome", "failure_class")
    list_select_related = ("job",)
    search_fields = ("=job__id",)
    search_help_text = "Exact job id."
    ordering = ("-id",)
    fields = ("job_link", "number", "worker_id", "lease_token", "claimed_at", "finished_at",
              "outcome", "reported_outcome", "failure_class", "duration", "error_shown")
    readonly_fields = ("job_link", "duration", "error_shown")

    @admin.display(description="job", ordering="job_id")
    def job_link(self, attempt: Attempt) -> str:
        url = reverse("admin:pgjobs_job_change", args=[attempt.job_id])
        return format_html('<a href="{}">{}</a>', url, attempt.job_id)

    @admin.display(description="task")
    def task(self, attempt: Attempt) -> str:
        return attempt.job.task

    @admin.display(description="duration")
    def duration(self, attempt: Attempt) -> str:
        return "-" if attempt.duration_ms is None else f"{attempt.duration_ms} ms"

    @admin.display(description="error (redacted)")
    def error_shown(self, attempt: Attempt) -> str:
        return attempt_error_html(attempt, attempt.job)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Attempt], search_term: str
    ) -> tuple[QuerySet[Attempt], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = exact_id(term)
        if job_id is None:
            return queryset.none(), False
        return queryset.filter(job_id=job_id), False


@admin.register(IdempotencyReceipt)
class IdempotencyReceiptAdmin(ReadOnlyAdmin):
    list_display = ("id", "scope", "key", "job_id", "created_at", "expires_at")
    search_fields = ("=scope", "=key")
    search_help_text = "Exact scope:key."
    ordering = ("-id",)
    fields = ("scope", "key", "job_id", "result_shown", "created_at", "expires_at")
    readonly_fields = ("job_id", "result_shown")

    @admin.display(description="result (redacted)")
    def result_shown(self, receipt: IdempotencyReceipt) -> str:
        return format_html("<pre>{}</pre>", _pretty(redactor_for(None).payload(receipt.result)))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyReceipt], search_term: str
    ) -> tuple[QuerySet[IdempotencyReceipt], bool]:
        # scope:key answers from the unique index; a bare key would read the whole table.
        term = search_term.strip()
        scope, sep, key = term.partition(":")
        if not term:
            return queryset, False
        if not sep or not searchable(term):
            return queryset.none(), False
        return queryset.filter(scope=scope, key=key), False


@admin.register(OperatorAction)
class OperatorActionAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "actor_name", "action", "selected", "changed", "reason")
    list_filter = ("action",)
    ordering = ("-id",)
    fields = ("created_at", "actor_name", "action", "reason", "selected", "changed",
              "job_ids", "detail_shown")
    readonly_fields = ("detail_shown",)

    @admin.display(description="what changed")
    def detail_shown(self, action: OperatorAction) -> str:
        return format_html("<pre>{}</pre>", _pretty(action.detail))
