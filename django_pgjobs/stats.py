"""The numbers operators need, each one bounded query over an index.

Every function reads with the database clock and touches live rows, the recent end of the
finished index, or a capped sample of recent attempts: none of them scans history, so they stay
cheap on a table with millions of finished jobs. ``snapshot`` gathers them all; the dashboard,
``manage.py pgjobs_stats`` and the Prometheus collector read from it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from . import sql
from .conf import settings
from .status import JobStatus

RECENT_SECONDS = 24 * 3600  # dead and cancelled counts, failure classes
LATENCY_WINDOW_SECONDS = 3600  # handler and pickup latency, attempt numbers
SAMPLE_LIMIT = 10_000  # most recent attempts a latency figure is computed from
LEASE_SOON_SECONDS = 10.0
THROUGHPUT_MINUTES = 60
LIMIT_KEYS_SHOWN = 20  # limit keys, the most waiting first
WORKERS_SHOWN = 100  # worker rows, live first
ERROR_GROUPS_SHOWN = 20  # grouped errors, the most frequent first
HORIZON_SHOWN = 10  # what holds the vacuum horizon back, the furthest first

LIVE_STATUSES = (JobStatus.READY, JobStatus.THROTTLED, JobStatus.SCHEDULED, JobStatus.RUNNING,
                 JobStatus.RETRYING, JobStatus.PENDING)


@dataclass(frozen=True)
class QueueStats:
    """One queue: live counts, recent terminal counts, and its backlog against the policy."""

    queue: str
    ready: int = 0
    # Due, waiting for a slot of their limit key (docs/limits.md).
    throttled: int = 0
    scheduled: int = 0
    running: int = 0
    retrying: int = 0
    # Waiting for the jobs they depend on (docs/workflows.md).
    pending: int = 0
    dead_recent: int = 0
    cancelled_recent: int = 0
    oldest_ready_age_seconds: float | None = None
    # PGJOBS_BACKLOG_MAX_AGE_SECONDS for this queue (or its "*" entry); None: no policy.
    backlog_max_age_seconds: float | None = None
    # An operator paused it: workers claim nothing from it until it is resumed.
    paused: bool = False

    @property
    def healthy(self) -> bool:
        """False when the oldest ready job has waited longer than the backlog policy allows."""
        if self.backlog_max_age_seconds is None or self.oldest_ready_age_seconds is None:
            return True
        return self.oldest_ready_age_seconds <= self.backlog_max_age_seconds

    def count(self, status: str) -> int:
        """The live count for ``status``, or the recent count for dead and cancelled."""
        if status in (JobStatus.DEAD, JobStatus.CANCELLED):
            return int(getattr(self, f"{status}_recent"))
        return int(getattr(self, str(status)))


@dataclass(frozen=True)
class AttemptBucket:
    """How many recent claims were a job's ``number``-th attempt."""

    number: int
    count: int


@dataclass(frozen=True)
class Latency:
    """Percentiles over a sample; ``key`` is a task name or a queue name."""

    key: str
    samples: int
    p50: float
    p95: float
    max: float


@dataclass(frozen=True)
class LeaseHealth:
    """Running jobs whose lease has expired (rescue pending) or expires within ``soon_seconds``."""

    expired: int
    expiring_soon: int
    soon_seconds: float


@dataclass(frozen=True)
class FailureCount:
    failure_class: str
    task: str
    count: int


@dataclass(frozen=True)
class ErrorGroup:
    """Failed attempts of one task and class whose errors read alike (numbers and ids aside)."""

    task: str
    failure_class: str
    message: str  # the error's first line, numbers as N, ids as <id>, hex as <hex>
    count: int
    first_seen: datetime
    last_seen: datetime
    newest_job: int


@dataclass(frozen=True)
class ThroughputPoint:
    """Jobs that finished in the minute starting at ``minute``."""

    minute: datetime
    succeeded: int
    dead: int


@dataclass(frozen=True)
class LateSchedule:
    """A schedule whose last due tick was not enqueued within PGJOBS_SCHEDULE_GRACE_SECONDS.

    ``pending``: the tick ``due_at`` still has no job (no worker has enqueued it); otherwise it
    was handled ``late_seconds`` after its time, and the schedule is late until a tick is on
    time again.
    """

    name: str
    task: str
    pending: bool
    due_at: datetime
    late_seconds: float


