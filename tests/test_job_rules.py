"""The job table's rules (pgjobs_job_rules, migration 0019): each refuses by its name, with the
values the Python side uses, and they are the table's only CHECK."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

import django_pgjobs
from django_pgjobs.models import JOB_RULE_COLUMNS, Job
from django_pgjobs.status import JobStatus
from django_pgjobs.validation import MAX_RUNNING_LIMIT, PRIORITY_MAX, PRIORITY_MIN

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 6, tzinfo=UTC)
# A ready job with no limit, rate, tick or dependency: every rule holds.
READY = {
    "status": "ready", "priority": 0, "base_priority": 0, "attempts": 0, "max_attempts": 20,
    "snoozes": 0, "lease_seconds": 30, "payload_version": 1, "lease_owner": None,
    "lease_token": None, "lease_expires_at": None, "finished_at": None, "timeout_seconds": None,
    "schedule": None, "scheduled_at": None, "limit_key": None, "limit_max": None,
    "limit_slot": None, "rate_interval": None, "rate_burst": None, "rate_weight": None,
    "pending_dependencies": None,
}
RUNNING = {**READY, "status": "running", "lease_owner": "w1", "lease_token": uuid.uuid4(),
           "lease_expires_at": NOW}
RATED = {**READY, "limit_key": "k:1", "limit_max": 1, "rate_interval": 1.0, "rate_burst": 2,
         "rate_weight": 1}


def broken_rule(**changed: Any) -> str | None:
    """The rule a job of READY's values with ``changed`` breaks, by the name it is refused
    under; None if it breaks none."""
    values = {**READY, **changed}
    assert set(values) == set(JOB_RULE_COLUMNS)
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT unnest(proargtypes::regtype[])::text FROM pg_proc "
                           "WHERE proname = 'pgjobs_job_rules'")
            types = [t for (t,) in cursor.fetchall()]
            assert len(types) == len(JOB_RULE_COLUMNS)
            arguments = ", ".join(f"%s::{t}" for t in types)
            cursor.execute(f"SELECT pgjobs_job_rules({arguments})",
                           [values[c] for c in JOB_RULE_COLUMNS])
            assert cursor.fetchone() == (True,)
    except IntegrityError as refused:
        cause = refused.__cause__
        assert isinstance(cause, psycopg.errors.CheckViolation)
        assert cause.diag.table_name == "pgjobs_job"
        assert f'violates check constraint "{cause.diag.constraint_name}"' in str(refused)
        return cause.diag.constraint_name
    return None


@pytest.mark.parametrize(("changed", "rule"), [
    ({"status": "finished"}, "pgjobs_job_status_valid"),
    ({"priority": PRIORITY_MAX + 1}, "pgjobs_job_priority_range"),
    ({"base_priority": PRIORITY_MIN - 1}, "pgjobs_job_priority_range"),
    ({"status": "running"}, "pgjobs_job_lease_state"),
    ({**RUNNING, "lease_owner": None}, "pgjobs_job_lease_state"),
    ({"lease_token": uuid.uuid4()}, "pgjobs_job_lease_state"),
    ({"lease_expires_at": NOW}, "pgjobs_job_lease_state"),
    ({"status": "succeeded"}, "pgjobs_job_terminal_finished"),
    ({"max_attempts": 0}, "pgjobs_job_bounds"),
    ({"lease_seconds": 0}, "pgjobs_job_bounds"),
    ({"attempts": -1}, "pgjobs_job_counts"),
    ({"snoozes": -1}, "pgjobs_job_counts"),
    ({"payload_version": -1}, "pgjobs_job_counts"),
    ({"limit_key": "k:1", "limit_max": 2, "limit_slot": -1}, "pgjobs_job_counts"),
    # A burst alone, without the weight that makes the rate rule whole, is still no count.
    ({"limit_key": "k:1", "limit_max": 1, "rate_burst": -1}, "pgjobs_job_counts"),
    ({"timeout_seconds": 0.0}, "pgjobs_job_timeout_positive"),
    ({"limit_key": "k:1", "limit_max": 0}, "pgjobs_job_limit_pair"),
    ({"limit_max": 3}, "pgjobs_job_limit_pair"),
    ({"limit_key": "k:1", "limit_max": MAX_RUNNING_LIMIT + 1}, "pgjobs_job_limit_pair"),
    ({"rate_interval": 1.0}, "pgjobs_job_rate_whole"),
    ({**RATED, "limit_max": 2}, "pgjobs_job_rate_whole"),
    ({**RATED, "rate_weight": 3}, "pgjobs_job_rate_whole"),
    ({**RATED, "rate_interval": 0.0}, "pgjobs_job_rate_whole"),
    ({**RATED, "rate_burst": MAX_RUNNING_LIMIT + 1}, "pgjobs_job_rate_whole"),
    ({"status": "pending", "pending_dependencies": 0}, "pgjobs_job_pending_waits"),
    ({"schedule": 1}, "pgjobs_job_tick_pair"),
    ({"scheduled_at": NOW}, "pgjobs_job_tick_pair"),
])
def test_each_rule_refuses_a_row_that_breaks_it_by_its_name(changed, rule) -> None:
    assert broken_rule(**changed) == rule


@pytest.mark.parametrize("changed", [
    {},
    RUNNING,
    RATED,
    {"priority": PRIORITY_MAX, "base_priority": PRIORITY_MIN},
    {"limit_key": "k:1", "limit_max": MAX_RUNNING_LIMIT, "limit_slot": 0},
    {**RATED, "rate_burst": MAX_RUNNING_LIMIT, "rate_weight": MAX_RUNNING_LIMIT},
    {"status": "pending", "pending_dependencies": 1},
    {"schedule": 1, "scheduled_at": NOW},
    {"timeout_seconds": 0.001, "max_attempts": 1, "lease_seconds": 1},
    *({"status": status, "finished_at": NOW} for status in
      (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)),
    *({"status": status} for status in
      (JobStatus.SCHEDULED, JobStatus.THROTTLED, JobStatus.RETRYING)),
    # A rule whose columns are NULL passes, as a CHECK constraint's would.
    {"max_attempts": None, "priority": None, "status": None},
])
def test_rows_within_every_rule_pass(changed) -> None:
    assert broken_rule(**changed) is None


def test_every_status_is_one_the_rules_know() -> None:
    for status in JobStatus.values:
        assert broken_rule(status=status) not in ("pgjobs_job_status_valid",)


def test_a_write_that_breaks_a_rule_is_refused_and_the_callers_transaction_goes_on() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    with transaction.atomic():
        with pytest.raises(IntegrityError, match="pgjobs_job_lease_state"), \
                transaction.atomic():
            Job.objects.filter(pk=job.pk).update(status=JobStatus.RUNNING)
        assert Job.objects.get(pk=job.pk).status == JobStatus.READY


def test_the_rules_are_the_tables_only_check() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT conname FROM pg_constraint "
                       "WHERE conrelid = 'pgjobs_job'::regclass AND contype = 'c'")
        assert [name for (name,) in cursor.fetchall()] == ["pgjobs_job_rules"]


def test_a_jobs_constraints_validate_in_python_through_the_rules() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    job.validate_constraints()  # a valid job: nothing raised
    job.status = JobStatus.RUNNING
    with transaction.atomic():
        with pytest.raises(ValidationError, match="pgjobs_job_lease_state"):
            job.validate_constraints()
        assert Job.objects.get(pk=job.pk).status == JobStatus.READY  # the transaction goes on


def test_a_value_out_of_its_columns_range_fails_validation_by_name_not_by_a_data_error() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})
    job.priority = 40_000  # past smallint: no rule is reached, the value itself is refused
    with transaction.atomic():
        with pytest.raises(ValidationError, match="smallint"):
            job.validate_constraints()
        assert Job.objects.filter(pk=job.pk).exists()  # the transaction goes on
