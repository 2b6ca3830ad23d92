"""Process isolation: a handler declared ``isolation="process"`` runs in a child process.

A thread that ignores its timeout or a cancel cannot be stopped; a process can. Each executor
slot that meets such a handler starts one child (Python's "spawn": a fresh interpreter that sets
Django up itself, never a fork of a threaded worker) and reuses it for the next ones. The child
runs the job with its own database connection, so leases, heartbeats, receipts and the result
work exactly as in a thread, and sends the outcome back. The child says when the handler starts:
its own start-up does not count against the handler's timeout. To stop a job the worker
terminates the child (SIGTERM, then SIGKILL after PGJOBS_KILL_GRACE_SECONDS), or, if the job has
not started yet, does not start it; the slot starts a new child for its next process-isolated
job. A child never outlives the worker (see ``child``): the kernel kills it when the executor
thread that started it ends, the worker's death included.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import threading
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from django.db import connections

from ..child import READY, STARTED, run_jobs
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
        self._up = False  # the child has set Django up and waits for a job
        self._lock = threading.Lock()
        # By lease token (one per claim): the job the child was sent, and the job to stop.
        self._running: uuid.UUID | None = None
        self._stopped: uuid.UUID | None = None

    def run(self, job: ClaimedJob, started: Callable[[], None] = lambda: None) -> Outcome | None:
        """Run ``job`` in the child; its outcome, or None when it was stopped or the child died.

        ``started`` is called when the handler starts, once the child is set up: its start-up
        (a fresh interpreter importing Django) is not the handler's time. A stop that comes
        before then keeps the handler from starting.
        """
        try:
            conn = self._waiting_child(job)
            if conn is None:
                return None
            with self._lock:
                if self._stopped == job.lease_token:
                    return None
                self._running = job.lease_token
            conn.send((job, self.worker_id, self.using))
            while True:
                message = self._receive(job)
                if message is _GONE:
                    return None
                if message == STARTED:
                    started()
                elif message is not _NOTHING:
                    outcome: Outcome = message
                    return outcome
        finally:
            with self._lock:
                self._running = None

    def kill(self, job: ClaimedJob) -> None:
        """Stop ``job``: it does not start if it has not; if the child runs it, terminate the
        child now (SIGTERM), and SIGKILL it if it still runs after the grace."""
        with self._lock:
            self._stopped = job.lease_token
            process = self._process if self._running == job.lease_token else None
        if process is not None:
            _terminate(process)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(None)
        if self._process is not None:
            self._process.join(2)
            if self._process.is_alive():
                self._process.kill()
        self._forget()

    def _waiting_child(self, job: ClaimedJob) -> Connection | None:
        """The child, set up and waiting for a job; None if ``job`` was stopped first or the
        child died while it started."""
        if self._process is None or not self._process.is_alive():
            self._forget()
            self._start()
        while not self._up:
            with self._lock:
                stopped = self._stopped == job.lease_token
            if stopped:
                # A child stopped in its start-up may be stuck there: the next job gets a new one.
                _terminate(self._process)
                self._forget()
                return None
            message = self._receive(job)
            if message is _GONE:
                return None
            self._up = message == READY
        return self._conn

    def _start(self) -> None:
        parent, child = _SPAWN.Pipe()
        # The database the parent uses, should its settings have been changed since start-up
        # (a test run's database): the child reads them afresh (see ``child.run_jobs``).
        database = connections[self.using].settings_dict["NAME"]
        self._process = _SPAWN.Process(target=run_jobs,
                                       args=(child, os.getpid(), self.using, database),
                                       name=f"pgjobs-child {self.worker_id}", daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def _receive(self, job: ClaimedJob) -> Any:
        """The child's next message; ``_NOTHING`` after a short wait, ``_GONE`` once it died."""
        assert self._conn is not None
        try:
            if self._conn.poll(0.1):
                return self._conn.recv()
        except (EOFError, OSError):
            pass  # the child is gone: said below
        if self._process.is_alive():
            return _NOTHING
        with self._lock:
            stopped = self._stopped == job.lease_token
        if not stopped:
            logger.error("worker.child_died worker=%s job=%s task=%s exit=%s; its lease will "
                         "expire and the rescue step will retry it", self.worker_id, job.id,
                         job.task, self._process.exitcode)
        self._forget()
        return _GONE

    def _forget(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None
        self._up = False


def _terminate(process: Any) -> None:
    """SIGTERM ``process`` now, and SIGKILL it if it still runs after the grace."""
    if not process.is_alive():
        return
    process.terminate()
    grace = float(settings.KILL_GRACE_SECONDS)
    threading.Timer(grace, lambda: process.is_alive() and process.kill()).start()


# What ``_receive`` returns when the child said nothing yet, and once it is gone.
_NOTHING = object()
_GONE = object()


__all__ = ["ChildProcess"]
