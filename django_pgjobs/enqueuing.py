"""Validate jobs and insert them in the caller's transaction.

``enqueue`` is one INSERT on the caller's connection: if the caller's transaction rolls back, the
job never existed; if it commits, the job is durable. Bad input is refused before anything is
written, with an error that names the problem.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import psycopg
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, ProgrammingError, connections, transaction
from django.db.backends.utils import CursorWrapper
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init
from django.utils import timezone

from . import sql, tracing
from .conf import checked, settings
from .exceptions import (
    InvalidJobOption,
    KeyTakenThenFreed,
    NotMigrated,
    PayloadNotJSON,
    UnknownQueue,
    UnknownTask,
)
from .models import Job
from .payloads import encode_json
from .registry import Handler, registry
from .validation import (
    DURATION_MAX_SECONDS,
    duration_problem,
    escape_control,
    nesting_problem,
    option_problem,
    queue_problem,
    seconds_of,
    shown,
    whole_number_problem,
)

OPTIONS = frozenset({
    "queue", "priority", "run_at", "delay", "idempotency_key", "unique_key", "unique_period",
    "max_attempts", "max_age", "lease", "timeout", "trace_id", "fairness_key", "payload_version",
})


class Tick(NamedTuple):
    """The tick of a schedule a job is for: the unique index holds one job per tick."""

    schedule_id: int
    scheduled_at: datetime


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue, for ``enqueue_many``.

    ``tick`` is set by the schedule step (and an operator's run-now) only: a spec whose tick
    already has a job is skipped by the statement and answered with that job.
    """

    task: str | Handler
    payload: Any
    options: Mapping[str, Any]
    tick: Tick | None = None

    @classmethod
    def of(cls, task: str | Handler, payload: Any, **options: Any) -> JobSpec:
        return cls(task, payload, options)


def enqueue(task: str | Handler, payload: Any, **options: Any) -> Job:
    """Enqueue one job in the caller's transaction and return it.

    Options: queue, priority, run_at or delay, idempotency_key, unique_key and unique_period,
    max_attempts, max_age, lease, timeout, trace_id, fairness_key, payload_version, using. A
    second enqueue with the same task and idempotency_key returns the existing job
    (``job.created`` is False) and writes nothing; so does one with the unique_key of an active
    job (or, with a unique_period, of a job of the same period).
    """
    using = options.pop("using", None)
    return enqueue_many([JobSpec(task, payload, options)], using=using)[0]


