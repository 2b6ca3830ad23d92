from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_pgjobs import fit, stats, transitions
from django_pgjobs.models import Attempt
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import AttemptOutcome, JobStatus
from django_pgjobs.transitions import database_now
from tests.conftest import plan_nodes
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db


def by_queue(rows: list[stats.QueueStats]) -> dict[str, stats.QueueStats]:
    return {row.queue: row for row in rows}


def test_queue_counts_cover_every_state_and_only_recent_terminal_jobs() -> None:
    now = database_now()
    JobFactory.create_batch(3, queue="mail")
    JobFactory.create_batch(2, queue="mail", scheduled=True)
    JobFactory(queue="mail", running=True)
    JobFactory.create_batch(4, queue="mail", retrying=True)
    JobFactory.create_batch(2, queue="mail", dead=True, finished_at=now - timedelta(hours=1))
    JobFactory(queue="mail", dead=True, finished_at=now - timedelta(days=2))  # too old
    JobFactory(queue="mail", cancelled=True, finished_at=now - timedelta(minutes=5))
    JobFactory.create_batch(5, queue="mail", succeeded=True)  # never counted
    JobFactory(queue="reports")

    rows = by_queue(stats.queue_stats())

    assert set(rows) == {"mail", "reports"}
    mail = rows["mail"]
    assert (mail.ready, mail.scheduled, mail.running, mail.retrying) == (3, 2, 1, 4)
    assert (mail.dead_recent, mail.cancelled_recent) == (2, 1)
    assert mail.count(JobStatus.DEAD) == 2 and mail.count(JobStatus.READY) == 3
    reports = rows["reports"]
    assert (reports.ready, reports.scheduled, reports.running, reports.dead_recent) == (1, 0, 0, 0)


def test_oldest_ready_age_is_the_oldest_across_every_priority() -> None:
    now = database_now()
    # The oldest job sits behind higher-priority ones: the skip scan must still find it.
    JobFactory(queue="q", priority=50, run_at=now - timedelta(seconds=10))
    JobFactory(queue="q", priority=50, run_at=now - timedelta(seconds=20))
    JobFactory(queue="q", priority=-5, run_at=now - timedelta(seconds=300))
    JobFactory(queue="q", priority=0, run_at=now - timedelta(seconds=100))
    JobFactory(queue="r", priority=0, run_at=now - timedelta(seconds=40))
    JobFactory(queue="r", scheduled=True)  # not ready: no age

    rows = by_queue(stats.queue_stats())

    assert rows["q"].oldest_ready_age_seconds == pytest.approx(300, abs=5)
    assert rows["r"].oldest_ready_age_seconds == pytest.approx(40, abs=5)


def test_a_queue_with_nothing_ready_has_no_age_and_is_healthy() -> None:
    JobFactory(queue="idle", retrying=True)
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"idle": 1}):
        idle = by_queue(stats.queue_stats())["idle"]
    assert idle.oldest_ready_age_seconds is None
    assert idle.healthy is True


def test_backlog_policy_marks_queues_older_than_allowed_unhealthy() -> None:
    now = database_now()
    JobFactory(queue="fast", run_at=now - timedelta(seconds=120))
    JobFactory(queue="slow", run_at=now - timedelta(seconds=120))
    JobFactory(queue="other", run_at=now - timedelta(seconds=120))
    policy = {"fast": 60, "slow": 3600, "*": 30}
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS=policy):
        rows = by_queue(stats.queue_stats())
        snap = stats.snapshot()

    assert rows["fast"].backlog_max_age_seconds == 60 and rows["fast"].healthy is False
    assert rows["slow"].backlog_max_age_seconds == 3600 and rows["slow"].healthy is True
    assert rows["other"].backlog_max_age_seconds == 30 and rows["other"].healthy is False
    assert snap.healthy is False


def test_declared_and_policy_queues_appear_with_zeros() -> None:
    with override_settings(PGJOBS_QUEUES=["default", "mail"],
                           PGJOBS_BACKLOG_MAX_AGE_SECONDS={"audit": 10}):
        rows = by_queue(stats.queue_stats())
    assert set(rows) == {"audit", "default", "mail"}
    assert rows["audit"] == stats.QueueStats(queue="audit", backlog_max_age_seconds=10.0)
    assert rows["mail"].ready == 0 and rows["mail"].backlog_max_age_seconds is None


