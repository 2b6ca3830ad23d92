"""The only code that changes a job's status.

Every transition is one guarded statement (or one short transaction) whose WHERE clause says
which state, and for a running job which lease token, it applies to; each returns what it
changed, and the caller decides what a zero means. Times that decide ownership come from the
database clock.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Now

from . import sql
from .context import ClaimedJob
from .models import Job
from .retry import decide
from .status import AttemptOutcome, FailureClass, JobStatus, TerminalReason

_QUEUE_SENTINEL = "\x00pgjobs-queue\x00"
_claim_sql_cache: dict[tuple[str, int], tuple[str, list[Any], int]] = {}


@dataclass(frozen=True)
class Outcome:
    """What a worker reports for one attempt; ``settle`` applies it only under the lease."""

    job_id: int
    lease_token: uuid.UUID
    status: JobStatus
    attempt_outcome: AttemptOutcome
    delay_seconds: float | None = None
    attempts_delta: int = 0
    snoozes_delta: int = 0
    failure_class: str = ""
    terminal_reason: str = ""
    error: str = ""
    traceback: str = ""
    result_json: str | None = None
    duration_ms: int | None = None
    # For log lines only.
    task: str = ""
    attempt: int = 0
    trace_id: str = ""

    @classmethod
    def release(cls, job: ClaimedJob, reason: str = "") -> Outcome:
        """Hand an unstarted job back: ready at once, the attempt not counted."""
        return cls(
            job.id, job.lease_token, JobStatus.READY, AttemptOutcome.RELEASED,
            attempts_delta=-1, error=reason, task=job.task, attempt=job.attempt,
            trace_id=job.trace_id,
        )


def claim_jobs(
    worker_id: str, queue: str, limit: int, *, using: str = DEFAULT_DB_ALIAS
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs of ``queue`` for ``worker_id``, in one short transaction."""
    with transaction.atomic(using=using):
        claim_sql, params, queue_at = _claim_sql(using, limit)
        params = [*params, worker_id]
        params[queue_at] = queue
        with connections[using].cursor() as cursor:
            cursor.execute(claim_sql, params)
            rows = cursor.fetchall()
    return [_claimed(row) for row in rows]


def _claim_sql(using: str, limit: int) -> tuple[str, list[Any], int]:
    # Compiled once per (database, limit) inside the claim's transaction, since Django refuses
    # to compile select_for_update outside one; later claims reuse the text.
    key = (using, limit)
    cached = _claim_sql_cache.get(key)
    if cached is None:
        candidates = (
            Job.objects.using(using)
            .select_for_update(skip_locked=True)
            .filter(status=JobStatus.READY, queue=_QUEUE_SENTINEL)
            .order_by("-priority", "run_at", "id")
            .values("id")[:limit]
        )
        candidates_sql, candidates_params = candidates.query.get_compiler(using=using).as_sql()
        text = sql.query("claim_jobs").replace("{candidates}", candidates_sql)
        cached = (text, list(candidates_params), list(candidates_params).index(_QUEUE_SENTINEL))
        _claim_sql_cache[key] = cached
    return cached


def _claimed(row: Sequence[Any]) -> ClaimedJob:
    payload = row[3]
    return ClaimedJob(
        id=row[0], task=row[1], payload_version=row[2],
        payload=json.loads(payload) if isinstance(payload, str) else payload,
        attempt=row[4], max_attempts=row[5], snoozes=row[6], deadline=row[7],
        lease_seconds=row[8], lease_token=row[9], lease_expires_at=row[10], trace_id=row[11],
        queue=row[12], priority=row[13], created_at=row[14],
    )


def settle(outcomes: Sequence[Outcome], *, using: str = DEFAULT_DB_ALIAS) -> dict[uuid.UUID, bool]:
    """Apply a batch of outcomes in one fenced statement; map each lease token to whether it won.

    A token that maps to False lost its lease before reporting: its attempt is recorded as lost
    and the job was not touched.
    """
    if not outcomes:
        return {}
    columns: list[list[Any]] = [[] for _ in range(13)]
    for o in outcomes:
        for column, value in zip(
            columns,
            (
                o.job_id, o.lease_token, o.status.value, o.attempt_outcome.value,
                o.delay_seconds, o.attempts_delta, o.snoozes_delta, o.failure_class,
                o.terminal_reason, o.error, o.traceback, o.result_json, o.duration_ms,
            ),
            strict=True,
        ):
            column.append(value)
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("settle_jobs"), columns)
        rows = cursor.fetchall()
    won = {token: bool(applied) for token, applied in rows}
    return {o.lease_token: won.get(o.lease_token, False) for o in outcomes}


def extend_leases(
    leases: Iterable[tuple[int, uuid.UUID]], *, using: str = DEFAULT_DB_ALIAS
) -> dict[int, bool]:
    """Heartbeat: extend each lease still held; map extended job ids to "cancel requested"."""
    pairs = list(leases)
    if not pairs:
        return {}
    with connections[using].cursor() as cursor:
        cursor.execute(
            sql.query("extend_leases"), [[p[0] for p in pairs], [p[1] for p in pairs]]
        )
        return {job_id: bool(cancel) for job_id, _, cancel in cursor.fetchall()}


