"""The worker: claim, execute outside any transaction, settle; maintenance; signals.

``core`` holds the ``Worker`` (lifecycle, the executors' claim loop, the main thread's loop),
``slots`` the executor slots with the batch runner and the watchdog, ``settler`` the thread that
settles outcomes and sends heartbeats, ``queues`` the queue rotation, and ``connections`` the
per-thread connection handling. The management command ``pgjobs_worker`` only parses flags and
calls ``Worker(...).run()``.
"""

from .aio import DEFAULT_ASYNC_CONCURRENCY
from .connections import database_target
from .core import (
    EXIT_DATABASE_UNREACHABLE,
    EXIT_EXECUTORS_LOST,
    MAX_ASYNC_CONCURRENCY,
    MAX_BATCH_SIZE,
    MAX_CONCURRENCY,
    Counters,
    Worker,
)
from .queues import weighted_rotation

__all__ = [
    "DEFAULT_ASYNC_CONCURRENCY",
    "EXIT_DATABASE_UNREACHABLE",
    "EXIT_EXECUTORS_LOST",
    "MAX_ASYNC_CONCURRENCY",
    "MAX_BATCH_SIZE",
    "MAX_CONCURRENCY",
    "Counters",
    "Worker",
    "database_target",
    "weighted_rotation",
]
