"""Small single-purpose maintenance steps that every worker runs on a cadence.

Each step is bounded (a batch limit) and safe to run from many workers at once: the statements
lock with SKIP LOCKED or are idempotent. Every statement is its own short transaction, so
vacuum can reclaim what a step leaves behind while the step is still running.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import DEFAULT_DB_ALIAS, connections

from . import sql
from .conf import DEFAULT_RETENTION_SECONDS, settings
from .history import sample_queues
from .models import PRIORITY_MAX, PRIORITY_MIN
from .receipts import delete_expired_receipts
from .schedules import ScheduleStep
from .status import TERMINAL_STATUSES, JobStatus
from .transitions import (
    ORPHAN_SCAN,
    admit_waiting_keys,
    delete_finished_jobs,
    expire_pending_jobs,
    free_orphaned_slots,
    orphaned_slots_start,
    promote_due_jobs,
    raise_waiting_priorities,
    ready_queues,
    rescue_expired_leases,
    start_rate_heads,
)
from .validation import escape_control, number_problem, whole_number_problem

logger = logging.getLogger("django_pgjobs.maintenance")

# One aging or pruning run stops after this many batches and asks to run again at once: the
# main thread also runs the watchdog and the other steps, so no step may hold it for long.
BATCHES_PER_RUN = 20
# While a queue's backlog stays over the policy, the warning repeats this often.
BACKLOG_REMIND_SECONDS = 300.0
# The longest interval or retention a step accepts: a hundred years.
_SECONDS_MAX = 100 * 365 * 24 * 3600
# The (run_at, id) keyset position before every job.
AGING_KEYSET_START = (datetime(1, 1, 1, tzinfo=UTC), 0)


@dataclass
class Step:
    """A step the worker's main thread runs every ``interval_seconds`` (with 10% jitter).

    A run that changed ``backlog_at`` rows or more stopped at its bound with work left, so the
    next run is due at once instead of after the interval.
    """

    name: str
    interval_seconds: float
    run: Callable[[str], int]
    backlog_at: int | None = None
    # A step that made jobs ready wakes the worker's idle executors.
    wakes_workers: bool = False
    # Seconds until the step has work again, when it knows (asked after each run): it runs then
    # if that is sooner than its interval.
    due_again_in: Callable[[], float | None] | None = None
    next_due: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.interval_seconds) and self.interval_seconds > 0):
            raise ValueError(f"{self.name}: interval must be > 0 seconds, "
                             f"got {self.interval_seconds!r}")
        if self.backlog_at is not None and self.backlog_at < 1:
            raise ValueError(f"{self.name}: backlog_at must be at least 1")

    def due(self, now: float) -> bool:
        return now >= self.next_due

    def schedule_next(self, now: float, changed: int = 0) -> None:
        if self.backlog_at is not None and changed >= self.backlog_at:
            self.next_due = now
            return
        self.next_due = now + self.interval_seconds * random.uniform(0.9, 1.1)
        again = self.due_again_in() if self.due_again_in is not None else None
        if again is not None:
            self.next_due = min(self.next_due, now + max(0.0, again))


def promote_step(using: str = DEFAULT_DB_ALIAS) -> int:
    """Make due scheduled and retrying jobs ready; return how many."""
    return len(promote_due_jobs(settings.PROMOTE_BATCH, using=using))


def expire_pending_step(using: str = DEFAULT_DB_ALIAS) -> int:
    """End pending jobs whose deadline passed while they waited; return how many."""
    return len(expire_pending_jobs(settings.RESCUE_BATCH, using=using))


def rescue_step(using: str = DEFAULT_DB_ALIAS) -> int:
    """Take back running jobs whose lease expired; return how many."""
    rescued = rescue_expired_leases(settings.RESCUE_BATCH, using=using)
    for outcome in rescued:
        logger.warning(
            "job.lease_expired id=%s task=%s attempt=%s trace=%s next=%s reason=%s",
            outcome.job_id, outcome.task, outcome.attempt,
            escape_control(outcome.trace_id) or "-", outcome.status.value,
            outcome.terminal_reason or "-",
            extra={"pgjobs": {"job_id": outcome.job_id, "outcome": "lease_expired"}},
        )
    return len(rescued)


def admit_step(using: str = DEFAULT_DB_ALIAS) -> int:
    """Give free slots to throttled jobs the statements that freed them could not see."""
    return admit_waiting_keys(settings.PROMOTE_BATCH, using=using)


class RateStep:
    """Make ready the jobs under a rate whose time to start has come, and remember when the
    next one's comes: the step runs again then, so a rate of several a second is kept to the
    worker's wake-up resolution, not to its poll interval."""

    def __init__(self) -> None:
        self.next_in: float | None = None

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        started, self.next_in = start_rate_heads(settings.PROMOTE_BATCH, using=using)
        return started

    def due_again_in(self) -> float | None:
        return self.next_in


