"""The schedule step, the sync of declared schedules, and the operators' schedule actions.

The step takes ``now`` in place of the database clock, so misfires and DST days are walked
exactly; what the database decides (locks, the unique index) is exercised for real.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.utils import timezone

import django_pgjobs
from django_pgjobs import Schedule, schedules
from django_pgjobs.context import JobContext
from django_pgjobs.enqueuing import JobSpec, Tick, enqueue_many
from django_pgjobs.executor import execute
from django_pgjobs.models import Job, OperatorAction
from django_pgjobs.models import Schedule as ScheduleRow
from django_pgjobs.registry import registry
from django_pgjobs.schedules import (
    DEFINITION,
    PASS_HOLD_SECONDS,
    ScheduleStep,
    declared_schedules,
    enqueue_due_ticks,
    pause_schedules,
    resume_schedules,
    run_schedules_now,
    save_schedule,
    sync_declared,
)
from django_pgjobs.status import JobStatus, ScheduleSource
from django_pgjobs.transitions import Actor, claim_jobs, database_now
from tests.conftest import MANAGE, ROOT, wait_for, worker_env
from tests.factories import JobFactory, ScheduleFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 5, 4, 9, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ticks_of(schedule: ScheduleRow) -> list[datetime]:
    return list(Job.objects.filter(schedule=schedule).order_by("scheduled_at")
                .values_list("scheduled_at", flat=True))


def fresh(schedule: ScheduleRow) -> ScheduleRow:
    return ScheduleRow.objects.get(pk=schedule.pk)


# --- the step --------------------------------------------------------------------------------


def test_each_due_tick_becomes_one_job_carrying_its_schedule_and_tick() -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), payload={"report": "daily"}, queue="reports",
                               priority=7)
    assert enqueue_due_ticks(now=at(2.5)) == 3
    jobs = list(Job.objects.filter(schedule=schedule).order_by("scheduled_at"))
    assert [j.scheduled_at for j in jobs] == [at(0), at(1), at(2)]
    assert {(j.task, j.queue, j.priority, j.status) for j in jobs} == {
        ("tests.when", "reports", 7, JobStatus.READY)}
    assert [j.payload for j in jobs] == [{"report": "daily"}] * 3
    schedule = fresh(schedule)
    assert (schedule.next_tick_at, schedule.last_tick_at, schedule.last_job_id) == (
        at(3), at(2), jobs[-1].pk)
    assert (schedule.ticks_enqueued, schedule.ticks_missed, schedule.ticks_skipped) == (3, 0, 0)
    assert enqueue_due_ticks(now=at(2.9)) == 0  # nothing new is due


def test_the_handler_sees_the_tick_as_ctx_scheduled_at() -> None:
    ScheduleFactory(next_tick_at=at(0))
    enqueue_due_ticks(now=at(0.2))
    unscheduled = django_pgjobs.enqueue("tests.when", {"plain": True})
    claimed = {job.id: job for job in claim_jobs("w", "default", 10)}
    results = {job_id: execute(job, JobContext(job, worker_id="w", using="default"))
               for job_id, job in claimed.items()}
    scheduled = next(i for i in claimed if i != unscheduled.pk)
    assert claimed[scheduled].scheduled_at == at(0)
    assert '"scheduled_at": "2026-05-04T09:00:00+00:00"' in results[scheduled].result_json
    assert claimed[unscheduled.pk].scheduled_at is None
    assert '"scheduled_at": null' in results[unscheduled.pk].result_json


def test_the_unique_index_refuses_a_second_job_for_a_tick_whatever_the_cursor_says() -> None:
    schedule = ScheduleFactory(next_tick_at=at(0))
    enqueue_due_ticks(now=at(1.5))
    # A cursor moved back (a stale write, a bug, an operator's hand): the ticks already have
    # jobs, and the statement's ON CONFLICT DO NOTHING keeps them at one each.
    ScheduleRow.objects.filter(pk=schedule.pk).update(next_tick_at=at(0))
    enqueue_due_ticks(now=at(2.5))
    assert ticks_of(schedule) == [at(0), at(1), at(2)]
    again = enqueue_many([JobSpec("tests.when", {}, {}, tick=Tick(schedule.pk, at(1)))])
    assert (again[0].created, again[0].scheduled_at) == (False, at(1))
    with pytest.raises(IntegrityError, match="pgjobs_job_schedule_tick"), transaction.atomic():
        JobFactory(schedule=schedule, scheduled_at=at(1))
    assert Job.objects.filter(schedule=schedule).count() == 3


def test_a_schedule_another_worker_holds_is_skipped_not_waited_for(other_connection) -> None:
    schedule = ScheduleFactory(next_tick_at=at(0))
    other_connection.set_autocommit(False)
    with other_connection.cursor() as cursor:
        cursor.execute("SELECT id FROM pgjobs_schedule WHERE id = %s FOR NO KEY UPDATE",
                       [schedule.pk])
    try:
        assert enqueue_due_ticks(now=at(0.5)) == 0
        assert ticks_of(schedule) == []
    finally:
        other_connection.rollback()
    assert enqueue_due_ticks(now=at(0.5)) == 1
    assert ticks_of(schedule) == [at(0)]


def test_a_batch_is_bounded_and_the_next_pass_goes_on_where_it_stopped() -> None:
    first = ScheduleFactory(next_tick_at=at(0))
    second = ScheduleFactory(next_tick_at=at(0))
    assert enqueue_due_ticks(now=at(4.5), limit=3) == 3
    assert (len(ticks_of(first)) + len(ticks_of(second))) == 3
    while enqueue_due_ticks(now=at(4.5), limit=3):
        pass
    assert ticks_of(first) == ticks_of(second) == [at(s) for s in range(5)]


def test_paused_retired_and_unknown_task_schedules_do_not_tick() -> None:
    paused = ScheduleFactory(next_tick_at=at(0), paused_at=at(0))
    retired = ScheduleFactory(next_tick_at=at(0), retired_at=at(0))
    elsewhere = ScheduleFactory(next_tick_at=at(0), task="tests.not_in_this_worker")
    assert enqueue_due_ticks(now=at(5)) == 0
    assert Job.objects.count() == 0
    # A worker that has the task (a newer deploy) takes it; this one left its cursor alone.
    assert fresh(elsewhere).next_tick_at == at(0)
    assert fresh(paused).next_tick_at == fresh(retired).next_tick_at == at(0)


def test_a_schedule_whose_jobs_enqueue_refuses_waits_and_says_why(settings, caplog) -> None:
    good = ScheduleFactory(next_tick_at=at(0))
    bad = ScheduleFactory(next_tick_at=at(0), queue="reports")
    settings.PGJOBS_QUEUES = ["default"]  # set after the schedule was saved
    with caplog.at_level(logging.ERROR, logger="django_pgjobs.schedules"):
        enqueue_due_ticks(now=at(0.5))
    assert ticks_of(good) == [at(0)] and ticks_of(bad) == []
    assert fresh(bad).next_tick_at == at(0)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"schedule.refused name={bad.name} task=tests.when: its jobs are "
                           "refused (unknown queue 'reports'")


# --- a schedule that fails ----------------------------------------------------------------------


def test_a_schedule_whose_ticks_cannot_be_planned_is_recorded_and_the_others_go_on(
    caplog,
) -> None:
    # A zone gone from the tzdata of an upgraded host (with a secret in its name, to show that
    # the error is scrubbed).
    broken = ScheduleFactory(next_tick_at=at(0), payload={})
    ScheduleRow.objects.filter(pk=broken.pk).update(timezone="Gone/Zone password=hunter2")
    healthy = ScheduleFactory(cron="* * * * *", next_tick_at=at(0))
    # Rare ticks caught up with big limits once walked back past year 1.
    yearly = ScheduleFactory(cron="0 0 1 1 *", misfire="catch_up", catch_up_limit=5_000,
                             next_tick_at=datetime(2026, 1, 1, tzinfo=UTC))
    leap = ScheduleFactory(cron="0 0 29 2 *", misfire="catch_up", catch_up_limit=10_000,
                           next_tick_at=datetime(2024, 2, 29, tzinfo=UTC))
    started = database_now()
    with caplog.at_level(logging.ERROR, logger="django_pgjobs.schedules"):
        assert enqueue_due_ticks(now=at(0.5)) == 3
        enqueue_due_ticks(now=at(1.5))
    assert ticks_of(healthy) == [at(0)]
    assert ticks_of(yearly) == [datetime(2026, 1, 1, tzinfo=UTC)]
    assert ticks_of(leap) == [datetime(2024, 2, 29, tzinfo=UTC)]
    assert ticks_of(broken) == []
    row = fresh(broken)
    assert row.next_tick_at == at(0) and row.ticks_enqueued == row.ticks_missed == 0
    error = ("ZoneInfoNotFoundError: 'No time zone found with key Gone/Zone password="
             "[redacted]'")
    assert row.last_error == error
    assert row.last_error_at is not None and row.last_error_at >= started
    assert fresh(healthy).last_error == "" and fresh(healthy).last_error_at is None
    # Logged once while it lasts, not on every pass.
    assert [r.getMessage() for r in caplog.records] == [
        f"schedule.failed name={broken.name} task=tests.when: its ticks could not be planned "
        f"({error}); its cursor stays, the other schedules go on, and it shows as late"]

    ScheduleRow.objects.filter(pk=broken.pk).update(timezone="UTC")
    enqueue_due_ticks(now=at(1.5))
    row = fresh(broken)
    assert ticks_of(broken) == [at(0), at(1)]
    assert (row.last_error, row.last_error_at) == ("", None)


def test_a_schedules_error_is_kept_on_one_line_without_its_payloads_secrets(monkeypatch) -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), payload={"api_key": "k-4242-secret"})

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("cannot plan\nwith k-4242-secret\x00")

    monkeypatch.setattr(schedules, "plan_ticks", fails)
    enqueue_due_ticks(now=at(0.5))
    assert fresh(schedule).last_error == "ValueError: cannot plan\\nwith [redacted]\\x00"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_starts_and_exits_zero_beside_a_schedule_that_cannot_be_planned() -> None:
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    healthy = ScheduleRow.objects.create(
        name="fails.healthy", task="demo.tick", cron="* * * * *", next_tick_at=minute,
        payload={"schedule": "fails.healthy"})
    yearly = ScheduleRow.objects.create(
        name="fails.yearly", task="demo.tick", cron="0 0 1 1 *", misfire="catch_up",
        catch_up_limit=10_000, next_tick_at=datetime(now.year, 1, 1, tzinfo=UTC))
    broken = ScheduleRow.objects.create(
        name="fails.broken", task="demo.tick", cron="* * * * *", next_tick_at=minute)
    ScheduleRow.objects.filter(pk=broken.pk).update(timezone="Gone/Zone")
    result = subprocess.run(
        [sys.executable, str(MANAGE), "pgjobs_worker", "--burst"], cwd=ROOT,
        env=worker_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert ticks_of(healthy) == [minute]
    assert ticks_of(yearly) == [datetime(now.year, 1, 1, tzinfo=UTC)]
    assert fresh(broken).last_error.startswith("ZoneInfoNotFoundError: ")
    assert "schedule.failed name=fails.broken task=demo.tick" in result.stderr


# --- a pass that stops ---------------------------------------------------------------------------


class StoppedPass(threading.Thread):
    """A pass, on a connection of its own, that stops once it holds its rows, until released.

    It stands for a worker stopped (SIGSTOP, a frozen host) between two statements of its pass.
    """

    def __init__(self, now: datetime) -> None:
        super().__init__(daemon=True)
        self.now = now
        self.holding = threading.Event()
        self.release = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            enqueue_due_ticks(now=self.now)
        except BaseException as exc:  # read by the test
            self.error = exc
        finally:
            connections.close_all()

    def plan_ticks(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def plan(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is self:
                self.holding.set()
                self.release.wait(120)
            return real(*args, **kwargs)
        return plan


@pytest.fixture
def stopped_pass(monkeypatch) -> Iterator[Callable[[datetime], StoppedPass]]:
    started: list[StoppedPass] = []

    def start(now: datetime) -> StoppedPass:
        stopped = StoppedPass(now)
        monkeypatch.setattr(schedules, "plan_ticks", stopped.plan_ticks(schedules.plan_ticks))
        stopped.start()
        assert stopped.holding.wait(30)
        started.append(stopped)
        return stopped

    yield start
    for stopped in started:
        stopped.release.set()
        stopped.join(30)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_pass_stopped_while_it_holds_the_rows_loses_them_and_another_pass_runs_the_ticks(
    stopped_pass,
) -> None:
    schedule = ScheduleFactory(next_tick_at=at(0))
    stopped = stopped_pass(at(0.5))
    # While it is stopped, other passes skip the row; the server ends the stopped one's
    # session after PASS_HOLD_SECONDS, and the next pass takes the tick.
    wait_for(lambda: enqueue_due_ticks(now=at(0.5)) == 1, 6 * PASS_HOLD_SECONDS)
    assert ticks_of(schedule) == [at(0)]
    stopped.release.set()
    stopped.join(30)
    assert isinstance(stopped.error, DatabaseError)  # its pass rolled back
    schedule = fresh(schedule)
    assert (schedule.ticks_enqueued, schedule.next_tick_at) == (1, at(1))


# --- misfire -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("misfire", "limit", "ran", "missed"), [
    ("skip", 100, [7, 8, 9, 10], 7),
    ("catch_up", 3, [5, 6, 7, 8, 9, 10], 5),
    ("catch_up", 100, list(range(11)), 0),
    ("none", 100, [8, 9, 10], 8),
])
def test_after_an_outage_each_misfire_policy_runs_what_it_says(
    settings, caplog, misfire: str, limit: int, ran: list[int], missed: int
) -> None:
    settings.PGJOBS_SCHEDULE_GRACE_SECONDS = 3
    schedule = ScheduleFactory(next_tick_at=at(0), misfire=misfire, catch_up_limit=limit)
    # No worker ran from 0 to 10.5: ticks 0-7 are older than the grace, 8-10 are on time.
    with caplog.at_level(logging.WARNING, logger="django_pgjobs.schedules"):
        enqueue_due_ticks(now=at(10.5))
    assert ticks_of(schedule) == [at(s) for s in ran]
    schedule = fresh(schedule)
    assert (schedule.ticks_missed, schedule.ticks_enqueued) == (missed, len(ran))
    assert schedule.last_tick_at == at(10)
    # Every tick is accounted for, exactly once: run or passed over.
    assert schedule.ticks_enqueued + schedule.ticks_missed == 11
    if missed:
        assert schedule.last_skip_reason == "misfire"
        assert caplog.messages == [f"schedule.missed name={schedule.name} ticks={missed} "
                                   f"policy={misfire}: no worker enqueued them within "
                                   "PGJOBS_SCHEDULE_GRACE_SECONDS"]
    else:
        assert caplog.messages == []


# --- overlap -------------------------------------------------------------------------------------


def test_overlap_skip_skips_ticks_while_the_previous_job_waits_and_records_them(caplog) -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), overlap="skip")
    enqueue_due_ticks(now=at(0.5))
    [first] = Job.objects.filter(schedule=schedule)
    with caplog.at_level(logging.INFO, logger="django_pgjobs.schedules"):
        enqueue_due_ticks(now=at(2.5))  # ticks 1 and 2 while job 0 is still ready
    assert ticks_of(schedule) == [at(0)]
    schedule = fresh(schedule)
    assert (schedule.ticks_skipped, schedule.last_skipped_at, schedule.last_skip_reason) == (
        2, at(2), "overlap")
    assert f"schedule.skipped name={schedule.name} ticks=2 reason=overlap " \
           "last=2026-05-04T09:00:02+00:00" in caplog.text
    for status in (JobStatus.RUNNING, JobStatus.RETRYING, JobStatus.SCHEDULED):
        Job.objects.filter(pk=first.pk).update(status=status, **(
            {"lease_token": "8d1d1d35-7a54-4e0a-9a1b-1a2b3c4d5e6f", "lease_owner": "w",
             "lease_expires_at": at(60)} if status == JobStatus.RUNNING else
            {"lease_token": None, "lease_owner": None, "lease_expires_at": None}))
        enqueue_due_ticks(now=fresh(schedule).next_tick_at + timedelta(seconds=0.5))
        assert ticks_of(schedule) == [at(0)], status
    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED, finished_at=at(5))
    # Ticks 6 and 7 are due at once: only the latest runs, the other would wait alongside it.
    enqueue_due_ticks(now=at(7.5))
    assert ticks_of(schedule) == [at(0), at(7)]
    schedule = fresh(schedule)
    assert schedule.ticks_enqueued + schedule.ticks_skipped == 8
    assert schedule.last_job_id == Job.objects.get(schedule=schedule, scheduled_at=at(7)).pk


def test_overlap_allow_enqueues_every_tick_whatever_the_previous_job_does() -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), overlap="allow")
    enqueue_due_ticks(now=at(0.5))
    enqueue_due_ticks(now=at(2.5))
    assert ticks_of(schedule) == [at(0), at(1), at(2)]
    assert fresh(schedule).ticks_skipped == 0


# --- DST through the database --------------------------------------------------------------------


@pytest.mark.parametrize(("day", "cron", "expected"), [
    # Fall back: the daily run in the repeated hour runs once, at the first 02:30.
    (datetime(2026, 10, 25, tzinfo=UTC), "30 2 * * *", [datetime(2026, 10, 25, 0, 30,
                                                                 tzinfo=UTC)]),
    # Spring forward: 02:30 does not exist; the run happens at 03:00 CEST, not never.
    (datetime(2026, 3, 29, tzinfo=UTC), "30 2 * * *", [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]),
])
def test_a_daily_schedule_in_paris_through_a_dst_day_runs_exactly_once(
    day: datetime, cron: str, expected: list[datetime]
) -> None:
    start = day - timedelta(hours=3)
    schedule = ScheduleFactory(cron=cron, timezone="Europe/Paris", next_tick_at=None)
    from django_pgjobs.ticks import next_tick

    ScheduleRow.objects.filter(pk=schedule.pk).update(
        next_tick_at=next_tick(cron, "Europe/Paris", start))
    now = start
    while now < day + timedelta(hours=22):
        enqueue_due_ticks(now=now)
        now += timedelta(minutes=4)
    assert ticks_of(schedule) == expected


def test_an_hourly_schedule_in_paris_runs_25_times_on_the_fall_back_day() -> None:
    from django_pgjobs.ticks import next_tick

    start = datetime(2026, 10, 24, 21, 59, tzinfo=UTC)  # 23:59 CEST
    schedule = ScheduleFactory(cron="0 * * * *", timezone="Europe/Paris",
                               next_tick_at=next_tick("0 * * * *", "Europe/Paris", start))
    now = start
    while now < datetime(2026, 10, 25, 22, 59, tzinfo=UTC):  # 23:59 CET
        enqueue_due_ticks(now=now)
        now += timedelta(minutes=7)
    ticks = ticks_of(schedule)
    assert len(ticks) == len(set(ticks)) == 25
    assert [t.astimezone(django_pgjobs.ticks.zone("Europe/Paris")).strftime("%H%z")
            for t in ticks[1:5]] == ["01+0200", "02+0200", "02+0100", "03+0100"]


# --- the sync ------------------------------------------------------------------------------------


@pytest.fixture
def declare():
    declared: list[str] = []

    def register(name: str, **options: Any) -> None:
        django_pgjobs.job(name, **options)(lambda ctx, payload: None)
        declared.append(name)

    yield register
    for name in declared:
        registry.remove(name)


def names(source: str | None = None) -> dict[str, str]:
    rows = ScheduleRow.objects.order_by("name")
    if source is not None:
        rows = rows.filter(source=source)
    return {row.name: row.state for row in rows}


def test_the_sync_adds_changes_and_retires_declared_schedules_and_keeps_their_rows(
    declare, settings
) -> None:
    declare("tests.sync.daily", cron="0 6 * * *", timezone="Europe/Paris",
            schedules=[Schedule("0 18 * * *", name="tests.sync.evening", payload={"n": 1})])
    settings.PGJOBS_SCHEDULES = {"tests.sync.hourly": {"task": "tests.ok", "cron": "0 * * * *"}}
    report = sync_declared()
    assert sorted(report.added) == ["tests.sync.daily", "tests.sync.evening", "tests.sync.hourly"]
    daily = ScheduleRow.objects.get(name="tests.sync.daily")
    assert (daily.task, daily.cron, daily.timezone, daily.source) == (
        "tests.sync.daily", "0 6 * * *", "Europe/Paris", ScheduleSource.CODE)
    assert daily.next_tick_at is not None and daily.next_tick_at > timezone.now()
    assert ScheduleRow.objects.get(name="tests.sync.hourly").source == ScheduleSource.SETTINGS
    assert sync_declared().added == [] and sync_declared().changed == []  # nothing to do

    # A payload change keeps the cursor; a new expression moves it.
    evening = ScheduleRow.objects.get(name="tests.sync.evening")
    ScheduleRow.objects.filter(pk=evening.pk).update(next_tick_at=at(0))
    registry.remove("tests.sync.daily")
    declare("tests.sync.daily", cron="30 7 * * *", timezone="Europe/Paris",
            schedules=[Schedule("0 18 * * *", name="tests.sync.evening", payload={"n": 2})])
    job = JobFactory(schedule=evening, scheduled_at=at(0))
    settings.PGJOBS_SCHEDULES = {}
    report = sync_declared()
    assert sorted(report.changed) == ["tests.sync.daily", "tests.sync.evening"]
    assert report.retired == ["tests.sync.hourly"]
    evening = fresh(evening)
    assert (evening.payload, evening.next_tick_at) == ({"n": 2}, at(0))
    assert ScheduleRow.objects.get(name="tests.sync.daily").cron == "30 7 * * *"
    assert names() == {"tests.sync.daily": "active", "tests.sync.evening": "active",
                       "tests.sync.hourly": "retired"}

    # Gone from code: retired, never deleted, and the jobs that name it keep it.
    registry.remove("tests.sync.daily")
    assert sorted(sync_declared().retired) == ["tests.sync.daily", "tests.sync.evening"]
    assert Job.objects.get(pk=job.pk).schedule_id == evening.pk
    assert fresh(evening).retired_at is not None
    # Declared again: back, ticking from its next tick after now.
    declare("tests.sync.daily", schedules=[Schedule("0 18 * * *", name="tests.sync.evening")])
    report = sync_declared()
    assert report.changed == ["tests.sync.evening"]
    evening = fresh(evening)
    assert evening.retired_at is None and evening.next_tick_at > timezone.now()


def test_the_sync_never_touches_an_operators_schedule_or_a_pause(declare, caplog) -> None:
    mine = ScheduleFactory(name="tests.sync.mine", cron="0 3 * * *", task="tests.ok")
    declare("tests.sync.code", cron="0 4 * * *",
            schedules=[Schedule("0 5 * * *", name="tests.sync.mine")])
    with caplog.at_level(logging.WARNING, logger="django_pgjobs.schedules"):
        report = sync_declared()
    assert report.conflicts == ["tests.sync.mine"]
    assert "schedule.conflict name=tests.sync.mine" in caplog.text
    mine = fresh(mine)
    assert (mine.cron, mine.task, mine.source) == ("0 3 * * *", "tests.ok", ScheduleSource.ADMIN)
    code = ScheduleRow.objects.get(name="tests.sync.code")
    pause_schedules([code.pk])
    registry.remove("tests.sync.code")
    declare("tests.sync.code", cron="0 9 * * *")
    sync_declared()
    assert fresh(code).state == "paused" and fresh(code).cron == "0 9 * * *"
    registry.remove("tests.sync.code")
    sync_declared()
    assert fresh(mine).state == "active"  # the operator's schedule is never retired


def test_a_new_declared_cron_counts_the_old_ones_due_ticks_as_missed(declare, caplog) -> None:
    declare("tests.sync.nightly", cron="0 0 * * *")
    sync_declared()
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    ScheduleRow.objects.filter(name="tests.sync.nightly").update(
        next_tick_at=midnight - timedelta(days=2))
    registry.remove("tests.sync.nightly")
    declare("tests.sync.nightly", cron="30 1 * * *")  # a deploy changes the expression
    with caplog.at_level(logging.WARNING, logger="django_pgjobs.schedules"):
        assert sync_declared().changed == ["tests.sync.nightly"]
    # Two days ago, yesterday and today at midnight were due and never enqueued.
    row = ScheduleRow.objects.get(name="tests.sync.nightly")
    assert (row.cron, row.ticks_missed, row.last_skipped_at, row.last_skip_reason) == (
        "30 1 * * *", 3, midnight, "misfire")
    assert row.next_tick_at > timezone.now() - timedelta(seconds=1)
    assert caplog.messages == ["schedule.missed name=tests.sync.nightly ticks=3 policy=skip: "
                               "its expression or zone changed before they were enqueued"]
    # A change of payload alone keeps the cursor: nothing is dropped, nothing counted.
    registry.remove("tests.sync.nightly")
    declare("tests.sync.nightly", cron="30 1 * * *", schedules=[])
    sync_declared()
    assert ScheduleRow.objects.get(name="tests.sync.nightly").ticks_missed == 3


def test_the_step_syncs_once_then_enqueues(declare) -> None:
    declare("tests.sync.step", cron="* * * * * *")
    step = ScheduleStep()
    step()
    assert step.synced and names(ScheduleSource.CODE) == {"tests.sync.step": "active"}
    registry.remove("tests.sync.step")
    step()
    assert names(ScheduleSource.CODE) == {"tests.sync.step": "active"}  # not synced again


def test_declared_schedules_report_what_enqueue_would_refuse(declare, settings) -> None:
    declare("tests.sync.reports", schedules=[Schedule("0 6 * * *", name="tests.sync.q",
                                                      queue="reports")])
    settings.PGJOBS_QUEUES = ["default"]
    settings.PGJOBS_SCHEDULES = {
        "tests.sync.ghost": {"task": "tests.no_such_task", "cron": "0 6 * * *"},
        "tests.sync.reports": {"task": "tests.ok", "cron": "0 7 * * *"},
        "tests.sync.q": {"task": "tests.ok", "cron": "0 8 * * *"},
    }
    declared, problems = declared_schedules()
    assert [d.schedule.name for d in declared] == ["tests.sync.reports"]
    assert problems[0] == ("schedule 'tests.sync.q': its jobs would be refused: unknown queue "
                           "'reports': PGJOBS_QUEUES declares default")
    assert "schedule 'tests.sync.ghost': task 'tests.no_such_task' has no registered handler" \
           " (register it with @django_pgjobs.job)" in problems
    assert "schedule 'tests.sync.q' is declared twice (by code (@job) and settings " \
           "(PGJOBS_SCHEDULES)): schedule names are unique" in problems


# --- operators -----------------------------------------------------------------------------------


def test_pause_and_resume_are_guarded_and_audited_and_a_resume_skips_the_paused_ticks() -> None:
    active, paused, retired = (ScheduleFactory(next_tick_at=at(0)),
                               ScheduleFactory(paused_at=at(0)),
                               ScheduleFactory(retired_at=at(0)))
    ada = Actor("ada", None)
    assert pause_schedules([active.pk, paused.pk, retired.pk], actor=ada, reason="deploy") == 1
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.actor_name, audit.reason, audit.schedule_ids, audit.changed) == (
        "schedule_pause", "ada", "deploy", sorted([active.pk, paused.pk, retired.pk]), 1)
    assert audit.detail == {"before": {"active": 1, "paused": 1, "retired": 1},
                            "paused": [active.pk]}
    assert enqueue_due_ticks(now=timezone.now()) == 0
    assert resume_schedules([active.pk, retired.pk], actor=ada) == 1
    active = fresh(active)
    assert active.paused_at is None
    # The ticks of the pause do not run: the next one is after now.
    assert active.next_tick_at > timezone.now() - timedelta(seconds=1)
    assert OperatorAction.objects.order_by("-id")[0].detail["resumed"] == [active.pk]


def waiting_for_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND datname = current_database()")
        return int(cursor.fetchone()[0])


def read_by_the_admin(schedule: ScheduleRow) -> tuple[ScheduleRow, dict[str, Any]]:
    """The row and definition an operator's form starts from."""
    row = fresh(schedule)
    return row, {f: getattr(row, f) for f in DEFINITION}


