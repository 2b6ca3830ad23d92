"""Job, Attempt, IdempotencyReceipt, Schedule and the operators' audit trail.

Rows change state only through ``transitions.py``; these classes describe the schema and the
invariants the database enforces.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import (
    DEFAULT_DB_ALIAS,
    DataError,
    IntegrityError,
    connections,
    models,
    transaction,
)
from django.db.models import Q
from django.db.models.functions import Now

from .status import (
    ACTIVE_STATUSES,
    AttemptOutcome,
    FailureClass,
    JobStatus,
    MisfirePolicy,
    OverlapPolicy,
    Requires,
    ScheduleSource,
    SkipReason,
    TerminalReason,
)
from .validation import (
    CRON_MAX_LENGTH,
    FAIRNESS_KEY_MAX_LENGTH,
    KEY_MAX_LENGTH,
    LIMIT_KEY_MAX_LENGTH,
    MAX_RUNNING_LIMIT,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_NAME_MAX_LENGTH,
    RECEIPT_SCOPE_MAX_LENGTH,
    SCHEDULE_NAME_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
    TIMEZONE_MAX_LENGTH,
    TRACE_MAX_LENGTH,
    TRACEPARENT_MAX_LENGTH,
    queue_problem,
)


def validate_queue_name(value: str) -> None:
    """The queue-name rule of ``validation.py``, for forms (the admin)."""
    problem = queue_problem(value)
    if problem is not None:
        raise ValidationError(f"The queue {problem}.")


# The columns the job table's rules read, in the order pgjobs_job_rules takes them. The rules
# themselves are that PL/pgSQL function's (migration 0019, which says why not CHECK expressions):
# a status of JobStatus; priorities within PRIORITY_MIN and PRIORITY_MAX; a lease held by a
# running job only, and whole; a finish time on a finished job; max_attempts and lease_seconds
# at least 1; counts (and a rate's burst) never below 0; a positive timeout; a limit key with
# its limit (1 to MAX_RUNNING_LIMIT); a rate whole, on a key of one slot; a pending job waiting
# for at least one dependency; a schedule with its tick. Each broken rule is refused by its name.
JOB_RULE_COLUMNS = (
    "status", "priority", "base_priority", "attempts", "max_attempts", "snoozes",
    "lease_seconds", "payload_version", "lease_owner", "lease_token", "lease_expires_at",
    "finished_at", "timeout_seconds", "schedule", "scheduled_at", "limit_key", "limit_max",
    "limit_slot", "rate_interval", "rate_burst", "rate_weight", "pending_dependencies",
)


class RulesCheck(models.CheckConstraint):
    """The CHECK that calls pgjobs_job_rules. The function refuses a row by raising, naming the
    rule it breaks; ``validate`` (``Model.full_clean``) turns that into a ``ValidationError``
    naming it, and runs in a savepoint, so the caller's transaction stays usable."""

    def validate(self, model: Any, instance: Any, exclude: Any = None,
                 using: str = DEFAULT_DB_ALIAS) -> None:
        fields = [model._meta.get_field(name) for name in JOB_RULE_COLUMNS]
        if exclude and any(field.name in exclude for field in fields):
            return
        # Each value typed as its column is: the function takes exactly those types.
        connection = connections[using]
        arguments = ", ".join(f"%s::{field.db_type(connection) or field.rel_db_type(connection)}"
                              for field in fields)
        values = [field.get_db_prep_value(getattr(instance, field.attname), connection)
                  for field in fields]
        try:
            with transaction.atomic(using=using), connection.cursor() as cursor:
                cursor.execute(f"SELECT pgjobs_job_rules({arguments})", values)
        except (IntegrityError, DataError) as refused:  # a rule broken; a value out of range
            raise ValidationError(str(refused).splitlines()[0], code="rules") from refused


# The succeeded jobs whose success has no attempt row: the job keeps that attempt, and the
# settle leaves lease_owner (its worker) only on such a job. A job that succeeded before
# migration 0018 has a row for it and no lease_owner.
KEPT_SUCCESS = Q(status=JobStatus.SUCCEEDED, lease_owner__isnull=False)


