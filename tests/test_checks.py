from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db.utils import ConnectionHandler

from django_pgjobs.checks import check_database, check_settings, vendor_messages
from django_pgjobs.registry import job, registry
from tests.conftest import MANAGE, ROOT


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def test_a_database_that_is_not_postgresql_is_an_error() -> None:
    other = ConnectionHandler({"default": {"ENGINE": "django.db.backends.dummy"}})
    [error] = vendor_messages("default", other["default"])
    assert error.id == "pgjobs.E001"
    assert "needs PostgreSQL" in error.msg


@pytest.mark.django_db
def test_the_test_database_passes_and_autovacuum_off_is_a_warning() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        autovacuum = cursor.fetchone()[0]
    expected = [] if autovacuum == "on" else ["pgjobs.W002"]
    assert ids(check_database(databases=["default"])) == expected


def test_default_settings_pass() -> None:
    assert check_settings() == []


def test_every_system_check_passes_without_django_contrib_postgres() -> None:
    # The app needs nothing in INSTALLED_APPS beyond itself and the admin's usual apps: Django 6
    # reports any GinIndex or postgres field of a project without django.contrib.postgres.
    from django.apps import apps
    from django.core import checks

    assert not apps.is_installed("django.contrib.postgres")
    errors = [m for m in checks.run_checks() if m.level >= checks.ERROR]
    assert errors == []


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PGJOBS_LEASE_SECONDS", 0, "PGJOBS_LEASE_SECONDS must be a whole number from 1 to "
         "604800, got 0"),
        ("PGJOBS_MAX_ATTEMPTS", "5", "PGJOBS_MAX_ATTEMPTS must be a whole number from 1 to "
         "1000000, got '5'"),
        ("PGJOBS_MAX_ATTEMPTS", 2.5, "PGJOBS_MAX_ATTEMPTS must be a whole number from 1 to "
         "1000000, got 2.5"),
        ("PGJOBS_MAX_ATTEMPTS", True, "PGJOBS_MAX_ATTEMPTS must be a whole number"),
        ("PGJOBS_MAX_PAYLOAD_BYTES", float("nan"), "PGJOBS_MAX_PAYLOAD_BYTES must be a whole "
         "number from 1 to 268435456, got nan"),
        ("PGJOBS_MAX_PAYLOAD_DEPTH", 0, "PGJOBS_MAX_PAYLOAD_DEPTH must be a whole number"),
        ("PGJOBS_POLL_INTERVAL_SECONDS", -1, "PGJOBS_POLL_INTERVAL_SECONDS must be a finite "
         "number from 0.01 to 3600, got -1"),
        ("PGJOBS_POLL_INTERVAL_SECONDS", float("inf"), "must be a finite number from 0.01"),
        ("PGJOBS_POLL_INTERVAL_SECONDS", 1e-300, "must be a finite number from 0.01 to 3600, "
         "got 1e-300"),
        ("PGJOBS_REDACT_NO_KEYS", "yes", "PGJOBS_REDACT_NO_KEYS must be True or False"),
        ("PGJOBS_METRICS_MAX_QUEUES", 0, "PGJOBS_METRICS_MAX_QUEUES must be a whole number from "
         "1 to 10000, got 0"),
        ("PGJOBS_RETRY_MAX_SECONDS", float("nan"), "PGJOBS_RETRY_MAX_SECONDS must be a finite"),
        ("PGJOBS_SHUTDOWN_GRACE_SECONDS", -1, "PGJOBS_SHUTDOWN_GRACE_SECONDS must be a finite "
         "number from 0 to 86400"),
        ("PGJOBS_MAX_SNOOZES", -1, "PGJOBS_MAX_SNOOZES must be a whole number from 0 to"),
        ("PGJOBS_QUEUE", "a:b", "PGJOBS_QUEUE must be a queue name"),
        ("PGJOBS_QUEUES", "default", "PGJOBS_QUEUES must be None or a list of queue names, got "
         "'default'"),
        ("PGJOBS_QUEUES", ["default", "bad name"], "an entry must be a queue name"),
        ("PGJOBS_QUEUES", ["billing"], "PGJOBS_QUEUE must be one of PGJOBS_QUEUES"),
        ("PGJOBS_RETENTION_SECONDS", {"done": 1}, "must be a dict with keys among"),
        ("PGJOBS_RETENTION_SECONDS", {"dead": float("nan")}, "['dead'] must be None"),
        ("PGJOBS_REDACT_KEYS", "password", "PGJOBS_REDACT_KEYS must be a list of key names, got "
         "'password' (a string is not a list)"),
        ("PGJOBS_HANDLER_MODULES", "jobs", "PGJOBS_HANDLER_MODULES must be a list of module "
         "names, got 'jobs' (a string is not a list)"),
        ("PGJOBS_HANDLER_MODULES", ["jobs", 3], "3 is not a non-empty string"),
        ("PGJOBS_HANDLER_MODULES", 5, "PGJOBS_HANDLER_MODULES must be a list of module names, "
         "got 5"),
        ("PGJOBS_NOTIFY", "yes", "PGJOBS_NOTIFY must be True or False, got 'yes'"),
        ("PGJOBS_BACKLOG_MAX_AGE_SECONDS", {"*": float("inf")}, "['*'] must be a finite"),
        ("PGJOBS_AGING_CAP", 101, "PGJOBS_AGING_CAP must be a whole number from -100 to 100"),
    ],
)
def test_bad_settings_are_reported_by_name(settings, name, value, message) -> None:
    setattr(settings, name, value)
    messages = check_settings()
    assert [m.id for m in messages] == ["pgjobs.E010"]
    assert message in messages[0].msg, messages[0].msg


