"""Executor slots: one thread each, running a claimed batch job by job; and their watchdog.

A slot holds the job it runs and the claimed jobs waiting behind it. ``BatchRunner`` runs a
batch in a slot, outside any transaction, and hands every outcome to the settler: a thread's
handler runs in the slot, a process-isolated one in the slot's child process, an async one on
the worker's event loop (the slot goes on with its batch meanwhile). The ``Watchdog`` (run by
the worker's main thread) takes over jobs past their timeout or cancelled by an operator, hands
back waiting jobs before their lease runs out, and gives up on a thread that runs on past a
takeover's grace or hung past twice its lease (it cannot be killed; a child process can, and
is), and forgets it once it ends.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import DatabaseError

from ..claimed import ClaimedJob
from ..context import JobContext
from ..executor import execute
from ..outcomes import Outcome
from ..registry import Handler, registry
from ..transitions import cancel_requested
from .aio import AsyncRunner
from .connections import database_reachable, reset_connection
from .isolation import ChildProcess
from .running import RunningJob, RunningJobs, failed_around
from .settler import Settler

logger = logging.getLogger("django_pgjobs.worker")

# How old the slot's last word on cancels may be when it starts a claimed job. A job started
# within this of its claim (or of the last read) starts without asking; one that waited longer
# behind the batch's earlier jobs is asked about first, with every job still waiting behind it,
# in one read by primary key. A batch of fast jobs so pays nothing; a slow one, a read per job
# at most, beside handlers that take longer than this each.
START_CANCEL_FRESH_SECONDS = 0.05
BEFORE_START = "cancelled by an operator before it started"


@dataclass
class Slot:
    """One executor thread and what it is running, for the watchdog."""

    index: int
    thread: threading.Thread | None = None
    job: ClaimedJob | None = None
    heartbeat: bool = False
    abandoned: bool = False
    # Its thread died of an error in the worker's own code (logged; see Worker._executor).
    crashed: bool = False
    # Claimed jobs waiting their turn behind ``job``; the watchdog may release them from here.
    waiting: deque[ClaimedJob] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # The child process of the slot's process-isolated handlers, once it has had one.
    child: ChildProcess | None = None
    # This process's clock when the slot last knew which of its jobs an operator cancelled: its
    # batch's claim, or its last read of cancel_requested.
    cancels_known_at: float = 0.0

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self.abandoned


class BatchRunner:
    """Runs claimed batches in slots; every outcome goes to the settler."""

    def __init__(
        self, settler: Settler, running: RunningJobs, async_runner: AsyncRunner, *,
        worker_id: str, using: str, stopping: Callable[[], bool],
    ) -> None:
        self.settler = settler
        self.running = running
        self.async_runner = async_runner
        self.worker_id = worker_id
        self.using = using
        self.stopping = stopping

    def hold(self, slot: Slot, jobs: list[ClaimedJob]) -> None:
        """Queue a claimed batch in ``slot``: from here on the watchdog can hand it back."""
        with slot.lock:
            slot.waiting.extend(jobs)
            # The claim just committed: no cancel of these jobs can have come before it.
            slot.cancels_known_at = min((j.claimed_monotonic for j in jobs), default=0.0)

    def _cancelled_before_start(self, slot: Slot, job: ClaimedJob) -> bool | None:
        """Before ``job`` starts: whether an operator cancelled it since its claim.

        Asked only when the slot's word on cancels is stale, in one read that covers the jobs
        waiting behind it too; a cancelled job is settled here, unstarted, and so are the
        waiting ones the read names. None: the database could not be asked.
        """
        if time.monotonic() - slot.cancels_known_at <= START_CANCEL_FRESH_SECONDS:
            return False
        with slot.lock:
            ids = [job.id, *(waiting.id for waiting in slot.waiting)]
        try:
            asked = set(cancel_requested(ids, using=self.using))
        except DatabaseError:
            reset_connection(self.using)  # the next claim reconnects
            return None
        slot.cancels_known_at = time.monotonic()
        if not asked:
            return False
        self.cancel_waiting(slot, asked)
        if job.id not in asked:
            return False
        self.settler.put(Outcome.cancelled(job, BEFORE_START))
        return True

    def run(self, slot: Slot) -> None:
        """Run the jobs waiting in ``slot`` one by one until none is left."""
        while True:
            picked = self._next(slot)
            if picked is None:
                return
            job, handler = picked
            # An earlier job of the batch may have left the connection broken (the server cut
            # it mid-handler): reconnect now rather than fail this job on it as well. While the
            # database is unreachable, starting handlers would only burn their attempts.
            cancelled = self._cancelled_before_start(slot, job) if database_reachable(
                self.using) else None
            if cancelled is None:
                with slot.lock:
                    slot.job, slot.heartbeat = None, False
                    slot.waiting.appendleft(job)
                    self.release_waiting(slot, "database unreachable")
                return
            if cancelled:
                slot.job, slot.heartbeat = None, False
                continue
            ctx = JobContext(job, worker_id=self.worker_id, using=self.using)
            if handler is not None and handler.is_async:
                slot.job, slot.heartbeat = None, False
                self.async_runner.submit(job, ctx, heartbeat=handler.heartbeat)
                continue
            process = handler is not None and handler.isolation == "process"
            try:
                outcome = self._run_here(slot, job, ctx, process)
            except Exception as exc:  # the worker's own code failed: the job's failure, not
                # the executor's death (the executor goes on with the rest of its batch)
                outcome = failed_around(job, exc, worker_id=self.worker_id)
            if outcome is not None:
                self.settler.put(ctx.settlement(outcome))

    def _run_here(
        self, slot: Slot, job: ClaimedJob, ctx: JobContext, process: bool
    ) -> Outcome | None:
        """Run one job in this slot's thread or its child; None when the child was killed."""
        child = stop = None
        if process:
            if slot.child is None:
                slot.child = ChildProcess(worker_id=self.worker_id, using=self.using)
            child = slot.child
            stop = functools.partial(child.kill, job)
        # A child's handler starts once the child is up: it says when (``handler_starts``).
        running = RunningJob(job, ctx, None if child else time.monotonic(), stop=stop)

        def handler_starts() -> None:
            # A fresh child's start-up spent lease time that the handler's timeout does not
            # count: renew the lease as the handler starts, so the handler has the whole lease
            # a thread's handler has, and its timeout still comes before the lease's end. A
            # child already up starts at once and needs no round trip.
            if job.lease_left_seconds() < job.lease_seconds * 2 / 3:
                ctx.renew_lease()
            running.start()

        try:
            with self.running.tracking(running, heartbeat=slot.heartbeat):
                if child is not None:
                    return child.run(job, started=handler_starts)
                return execute(job, ctx)
        finally:
            slot.job = None

    def _next(self, slot: Slot) -> tuple[ClaimedJob, Handler | None] | None:
        """The next job of the slot's batch to run now and its handler, or None if none is left."""
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
                if slot.heartbeat and not (handler and handler.is_async):
                    # A declared-long job holds this executor for longer than the others'
                    # leases: let other executors and workers have them now.
                    self.release_waiting(slot, "batch behind a long-running job")
                return job, handler
        return None

    def release_waiting(self, slot: Slot, reason: str) -> None:
        """Hand back the slot's unstarted jobs (the caller holds ``slot.lock``)."""
        while slot.waiting:
            self.settler.put(Outcome.released(slot.waiting.popleft(), reason))

    def cancel_waiting(self, slot: Slot, job_ids: set[int]) -> int:
        """Settle the slot's unstarted jobs among ``job_ids`` as cancelled; return how many."""
        with slot.lock:
            cancelled = [job for job in slot.waiting if job.id in job_ids]
            for job in cancelled:
                slot.waiting.remove(job)
                self.settler.put(Outcome.cancelled(job, BEFORE_START))
        return len(cancelled)

    # --- what the watchdog asks of the runner ----------------------------------------------

    def enforce_timeouts(self) -> None:
        """Take over every running job past its timeout."""
        self.running.enforce_timeouts()

    def taken_over_for(self, job: ClaimedJob) -> float | None:
        """How long ago ``job``'s run was taken over (timeout, cancel), if it was."""
        return self.running.left_running(job.id)

    def held(self, slots: list[Slot]) -> list[int]:
        """The ids of the jobs this runner holds: running, and waiting in ``slots``."""
        held = self.running.ids()
        for slot in slots:
            with slot.lock:
                held += [job.id for job in slot.waiting]
        return held

    def cancel(self, job_ids: set[int], slots: list[Slot]) -> int:
        """Take over the running jobs among ``job_ids`` and settle the waiting ones cancelled."""
        taken = self.running.cancel(job_ids)
        for slot in slots:
            taken += self.cancel_waiting(slot, job_ids)
        return taken

    def hand_back_waiting(self, slot: Slot, reason: str) -> None:
        """Hand back every unstarted job of ``slot``."""
        with slot.lock:
            self.release_waiting(slot, reason)

    def hand_back_stale(self, slot: Slot) -> None:
        """Hand back the unstarted jobs of ``slot`` whose lease is too short to start them.

        Jobs queued behind a slow handler must go back while their lease still holds, or the
        rescue step would count an attempt they never had.
        """
        with slot.lock:
            stale = [j for j in slot.waiting if j.too_late_to_start()]
            for job in stale:
                slot.waiting.remove(job)
                self.settler.put(Outcome.released(job, "lease too short to start"))


