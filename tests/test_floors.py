"""Claims from a floor per priority while a snapshot held open keeps vacuum from cleaning up:
the statement, the worker's floors, and the horizon that turns them on, on a real server."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone

import django_pgjobs
from django_pgjobs import JobSpec
from django_pgjobs.claimed import ClaimedJob
from django_pgjobs.models import Job, QueueState
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs, claim_statement, settle_and_claim
from django_pgjobs.worker import Worker
from django_pgjobs.worker.floors import (
    FULL_CLAIM_MAX_SECONDS,
    FULL_CLAIM_SECONDS,
    ClaimFloors,
    HorizonWatch,
)
from tests.conftest import ROOT, holding_snapshot, run_in_thread, succeeded, wait_for
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def held_snapshot() -> Iterator[None]:
    """A session holding a REPEATABLE READ snapshot open, older than the floors' threshold."""
    with holding_snapshot("nightly-report"):
        time.sleep(0.3)
        with override_settings(PGJOBS_CLAIM_FLOORS_AFTER_SECONDS=0.2):
            yield


def floor_of(job: Job) -> tuple[int, int, int]:
    return (job.priority, round(job.run_at.timestamp() * 1_000_000), job.pk)


def test_a_claim_from_floors_takes_only_the_jobs_past_each_priority_floor_in_claim_order() -> None:
    now = timezone.now()
    low = [JobFactory(priority=0, run_at=now - timedelta(seconds=s)) for s in (3, 2, 1)]
    high = [JobFactory(priority=5, run_at=now - timedelta(seconds=s)) for s in (2, 1)]
    unfloored = JobFactory(priority=9)
    JobFactory(queue="other", priority=5)
    claimed = claim_jobs("w1", "default", 10, floors=[floor_of(low[0]), floor_of(high[0])])
    # The highest priority first, each from its floor: not the floors' own jobs, and nothing
    # at a priority with no floor (the next full claim takes those).
    assert [c.id for c in claimed] == [high[1].pk, low[1].pk, low[2].pk]
    assert Job.objects.get(pk=unfloored.pk).status == JobStatus.READY


def test_a_floor_orders_jobs_of_one_time_by_id() -> None:
    # One enqueue of many jobs gives them all the same run_at: the floor goes by id among them.
    jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(6)])
    assert len({j.run_at for j in jobs}) == 1
    claimed = claim_jobs("w1", "default", 2, floors=[floor_of(jobs[2])])
    assert [c.id for c in claimed] == [jobs[3].pk, jobs[4].pk]


def test_a_paused_queue_gives_nothing_from_floors_either() -> None:
    old = JobFactory(run_at=timezone.now() - timedelta(seconds=5))
    JobFactory()
    QueueState.objects.create(name="default", paused=True)
    assert claim_jobs("w1", "default", 10, floors=[floor_of(old)]) == []


def test_a_settlement_and_a_claim_from_floors_go_in_one_transaction() -> None:
    first = JobFactory(run_at=timezone.now() - timedelta(seconds=5))
    [running] = claim_jobs("w1", "default", 1)
    later = JobFactory()
    applied, claimed = settle_and_claim([succeeded(running)], "w1", "default", 10,
                                        floors=[floor_of(first)])
    assert applied == {running.lease_token: True}
    assert [c.id for c in claimed] == [later.pk]


def test_the_statement_from_floors_differs_from_the_claim_only_in_its_candidates() -> None:
    full, floored = claim_statement(10).text, claim_statement(10, from_floors=True).text

    def outside_candidates(text: str) -> tuple[str, str]:
        before, rest = text.split("WITH candidates AS (\n", 1)
        return before, rest.split("\n), claimed AS (", 1)[1]

    assert outside_candidates(full) == outside_candidates(floored)
    assert "AND (j.run_at, j.id) > ('epoch'::timestamptz" in floored
    assert floored.count("FOR UPDATE OF j SKIP LOCKED") == 1
    assert claim_statement(10, from_floors=True).name != claim_statement(10).name


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def claimed_at(priority: int, seconds: int, job_id: int) -> ClaimedJob:
    now_us = int(timezone.now().timestamp() * 1_000_000)
    return ClaimedJob(id=job_id, task="t", payload_version=1, payload={}, attempt=1,
                      max_attempts=1, snoozes=0, deadline_us=None, lease_seconds=30,
                      lease_token=uuid.uuid4(), lease_owner="w", lease_expires_at_us=now_us,
                      trace_id="", queue="default", priority=priority, created_at_us=now_us,
                      run_at_us=now_us + seconds * 1_000_000)