def test_every_setting_has_a_rule() -> None:
    from django_pgjobs import conf
    from django_pgjobs.checks import SETTING_RULES

    defaults = {name[len("DEFAULT_"):] for name in vars(conf) if name.startswith("DEFAULT_")}
    assert set(SETTING_RULES) == defaults


def test_a_misspelt_setting_is_a_warning(settings) -> None:
    settings.PGJOBS_LEASE_SECOND = 10
    assert ids(check_settings()) == ["pgjobs.W001"]


def test_receipts_must_outlast_the_longest_retry_window(settings) -> None:
    settings.PGJOBS_RECEIPT_RETENTION_SECONDS = 3600
    settings.PGJOBS_MAX_AGE_SECONDS = 3600
    settings.PGJOBS_UNKNOWN_TASK_RETRY_SECONDS = 600
    assert check_settings() == []

    @job("tests.checks.long_lived", max_age=timedelta(days=2))
    def long_lived(ctx, payload):
        return None

    try:
        [error] = check_settings()
        assert error.id == "pgjobs.E011"
        assert "shorter than the longest retry window (172800s" in error.msg
    finally:
        registry.remove("tests.checks.long_lived")


@pytest.mark.parametrize(("value", "message"), [
    ("nightly", "PGJOBS_SCHEDULES must be a dict of schedule name to options"),
    ({"bad name": {"task": "tests.ok", "cron": "0 3 * * *"}}, "a key must be a schedule name"),
    ({"n": {"task": "tests.ok"}}, "PGJOBS_SCHEDULES['n'] needs 'cron'"),
    ({"n": {"task": "tests.ok", "cron": "0 3 * * *", "when": 1}}, "unknown option(s) when"),
    ({"n": {"task": "tests.ok", "cron": "0 25 * * *"}},
     "PGJOBS_SCHEDULES['n']: schedule 'n': cron is not a cron expression (Bad hour)"),
    ({"n": {"task": "tests.ok", "cron": "0 3 * * *", "timezone": "Paris"}},
     "schedule 'n': timezone is not a known time zone"),
    ({"n": {"task": "tests.ok", "cron": "0 3 * * *", "misfire": "all"}},
     "schedule 'n': misfire must be one of 'skip', 'catch_up', 'none', got 'all'"),
    ({"n": {"task": "tests.ok", "cron": "0 3 * * *", "overlap": "never"}},
     "schedule 'n': overlap must be one of 'allow', 'skip', got 'never'"),
])
def test_bad_schedule_settings_are_reported_naming_the_schedule(settings, value, message) -> None:
    settings.PGJOBS_SCHEDULES = value
    messages = check_settings()
    assert [m.id for m in messages] == ["pgjobs.E010"]
    assert message in messages[0].msg, messages[0].msg


