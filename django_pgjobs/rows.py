"""Checked specs as the rows an INSERT takes, and its answers as jobs.

Bulk calls repeat one task and options with different payloads, and single enqueues repeat them
call after call. So a (task, options) pair is checked once (``Combination``): its row values are
kept, and the jobs it becomes are copies of one ``Job`` built once. Only the payload and the
tick are checked per spec (``Row``).
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .exceptions import InvalidJobOption
from .limits import Rate
from .models import Job
from .options import Checked, Defaults, JobSpec, Tick, check_options, checked_tick
from .payloads import encode_json
from .registry import Handler, registry

# The values of a row (``Row.values``), named as the INSERT's row source and the one-job
# INSERT's parameters name them (``sql/jobs.sql``); the traceparent comes after.
ROW_COLUMNS = (
    "task", "payload_version", "queue", "payload", "priority", "run_at", "delay_seconds",
    "max_attempts", "max_age_seconds", "lease_seconds", "idempotency_key", "unique_key",
    "unique_period", "timeout_seconds", "trace_id", "fairness_key", "limit_max", "rate_interval",
    "rate_burst", "schedule_id", "scheduled_at", "limit_key", "rate_weight",
)
# A row's own values among the shared ones: its payload, and from its tick on, the last four
# columns (its tick, its limit key and its weight under a rate).
_PAYLOAD_AT = ROW_COLUMNS.index("payload")
_OWN = frozenset({"payload", "schedule_id", "scheduled_at", "limit_key", "rate_weight"})
_TICK_AT = ROW_COLUMNS.index("schedule_id")


class StoredPayload(NamedTuple):
    """A payload as a row held it (a replay's): stored again as it is, not typed or sealed."""

    value: Any


@dataclass(eq=False)
class Row:
    """A checked spec until its INSERT answers: its combination's values and its own."""

    combination: Combination
    payload: Any
    encoded: str  # the payload
    tick: Tick | None
    limit_key: str | None = None
    rate_weight: int | None = None
    traceparent: str | None = None
    # A workflow's job: its count of dependencies, whether jobs depend on it, its workflow id.
    graph: tuple[int, bool, str] | None = None

    # What a unique index may refuse the row for, and what the spans of its enqueue name.
    @property
    def task(self) -> str:
        return self.combination.checked.task

    @property
    def queue(self) -> str:
        return self.combination.checked.queue

    @property
    def idempotency_key(self) -> str | None:
        return self.combination.checked.idempotency_key

    @property
    def unique_key(self) -> str | None:
        return self.combination.checked.unique_key

    @property
    def unique_period(self) -> float | None:
        return self.combination.checked.unique_period

    @property
    def schedule_id(self) -> int | None:
        return None if self.tick is None else self.tick.schedule_id

    @property
    def scheduled_at(self) -> datetime | None:
        return None if self.tick is None else self.tick.scheduled_at

    @property
    def keyed(self) -> bool:
        """Whether a unique index may refuse it: it has an idempotency key, a unique key or a
        schedule tick."""
        return self.tick is not None or self.combination.keyed

    @property
    def values(self) -> tuple[Any, ...]:
        """The row's values in ROW_COLUMNS' order."""
        return (*self.combination.head, self.encoded, *self.combination.tail,
                self.schedule_id, self.scheduled_at, self.limit_key, self.rate_weight)

    def job(self, answered: dict[str, Any], alias: str) -> Job:
        """The job this row became: ``answered`` holds what its INSERT returned."""
        answered["payload"] = self.payload
        answered["traceparent"] = self.traceparent
        answered["schedule_id"] = self.schedule_id
        answered["scheduled_at"] = self.scheduled_at
        answered["limit_key"] = self.limit_key
        answered["rate_weight"] = self.rate_weight
        if self.graph is not None:
            answered["pending_dependencies"] = self.graph[0] or None
            answered["has_dependents"] = self.graph[1]
            answered["workflow_id"] = uuid.UUID(self.graph[2])
        return self.combination.new_job(answered, alias)


def rows_of(specs: Iterable[JobSpec], defaults: Defaults) -> list[Row]:
    """Each spec's row; a (task, options) pair seen before is not checked again.

    A spec that is refused is refused with the same error as when checked alone: pairs are
    remembered only once they have passed, until a setting changes.
    """
    global _remembered_under
    if _remembered_under is not defaults or (_remembered and (
            pre_init.has_listeners(Job) or post_init.has_listeners(Job))):
        # New settings; or a receiver of Job's init signals, connected since: its jobs are
        # built, never copied.
        _remembered.clear()
        _remembered_under = defaults
    passed: dict[Hashable, Combination] = {}
    rows = []
    for spec in specs:
        key = _combination_key(spec)
        if key is None:
            rows.append(Combination.of(spec, defaults).row(spec, defaults))
            continue
        combination = passed.get(key)
        if combination is None:
            combination = _remembered.get(key)
            if combination is None or not combination.still_valid(spec):
                combination = Combination.of(spec, defaults)
                if combination.lasts:
                    if len(_remembered) >= _REMEMBERED_COMBINATIONS:
                        _remembered.clear()  # keys that vary call by call (idempotency keys)
                    _remembered[key] = combination
            passed[key] = combination
        rows.append(combination.row(spec, defaults))
    return rows


# The pairs that passed under the settings ``_remembered_under`` holds, by _combination_key:
# checking one again gives the same verdict, unless its handler was registered anew.
_remembered: dict[Hashable, Combination] = {}
_remembered_under: Defaults | None = None
# Enough for the tasks and option sets one process enqueues; more means keys that churn.
_REMEMBERED_COMBINATIONS = 256
# Option values whose equality means the same verdict: a (task, options) pair made of these
# only is checked once per call. Types are compared too, so priority=True (refused) never
# borrows the verdict of priority=1, which it equals.
_PLAIN_OPTION_TYPES = frozenset({str, int, float, bool, type(None), timedelta, datetime})


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
class Combination:
    """What every spec of one task and options shares: checked once, copied into each row."""

    checked: Checked
    # The values of a row before and after the payload, in ROW_COLUMNS' order.
    head: tuple[Any, ...]
    tail: tuple[Any, ...]
    # The job the second and later jobs are copied from, in this call or a later one.
    prototype: Job | None = None
    built: int = 0

    @classmethod
    def of(cls, spec: JobSpec, defaults: Defaults) -> Combination:
        """Check ``spec`` but its payload; raise ``EnqueueError``."""
        if not isinstance(spec, JobSpec):
            raise InvalidJobOption(
                f"enqueue_many takes JobSpec objects (JobSpec.of(task, payload, **options)), "
                f"got {type(spec).__name__}"
            )
        checked = check_options(spec.task, dict(spec.options), spec.tick, defaults)
        shared = {name: getattr(checked, name) for name in ROW_COLUMNS
                  if name not in _OWN}
        return cls(checked,
                   tuple(shared[c] for c in ROW_COLUMNS[:_PAYLOAD_AT]),
                   tuple(shared[c] for c in ROW_COLUMNS[_PAYLOAD_AT + 1:_TICK_AT]))

    @property
    def lasts(self) -> bool:
        """Whether to keep it past this call: one with an absolute run_at, which its check
        compares with the clock, is seldom enqueued again."""
        return self.checked.run_at is None

    @property
    def keyed(self) -> bool:
        """Whether a unique index may refuse its jobs for a key of theirs."""
        return self.checked.idempotency_key is not None or self.checked.unique_key is not None

    def still_valid(self, spec: JobSpec) -> bool:
        """Whether this pair's verdict holds for ``spec`` (same key): its handler is current."""
        task = spec.task
        current = task if isinstance(task, Handler) else registry.resolve(task, may_import=False)
        return current is self.checked.handler

    def row(self, spec: JobSpec, defaults: Defaults) -> Row:
        """The row of ``spec``, one of this combination; check its tick and payload."""
        tick = checked_tick(spec.tick)
        checked = self.checked
        handler = checked.handler
        payload = plain = spec.payload
        if type(payload) is StoredPayload:
            # Fields declared encrypted since the original was enqueued are sealed now.
            payload = plain = payload.value
            if handler.encrypted:
                payload = handler.sealed(payload, stored=True)
        elif handler.shapes_payload:
            # A limit's key function is given the JSON form, not the ciphertext.
            plain = handler.plain_payload(payload, checked.payload_version)
            payload = handler.sealed(plain)
        encoded = encode_json(payload, limit=defaults.max_payload_bytes,
                              max_depth=defaults.max_payload_depth)
        limit = handler.limit
        if limit is None:
            return Row(self, payload, encoded, tick)
        limit_key = limit.key_of(checked.task, plain, checked.fairness_key, checked.queue)
        weight = limit.weight_of(checked.task, plain) if isinstance(limit, Rate) else None
        return Row(self, payload, encoded, tick, limit_key, weight)

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
            self.prototype = Job(**self._fields())
        if self.prototype is None:
            fields = self._fields()
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

    def _fields(self) -> dict[str, Any]:
        """The fields its jobs share; the payload and the tick are None."""
        checked = self.checked
        return dict(
            task=checked.task, payload_version=checked.payload_version, queue=checked.queue,
            payload=None, priority=checked.priority, base_priority=checked.priority, attempts=0,
            max_attempts=checked.max_attempts, snoozes=0, lease_seconds=checked.lease_seconds,
            idempotency_key=checked.idempotency_key, unique_key=checked.unique_key,
            timeout_seconds=checked.timeout_seconds, trace_id=checked.trace_id,
            fairness_key=checked.fairness_key, schedule_id=None, scheduled_at=None,
            limit_key=None, limit_max=checked.limit_max, limit_slot=None,
            rate_interval=checked.rate_interval, rate_burst=checked.rate_burst, rate_weight=None,
        )


__all__ = ["ROW_COLUMNS", "Combination", "Row", "StoredPayload", "rows_of"]