@pytest.mark.django_db(transaction=True)
def test_an_edit_saved_while_a_pass_holds_the_row_keeps_what_the_pass_wrote(
    stopped_pass,
) -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), overlap="skip", payload={"v": 1})
    row, before = read_by_the_admin(schedule)
    stopped = stopped_pass(at(0.5))  # a pass holds the row, about to enqueue tick 0
    row.payload = {"v": 2}
    saving = threading.Thread(target=lambda: (save_schedule(row, created=False, before=before),
                                              connections.close_all()))
    saving.start()
    wait_for(waiting_for_a_lock, 30)  # the save waits for the pass
    stopped.release.set()
    stopped.join(30)
    saving.join(30)
    assert stopped.error is None and not saving.is_alive()
    [job] = Job.objects.filter(schedule=schedule)
    saved = fresh(schedule)
    assert saved.payload == {"v": 2}
    assert (saved.ticks_enqueued, saved.last_job_id, saved.last_tick_at, saved.next_tick_at) == (
        1, job.pk, at(0), at(1))
    # Overlap skip still sees tick 0's job waiting: tick 1 is skipped, not run beside it.
    enqueue_due_ticks(now=at(1.5))
    assert ticks_of(schedule) == [at(0)]
    assert fresh(schedule).ticks_skipped == 1


