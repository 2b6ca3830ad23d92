"""Every change of a job's state, in one module: the claim, the ways out of RUNNING, the
maintenance transitions and the operator transitions.

Read it top to bottom:

0. ``insert_job`` and ``insert_jobs``: a new job, SCHEDULED or READY, in its caller's
   transaction (``enqueuing`` checks it first and answers with the ``Job``).
1. ``claim_jobs``: READY -> RUNNING, one short transaction built on the ORM's
   ``select_for_update(skip_locked=True)``, lease times from the database clock.
2. ``extend_leases``: a heartbeat; RUNNING stays RUNNING under the same token.
3. ``settle``: RUNNING -> the state an ``Outcome`` names (``outcomes.WAYS_OUT`` is the list),
   only while the reporter still holds the lease; a stale report is recorded as lost. A worker
   sends its pending settlement with its next claim (``settle_and_claim``).
4. ``rescue_expired_leases``: RUNNING whose lease expired -> RETRYING or DEAD (the retry policy).
5. ``promote_due_jobs``: SCHEDULED and RETRYING whose time came -> READY (and
   ``promote_jobs_due_by``, the same as of a given time, for tests).
6. ``raise_waiting_priorities``: READY stays READY with a higher priority (aging).
7. ``delete_finished_jobs``: a terminal job past its retention leaves the table with its
   attempts (``maintenance.prune_jobs`` keeps the cadence and the batches).
8. Operators: ``retry_jobs``, ``cancel_jobs``, ``dead_letter_jobs``, and for
   ``enqueuing.replay_job`` the lock of the original and its audit (``take_for_replay``,
   ``audit_replay``).
9. Limits: a job with a limit key is READY or RUNNING only while it holds a slot of its key,
   THROTTLED otherwise; triggers of pgjobs_job move it between the two as slots are taken and
   freed, in the statements above (docs/limits.md). ``free_orphaned_slots`` and
   ``admit_waiting_keys`` catch what a trigger cannot see (``sql/limits.sql``);
   ``set_key_limit`` is an operator's limit for one key.

This module runs every write to ``pgjobs_job``, ``pgjobs_attempt`` and the limits' tables. The
statements of 0 to 7 are in ``sql/jobs.sql``, those of 9 in ``sql/limits.sql``; the operator
transitions are ORM updates of the rows they lock.
A schedule's jobs enter through enqueue like any other (``schedules`` builds them); operators'
actions on schedules are audited here too (``audit_schedule_action``).

Every transition is one guarded statement (or one short transaction) whose WHERE clause says
which state, and for a running job which lease token, it applies to; each returns what it
changed, and the caller decides what a zero means. Times that decide ownership come from the
database clock.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from operator import attrgetter
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models import Exists, F, QuerySet
from django.db.models.functions import Now

from . import prepared, sql
from .claimed import ClaimedJob, claimed_jobs
from .conf import settings
from .exceptions import InvalidJobOption
from .limits import Rate
from .models import Job, KeyLimit, OperatorAction, OperatorActionKind, QueueState
from .outcomes import Outcome
from .registry import registry
from .retry import decide
from .status import (
    ACTIVE_STATUSES,
    RETRYABLE_STATUSES,
    TERMINAL_STATUSES,
    WAITING_STATUSES,
    FailureClass,
    JobStatus,
    TerminalReason,
)
from .validation import limit_key_problem, max_running_problem, queue_problem, seconds_of

# --- 0. the insert ------------------------------------------------------------------------------


def insert_job(
    values: Mapping[str, Any], *, keyed: bool, notify: bool, using: str
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """INSERT one job in the caller's transaction; its answer's column names and row (none if a
    unique index refused it). ``values`` are named as the statement's parameters; ``keyed``
    says whether the job has a key or a tick a unique index may refuse (``sql.inserted_rows``).

    Only ``enqueue`` calls this, with values it checked (``options.check_options``).

    In autocommit the statement is prepared (``prepared.run``): parsing and planning it cost
    the server about as much as inserting the row. Inside a transaction it is sent in full: a
    session that lost its statements (the caller's code ran ``DISCARD ALL``) would fail the
    ``EXECUTE``, and with it the caller's transaction. In autocommit there is no transaction to
    lose, and a lost statement is sent again in full.
    """
    params = {**values, "notify": notify}
    connection = connections[using]
    if prepared.outside_any_transaction(connection) and prepared.enabled(using):
        try:
            [(names, rows)] = prepared.run(using, [(_INSERT_JOB[keyed], params)],
                                           connection=connection)
            return names, rows
        except DatabaseError as error:
            if not prepared.lost_statement(error):
                raise
    with connection.cursor() as cursor:
        prepared.read_times_with_psycopgs_loader(connection, cursor.cursor)
        cursor.execute(_INSERT_JOB[keyed].text, params)
        return _answer_names(cursor, one=True), cursor.fetchall()


# By whether the job has a key or a tick.
_INSERT_JOB = {keyed: prepared.Statement("insert_job", sql.inserted_rows("insert_job", keyed),
                                          reads_times=True)
               for keyed in (False, True)}


def insert_jobs(
    own: str, shared: Sequence[list[Any]], *, keyed: bool, notify: bool, using: str
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """INSERT many jobs with one statement in the caller's transaction; the answer's column
    names and rows, one per job inserted (a unique index may refuse some of them when
    ``keyed``: some job has a key or a tick, ``sql.inserted_rows``).

    ``shared`` holds a list per shared column, an element per combination of task and options;
    ``own`` each job's own values, one JSON document (``insert_jobs`` in ``sql/jobs.sql``).
    """
    with connections[using].cursor() as cursor:
        prepared.read_times_with_psycopgs_loader(connections[using], cursor.cursor)
        cursor.execute(sql.inserted_rows("insert_jobs", keyed), [own, *shared, notify])
        return _answer_names(cursor, one=False), cursor.fetchall()


def lock_upstream_jobs(job_ids: Sequence[int], *, using: str) -> dict[int, tuple[str, Any]]:
    """Lock the jobs new edges depend on, in id order; each one's status and workflow id."""
    if not job_ids:
        return {}
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("lock_upstream_jobs"), [list(job_ids)])
        return {job_id: (status, workflow) for job_id, status, workflow in cursor.fetchall()}


