"""Settings, read from Django settings at call time so ``override_settings`` works.

Every setting is ``PGJOBS_<NAME>`` in the project's settings; the defaults live here with their
units in the name. ``checks.py`` validates them and reports a bad value by name; code that must
not act on a bad value reads the setting through ``checked``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

from .exceptions import InvalidSetting
from .validation import setting_problem

DEFAULT_QUEUE = "default"
DEFAULT_QUEUES: list[str] | None = None  # None: any queue name is accepted
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_MAX_PAYLOAD_DEPTH = 32  # nesting of lists and objects in a payload
# The most jobs one job may depend on (docs/workflows.md): a chord's callback waits for its
# whole group, so this bounds a chord too.
DEFAULT_MAX_DEPENDENCIES = 1000
# The largest result a handler may return (JSON, in bytes): results are stored on the job and
# read by the jobs that depend on it.
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
DEFAULT_LEASE_SECONDS = 30
DEFAULT_MAX_ATTEMPTS = 20
DEFAULT_MAX_AGE_SECONDS = 3 * 24 * 3600
DEFAULT_RETRY_BASE_SECONDS = 1.0
DEFAULT_RETRY_MAX_SECONDS = 3600.0
DEFAULT_UNKNOWN_TASK_RETRY_SECONDS = 3600
DEFAULT_MAX_SNOOZES = 100
DEFAULT_MAX_SNOOZE_SECONDS = 24 * 3600
DEFAULT_POLL_INTERVAL_SECONDS = 1.0
DEFAULT_RESCUE_INTERVAL_SECONDS = 5.0
# How often each worker writes its heartbeat row (django_pgjobs.workers); it counts as gone once
# not seen for two of them.
DEFAULT_WORKER_HEARTBEAT_SECONDS = 5.0
DEFAULT_RESCUE_BATCH = 500
DEFAULT_PROMOTE_BATCH = 5000
DEFAULT_SETTLE_FLUSH_SECONDS = 0.05
# A worker's pending outcomes ride with its next claim (one commit per batch, less work for the
# server); False: the settler thread sends every full batch itself, beside the next claim (a
# lone worker on an otherwise idle server drains faster so, at twice the commits).
DEFAULT_SETTLE_WITH_CLAIM = True
# The claim and the settle are prepared once per connection (prepared.py): None on every database
# but those whose settings say DISABLE_SERVER_SIDE_CURSORS (a pooler in transaction mode) or
# that bind parameters server-side; True or False for all of them.
DEFAULT_PREPARED_STATEMENTS: bool | None = None
DEFAULT_SHUTDOWN_GRACE_SECONDS = 30.0
# How often a worker asks whether an operator cancelled one of its running jobs.
DEFAULT_CANCEL_CHECK_SECONDS = 0.5
# How long a process-isolated handler's child gets after SIGTERM before SIGKILL, and a thread
# handler taken over gets to return before its thread is given up.
DEFAULT_KILL_GRACE_SECONDS = 2.0
# A --burst worker that cannot reach its database for this long exits non-zero; a long-running
# worker retries for as long as an outage lasts.
DEFAULT_BURST_UNREACHABLE_SECONDS = 30.0
DEFAULT_RECEIPT_RETENTION_SECONDS = 7 * 24 * 3600
DEFAULT_RETENTION_SECONDS = {
    "succeeded": 24 * 3600,
    "cancelled": 7 * 24 * 3600,
    "dead": 14 * 24 * 3600,
}
DEFAULT_PRUNE_INTERVAL_SECONDS = 60.0
# The queues' history (django_pgjobs.history): one sample per queue per interval, kept this long
# (the admin's longest chart is a week).
DEFAULT_HISTORY_INTERVAL_SECONDS = 60.0
# The admin's dashboard and lists reload themselves this often while visible (the operator can
# stop it).
DEFAULT_ADMIN_REFRESH_SECONDS = 10.0
DEFAULT_HISTORY_RETENTION_SECONDS = 8 * 24 * 3600
DEFAULT_PRUNE_BATCH = 1000
DEFAULT_NOTIFY = True
# Workers LISTEN for those notifications; False: poll only, keeping no session state (for
# PgBouncer in transaction pooling mode).
DEFAULT_LISTEN = True
DEFAULT_AGING_INTERVAL_SECONDS = 60.0
DEFAULT_AGING_STEP = 10
DEFAULT_AGING_CAP = 100
DEFAULT_AGING_BATCH = 1000
DEFAULT_BACKLOG_MAX_AGE_SECONDS: dict[str, float] = {}
DEFAULT_BACKLOG_CHECK_INTERVAL_SECONDS = 30.0
# A transaction or snapshot open this long, or this many transactions behind, holds vacuum's
# horizon back: the dashboard, pgjobs_stats and a system check name it (docs/operations.md).
DEFAULT_HORIZON_WARN_SECONDS = 300.0
# The database alias the dashboard, pgjobs_stats and the metrics read their figures from (a
# replica); None: the default. Workers' liveness and the horizon are read on the primary, and
# every action writes there.
DEFAULT_STATS_DATABASE: str | None = None
DEFAULT_HORIZON_WARN_XIDS = 500_000
# While something has held the horizon back this long, workers start their claims from a floor
# per priority and make a full claim every second or so (worker/floors.py); 0: never.
DEFAULT_CLAIM_FLOORS_AFTER_SECONDS = 30.0
# Matched as whole words of snake, kebab or camel case (see redaction.py): "pass" hides "db_pass"
# and "userPass", never "passenger".
DEFAULT_REDACT_KEYS = (
    "password",
    "passwd",
    "pwd",
    "pass",
    "passphrase",
    "secret",
    "token",
    "authorization",
    "auth",
    "credentials",
    "credential",
    "jwt",
    "api_key",
    "apikey",
    "private_key",
    "card",
    "card_number",
    "cvv",
    "cvc",
    "ssn",
    "iban",
    "cookie",
    "session",
    "sessionid",
)
# An empty PGJOBS_REDACT_KEYS turns the key rule off: payloads show every value to viewers and
# errors keep their ``password=...`` pairs. The system checks warn of it (pgjobs.W003) unless
# this says it is meant.
DEFAULT_REDACT_NO_KEYS = False
DEFAULT_HANDLER_MODULES = ("jobs",)
# Schedules declared in settings: name -> {"task": ..., "cron": ..., and the other options of
# django_pgjobs.Schedule}. Synced at worker start like the ones declared with @job.
DEFAULT_SCHEDULES: dict[str, dict[str, object]] = {}
DEFAULT_SCHEDULE_INTERVAL_SECONDS = 1.0  # how often each worker looks for due ticks
DEFAULT_SCHEDULE_BATCH = 100  # ticks enqueued per statement
# A tick enqueued within this long of its time is on time; an older one was missed (the
# schedule's misfire policy decides whether it runs) and its schedule shows as late.
DEFAULT_SCHEDULE_GRACE_SECONDS = 60.0
# OpenTelemetry spans (django_pgjobs.tracing): None when opentelemetry-api is installed, True to
# insist (a system check fails without the package), False never.
DEFAULT_TRACING: bool | None = None
# The metrics view's queue gauges name this many queues, those of the largest backlog; the rest
# are summed under queue="*", so a project with thousands of queues exports a bounded number of
# series.
DEFAULT_METRICS_MAX_QUEUES = 50
# Keys of encrypted fields (django_pgjobs.encryption), each 32 bytes in URL-safe base64: the first
# encrypts, all decrypt, so a new key goes first and an old one stays until
# pgjobs_rotate_keys has moved every value off it.
DEFAULT_ENCRYPTION_KEYS: list[str] = []


class Settings:
    """Attribute access to ``PGJOBS_*`` settings with module defaults."""

    def __getattr__(self, name: str) -> Any:
        try:
            default = globals()[f"DEFAULT_{name}"]
        except KeyError:
            raise AttributeError(f"unknown django-pgjobs setting {name!r}") from None
        return getattr(django_settings, f"PGJOBS_{name}", default)


settings = Settings()


def checked(name: str) -> Any:
    """PGJOBS_<name>, by the rule the system checks hold it to; ``InvalidSetting`` if it breaks it.

    A process that skipped the checks would otherwise act on what its rule refuses: a lease of
    -5 seconds failed the table's CHECK, and the server's report of the failing row quoted the
    payload.
    """
    value = getattr(settings, name)
    problem = setting_problem(name, value)
    if problem is not None:
        raise InvalidSetting(name, problem)
    return value
