"""Schedules run by real ``pgjobs_worker`` processes: many at once, stopped, and slow handlers.

Every assertion is an exact count or order of rows; the waits only give the workers time.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db.models import Count
from django.utils import timezone

from django_pgjobs.models import Job, Schedule
from django_pgjobs.status import JobStatus, ScheduleSource
from testproject.demo.models import LedgerEntry
from tests.conftest import ended_attempts, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SECOND = timedelta(seconds=1)


def every_second(name: str, **fields) -> Schedule:
    first = (timezone.now() + 2 * SECOND).replace(microsecond=0)
    return Schedule.objects.create(
        name=name, task="demo.tick", cron="* * * * * *", payload={"schedule": name},
        source=ScheduleSource.ADMIN, next_tick_at=first, **fields)


def ticks(schedule: Schedule) -> list:
    return list(Job.objects.filter(schedule=schedule).order_by("scheduled_at")
                .values_list("scheduled_at", flat=True))


def state(schedules: list[Schedule], workers: list) -> str:
    """The jobs of ``schedules`` by status, and the end of each worker's output."""
    jobs = sorted(Job.objects.filter(schedule__in=schedules)
                  .values_list("status").annotate(n=Count("id")))
    tails = "\n".join(f"--- worker {w.pid}:\n" + "\n".join(w.output().splitlines()[-15:])
                       for w in workers)
    return f"jobs by status {jobs}\n{tails}"


def settle_and_stop(schedules: list[Schedule], workers: list) -> None:
    """Pause the schedules, let their jobs finish, and stop the workers (each must exit 0)."""
    Schedule.objects.filter(pk__in=[s.pk for s in schedules]).update(paused_at=timezone.now())
    wait_for(lambda: not Job.objects.filter(
        schedule__in=schedules, status__in=[JobStatus.READY, JobStatus.RUNNING]).exists(), 90,
        what=lambda: state(schedules, workers))
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.output()


def accounted(schedule: Schedule) -> int:
    """Ticks from the first one to the last handled, each enqueued, missed or skipped."""
    first = Job.objects.filter(schedule=schedule).order_by("scheduled_at")[0].scheduled_at
    return int((schedule.last_tick_at - first) / SECOND) + 1


def test_four_workers_enqueue_exactly_one_job_per_tick_and_miss_none(start_worker) -> None:
    schedule = every_second("workers.every-second")
    workers = [start_worker("--concurrency", "2", "--poll-interval", "0.2",
                            "--worker-id", f"w{i}", PGJOBS_SCHEDULE_INTERVAL_SECONDS="0.3")
               for i in range(4)]
    # At least 12 ticks, once every worker is up: all four race for each of them.
    wait_for(lambda: all("worker.start" in w.output() for w in workers), 90,
             what=lambda: state([schedule], workers))
    started = Job.objects.filter(schedule=schedule).count()
    wait_for(lambda: Job.objects.filter(schedule=schedule).count() >= started + 12, 90,
             what=lambda: state([schedule], workers))
    settle_and_stop([schedule], workers)

    got = ticks(schedule)
    assert len(got) >= 12
    assert got == [got[0] + i * SECOND for i in range(len(got))]  # no tick twice, none missing
    schedule = Schedule.objects.get(pk=schedule.pk)
    assert (schedule.ticks_enqueued, schedule.ticks_missed, schedule.ticks_skipped) == (
        len(got), 0, 0)
    assert accounted(schedule) == len(got)
    # Each tick's handler ran once, on one attempt.
    runs = list(LedgerEntry.objects.filter(kind="tick").values_list("key", flat=True))
    assert sorted(runs) == sorted(f"workers.every-second@{t.isoformat()}" for t in got)
    assert set(Job.objects.filter(schedule=schedule).values_list("status", "attempts")) == {
        (JobStatus.SUCCEEDED, 1)}
    assert len(ended_attempts(*Job.objects.filter(schedule=schedule).values_list(
        "pk", flat=True))) == len(got)
    # Each tick was logged as enqueued once, by whichever worker won it.
    enqueued = [w.output().count("schedule.enqueued name=workers.every-second ") for w in workers]
    assert sum(enqueued) == len(got)


