from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import django_pgjobs
from django_pgjobs.executor import ERROR_MAX_CHARS
from django_pgjobs.models import Attempt, Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from django_pgjobs.testing import drain

pytestmark = pytest.mark.django_db


def run_one(task: str, payload, **options) -> tuple[Job, Attempt]:
    """Enqueue one job, then claim, execute and settle it the way a worker does."""
    enqueued = django_pgjobs.enqueue(task, payload, **options)
    [run] = drain(max_jobs=1)
    assert run.job_id == enqueued.pk and run.outcome != AttemptOutcome.LOST
    job = Job.objects.get(pk=run.job_id)
    [attempt] = job.attempt_history()  # a success as its job keeps it: it has no row
    return job, attempt


def run_claimed() -> Job:
    """Claim, execute and settle the one ready job whose row a test changed after enqueue."""
    [run] = drain(max_jobs=1)
    return Job.objects.get(pk=run.job_id)


def test_success_stores_the_result() -> None:
    job, attempt = run_one("tests.ok", {"a": 1})
    assert (job.status, job.terminal_reason, job.result) == (
        JobStatus.SUCCEEDED, TerminalReason.SUCCEEDED, {"echo": {"a": 1}})
    assert attempt.outcome == AttemptOutcome.SUCCEEDED and attempt.duration_ms is not None


def test_transient_failure_retries_with_backoff_and_keeps_the_error() -> None:
    job, attempt = run_one("tests.transient", {})
    assert (job.status, job.failure_class) == (JobStatus.RETRYING, FailureClass.TRANSIENT)
    assert job.attempts == 1 and job.finished_at is None
    assert "Transient: upstream 503" in job.last_error
    assert attempt.outcome == AttemptOutcome.FAILED
    assert "upstream 503" in attempt.error and "Traceback" in attempt.traceback


def test_permanent_failure_is_dead_at_once_with_a_reason() -> None:
    job, attempt = run_one("tests.permanent", {}, max_attempts=10)
    assert (job.status, job.terminal_reason, job.failure_class) == (
        JobStatus.DEAD, TerminalReason.PERMANENT_ERROR, FailureClass.PERMANENT)
    assert job.attempts == 1 and "card declined" in job.last_error
    assert attempt.outcome == AttemptOutcome.DEAD


def test_last_attempt_ends_dead_with_attempts_exhausted() -> None:
    job, _ = run_one("tests.unknown_error", {}, max_attempts=1)
    assert (job.status, job.terminal_reason, job.failure_class) == (
        JobStatus.DEAD, TerminalReason.ATTEMPTS_EXHAUSTED, FailureClass.UNKNOWN)


def test_rate_limited_waits_for_the_hint() -> None:
    job, _ = run_one("tests.rate_limited", {})
    assert job.status == JobStatus.RETRYING and job.failure_class == FailureClass.RATE_LIMITED
    assert job.run_at - job.updated_at >= timedelta(seconds=120)


def test_per_handler_mappings_classify() -> None:
    job, _ = run_one("tests.retry_on", {"raise": "lookup"})
    assert job.failure_class == FailureClass.TRANSIENT and job.status == JobStatus.RETRYING
    job, _ = run_one("tests.retry_on", {"raise": "zero"})
    assert job.failure_class == FailureClass.PERMANENT and job.status == JobStatus.DEAD


def test_snooze_defers_without_using_an_attempt(settings) -> None:
    job, attempt = run_one("tests.snooze", {"seconds": 60})
    assert (job.status, job.attempts, job.snoozes) == (JobStatus.SCHEDULED, 0, 1)
    assert job.run_at - job.updated_at == timedelta(seconds=60)
    assert attempt.outcome == AttemptOutcome.SNOOZED


def test_snoozing_past_the_limit_is_dead(settings) -> None:
    settings.PGJOBS_MAX_SNOOZES = 0
    job, _ = run_one("tests.snooze", {"seconds": 1})
    assert (job.status, job.terminal_reason) == (JobStatus.DEAD, TerminalReason.SNOOZE_LIMIT)


@pytest.mark.parametrize("task", ["tests.system_exit", "tests.keyboard_interrupt"])
def test_base_exceptions_from_a_handler_are_recorded_not_raised(task: str) -> None:
    job, attempt = run_one(task, {})
    assert job.status == JobStatus.RETRYING and job.failure_class == FailureClass.UNKNOWN
    assert attempt.outcome == AttemptOutcome.FAILED


def test_a_return_value_that_is_not_json_is_a_permanent_failure() -> None:
    job, _ = run_one("tests.bad_return", {})
    assert (job.status, job.failure_class) == (JobStatus.DEAD, FailureClass.PERMANENT)
    assert "not JSON" in job.last_error


def test_old_payloads_are_upgraded_before_the_handler_sees_them() -> None:
    job, _ = run_one("tests.versioned", {"amount": 5}, payload_version=1)
    assert job.result == {"currency": "EUR", "amount_cents": 500}


def test_a_payload_newer_than_the_handler_waits_for_a_newer_worker() -> None:
    # Enqueue refuses a version newer than its own handler's, so a job written by a newer
    # deploy (whose handler is at version 4) is made by changing the row.
    django_pgjobs.enqueue("tests.versioned", {"amount": 5}, payload_version=3)
    Job.objects.update(payload_version=4)
    job = run_claimed()
    attempt = Attempt.objects.get(job_id=job.pk)
    assert (job.status, job.failure_class, job.attempts) == (
        JobStatus.RETRYING, FailureClass.UNSUPPORTED_VERSION, 0)
    assert "newer than this worker" in attempt.error


