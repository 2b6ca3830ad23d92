"""PgJobsBackend, tested the way Django tests its own task backends, plus runs by real workers."""

from __future__ import annotations

import asyncio
import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core import checks
from django.db import transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

import django_pgjobs
from django_pgjobs.backend import PgJobsBackend, TaskFailed, names, option_problems, task_name
from django_pgjobs.models import Attempt, Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus
from django_pgjobs.testing import assert_enqueued, drain
from django_pgjobs.worker import Worker
from tests.conftest import wait_for
from tests.factories import AttemptFactory, JobFactory

try:
    from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

ran: list[tuple[str, Any]] = []


@task()
def noop() -> None:
    ran.append(("noop", None))


@task()
def add(a: int, b: int) -> int:
    ran.append(("add", (a, b)))
    return a + b


@task(queue_name="flaky")
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task()
async def add_async(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task()
async def sleep_async(seconds: float) -> None:
    await asyncio.sleep(seconds)


@task(takes_context=True)
def with_context(context: Any, label: str) -> dict[str, Any]:
    return {"label": label, "attempt": context.attempt, "id": context.task_result.id}


@task()
def bad_return() -> Any:
    return {"when": object()}


@task(priority=10)
def ordered(label: str) -> str:
    ran.append(("ordered", label))
    return label


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


# --- the backend's declared features ---------------------------------------------------------


def test_backend_supports_every_feature() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, PgJobsBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    assert default_task_backend.alias == "default"


# --- enqueue ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enqueue_returns_a_ready_result_and_writes_one_job() -> None:
    result = add.enqueue(2, b=3)

    assert result.status == TaskResultStatus.READY
    assert result.task == add
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.backend == "default"
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None, None, None)
    assert (result.errors, result.worker_ids, result.attempts) == ([], [], 0)
    assert result.is_finished is False
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value
    job = Job.objects.get(pk=int(result.id))
    assert job.task == "django.tasks:tests.test_backend.add" == task_name(add)
    assert job.payload == {"args": [2], "kwargs": {"b": 3}, "backend": "default"}
    assert (job.queue, job.priority, job.status) == ("default", 0, JobStatus.READY)
    assert job.created_at == result.enqueued_at


@pytest.mark.django_db
def test_enqueue_normalizes_arguments_like_django() -> None:
    result = add.enqueue((1, 2), b=b"bytes")
    assert (result.args, result.kwargs) == ([[1, 2]], {"b": "bytes"})
    assert Job.objects.get(pk=int(result.id)).payload["args"] == [[1, 2]]


@pytest.mark.django_db
def test_enqueue_refuses_arguments_that_are_not_json() -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        add.enqueue(timezone.now(), 1)
    # Stricter than Django: an int key would come back as a string.
    with pytest.raises(django_pgjobs.PayloadNotJSON, match="is a int, not a string"):
        add.enqueue({1: "one"}, 1)
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_priority_queue_and_run_after_become_job_columns() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(priority=-20, queue_name="reports", run_after=later).enqueue(1, 1)
    job = Job.objects.get(pk=int(result.id))
    assert (job.priority, job.base_priority, job.queue) == (-20, -20, "reports")
    assert (job.status, job.run_at) == (JobStatus.SCHEDULED, later)
    assert result.task.run_after == later
    assert add.get_backend().get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_callers_transaction() -> None:
    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        result = noop.enqueue()
        assert Job.objects.filter(pk=int(result.id)).exists()
        raise Rollback
    with pytest.raises(TaskResultDoesNotExist):
        noop.get_result(result.id)


@pytest.mark.django_db
def test_enqueue_sends_task_enqueued_from_the_backend_class() -> None:
    seen: list[tuple[type, str]] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result.status))

    task_enqueued.connect(receiver)
    try:
        noop.enqueue()
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [(PgJobsBackend, TaskResultStatus.READY)]


@pytest.mark.django_db
def test_a_failing_enqueue_receiver_does_not_stop_the_enqueue(caplog) -> None:
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_enqueued.connect(broken)
    try:
        result = noop.enqueue()
    finally:
        task_enqueued.disconnect(broken)
    assert Job.objects.filter(pk=int(result.id)).exists()
    assert "receiver bug" in caplog.text and "task_enqueued" in caplog.text


@pytest.mark.django_db
def test_aenqueue_and_aget_result() -> None:
    result = async_to_sync(add.aenqueue)(4, 5)
    assert result.status == TaskResultStatus.READY
    fetched = async_to_sync(add.aget_result)(result.id)
    assert (fetched.id, fetched.args, fetched.status) == (result.id, [4, 5],
                                                          TaskResultStatus.READY)
    fetched = async_to_sync(default_task_backend.aget_result)(result.id)
    assert fetched.task == add