class OrphanedSlotsStep:
    """Free slots whose holder is gone; each is logged, as it should not happen.

    Each run looks through the next ``scan`` slot rows by id, so a run's work is bounded
    however many slots there are, and starts over after the last. The first run starts at
    ``start``, or at a slot row at random: workers started together, or restarted before their
    look went round, read different windows.
    """

    def __init__(self, scan: int = ORPHAN_SCAN, start: int | None = None) -> None:
        self.scan = scan
        self.after = start

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        if self.after is None:
            self.after = orphaned_slots_start(using=using)
        freed, self.after = free_orphaned_slots(settings.RESCUE_BATCH, after=self.after,
                                                scan=self.scan, using=using)
        for key, n, job_id in freed:
            logger.error("limit.orphaned_slot key=%s slot=%s job=%s: freed; its holder was "
                         "deleted or changed without the triggers of pgjobs_job",
                         escape_control(key), n, job_id)
        return len(freed)


# --- priority aging ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgingPolicy:
    """How ready jobs gain priority while they wait; validated on construction."""

    interval_seconds: float
    step: int
    cap: int
    batch: int

    def __post_init__(self) -> None:
        _positive_seconds("aging interval", self.interval_seconds)
        _whole("aging step", self.step, 0, PRIORITY_MAX - PRIORITY_MIN)
        _whole("aging cap", self.cap, PRIORITY_MIN, PRIORITY_MAX)
        _whole("aging batch", self.batch, 1, 100_000)

    @classmethod
    def from_settings(cls) -> AgingPolicy:
        return cls(
            float(settings.AGING_INTERVAL_SECONDS), settings.AGING_STEP, settings.AGING_CAP,
            settings.AGING_BATCH,
        )

    @property
    def enabled(self) -> bool:
        return self.step > 0

    def waits_to_cap(self, base_priority: int) -> float:
        """Seconds of being ready by which a job of ``base_priority`` has earned the cap."""
        if base_priority >= self.cap:
            return 0.0
        if not self.enabled:
            return math.inf
        return math.ceil((self.cap - base_priority) / self.step) * self.interval_seconds


def age_priorities(using: str = DEFAULT_DB_ALIAS, *, policy: AgingPolicy | None = None) -> int:
    """Raise the priority of ready jobs that waited past the aging interval; return how many.

    Walks the claim index one (queue, priority) level at a time, highest level first: a job
    raised out of a level lands in a level already walked, so one run raises each job at most
    once. Stops after ``BATCHES_PER_RUN`` batches.
    """
    policy = policy or AgingPolicy.from_settings()
    if not policy.enabled:
        return 0
    budget = policy.batch * BATCHES_PER_RUN
    raised = 0
    for queue in ready_queues(using=using):
        for level in _levels_below_cap(queue, policy.cap, using):
            after = AGING_KEYSET_START
            while budget > 0:
                limit = min(policy.batch, budget)
                batch = raise_waiting_priorities(
                    queue, level, after=after, limit=limit, step=policy.step,
                    interval_seconds=policy.interval_seconds, cap=policy.cap, using=using,
                )
                raised += batch.raised
                budget -= max(batch.taken, 1)
                if batch.last is None or batch.taken < limit:
                    break
                after = batch.last
            if budget <= 0:
                return raised
    return raised


