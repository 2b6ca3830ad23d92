"""Prometheus exposition: queue gauges read from the database, worker counters and histograms.

Two sources, served separately so that summing across scrape targets never double counts:

- ``StatsCollector`` reads ``stats`` at scrape time (jobs by queue and status, oldest ready age
  against the backlog policy, leases). Mount ``metrics_view`` in the project's urls to serve it.
  It names the PGJOBS_METRICS_MAX_QUEUES queues of the largest backlog and folds the rest into
  queue="*", so the number of series stays bounded however many queues there are.
- ``WorkerMetrics`` counts what one worker process does (claims, completions, retries and dead
  by failure class, lease expiries it rescued, lost settlements, handler duration, pickup
  latency). ``pgjobs_worker --metrics-port`` serves it; ``--metrics-stats`` adds the gauges.

Needs the ``metrics`` extra (``prometheus-client``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from . import stats
from .claimed import ClaimedJob
from .conf import checked
from .outcomes import Outcome
from .stats import QueueStats
from .status import JobStatus
from .validation import missing_extra

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Histogram,
        generate_latest,
        start_http_server,
    )
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:
    raise ImproperlyConfigured(
        f"django_pgjobs.metrics: {missing_extra('prometheus-client', 'metrics')}"
    ) from exc

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("django_pgjobs.metrics")

HANDLER_DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
)
PICKUP_LATENCY_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)
# The queue label of the queues past PGJOBS_METRICS_MAX_QUEUES, summed; no queue is named "*"
# (the backlog policy's "*" means the same: every other queue).
OTHER_QUEUES = "*"


def named_queues(queues: list[QueueStats], limit: int) -> list[tuple[QueueStats, bool]]:
    """The ``limit`` queues of the largest backlog, and one ``OTHER_QUEUES`` entry for the rest,
    each with whether its backlog is healthy.

    Largest backlog: the most ready jobs, then the oldest ready job, then the most live jobs;
    ties by name, so a scrape names the same queues as the last one while nothing changed. The
    rest are summed: their oldest ready age is the oldest of theirs, and the entry is healthy
    only when each of them is; their backlog policies differ, so it has none.
    """
    if len(queues) <= limit:
        return [(q, q.healthy) for q in queues]
    ranked = sorted(queues, key=lambda q: (
        -q.ready, -(q.oldest_ready_age_seconds or 0.0),
        -sum(q.count(s) for s in stats.LIVE_STATUSES), q.queue))
    named, rest = ranked[:limit], ranked[limit:]
    ages = [q.oldest_ready_age_seconds for q in rest if q.oldest_ready_age_seconds is not None]
    other = QueueStats(
        queue=OTHER_QUEUES,
        ready=sum(q.ready for q in rest), scheduled=sum(q.scheduled for q in rest),
        running=sum(q.running for q in rest), retrying=sum(q.retrying for q in rest),
        dead_recent=sum(q.dead_recent for q in rest),
        cancelled_recent=sum(q.cancelled_recent for q in rest),
        oldest_ready_age_seconds=max(ages) if ages else None,
    )
    return [*((q, q.healthy) for q in named), (other, all(q.healthy for q in rest))]


class StatsCollector(Collector):
    """Gauges computed from ``stats`` on every scrape (a handful of indexed queries)."""

    def __init__(self, *, using: str | None = None, close_connection: bool = False) -> None:
        # Without ``using``: the figures from PGJOBS_STATS_DATABASE, the workers and the
        # vacuum horizon from the primary (the default alias), as stats.snapshot reads them.
        self.using = using
        # Scrapes served outside a request (the worker's HTTP server, a thread per scrape)
        # must not leave a connection behind in a thread that is about to end.
        self.close_connection = close_connection

    def describe(self) -> Iterable[Metric]:
        # Registering a collector calls describe(); returning nothing keeps that from querying.
        return []

    def collect(self) -> Iterator[Metric]:
        read, primary = self.using or stats.read_alias(), self.using or DEFAULT_DB_ALIAS
        try:
            queues = stats.queue_stats(using=read)
            leases = stats.lease_health(using=read)
            limits = stats.key_limits(using=read)
            workers = stats.workers(using=primary)
            horizon = stats.horizon(using=primary)
        finally:
            if self.close_connection:
                for alias in {read, primary}:
                    connections[alias].close()
        jobs = GaugeMetricFamily(
            "pgjobs_jobs", "Jobs waiting or running, by queue and status.",
            labels=["queue", "status"],
        )
        finished = GaugeMetricFamily(
            "pgjobs_jobs_finished_recent",
            f"Jobs that went dead or were cancelled in the last {stats.RECENT_SECONDS} seconds.",
            labels=["queue", "status"],
        )
        age = GaugeMetricFamily(
            "pgjobs_oldest_ready_age_seconds",
            "How long the oldest ready job of the queue has waited since it became due "
            "(0 when nothing is ready).",
            labels=["queue"],
        )
        policy = GaugeMetricFamily(
            "pgjobs_backlog_max_age_seconds",
            "The backlog policy: the longest a ready job may wait "
            "(PGJOBS_BACKLOG_MAX_AGE_SECONDS).",
            labels=["queue"],
        )
        healthy = GaugeMetricFamily(
            "pgjobs_backlog_healthy",
            "1 while the oldest ready job is within the backlog policy, else 0.",
            labels=["queue"],
        )
        for queue, is_healthy in named_queues(queues, int(checked("METRICS_MAX_QUEUES"))):
            for status in stats.LIVE_STATUSES:
                jobs.add_metric([queue.queue, status.value], queue.count(status))
            for status in (JobStatus.DEAD, JobStatus.CANCELLED):
                finished.add_metric([queue.queue, status.value], queue.count(status))
            age.add_metric([queue.queue], queue.oldest_ready_age_seconds or 0.0)
            healthy.add_metric([queue.queue], 1.0 if is_healthy else 0.0)
            if queue.backlog_max_age_seconds is not None:
                policy.add_metric([queue.queue], queue.backlog_max_age_seconds)
        yield from (jobs, finished, age, policy, healthy)
        # Limit keys are as many as an application's customers: the ones with the most waiting
        # jobs only (stats.LIMIT_KEYS_SHOWN), each under its own label.
        held = GaugeMetricFamily(
            "pgjobs_limit_held",
            "Slots of a limit key held by its ready and running jobs (docs/limits.md).",
            labels=["key"],
        )
        waiting = GaugeMetricFamily(
            "pgjobs_limit_waiting", "Jobs waiting (throttled) for a slot of their limit key.",
            labels=["key"],
        )
        limit = GaugeMetricFamily(
            "pgjobs_limit_max_running", "A limit key's limit: an operator's, else declared.",
            labels=["key"],
        )
        rate = GaugeMetricFamily(
            "pgjobs_limit_rate_per_second", "A rate key's declared starts a second.",
            labels=["key"],
        )
        next_start = GaugeMetricFamily(
            "pgjobs_limit_next_start_seconds",
            "Seconds until a rate key's next job may start (0: now).",
            labels=["key"],
        )
        for key in limits:
            held.add_metric([key.key], key.running + key.ready)
            waiting.add_metric([key.key], key.waiting)
            if key.rate_per_second is not None:
                rate.add_metric([key.key], key.rate_per_second)
                next_start.add_metric([key.key], max(key.next_start_seconds or 0.0,
                                                     key.held_back_seconds or 0.0))
            elif key.max_running is not None:
                limit.add_metric([key.key], key.max_running)
        yield from (held, waiting, limit, rate, next_start)
        states = GaugeMetricFamily(
            "pgjobs_workers",
            "Worker processes by state: live, stopped, gone (docs/operations.md).",
            labels=["state"],
        )
        for state in ("live", "stopped", "gone"):
            states.add_metric([state], sum(1 for w in workers if w.state == state))
        yield states
        sessions = [h.seconds for h in horizon if h.seconds is not None]
        yield GaugeMetricFamily(
            "pgjobs_horizon_held_seconds",
            "How long the oldest open transaction or snapshot of this database (or prepared "
            "transaction) has been holding vacuum's horizon back (0: none).",
            value=max(sessions, default=0.0),
        )
        yield GaugeMetricFamily(
            "pgjobs_horizon_held_xids",
            "Transactions begun since the snapshot, slot or prepared transaction that holds "
            "vacuum's horizon back the furthest (0: none).",
            value=max((h.xids for h in horizon), default=0),
        )
        yield GaugeMetricFamily(
            "pgjobs_leases_expired",
            "Running jobs whose lease has expired; the rescue step will take them back.",
            value=leases.expired,
        )
        yield GaugeMetricFamily(
            "pgjobs_leases_expiring_soon",
            f"Running jobs whose lease expires within {leases.soon_seconds:g} seconds.",
            value=leases.expiring_soon,
        )


class WorkerMetrics:
    """Counters and histograms for one worker process, fed by the worker's listeners."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.claims = Counter("pgjobs_claims", "Jobs claimed.", ["queue"], registry=r)
        self.completions = Counter(
            "pgjobs_completions", "Jobs whose handler succeeded.", ["task"], registry=r
        )
        self.retries = Counter(
            "pgjobs_retries", "Failed attempts that will be retried, by failure class.",
            ["failure_class"], registry=r,
        )
        self.dead = Counter(
            "pgjobs_dead", "Jobs that went dead, by failure class and terminal reason.",
            ["failure_class", "reason"], registry=r,
        )
        self.lease_expiries = Counter(
            "pgjobs_lease_expiries",
            "Running jobs whose lease expired, taken back by this worker's rescue step.",
            registry=r,
        )
        self.lost_settlements = Counter(
            "pgjobs_lost_settlements",
            "Outcomes reported after the lease was lost; nothing was applied.", ["task"],
            registry=r,
        )
        self.handler_duration = Histogram(
            "pgjobs_handler_duration_seconds", "Handler run time.", ["task"],
            buckets=HANDLER_DURATION_BUCKETS, registry=r,
        )
        self.pickup_latency = Histogram(
            "pgjobs_pickup_latency_seconds",
            "From the time a job became due (run_at) to its claim.", ["queue"],
            buckets=PICKUP_LATENCY_BUCKETS, registry=r,
        )

    def attach(self, worker: Worker) -> None:
        """Hook into ``worker``: its claims, settlements and rescue step."""
        worker.claim_listeners.append(self.on_claim)
        worker.settle_listeners.append(self.on_settle)
        for step in worker.steps:
            if step.name == "rescue":
                step.run = self._counting_rescues(step.run)

    def on_claim(self, jobs: list[ClaimedJob]) -> None:
        for job in jobs:
            self.claims.labels(job.queue).inc()
            if job.run_at_us is not None:
                waited = (job.claimed_at_us - job.run_at_us) / 1_000_000
                self.pickup_latency.labels(job.queue).observe(max(0.0, waited))

    def on_settle(self, outcome: Outcome, applied: bool) -> None:
        if outcome.duration_ms is not None:
            self.handler_duration.labels(outcome.task).observe(outcome.duration_ms / 1000)
        if not applied:
            self.lost_settlements.labels(outcome.task).inc()
        elif outcome.status == JobStatus.SUCCEEDED:
            self.completions.labels(outcome.task).inc()
        elif outcome.status == JobStatus.RETRYING:
            self.retries.labels(outcome.failure_class or "unknown").inc()
        elif outcome.status == JobStatus.DEAD:
            self.dead.labels(outcome.failure_class or "none", outcome.terminal_reason).inc()

    def _counting_rescues(self, run: Callable[[str], int]) -> Callable[[str], int]:
        def counted(using: str) -> int:
            rescued = run(using)
            if rescued:
                self.lease_expiries.inc(rescued)
            return rescued

        return counted


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(registry)