# --- validation, with Django's messages ------------------------------------------------------


def test_a_function_that_is_not_module_level_is_refused() -> None:
    def local() -> None:
        pass

    message = "Task function must be defined at a module level."
    with pytest.raises(InvalidTask, match=re.escape(message)):
        task()(local)


def test_takes_context_needs_a_context_argument() -> None:
    message = "Task takes context but does not have a first argument of 'context'."
    with pytest.raises(InvalidTask, match=re.escape(message)):
        task(takes_context=True)(add.func)


@pytest.mark.parametrize("priority", [-101, 101])
def test_priority_out_of_range_is_refused(priority: int) -> None:
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        add.using(priority=priority)


def test_naive_run_after_is_refused() -> None:
    with pytest.raises(InvalidTask, match=re.escape("run_after must be an aware datetime.")):
        add.using(run_after=datetime(2030, 1, 1))


def test_queue_not_in_queues_is_refused() -> None:
    tasks = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend",
                         "QUEUES": ["default"]}}
    with override_settings(TASKS=tasks):
        with pytest.raises(InvalidTask, match=re.escape("Queue 'mail' is not valid for backend.")):
            add.using(queue_name="mail")
        assert add.using(queue_name="default").queue_name == "default"


def test_queue_not_declared_in_pgjobs_queues_is_refused() -> None:
    with override_settings(PGJOBS_QUEUES=["default"]), pytest.raises(
        InvalidTask, match="Queue 'mail' is not valid for backend: PGJOBS_QUEUES does not"
    ):
        add.using(queue_name="mail")


@pytest.mark.django_db
def test_get_result_of_an_unknown_or_malformed_id() -> None:
    job = django_pgjobs.enqueue("tests.ok", {})  # a plain job is not a task result
    for bad in ["", "abc", "-1", "0", "1.5", " 1", "99999999999999999999", str(job.pk),
                str(job.pk + 1000)]:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bad)


@pytest.mark.django_db
def test_get_result_of_another_task_is_a_mismatch() -> None:
    result = add.enqueue(1, 2)
    assert add.get_result(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        noop.get_result(result.id)


@pytest.mark.django_db
def test_get_result_is_one_query(django_assert_num_queries) -> None:
    result = add.enqueue(1, 2)
    with django_assert_num_queries(1):
        add.get_backend().get_result(result.id)


@pytest.mark.django_db
def test_results_map_every_attempt_outcome_with_djangos_meanings() -> None:
    job = JobFactory(task=task_name(add), retrying=True, attempts=2,
                     payload={"args": [1, 2], "kwargs": {}, "backend": "default"})
    now = timezone.now()
    AttemptFactory(job=job, number=1, worker_id="w1", outcome=AttemptOutcome.RELEASED,
                   claimed_at=now - timedelta(minutes=5))
    AttemptFactory(job=job, number=1, worker_id="w2", outcome=AttemptOutcome.LEASE_EXPIRED,
                   failure_class="lease_expired", error="lease held by w2 expired",
                   claimed_at=now - timedelta(minutes=4))
    AttemptFactory(job=job, number=2, worker_id="w3", outcome=AttemptOutcome.FAILED,
                   failure_class="unknown", error="KeyError: 'sku'",
                   traceback="Traceback ...\nKeyError: 'sku'",
                   claimed_at=now - timedelta(minutes=3))

    result = add.get_result(str(job.pk))

    assert result.status == TaskResultStatus.READY  # waiting to be executed again
    assert result.worker_ids == ["w2", "w3"]  # the released attempt never ran
    assert result.started_at == now - timedelta(minutes=4)
    assert result.last_attempted_at == now - timedelta(minutes=3)
    assert [e.exception_class_path for e in result.errors] == [
        "django_pgjobs.exceptions.LeaseLost", "builtins.KeyError",
    ]
    assert result.errors[1].exception_class is KeyError
    assert result.finished_at is None


@pytest.mark.django_db
def test_a_cancelled_task_reads_as_failed() -> None:
    job = JobFactory(task=task_name(noop), cancelled=True,
                     payload={"args": [], "kwargs": {}, "backend": "default"})
    result = noop.get_result(str(job.pk))
    assert (result.status, result.attempts, result.errors) == (TaskResultStatus.FAILED, 0, [])
    assert result.finished_at == job.finished_at


# --- checks ----------------------------------------------------------------------------------


def errors_of(tasks: dict[str, Any], **extra: Any) -> list[tuple[str, str]]:
    with override_settings(TASKS=tasks, **extra):
        return [(m.id or "", m.msg) for m in task_backends["default"].check()]


def test_check_passes_for_the_test_settings() -> None:
    assert task_backends["default"].check() == []
    messages = checks.run_checks()
    assert [m for m in messages if (m.id or "").startswith("pgjobs.E1")] == []


def test_check_reports_an_unknown_database_and_bad_options() -> None:
    tasks = {"default": {
        "BACKEND": "django_pgjobs.backend.PgJobsBackend",
        "OPTIONS": {"database": "nope", "retries": 3, "max_attempts": 0,
                    "queues": {"mail": {"lease_seconds": "long", "colour": "red"}}},
    }}
    found = errors_of(tasks)
    assert ("pgjobs.E102",
            "TASKS['default'] OPTIONS['database'] names an unknown database 'nope'.") in found
    problems = [msg for code, msg in found if code == "pgjobs.E103"]
    assert problems == [
        "TASKS['default'] " + p for p in option_problems(tasks["default"]["OPTIONS"])
    ]
    assert len(problems) == 4
    assert any("unknown key 'retries'" in p for p in problems)
    assert any("OPTIONS['max_attempts'] must be a whole number from 1 to 1000000, got 0." in p
               for p in problems)
    assert any("OPTIONS['queues']['mail']['lease_seconds'] must be a number, got 'long'." in p
               for p in problems)
    assert any("OPTIONS['queues']['mail'] has an unknown key 'colour'" in p for p in problems)


def test_check_reports_queues_pgjobs_does_not_accept() -> None:
    tasks = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend",
                         "QUEUES": ["default", "x" * 65]}}
    found = errors_of(tasks, PGJOBS_QUEUES=["default"])
    assert [code for code, _ in found] == ["pgjobs.E104"]
    assert "the queue must be a queue name (1 to 64 letters" in found[0][1]


