from __future__ import annotations

from datetime import timedelta

import pytest
from django.db.utils import ConnectionHandler

from django_pgjobs.checks import check_database, check_settings, vendor_messages
from django_pgjobs.registry import job, registry


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


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PGJOBS_LEASE_SECONDS", 0, "PGJOBS_LEASE_SECONDS must be > 0"),
        ("PGJOBS_MAX_ATTEMPTS", "5", "PGJOBS_MAX_ATTEMPTS must be a number"),
        ("PGJOBS_POLL_INTERVAL_SECONDS", -1, "must be > 0"),
        ("PGJOBS_MAX_SNOOZES", -1, "PGJOBS_MAX_SNOOZES must be >= 0"),
        ("PGJOBS_QUEUES", "default", "PGJOBS_QUEUES must be None or a list"),
        ("PGJOBS_QUEUES", ["billing"], "PGJOBS_QUEUE must be one of PGJOBS_QUEUES"),
        ("PGJOBS_RETENTION_SECONDS", {"done": 1}, "must be a dict with keys among"),
        ("PGJOBS_REDACT_KEYS", "password", "PGJOBS_REDACT_KEYS must be a list"),
    ],
)
def test_bad_settings_are_reported_by_name(settings, name, value, message) -> None:
    setattr(settings, name, value)
    messages = check_settings()
    assert any(message in m.msg for m in messages), [m.msg for m in messages]


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