def promote_due_jobs(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Make scheduled and retrying jobs whose run_at has come ready; return their queues."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("promote_due"), [limit])
        return [row[0] for row in cursor.fetchall()]


def ready_queues(*, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The queues that have ready jobs now."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("ready_queues"))
        return [row[0] for row in cursor.fetchall()]


def database_now(*, using: str = DEFAULT_DB_ALIAS) -> datetime:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("db_now"))
        row = cursor.fetchone()
    assert row is not None
    return row[0]


def rescue_expired_leases(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> list[Outcome]:
    """Take back up to ``limit`` running jobs whose lease expired; retry them or end them.

    The rows are locked (SKIP LOCKED, so several workers can rescue at once) and settled under
    their old token in the same transaction: a worker that reports later finds it lost.
    """
    with transaction.atomic(using=using):
        expired = list(
            Job.objects.using(using)
            .select_for_update(skip_locked=True)
            .filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now())
            .order_by("lease_expires_at")
            .values_list(
                "id", "lease_token", "attempts", "max_attempts", "created_at", "deadline",
                "task", "trace_id", "lease_owner", "lease_expires_at",
            )[:limit]
        )
        if not expired:
            return []
        now = database_now(using=using)
        outcomes = []
        for row in expired:
            job_id, token, attempts, max_attempts, created, deadline, task, trace, owner, at = row
            assert token is not None and at is not None  # the lease check constraint holds
            decision = decide(
                FailureClass.LEASE_EXPIRED, attempts=attempts, max_attempts=max_attempts,
                created_at=created, deadline=deadline, now=now,
            )
            outcomes.append(
                Outcome(
                    job_id, token, decision.status, AttemptOutcome.LEASE_EXPIRED,
                    delay_seconds=decision.delay_seconds, attempts_delta=decision.attempts_delta,
                    failure_class=FailureClass.LEASE_EXPIRED.value,
                    terminal_reason=decision.terminal_reason,
                    error=f"lease held by {owner} expired at {at.isoformat()}",
                    task=task, attempt=attempts, trace_id=trace,
                )
            )
        settle(outcomes, using=using)
    return outcomes


# --- operator transitions (the admin and management commands call these) --------------------


def retry_jobs(job_ids: Iterable[int], *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Dead or cancelled jobs back to ready with a fresh attempt budget; receipts are kept."""
    return (
        Job.objects.using(using)
        .filter(pk__in=list(job_ids), status__in=[JobStatus.DEAD, JobStatus.CANCELLED])
        .update(
            status=JobStatus.READY, attempts=0, snoozes=0, run_at=Now(), finished_at=None,
            terminal_reason="", priority=F("base_priority"), cancel_requested_at=None,
            deadline=Now() + (F("deadline") - F("created_at")), updated_at=Now(),
        )
    )


def cancel_jobs(job_ids: Iterable[int], *, using: str = DEFAULT_DB_ALIAS) -> tuple[int, int]:
    """Cancel waiting jobs; ask running ones to stop. Return (cancelled, asked to stop)."""
    ids = list(job_ids)
    jobs = Job.objects.using(using).filter(pk__in=ids)
    with transaction.atomic(using=using):
        cancelled = jobs.filter(
            status__in=[JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RETRYING]
        ).update(
            status=JobStatus.CANCELLED, terminal_reason=TerminalReason.OPERATOR,
            finished_at=Now(), updated_at=Now(),
        )
        asked = jobs.filter(status=JobStatus.RUNNING, cancel_requested_at__isnull=True).update(
            cancel_requested_at=Now(), updated_at=Now()
        )
    return cancelled, asked


def dead_letter_jobs(
    job_ids: Iterable[int], reason: str, *, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Move waiting jobs to dead by hand. Running jobs are left to their lease holder."""
    if not reason.strip():
        raise ValueError("dead-lettering needs a reason")
    return (
        Job.objects.using(using)
        .filter(pk__in=list(job_ids))
        .filter(Q(status__in=[JobStatus.READY, JobStatus.SCHEDULED, JobStatus.RETRYING]))
        .update(
            status=JobStatus.DEAD, terminal_reason=TerminalReason.OPERATOR,
            last_error=f"dead-lettered by operator: {reason}", finished_at=Now(), updated_at=Now(),
        )
    )


def replay_job(
    job: Job, *, idempotency_key: str | None, using: str = DEFAULT_DB_ALIAS
) -> Job:
    """Enqueue a new job from ``job``'s payload, under the given idempotency key (or none)."""
    from .enqueuing import JobSpec, enqueue_many

    max_age = (job.deadline - job.created_at) if job.deadline else None
    spec = JobSpec.of(
        job.task, job.payload, queue=job.queue, priority=job.base_priority,
        max_attempts=job.max_attempts, lease=timedelta(seconds=job.lease_seconds),
        idempotency_key=idempotency_key, trace_id=job.trace_id, fairness_key=job.fairness_key,
        payload_version=job.payload_version, max_age=max_age,
    )
    return enqueue_many([spec], using=using)[0]


__all__ = [
    "Outcome",
    "cancel_jobs",
    "claim_jobs",
    "dead_letter_jobs",
    "extend_leases",
    "promote_due_jobs",
    "ready_queues",
    "replay_job",
    "rescue_expired_leases",
    "retry_jobs",
    "settle",
]