def test_workers_stopped_across_ticks_then_started_run_what_each_misfire_policy_says(
    start_worker,
) -> None:
    grace = 3.0
    policies = {"skip": every_second("misfire.skip", misfire="skip"),
                "catch_up": every_second("misfire.catch_up", misfire="catch_up",
                                         catch_up_limit=3),
                "none": every_second("misfire.none", misfire="none")}
    env = {"PGJOBS_SCHEDULE_INTERVAL_SECONDS": "0.25", "PGJOBS_SCHEDULE_GRACE_SECONDS": "3"}
    before = start_worker("--poll-interval", "0.2", **env)
    wait_for(lambda: all(Job.objects.filter(schedule=s).count() >= 3
                         for s in policies.values()), 90)
    before.signal(signal.SIGTERM)
    assert before.wait(60) == 0, before.output()
    stopped = timezone.now()
    time.sleep(9)  # the outage: about nine ticks of each schedule go by with no worker
    after = start_worker("--poll-interval", "0.2", **env)
    wait_for(lambda: all(
        (s := Schedule.objects.get(pk=p.pk)).last_tick_at is not None
        and s.last_tick_at > stopped + 12 * SECOND for p in policies.values()), 90)
    settle_and_stop(list(policies.values()), [after])

    late_by_policy = {}
    for policy, schedule in policies.items():
        schedule = Schedule.objects.get(pk=schedule.pk)
        got = ticks(schedule)
        seconds = [int((t - got[0]) / SECOND) for t in got]
        assert seconds == sorted(set(seconds))
        gaps = [(a, b) for a, b in pairwise(seconds) if b - a > 1]
        assert len(gaps) == 1, (policy, seconds)  # the outage, and only the outage
        missing = gaps[0][1] - gaps[0][0] - 1
        assert missing >= 2, (policy, seconds)
        # Every tick is accounted for exactly once: enqueued, or missed by the policy.
        assert schedule.ticks_missed == missing, policy
        assert schedule.ticks_enqueued == len(got)
        assert schedule.ticks_enqueued + schedule.ticks_missed == accounted(schedule)
        # Late jobs: those enqueued more than the grace after their tick, i.e. the missed
        # ticks the policy ran. They come right after the gap.
        jobs = list(Job.objects.filter(schedule=schedule).order_by("scheduled_at"))
        late = [i for i, job in enumerate(jobs)
                if (job.created_at - job.scheduled_at).total_seconds() > grace]
        late_by_policy[policy] = late
        after_gap = seconds.index(gaps[0][1])
        assert late == list(range(after_gap, after_gap + len(late))), policy
    assert {p: len(late) for p, late in late_by_policy.items()} == {
        "skip": 1, "catch_up": 3, "none": 0}
    assert "schedule.missed name=misfire.none" in after.output()


def test_overlap_skip_with_a_handler_slower_than_the_interval_never_runs_two_at_once(
    start_worker,
) -> None:
    schedule = every_second("overlap.slow", overlap="skip")
    Schedule.objects.filter(pk=schedule.pk).update(
        payload={"schedule": "overlap.slow", "sleep": 2.5})
    workers = [start_worker("--concurrency", "2", "--poll-interval", "0.2",
                            PGJOBS_SCHEDULE_INTERVAL_SECONDS="0.25") for _ in range(2)]
    wait_for(lambda: Job.objects.filter(schedule=schedule, status=JobStatus.SUCCEEDED).count()
             >= 4, 120)
    settle_and_stop([schedule], workers)

    schedule = Schedule.objects.get(pk=schedule.pk)
    jobs = list(Job.objects.filter(schedule=schedule).order_by("scheduled_at"))
    assert len(jobs) >= 4
    assert {job.status for job in jobs} == {JobStatus.SUCCEEDED}
    # The next tick's job was enqueued only after the previous one had finished.
    for previous, following in pairwise(jobs):
        assert following.created_at >= previous.finished_at, (previous.pk, following.pk)
    # The handler takes 2.5 s on a 1 s schedule: ticks were skipped, and every one is counted.
    assert schedule.ticks_skipped >= 2 * (len(jobs) - 1)
    assert (schedule.ticks_enqueued, schedule.ticks_missed) == (len(jobs), 0)
    assert schedule.ticks_enqueued + schedule.ticks_skipped == accounted(schedule)
    assert schedule.last_skip_reason == "overlap"
    assert any("schedule.skipped name=overlap.slow" in w.output() for w in workers)