def test_a_schedule_of_an_unknown_handler_or_refused_jobs_is_a_check_error(settings) -> None:
    from django_pgjobs import Schedule
    from django_pgjobs.checks import check_schedules

    settings.PGJOBS_SCHEDULES = {"n": {"task": "tests.nobody", "cron": "0 3 * * *"}}
    assert check_settings() == []  # well formed: the handler is what is missing
    job("tests.checks.reports", schedules=[Schedule("0 6 * * *", name="tests.checks.q",
                                                    queue="reports")])(lambda ctx, p: None)
    try:
        settings.PGJOBS_QUEUES = ["default"]
        errors = check_schedules()
    finally:
        registry.remove("tests.checks.reports")
    assert [(e.id, e.msg) for e in errors] == [
        ("pgjobs.E012", "schedule 'tests.checks.q': its jobs would be refused: unknown queue "
                        "'reports': PGJOBS_QUEUES declares default"),
        ("pgjobs.E012", "schedule 'n': task 'tests.nobody' has no registered handler (register "
                        "it with @django_pgjobs.job)"),
    ]


def test_the_grace_must_outlast_the_schedule_interval(settings) -> None:
    settings.PGJOBS_SCHEDULE_INTERVAL_SECONDS = 5
    settings.PGJOBS_SCHEDULE_GRACE_SECONDS = 5
    [error] = check_settings()
    assert error.msg.startswith("PGJOBS_SCHEDULE_GRACE_SECONDS must be longer than "
                                "PGJOBS_SCHEDULE_INTERVAL_SECONDS")


@pytest.mark.parametrize("value", [5, "jobs", ["jobs", None]])
def test_handler_modules_the_checks_refuse_leave_start_up_to_report_them(settings, value) -> None:
    from django.apps import apps

    settings.PGJOBS_HANDLER_MODULES = value
    apps.get_app_config("pgjobs").ready()  # what django.setup() runs before the checks
    [error] = check_settings()
    assert error.id == "pgjobs.E010"
    assert error.msg.startswith("PGJOBS_HANDLER_MODULES must be a list of module names")


def test_empty_redact_keys_are_a_warning_naming_the_setting_unless_opted_out(settings) -> None:
    settings.PGJOBS_REDACT_KEYS = []
    [warning] = check_settings()
    assert warning.id == "pgjobs.W003"
    assert warning.msg.startswith("PGJOBS_REDACT_KEYS is empty, which turns key redaction off")
    assert "PGJOBS_REDACT_NO_KEYS = True" in warning.hint
    settings.PGJOBS_REDACT_NO_KEYS = True
    assert check_settings() == []
    settings.PGJOBS_REDACT_KEYS = ["password"]
    settings.PGJOBS_REDACT_NO_KEYS = False
    assert check_settings() == []


def test_migrate_on_a_database_that_is_not_postgresql_prints_the_error_once() -> None:
    env = {name: value for name, value in os.environ.items() if name != "PGJOBS_DATABASE_NAME"}
    env["DATABASE_URL"] = "sqlite:///:memory:"
    run = subprocess.run([sys.executable, str(MANAGE), "migrate"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.count("pgjobs.E001") == 1, run.stderr
    assert "database 'default' uses sqlite; django-pgjobs needs PostgreSQL" in run.stderr


def test_a_worker_runs_the_queues_checks_at_start_and_not_the_web_processes() -> None:
    from django.core.checks import Error, register
    from django.core.checks.registry import registry as checks_registry
    from django.core.management.base import SystemCheckError
    from django.test import override_settings

    from django_pgjobs.checks import PGJOBS
    from django_pgjobs.management.commands.pgjobs_worker import Command

    worker = Command()
    assert worker.requires_system_checks == [PGJOBS]

    @register()  # an app's own check, of a kind a worker has no use for (URLs, templates)
    def broken_web_page(**kwargs: object) -> list[Error]:
        return [Error("a URL pattern is broken", id="web.E001")]

    try:
        worker.check(tags=worker.requires_system_checks)  # what a worker runs at start: passes
        with pytest.raises(SystemCheckError, match=r"web\.E001"):
            worker.check()  # every check, as manage.py check runs them
        with override_settings(PGJOBS_LEASE_SECONDS=-5), pytest.raises(
                SystemCheckError, match=r"pgjobs\.E010"):
            worker.check(tags=worker.requires_system_checks)
    finally:
        checks_registry.registered_checks.discard(broken_web_page)