def insert_dependencies(edges: Sequence[tuple[int, int, str]], *, using: str) -> None:
    """Write a workflow's edges (dependent, upstream, requires) and mark their upstream jobs."""
    if not edges:
        return
    jobs, upstreams, requires = (list(column) for column in zip(*edges, strict=True))
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("insert_dependencies"),
                       {"jobs": jobs, "upstreams": upstreams, "requires": requires})


def resolve_dependencies(ended: Mapping[int, str], *, using: str) -> None:
    """Resolve the unresolved edges on jobs that have ended (id: status), as their end would."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("resolve_dependencies"),
                       {"ids": list(ended), "statuses": [str(s) for s in ended.values()]})


def dependency_results(job_id: int, *, using: str) -> list[tuple[Any, ...]]:
    """(id, task, status, result, requires) of each job ``job_id`` depends on, in edge order."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("dependency_results"), [job_id])
        return [(row[0], row[1], row[2], json.loads(row[3]) if isinstance(row[3], str)
                 else row[3], row[4]) for row in cursor.fetchall()]


def record_progress(job_id: int, lease_token: uuid.UUID, progress: str, *, using: str) -> bool:
    """Write a running job's progress (JSON text) under its lease; False: the lease is gone."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("record_progress"),
                       {"id": job_id, "token": lease_token, "progress": progress})
        return cursor.fetchone() is not None


def expire_pending_jobs(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> list[int]:
    """End pending jobs whose deadline passed, dead; their ids."""
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql.query("expire_pending_jobs"), [limit])
        return [row[0] for row in cursor.fetchall()]


def unique_key_holder(task: str, key: str, period: float | None, *, using: str) -> int | None:
    """The id of the job that holds ``task``'s unique ``key`` now (in ``period``), if any."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("unique_key_holder"), {"task": task, "key": key,
                                                        "period": period})
        found = cursor.fetchone()
    return None if found is None else found[0]


def _answer_names(cursor: CursorWrapper, one: bool) -> list[str]:
    """The names of an insert's answer columns: the same for every execution of its statement."""
    names = _ANSWER_NAMES.get(one)
    if names is None:
        # Reading the description builds an object per column: once per statement is enough.
        names = _ANSWER_NAMES[one] = [column.name for column in cursor.description]
    return names


_ANSWER_NAMES: dict[bool, list[str]] = {}
# --- 1. the claim ------------------------------------------------------------------------------

# A claim's floor at one priority: the (run_at, id) of the last job claimed there.
Floor = tuple[int, int, int]  # priority, run_at in microseconds since the epoch, id


