"""Does this workload still fit in PostgreSQL? Measure it, then answer the decision record.

``measure`` reads the live installation (rates, latency, payload sizes, backlog, table size,
dead tuples, vacuum); ``judge`` turns the measurements into a verdict on each of the four
questions of docs/decision-record.md. ``manage.py pgjobs_fit`` prints both.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from . import sql, stats
from .conf import settings

CLAIM_WINDOW_SECONDS = 3600
PAYLOAD_SAMPLE = 10_000

# Thresholds, per job-table row writes and sizes; docs/operations.md explains each.
RATE_WATCH_PER_SECOND = 2_000
RATE_OUTGROWING_PER_SECOND = 10_000
BACKLOG_WATCH = 1_000_000
BACKLOG_OUTGROWING = 10_000_000
PICKUP_WATCH_SECONDS = 30.0
PAYLOAD_WATCH_BYTES = 8 * 1024
PAYLOAD_OUTGROWING_BYTES = 32 * 1024
DEAD_RATIO_WATCH = 0.2
DEAD_RATIO_OUTGROWING = 0.5
VACUUM_STALE_SECONDS = 24 * 3600
VACUUM_STALE_MIN_DEAD = 10_000
# The queue's share of the database matters only once it is big or busy enough to compete with
# the application's own tables (a database that holds little else is no cause for concern).
DATABASE_SHARE_WATCH = 0.5
DATABASE_SHARE_MIN_BYTES = 1024**3
WRITE_SHARE_WATCH = 0.9
WRITE_SHARE_MIN_PER_SECOND = 100


class Verdict(Enum):
    COMFORTABLE = "comfortably within PostgreSQL"
    WATCH = "watch"
    OUTGROWING = "outgrowing PostgreSQL"


_RANK = {Verdict.COMFORTABLE: 0, Verdict.WATCH: 1, Verdict.OUTGROWING: 2}


@dataclass(frozen=True)
class Measurements:
    """What ``measure`` read; None where there was nothing to measure."""

    enqueue_per_second: float | None  # live, over the sample; None when not sampled
    sample_seconds: float
    claims_per_second: float  # over the last hour, retries included
    peak_finished_per_minute: int
    backlog: int  # ready + scheduled + retrying
    oldest_ready_age_seconds: float | None
    unhealthy_queues: list[str]
    pickup_p95_seconds: float | None
    payload_samples: int
    payload_p95_bytes: float | None
    payload_max_bytes: int | None
    payload_limit_bytes: int
    job_table_bytes: int
    job_index_bytes: int
    attempt_total_bytes: int
    database_bytes: int
    live_tuples: int
    dead_tuples: int
    last_vacuum: datetime | None
    last_vacuum_age_seconds: float | None
    queue_write_share: float | None  # of all row writes in the database since stats reset

    @property
    def dead_tuple_ratio(self) -> float | None:
        total = self.live_tuples + self.dead_tuples
        return self.dead_tuples / total if total else None

    @property
    def database_share(self) -> float | None:
        queue = self.job_table_bytes + self.job_index_bytes + self.attempt_total_bytes
        return queue / self.database_bytes if self.database_bytes else None


@dataclass
class Answer:
    """The verdict on one question, with the measurements behind it."""

    question: str
    verdict: Verdict = Verdict.COMFORTABLE
    reasons: list[str] = field(default_factory=list)
    consider: str = ""

    def note(self, verdict: Verdict, reason: str) -> None:
        self.reasons.append(f"[{verdict.value}] {reason}")
        if _RANK[verdict] > _RANK[self.verdict]:
            self.verdict = verdict


def measure(
    *,
    sample_seconds: float = 5.0,
    using: str = DEFAULT_DB_ALIAS,
    sleep: Callable[[float], Any] = time.sleep,
) -> Measurements:
    """Read the workload. The live enqueue rate watches the job id grow for ``sample_seconds``."""
    rate = None
    if sample_seconds > 0:
        first = _one("fit_max_job_id", [], using)[0]
        started = time.monotonic()
        sleep(sample_seconds)
        elapsed = max(time.monotonic() - started, sample_seconds)
        rate = _one("fit_jobs_after", [first], using)[0] / elapsed
    queues = stats.queue_stats(using=using)
    pickup = stats.pickup_latency(using=using)
    throughput = stats.throughput(using=using)
    claims = _one("fit_claims", {"window": CLAIM_WINDOW_SECONDS}, using)[0]
    samples, p95, largest = _one("fit_payloads", [PAYLOAD_SAMPLE], using)
    table, indexes, attempts, database = _one("fit_storage", [], using)
    health = _one("fit_table_health", [], using)
    live, dead, vacuumed, vacuum_age, queue_writes, all_writes = health
    ages = [q.oldest_ready_age_seconds for q in queues if q.oldest_ready_age_seconds is not None]
    return Measurements(
        enqueue_per_second=rate,
        sample_seconds=sample_seconds,
        claims_per_second=claims / CLAIM_WINDOW_SECONDS,
        peak_finished_per_minute=max((p.succeeded + p.dead for p in throughput), default=0),
        backlog=sum(q.ready + q.scheduled + q.retrying for q in queues),
        oldest_ready_age_seconds=max(ages, default=None),
        unhealthy_queues=[q.queue for q in queues if not q.healthy],
        pickup_p95_seconds=max((p.p95 for p in pickup), default=None),
        payload_samples=int(samples),
        payload_p95_bytes=float(p95) if p95 is not None else None,
        payload_max_bytes=int(largest) if largest is not None else None,
        payload_limit_bytes=int(settings.MAX_PAYLOAD_BYTES),
        job_table_bytes=int(table),
        job_index_bytes=int(indexes),
        attempt_total_bytes=int(attempts),
        database_bytes=int(database),
        live_tuples=int(live or 0),
        dead_tuples=int(dead or 0),
        last_vacuum=vacuumed,
        last_vacuum_age_seconds=float(vacuum_age) if vacuum_age is not None else None,
        queue_write_share=(float(queue_writes) / float(all_writes)) if all_writes else None,
    )


def judge(m: Measurements) -> list[Answer]:
    """The decision record's four questions, answered for these measurements."""
    return [_volume(m), _transaction(), _payload(m), _isolation(m)]


