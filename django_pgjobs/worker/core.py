"""The Worker: its lifecycle, its executors' claim loop and its main thread's loop.

Threads, each with its own database connection:

- N executors: claim a batch from the next queue in turn (``queues.QueueRotation``) and run it
  (``slots.BatchRunner``): thread handlers in the executor, process-isolated ones in its child
  process (``isolation``), async ones on the event loop (``aio.AsyncRunner``, a thread of its
  own, started on the first async job);
- one settler (``settler.Settler``): applies outcomes in batched fenced statements and sends
  heartbeats;
- one listener (unless poll-only, ``notify.Listener``): LISTENs for enqueue notifications and
  wakes idle executors;
- the main thread: maintenance steps on their cadence, the watchdog (timeouts, operators'
  cancels, hung handlers: ``slots.Watchdog``, ``running.RunningJobs``), and signals.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from ..claimed import ClaimedJob
from ..conf import settings
from ..maintenance import RATES_STEP, Step, default_steps
from ..notify import Listener
from ..outcomes import Outcome
from ..status import AttemptOutcome
from ..transitions import (
    claim_jobs,
    pending_queues_with_work_running,
    promote_due_jobs,
    ready_queues,
    settle_and_claim,
)
from ..validation import (
    escape_control,
    poll_interval_problem,
    queue_problem,
    whole_number_problem,
)
from ..workers import Heartbeat
from .aio import DEFAULT_ASYNC_CONCURRENCY, AsyncRunner
from .connections import (
    Outage,
    database_error_text,
    database_target,
    is_read_only_error,
    refresh_connection,
    reset_connection,
)
from .floors import ClaimFloors, HorizonWatch
from .queues import QueueRotation
from .running import RunningJobs
from .settler import Settler, SettlerConfig
from .slots import BatchRunner, Slot, Watchdog

logger = logging.getLogger("django_pgjobs.worker")

RECONNECT_MAX_SECONDS = 5.0
# The longest the main thread waits before it looks again: at its steps, its slots and a signal.
MAIN_TICK_SECONDS = 0.25
# The exit status of a --burst worker that gave up on a database it could not reach.
EXIT_DATABASE_UNREACHABLE = 3
# The exit status of a worker whose executors all failed (each failure is logged).
EXIT_EXECUTORS_LOST = 4
# A thread that cannot be stopped (a handler past its timeout or cancelled, and still running
# after PGJOBS_KILL_GRACE_SECONDS, or hung past twice its lease) is given up and its executor
# replaced, up to this many such threads per executor at once: each keeps its database
# connection until its handler returns.
ABANDONED_THREADS_PER_EXECUTOR = 4
# Each executor holds a database connection; a claim of a batch holds its rows' locks.
MAX_CONCURRENCY = 100
MAX_BATCH_SIZE = 1000
MAX_ASYNC_CONCURRENCY = 10_000


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class Counters:
    claimed: int = 0
    settled: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    database_errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_claimed(self, n: int) -> None:
        with self._lock:
            self.claimed += n

    def add_settled(self, outcome: str, applied: bool) -> None:
        with self._lock:
            if applied:
                self.settled[outcome] = self.settled.get(outcome, 0) + 1
            else:
                self.lost += 1

    def add_database_error(self) -> None:
        with self._lock:
            self.database_errors += 1


class Budget:
    """How many more jobs a ``--max-jobs`` worker may claim (None: no limit)."""

    def __init__(self, max_jobs: int | None, batch_size: int) -> None:
        self._left = max_jobs
        self._batch_size = batch_size
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if self._left is None:
                return self._batch_size
            take = min(self._batch_size, self._left)
            self._left -= take
            return take

    def give_back(self, n: int) -> None:
        if n <= 0:
            return
        with self._lock:
            if self._left is not None:
                self._left += n


class Worker:
    """Runs jobs from the given queues (all queues when none are given) until stopped."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        batch_size: int = 10,
        poll_interval: float | None = None,
        burst: bool = False,
        max_jobs: int | None = None,
        worker_id: str | None = None,
        shutdown_grace: float | None = None,
        using: str = DEFAULT_DB_ALIAS,
        install_signals: bool = True,
        maintenance: Sequence[Step] | None = None,
        queue_weights: Mapping[str, int] | None = None,
        listen: bool | None = None,
        async_concurrency: int = DEFAULT_ASYNC_CONCURRENCY,
    ) -> None:
        for name, value, high in (("concurrency", concurrency, MAX_CONCURRENCY),
                                  ("batch_size", batch_size, MAX_BATCH_SIZE),
                                  ("async_concurrency", async_concurrency, MAX_ASYNC_CONCURRENCY),
                                  ("max_jobs", 1 if max_jobs is None else max_jobs, 2**62)):
            problem = whole_number_problem(value, 1, high)
            if problem is not None:
                raise ValueError(f"{name} {problem}")
        if queue_weights and not queues:
            queues = list(queue_weights)
        for queue in queues or ():
            problem = queue_problem(queue)
            if problem is not None:
                raise ValueError(f"queue {problem}")
        self.queues = list(dict.fromkeys(queues)) if queues else None
        self.rotation = QueueRotation(self.queues, queue_weights or {}, using=using)
        self.concurrency = concurrency
        self.async_concurrency = async_concurrency
        self.batch_size = batch_size
        self.poll_interval = float(
            settings.POLL_INTERVAL_SECONDS if poll_interval is None else poll_interval
        )
        problem = poll_interval_problem(self.poll_interval)
        if problem is not None:  # the setting's rule, for a process that skipped the checks
            raise ValueError(f"poll_interval {problem}")
        self.burst = burst
        self.worker_id = worker_id or default_worker_id()
        self.shutdown_grace = float(
            settings.SHUTDOWN_GRACE_SECONDS if shutdown_grace is None else shutdown_grace
        )
        self.using = using
        self.install_signals = install_signals
        # Poll-only (listen False) keeps no session state, for PgBouncer's transaction pooling.
        self.listen = bool(settings.LISTEN if listen is None else listen)
        self.steps = list(maintenance) if maintenance is not None else default_steps(
            self.poll_interval, queues=self.queues
        )
        self.counters = Counters()
        self.exit_code = 0
        self.outage = Outage()
        self.settler = Settler(
            SettlerConfig(using=using, worker_id=self.worker_id, batch=batch_size * concurrency,
                          flush_seconds=float(settings.SETTLE_FLUSH_SECONDS),
                          with_claims=bool(settings.SETTLE_WITH_CLAIM)),
            on_settled=self.log_settled, on_database_error=self.counters.add_database_error,
        )
        self.running = RunningJobs(self.settler, worker_id=self.worker_id)
        self.async_runner = AsyncRunner(self.settler, self.running,
                                        concurrency=async_concurrency,
                                        worker_id=self.worker_id, using=using)
        self.runner = BatchRunner(self.settler, self.running, self.async_runner,
                                  worker_id=self.worker_id, using=using,
                                  stopping=lambda: self.stopping)
        # The worker's row in pgjobs_worker: written at start, every heartbeat, and at a stop.
        self.heartbeat = Heartbeat(self.worker_id, queues=self.queues,
                                   concurrency=self.concurrency, listens=self.listen,
                                   running=lambda: len(self.running.snapshot()))
        self.steps.append(Step("heartbeat", float(settings.WORKER_HEARTBEAT_SECONDS),
                               self.heartbeat))
        # Where claims start while a snapshot held open keeps vacuum from cleaning up.
        self.floors = ClaimFloors()
        self.steps.append(Step("horizon", float(settings.RESCUE_INTERVAL_SECONDS),
                               HorizonWatch(self.floors)))
        self.watchdog = Watchdog(
            self.runner, start_slot=lambda: self._start_slot(Slot(next(self._slot_numbers))),
            cancel_every=float(settings.CANCEL_CHECK_SECONDS),
            max_abandoned=ABANDONED_THREADS_PER_EXECUTOR * concurrency,
            grace=float(settings.KILL_GRACE_SECONDS),
        )
        # Called with (outcome, applied) after each settlement; metrics hook in here.
        self.settle_listeners: list[Callable[[Outcome, bool], None]] = []
        # Called with each claimed batch before it runs; metrics hook in here too.
        self.claim_listeners: list[Callable[[list[ClaimedJob]], None]] = []
        self._budget = Budget(max_jobs, batch_size)
        self._stop = threading.Event()
        # Set to run the main thread's loop now (a stop, or a rate's next start announced).
        self._main_nudge = threading.Event()
        self._wake = threading.Condition()
        self._wake_generation = 0
        self._slots: list[Slot] = []  # the main thread's; given-up ones go once they end
        self._slot_numbers = itertools.count()
        self._listener: Listener | None = None
        self._signals_seen = 0
        # The first SIGTERM or SIGINT, noted by the handler for the main loop to act on.
        self._signalled: int | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (signal, ``stop()``, burst finished or max jobs).

        Return 0, ``EXIT_DATABASE_UNREACHABLE`` when a burst worker gave up on its database, or
        ``EXIT_EXECUTORS_LOST`` when every executor failed.
        """
        previous = self._install_signal_handlers()
        logger.info("worker.start worker=%s queues=%s concurrency=%d batch=%d burst=%s "
                    "listen=%s", self.worker_id, ",".join(self.rotation.labels()),
                    self.concurrency, self.batch_size, self.burst, self.listen)
        if not self._connect():
            self._restore_signal_handlers(previous)
            connections.close_all()
            return self.exit_code
        self.settler.start()
        if self.listen:
            self._listener = Listener(
                self.wake, queues=self.queues, using=self.using,
                application_name=f"pgjobs-listener {self.worker_id}",
                noticed=self.rotation.noticed, rate_due=self.rate_due,
            )
            self._listener.start()
        for _ in range(self.concurrency):
            self._start_slot(Slot(next(self._slot_numbers)))
        try:
            self._main_loop()
        finally:
            self._shutdown()
            self._restore_signal_handlers(previous)
        logger.info("worker.stop worker=%s claimed=%d settled=%s lost=%d", self.worker_id,
                    self.counters.claimed, self.counters.settled, self.counters.lost)
        return self.exit_code

    def stop(self) -> None:
        """Stop claiming; running handlers finish, unstarted claimed jobs are released."""
        self._stop.set()
        self._main_nudge.set()
        self.wake()

    def wake(self) -> None:
        """Tell idle executors to claim now (new work arrived)."""
        with self._wake:
            self._wake_generation += 1
            self._wake.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _connect(self) -> bool:
        """Reach the database before starting any thread; False if stopped or given up."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                connections[self.using].ensure_connection()
            except DatabaseError as exc:
                if self.database_failed("connect", exc, backoff):
                    return False
                retry_at = time.monotonic() + backoff
                while self._signalled is None and time.monotonic() < retry_at:
                    self._stop.wait(min(MAIN_TICK_SECONDS, retry_at - time.monotonic()))
                if self._signalled is not None:
                    self._drain_on_signal()
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
                continue
            self.outage.recovered()
            return True
        return False

    def database_failed(self, what: str, exc: BaseException, retry_in: float) -> bool:
        """Log a failed database call and its backoff; True when a burst worker gives up.

        A long-running worker retries for as long as it takes (an outage ends); a burst worker,
        run by a script that waits for it, exits after PGJOBS_BURST_UNREACHABLE_SECONDS.
        """
        self.counters.add_database_error()
        down_for = self.outage.failed()
        if is_read_only_error(exc) and self._listener is not None:
            self._listener.check_server()
        logger.warning(
            "worker.database_error worker=%s during=%s database=%s failing_for=%.1fs "
            "retry_in=%.1fs error=%s", self.worker_id, what, database_target(self.using),
            down_for, retry_in, database_error_text(exc),
        )
        limit = float(settings.BURST_UNREACHABLE_SECONDS)
        if not self.burst or down_for < limit:
            return False
        logger.error(
            "worker.give_up worker=%s database=%s unreachable for %.1fs "
            "(PGJOBS_BURST_UNREACHABLE_SECONDS=%g): exiting with status %d",
            self.worker_id, database_target(self.using), down_for, limit,
            EXIT_DATABASE_UNREACHABLE,
        )
        self.exit_code = EXIT_DATABASE_UNREACHABLE
        self.stop()
        return True

    def _shutdown(self) -> None:
        self._stop.set()
        self.wake()
        if self._listener is not None:
            self._listener.stop()
        # A worker that gave up on its database cannot settle anything: it waits for nothing.
        grace = 0.0 if self.exit_code == EXIT_DATABASE_UNREACHABLE else self.shutdown_grace
        hard_deadline = time.monotonic() + grace
        for slot in self._slots:
            if slot.thread is not None and not slot.abandoned:
                slot.thread.join(max(0.0, hard_deadline - time.monotonic()))
        self.async_runner.stop(deadline=hard_deadline)
        for slot in self._slots:
            if slot.child is not None:
                slot.child.close()
        still_running = [r.job.id for r in self.running.snapshot()]
        if still_running:
            logger.warning("worker.shutdown jobs still running after %.0fs grace: %s; their "
                           "leases will expire and they will be rescued",
                           self.shutdown_grace, still_running)
        self.settler.stop(give_up_at=hard_deadline,
                          timeout=max(1.0, hard_deadline - time.monotonic()) + 1.0)
        try:
            self.heartbeat.stopped(self.using)
        except DatabaseError as exc:
            logger.warning("worker.stopped_row worker=%s: could not say it stopped (its row "
                           "will show it gone once its heartbeat is old): %s", self.worker_id,
                           database_error_text(exc))
        connections.close_all()

    # --- the main thread ----------------------------------------------------------------------

    def _main_loop(self) -> None:
        while not self._stop.is_set():
            if self._signalled is not None:
                self._drain_on_signal()
                continue
            # Done when no executor claims any more and no async job is left to look after.
            if not any(slot.alive for slot in self._slots) and not self.async_runner.in_flight():
                ended = [slot for slot in self._slots if not slot.abandoned]
                if ended and all(slot.crashed for slot in ended):
                    logger.error("worker.executors_lost worker=%s: every executor failed; "
                                 "exiting with status %d", self.worker_id, EXIT_EXECUTORS_LOST)
                    self.exit_code = EXIT_EXECUTORS_LOST
                return
            now = time.monotonic()
            for step in self.steps:
                if step.due(now):
                    changed = self._run_step(step)
                    step.schedule_next(time.monotonic(), changed)
            self.watchdog.check(self._slots)
            self._check_cancels()
            next_due = min((s.next_due for s in self.steps), default=now + 1.0)
            self._main_nudge.wait(max(0.01, min(next_due - time.monotonic(), MAIN_TICK_SECONDS)))
            self._main_nudge.clear()

    def rate_due(self, seconds: float) -> None:
        """A job under a rate may start in ``seconds``: run the rates step then (the listener
        hears it from the claim that made the job wait), not at its next poll."""
        for step in self.steps:
            if step.name == RATES_STEP:
                step.next_due = min(step.next_due, time.monotonic() + max(0.0, seconds))
                self._main_nudge.set()

    def _check_cancels(self) -> None:
        try:
            self.watchdog.check_cancels(self._slots, self.using)
        except DatabaseError as exc:
            self.counters.add_database_error()
            logger.warning("worker.cancels: database error: %s", database_error_text(exc))
            reset_connection(self.using)

    def _run_step(self, step: Step) -> int:
        try:
            changed = step.run(self.using)
        except DatabaseError as exc:
            self.counters.add_database_error()
            logger.warning("maintenance %s: database error: %s", step.name,
                           database_error_text(exc))
            reset_connection(self.using)
            return 0
        if changed and step.wakes_workers:
            self.wake()
        return changed

    # --- signals ----------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if not self.install_signals or threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _restore_signal_handlers(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # A handler runs in the main thread between two of its bytecodes, perhaps while that
        # thread holds the lock inside an Event it is waiting on or clearing (the main loop's
        # nudge). Setting that Event here would wait for a lock its own thread holds, for ever:
        # a worker hung at SIGTERM until it was killed. So the first signal is only noted, and
        # the main loop, which looks at least every MAIN_TICK_SECONDS, starts the drain.
        self._signals_seen += 1
        if self._signals_seen > 1:
            # Logging's locks are reentrant: the main thread may take them again.
            logger.warning("worker.kill worker=%s second signal: exiting now; leases will "
                           "recover running jobs", self.worker_id)
            os._exit(1)
        self._signalled = signum

    def _drain_on_signal(self) -> None:
        """The main thread's answer to the first signal: stop claiming and finish (``stop``)."""
        assert self._signalled is not None
        logger.info("worker.drain worker=%s signal=%s: finishing running jobs",
                    self.worker_id, signal.Signals(self._signalled).name)
        self.stop()

    # --- executors --------------------------------------------------------------------------

    def _start_slot(self, slot: Slot) -> None:
        slot.thread = threading.Thread(
            target=self._executor, args=(slot,), name=f"pgjobs-executor-{slot.index}",
            daemon=True,
        )
        if slot not in self._slots:
            self._slots.append(slot)
        slot.thread.start()

    def _executor(self, slot: Slot) -> None:
        backoff = 0.1
        try:
            while not self._stop.is_set() and not slot.abandoned:
                limit = self._budget.take()
                if limit == 0:
                    return
                generation = self._wake_generation
                try:
                    refresh_connection(self.using)
                    jobs = self._claim(limit)
                    backoff = 0.1
                except DatabaseError as exc:
                    self._budget.give_back(limit)
                    reset_connection(self.using)
                    if self.database_failed("claim", exc, backoff):
                        return
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
                    continue
                self.outage.recovered()
                self._budget.give_back(limit - len(jobs))
                if not jobs:
                    if self.burst:
                        if not self._anything_eligible():
                            return
                        # What is eligible may be behind a floor: the next claim is a full one.
                        self.floors.missed()
                    self._idle(generation)
                    continue
                self.counters.add_claimed(len(jobs))
                if logger.isEnabledFor(logging.DEBUG):
                    self._log_claimed(jobs)
                self.runner.hold(slot, jobs)
                for listener in self.claim_listeners:
                    listener(jobs)
                self.runner.run(slot)
        except BaseException as exc:
            # A job's failure never reaches here (the runner records it as the job's outcome):
            # this is the executor's own code. It must not die unseen: its unstarted jobs go
            # back, it is logged, and a worker left with no executor exits non-zero.
            slot.crashed = True
            self.runner.hand_back_waiting(slot, "its executor failed")
            logger.error("worker.executor_died worker=%s executor=%d: %s", self.worker_id,
                         slot.index, type(exc).__qualname__, exc_info=exc)
        finally:
            connections.close_all()

    def _claim(self, limit: int) -> list[ClaimedJob]:
        # The first claim carries the worker's pending outcomes (settled in its transaction).
        with self.settler.lend() as loan:
            for queue in self.rotation.order():
                floors = self.floors.start(queue)
                started = time.perf_counter()
                if loan.outcomes:
                    applied, jobs = settle_and_claim(loan.outcomes, self.worker_id, queue, limit,
                                                     floors=floors, using=self.using)
                    loan.settled(applied)
                else:
                    jobs = claim_jobs(self.worker_id, queue, limit, floors=floors,
                                      using=self.using)
                self.floors.claimed(queue, jobs, limit=limit, full_seconds=(
                    None if floors is not None else time.perf_counter() - started))
                if jobs:
                    return jobs
        self.rotation.found_nothing()
        return []

    def _anything_eligible(self) -> bool:
        if promote_due_jobs(settings.PROMOTE_BATCH, using=self.using):
            return True
        ready = set(ready_queues(using=self.using))
        if not ready:
            # A workflow's pending jobs, which jobs running now will release: wait for them.
            ready = set(pending_queues_with_work_running(using=self.using))
        return bool(ready if self.queues is None else ready.intersection(self.queues))

    def _idle(self, generation: int) -> None:
        timeout = self.poll_interval * random.uniform(0.8, 1.2)
        with self._wake:
            if self._wake_generation == generation and not self._stop.is_set():
                self._wake.wait(timeout)

    # --- logging ----------------------------------------------------------------------------

    def _log_claimed(self, jobs: list[ClaimedJob]) -> None:
        for job in jobs:
            logger.debug(
                "job.claimed id=%s task=%s attempt=%s worker=%s trace=%s queue=%s",
                job.id, job.task, job.attempt, self.worker_id,
                escape_control(job.trace_id) or "-", job.queue,
                extra={"pgjobs": {"job_id": job.id, "task": job.task, "attempt": job.attempt,
                                  "worker": self.worker_id, "trace_id": job.trace_id,
                                  "outcome": "claimed"}},
            )

    def log_settled(self, outcome: Outcome, applied: bool) -> None:
        reported = outcome.attempt_outcome.value
        self.counters.add_settled(reported, applied)
        for listener in self.settle_listeners:
            listener(outcome, applied)
        level = logging.INFO if applied else logging.WARNING
        if not logger.isEnabledFor(level):
            return  # on the hot path: build nothing for a line nobody reads
        fields: dict[str, Any] = {
            "job_id": outcome.job_id, "task": outcome.task, "attempt": outcome.attempt,
            "worker": self.worker_id, "trace_id": outcome.trace_id,
            "outcome": reported if applied else AttemptOutcome.LOST.value,
            "status": outcome.status.value if applied else None,
            "failure_class": outcome.failure_class, "duration_ms": outcome.duration_ms,
        }
        logger.log(
            level,
            "job.%s id=%s task=%s attempt=%s worker=%s trace=%s status=%s class=%s "
            "duration_ms=%s",
            fields["outcome"], outcome.job_id, outcome.task, outcome.attempt, self.worker_id,
            escape_control(outcome.trace_id) or "-",
            fields["status"] or f"unchanged(reported {reported})",
            outcome.failure_class or "-", outcome.duration_ms,
            extra={"pgjobs": fields},
        )


__all__ = [
    "EXIT_DATABASE_UNREACHABLE",
    "EXIT_EXECUTORS_LOST",
    "MAX_ASYNC_CONCURRENCY",
    "MAX_BATCH_SIZE",
    "MAX_CONCURRENCY",
    "Budget",
    "Counters",
    "Worker",
    "default_worker_id",
]