def claim_jobs(
    worker_id: str, queue: str, limit: int, *, floors: Sequence[Floor] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[ClaimedJob]:
    """Claim up to ``limit`` ready jobs of ``queue`` for ``worker_id``, in one short transaction.

    A paused queue gives nothing: the statement reads the queue's pause in the same snapshot.
    With ``floors`` (a worker's while a snapshot is held open, ``worker.floors``), only the jobs
    past a floor, at a priority that has one, are candidates.
    """
    with transaction.atomic(using=using):
        [(columns, rows)] = prepared.run(
            using, [_claim(worker_id, queue, limit, floors)], whole_block=True)
    return claimed_jobs(columns, rows)


def _claim(
    worker_id: str, queue: str, limit: int, floors: Sequence[Floor] | None
) -> tuple[prepared.Statement, dict[str, Any]]:
    values: dict[str, Any] = {"queue": queue, "worker_id": worker_id}
    if not floors:
        return claim_statement(limit), values
    values["floors"] = json.dumps([{"priority": p, "run_at_us": us, "id": i}
                                   for p, us, i in floors])
    return claim_statement(limit, from_floors=True), values


def settle_and_claim(
    outcomes: Sequence[Outcome], worker_id: str, queue: str, limit: int, *,
    floors: Sequence[Floor] | None = None, using: str = DEFAULT_DB_ALIAS,
) -> tuple[dict[uuid.UUID, bool], list[ClaimedJob]]:
    """``settle`` these outcomes, then ``claim_jobs``, in the claim's one short transaction.

    A worker's pending settlement rides with its next claim: one commit for both, and where the
    connection binds parameters client-side (Django's default) one round trip, the statements
    sent as one message with the transaction's BEGIN and COMMIT (``prepared.run``). Both commit
    or neither does. Return what ``settle`` and ``claim_jobs`` return.

    A limit key's slot that the settlement frees goes with the key's next job to this claim when
    that job is of ``queue`` (the settlement is told of the claim): the claim starts it, written
    from ``throttled`` to ``running`` once, not made ready for the claim to write it again, and
    it counts in the batch of ``limit``.
    """
    if not outcomes:
        return {}, claim_jobs(worker_id, queue, limit, floors=floors, using=using)
    reports = _reports(outcomes)
    # In a transaction that goes on after the claim (a test's, or one the caller opened),
    # nothing more may go to it.
    goes_on = not prepared.outside_any_transaction(connections[using])
    with transaction.atomic(using=using):
        results = prepared.run(using, [
            *_push_backs(outcomes),
            (_SETTLE, [queue, limit, reports]),
            _claim(worker_id, queue, limit, floors),
            *([(_CLAIM_TO_END, [])] if goes_on else []),
        ], whole_block=True)
    (_, settled), (columns, rows) = results[-3:-1] if goes_on else results[-2:]
    return _applied(outcomes, settled), claimed_jobs(columns, rows)


@cache
def claim_statement(limit: int, *, from_floors: bool = False) -> prepared.Statement:
    """The claim of a batch of ``limit``: the ``claim_jobs`` block of ``sql/jobs.sql``, whole.

    Its parameters are ``queue`` and ``worker_id``; the batch size is written into its text (a
    generic plan would guess at a bound LIMIT), so each size is a statement of its own.
    ``from_floors``: its candidates are ``claim_candidates_from_floors``, whose floors are one
    more parameter (``claim_jobs``).
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ValueError(f"a claim's batch size is a whole number of at least 1, not {limit!r}")
    text = sql.query("claim_jobs")
    if from_floors:
        start, end = "WITH candidates AS (\n", "\n), claimed AS ("
        before, rest = text.split(start, 1)
        text = (before + start + sql.query("claim_candidates_from_floors")
                + end + rest.split(end, 1)[1])
    text = text.replace("{limit}", str(limit))
    if from_floors:
        return prepared.Statement(f"claim{limit}_from_floors", text, without_jit=True)
    return prepared.Statement(f"claim{limit}", text, same_values=True, without_jit=True)


def claim_candidates(
    queue: str, limit: int, *, using: str = DEFAULT_DB_ALIAS
) -> QuerySet[Job, Any]:
    """The claim's candidates as the ORM says them; the claim's text is this query, compiled.

    ``select_for_update(skip_locked=True)``: each candidate is locked, and one another
    transaction holds is skipped, not waited for. Django compiles it only inside
    ``transaction.atomic()``, as the claim runs. The claim's statement writes this query out
    (``sql/jobs.sql``) so that it reads whole and is prepared as it is; a test compiles this
    query on each supported Django and proves that text equal to it.
    """
    paused = QueueState.objects.using(using).filter(name=queue, paused=True)
    return (
        Job.objects.using(using)
        .select_for_update(skip_locked=True)
        .filter(~Exists(paused), status=JobStatus.READY, queue=queue)
        .order_by("-priority", "run_at", "id")
        .values("id")[:limit]
    )


def prepare_worker_statements(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> bool:
    """Prepare the claim of ``limit`` and the settle now, where they are prepared at all.

    Return whether they are: then ``claim_jobs`` and ``settle`` send only their ``EXECUTE``
    for the next while (``explain`` reads the plans of exactly those).
    """
    if not prepared.enabled(using):
        return False
    prepared.prepare(using, [claim_statement(limit), _SETTLE])
    return True


# --- 2. heartbeats --------------------------------------------------------------------------------


def extend_leases(
    leases: Iterable[tuple[int, uuid.UUID]], *, using: str = DEFAULT_DB_ALIAS
) -> dict[int, bool]:
    """Extend each lease still held; map each extended job id to whether a cancel was asked.

    A job missing from the answer is no longer held by that token: its holder lost it.
    """
    pairs = list(leases)
    if not pairs:
        return {}
    with connections[using].cursor() as cursor:
        cursor.execute(
            sql.query("extend_leases"), [[p[0] for p in pairs], [p[1] for p in pairs]]
        )
        return {job_id: bool(cancel) for job_id, _, cancel in cursor.fetchall()}


def cancel_requested(job_ids: Sequence[int], *, using: str = DEFAULT_DB_ALIAS) -> list[int]:
    """Which of these running jobs an operator asked to stop (their worker then settles them).

    By primary key, read-only: a worker asks it about the jobs it holds, about twice a second.
    """
    if not job_ids:
        return []
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("cancel_requested"), [list(job_ids)])
        return [row[0] for row in cursor.fetchall()]


# --- 3. the ways out of RUNNING ------------------------------------------------------------------

# The columns of settle_jobs' recordset, named as Outcome's fields.
REPORT_FIELDS = (
    "job_id", "lease_token", "attempt", "worker_id", "status", "attempt_outcome",
    "delay_seconds", "counted", "adds_snooze", "failure_class", "terminal_reason", "error",
    "traceback", "result_json", "duration_ms",
)
_report = attrgetter(*REPORT_FIELDS)


def settle(outcomes: Sequence[Outcome], *, using: str = DEFAULT_DB_ALIAS) -> dict[uuid.UUID, bool]:
    """Apply a batch of outcomes in one fenced statement; map each lease token to "applied".

    Each attempt's row is written here, once, with its outcome. A token that maps to False lost
    its lease before reporting: its attempt is recorded as lost and the job was not touched. An
    outcome that is not a way out of RUNNING is refused, and so is a batch that reports one
    lease twice (its row can be written only once).
    """
    if not outcomes:
        return {}
    *_, (_, rows) = prepared.run(using, [*_push_backs(outcomes),
                                         (_SETTLE, [None, None, _reports(outcomes)])])
    return _applied(outcomes, rows)


_SETTLE = prepared.Statement("settle", sql.query("settle_jobs"), without_jit=True)
_CLAIM_TO_END = prepared.Statement("claim_to_end", sql.query("claim_to_end"))
_PUSH_BACK = prepared.Statement("push_back", sql.query("push_back_rates"))


def _push_backs(outcomes: Sequence[Outcome]) -> list[tuple[prepared.Statement, list[str]]]:
    """The statement that applies the batch's RateLimited push-backs, before its settlement;
    none when it has none. A push-back is what the handler heard from the service it called, so
    it is applied whether or not its outcome still holds the lease."""
    pushed = [{"job_id": o.job_id, "key": o.push_back_key, "seconds": o.push_back_seconds}
              for o in outcomes if o.push_back_seconds is not None]
    return [(_PUSH_BACK, [json.dumps(pushed)])] if pushed else []


def _reports(outcomes: Sequence[Outcome]) -> str:
    """The batch as settle_jobs takes it, once every outcome is known to be a way out."""
    for outcome in outcomes:
        problem = outcome.problem()
        if problem is not None:
            raise ValueError(f"settle refuses an outcome: {problem}")
    if len({o.lease_token for o in outcomes}) != len(outcomes):
        raise ValueError("settle refuses a batch that reports one lease twice")
    # One JSON document for the batch: encoding it costs the worker a fraction of adapting a
    # parameter per column, and the server parses it in C.
    return json.dumps([dict(zip(REPORT_FIELDS, _report(o), strict=True)) for o in outcomes],
                      default=str)


def _applied(outcomes: Sequence[Outcome], rows: Sequence[Any]) -> dict[uuid.UUID, bool]:
    applied = {token: bool(was_applied) for token, was_applied in rows}
    return {o.lease_token: applied.get(o.lease_token, False) for o in outcomes}


# --- 4. rescue ------------------------------------------------------------------------------------


class _Expired(NamedTuple):
    """A running job whose lease expired, as the rescue step read it (``_EXPIRED_COLUMNS``)."""

    id: int
    lease_token: uuid.UUID
    attempt: int
    max_attempts: int
    created_at: datetime
    deadline: datetime | None
    task: str
    trace_id: str
    lease_owner: str
    lease_expires_at: datetime
    cancel_requested_at: datetime | None


# The Job columns _Expired's fields are read from, field by field.
_EXPIRED_COLUMNS = ("id", "lease_token", "attempts", "max_attempts", "created_at", "deadline",
                    "task", "trace_id", "lease_owner", "lease_expires_at", "cancel_requested_at")


def rescue_expired_leases(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> list[Outcome]:
    """Take back up to ``limit`` running jobs whose lease expired; retry them or end them.

    The rows are locked (SKIP LOCKED, so several workers can rescue at once) and settled under
    their old token in the same transaction: a worker that reports later finds it lost.
    """
    with transaction.atomic(using=using):
        expired = [_Expired(*row) for row in (
            Job.objects.using(using)
            .select_for_update(skip_locked=True)
            .filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now())
            .order_by("lease_expires_at")
            .values_list(*_EXPIRED_COLUMNS)[:limit]
        )]
        if not expired:
            return []
        now = database_now(using=using)
        outcomes = [
            # An operator asked it to stop and its worker is gone: the cancel still sticks.
            Outcome.cancelled(job, f"cancelled by an operator; the lease held by "
                                   f"{job.lease_owner} expired before its worker settled it")
            if job.cancel_requested_at is not None else Outcome.failed(
                job, FailureClass.LEASE_EXPIRED,
                decide(FailureClass.LEASE_EXPIRED, attempts=job.attempt,
                       max_attempts=job.max_attempts, created_at=job.created_at,
                       deadline=job.deadline, now=now),
                error=f"lease held by {job.lease_owner} expired at "
                      f"{job.lease_expires_at.isoformat()}",
            )
            for job in expired
        ]
        settle(outcomes, using=using)
    return outcomes


# --- 5. promotion, 6. aging --------------------------------------------------------------------


def promote_due_jobs(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Make scheduled and retrying jobs whose run_at has come ready; return their queues."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("promote_due_jobs"), [limit])
        return [row[0] for row in cursor.fetchall()]


def promote_jobs_due_by(
    when: datetime, limit: int, *, queues: Sequence[str] | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> list[str]:
    """Make scheduled and retrying jobs due by ``when`` ready (of ``queues``, or every queue).

    ``promote_due_jobs`` as of a time the caller gives rather than the database clock: tests use
    it to run jobs whose time has not come (``testing.drain(now=...)``). Only the status
    changes; run_at, the deadline and the lease's clock are untouched. Return their queues.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("promote_jobs_due_by"), {
            "when": when, "limit": limit, "queues": None if queues is None else list(queues),
        })
        return [row[0] for row in cursor.fetchall()]


