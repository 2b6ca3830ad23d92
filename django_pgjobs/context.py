"""What a handler sees: the job's identity, its lease, heartbeats and idempotency receipts."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import receipts

logger = logging.getLogger("django_pgjobs.handler")


@dataclass
class ClaimedJob:
    """A job as the claim returned it, owned by this worker until settled."""

    id: int
    task: str
    payload_version: int
    payload: Any
    attempt: int
    max_attempts: int
    snoozes: int
    deadline: datetime | None
    lease_seconds: int
    lease_token: uuid.UUID
    lease_expires_at: datetime
    trace_id: str
    queue: str
    priority: int
    created_at: datetime
    claimed_monotonic: float = field(default_factory=time.monotonic)
    run_at: datetime | None = None  # when the job became due; pickup latency starts here

    def lease_left_seconds(self) -> float:
        """Lease time left by this process's monotonic clock (the database's may be ahead)."""
        return self.lease_seconds - (time.monotonic() - self.claimed_monotonic)


class JobContext:
    """Passed to every handler as its first argument."""

    def __init__(self, job: ClaimedJob, *, worker_id: str, using: str) -> None:
        self.job = job
        self.worker_id = worker_id
        self.using = using
        self._lease_lost = threading.Event()
        self._cancel_requested = threading.Event()

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
    def lease_lost(self) -> bool:
        """True once a heartbeat found that this worker no longer owns the job."""
        return self._lease_lost.is_set()

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked this running job to stop."""
        return self._cancel_requested.is_set()

    def heartbeat(self) -> None:
        """Extend the lease now (fenced); raise ``LeaseLost`` if this worker no longer owns it."""
        from .exceptions import LeaseLost
        from .transitions import extend_leases

        if self._lease_lost.is_set():
            raise LeaseLost(f"job {self.job.id}: lease lost")
        extended = extend_leases([(self.job.id, self.job.lease_token)], using=self.using)
        if self.job.id not in extended:
            self._lease_lost.set()
            raise LeaseLost(f"job {self.job.id}: lease lost")
        self.job.claimed_monotonic = time.monotonic()
        if extended[self.job.id]:
            self._cancel_requested.set()

    def receipt(
        self, scope: str, *, key: str, retention_seconds: float | None = None
    ) -> AbstractContextManager[receipts.Receipt]:
        """Hold the idempotency receipt ``(scope, key)``; see ``receipts.receipt``."""
        return receipts.receipt(
            scope, key, job_id=self.job.id, retention_seconds=retention_seconds, using=self.using
        )

    def __repr__(self) -> str:
        return f"<JobContext job={self.job.id} task={self.job.task} attempt={self.job.attempt}>"

