"""Faults the harness found in the core, pinned with a direct test each."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

import django_pgjobs
from django_pgjobs.models import Job
from django_pgjobs.status import AttemptOutcome, JobStatus
from django_pgjobs.transitions import (
    claim_jobs,
    promote_due_jobs,
    rescue_expired_leases,
    settle,
)
from django_pgjobs.worker import Worker
from django_pgjobs.worker import settler as settler_module
from testproject.chaos.models import Run
from tests.conftest import ended_attempts, succeeded, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stale_report_settled_in_one_batch_with_the_winning_one_changes_nothing():
    # A worker can hold both reports at once: its handler ran past the lease, the job was
    # rescued, and the retry was claimed and finished before the settler's next flush.
    job = django_pgjobs.enqueue("tests.ok", {})
    [stale] = claim_jobs("slow-worker", "default", 1)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=Now() - timedelta(seconds=1))
    assert len(rescue_expired_leases(10)) == 1
    Job.objects.filter(pk=job.pk).update(run_at=Now())
    promote_due_jobs(10)
    [current] = claim_jobs("fast-worker", "default", 1)

    won = settle([succeeded(stale, '"stale"'), succeeded(current, '"current"')])

    assert won == {stale.lease_token: False, current.lease_token: True}
    stored = Job.objects.get(pk=job.pk)
    assert [(a.worker_id, a.outcome, a.reported_outcome) for a in stored.attempt_history()] == [
        ("slow-worker", AttemptOutcome.LEASE_EXPIRED, AttemptOutcome.SUCCEEDED),
        ("fast-worker", AttemptOutcome.SUCCEEDED, AttemptOutcome.SUCCEEDED),
    ]
    assert (stored.status, stored.result) == (JobStatus.SUCCEEDED, "current")


def test_an_idle_settler_is_woken_by_a_new_outcome(monkeypatch):
    # An idle settler sleeps until something wakes it; a new outcome must, or a job that
    # finishes near the end of its lease is rescued before its report lands (seen in the
    # harness as a disconnected worker's failure recorded 'lost'). With the idle sleep made
    # a minute long, only the wake-up can settle the job within the wait below.
    monkeypatch.setattr(settler_module, "IDLE_SECONDS", 60.0)
    job = django_pgjobs.enqueue("tests.ok", {})
    worker = Worker(install_signals=False, poll_interval=0.05)
    settler = worker.settler
    settler.start()
    try:
        time.sleep(0.1)  # the settler is now in its idle wait
        [claimed] = claim_jobs("w", "default", 1)
        settler.put(succeeded(claimed, '"done"'))
        wait_for(lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED, 20, 0.01)
    finally:
        settler.stop(give_up_at=time.monotonic() + 5, timeout=5)


@pytest.mark.slow
def test_jobs_after_a_lost_connection_in_the_same_batch_run_on_a_fresh_one(start_worker):
    # One claim brings the held job and its followers; the worker's connections are cut while
    # the first holds. The held job fails (its connection died under it); the followers must
    # not inherit the dead connection and fail with it, each losing an attempt.
    held = django_pgjobs.enqueue("chaos.plain_effect", {"key": "held", "hold": "before_effect"},
                                 priority=10)
    followers = [django_pgjobs.enqueue("chaos.tick", {"n": i}, lease=30).pk for i in range(3)]
    worker = start_worker("--worker-id", "cut", "--concurrency", "1", "--batch-size", "10",
                          PGAPPNAME="cut")
    wait_for(lambda: Run.objects.filter(job_id=held.pk, stage=Run.Stage.HOLDING).exists(), 30)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE application_name = 'cut'")
        assert cursor.fetchone()[0] >= 2  # the executor's and the settler's
    wait_for(lambda: Job.objects.filter(pk__in=[held.pk, *followers],
                                        status=JobStatus.SUCCEEDED).count() == 4, 30)
    assert [(a.outcome, a.failure_class) for a in ended_attempts(held.pk)] == [
        (AttemptOutcome.FAILED, "transient"), (AttemptOutcome.SUCCEEDED, "")]
    assert [(a.number, a.outcome) for a in ended_attempts(*followers)] == [
        (1, AttemptOutcome.SUCCEEDED)] * 3
    assert worker.proc.poll() is None, worker.output()
