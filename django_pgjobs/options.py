"""What an enqueue's options mean: each one checked, defaults filled in, before any SQL.

``check_options`` turns a task and the options given for it into ``Checked``: every value a
job row takes from them, or an ``EnqueueError`` that names the option. The rules themselves
are ``validation``'s (``OPTION_RULES``), the ones ``@job`` checks at declaration; this module
decides which default applies and which options go together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.core.signals import setting_changed
from django.utils import timezone

from .conf import checked, settings
from .exceptions import InvalidJobOption, PayloadNotJSON, UnknownQueue, UnknownTask
from .limits import Limit, Rate
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
    # The jobs this one waits for (docs/workflows.md): JobSpecs of the same enqueue_many call,
    # saved Jobs or job ids, each alone (it must succeed) or in an ``After``.
    after: tuple[Any, ...] = ()

    @classmethod
    def of(cls, task: str | Handler, payload: Any, *, after: Iterable[Any] = (),
           **options: Any) -> JobSpec:
        # A lone string is one wrong entry (refused by name), not a list of its characters.
        return cls(task, payload, options,
                   after=(after,) if isinstance(after, str | bytes) else tuple(after))


@dataclass(frozen=True)
class Defaults:
    """The settings enqueue needs, read once and again only after one of them changed."""

    queue: str
    queues: frozenset[str] | None
    max_attempts: int
    max_age_seconds: float
    lease_seconds: int
    max_payload_bytes: int
    max_payload_depth: int
    notify: bool

    @classmethod
    def read(cls) -> Defaults:
        """The settings as they are now; read again only once one of them changed."""
        global _defaults
        if _defaults is None:
            queues = checked("QUEUES")
            _defaults = cls(
                queue=checked("QUEUE"),
                queues=None if queues is None else frozenset(queues),
                max_attempts=checked("MAX_ATTEMPTS"),
                max_age_seconds=float(checked("MAX_AGE_SECONDS")),
                lease_seconds=checked("LEASE_SECONDS"),
                max_payload_bytes=checked("MAX_PAYLOAD_BYTES"),
                max_payload_depth=checked("MAX_PAYLOAD_DEPTH"),
                notify=checked("NOTIFY"),
            )
        return _defaults


# Reading eight settings through Django's lazy settings cost a single enqueue more than its
# validation; settings change only through override_settings (tests), which says so.
_defaults: Defaults | None = None


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _defaults
    if setting.startswith("PGJOBS_"):
        _defaults = None


setting_changed.connect(_on_setting_changed)


@dataclass(frozen=True)
class Checked:
    """A task's options, checked, with their defaults: what its job rows take from them.

    The fields before ``payload`` in a row are ``task`` to ``priority``; the rest follow it
    (``rows.ROW_COLUMNS`` names them all).
    """

    handler: Handler
    task: str
    payload_version: int
    queue: str
    priority: int
    run_at: datetime | None
    delay_seconds: float
    max_attempts: int
    max_age_seconds: float
    lease_seconds: int
    idempotency_key: str | None
    unique_key: str | None
    unique_period: float | None
    timeout_seconds: float | None
    trace_id: str
    fairness_key: str | None
    # The handler's Limit: its max_running is the jobs', each job's key comes from its payload.
    # A Rate's key has one slot, held by the job that starts next; its interval and burst.
    limit_max: int | None
    rate_interval: float | None
    rate_burst: int | None


def check_options(task: Any, given: Mapping[str, Any], tick: Any, defaults: Defaults) -> Checked:
    """Check ``task`` and the options ``given`` for it (and ``tick``); raise ``EnqueueError``."""
    if "using" in given:
        raise InvalidJobOption(
            "a JobSpec cannot choose its database: enqueue_many writes every spec in one "
            "statement, so pass using= to enqueue_many"
        )
    unknown = sorted(escape_control(str(k)) for k in given if k not in OPTIONS)
    if unknown:
        raise InvalidJobOption(f"unknown enqueue option(s): {', '.join(unknown)}")
    handler = _resolve_handler(task)
    # Each option as given, else its handler's declaration, else the setting.
    options = {
        "queue": _first(given.get("queue"), handler.queue, defaults.queue),
        "priority": given.get("priority", handler.priority),
        "max_attempts": _first(given.get("max_attempts"), handler.max_attempts,
                               defaults.max_attempts),
        "payload_version": given.get("payload_version", handler.version),
        "lease": _first(given.get("lease"), handler.lease),
        "max_age": _first(given.get("max_age"), handler.max_age),
        "timeout": _first(given.get("timeout"), handler.timeout),
        **{name: given.get(name) for name in (
            "run_at", "delay", "idempotency_key", "unique_key", "unique_period", "trace_id",
            "fairness_key")},
    }
    checked_tick(tick)  # before the options, as a spec checked alone always was
    _check_rules(options, defaults)
    if options["payload_version"] > handler.version:
        # Workers run a payload only up to their handler's version and hold a newer one
        # back for a newer deploy: this code has none, so the job might wait for ever.
        raise InvalidJobOption(
            f"payload_version {options['payload_version']} is newer than the handler of "
            f"{handler.name!r} here (version {handler.version}): no worker running this code "
            "could run the job, which would wait for a newer deploy; enqueue it from code whose "
            f"handler has version {options['payload_version']}, or leave payload_version out")
    max_age = options["max_age"]
    max_age_seconds = seconds_of(max_age) if max_age is not None else defaults.max_age_seconds
    assert max_age_seconds is not None
    lease, timeout, period = options["lease"], options["timeout"], options["unique_period"]
    return Checked(
        handler=handler,
        task=handler.name,
        payload_version=options["payload_version"],
        queue=options["queue"],
        priority=options["priority"],
        run_at=options["run_at"],
        delay_seconds=_due_in(options["run_at"], options["delay"], max_age_seconds),
        max_attempts=options["max_attempts"],
        max_age_seconds=max_age_seconds,
        lease_seconds=defaults.lease_seconds if lease is None else _whole_seconds(lease),
        idempotency_key=options["idempotency_key"],
        unique_key=options["unique_key"],
        unique_period=seconds_of(period) if period is not None else None,
        timeout_seconds=seconds_of(timeout) if timeout is not None else None,
        trace_id=options["trace_id"] or "",
        fairness_key=options["fairness_key"],
        **_limit_columns(handler.limit),
    )


def _limit_columns(limit: Limit | Rate | None) -> dict[str, Any]:
    if isinstance(limit, Rate):
        return {"limit_max": 1, "rate_interval": limit.interval, "rate_burst": limit.burst}
    return {"limit_max": None if limit is None else limit.max_running, "rate_interval": None,
            "rate_burst": None}


# Options that always have a value by now (a default if not given): checked whatever it is.
_ALWAYS_SET = ("priority", "max_attempts", "payload_version")


def _check_rules(options: Mapping[str, Any], defaults: Defaults) -> None:
    """Each option against its rule (``validation.OPTION_RULES``; one that is None takes its
    default), the queue against the queues the settings declare, in the order errors are
    reported."""
    queue = options["queue"]
    problem = queue_problem(queue)
    if problem is not None:
        raise UnknownQueue(f"queue {problem}")
    if defaults.queues is not None and queue not in defaults.queues:
        raise UnknownQueue(
            f"unknown queue {queue!r}: PGJOBS_QUEUES declares {', '.join(sorted(defaults.queues))}"
        )
    for option in _ALWAYS_SET:
        _check(option_problem(option, options[option]))
    _check_when_set(options, ("lease", "max_age", "idempotency_key", "unique_key",
                              "unique_period"))
    if options["unique_period"] is not None and options["unique_key"] is None:
        raise InvalidJobOption("unique_period needs a unique_key (the key it makes unique)")
    _check_when_set(options, ("timeout", "trace_id", "fairness_key"))


def _check_when_set(options: Mapping[str, Any], names: Iterable[str]) -> None:
    for option in names:
        if options[option] is not None:
            _check(option_problem(option, options[option]))


def checked_tick(tick: Any) -> Tick | None:
    """``tick`` if it is a schedule's tick (or None); else raise ``InvalidJobOption``."""
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


def _resolve_handler(task: Any) -> Handler:
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
    max_depth = Defaults.read().max_payload_depth
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


__all__ = [
    "OPTIONS", "Checked", "Defaults", "JobSpec", "Tick", "check_nesting", "check_options",
    "checked_tick", "encode_payload",
]