def test_an_edit_writes_only_the_fields_the_operator_changed() -> None:
    schedule = ScheduleFactory(next_tick_at=at(0), priority=3)
    row, before = read_by_the_admin(schedule)
    ScheduleRow.objects.filter(pk=schedule.pk).update(priority=5)  # another operator's edit
    enqueue_due_ticks(now=at(2.5))
    row.queue = "reports"
    save_schedule(row, created=False, before=before, actor=Actor("ada"))
    saved = fresh(schedule)
    assert (saved.queue, saved.priority) == ("reports", 5)
    assert (saved.ticks_enqueued, saved.next_tick_at, saved.last_tick_at) == (3, at(3), at(2))
    assert OperatorAction.objects.get().detail == {"changed": {"queue": ["", "reports"]}}


def test_a_new_cron_counts_the_old_ones_due_ticks_as_missed(caplog) -> None:
    midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    schedule = ScheduleFactory(cron="0 0 * * *", next_tick_at=midnight - timedelta(days=3))
    paused = ScheduleFactory(cron="0 0 * * *", next_tick_at=midnight - timedelta(days=3),
                             paused_at=midnight)
    for row, before in (read_by_the_admin(schedule), read_by_the_admin(paused)):
        row.cron = "30 1 * * *"
        with caplog.at_level(logging.WARNING, logger="django_pgjobs.schedules"):
            save_schedule(row, created=False, before=before)
    # Three days ago, two, yesterday and today at midnight were due and never enqueued.
    saved = fresh(schedule)
    assert (saved.ticks_missed, saved.last_skipped_at, saved.last_skip_reason) == (
        4, midnight, "misfire")
    assert saved.next_tick_at > timezone.now() - timedelta(seconds=1)
    assert caplog.messages == [f"schedule.missed name={schedule.name} ticks=4 policy=skip: its "
                               "expression or zone changed before they were enqueued"]
    # A paused schedule's ticks never run, and are not counted (a resume skips them too).
    assert (fresh(paused).ticks_missed, fresh(paused).last_skip_reason) == (0, "")