def test_check_reports_the_app_missing() -> None:
    from django.conf import settings

    apps_without = [a for a in settings.INSTALLED_APPS if a != "django_pgjobs"]
    with override_settings(INSTALLED_APPS=apps_without):
        found = [(m.id, m.msg) for m in task_backends["default"].check()]
    assert found == [("pgjobs.E101", "TASKS['default'] uses PgJobsBackend, but django_pgjobs "
                                     "is not in INSTALLED_APPS.")]


# --- run the way the pgjobs worker runs them (django_pgjobs.testing.drain) ---------------------

pytestmark_worker = pytest.mark.django_db(transaction=True)
LATER = timedelta(hours=1)  # drain(now=timezone.now() + LATER) runs every retry that waits


@pytest.mark.django_db
def test_a_task_runs_and_its_result_reads_back() -> None:
    result = add.enqueue(2, 3)
    assert_enqueued(add, args=[2, 3], kwargs={})
    [run] = drain()

    assert ran == [("add", (2, 3))] and run.result == 5
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.is_finished
    # A success has no attempt row: the job keeps it, and the result reads it from there.
    assert not Attempt.objects.filter(job_id=int(result.id)).exists()
    [attempt] = Job.objects.get(pk=int(result.id)).attempt_history()
    assert result.worker_ids == [attempt.worker_id] and result.attempts == 1
    assert result.started_at == result.last_attempted_at == attempt.claimed_at
    assert result.finished_at == Job.objects.get(pk=int(result.id)).finished_at
    assert result.errors == []


@pytest.mark.django_db
def test_async_context_and_keyword_tasks_run() -> None:
    async_result = add_async.enqueue(20, b=22)
    context_result = with_context.enqueue("hello")
    drain()
    assert add_async.get_result(async_result.id).return_value == 42
    assert with_context.get_result(context_result.id).return_value == {
        "label": "hello", "attempt": 1, "id": context_result.id,
    }


@pytest.mark.django_db
def test_a_failing_task_is_retried_then_failed_with_one_error_per_attempt() -> None:
    tasks = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend", "QUEUES": [],
                         "OPTIONS": {"queues": {"flaky": {"max_attempts": 2}}}}}
    with override_settings(TASKS=tasks):
        result = fail.enqueue("bad input")
        assert Job.objects.get(pk=int(result.id)).max_attempts == 2
        runs = drain(now=timezone.now() + LATER)
        final = fail.get_result(result.id)

    assert [r.outcome for r in runs] == [AttemptOutcome.FAILED, AttemptOutcome.DEAD]
    assert final.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = final.return_value
    attempts = list(Attempt.objects.filter(job_id=int(result.id)).order_by("claimed_at"))
    assert final.attempts == 2 == len(attempts)
    assert final.worker_ids == [a.worker_id for a in attempts]
    assert [e.exception_class for e in final.errors] == [ValueError, ValueError]
    assert all("ValueError: bad input" in e.traceback for e in final.errors)
    assert final.started_at == attempts[0].claimed_at
    assert final.last_attempted_at == attempts[1].claimed_at
    assert final.finished_at is not None