class Schedule(models.Model):
    """A periodic schedule: a job of ``task`` at every tick of ``cron`` in ``timezone``.

    ``next_tick_at`` is the cursor: the first tick not yet handled. The schedule step locks due
    rows (SKIP LOCKED), enqueues their ticks and moves the cursor in one transaction; the unique
    index on the job's (schedule, scheduled_at) makes a second job for one tick impossible
    whatever else happens. Rows are retired, never deleted, so jobs can always name theirs.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=SCHEDULE_NAME_MAX_LENGTH, unique=True)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    cron = models.CharField(max_length=CRON_MAX_LENGTH)
    timezone = models.CharField(max_length=TIMEZONE_MAX_LENGTH, default="UTC")
    payload = models.JSONField(default=dict, blank=True)
    # "" and NULL: the handler's queue and priority.
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True, default="")
    priority = models.SmallIntegerField(null=True, blank=True)
    misfire = models.CharField(max_length=16, choices=MisfirePolicy.choices,
                               default=MisfirePolicy.SKIP)
    catch_up_limit = models.PositiveIntegerField(default=100)
    overlap = models.CharField(max_length=16, choices=OverlapPolicy.choices,
                               default=OverlapPolicy.ALLOW)
    # The sync at worker start owns code and settings schedules; it never touches admin ones.
    source = models.CharField(max_length=16, choices=ScheduleSource.choices,
                              default=ScheduleSource.ADMIN)
    paused_at = models.DateTimeField(null=True, blank=True)
    # Set by the sync when the declaration is gone from code and settings.
    retired_at = models.DateTimeField(null=True, blank=True)
    next_tick_at = models.DateTimeField(null=True, blank=True)
    # The latest tick handled (enqueued or passed over) and when, by the database clock.
    last_tick_at = models.DateTimeField(null=True, blank=True)
    last_handled_at = models.DateTimeField(null=True, blank=True)
    # No foreign key: finished jobs are pruned, the schedule stays.
    last_job_id = models.BigIntegerField(null=True, blank=True)
    ticks_enqueued = models.PositiveBigIntegerField(default=0)
    # Passed over by the misfire policy (no worker enqueued them in time).
    ticks_missed = models.PositiveBigIntegerField(default=0)
    # Skipped by the overlap policy (the previous tick's job had not finished).
    ticks_skipped = models.PositiveBigIntegerField(default=0)
    last_skipped_at = models.DateTimeField(null=True, blank=True)
    last_skip_reason = models.CharField(max_length=16, choices=SkipReason.choices, blank=True,
                                        default="")
    # Why the schedule's last pass failed (scrubbed, one line), and when; cleared by its next
    # pass that succeeds. A failing schedule never stops a worker or the other schedules.
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "pgjobs_schedule"
        indexes = [
            # The schedule step's query: due, active schedules in cursor order. Paused and
            # retired schedules stay out of it.
            models.Index(
                fields=["next_tick_at"],
                name="pgjobs_schedule_due_idx",
                condition=Q(paused_at__isnull=True, retired_at__isnull=True,
                            next_tick_at__isnull=False),
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(misfire__in=MisfirePolicy.values),
                                   name="pgjobs_schedule_misfire_valid"),
            models.CheckConstraint(condition=Q(overlap__in=OverlapPolicy.values),
                                   name="pgjobs_schedule_overlap_valid"),
            models.CheckConstraint(condition=Q(source__in=ScheduleSource.values),
                                   name="pgjobs_schedule_source_valid"),
            models.CheckConstraint(
                condition=Q(priority__isnull=True)
                | Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="pgjobs_schedule_priority_range",
            ),
            models.CheckConstraint(condition=Q(catch_up_limit__gte=1),
                                   name="pgjobs_schedule_catch_up_limit"),
        ]
        permissions = [
            ("pause_schedule", "Can pause schedules"),
            ("resume_schedule", "Can resume schedules"),
            ("run_schedule", "Can run a schedule now"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def state(self) -> str:
        """active, paused or retired."""
        if self.retired_at is not None:
            return "retired"
        return "paused" if self.paused_at is not None else "active"


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=TASK_NAME_MAX_LENGTH)
    payload_version = models.SmallIntegerField(default=1)
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, validators=[validate_queue_name])
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=JobStatus.choices)
    # The priority the claim orders by; aging raises it from base_priority up to a cap.
    priority = models.SmallIntegerField(default=0)
    base_priority = models.SmallIntegerField(default=0)
    run_at = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(default=0)
    max_attempts = models.IntegerField()
    snoozes = models.IntegerField(default=0)
    deadline = models.DateTimeField(null=True, blank=True)
    lease_seconds = models.IntegerField()
    # NULL, not "", for "none": the lease rule (pgjobs_job_lease_state) and the partial unique
    # index on idempotency_key both test IS NULL.
    lease_owner = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    lease_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the running attempt was claimed (kept after it ends: the last attempt's). A running
    # attempt has no row in pgjobs_attempt: its facts are the lease columns and this one, and
    # its row is written once, when it ends (transitions.settle). An attempt that succeeds never
    # gets a row: its facts stay here, with lease_owner (its worker), finished_at and
    # duration_ms (its handler's time), which only a succeeded job keeps.
    claimed_at = models.DateTimeField(null=True, blank=True)
    duration_ms = models.IntegerField(null=True, blank=True)
    idempotency_key = models.CharField(  # noqa: DJ001
        max_length=KEY_MAX_LENGTH, null=True, blank=True
    )
    # Unique while active (scheduled, ready, running, retrying); with a period, unique within the
    # period that starts at unique_period_start, whatever the state.
    unique_key = models.CharField(  # noqa: DJ001
        max_length=KEY_MAX_LENGTH, null=True, blank=True
    )
    unique_period_start = models.DateTimeField(null=True, blank=True)
    # The handler's or the job's timeout: its worker settles it as timed out after this long.
    timeout_seconds = models.FloatField(null=True, blank=True)
    trace_id = models.CharField(max_length=TRACE_MAX_LENGTH, blank=True, default="")
    # The W3C traceparent of the span that enqueued the job (django_pgjobs.tracing), restored
    # by the worker to link each attempt's span to it; NULL when there was none.
    traceparent = models.CharField(  # noqa: DJ001
        max_length=TRACEPARENT_MAX_LENGTH, null=True, blank=True
    )
    fairness_key = models.CharField(  # noqa: DJ001
        max_length=FAIRNESS_KEY_MAX_LENGTH, null=True, blank=True
    )
    # The job's limit key (``name:key``) and its handler's max_running when it was enqueued,
    # when its handler declares a Limit; and the slot of its key it holds (while ready or
    # running) or last held. docs/limits.md.
    limit_key = models.CharField(  # noqa: DJ001
        max_length=LIMIT_KEY_MAX_LENGTH, null=True, blank=True
    )
    limit_max = models.IntegerField(null=True, blank=True)
    limit_slot = models.SmallIntegerField(null=True, blank=True)
    # Under a Rate (limit_max 1: the key's one slot is held by the job that starts next, from
    # when it is given it until its claim): seconds between starts of one unit of weight, how
    # many units may start at once, and how many this job weighs.
    rate_interval = models.FloatField(null=True, blank=True)
    rate_burst = models.IntegerField(null=True, blank=True)
    rate_weight = models.IntegerField(null=True, blank=True)
    failure_class = models.CharField(
        max_length=32, blank=True, default="", choices=FailureClass.choices
    )
    terminal_reason = models.CharField(
        max_length=32, blank=True, default="", choices=TerminalReason.choices
    )
    last_error = models.TextField(blank=True, default="")
    result = models.JSONField(null=True, blank=True)
    # Workflows (docs/workflows.md): the id its jobs share; while pending, how many of the jobs
    # it depends on have not yet ended as its edges require; and whether any job depends on it
    # (only then does its end look for dependents: the trigger's WHEN tests this column).
    workflow_id = models.UUIDField(null=True, blank=True)
    pending_dependencies = models.IntegerField(null=True, blank=True)
    has_dependents = models.BooleanField(default=False, db_default=False)
    # The handler's last ctx.progress(): {"done": n, "total": n or null, "message": "..."},
    # written under its lease at most once a second.
    progress = models.JSONField(null=True, blank=True)
    # Jobs of a schedule: which one and the tick's intended time (ctx.scheduled_at). A unique
    # index holds one job per (schedule, tick); PROTECT keeps schedules that jobs name.
    schedule = models.ForeignKey(Schedule, on_delete=models.PROTECT, null=True, blank=True,
                                 db_index=False, related_name="+")
    scheduled_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())

    # Not a column: on a job ``enqueue`` returned, whether that call inserted it (True) or found
    # it already there (False: its idempotency key, unique key or schedule tick was taken).
    # None on a job read any other way.
    created: bool | None = None

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
            # The jobs waiting for a slot of their limit key, in the order a freed slot takes
            # them (the claim's order, within the key).
            models.Index(
                "limit_key",
                models.F("priority").desc(),
                "run_at",
                "id",
                name="pgjobs_job_throttled_idx",
                condition=Q(status=JobStatus.THROTTLED),
            ),
            # The next job of each rate key, waiting for its time (it holds the key's slot):
            # what the limits step makes ready when that time comes, and when it next must.
            models.Index(
                fields=["run_at"],
                name="pgjobs_job_rate_next_idx",
                condition=Q(status=JobStatus.THROTTLED, limit_slot__isnull=False),
            ),
            # The expire step's pending jobs past their deadline, and a workflow's jobs.
            models.Index(
                fields=["deadline"],
                name="pgjobs_job_pending_idx",
                condition=Q(status=JobStatus.PENDING),
            ),
            models.Index(
                fields=["workflow_id"],
                name="pgjobs_job_workflow_idx",
                condition=Q(workflow_id__isnull=False),
            ),
            # The admin's search by trace id or its first characters (text_pattern_ops answers
            # LIKE 'prefix%' in any collation); without it a search reads the whole history.
            models.Index(
                fields=["trace_id"], name="pgjobs_job_trace_prefix_idx", condition=~Q(trace_id=""),
                opclasses=["text_pattern_ops"],
            ),
        ]
        constraints = [
            # The table's rules (status, priority range, lease state, bounds, limits, rates,
            # ticks...), each named, in one PL/pgSQL function: see JOB_RULE_COLUMNS.
            RulesCheck(
                condition=models.Func(*(models.F(c) for c in JOB_RULE_COLUMNS),
                                      function="pgjobs_job_rules",
                                      output_field=models.BooleanField()),
                name="pgjobs_job_rules",
            ),
            models.UniqueConstraint(
                fields=["task", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="pgjobs_job_idempotency_key",
            ),
            # Only active jobs are in it: once a job finishes, its key is free again.
            models.UniqueConstraint(
                fields=["task", "unique_key"],
                condition=Q(unique_key__isnull=False, unique_period_start__isnull=True,
                            status__in=ACTIVE_STATUSES),
                name="pgjobs_job_unique_while_active",
            ),
            models.UniqueConstraint(
                fields=["task", "unique_key", "unique_period_start"],
                condition=Q(unique_period_start__isnull=False),
                name="pgjobs_job_unique_per_period",
            ),
            # Exactly one job per (schedule, tick), however many workers enqueue at once.
            models.UniqueConstraint(
                fields=["schedule", "scheduled_at"],
                condition=Q(schedule__isnull=False),
                name="pgjobs_job_schedule_tick",
            ),
        ]
        permissions = [
            ("retry_job", "Can retry dead or cancelled jobs"),
            ("replay_job", "Can replay a job as a new job"),
            ("cancel_job", "Can cancel jobs"),
            ("deadletter_job", "Can move jobs to dead by hand"),
            ("view_raw_payload", "Can see unredacted payloads"),
            ("reveal_encrypted", "Can decrypt the encrypted fields of payloads and results"),
        ]

    def __str__(self) -> str:
        return f"{self.task}#{self.pk} ({self.status})"

    def success_attempt(self) -> Attempt | None:
        """The attempt that succeeded, as its row would read, unsaved; None unless there is one.

        An attempt that succeeds gets no row (``settle_jobs``): its job keeps its worker, its
        times and its handler's time. A job that succeeded before that change has a row, and no
        lease_owner left on it.
        """
        # KEPT_SUCCESS, read on this row.
        if (self.status != JobStatus.SUCCEEDED or self.lease_owner is None
                or self.claimed_at is None):
            return None
        return Attempt(job=self, number=self.attempts, worker_id=self.lease_owner,
                       claimed_at=self.claimed_at, finished_at=self.finished_at,
                       outcome=AttemptOutcome.SUCCEEDED,
                       reported_outcome=AttemptOutcome.SUCCEEDED, duration_ms=self.duration_ms)

    def attempt_history(self) -> list[Attempt]:
        """Every ended attempt of this job in the order they were claimed: its attempt rows,
        and its success, which has none (``success_attempt``)."""
        success = self.success_attempt()
        history = [*self.attempt_set.all(), *([] if success is None else [success])]
        return in_claim_order(history)


def in_claim_order(attempts: Iterable[Attempt]) -> list[Attempt]:
    """``attempts`` (rows, and successes built by ``Job.success_attempt``) as they were claimed.
    A late report's row is stamped when it arrived, which can be after the success."""
    return sorted(attempts, key=lambda a: (a.claimed_at, a.pk is None, a.pk or 0))


