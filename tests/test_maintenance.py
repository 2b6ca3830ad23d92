"""Maintenance steps: priority aging, retention, the backlog-age watch, and their cadence."""

from __future__ import annotations

import logging
import math
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

import django_pgjobs
from django_pgjobs import sql
from django_pgjobs.maintenance import (
    AgingPolicy,
    BacklogWatch,
    Step,
    age_priorities,
    count_expired_receipts,
    count_prunable_jobs,
    default_steps,
    prune_finished,
    prune_jobs,
    prune_receipts,
    retention_seconds,
)
from django_pgjobs.models import Attempt, IdempotencyReceipt, Job
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs
from tests.factories import AttemptFactory, JobFactory, ReceiptFactory

pytestmark = pytest.mark.django_db

POLICY = AgingPolicy(interval_seconds=60, step=10, cap=50, batch=100)


def ago(seconds: float):
    return timezone.now() - timedelta(seconds=seconds)


def waiting(seconds: float, **kwargs) -> Job:
    """A job due ``seconds`` ago and enqueued before that (ready since its run_at)."""
    return JobFactory(**{"created_at": ago(2 * 3600), **kwargs}, run_at=ago(seconds))


def priorities() -> dict[int, int]:
    return dict(Job.objects.values_list("id", "priority"))


# --- priority aging ------------------------------------------------------------------------------


def test_aging_adds_one_step_per_whole_interval_waited_up_to_the_cap() -> None:
    fresh = waiting(30)
    one = waiting(90)
    three = waiting(200)
    capped = waiting(3600)
    low = waiting(630, priority=-100)  # 10 intervals: -100 + 100 = 0
    above_cap = waiting(3600, priority=80)
    other_queue = waiting(150, queue="reports", priority=5)
    not_ready = [
        waiting(3600, scheduled=True),  # due but not promoted yet
        waiting(3600, running=True),
        waiting(3600, retrying=True),
        waiting(3600, succeeded=True),
    ]

    assert age_priorities(policy=POLICY) == 5

    assert priorities() == {
        fresh.id: 0, one.id: 10, three.id: 30, capped.id: 50, low.id: 0, above_cap.id: 80,
        other_queue.id: 25, **{job.id: 0 for job in not_ready},
    }
    # base_priority keeps what the job was enqueued with; the next run computes from it again.
    assert Job.objects.get(pk=three.id).base_priority == 0
    assert age_priorities(policy=POLICY) == 0
    assert Job.objects.get(pk=three.id).priority == 30


def test_aging_counts_the_wait_from_the_base_priority_not_from_the_last_raise() -> None:
    job = waiting(90)
    assert age_priorities(policy=POLICY) == 1
    assert Job.objects.get(pk=job.id).priority == 10
    Job.objects.filter(pk=job.id).update(run_at=ago(250))  # now four intervals waited
    assert age_priorities(policy=POLICY) == 1
    assert Job.objects.get(pk=job.id).priority == 40


def test_aging_counts_only_the_time_a_job_has_been_ready_not_a_run_at_given_in_the_past() -> None:
    # Enqueued just now, wanted a week ago: it has not waited at all yet.
    now_enqueued = django_pgjobs.enqueue("tests.ok", {}, priority=-100, run_at=ago(7 * 86400))
    # Enqueued 130 s ago with a run_at of ten days before: two intervals of waiting.
    two_intervals = JobFactory(priority=-100, created_at=ago(130), run_at=ago(10 * 86400))
    # A retry due 70 s ago of a job enqueued a day ago: one interval since it was due again.
    retried = waiting(70, created_at=ago(86400))

    assert age_priorities(policy=POLICY) == 2

    assert priorities() == {now_enqueued.id: -100, two_intervals.id: -80, retried.id: 10}


def test_an_aged_job_overtakes_newer_work_and_ties_break_by_run_at_then_id() -> None:
    aged = waiting(200, priority=-10)  # 3 intervals: -10 + 30 = 20
    newer_same = waiting(1, priority=20)
    newer_lower = waiting(2, priority=10)
    same_time = ago(130)
    # 2 intervals: 20, and the same run_at for both
    tie_a = JobFactory(priority=0, created_at=ago(7200), run_at=same_time)
    tie_b = JobFactory(priority=0, created_at=ago(7200), run_at=same_time)
    assert [c.id for c in claim_jobs("w", "default", 1)] == [newer_same.id]  # before aging

    age_priorities(policy=POLICY)

    claimed = [c.id for c in claim_jobs("w", "default", 10)]
    assert claimed == [aged.id, tie_a.id, tie_b.id, newer_lower.id]
    assert tie_a.id < tie_b.id