@pytest.mark.django_db
def test_a_return_value_that_is_not_json_fails_at_once_with_the_exception_django_records() -> None:
    finished: list[Any] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    result = bad_return.enqueue()
    task_finished.connect(receiver)
    try:
        [run] = drain()
    finally:
        task_finished.disconnect(receiver)
    assert (run.outcome, run.status, run.failure_class) == (
        AttemptOutcome.DEAD, JobStatus.DEAD, FailureClass.PERMANENT)
    final = bad_return.get_result(result.id)
    assert (final.status, final.attempts) == (TaskResultStatus.FAILED, 1)
    # The exception normalize_json raised, as Django's own backends record it, with its
    # traceback, in the stored result and in the one task_finished carried.
    for seen in (final, finished[-1]):
        [error] = seen.errors
        assert error.exception_class is TypeError
        assert error.exception_class_path == "builtins.TypeError"
        assert "Traceback (most recent call last)" in error.traceback
        assert "TypeError: Unsupported type" in error.traceback
    assert Attempt.objects.get(job_id=int(result.id)).error.startswith("TypeError: Unsupported")


@pytest.mark.django_db
def test_signals_carry_djangos_meanings_and_a_raising_receiver_changes_nothing() -> None:
    seen: list[tuple[str, str, int, type]] = []

    def started(sender: type, task_result: Any, **kwargs: Any) -> None:
        seen.append(("started", task_result.status, task_result.attempts, sender))
        raise RuntimeError("broken started receiver")

    def finished(sender: type, task_result: Any, **kwargs: Any) -> None:
        seen.append(("finished", task_result.status, len(task_result.errors), sender))
        raise RuntimeError("broken finished receiver")

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok = add.enqueue(1, 1)
        bad = bad_return.enqueue()
        drain()
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)

    assert add.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    assert bad_return.get_result(bad.id).status == TaskResultStatus.FAILED
    assert seen == [
        ("started", TaskResultStatus.RUNNING, 1, PgJobsBackend),
        ("finished", TaskResultStatus.SUCCESSFUL, 0, PgJobsBackend),
        ("started", TaskResultStatus.RUNNING, 1, PgJobsBackend),
        ("finished", TaskResultStatus.FAILED, 1, PgJobsBackend),
    ]


# --- get_result() gives back the task as enqueued ---------------------------------------------


@pytest.mark.django_db
def test_get_result_equals_the_result_enqueue_returned() -> None:
    later = timezone.now() + timedelta(hours=1)
    result = add.using(priority=-20, queue_name="reports", run_after=later).enqueue(1, b=1)

    fetched = default_task_backend.get_result(result.id)
    # TaskResult.__eq__ compares every field, the task's too (func, priority, backend,
    # queue_name, run_after, takes_context): they all round-trip.
    assert fetched == result
    assert fetched.task == result.task
    assert (fetched.task.run_after, fetched.task.priority, fetched.task.queue_name,
            fetched.task.backend) == (later, -20, "reports", "default")
    assert add.get_result(result.id) == result


@pytest.mark.django_db
def test_a_refreshed_result_equals_get_result_and_a_stale_one_does_not() -> None:
    result = ordered.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue("x")
    before = default_task_backend.get_result(result.id)
    [run] = drain(now=timezone.now() + LATER)
    assert run.succeeded

    after = default_task_backend.get_result(result.id)
    assert after == default_task_backend.get_result(result.id)  # reading twice: the same
    assert before != after  # status, times, worker_ids and return value moved on
    result.refresh()  # refresh() copies what moved; args, kwargs and the task stay
    assert result == after
    assert after.task.run_after == result.task.run_after and after.task.priority == 10