def test_an_unknown_task_at_run_time_waits_within_the_deploy_window(settings) -> None:
    from tests.handlers import ok

    django_pgjobs.enqueue(ok, {})
    Job.objects.update(task="renamed.in.a.newer.release")
    job = run_claimed()
    assert (job.status, job.failure_class, job.attempts) == (
        JobStatus.RETRYING, FailureClass.UNKNOWN_TASK, 0)


def test_an_unknown_task_after_the_window_is_dead(settings) -> None:
    settings.PGJOBS_UNKNOWN_TASK_RETRY_SECONDS = 60
    django_pgjobs.enqueue("tests.ok", {})
    Job.objects.update(task="gone", created_at=timezone.now() - timedelta(hours=1))
    job = run_claimed()
    assert (job.status, job.terminal_reason) == (JobStatus.DEAD, TerminalReason.UNKNOWN_TASK)


def test_a_job_past_its_deadline_is_not_run() -> None:
    from tests.handlers import events

    events.clear()
    django_pgjobs.enqueue("tests.ok", {"late": True})
    Job.objects.update(deadline=timezone.now() - timedelta(hours=1))
    job = run_claimed()
    assert (job.status, job.terminal_reason) == (JobStatus.DEAD, TerminalReason.DEADLINE_PASSED)
    assert events == []


@django_pgjobs.job("tests.executor.surrogate_result")
def surrogate_result(ctx, payload):
    return {"name": "bad \udcff byte"}


@django_pgjobs.job("tests.executor.leaky", max_attempts=1)
def leaky(ctx, payload):
    # The secret straddles the error's cut: only scrubbing before cutting hides all of it.
    padding = "x" * (ERROR_MAX_CHARS - len("ValueError: ") - 11)  # the cut falls in the key
    raise ValueError(f"{padding} {payload['api_key']} and postgres://app:pw-123456@db/x")


def test_a_result_postgresql_cannot_store_is_a_classified_failure_that_says_why() -> None:
    job, attempt = run_one("tests.executor.surrogate_result", {})
    assert (job.status, job.failure_class, job.terminal_reason) == (
        JobStatus.DEAD, FailureClass.PERMANENT, TerminalReason.PERMANENT_ERROR)
    assert job.result is None
    assert attempt.error.startswith("handler returned a value with a lone surrogate ('\\udcff')")


def test_errors_are_scrubbed_before_they_are_cut() -> None:
    job, attempt = run_one("tests.executor.leaky", {"api_key": "sk_live_ABCDEFGHIJ"})
    assert len(attempt.error) <= ERROR_MAX_CHARS
    for stored in (attempt.error, attempt.traceback, job.last_error):
        assert "sk_live" not in stored and "ABCDEF" not in stored
        assert "pw-123456" not in stored
    assert "postgres://app:[redacted]@db/x" in attempt.traceback


def test_an_upgrade_that_raises_is_classified_like_a_handler_error_with_its_secret_scrubbed(
) -> None:
    job, attempt = run_one("tests.upgrade_fails", {"password": "hunter2-secret", "n": 1},
                           payload_version=1, max_attempts=5)
    # A ValueError from a handler is an unknown failure, retried: so is one from its upgrade.
    assert (job.status, job.terminal_reason, job.failure_class, job.attempts) == (
        JobStatus.RETRYING, "", FailureClass.UNKNOWN, 1)
    assert job.last_error == ("payload upgrade from version 1 failed: ValueError: cannot "
                              "upgrade {'n': 1, 'password': [redacted]}")
    assert attempt.outcome == AttemptOutcome.FAILED
    assert "_upgrade_fails_v1_to_v2" in attempt.traceback
    for text in (job.last_error, attempt.error, attempt.traceback):
        assert "hunter2-secret" not in text


@django_pgjobs.job("tests.executor.upgrade_unreachable", version=2)
def upgrade_unreachable(ctx, payload):
    return payload


@upgrade_unreachable.upgrade(from_version=1)
def _upgrade_unreachable_v1(payload):
    raise ConnectionError("the rates service is down")


@django_pgjobs.job("tests.executor.upgrade_permanent_on", version=2, permanent_on=(ValueError,))
def upgrade_permanent_on(ctx, payload):
    return payload


@upgrade_permanent_on.upgrade(from_version=1)
def _upgrade_permanent_on_v1(payload):
    raise ValueError("no such currency")


@django_pgjobs.job("tests.executor.upgrade_interrupted", version=2)
def upgrade_interrupted(ctx, payload):
    return payload


@upgrade_interrupted.upgrade(from_version=1)
def _upgrade_interrupted_v1(payload):
    raise KeyboardInterrupt


def test_an_upgrade_that_fails_transiently_is_retried() -> None:
    job, _ = run_one("tests.executor.upgrade_unreachable", {}, payload_version=1)
    assert (job.status, job.failure_class) == (JobStatus.RETRYING, FailureClass.TRANSIENT)
    assert job.last_error == ("payload upgrade from version 1 failed: ConnectionError: the "
                              "rates service is down")


def test_an_upgrade_error_the_handler_names_permanent_ends_the_job() -> None:
    job, _ = run_one("tests.executor.upgrade_permanent_on", {}, payload_version=1,
                     max_attempts=5)
    assert (job.status, job.terminal_reason, job.failure_class) == (
        JobStatus.DEAD, TerminalReason.PERMANENT_ERROR, FailureClass.PERMANENT)


def test_an_interrupt_in_an_upgrade_is_not_recorded_as_the_jobs_failure() -> None:
    django_pgjobs.enqueue("tests.executor.upgrade_interrupted", {}, payload_version=1)
    with pytest.raises(KeyboardInterrupt):
        drain(max_jobs=1)