@dataclass(frozen=True)
class AgingBatch:
    """What one aging batch did, and the (run_at, id) keyset position to continue after."""

    raised: int
    taken: int
    last: tuple[datetime, int] | None


def raise_waiting_priorities(
    queue: str,
    priority: int,
    *,
    after: tuple[datetime, int],
    limit: int,
    step: int,
    interval_seconds: float,
    cap: int,
    using: str = DEFAULT_DB_ALIAS,
) -> AgingBatch:
    """Age up to ``limit`` ready jobs of one (queue, priority) that waited past an interval.

    Each gains ``step`` per whole ``interval_seconds`` it has been ready (since its run_at, or
    its enqueue if later), over its base priority, up to ``cap``; only ready jobs change, and
    never downwards.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("raise_waiting_priorities"), {
            "queue": queue, "priority": priority, "after_run_at": after[0],
            "after_id": after[1], "limit": limit, "step": step,
            "interval": float(interval_seconds), "cap": cap,
        })
        row = cursor.fetchone()
    assert row is not None
    raised, taken, last_run_at, last_id = row
    last = (last_run_at, last_id) if last_id is not None else None
    return AgingBatch(int(raised), int(taken), last)


# --- 7. retention --------------------------------------------------------------------------------


def delete_finished_jobs(
    status: str, retention_seconds: float, limit: int, *, using: str = DEFAULT_DB_ALIAS
) -> tuple[int, int]:
    """Delete up to ``limit`` jobs that finished in ``status`` over ``retention_seconds`` ago,
    with their attempts, in one statement; return (jobs deleted, attempts deleted).

    The statement matches terminal states only, whatever ``status`` says.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("prune_jobs"),
                       {"status": status, "retention": retention_seconds, "limit": limit})
        row = cursor.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# --- reads between claims ------------------------------------------------------------------------