@pytest.mark.django_db
def test_a_worker_that_cannot_import_the_task_does_not_count_as_a_run(monkeypatch) -> None:
    result = with_context.enqueue("deploy")
    name = task_name(with_context)
    # A worker of the previous release: the task's module path does not import.
    with monkeypatch.context() as old_release:
        old_release.setattr(names, "import_string", _cannot_import)
        django_pgjobs.registry.registry.remove(name)
        [waited] = drain()
    assert (waited.outcome, waited.status, waited.failure_class) == (
        AttemptOutcome.FAILED, JobStatus.RETRYING, FailureClass.UNKNOWN_TASK)
    waiting = with_context.get_result(result.id)
    assert (waiting.status, waiting.attempts, waiting.worker_ids, waiting.errors) == (
        TaskResultStatus.READY, 0, [], [])
    assert (waiting.started_at, waiting.last_attempted_at) == (None, None)

    [run] = drain(now=timezone.now() + LATER)  # the new release's worker has it
    assert run.result == {"label": "deploy", "attempt": 1, "id": result.id}
    final = with_context.get_result(result.id)
    assert (final.status, final.attempts, final.errors) == (TaskResultStatus.SUCCESSFUL, 1, [])
    assert [a.outcome for a in Job.objects.get(pk=int(result.id)).attempt_history()] == [
        AttemptOutcome.FAILED, AttemptOutcome.SUCCEEDED]
    assert Job.objects.get(pk=int(result.id)).attempts == 1


def _cannot_import(path: str) -> Any:
    raise ImportError(f"No module named {path!r}")


# --- retries: max_attempts and backoff, the names of Django's proposal -----------------------

backoffs: list[tuple[BaseException, Any]] = []


def backoff_thirty(exception: BaseException, task_result: Any) -> int:
    backoffs.append((exception, task_result))
    return 30


def backoff_stop(exception: BaseException, task_result: Any) -> None:
    backoffs.append((exception, task_result))
    return None


def backoff_broken(exception: BaseException, task_result: Any) -> Any:
    raise RuntimeError("backoff bug")


def tasks_with(**options: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend", "QUEUES": [],
                        "OPTIONS": options}}


@pytest.fixture(autouse=True)
def _clear_backoffs() -> None:
    backoffs.clear()


@pytest.mark.django_db
def test_a_task_with_no_options_gets_the_default_attempts_and_options_set_them() -> None:
    assert Job.objects.get(pk=int(fail.enqueue().id)).max_attempts == 20
    with override_settings(TASKS=tasks_with(max_attempts=1)):
        result = fail.enqueue("once")
        assert Job.objects.get(pk=int(result.id)).max_attempts == 1
        [run] = [r for r in drain() if r.job_id == int(result.id)]
        final = fail.get_result(result.id)
    assert (run.outcome, run.status) == (AttemptOutcome.DEAD, JobStatus.DEAD)
    assert (final.status, final.attempts) == (TaskResultStatus.FAILED, 1)


@pytest.mark.django_db
@pytest.mark.parametrize("backoff", [backoff_thirty, "tests.test_backend.backoff_thirty"])
def test_the_backoff_option_chooses_the_wait_and_sees_the_failed_result(backoff) -> None:
    with override_settings(TASKS=tasks_with(max_attempts=3, backoff=backoff)):
        result = fail.enqueue("slow down")
        [first] = drain()
        job = Job.objects.get(pk=int(result.id))
        assert (first.status, job.failure_class) == (JobStatus.RETRYING, "unknown")
        assert job.run_at - job.updated_at == timedelta(seconds=30)  # exactly, no jitter
        assert drain(now=timezone.now() + timedelta(seconds=20)) == []
        runs = drain(now=timezone.now() + timedelta(minutes=5))
    assert [r.outcome for r in runs] == [AttemptOutcome.FAILED, AttemptOutcome.DEAD]
    # Asked after each failure but the last, with the result as the run left it.
    assert len(backoffs) == 2
    exception, seen = backoffs[0]
    assert isinstance(exception, ValueError) and str(exception) == "slow down"
    assert (seen.id, seen.status, seen.attempts) == (result.id, TaskResultStatus.FAILED, 1)
    assert [e.exception_class for e in seen.errors] == [ValueError]
    assert backoffs[1][1].attempts == 2


@pytest.mark.django_db
def test_a_backoff_that_returns_none_stops_the_retries() -> None:
    with override_settings(TASKS=tasks_with(backoff=backoff_stop)):
        result = fail.enqueue("give up")
        [run] = drain()
        final = fail.get_result(result.id)
    assert (run.outcome, run.status, run.failure_class) == (
        AttemptOutcome.DEAD, JobStatus.DEAD, FailureClass.PERMANENT)
    assert [e.exception_class for e in final.errors] == [ValueError]  # still the real one
    assert len(backoffs) == 1


@pytest.mark.django_db
def test_the_backoff_is_not_asked_for_failures_that_say_their_own_wait_or_none(caplog) -> None:
    with override_settings(TASKS=tasks_with(backoff=backoff_thirty)):
        rate_limited.enqueue()
        bad_return.enqueue()
        runs = drain()
    assert [(r.failure_class, r.status) for r in runs] == [
        (FailureClass.RATE_LIMITED, JobStatus.RETRYING), (FailureClass.PERMANENT, JobStatus.DEAD)]
    assert backoffs == []


