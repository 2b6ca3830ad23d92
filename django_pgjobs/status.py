"""The job state machine, attempt outcomes, failure classes and schedule policies, written
down once.

docs/state-machine.md carries the same table; a test keeps the two in step. docs/schedules.md
describes the schedule policies.
"""

from django.db import models


class JobStatus(models.TextChoices):
    # Waiting for jobs it depends on (docs/workflows.md): outside the claim index until the last
    # of them ends as its edge requires. The statement that settles that dependency makes it
    # READY (or SCHEDULED, before its run_at), or CANCELLED when an edge can no longer be met;
    # the expire step ends it DEAD when its deadline passes first; an operator may cancel it.
    PENDING = "pending", "pending"
    # Waiting for run_at (enqueued with a delay). The promote step moves it to READY when due;
    # an operator may cancel it.
    SCHEDULED = "scheduled", "scheduled"
    # Due, but its limit key is at its limit (a ``Limit`` of its handler): it waits outside the
    # claim index. The database makes it READY in the statement that frees a slot of its key
    # (docs/limits.md); an operator may cancel it.
    THROTTLED = "throttled", "throttled"
    # Eligible now. A worker's claim moves it to RUNNING; an operator may cancel it.
    READY = "ready", "ready"
    # Leased to one worker. Only the lease holder settles it (to SUCCEEDED, RETRYING, READY on
    # release or snooze, DEAD, CANCELLED when an operator asked it to stop); the rescue step
    # takes it when the lease expires.
    RUNNING = "running", "running"
    # Failed, waiting out its backoff. The promote step moves it to READY when due; an operator
    # may cancel or dead-letter it.
    RETRYING = "retrying", "retrying"
    # Terminal: the handler returned. Only pruning removes it.
    SUCCEEDED = "succeeded", "succeeded"
    # Terminal: will not run again without an operator's retry. terminal_reason says why.
    DEAD = "dead", "dead"
    # Terminal: an operator cancelled it (waiting, or running: its worker settled it as
    # cancelled within a second of the request). An operator may retry it.
    CANCELLED = "cancelled", "cancelled"


# The groups the operator transitions and the admin act on, named once. Tuples, in the order of
# the states above, because the admin lists them in that order.
TERMINAL_STATUSES = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)
# Not running and not finished: an operator may cancel or dead-letter these.
WAITING_STATUSES = (JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.THROTTLED,
                    JobStatus.READY, JobStatus.RETRYING)
# Not finished: a unique key (without a period) is held by a job in one of these.
ACTIVE_STATUSES = (JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.THROTTLED, JobStatus.READY,
                   JobStatus.RUNNING, JobStatus.RETRYING)
# An operator may send these back to ready with a fresh attempt budget.
RETRYABLE_STATUSES = (JobStatus.DEAD, JobStatus.CANCELLED)


class AttemptOutcome(models.TextChoices):
    RUNNING = "running", "running"  # claimed; the worker has not reported yet
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"  # the handler raised; the job retries
    DEAD = "dead", "dead"  # the handler raised and the job went dead
    SNOOZED = "snoozed", "snoozed"  # the handler deferred itself without using an attempt
    RELEASED = "released", "released"  # handed back unstarted (shutdown, lease too short to start)
    LEASE_EXPIRED = "lease_expired", "lease expired"  # the rescue step found the lease expired
    TIMED_OUT = "timed_out", "timed out"  # still running at its timeout; the worker settled it
    CANCELLED = "cancelled", "cancelled"  # an operator cancelled it while it ran
    LOST = "lost", "lost"  # the worker reported after it had lost the lease; nothing applied


class FailureClass(models.TextChoices):
    TRANSIENT = "transient", "transient"
    RATE_LIMITED = "rate_limited", "rate limited"
    PERMANENT = "permanent", "permanent"
    LEASE_EXPIRED = "lease_expired", "lease expired"
    TIMEOUT = "timeout", "timeout"
    UNKNOWN = "unknown", "unknown"
    UNKNOWN_TASK = "unknown_task", "unknown task"
    UNSUPPORTED_VERSION = "unsupported_version", "unsupported payload version"
    # A field encrypted under a key this worker's PGJOBS_ENCRYPTION_KEYS does not hold.
    UNKNOWN_KEY = "unknown_key", "encryption key not configured"


class TerminalReason(models.TextChoices):
    SUCCEEDED = "succeeded", "succeeded"
    PERMANENT_ERROR = "permanent_error", "permanent error"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", "attempts exhausted"
    DEADLINE_PASSED = "deadline_passed", "deadline passed"
    UNKNOWN_TASK = "unknown_task", "unknown task"
    UNSUPPORTED_VERSION = "unsupported_version", "unsupported payload version"
    UNKNOWN_KEY = "unknown_key", "encryption key not configured"
    SNOOZE_LIMIT = "snooze_limit", "snoozed too often"
    OPERATOR = "operator", "operator action"
    # Cancelled while pending: a job it depends on ended in a way its edge does not accept.
    DEPENDENCY = "dependency", "dependency not met"


# --- schedules ----------------------------------------------------------------------------------


class MisfirePolicy(models.TextChoices):
    """What runs of the ticks no worker enqueued in time (``ticks.MISFIRE_KEEPS`` says how many)."""

    SKIP = "skip", "skip: only the latest missed tick runs"
    CATCH_UP = "catch_up", "catch up: every missed tick runs, up to the catch-up limit"
    NONE = "none", "none: missed ticks do not run"


class OverlapPolicy(models.TextChoices):
    ALLOW = "allow", "allow: a tick runs even while the previous tick's job has not finished"
    SKIP = "skip", "skip: a tick is skipped while the previous tick's job waits or runs"


class Requires(models.TextChoices):
    """What a dependency edge asks of the job it depends on (docs/workflows.md)."""

    SUCCEEDED = "succeeded", "succeeded: run only if it succeeded"
    FINISHED = "finished", "finished: run whatever it ended as"
    FAILED = "failed", "failed: run only if it ended dead or cancelled"


class ScheduleSource(models.TextChoices):
    """Who owns a schedule's definition: the sync at worker start owns code and settings."""

    CODE = "code", "code (@job)"
    SETTINGS = "settings", "settings (PGJOBS_SCHEDULES)"
    ADMIN = "admin", "admin"


class SkipReason(models.TextChoices):
    OVERLAP = "overlap", "overlap"
    MISFIRE = "misfire", "misfire"
