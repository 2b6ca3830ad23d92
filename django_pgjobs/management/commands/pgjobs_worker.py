"""manage.py pgjobs_worker: run a worker until stopped."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from django_pgjobs.checks import PGJOBS as PGJOBS_CHECKS
from django_pgjobs.management.arguments import (
    label,
    poll_interval,
    queue_name,
    seconds,
    whole_number,
)
from django_pgjobs.validation import MIN_POLL_INTERVAL_SECONDS
from django_pgjobs.worker import (
    DEFAULT_ASYNC_CONCURRENCY,
    EXIT_DATABASE_UNREACHABLE,
    EXIT_EXECUTORS_LOST,
    MAX_ASYNC_CONCURRENCY,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    Worker,
    database_target,
)


def _queue(text: str) -> tuple[str, int | None]:
    """Parse ``name`` or ``name:weight``."""
    name, colon, weight = text.rpartition(":")
    if not colon:
        name, weight_value = text, None
    else:
        try:
            weight_value = int(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the weight after ':' must be a whole number"
            ) from None
        if not 1 <= weight_value <= 100:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the weight must be from 1 to 100, got {weight_value}"
            )
    return queue_name(name), weight_value


_SECONDS = seconds(0, 86400, low_inclusive=False)


class Command(BaseCommand):
    help = "Run a django-pgjobs worker: claim jobs, run their handlers, settle them."
    # django-pgjobs' own checks (settings, keys, schedules), not every app's: a worker serves
    # no URL, template or admin page, and importing them to check them was a tenth of its
    # start-up (docs/benchmarks.md). `manage.py check` runs them all.
    requires_system_checks = [PGJOBS_CHECKS]

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", "-q", action="append", type=_queue, dest="queues",
                            help="queue to serve, as NAME or NAME:WEIGHT (repeatable; a queue "
                                 "of weight 3 gets 3 claim turns to another's 1 while both "
                                 "have work); default: every queue")
        parser.add_argument("--concurrency", "-c", type=whole_number(1, MAX_CONCURRENCY),
                            default=1, help="executor threads, one database connection each "
                                            f"(default 1, at most {MAX_CONCURRENCY})")
        parser.add_argument("--batch-size", type=whole_number(1, MAX_BATCH_SIZE), default=10,
                            help=f"jobs claimed per claim (default 10, at most {MAX_BATCH_SIZE})")
        parser.add_argument("--async-concurrency", type=whole_number(1, MAX_ASYNC_CONCURRENCY),
                            default=DEFAULT_ASYNC_CONCURRENCY,
                            help="async handlers run at once on the worker's event loop "
                                 f"(default {DEFAULT_ASYNC_CONCURRENCY})")
        parser.add_argument("--poll-interval", type=poll_interval, default=None,
                            help="seconds between polls when idle, at least "
                                 f"{MIN_POLL_INTERVAL_SECONDS:g} (default "
                                 "PGJOBS_POLL_INTERVAL_SECONDS)")
        parser.add_argument("--burst", action="store_true",
                            help="exit 0 once nothing is eligible")
        parser.add_argument("--max-jobs", type=whole_number(1), default=None,
                            help="exit after claiming this many jobs")
        parser.add_argument("--worker-id", type=label(200), default=None,
                            help="name in leases and attempts (default host:pid:random)")
        parser.add_argument("--shutdown-grace", type=_SECONDS, default=None,
                            help="seconds running handlers get to finish after SIGTERM")
        parser.add_argument("--no-listen", action="store_false", dest="listen", default=None,
                            help="poll only: no LISTEN connection and no session state (for "
                                 "PgBouncer in transaction pooling mode); default "
                                 "PGJOBS_LISTEN")
        parser.add_argument("--database", default="default", help="database alias")
        parser.add_argument("--log-level", default="INFO",
                            choices=["DEBUG", "INFO", "WARNING", "ERROR"])
        parser.add_argument("--metrics-port", type=whole_number(0, 65535), default=None,
                            help="serve this worker's Prometheus metrics on 127.0.0.1:PORT "
                                 "(0 picks a free port, logged at start)")
        parser.add_argument("--metrics-stats", action="store_true",
                            help="also serve the queue gauges read from the database (give "
                                 "it to one worker only, or sums across workers double count)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["database"] not in connections:
            raise CommandError(f"unknown database alias {options['database']!r}")
        worker_id = options["worker_id"]
        queues, weights = _queues_and_weights(options["queues"])
        self._configure_logging(options["log_level"])
        worker = Worker(
            queues=queues,
            queue_weights=weights,
            listen=options["listen"],
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            async_concurrency=options["async_concurrency"],
            poll_interval=options["poll_interval"],
            burst=options["burst"],
            max_jobs=options["max_jobs"],
            worker_id=worker_id,
            shutdown_grace=options["shutdown_grace"],
            using=options["database"],
        )
        metrics_server = self._serve_metrics(worker, options)
        try:
            status = worker.run()
        finally:
            if metrics_server is not None:
                metrics_server.stop()
        counters = worker.counters
        self.stdout.write(
            f"worker {worker.worker_id} claimed {counters.claimed}, settled "
            f"{sum(counters.settled.values())} {dict(sorted(counters.settled.items()))}, "
            f"lost {counters.lost}"
        )
        failures = {
            EXIT_DATABASE_UNREACHABLE:
                f"gave up: database {database_target(worker.using)} could not be reached for "
                "PGJOBS_BURST_UNREACHABLE_SECONDS (see the log lines above for each attempt)",
            EXIT_EXECUTORS_LOST:
                "stopped: every executor failed (see the worker.executor_died lines above)",
        }
        if status in failures:
            raise CommandError(failures[status], returncode=status)

    def _serve_metrics(self, worker: Worker, options: dict[str, Any]) -> Any:
        if options["metrics_port"] is None:
            if options["metrics_stats"]:
                raise CommandError("--metrics-stats needs --metrics-port")
            return None
        from django_pgjobs.metrics import MetricsServer

        try:
            return MetricsServer(worker, options["metrics_port"],
                                 with_stats=options["metrics_stats"])
        except OSError as exc:
            raise CommandError(f"--metrics-port {options['metrics_port']}: {exc}") from exc

    def _configure_logging(self, level: str) -> None:
        root = logging.getLogger("django_pgjobs")
        root.setLevel(level)
        if not root.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            root.addHandler(handler)


def _queues_and_weights(
    parsed: list[tuple[str, int | None]] | None,
) -> tuple[list[str] | None, dict[str, int]]:
    if not parsed:
        return None, {}
    weights: dict[str, int] = {}
    for name, weight in parsed:
        if weight is None:
            continue
        if weights.get(name, weight) != weight:
            raise CommandError(f"--queue {name} is given with two weights")
        weights[name] = weight
    return [name for name, _ in parsed], weights
