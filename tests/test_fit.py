"""pgjobs_fit: measurements read from a real database, verdicts from the decision record."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

import django_pgjobs
from django_pgjobs import fit
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.fit import Measurements, Verdict, judge, measure
from django_pgjobs.status import AttemptOutcome
from django_pgjobs.transitions import database_now
from tests.factories import AttemptFactory, JobFactory

BASE = Measurements(
    enqueue_per_second=5.0, sample_seconds=5.0, claims_per_second=4.0,
    peak_finished_per_minute=300, backlog=100, oldest_ready_age_seconds=1.0,
    unhealthy_queues=[], pickup_p95_seconds=0.2, payload_samples=1000,
    payload_p95_bytes=300.0, payload_max_bytes=900, payload_limit_bytes=65536,
    job_table_bytes=10 * 1024**2, job_index_bytes=2 * 1024**2,
    attempt_total_bytes=8 * 1024**2, database_bytes=200 * 1024**2, live_tuples=9000,
    dead_tuples=1000, last_vacuum=None, last_vacuum_age_seconds=600.0, queue_write_share=0.3,
)


def verdicts(m: Measurements) -> list[Verdict]:
    return [answer.verdict for answer in judge(m)]


OK, WATCH, OUT = Verdict.COMFORTABLE, Verdict.WATCH, Verdict.OUTGROWING


def test_a_modest_workload_is_comfortable_on_every_question() -> None:
    answers = judge(BASE)
    assert [a.question[:2] for a in answers] == ["1.", "2.", "3.", "4."]
    assert [a.verdict for a in answers] == [OK, OK, OK, OK]
    assert answers[2].reasons == [
        "[comfortably within PostgreSQL] payload p95 300 bytes, largest 900 of the 1,000 "
        "newest jobs (limit 65,536)"
    ]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"enqueue_per_second": 2_500.0}, [WATCH, OK, OK, OK]),
    ({"claims_per_second": 12_000.0}, [OUT, OK, OK, OK]),
    ({"peak_finished_per_minute": 200_000}, [WATCH, OK, OK, OK]),
    ({"backlog": 2_000_000}, [WATCH, OK, OK, OK]),
    ({"backlog": 20_000_000}, [OUT, OK, OK, OK]),
    ({"unhealthy_queues": ["mail"], "oldest_ready_age_seconds": 900.0}, [WATCH, OK, OK, OK]),
    ({"pickup_p95_seconds": 45.0}, [WATCH, OK, OK, OK]),
    ({"payload_p95_bytes": 10_000.0}, [OK, OK, WATCH, OK]),
    ({"payload_max_bytes": 60_000}, [OK, OK, WATCH, OK]),
    ({"payload_p95_bytes": 40_000.0, "payload_max_bytes": 50_000}, [OK, OK, OUT, OK]),
    ({"dead_tuples": 3_000, "live_tuples": 7_000}, [OK, OK, OK, WATCH]),
    ({"dead_tuples": 6_000, "live_tuples": 4_000}, [OK, OK, OK, OUT]),
    ({"dead_tuples": 20_000, "live_tuples": 100_000, "last_vacuum_age_seconds": 3 * 86400},
     [OK, OK, OK, WATCH]),
    ({"dead_tuples": 20_000, "live_tuples": 100_000, "last_vacuum_age_seconds": None},
     [OK, OK, OK, WATCH]),
    ({"job_table_bytes": 3 * 1024**3, "database_bytes": 4 * 1024**3}, [OK, OK, OK, WATCH]),
    ({"job_table_bytes": 150 * 1024**2}, [OK, OK, OK, OK]),  # most of a small database: fine
    ({"queue_write_share": 0.95, "claims_per_second": 500.0}, [OK, OK, OK, WATCH]),
    ({"queue_write_share": 0.95}, [OK, OK, OK, OK]),  # a quiet queue in a quiet database
])
def test_each_threshold_moves_its_question(changes: dict, expected: list[Verdict]) -> None:
    assert verdicts(replace(BASE, **changes)) == expected


def test_outgrowing_says_what_to_consider_instead() -> None:
    answers = judge(replace(BASE, claims_per_second=50_000.0, payload_p95_bytes=50_000.0))
    assert "Kafka" in answers[0].consider and "RabbitMQ or SQS" in answers[0].consider
    assert "object storage" in answers[2].consider


@pytest.mark.django_db
def test_measure_reads_backlog_payloads_claims_and_storage_from_the_database() -> None:
    now = database_now()
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"text": "x" * n})
                                for n in (10, 100, 1000, 5000)])
    JobFactory.create_batch(3, scheduled=True, payload={})
    JobFactory(retrying=True, payload={})
    JobFactory(succeeded=True, payload={}, finished_at=now - timedelta(hours=2))
    # 36 claims in the hour: 30 successes, kept on their jobs, and 6 failures, with rows.
    half_an_hour_ago = now - timedelta(minutes=30)
    JobFactory.create_batch(30, succeeded=True, lease_owner="w", claimed_at=half_an_hour_ago,
                            finished_at=half_an_hour_ago)
    for _ in range(6):
        AttemptFactory(job=JobFactory(dead=True), claimed_at=half_an_hour_ago,
                       outcome=AttemptOutcome.DEAD, failure_class="permanent")
    AttemptFactory(claimed_at=now - timedelta(hours=2),
                   job=JobFactory(succeeded=True, finished_at=now - timedelta(hours=2)))

    m = measure(sample_seconds=0)

    assert m.enqueue_per_second is None
    assert m.backlog == 4 + 3 + 1  # the finished jobs are not waiting
    assert m.claims_per_second == 36 / 3600
    # PostgreSQL prints {"text": "x...x"}: n + 12 bytes.
    assert m.payload_max_bytes == 5012
    assert m.payload_samples == 4 + 3 + 1 + 1 + 37
    assert m.payload_limit_bytes == 65536
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_table_size('pgjobs_job'), pg_indexes_size('pgjobs_job'), "
                       "pg_total_relation_size('pgjobs_attempt')")
        assert (m.job_table_bytes, m.job_index_bytes, m.attempt_total_bytes) == cursor.fetchone()
        cursor.execute("SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables "
                       "WHERE relname = 'pgjobs_job'")
        assert (m.live_tuples, m.dead_tuples) == cursor.fetchone()
    assert m.database_bytes > m.job_table_bytes


@pytest.mark.django_db
def test_live_enqueue_rate_counts_jobs_committed_during_the_sample() -> None:
    def enqueue_while_sampling(seconds: float) -> None:
        django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"i": i}) for i in range(30)])

    m = measure(sample_seconds=10, sleep=enqueue_while_sampling)
    assert m.enqueue_per_second == pytest.approx(3.0)


@pytest.mark.django_db
def test_large_payloads_make_the_command_say_outgrowing() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"blob": "x" * 40_000})
                                for _ in range(5)])
    out = StringIO()
    call_command("pgjobs_fit", "--sample-seconds", "0", stdout=out)
    text = out.getvalue()
    assert "enqueue rate (live)     not sampled" in text
    assert "3. Payload size: OUTGROWING POSTGRESQL" in text
    assert "  consider: object storage for the data" in text
    assert "1. Volume and latency: COMFORTABLY WITHIN POSTGRESQL" in text
    assert "2. Must enqueue share a transaction with the data?: COMFORTABLY" in text


@pytest.mark.django_db
def test_fit_json_has_the_measurements_and_four_answers() -> None:
    JobFactory.create_batch(2)
    out = StringIO()
    call_command("pgjobs_fit", "--sample-seconds", "0", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["measurements"]["backlog"] == 2
    assert data["measurements"]["payload_limit_bytes"] == 65536
    answers = data["answers"]
    assert [a["question"][:2] for a in answers] == ["1.", "2.", "3.", "4."]
    # The first three depend on the jobs alone; the fourth also on the test database's churn.
    assert [a["verdict"] for a in answers[:3]] == ["comfortable"] * 3
    assert all(a["consider"] == "" for a in answers[:3])
    assert answers[3]["verdict"] in {"comfortable", "watch", "outgrowing"}
    assert (answers[3]["consider"] == "") == (answers[3]["verdict"] == "comfortable")


def test_fit_refuses_a_bad_sample() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="must be from 0 to 300 seconds"):
        call_command("pgjobs_fit", "--sample-seconds", "-1")
    assert fit.PAYLOAD_OUTGROWING_BYTES > fit.PAYLOAD_WATCH_BYTES