def test_attempt_distribution_counts_recent_claims_by_attempt_number() -> None:
    now = database_now()
    for number, n in ((1, 5), (2, 2), (3, 1)):
        for _ in range(n):
            AttemptFactory(number=number, claimed_at=now - timedelta(minutes=10 * number))
    AttemptFactory(number=4, claimed_at=now - timedelta(hours=3))  # outside the hour

    assert stats.attempt_distribution() == [
        stats.AttemptBucket(1, 5), stats.AttemptBucket(2, 2), stats.AttemptBucket(3, 1),
    ]
    assert stats.attempt_distribution(sample=3) == [stats.AttemptBucket(1, 3)]


def test_handler_latency_percentiles_per_task() -> None:
    now = database_now()
    for ms in range(1, 101):
        job = JobFactory(task="tests.ok", succeeded=True)
        AttemptFactory(job=job, claimed_at=now - timedelta(minutes=1), duration_ms=ms,
                       outcome=AttemptOutcome.SUCCEEDED)
    slow = JobFactory(task="tests.permanent", dead=True)
    AttemptFactory(job=slow, claimed_at=now - timedelta(minutes=1), duration_ms=4000,
                   outcome=AttemptOutcome.DEAD)
    AttemptFactory(claimed_at=now - timedelta(minutes=1))  # still running: no duration
    old = JobFactory(task="tests.ok", succeeded=True)
    AttemptFactory(job=old, claimed_at=now - timedelta(hours=2), duration_ms=99999)

    latency = {row.key: row for row in stats.handler_latency()}

    assert set(latency) == {"tests.ok", "tests.permanent"}
    ok = latency["tests.ok"]
    assert (ok.samples, ok.p50, ok.p95, ok.max) == (100, 50.5, pytest.approx(95.05), 100)
    assert latency["tests.permanent"] == stats.Latency("tests.permanent", 1, 4000, 4000, 4000)


def test_pickup_latency_measures_due_to_first_claim_and_skips_moved_run_at() -> None:
    now = database_now()
    for wait in (1, 2, 3, 4, 100):
        job = JobFactory(queue="mail", succeeded=True, run_at=now - timedelta(minutes=5))
        AttemptFactory(job=job, number=1,
                       claimed_at=now - timedelta(minutes=5) + timedelta(seconds=wait))
    # A retried job's run_at is its retry time: its first claim says nothing about pickup.
    retried = JobFactory(queue="mail", retrying=True, attempts=2, run_at=now)
    AttemptFactory(job=retried, number=1, claimed_at=now - timedelta(minutes=30))

    pickup = stats.pickup_latency()

    assert len(pickup) == 1
    mail = pickup[0]
    assert (mail.key, mail.samples) == ("mail", 5)
    assert mail.p50 == pytest.approx(3)
    assert mail.max == pytest.approx(100)


def test_a_success_with_no_attempt_row_counts_in_every_attempt_figure() -> None:
    """An attempt that succeeds has no row: its job stands for it in the attempt figures."""
    JobFactory.create_batch(2, queue="mail", task="tests.ok")
    claimed = transitions.claim_jobs("w1", "mail", 2)
    transitions.settle([Outcome.succeeded(c, "null", duration_ms=ms)
                        for c, ms in zip(claimed, (10, 30), strict=True)])
    assert not Attempt.objects.exists()

    assert stats.attempt_distribution() == [stats.AttemptBucket(1, 2)]
    assert stats.handler_latency() == [stats.Latency("tests.ok", 2, 20, 29, 30)]
    [mail] = stats.pickup_latency()
    assert (mail.key, mail.samples) == ("mail", 2)
    assert fit.measure(sample_seconds=0).claims_per_second * fit.CLAIM_WINDOW_SECONDS == (
        pytest.approx(2))


def test_the_attempt_sample_is_the_newest_claims_whatever_their_outcome() -> None:
    # Older failures (rows) and newer successes (kept on their jobs): with room for three, the
    # sample is the three newest claims, all successes, not three of each kind.
    now = database_now()
    for minutes in (50, 40, 30):
        AttemptFactory(number=2, claimed_at=now - timedelta(minutes=minutes), duration_ms=900,
                       outcome=AttemptOutcome.FAILED, failure_class="transient")
    for minutes in (3, 2, 1):
        at = now - timedelta(minutes=minutes)
        JobFactory(task="tests.ok", succeeded=True, attempts=1, lease_owner="w", claimed_at=at,
                   run_at=at - timedelta(seconds=1),
                   finished_at=at + timedelta(seconds=1), duration_ms=5)

    assert stats.attempt_distribution(sample=3) == [stats.AttemptBucket(1, 3)]
    assert stats.handler_latency(sample=3) == [stats.Latency("tests.ok", 3, 5, 5, 5)]
    assert [p.samples for p in stats.pickup_latency(sample=3)] == [3]


