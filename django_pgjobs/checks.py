"""System checks: the database is PostgreSQL, and every PGJOBS_* setting makes sense."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf
from .conf import settings
from .exceptions import InvalidJobOption
from .models import PRIORITY_MAX, PRIORITY_MIN
from .periodic import declared_schedules, settings_schedule
from .registry import registry
from .validation import (
    DURATION_MAX_SECONDS,
    LEASE_MAX_SECONDS,
    MAX_ATTEMPTS_LIMIT,
    bool_problem,
    number_problem,
    queue_problem,
    shown,
    whole_number_problem,
)

MIN_POSTGRES_VERSION = 130000

DAY_SECONDS = 24 * 3600
YEAR_SECONDS = 365 * DAY_SECONDS
Rule = Callable[[Any], "str | None"]


def _whole(low: int, high: int) -> Rule:
    return lambda value: whole_number_problem(value, low, high)


def _seconds(low: float, high: float, *, low_inclusive: bool = False) -> Rule:
    return lambda value: number_problem(value, low, high, low_inclusive=low_inclusive)


def _queues(value: Any) -> str | None:
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
    def check(value: Any) -> str | None:
        if isinstance(value, str) or not isinstance(value, list | tuple):
            return f"must be a list of {what}, got {shown(value)} (a string is not a list)"
        bad = [item for item in value if not isinstance(item, str) or not item]
        if bad:
            return f"must be a list of {what}: {shown(bad[0])} is not a non-empty string"
        return None

    return check


def _retention(value: Any) -> str | None:
    if not isinstance(value, dict) or not set(value) <= {"succeeded", "cancelled", "dead"}:
        return "must be a dict with keys among succeeded, cancelled, dead"
    for state, seconds in value.items():
        if seconds is not None:
            problem = number_problem(seconds, 0, 100 * YEAR_SECONDS, low_inclusive=False)
            if problem is not None:
                return f"[{state!r}] must be None (keep forever) or seconds: {problem}"
    return None


def _backlog_policy(value: Any) -> str | None:
    if not isinstance(value, dict):
        return 'must be a dict of queue name (or "*" for any other queue) to seconds > 0'
    for queue, seconds in value.items():
        if queue != "*" and queue_problem(queue) is not None:
            return f"has a key that is not a queue name or \"*\": {shown(queue)}"
        problem = number_problem(seconds, 0, YEAR_SECONDS, low_inclusive=False)
        if problem is not None:
            return f"[{queue!r}] {problem}"
    return None


def _schedules(value: Any) -> str | None:
    if not isinstance(value, dict):
        return ("must be a dict of schedule name to options ({'task': ..., 'cron': ..., ...}), "
                f"got {shown(value)}")
    for name, entry in value.items():
        try:
            settings_schedule(name, entry)
        except InvalidJobOption as exc:
            return f"has a bad entry: {exc}"
    return None


def _tracing(value: Any) -> str | None:
    if value is not None and not isinstance(value, bool):
        return ("must be None (trace when opentelemetry-api is installed), True or False, "
                f"got {shown(value)}")
    if value is True and importlib.util.find_spec("opentelemetry") is None:
        return "is True but opentelemetry-api is not installed (pip install 'django-pgjobs[otel]')"
    return None


def _prepared_statements(value: Any) -> str | None:
    if value is not None and not isinstance(value, bool):
        return ("must be None (prepare except where DISABLE_SERVER_SIDE_CURSORS is set), True "
                f"or False, got {shown(value)}")
    return None


# Every setting and its rule, in conf.py's order; a test fails when a setting has no rule.
SETTING_RULES: dict[str, Rule] = {
    "QUEUE": queue_problem,
    "QUEUES": _queues,
    "MAX_PAYLOAD_BYTES": _whole(1, 256 * 1024 * 1024),
    "MAX_PAYLOAD_DEPTH": _whole(1, 1000),
    "LEASE_SECONDS": _whole(1, LEASE_MAX_SECONDS),
    "MAX_ATTEMPTS": _whole(1, MAX_ATTEMPTS_LIMIT),
    "MAX_AGE_SECONDS": _seconds(0, DURATION_MAX_SECONDS),
    "RETRY_BASE_SECONDS": _seconds(0, YEAR_SECONDS),
    "RETRY_MAX_SECONDS": _seconds(0, YEAR_SECONDS),
    "UNKNOWN_TASK_RETRY_SECONDS": _seconds(0, YEAR_SECONDS),
    "MAX_SNOOZES": _whole(0, 1_000_000),
    "MAX_SNOOZE_SECONDS": _seconds(0, YEAR_SECONDS),
    "POLL_INTERVAL_SECONDS": _seconds(0, 3600),
    "RESCUE_INTERVAL_SECONDS": _seconds(0, 3600),
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
    "HANDLER_MODULES": _names("module names"),
    "SCHEDULES": _schedules,
    "SCHEDULE_INTERVAL_SECONDS": _seconds(0, 3600),
    "SCHEDULE_BATCH": _whole(1, 10_000),
    "SCHEDULE_GRACE_SECONDS": _seconds(0, DAY_SECONDS),
    "TRACING": _tracing,
}


@register(Tags.database)
def check_database(databases: Sequence[str] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """django-pgjobs needs PostgreSQL 13 or newer, and autovacuum to keep up with its churn."""
    messages: list[CheckMessage] = []
    for alias in databases or []:
        connection = connections[alias]
        if connection.vendor != "postgresql":
            # check_vendor reports the default database on every run, with or without the
            # database tag; reporting it here as well would print the same error twice.
            if alias != DEFAULT_DB_ALIAS:
                messages += vendor_messages(alias, connection)
            continue
        version = connection.pg_version  # type: ignore[attr-defined]
        if version < MIN_POSTGRES_VERSION:
            messages.append(Error(
                f"database {alias!r} runs PostgreSQL {version // 10000}; django-pgjobs needs 13+",
                id="pgjobs.E002",
            ))
        with connection.cursor() as cursor:
            cursor.execute("SHOW autovacuum")
            row = cursor.fetchone()
        if row is not None and row[0] == "off":
            messages.append(Warning(
                f"database {alias!r} runs with autovacuum off: every job row is rewritten two or "
                "three times and then deleted, so without vacuum the job table and its claim "
                "index grow without bound and claims slow down",
                hint="turn autovacuum on, or run VACUUM on pgjobs_job and pgjobs_attempt often",
                id="pgjobs.W002",
            ))
    return messages


def vendor_messages(alias: str, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
    """An error unless ``connection`` is PostgreSQL (no query is sent)."""
    if connection.vendor == "postgresql":
        return []
    return [Error(
        f"database {alias!r} uses {connection.vendor}; django-pgjobs needs PostgreSQL "
        "(it relies on SKIP LOCKED, partial indexes and jsonb)",
        hint="set its ENGINE to 'django.db.backends.postgresql'",
        id="pgjobs.E001",
    )]


@register()
def check_vendor(**kwargs: Any) -> list[CheckMessage]:
    """The default database must be PostgreSQL (checked without connecting)."""
    return vendor_messages(DEFAULT_DB_ALIAS, connections[DEFAULT_DB_ALIAS])


@register()
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Every PGJOBS_* setting has a known name and a value of the right type and range."""
    messages: list[CheckMessage] = []
    known = {name[len("DEFAULT_"):] for name in vars(conf) if name.startswith("DEFAULT_")}
    for name in dir(django_settings):
        if name.startswith("PGJOBS_") and name[len("PGJOBS_"):] not in known:
            messages.append(Warning(f"{name} is not a django-pgjobs setting (a typo?)",
                                    id="pgjobs.W001"))
    for name, rule in SETTING_RULES.items():
        problem = rule(getattr(settings, name))
        if problem is not None:
            messages.append(Error(f"PGJOBS_{name} {problem}", id="pgjobs.E010"))
    if messages:
        return messages  # the rules below compare settings that must first be valid
    if settings.QUEUES is not None and settings.QUEUE not in settings.QUEUES:
        messages.append(Error(
            f"PGJOBS_QUEUE must be one of PGJOBS_QUEUES (got {settings.QUEUE!r})",
            id="pgjobs.E010",
        ))
    if settings.RETRY_BASE_SECONDS > settings.RETRY_MAX_SECONDS:
        messages.append(Error(
            "PGJOBS_RETRY_BASE_SECONDS must not exceed PGJOBS_RETRY_MAX_SECONDS "
            f"(got {settings.RETRY_BASE_SECONDS!r} > {settings.RETRY_MAX_SECONDS!r})",
            id="pgjobs.E010",
        ))
    if settings.SCHEDULE_GRACE_SECONDS <= settings.SCHEDULE_INTERVAL_SECONDS:
        messages.append(Error(
            "PGJOBS_SCHEDULE_GRACE_SECONDS must be longer than PGJOBS_SCHEDULE_INTERVAL_SECONDS "
            f"(got {settings.SCHEDULE_GRACE_SECONDS!r} <= {settings.SCHEDULE_INTERVAL_SECONDS!r}):"
            " otherwise ticks count as missed while workers run",
            id="pgjobs.E010",
        ))
    messages += _receipt_retention()
    return messages


