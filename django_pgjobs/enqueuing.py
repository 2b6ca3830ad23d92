"""Enqueue: check jobs, insert them in the caller's transaction, and answer with their jobs.

``enqueue`` is one INSERT on the caller's connection: if the caller's transaction rolls back, the
job never existed; if it commits, the job is durable. Bad input is refused before anything is
written, with an error that names the problem. The parts, each on its own:

- ``options``: what each option means, checked, defaults filled in;
- ``rows``: checked specs as the INSERT's rows (a task and options checked once per call, and
  kept), and its answers as ``Job`` objects;
- ``transitions.insert_job`` and ``insert_jobs``: the INSERT itself (``sql/jobs.sql``);
- here: the calls, the guard of a database's first INSERT, and each answer paired with its row
  (a row a unique index refused is answered with the job that holds its key).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, ProgrammingError, connections, transaction

from . import tracing, transitions, workflows
from .exceptions import InvalidJobOption, KeyTakenThenFreed, NotMigrated
from .models import Job
from .options import (
    OPTIONS,
    Defaults,
    JobSpec,
    Tick,
    check_nesting,
    encode_payload,
)
from .registry import Handler
from .rows import ROW_COLUMNS, Combination, Row, StoredPayload, rows_of
from .validation import shown


def enqueue(task: str | Handler, payload: Any, **options: Any) -> Job:
    """Enqueue one job in the caller's transaction and return it.

    Options: queue, priority, run_at or delay, idempotency_key, unique_key and unique_period,
    max_attempts, max_age, lease, timeout, trace_id, fairness_key, payload_version, using, and
    after (the jobs it waits for: docs/workflows.md). A
    second enqueue with the same task and idempotency_key returns the existing job
    (``job.created`` is False) and writes nothing; so does one with the unique_key of an active
    job (or, with a unique_period, of a job of the same period).
    """
    using = options.pop("using", None)
    after = options.pop("after", ())
    return enqueue_many([JobSpec.of(task, payload, after=after, **options)], using=using)[0]


def enqueue_many(specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
    """Enqueue many jobs with one INSERT, in order; all are validated before any is written."""
    alias = _checked_alias(using)
    defaults = Defaults.read()
    if not isinstance(specs, list | tuple):
        specs = list(specs)
    rows = rows_of(specs, defaults)
    if not rows:
        return []
    if any(spec.after for spec in specs):
        return _enqueue_graph(specs, rows, alias, defaults.notify)
    return _traced_insert(rows, alias, defaults.notify)


def _traced_insert(rows: Sequence[Row], alias: str, notify: bool) -> list[Job]:
    """The INSERT of ``rows``, in a span that carries its trace to the jobs when there is one
    to carry."""
    found = tracing.send_tracer()
    if found is None:
        return _insert_all(rows, [None] * len(rows), alias, notify)
    with tracing.sending(found, rows) as sending:
        jobs = _insert_all(rows, sending.traceparents, alias, notify)
        sending.sent(jobs)
    return jobs


def _enqueue_graph(specs: Sequence[JobSpec], rows: Sequence[Row], alias: str,
                   notify: bool) -> list[Job]:
    """A workflow: its jobs and edges, checked, in one savepoint (``workflows``)."""

    def insert(graph: workflows.Graph) -> list[Job]:
        for place, row in enumerate(rows):
            row.graph = (graph.pending[place], graph.has_dependents[place], graph.workflow_id)
        return _traced_insert(rows, alias, notify)

    return workflows.enqueue_graph(specs, insert, alias)


def validate(spec: JobSpec) -> None:
    """Check ``spec`` as ``enqueue_many`` would, sending nothing; raise ``EnqueueError``."""
    defaults = Defaults.read()
    Combination.of(spec, defaults).row(spec, defaults)


KEEP_KEY = object()  # replay_job(idempotency_key=KEEP_KEY): the replay takes the original's key


def replay_job(
    job: Job, *, idempotency_key: str | object | None, actor: transitions.Actor = transitions.CODE,
    reason: str = "", using: str = DEFAULT_DB_ALIAS,
) -> Job:
    """Enqueue a new job from finished ``job``'s payload, under the given idempotency key.

    ``KEEP_KEY`` moves the original's key to the replay (later enqueues with that key then
    dedupe against the replay); a string gives the replay a new key; None gives it none.
    Raises ``ValueError`` when the original is not finished or the key is taken.
    """
    move_key = idempotency_key is KEEP_KEY
    with transaction.atomic(using=using):
        original = transitions.take_for_replay(job, move_key=move_key, using=using)
        key = original.idempotency_key if move_key else idempotency_key
        assert key is None or isinstance(key, str)
        max_age = (original.deadline - original.created_at) if original.deadline else None
        # The payload as its row holds it: checked and sealed when the original was enqueued.
        replay = enqueue(
            original.task, StoredPayload(original.payload), queue=original.queue,
            priority=original.base_priority, max_attempts=original.max_attempts,
            lease=timedelta(seconds=original.lease_seconds), idempotency_key=key,
            trace_id=original.trace_id,
            fairness_key=original.fairness_key, payload_version=original.payload_version,
            max_age=max_age, using=using,
        )
        if not replay.created:
            # Rolls back the key move too: nothing happened.
            raise ValueError(
                f"idempotency key {key!r} is already used by job {replay.pk} of {original.task}"
            )
        transitions.audit_replay(original, replay, key_moved=move_key and key is not None,
                                 actor=actor, reason=reason, using=using)
    return replay


def _checked_alias(using: Any) -> str:
    """The alias ``using`` names, once it is known to name a PostgreSQL database."""
    alias = DEFAULT_DB_ALIAS if using is None else using
    if isinstance(alias, str) and alias in _migrated:
        return alias
    if not isinstance(alias, str) or alias not in connections:
        raise InvalidJobOption(f"using must name a database in DATABASES, got {shown(using)}")
    vendor = connections[alias].vendor  # the backend's class says it: nothing connects
    if vendor != "postgresql":
        raise InvalidJobOption(
            f"using names database {alias!r}, which uses {vendor}; django-pgjobs stores jobs "
            "in PostgreSQL only")
    return alias


_NOT_MIGRATED = (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn)
# The aliases whose first INSERT went through: PostgreSQL databases that have the job table.
# Until then an INSERT that finds no table must not abort the caller's transaction (see
# _insert_all); from then on a single enqueue stays one round trip.
_migrated: set[str] = set()


def _on_databases_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES":
        _migrated.clear()


setting_changed.connect(_on_databases_changed)


def _insert_all(
    rows: Sequence[Row], traceparents: Sequence[str | None], alias: str, notify: bool
) -> list[Job]:
    if alias in _migrated:
        return _insert_rows(rows, traceparents, alias, notify)
    # The first enqueue on this alias: the database may not have been migrated. An INSERT into
    # a missing table aborts the transaction it runs in, so inside the caller's it runs in a
    # savepoint (two round trips more, once per alias and process), and the caller's
    # transaction survives the refusal.
    connection = connections[alias]
    try:
        if connection.get_autocommit():
            jobs = _insert_rows(rows, traceparents, alias, notify)
        else:
            with transaction.atomic(using=alias):
                jobs = _insert_rows(rows, traceparents, alias, notify)
    except ProgrammingError as exc:
        if isinstance(exc.__cause__, _NOT_MIGRATED):
            raise NotMigrated(alias) from exc
        raise
    _migrated.add(alias)
    return jobs


def _insert_rows(
    rows: Sequence[Row], traceparents: Sequence[str | None], alias: str, notify: bool
) -> list[Job]:
    for row, traceparent in zip(rows, traceparents, strict=True):
        row.traceparent = traceparent
    jobs: list[Job | None] = [None] * len(rows)
    pending = list(range(len(rows)))
    # A refused row whose key holder finished before it could be read back is sent again: its
    # key is free now. Twice more at most; each time some holder finished within milliseconds.
    for _ in range(3):
        if not pending:
            break
        batch = [rows[i] for i in pending]
        for i, job in zip(pending, _insert(batch, alias, notify), strict=True):
            jobs[i] = job
        pending = [i for i in pending if jobs[i] is None]
    if pending:
        row = rows[pending[0]]
        raise KeyTakenThenFreed(row.task, row.idempotency_key or row.unique_key or str(
            row.scheduled_at))
    return [job for job in jobs if job is not None]


def _insert(rows: Sequence[Row], alias: str, notify: bool) -> list[Job | None]:
    """One INSERT of ``rows``; each row's job, the one holding its key, or None if that is gone."""
    keyed = any(row.keyed for row in rows)
    if len(rows) == 1 and rows[0].graph is None:
        [row] = rows
        names, returned = transitions.insert_job(
            {**dict(zip(ROW_COLUMNS, row.values, strict=True)), "traceparent": row.traceparent},
            keyed=keyed, notify=notify, using=alias)
    else:
        combinations, own = _many_rows(rows)
        shared = [list(column) for column in
                  zip(*(c.head + c.tail for c in combinations), strict=True)]
        names, returned = transitions.insert_jobs(own, shared, keyed=keyed, notify=notify,
                                                  using=alias)
    return _pair_with_rows(rows, returned, names, alias)


