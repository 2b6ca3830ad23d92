"""Where a worker's claims start while a snapshot held open keeps vacuum from cleaning up.

While something holds vacuum's horizon back (a long report, a session idle in transaction, a
replication slot: ``stats.horizon``), the claim index keeps an entry for every job claimed
since, and a claim that starts at the beginning of its queue visits each of those rows to learn
it is no longer ready: the claim slows with every job that went by. While that lasts, a worker
starts each claim of a queue from a floor per priority, the (run_at, id) of the last job it
claimed there (``claim_candidates_from_floors`` in ``sql/jobs.sql``), and makes a full claim
every ``FULL_CLAIM_SECONDS`` (or ``FULL_CLAIM_SPACING`` times as long as the last took, when
longer): that claim takes the jobs that became ready behind a floor, or at a priority the
worker has not claimed from since, so none waits longer than that for being behind.

The horizon is read on the maintenance cadence (``HorizonWatch``, a step of the worker's main
thread); claims read and move the floors from the executors' threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from django.db import DEFAULT_DB_ALIAS

from ..claimed import ClaimedJob
from ..conf import settings
from ..transitions import Floor

logger = logging.getLogger("django_pgjobs.worker")

# A full claim comes every second while floors are in use, the longest a job behind its floor
# waits; unless it takes more than a twentieth of that itself: it reads every job claimed since
# the hold began, so the longer the hold the longer it takes, and it then comes every twenty
# times as long as the last one took (its settlement's time included), and at least every ten
# seconds.
FULL_CLAIM_SECONDS = 1.0
FULL_CLAIM_SPACING = 20
FULL_CLAIM_MAX_SECONDS = 10.0


class ClaimFloors:
    """Each queue's floors, per priority, while the horizon is held back; none otherwise."""

    def __init__(self, *, full_claim_seconds: float = FULL_CLAIM_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.held = False
        self._full_claim_seconds = full_claim_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._floors: dict[str, dict[int, ClaimedJob]] = {}
        self._full_at: dict[str, float] = {}
        self._full_every: dict[str, float] = {}

    def hold(self, held: bool) -> None:
        """Whether the horizon is held back now. Floors start anew each time it is."""
        with self._lock:
            if held == self.held:
                return
            self.held = held
            self._floors.clear()
            self._full_at.clear()
            self._full_every.clear()
        if held:
            logger.info("worker.claim_floors on: something holds vacuum's horizon back, so "
                        "claims start past the jobs this worker took (a full claim every %gs "
                        "or so)", self._full_claim_seconds)
        else:
            logger.info("worker.claim_floors off: claims start at the head of each queue")

    def start(self, queue: str) -> list[Floor] | None:
        """The floors the next claim of ``queue`` starts from; None: a full claim."""
        if not self.held:
            return None
        with self._lock:
            floors = self._floors.get(queue)
            now = self._clock()
            full_at = self._full_at.get(queue)
            every = self._full_every.get(queue, self._full_claim_seconds)
            if not floors or full_at is None or now - full_at >= every:
                self._full_at[queue] = now
                return None
            return [(job.priority, job.run_at_us or 0, job.id) for job in floors.values()]

    def claimed(self, queue: str, jobs: Sequence[ClaimedJob], *, limit: int = 0,
                full_seconds: float | None = None) -> None:
        """Move ``queue``'s floors past the jobs a claim of it took; ``full_seconds``: it was a
        full claim of a batch of ``limit``, and took that long."""
        if not self.held:
            return
        with self._lock:
            floors = self._floors.setdefault(queue, {})
            if full_seconds is not None:
                self._full_every[queue] = min(FULL_CLAIM_MAX_SECONDS, max(
                    self._full_claim_seconds, FULL_CLAIM_SPACING * full_seconds))
                # A whole batch that was all behind the floors (retries promoted together, a
                # backlog the floors passed) may leave more there: the next claim is full too,
                # so they drain at the claims' pace, not a batch per interval.
                if floors and len(jobs) >= limit > 0 and all(
                        _behind(job, floors.get(job.priority)) for job in jobs):
                    self._full_at.pop(queue, None)
            for job in jobs:
                last = floors.get(job.priority)
                if last is None or (job.run_at_us or 0, job.id) > (last.run_at_us or 0, last.id):
                    floors[job.priority] = job

    def missed(self) -> None:
        """The next claim of each queue is a full one (ready jobs may be behind a floor)."""
        with self._lock:
            self._full_at.clear()


def _behind(job: ClaimedJob, floor: ClaimedJob | None) -> bool:
    """Whether a claim from floors could not have taken ``job``."""
    return floor is None or (job.run_at_us or 0, job.id) <= (floor.run_at_us or 0, floor.id)


class HorizonWatch:
    """A maintenance step: tells ``floors`` whether something holds the horizon back longer
    than ``PGJOBS_CLAIM_FLOORS_AFTER_SECONDS`` (a replication slot: further back than
    ``PGJOBS_HORIZON_WARN_XIDS`` transactions, as it has no age in seconds)."""

    def __init__(self, floors: ClaimFloors) -> None:
        self.floors = floors

    def __call__(self, using: str = DEFAULT_DB_ALIAS) -> int:
        after = float(settings.CLAIM_FLOORS_AFTER_SECONDS)
        if after <= 0:
            self.floors.hold(False)
            return 0
        # The dashboard's reads, imported at the first reading, not at start-up: a worker's
        # first claim waits for the modules it imports (7.5 ms of them are this one's).
        from ..stats import horizon

        xids = int(settings.HORIZON_WARN_XIDS)
        held = any(
            h.seconds >= after if h.seconds is not None else h.xids >= xids
            for h in horizon(using=using))
        self.floors.hold(held)
        return 0