def test_lease_health_counts_expired_and_expiring_leases() -> None:
    now = database_now()
    JobFactory.create_batch(2, running=True, lease_expires_at=now - timedelta(seconds=60))
    JobFactory(running=True, lease_expires_at=now + timedelta(seconds=5))
    JobFactory(running=True, lease_expires_at=now + timedelta(seconds=600))

    assert stats.lease_health() == stats.LeaseHealth(expired=2, expiring_soon=1, soon_seconds=10)
    assert stats.lease_health(soon_seconds=3600).expiring_soon == 2


def test_failure_classes_over_the_last_day_by_class_and_task() -> None:
    now = database_now()
    transient = JobFactory(task="tests.transient", retrying=True)
    for _ in range(3):
        AttemptFactory(job=transient, failure_class="transient", outcome=AttemptOutcome.FAILED,
                       claimed_at=now - timedelta(hours=2))
    poison = JobFactory(task="tests.permanent", dead=True)
    AttemptFactory(job=poison, failure_class="permanent", outcome=AttemptOutcome.DEAD,
                   claimed_at=now - timedelta(hours=1))
    AttemptFactory(job=poison, failure_class="permanent", claimed_at=now - timedelta(days=2))
    AttemptFactory(job=poison, outcome=AttemptOutcome.SUCCEEDED)  # not a failure

    failures = stats.failure_classes()

    assert failures == [
        stats.FailureCount("transient", "tests.transient", 3),
        stats.FailureCount("permanent", "tests.permanent", 1),
    ]


def test_throughput_is_one_point_per_minute_with_zeros() -> None:
    now = database_now()
    minute = now.replace(second=0, microsecond=0)
    JobFactory.create_batch(3, succeeded=True, finished_at=minute + timedelta(seconds=1))
    JobFactory(dead=True, finished_at=minute - timedelta(minutes=2) + timedelta(seconds=30))
    JobFactory(succeeded=True, finished_at=minute - timedelta(hours=2))  # outside the hour
    JobFactory(cancelled=True, finished_at=minute)  # not throughput

    points = stats.throughput(minutes=5)

    assert [p.minute for p in points] == [minute - timedelta(minutes=4 - i) for i in range(5)]
    assert [(p.succeeded, p.dead) for p in points] == [(0, 0), (0, 0), (0, 1), (0, 0), (3, 0)]
    assert len(stats.throughput()) == 60
    with pytest.raises(ValueError, match="at least 1"):
        stats.throughput(minutes=0)


def test_snapshot_is_json_ready() -> None:
    JobFactory(queue="mail")
    AttemptFactory(job=JobFactory(running=True, attempts=2), outcome=AttemptOutcome.FAILED,
                   failure_class="transient", duration_ms=12)
    data = stats.snapshot().as_dict()
    text = json.dumps(data)
    assert json.loads(text)["queues"][0]["queue"] == "default"
    assert [q["queue"] for q in data["queues"]] == ["default", "mail"]
    assert data["queues"][1]["ready"] == 1 and data["queues"][1]["healthy"] is True
    assert data["failures"] == [{"failure_class": "transient", "task": "demo.noop", "count": 1}]
    assert data["healthy"] is True
    assert len(data["throughput"]) == 60


# --- plans on realistic history ------------------------------------------------------------