@pytest.mark.django_db
@pytest.mark.parametrize(("backoff", "logged"), [
    (backoff_broken, "OPTIONS['backoff'] of backend 'default' raised for task result"),
    (lambda exception, task_result: "soon", "returned 'soon' for task result"),
    (lambda exception, task_result: -1, "must be a finite number from 0 to"),
])
def test_a_broken_backoff_leaves_the_default_backoff(caplog, backoff, logged) -> None:
    with override_settings(TASKS=tasks_with(backoff=backoff)):
        result = fail.enqueue("x")
        [run] = drain()
    assert (run.outcome, run.status, run.failure_class) == (
        AttemptOutcome.FAILED, JobStatus.RETRYING, FailureClass.UNKNOWN)
    assert logged in caplog.text
    assert Job.objects.get(pk=int(result.id)).run_at > timezone.now() - timedelta(minutes=1)


def test_check_reports_a_backoff_that_is_not_a_callable() -> None:
    assert option_problems({"backoff": backoff_thirty}) == []
    assert option_problems({"backoff": "tests.test_backend.backoff_thirty"}) == []
    assert option_problems({"backoff": 30}) == [
        "OPTIONS['backoff'] must be a callable backoff(exception, task_result) or its dotted "
        "path, got 30."]
    [problem] = option_problems({"backoff": "tests.test_backend.no_such_backoff"})
    assert problem.startswith("OPTIONS['backoff'] cannot be imported (")


@task()
def rate_limited() -> None:
    raise django_pgjobs.RetryAfter(120)


@pytestmark_worker
def test_djangos_task_finished_log_carries_the_error_scrubbed(caplog) -> None:
    caplog.set_level("ERROR")
    with override_settings(TASKS=tasks_with(max_attempts=1)):
        fail.enqueue("login refused for password=hunter22")
        Worker(burst=True, install_signals=False, poll_interval=0.05, max_jobs=1).run()
    records = [r for r in caplog.records if r.name in ("django.tasks", "django_tasks")]
    assert records and records[-1].exc_info is not None
    # Django's receiver logs the exception being handled: the scrubbed summary, not the task's
    # own exception with its message and frames.
    assert records[-1].exc_info[0] is TaskFailed
    assert str(records[-1].exc_info[1]) == "ValueError: login refused for password=[redacted]"
    assert "hunter22" not in caplog.text


@pytest.mark.django_db
def test_task_finished_is_sent_once_when_the_job_is_dead_and_a_retry_is_a_warning(caplog) -> None:
    caplog.set_level("INFO")
    finished: list[Any] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        finished.append((task_result.status, len(task_result.errors)))

    task_finished.connect(receiver)
    try:
        with override_settings(TASKS=tasks_with(max_attempts=2)):
            result = fail.enqueue("token=s3cret refused")
            [first] = drain()
            after_first = fail.get_result(result.id)
            seen_after_first = list(finished)
            [second] = drain(now=timezone.now() + LATER)
    finally:
        task_finished.disconnect(receiver)
    assert (first.status, after_first.status) == (JobStatus.RETRYING, TaskResultStatus.READY)
    # The retried attempt is not finished: no signal, no ERROR from Django's receiver.
    assert seen_after_first == []
    assert second.status == JobStatus.DEAD
    assert finished == [(TaskResultStatus.FAILED, 2)]
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "django_pgjobs.backend" and r.levelname == "WARNING"]
    [warning] = warnings
    assert warning.startswith(f"task {fail.name} (result {result.id}) failed attempt 1 of 2 "
                              "and will run again at about ")
    assert warning.endswith(": ValueError: token=[redacted] refused")
    assert "s3cret" not in caplog.text
    django_errors = [r for r in caplog.records
                     if r.name in ("django.tasks", "django_tasks") and r.levelname == "ERROR"]
    assert len(django_errors) == 1


@pytest.mark.django_db
def test_near_its_deadline_a_task_is_finished_exactly_when_its_job_ends() -> None:
    # RetryAfter(120) waits 120 to 132 s: with the deadline 126 s away, whether a retry fits is a
    # coin toss. Decided twice, the signal and the job's state would disagree about half the time.
    finished: list[str] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result.id)

    results = [rate_limited.enqueue() for _ in range(16)]
    Job.objects.update(deadline=Now() + timedelta(seconds=126))
    task_finished.connect(receiver)
    try:
        runs = drain()
    finally:
        task_finished.disconnect(receiver)
    assert sorted(r.job_id for r in runs) == sorted(int(r.id) for r in results)
    ended = {str(r.job_id) for r in runs if r.status == JobStatus.DEAD}
    assert {str(r.job_id) for r in runs if r.status == JobStatus.RETRYING} | ended == {
        r.id for r in results}
    assert sorted(finished) == sorted(ended)


