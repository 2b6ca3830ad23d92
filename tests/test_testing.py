"""django_pgjobs.testing and its pytest plugin: what was enqueued, and draining due jobs."""

from __future__ import annotations

import os
from datetime import timedelta
from importlib.metadata import entry_points

import pytest
import time_machine
from django.db import connection
from django.test import TestCase, TransactionTestCase
from django.utils import timezone

import django_pgjobs
from django_pgjobs import retry, testing
from django_pgjobs.models import Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus
from django_pgjobs.testing import ANY, JobFailed, assert_enqueued, drain, refute_enqueued
from django_pgjobs.transitions import promote_jobs_due_by
from tests import handlers

pytestmark = pytest.mark.django_db


# --- what was enqueued -------------------------------------------------------------------------


def test_assert_enqueued_matches_payloads_partially_and_returns_the_oldest_match() -> None:
    first = django_pgjobs.enqueue("tests.ok", {"order": {"id": 7, "lines": [1, 2]}, "by": "ada"})
    django_pgjobs.enqueue("tests.ok", {"order": {"id": 7, "lines": [1, 2]}, "by": "bob"})

    assert assert_enqueued("tests.ok", payload={"order": {"id": 7}}).pk == first.pk
    assert assert_enqueued(handlers.ok, payload={"by": "bob", "order": {"lines": [1, ANY]}})
    assert assert_enqueued("tests.ok", payload={"by": ANY}, queue="default", priority=0)
    with pytest.raises(AssertionError):  # lists match element by element, whole length
        assert_enqueued("tests.ok", payload={"order": {"lines": [1]}})
    with pytest.raises(AssertionError):  # JSON keeps true and 1 apart
        assert_enqueued("tests.ok", payload={"order": {"id": True}})


def test_a_failed_assert_lists_the_jobs_of_that_task_and_what_differs() -> None:
    django_pgjobs.enqueue("tests.ok", {"order_id": 4})
    django_pgjobs.enqueue("tests.ok", {"order_id": 5}, queue="billing")
    with pytest.raises(AssertionError) as failed:
        assert_enqueued("tests.ok", payload={"order_id": 3}, queue="default")
    message = str(failed.value)
    assert message.startswith("Expected an enqueued job of task 'tests.ok' with "
                              "payload={'order_id': 3}, queue='default'.\n"
                              "Enqueued jobs of task 'tests.ok' (2):\n")
    assert "payload={'order_id': 4}" in message and "payload={'order_id': 5}" in message
    assert "differs: payload['order_id'] is 4, expected 3" in message
    assert "differs: payload['order_id'] is 5, expected 3" in message


def test_a_failed_assert_quotes_every_payload_redacted() -> None:
    card = "4111111111111111"
    django_pgjobs.enqueue("tests.ok", {"order_id": 4, "card_number": card,
                                       "billing": {"api_key": "k-9876543210"}})
    with pytest.raises(AssertionError) as failed:
        assert_enqueued("tests.ok", payload={"card_number": "4242424242424242"})
    message = str(failed.value)
    assert card not in message and "k-9876543210" not in message
    # (jsonb orders keys by length, then bytes)
    assert "payload={'billing': {'api_key': '[redacted]'}, 'order_id': 4, 'card_number': " \
           "'[redacted]'}" in message
    assert "differs: payload['card_number'] is '[redacted]', expected '4242424242424242'" in (
        message)
    with pytest.raises(AssertionError) as failed:
        assert_enqueued("tests.ok", payload={"billing": {"api_key": {"id": 1}}})
    assert "differs: payload['billing']['api_key'] is '[redacted]', expected a mapping" in (
        str(failed.value))


def test_a_failed_assert_says_what_else_is_enqueued_or_that_nothing_is() -> None:
    with pytest.raises(AssertionError, match="Nothing is enqueued"):
        assert_enqueued("tests.ok")
    django_pgjobs.enqueue("tests.ok", {})
    django_pgjobs.enqueue("tests.ok", {})
    django_pgjobs.enqueue("tests.permanent", {})
    with pytest.raises(AssertionError) as failed:
        assert_enqueued("tests.transient")
    assert "None of that task is enqueued; enqueued: 'tests.ok' (2), 'tests.permanent' (1)." in (
        str(failed.value))
    with pytest.raises(AssertionError, match=r"No handler is registered under the name 'tests\.o"):
        assert_enqueued("tests.okk")