_view_registry: CollectorRegistry | None = None
_view_lock = threading.Lock()


def view_registry() -> CollectorRegistry:
    """The registry ``metrics_view`` serves: the database gauges."""
    global _view_registry
    with _view_lock:
        if _view_registry is None:
            registry = CollectorRegistry(auto_describe=True)
            registry.register(StatsCollector())
            _view_registry = registry
        return _view_registry


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Serve the queue gauges in Prometheus text format; mount it where only scrapers reach."""
    return HttpResponse(exposition(view_registry()), content_type=CONTENT_TYPE_LATEST)


class MetricsServer:
    """A worker's metrics endpoint on 127.0.0.1, running in a daemon thread."""

    def __init__(
        self, worker: Worker, port: int, *, with_stats: bool = False, addr: str = "127.0.0.1"
    ) -> None:
        self.metrics = WorkerMetrics()
        self.metrics.attach(worker)
        if with_stats:
            self.metrics.registry.register(
                StatsCollector(using=worker.using, close_connection=True)
            )
        self._server, self._thread = start_http_server(
            port, addr=addr, registry=self.metrics.registry
        )
        self.port = int(self._server.server_port)
        logger.info("metrics.serving worker=%s addr=%s port=%d", worker.worker_id, addr,
                    self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


__all__ = [
    "OTHER_QUEUES",
    "MetricsServer",
    "StatsCollector",
    "WorkerMetrics",
    "exposition",
    "metrics_view",
    "view_registry",
]