@task()
def snoozing() -> None:
    raise django_pgjobs.Snooze(60)


@pytest.mark.django_db
def test_a_snoozing_task_is_neither_finished_nor_a_failure(caplog) -> None:
    caplog.set_level("INFO")
    finished: list[Any] = []

    def receiver(sender: type, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result.status)

    task_finished.connect(receiver)
    try:
        result = snoozing.enqueue()
        [run] = drain()
    finally:
        task_finished.disconnect(receiver)
    assert (run.outcome, run.status) == (AttemptOutcome.SNOOZED, JobStatus.SCHEDULED)
    assert snoozing.get_result(result.id).status == TaskResultStatus.READY
    assert finished == []
    assert [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []


@task()
def login(username: str, password: str, *, otp: str = "") -> str:
    raise ValueError(f"user {username} with {password} refused")


@task()
@django_pgjobs.redact("payment.number", "items[*].code")
def pay(amount: int, payment: dict[str, Any], items: list[dict[str, Any]] | None = None) -> None:
    raise ValueError(f"payment {payment['number']} declined")


@task(takes_context=True)
def with_secret_context(context: Any, secret: str, *extra_tokens: str) -> None:
    return None


@pytest.mark.django_db
def test_positional_arguments_are_redacted_by_their_parameter_names() -> None:
    from django_pgjobs.registry import redactor_for

    result = login.enqueue("bob", "s3cret-pw", otp="123456")
    job = Job.objects.get(pk=result.id)
    assert job.payload["args"] == ["bob", "s3cret-pw"]  # stored as given
    redactor = redactor_for(job.task)
    assert redactor.payload(job.payload) == {
        "args": ["bob", "[redacted]"], "kwargs": {"otp": "123456"}, "backend": "default",
    }
    # By keyword the same argument is hidden by the key rule.
    keyword = Job.objects.get(pk=login.enqueue(username="bob", password="s3cret-pw").id)
    assert redactor.payload(keyword.payload)["kwargs"] == {
        "username": "bob", "password": "[redacted]",
    }
    # Error text loses the value, from either form.
    assert "s3cret-pw" not in redactor.text("user bob with s3cret-pw refused", job.payload)


@pytest.mark.django_db
def test_declared_paths_of_a_task_name_parameters_by_position_or_keyword() -> None:
    from django_pgjobs.registry import redactor_for

    positional = pay.enqueue(10, {"number": "4111111111111111", "holder": "Ada"},
                             [{"code": "X-123", "n": 1}])
    keyword = pay.enqueue(amount=10, payment={"number": "4111111111111111", "holder": "Ada"},
                          items=[{"code": "X-123", "n": 1}])
    shown = [redactor_for(pay_job.task).payload(pay_job.payload)
             for pay_job in Job.objects.filter(pk__in=[positional.id, keyword.id]).order_by("id")]
    assert shown[0]["args"] == [10, {"number": "[redacted]", "holder": "Ada"},
                                [{"code": "[redacted]", "n": 1}]]
    assert shown[1]["kwargs"] == {"amount": 10,
                                  "payment": {"number": "[redacted]", "holder": "Ada"},
                                  "items": [{"code": "[redacted]", "n": 1}]}


@pytest.mark.django_db
def test_var_positional_and_context_parameters_are_bound_correctly() -> None:
    from django_pgjobs.registry import redactor_for

    job = Job.objects.get(pk=with_secret_context.enqueue("s3cret-one", "t1", "t2").id)
    assert redactor_for(job.task).payload(job.payload)["args"] == ["[redacted]"] * 3


def test_a_bad_redaction_path_on_a_task_is_refused_at_declaration() -> None:
    with pytest.raises(django_pgjobs.InvalidJobOption, match="redaction path"):
        django_pgjobs.redact("card..number")


@pytestmark_worker
def test_a_failing_tasks_positional_secret_is_scrubbed_from_the_stored_error(login_admin) -> None:
    result = login.enqueue("bob", "s3cret-pw")
    Worker(burst=True, install_signals=False, poll_interval=0.05, max_jobs=1).run()
    attempt = Attempt.objects.get(job_id=result.id)
    assert attempt.error == "ValueError: user bob with [redacted] refused"
    assert "s3cret-pw" not in attempt.traceback
    errors = login.get_result(result.id).errors
    assert errors and "s3cret-pw" not in errors[-1].traceback
    # Every admin page a viewer can open shows it redacted.
    for url in (f"/admin/pgjobs/job/{result.id}/change/", "/admin/pgjobs/job/",
                f"/admin/pgjobs/attempt/{attempt.pk}/change/"):
        page = login_admin.get(url)
        assert page.status_code == 200 and b"s3cret-pw" not in page.content, url
    exported = login_admin.post("/admin/pgjobs/job/", {
        "action": "export_selected", "index": 0, "_selected_action": [result.id],
    })
    assert exported.status_code == 200 and b"s3cret-pw" not in exported.content


@pytest.fixture
def login_admin(client):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="pgjobs", codename__in=["view_job", "view_attempt"]))
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_enqueue_by_name_never_imports_a_module() -> None:
    import sys

    name = "django.tasks:tests.never_imported_module.anything"
    assert "tests.never_imported_module" not in sys.modules
    with pytest.raises(django_pgjobs.UnknownTask):
        django_pgjobs.enqueue(name, {"args": [], "kwargs": {}})
    assert "tests.never_imported_module" not in sys.modules
    # Not a Task, even though its module is imported: refused too.
    with pytest.raises(django_pgjobs.UnknownTask):
        django_pgjobs.enqueue("django.tasks:os.system", {"args": ["true"], "kwargs": {}})
    assert Job.objects.count() == 0
    # A Task whose module is imported may be enqueued by name.
    job = django_pgjobs.enqueue(task_name(add), {"args": [1, 2], "kwargs": {}})
    assert job.task == task_name(add)