HISTORY_SQL = """
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
    run_at, attempts, max_attempts, snoozes, lease_seconds, trace_id, last_error, failure_class,
    terminal_reason, created_at, started_at, finished_at, claimed_at, lease_owner, duration_ms)
SELECT 'task' || (g %% 7), 1, (ARRAY['default', 'mail', 'reports'])[1 + g %% 3], '{}',
    CASE WHEN g %% 50 = 0 THEN 'dead' ELSE 'succeeded' END, 0, 0, t, 1, 5, 0, 30, '', '',
    CASE WHEN g %% 50 = 0 THEN 'permanent' ELSE '' END,
    CASE WHEN g %% 50 = 0 THEN 'permanent_error' ELSE 'succeeded' END, t, t, t + interval '1 s',
    t, CASE WHEN g %% 50 <> 0 THEN 'w' END, CASE WHEN g %% 50 <> 0 THEN 5 END
FROM (SELECT g, now() - g * interval '3 s' FROM generate_series(1, %s) AS g) AS s(g, t);
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
    run_at, attempts, max_attempts, snoozes, lease_seconds, trace_id, last_error, failure_class,
    terminal_reason)
SELECT 'task1', 1, 'default', '{}', 'ready', g %% 3, 0, now(), 0, 5, 0, 30, '', '', '', ''
FROM generate_series(1, 200) AS g;
INSERT INTO pgjobs_attempt (job_id, number, worker_id, lease_token, claimed_at, finished_at,
    outcome, reported_outcome, failure_class, error, traceback, duration_ms)
SELECT id, 1, 'w', gen_random_uuid(), started_at, finished_at, status, '', failure_class, '', '',
    5
FROM pgjobs_job WHERE finished_at IS NOT NULL AND status <> 'succeeded';
ANALYZE pgjobs_job;
ANALYZE pgjobs_attempt;
-- Empty here, but its pages may hold the dead rows of an earlier test's slots (a bulk test of
-- thousands of keys): analysed, it is planned as the empty table it is, as autovacuum would.
ANALYZE pgjobs_key_slot;
"""

STATS_QUERIES: dict[str, list[Any] | dict[str, Any]] = {
    "stats_queue_counts": [86400],
    "stats_oldest_ready": [],
    "stats_attempt_numbers": {"window": 3600, "cap": 10000},
    "stats_handler_latency": {"window": 3600, "cap": 10000},
    "stats_pickup_latency": {"window": 3600, "cap": 10000},
    "stats_leases": [10.0],
    "stats_failures": [86400],
    "stats_throughput": [60, 60],
    "stats_limit_keys": {"limit": 20},
    "stats_error_groups": {"window": 86400, "limit": 20},
    # The limits' and rates' maintenance, which every worker runs on its cadence.
    "orphaned_slots": {"after": 0, "until": 5000, "batch": 1000},
    "admit_waiting_keys": {"batch": 1000},
    "start_rate_heads": {"batch": 1000},
}


@pytest.mark.slow
def test_every_stats_query_reads_indexes_not_history() -> None:
    with connection.cursor() as cursor:
        cursor.execute(HISTORY_SQL, [200_000])
        plans = {}
        for name, params in STATS_QUERIES.items():
            cursor.execute("EXPLAIN (FORMAT JSON) " + stats.statement(name), params)
            raw = cursor.fetchone()[0]
            plans[name] = plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])

    for name, nodes in plans.items():
        scanned = [(n["Node Type"], n.get("Index Name")) for n in nodes
                   if n.get("Relation Name") in ("pgjobs_job", "pgjobs_attempt")]
        assert scanned, name
        assert all(kind != "Seq Scan" for kind, _ in scanned), (name, scanned)
    indexes = {name: {n.get("Index Name") for n in nodes} for name, nodes in plans.items()}
    assert "pgjobs_job_claim_idx" in indexes["stats_oldest_ready"]
    assert "pgjobs_job_finished_idx" in indexes["stats_throughput"]
    assert "pgjobs_job_lease_idx" in indexes["stats_leases"]
    # Successes, which have no attempt row, come from the finished index.
    assert {"pgjobs_attempt_claimed_idx",
            "pgjobs_job_finished_idx"} <= indexes["stats_handler_latency"]
    for running_too in ("stats_attempt_numbers", "stats_pickup_latency"):
        assert {"pgjobs_attempt_claimed_idx", "pgjobs_job_lease_idx",
                "pgjobs_job_finished_idx"} <= indexes[running_too]
    assert "pgjobs_attempt_failed_idx" in indexes["stats_failures"]
    assert "pgjobs_attempt_failed_idx" in indexes["stats_error_groups"]
    assert {"pgjobs_job_claim_idx", "pgjobs_job_lease_idx", "pgjobs_job_due_idx",
            "pgjobs_job_finished_idx"} <= indexes["stats_queue_counts"]
    assert {"pgjobs_job_throttled_idx", "pgjobs_job_lease_idx"} <= indexes["stats_limit_keys"]
    assert "pgjobs_job_rate_next_idx" in indexes["start_rate_heads"]


# --- manage.py pgjobs_stats ----------------------------------------------------------------


