"""The settler: one thread that applies a worker's outcomes in batches and sends heartbeats.

Executors hand it outcomes (``put``). An executor that claims borrows what is pending and settles
it in its claim's transaction (``with settler.lend() as loan``): one round trip and one commit
for both, and what the claim could not settle comes back when the block ends. What no claim
takes in time the settler flushes itself, in one fenced statement, once the oldest has waited
``flush_seconds`` (or when four batches wait, the worker stops, or a claim gave its outcomes
back). Jobs whose handlers declared ``heartbeat=True`` are watched: their leases are extended
every third of their length, and the answer goes back to the handler's context. It knows
nothing of the worker but its config and two callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import DatabaseError, DataError, IntegrityError, ProgrammingError, connections

from ..context import JobContext
from ..outcomes import Outcome
from ..transitions import extend_leases, settle
from .connections import database_error_text, reset_connection

logger = logging.getLogger("django_pgjobs.worker")

# How long an idle settler sleeps when nothing wakes it (new outcomes and due heartbeats do).
IDLE_SECONDS = 1.0
RECONNECT_MAX_SECONDS = 5.0


@dataclass(frozen=True)
class SettlerConfig:
    using: str
    worker_id: str  # for log lines
    batch: int  # a full batch of outcomes
    flush_seconds: float  # flush when the oldest has waited this long
    # Claims borrow the pending outcomes (``lend``); the settler flushes a full batch only once
    # four are pending. False: it flushes each full batch at once, and ``lend`` lends nothing.
    with_claims: bool = True


class Settler(threading.Thread):
    """Applies outcomes in batches and keeps declared-long leases alive.

    ``on_settled(outcome, applied)`` is called for every outcome the database answered for;
    ``on_database_error()`` for every failed round trip.
    """

    def __init__(
        self,
        config: SettlerConfig,
        *,
        on_settled: Callable[[Outcome, bool], None],
        on_database_error: Callable[[], None],
    ) -> None:
        super().__init__(name="pgjobs-settler", daemon=True)
        self.config = config
        self.on_settled = on_settled
        self.on_database_error = on_database_error
        self._cond = threading.Condition()
        self._pending: list[Outcome] = []
        self._oldest: float | None = None
        self._beats: dict[int, tuple[JobContext, float]] = {}
        self._stopping = False
        # When stopping, how long a database outage may hold back the last outcomes.
        self._give_up_at = float("inf")
        # A claim could not settle what it took: this thread settles the pending outcomes next
        # (a report that cannot be stored must not fail one claim after another).
        self._settle_here = False

    def put(self, outcome: Outcome) -> None:
        with self._cond:
            self._pending.append(outcome)
            if self._oldest is None:
                # An idle settler sleeps up to a second: wake it to time this batch's flush.
                self._oldest = time.monotonic()
                self._cond.notify()
            if len(self._pending) >= self._high_water:
                self._cond.notify()

    @property
    def _high_water(self) -> int:
        # Past this many pending, the settler flushes without waiting for a claim to take them.
        return 4 * self.config.batch if self.config.with_claims else self.config.batch

    @contextmanager
    def lend(self) -> Iterator[Loan]:
        """Lend the pending outcomes (one per lease token) to a claim that settles them.

        The claim tells the database's answer with ``loan.settled(applied)``. Whatever it has
        not settled when the block ends (its transaction failed) comes back, and this thread
        stores it next: a report that cannot be stored must not fail one claim after another.
        """
        with self._cond:
            lending = (self.config.with_claims and self._pending and not self._settle_here
                       and not self._stopping)
            loan = Loan(self, self._take_batch() if lending else [])
        try:
            yield loan
        finally:
            if loan.outcomes:
                with self._cond:
                    self._pending[:0] = loan.outcomes
                    self._oldest = self._oldest or time.monotonic()
                    self._settle_here = True
                    self._cond.notify()

    def pending(self) -> list[Outcome]:
        """The outcomes waiting to be settled, oldest first."""
        with self._cond:
            return list(self._pending)

    def _answered(self, batch: Sequence[Outcome], applied: dict[uuid.UUID, bool]) -> None:
        """Report each outcome of ``batch`` the database answered for."""
        for outcome in batch:
            if outcome.lease_token in applied:
                self.on_settled(outcome, applied[outcome.lease_token])

    def watch(self, ctx: JobContext) -> None:
        """Heartbeat ``ctx``'s lease every third of its length until ``unwatch``."""
        with self._cond:
            self._beats[ctx.job.id] = (ctx, time.monotonic() + ctx.job.lease_seconds / 3)
            self._cond.notify()

    def unwatch(self, ctx: JobContext) -> None:
        with self._cond:
            self._beats.pop(ctx.job.id, None)

    def stop(self, *, give_up_at: float, timeout: float) -> None:
        """Flush what is pending and end; past ``give_up_at`` an outage ends it regardless."""
        with self._cond:
            self._stopping = True
            self._give_up_at = give_up_at
            self._cond.notify()
        self.join(timeout)

    def run(self) -> None:
        try:
            self._loop()
        finally:
            connections.close_all()

    def _loop(self) -> None:
        backoff = 0.1
        while True:
            batch, beats = self._next_work()
            if batch is None:
                return
            try:
                self.flush(batch)
                batch = []  # settled: a heartbeat error below must not queue them again
                self._heartbeat(beats)
                backoff = 0.1
            except DatabaseError as exc:
                self.on_database_error()
                logger.warning("settler: database error, will retry: %s",
                               database_error_text(exc))
                reset_connection(self.config.using)
                with self._cond:
                    self._pending[:0] = batch
                    self._oldest = self._oldest or time.monotonic()
                    self._settle_here = self._settle_here or bool(batch)
                    if self._stopping and time.monotonic() > self._give_up_at:
                        logger.error("settler: giving up on %d outcomes at shutdown; their "
                                     "leases will expire and the jobs will be rescued",
                                     len(self._pending))
                        return
                time.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)

    def _next_work(self) -> tuple[list[Outcome] | None, list[JobContext]]:
        """Wait for a batch to flush or heartbeats to send; (None, []) once stopped and empty."""
        flush_after = self.config.flush_seconds
        with self._cond:
            while True:
                now = time.monotonic()
                next_beat = min((due for _, due in self._beats.values()), default=None)
                ready = bool(self._pending) and (
                    self._stopping
                    or self._settle_here
                    or len(self._pending) >= self._high_water
                    or now - (self._oldest or now) >= flush_after
                )
                if ready or (next_beat is not None and next_beat <= now):
                    break
                if self._stopping and not self._pending:
                    return None, []
                waits = [IDLE_SECONDS]
                if self._pending:
                    waits.append(flush_after - (now - (self._oldest or now)))
                if next_beat is not None:
                    waits.append(next_beat - now)
                self._cond.wait(max(0.001, min(waits)))
            batch = self._take_batch()
            self._settle_here = False
            beats = [ctx for ctx, due in self._beats.values() if due <= time.monotonic()]
        return batch, beats

    def _take_batch(self) -> list[Outcome]:
        # Under the lock. One report per lease token per statement: a job the worker took over
        # (timeout, cancel) may have its handler's late report queued behind the takeover. The
        # later one waits for the next statement, so it finds the takeover applied and is lost.
        batch: list[Outcome] = []
        rest: list[Outcome] = []
        tokens: set[uuid.UUID] = set()
        for outcome in self._pending:
            (rest if outcome.lease_token in tokens else batch).append(outcome)
            tokens.add(outcome.lease_token)
        self._pending = rest
        self._oldest = time.monotonic() if rest else None
        return batch

    def flush(self, batch: Sequence[Outcome]) -> None:
        """Settle ``batch`` now (raises DatabaseError when the database is away)."""
        if not batch:
            return
        try:
            applied = settle(batch, using=self.config.using)
        except (DataError, IntegrityError, ProgrammingError) as exc:
            # Not a lost connection: something in one report cannot be stored. Retrying the
            # batch would fail forever and hold back every other settlement of this worker.
            applied = self._settle_one_by_one(batch, exc)
        self._answered(batch, applied)

    def _settle_one_by_one(
        self, batch: Sequence[Outcome], exc: DatabaseError
    ) -> dict[uuid.UUID, bool]:
        logger.error("settler: %d outcomes could not be stored together (%s); settling them "
                     "one at a time", len(batch), database_error_text(exc))
        applied: dict[uuid.UUID, bool] = {}
        for outcome in batch:
            for attempt in (outcome, outcome.without_text()):
                try:
                    applied.update(settle([attempt], using=self.config.using))
                    break
                except (DataError, IntegrityError, ProgrammingError) as error:
                    logger.error("settler: job %s: report not stored: %s", outcome.job_id,
                                 database_error_text(error))
            else:
                logger.error("settler: job %s: giving up on its report; its lease will expire "
                             "and the rescue step will retry it", outcome.job_id)
        return applied

    def _heartbeat(self, contexts: Sequence[JobContext]) -> None:
        if not contexts:
            return
        extended = extend_leases(
            [(ctx.job.id, ctx.job.lease_token) for ctx in contexts], using=self.config.using
        )
        with self._cond:
            for ctx in contexts:
                held = ctx.job.id in extended
                ctx.heartbeat_answered(held, extended.get(ctx.job.id, False))
                if not held:
                    self._beats.pop(ctx.job.id, None)
                    logger.warning("job.lease_lost id=%s task=%s worker=%s",
                                   ctx.job.id, ctx.job.task, self.config.worker_id)
                elif ctx.job.id in self._beats:
                    self._beats[ctx.job.id] = (ctx, time.monotonic() + ctx.job.lease_seconds / 3)


class Loan:
    """The outcomes a claim borrowed from the settler (``Settler.lend``)."""

    def __init__(self, settler: Settler, outcomes: list[Outcome]) -> None:
        self._settler = settler
        self.outcomes = outcomes  # what the claim has still to settle

    def settled(self, applied: dict[uuid.UUID, bool]) -> None:
        """The claim's transaction committed them, with the database's answer for each."""
        batch, self.outcomes = self.outcomes, []
        self._settler._answered(batch, applied)


__all__ = ["Loan", "Settler", "SettlerConfig"]
