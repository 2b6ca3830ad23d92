"""Executor slots: one thread each, running a claimed batch job by job; and their watchdog.

A slot holds the job it runs and the claimed jobs waiting behind it. ``BatchRunner`` runs a
batch in a slot, outside any transaction, and hands every outcome to the settler. The
``Watchdog`` (run by the worker's main thread) hands back waiting jobs before their lease runs
out and gives up on a handler hung past twice its lease, whose thread cannot be killed.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..claimed import ClaimedJob
from ..context import JobContext
from ..executor import execute
from ..outcomes import Outcome
from ..registry import registry
from .connections import database_reachable
from .settler import Settler

logger = logging.getLogger("django_pgjobs.worker")


@dataclass
class Slot:
    """One executor thread and what it is running, for the watchdog."""

    index: int
    thread: threading.Thread | None = None
    job: ClaimedJob | None = None
    heartbeat: bool = False
    abandoned: bool = False
    # Claimed jobs waiting their turn behind ``job``; the watchdog may release them from here.
    waiting: deque[ClaimedJob] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.abandoned


class BatchRunner:
    """Runs claimed batches in slots; every outcome goes to the settler."""

    def __init__(
        self, settler: Settler, *, worker_id: str, using: str, stopping: Callable[[], bool]
    ) -> None:
        self.settler = settler
        self.worker_id = worker_id
        self.using = using
        self.stopping = stopping

    def run(self, slot: Slot, jobs: list[ClaimedJob]) -> None:
        with slot.lock:
            slot.waiting.extend(jobs)
        while True:
            job = self._next(slot)
            if job is None:
                return
            # An earlier job of the batch may have left the connection broken (the server cut
            # it mid-handler): reconnect now rather than fail this job on it as well. While the
            # database is unreachable, starting handlers would only burn their attempts.
            if not database_reachable(self.using):
                with slot.lock:
                    slot.job, slot.heartbeat = None, False
                    slot.waiting.appendleft(job)
                    self.release_waiting(slot, "database unreachable")
                return
            ctx = JobContext(job, worker_id=self.worker_id, using=self.using)
            if slot.heartbeat:
                self.settler.watch(ctx)
            try:
                outcome = execute(job, ctx)
            finally:
                if slot.heartbeat:
                    self.settler.unwatch(ctx)
                slot.job = None
            self.settler.put(outcome)

    def _next(self, slot: Slot) -> ClaimedJob | None:
        """The next job of the slot's batch to run now, or None when there is none to run."""
        with slot.lock:
            while slot.waiting:
                if self.stopping() or slot.abandoned:
                    self.release_waiting(slot, "worker stopping")
                    return None
                job = slot.waiting.popleft()
                if job.too_late_to_start():
                    self.settler.put(Outcome.released(job, "lease too short to start"))
                    continue
                handler = registry.resolve(job.task)
                slot.job, slot.heartbeat = job, bool(handler and handler.heartbeat)
                if slot.heartbeat:
                    # A declared-long job holds this executor for longer than the others'
                    # leases: let other executors and workers have them now.
                    self.release_waiting(slot, "batch behind a long-running job")
                return job
        return None

    def release_waiting(self, slot: Slot, reason: str) -> None:
        """Hand back the slot's unstarted jobs (the caller holds ``slot.lock``)."""
        while slot.waiting:
            self.settler.put(Outcome.released(slot.waiting.popleft(), reason))


class Watchdog:
    """Looks over the slots from the worker's main thread."""

    def __init__(self, runner: BatchRunner, *, start_slot: Callable[[], None]) -> None:
        self.runner = runner
        self.start_slot = start_slot

    def check(self, slots: list[Slot]) -> None:
        for slot in list(slots):
            self._release_stale_waiting(slot)
            job = slot.job
            if job is None or slot.heartbeat or slot.abandoned:
                continue
            # A handler hung past its lease (without heartbeats) has lost the job to the
            # rescue step; its thread cannot be killed, so give up on it and start a fresh one.
            if job.lease_left_seconds() < -job.lease_seconds:
                slot.abandoned = True
                logger.error("worker.abandon worker=%s job=%s task=%s ran past twice its lease; "
                             "starting a new executor", self.runner.worker_id, job.id, job.task)
                self.start_slot()

    def _release_stale_waiting(self, slot: Slot) -> None:
        # Jobs queued behind a slow handler must go back while their lease still holds, or
        # the rescue step would count an attempt they never had.
        with slot.lock:
            stale = [j for j in slot.waiting if j.too_late_to_start()]
            for job in stale:
                slot.waiting.remove(job)
                self.runner.settler.put(Outcome.released(job, "lease too short to start"))


__all__ = ["BatchRunner", "Slot", "Watchdog"]