def test_refute_enqueued_fails_naming_the_jobs_that_match() -> None:
    refute_enqueued("tests.ok")
    job = django_pgjobs.enqueue("tests.ok", {"n": 1})
    refute_enqueued("tests.ok", payload={"n": 2})
    refute_enqueued("tests.ok", queue="other")
    with pytest.raises(AssertionError) as failed:
        refute_enqueued("tests.ok", payload={"n": 1})
    assert str(failed.value).splitlines()[0] == (
        "Expected no enqueued job of task 'tests.ok' with payload={'n': 1}, found 1:")
    assert f"job {job.pk}: task='tests.ok'" in str(failed.value)


def test_only_jobs_waiting_to_run_count_as_enqueued() -> None:
    ready = django_pgjobs.enqueue("tests.ok", {"n": 1})
    scheduled = django_pgjobs.enqueue("tests.ok", {"n": 2}, delay=3600)
    done = django_pgjobs.enqueue("tests.ok", {"n": 3})
    Job.objects.filter(pk=done.pk).update(status=JobStatus.CANCELLED, finished_at=timezone.now())

    assert [j.pk for j in testing.enqueued_jobs("tests.ok")] == [ready.pk, scheduled.pk]
    assert [j.pk for j in testing.enqueued_jobs(status="scheduled")] == [scheduled.pk]
    refute_enqueued("tests.ok", payload={"n": 3})
    with pytest.raises(ValueError, match="status must be one of pending, scheduled, throttled, "
                                         "ready, retrying"):
        testing.enqueued_jobs(status="cancelled")


def test_run_at_and_delay_match_within_a_second() -> None:
    at = timezone.now() + timedelta(hours=2)
    django_pgjobs.enqueue("tests.ok", {"n": 1}, run_at=at)
    django_pgjobs.enqueue("tests.ok", {"n": 2}, delay=timedelta(minutes=5))

    assert_enqueued("tests.ok", run_at=at + timedelta(milliseconds=900))
    assert_enqueued("tests.ok", payload={"n": 2}, delay=300)
    assert_enqueued("tests.ok", payload={"n": 2}, delay=timedelta(minutes=5, milliseconds=500))
    with pytest.raises(AssertionError, match="differs: delay is 300s, expected 302s"):
        assert_enqueued("tests.ok", payload={"n": 2}, delay=302)
    with pytest.raises(AssertionError, match="differs: run_at is"):
        assert_enqueued("tests.ok", payload={"n": 1}, run_at=at + timedelta(seconds=2))


def test_options_that_cannot_match_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match=r"unknown match option\(s\) colour, size"):
        assert_enqueued("tests.ok", colour="red", size=1)
    with pytest.raises(ValueError, match="run_at is a naive datetime"):
        assert_enqueued("tests.ok", run_at=timezone.now().replace(tzinfo=None))
    with pytest.raises(ValueError, match="delay must be seconds or a timedelta, got 'soon'"):
        assert_enqueued("tests.ok", delay="soon")
    with pytest.raises(TypeError, match="task must be a task name"):
        assert_enqueued(42)


# --- drain -------------------------------------------------------------------------------------


def test_drain_runs_a_due_job_through_claim_execute_and_settle() -> None:
    job = django_pgjobs.enqueue("tests.ok", {"a": 1})
    [run] = drain()

    assert (run.job_id, run.task, run.attempt, run.outcome, run.status) == (
        job.pk, "tests.ok", 1, AttemptOutcome.SUCCEEDED, JobStatus.SUCCEEDED)
    assert run.result == {"echo": {"a": 1}} and run.error == "" and run.succeeded
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.result, stored.attempts) == (
        JobStatus.SUCCEEDED, {"echo": {"a": 1}}, 1)
    [attempt] = stored.attempt_history()
    assert (attempt.worker_id, attempt.outcome) == (testing.WORKER_ID, AttemptOutcome.SUCCEEDED)
    # Inside the test's transaction the times are still in order (the statements' clock).
    assert stored.created_at <= attempt.claimed_at <= attempt.finished_at == stored.finished_at
    assert drain() == []