@dataclass(frozen=True)
class ScheduleHealth:
    active: int = 0
    paused: int = 0
    retired: int = 0
    late: list[LateSchedule] = field(default_factory=list)
    grace_seconds: float = 0.0

    @property
    def on_time(self) -> bool:
        return not self.late


@dataclass(frozen=True)
class KeyLimitStats:
    """One limit key (docs/limits.md): the jobs holding its slots, its limit, what waits."""

    key: str
    running: int
    ready: int  # holding a slot, waiting for a worker of their queue
    max_running: int | None  # the operator's limit, else the jobs' declared one
    set_by_operator: bool  # its limit, or its rate
    waiting: int  # throttled
    oldest_waiting_seconds: float | None
    # A Rate's key: its starts a second and burst; when its next job may start (None: now, or
    # none waits); how much longer a handler's RateLimited holds it back.
    rate_per_second: float | None = None
    rate_burst: int | None = None
    next_start_seconds: float | None = None
    held_back_seconds: float | None = None

    @property
    def rate(self) -> str:
        """The rate as operators read it: "2/s" or "1 every 30s", and its burst above 1."""
        if self.rate_per_second is None:
            return ""
        per = self.rate_per_second
        said = f"{per:g}/s" if per >= 1 else f"1 every {1 / per:.3g}s"
        return said + (f", burst {self.rate_burst}" if self.rate_burst and self.rate_burst > 1
                       else "")


