"""Chancy: the app its own CLI loads, the queue's settings, and the same no-op and pickup jobs.

Workers run through Chancy's CLI, one process each:
``chancy --app bench.peers.chancy_app.app worker start``. A worker takes its queues' settings
from the database, where the client's setup declares ``QUEUE``. Two settings differ from
Chancy's defaults, both documented options: the async executor (jobs run on the worker's event
loop) and eager polling (a worker fetches again as soon as a job ends, not only every
``polling_interval`` seconds). With the defaults (the process executor, a poll every 5 seconds)
a worker drains a backlog at under 2 jobs/s. The concurrency is left to the executor's default.
Chancy has no batch size: a fetch takes up to the concurrency less the jobs still running, so
the concurrency sets both. Its workers have no burst mode: the harness stops them (SIGTERM,
Chancy's graceful shutdown) once its table shows nothing outstanding. The app keeps Chancy's
default plugins and logs at WARNING, as every worker measured here does (at INFO it logs a line
for every job it fetches).
"""

from __future__ import annotations

import logging
import os

from chancy import Chancy, Queue, job
from chancy.executors.asyncex import AsyncExecutor

from bench.probe import report_start

QUEUE = Queue("default", executor=Chancy.Executor.Async, eager_polling=True)
# The executor's default concurrency, which a queue declared without one gets.
CONCURRENCY = QUEUE.concurrency or AsyncExecutor.__new__(AsyncExecutor).get_default_concurrency()
# How the runner's output states these settings.
SETTINGS = (
    f"queue declared with executor=AsyncExecutor, eager_polling=True, concurrency left to the "
    f"executor's default ({CONCURRENCY}, also the most one fetch takes: Chancy has no batch "
    f"size), polling_interval={QUEUE.polling_interval} s (its default); default plugins; "
    "log level WARNING; no burst mode: stopped by SIGTERM once nothing is outstanding"
)


def _logger() -> logging.Logger:
    logger = logging.getLogger("chancy")
    logger.setLevel(logging.WARNING)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s][%(levelname)s] %(message)s"))
        logger.addHandler(handler)
    return logger


app = Chancy(os.environ.get("BENCH_DATABASE_URL", ""), log=_logger())


@job()
async def noop(n: int) -> None:
    """Do nothing."""


@job()
async def pickup(n: int, port: int) -> None:
    """Report the moment this job started."""
    report_start(n, port)
