"""A claimed job: what the claim returns, held by one worker under its lease until it settles.

The claim's statement (``sql/jobs.sql``, block ``claim_jobs``) names its result columns after the
fields here; ``claimed_jobs`` maps a result to jobs by those names, so the SQL and this module
can change order independently. Times travel as whole microseconds since the epoch, in columns
named ``<field>_us``: exact, and far cheaper to turn into datetimes than timestamptz text.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
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
    lease_owner: str  # this worker's id, as the claim wrote it
    lease_expires_at: datetime
    trace_id: str
    queue: str
    priority: int
    created_at: datetime
    run_at: datetime | None = None  # when the job became due; pickup latency starts here
    # The worker settles it as timed out once its handler has run this long (None: never).
    timeout_seconds: float | None = None
    # A schedule's job: the tick's intended time (None for jobs enqueued otherwise).
    scheduled_at: datetime | None = None
    # The enqueue span's W3C traceparent (django_pgjobs.tracing links the attempt's span to it).
    traceparent: str | None = None
    # This process's clock when the lease was last taken or extended.
    claimed_monotonic: float = field(default_factory=time.monotonic)

    def lease_left_seconds(self) -> float:
        """Lease time left by this process's monotonic clock (the database's may be ahead)."""
        return self.lease_seconds - (time.monotonic() - self.claimed_monotonic)

    def too_late_to_start(self) -> bool:
        """Whether waiting its turn used half the lease: start it now and it may outlive it.

        Such a job is handed back unstarted (``Outcome.released``) rather than run.
        """
        return self.lease_left_seconds() < self.lease_seconds / 2

    def lease_renewed(self) -> None:
        """The lease was extended just now (a heartbeat): count its time from here."""
        self.claimed_monotonic = time.monotonic()

    def database_now(self) -> datetime:
        """The database clock now, from the lease's start and this process's elapsed time."""
        leased_at = self.lease_expires_at - timedelta(seconds=self.lease_seconds)
        return leased_at + timedelta(seconds=time.monotonic() - self.claimed_monotonic)


def from_epoch_us(microseconds: int) -> datetime:
    return _EPOCH + timedelta(microseconds=microseconds)


def claimed_jobs(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """The jobs of a claim's result, read by the names of its ``columns``."""
    read = _reader(tuple(columns))
    return [read(row) for row in rows]


@cache
def _reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], ClaimedJob]:
    # Built once per column list: finding each field's position by name costs nothing per row.
    at = {name: index for index, name in enumerate(columns)}
    wanted = ("id", "task", "payload_version", "payload", "attempt", "max_attempts", "snoozes",
              "deadline_us", "lease_seconds", "lease_token", "lease_owner", "lease_expires_at_us",
              "trace_id", "queue", "priority", "created_at_us", "run_at_us", "timeout_seconds",
              "scheduled_at_us", "traceparent")
    missing = [name for name in wanted if name not in at]
    if missing:
        raise LookupError(f"the claim's result lacks column(s) {', '.join(missing)}")
    (i_id, i_task, i_version, i_payload, i_attempt, i_max, i_snoozes, i_deadline, i_lease,
     i_token, i_owner, i_expires, i_trace, i_queue, i_priority, i_created, i_run_at, i_timeout,
     i_scheduled, i_parent) = (
        at[name] for name in wanted)
    loads = _json_loads

    def read(row: Sequence[Any]) -> ClaimedJob:
        deadline = row[i_deadline]
        scheduled = row[i_scheduled]
        return ClaimedJob(
            id=row[i_id], task=row[i_task], payload_version=row[i_version],
            payload=loads(row[i_payload]), attempt=row[i_attempt], max_attempts=row[i_max],
            snoozes=row[i_snoozes],
            deadline=None if deadline is None else from_epoch_us(deadline),
            lease_seconds=row[i_lease], lease_token=row[i_token], lease_owner=row[i_owner],
            lease_expires_at=from_epoch_us(row[i_expires]), trace_id=row[i_trace],
            queue=row[i_queue], priority=row[i_priority],
            created_at=from_epoch_us(row[i_created]), run_at=from_epoch_us(row[i_run_at]),
            timeout_seconds=row[i_timeout],
            scheduled_at=None if scheduled is None else from_epoch_us(scheduled),
            traceparent=row[i_parent],
        )

    return read


def _json_loads(value: Any) -> Any:
    # psycopg returns jsonb decoded; a driver or cast that hands back text is decoded here.
    return json.loads(value) if isinstance(value, str) else value


__all__ = ["ClaimedJob", "claimed_jobs", "from_epoch_us"]