def test_floors_move_with_each_claim_and_a_full_claim_comes_every_second() -> None:
    clock = Clock()
    floors = ClaimFloors(clock=clock)
    floors.claimed("default", [claimed_at(0, 1, 1)])
    assert floors.start("default") is None  # nothing held back: every claim is full
    floors.hold(True)
    assert floors.start("default") is None  # no floor yet: a full claim sets them
    floors.claimed("default", [claimed_at(5, 2, 7), claimed_at(0, 3, 4), claimed_at(0, 1, 9)])
    clock.now += FULL_CLAIM_SECONDS / 2
    assert sorted((p, i) for p, _, i in floors.start("default")) == [(0, 4), (5, 7)]
    assert floors.start("other") is None  # each queue has its own
    clock.now += FULL_CLAIM_SECONDS / 2
    assert floors.start("default") is None  # a second since the last full claim
    assert floors.start("default") is not None
    floors.missed()
    assert floors.start("default") is None
    floors.hold(False)
    floors.hold(True)
    assert floors.start("default") is None  # held anew: the floors start over


def held_floors() -> tuple[Clock, ClaimFloors]:
    """Floors on a clock of the test's, held, after the first (full) claim of "default"."""
    clock = Clock()
    floors = ClaimFloors(clock=clock)
    floors.hold(True)
    assert floors.start("default") is None
    return clock, floors


def test_a_full_claim_that_takes_long_comes_less_often() -> None:
    clock, floors = held_floors()
    # A full claim of a quarter of a second: the next comes 20 times as long after it.
    floors.claimed("default", [claimed_at(0, 1, 1)], full_seconds=0.25)
    clock.now += 4.9
    assert floors.start("default") is not None
    clock.now += 0.1
    assert floors.start("default") is None
    floors.claimed("default", [], full_seconds=0.01)  # a fast one: every second again
    clock.now += FULL_CLAIM_SECONDS
    assert floors.start("default") is None


def test_the_horizon_watch_turns_floors_on_while_a_snapshot_is_held(held_snapshot) -> None:
    floors = ClaimFloors()
    HorizonWatch(floors)()
    assert floors.held
    with override_settings(PGJOBS_CLAIM_FLOORS_AFTER_SECONDS=0):
        HorizonWatch(floors)()
    assert not floors.held
    with override_settings(PGJOBS_CLAIM_FLOORS_AFTER_SECONDS=3600):
        HorizonWatch(floors)()
    assert not floors.held


def test_without_a_held_snapshot_the_watch_leaves_claims_whole() -> None:
    floors = ClaimFloors()
    floors.hold(True)
    with override_settings(PGJOBS_CLAIM_FLOORS_AFTER_SECONDS=0.2):
        HorizonWatch(floors)()
    assert not floors.held