def _volume(m: Measurements) -> Answer:
    answer = Answer("1. Volume and latency")
    rate = max(m.enqueue_per_second or 0.0, m.claims_per_second,
               m.peak_finished_per_minute / 60)
    rate_text = (f"{rate:,.1f} jobs/s at the busiest measure (enqueued now, claimed over the "
                 "last hour, or the peak minute finished)")
    if rate >= RATE_OUTGROWING_PER_SECOND:
        answer.note(Verdict.OUTGROWING, rate_text)
    elif rate >= RATE_WATCH_PER_SECOND:
        answer.note(Verdict.WATCH, rate_text)
    else:
        answer.note(Verdict.COMFORTABLE, rate_text)
    backlog_text = f"{m.backlog:,} jobs waiting (ready, scheduled, retrying)"
    if m.backlog >= BACKLOG_OUTGROWING:
        answer.note(Verdict.OUTGROWING, backlog_text)
    elif m.backlog >= BACKLOG_WATCH:
        answer.note(Verdict.WATCH, backlog_text)
    else:
        answer.note(Verdict.COMFORTABLE, backlog_text)
    if m.unhealthy_queues:
        answer.note(Verdict.WATCH, "backlog older than its policy in "
                    f"{', '.join(m.unhealthy_queues)} (oldest {m.oldest_ready_age_seconds:.0f}s):"
                    " add workers or concurrency before blaming the database")
    if m.pickup_p95_seconds is not None:
        pickup_text = f"pickup latency p95 {m.pickup_p95_seconds:.2f}s"
        answer.note(Verdict.WATCH if m.pickup_p95_seconds > PICKUP_WATCH_SECONDS
                    else Verdict.COMFORTABLE, pickup_text)
    answer.consider = ("a broker built for the volume: Kafka for streams and replay, RabbitMQ "
                       "or SQS for work queues; keep PostgreSQL for the data")
    return answer