def _many_rows(rows: Sequence[Row]) -> tuple[list[Combination], str]:
    """The combinations of ``rows``, and each row's own values as one JSON document.

    A row is ``[combination, payload]``, then its schedule tick, traceparent, limit key and
    weight when it has any of them (and then a workflow's count of dependencies, whether jobs
    depend on it, and its workflow id): joining the already encoded payloads costs a fraction
    of quoting a text array of them, and the server parses the document once.
    """
    combinations: list[Combination] = []
    numbers: dict[int, int] = {}
    parts = []
    for row in rows:
        number = numbers.get(id(row.combination))
        if number is None:
            number = numbers[id(row.combination)] = len(combinations) + 1
            combinations.append(row.combination)
        traceparent = row.traceparent
        if row.tick is None and traceparent is None and row.limit_key is None and (
                row.graph is None):
            parts.append(f"[{number},{row.encoded}]")
        else:
            scheduled_at = row.scheduled_at
            graph = "" if row.graph is None else (
                f",{row.graph[0]},{json.dumps(row.graph[1])},{json.dumps(row.graph[2])}")
            parts.append(f"[{number},{row.encoded},{json.dumps(row.schedule_id)},"
                         f"{json.dumps(scheduled_at and scheduled_at.isoformat())},"
                         f"{json.dumps(traceparent)},{json.dumps(row.limit_key)},"
                         f"{json.dumps(row.rate_weight)}{graph}]")
    return combinations, f"[{','.join(parts)}]"


