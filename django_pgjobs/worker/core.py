"""The worker: claim, execute outside any transaction, settle; maintenance; signals.

Threads, each with its own database connection:

- N executors: claim a batch from the next queue in turn (weighted), run each job, hand the
  outcome over;
- one settler: applies outcomes in batched fenced statements and sends heartbeats;
- one listener (unless poll-only): LISTENs for enqueue notifications and wakes idle executors;
- the main thread: maintenance (promote due jobs, rescue expired leases, age priorities, prune,
  watch backlog age), the watchdog for handlers that hang past their lease, and signals.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import FrameType
from typing import Any

import psycopg
from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    DataError,
    IntegrityError,
    ProgrammingError,
    connections,
)

from .conf import settings
from .context import ClaimedJob, JobContext
from .executor import execute
from .maintenance import Periodic, default_steps
from .notify import Listener
from .registry import registry
from .status import AttemptOutcome
from .transitions import Outcome, claim_jobs, promote_due_jobs, ready_queues, settle
from .validation import escape_control, queue_problem, whole_number_problem

logger = logging.getLogger("django_pgjobs.worker")

_QUEUE_REFRESH_SECONDS = 1.0
_RECONNECT_MAX_SECONDS = 5.0
# The exit status of a --burst worker that gave up on a database it could not reach.
EXIT_DATABASE_UNREACHABLE = 3
# Each executor holds a database connection; a claim of a batch holds its rows' locks.
MAX_CONCURRENCY = 100
MAX_BATCH_SIZE = 1000
# How long an idle settler sleeps when nothing wakes it (new outcomes and due heartbeats do).
_SETTLER_IDLE_SECONDS = 1.0


def weighted_rotation(weights: Mapping[str, int]) -> list[str]:
    """One cycle of queue turns in which each queue appears ``weight`` times, spread evenly.

    Smooth weighted round-robin: {"billing": 3, "default": 1} gives billing, billing, default,
    billing, so no queue waits longer than its share between turns.
    """
    total = sum(weights.values())
    current = dict.fromkeys(weights, 0)
    cycle = []
    for _ in range(total):
        for queue, weight in weights.items():
            current[queue] += weight
        chosen = max(current, key=lambda q: current[q])
        current[chosen] -= total
        cycle.append(chosen)
    return cycle


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def refresh_connection(using: str) -> None:
    """Drop this thread's connection if an error left it unusable or CONN_MAX_AGE (> 0) passed.

    Unlike ``close_old_connections``, a CONN_MAX_AGE of 0 does not close the connection after
    every claim: a worker is one long-running "request".
    """
    connection = connections[using]
    if connection.connection is None:
        return
    if connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            reset_connection(using)
            return
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    if max_age and connection.close_at is not None and time.monotonic() >= connection.close_at:
        reset_connection(using)


def database_reachable(using: str) -> bool:
    """Refresh this thread's connection and say whether the database answers."""
    refresh_connection(using)
    connection = connections[using]
    if connection.connection is not None:
        return True
    try:
        connection.ensure_connection()
    except DatabaseError:
        return False
    return True