@pytest.mark.django_db(transaction=True)
def test_a_worker_claims_from_floors_and_still_starts_a_job_ready_behind_them(
    held_snapshot,
) -> None:
    worker = Worker(concurrency=1, batch_size=5, install_signals=False, poll_interval=0.05)
    starts: list[Any] = []
    start = worker.floors.start

    def recorded(queue: str) -> Any:
        floors = start(queue)
        starts.append(floors)
        return floors

    worker.floors.start = recorded  # type: ignore[method-assign]
    thread = run_in_thread(worker)
    try:
        wait_for(lambda: worker.floors.held, 10)
        first = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(20)])
        wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 20, 20)
        # Ready an hour ago, so behind every floor: only a full claim can see it.
        behind = django_pgjobs.enqueue("tests.ok", {"behind": True},
                                       run_at=timezone.now() - timedelta(hours=1))
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(5)])
        wait_for(lambda: Job.objects.get(pk=behind.pk).status == JobStatus.SUCCEEDED,
                 10 * FULL_CLAIM_SECONDS)
    finally:
        worker.stop()
        thread.join(10)
    assert any(s for s in starts), "no claim started from floors"
    assert all(Job.objects.get(pk=j.pk).status == JobStatus.SUCCEEDED for j in first)


def test_a_claim_from_floors_is_planned_once_not_at_every_claim() -> None:
    # Given its floors as arrays, PostgreSQL planned it anew each time (a generic plan guessed
    # ten floors and looked costlier than a plan for the one it was given), a fifth of a
    # millisecond a claim. After its first five runs it now keeps one plan.
    first = JobFactory(run_at=timezone.now() - timedelta(seconds=30))
    with connection.cursor() as cursor:
        # The planner weighs the plans by the table's statistics, which an earlier test's
        # ANALYZE of a large history leaves behind (pg_class keeps them past a rollback).
        cursor.execute("ANALYZE pgjobs_job")
    for _ in range(12):
        JobFactory()
        assert len(claim_jobs("w1", "default", 10, floors=[floor_of(first)])) == 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT generic_plans FROM pg_prepared_statements WHERE name = %s",
                       [claim_statement(10, from_floors=True).name])
        [(generic,)] = cursor.fetchall()
    assert generic >= 1


def test_a_full_claim_that_takes_only_jobs_behind_the_floors_is_followed_by_another() -> None:
    clock, floors = held_floors()
    floors.claimed("default", [claimed_at(0, 60, 50)], limit=2, full_seconds=0.001)
    clock.now += FULL_CLAIM_SECONDS
    assert floors.start("default") is None
    # A whole batch from behind the floor (retries promoted together): the next claim is
    # full too, and so on while full claims keep finding whole batches there.
    behind = [claimed_at(0, 1, 10), claimed_at(0, 2, 11)]
    floors.claimed("default", behind, limit=2, full_seconds=0.001)
    assert floors.start("default") is None
    floors.claimed("default", [claimed_at(0, 3, 12)], limit=2, full_seconds=0.001)
    assert floors.start("default") is not None
    assert floors.start("default") is not None
    # A whole batch past the floor is a backlog the floors reach: no full claim follows.
    clock.now += FULL_CLAIM_SECONDS
    assert floors.start("default") is None
    floors.claimed("default", [claimed_at(0, 70, 60), claimed_at(0, 71, 61)], limit=2,
                   full_seconds=0.001)
    assert floors.start("default") is not None


def test_full_claims_come_at_least_every_ten_seconds_however_long_one_took() -> None:
    clock, floors = held_floors()
    floors.claimed("default", [claimed_at(0, 1, 1)], limit=10, full_seconds=5.0)
    clock.now += FULL_CLAIM_MAX_SECONDS - 0.1
    assert floors.start("default") is not None
    clock.now += 0.1
    assert floors.start("default") is None


# A project without the admin (whose dashboard imports them anyway): a worker set up to run.
STARTUP_IMPORTS = """
import sys
import django
from django.conf import settings
settings.configure(INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                                   "django_pgjobs"],
                   DATABASES={"default": {"ENGINE": "django.db.backends.postgresql"}})
django.setup()
from django_pgjobs.management.commands import pgjobs_worker
from django_pgjobs.worker import Worker
Worker(install_signals=False)
print("django_pgjobs.stats" in sys.modules)
"""


def test_a_worker_imports_the_dashboards_reads_at_its_first_horizon_reading_not_at_start() -> None:
    done = subprocess.run([sys.executable, "-c", STARTUP_IMPORTS], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False"
