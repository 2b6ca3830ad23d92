"""The jobs whose handlers run now in this worker, and the takeovers the worker makes of them.

Whatever runs a handler (an executor thread, a child process, the event loop) registers it here
while it runs. The worker's main thread looks the list over: a job still running at its timeout,
or one an operator cancelled, is settled by the worker itself (fenced by its lease like any
settlement), its handler is told (``ctx.timed_out``, ``ctx.cancelled``) and, where it can be,
stopped: a child process is killed, an async task cancelled. A thread cannot be stopped; what
its handler reports later is recorded as lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..claimed import ClaimedJob
from ..context import JobContext
from ..executor import broke_around, timed_out
from ..outcomes import Outcome
from .settler import Settler

logger = logging.getLogger("django_pgjobs.worker")


@dataclass
class RunningJob:
    job: ClaimedJob
    ctx: JobContext
    # This process's monotonic clock when the handler started; None while a child process
    # that will run it starts up (its timeout counts from the handler's start).
    started: float | None
    # Stops the handler where that is possible: kills its child process, cancels its task.
    stop: Callable[[], None] | None = None
    taken_over: bool = False
    taken_over_at: float = 0.0  # this process's monotonic clock at the takeover

    def start(self) -> None:
        """Note that the handler starts now."""
        self.started = time.monotonic()

    def ran_seconds(self, now: float | None = None) -> float:
        if self.started is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.started


class RunningJobs:
    """The running handlers of one worker, shared by its threads."""

    def __init__(self, settler: Settler, *, worker_id: str) -> None:
        self.settler = settler
        self.worker_id = worker_id
        self._jobs: dict[int, RunningJob] = {}
        self._lock = threading.Lock()

    @contextmanager
    def tracking(self, running: RunningJob, *, heartbeat: bool) -> Iterator[RunningJob]:
        """Hold ``running`` here while its handler runs, for the thread and the event loop
        alike: the watchdog sees it (timeouts, cancels), and the settler heartbeats the lease
        of a handler declared long."""
        self.started(running)
        if heartbeat:
            self.settler.watch(running.ctx)
        try:
            yield running
        finally:
            if heartbeat:
                self.settler.unwatch(running.ctx)
            self.finished(running.job.id)

    def started(self, running: RunningJob) -> None:
        with self._lock:
            self._jobs[running.job.id] = running

    def finished(self, job_id: int) -> RunningJob | None:
        with self._lock:
            return self._jobs.pop(job_id, None)

    def snapshot(self) -> list[RunningJob]:
        with self._lock:
            return list(self._jobs.values())

    def left_running(self, job_id: int) -> float | None:
        """How long ago ``job_id`` was taken over while its thread, which nothing can stop, runs
        on; None if it was not, or can be stopped."""
        with self._lock:
            running = self._jobs.get(job_id)
            if running is None or not running.taken_over or running.stop is not None:
                return None
            return time.monotonic() - running.taken_over_at

    def ids(self) -> list[int]:
        with self._lock:
            return [job_id for job_id, r in self._jobs.items() if not r.taken_over]

    def enforce_timeouts(self) -> int:
        """Take over every job still running at its timeout; return how many."""
        now = time.monotonic()
        taken = 0
        for running in self.snapshot():
            limit = running.job.timeout_seconds
            if (running.taken_over or limit is None or running.started is None
                    or running.ran_seconds(now) < limit):
                continue
            self.take_over(running, timed_out(running.job, ran_seconds=running.ran_seconds(now)),
                           timed_out=True)
            taken += 1
        return taken

    def cancel(self, job_ids: set[int]) -> int:
        """Take over the running jobs among ``job_ids`` as cancelled; return how many."""
        taken = 0
        for running in self.snapshot():
            if running.job.id in job_ids and not running.taken_over:
                self.take_over(running, Outcome.cancelled(
                    running.job, "cancelled by an operator while it ran"), cancelled=True)
                taken += 1
        return taken

    def take_over(
        self, running: RunningJob, outcome: Outcome, *, timed_out: bool = False,
        cancelled: bool = False,
    ) -> None:
        """Settle ``running`` with ``outcome`` now, tell its handler, and stop it if possible."""
        with self._lock:
            if running.taken_over:
                return
            running.taken_over, running.taken_over_at = True, time.monotonic()
        running.ctx.taken_over(timed_out=timed_out, cancelled=cancelled)
        self.settler.put(outcome)
        logger.warning("job.%s id=%s task=%s worker=%s after %.1fs; %s",
                       "timed_out" if timed_out else "cancelled", running.job.id,
                       running.job.task, self.worker_id, running.ran_seconds(),
                       "stopping its handler" if running.stop else
                       "its thread cannot be stopped: what it reports later is recorded lost")
        if running.stop is not None:
            running.stop()


def failed_around(job: ClaimedJob, exc: Exception, *, worker_id: str) -> Outcome:
    """Log that the worker's own code failed around ``job``, and return the job's failure.

    The exception's type only: its text may quote the payload, which logs must not show (the
    stored error is scrubbed).
    """
    logger.error("worker.job_error worker=%s job=%s task=%s: %s around the job; recorded as its "
                 "failure", worker_id, job.id, job.task, type(exc).__qualname__)
    return broke_around(job, exc)


__all__ = ["RunningJob", "RunningJobs", "failed_around"]