def test_aging_works_in_bounded_batches_and_raises_each_job_once_per_run() -> None:
    jobs = [waiting(130 + i) for i in range(5)]  # level 0 -> 20
    jobs += [waiting(70 + i, priority=10) for i in range(3)]  # level 10 -> 20
    policy = AgingPolicy(interval_seconds=60, step=10, cap=50, batch=2)

    with CaptureQueriesContext(connection) as queries:
        assert age_priorities(policy=policy) == 8

    assert set(priorities().values()) == {20}
    batches = [q for q in queries.captured_queries if "WITH due AS" in q["sql"]]
    # Level 10 first (3 jobs: 2 + 1), then level 0 (5 jobs: 2 + 2 + 1); the jobs raised out of
    # level 0 land in level 20, which is not walked again.
    assert len(batches) == 5


def test_one_aging_run_stops_at_its_row_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("django_pgjobs.maintenance.BATCHES_PER_RUN", 2)
    for i in range(7):
        waiting(90 + i)
    policy = AgingPolicy(interval_seconds=60, step=10, cap=50, batch=3)
    assert age_priorities(policy=policy) == 6
    assert age_priorities(policy=policy) == 1
    assert set(priorities().values()) == {10}


def test_aging_is_off_when_the_step_is_zero() -> None:
    job = waiting(3600)
    off = AgingPolicy(interval_seconds=60, step=0, cap=50, batch=10)
    with CaptureQueriesContext(connection) as queries:
        assert age_priorities(policy=off) == 0
    assert queries.captured_queries == []
    assert Job.objects.get(pk=job.id).priority == 0
    assert off.waits_to_cap(0) == math.inf


@override_settings(PGJOBS_AGING_INTERVAL_SECONDS=30, PGJOBS_AGING_STEP=25, PGJOBS_AGING_CAP=100,
                   PGJOBS_AGING_BATCH=7)
def test_the_policy_comes_from_settings_and_says_how_long_a_job_waits_for_the_cap() -> None:
    policy = AgingPolicy.from_settings()
    assert policy == AgingPolicy(interval_seconds=30.0, step=25, cap=100, batch=7)
    assert policy.waits_to_cap(-100) == 8 * 30  # 200 priority points in steps of 25
    assert policy.waits_to_cap(90) == 30
    assert policy.waits_to_cap(100) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval_seconds": 0}, "aging interval must be a finite number above 0"),
        ({"interval_seconds": math.nan}, "aging interval must be a finite number above 0"),
        ({"step": -1}, "aging step must be a whole number from 0 to 200"),
        ({"step": 2.5}, "aging step must be a whole number from 0 to 200"),
        ({"cap": 101}, "aging cap must be a whole number from -100 to 100"),
        ({"batch": 0}, "aging batch must be a whole number from 1 to 100000"),
    ],
)
def test_a_bad_aging_policy_is_refused(kwargs: dict, message: str) -> None:
    values = {"interval_seconds": 60, "step": 10, "cap": 50, "batch": 10, **kwargs}
    with pytest.raises(ValueError, match=message):
        AgingPolicy(**values)


@pytest.mark.django_db(transaction=True)
def test_aging_skips_a_job_a_claim_holds_and_does_not_wait_for_it(other_connection) -> None:
    held = waiting(90)
    free = waiting(95)
    other_connection.set_autocommit(False)
    with other_connection.cursor() as cursor:
        cursor.execute("SET LOCAL lock_timeout = '5s'")
        cursor.execute("SELECT id FROM pgjobs_job WHERE id = %s FOR UPDATE", [held.id])
    try:
        assert age_priorities(policy=POLICY) == 1
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
    assert priorities() == {held.id: 0, free.id: 10}
    assert age_priorities(policy=POLICY) == 1
    assert priorities() == {held.id: 10, free.id: 10}


# --- retention -----------------------------------------------------------------------------------


RETENTION = {"succeeded": 3600, "cancelled": 3600, "dead": 7200}


def finished(trait: str, seconds_ago: float, **kwargs) -> Job:
    return JobFactory(**{trait: True}, finished_at=ago(seconds_ago), **kwargs)