@pytestmark_worker
def test_higher_priority_runs_first_and_deferred_tasks_wait() -> None:
    later = ordered.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    ordered.using(priority=-5).enqueue("low")
    ordered.using(priority=50).enqueue("high")
    ordered.enqueue("middle")
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05, batch_size=1)
    worker.run()
    assert [label for name, label in ran if name == "ordered"] == ["high", "middle", "low"]
    assert ordered.get_result(later.id).status == TaskResultStatus.READY


@pytest.mark.slow
@pytestmark_worker
def test_a_task_runs_under_the_pgjobs_worker_command(start_worker) -> None:
    from testproject.demo.tasks import add as demo_add

    result = demo_add.enqueue(40, 2)
    worker = start_worker("--poll-interval", "0.1")
    wait_for(lambda: demo_add.get_result(result.id).is_finished, 30)
    worker.signal(15)
    assert worker.wait(30) == 0
    final = demo_add.get_result(result.id)
    assert (final.status, final.return_value, final.attempts) == (
        TaskResultStatus.SUCCESSFUL, 42, 1
    )


@pytest.mark.django_db(transaction=True)
def test_the_timeout_option_is_stored_with_each_task_and_enforced_by_the_worker() -> None:
    options = tasks_with(max_attempts=1, timeout_seconds=0.5,
                         queues={"slow": {"timeout_seconds": 120}})
    with override_settings(TASKS=options):
        result = sleep_async.enqueue(60)
        slow = sleep_async.using(queue_name="slow").enqueue(0)
        assert Job.objects.get(pk=int(slow.id)).timeout_seconds == 120  # the queue's own
        assert Job.objects.get(pk=int(result.id)).timeout_seconds == 0.5
        Worker(burst=True, install_signals=False, poll_interval=0.05).run()
        final = sleep_async.get_result(result.id)
    job = Job.objects.get(pk=int(result.id))
    assert (job.status, job.failure_class) == (JobStatus.DEAD, FailureClass.TIMEOUT)
    # Timed out; the cancelled coroutine's own late report, when it made one, is recorded lost.
    assert Attempt.objects.get(job_id=job.pk).outcome in (AttemptOutcome.TIMED_OUT,
                                                          AttemptOutcome.LOST)
    assert final.status == TaskResultStatus.FAILED
    assert Job.objects.get(pk=int(slow.id)).status == JobStatus.SUCCEEDED


def test_a_bad_timeout_option_is_refused_by_the_check() -> None:
    assert option_problems({"timeout_seconds": 0}) == [
        "OPTIONS['timeout_seconds'] must be a finite number above 0 and at most 3.1536e+08, got 0."]


@pytest.mark.parametrize(("value", "enqueue_accepts"), [
    (0.5, True), (0, False), (10 * 365 * 24 * 3600 + 1, False)])
def test_the_backend_and_enqueue_hold_max_age_to_one_rule(value, enqueue_accepts) -> None:
    from datetime import timedelta

    from django_pgjobs.validation import option_problem

    problems = option_problems({"max_age_seconds": value})
    assert (problems == []) is enqueue_accepts, problems
    assert (option_problem("max_age", timedelta(seconds=value)) is None) is enqueue_accepts
