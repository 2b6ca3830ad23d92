"""The rules every input is held to, written once.

Enqueue, the management commands, the system checks, the Tasks backend and the models all ask
these functions; each returns ``None`` when a value is acceptable and otherwise a phrase that
completes "<name> ..." (``"must be a whole number from 1 to 100, got 2.5"``), so every caller
raises its own kind of error with the same words. Nothing here imports the rest of the package.
"""

from __future__ import annotations

import base64
import binascii
import importlib.util
import math
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

QUEUE_NAME_MAX_LENGTH = 64
# Letters, digits and ``_ . -``; no ``:`` (``--queue NAME:WEIGHT``), no spaces or control
# characters (queue names go into log lines and NOTIFY payloads).
QUEUE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
QUEUE_NAME_RULE = (
    f"1 to {QUEUE_NAME_MAX_LENGTH} letters, digits, '_', '.' or '-', not starting with '.' "
    "or '-'"
)
TASK_NAME_MAX_LENGTH = 200
TASK_NAME = re.compile(r"[A-Za-z_][\w.:-]{0,199}", re.ASCII)
TASK_NAME_RULE = (
    "a letter or underscore, then letters, digits and . _ : - "
    f"(at most {TASK_NAME_MAX_LENGTH} characters)"
)
# A schedule's name follows the task-name rule: it goes into log lines and the admin's URLs.
SCHEDULE_NAME_MAX_LENGTH = TASK_NAME_MAX_LENGTH
CRON_MAX_LENGTH = 100
TIMEZONE_MAX_LENGTH = 64
PRIORITY_MIN = -100
PRIORITY_MAX = 100
# What a job may carry and ask for, whoever enqueues it (enqueue, the Tasks backend, settings).
KEY_MAX_LENGTH = 255
RECEIPT_SCOPE_MAX_LENGTH = 100
TRACE_MAX_LENGTH = 64
# A W3C traceparent is 55 characters in version 00; later versions may append fields.
TRACEPARENT_MAX_LENGTH = 128
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[0-9a-zA-Z._-]+)*",
                         re.ASCII)
FAIRNESS_KEY_MAX_LENGTH = 200
# A job's limit key is its limit's name, ':', and the key its payload gives (a Limit). Each
# unit of a limit is a row (a slot), so a limit counts up to this many.
LIMIT_KEY_MAX_LENGTH = 255
MAX_RUNNING_LIMIT = 10_000
MAX_ATTEMPTS_LIMIT = 1_000_000
LEASE_MAX_SECONDS = 7 * 24 * 3600
# The longest delay or max age a job may have: ten years. Past that a value is a mistake (a
# timestamp passed as seconds, 1e300), and PostgreSQL's timestamps would overflow.
DURATION_MAX_SECONDS = 10 * 365 * 24 * 3600
DAY_SECONDS = 24 * 3600
YEAR_SECONDS = 365 * DAY_SECONDS
# The shortest poll interval a worker takes. Below it an idle worker's wait is about as long as
# the claim it polls with, and it spins: 1e-300 took three times the CPU of one second.
MIN_POLL_INTERVAL_SECONDS = 0.01
POLL_INTERVAL_MAX_SECONDS = 3600.0
# Control characters forge log lines (a newline starts a new one) and terminals obey some.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_CRON_PROBE = datetime(2000, 1, 1, tzinfo=UTC)


def queue_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"must be a queue name ({QUEUE_NAME_RULE}), not {type(value).__name__}"
    if QUEUE_NAME.fullmatch(value) is None:
        return f"must be a queue name ({QUEUE_NAME_RULE}), got {value!r}"
    return None


def task_name_problem(value: object) -> str | None:
    if not isinstance(value, str) or TASK_NAME.fullmatch(value) is None:
        return f"must be a task name ({TASK_NAME_RULE}), got {value!r}"
    return None


def schedule_name_problem(value: object) -> str | None:
    if not isinstance(value, str) or TASK_NAME.fullmatch(value) is None:
        return f"must be a schedule name ({TASK_NAME_RULE}), got {shown(value)}"
    return None


def cron_problem(value: object) -> str | None:
    """A cron expression of 5 fields, or 6 with seconds first (``*/10 * * * * *``)."""
    if not isinstance(value, str):
        return f"must be a cron expression (a string), not {type(value).__name__}"
    problem = text_problem(value, CRON_MAX_LENGTH)
    if problem is not None:
        return problem
    try:
        CronSim(value, _CRON_PROBE)
    except CronSimError as exc:
        return (f"is not a cron expression ({exc}): give 5 fields (minute hour day month "
                f"weekday), or 6 with seconds first, got {shown(value)}")
    return None