def _levels_below_cap(queue: str, cap: int, using: str) -> list[int]:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("aging_levels"), {"queue": queue, "cap": cap})
        return [row[0] for row in cursor.fetchall()]


# --- retention -----------------------------------------------------------------------------------


def retention_seconds(status: str) -> float | None:
    """How long a job finished in ``status`` is kept (None: forever), per PGJOBS_RETENTION_SECONDS.

    A terminal state the setting leaves out keeps its default.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"only terminal jobs are pruned, not {status!r}")
    configured = dict(settings.RETENTION_SECONDS)
    value = configured.get(status, DEFAULT_RETENTION_SECONDS[status])
    return None if value is None else float(value)


def prune_jobs(
    status: str, retention: float, limit: int, *, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, int]:
    """Delete up to ``limit`` jobs finished in ``status`` over ``retention`` seconds ago.

    Their attempts go in the same statement. Return (jobs deleted, attempts deleted).
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"only terminal jobs are pruned, not {status!r}")
    _positive_seconds("retention", retention, allow_zero=True)
    _whole("prune batch", limit, 1, 1_000_000)
    return delete_finished_jobs(status, float(retention), limit, using=using)


def prune_receipts(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Delete up to ``limit`` idempotency receipts past their expiry; return how many."""
    _whole("prune batch", limit, 1, 1_000_000)
    return delete_expired_receipts(limit, using=using)


def count_prunable_jobs(status: str, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """How many jobs finished in ``status`` are past their retention now."""
    retention = retention_seconds(status)
    if retention is None:
        return 0
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("count_prunable_jobs"),
                       {"status": status, "retention": retention})
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def count_expired_receipts(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """How many idempotency receipts are past their expiry now."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("count_expired_receipts"))
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def prune_finished(using: str = DEFAULT_DB_ALIAS) -> int:
    """Delete one batch per terminal state past retention, and one of expired receipts.

    Return how many jobs and receipts went; a full batch anywhere makes the step run again.
    """
    limit = int(settings.PRUNE_BATCH)
    deleted = 0
    for status in (JobStatus.SUCCEEDED, JobStatus.CANCELLED, JobStatus.DEAD):
        retention = retention_seconds(status)
        if retention is None:
            continue
        jobs, attempts = prune_jobs(status, retention, limit, using=using)
        if jobs:
            logger.info("maintenance.prune status=%s jobs=%d attempts=%d", status, jobs, attempts)
        deleted += jobs
    receipts = prune_receipts(limit, using=using)
    if receipts:
        logger.info("maintenance.prune receipts=%d", receipts)
    return deleted + receipts


# --- backlog age ---------------------------------------------------------------------------------


class BacklogWatch:
    """Log when a served queue's oldest ready job has waited past PGJOBS_BACKLOG_MAX_AGE_SECONDS.

    Warns when a queue goes over, again every ``BACKLOG_REMIND_SECONDS`` while it stays over,
    and says when it is back within the policy.
    """

    def __init__(self, queues: Collection[str] | None = None) -> None:
        self.queues = set(queues) if queues is not None else None
        self._warned_at: dict[str, float] = {}

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        """Check now; return how many served queues are over their limit."""
        # The dashboard's reads, imported at the first check rather than at a worker's start.
        from .stats import backlog_max_age, backlog_policy

        policy = backlog_policy()
        ages = self.oldest_ready_ages(using)
        over: dict[str, tuple[float, float]] = {}
        for queue, age in ages.items():
            limit = backlog_max_age(queue, policy)
            if limit is not None and age > limit:
                over[queue] = (age, limit)
        now = time.monotonic()
        for queue, (age, limit) in sorted(over.items()):
            warned = self._warned_at.get(queue)
            if warned is None or now - warned >= BACKLOG_REMIND_SECONDS:
                self._warned_at[queue] = now
                logger.warning(
                    "queue.backlog_too_old queue=%s oldest_ready_age_s=%.1f max_age_s=%.1f",
                    queue, age, limit,
                    extra={"pgjobs": {"queue": queue, "oldest_ready_age_seconds": age,
                                      "backlog_max_age_seconds": limit}},
                )
        for queue in sorted(set(self._warned_at) - set(over)):
            del self._warned_at[queue]
            logger.info("queue.backlog_within_policy queue=%s", queue)
        return len(over)

    def oldest_ready_ages(self, using: str) -> dict[str, float]:
        """Seconds the oldest ready job of each served queue has waited since it became due."""
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("stats_oldest_ready"))
            rows = cursor.fetchall()
        return {
            queue: float(age) for queue, age in rows
            if self.queues is None or queue in self.queues
        }