class Watchdog:
    """Looks over the slots and the running jobs from the worker's main thread."""

    def __init__(
        self, runner: BatchRunner, *, start_slot: Callable[[], None], cancel_every: float,
        max_abandoned: int, grace: float,
    ) -> None:
        self.runner = runner
        self.start_slot = start_slot
        self.cancel_every = cancel_every
        # At most this many given-up threads run on at once, each with its replacement and
        # each holding its database connection; past it, a stuck thread keeps its slot and the
        # worker runs with one executor fewer.
        self.max_abandoned = max_abandoned
        # How long a handler taken over gets to return (it may be returning) before its thread
        # is given up.
        self.grace = grace
        self._cancels_read_at = 0.0
        self._kept: set[int] = set()  # jobs whose stuck thread kept its slot (logged once)

    def check(self, slots: list[Slot]) -> None:
        """Look over ``slots`` once; forget those whose given-up thread has ended."""
        self._prune(slots)
        self.runner.enforce_timeouts()
        for slot in list(slots):
            self.runner.hand_back_stale(slot)
            job = slot.job
            if job is None or slot.abandoned:
                continue
            taken_over_for = self.runner.taken_over_for(job)
            if taken_over_for is not None:
                # A handler that timed out or was cancelled is settled, but its thread cannot
                # be stopped and may never return: the jobs queued behind it go back now, and
                # past the grace a fresh executor takes the slot, so a stuck handler costs no
                # capacity.
                self.runner.hand_back_waiting(slot, "batch behind a handler taken over")
                if taken_over_for >= self.grace:
                    self._abandon(slot, job, slots, "was taken over (timeout or cancel) and "
                                                    "its thread cannot be stopped")
                continue
            if slot.heartbeat:
                continue
            # A handler hung past its lease (without heartbeats) has lost the job to the
            # rescue step. A child process is killed; a thread cannot be, so give up on it
            # and start a fresh one.
            if job.lease_left_seconds() < -job.lease_seconds:
                if slot.child is not None:
                    slot.child.kill(job)
                    continue
                self._abandon(slot, job, slots, "ran past twice its lease")

    def _prune(self, slots: list[Slot]) -> None:
        # A given-up thread that ended at last has closed its connection: its slot goes, and
        # so does the note of a stuck job whose thread has left it.
        for slot in [s for s in slots if s.abandoned and s.thread is not None
                     and not s.thread.is_alive()]:
            slots.remove(slot)
            if slot.child is not None:
                slot.child.close()
        self._kept &= {s.job.id for s in slots if s.job is not None}

    def _abandon(self, slot: Slot, job: ClaimedJob, slots: list[Slot], why: str) -> None:
        """Give up on ``slot``'s thread and start a new executor, up to ``max_abandoned``."""
        running_on = sum(1 for s in slots if s.abandoned and s.thread is not None
                         and s.thread.is_alive())
        if running_on >= self.max_abandoned:
            if job.id not in self._kept:
                self._kept.add(job.id)
                logger.error("worker.abandon_limit worker=%s job=%s task=%s %s, but %d given-up "
                             "threads still run (the limit): its executor is not replaced, and "
                             "the worker runs one executor short until the handler returns",
                             self.runner.worker_id, job.id, job.task, why, running_on)
            return
        slot.abandoned = True
        logger.error("worker.abandon worker=%s job=%s task=%s %s; starting a new executor "
                     "(%d of at most %d given-up threads still run)", self.runner.worker_id,
                     job.id, job.task, why, running_on + 1, self.max_abandoned)
        self.start_slot()

    def check_cancels(self, slots: list[Slot], using: str) -> int:
        """Every ``cancel_every`` seconds, ask which of this worker's jobs were cancelled.

        Running ones are taken over as cancelled, waiting ones settled as cancelled.
        """
        now = time.monotonic()
        if now - self._cancels_read_at < self.cancel_every:
            return 0
        self._cancels_read_at = now
        held = self.runner.held(slots)
        if not held:
            return 0
        asked = set(cancel_requested(held, using=using))
        if not asked:
            return 0
        return self.runner.cancel(asked, slots)


__all__ = ["BatchRunner", "Slot", "Watchdog"]
