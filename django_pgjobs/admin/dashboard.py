"""The operations dashboard: ``stats.snapshot()`` arranged for the admin page.

Everything is rendered on the server; the history's charts are inline SVG (``charts``), so the
page needs no asset build. Its only script refreshes it in place (``live.html``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db import DEFAULT_DB_ALIAS
from django.urls import reverse

from .. import history, stats
from ..conf import settings
from ..registry import redactor_for
from ..status import FailureClass, JobStatus
from .charts import Series, log_chart
from .display import duration_text, jobs_text, time_text

WORKERS_ON_DASHBOARD = 20
# The history charts show the busiest queues, this many, each with its own pair of charts.
HISTORY_QUEUES_SHOWN = 12
# Each range's time labels: how they read and how many buckets apart.
TIME_LABELS = {"1h": ("%H:%M", 10), "24h": ("%H:%M", 16), "7d": ("%a %H:%M", 24)}
COUNTED_STATUSES = (JobStatus.READY, JobStatus.THROTTLED, JobStatus.SCHEDULED, JobStatus.RUNNING,
                    JobStatus.RETRYING, JobStatus.PENDING, JobStatus.DEAD)


@dataclass(frozen=True)
class Cell:
    count: int
    url: str


@dataclass(frozen=True)
class QueueRow:
    queue: str
    cells: list[Cell]
    oldest_ready: str
    policy: str
    healthy: bool
    paused: bool = False


def _over_policy(snap: stats.Snapshot) -> list[str]:
    return [
        f"Queue {q.queue}: the oldest ready job has waited "
        f"{duration_text(q.oldest_ready_age_seconds or 0)}, over its backlog policy of "
        f"{duration_text(q.backlog_max_age_seconds or 0)}."
        for q in snap.queues if not q.healthy
    ]


def _paused(snap: stats.Snapshot) -> list[str]:
    return [f"Queue {q.queue} is paused: workers claim none of its jobs."
            for q in snap.queues if q.paused]


def _expired_leases(snap: stats.Snapshot) -> list[str]:
    n = snap.leases.expired
    if not n:
        return []
    return [f"{jobs_text(n)} still running with an expired lease: the worker is gone or stalled, "
            "and the rescue step has not retried or ended them yet."]


def _late_schedules(snap: stats.Snapshot) -> list[str]:
    late = snap.schedules.late
    if not late:
        return []
    names = ", ".join(s.name for s in late)
    return [f"{len(late)} late schedule{'s' if len(late) != 1 else ''}: {names}."]


def _unserved(snap: stats.Snapshot) -> list[str]:
    live = sum(1 for w in snap.workers if w.state == "live")
    said = ("no worker is live" if not live
            else f"none of the {live} live worker{'s' if live != 1 else ''} serves it")
    return [f"Queue {q.queue} has {jobs_text(q.ready)} ready and no live worker serving it: "
            f"{said}." for q in snap.unserved()]


def _horizon(snap: stats.Snapshot) -> list[str]:
    return [f"{h.described()} keeps vacuum from removing the rows of finished jobs: they pile "
            "up in the job table and its indexes, and claims slow, until it ends."
            for h in snap.held()]


# Each check of the health line, in the order the line says them: first, whether anything runs
# the work at all.
HEALTH_CHECKS = (_unserved, _over_policy, _expired_leases, _horizon, _late_schedules, _paused)


def health(snap: stats.Snapshot) -> tuple[list[str], str]:
    """What is wrong, one sentence each (empty when nothing is), and what was checked."""
    problems = [text for check in HEALTH_CHECKS for text in check(snap)]
    policies = [q.queue for q in snap.queues if q.backlog_max_age_seconds is not None]
    backlog = ("every queue with a backlog policy is within it" if policies
               else "no backlog policy is set (PGJOBS_BACKLOG_MAX_AGE_SECONDS), so backlog age "
               "is not checked")
    live = sum(1 for w in snap.workers if w.state == "live")
    checked = (f"{live} live worker{'s' if live != 1 else ''} serving every queue with ready "
               f"jobs; no expired leases, nothing holding vacuum back, no late schedules, no "
               f"paused queue; {backlog}."
               if not problems else "")
    return problems, checked


def dashboard_context(*, range_name: str = history.DEFAULT_RANGE,
                      using: str | None = None) -> dict[str, Any]:
    """The template context of the dashboard page; ``range_name`` is the history's span.
    Read from ``using``, else as ``stats.snapshot`` reads (``PGJOBS_STATS_DATABASE``)."""
    snap = stats.snapshot(using=using)
    changelist = reverse("admin:pgjobs_job_changelist")
    listed = {q.queue for q in snap.queues}
    policy = stats.backlog_policy()
    # A queue whose jobs have all finished has nothing to count, yet it is named under pickup
    # latency: list it with zeros rather than leave it out.
    queues = sorted([*snap.queues, *(
        stats.QueueStats(queue=name, backlog_max_age_seconds=stats.backlog_max_age(name, policy))
        for name in {p.key for p in snap.pickup_latency_seconds} - listed)],
        key=lambda q: q.queue)
    problems, checked = health(snap)
    rows = [
        QueueRow(
            queue=q.queue,
            cells=[
                Cell(q.count(s), f"{changelist}?{_filter(q.queue, s)}") for s in COUNTED_STATUSES
            ],
            oldest_ready="-" if q.oldest_ready_age_seconds is None
            else duration_text(q.oldest_ready_age_seconds),
            policy="none" if q.backlog_max_age_seconds is None
            else duration_text(q.backlog_max_age_seconds),
            healthy=q.healthy,
            paused=q.paused,
        )
        for q in queues
    ]
    total_attempts = sum(b.count for b in snap.attempts) or 1
    schedules = reverse("admin:pgjobs_schedule_changelist")
    return {
        "snapshot": snap,
        "problems": problems,
        "checked": checked,
        "schedules_url": schedules,
        "late_schedules": [
            (s.name, f"{schedules}?{urlencode({'q': s.name})}", s.task,
             time_text(s.due_at), duration_text(s.late_seconds),
             "not enqueued yet" if s.pending else "enqueued late")
            for s in snap.schedules.late
        ],
        "statuses": [s.label for s in COUNTED_STATUSES],
        "queue_rows": rows,
        "attempt_rows": [
            (b.number, b.count, round(100 * b.count / total_attempts)) for b in snap.attempts
        ],
        "failure_totals": [(class_label(c), n) for c, n in sorted(
            snap.failures_by_class().items(), key=lambda kv: -kv[1])],
        "failures_by_task": [(class_label(f.failure_class), f.task, f.count)
                             for f in snap.failures],
        "error_groups": [{
            "task": g.task, "class": class_label(g.failure_class),
            # Stored scrubbed; shown through the task's redaction again, as on a job's page.
            "message": redactor_for(g.task).text(g.message, None), "count": g.count,
            "first_seen": time_text(g.first_seen), "last_seen": time_text(g.last_seen),
            "jobs_url": f"{changelist}?"
                        + urlencode({"task": g.task, "failure_class__exact": g.failure_class}),
            "newest_url": reverse("admin:pgjobs_job_change", args=[g.newest_job]),
            "newest_job": g.newest_job,
        } for g in snap.errors],
        **history_context(range_name, using=using or stats.read_alias()),
        "throughput_total": sum(p.succeeded + p.dead for p in snap.throughput),
        "recent_hours": round(snap.windows.get("recent_seconds", 0) / 3600),
        "latency_minutes": round(snap.windows.get("latency_window_seconds", 0) / 60),
        "queues_url": reverse("admin:pgjobs_queuestate_changelist"),
        "horizon_rows": [
            (h.kind, h.holder, h.application_name or "-", h.role or "-", h.state or "-",
             "-" if h.seconds is None else duration_text(h.seconds), f"{h.xids:,}", h.holds)
            for h in snap.horizon],
        "horizon_warn": duration_text(float(settings.HORIZON_WARN_SECONDS)),
        "horizon_warn_xids": f"{int(settings.HORIZON_WARN_XIDS):,}",
        "workers_url": reverse("admin:pgjobs_workerprocess_changelist"),
        "worker_rows": [
            (w.worker_id, w.host, w.pid, w.state, ", ".join(w.queues) if w.queues else "every",
             w.concurrency, w.running, duration_text(w.seen_seconds_ago))
            for w in snap.workers[:WORKERS_ON_DASHBOARD]
        ],
    }


def _grid(range_name: str, now: datetime) -> list[datetime]:
    """The buckets' starts over the range, oldest first, on the grid the database bins on."""
    span, bucket = history.RANGES[range_name][0], history.bucket_seconds(range_name)
    origin = history.BIN_ORIGIN
    last = origin + timedelta(seconds=(now - origin).total_seconds() // bucket * bucket)
    return [last - timedelta(seconds=bucket * k) for k in range(span // bucket - 1, -1, -1)]


def history_context(range_name: str, *, using: str = DEFAULT_DB_ALIAS,
                    now: datetime | None = None) -> dict[str, Any]:
    """The history section: every queue together, then the busiest queues one by one.

    A bucket no worker sampled is a gap in every line (no worker ran then, or none had yet);
    a bucket sampled without a queue's row is a zero for that queue (it had nothing)."""
    if range_name not in history.RANGES:
        range_name = history.DEFAULT_RANGE
    by_queue = history.points(range_name, using=using)
    grid = _grid(range_name, now or datetime.now(UTC))
    index = {at: i for i, at in enumerate(grid)}
    sampled = {p.at for points in by_queue.values() for p in points}
    per_minute = history.bucket_seconds(range_name) / 60
    time_format, every = TIME_LABELS[range_name]

    def column(points: Sequence[history.Point], value: Any, *, zero: float | None = 0.0
               ) -> list[float | None]:
        out: list[float | None] = [zero if at in sampled else None for at in grid]
        for p in points:
            if p.at in index:
                out[index[p.at]] = value(p)
        return out

    def charts(name: str, points: Sequence[history.Point]) -> dict[str, Any]:
        slug = "all" if name == "" else name
        jobs = [
            Series("ready", "ready (peak)", column(points, lambda p: p.ready)),
            Series("running", "running (peak)", column(points, lambda p: p.running)),
            Series("waiting", "scheduled, retrying, throttled or pending (peak)",
                   column(points, lambda p: p.waiting)),
            Series("succeeded", "succeeded per minute",
                   column(points, lambda p: p.succeeded / per_minute)),
            Series("failed", "failed attempts per minute",
                   column(points, lambda p: p.failed / per_minute)),
        ]
        wait = [Series("wait", "oldest ready job's wait (longest)",
                       column(points, lambda p: p.oldest_ready_seconds, zero=None))]
        what = "every queue" if name == "" else f"queue {name}"
        return {
            "queue": name,
            "jobs_svg": log_chart(f"pgjobs-history-{slug}", grid, jobs,
                                  title=f"Jobs in {what}", time_format=time_format,
                                  label_every=every),
            "wait_svg": log_chart(f"pgjobs-wait-{slug}", grid, wait,
                                  title=f"Oldest ready wait in {what}", unit="s",
                                  time_format=time_format, label_every=every),
        }

    activity = {q: sum(p.ready + p.running + p.waiting + p.succeeded + p.failed for p in pts)
                for q, pts in by_queue.items()}
    busiest = sorted(sorted(activity, key=lambda q: -activity[q])[:HISTORY_QUEUES_SHOWN])
    totals = _summed(by_queue)
    return {
        "history_range": range_name,
        "history_ranges": list(history.RANGES),
        "history_sampled": bool(sampled),
        "history_interval": duration_text(float(settings.HISTORY_INTERVAL_SECONDS)),
        "history_all": charts("", totals),
        "history_queues": [charts(q, by_queue[q]) for q in busiest],
        "history_more": len(by_queue) - len(busiest),
    }


def _summed(by_queue: dict[str, list[history.Point]]) -> list[history.Point]:
    """Every queue's points added up per bucket (the longest wait, not the sum of them)."""
    buckets: dict[datetime, history.Point] = {}
    for points in by_queue.values():
        for p in points:
            was = buckets.get(p.at)
            if was is None:
                buckets[p.at] = p
                continue
            waits = [w for w in (was.oldest_ready_seconds, p.oldest_ready_seconds)
                     if w is not None]
            buckets[p.at] = history.Point(
                p.at, None, was.ready + p.ready, was.waiting + p.waiting,
                was.running + p.running, max(waits) if waits else None,
                was.succeeded + p.succeeded, was.failed + p.failed, was.dead + p.dead)
    return [buckets[at] for at in sorted(buckets)]


def class_label(failure_class: str) -> str:
    """A failure class as the lists and the job page say it (``lease expired``)."""
    return str(FailureClass(failure_class).label) if failure_class in FailureClass.values \
        else failure_class


def _filter(queue: str, status: str) -> str:
    return urlencode({"queue": queue, "status__exact": status})


__all__ = ["dashboard_context", "health", "history_context"]
