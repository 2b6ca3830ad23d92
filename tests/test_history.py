"""The queues' history: one sample per queue per interval, written once however many workers
run the step, pruned after its retention, and read back in buckets for the charts."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

from django_pgjobs import history
from django_pgjobs.maintenance import default_steps
from django_pgjobs.models import Job, QueueSample
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db


def interval_start() -> object:
    """The start of the current sampling interval by the database's clock (the test's
    transaction time, which is what the step's now() sees too)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT date_bin(interval '60 seconds', now(), "
                       "timestamptz '2000-01-01')")
        return cursor.fetchone()[0]


def test_a_sample_counts_each_queue_now_and_what_finished_in_the_interval_before() -> None:
    at = interval_start()
    JobFactory.create_batch(3, queue="mail", run_at=at - timedelta(minutes=5))
    JobFactory(queue="mail", running=True)
    JobFactory(queue="mail", retrying=True)
    JobFactory.create_batch(2, queue="mail", succeeded=True, finished_at=at - timedelta(seconds=30))
    JobFactory(queue="mail", succeeded=True, finished_at=at - timedelta(seconds=90))  # earlier
    JobFactory(queue="mail", succeeded=True, finished_at=at + timedelta(seconds=1))  # later
    dead = JobFactory(queue="reports", dead=True, finished_at=at - timedelta(seconds=10))
    AttemptFactory(job=dead, number=1, outcome="dead", failure_class="permanent",
                   finished_at=at - timedelta(seconds=10))
    retried = JobFactory(queue="reports", retrying=True)
    AttemptFactory(job=retried, number=1, outcome="failed", failure_class="transient",
                   finished_at=at - timedelta(seconds=20))

    assert history.sample_queues() == 2
    rows = {s.queue: s for s in QueueSample.objects.all()}
    mail, reports = rows["mail"], rows["reports"]
    assert {s.sampled_at for s in rows.values()} == {at}
    assert (mail.ready, mail.waiting, mail.running, mail.succeeded, mail.failed, mail.dead) == (
        3, 1, 1, 2, 0, 0)
    assert mail.oldest_ready_seconds is not None and 300 <= mail.oldest_ready_seconds < 400
    assert (reports.ready, reports.waiting, reports.succeeded, reports.failed, reports.dead,
            reports.oldest_ready_seconds) == (0, 1, 0, 2, 1, None)


def test_the_interval_is_sampled_once_however_many_workers_run_the_step() -> None:
    JobFactory(queue="mail")
    assert history.sample_queues() == 1
    JobFactory(queue="mail")
    assert history.sample_queues() == 0  # another worker's run in the same interval
    assert QueueSample.objects.get().ready == 1


def test_idle_queues_write_no_row() -> None:
    assert history.sample_queues() == 0
    assert not QueueSample.objects.exists()


def test_samples_past_the_retention_are_deleted_by_the_next_sample() -> None:
    at = interval_start()
    QueueSample.objects.create(sampled_at=at - timedelta(days=9), queue="mail", ready=1)
    kept = QueueSample.objects.create(sampled_at=at - timedelta(days=7), queue="mail", ready=1)
    history.sample_queues()
    assert list(QueueSample.objects.values_list("pk", flat=True)) == [kept.pk]
    with override_settings(PGJOBS_HISTORY_RETENTION_SECONDS=6 * 24 * 3600):
        history.sample_queues()
    assert not QueueSample.objects.exists()


def test_the_history_outlives_the_jobs_it_counted() -> None:
    at = interval_start()
    JobFactory(queue="mail", succeeded=True, finished_at=at - timedelta(seconds=5))
    history.sample_queues()
    Job.objects.all().delete()
    assert QueueSample.objects.get().succeeded == 1


def test_points_bucket_each_queue_taking_the_peak_of_levels_and_the_sum_of_counts() -> None:
    at = interval_start()
    for minutes, ready, succeeded in ((1, 5, 10), (2, 50, 1), (20, 7, 3)):
        QueueSample.objects.create(sampled_at=at - timedelta(minutes=minutes), queue="mail",
                                   ready=ready, succeeded=succeeded, failed=1)
    QueueSample.objects.create(sampled_at=at - timedelta(hours=2), queue="mail", ready=999)
    by_queue = history.points("24h")
    [mail] = by_queue.values()
    assert sum(p.succeeded for p in mail) == 14 and max(p.ready for p in mail) == 999
    hour = history.points("1h")["mail"]
    assert [p.ready for p in hour] == [7, 50, 5]  # oldest first, one per minute
    assert [p.failed for p in hour] == [1, 1, 1]
    assert all(p.at.tzinfo is not None for p in hour)


def test_every_worker_runs_the_history_step_twice_per_interval() -> None:
    with override_settings(PGJOBS_HISTORY_INTERVAL_SECONDS=120):
        [step] = [s for s in default_steps(1.0) if s.name == "history"]
    assert step.interval_seconds == 60


def test_a_chart_breaks_its_line_where_no_worker_sampled_and_dots_a_lone_point() -> None:
    from datetime import UTC, datetime

    from django_pgjobs.admin.charts import Series, log_chart

    times = [datetime(2026, 1, 1, 0, m, tzinfo=UTC) for m in range(6)]
    svg = str(log_chart("c", times, [Series("ready", "ready", [1, 2, None, 5, None, None])],
                        title="t"))
    [path] = re.findall(r'<path d="([^"]+)"', svg)
    assert path.count("M") == 1 and path.count("L") == 1  # 1 to 2, then the gap
    assert svg.count("<circle") == 1  # 5 alone between gaps
    # On a log scale 0, 1, 10 and 100 sit evenly apart.
    from django_pgjobs.admin.charts import log_position
    assert [round(log_position(v, 1000), 2) for v in (0, 9, 99, 999)] == [0, 0.33, 0.67, 1]
