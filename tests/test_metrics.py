"""Prometheus exposition, scraped as text and parsed: gauges from stats, worker counters."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
import urllib.request
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import django_pgjobs
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.exceptions import InvalidSetting
from django_pgjobs.metrics import StatsCollector, WorkerMetrics, exposition
from django_pgjobs.models import KEPT_SUCCESS, Attempt, Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import database_now
from django_pgjobs.worker import Worker
from tests.conftest import ROOT, wait_for
from tests.factories import JobFactory

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str | bytes) -> Samples:
    """Every sample of the exposition, keyed by (name, sorted labels)."""
    if isinstance(text, bytes):
        text = text.decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.mark.django_db
def test_stats_gauges_by_queue_and_status() -> None:
    now = database_now()
    JobFactory.create_batch(3, queue="mail", run_at=now - timedelta(seconds=90))
    JobFactory(queue="mail", running=True, lease_expires_at=now - timedelta(seconds=60))
    JobFactory.create_batch(2, queue="mail", retrying=True)
    JobFactory(queue="mail", dead=True)
    JobFactory(queue="reports", scheduled=True)
    registry = CollectorRegistry()
    registry.register(StatsCollector())

    with override_settings(PGJOBS_BACKLOG_MAX_AGE_SECONDS={"mail": 60}):
        samples = parse(exposition(registry))

    assert value(samples, "pgjobs_jobs", queue="mail", status="ready") == 3
    assert value(samples, "pgjobs_jobs", queue="mail", status="running") == 1
    assert value(samples, "pgjobs_jobs", queue="mail", status="retrying") == 2
    assert value(samples, "pgjobs_jobs", queue="mail", status="scheduled") == 0
    assert value(samples, "pgjobs_jobs", queue="reports", status="scheduled") == 1
    assert value(samples, "pgjobs_jobs_finished_recent", queue="mail", status="dead") == 1
    age = value(samples, "pgjobs_oldest_ready_age_seconds", queue="mail")
    assert age is not None and 85 <= age <= 120
    assert value(samples, "pgjobs_oldest_ready_age_seconds", queue="reports") == 0
    assert value(samples, "pgjobs_backlog_max_age_seconds", queue="mail") == 60
    assert value(samples, "pgjobs_backlog_max_age_seconds", queue="reports") is None
    assert value(samples, "pgjobs_backlog_healthy", queue="mail") == 0
    assert value(samples, "pgjobs_backlog_healthy", queue="reports") == 1
    assert value(samples, "pgjobs_leases_expired") == 1
    assert value(samples, "pgjobs_leases_expiring_soon") == 0


@pytest.mark.django_db
def test_the_gauges_name_the_queues_of_the_largest_backlog_and_sum_the_rest(settings) -> None:
    settings.PGJOBS_METRICS_MAX_QUEUES = 2
    settings.PGJOBS_BACKLOG_MAX_AGE_SECONDS = {"big": 3600, "late": 60}
    now = database_now()
    JobFactory.create_batch(3, queue="big")
    JobFactory.create_batch(2, queue="mid")
    JobFactory(queue="late", run_at=now - timedelta(seconds=90))
    JobFactory(queue="busy", running=True)
    JobFactory(queue="later", scheduled=True)
    JobFactory(queue="later", dead=True)
    registry = CollectorRegistry()
    registry.register(StatsCollector())

    samples = parse(exposition(registry))

    by_queue = {dict(labels)["queue"] for (name, labels) in samples if name == "pgjobs_jobs"}
    assert by_queue == {"big", "mid", "*"}
    assert [value(samples, "pgjobs_jobs", queue="*", status=status)
            for status in ("ready", "scheduled", "running", "retrying")] == [1, 1, 1, 0]
    assert value(samples, "pgjobs_jobs_finished_recent", queue="*", status="dead") == 1
    age = value(samples, "pgjobs_oldest_ready_age_seconds", queue="*")
    assert age is not None and 85 <= age <= 300  # the oldest of the folded queues: late's
    assert value(samples, "pgjobs_backlog_healthy", queue="*") == 0  # late is over its policy
    assert value(samples, "pgjobs_backlog_max_age_seconds", queue="big") == 3600
    assert value(samples, "pgjobs_backlog_max_age_seconds", queue="*") is None


@pytest.mark.django_db
def test_a_scrape_refuses_a_max_queues_its_rule_refuses_with_the_error_enqueue_gives(
    settings,
) -> None:
    settings.PGJOBS_METRICS_MAX_QUEUES = True  # a bool is no count, though int(True) is 1
    JobFactory(queue="mail")
    registry = CollectorRegistry()
    registry.register(StatsCollector())
    with pytest.raises(InvalidSetting) as refused:
        exposition(registry)
    assert refused.value.setting == "PGJOBS_METRICS_MAX_QUEUES"
    assert "pgjobs.E010" in str(refused.value)


@pytest.mark.django_db
def test_two_thousand_queues_export_the_series_of_the_cap_and_one_more_queue() -> None:
    django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {}, queue=f"q{i}") for i in range(2000)])
    registry = CollectorRegistry()
    registry.register(StatsCollector())

    samples = parse(exposition(registry))

    queues = {dict(labels)["queue"] for (name, labels) in samples if name == "pgjobs_jobs"}
    assert len(queues) == 51 and "*" in queues  # PGJOBS_METRICS_MAX_QUEUES = 50, and the rest
    # Per queue: six live statuses, two recent terminal ones, the oldest age and health; no
    # policy is set. Then the workers by state (three), the two horizon gauges and the two
    # lease gauges.
    assert len(samples) == 51 * 10 + 3 + 2 + 2
    assert value(samples, "pgjobs_jobs", queue="*", status="ready") == 1950


@pytest.mark.django_db
def test_metrics_view_serves_the_gauges(client) -> None:
    JobFactory.create_batch(2, queue="mail")
    response = client.get("/metrics/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = parse(response.content)
    assert value(samples, "pgjobs_jobs", queue="mail", status="ready") == 2
    assert client.post("/metrics/").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_worker_counters_match_what_the_database_recorded() -> None:
    django_pgjobs.enqueue_many(
        [JobSpec.of("tests.ok", {"i": i}) for i in range(3)]
        + [JobSpec.of("tests.ok", {}, queue="other"), JobSpec.of("tests.permanent", {}),
           JobSpec.of("tests.unknown_error", {}, max_attempts=1)]
    )
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05)
    metrics = WorkerMetrics()
    metrics.attach(worker)
    assert worker.run() == 0

    samples = parse(exposition(metrics.registry))

    assert value(samples, "pgjobs_claims_total", queue="default") == 5
    assert value(samples, "pgjobs_claims_total", queue="other") == 1
    assert value(samples, "pgjobs_completions_total", task="tests.ok") == 4
    assert value(samples, "pgjobs_dead_total", failure_class="permanent",
                 reason="permanent_error") == 1
    assert value(samples, "pgjobs_dead_total", failure_class="unknown",
                 reason="attempts_exhausted") == 1
    assert value(samples, "pgjobs_handler_duration_seconds_count", task="tests.ok") == 4
    assert value(samples, "pgjobs_pickup_latency_seconds_count", queue="default") == 5
    assert value(samples, "pgjobs_lost_settlements_total", task="tests.ok") is None
    # Each claim ended one attempt: the two failures have rows, the four successes are their jobs.
    assert Attempt.objects.count() == 2
    assert Job.objects.filter(KEPT_SUCCESS).count() == 4


@pytest.mark.django_db(transaction=True)
def test_retries_are_counted_by_failure_class() -> None:
    django_pgjobs.enqueue("tests.transient", {})
    worker = Worker(burst=True, install_signals=False, poll_interval=0.05, max_jobs=1)
    metrics = WorkerMetrics()
    metrics.attach(worker)
    worker.run()
    samples = parse(exposition(metrics.registry))
    assert value(samples, "pgjobs_retries_total", failure_class="transient") == 1
    assert Job.objects.get().status == JobStatus.RETRYING


@pytest.mark.django_db
def test_lost_settlements_are_counted_and_nothing_else() -> None:
    metrics = WorkerMetrics()
    held = SimpleNamespace(id=1, lease_token=uuid.uuid4(), task="tests.ok", attempt=1,
                           lease_owner="w1", trace_id="")
    outcome = Outcome.succeeded(held, "null", duration_ms=1500)
    metrics.on_settle(outcome, False)
    samples = parse(exposition(metrics.registry))
    assert value(samples, "pgjobs_lost_settlements_total", task="tests.ok") == 1
    assert value(samples, "pgjobs_completions_total", task="tests.ok") is None
    # The handler did run: its time still counts, in the 2.5 s bucket and above.
    assert value(samples, "pgjobs_handler_duration_seconds_bucket", task="tests.ok",
                 le="1.0") == 0
    assert value(samples, "pgjobs_handler_duration_seconds_bucket", task="tests.ok",
                 le="2.5") == 1


@pytest.mark.django_db(transaction=True)
def test_lease_expiries_rescued_by_the_worker_are_counted() -> None:
    now = database_now()
    JobFactory.create_batch(2, running=True, lease_expires_at=now - timedelta(seconds=30))
    worker = Worker(install_signals=False)
    metrics = WorkerMetrics()
    metrics.attach(worker)
    rescue = next(step for step in worker.steps if step.name == "rescue")

    assert rescue.run(worker.using) == 2
    assert rescue.run(worker.using) == 0

    samples = parse(exposition(metrics.registry))
    assert value(samples, "pgjobs_lease_expiries_total") == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_worker_process_serves_metrics_on_its_port(start_worker) -> None:
    django_pgjobs.enqueue_many([JobSpec.of("demo.noop", {"i": i}) for i in range(4)])
    django_pgjobs.enqueue("demo.noop", {"later": True}, delay=3600)
    worker = start_worker("--poll-interval", "0.1", "--metrics-port", "0", "--metrics-stats")
    port = wait_for(lambda: re.search(r"metrics\.serving .* port=(\d+)", worker.output()), 30)
    wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4, 30)
    url = f"http://127.0.0.1:{port.group(1)}/metrics"  # type: ignore[union-attr]

    def settled_scrape() -> Samples | None:
        with urllib.request.urlopen(url, timeout=5) as response:
            samples = parse(response.read())
        # Settlement is batched: wait until the settler has reported all four.
        done = value(samples, "pgjobs_completions_total", task="demo.noop") == 4
        return samples if done else None

    samples = wait_for(settled_scrape, 30)
    assert value(samples, "pgjobs_claims_total", queue="default") == 4  # type: ignore[arg-type]
    # --metrics-stats: the database gauges come with the worker's counters.
    assert value(samples, "pgjobs_jobs", queue="default", status="scheduled") == 1  # type: ignore[arg-type]
    assert value(samples, "pgjobs_jobs", queue="default", status="ready") == 0  # type: ignore[arg-type]
    worker.signal(15)
    assert worker.wait(30) == 0


def test_metrics_stats_needs_a_port() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--metrics-stats needs --metrics-port"):
        call_command("pgjobs_worker", "--metrics-stats")


def test_without_prometheus_client_the_import_names_the_metrics_extra(monkeypatch) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "prometheus_client"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    monkeypatch.delitem(sys.modules, "django_pgjobs.metrics")
    with pytest.raises(ImproperlyConfigured) as refused:
        importlib.import_module("django_pgjobs.metrics")
    assert str(refused.value) == (
        "django_pgjobs.metrics: prometheus-client is not installed; the metrics extra brings "
        "it: pip install './django-pgjobs[metrics]' (see the README's Install)")
    # The command it names is the README's, for the extra pyproject.toml defines.
    assert "pip install './django-pgjobs[metrics]'" in (ROOT / "README.md").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert [r.split(">")[0] for r in extras["metrics"]] == ["prometheus-client"]