def test_drain_runs_jobs_that_jobs_enqueue_in_claim_order() -> None:
    django_pgjobs.enqueue("tests.fan_out", {"n": 3})
    runs = drain()
    assert [(r.task, r.result) for r in runs] == [
        ("tests.fan_out", 3),
        ("tests.ok", {"echo": {"child": 2}}),  # the highest priority first
        ("tests.ok", {"echo": {"child": 1}}),
        ("tests.ok", {"echo": {"child": 0}}),
    ]
    assert runs.outcomes == {"succeeded": 4}
    assert [r.result for r in runs.of(handlers.fan_out)] == [3]


def test_a_failure_waits_for_its_retry_until_now_says_it_is_due() -> None:
    job = django_pgjobs.enqueue("tests.rate_limited", {}, max_attempts=3)
    [first] = drain()
    assert (first.outcome, first.status, first.failure_class) == (
        AttemptOutcome.FAILED, JobStatus.RETRYING, FailureClass.RATE_LIMITED)
    assert "RetryAfter: retry after 120s" in first.error
    assert drain() == []  # the retry is two minutes away
    assert_enqueued("tests.rate_limited", status="retrying", attempts=1)

    runs = drain(now=timezone.now() + timedelta(hours=1))
    assert [(r.attempt, r.outcome, r.status) for r in runs] == [
        (2, AttemptOutcome.FAILED, JobStatus.RETRYING),
        (3, AttemptOutcome.DEAD, JobStatus.DEAD),  # max_attempts bounds the retries
    ]
    assert Job.objects.get(pk=job.pk).terminal_reason == "attempts_exhausted"


def test_a_retry_never_comes_due_in_the_drain_that_failed_it(monkeypatch) -> None:
    monkeypatch.setattr(retry, "backoff_seconds", lambda attempt, **kwargs: 0.0)
    django_pgjobs.enqueue("tests.transient", {})
    # Due a moment after it failed, but drain's clock was read when it started.
    assert [r.outcome for r in drain()] == [AttemptOutcome.FAILED]
    assert [r.outcome for r in drain()] == [AttemptOutcome.FAILED]
    assert [r.attempt for r in drain(max_jobs=5)] == [3]


def test_drain_runs_scheduled_jobs_once_now_passes_their_run_at() -> None:
    later = django_pgjobs.enqueue("tests.ok", {"when": "later"}, delay=3600)
    assert drain() == []
    assert drain(now=timezone.now() + timedelta(minutes=30)) == []
    [run] = drain(now=timezone.now() + timedelta(minutes=61))
    assert run.job_id == later.pk and run.succeeded
    # Only the status was moved early: run_at still says when the job was due.
    assert Job.objects.get(pk=later.pk).run_at == later.run_at


def test_drain_honours_a_clock_frozen_by_time_machine() -> None:
    job = django_pgjobs.enqueue("tests.ok", {"when": "tomorrow"},
                                run_at=timezone.now() + timedelta(days=1))
    with time_machine.travel(timezone.now() + timedelta(hours=23), tick=False):
        assert drain() == []
    with time_machine.travel(timezone.now() + timedelta(hours=25), tick=False):
        [run] = drain()
        assert run.job_id == job.pk and run.succeeded


def test_a_retry_is_due_when_the_travelled_clock_passes_the_databases_time_for_it() -> None:
    # The database schedules retries (and delay=, snoozes) by its own clock, which time-machine
    # does not move: travel from the present and shift, and they come due as they would.
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        django_pgjobs.enqueue("tests.rate_limited", {}, max_attempts=2)
        assert [r.outcome for r in drain()] == [AttemptOutcome.FAILED]
        assert drain() == []
        traveller.shift(timedelta(minutes=1))
        assert drain() == []
        traveller.shift(timedelta(minutes=2))
        assert [r.outcome for r in drain()] == [AttemptOutcome.DEAD]
    # Travelled a day ahead, the same retry is due at once (the documented caveat).
    django_pgjobs.enqueue("tests.rate_limited", {}, max_attempts=2)
    with time_machine.travel(timezone.now() + timedelta(days=1), tick=False):
        assert [r.outcome for r in drain()] == [AttemptOutcome.FAILED, AttemptOutcome.DEAD]