def timezone_problem(value: object) -> str | None:
    """A time zone name of the IANA database (``Europe/Paris``, ``UTC``)."""
    if not isinstance(value, str) or not value or len(value) > TIMEZONE_MAX_LENGTH:
        return f"must be a time zone name such as 'Europe/Paris' or 'UTC', got {shown(value)}"
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        return f"is not a known time zone (an IANA name such as 'Europe/Paris'), got {shown(value)}"
    return None


def choice_problem(value: object, choices: Iterable[str]) -> str | None:
    allowed = list(choices)
    if not isinstance(value, str) or value not in allowed:
        return f"must be one of {', '.join(map(repr, allowed))}, got {shown(value)}"
    return None


def whole_number_problem(value: object, low: int, high: int) -> str | None:
    """A whole number (not a bool, not a float) from ``low`` to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"must be a whole number from {low} to {high}, got {shown(value)}"
    return None


def number_problem(
    value: object, low: float, high: float, *, low_inclusive: bool = True
) -> str | None:
    """A finite number (a bool is not one) between ``low`` and ``high``."""
    number = seconds_of(value)
    if number is None:
        if isinstance(value, int) and not isinstance(value, bool):
            return f"must be at most {high:g}, got {shown(value)}"
        return f"must be a number, got {shown(value)}"
    above = number >= low if low_inclusive else number > low
    if not math.isfinite(number) or not above or number > high:
        return f"must be a finite number {_span(low, high, low_inclusive)}, got {shown(value)}"
    return None


def seconds_of(value: object) -> float | None:
    """``value`` (a timedelta or a number) in seconds, or None when it is neither or too large."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def duration_problem(
    value: object, low: float, high: float, *, low_inclusive: bool = True
) -> str | None:
    """A timedelta or a finite number of seconds between ``low`` and ``high``."""
    seconds = seconds_of(value)
    if seconds is None:
        if isinstance(value, int) and not isinstance(value, bool):
            return f"must be at most {high:g} seconds, got {shown(value)}"
        return f"must be a timedelta or a number of seconds, got {type(value).__name__}"
    above = seconds >= low if low_inclusive else seconds > low
    if not math.isfinite(seconds) or not above or seconds > high:
        return f"must be {_span(low, high, low_inclusive)} seconds, got {shown(value)}"
    return None


def bool_problem(value: object) -> str | None:
    if not isinstance(value, bool):
        return f"must be True or False, got {shown(value)}"
    return None