@override_settings(PGJOBS_RETENTION_SECONDS=RETENTION)
def test_prune_deletes_terminal_jobs_past_their_state_retention_with_their_attempts() -> None:
    old_success = finished("succeeded", 7200)
    for number in (1, 2):
        AttemptFactory(job=old_success, number=number, outcome="succeeded")
    recent_success = finished("succeeded", 1800)
    AttemptFactory(job=recent_success, outcome="succeeded")
    dead_within = finished("dead", 5400)  # dead are kept two hours here
    dead_past = finished("dead", 9000)
    cancelled_past = finished("cancelled", 3700)
    ready = JobFactory(created_at=ago(10**6), run_at=ago(10**6))
    running = JobFactory(running=True, created_at=ago(10**6))
    AttemptFactory(job=running)
    waiting = [JobFactory(scheduled=True), JobFactory(retrying=True)]
    expired_receipt = ReceiptFactory(expires_at=ago(1))
    live_receipt = ReceiptFactory()

    assert prune_finished() == 3 + 1

    remaining = set(Job.objects.values_list("id", flat=True))
    assert remaining == {recent_success.id, dead_within.id, ready.id, running.id,
                         *(j.id for j in waiting)}
    assert not {old_success.id, dead_past.id, cancelled_past.id} & remaining
    assert sorted(Attempt.objects.values_list("job_id", flat=True)) == sorted(
        [recent_success.id, running.id])
    assert list(IdempotencyReceipt.objects.values_list("id", flat=True)) == [live_receipt.id]
    assert expired_receipt.id != live_receipt.id
    assert prune_finished() == 0


def test_the_prune_statement_never_deletes_a_job_that_can_still_run() -> None:
    # finished_at is set on every job here, even the live ones, so only the status guard in the
    # SQL stands between them and the DELETE.
    live = [
        JobFactory(finished_at=ago(10**6)),
        JobFactory(running=True, finished_at=ago(10**6)),
        JobFactory(scheduled=True, finished_at=ago(10**6)),
        JobFactory(retrying=True, finished_at=ago(10**6)),
    ]
    for job in live:
        AttemptFactory(job=job, lease_token=uuid.uuid4())
    with connection.cursor() as cursor:
        for status in [*JobStatus.values, "", "ready' OR 'x'='x"]:
            if status in ("succeeded", "dead", "cancelled"):
                continue
            cursor.execute(sql.query("prune_jobs"),
                           {"status": status, "retention": 0.0, "limit": 1000})
            assert cursor.fetchone() == (0, 0), status
    assert Job.objects.count() == len(live)
    assert Attempt.objects.count() == len(live)
    for status in ("ready", "running", "scheduled", "retrying", "nonsense"):
        with pytest.raises(ValueError, match="only terminal jobs are pruned"):
            prune_jobs(status, 0, 10)


@override_settings(PGJOBS_RETENTION_SECONDS=RETENTION, PGJOBS_PRUNE_BATCH=2)
def test_one_prune_run_deletes_one_bounded_batch_per_state() -> None:
    for i in range(5):
        finished("succeeded", 7200 + i)
    with CaptureQueriesContext(connection) as queries:
        assert prune_finished() == 2
    deletes = [q for q in queries.captured_queries if "WITH doomed AS" in q["sql"]]
    assert len(deletes) == 4  # succeeded, cancelled, dead, receipts: one statement each
    assert Job.objects.count() == 3
    step = next(s for s in default_steps(1.0) if s.name == "prune")
    assert step.backlog_at == 2