def pending_queues_with_work_running(*, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The queues with pending jobs, while some job is ready or running that may release them."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("pending_queues_with_work_running"))
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


# --- 8. operator transitions (the admin and management commands call these) -----------------
# Each locks the selected rows in id order (so two operators cannot deadlock, and a claim, which
# skips locked rows, cannot take one mid-action), applies one update guarded by status, and
# writes its audit row in the same transaction: the audit says exactly what changed.


@dataclass(frozen=True)
class Actor:
    """Who asked for an operator transition, as the audit row records it."""

    name: str
    user_id: int | None = None

    @classmethod
    def of(cls, user: Any) -> Actor:
        """The actor for a Django user."""
        return cls(user.get_username(), user.pk)


CODE = Actor("")  # an operator transition called from code, with no user behind it


def retry_jobs(
    job_ids: Iterable[int], *, actor: Actor = CODE, reason: str = "",
    using: str = DEFAULT_DB_ALIAS,
) -> int:
    """Dead or cancelled jobs back to ready with a fresh attempt budget; receipts are kept.

    A job whose unique key another active job holds stays as it is: two active jobs with one
    key are what the key forbids (the audit row lists it as ``held_elsewhere``). A workflow's
    jobs that were cancelled because a retried job had failed wait for it again, pending, down
    the branch (the audit row counts them as ``dependents_reopened``).
    """
    ids = unique_ids(job_ids)
    with transaction.atomic(using=using):
        before = _lock(ids, using)
        eligible = [i for i, status in before.items() if status in RETRYABLE_STATUSES]
        held = _unique_keys_held_elsewhere(eligible, using)
        eligible = [i for i in eligible if i not in held]
        retried = (
            Job.objects.using(using)
            .filter(pk__in=eligible, status__in=RETRYABLE_STATUSES)
            .update(
                status=JobStatus.READY, attempts=0, snoozes=0, run_at=Now(), finished_at=None,
                terminal_reason="", priority=F("base_priority"), cancel_requested_at=None,
                deadline=Now() + (F("deadline") - F("created_at")), updated_at=Now(),
            )
        )
        reopened = _reopen_dependencies(eligible, using) if retried else 0
        _audit(OperatorActionKind.RETRY, actor, reason, ids, retried,
               {"before": counts_by_state(before.values()), "retried": eligible,
                **({"held_elsewhere": sorted(held)} if held else {}),
                **({"dependents_reopened": reopened} if reopened else {})}, using)
        _notify(eligible, using)
    return retried


def _reopen_dependencies(job_ids: Sequence[int], using: str) -> int:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("reopen_dependencies"), [list(job_ids)])
        row = cursor.fetchone()
    return int(row[0]) if row else 0


def run_jobs_now(
    job_ids: Iterable[int], *, actor: Actor = CODE, reason: str = "",
    using: str = DEFAULT_DB_ALIAS,
) -> int:
    """Scheduled and retrying jobs due now: ready at once (or, under a limit, waiting for it
    as any job that comes due does), their attempts as they are; audited."""
    ids = unique_ids(job_ids)
    with transaction.atomic(using=using):
        before = _lock(ids, using)
        eligible = [i for i, status in before.items() if status in DUE_LATER_STATUSES]
        moved = (
            Job.objects.using(using)
            .filter(pk__in=eligible, status__in=DUE_LATER_STATUSES)
            .update(status=JobStatus.READY, run_at=Now(), updated_at=Now())
        )
        _audit(OperatorActionKind.RUN_NOW, actor, reason, ids, moved,
               {"before": counts_by_state(before.values()), "run_now": eligible}, using)
        _notify(eligible, using)
    return moved


def cancel_jobs(
    job_ids: Iterable[int], *, actor: Actor = CODE, reason: str = "",
    using: str = DEFAULT_DB_ALIAS,
) -> tuple[int, int]:
    """Cancel waiting jobs; ask running ones to stop. Return (cancelled, asked to stop).

    A running job's worker settles it cancelled: before its handler starts, if it has not yet,
    or while it runs (the lease contract's takeover). Its handler may still finish first: the
    job then ends as the handler reported, and ``cancel_shown`` on its page says so.
    """
    ids = unique_ids(job_ids)
    jobs = Job.objects.using(using)
    with transaction.atomic(using=using):
        before = _lock(ids, using)
        waiting = [i for i, status in before.items() if status in WAITING_STATUSES]
        running = [i for i, status in before.items() if status == JobStatus.RUNNING]
        cancelled = jobs.filter(pk__in=waiting, status__in=WAITING_STATUSES).update(
            status=JobStatus.CANCELLED, terminal_reason=TerminalReason.OPERATOR,
            finished_at=Now(), updated_at=Now(),
        )
        # The lease holder sees the request on its next heartbeat; it stays the only writer of
        # the job's outcome, so a stop request never races its settlement.
        asked_ids = list(
            jobs.filter(pk__in=running, status=JobStatus.RUNNING, cancel_requested_at__isnull=True)
            .values_list("id", flat=True)
        )
        asked = jobs.filter(
            pk__in=asked_ids, status=JobStatus.RUNNING, cancel_requested_at__isnull=True
        ).update(cancel_requested_at=Now(), updated_at=Now())
        # A job that had already ended when the cancel came stays as it ended: the audit says
        # the cancel came too late for it, and how it had ended (the job page shows it).
        too_late = {str(i): status for i, status in before.items()
                    if status in TERMINAL_STATUSES}
        _audit(OperatorActionKind.CANCEL, actor, reason, ids, cancelled + asked,
               {"before": counts_by_state(before.values()), "cancelled": waiting,
                "asked_to_stop": asked_ids, **({"too_late": too_late} if too_late else {})},
               using)
    return cancelled, asked