def run_stats(*args: str) -> str:
    out = StringIO()
    call_command("pgjobs_stats", *args, stdout=out)
    return out.getvalue()


def test_stats_command_prints_the_tables() -> None:
    now = database_now()
    JobFactory.create_batch(2, queue="mail", run_at=now - timedelta(seconds=120))
    JobFactory(queue="mail", retrying=True)
    failed = JobFactory(task="tests.transient", queue="mail", retrying=True)
    AttemptFactory(job=failed, failure_class="transient", duration_ms=40)
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60}):
        text = run_stats()

    row = next(line for line in text.splitlines() if line.startswith("mail "))
    assert row.split()[:8] == ["mail", "2", "0", "0", "0", "2", "0", "0"]
    assert row.split()[-3:] == ["60.0", "UNHEALTHY", "running"]
    failure = next(line for line in text.splitlines() if line.startswith("transient "))
    assert failure.split() == ["transient", "tests.transient", "1"]
    assert "Leases: 0 expired (rescue pending), 0 expiring within 10s" in text
    assert "#1: 1" in text


def test_stats_command_json_matches_the_snapshot() -> None:
    JobFactory.create_batch(3, queue="mail")
    data = json.loads(run_stats("--json"))
    assert data["queues"] == [{
        "queue": "mail", "ready": 3, "throttled": 0, "scheduled": 0, "running": 0, "retrying": 0,
        "pending": 0, "dead_recent": 0, "cancelled_recent": 0,
        "oldest_ready_age_seconds": data["queues"][0]["oldest_ready_age_seconds"],
        "backlog_max_age_seconds": None, "paused": False, "healthy": True,
    }]
    assert data["leases"] == {"expired": 0, "expiring_soon": 0, "soon_seconds": 10.0}
    assert len(data["throughput"]) == 60


def test_stats_command_fails_when_a_backlog_is_unhealthy() -> None:
    JobFactory(queue="mail", run_at=database_now() - timedelta(seconds=300))
    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60}):
        with pytest.raises(CommandError, match="backlog older than its policy in: mail"):
            run_stats("--fail-unhealthy")
        run_stats()  # without the flag it only reports
    with pytest.raises(CommandError, match="unknown database alias"):
        run_stats("--database", "nope")


# --- schedules ----------------------------------------------------------------------------------


@override_settings(PGJOBS_SCHEDULE_GRACE_SECONDS=60)
def test_schedules_whose_last_due_tick_was_not_enqueued_in_time_are_late() -> None:
    from django_pgjobs.schedules import enqueue_due_ticks
    from tests.factories import ScheduleFactory

    now = timezone.now()
    pending = ScheduleFactory(name="late.pending", next_tick_at=now - timedelta(minutes=5))
    ScheduleFactory(name="on.time", next_tick_at=now - timedelta(seconds=10))
    ScheduleFactory(name="paused.late", next_tick_at=now - timedelta(hours=1), paused_at=now)
    ScheduleFactory(name="retired.late", next_tick_at=now - timedelta(hours=1), retired_at=now)
    # Handled, but ten minutes after its tick: late until a tick is on time again.
    handled = ScheduleFactory(name="late.handled", cron="0 * * * *",
                              next_tick_at=now + timedelta(minutes=30),
                              last_tick_at=now - timedelta(minutes=20),
                              last_handled_at=now - timedelta(minutes=10))
    health = stats.snapshot().schedules
    assert (health.active, health.paused, health.retired) == (3, 1, 1)
    assert [(s.name, s.pending) for s in health.late] == [
        ("late.handled", False), ("late.pending", True)]
    assert health.late[1].due_at == pending.next_tick_at
    assert 299 < health.late[1].late_seconds < 400
    assert 599 < health.late[0].late_seconds < 601
    assert not health.on_time
    data = stats.snapshot().as_dict()["schedules"]
    assert data["on_time"] is False and data["late"][1]["name"] == "late.pending"
    out = StringIO()
    with pytest.raises(CommandError, match=r"late schedules: late\.handled, late\.pending"):
        call_command("pgjobs_stats", "--fail-unhealthy", stdout=out)
    assert "Schedules: 3 active, 1 paused, 1 retired; 2 late" in out.getvalue()
    # A worker comes back: the pending one's missed ticks go by its policy and it runs its
    # on-time ticks again, so only the schedule handled late and not due since stays late.
    enqueue_due_ticks()
    assert [s.name for s in stats.schedule_health().late] == [handled.name]