# The columns of the INSERT's answer that pair a returned row with its job and fill that job.
_ANSWER = ("id", "task", "idempotency_key", "unique_key", "schedule_id", "scheduled_at",
           "status", "run_at", "deadline", "created_at")


def _pair_with_rows(
    rows: Sequence[Row], returned: list[tuple[Any, ...]], names: list[str], alias: str
) -> list[Job | None]:
    # A returned row is found by what made it unique: (task, idempotency key), else (schedule,
    # tick), else (task, unique key); two tasks may share a key. Jobs with none of these come
    # back in the order they were given.
    id_, task, key, unique, schedule, tick, status, run_at, deadline, created_at = (
        names.index(column) for column in _ANSWER)
    inserted: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    plain = []
    for r in returned:
        if r[key] is not None:
            inserted[("idempotency", r[task], r[key])] = r
        elif r[schedule] is not None:
            inserted[("tick", r[schedule], r[tick])] = r
        elif r[unique] is not None:
            inserted[("unique", r[task], r[unique])] = r
        else:
            plain.append(r)
    unkeyed = iter(plain)
    jobs: list[Job | None] = []
    for row in rows:
        found: tuple[Any, ...] | None
        if not row.keyed:
            found = next(unkeyed)
        elif row.idempotency_key is not None:
            found = inserted.pop(("idempotency", row.task, row.idempotency_key), None)
        elif row.tick is not None:
            found = inserted.pop(("tick", *row.tick), None)
        else:
            found = inserted.pop(("unique", row.task, row.unique_key), None)
        if found is None:
            # A unique index refused it: the key or tick was taken before this statement, or by
            # an earlier spec of this one.
            jobs.append(_existing(row, alias))
            continue
        jobs.append(row.job({
            "id": found[id_], "status": found[status], "run_at": found[run_at],
            "deadline": found[deadline], "created_at": found[created_at],
            "updated_at": found[created_at], "created": True}, alias))
    return jobs


def _existing(row: Row, alias: str) -> Job | None:
    """The job holding the idempotency key, tick or unique key ``row`` was refused for, if any."""
    jobs = Job.objects.using(alias)
    if row.idempotency_key is not None:
        existing = jobs.filter(task=row.task, idempotency_key=row.idempotency_key).first()
    elif row.tick is not None:
        existing = jobs.filter(schedule_id=row.tick.schedule_id,
                               scheduled_at=row.tick.scheduled_at).first()
    else:
        existing = None
    if existing is None and row.unique_key is not None:
        holder = transitions.unique_key_holder(row.task, row.unique_key, row.unique_period,
                                               using=alias)
        existing = jobs.filter(pk=holder).first() if holder is not None else None
    if existing is None:
        return None  # the holder finished (or was pruned) since the INSERT: the key is free
    existing.created = False
    return existing


__all__ = [
    "KEEP_KEY", "OPTIONS", "JobSpec", "Tick", "check_nesting", "encode_payload", "enqueue",
    "enqueue_many", "replay_job", "validate",
]