# --- the default set -----------------------------------------------------------------------------


def default_steps(
    poll_interval: float, *, queues: Sequence[str] | None = None
) -> list[Step]:
    """The maintenance every worker runs; ``queues`` are the queues it serves (None: all)."""
    steps = [
        Step("promote", poll_interval, promote_step, wakes_workers=True),
        Step("rescue", float(settings.RESCUE_INTERVAL_SECONDS), rescue_step),
        # Limits: a slot freed while the job that would take it was uncommitted is given on
        # the promote step's cadence; orphaned slots (none, unless a writer bypassed the
        # triggers) are looked for on the rescue step's.
        Step("limits", poll_interval, admit_step, wakes_workers=True),
        Step("orphaned slots", float(settings.RESCUE_INTERVAL_SECONDS), OrphanedSlotsStep()),
        # Workflows: a pending job whose deadline passes ends dead on the rescue step's cadence.
        Step("expire pending", float(settings.RESCUE_INTERVAL_SECONDS), expire_pending_step),
        _rate_step(poll_interval),
        Step("prune", float(settings.PRUNE_INTERVAL_SECONDS), prune_finished,
                 backlog_at=int(settings.PRUNE_BATCH)),
        # Twice per interval: the first run in an interval samples it, the jitter never skips
        # one, and a second run finds it sampled at the cost of one index probe.
        Step("history", float(settings.HISTORY_INTERVAL_SECONDS) / 2, _sample_history),
        # Syncs the declared schedules on its first run, then enqueues due ticks in batches.
        Step("schedules", float(settings.SCHEDULE_INTERVAL_SECONDS), ScheduleStep(),
                 backlog_at=int(settings.SCHEDULE_BATCH), wakes_workers=True),
    ]
    aging = AgingPolicy.from_settings()
    if aging.enabled:
        # Twice per interval, so a job's priority trails what its wait has earned by at most
        # half an interval.
        steps.append(Step("aging", aging.interval_seconds / 2, age_priorities,
                              backlog_at=aging.batch * BATCHES_PER_RUN))
    if settings.BACKLOG_MAX_AGE_SECONDS:
        steps.append(Step("backlog", float(settings.BACKLOG_CHECK_INTERVAL_SECONDS),
                              BacklogWatch(queues)))
    return steps


RATES_STEP = "rates"


def _sample_history(using: str = DEFAULT_DB_ALIAS) -> int:
    sample_queues(using)
    return 0  # never a backlog: one sample per interval is all there is


def _rate_step(poll_interval: float) -> Step:
    run = RateStep()
    return Step(RATES_STEP, poll_interval, run, wakes_workers=True, backlog_at=int(
        settings.PROMOTE_BATCH), due_again_in=run.due_again_in)


def _positive_seconds(name: str, value: object, *, allow_zero: bool = False) -> None:
    problem = number_problem(value, 0, _SECONDS_MAX, low_inclusive=allow_zero)
    if problem is not None:
        raise ValueError(f"{name} {problem}")


def _whole(name: str, value: object, low: int, high: int) -> None:
    problem = whole_number_problem(value, low, high)
    if problem is not None:
        raise ValueError(f"{name} {problem}")