def test_run_now_enqueues_one_job_per_schedule_at_the_time_asked_and_audits_it() -> None:
    schedule = ScheduleFactory(next_tick_at=at(3600), paused_at=at(0), payload={"k": 1})
    retired = ScheduleFactory(retired_at=at(0))
    [job] = run_schedules_now([schedule.pk, retired.pk], actor=Actor("bob"), reason="re-run")
    assert (job.schedule_id, job.payload, job.task) == (schedule.pk, {"k": 1}, "tests.when")
    assert abs((job.scheduled_at - timezone.now()).total_seconds()) < 60
    schedule = fresh(schedule)
    assert (schedule.last_job_id, schedule.next_tick_at) == (job.pk, at(3600))  # cursor kept
    audit = OperatorAction.objects.get()
    assert (audit.action, audit.job_ids, audit.changed) == ("schedule_run_now", [job.pk], 1)
    assert audit.detail["enqueued"] == {str(schedule.pk): job.pk}


def test_a_schedule_row_is_never_deleted_while_jobs_name_it() -> None:
    schedule = ScheduleFactory()
    JobFactory(schedule=schedule, scheduled_at=at(0))
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        schedule.delete()
    # The database holds it too (the foreign key is checked at once here, not at commit).
    with pytest.raises(IntegrityError, match="pgjobs_job_schedule_id"), transaction.atomic(), \
            connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("DELETE FROM pgjobs_schedule WHERE id = %s", [schedule.pk])


