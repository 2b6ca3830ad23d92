"""Job, Attempt and IdempotencyReceipt.

Rows change state only through ``transitions.py``; these classes describe the schema and the
invariants the database enforces.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from .validation import QUEUE_NAME_MAX_LENGTH, TRACEPARENT_MAX_LENGTH, queue_problem

PRIORITY_MIN = -100
PRIORITY_MAX = 100


def validate_queue_name(value: str) -> None:
    """The queue-name rule of ``validation.py``, for forms (the admin)."""
    problem = queue_problem(value)
    if problem is not None:
        raise ValidationError(f"The queue {problem}.")

_RUNNING_HOLDS_A_LEASE = Q(
    status=JobStatus.RUNNING,
    lease_token__isnull=False,
    lease_owner__isnull=False,
    lease_expires_at__isnull=False,
) | (~Q(status=JobStatus.RUNNING) & Q(lease_token__isnull=True, lease_expires_at__isnull=True))

_TERMINAL_HAS_FINISHED_AT = ~Q(
    status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED]
) | Q(finished_at__isnull=False)


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=200)
    payload_version = models.PositiveSmallIntegerField(default=1)
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, validators=[validate_queue_name])
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=JobStatus.choices)
    # The priority the claim orders by; aging raises it from base_priority up to a cap.
    priority = models.SmallIntegerField(default=0)
    base_priority = models.SmallIntegerField(default=0)
    run_at = models.DateTimeField(db_default=Now())
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField()
    snoozes = models.PositiveIntegerField(default=0)
    deadline = models.DateTimeField(null=True, blank=True)
    lease_seconds = models.PositiveIntegerField()
    # NULL, not "", for "none": the lease check constraint and the partial unique index on
    # idempotency_key both test IS NULL.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    trace_id = models.CharField(max_length=64, blank=True, default="")
    # The W3C traceparent of the span that enqueued the job (django_pgjobs.tracing), restored
    # by the worker to link each attempt's span to it; NULL when there was none.
    traceparent = models.CharField(  # noqa: DJ001
        max_length=TRACEPARENT_MAX_LENGTH, null=True, blank=True
    )
    fairness_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    failure_class = models.CharField(
        max_length=32, blank=True, default="", choices=FailureClass.choices
    )
    terminal_reason = models.CharField(
        max_length=32, blank=True, default="", choices=TerminalReason.choices
    )
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgjobs_job"
        indexes = [
            # The claim reads this index in order and stops after LIMIT rows: its columns are the
            # claim's WHERE equality column and ORDER BY, and it holds only eligible rows, so
            # finished history never enters it.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="pgjobs_job_claim_idx",
                condition=Q(status=JobStatus.READY),
            ),
            models.Index(
                fields=["lease_expires_at"],
                name="pgjobs_job_lease_idx",
                condition=Q(status=JobStatus.RUNNING),
            ),
            models.Index(
                fields=["run_at"],
                name="pgjobs_job_due_idx",
                condition=Q(status__in=[JobStatus.SCHEDULED, JobStatus.RETRYING]),
            ),
            models.Index(
                fields=["status", "finished_at"],
                name="pgjobs_job_finished_idx",
                condition=Q(status__in=[JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED]),
            ),
            # The admin's search by trace id; without it a search reads the whole history.
            models.Index(
                fields=["trace_id"], name="pgjobs_job_trace_idx", condition=~Q(trace_id="")
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX)
                & Q(base_priority__gte=PRIORITY_MIN, base_priority__lte=PRIORITY_MAX),
                name="pgjobs_job_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="pgjobs_job_status_valid"
            ),
            models.CheckConstraint(condition=_RUNNING_HOLDS_A_LEASE, name="pgjobs_job_lease_state"),
            models.CheckConstraint(
                condition=_TERMINAL_HAS_FINISHED_AT, name="pgjobs_job_terminal_finished"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1) & Q(lease_seconds__gte=1),
                name="pgjobs_job_bounds",
            ),
            models.UniqueConstraint(
                fields=["task", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_job_idempotency_key",
            ),
        ]
        permissions = [
            ("retry_job", "Can retry dead or cancelled jobs"),
            ("replay_job", "Can replay a job as a new job"),
            ("cancel_job", "Can cancel jobs"),
            ("deadletter_job", "Can move jobs to dead by hand"),
            ("view_raw_payload", "Can see unredacted payloads"),
        ]

    def __str__(self) -> str:
        return f"{self.task}#{self.pk} ({self.status})"


class Attempt(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    lease_token = models.UUIDField(unique=True)
    claimed_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, default=AttemptOutcome.RUNNING
    )
    # What the worker reported; differs from outcome only when the report came too late (LOST).
    reported_outcome = models.CharField(
        max_length=16, choices=AttemptOutcome.choices, blank=True, default=""
    )
    failure_class = models.CharField(
        max_length=32, blank=True, default="", choices=FailureClass.choices
    )
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    duration_ms = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        db_table = "pgjobs_attempt"
        indexes = [
            models.Index(fields=["claimed_at"], name="pgjobs_attempt_claimed_idx"),
            # Failure statistics read failed attempts only; successes, most of every window,
            # stay out of this index (and a success's settle stays a HOT update).
            models.Index(
                fields=["claimed_at"],
                name="pgjobs_attempt_failed_idx",
                condition=~Q(failure_class=""),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} ({self.outcome})"


class IdempotencyReceipt(models.Model):
    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    # No database constraint: receipts must outlive the job that wrote them when jobs are pruned.
    job = models.ForeignKey(
        Job, on_delete=models.DO_NOTHING, db_constraint=False, null=True, blank=True,
        related_name="+",
    )
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "pgjobs_receipt"
        constraints = [
            models.UniqueConstraint(fields=["scope", "key"], name="pgjobs_receipt_scope_key")
        ]
        indexes = [models.Index(fields=["expires_at"], name="pgjobs_receipt_expires_idx")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"


class OperatorActionKind(models.TextChoices):
    RETRY = "retry", "retry"
    REPLAY = "replay", "replay"
    CANCEL = "cancel", "cancel"
    DEAD_LETTER = "dead_letter", "dead-letter"
    VIEW_RAW_PAYLOAD = "view_raw_payload", "view raw payload"


class OperatorAction(models.Model):
    """The audit trail: one row per operator action, written in the action's transaction."""

    id = models.BigAutoField(primary_key=True)
    created_at = models.DateTimeField(db_default=Now())
    # The name is kept as it was: the row must still say who acted after the user is deleted.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150)
    action = models.CharField(max_length=32, choices=OperatorActionKind.choices)
    reason = models.TextField(blank=True, default="")
    # The jobs the operator selected; ``detail`` says what happened to which of them.
    job_ids = models.JSONField(default=list)
    selected = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict)

    class Meta:
        db_table = "pgjobs_operator_action"

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_name or '(no user)'} at {self.created_at}"