def dead_letter_jobs(
    job_ids: Iterable[int], reason: str, *, actor: Actor = CODE, using: str = DEFAULT_DB_ALIAS
) -> int:
    """Move waiting jobs to dead by hand. Running jobs are left to their lease holder."""
    if not reason.strip():
        raise ValueError("dead-lettering needs a reason")
    ids = unique_ids(job_ids)
    with transaction.atomic(using=using):
        before = _lock(ids, using)
        eligible = [i for i, status in before.items() if status in WAITING_STATUSES]
        dead = (
            Job.objects.using(using)
            .filter(pk__in=eligible, status__in=WAITING_STATUSES)
            .update(
                status=JobStatus.DEAD, terminal_reason=TerminalReason.OPERATOR,
                last_error=f"dead-lettered by operator: {reason}", finished_at=Now(),
                updated_at=Now(),
            )
        )
        _audit(OperatorActionKind.DEAD_LETTER, actor, reason, ids, dead,
               {"before": counts_by_state(before.values()), "dead_lettered": eligible}, using)
    return dead


def take_for_replay(job: Job, *, move_key: bool, using: str = DEFAULT_DB_ALIAS) -> Job:
    """Lock finished ``job`` in the caller's transaction for ``enqueuing.replay_job``.

    With ``move_key`` its idempotency key is taken off it, for the replay to take. Return the
    original as it is now; raise ``ValueError`` when it is not finished.
    """
    jobs = Job.objects.using(using)
    original = jobs.select_for_update().filter(pk=job.pk, status__in=TERMINAL_STATUSES).first()
    if original is None:
        raise ValueError(f"job {job.pk} is not finished (succeeded, dead or cancelled)")
    if move_key and original.idempotency_key is not None:
        jobs.filter(
            pk=original.pk, idempotency_key=original.idempotency_key,
            status__in=TERMINAL_STATUSES,
        ).update(idempotency_key=None, updated_at=Now())
    return original