# --- manage.py pgjobs_schedules ---------------------------------------------------------------


def test_the_schedules_command_lists_next_ticks_across_the_fall_back_hour() -> None:
    import json
    from io import StringIO

    import time_machine
    from django.core.management import call_command

    ScheduleFactory(name="ops.hourly", cron="0 * * * *", timezone="Europe/Paris",
                    paused_at=at(0))
    ScheduleFactory(name="ops.gone", retired_at=at(0))
    # 01:30 CEST on the day Paris falls back: a paused schedule shows what a resume would run.
    with time_machine.travel(datetime(2026, 10, 24, 23, 30, tzinfo=UTC), tick=False):
        out = StringIO()
        call_command("pgjobs_schedules", "--json", "--count", "4", stdout=out)
    [listed] = json.loads(out.getvalue())
    assert (listed["name"], listed["state"], listed["source"]) == ("ops.hourly", "paused",
                                                                   "admin")
    assert listed["next_ticks"] == ["2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00",
                                    "2026-10-25T03:00:00+01:00", "2026-10-25T04:00:00+01:00"]
    text = StringIO()
    call_command("pgjobs_schedules", "--all", stdout=text)
    assert "ops.gone  [retired, admin]" in text.getvalue()
    assert "ops.hourly  [paused, admin]  tests.when  '0 * * * *' Europe/Paris" in text.getvalue()
    assert "\n  next if resumed: 2026-" in text.getvalue()


