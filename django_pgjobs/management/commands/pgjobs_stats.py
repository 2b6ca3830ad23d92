"""manage.py pgjobs_stats: the operator's picture of the queue, as tables or JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs import stats


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(h) for h in headers], *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        first, *rest = row
        lines.append("  ".join([first.ljust(widths[0])]
                               + [v.rjust(w) for v, w in zip(rest, widths[1:], strict=True)]))
    return lines


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return str(value)


class Command(BaseCommand):
    help = ("Show queue counts, backlog age against the policy, attempts, latency, leases, "
            "failures, throughput and late schedules.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument("--fail-unhealthy", action="store_true",
                            help="exit 1 when a queue's oldest ready job is older than its "
                                 "backlog policy or a schedule is late (for cron and health "
                                 "checks)")
        parser.add_argument("--database", default=None,
                            help="database alias to read everything from (default: "
                                 "PGJOBS_STATS_DATABASE for the figures, the default alias "
                                 "for workers and the vacuum horizon)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] is not None and options["database"] not in connections:
            raise CommandError(f"unknown database alias {options['database']!r}")
        snap = stats.snapshot(using=options["database"])
        if options["json"]:
            self.stdout.write(json.dumps(snap.as_dict(), indent=2))
        else:
            self.stdout.write("\n".join(self._render(snap)))
        unhealthy = [q.queue for q in snap.queues if not q.healthy]
        late = [s.name for s in snap.schedules.late]
        if options["fail_unhealthy"] and (unhealthy or late):
            raise CommandError("; ".join(
                [f"backlog older than its policy in: {', '.join(unhealthy)}"] * bool(unhealthy)
                + [f"late schedules: {', '.join(late)}"] * bool(late)))

    def _render(self, snap: stats.Snapshot) -> list[str]:
        recent_h = stats.RECENT_SECONDS // 3600
        window_min = stats.LATENCY_WINDOW_SECONDS // 60
        out = ["Queues"]
        out += _table(
            ["queue", "ready", "throttled", "scheduled", "running", "retrying", "pending",
             f"dead {recent_h}h",
             f"cancelled {recent_h}h", "oldest ready s", "policy s", "backlog", "state"],
            [[q.queue, q.ready, q.throttled, q.scheduled, q.running, q.retrying, q.pending,
              q.dead_recent,
              q.cancelled_recent, q.oldest_ready_age_seconds, q.backlog_max_age_seconds,
              "ok" if q.healthy else "UNHEALTHY", "PAUSED" if q.paused else "running"]
             for q in snap.queues],
        ) if snap.queues else ["  (no jobs)"]
        leases = snap.leases
        out += ["", f"Leases: {leases.expired} expired (rescue pending), {leases.expiring_soon} "
                    f"expiring within {leases.soon_seconds:g}s"]
        claims = sum(b.count for b in snap.attempts)
        retries = claims - sum(b.count for b in snap.attempts if b.number == 1)
        out += ["", f"Claims in the last {window_min} min by attempt number "
                    f"(latest {stats.SAMPLE_LIMIT} at most): "
                + (", ".join(f"#{b.number}: {b.count}" for b in snap.attempts) or "none")
                + (f"; retries are {100 * retries / claims:.0f}%" if claims else "")]
        out += ["", f"Handler latency, ms (last {window_min} min)"]
        out += _latency_table("task", snap.handler_latency_ms)
        out += ["", f"Pickup latency, s (last {window_min} min, first attempts)"]
        out += _latency_table("queue", snap.pickup_latency_seconds)
        out += ["", f"Failed attempts (last {recent_h}h)"]
        out += _table(["failure class", "task", "attempts"],
                      [[f.failure_class, f.task, f.count] for f in snap.failures]) \
            if snap.failures else ["  (none)"]
        health = snap.schedules
        out += ["", f"Schedules: {health.active} active, {health.paused} paused, "
                    f"{health.retired} retired; "
                + (f"{len(health.late)} late (last due tick not enqueued within "
                   f"{health.grace_seconds:g}s)" if health.late else "none late")]
        if health.late:
            out += _table(["schedule", "task", "due tick", "late s", "enqueued"],
                          [[s.name, s.task, s.due_at.isoformat(), s.late_seconds,
                            "not yet" if s.pending else "late"] for s in health.late])
        out += ["", "Workers (live first)"]
        out += _table(["worker", "state", "host", "pid", "queues", "concurrency", "running",
                       "last seen s ago"],
                      [[w.worker_id, w.state, w.host, w.pid,
                        ",".join(w.queues) if w.queues else "*", w.concurrency, w.running,
                        round(w.seen_seconds_ago, 1)] for w in snap.workers]) \
            if snap.workers else ["  (none has run)"]
        unserved = snap.unserved()
        if unserved:
            out += [f"  UNSERVED: {', '.join(q.queue for q in unserved)} (ready jobs, no live "
                    "worker serving them)"]
        out += ["", "Vacuum horizon (what keeps vacuum from removing finished jobs' rows, "
                    "the furthest first)"]
        out += _table(["holder", "kind", "application", "role", "state", "open s", "xids behind",
                       "holds"],
                      [[h.holder, h.kind, h.application_name, h.role, h.state,
                        None if h.seconds is None else round(h.seconds, 1), h.xids,
                        "HOLDS" if h.holds else "-"] for h in snap.horizon]) \
            if snap.horizon else ["  (nothing holds it: vacuum can clean up to now)"]
        out += ["", f"Limits (keys in use, most waiting first, at most {stats.LIMIT_KEYS_SHOWN})"]
        out += _table(["key", "running", "ready", "limit", "waiting", "oldest waiting s",
                       "next start in s", "held back s"],
                      [[k.key, k.running, k.ready,
                        f"{k.rate or k.max_running}{' (operator)' if k.set_by_operator else ''}",
                        k.waiting, k.oldest_waiting_seconds, k.next_start_seconds,
                        k.held_back_seconds] for k in snap.limits]) \
            if snap.limits else ["  (none)"]
        succeeded = sum(p.succeeded for p in snap.throughput)
        dead = sum(p.dead for p in snap.throughput)
        peak = max((p.succeeded + p.dead for p in snap.throughput), default=0)
        out += ["", f"Throughput (last {len(snap.throughput)} min): {succeeded} succeeded, "
                    f"{dead} dead, peak {peak}/min; per minute, newest last:",
                "  " + " ".join(str(p.succeeded + p.dead) for p in snap.throughput[-15:])]
        return out


def _latency_table(key: str, rows: Sequence[stats.Latency]) -> list[str]:
    if not rows:
        return ["  (no samples)"]
    return _table([key, "samples", "p50", "p95", "max"],
                  [[r.key, r.samples, r.p50, r.p95, r.max] for r in rows])
