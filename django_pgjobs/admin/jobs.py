"""The job admin: the list, the detail page, the raw payload, the dashboard and the actions.

Nothing here writes a job: every action confirms what it will do, then calls its operator
transition (``actions.ACTIONS``). Payloads, results, errors and tracebacks are shown redacted.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import Q, QuerySet
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
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import encryption, history, sql, transitions
from ..exceptions import Undecryptable
from ..models import (
    Attempt,
    Dependency,
    IdempotencyReceipt,
    Job,
    OperatorAction,
    OperatorActionKind,
)
from ..redaction import masked
from ..registry import redactor_for, registry
from ..status import TERMINAL_STATUSES, JobStatus, TerminalReason
from .actions import (
    ACTION_BUTTONS,
    ACTION_MAX_JOBS,
    ACTION_STATES,
    ACTIONS,
    Action,
    status_counts,
    tasks_text,
)
from .base import AttemptColumns, NoWrites, ReadOnlyAdmin, TimeColumns
from .dashboard import dashboard_context
from .display import (
    breakable,
    duration_text,
    exact_id,
    one_line,
    parse_ids,
    pretty,
    preview,
    searchable,
    status_badge,
    time_text,
)
from .filters import FinishedFilter, QueueFilter, ScheduleFilter, TaskFilter, WorkflowFilter


def _actor(request: HttpRequest) -> transitions.Actor:
    return transitions.Actor.of(request.user)


def operator_actions_of(job_id: int, limit: int = 20) -> QuerySet[OperatorAction]:
    """The latest operator actions that selected the job, through the index on ``job_ids``."""
    return OperatorAction.objects.filter(job_ids__contains=[job_id]).order_by("-id")[:limit]


def operator_action(action: Action) -> Any:
    """The admin action of one entry of ``ACTIONS``: it asks, then confirms and applies."""

    def run(modeladmin: JobAdmin, request: HttpRequest, queryset: QuerySet[Job]) -> Any:
        return modeladmin.confirm(request, queryset, action)

    run.__name__ = action.name
    return admin.action(permissions=[action.permission], description=action.description)(run)


class AttemptInline(NoWrites, AttemptColumns, TimeColumns, admin.TabularInline):
    model = Attempt
    fk_name = "job"
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ("number",)
    fields = ("number", "worker_id", "outcome", "failure_class", "duration", "claimed_at_shown",
              "finished_at_shown", "error_shown")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Attempt]:
        # The job is needed to scrub its payload's secrets out of each error.
        return super().get_queryset(request).select_related("job")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("pgjobs.view_job")


TIME_FIELDS = ("run_at_shown", "deadline_shown", "created_at_shown", "started_at_shown",
               "finished_at_shown", "updated_at_shown", "claimed_at_shown",
               "lease_expires_at_shown", "heartbeat_at_shown", "scheduled_at_shown",
               "cancel_requested_at_shown")
# How a job that ended before an operator's cancel reached it had ended, in the page's words.
_ENDED_BEFORE_THE_CANCEL: dict[str, str] = {
    JobStatus.SUCCEEDED: "succeeded", JobStatus.DEAD: "ended dead",
    JobStatus.CANCELLED: "been cancelled",
}


# A success message links this many of the jobs it names.
JOBS_LINKED = 10


def _job_links(ids: list[int]) -> str:
    """The jobs an action selected, linked (the first few): "Jobs: job 5, job 6"."""
    links = format_html_join(", ", '<a href="{}">job {}</a>', (
        (reverse("admin:pgjobs_job_change", args=[i]), i) for i in ids[:JOBS_LINKED]))
    more = f" and {len(ids) - JOBS_LINKED} more" if len(ids) > JOBS_LINKED else ""
    return format_html("Selected: {}{}.", links, more)


def _replay_link(job_id: int, action: OperatorAction) -> str:
    """On a replay's row of a job's history: a link to the other job of the pair."""
    detail = action.detail if isinstance(action.detail, dict) else {}
    if action.action != OperatorActionKind.REPLAY or "replay_id" not in detail:
        return ""
    if detail["replay_id"] == job_id:
        other, said = detail.get("original_id") or action.job_ids[0], "a replay of"
    else:
        other, said = detail["replay_id"], "replayed as"
    return format_html(' ({} <a href="{}" class="pgjobs-replay-link">job {}</a>)', said,
                       reverse("admin:pgjobs_job_change", args=[other]), other)


# The dead list's last-error column: its first line, cut here.
ERROR_PREVIEW_CHARS = 120
# A job page lists at most this many of its receipts.
RECEIPTS_SHOWN = 20
# A workflow's tree on a job's page, and the edges listed either way: the first this many.
WORKFLOW_JOBS_SHOWN = 200
EDGES_SHOWN = 50


@admin.register(Job)
class JobAdmin(TimeColumns, ReadOnlyAdmin):
    # Narrow enough for 1366 px beside the admin's menu and the filters: the status cell says
    # the lease or the failure class with the status; the payload is one line.
    list_display = ("id", "task_shown", "queue", "status_shown", "attempts_used", "age",
                    "payload_preview")
    list_filter = ("status", FinishedFilter, QueueFilter, TaskFilter, "failure_class",
                   ScheduleFilter, WorkflowFilter)
    search_fields = ("=id", "=idempotency_key", "=trace_id")
    search_help_text = ("A job id or idempotency key, whole; the first characters of a trace id "
                        "or of task names (\"billing.\" finds every billing task).")
    ordering = ("-id",)
    change_form_template = "admin/pgjobs/job/change_form.html"
    inlines = [AttemptInline]
    actions = [*(operator_action(a) for a in ACTIONS.values()), "export_selected"]
    readonly_fields = ("payload_shown", "result_shown", "error_shown", "operator_history",
                       "schedule_link", "cancel_shown", "rate_shown", "receipts_shown",
                       "progress_shown", "dependencies_shown", "dependents_shown",
                       "workflow_shown", *TIME_FIELDS)
    fieldsets = (
        (None, {"fields": ("id", "task", "queue", "status", "terminal_reason", "cancel_shown",
                           "failure_class", "priority", "base_priority")}),
        ("Payload (redacted)", {"fields": ("payload_shown", "payload_version", "result_shown")}),
        ("Last error (redacted)", {"fields": ("error_shown",)}),
        # docs/workflows.md: what the job waits for, what waits for it, how far it has got.
        ("Workflow", {"fields": ("progress_shown", "pending_dependencies", "dependencies_shown",
                                 "dependents_shown", "workflow_shown")}),
        ("Attempts and times", {"fields": ("attempts", "max_attempts", "snoozes", "run_at_shown",
                                           "deadline_shown", "created_at_shown",
                                           "started_at_shown", "finished_at_shown",
                                           "updated_at_shown")}),
        # A running attempt's record until it ends, and a succeeded one's for good: a success
        # has no attempt row (the inline lists the attempts that ended otherwise).
        ("Lease", {"fields": ("lease_owner", "lease_token", "claimed_at_shown", "duration_ms",
                              "lease_seconds", "lease_expires_at_shown", "heartbeat_at_shown",
                              "cancel_requested_at_shown")}),
        ("Identity", {"fields": ("idempotency_key", "trace_id", "fairness_key", "schedule_link",
                                 "scheduled_at_shown", "receipts_shown")}),
        # A handler's Limit: the job's key, the limit it was enqueued under, the slot it holds
        # while ready or running (or held last); under a Rate, the rate and the job's weight.
        # docs/limits.md.
        ("Limit", {"fields": ("limit_key", "limit_max", "limit_slot", "rate_shown",
                              "rate_weight")}),
        ("Operator actions", {"fields": ("operator_history",)}),
    )

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        # A job's receipts (scope and key) are for those who may see receipts.
        if request.user.has_perm("pgjobs.view_idempotencyreceipt"):
            return self.fieldsets
        return [(name, {**options, "fields": tuple(f for f in options["fields"]
                                                   if f != "receipts_shown")})
                for name, options in self.fieldsets or ()]

    @admin.display(description="receipts")
    def receipts_shown(self, job: Job) -> str:
        """The receipts this job's attempts took (the side effects they guard), linked."""
        receipts = list(IdempotencyReceipt.objects.filter(job_id=job.pk)
                        .order_by("id").values_list("id", "scope", "key")[:RECEIPTS_SHOWN + 1])
        if not receipts:
            return "-"
        more = len(receipts) > RECEIPTS_SHOWN
        items = format_html_join(", ", '<a href="{}">{}:{}</a>', (
            (reverse("admin:pgjobs_idempotencyreceipt_change", args=[pk]), scope, key)
            for pk, scope, key in receipts[:RECEIPTS_SHOWN]))
        return format_html("{}{}", items, f" and more (the first {RECEIPTS_SHOWN} shown)"
                           if more else "")

    @admin.display(description="progress")
    def progress_shown(self, job: Job) -> str:
        progress = job.progress
        if not isinstance(progress, dict):
            return "-"
        done, total = progress.get("done"), progress.get("total")
        said = f"{done:g} of {total:g}" if isinstance(total, int | float) and isinstance(
            done, int | float) else f"{done}"
        message = redactor_for(job.task).text(str(progress.get("message") or ""), job.payload)
        return format_html("{}{}", said, f": {message}" if message else "")

    @admin.display(description="depends on")
    def dependencies_shown(self, job: Job) -> str:
        edges = (Dependency.objects.filter(job_id=job.pk).order_by("id")
                 .values_list("upstream_id", "requires", "upstream_status")[:EDGES_SHOWN])
        return self._edges(edges, lambda requires, ended: (
            f"requires {requires}" + (f"; it ended {ended}" if ended else "; not ended yet")))

    @admin.display(description="depended on by")
    def dependents_shown(self, job: Job) -> str:
        edges = (Dependency.objects.filter(upstream_id=job.pk).order_by("id")
                 .values_list("job_id", "requires", "upstream_status")[:EDGES_SHOWN])
        return self._edges(edges, lambda requires, ended: f"which requires {requires}")

    def _edges(self, edges: Any, said: Any) -> str:
        rows = list(edges)
        if not rows:
            return "-"
        statuses = dict(Job.objects.filter(pk__in=[r[0] for r in rows])
                        .values_list("pk", "status"))
        return format_html_join(mark_safe("<br>"), '<a href="{}">job {}</a> {} ({})', (
            (reverse("admin:pgjobs_job_change", args=[other]), other,
             status_badge(statuses.get(other, "pruned")), said(requires, ended))
            for other, requires, ended in rows))

    @admin.display(description="workflow")
    def workflow_shown(self, job: Job) -> str:
        """The job's workflow as an indented tree: each job under the jobs it waits for."""
        if job.workflow_id is None:
            return "-"
        members = {pk: (task, status) for pk, task, status in
                   Job.objects.filter(workflow_id=job.workflow_id).order_by("id")
                   .values_list("pk", "task", "status")[:WORKFLOW_JOBS_SHOWN]}
        below: dict[int, list[int]] = {}
        has_parent: set[int] = set()
        for child, parent in Dependency.objects.filter(job_id__in=list(members)).values_list(
                "job_id", "upstream_id"):
            if parent in members:
                below.setdefault(parent, []).append(child)
                has_parent.add(child)
        lines: list[tuple[int, int, bool]] = []
        shown: set[int] = set()

        def walk(pk: int, depth: int) -> None:
            again = pk in shown
            lines.append((pk, depth, again))
            shown.add(pk)
            if not again:
                for child in sorted(below.get(pk, ())):
                    walk(child, depth + 1)

        for root in (pk for pk in members if pk not in has_parent):
            walk(root, 0)
        link = reverse("admin:pgjobs_job_changelist") + f"?workflow={job.workflow_id}"
        tree = format_html_join("", (
            '<div class="pgjobs-tree" style="padding-left: {}em">{}<a href="{}">job {}</a> '
            '{} {}{}</div>'), (
            (depth * 1.5, "└ " if depth else "", reverse("admin:pgjobs_job_change", args=[pk]),
             pk, breakable(members[pk][0]), status_badge(members[pk][1]),
             " (shown above)" if again else (" ← this job" if pk == job.pk else ""))
            for pk, depth, again in lines))
        more = len(members) >= WORKFLOW_JOBS_SHOWN
        return format_html('{}<p><a href="{}">All jobs of workflow {}</a>{}</p>', tree, link,
                           job.workflow_id,
                           f" (the first {WORKFLOW_JOBS_SHOWN} shown)" if more else "")

    @admin.display(description="rate")
    def rate_shown(self, job: Job) -> str:
        if job.rate_interval is None:
            return "-"
        per_second = 1 / job.rate_interval
        said = f"{per_second:g} a second" if per_second >= 1 else \
            f"1 every {job.rate_interval:.3g}s"
        return f"{said}, burst {job.rate_burst}"

    # --- permissions (ACTIONS names these) ---

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

    def has_reveal_encrypted_permission(self, request: HttpRequest) -> bool:
        # Decrypting is a look at the raw payload and more: it needs both permissions.
        return self.has_raw_payload_permission(request) and request.user.has_perm(
            "pgjobs.reveal_encrypted")

    # --- list ---

    @admin.display(description="attempts")
    def attempts_used(self, job: Job) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @admin.display(description="age")
    def age(self, job: Job) -> str:
        return duration_text((timezone.now() - job.created_at).total_seconds())

    @admin.display(description="ended for", ordering="terminal_reason")
    def reason_shown(self, job: Job) -> str:
        return job.get_terminal_reason_display()

    @admin.display(description="task", ordering="task")
    def task_shown(self, job: Job) -> str:
        return breakable(job.task)

    @admin.display(description="status", ordering="status")
    def status_shown(self, job: Job) -> str:
        """The status as a badge (its text, in its colour), then what a list reader asks next:
        a running job's lease, a failed one's failure class."""
        if job.lease_expires_at is not None:
            left = (job.lease_expires_at - timezone.now()).total_seconds()
            more = (f"lease {duration_text(left)}" if left >= 0
                    else f"lease expired {duration_text(-left)} ago")
        else:
            more = job.get_failure_class_display() if job.failure_class else ""
        return format_html('{}{}', status_badge(job.status),
                           format_html(" <small>{}</small>", more) if more else "")

    @admin.display(description="payload (redacted)")
    def payload_preview(self, job: Job) -> str:
        return one_line(preview(redactor_for(job.task).payload(job.payload)))

    @admin.display(description="last error")
    def error_preview(self, job: Job) -> str:
        text = redactor_for(job.task).text(job.last_error, job.payload)
        first = text.split("\n", 1)[0]
        return one_line(
            first if len(first) <= ERROR_PREVIEW_CHARS else first[:ERROR_PREVIEW_CHARS] + "…")

    def get_list_display(self, request: HttpRequest) -> Any:
        # The dead list says why: each job's terminal reason and last error, in place of the
        # payload.
        if request.GET.get("status__exact") == JobStatus.DEAD:
            return ("id", "task_shown", "queue", "status_shown", "attempts_used", "age",
                    "reason_shown", "error_preview")
        return super().get_list_display(request)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not searchable(term):
            return queryset.none(), False
        # Each match answered by an index: the primary key, the idempotency-key index probed
        # once per task, the trace index (text_pattern_ops) for a trace id's first characters.
        # Task names match by their start among the names the code knows, as the task filter.
        with connections[queryset.db].cursor() as cursor:
            cursor.execute(sql.query("jobs_by_idempotency_key"), [term])
            keyed = [row[0] for row in cursor.fetchall()]
        # (The trace index holds only jobs with a trace id: say so, or the planner cannot use it.)
        condition = (Q(trace_id__startswith=term) & ~Q(trace_id="")) | Q(pk__in=keyed)
        tasks = [name for name in TaskFilter.names() if name.startswith(term)]
        if tasks:
            condition |= Q(task__in=tasks)
        job_id = exact_id(term)
        if job_id is not None:
            condition |= Q(pk=job_id)
        return queryset.filter(condition), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A forged POST for an action this user may not run is refused (RefuseForgedActions).
        context = {"dashboard_url": reverse("admin:pgjobs_job_dashboard"), **(extra_context or {})}
        return super().changelist_view(request, context)

    # --- detail ---

    @admin.display(description="payload")
    def payload_shown(self, job: Job) -> str:
        return format_html("<pre>{}</pre>", pretty(redactor_for(job.task).payload(job.payload)))

    @admin.display(description="result")
    def result_shown(self, job: Job) -> str:
        if job.result is None:
            return "-"
        # A handler may echo a payload's secret into its result, under a key of its own.
        shown = redactor_for(job.task).payload(job.result, also=job.payload)
        return format_html("<pre>{}</pre>", pretty(shown))

    @admin.display(description="last error")
    def error_shown(self, job: Job) -> str:
        text = redactor_for(job.task).text(job.last_error, job.payload)
        return format_html("<pre>{}</pre>", text) if text else "-"

    @admin.display(description="cancel")
    def cancel_shown(self, job: Job) -> str:
        """Who cancelled the job, when and why; or that the cancel came too late for it."""
        cancel = OperatorAction.objects.filter(
            job_ids__contains=[job.pk], action=OperatorActionKind.CANCEL).order_by("-id").first()
        if cancel is None:
            return "-"
        asked = (f"by {cancel.actor_name or '(code)'} at {time_text(cancel.created_at)}"
                 + (f": {cancel.reason}" if cancel.reason else ""))
        too_late = str(job.pk) in cancel.detail.get("too_late", {}) or (
            job.cancel_requested_at is not None
            and job.status in (JobStatus.SUCCEEDED, JobStatus.DEAD))
        if too_late:
            return (f"Cancel {asked} came too late: the job had already "
                    f"{_ENDED_BEFORE_THE_CANCEL.get(job.status, job.status)}")
        if job.status == JobStatus.CANCELLED and job.terminal_reason == TerminalReason.OPERATOR:
            return f"Cancelled {asked}"
        if job.status == JobStatus.RUNNING and job.cancel_requested_at is not None:
            return f"Cancel asked {asked}; its worker is ending it"
        return "-"

    @admin.display(description="schedule")
    def schedule_link(self, job: Job) -> str:
        if job.schedule_id is None:
            return "-"
        url = reverse("admin:pgjobs_schedule_change", args=[job.schedule_id])
        return format_html('<a href="{}">{}</a>', url, job.schedule_id)

    @admin.display(description="history")
    def operator_history(self, job: Job) -> str:
        actions = operator_actions_of(job.pk)
        rows = [
            (time_text(a.created_at), a.get_action_display(),
             a.actor_name or "(code)", a.reason or "", _replay_link(job.pk, a))
            for a in actions
        ]
        if not rows:
            return "-"
        return format_html(
            "<ul>{}</ul>", format_html_join("", "<li>{} {} by {} {}{}</li>", rows)
        )

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = {"can_view_raw_payload": self.has_raw_payload_permission(request),
                   "job_actions": self._job_actions(request, object_id),
                   "workflow_open_ids": self._workflow_open_ids(request, object_id),
                   **(extra_context or {})}
        return super().change_view(request, object_id, form_url, context)

    def _job_actions(self, request: HttpRequest, object_id: str) -> list[tuple[str, str]]:
        """The actions this user may take on this job, as buttons: each opens the same plan
        and confirmation as from the list."""
        status = Job.objects.filter(pk=object_id).values_list("status", flat=True).first() \
            if object_id.isdigit() else None
        if status is None:
            return []
        return [(name, label) for name, label in ACTION_BUTTONS.items()
                if status in ACTION_STATES[name]
                and getattr(self, f"has_{ACTIONS[name].permission}_permission")(request)]

    def _workflow_open_ids(self, request: HttpRequest, object_id: str) -> list[int]:
        """The unfinished jobs of this job's workflow, for its *Cancel the workflow* button:
        the list's cancel action with them selected, so the same plan, confirmation and audit."""
        if not object_id.isdigit() or not self.has_cancel_permission(request):
            return []
        workflow = Job.objects.filter(pk=object_id).values_list("workflow_id", flat=True).first()
        if workflow is None:
            return []
        return list(Job.objects.filter(workflow_id=workflow)
                    .exclude(status__in=TERMINAL_STATUSES).order_by("id")
                    .values_list("pk", flat=True)[:ACTION_MAX_JOBS])

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
        if not self.has_view_permission(request):
            raise PermissionDenied
        if not self.has_raw_payload_permission(request):
            return self.permission_needed(
                request, "pgjobs.view_raw_payload", "Showing a job's raw payload",
                back_url=reverse("admin:pgjobs_job_change", args=[object_id]))
        if request.method not in ("GET", "HEAD", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        job = self.get_object(request, object_id)
        if job is None:
            raise Http404("no such job")
        handler = registry.resolve(job.task)
        payload_paths = handler.encrypted if handler is not None else ()
        result_paths = handler.encrypted_result if handler is not None else ()
        sealed = [*encryption.sealed_at(job.payload, payload_paths, where=encryption.PAYLOAD),
                  *encryption.sealed_at(job.result, result_paths, where=encryption.RESULT)]
        can_decrypt = bool(sealed) and self.has_reveal_encrypted_permission(request)
        context: dict[str, Any] = {
            **self.admin_site.each_context(request), "opts": self.opts, "job": job,
            "title": f"Raw payload of job {job.pk}", "revealed": request.method == "POST",
            "sealed": sealed, "can_decrypt": can_decrypt, "decrypted": False,
        }
        if request.method == "POST":
            payload, result = masked(job.payload), masked(job.result)
            if "decrypt" in request.POST and sealed:
                if not can_decrypt:
                    return self.permission_needed(
                        request, "pgjobs.reveal_encrypted", "Decrypting encrypted fields",
                        back_url=reverse("admin:pgjobs_job_change", args=[object_id]))
                try:
                    payload = encryption.opened(job.payload, payload_paths,
                                                where=encryption.PAYLOAD, owner=job.task)
                    result = encryption.opened(job.result, result_paths,
                                               where=encryption.RESULT, owner=job.task)
                except Undecryptable as exc:
                    context["decrypt_error"] = str(exc)
                else:
                    context["decrypted"] = True
                    transitions.record_encrypted_reveal(job.pk, sealed, actor=_actor(request))
            transitions.record_raw_payload_view(job.pk, actor=_actor(request))
            context["payload"] = pretty(payload)
            context["result"] = None if job.result is None else pretty(result)
        return TemplateResponse(request, "admin/pgjobs/job/raw_payload.html", context)

    def permission_needed(
        self, request: HttpRequest, permission: str, what: str, back_url: str = ""
    ) -> HttpResponse:
        """A 403 in the admin's own page that names the permission the user lacks."""
        app_label, codename = permission.split(".", 1)
        found = Permission.objects.filter(content_type__app_label=app_label,
                                          codename=codename).first()
        context = {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": "Permission needed", "what": what, "permission": permission,
            "permission_name": found.name if found else codename, "back_url": back_url,
        }
        return TemplateResponse(request, "admin/pgjobs/permission_needed.html", context,
                                status=403)

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The operations dashboard."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": "Job queue dashboard",
            **dashboard_context(range_name=request.GET.get("range", history.DEFAULT_RANGE)),
            "can_pause": request.user.has_perm("pgjobs.pause_queue"),
        }
        return TemplateResponse(request, "admin/pgjobs/job/dashboard.html", context)

    # --- actions ---

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
                "result": redactor.payload(job.result, also=job.payload),
                "last_error": redactor.text(job.last_error, job.payload),
            })
        response = JsonResponse({"jobs": rows}, json_dumps_params={"indent": 2})
        response["Content-Disposition"] = 'attachment; filename="pgjobs-jobs.json"'
        return response

    def confirm(
        self, request: HttpRequest, queryset: QuerySet[Job], action: Action
    ) -> HttpResponse | None:
        """Show what ``action`` will do; on the confirming POST, do it and return None."""
        if action.name not in self.get_actions(request):
            raise PermissionDenied
        confirming = request.POST.get("pgjobs_confirm") == "yes"
        if confirming:
            # Ids of jobs that do not exist (pruned since the confirmation page, or forged) are
            # dropped here, so the audit row names only jobs the action could have touched.
            requested = parse_ids(request.POST.get("pgjobs_ids", ""))[: ACTION_MAX_JOBS + 1]
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
        form = action.form(request.POST if confirming else None, jobs=len(ids))
        if confirming and form.is_valid():
            try:
                text = action.apply(ids, form.cleaned_data, _actor(request))
            except ValueError as exc:
                self.message_user(request, str(exc), messages.ERROR)
                return None
            self.message_user(request, format_html("{} {}", text, _job_links(ids)),
                              messages.SUCCESS)
            return None
        plan = replace(action.plan(ids, status_counts(ids)), tasks=tasks_text(ids))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "title": plan.title,
            "plan": plan, "form": form, "action": action.name, "ids": ",".join(map(str, ids)),
            "first_id": ids[0], "selected": len(ids), "noun": "job",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/pgjobs/job/confirm_action.html", context)
