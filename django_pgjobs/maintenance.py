"""Small single-purpose maintenance steps that every worker runs on a cadence.

Each step is bounded (a batch limit) and safe to run from many workers at once: the statements
lock with SKIP LOCKED or are idempotent.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS

from .conf import settings
from .transitions import promote_due_jobs, rescue_expired_leases

logger = logging.getLogger("django_pgjobs.maintenance")


@dataclass
class Periodic:
    """A step the worker's main thread runs every ``interval_seconds`` (with 10% jitter)."""

    name: str
    interval_seconds: float
    run: Callable[[str], int]
    next_due: float = 0.0

    def due(self, now: float) -> bool:
        return now >= self.next_due

    def schedule_next(self, now: float) -> None:
        self.next_due = now + self.interval_seconds * random.uniform(0.9, 1.1)


def promote_due(using: str = DEFAULT_DB_ALIAS) -> int:
    """Make due scheduled and retrying jobs ready; return how many."""
    return len(promote_due_jobs(settings.PROMOTE_BATCH, using=using))


def rescue_expired(using: str = DEFAULT_DB_ALIAS) -> int:
    """Take back running jobs whose lease expired; return how many."""
    rescued = rescue_expired_leases(settings.RESCUE_BATCH, using=using)
    for outcome in rescued:
        logger.warning(
            "job.lease_expired id=%s task=%s attempt=%s trace=%s next=%s reason=%s",
            outcome.job_id, outcome.task, outcome.attempt, outcome.trace_id or "-",
            outcome.status.value, outcome.terminal_reason or "-",
            extra={"pgjobs": {"job_id": outcome.job_id, "outcome": "lease_expired"}},
        )
    return len(rescued)


def default_steps(poll_interval: float) -> list[Periodic]:
    """The maintenance every worker runs."""
    return [
        Periodic("promote", poll_interval, promote_due),
        Periodic("rescue", float(settings.RESCUE_INTERVAL_SECONDS), rescue_expired),
    ]

