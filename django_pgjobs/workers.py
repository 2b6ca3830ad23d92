"""Worker processes' heartbeats: the rows that say which workers are alive (``pgjobs_worker``).

Each worker writes its own row when it starts, every ``PGJOBS_WORKER_HEARTBEAT_SECONDS`` after
(a maintenance step), and once more when it stops cleanly. A worker is *live* while its row is
fresh (seen within two heartbeats) and not stopped, and, for a worker that listens, while its
listening session is still connected: a killed process's session ends with it, so a SIGKILLed
worker is seen gone within a second, not a heartbeat later. Rows of workers not seen for a day
are deleted by the same step. ``stats.workers()`` reads them for the admin and ``pgjobs_stats``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable, Collection
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from . import sql
from .version import VERSION

# How long a row of a worker not seen is kept.
WORKER_RETENTION_SECONDS = 24 * 3600


class Heartbeat:
    """The step that writes one worker's row; ``running`` says how many jobs it runs now."""

    def __init__(self, worker_id: str, *, queues: Collection[str] | None, concurrency: int,
                 listens: bool, running: Callable[[], int]) -> None:
        self.worker_id = worker_id
        self.running = running
        self.values: dict[str, Any] = {
            "worker_id": worker_id, "host": socket.gethostname()[:255], "pid": os.getpid(),
            "version": VERSION,
            "queues": None if queues is None else json.dumps(sorted(queues)),
            "concurrency": concurrency, "listens": listens,
        }
        self.beats = 0

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("beat_worker"), {**self.values, "running": self.running()})
            if self.beats % 100 == 0:  # at the first beat, and now and then after
                cursor.execute(sql.query("prune_workers"),
                               {"retention": WORKER_RETENTION_SECONDS})
        self.beats += 1
        return 0

    def stopped(self, using: str = DEFAULT_DB_ALIAS) -> None:
        """Say the worker stopped cleanly."""
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("stop_worker"), {"worker_id": self.worker_id})


__all__ = ["WORKER_RETENTION_SECONDS", "Heartbeat"]
