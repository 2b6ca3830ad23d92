"""The operations dashboard: ``stats.snapshot()`` arranged for the admin page.

Everything is rendered on the server; the throughput chart is an inline SVG built here, so the
page needs no JavaScript and no asset build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db import DEFAULT_DB_ALIAS
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import stats
from ..registry import redactor_for
from ..status import FailureClass, JobStatus
from .display import duration_text, jobs_text, time_text

WORKERS_ON_DASHBOARD = 20
CHART_WIDTH = 720
CHART_HEIGHT = 200
CHART_MARGIN = 36  # room for the axis labels
COUNTED_STATUSES = (JobStatus.READY, JobStatus.THROTTLED, JobStatus.SCHEDULED, JobStatus.RUNNING,
                    JobStatus.RETRYING, JobStatus.DEAD)


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


# Each check of the health line, in the order the line says them: first, whether anything runs
# the work at all.
HEALTH_CHECKS = (_unserved, _over_policy, _expired_leases, _late_schedules, _paused)


def health(snap: stats.Snapshot) -> tuple[list[str], str]:
    """What is wrong, one sentence each (empty when nothing is), and what was checked."""
    problems = [text for check in HEALTH_CHECKS for text in check(snap)]
    policies = [q.queue for q in snap.queues if q.backlog_max_age_seconds is not None]
    backlog = ("every queue with a backlog policy is within it" if policies
               else "no backlog policy is set (PGJOBS_BACKLOG_MAX_AGE_SECONDS), so backlog age "
               "is not checked")
    live = sum(1 for w in snap.workers if w.state == "live")
    checked = (f"{live} live worker{'s' if live != 1 else ''} serving every queue with ready "
               f"jobs; no expired leases, no late schedules, no paused queue; {backlog}."
               if not problems else "")
    return problems, checked


def dashboard_context(*, using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """The template context of the dashboard page."""
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
        "throughput_svg": throughput_svg(snap.throughput),
        "throughput_total": sum(p.succeeded + p.dead for p in snap.throughput),
        "recent_hours": round(snap.windows.get("recent_seconds", 0) / 3600),
        "latency_minutes": round(snap.windows.get("latency_window_seconds", 0) / 60),
        "queues_url": reverse("admin:pgjobs_queuestate_changelist"),
        "workers_url": reverse("admin:pgjobs_workerprocess_changelist"),
        "worker_rows": [
            (w.worker_id, w.host, w.pid, w.state, ", ".join(w.queues) if w.queues else "every",
             w.concurrency, w.running, duration_text(w.seen_seconds_ago))
            for w in snap.workers[:WORKERS_ON_DASHBOARD]
        ],
    }


def class_label(failure_class: str) -> str:
    """A failure class as the lists and the job page say it (``lease expired``)."""
    return str(FailureClass(failure_class).label) if failure_class in FailureClass.values \
        else failure_class


def _filter(queue: str, status: str) -> str:
    return urlencode({"queue": queue, "status__exact": status})


def throughput_svg(points: Sequence[stats.ThroughputPoint]) -> SafeString:
    """Jobs finished per minute as stacked bars (succeeded under dead), as an inline SVG."""
    width, height, margin = CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN
    plot_w, plot_h = width - 2 * margin, height - 2 * margin
    peak = max((p.succeeded + p.dead for p in points), default=0)
    scale = plot_h / peak if peak else 0.0
    slot = plot_w / max(len(points), 1)
    bars = []
    for i, p in enumerate(points):
        x = margin + i * slot
        ok_h, dead_h = p.succeeded * scale, p.dead * scale
        label = f"{p.minute:%H:%M}: {p.succeeded} succeeded, {p.dead} dead"
        bars.append((f"{x:.1f}", f"{margin + plot_h - ok_h:.1f}", f"{max(slot - 1, 1):.1f}",
                     f"{ok_h:.1f}", "pgjobs-ok", label))
        if p.dead:
            bars.append((f"{x:.1f}", f"{margin + plot_h - ok_h - dead_h:.1f}",
                         f"{max(slot - 1, 1):.1f}", f"{dead_h:.1f}", "pgjobs-dead", label))
    ticks = [
        (f"{margin + i * slot:.1f}", f"{height - margin + 14}", f"{p.minute:%H:%M}")
        for i, p in enumerate(points) if i % 10 == 0
    ]
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" id="pgjobs-throughput" role="img" '
        'width="{w}" height="{h}" viewBox="0 0 {w} {h}" aria-label="{aria}">'
        '<line x1="{m}" y1="{base}" x2="{right}" y2="{base}" stroke="currentColor"/>'
        '<text x="{m}" y="{top_label}" font-size="11">{peak} per minute</text>'
        "{bars}{ticks}</svg>",
        w=width, h=height, m=margin, base=margin + plot_h, right=width - margin,
        top_label=margin - 8, peak=peak,
        aria=f"Jobs finished per minute over the last {len(points)} minutes, peak {peak}",
        bars=format_html_join(
            "", '<rect x="{}" y="{}" width="{}" height="{}" class="{}"><title>{}</title></rect>',
            bars,
        ),
        ticks=format_html_join("", '<text x="{}" y="{}" font-size="10">{}</text>', ticks),
    )


__all__ = ["dashboard_context", "health", "throughput_svg"]