def test_the_schedules_command_shows_a_failing_schedules_error_escaped() -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    ScheduleFactory(name="ops.broken", last_error="OverflowError: date\x1b[31m out of range",
                    last_error_at=at(0))
    out = StringIO()
    call_command("pgjobs_schedules", "--json", stdout=out)
    [listed] = json.loads(out.getvalue())
    assert (listed["last_error"], listed["last_error_at"]) == (
        "OverflowError: date\x1b[31m out of range", at(0).isoformat())
    text = StringIO()
    call_command("pgjobs_schedules", stdout=text)
    assert f"  failing since {at(0).isoformat()}: OverflowError: date\\x1b[31m out of range" in (
        text.getvalue())
    assert "\x1b" not in text.getvalue()


def test_the_schedules_command_shows_an_active_schedules_ticks_from_its_cursor() -> None:
    import json
    from io import StringIO

    from django.core.management import call_command

    schedule = ScheduleFactory(name="ops.seconds", cron="*/20 * * * * *", next_tick_at=at(0))
    enqueue_due_ticks(now=at(0.5))
    out = StringIO()
    call_command("pgjobs_schedules", "--json", stdout=out)
    [listed] = json.loads(out.getvalue())
    assert listed["next_ticks"] == [(at(20 * i)).isoformat() for i in range(1, 6)]
    assert (listed["last_tick_at"], listed["last_job_status"], listed["ticks_enqueued"]) == (
        at(0).isoformat(), "ready", 1)
    assert listed["last_job_id"] == Job.objects.get(schedule=schedule).pk