@dataclass(frozen=True)
class WorkerStats:
    """One worker process as its heartbeat row says (``django_pgjobs.workers``)."""

    worker_id: str
    host: str
    pid: int
    version: str
    queues: list[str] | None  # None: every queue
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    seen_seconds_ago: float
    running: int
    # live; stopped (it said so); gone (not seen for two heartbeats, or its listening session
    # ended: killed, or cut off from the database).
    state: str

    def serves(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues


@dataclass(frozen=True)
class HorizonHolder:
    """Something that keeps vacuum from removing the rows that died after it: a session's open
    snapshot or transaction, a replication slot, a prepared transaction (docs/operations.md)."""

    kind: str  # session, replication slot, prepared transaction
    holder: str  # the session's pid, the slot's name, the prepared transaction's gid
    application_name: str
    role: str
    state: str  # a session's state (idle in transaction, active), a slot's (in)activity
    seconds: float | None  # how long its transaction has been open; None for a slot
    xids: int  # transactions begun since its snapshot: how far it holds the horizon back

    def described(self) -> str:
        """Who it is, as the dashboard, pgjobs_stats and the system check say it."""
        age = f"open {self.seconds:.0f}s, " if self.seconds is not None else ""
        if self.kind == "session":
            who = ", ".join(filter(None, [f"pid {self.holder}",
                                          self.application_name and f"'{self.application_name}'",
                                          self.role and f"role {self.role}", self.state]))
            return f"A session ({who}) {age}{self.xids:,} transactions behind"
        if self.kind == "replication slot":
            return (f"Replication slot {self.holder} ({self.state}), {self.xids:,} "
                    "transactions behind")
        return f"Prepared transaction {self.holder} (role {self.role}) {age}{self.xids:,} " \
            "transactions behind"

    @property
    def holds(self) -> bool:
        """Whether it holds the horizon back past the warning thresholds."""
        if self.seconds is not None and self.seconds >= float(settings.HORIZON_WARN_SECONDS):
            return True
        return self.xids >= int(settings.HORIZON_WARN_XIDS)


@dataclass(frozen=True)
class Snapshot:
    """Everything at once, as the dashboard and ``pgjobs_stats`` show it."""

    queues: list[QueueStats]
    attempts: list[AttemptBucket]
    handler_latency_ms: list[Latency]
    pickup_latency_seconds: list[Latency]
    leases: LeaseHealth
    failures: list[FailureCount]
    throughput: list[ThroughputPoint]
    schedules: ScheduleHealth = field(default_factory=ScheduleHealth)
    limits: list[KeyLimitStats] = field(default_factory=list)
    workers: list[WorkerStats] = field(default_factory=list)
    errors: list[ErrorGroup] = field(default_factory=list)
    horizon: list[HorizonHolder] = field(default_factory=list)
    windows: dict[str, float] = field(default_factory=dict)

    def held(self) -> list[HorizonHolder]:
        """What holds the vacuum horizon back past the warning thresholds, the furthest first."""
        return [h for h in self.horizon if h.holds]

    @property
    def healthy(self) -> bool:
        return all(q.healthy for q in self.queues)

    def unserved(self) -> list[QueueStats]:
        """Queues with ready jobs that no live worker serves."""
        live = [w for w in self.workers if w.state == "live"]
        return [q for q in self.queues
                if q.ready and not any(w.serves(q.queue) for w in live)]

    def failures_by_class(self) -> dict[str, int]:
        """Failed attempts per failure class, summed over tasks."""
        totals: dict[str, int] = {}
        for failure in self.failures:
            totals[failure.failure_class] = totals.get(failure.failure_class, 0) + failure.count
        return totals

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data (times as ISO 8601 strings)."""
        data = asdict(self)
        for queue, stats in zip(data["queues"], self.queues, strict=True):
            queue["healthy"] = stats.healthy
        for point in data["throughput"]:
            point["minute"] = point["minute"].isoformat()
        for late in data["schedules"]["late"]:
            late["due_at"] = late["due_at"].isoformat()
        for worker in data["workers"]:
            worker["started_at"] = worker["started_at"].isoformat()
            worker["last_seen_at"] = worker["last_seen_at"].isoformat()
        data["unserved_queues"] = [q.queue for q in self.unserved()]
        for holder, shown in zip(data["horizon"], self.horizon, strict=True):
            holder["holds"] = shown.holds
        for group in data["errors"]:
            group["first_seen"] = group["first_seen"].isoformat()
            group["last_seen"] = group["last_seen"].isoformat()
        data["schedules"]["on_time"] = self.schedules.on_time
        data["healthy"] = self.healthy
        return data


def queue_stats(
    *, recent_seconds: float = RECENT_SECONDS, using: str = DEFAULT_DB_ALIAS
) -> list[QueueStats]:
    """Per queue: ready, throttled, scheduled, running, retrying, recent dead and cancelled,
    backlog age.

    Queues with nothing to count still appear when PGJOBS_QUEUES declares them or the backlog
    policy names them.
    """
    counts: dict[str, dict[str, Any]] = {}
    rows = _fetch("stats_queue_counts", [recent_seconds], using)
    for queue, status, n in rows:
        key = f"{status}_recent" if status in (JobStatus.DEAD, JobStatus.CANCELLED) else status
        counts.setdefault(queue, {})[key] = int(n)
    for queue, age in _fetch("stats_oldest_ready", [], using):
        counts.setdefault(queue, {})["oldest_ready_age_seconds"] = float(age)
    for (queue,) in _fetch("stats_paused_queues", [], using):
        counts.setdefault(queue, {})["paused"] = True
    policy = backlog_policy()
    for queue in [*(settings.QUEUES or ()), *(q for q in policy if q != "*")]:
        counts.setdefault(queue, {})
    return [
        QueueStats(queue=queue, backlog_max_age_seconds=backlog_max_age(queue, policy), **values)
        for queue, values in sorted(counts.items())
    ]


def backlog_policy() -> dict[str, float]:
    """PGJOBS_BACKLOG_MAX_AGE_SECONDS: queue name (or "*" for any other) to seconds."""
    return {str(k): float(v) for k, v in dict(settings.BACKLOG_MAX_AGE_SECONDS).items()}


def backlog_max_age(queue: str, policy: dict[str, float] | None = None) -> float | None:
    """The longest a ready job of ``queue`` may wait, or None when no policy covers it."""
    policy = backlog_policy() if policy is None else policy
    return policy.get(queue, policy.get("*"))


def attempt_distribution(
    *,
    window_seconds: float = LATENCY_WINDOW_SECONDS,
    sample: int = SAMPLE_LIMIT,
    using: str = DEFAULT_DB_ALIAS,
) -> list[AttemptBucket]:
    """Recent claims by attempt number: first tries against retries."""
    rows = _fetch("stats_attempt_numbers", {"window": window_seconds, "cap": sample}, using)
    return [AttemptBucket(int(number), int(n)) for number, n in rows]


def handler_latency(
    *,
    window_seconds: float = LATENCY_WINDOW_SECONDS,
    sample: int = SAMPLE_LIMIT,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Latency]:
    """Handler run time in milliseconds per task, p50/p95/max over recent finished attempts."""
    rows = _fetch("stats_handler_latency", {"window": window_seconds, "cap": sample}, using)
    return [_latency(row) for row in rows]


def pickup_latency(
    *,
    window_seconds: float = LATENCY_WINDOW_SECONDS,
    sample: int = SAMPLE_LIMIT,
    using: str = DEFAULT_DB_ALIAS,
) -> list[Latency]:
    """Seconds from due to first claim per queue, p50/p95/max over recent first attempts.

    Jobs that were retried or snoozed since are left out: their run_at no longer says when
    they first became due.
    """
    rows = _fetch("stats_pickup_latency", {"window": window_seconds, "cap": sample}, using)
    return [_latency(row) for row in rows]


def lease_health(
    *, soon_seconds: float = LEASE_SOON_SECONDS, using: str = DEFAULT_DB_ALIAS
) -> LeaseHealth:
    """Leases already expired (the rescue step will take them) and those expiring soon."""
    expired, soon = _fetch("stats_leases", [soon_seconds], using)[0]
    return LeaseHealth(int(expired), int(soon), float(soon_seconds))


def failure_classes(
    *, window_seconds: float = RECENT_SECONDS, using: str = DEFAULT_DB_ALIAS
) -> list[FailureCount]:
    """Failed attempts in the window by failure class and task, most frequent first."""
    rows = _fetch("stats_failures", [window_seconds], using)
    return [FailureCount(str(cls), str(task), int(n)) for cls, task, n in rows]


def error_groups(
    *, window_seconds: float = RECENT_SECONDS, limit: int = ERROR_GROUPS_SHOWN,
    using: str = DEFAULT_DB_ALIAS,
) -> list[ErrorGroup]:
    """The most frequent errors of the window's failed attempts, grouped (``ErrorGroup``)."""
    return [ErrorGroup(
        task=str(r["task"]), failure_class=str(r["failure_class"]), message=str(r["message"]),
        count=int(r["count"]), first_seen=r["first_seen"], last_seen=r["last_seen"],
        newest_job=int(r["newest_job"]),
    ) for r in _fetch_named("stats_error_groups", {"window": window_seconds, "limit": limit},
                            using)]


def throughput(
    *, minutes: int = THROUGHPUT_MINUTES, using: str = DEFAULT_DB_ALIAS
) -> list[ThroughputPoint]:
    """Jobs succeeded and dead per minute, oldest minute first, the current minute last.

    Counts come from finished job rows, so a retention shorter than ``minutes`` undercounts.
    """
    if minutes < 1:
        raise ValueError("minutes must be at least 1")
    rows = _fetch("stats_throughput", [minutes, minutes], using)
    return [ThroughputPoint(minute, int(ok), int(dead)) for minute, ok, dead in rows]


LATE_SCHEDULES_SHOWN = 100


def schedule_health(*, using: str = DEFAULT_DB_ALIAS) -> ScheduleHealth:
    """Schedules by state, and the active ones that are late (oldest late tick first)."""
    grace = float(settings.SCHEDULE_GRACE_SECONDS)
    active, paused, retired = _fetch("schedule_counts", [], using)[0]
    rows = _fetch_named("late_schedules", {"grace": grace, "limit": LATE_SCHEDULES_SHOWN}, using)
    late = [LateSchedule(str(r["name"]), str(r["task"]), bool(r["pending"]), r["due_at"],
                         float(r["late_seconds"])) for r in rows]
    return ScheduleHealth(int(active), int(paused), int(retired), late, grace)


def key_limits(*, limit: int = LIMIT_KEYS_SHOWN, using: str = DEFAULT_DB_ALIAS
               ) -> list[KeyLimitStats]:
    """The limit keys in use, the ones with the most waiting jobs first (``limit`` of them)."""
    return [KeyLimitStats(
        key=str(r["key"]), running=int(r["running"]), ready=int(r["ready"]),
        max_running=None if r["max_running"] is None else int(r["max_running"]),
        set_by_operator=bool(r["set_by_operator"]), waiting=int(r["waiting"]),
        oldest_waiting_seconds=_float(r["oldest_waiting_seconds"]),
        rate_per_second=_float(r["rate_per_second"]),
        rate_burst=None if r["rate_burst"] is None else int(r["rate_burst"]),
        next_start_seconds=_float(r["next_start_seconds"]),
        held_back_seconds=_float(r["held_back_seconds"]),
    ) for r in _fetch_named("stats_limit_keys", {"limit": limit}, using)]


def workers(*, limit: int = WORKERS_SHOWN, using: str = DEFAULT_DB_ALIAS) -> list[WorkerStats]:
    """The worker processes' rows: live ones first, then by when last seen."""
    rows = _fetch_named("stats_workers", {
        "heartbeat": float(settings.WORKER_HEARTBEAT_SECONDS), "limit": limit}, using)
    return [WorkerStats(
        worker_id=r["worker_id"], host=r["host"], pid=int(r["pid"]), version=r["version"],
        # jsonb comes back from a raw cursor as its text (Django's loader).
        queues=None if r["queues"] is None else json.loads(r["queues"]),
        concurrency=int(r["concurrency"]), started_at=r["started_at"],
        last_seen_at=r["last_seen_at"], seen_seconds_ago=float(r["seen_seconds_ago"]),
        running=int(r["running"]), state=str(r["state"]),
    ) for r in rows]


def horizon(*, limit: int = HORIZON_SHOWN, using: str = DEFAULT_DB_ALIAS
            ) -> list[HorizonHolder]:
    """What holds this database's vacuum horizon back, the furthest first."""
    return [HorizonHolder(
        kind=r["kind"], holder=r["holder"], application_name=r["application_name"] or "",
        role=r["role"] or "", state=r["state"] or "", seconds=_float(r["seconds"]),
        xids=int(r["xids"] or 0),
    ) for r in _fetch_named("stats_horizon", {"limit": limit}, using)]


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def read_alias() -> str:
    """Where the figures are read: ``PGJOBS_STATS_DATABASE`` (a replica), else the default."""
    return str(settings.STATS_DATABASE or DEFAULT_DB_ALIAS)


def snapshot(*, using: str | None = None) -> Snapshot:
    """Every figure above with its default window.

    Read from ``using``; without it, from ``read_alias()``, except what only the primary knows:
    which workers are live (a listening worker's session is on the primary) and what holds the
    primary's vacuum horizon back."""
    primary = using or DEFAULT_DB_ALIAS
    using = using or read_alias()
    return Snapshot(
        queues=queue_stats(using=using),
        attempts=attempt_distribution(using=using),
        handler_latency_ms=handler_latency(using=using),
        pickup_latency_seconds=pickup_latency(using=using),
        leases=lease_health(using=using),
        failures=failure_classes(using=using),
        throughput=throughput(using=using),
        schedules=schedule_health(using=using),
        limits=key_limits(using=using),
        workers=workers(using=primary),
        errors=error_groups(using=using),
        horizon=horizon(using=primary),
        windows={
            "recent_seconds": RECENT_SECONDS,
            "latency_window_seconds": LATENCY_WINDOW_SECONDS,
            "sample_limit": SAMPLE_LIMIT,
            "lease_soon_seconds": LEASE_SOON_SECONDS,
            "throughput_minutes": THROUGHPUT_MINUTES,
        },
    )


def _latency(row: tuple[Any, ...]) -> Latency:
    key, samples, p50, p95, top = row
    return Latency(str(key), int(samples), float(p50), float(p95), float(top))


def statement(name: str) -> str:
    """The text of stats block ``name``, with the newest ended attempts spliced in where it
    reads them (``{ended_attempts}``: one sample for every attempt figure)."""
    return sql.query(name).replace("{ended_attempts}", sql.query("stats_ended_attempts"))


def _fetch(name: str, params: list[Any] | dict[str, Any], using: str) -> list[tuple[Any, ...]]:
    with connections[using].cursor() as cursor:
        cursor.execute(statement(name), params)
        return cursor.fetchall()


def _fetch_named(name: str, params: dict[str, Any], using: str) -> list[dict[str, Any]]:
    with connections[using].cursor() as cursor:
        cursor.execute(statement(name), params)
        columns = [column.name for column in cursor.description]
        return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


__all__ = [
    "AttemptBucket",
    "FailureCount",
    "HorizonHolder",
    "LateSchedule",
    "Latency",
    "LeaseHealth",
    "QueueStats",
    "ScheduleHealth",
    "Snapshot",
    "ThroughputPoint",
    "attempt_distribution",
    "backlog_max_age",
    "backlog_policy",
    "failure_classes",
    "handler_latency",
    "lease_health",
    "pickup_latency",
    "queue_stats",
    "schedule_health",
    "snapshot",
    "throughput",
]