@register()
def check_schedules(**kwargs: Any) -> list[CheckMessage]:
    """Every declared schedule names a handler, has its own name, and makes jobs enqueue takes."""
    if _schedules(settings.SCHEDULES) is not None:
        return []  # check_settings reports it
    _, problems = declared_schedules()
    return [Error(problem, id="pgjobs.E012") for problem in problems]


def _receipt_retention() -> list[CheckMessage]:
    # A receipt must outlive every retry of the job that wrote it, or a late retry would repeat
    # the side effect; every retry ends by the job's deadline (its max age).
    receipts = settings.RECEIPT_RETENTION_SECONDS
    longest = max(
        [float(settings.MAX_AGE_SECONDS), float(settings.UNKNOWN_TASK_RETRY_SECONDS)]
        + [h.max_age.total_seconds() for h in map(registry.get, registry.names())
           if h is not None and h.max_age is not None]
    )
    if receipts >= longest:
        return []
    return [Error(
        f"PGJOBS_RECEIPT_RETENTION_SECONDS ({receipts:g}) is shorter than the longest retry "
        f"window ({longest:g}s, the largest max age of any job): a retry could outlive its "
        "receipt and repeat a side effect",
        hint="raise PGJOBS_RECEIPT_RETENTION_SECONDS or lower the max ages",
        id="pgjobs.E011",
    )]
