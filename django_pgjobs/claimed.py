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
    """A job as the claim returned it, owned by this worker until settled.

    Its times are kept as the claim sent them, whole microseconds since the epoch (the ``_us``
    fields), and become datetimes only when asked for: most jobs never need one.
    """

    id: int
    task: str
    payload_version: int
    payload: Any
    attempt: int
    max_attempts: int
    snoozes: int
    deadline_us: int | None
    lease_seconds: int
    lease_token: uuid.UUID
    lease_owner: str  # this worker's id, as the claim wrote it
    lease_expires_at_us: int
    trace_id: str
    queue: str
    priority: int
    created_at_us: int
    run_at_us: int | None = None  # when the job became due; pickup latency starts here
    # The worker settles it as timed out once its handler has run this long (None: never).
    timeout_seconds: float | None = None
    # A schedule's job: the tick's intended time (None for jobs enqueued otherwise).
    scheduled_at_us: int | None = None
    # The enqueue span's W3C traceparent (django_pgjobs.tracing links the attempt's span to it).
    traceparent: str | None = None
    # This process's clock when the claim returned; and when the lease was last taken or
    # extended (a heartbeat moves it, not the other).
    claimed_monotonic: float = field(default_factory=time.monotonic)
    leased_monotonic: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> datetime | None:
        return None if self.deadline_us is None else from_epoch_us(self.deadline_us)

    @property
    def lease_expires_at(self) -> datetime:
        """When the lease taken at the claim expires (a heartbeat extends it in the database)."""
        return from_epoch_us(self.lease_expires_at_us)

    @property
    def claimed_at(self) -> datetime:
        """The claim's database time: its lease runs lease_seconds from then."""
        return from_epoch_us(self.claimed_at_us)

    @property
    def claimed_at_us(self) -> int:
        return self.lease_expires_at_us - self.lease_seconds * 1_000_000

    @property
    def created_at(self) -> datetime:
        return from_epoch_us(self.created_at_us)

    @property
    def run_at(self) -> datetime | None:
        return None if self.run_at_us is None else from_epoch_us(self.run_at_us)

    @property
    def scheduled_at(self) -> datetime | None:
        return None if self.scheduled_at_us is None else from_epoch_us(self.scheduled_at_us)

    def lease_left_seconds(self) -> float:
        """Lease time left by this process's monotonic clock (the database's may be ahead)."""
        return self.lease_seconds - (time.monotonic() - self.leased_monotonic)

    def too_late_to_start(self) -> bool:
        """Whether waiting its turn used half the lease: start it now and it may outlive it.

        Such a job is handed back unstarted (``Outcome.released``) rather than run.
        """
        return self.lease_left_seconds() < self.lease_seconds / 2

    def lease_renewed(self) -> None:
        """The lease was extended just now (a heartbeat): count its time from here."""
        self.leased_monotonic = time.monotonic()

    def database_now_us(self) -> int:
        """The database clock now, from the claim's time and this process's elapsed time."""
        return self.claimed_at_us + int((time.monotonic() - self.claimed_monotonic) * 1_000_000)

    def database_now(self) -> datetime:
        return from_epoch_us(self.database_now_us())

    def past_deadline(self) -> bool:
        """Whether the database clock has reached the job's deadline (never, without one)."""
        return self.deadline_us is not None and self.database_now_us() >= self.deadline_us


def from_epoch_us(microseconds: int) -> datetime:
    return _EPOCH + timedelta(microseconds=microseconds)


def claimed_jobs(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[ClaimedJob]:
    """The jobs of a claim's result, read by the names of its ``columns``."""
    read = _reader(tuple(columns))
    now = time.monotonic()
    return [read(row, now) for row in rows]


@cache
def _reader(columns: tuple[str, ...]) -> Callable[[Sequence[Any], float], ClaimedJob]:
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
     i_scheduled, i_parent) = (at[name] for name in wanted)
    loads = _json_loads

    def read(row: Sequence[Any], now: float) -> ClaimedJob:
        # Positional, in the fields' order: a keyword call costs more than the rest of the row.
        return ClaimedJob(
            row[i_id], row[i_task], row[i_version], loads(row[i_payload]), row[i_attempt],
            row[i_max], row[i_snoozes], row[i_deadline], row[i_lease], row[i_token],
            row[i_owner], row[i_expires], row[i_trace], row[i_queue], row[i_priority],
            row[i_created], row[i_run_at], row[i_timeout], row[i_scheduled], row[i_parent],
            now, now,  # claimed, and leased, now
        )

    return read


def _json_loads(value: Any) -> Any:
    # psycopg returns jsonb decoded; a driver or cast that hands back text is decoded here.
    return json.loads(value) if isinstance(value, str) else value


__all__ = ["ClaimedJob", "claimed_jobs", "from_epoch_us"]