def database_target(using: str) -> str:
    """Where ``using`` connects, for a log line: user@host:port/name, never the password."""
    params = connections[using].settings_dict
    host = params.get("HOST") or "(local socket)"
    return f"{params.get('USER') or '-'}@{host}:{params.get('PORT') or 5432}/{params.get('NAME')}"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one line of at most ``limit`` characters (drivers' messages span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def database_error_text(exc: BaseException) -> str:
    """A database error as one line, without the DETAIL and CONTEXT parts of the server's report.

    Those parts quote the data that failed (a jsonb cast's CONTEXT echoes the JSON, results and
    all), which must not reach a log; the primary message and SQLSTATE say what went wrong.
    """
    cause = exc.__cause__ if isinstance(exc.__cause__, psycopg.Error) else exc
    diag = getattr(cause, "diag", None)
    primary = getattr(diag, "message_primary", None)
    if primary:
        sqlstate = getattr(cause, "sqlstate", None)
        return one_line(Exception(f"{primary} (SQLSTATE {sqlstate})" if sqlstate else primary))
    return one_line(exc)


class Outage:
    """Since when this worker's database calls have been failing; shared by its threads."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._lock = threading.Lock()

    def failed(self) -> float:
        """Record a failure; return for how many seconds calls have been failing."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since = now
            return now - self._since

    def recovered(self) -> None:
        with self._lock:
            self._since = None


def reset_connection(using: str) -> None:
    """Drop this thread's connection after an error; the next query reconnects."""
    try:
        connections[using].close()
    except DatabaseError:
        connections[using].connection = None


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

    def add_settled(self, outcome: str, won: bool) -> None:
        with self._lock:
            if won:
                self.settled[outcome] = self.settled.get(outcome, 0) + 1
            else:
                self.lost += 1

    def add_database_error(self) -> None:
        with self._lock:
            self.database_errors += 1


class Settler(threading.Thread):
    """Applies outcomes in batches and keeps declared-long leases alive."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(name="pgjobs-settler", daemon=True)
        self.worker = worker
        self._cond = threading.Condition()
        self._pending: list[Outcome] = []
        self._oldest: float | None = None
        self._beats: dict[int, tuple[JobContext, float]] = {}
        self._stopping = False

    def put(self, outcome: Outcome) -> None:
        with self._cond:
            self._pending.append(outcome)
            if self._oldest is None:
                # An idle settler sleeps up to a second: wake it to time this batch's flush.
                self._oldest = time.monotonic()
                self._cond.notify()
            if len(self._pending) >= self.worker.settle_batch:
                self._cond.notify()

    def watch(self, ctx: JobContext) -> None:
        """Heartbeat ``ctx``'s lease every third of its length until ``unwatch``."""
        with self._cond:
            self._beats[ctx.job.id] = (ctx, time.monotonic() + ctx.job.lease_seconds / 3)
            self._cond.notify()

    def unwatch(self, ctx: JobContext) -> None:
        with self._cond:
            self._beats.pop(ctx.job.id, None)

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.join(timeout)

    def run(self) -> None:
        try:
            self._loop()
        finally:
            connections.close_all()

    def _loop(self) -> None:
        flush_after = float(settings.SETTLE_FLUSH_SECONDS)
        backoff = 0.1
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    next_beat = min((due for _, due in self._beats.values()), default=None)
                    ready = bool(self._pending) and (
                        self._stopping
                        or len(self._pending) >= self.worker.settle_batch
                        or now - (self._oldest or now) >= flush_after
                    )
                    if ready or (next_beat is not None and next_beat <= now):
                        break
                    if self._stopping and not self._pending:
                        return
                    waits = [_SETTLER_IDLE_SECONDS]
                    if self._pending:
                        waits.append(flush_after - (now - (self._oldest or now)))
                    if next_beat is not None:
                        waits.append(next_beat - now)
                    self._cond.wait(max(0.001, min(waits)))
                batch, self._pending, self._oldest = self._pending, [], None
                beats = [ctx for ctx, due in self._beats.values() if due <= time.monotonic()]
            try:
                self._flush(batch)
                batch = []  # settled: a heartbeat error below must not queue them again
                self._heartbeat(beats)
                backoff = 0.1
            except DatabaseError as exc:
                self.worker.counters.add_database_error()
                logger.warning("settler: database error, will retry: %s",
                               database_error_text(exc))
                reset_connection(self.worker.using)
                with self._cond:
                    self._pending[:0] = batch
                    self._oldest = self._oldest or time.monotonic()
                    if self._stopping and time.monotonic() > self.worker.hard_deadline:
                        logger.error("settler: giving up on %d outcomes at shutdown; their "
                                     "leases will expire and the jobs will be rescued",
                                     len(self._pending))
                        return
                time.sleep(backoff)
                backoff = min(backoff * 2, _RECONNECT_MAX_SECONDS)

    def _flush(self, batch: Sequence[Outcome]) -> None:
        if not batch:
            return
        try:
            won = settle(batch, using=self.worker.using)
        except (DataError, IntegrityError, ProgrammingError) as exc:
            # Not a lost connection: something in one report cannot be stored. Retrying the
            # batch would fail forever and hold back every other settlement of this worker.
            won = self._settle_one_by_one(batch, exc)
        for outcome in batch:
            if outcome.lease_token in won:
                self.worker.log_settled(outcome, won[outcome.lease_token])

    def _settle_one_by_one(
        self, batch: Sequence[Outcome], exc: DatabaseError
    ) -> dict[uuid.UUID, bool]:
        logger.error("settler: %d outcomes could not be stored together (%s); settling them "
                     "one at a time", len(batch), database_error_text(exc))
        won: dict[uuid.UUID, bool] = {}
        for outcome in batch:
            for attempt in (outcome, _stripped(outcome)):
                try:
                    won.update(settle([attempt], using=self.worker.using))
                    break
                except (DataError, IntegrityError, ProgrammingError) as error:
                    logger.error("settler: job %s: report not stored: %s", outcome.job_id,
                                 database_error_text(error))
            else:
                logger.error("settler: job %s: giving up on its report; its lease will expire "
                             "and the rescue step will retry it", outcome.job_id)
        return won

    def _heartbeat(self, contexts: Sequence[JobContext]) -> None:
        if not contexts:
            return
        from .transitions import extend_leases

        extended = extend_leases(
            [(ctx.job.id, ctx.job.lease_token) for ctx in contexts], using=self.worker.using
        )
        with self._cond:
            for ctx in contexts:
                if ctx.job.id not in extended:
                    ctx._lease_lost.set()
                    self._beats.pop(ctx.job.id, None)
                    logger.warning("job.lease_lost id=%s task=%s worker=%s",
                                   ctx.job.id, ctx.job.task, self.worker.worker_id)
                    continue
                ctx.job.claimed_monotonic = time.monotonic()
                if extended[ctx.job.id]:
                    ctx._cancel_requested.set()
                if ctx.job.id in self._beats:
                    self._beats[ctx.job.id] = (ctx, time.monotonic() + ctx.job.lease_seconds / 3)


def _stripped(outcome: Outcome) -> Outcome:
    """``outcome`` without the text and result that could not be stored."""
    return replace(outcome, error="the worker's report could not be stored", traceback="",
                   result_json=None)


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
        maintenance: Sequence[Periodic] | None = None,
        queue_weights: Mapping[str, int] | None = None,
        listen: bool | None = None,
    ) -> None:
        for name, value, high in (("concurrency", concurrency, MAX_CONCURRENCY),
                                  ("batch_size", batch_size, MAX_BATCH_SIZE),
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
        self.queue_weights = _check_weights(queue_weights or {}, self.queues)
        # The turns an explicit queue list takes; a queue without a weight has weight 1.
        self._schedule = weighted_rotation(
            {q: self.queue_weights.get(q, 1) for q in self.queues}
        ) if self.queues else []
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.settle_batch = batch_size * concurrency
        self.poll_interval = float(
            settings.POLL_INTERVAL_SECONDS if poll_interval is None else poll_interval
        )
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")
        self.burst = burst
        self.max_jobs = max_jobs
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
        self.hard_deadline = float("inf")
        self._stop = threading.Event()
        self._budget_lock = threading.Lock()
        self._budget = max_jobs
        self._wake = threading.Condition()
        self._wake_generation = 0
        self._rotation = 0
        self._known_queues: list[str] = []
        self._queues_read_at = 0.0
        self._slots: list[Slot] = []
        self._settler = Settler(self)
        self._listener: Listener | None = None
        self._signals_seen = 0
        # Called with (outcome, won) after each settlement; metrics hook in here.
        self.settle_listeners: list[Callable[[Outcome, bool], None]] = []
        # Called with each claimed batch before it runs; metrics hook in here too.
        self.claim_listeners: list[Callable[[list[ClaimedJob]], None]] = []

    # --- lifecycle ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (signal, ``stop()``, burst finished or max jobs).

        Return 0, or ``EXIT_DATABASE_UNREACHABLE`` when a burst worker gave up on its database.
        """
        previous = self._install_signal_handlers()
        logger.info("worker.start worker=%s queues=%s concurrency=%d batch=%d burst=%s "
                    "listen=%s", self.worker_id, ",".join(self._queue_labels()),
                    self.concurrency, self.batch_size, self.burst, self.listen)
        if not self._connect():
            self._restore_signal_handlers(previous)
            connections.close_all()
            return self.exit_code
        self._settler.start()
        if self.listen:
            self._listener = Listener(
                self.wake, queues=self.queues, using=self.using,
                application_name=f"pgjobs-listener {self.worker_id}",
            )
            self._listener.start()
        for index in range(self.concurrency):
            self._start_slot(Slot(index))
        try:
            self._main_loop()
        finally:
            self._shutdown()
            self._restore_signal_handlers(previous)
        logger.info("worker.stop worker=%s claimed=%d settled=%s lost=%d", self.worker_id,
                    self.counters.claimed, self.counters.settled, self.counters.lost)
        return self.exit_code

    def _connect(self) -> bool:
        """Reach the database before starting any thread; False if stopped or given up."""
        backoff = 0.1
        while not self._stop.is_set():
            try:
                connections[self.using].ensure_connection()
            except DatabaseError as exc:
                if self.database_failed("connect", exc, backoff):
                    return False
                self._stop.wait(backoff)
                backoff = min(backoff * 2, _RECONNECT_MAX_SECONDS)
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
        logger.warning(
            "worker.database_error worker=%s during=%s database=%s failing_for=%.1fs "
            "retry_in=%.1fs error=%s", self.worker_id, what, database_target(self.using),
            down_for, retry_in, one_line(exc),
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

    def stop(self) -> None:
        """Stop claiming; running handlers finish, unstarted claimed jobs are released."""
        self._stop.set()
        self.wake()

    def wake(self) -> None:
        """Tell idle executors to claim now (new work arrived)."""
        with self._wake:
            self._wake_generation += 1
            self._wake.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _main_loop(self) -> None:
        while not self._stop.is_set():
            if not any(s.thread and s.thread.is_alive() for s in self._slots if not s.abandoned):
                return
            now = time.monotonic()
            for step in self.steps:
                if step.due(now):
                    changed = self._run_step(step)
                    step.schedule_next(time.monotonic(), changed)
            self._watchdog()
            next_due = min((s.next_due for s in self.steps), default=now + 1.0)
            self._stop.wait(max(0.01, min(next_due - time.monotonic(), 0.25)))

    def _run_step(self, step: Periodic) -> int:
        try:
            changed = step.run(self.using)
        except DatabaseError as exc:
            self.counters.add_database_error()
            logger.warning("maintenance %s: database error: %s", step.name,
                           database_error_text(exc))
            reset_connection(self.using)
            return 0
        if changed and step.name == "promote":
            self.wake()
        return changed

    def _shutdown(self) -> None:
        self._stop.set()
        self.wake()
        if self._listener is not None:
            self._listener.stop()
        # A worker that gave up on its database cannot settle anything: it waits for nothing.
        grace = 0.0 if self.exit_code == EXIT_DATABASE_UNREACHABLE else self.shutdown_grace
        self.hard_deadline = time.monotonic() + grace
        for slot in self._slots:
            if slot.thread is not None and not slot.abandoned:
                slot.thread.join(max(0.0, self.hard_deadline - time.monotonic()))
        still_running = [s.job.id for s in self._slots if s.job is not None]
        if still_running:
            logger.warning("worker.shutdown jobs still running after %.0fs grace: %s; their "
                           "leases will expire and they will be rescued",
                           self.shutdown_grace, still_running)
        self._settler.stop(timeout=max(1.0, self.hard_deadline - time.monotonic()) + 1.0)
        connections.close_all()

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
        self._signals_seen += 1
        if self._signals_seen > 1:
            logger.warning("worker.kill worker=%s second signal: exiting now; leases will "
                           "recover running jobs", self.worker_id)
            os._exit(1)
        logger.info("worker.drain worker=%s signal=%s: finishing running jobs",
                    self.worker_id, signal.Signals(signum).name)
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
                limit = self._take_budget()
                if limit == 0:
                    return
                generation = self._wake_generation
                try:
                    refresh_connection(self.using)
                    jobs = self._claim(limit)
                    backoff = 0.1
                except DatabaseError as exc:
                    self._give_back_budget(limit)
                    reset_connection(self.using)
                    if self.database_failed("claim", exc, backoff):
                        return
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, _RECONNECT_MAX_SECONDS)
                    continue
                self.outage.recovered()
                self._give_back_budget(limit - len(jobs))
                if not jobs:
                    if self.burst and not self._anything_eligible():
                        return
                    self._idle(generation)
                    continue
                self.counters.add_claimed(len(jobs))
                if logger.isEnabledFor(logging.DEBUG):
                    for job in jobs:
                        logger.debug(
                            "job.claimed id=%s task=%s attempt=%s worker=%s trace=%s queue=%s",
                            job.id, job.task, job.attempt, self.worker_id,
                            escape_control(job.trace_id) or "-", job.queue,
                            extra={"pgjobs": {"job_id": job.id, "task": job.task,
                                              "attempt": job.attempt, "worker": self.worker_id,
                                              "trace_id": job.trace_id, "outcome": "claimed"}},
                        )
                for listener in self.claim_listeners:
                    listener(jobs)
                self._run_batch(slot, jobs)
        finally:
            connections.close_all()

    def _run_batch(self, slot: Slot, jobs: list[ClaimedJob]) -> None:
        with slot.lock:
            slot.waiting.extend(jobs)
        while True:
            with slot.lock:
                if not slot.waiting:
                    return
                if self._stop.is_set() or slot.abandoned:
                    self._release_waiting(slot, "worker stopping")
                    return
                job = slot.waiting.popleft()
                if job.lease_left_seconds() < job.lease_seconds / 2:
                    # Waiting behind its batch used half the lease: hand it back rather than
                    # start work that may outlive the lease.
                    self._settler.put(Outcome.release(job, "lease too short to start"))
                    continue
                handler = registry.resolve(job.task)
                slot.job, slot.heartbeat = job, bool(handler and handler.heartbeat)
                if slot.heartbeat:
                    # A declared-long job holds this executor for longer than the others'
                    # leases: let other executors and workers have them now.
                    self._release_waiting(slot, "batch behind a long-running job")
            # An earlier job of the batch may have left the connection broken (the server cut
            # it mid-handler): reconnect now rather than fail this job on it as well. While the
            # database is unreachable, starting handlers would only burn their attempts.
            if not database_reachable(self.using):
                with slot.lock:
                    slot.job, slot.heartbeat = None, False
                    slot.waiting.appendleft(job)
                    self._release_waiting(slot, "database unreachable")
                return
            ctx = JobContext(job, worker_id=self.worker_id, using=self.using)
            if slot.heartbeat:
                self._settler.watch(ctx)
            try:
                outcome = execute(job, ctx)
            finally:
                if slot.heartbeat:
                    self._settler.unwatch(ctx)
                slot.job = None
            self._settler.put(outcome)

    def _release_waiting(self, slot: Slot, reason: str) -> None:
        """Hand back the slot's unstarted jobs (the caller holds ``slot.lock``)."""
        while slot.waiting:
            self._settler.put(Outcome.release(slot.waiting.popleft(), reason))

    def _claim(self, limit: int) -> list[ClaimedJob]:
        queues = self._queue_order()
        for queue in queues:
            jobs = claim_jobs(self.worker_id, queue, limit, using=self.using)
            if jobs:
                return jobs
        if self.queues is None:
            self._queues_read_at = 0.0  # nothing found: read the ready queues again next time
        return []

    def _queue_order(self) -> list[str]:
        if self.queues is not None:
            queues, schedule = self.queues, self._schedule
        else:
            now = time.monotonic()
            if now - self._queues_read_at > _QUEUE_REFRESH_SECONDS:
                self._known_queues = ready_queues(using=self.using)
                self._queues_read_at = now
            queues = schedule = self._known_queues
        if not queues:
            return []
        # Weighted round-robin: each claim starts at the next turn of the cycle and falls back
        # to the other queues in order, so a flooded queue gets at most its share of claims
        # while other queues have ready work, and all of them when they have none.
        rotation = self._rotation = (self._rotation + 1) % len(schedule)
        start = queues.index(schedule[rotation])
        return queues[start:] + queues[:start]

    def _queue_labels(self) -> list[str]:
        if self.queues is None:
            return ["*"]
        return [f"{q}:{self.queue_weights[q]}" if q in self.queue_weights else q
                for q in self.queues]

    def _anything_eligible(self) -> bool:
        if promote_due_jobs(settings.PROMOTE_BATCH, using=self.using):
            return True
        ready = set(ready_queues(using=self.using))
        return bool(ready if self.queues is None else ready.intersection(self.queues))

    def _idle(self, generation: int) -> None:
        timeout = self.poll_interval * random.uniform(0.8, 1.2)
        with self._wake:
            if self._wake_generation == generation and not self._stop.is_set():
                self._wake.wait(timeout)

    def _take_budget(self) -> int:
        with self._budget_lock:
            if self._budget is None:
                return self.batch_size
            take = min(self.batch_size, self._budget)
            self._budget -= take
            return take

    def _give_back_budget(self, n: int) -> None:
        if n <= 0:
            return
        with self._budget_lock:
            if self._budget is not None:
                self._budget += n

    def _watchdog(self) -> None:
        # A handler that hangs past its lease (without heartbeats) has lost the job to the
        # rescue step; its thread cannot be killed, so give up on it and start a fresh one.
        for slot in list(self._slots):
            self._release_stale_waiting(slot)
            job = slot.job
            if job is None or slot.heartbeat or slot.abandoned:
                continue
            if job.lease_left_seconds() < -job.lease_seconds:
                slot.abandoned = True
                logger.error("worker.abandon worker=%s job=%s task=%s ran past twice its lease; "
                             "starting a new executor", self.worker_id, job.id, job.task)
                self._start_slot(Slot(len(self._slots)))

    def _release_stale_waiting(self, slot: Slot) -> None:
        # Jobs queued behind a slow handler must go back while their lease still holds, or
        # the rescue step would count an attempt they never had.
        with slot.lock:
            stale = [j for j in slot.waiting if j.lease_left_seconds() < j.lease_seconds / 2]
            for job in stale:
                slot.waiting.remove(job)
                self._settler.put(Outcome.release(job, "lease too short to start"))

    # --- logging ----------------------------------------------------------------------------

    def log_settled(self, outcome: Outcome, won: bool) -> None:
        reported = outcome.attempt_outcome.value
        self.counters.add_settled(reported, won)
        for listener in self.settle_listeners:
            listener(outcome, won)
        level = logging.INFO if won else logging.WARNING
        if not logger.isEnabledFor(level):
            return  # on the hot path: build nothing for a line nobody reads
        fields: dict[str, Any] = {
            "job_id": outcome.job_id, "task": outcome.task, "attempt": outcome.attempt,
            "worker": self.worker_id, "trace_id": outcome.trace_id,
            "outcome": reported if won else AttemptOutcome.LOST.value,
            "status": outcome.status.value if won else None,
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


def _check_weights(weights: Mapping[str, int], queues: Sequence[str] | None) -> dict[str, int]:
    for queue, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ValueError(f"queue weight for {queue!r} must be a whole number from 1 to 100, "
                             f"got {weight!r}")
        if queues is None or queue not in queues:
            raise ValueError(f"queue weight given for {queue!r}, which the worker does not serve")
    return dict(weights)
