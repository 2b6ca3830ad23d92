"""Native async handlers: one event loop per worker, many jobs at once, the same guarantees."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest

import django_pgjobs
from django_pgjobs import Transient
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Attempt, Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus
from django_pgjobs.worker import Worker
from tests.conftest import wait_for

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db(transaction=True)

state: dict[str, Any] = {"running": 0, "peak": 0, "cancelled": 0}
lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    state.update(running=0, peak=0, cancelled=0)


@django_pgjobs.job("tests.async.sleep")
async def async_sleep(ctx: Any, payload: Any) -> dict[str, Any]:
    with lock:
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
    try:
        await asyncio.sleep(payload.get("seconds", 0.2))
    finally:
        with lock:
            state["running"] -= 1
    return {"n": payload.get("n"), "attempt": ctx.attempt}


@django_pgjobs.job("tests.async.orm")
async def async_orm(ctx: Any, payload: Any) -> dict[str, Any]:
    # Django's async ORM works inside: these queries run off the event loop.
    mine = await Job.objects.filter(pk=ctx.job_id, status=JobStatus.RUNNING).aexists()
    others = await Job.objects.exclude(pk=ctx.job_id).acount()
    await ctx.aheartbeat()
    return {"mine_running": mine, "others": others}


@django_pgjobs.job("tests.async.flaky", max_attempts=3)
async def async_flaky(ctx: Any, payload: Any) -> str:
    await asyncio.sleep(0)
    if ctx.attempt == 1:
        raise Transient("upstream not ready")
    return "ok"


@django_pgjobs.job("tests.async.forever", timeout=0.5, max_attempts=1, lease=timedelta(seconds=30))
async def async_forever(ctx: Any, payload: Any) -> None:
    try:
        while True:
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        state["cancelled"] += 1
        raise


@task()
async def gathered(wanted: int) -> int:
    """A django.tasks task that waits until ``wanted`` of its kind are running together."""
    with lock:
        state["running"] += 1
        state["peak"] = max(state["peak"], state["running"])
    try:
        for _ in range(100):  # five seconds at most, then say how many there were
            if state["peak"] >= wanted:
                break
            await asyncio.sleep(0.05)
        return int(state["peak"])
    finally:
        with lock:
            state["running"] -= 1


def drain(**options: Any) -> Worker:
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05, **options)
    assert worker.run() == 0
    return worker


def test_an_async_handler_runs_and_its_result_is_stored() -> None:
    job = django_pgjobs.enqueue("tests.async.sleep", {"n": 7, "seconds": 0})
    drain()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.result) == (JobStatus.SUCCEEDED, {"n": 7, "attempt": 1})
    assert [a.outcome for a in stored.attempt_history()] == [AttemptOutcome.SUCCEEDED]


def test_many_async_jobs_run_at_once_on_one_executor() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.async.sleep", {"n": i, "seconds": 0.5})
                                for i in range(40)])
    drain(concurrency=1, batch_size=40, async_concurrency=40)
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 40
    assert state["peak"] >= 20  # one executor thread, yet many handlers awaited together


def test_the_event_loop_holds_no_more_than_async_concurrency_jobs() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.async.sleep", {"n": i, "seconds": 0.05})
                                for i in range(12)])
    drain(concurrency=2, batch_size=6, async_concurrency=3)
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 12
    assert 1 <= state["peak"] <= 3


def test_djangos_async_orm_and_async_heartbeats_work_inside() -> None:
    other = django_pgjobs.enqueue("tests.ok", {})
    job = django_pgjobs.enqueue("tests.async.orm", {}, priority=10)
    drain()
    assert Job.objects.get(pk=job.pk).result == {"mine_running": True, "others": 1}
    assert Job.objects.get(pk=other.pk).status == JobStatus.SUCCEEDED


def test_sync_and_async_handlers_share_one_worker_and_failures_are_classified() -> None:
    jobs = django_pgjobs.enqueue_many([
        JobSpec.of("tests.ok", {"i": 1}), JobSpec.of("tests.async.flaky", {}),
        JobSpec.of("tests.async.sleep", {"seconds": 0}), JobSpec.of("tests.ok", {"i": 2}),
    ])
    wait_for(lambda: (drain(), Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4)[1],
             30, 0.1)
    flaky = Job.objects.get(pk=jobs[1].pk)
    assert flaky.attempts == 2
    assert [(a.outcome, a.failure_class) for a in flaky.attempt_history()] == [
        (AttemptOutcome.FAILED, FailureClass.TRANSIENT), (AttemptOutcome.SUCCEEDED, "")]


def test_an_async_job_past_its_timeout_is_settled_and_its_task_cancelled() -> None:
    job = django_pgjobs.enqueue("tests.async.forever", {})
    worker = Worker(install_signals=False, poll_interval=0.05, max_jobs=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.DEAD, 30)
        wait_for(lambda: state["cancelled"] == 1, 10)
    finally:
        worker.stop()
        thread.join(30)
    stored = Job.objects.get(pk=job.pk)
    assert stored.failure_class == FailureClass.TIMEOUT
    # The cancelled task's own report came after the takeover: recorded beside the timeout,
    # which stays the attempt's outcome; nothing applied.
    wait_for(lambda: Attempt.objects.get(job_id=job.pk).reported_outcome not in (
        "", AttemptOutcome.TIMED_OUT), 10)
    assert Attempt.objects.get(job_id=job.pk).outcome == AttemptOutcome.TIMED_OUT


def test_async_django_tasks_run_on_the_event_loop_not_one_per_thread() -> None:
    # One executor thread claiming one job at a time: a task run through async_to_sync would
    # hold it until it returned, so the ten would run one after another, each seeing only itself.
    results = [gathered.enqueue(10) for _ in range(10)]
    drain(concurrency=1, batch_size=1, async_concurrency=10)
    assert [gathered.get_result(r.id).return_value for r in results] == [10] * 10
    assert state["peak"] == 10