def _transaction() -> Answer:
    answer = Answer("2. Must enqueue share a transaction with the data?")
    answer.note(Verdict.COMFORTABLE, "enqueue is one INSERT in the caller's transaction: a "
                "rolled-back order leaves no job, a committed one always has its job. Only "
                "you can say whether your jobs need that; if none do, this question does not "
                "argue for PostgreSQL")
    answer.consider = "an outbox table relayed to a broker, if jobs must leave the database"
    return answer


def _payload(m: Measurements) -> Answer:
    answer = Answer("3. Payload size")
    if m.payload_samples == 0 or m.payload_p95_bytes is None:
        answer.note(Verdict.COMFORTABLE, "no jobs to measure")
    else:
        text = (f"payload p95 {m.payload_p95_bytes:,.0f} bytes, largest "
                f"{m.payload_max_bytes or 0:,} of the {m.payload_samples:,} newest jobs "
                f"(limit {m.payload_limit_bytes:,})")
        near_limit = (m.payload_max_bytes or 0) >= 0.9 * m.payload_limit_bytes
        if m.payload_p95_bytes >= PAYLOAD_OUTGROWING_BYTES:
            answer.note(Verdict.OUTGROWING, text)
        elif m.payload_p95_bytes >= PAYLOAD_WATCH_BYTES or near_limit:
            answer.note(Verdict.WATCH, text + (": the largest is near the limit"
                                               if near_limit else ""))
        else:
            answer.note(Verdict.COMFORTABLE, text)
    answer.consider = ("object storage for the data, with a reference (a primary key, a "
                       "storage path) in the job")
    return answer


def _isolation(m: Measurements) -> Answer:
    answer = Answer("4. Failure isolation")
    ratio = m.dead_tuple_ratio
    if ratio is not None:
        text = (f"dead tuples {ratio:.0%} of the job table ({m.dead_tuples:,} dead, "
                f"{m.live_tuples:,} live)")
        if ratio >= DEAD_RATIO_OUTGROWING:
            answer.note(Verdict.OUTGROWING, text + ": vacuum is not keeping up with the churn")
        elif ratio >= DEAD_RATIO_WATCH:
            answer.note(Verdict.WATCH, text)
        else:
            answer.note(Verdict.COMFORTABLE, text)
    if m.last_vacuum_age_seconds is None:
        if m.dead_tuples >= VACUUM_STALE_MIN_DEAD:
            answer.note(Verdict.WATCH, "the job table has never been vacuumed")
    else:
        hours = m.last_vacuum_age_seconds / 3600
        stale = (m.last_vacuum_age_seconds > VACUUM_STALE_SECONDS
                 and m.dead_tuples >= VACUUM_STALE_MIN_DEAD)
        answer.note(Verdict.WATCH if stale else Verdict.COMFORTABLE,
                    f"last vacuum of the job table {hours:.1f} h ago")
    share = m.database_share
    queue_bytes = m.job_table_bytes + m.job_index_bytes + m.attempt_total_bytes
    if share is not None:
        heavy = share >= DATABASE_SHARE_WATCH and queue_bytes >= DATABASE_SHARE_MIN_BYTES
        answer.note(
            Verdict.WATCH if heavy else Verdict.COMFORTABLE,
            f"queue tables {_size(m.job_table_bytes + m.job_index_bytes)} jobs (of which "
            f"{_size(m.job_index_bytes)} indexes) + {_size(m.attempt_total_bytes)} attempts, "
            f"{share:.0%} of the database"
            + (": check retention (PGJOBS_RETENTION_SECONDS)" if heavy else ""),
        )
    if m.queue_write_share is not None:
        busy = (m.queue_write_share >= WRITE_SHARE_WATCH
                and m.claims_per_second >= WRITE_SHARE_MIN_PER_SECOND)
        answer.note(Verdict.WATCH if busy else Verdict.COMFORTABLE,
                    f"the queue makes {m.queue_write_share:.0%} of the database's row writes "
                    "since the statistics were reset")
    answer.consider = ("a separate PostgreSQL database for the queue (DATABASES alias), or a "
                       "broker if jobs must keep flowing while the database is down")
    return answer


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


def _one(name: str, params: list[Any] | dict[str, Any], using: str) -> tuple[Any, ...]:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query(name), params)
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


__all__ = ["Answer", "Measurements", "Verdict", "judge", "measure"]