def enqueue_many(specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
    """Enqueue many jobs with one INSERT, in order; all are validated before any is written."""
    alias = _checked_alias(using)
    defaults = _Defaults.read()
    rows = _validate_all(specs, defaults)
    if not rows:
        return []
    found = tracing.tracer()
    if found is None:
        return _insert_all(rows, [None] * len(rows), alias, defaults.notify)
    with tracing.sending(found, rows) as sending:
        jobs = _insert_all(rows, sending.traceparents, alias, defaults.notify)
        sending.sent(jobs)
    return jobs


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


def validate(spec: JobSpec) -> None:
    """Check ``spec`` as ``enqueue_many`` would, sending nothing; raise ``EnqueueError``."""
    _validate(spec, _Defaults.read())


def _insert_all(
    rows: Sequence[_Row], traceparents: Sequence[str | None], alias: str, notify: bool
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
    rows: Sequence[_Row], traceparents: Sequence[str | None], alias: str, notify: bool
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


def _insert(rows: Sequence[_Row], alias: str, notify: bool) -> list[Job | None]:
    """One INSERT of ``rows``; each row's job, the one holding its key, or None if that is gone."""
    with connections[alias].cursor() as cursor:
        _read_times_with_psycopgs_loader(cursor, alias)
        if len(rows) == 1:
            [row] = rows
            cursor.execute(sql.query("enqueue_one"), {
                **dict(zip(ROW_COLUMNS, row.values, strict=True)),
                "traceparent": row.traceparent, "notify": notify})
        else:
            combinations, own = _many_rows(rows)
            columns = zip(*(c.head + c.tail for c in combinations), strict=True)
            cursor.execute(_ENQUEUE_MANY, [own, *map(list, columns), notify])
        names = _returned_names(cursor, len(rows) == 1)
        returned = cursor.fetchall()
    return _pair_with_rows(rows, returned, names, alias)


def _many_rows(rows: Sequence[_Row]) -> tuple[list[_Combination], str]:
    """The combinations of ``rows``, and each row's own values as one JSON document.

    A row is ``[combination, payload]``, then its schedule tick and traceparent when it has
    them: joining the already encoded payloads costs a fraction of quoting a text array of
    them, and the server parses the document once.
    """
    combinations: list[_Combination] = []
    numbers: dict[int, int] = {}
    parts = []
    for row in rows:
        number = numbers.get(id(row.combination))
        if number is None:
            number = numbers[id(row.combination)] = len(combinations) + 1
            combinations.append(row.combination)
        traceparent = row.traceparent
        if row.tick is None and traceparent is None:
            parts.append(f"[{number},{row.encoded}]")
        else:
            scheduled_at = row.scheduled_at
            parts.append(f"[{number},{row.encoded},{json.dumps(row.schedule_id)},"
                         f"{json.dumps(scheduled_at and scheduled_at.isoformat())},"
                         f"{json.dumps(traceparent)}]")
    return combinations, f"[{','.join(parts)}]"


def _returned_names(cursor: CursorWrapper, one: bool) -> list[str]:
    """The names of the answer's columns: the same for every execution of one statement."""
    names = _RETURNED_NAMES.get(one)
    if names is None:
        # Reading the description builds an object per column: once per statement is enough.
        names = _RETURNED_NAMES[one] = [column.name for column in cursor.description]
    return names


_RETURNED_NAMES: dict[bool, list[str]] = {}


_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(
    psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


def _read_times_with_psycopgs_loader(cursor: CursorWrapper, alias: str) -> None:
    """Read this cursor's timestamptz columns with psycopg's own loader, compiled when it is.

    Django's loader is pure Python (it pins the time zone it wants), and parsing three times
    per returned row with it was a third of the cost of reading an enqueue's rows back. Where
    psycopg's loader gives the very time zone Django's would (UTC unless the database's
    TIME_ZONE says otherwise; not at all with USE_TZ = False), the values are the same.
    """
    raw = cursor.cursor
    if connections[alias].timezone is raw.connection.info.timezone:
        raw.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)


# The statement for many jobs, with its row source (a fixed block, never a value).
_ENQUEUE_MANY = sql.query("enqueue_jobs").replace("{rows}", sql.query("enqueue_rows_many"))
# The values of a row (_Row.values), named as enqueue_jobs' row source and enqueue_one's
# parameters name them; the traceparent comes after.
ROW_COLUMNS = (
    "task", "payload_version", "queue", "payload", "priority", "run_at", "delay_seconds",
    "max_attempts", "max_age_seconds", "lease_seconds", "idempotency_key", "unique_key",
    "unique_period", "timeout_seconds", "trace_id", "fairness_key", "schedule_id",
    "scheduled_at",
)


@dataclass(frozen=True)
class _Defaults:
    """The settings enqueue needs, read once and again only after one of them changed."""

    queue: str
    queues: frozenset[str] | None
    max_attempts: int
    max_age_seconds: float
    lease_seconds: int
    max_payload_bytes: int
    max_payload_depth: int
    notify: bool
    # The (task, options) pairs checked under these settings, by _combination_key: checking
    # one again gives the same verdict, unless its handler was registered anew (``still_valid``).
    combinations: dict[Hashable, _Combination] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def read(cls) -> _Defaults:
        """The settings as they are now; read again only once one of them changed."""
        global _defaults
        if _defaults is None:
            _defaults = cls._read()
        return _defaults

    @classmethod
    def _read(cls) -> _Defaults:
        queues = checked("QUEUES")
        return cls(
            queue=checked("QUEUE"),
            queues=None if queues is None else frozenset(queues),
            max_attempts=checked("MAX_ATTEMPTS"),
            max_age_seconds=float(checked("MAX_AGE_SECONDS")),
            lease_seconds=checked("LEASE_SECONDS"),
            max_payload_bytes=checked("MAX_PAYLOAD_BYTES"),
            max_payload_depth=checked("MAX_PAYLOAD_DEPTH"),
            notify=checked("NOTIFY"),
        )


# Reading eight settings through Django's lazy settings cost a single enqueue more than its
# validation; settings change only through override_settings (tests), which says so.
_defaults: _Defaults | None = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _defaults
    if setting.startswith("PGJOBS_"):
        _defaults = None


setting_changed.connect(_on_setting_changed)


@dataclass(eq=False)
class _Row:
    """A checked spec until its INSERT answers: its combination's values and its own."""

    combination: _Combination
    payload: Any
    encoded: str  # the payload
    tick: Tick | None
    traceparent: str | None = None

    # What a unique index may refuse the row for, and what the spans of its enqueue name.
    @property
    def task(self) -> str:
        return self.combination.fields["task"]

    @property
    def queue(self) -> str:
        return self.combination.fields["queue"]

    @property
    def idempotency_key(self) -> str | None:
        return self.combination.fields["idempotency_key"]

    @property
    def unique_key(self) -> str | None:
        return self.combination.fields["unique_key"]

    @property
    def schedule_id(self) -> int | None:
        return None if self.tick is None else self.tick.schedule_id

    @property
    def scheduled_at(self) -> datetime | None:
        return None if self.tick is None else self.tick.scheduled_at

    @property
    def unique_period(self) -> float | None:
        return self.combination.period

    @property
    def values(self) -> tuple[Any, ...]:
        """The row's values in ROW_COLUMNS' order."""
        return (*self.combination.head, self.encoded, *self.combination.tail,
                self.schedule_id, self.scheduled_at)

    def job(self, answered: dict[str, Any], alias: str) -> Job:
        """The job this row became: ``answered`` holds what its INSERT returned."""
        answered["payload"] = self.payload
        answered["traceparent"] = self.traceparent
        answered["schedule_id"] = self.schedule_id
        answered["scheduled_at"] = self.scheduled_at
        return self.combination.new_job(answered, alias)


# Option values whose equality means the same verdict: a (task, options) pair made of these
# only is checked once per call. Types are compared too, so priority=True (refused) never
# borrows the verdict of priority=1, which it equals.
_PLAIN_OPTION_TYPES = frozenset({str, int, float, bool, type(None), timedelta, datetime})


def _validate_all(specs: Iterable[JobSpec], defaults: _Defaults) -> list[_Row]:
    """Each spec's row; a (task, options) pair seen before is not checked again.

    Bulk calls repeat one task and options with different payloads, so only the payload and
    the tick are checked per spec. A spec that is refused is refused with the same error as
    when checked alone: pairs are remembered only once they have passed. Single enqueues
    repeat them too, call after call: ``defaults`` keeps the pairs that passed until a setting
    changes, and a kept pair's jobs are copies of one built before (``_Combination.new_job``).
    """
    remembered = defaults.combinations
    if remembered and (pre_init.has_listeners(Job) or post_init.has_listeners(Job)):
        # A receiver of Job's init signals, connected since: its jobs are built, never copied.
        remembered.clear()
    passed: dict[Hashable, _Combination] = {}
    rows = []
    for spec in specs:
        key = _combination_key(spec)
        if key is None:
            rows.append(_validate(spec, defaults))
            continue
        combination = passed.get(key)
        if combination is None:
            combination = remembered.get(key)
            if combination is None or not combination.still_valid(spec):
                combination = _Combination.of(spec, defaults)
                if combination.lasts:
                    if len(remembered) >= _REMEMBERED_COMBINATIONS:
                        remembered.clear()  # keys that vary call by call (idempotency keys)
                    remembered[key] = combination
            passed[key] = combination
        rows.append(combination.row(spec, defaults))
    return rows


# Enough for the tasks and option sets one process enqueues; more means keys that churn.
_REMEMBERED_COMBINATIONS = 256


def _validate(spec: JobSpec, defaults: _Defaults) -> _Row:
    return _Combination.of(spec, defaults).row(spec, defaults)


def _combination_key(spec: Any) -> Hashable | None:
    """What ``spec`` shares with others of the same task and options, or None if unsure."""
    if not isinstance(spec, JobSpec) or not isinstance(spec.task, str | Handler):
        return None
    options = spec.options
    if type(options) is dict and not options:
        return spec.task, ()
    if not isinstance(options, dict) or not all(
            type(value) in _PLAIN_OPTION_TYPES for value in options.values()):
        return None
    return spec.task, tuple((name, type(value), value) for name, value in options.items())


@dataclass
class _Combination:
    """What every spec of one task and options shares: checked once, copied into each row."""

    fields: dict[str, Any]  # of its jobs; the payload and the tick are None
    # The values of a row before and after the payload, and the unique period.
    head: tuple[Any, ...]
    tail: tuple[Any, ...]
    period: float | None
    # The handler it was checked against; its verdict stands while that one is registered.
    handler: Handler | None = None
    # Whether to keep it past this call: one with an absolute run_at, which its check compares
    # with the clock, is seldom enqueued again.
    lasts: bool = False
    # The job the second and later jobs are copied from, in this call or a later one.
    prototype: Job | None = None
    built: int = 0

    def still_valid(self, spec: JobSpec) -> bool:
        """Whether this pair's verdict holds for ``spec`` (same key): its handler is current."""
        task = spec.task
        current = task if isinstance(task, Handler) else registry.resolve(task, may_import=False)
        return current is self.handler

    @property
    def keyed(self) -> bool:
        """Whether a unique index may refuse its jobs for a key of theirs."""
        return self.fields["idempotency_key"] is not None or self.fields["unique_key"] is not None

    @classmethod
    def of(cls, spec: JobSpec, defaults: _Defaults) -> _Combination:
        """Check ``spec`` but its payload; raise ``EnqueueError``."""
        if not isinstance(spec, JobSpec):
            raise InvalidJobOption(
                f"enqueue_many takes JobSpec objects (JobSpec.of(task, payload, **options)), "
                f"got {type(spec).__name__}"
            )
        opts = dict(spec.options)
        if "using" in opts:
            raise InvalidJobOption(
                "a JobSpec cannot choose its database: enqueue_many writes every spec in one "
                "statement, so pass using= to enqueue_many"
            )
        unknown = sorted(escape_control(str(k)) for k in opts if k not in OPTIONS)
        if unknown:
            raise InvalidJobOption(f"unknown enqueue option(s): {', '.join(unknown)}")
        handler = _resolve_handler(spec.task)
        name = handler.name
        payload_version = opts.get("payload_version", handler.version)
        queue = _first(opts.get("queue"), handler.queue, defaults.queue)
        priority = opts.get("priority", handler.priority)
        run_at = opts.get("run_at")
        delay = opts.get("delay")
        key = opts.get("idempotency_key")
        unique_key = opts.get("unique_key")
        unique_period = opts.get("unique_period")
        timeout = _first(opts.get("timeout"), handler.timeout)
        max_attempts = _first(opts.get("max_attempts"), handler.max_attempts,
                              defaults.max_attempts)
        max_age = _first(opts.get("max_age"), handler.max_age)
        lease = _first(opts.get("lease"), handler.lease)
        trace_id = opts.get("trace_id")
        fairness_key = opts.get("fairness_key")
        _checked_tick(spec.tick)  # before the options, as a spec checked alone always was

        _check_options(defaults, queue, priority, max_attempts, payload_version, lease, max_age,
                       key, unique_key, unique_period, timeout, trace_id, fairness_key)
        if payload_version > handler.version:
            # Workers run a payload only up to their handler's version and hold a newer one
            # back for a newer deploy: this code has none, so the job might wait for ever.
            raise InvalidJobOption(
                f"payload_version {payload_version} is newer than the handler of {name!r} "
                f"here (version {handler.version}): no worker running this code could run the "
                "job, which would wait for a newer deploy; enqueue it from code whose handler "
                f"has version {payload_version}, or leave payload_version out")
        max_age_seconds = seconds_of(max_age) if max_age is not None else defaults.max_age_seconds
        assert max_age_seconds is not None
        delay_seconds = _due_in(run_at, delay, max_age_seconds)
        lease_seconds = defaults.lease_seconds if lease is None else _whole_seconds(lease)
        timeout_seconds = seconds_of(timeout) if timeout is not None else None
        trace_id = trace_id or ""
        period = seconds_of(unique_period) if unique_period is not None else None
        fields = dict(
            task=name,
            payload_version=payload_version,
            queue=queue,
            payload=None,
            priority=priority,
            base_priority=priority,
            attempts=0,
            max_attempts=max_attempts,
            snoozes=0,
            lease_seconds=lease_seconds,
            idempotency_key=key,
            unique_key=unique_key,
            timeout_seconds=timeout_seconds,
            trace_id=trace_id,
            fairness_key=fairness_key,
            schedule_id=None,
            scheduled_at=None,
        )
        return cls(
            fields,
            *_split_row({
                "task": name, "payload_version": payload_version, "queue": queue,
                "priority": priority, "run_at": run_at, "delay_seconds": delay_seconds,
                "max_attempts": max_attempts, "max_age_seconds": max_age_seconds,
                "lease_seconds": lease_seconds, "idempotency_key": key, "unique_key": unique_key,
                "unique_period": period, "timeout_seconds": timeout_seconds,
                "trace_id": trace_id, "fairness_key": fairness_key,
            }),
            period=period,
            handler=handler,
            lasts=run_at is None,
        )

    def row(self, spec: JobSpec, defaults: _Defaults) -> _Row:
        """The row of ``spec``, one of this combination; check its tick and payload."""
        tick = _checked_tick(spec.tick)
        encoded = encode_json(spec.payload, limit=defaults.max_payload_bytes,
                              max_depth=defaults.max_payload_depth)
        return _Row(self, spec.payload, encoded, tick)

    def new_job(self, own: dict[str, Any], alias: str) -> Job:
        """A job of this combination, saved in ``alias``, with ``own`` attribute values.

        ``Model.__init__`` per job was the largest cost of a bulk enqueue; a copy of its result
        is the same object: every field set (a missing one would be deferred, fetched on
        access) and a state of its own.
        """
        self.built += 1
        # Receivers of Job's init signals get one call per job: then no job is a copy.
        if self.built > 1 and self.prototype is None and not (
                pre_init.has_listeners(Job) or post_init.has_listeners(Job)):
            self.prototype = Job(**self.fields)
        fields = self.fields
        if self.prototype is None:
            job = Job(**{name: own.get(name, fields[name]) for name in fields})
            job.__dict__.update(own)
        else:
            job = Job.__new__(Job)
            # A field's attribute is a plain instance attribute, as Model.__init__ sets it.
            attributes = self.prototype.__dict__.copy()
            attributes.update(own)
            job.__dict__ = attributes
            job._state = ModelState()
        job._state.adding = False
        job._state.db = alias
        return job


# A row's own values among the shared ones: its payload, and its tick, the last two columns.
_PAYLOAD_AT = ROW_COLUMNS.index("payload")
_TICK_AT = ROW_COLUMNS.index("schedule_id")


def _split_row(shared: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The values before and after the payload, in ROW_COLUMNS' order, from their names."""
    return (tuple(shared[c] for c in ROW_COLUMNS[:_PAYLOAD_AT]),
            tuple(shared[c] for c in ROW_COLUMNS[_PAYLOAD_AT + 1:_TICK_AT]))


def _check_options(
    defaults: _Defaults, queue: Any, priority: Any, max_attempts: Any, payload_version: Any,
    lease: Any, max_age: Any, key: Any, unique_key: Any, unique_period: Any, timeout: Any,
    trace_id: Any, fairness_key: Any,
) -> None:
    problem = queue_problem(queue)
    if problem is not None:
        raise UnknownQueue(f"queue {problem}")
    if defaults.queues is not None and queue not in defaults.queues:
        raise UnknownQueue(
            f"unknown queue {queue!r}: PGJOBS_QUEUES declares {', '.join(sorted(defaults.queues))}"
        )
    # Each rule is validation.OPTION_RULES'; an option that is None takes its default, except
    # these three, which always have a value by now.
    for option, value in (("priority", priority), ("max_attempts", max_attempts),
                          ("payload_version", payload_version)):
        _check(option_problem(option, value))
    for option, value in (("lease", lease), ("max_age", max_age), ("idempotency_key", key),
                          ("unique_key", unique_key), ("unique_period", unique_period)):
        if value is not None:
            _check(option_problem(option, value))
    if unique_period is not None and unique_key is None:
        raise InvalidJobOption("unique_period needs a unique_key (the key it makes unique)")
    for option, value in (("timeout", timeout), ("trace_id", trace_id),
                          ("fairness_key", fairness_key)):
        if value is not None:
            _check(option_problem(option, value))


def _checked_tick(tick: Any) -> Tick | None:
    if tick is None:
        return None
    if (not isinstance(tick, Tick) or whole_number_problem(tick.schedule_id, 1, 2**63 - 1)
            or not isinstance(tick.scheduled_at, datetime) or timezone.is_naive(tick.scheduled_at)):
        raise InvalidJobOption(
            f"tick must be a Tick(schedule_id, aware scheduled_at), got {shown(tick, 80)}"
        )
    return tick


def _check(problem: str | None) -> None:
    if problem is not None:
        raise InvalidJobOption(problem)


def _due_in(run_at: Any, delay: Any, max_age_seconds: float) -> float:
    """Seconds from now until the job is due; refuse a time at or past the job's deadline."""
    if run_at is not None and delay is not None:
        raise InvalidJobOption("give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobOption(f"run_at must be a datetime, not {type(run_at).__name__}")
        if timezone.is_naive(run_at):
            raise InvalidJobOption(
                "run_at is a naive datetime; give an aware one (e.g. django.utils.timezone.now())"
            )
        due_in = (run_at - timezone.now()).total_seconds()
        what = f"run_at {run_at.isoformat()}"
    elif delay is not None:
        problem = duration_problem(delay, 0, DURATION_MAX_SECONDS)
        _check(problem and f"delay {problem}")
        due_in = seconds_of(delay) or 0.0
        what = f"delay of {due_in:g}s"
    else:
        return 0.0
    if due_in >= max_age_seconds:
        # The job would be due at or after its deadline: it could only ever die unrun.
        raise InvalidJobOption(
            f"{what} is at or after the job's deadline ({max_age_seconds:g}s after enqueue, "
            "its max_age): it could never run; give a longer max_age or an earlier time"
        )
    return 0.0 if run_at is not None else due_in


def _whole_seconds(lease: Any) -> int:
    seconds = seconds_of(lease)
    assert seconds is not None  # checked by duration_problem
    return -int(-seconds // 1)  # whole seconds, rounded up


def _first(*values: Any) -> Any:
    """The first value that is not None (0 and empty values count: they are errors to report)."""
    return next((v for v in values if v is not None), None)


def _resolve_handler(task: str | Handler) -> Handler:
    if isinstance(task, Handler):
        return task
    if not isinstance(task, str):
        raise InvalidJobOption(f"task must be a task name or a handler, not {type(task).__name__}")
    handler = registry.resolve(task, may_import=False)
    if handler is None:
        raise UnknownTask(task)
    return handler


def check_nesting(value: Any, *, root: str = "payload") -> None:
    """Refuse ``value`` if nested deeper than PGJOBS_MAX_PAYLOAD_DEPTH; raise ``PayloadNotJSON``.

    For code that walks a value recursively before it is encoded, as django.tasks'
    ``normalize_json`` does: this walk keeps its own stack, so an argument 10,000 levels deep
    is refused by the depth rule, not by Python's recursion limit. Mappings and sequences other
    than text count as levels, as that walk takes them.
    """
    max_depth = _Defaults.read().max_payload_depth
    stack: list[tuple[Any, int, str]] = [(value, 0, root)]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[tuple[Any, Any]] = item.items()
        elif isinstance(item, Sequence) and not isinstance(item, str | bytes | bytearray):
            children = enumerate(item)
        else:
            continue
        if depth >= max_depth:
            raise PayloadNotJSON(path, nesting_problem(max_depth))
        for key, child in children:
            # Named by the first level only: a full path 10,000 levels long helps no reader.
            stack.append((child, depth + 1, f"{root}[{key!r}]" if depth == 0 else path))


def encode_payload(payload: Any, *, limit: int | None = None) -> str:
    """``payload`` as JSON text, or say which key is not JSON or that it is too large."""
    return encode_json(
        payload, limit=settings.MAX_PAYLOAD_BYTES if limit is None else limit,
        max_depth=settings.MAX_PAYLOAD_DEPTH,
    )


# The columns of the INSERT's answer that pair a returned row with its job and fill that job.
_ANSWER = ("id", "task", "idempotency_key", "unique_key", "schedule_id", "scheduled_at",
           "status", "run_at", "deadline", "created_at")


def _pair_with_rows(
    rows: Sequence[_Row], returned: list[tuple[Any, ...]], names: list[str], alias: str
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
        if row.tick is None and not row.combination.keyed:
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


def _existing(row: _Row, alias: str) -> Job | None:
    """The job holding the idempotency key, tick or unique key ``row`` was refused for, if any."""
    if row.idempotency_key is not None:
        existing = Job.objects.using(alias).filter(
            task=row.task, idempotency_key=row.idempotency_key).first()
    elif row.tick is not None:
        existing = Job.objects.using(alias).filter(
            schedule_id=row.tick.schedule_id, scheduled_at=row.tick.scheduled_at).first()
    else:
        existing = None
    if existing is None and row.unique_key is not None:
        with connections[alias].cursor() as cursor:
            cursor.execute(sql.query("existing_unique_job"), {
                "task": row.task, "key": row.unique_key, "period": row.unique_period})
            found = cursor.fetchone()
        existing = Job.objects.using(alias).filter(pk=found[0]).first() if found else None
    if existing is None:
        return None  # the holder finished (or was pruned) since the INSERT: the key is free
    existing.created = False  # type: ignore[attr-defined]
    return existing


__all__ = [
    "JobSpec", "Tick", "check_nesting", "encode_payload", "enqueue", "enqueue_many", "validate",
]