def text_problem(value: object, max_length: int, *, allow_empty: bool = False) -> str | None:
    """A string PostgreSQL can store and a log line can carry as it is."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value and not allow_empty:
        return "must not be empty"
    if len(value) > max_length:
        return f"must be at most {max_length} characters, got {len(value)}"
    return storable_text_problem(value) or (
        "must not contain control characters (newlines, tabs, NUL)"
        if _CONTROL.search(value) else None
    )


def storable_text_problem(value: str) -> str | None:
    """What keeps PostgreSQL from storing ``value`` as text: a NUL, or a lone surrogate."""
    if "\x00" in value:
        return "contains a NUL character, which PostgreSQL cannot store"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return (f"contains a lone surrogate ({value[exc.start]!r} at index {exc.start}), "
                    "which is not UTF-8")
    return None


def nesting_problem(max_depth: int) -> str:
    """Why a value nested deeper than ``max_depth`` lists and objects is refused."""
    return f"nested more than {max_depth} levels deep (PGJOBS_MAX_PAYLOAD_DEPTH)"


def escape_control(text: str) -> str:
    """``text`` with control characters written as escapes, so it stays on one log line."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def shown(value: object, limit: int = 40) -> str:
    """``value`` as an error message quotes it: short, and safe for any value."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails is still described
        text = f"<{type(value).__name__}>"
    text = escape_control(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _span(low: float, high: float, low_inclusive: bool) -> str:
    return f"from {low:g} to {high:g}" if low_inclusive else f"above {low:g} and at most {high:g}"


# The durations' spans in seconds (low, high, whether low itself is allowed), which the
# django.tasks backend's ``*_seconds`` OPTIONS take too.
DURATION_SPANS: dict[str, tuple[float, float, bool]] = {
    "lease": (1, LEASE_MAX_SECONDS, True),
    "max_age": (0, DURATION_MAX_SECONDS, False),
    "timeout": (0, DURATION_MAX_SECONDS, False),
    "unique_period": (1, DURATION_MAX_SECONDS, True),
}


def _duration(option: str) -> Callable[[object], str | None]:
    low, high, low_inclusive = DURATION_SPANS[option]
    return lambda v: duration_problem(v, low, high, low_inclusive=low_inclusive)


# The rule of each job option, written once: enqueue checks the options of every job by it,
# and @job checks a handler's defaults by it when the handler is declared, so a default that no
# enqueue would accept fails at import, not on every enqueue.
OPTION_RULES: dict[str, Callable[[object], str | None]] = {
    "priority": lambda v: whole_number_problem(v, PRIORITY_MIN, PRIORITY_MAX),
    "max_attempts": lambda v: whole_number_problem(v, 1, MAX_ATTEMPTS_LIMIT),
    "payload_version": lambda v: whole_number_problem(v, 1, 32767),
    "lease": _duration("lease"),
    "max_age": _duration("max_age"),
    "timeout": _duration("timeout"),
    "idempotency_key": lambda v: text_problem(v, KEY_MAX_LENGTH),
    "unique_key": lambda v: text_problem(v, KEY_MAX_LENGTH),
    "unique_period": _duration("unique_period"),
    "trace_id": lambda v: text_problem(v, TRACE_MAX_LENGTH, allow_empty=True),
    "fairness_key": lambda v: text_problem(v, FAIRNESS_KEY_MAX_LENGTH),
}


def max_running_problem(value: object) -> str | None:
    """How many jobs of one limit key may run at once."""
    return whole_number_problem(value, 1, MAX_RUNNING_LIMIT)


def limit_key_problem(value: object) -> str | None:
    """A job's whole limit key (``name:key``), as the database stores it."""
    return text_problem(value, LIMIT_KEY_MAX_LENGTH)


def option_problem(option: str, value: object) -> str | None:
    """What is wrong with ``value`` for the job option ``option`` ("priority must be ..."), or
    None. The caller leaves out an option whose None means "the default"."""
    problem = OPTION_RULES[option](value)
    return None if problem is None else f"{option} {problem}"


def poll_interval_problem(value: object) -> str | None:
    """A worker's poll interval: seconds, from the floor that keeps an idle worker idle."""
    return number_problem(value, MIN_POLL_INTERVAL_SECONDS, POLL_INTERVAL_MAX_SECONDS)


# --- settings ----------------------------------------------------------------------------------

Rule = Callable[[object], "str | None"]


def _whole(low: int, high: int) -> Rule:
    return lambda value: whole_number_problem(value, low, high)


def _seconds(low: float, high: float, *, low_inclusive: bool = False) -> Rule:
    return lambda value: number_problem(value, low, high, low_inclusive=low_inclusive)


