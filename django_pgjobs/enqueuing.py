"""Validate jobs and insert them in the caller's transaction.

``enqueue`` is one INSERT on the caller's connection: if the caller's transaction rolls back, the
job never existed; if it commits, the job is durable. Bad input is refused before anything is
written, with an error that names the problem.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from . import sql
from .conf import settings
from .exceptions import (
    InvalidJobOption,
    PayloadNotJSON,
    PayloadTooLarge,
    UnknownQueue,
    UnknownTask,
)
from .models import PRIORITY_MAX, PRIORITY_MIN, Job
from .registry import Handler, registry

_QUEUE_MAX_LENGTH = 64
_KEY_MAX_LENGTH = 255
_TRACE_MAX_LENGTH = 64


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue, for ``enqueue_many``."""

    task: str | Handler
    payload: Any
    options: Mapping[str, Any]

    @classmethod
    def of(cls, task: str | Handler, payload: Any, **options: Any) -> JobSpec:
        return cls(task, payload, options)


def enqueue(task: str | Handler, payload: Any, **options: Any) -> Job:
    """Enqueue one job in the caller's transaction and return it.

    Options: queue, priority, run_at or delay, idempotency_key, max_attempts, max_age, lease,
    trace_id, fairness_key, payload_version, using. A second enqueue with the same task and
    idempotency_key returns the existing job (``job.created`` is False) and writes nothing.
    """
    return enqueue_many([JobSpec(task, payload, options)], using=options.get("using"))[0]


def enqueue_many(specs: Iterable[JobSpec], *, using: str | None = None) -> list[Job]:
    """Enqueue many jobs with one INSERT, in order; all are validated before any is written."""
    defaults = _Defaults.read()
    rows = [_validate(spec, defaults) for spec in specs]
    if not rows:
        return []
    alias = using or DEFAULT_DB_ALIAS
    with connections[alias].cursor() as cursor:
        if len(rows) == 1:
            cursor.execute(_enqueue_sql("enqueue_rows_one"), [*rows[0].values, defaults.notify])
        else:
            columns = zip(*(row.values for row in rows), strict=True)
            cursor.execute(
                _enqueue_sql("enqueue_rows_many"), [*map(list, columns), defaults.notify]
            )
        returned = cursor.fetchall()
    return _pair_with_rows(rows, returned, alias)


@cache
def _enqueue_sql(rows: str) -> str:
    """The enqueue statement with one of its two row sources (a fixed block, never a value)."""
    return sql.query("enqueue_jobs").replace("{rows}", sql.query(rows))


@dataclass(frozen=True)
class _Defaults:
    """The settings enqueue needs, read once per call rather than once per job."""

    queue: str
    queues: frozenset[str] | None
    max_attempts: int
    max_age_seconds: float
    lease_seconds: int
    max_payload_bytes: int
    notify: bool

    @classmethod
    def read(cls) -> _Defaults:
        queues = settings.QUEUES
        return cls(
            queue=settings.QUEUE,
            queues=None if queues is None else frozenset(queues),
            max_attempts=settings.MAX_ATTEMPTS,
            max_age_seconds=float(settings.MAX_AGE_SECONDS),
            lease_seconds=settings.LEASE_SECONDS,
            max_payload_bytes=settings.MAX_PAYLOAD_BYTES,
            notify=bool(settings.NOTIFY),
        )


@dataclass
class _Row:
    job: Job
    values: tuple[Any, ...]