def test_drain_serves_only_the_queues_it_is_given() -> None:
    billing = django_pgjobs.enqueue("tests.ok", {"q": "billing"}, queue="billing")
    django_pgjobs.enqueue("tests.ok", {"q": "default"})
    scheduled = django_pgjobs.enqueue("tests.ok", {"q": "default-later"}, delay=60)
    assert [r.job_id for r in drain("billing", now=timezone.now() + timedelta(hours=1))] == [
        billing.pk]
    # Another queue's scheduled job is not promoted either.
    assert Job.objects.get(pk=scheduled.pk).status == JobStatus.SCHEDULED
    assert len(drain(["default", "emails"])) == 1


def test_max_jobs_bounds_a_drain_and_a_runaway_one_is_an_error(monkeypatch) -> None:
    django_pgjobs.enqueue("tests.forever", {"generation": 0})
    runs = drain(max_jobs=3)
    assert [r.task for r in runs] == ["tests.forever"] * 3
    assert_enqueued("tests.forever", payload={"generation": 3})

    monkeypatch.setattr(testing, "DRAIN_LIMIT", 5)
    with pytest.raises(AssertionError, match="drain ran 5 jobs and more are due"):
        drain()
    # Nothing was claimed and left running.
    assert not Job.objects.filter(status=JobStatus.RUNNING).exists()


def test_raise_errors_raises_the_first_failure_once_it_is_settled() -> None:
    job = django_pgjobs.enqueue("tests.unknown_error", {}, max_attempts=5)
    with pytest.raises(JobFailed) as failed:
        drain(raise_errors=True)
    assert failed.value.run.job_id == job.pk
    message = str(failed.value)
    assert message.startswith(f"job {job.pk} (tests.unknown_error) attempt 1 ended failed "
                              "(unknown), job now retrying: KeyError: 'surprise'")
    assert "Traceback (most recent call last)" in message
    assert Job.objects.get(pk=job.pk).status == JobStatus.RETRYING


def test_a_handler_that_aborts_the_tests_transaction_fails_alone() -> None:
    django_pgjobs.enqueue("tests.aborts_transaction", {})
    ok = django_pgjobs.enqueue("tests.ok", {"after": True}, priority=-1)
    first, second = drain()
    assert (first.outcome, first.status) == (AttemptOutcome.DEAD, JobStatus.DEAD)
    assert "division by zero" in first.error
    assert (second.job_id, second.outcome) == (ok.pk, AttemptOutcome.SUCCEEDED)
    # The test's own transaction is still usable.
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 1


def test_bad_arguments_to_drain_are_refused_before_any_sql(django_assert_num_queries) -> None:
    with django_assert_num_queries(0):
        with pytest.raises(ValueError, match="queue must be a queue name"):
            drain("no spaces")
        with pytest.raises(ValueError, match="queues must be a queue name or a list of them, got"):
            drain(queues=5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="queues must be a queue name or a list of them"):
            drain(queues={"default": 1})  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_jobs must be a whole number from 1 to"):
            drain(max_jobs=0)
        with pytest.raises(ValueError, match="now must be an aware datetime"):
            drain(now=timezone.now().replace(tzinfo=None))
        with pytest.raises(ValueError, match="using must name a database"):
            drain(using="nope")


def test_promote_jobs_due_by_moves_only_waiting_jobs_due_by_then() -> None:
    soon = django_pgjobs.enqueue("tests.ok", {}, delay=60)
    late = django_pgjobs.enqueue("tests.ok", {}, delay=7200, queue="other")
    ready = django_pgjobs.enqueue("tests.ok", {})
    in_an_hour = timezone.now() + timedelta(hours=1)
    assert promote_jobs_due_by(in_an_hour, 10, queues=["other"]) == []
    assert promote_jobs_due_by(in_an_hour, 10) == ["default"]
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses == {soon.pk: "ready", late.pk: "scheduled", ready.pk: "ready"}


# --- in Django's test cases, and the pytest plugin ---------------------------------------------


