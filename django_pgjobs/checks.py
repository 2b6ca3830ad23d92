"""System checks: the database is PostgreSQL, and every PGJOBS_* setting makes sense."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf
from .conf import settings
from .models import PRIORITY_MAX, PRIORITY_MIN
from .registry import registry

MIN_POSTGRES_VERSION = 130000

_POSITIVE_NUMBERS = (
    "MAX_PAYLOAD_BYTES", "LEASE_SECONDS", "MAX_ATTEMPTS", "MAX_AGE_SECONDS",
    "RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS", "UNKNOWN_TASK_RETRY_SECONDS",
    "MAX_SNOOZE_SECONDS", "POLL_INTERVAL_SECONDS", "BURST_UNREACHABLE_SECONDS",
    "RESCUE_INTERVAL_SECONDS", "RESCUE_BATCH",
    "PROMOTE_BATCH", "SETTLE_FLUSH_SECONDS", "RECEIPT_RETENTION_SECONDS",
    "PRUNE_INTERVAL_SECONDS", "PRUNE_BATCH", "AGING_INTERVAL_SECONDS", "AGING_BATCH",
)
_NON_NEGATIVE_NUMBERS = ("MAX_SNOOZES", "SHUTDOWN_GRACE_SECONDS", "AGING_STEP")


@register(Tags.database)
def check_database(databases: Sequence[str] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """django-pgjobs needs PostgreSQL 13 or newer, and autovacuum to keep up with its churn."""
    messages: list[CheckMessage] = []
    for alias in databases or []:
        connection = connections[alias]
        vendor_errors = vendor_messages(alias, connection)
        if vendor_errors:
            messages += vendor_errors
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
    """Every PGJOBS_* setting has a known name and a sensible value."""
    messages: list[CheckMessage] = []
    known = {name[len("DEFAULT_"):] for name in vars(conf) if name.startswith("DEFAULT_")}
    for name in dir(django_settings):
        if name.startswith("PGJOBS_") and name[len("PGJOBS_"):] not in known:
            messages.append(Warning(f"{name} is not a django-pgjobs setting (a typo?)",
                                    id="pgjobs.W001"))
    for name in _POSITIVE_NUMBERS:
        messages += _number(name, strictly_positive=True)
    for name in _NON_NEGATIVE_NUMBERS:
        messages += _number(name, strictly_positive=False)
    messages += _queues()
    messages += _retention()
    messages += _redact_keys()
    messages += _scheduling()
    if not messages and settings.RETRY_BASE_SECONDS > settings.RETRY_MAX_SECONDS:
        messages.append(_error("RETRY_BASE_SECONDS", "must not exceed PGJOBS_RETRY_MAX_SECONDS"))
    return messages


def _error(name: str, problem: str, id: str = "pgjobs.E010") -> Error:
    return Error(f"PGJOBS_{name} {problem} (got {getattr(settings, name)!r})", id=id)


def _number(name: str, *, strictly_positive: bool) -> list[CheckMessage]:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return [_error(name, "must be a number")]
    if value < 0 or (strictly_positive and value == 0):
        return [_error(name, "must be > 0" if strictly_positive else "must be >= 0")]
    return []


def _queues() -> list[CheckMessage]:
    queues = settings.QUEUES
    if queues is not None and (
        isinstance(queues, str) or not isinstance(queues, Iterable)
        or not all(isinstance(q, str) and 0 < len(q) <= 64 for q in queues)
    ):
        return [_error("QUEUES", "must be None or a list of queue names (1-64 characters)")]
    if not isinstance(settings.QUEUE, str) or not settings.QUEUE:
        return [_error("QUEUE", "must be a non-empty queue name")]
    if queues is not None and settings.QUEUE not in queues:
        return [_error("QUEUE", "must be one of PGJOBS_QUEUES")]
    return []


def _retention() -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    retention = settings.RETENTION_SECONDS
    if not isinstance(retention, dict) or not set(retention) <= {"succeeded", "cancelled", "dead"}:
        messages.append(_error(
            "RETENTION_SECONDS", "must be a dict with keys among succeeded, cancelled, dead"
        ))
    receipts = settings.RECEIPT_RETENTION_SECONDS
    if not isinstance(receipts, int | float):
        return messages
    # A receipt must outlive every retry of the job that wrote it, or a late retry would repeat
    # the side effect; every retry ends by the job's deadline (its max age).
    longest = max(
        [float(settings.MAX_AGE_SECONDS), float(settings.UNKNOWN_TASK_RETRY_SECONDS)]
        + [h.max_age.total_seconds() for h in map(registry.get, registry.names())
           if h is not None and h.max_age is not None]
    )
    if receipts < longest:
        messages.append(Error(
            f"PGJOBS_RECEIPT_RETENTION_SECONDS ({receipts:g}) is shorter than the longest retry "
            f"window ({longest:g}s, the largest max age of any job): a retry could outlive its "
            "receipt and repeat a side effect",
            hint="raise PGJOBS_RECEIPT_RETENTION_SECONDS or lower the max ages",
            id="pgjobs.E011",
        ))
    return messages


def _redact_keys() -> list[CheckMessage]:
    keys = settings.REDACT_KEYS
    if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
        return [_error("REDACT_KEYS", "must be a list of non-empty key names")]
    return []


def _scheduling() -> list[CheckMessage]:
    """Aging, backlog policy, retention values and wake-ups (validated as the steps need them)."""
    messages: list[CheckMessage] = []
    for name, low, high in (("AGING_STEP", 0, PRIORITY_MAX - PRIORITY_MIN),
                            ("AGING_CAP", PRIORITY_MIN, PRIORITY_MAX),
                            ("AGING_BATCH", 1, 100_000)):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            messages.append(_error(name, f"must be a whole number from {low} to {high}"))
    messages += _number("BACKLOG_CHECK_INTERVAL_SECONDS", strictly_positive=True)
    policy = settings.BACKLOG_MAX_AGE_SECONDS
    if not isinstance(policy, dict) or not all(
        isinstance(queue, str) and queue and _is_positive(seconds)
        for queue, seconds in policy.items()
    ):
        messages.append(_error(
            "BACKLOG_MAX_AGE_SECONDS",
            'must be a dict of queue name (or "*" for any other queue) to seconds > 0',
        ))
    retention = settings.RETENTION_SECONDS
    if isinstance(retention, dict) and not all(
        seconds is None or _is_positive(seconds) for seconds in retention.values()
    ):
        messages.append(_error(
            "RETENTION_SECONDS", "values must be seconds > 0, or None to keep forever"
        ))
    for name in ("LISTEN", "NOTIFY"):
        if not isinstance(getattr(settings, name), bool):
            messages.append(_error(name, "must be True or False"))
    return messages


def _is_positive(value: object) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0