def audit_replay(
    original: Job, replay: Job, *, key_moved: bool, actor: Actor, reason: str,
    using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Audit a replay of ``original`` as ``replay`` (``enqueuing.replay_job``, in its
    transaction)."""
    # Both jobs, so each one's page lists the replay and links the other.
    _audit(OperatorActionKind.REPLAY, actor, reason, [original.pk, replay.pk], 1,
           {"replay_id": replay.pk, "original_id": original.pk,
            "original_key": original.idempotency_key,
            "replay_key": replay.idempotency_key, "key_moved": key_moved}, using)


def pause_queue(
    queue: str, *, actor: Actor = CODE, reason: str = "", using: str = DEFAULT_DB_ALIAS
) -> bool:
    """Stop workers claiming from ``queue`` (enqueue still works); True if it was running.

    The claim reads the pause in its own statement, so no claim that starts after this commits
    takes a job of the queue. Jobs already claimed run to their end.
    """
    return _set_paused(queue, True, actor, reason, using)


def resume_queue(
    queue: str, *, actor: Actor = CODE, reason: str = "", using: str = DEFAULT_DB_ALIAS
) -> bool:
    """Let workers claim from ``queue`` again; True if it was paused. Idle workers are woken."""
    return _set_paused(queue, False, actor, reason, using)


def _set_paused(queue: str, paused: bool, actor: Actor, reason: str, using: str) -> bool:
    problem = queue_problem(queue)
    if problem is not None:
        raise ValueError(f"queue {problem}")
    with transaction.atomic(using=using):
        states = QueueState.objects.using(using)
        state = states.select_for_update().filter(name=queue).first()
        was_paused = state is not None and state.paused
        states.update_or_create(name=queue, defaults={
            "paused": paused, "changed_at": Now(), "changed_by": actor.name, "reason": reason,
        })
        changed = was_paused != paused
        _audit(OperatorActionKind.PAUSE_QUEUE if paused else OperatorActionKind.RESUME_QUEUE,
               actor, reason, [], int(changed), {"queue": queue, "was_paused": was_paused}, using)
        if not paused and changed and settings.NOTIFY:
            # Workers idle on a paused queue wake as for an enqueue, when this commits.
            with connections[using].cursor() as cursor:
                cursor.execute(sql.query("notify_queue"), [queue])
    return changed


def record_raw_payload_view(job_id: int, *, actor: Actor, using: str = DEFAULT_DB_ALIAS) -> None:
    """Audit that ``actor`` saw job ``job_id``'s unredacted payload."""
    _audit(OperatorActionKind.VIEW_RAW_PAYLOAD, actor, "", [job_id], 0, {}, using)


def record_encrypted_reveal(job_id: int, fields: list[str], *, actor: Actor,
                            using: str = DEFAULT_DB_ALIAS) -> None:
    """Audit that ``actor`` saw the decrypted ``fields`` of job ``job_id``."""
    _audit(OperatorActionKind.REVEAL_ENCRYPTED, actor, "", [job_id], 0, {"fields": fields},
           using)


def audit_schedule_action(
    action: str, actor: Actor, reason: str, schedule_ids: list[int], changed: int,
    detail: dict[str, Any], *, job_ids: Sequence[int] = (), using: str = DEFAULT_DB_ALIAS,
) -> None:
    """Audit an operator's action on schedules (``periodic`` calls it in the action's
    transaction); ``job_ids`` are the jobs it enqueued."""
    OperatorAction.objects.using(using).create(
        actor_id=actor.user_id, actor_name=actor.name, action=action, reason=reason,
        job_ids=list(job_ids), schedule_ids=schedule_ids, selected=len(schedule_ids),
        changed=changed, detail=detail,
    )


# Waiting for a time: what "run now" makes due at once.
DUE_LATER_STATUSES = (JobStatus.SCHEDULED, JobStatus.RETRYING)


# --- 9. limits: the maintenance of key slots ----------------------------------------------------
# The triggers of pgjobs_job take and free slots as jobs wait, become ready and end their runs
# (docs/limits.md). These catch the two things a trigger cannot see.


# How many slot rows (held or free) one look for orphans reads, by id: about 8 ms at 5,000 held
# here. A worker's step looks through every slot row in as many runs as there are windows.
ORPHAN_SCAN = 5000


def free_orphaned_slots(
    limit: int, *, after: int = 0, scan: int = ORPHAN_SCAN, using: str = DEFAULT_DB_ALIAS
) -> tuple[list[tuple[str, int, int]], int]:
    """Free up to ``limit`` slots whose holder no longer holds them, among the slot rows with
    ids after ``after`` up to ``after + scan``; (key, slot, job id) of each, and the id to look
    after next (once the look reached the last slot row, the one before the first: the next
    look starts over).

    A slot is freed by the statement that ends its holder's run: this finds only a holder
    deleted while it held one, or changed by a writer that bypassed the triggers.
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql.query("orphaned_slots"),
                       {"after": after, "until": after + scan, "batch": limit})
        rows = cursor.fetchall()
        first, last = rows[0][:2]
        resume = after + scan if last is not None and after + scan < last else first or 0
        found = [(key, n, job_id) for _, _, key, n, job_id in rows if key is not None]
        if not found:
            return [], resume
        cursor.execute(sql.query("free_orphaned_slots"), {"slots": json.dumps(
            [{"key": key, "n": n, "job_id": job_id} for key, n, job_id in found])})
        freed = [(key, n, job_id) for key, n, job_id in cursor.fetchall()]
    # Stopped at ``limit`` with the window not looked through: the next look takes it again
    # (without the slots freed here).
    return freed, after if len(found) >= limit else resume


def orphaned_slots_start(*, using: str = DEFAULT_DB_ALIAS) -> int:
    """A slot row id at random, where a worker's first look for orphaned slots starts."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("orphaned_slots_start"))
        return int(cursor.fetchone()[0])


def admit_waiting_keys(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Give free slots to throttled jobs, for up to ``limit`` keys that have both; how many.

    A slot freed while the job that would have taken it was not yet committed (the freeing
    statement could not see it) is given here, on the next run of the step.
    """
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql.query("admit_waiting_keys"), {"batch": limit})
        return sum(admitted for _, admitted in cursor.fetchall())


def start_rate_heads(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> tuple[int, float | None]:
    """Make ready up to ``limit`` jobs under a rate whose time to start has come; how many, and
    in how many seconds the next one's comes (None when none waits for its time)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("start_rate_heads"), {"batch": limit})
        [(started, _, next_in)] = cursor.fetchall()
    return int(started), None if next_in is None else float(next_in)


def set_key_limit(
    key: str, max_running: int, *, actor: Actor = CODE, reason: str = "",
    using: str = DEFAULT_DB_ALIAS,
) -> int:
    """Let at most ``max_running`` jobs of limit key ``key`` run at once, in place of what its
    handler declares; audited. Return how many throttled jobs a raised limit made ready now.

    A lowered limit stops new starts until the jobs above it finish; none is interrupted.
    """
    for problem, what in ((limit_key_problem(key), "key"),
                          (max_running_problem(max_running), "max_running")):
        if problem is not None:
            raise ValueError(f"{what} {problem}")
    if registry.rate_of(key) is not None:
        raise ValueError(f"key {key!r} is a rate's: its one slot is held by the job that starts "
                         "next, and a higher max_running would let more start than the rate "
                         "allows")
    with transaction.atomic(using=using):
        limits = KeyLimit.objects.using(using)
        before = limits.filter(key=key).values_list("max_running", flat=True).first()
        limits.update_or_create(key=key, defaults={
            "max_running": max_running, "changed_at": Now(), "changed_by": actor.name})
        with connections[using].cursor() as cursor:
            values: dict[str, Any] = {"key": key, "max_running": max_running}
            cursor.execute(sql.query("make_key_slots"), values)
            cursor.execute(sql.query("admit_key"), values)
            [(admitted,)] = cursor.fetchall()
        _audit(OperatorActionKind.SET_KEY_LIMIT, actor, reason, [], int(before != max_running),
               {"key": key, "max_running": max_running, "before": before,
                "admitted": admitted}, using)
    return admitted


def set_key_rate(
    key: str, count: int, per: float | timedelta, *, burst: int = 1, actor: Actor = CODE,
    reason: str = "", using: str = DEFAULT_DB_ALIAS,
) -> bool:
    """Let at most ``count`` jobs of rate key ``key`` start per ``per`` (``burst`` at once), in
    place of what its handler declares; audited. Return whether the key's next job, waiting for
    its time, was given it again under the new rate (it may start sooner, or later).

    Starts already charged stay charged: the new spacing applies from the next start on.
    """
    problem = limit_key_problem(key)
    if problem is not None:
        raise ValueError(f"key {problem}")
    try:
        rate = Rate(count, per=per, burst=burst)
    except InvalidJobOption as exc:
        raise ValueError(str(exc)) from exc
    declared = registry.rate_of(key)
    if declared is None:
        raise ValueError(f"key {key!r} is not a rate's: no handler here declares a Rate of that "
                         "name (a Limit's key takes a max_running)")
    per_seconds = seconds_of(per)
    with transaction.atomic(using=using):
        limits = KeyLimit.objects.using(using)
        row = limits.filter(key=key).first()
        before = None if row is None else {
            "rate_count": row.rate_count, "rate_per_seconds": row.rate_per_seconds,
            "rate_burst": row.rate_burst}
        was = declared.interval
        if row is not None and row.rate_count and row.rate_per_seconds:
            was = row.rate_per_seconds / row.rate_count
        limits.update_or_create(key=key, defaults={
            "max_running": None, "rate_count": count, "rate_per_seconds": per_seconds,
            "rate_burst": burst, "changed_at": Now(), "changed_by": actor.name})
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("retime_rate_key"), {
                "key": key, "was": was, "spacing": rate.interval, "burst": burst})
            [(retimed,)] = cursor.fetchall()
        after = {"rate_count": count, "rate_per_seconds": per_seconds, "rate_burst": burst}
        _audit(OperatorActionKind.SET_KEY_LIMIT, actor, reason, [], int(before != after),
               {"key": key, **after, "before": before, "retimed": retimed}, using)
    return bool(retimed)


def unique_ids(ids: Iterable[int]) -> list[int]:
    """An operator's selection, each id once, in the order rows are locked (by id)."""
    return sorted({int(i) for i in ids})


def _lock(ids: list[int], using: str) -> dict[int, str]:
    """Lock the rows of ``ids`` in id order; return each one's status now."""
    rows = (
        Job.objects.using(using).select_for_update().filter(pk__in=ids).order_by("id")
        .values_list("id", "status")
    )
    return dict(rows)


def _unique_keys_held_elsewhere(ids: list[int], using: str) -> set[int]:
    """The jobs among ``ids`` whose unique key (no period) an active job holds, or an earlier
    one of ``ids`` will once retried."""
    keyed = (Job.objects.using(using).filter(pk__in=ids, unique_key__isnull=False,
                                             unique_period_start__isnull=True)
             .order_by("id").values_list("id", "task", "unique_key"))
    held: set[int] = set()
    taken: set[tuple[str, str | None]] = set()
    for job_id, task, key in keyed:
        busy = (task, key) in taken or Job.objects.using(using).filter(
            task=task, unique_key=key, unique_period_start__isnull=True,
            status__in=ACTIVE_STATUSES).exists()
        if busy:
            held.add(job_id)
        else:
            taken.add((task, key))
    return held


def counts_by_state(states: Iterable[str]) -> dict[str, int]:
    """How many of an operator's selection were in each state (the audit's "before")."""
    return dict(Counter(states))


def _audit(
    action: str, actor: Actor, reason: str, ids: list[int], changed: int,
    detail: dict[str, Any], using: str,
) -> None:
    OperatorAction.objects.using(using).create(
        actor_id=actor.user_id, actor_name=actor.name, action=action, reason=reason,
        job_ids=ids, selected=len(ids), changed=changed, detail=detail,
    )


def _notify(ids: list[int], using: str) -> None:
    # Jobs made ready by hand wake idle workers like freshly enqueued ones; PostgreSQL delivers
    # the notification only when the operator's transaction commits.
    if ids and settings.NOTIFY:
        with connections[using].cursor() as cursor:
            cursor.execute(sql.query("notify_ready_queues"), [ids])


__all__ = [
    "CODE",
    "REPORT_FIELDS",
    "Actor",
    "AgingBatch",
    "audit_replay",
    "audit_schedule_action",
    "cancel_jobs",
    "cancel_requested",
    "claim_candidates",
    "claim_jobs",
    "claim_statement",
    "counts_by_state",
    "dead_letter_jobs",
    "delete_finished_jobs",
    "extend_leases",
    "insert_job",
    "insert_jobs",
    "pause_queue",
    "promote_due_jobs",
    "promote_jobs_due_by",
    "raise_waiting_priorities",
    "ready_queues",
    "record_raw_payload_view",
    "rescue_expired_leases",
    "resume_queue",
    "retry_jobs",
    "settle",
    "settle_and_claim",
    "take_for_replay",
    "unique_ids",
    "unique_key_holder",
]


# --- key rotation (pgjobs_rotate_keys) --------------------------------------------------------


def jobs_to_reseal(after: int, limit: int, *, using: str) -> list[tuple[Any, ...]]:
    """(id, task, sealed, payload, result) of the next ``limit`` jobs after id ``after``; the
    payload and result as the row's text, and None unless ``sealed`` (it holds an encrypted
    value)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("jobs_to_reseal"), {"after": after, "limit": limit})
        return [(i, task, sealed, payload if sealed else None, result if sealed else None)
                for i, task, sealed, payload, result in cursor.fetchall()]


def reseal_jobs(rows: list[dict[str, Any]], *, using: str) -> set[int]:
    """Write each row's new ``payload`` and ``result`` (JSON text; None: unchanged) where the job
    still holds the text ``was_payload`` and ``was_result``; the ids written
    (``sql.resealed_rows``: a batch skips held rows)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.resealed_rows("reseal_jobs", len(rows)), {"rows": json.dumps(rows)})
        return {row[0] for row in cursor.fetchall()}
