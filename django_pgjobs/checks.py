"""System checks: the database is PostgreSQL, and every PGJOBS_* setting makes sense."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings as django_settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf
from .conf import settings
from .exceptions import InvalidJobOption
from .registry import registry
from .schedules import declared_schedules, settings_schedule
from .validation import SETTING_RULES as VALUE_RULES
from .validation import Rule, shown

# The tag of this module's checks: a worker runs these at start (pgjobs_worker), and leaves
# the web process's own (URLs, templates, the admin) to the web process.
PGJOBS = "pgjobs"

MIN_POSTGRES_VERSION = 130000


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


# Every setting and its rule; a test fails when a setting has no rule. The rules live with the
# other rules of input (validation.SETTING_RULES), where the code that reads a setting asks
# them too; a schedule's rule needs the schedules' own code.
SETTING_RULES: dict[str, Rule] = {**VALUE_RULES, "SCHEDULES": _schedules}


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
        if alias == settings.STATS_DATABASE:
            messages += replica_messages(alias)
        messages += [Warning(
            f"database {alias!r}: {h.described()} holds the vacuum horizon back: vacuum removes "
            "none of the rows that died since, so finished jobs' rows pile up in pgjobs_job "
            "and its indexes, and claims slow, until it ends",
            hint="end it (an idle transaction: pg_terminate_backend; a slot: drop it or bring "
                 "its consumer back; a prepared transaction: COMMIT or ROLLBACK PREPARED); "
                 "PGJOBS_HORIZON_WARN_SECONDS and PGJOBS_HORIZON_WARN_XIDS set when to warn",
            id="pgjobs.W004",
        ) for h in _horizon(alias) if h.holds]
    return messages


def _horizon(alias: str) -> list[Any]:
    from . import stats  # the dashboard's reads: imported only where a check asks the database

    return stats.horizon(using=alias)


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


def replica_messages(alias: str) -> list[CheckMessage]:
    """The stats alias on a standby with hot_standby_feedback on: its long queries hold the
    primary's horizon back (the figures are read there for long scans' sake)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_is_in_recovery(), current_setting('hot_standby_feedback')")
        row = cursor.fetchone()
    if row is None or not row[0] or row[1] != "on":
        return []
    return [Warning(
        f"PGJOBS_STATS_DATABASE {alias!r} is a standby with hot_standby_feedback on: a long "
        "query there holds the primary's vacuum horizon back as if it ran on the primary, and "
        "finished jobs' rows pile up in its job table",
        hint="turn hot_standby_feedback off on that standby (its long queries may then be "
             "cancelled by replication conflicts), or keep its queries short",
        id="pgjobs.W006",
    )]


@register(PGJOBS)
def check_hosts(**kwargs: Any) -> list[CheckMessage]:
    """A database with several hosts (a primary and its standbys) must ask for the primary, and
    the stats alias must exist (checked without connecting)."""
    messages = host_messages(django_settings.DATABASES)
    alias = settings.STATS_DATABASE
    if isinstance(alias, str) and alias and alias not in django_settings.DATABASES:
        messages.append(Error(f"PGJOBS_STATS_DATABASE names {alias!r}, which is not in "
                              "DATABASES", id="pgjobs.E013"))
    return messages


def host_messages(databases: dict[str, dict[str, Any]]) -> list[CheckMessage]:
    """A warning for each database that lists several hosts without target_session_attrs."""
    messages: list[CheckMessage] = []
    for alias, config in databases.items():
        options = config.get("OPTIONS") or {}
        # The hosts are HOST, or the driver's own host option (a URL's ?host=a,b puts them there).
        host = str(config.get("HOST") or options.get("host") or "")
        if "postgresql" in str(config.get("ENGINE", "")) and "," in host \
                and not options.get("target_session_attrs"):
            messages.append(Warning(
                f"database {alias!r} lists several hosts ({host}) without "
                "target_session_attrs: a connection takes the first that answers, so after a "
                "failover a worker may reach the old primary or a standby and have every write "
                "refused as read-only",
                hint='add "OPTIONS": {"target_session_attrs": "read-write"} (or "primary")',
                id="pgjobs.W005",
            ))
    return messages


@register(PGJOBS)
def check_vendor(**kwargs: Any) -> list[CheckMessage]:
    """The default database must be PostgreSQL (checked without connecting)."""
    return vendor_messages(DEFAULT_DB_ALIAS, connections[DEFAULT_DB_ALIAS])


@register(PGJOBS)
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
    if not settings.REDACT_KEYS and not settings.REDACT_NO_KEYS:
        messages.append(Warning(
            "PGJOBS_REDACT_KEYS is empty, which turns key redaction off: viewers of the admin "
            "see every payload value, and errors, logs and spans keep their 'password=...' "
            "pairs",
            hint="leave PGJOBS_REDACT_KEYS unset for the default keys, list the keys to hide, "
                 "or set PGJOBS_REDACT_NO_KEYS = True to say that no key is secret",
            id="pgjobs.W003",
        ))
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
    messages += _encryption_keys()
    return messages


def _encryption_keys() -> list[CheckMessage]:
    # A handler that declares encrypted fields cannot enqueue (or store its result) without a
    # key: said at start-up rather than at the first enqueue.
    if settings.ENCRYPTION_KEYS:
        return []
    declaring = sorted(h.name for h in map(registry.get, registry.names())
                       if h is not None and (h.encrypted or h.encrypted_result))
    if not declaring:
        return []
    named = ", ".join(map(repr, declaring[:5])) + (
        f" and {len(declaring) - 5} more" if len(declaring) > 5 else "")
    return [Error(
        f"PGJOBS_ENCRYPTION_KEYS is empty, and these tasks declare encrypted fields: {named}",
        hint="set PGJOBS_ENCRYPTION_KEYS to a list of keys; manage.py pgjobs_rotate_keys "
             "--generate-key prints one",
        id="pgjobs.E014",
    )]


@register(PGJOBS)
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