class DrainInsideATestCase(TestCase):
    """The helpers in the test's own transaction: the claim is a savepoint there."""

    def test_enqueue_assert_and_drain(self) -> None:
        django_pgjobs.enqueue("tests.fan_out", {"n": 1})
        assert_enqueued("tests.fan_out", payload={"n": 1})
        runs = drain()
        self.assertEqual([r.task for r in runs], ["tests.fan_out", "tests.ok"])
        refute_enqueued()
        self.assertTrue(connection.in_atomic_block)


class DrainInATransactionTestCase(TransactionTestCase):
    """The helpers in autocommit, as a worker runs: every settlement commits."""

    def test_enqueue_assert_and_drain(self) -> None:
        django_pgjobs.enqueue("tests.transient", {})
        [run] = drain()
        self.assertEqual((run.outcome, run.status), (AttemptOutcome.FAILED, JobStatus.RETRYING))
        self.assertFalse(connection.in_atomic_block)
        runs = drain(now=timezone.now() + timedelta(hours=1))
        self.assertEqual([r.outcome for r in runs], [AttemptOutcome.FAILED, AttemptOutcome.DEAD])


def test_the_plugin_is_registered_by_an_entry_point_and_loaded(request) -> None:
    [plugin] = [e for e in entry_points(group="pytest11") if e.name == "django_pgjobs"]
    assert plugin.value == "django_pgjobs.pytest_plugin"
    assert request.config.pluginmanager.hasplugin("django_pgjobs")


def test_the_pgjobs_fixture_gives_the_helpers(pgjobs) -> None:
    handlers.ok.enqueue({"via": "fixture"})
    job = pgjobs.assert_enqueued(handlers.ok, payload={"via": pgjobs.ANY})
    assert [r.job_id for r in pgjobs.drain()] == [job.pk]
    pgjobs.refute_enqueued(handlers.ok)
    assert pgjobs.enqueued_jobs() == []


@pytest.mark.django_db(transaction=True)
def test_the_pgjobs_fixture_in_a_transactional_test(pgjobs) -> None:
    handlers.ok.enqueue({"via": "fixture"})
    assert not connection.in_atomic_block
    [run] = pgjobs.drain()
    assert run.succeeded and Job.objects.get(pk=run.job_id).status == JobStatus.SUCCEEDED


# --- timeouts and process isolation, as a worker enforces them ----------------------------------


@pytest.mark.django_db(transaction=True)
def test_drain_runs_a_process_isolated_handler_in_a_child_process() -> None:
    django_pgjobs.enqueue("demo.sleep_process", {"seconds": 0})
    [run] = drain()
    assert (run.outcome, run.status) == (AttemptOutcome.SUCCEEDED, JobStatus.SUCCEEDED)
    assert isinstance(run.result, int) and run.result != os.getpid()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drain_kills_a_process_isolated_handler_at_its_timeout_as_a_worker_does() -> None:
    job = django_pgjobs.enqueue("demo.sleep_process", {"seconds": 30})
    [run] = drain()
    assert (run.outcome, run.status, run.failure_class) == (
        AttemptOutcome.TIMED_OUT, JobStatus.DEAD, FailureClass.TIMEOUT)
    assert run.error.startswith("timed out: still running after ")
    assert run.error.endswith(" (timeout 1s)")
    assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drain_counts_a_process_isolated_timeout_from_the_handlers_start(monkeypatch) -> None:
    # The child's start-up alone (2 s) is longer than the handler's 1 s timeout.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.slow_child_settings")
    django_pgjobs.enqueue("demo.sleep_process", {"seconds": 0.2})
    [run] = drain()
    assert (run.outcome, run.status) == (AttemptOutcome.SUCCEEDED, JobStatus.SUCCEEDED)
    assert run.result != os.getpid()


@pytest.mark.slow
def test_in_the_tests_transaction_a_handler_past_its_timeout_is_settled_timed_out() -> None:
    # A child could not see the test's transaction: the handler runs here, and a worker's
    # outcome is recorded once it returns.
    job = django_pgjobs.enqueue("demo.sleep_process", {"seconds": 1.5})
    [run] = drain()
    assert (run.outcome, run.status, run.failure_class) == (
        AttemptOutcome.TIMED_OUT, JobStatus.DEAD, FailureClass.TIMEOUT)
    assert run.result is None
    assert Job.objects.get(pk=job.pk).status == JobStatus.DEAD