def _alias_name(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return None
    return f"must be None or a database alias, got {shown(value)}"


def _queues(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        return f"must be None or a list of queue names, got {shown(value)}"
    for queue in value:
        problem = queue_problem(queue)
        if problem is not None:
            return f"must be None or a list of queue names: an entry {problem}"
    return None


def _names(what: str) -> Rule:
    def check(value: object) -> str | None:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return f"must be a list of {what}, got {shown(value)} (a string is not a list)"
        bad = [item for item in value if not isinstance(item, str) or not item]
        if bad:
            return f"must be a list of {what}: {shown(bad[0])} is not a non-empty string"
        return None

    return check


def _retention(value: object) -> str | None:
    if not isinstance(value, dict) or not set(value) <= {"succeeded", "cancelled", "dead"}:
        return "must be a dict with keys among succeeded, cancelled, dead"
    for state, seconds in value.items():
        if seconds is not None:
            problem = number_problem(seconds, 0, 100 * YEAR_SECONDS, low_inclusive=False)
            if problem is not None:
                return f"[{state!r}] must be None (keep forever) or seconds: {problem}"
    return None


def _backlog_policy(value: object) -> str | None:
    if not isinstance(value, dict):
        return 'must be a dict of queue name (or "*" for any other queue) to seconds > 0'
    for queue, seconds in value.items():
        if queue != "*" and queue_problem(queue) is not None:
            return f"has a key that is not a queue name or \"*\": {shown(queue)}"
        problem = number_problem(seconds, 0, YEAR_SECONDS, low_inclusive=False)
        if problem is not None:
            return f"[{queue!r}] {problem}"
    return None


def missing_extra(package: str, extra: str) -> str:
    """That ``package`` is not installed, and the extra of ours that brings it."""
    # The name is not published yet: the README's Install installs from a checkout.
    return (f"{package} is not installed; the {extra} extra brings it: "
            f"pip install './django-pgjobs[{extra}]' (see the README's Install)")


def _tracing(value: object) -> str | None:
    if value is not None and not isinstance(value, bool):
        return ("must be None (trace when opentelemetry-api is installed), True or False, "
                f"got {shown(value)}")
    if value is True and importlib.util.find_spec("opentelemetry") is None:
        return f"is True but {missing_extra('opentelemetry-api', 'otel')}"
    return None


ENCRYPTION_KEY_BYTES = 32


def encryption_key_bytes(text: str) -> bytes | None:
    """The key ``text`` spells in URL-safe base64, or None if it is not one of 32 bytes."""
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii"))
    except (binascii.Error, ValueError, UnicodeEncodeError):
        return None
    return raw if len(raw) == ENCRYPTION_KEY_BYTES else None


def _encryption_keys(value: object) -> str | None:
    if not isinstance(value, list | tuple) or not all(isinstance(k, str) for k in value):
        return "must be a list of keys (strings): the first encrypts, all decrypt"
    raws = [encryption_key_bytes(text) for text in value]
    for position, raw in enumerate(raws):
        if raw is None:
            return (f"[{position}] is not a key: each is {ENCRYPTION_KEY_BYTES} bytes in "
                    "URL-safe base64 (manage.py pgjobs_rotate_keys --generate-key prints one)")
    if len(set(raws)) != len(raws):
        return "lists one key twice"
    if value and importlib.util.find_spec("cryptography") is None:
        return f"is set but {missing_extra('cryptography', 'encryption')}"
    return None


def _prepared_statements(value: object) -> str | None:
    if value is not None and not isinstance(value, bool):
        return ("must be None (prepare except where DISABLE_SERVER_SIDE_CURSORS is set), True "
                f"or False, got {shown(value)}")
    return None


# Every setting but PGJOBS_SCHEDULES (whose entries are schedules: checks.py holds its rule) and
# its rule, in conf.py's order. The system checks report a value that breaks one as
# pgjobs.E010; the code that reads a setting asks the same rule (``setting_problem``), for a
# process that skipped the checks.
SETTING_RULES: dict[str, Rule] = {
    "QUEUE": queue_problem,
    "QUEUES": _queues,
    "MAX_PAYLOAD_BYTES": _whole(1, 256 * 1024 * 1024),
    "MAX_PAYLOAD_DEPTH": _whole(1, 1000),
    "MAX_DEPENDENCIES": _whole(1, 100_000),
    "MAX_RESULT_BYTES": _whole(64 * 1024, 256 * 1024 * 1024),
    "LEASE_SECONDS": _whole(1, LEASE_MAX_SECONDS),
    "MAX_ATTEMPTS": _whole(1, MAX_ATTEMPTS_LIMIT),
    "MAX_AGE_SECONDS": _seconds(0, DURATION_MAX_SECONDS),
    "RETRY_BASE_SECONDS": _seconds(0, YEAR_SECONDS),
    "RETRY_MAX_SECONDS": _seconds(0, YEAR_SECONDS),
    "UNKNOWN_TASK_RETRY_SECONDS": _seconds(0, YEAR_SECONDS),
    "MAX_SNOOZES": _whole(0, 1_000_000),
    "MAX_SNOOZE_SECONDS": _seconds(0, YEAR_SECONDS),
    "POLL_INTERVAL_SECONDS": poll_interval_problem,
    "RESCUE_INTERVAL_SECONDS": _seconds(0, 3600),
    "WORKER_HEARTBEAT_SECONDS": _seconds(0, 3600),
    "RESCUE_BATCH": _whole(1, 100_000),
    "PROMOTE_BATCH": _whole(1, 100_000),
    "SETTLE_FLUSH_SECONDS": _seconds(0, 60),
    "SHUTDOWN_GRACE_SECONDS": _seconds(0, DAY_SECONDS, low_inclusive=True),
    "BURST_UNREACHABLE_SECONDS": _seconds(0, DAY_SECONDS),
    "CANCEL_CHECK_SECONDS": _seconds(0, 60),
    "KILL_GRACE_SECONDS": _seconds(0, 3600),
    "RECEIPT_RETENTION_SECONDS": _seconds(0, 100 * YEAR_SECONDS),
    "RETENTION_SECONDS": _retention,
    "PRUNE_INTERVAL_SECONDS": _seconds(0, DAY_SECONDS),
    "HISTORY_INTERVAL_SECONDS": _seconds(1, 3600, low_inclusive=True),
    "ADMIN_REFRESH_SECONDS": _seconds(1, 3600, low_inclusive=True),
    "HORIZON_WARN_SECONDS": _seconds(1, 30 * DAY_SECONDS, low_inclusive=True),
    "HORIZON_WARN_XIDS": _whole(1000, 2_000_000_000),
    "CLAIM_FLOORS_AFTER_SECONDS": _seconds(0, 30 * DAY_SECONDS, low_inclusive=True),
    "STATS_DATABASE": _alias_name,
    "HISTORY_RETENTION_SECONDS": _seconds(3600, 366 * DAY_SECONDS, low_inclusive=True),
    "PRUNE_BATCH": _whole(1, 100_000),
    "NOTIFY": bool_problem,
    "SETTLE_WITH_CLAIM": bool_problem,
    "PREPARED_STATEMENTS": _prepared_statements,
    "LISTEN": bool_problem,
    "AGING_INTERVAL_SECONDS": _seconds(0, DAY_SECONDS),
    "AGING_STEP": _whole(0, PRIORITY_MAX - PRIORITY_MIN),
    "AGING_CAP": _whole(PRIORITY_MIN, PRIORITY_MAX),
    "AGING_BATCH": _whole(1, 100_000),
    "BACKLOG_MAX_AGE_SECONDS": _backlog_policy,
    "BACKLOG_CHECK_INTERVAL_SECONDS": _seconds(0, DAY_SECONDS),
    "REDACT_KEYS": _names("key names"),
    "REDACT_NO_KEYS": bool_problem,
    "HANDLER_MODULES": _names("module names"),
    "SCHEDULE_INTERVAL_SECONDS": _seconds(0, 3600),
    "SCHEDULE_BATCH": _whole(1, 10_000),
    "SCHEDULE_GRACE_SECONDS": _seconds(0, DAY_SECONDS),
    "TRACING": _tracing,
    "METRICS_MAX_QUEUES": _whole(1, 10_000),
    "ENCRYPTION_KEYS": _encryption_keys,
}


def setting_problem(name: str, value: object) -> str | None:
    """What is wrong with ``value`` for setting PGJOBS_<name>, or None."""
    return SETTING_RULES[name](value)


__all__ = [
    "CRON_MAX_LENGTH",
    "DAY_SECONDS",
    "DURATION_MAX_SECONDS",
    "DURATION_SPANS",
    "ENCRYPTION_KEY_BYTES",
    "FAIRNESS_KEY_MAX_LENGTH",
    "KEY_MAX_LENGTH",
    "LEASE_MAX_SECONDS",
    "MAX_ATTEMPTS_LIMIT",
    "MIN_POLL_INTERVAL_SECONDS",
    "OPTION_RULES",
    "POLL_INTERVAL_MAX_SECONDS",
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "QUEUE_NAME",
    "QUEUE_NAME_MAX_LENGTH",
    "QUEUE_NAME_RULE",
    "RECEIPT_SCOPE_MAX_LENGTH",
    "SCHEDULE_NAME_MAX_LENGTH",
    "SETTING_RULES",
    "TASK_NAME",
    "TASK_NAME_MAX_LENGTH",
    "TASK_NAME_RULE",
    "TIMEZONE_MAX_LENGTH",
    "TRACEPARENT",
    "TRACEPARENT_MAX_LENGTH",
    "TRACE_MAX_LENGTH",
    "YEAR_SECONDS",
    "bool_problem",
    "choice_problem",
    "cron_problem",
    "duration_problem",
    "escape_control",
    "missing_extra",
    "number_problem",
    "option_problem",
    "poll_interval_problem",
    "queue_problem",
    "schedule_name_problem",
    "seconds_of",
    "setting_problem",
    "shown",
    "storable_text_problem",
    "task_name_problem",
    "text_problem",
    "timezone_problem",
    "whole_number_problem",
]
