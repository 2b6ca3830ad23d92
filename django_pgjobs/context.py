"""What a handler sees: the job's identity, its lease, heartbeats and idempotency receipts."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async

from . import receipts
from .claimed import ClaimedJob
from .exceptions import Cancelled, LeaseLost, TimedOut
from .outcomes import Outcome
from .status import AttemptOutcome
from .transitions import extend_leases, record_progress

# A chatty handler's progress costs at most one write per this many seconds.
PROGRESS_WRITE_SECONDS = 1.0
PROGRESS_MESSAGE_MAX_LENGTH = 200

logger = logging.getLogger("django_pgjobs.handler")


class JobContext:
    """Passed to every handler as its first argument."""

    def __init__(self, job: ClaimedJob, *, worker_id: str, using: str) -> None:
        self.job = job
        self.worker_id = worker_id
        self.using = using
        # Set by the worker's threads, read by the handler's: plain flags (an attribute store is
        # atomic, and nobody waits on them), three Events' worth cheaper for every job.
        self._lease_lost = False
        self._cancelled = False
        self._timed_out = False
        self._progress_written_at = -math.inf
        # The latest progress a call within the second left unwritten: written when the
        # handler returns (flush_progress), so the job's last word is the handler's last.
        self.progress_unwritten: str | None = None

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry this job's id, task and trace id."""
        return logging.LoggerAdapter(
            logger, {"job_id": self.job.id, "task": self.job.task, "trace_id": self.job.trace_id}
        )

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def trace_id(self) -> str:
        return self.job.trace_id

    @property
    def scheduled_at(self) -> datetime | None:
        """The intended time of the schedule's tick this job is for (UTC); None if unscheduled.

        A job an operator ran now from the admin has the time it was asked for.
        """
        return self.job.scheduled_at

    @property
    def lease_lost(self) -> bool:
        """True once a heartbeat found that this worker no longer owns the job."""
        return self._lease_lost

    @property
    def cancelled(self) -> bool:
        """True once an operator cancelled this running job: stop; the job ends cancelled.

        Whatever the handler returns or raises after this, its job ends ``cancelled``
        (``settlement``): the worker settles it so, now or when the handler stops.
        """
        return self._cancelled

    # The name of 0.1, when a cancel was only a request: kept for handlers that check it.
    cancel_requested = cancelled

    @property
    def timed_out(self) -> bool:
        """True once the job ran past its timeout: stop; the worker settled it as timed out."""
        return self._timed_out

    def heartbeat(self) -> None:
        """Extend the lease now (fenced).

        Raise ``TimedOut`` after the job's timeout, ``Cancelled`` after an operator's cancel,
        ``LeaseLost`` once this worker no longer owns the job: in each case, stop.
        """
        if not self._lease_lost:
            self.renew_lease()
        if self._timed_out:
            raise TimedOut(f"job {self.job.id}: timed out after {self.job.timeout_seconds:g}s")
        if self._cancelled:
            raise Cancelled(f"job {self.job.id}: cancelled by an operator")
        if self._lease_lost:
            raise LeaseLost(f"job {self.job.id}: lease lost")

    def renew_lease(self) -> None:
        """Extend the lease now (fenced) and record the answer; raise nothing (the worker's
        renewal; a handler calls ``heartbeat``)."""
        extended = extend_leases([(self.job.id, self.job.lease_token)], using=self.using)
        self.heartbeat_answered(self.job.id in extended, extended.get(self.job.id, False))

    async def aheartbeat(self) -> None:
        """``heartbeat`` for an async handler (the database call runs off the event loop)."""
        await sync_to_async(self.heartbeat, thread_sensitive=True)()

    def taken_over(self, *, timed_out: bool = False, cancelled: bool = False) -> None:
        """The worker settled this job while its handler ran (timeout, cancel): tell the handler.

        Its lease is gone with the settlement, so whatever it reports later is recorded lost.
        """
        if timed_out:
            self._timed_out = True
        if cancelled:
            self._cancelled = True
        self._lease_lost = True

    def heartbeat_answered(self, extended: bool, cancel_requested: bool) -> None:
        """Record what a heartbeat found, whether the handler or the worker sent it.

        Not extended: another attempt or the rescue step has the job; the handler sees
        ``lease_lost``. Extended: the lease's time counts from now. An operator's cancel shows
        as ``cancelled`` at once (the worker settles the job within a second).
        """
        if not extended:
            self._lease_lost = True
            return
        self.job.lease_renewed()
        if cancel_requested:
            self._cancelled = True

    def settlement(self, reported: Outcome) -> Outcome:
        """What to settle for the handler's ``reported`` outcome.

        A handler told of a cancel (``cancelled``) may stop and return, or raise: either way its
        job ends cancelled, as it was told. Otherwise what it reported.
        """
        if not self._cancelled or reported.attempt_outcome == AttemptOutcome.CANCELLED:
            return reported
        return Outcome.cancelled(
            self.job, f"cancelled by an operator while it ran; the handler was told and then "
                      f"reported {reported.attempt_outcome.value}")

    def progress(self, done: float, total: float | None = None, message: str = "") -> None:
        """Record how far the job has got: ``done`` of ``total`` (None: unknown), and a short
        ``message``. Shown live in the admin and on ``Job.progress``.

        Written under the lease (a worker that lost it changes nothing; ``lease_lost`` turns
        True), at most once per second: calls in between are held back, and the last of them is
        written when the handler ends, so call it as often as is convenient. ``ValueError`` for
        a negative, infinite or NaN count or a long message.
        """
        for name, value in (("done", done), ("total", total)):
            if value is None and name == "total":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value >= 0):
                raise ValueError(f"progress {name} must be a finite number >= 0, got {value!r}")
        if not isinstance(message, str) or len(message) > PROGRESS_MESSAGE_MAX_LENGTH:
            raise ValueError(f"progress message must be a string of at most "
                             f"{PROGRESS_MESSAGE_MAX_LENGTH} characters")
        if self._lease_lost:
            return
        document = json.dumps({"done": done, "total": total, "message": message})
        if time.monotonic() - self._progress_written_at < PROGRESS_WRITE_SECONDS:
            self.progress_unwritten = document
            return
        self._write_progress(document)

    def flush_progress(self) -> None:
        """Write the progress the last calls left unwritten, if any (the executor calls this
        when the handler returns or raises)."""
        if self.progress_unwritten is not None and not self._lease_lost:
            self._write_progress(self.progress_unwritten)

    def _write_progress(self, document: str) -> None:
        self._progress_written_at = time.monotonic()
        self.progress_unwritten = None
        if not record_progress(self.job.id, self.job.lease_token, document, using=self.using):
            self._lease_lost = True

    async def aprogress(self, done: float, total: float | None = None, message: str = "") -> None:
        """``progress`` for an async handler (the database call runs off the event loop)."""
        await sync_to_async(self.progress, thread_sensitive=True)(done, total, message)

    def dependencies(self) -> list[Any]:
        """The jobs this job depended on (docs/workflows.md), in the order they were named:
        each one's ``job_id``, ``task``, ``status`` (how it ended) and ``result``."""
        from .workflows import results_of

        return results_of(self.job.id, using=self.using)

    async def adependencies(self) -> list[Any]:
        """``dependencies`` for an async handler."""
        return await sync_to_async(self.dependencies, thread_sensitive=True)()

    def receipt(
        self, scope: str, *, key: str, retention_seconds: float | None = None,
        encrypted: Iterable[str] = (),
    ) -> AbstractContextManager[receipts.Receipt]:
        """Hold the idempotency receipt ``(scope, key)``; see ``receipts.receipt``."""
        return receipts.receipt(
            scope, key, job_id=self.job.id, lease_token=self.job.lease_token,
            retention_seconds=retention_seconds, encrypted=encrypted, using=self.using,
        )

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} task={self.job.task} attempt={self.job.attempt}>"
