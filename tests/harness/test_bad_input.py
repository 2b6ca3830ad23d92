"""Handlers that misbehave, run by a real worker process.

Each bad job must end with a recorded outcome, and the same worker process must go on to drain
the ordinary jobs queued behind it, then drain and exit 0 on SIGTERM.
"""

from __future__ import annotations

import signal

import pytest

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Job
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from testproject.chaos.models import Run
from tests.conftest import ended_attempts, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FOLLOWERS = 3
TERMINAL = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)


def enqueue_with_followers(task: str) -> tuple[Job, list[int]]:
    """The bad job first (higher priority), then ordinary jobs the worker must still run."""
    bad = django_pgjobs.enqueue(task, {}, priority=10)
    followers = django_pgjobs.enqueue_many(
        [JobSpec.of("chaos.tick", {"n": i}) for i in range(FOLLOWERS)]
    )
    return bad, [job.pk for job in followers]


def followers_succeeded(ids: list[int]) -> bool:
    return Job.objects.filter(pk__in=ids, status=JobStatus.SUCCEEDED).count() == len(ids)


@pytest.mark.parametrize(
    ("task", "reason", "failure_class", "outcomes", "error"),
    [
        ("chaos.not_json", TerminalReason.PERMANENT_ERROR, FailureClass.PERMANENT,
         [AttemptOutcome.DEAD], "handler returned a value that is not JSON: TypeError"),
        ("chaos.too_deep", TerminalReason.PERMANENT_ERROR, FailureClass.PERMANENT,
         [AttemptOutcome.DEAD], "handler returned a value that is not JSON: RecursionError"),
        ("chaos.nul_result", TerminalReason.PERMANENT_ERROR, FailureClass.PERMANENT,
         [AttemptOutcome.DEAD], "a NUL character, which PostgreSQL cannot store"),
        ("chaos.system_exit", TerminalReason.ATTEMPTS_EXHAUSTED, FailureClass.UNKNOWN,
         [AttemptOutcome.FAILED, AttemptOutcome.DEAD], "SystemExit: 3"),
        ("chaos.keyboard_interrupt", TerminalReason.ATTEMPTS_EXHAUSTED, FailureClass.UNKNOWN,
         [AttemptOutcome.FAILED, AttemptOutcome.DEAD], "KeyboardInterrupt"),
        ("chaos.nul_error", TerminalReason.ATTEMPTS_EXHAUSTED, FailureClass.UNKNOWN,
         [AttemptOutcome.FAILED, AttemptOutcome.DEAD], "ValueError: bad byte: \\x00"),
        ("chaos.unprintable", TerminalReason.ATTEMPTS_EXHAUSTED, FailureClass.UNKNOWN,
         [AttemptOutcome.FAILED, AttemptOutcome.DEAD],
         "testproject.chaos.jobs._Unprintable: <exception str() failed>"),
    ],
)
def test_a_misbehaving_handler_gets_a_recorded_outcome_and_the_worker_goes_on(
    start_worker, task, reason, failure_class, outcomes, error
):
    bad, followers = enqueue_with_followers(task)
    worker = start_worker("--worker-id", "bad-input", "--concurrency", "1")
    wait_for(lambda: Job.objects.get(pk=bad.pk).status in TERMINAL and followers_succeeded(
        followers), 30)
    assert worker.proc.poll() is None, worker.output()

    stored = Job.objects.get(pk=bad.pk)
    assert (stored.status, stored.terminal_reason, stored.failure_class) == (
        JobStatus.DEAD, reason, failure_class)
    assert stored.attempts == len(outcomes)
    assert error in stored.last_error
    attempts = ended_attempts(bad.pk)
    assert [a.outcome for a in attempts] == outcomes
    assert all(error in a.error for a in attempts)
    assert Run.objects.filter(job_id=bad.pk).count() == len(outcomes)
    # The same process ran the ordinary jobs queued behind the bad one.
    assert {(a.worker_id, a.outcome) for a in ended_attempts(*followers)} == {
        ("bad-input", AttemptOutcome.SUCCEEDED)}
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()


def test_a_handler_hanging_past_twice_its_lease_is_abandoned_and_the_worker_goes_on(
    start_worker,
):
    hung = django_pgjobs.enqueue("chaos.hang", {"hang_seconds": 60}, priority=10)  # lease 1 s
    worker = start_worker("--worker-id", "hang", "--concurrency", "1")
    wait_for(lambda: Run.objects.filter(job_id=hung.pk).exists(), 30)
    followers = [j.pk for j in django_pgjobs.enqueue_many(
        [JobSpec.of("chaos.tick", {"n": i}) for i in range(FOLLOWERS)])]
    # Its only executor is stuck in the handler: the rescue step retries the job once the lease
    # runs out, and after two leases the watchdog starts a fresh executor, which runs the
    # retry and the jobs queued behind it while the first attempt is still hanging.
    wait_for(lambda: followers_succeeded(followers)
             and Job.objects.get(pk=hung.pk).status == JobStatus.SUCCEEDED, 30)
    assert worker.proc.poll() is None, worker.output()
    assert "worker.abandon" in worker.output()

    first, second = Run.objects.filter(job_id=hung.pk).order_by("id")
    assert (first.attempt, first.finished_at) == (1, None)  # still hanging
    assert (second.attempt, second.finished_at is not None) == (2, True)
    assert [(a.worker_id, a.outcome, a.failure_class) for a in ended_attempts(hung.pk)] == [
        ("hang", AttemptOutcome.LEASE_EXPIRED, FailureClass.LEASE_EXPIRED),
        ("hang", AttemptOutcome.SUCCEEDED, ""),
    ]
    assert Job.objects.get(pk=hung.pk).result == {"attempt": 2}
    assert {(a.worker_id, a.outcome) for a in ended_attempts(*followers)} == {
        ("hang", AttemptOutcome.SUCCEEDED)}