@override_settings(PGJOBS_RETENTION_SECONDS={"dead": None})
def test_retention_none_keeps_a_state_forever_and_unnamed_states_keep_their_default() -> None:
    dead = finished("dead", 10**7)
    old_success = finished("succeeded", 2 * 24 * 3600)  # default retention: one day
    assert retention_seconds("dead") is None
    assert retention_seconds("succeeded") == 24 * 3600
    assert prune_finished() == 1
    assert list(Job.objects.values_list("id", flat=True)) == [dead.id]
    assert old_success.id != dead.id


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: prune_jobs("succeeded", -1, 10), "retention must be a finite number from 0 to"),
        (lambda: prune_jobs("succeeded", 10, 0), "prune batch must be a whole number"),
        (lambda: prune_receipts(0), "prune batch must be a whole number"),
    ],
)
def test_bad_prune_limits_are_refused(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.django_db(transaction=True)
@override_settings(PGJOBS_RETENTION_SECONDS=RETENTION)
def test_prune_skips_a_job_an_operator_holds_and_does_not_wait(other_connection) -> None:
    held = finished("dead", 10**5)
    free = finished("dead", 10**5)
    other_connection.set_autocommit(False)
    with other_connection.cursor() as cursor:
        cursor.execute("SELECT id FROM pgjobs_job WHERE id = %s FOR UPDATE", [held.id])
    try:
        assert prune_jobs("dead", 7200, 10) == (1, 0)
    finally:
        other_connection.rollback()
        other_connection.set_autocommit(True)
    assert list(Job.objects.values_list("id", flat=True)) == [held.id]
    assert free.id != held.id


@override_settings(PGJOBS_RETENTION_SECONDS=RETENTION)
def test_the_prune_command_deletes_everything_past_retention_in_batches() -> None:
    for i in range(5):
        AttemptFactory(job=finished("succeeded", 7200 + i))
    finished("dead", 9000)
    keep = finished("dead", 60)
    ReceiptFactory(expires_at=ago(5))
    out = StringIO()
    with CaptureQueriesContext(connection) as queries:
        call_command("pgjobs_prune", "--batch-size", "2", stdout=out)
    assert list(Job.objects.values_list("id", flat=True)) == [keep.id]
    assert Attempt.objects.count() == 0
    assert IdempotencyReceipt.objects.count() == 0
    deletes = [q for q in queries.captured_queries if "WITH doomed AS" in q["sql"]]
    # succeeded 2 + 2 + 1, cancelled 0, dead 1, receipts 1: a short batch ends each state.
    assert len(deletes) == 3 + 1 + 1 + 1
    assert out.getvalue().splitlines() == [
        "succeeded: deleted 5 jobs and 5 attempts (finished over 3600s ago)",
        "cancelled: deleted 0 jobs and 0 attempts (finished over 3600s ago)",
        "dead: deleted 1 jobs and 0 attempts (finished over 7200s ago)",
        "receipts: deleted 1 expired receipts",
    ]


@override_settings(PGJOBS_RETENTION_SECONDS={"dead": None, "cancelled": 60})
def test_the_prune_command_dry_run_counts_and_deletes_nothing() -> None:
    finished("succeeded", 2 * 24 * 3600)
    finished("cancelled", 120)
    finished("cancelled", 30)
    finished("dead", 10**7)
    ReceiptFactory(expires_at=ago(5))
    assert count_prunable_jobs("cancelled") == 1
    assert count_expired_receipts() == 1
    out = StringIO()
    call_command("pgjobs_prune", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == [
        "succeeded: would delete 1 jobs (finished over 86400s ago)",
        "cancelled: would delete 1 jobs (finished over 60s ago)",
        "dead: kept forever (PGJOBS_RETENTION_SECONDS)",
        "receipts: would delete 1 expired receipts",
    ]
    assert Job.objects.count() == 4
    assert IdempotencyReceipt.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "must be at least 1"),
        (["--batch-size", "many"], "is not a whole number"),
        (["--state", "ready"], "invalid choice: 'ready'"),
        (["--max-batches", "-3"], "must be at least 1"),
    ],
)
def test_the_prune_command_refuses_bad_flags(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pgjobs_prune", *args, stdout=StringIO())


@override_settings(PGJOBS_RETENTION_SECONDS=RETENTION)
def test_the_prune_command_can_prune_one_state_and_stop_after_some_batches() -> None:
    for i in range(5):
        finished("succeeded", 7200 + i)
    finished("dead", 10**5)
    out = StringIO()
    call_command("pgjobs_prune", "--state", "succeeded", "--batch-size", "2", "--max-batches",
                 "2", stdout=out)
    assert Job.objects.filter(status="succeeded").count() == 1
    assert Job.objects.filter(status="dead").count() == 1
    assert out.getvalue().splitlines() == [
        "succeeded: deleted 4 jobs and 0 attempts (finished over 3600s ago); stopped after "
        "2 batches, more may remain",
    ]


# --- backlog age ---------------------------------------------------------------------------------


@override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"billing": 60, "*": 3600})
def test_the_backlog_watch_warns_about_queues_over_the_policy_once_then_on_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    billing = JobFactory(queue="billing", run_at=ago(300))
    JobFactory(queue="billing", run_at=ago(10))
    JobFactory(queue="default", run_at=ago(600))  # within "*"
    JobFactory(queue="reports", run_at=ago(7200), priority=-5)  # over "*"
    JobFactory(queue="reports", run_at=ago(5), priority=50)
    JobFactory(queue="idle", scheduled=True, run_at=ago(10**5))  # not ready: no backlog
    watch = BacklogWatch()
    caplog.set_level(logging.INFO, logger="django_pgjobs.maintenance")

    assert watch() == 2
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.pgjobs["queue"] for r in warnings] == ["billing", "reports"]  # type: ignore[attr-defined]
    assert warnings[0].pgjobs["backlog_max_age_seconds"] == 60  # type: ignore[attr-defined]
    assert 299 <= warnings[0].pgjobs["oldest_ready_age_seconds"] < 400  # type: ignore[attr-defined]
    assert 7199 <= warnings[1].pgjobs["oldest_ready_age_seconds"] < 7300  # type: ignore[attr-defined]

    caplog.clear()
    assert watch() == 2
    assert caplog.records == []  # no repeat within the reminder period

    Job.objects.filter(pk=billing.id).delete()
    assert watch() == 1
    assert [r.getMessage() for r in caplog.records] == ["queue.backlog_within_policy queue=billing"]


