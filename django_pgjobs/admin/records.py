"""The record admins: attempts, idempotency receipts and the audit trail, read-only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ..models import Attempt, IdempotencyReceipt, Job, OperatorAction
from ..registry import redactor_for
from ..status import AttemptOutcome
from .base import AttemptColumns, ReadOnlyAdmin, TimeColumns
from .display import breakable, exact_id, pretty, searchable
from .filters import ActorFilter, CreatedFilter


class EndedOutcomeFilter(admin.ChoicesFieldListFilter):
    """The outcomes an attempt row can have: not ``running``, which no row ever holds.

    An attempt's row is written by the statement that ends it; a running attempt is the job's
    lease (the job list's ``running`` status). An attempt that succeeds has no row at all (its
    job keeps it: the job list's ``succeeded`` status); ``succeeded`` rows are those written
    before that was so.
    """

    def choices(self, changelist: ChangeList) -> Any:
        never = changelist.get_query_string(
            {self.lookup_kwarg: AttemptOutcome.RUNNING}, [self.lookup_kwarg_isnull])
        return (choice for choice in super().choices(changelist)
                if choice["query_string"] != never)


@admin.register(Attempt)
class AttemptAdmin(AttemptColumns, TimeColumns, ReadOnlyAdmin):
    list_display = ("id", "job_link", "task", "number", "worker_id", "outcome_shown",
                    "duration", "claimed_at_shown")
    list_filter = (("outcome", EndedOutcomeFilter), "failure_class")
    list_select_related = ("job",)
    sortable_by = ("id", "job_link", "claimed_at_shown")  # the indexed ones
    search_fields = ("=job__id",)
    search_help_text = "Exact job id."
    ordering = ("-id",)
    fields = ("job_link", "number", "worker_id", "lease_token", "claimed_at_shown",
              "finished_at_shown", "outcome", "reported_outcome", "failure_class", "duration",
              "error_shown")
    readonly_fields = ("job_link", "duration", "error_shown", "claimed_at_shown",
                       "finished_at_shown")

    @admin.display(description="job", ordering="job_id")
    def job_link(self, attempt: Attempt) -> str:
        url = reverse("admin:pgjobs_job_change", args=[attempt.job_id])
        return format_html('<a href="{}">{}</a>', url, attempt.job_id)

    @admin.display(description="task")
    def task(self, attempt: Attempt) -> str:
        return breakable(attempt.job.task)

    @admin.display(description="outcome", ordering="outcome")
    def outcome_shown(self, attempt: Attempt) -> str:
        if not attempt.failure_class:
            return attempt.get_outcome_display()
        return format_html("{} <small>{}</small>", attempt.get_outcome_display(),
                           attempt.get_failure_class_display())

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
class IdempotencyReceiptAdmin(TimeColumns, ReadOnlyAdmin):
    list_display = ("id", "scope", "key", "job_link", "created_at_shown", "expires_at_shown")
    sortable_by = ("id", "expires_at_shown")  # the indexed ones
    search_fields = ("=scope", "=key")
    search_help_text = "Exact scope:key."
    ordering = ("-id",)
    fields = ("scope", "key", "job_link", "result_shown", "created_at_shown", "expires_at_shown")
    readonly_fields = ("job_link", "result_shown", "created_at_shown", "expires_at_shown")

    @admin.display(description="job")
    def job_link(self, receipt: IdempotencyReceipt) -> str:
        # A receipt outlives its pruned job: then the id is all there is.
        if receipt.job_id is None:
            return "-"
        if not Job.objects.filter(pk=receipt.job_id).exists():
            return f"{receipt.job_id} (pruned)"
        return format_html('<a href="{}">job {}</a>',
                           reverse("admin:pgjobs_job_change", args=[receipt.job_id]),
                           receipt.job_id)

    @admin.display(description="result (redacted)")
    def result_shown(self, receipt: IdempotencyReceipt) -> str:
        # The job's task and payload say what to hide, while the job is kept; a receipt
        # outlives its pruned job, and then only the keys apply.
        job = None if receipt.job_id is None else (
            Job.objects.filter(pk=receipt.job_id).only("task", "payload").first())
        task, payload = (None, None) if job is None else (job.task, job.payload)
        shown = redactor_for(task).payload(receipt.result, also=payload)
        return format_html("<pre>{}</pre>", pretty(shown))

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


# The audit list names this many of an action's jobs or schedules before "and N more".
TARGETS_SHOWN = 3


@admin.register(OperatorAction)
class OperatorActionAdmin(TimeColumns, ReadOnlyAdmin):
    list_display = ("id", "created_at_shown", "actor_name", "action", "target", "selected",
                    "changed", "reason")
    # No date drill-down and no DISTINCT over the log: each would read the whole audit table.
    list_filter = ("action", ActorFilter, CreatedFilter)
    ordering = ("-id",)
    fields = ("created_at_shown", "actor_name", "action", "reason", "selected", "changed",
              "job_ids", "schedule_ids", "detail_shown")
    readonly_fields = ("detail_shown", "created_at_shown")

    @admin.display(description="what changed")
    def detail_shown(self, action: OperatorAction) -> str:
        return format_html("<pre>{}</pre>", pretty(action.detail))

    @admin.display(description="target")
    def target(self, action: OperatorAction) -> str:
        """What the action was about, linked: its jobs (the first few), schedules, queue or
        limit key."""
        detail = action.detail if isinstance(action.detail, dict) else {}
        parts = [format_html('<a href="{}">job {}</a>',
                             reverse("admin:pgjobs_job_change", args=[i]), i)
                 for i in action.job_ids[:TARGETS_SHOWN]]
        parts += [format_html('<a href="{}">schedule {}</a>',
                              reverse("admin:pgjobs_schedule_change", args=[i]), i)
                  for i in action.schedule_ids[:TARGETS_SHOWN]]
        more = len(action.job_ids) + len(action.schedule_ids) - len(parts)
        for name, said in (("queue", "queue {}"), ("key", "key {}")):
            if isinstance(detail.get(name), str):
                parts.append(format_html(said, detail[name]))
        if more > 0:
            parts.append(format_html("and {} more", more))
        return format_html_join(", ", "{}", ((p,) for p in parts)) if parts else "-"