class Attempt(models.Model):
    # One row per ended attempt, written once by the statement that ends it (its outcome known),
    # except an attempt that succeeded: its job keeps it (Job.claimed_at, lease_owner,
    # finished_at, duration_ms; Job.success_attempt() builds it as a row would read).
    # The running attempt lives on its job (lease_owner, lease_token, claimed_at); RUNNING rows
    # are only those a worker older than migration 0008 wrote at claim time, and any outcome
    # other than a success (which only a claim without such a row can have) completes them.
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
    # What the worker reported. It differs from outcome when a pending cancel ended the job, and
    # when the report came too late: recorded LOST, or, on an attempt the rescue step or the
    # worker had already ended (lease expired, timed out, cancelled), beside that outcome.
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
            # The history's sample counts the attempts that failed in its minute, by when they
            # ended: a long attempt fails minutes after its claim.
            models.Index(
                fields=["finished_at"],
                name="pgjobs_attempt_failed_end_idx",
                condition=~Q(failure_class=""),
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of job {self.job_id} ({self.outcome})"


class Dependency(models.Model):
    """An edge of a workflow: ``job`` waits, pending, until ``upstream`` ends as ``requires``
    asks (docs/workflows.md). Written with the dependent job, in its enqueue's transaction;
    resolved (``upstream_status`` set) by the statement that ends the upstream job. No foreign
    key constraints: the prune step deletes a job's edges with it, in either direction."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, db_constraint=False,
                            related_name="dependency_edges")
    upstream = models.ForeignKey(Job, on_delete=models.CASCADE, db_constraint=False,
                                 db_index=False, related_name="dependent_edges")
    requires = models.CharField(max_length=16, choices=Requires.choices)
    # How the upstream job ended, once it did: "" until then.
    upstream_status = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        db_table = "pgjobs_dependency"
        indexes = [
            # The edges an ending job resolves, and the dependents a workflow page lists.
            models.Index(fields=["upstream"], name="pgjobs_dependency_upstream_idx"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "upstream"], name="pgjobs_dependency_once"),
            models.CheckConstraint(condition=Q(requires__in=Requires.values),
                                   name="pgjobs_dependency_requires_valid"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} after job {self.upstream_id} ({self.requires})"


class KeyLimit(models.Model):
    """An operator's limit for one limit key, in place of its handler's: a max_running for a
    Limit's key, or a rate (count per per_seconds, burst) for a Rate's."""

    key = models.CharField(primary_key=True, max_length=LIMIT_KEY_MAX_LENGTH)
    max_running = models.PositiveIntegerField(null=True, blank=True)
    rate_count = models.PositiveIntegerField(null=True, blank=True)
    rate_per_seconds = models.FloatField(null=True, blank=True)
    rate_burst = models.PositiveIntegerField(null=True, blank=True)
    changed_at = models.DateTimeField(db_default=Now())
    changed_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        db_table = "pgjobs_key_limit"
        verbose_name = "limit"
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__gte=1, max_running__lte=MAX_RUNNING_LIMIT),
                name="pgjobs_key_limit_range",
            ),
            # One kind: a max_running, or a whole rate.
            models.CheckConstraint(
                condition=Q(max_running__isnull=False, rate_count__isnull=True,
                            rate_per_seconds__isnull=True, rate_burst__isnull=True)
                | Q(max_running__isnull=True, rate_count__gte=1,
                    rate_count__lte=MAX_RUNNING_LIMIT, rate_per_seconds__gt=0,
                    rate_burst__gte=1, rate_burst__lte=MAX_RUNNING_LIMIT),
                name="pgjobs_key_limit_kind",
            ),
        ]

    def __str__(self) -> str:
        if self.rate:
            return f"{self.key} ({self.rate})"
        return f"{self.key} (at most {self.max_running})"

    @property
    def rate(self) -> str:
        """The operator's rate as operators read it, or "" for a max_running."""
        if self.rate_count is None or self.rate_per_seconds is None:
            return ""
        return f"{self.rate_count} per {self.rate_per_seconds:g}s, burst {self.rate_burst}"


class KeyRate(models.Model):
    """A rate key's state: when its starts so far would end, spaced at its rate (its
    theoretical arrival time), and until when a handler's ``RateLimited`` holds it back.

    Written by the claims that start its jobs and by push-backs, never by an enqueue: a
    caller's transaction holds no lock a worker waits for.
    """

    key = models.CharField(primary_key=True, max_length=LIMIT_KEY_MAX_LENGTH)
    tat = models.DateTimeField(null=True, blank=True)  # None: no start charged yet
    blocked_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgjobs_key_rate"
        verbose_name = "rate"

    def __str__(self) -> str:
        return self.key


class WorkerProcess(models.Model):
    """A worker process, as its last heartbeat said (``django_pgjobs.workers``): who it is, what
    it serves, and when it was last seen. A row whose worker stopped cleanly says when; one whose
    worker died says nothing more, and its heartbeat grows old."""

    worker_id = models.CharField(primary_key=True, max_length=200)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    version = models.CharField(max_length=50, blank=True, default="")
    queues = models.JSONField(null=True, blank=True)  # None: every queue
    concurrency = models.PositiveIntegerField()
    # A listening worker keeps a session named after it (pg_stat_activity): while that session
    # is gone, so is the worker, whatever its last heartbeat says.
    listens = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    running = models.PositiveIntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pgjobs_worker"
        verbose_name = "worker"

    def __str__(self) -> str:
        return self.worker_id


class QueueSample(models.Model):
    """One queue's state at the end of one sampling interval (``django_pgjobs.history``): how
    many jobs waited and ran then, how long its oldest ready job had waited, and how many jobs
    succeeded and attempts failed during the interval. A queue with nothing to count has no row.
    Written by one statement per interval and kept ``PGJOBS_HISTORY_RETENTION_SECONDS``."""

    id = models.BigAutoField(primary_key=True)
    sampled_at = models.DateTimeField()  # the interval's end, on the interval's grid
    queue = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    ready = models.PositiveIntegerField(default=0)
    waiting = models.PositiveIntegerField(default=0)  # scheduled, retrying, throttled or pending
    running = models.PositiveIntegerField(default=0)
    oldest_ready_seconds = models.FloatField(null=True, blank=True)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)  # failed attempts, retried or not
    dead = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "pgjobs_queue_sample"
        verbose_name = "queue sample"
        constraints = [
            models.UniqueConstraint(fields=["sampled_at", "queue"],
                                    name="pgjobs_queue_sample_once"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} at {self.sampled_at:%Y-%m-%d %H:%M}"


class KeySlot(models.Model):
    """One unit of a limit key: held by the job it names while that job is ready or running.

    A key has a row for each slot below its largest limit yet. The slots are taken with SKIP
    LOCKED and freed by the statement that ends the holder's run (triggers of pgjobs_job,
    docs/limits.md); ``transitions.free_orphaned_slots`` frees any whose holder is gone.
    """

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=LIMIT_KEY_MAX_LENGTH)
    n = models.PositiveSmallIntegerField()
    # Not a foreign key: the holder's row is read, never joined by a constraint, and a slot
    # must not stop a job's deletion.
    job_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "pgjobs_key_slot"
        constraints = [
            models.UniqueConstraint(fields=["key", "n"], name="pgjobs_key_slot_key_n"),
        ]
        indexes = [
            models.Index(fields=["key"], name="pgjobs_key_slot_free_idx",
                         condition=Q(job_id__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"{self.key}#{self.n}"


class IdempotencyReceipt(models.Model):
    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=RECEIPT_SCOPE_MAX_LENGTH)
    key = models.CharField(max_length=KEY_MAX_LENGTH)
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
        indexes = [
            models.Index(fields=["expires_at"], name="pgjobs_receipt_expires_idx"),
            # A job's page lists the receipts its attempts took.
            models.Index(fields=["job"], name="pgjobs_receipt_job_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"


class QueueState(models.Model):
    """One row per queue an operator has paused or resumed; workers do not claim from a paused one.

    A queue without a row is running. The claim reads this table in the same statement (a
    probe by primary key), so a pause stops claims as soon as it commits.
    """

    name = models.CharField(primary_key=True, max_length=QUEUE_NAME_MAX_LENGTH,
                            validators=[validate_queue_name])
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField(db_default=Now())
    changed_by = models.CharField(max_length=150, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    class Meta:
        db_table = "pgjobs_queue"
        verbose_name = "queue"
        permissions = [("pause_queue", "Can pause and resume queues")]

    def __str__(self) -> str:
        return f"{self.name} ({'paused' if self.paused else 'active'})"


class OperatorActionKind(models.TextChoices):
    RETRY = "retry", "retry"
    REPLAY = "replay", "replay"
    CANCEL = "cancel", "cancel"
    DEAD_LETTER = "dead_letter", "dead-letter"
    VIEW_RAW_PAYLOAD = "view_raw_payload", "view raw payload"
    REVEAL_ENCRYPTED = "reveal_encrypted", "decrypt encrypted fields"
    PAUSE_QUEUE = "pause_queue", "pause queue"
    RESUME_QUEUE = "resume_queue", "resume queue"
    SET_KEY_LIMIT = "set_key_limit", "set key limit"
    RUN_NOW = "run_now", "run now"
    SCHEDULE_CREATE = "schedule_create", "create schedule"
    SCHEDULE_CHANGE = "schedule_change", "change schedule"
    SCHEDULE_PAUSE = "schedule_pause", "pause schedule"
    SCHEDULE_RESUME = "schedule_resume", "resume schedule"
    SCHEDULE_RUN_NOW = "schedule_run_now", "run schedule now"


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
    # The jobs (or schedules) the operator selected; ``detail`` says what happened to which.
    job_ids = models.JSONField(default=list)
    schedule_ids = models.JSONField(default=list, blank=True)
    selected = models.PositiveIntegerField(default=0)
    changed = models.PositiveIntegerField(default=0)
    detail = models.JSONField(default=dict)

    class Meta:
        db_table = "pgjobs_operator_action"
        # A job page's operator history finds the actions whose job_ids hold the job (@>) through
        # a GIN index that migration 0009 makes in SQL (a GinIndex here would need
        # django.contrib.postgres in INSTALLED_APPS).

    def __str__(self) -> str:
        return f"{self.get_action_display()} by {self.actor_name or '(no user)'}"