def _validate(spec: JobSpec, defaults: _Defaults) -> _Row:
    opts = dict(spec.options)
    opts.pop("using", None)
    handler = _resolve_handler(spec.task)
    name = handler.name if handler is not None else str(spec.task)
    payload_version = opts.pop("payload_version", handler.version if handler else 1)
    queue = _first(opts.pop("queue", None), handler and handler.queue, defaults.queue)
    priority = opts.pop("priority", handler.priority if handler else 0)
    run_at = opts.pop("run_at", None)
    delay = opts.pop("delay", None)
    key = opts.pop("idempotency_key", None)
    max_attempts = _first(opts.pop("max_attempts", None), handler and handler.max_attempts,
                          defaults.max_attempts)
    max_age = _first(opts.pop("max_age", None), handler and handler.max_age)
    lease = _first(opts.pop("lease", None), handler and handler.lease)
    trace_id = opts.pop("trace_id", "") or ""
    fairness_key = opts.pop("fairness_key", None)
    if opts:
        raise InvalidJobOption(f"unknown enqueue option(s): {', '.join(sorted(opts))}")

    _check_queue(queue, defaults.queues)
    _check_int("priority", priority, PRIORITY_MIN, PRIORITY_MAX)
    _check_int("max_attempts", max_attempts, 1, 1_000_000)
    _check_int("payload_version", payload_version, 1, 32767)
    if run_at is not None and delay is not None:
        raise InvalidJobOption("give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobOption(f"run_at must be a datetime, not {type(run_at).__name__}")
        if timezone.is_naive(run_at):
            raise InvalidJobOption(
                "run_at is a naive datetime; give an aware one (e.g. django.utils.timezone.now())"
            )
    delay_seconds = _seconds("delay", delay, allow_zero=True) if delay is not None else 0.0
    max_age_seconds = (
        _seconds("max_age", max_age) if max_age is not None else defaults.max_age_seconds
    )
    lease_seconds = (
        math.ceil(_seconds("lease", lease)) if lease is not None else defaults.lease_seconds
    )
    _check_int("lease", lease_seconds, 1, 7 * 24 * 3600)
    _check_text("idempotency_key", key, _KEY_MAX_LENGTH, optional=True)
    _check_text("trace_id", trace_id, _TRACE_MAX_LENGTH, optional=False)
    _check_text("fairness_key", fairness_key, 200, optional=True)

    encoded = encode_payload(spec.payload, limit=defaults.max_payload_bytes)
    job = Job(
        task=name,
        payload_version=payload_version,
        queue=queue,
        payload=spec.payload,
        priority=priority,
        base_priority=priority,
        attempts=0,
        max_attempts=max_attempts,
        snoozes=0,
        lease_seconds=lease_seconds,
        idempotency_key=key,
        trace_id=trace_id,
        fairness_key=fairness_key,
    )
    values = (
        name, payload_version, queue, encoded, priority, run_at, delay_seconds, max_attempts,
        max_age_seconds, lease_seconds, key, trace_id, fairness_key,
    )
    return _Row(job, values)


def _first(*values: Any) -> Any:
    """The first value that is not None (0 and empty values count: they are errors to report)."""
    return next((v for v in values if v is not None), None)


def _resolve_handler(task: str | Handler) -> Handler | None:
    if isinstance(task, Handler):
        return task
    if not isinstance(task, str):
        raise InvalidJobOption(f"task must be a task name or a handler, not {type(task).__name__}")
    handler = registry.get(task)
    if handler is None:
        raise UnknownTask(task)
    return handler


def _check_queue(queue: Any, declared: frozenset[str] | None) -> None:
    if not isinstance(queue, str) or not queue or len(queue) > _QUEUE_MAX_LENGTH:
        raise UnknownQueue(
            f"queue must be a non-empty name of at most {_QUEUE_MAX_LENGTH} characters"
        )
    if declared is not None and queue not in declared:
        raise UnknownQueue(
            f"unknown queue {queue!r}: PGJOBS_QUEUES declares {', '.join(sorted(declared))}"
        )


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidJobOption(f"{name} must be a whole number from {low} to {high}, got {value!r}")


def _check_text(name: str, value: Any, limit: int, *, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or len(value) > limit or (optional and not value):
        raise InvalidJobOption(f"{name} must be a non-empty string of at most {limit} characters")


def _seconds(name: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidJobOption(f"{name} must be a timedelta or a number of seconds")
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidJobOption(f"{name} must be {'>= 0' if allow_zero else '> 0'} seconds")
    return seconds


def encode_payload(payload: Any, *, limit: int | None = None) -> str:
    """Return ``payload`` as JSON text, or say which key is not JSON or that it is too large."""
    _check_json(payload, "payload")
    encoded = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    size = len(encoded.encode("utf-8"))
    if limit is None:
        limit = settings.MAX_PAYLOAD_BYTES
    if size > limit:
        raise PayloadTooLarge(size, limit)
    return encoded


def _check_json(value: Any, path: str) -> None:
    # Stricter than json.dumps: it would turn tuples into lists and int keys into strings, so
    # the handler would get back something other than what was enqueued.
    if isinstance(value, str):
        if "\x00" in value:
            raise PayloadNotJSON(path, "contains a NUL character, which PostgreSQL cannot store")
        return
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadNotJSON(path, f"{value!r} is not a finite number")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadNotJSON(path, f"key {key!r} is a {type(key).__name__}, not a string")
            if "\x00" in key:
                raise PayloadNotJSON(path, f"key {key!r} contains a NUL character")
            _check_json(item, f"{path}[{key!r}]")
        return
    raise PayloadNotJSON(path, f"{type(value).__name__} is not JSON (use str, int, float, "
                         "bool, None, list or dict)")


def _pair_with_rows(rows: Sequence[_Row], returned: list[tuple[Any, ...]], alias: str) -> list[Job]:
    by_key = {r[1]: r for r in returned if r[1] is not None}
    unkeyed = iter(r for r in returned if r[1] is None)
    jobs: list[Job] = []
    claimed_keys: set[str] = set()
    for row in rows:
        job = row.job
        key = job.idempotency_key
        found = by_key.get(key) if key is not None and key not in claimed_keys else None
        if key is not None and found is None:
            existing = Job.objects.using(alias).get(task=job.task, idempotency_key=key)
            existing.created = False  # type: ignore[attr-defined]
            jobs.append(existing)
            continue
        if found is None:
            found = next(unkeyed)
        else:
            claimed_keys.add(key)  # type: ignore[arg-type]
        job.id, _, job.status, job.run_at, job.deadline, job.created_at = found[:6]
        job.updated_at = job.created_at
        job._state.adding = False
        job._state.db = alias
        job.created = True  # type: ignore[attr-defined]
        jobs.append(job)
    return jobs


__all__ = ["JobSpec", "encode_payload", "enqueue", "enqueue_many"]
