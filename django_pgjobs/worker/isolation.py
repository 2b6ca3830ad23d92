"""Process isolation: a handler declared ``isolation="process"`` runs in a child process.

A thread that ignores its timeout or a cancel cannot be stopped; a process can. Each executor
slot that meets such a handler starts one child (Python's "spawn": a fresh interpreter that sets
Django up itself, never a fork of a threaded worker) and reuses it for the next ones. The child
runs the job with its own database connection, so leases, heartbeats, receipts and the result
work exactly as in a thread, and sends the outcome back. To stop a job the worker terminates the
child (SIGTERM, then SIGKILL after PGJOBS_KILL_GRACE_SECONDS); the slot starts a new one for its
next process-isolated job. A child never outlives the worker (see ``child``): the kernel kills
it when the executor thread that started it ends, the worker's death included.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection
from typing import Any

from django.db import connections

from ..child import run_jobs
from ..claimed import ClaimedJob
from ..conf import settings
from ..outcomes import Outcome

logger = logging.getLogger("django_pgjobs.worker")

_SPAWN = multiprocessing.get_context("spawn")


class ChildProcess:
    """One slot's child process, started on its first process-isolated job."""

    def __init__(self, *, worker_id: str, using: str) -> None:
        self.worker_id = worker_id
        self.using = using
        self._process: Any = None
        self._conn: Connection | None = None
        self._killed = threading.Event()

    def run(self, job: ClaimedJob) -> Outcome | None:
        """Run ``job`` in the child; its outcome, or None when the child was killed or died."""
        conn = self._ready()
        self._killed.clear()
        conn.send((job, self.worker_id, self.using))
        while True:
            try:
                if conn.poll(0.1):
                    outcome: Outcome = conn.recv()
                    return outcome
            except (EOFError, OSError):
                pass  # the child is gone: said below
            if not self._process.is_alive():
                if not self._killed.is_set():
                    logger.error("worker.child_died worker=%s job=%s task=%s exit=%s; its lease "
                                 "will expire and the rescue step will retry it",
                                 self.worker_id, job.id, job.task, self._process.exitcode)
                self._forget()
                return None

    def kill(self) -> None:
        """Terminate the child now (SIGTERM), and SIGKILL it if it still runs after the grace."""
        process = self._process
        if process is None or not process.is_alive():
            return
        self._killed.set()
        process.terminate()
        grace = float(settings.KILL_GRACE_SECONDS)
        threading.Timer(grace, lambda: process.is_alive() and process.kill()).start()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
        if self._process is not None:
            self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
        self._forget()

    def _ready(self) -> Connection:
        if self._process is None or not self._process.is_alive():
            parent, child = _SPAWN.Pipe()
            # The database the parent uses, should its settings have been changed since
            # start-up (a test run's database): the child reads them afresh.
            database = connections[self.using].settings_dict["NAME"]
            self._process = _SPAWN.Process(target=run_jobs,
                                           args=(child, os.getpid(), self.using, database),
                                           name=f"pgjobs-child {self.worker_id}", daemon=True)
            self._process.start()
            child.close()
            self._conn = parent
        assert self._conn is not None
        return self._conn

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None


__all__ = ["ChildProcess"]