@override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"billing": 60})
def test_the_backlog_watch_only_looks_at_the_queues_the_worker_serves() -> None:
    JobFactory(queue="billing", run_at=ago(300))
    assert BacklogWatch(["default"])() == 0
    assert BacklogWatch(["billing", "default"])() == 1


# --- cadence -------------------------------------------------------------------------------------


def test_a_step_runs_again_at_once_when_it_stopped_at_its_bound() -> None:
    step = Step("x", 10.0, lambda using: 0, backlog_at=100)
    step.schedule_next(1000.0, changed=100)
    assert step.next_due == 1000.0
    step.schedule_next(1000.0, changed=99)
    assert 1009.0 <= step.next_due <= 1011.0


@pytest.mark.parametrize("interval", [0, -1, math.inf, math.nan])
def test_a_step_needs_a_positive_interval(interval: float) -> None:
    with pytest.raises(ValueError, match="interval must be > 0 seconds"):
        Step("x", interval, lambda using: 0)


def test_default_steps_follow_the_settings() -> None:
    assert [s.name for s in default_steps(0.5)] == [
        "promote", "rescue", "limits", "orphaned slots", "expire pending", "rates", "prune",
        "history", "schedules", "aging"]
    with override_settings(PGJOBS_AGING_STEP=0, PGJOBS_BACKLOG_MAX_AGE_SECONDS={"a": 5}):
        steps = default_steps(0.5, queues=["a"])
        assert [s.name for s in steps] == ["promote", "rescue", "limits", "orphaned slots",
                                           "expire pending", "rates", "prune", "history",
                                           "schedules", "backlog"]
        assert steps[-1].run.queues == {"a"}  # type: ignore[attr-defined]
    with override_settings(PGJOBS_AGING_INTERVAL_SECONDS=8):
        aging = next(s for s in default_steps(0.5) if s.name == "aging")
        assert aging.interval_seconds == 4.0


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("PGJOBS_AGING_CAP", 101,
         "PGJOBS_AGING_CAP must be a whole number from -100 to 100, got 101"),
        ("PGJOBS_AGING_STEP", 2.5,
         "PGJOBS_AGING_STEP must be a whole number from 0 to 200, got 2.5"),
        ("PGJOBS_AGING_BATCH", 0,
         "PGJOBS_AGING_BATCH must be a whole number from 1 to 100000, got 0"),
        ("PGJOBS_BACKLOG_MAX_AGE_SECONDS", {"billing": 0},
         "PGJOBS_BACKLOG_MAX_AGE_SECONDS ['billing'] must be a finite number above 0 and at "
         "most 3.1536e+07, got 0"),
        ("PGJOBS_BACKLOG_MAX_AGE_SECONDS", ["billing"],
         'PGJOBS_BACKLOG_MAX_AGE_SECONDS must be a dict of queue name (or "*" for any other '
         "queue) to seconds > 0"),
        ("PGJOBS_RETENTION_SECONDS", {"dead": -1},
         "PGJOBS_RETENTION_SECONDS ['dead'] must be None (keep forever) or seconds: must be a "
         "finite number above 0 and at most 3.1536e+09, got -1"),
        ("PGJOBS_LISTEN", "no", "PGJOBS_LISTEN must be True or False, got 'no'"),
        ("PGJOBS_BACKLOG_CHECK_INTERVAL_SECONDS", 0,
         "PGJOBS_BACKLOG_CHECK_INTERVAL_SECONDS must be a finite number above 0 and at most "
         "86400, got 0"),
    ],
)
def test_bad_scheduling_settings_fail_the_system_checks(setting, value, message) -> None:
    from django_pgjobs.checks import check_settings

    with override_settings(**{setting: value}):
        errors = [(m.id, m.msg) for m in check_settings()]
    assert errors == [("pgjobs.E010", message)]
