"""OpenTelemetry: the enqueue span, the attempt spans linked to it, and nothing without the API."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import Error
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode

import django_pgjobs
from django_pgjobs import tracing
from django_pgjobs.checks import check_settings
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Job
from django_pgjobs.testing import WORKER_ID, drain
from django_pgjobs.worker import Worker
from tests.conftest import ROOT, worker_env

pytestmark = pytest.mark.django_db


@dataclass
class Traces:
    exporter: InMemorySpanExporter
    provider: TracerProvider

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        found = self.exporter.get_finished_spans()
        return [s for s in found if name is None or s.name == name]

    def request(self) -> Any:
        """A span standing for the web request that enqueues."""
        return self.provider.get_tracer("tests").start_as_current_span("POST /orders")


@pytest.fixture
def traces() -> Iterator[Traces]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        yield Traces(exporter, provider)
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()


# A caller's context from elsewhere (a propagated header), sampled.
INCOMING = trace.SpanContext(trace_id=0x4BF92F3577B34DA6A3CE929D0E0E4736,
                             span_id=0x00F067AA0BA902B7, is_remote=True,
                             trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))


def global_sdk(monkeypatch: pytest.MonkeyPatch) -> tuple[InMemorySpanExporter, TracerProvider]:
    """An SDK set up globally after django-pgjobs resolved its tracer (shut it down after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(tracing._state, "tracer", provider.get_tracer("django_pgjobs"))
    return exporter, provider


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_enqueue_records_a_producer_span_and_stores_its_traceparent(traces) -> None:
    with traces.request():
        job = django_pgjobs.enqueue("tests.ok", {"n": 1}, queue="billing")
    [request] = traces.spans("POST /orders")
    [send] = traces.spans("send billing")

    assert send.kind == SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "django_pgjobs",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "billing",
        "messaging.django_pgjobs.task": "tests.ok",
        "messaging.message.id": str(job.pk),
    }
    assert job.traceparent == traceparent_of(send)
    assert Job.objects.get(pk=job.pk).traceparent == traceparent_of(send)


def test_an_enqueue_the_database_refuses_is_an_error_span_without_the_rows_data(traces) -> None:
    secret = "4111111111111111"
    with transaction.atomic():
        with connection.cursor() as cursor:
            # A rule of the project's own (a CHECK of its DBA, a trigger) that refuses the row:
            # the server's DETAIL quotes the failing row, payload and all.
            cursor.execute("ALTER TABLE pgjobs_job ADD CONSTRAINT tests_no_refunds "
                           "CHECK (payload->>'kind' IS DISTINCT FROM 'refund') NOT VALID")
        with pytest.raises(IntegrityError) as refused:
            django_pgjobs.enqueue("tests.ok", {"kind": "refund", "pan": secret}, queue="billing")
        assert secret in str(refused.value)  # the caller's own exception keeps it all
        transaction.set_rollback(True)
    [send] = traces.spans("send billing")
    assert send.status.status_code == StatusCode.ERROR
    assert send.attributes["error.type"] == "django.db.utils.IntegrityError"
    [event] = send.events
    assert dict(event.attributes) == {
        "exception.type": "django.db.utils.IntegrityError",
        "exception.message": 'new row for relation "pgjobs_job" violates check constraint '
                             '"tests_no_refunds" (SQLSTATE 23514)',
    }
    assert send.status.description == event.attributes["exception.message"]


def test_every_attempt_is_a_consumer_span_linked_to_the_enqueue(traces) -> None:
    with traces.request():
        job = django_pgjobs.enqueue("tests.ok", {"n": 1})
    [send] = traces.spans("send default")
    traces.exporter.clear()

    drain()

    [process] = traces.spans()
    assert (process.name, process.kind) == ("process default", SpanKind.CONSUMER)
    assert process.parent is None  # a trace of its own, linked to the one that enqueued it
    [link] = process.links
    assert (link.context.trace_id, link.context.span_id) == (send.context.trace_id,
                                                             send.context.span_id)
    assert dict(process.attributes or {}) == {
        "messaging.system": "django_pgjobs",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "default",
        "messaging.message.id": str(job.pk),
        "messaging.client.id": WORKER_ID,
        "messaging.django_pgjobs.task": "tests.ok",
        "messaging.django_pgjobs.attempt": 1,
        "messaging.django_pgjobs.outcome": "succeeded",
        "messaging.django_pgjobs.status": "succeeded",
    }
    assert process.status.status_code == StatusCode.UNSET


def test_a_failed_attempt_is_an_error_span_with_its_class_and_scrubbed_exception(traces) -> None:
    with traces.request():
        django_pgjobs.enqueue("tests.transient", {"password": "hunter22"})
    [send] = traces.spans("send default")
    drain()
    drain(now=timezone.now() + timedelta(hours=1))

    processes = traces.spans("process default")
    assert [(s.attributes or {})["messaging.django_pgjobs.attempt"] for s in processes] == [
        1, 2, 3]
    first, *_, last = processes
    assert all(s.links[0].context.span_id == send.context.span_id for s in processes)
    attributes = dict(first.attributes or {})
    assert (attributes["messaging.django_pgjobs.outcome"],
            attributes["messaging.django_pgjobs.status"],
            attributes["messaging.django_pgjobs.failure_class"],
            attributes["error.type"]) == ("failed", "retrying", "transient", "transient")
    assert first.status.status_code == StatusCode.ERROR
    [event] = first.events
    assert event.name == "exception"
    assert dict(event.attributes or {})["exception.type"] == "django_pgjobs.exceptions.Transient"
    assert "upstream 503" in str(dict(event.attributes or {})["exception.message"])
    assert "Traceback" in str(dict(event.attributes or {})["exception.stacktrace"])
    assert "hunter22" not in str(event.attributes)
    assert dict(last.attributes or {})["messaging.django_pgjobs.status"] == "dead"


def test_the_handlers_own_spans_are_children_of_the_attempts_span(traces) -> None:
    django_pgjobs.enqueue("tests.current_span", {})
    [run] = drain()
    [process] = traces.spans("process default")
    assert run.result == f"{process.context.span_id:016x}"


def test_enqueue_many_gives_every_job_a_create_span_of_its_own(traces) -> None:
    with traces.request():
        jobs = django_pgjobs.enqueue_many([
            JobSpec.of("tests.ok", {"n": 1}), JobSpec.of("tests.ok", {"n": 2}, queue="billing"),
        ])
    [send] = traces.spans("send")  # two queues: no destination in the name
    assert send.kind == SpanKind.PRODUCER
    assert (send.attributes or {})["messaging.batch.message_count"] == 2
    assert "messaging.destination.name" not in (send.attributes or {})
    creates = [*traces.spans("create default"), *traces.spans("create billing")]
    assert [(c.attributes or {})["messaging.message.id"] for c in creates] == [
        str(j.pk) for j in jobs]
    assert all(c.parent is not None and c.parent.span_id == send.context.span_id
               for c in creates)
    assert [Job.objects.get(pk=j.pk).traceparent for j in jobs] == [
        traceparent_of(c) for c in creates]


def test_a_deduplicated_enqueue_keeps_the_first_jobs_traceparent(traces) -> None:
    first = django_pgjobs.enqueue("tests.ok", {}, idempotency_key="k")
    again = django_pgjobs.enqueue("tests.ok", {}, idempotency_key="k")
    first_send, second_send = traces.spans("send default")
    assert again.pk == first.pk and again.traceparent == traceparent_of(first_send)
    assert (second_send.attributes or {})["messaging.django_pgjobs.deduplicated"] is True


def test_a_django_task_is_traced_from_enqueue_to_its_run(traces) -> None:
    from tests.test_backend import add

    with traces.request():
        result = add.enqueue(2, 3)
    [send] = traces.spans("send default")
    assert (send.attributes or {})["messaging.message.id"] == result.id
    drain()
    [process] = traces.spans("process default")
    assert process.links[0].context.span_id == send.context.span_id


@pytest.mark.django_db(transaction=True)
def test_a_worker_restores_the_traceparent_from_the_claim(traces) -> None:
    with traces.request(), transaction.atomic():
        job = django_pgjobs.enqueue("tests.ok", {"n": 1})
    [send] = traces.spans("send default")
    Worker(burst=True, install_signals=False, poll_interval=0.05).run()
    [process] = traces.spans("process default")
    assert process.links[0].context.span_id == send.context.span_id
    assert (process.attributes or {})["messaging.message.id"] == str(job.pk)
    assert (process.attributes or {})["messaging.client.id"] != WORKER_ID  # the worker's own


@pytest.mark.django_db(transaction=True)
def test_an_async_handler_runs_in_its_attempts_span_on_the_workers_loop(traces) -> None:
    with traces.request(), transaction.atomic():
        job = django_pgjobs.enqueue("tests.current_span_async", {})
    [send] = traces.spans("send default")
    Worker(burst=True, install_signals=False, poll_interval=0.05).run()
    [process] = traces.spans("process default")
    assert process.links[0].context.span_id == send.context.span_id
    assert (process.attributes or {})["messaging.django_pgjobs.outcome"] == "succeeded"
    job.refresh_from_db()
    assert job.result == f"{process.context.span_id:016x}"  # current inside the coroutine


def test_with_the_api_alone_nothing_is_recorded_or_stored() -> None:
    # No SDK anywhere: OpenTelemetry's global provider makes spans that record nothing.
    tracing.reset()
    assert tracing.tracer() is not None
    job = django_pgjobs.enqueue("tests.ok", {})
    assert job.traceparent is None
    assert Job.objects.get(pk=job.pk).traceparent is None
    [run] = drain()
    assert run.succeeded


def test_with_the_api_alone_and_no_trace_going_on_an_enqueue_starts_no_span(monkeypatch) -> None:
    tracing.reset()
    found = tracing.tracer()
    started: list[str] = []
    start = found.start_as_current_span

    def counted(name: str, **kwargs: Any) -> Any:
        started.append(name)
        return start(name, **kwargs)

    monkeypatch.setattr(found, "start_as_current_span", counted)
    entered: list[int] = []
    sending = tracing.sending

    def entering(found: Any, jobs: Any) -> Any:
        entered.append(len(jobs))
        return sending(found, jobs)

    monkeypatch.setattr(tracing, "sending", entering)
    jobs = [django_pgjobs.enqueue("tests.ok", {}),
            *django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(2)])]
    assert started == []
    assert entered == []  # not even the span's context manager
    assert [Job.objects.get(pk=job.pk).traceparent for job in jobs] == [None] * 3

    # A trace going on (a propagated header), or an SDK set up since: the span is made again.
    with trace.use_span(trace.NonRecordingSpan(INCOMING)):
        django_pgjobs.enqueue("tests.ok", {})
    assert started == ["send default"]
    assert entered == [1]
    exporter, provider = global_sdk(monkeypatch)
    job = django_pgjobs.enqueue("tests.ok", {})
    assert [s.name for s in exporter.get_finished_spans()] == ["send default"]
    assert Job.objects.get(pk=job.pk).traceparent is not None
    provider.shutdown()


def test_a_sampled_out_enqueue_many_records_no_span_and_its_jobs_share_its_context() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.set_tracer_provider(provider)
    try:
        jobs = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(3)])
    finally:
        tracing.set_tracer_provider(None)
        provider.shutdown()
    assert exporter.get_finished_spans() == ()
    # The send span's context, still propagated (the trace goes on unsampled), one for all.
    stored = {Job.objects.get(pk=job.pk).traceparent for job in jobs}
    [traceparent] = stored
    assert traceparent is not None and int(traceparent[-2:], 16) & 1 == 0  # not sampled


def test_with_the_api_alone_every_job_carries_the_incoming_sampled_context() -> None:
    # No SDK, but a caller's context from elsewhere (a propagated header): a span of the API
    # alone carries its parent's context, so each job, alone or among many, stores that one.
    tracing.reset()
    with trace.use_span(trace.NonRecordingSpan(INCOMING)):
        alone = django_pgjobs.enqueue("tests.ok", {})
        many = django_pgjobs.enqueue_many([JobSpec.of("tests.ok", {"n": n}) for n in range(3)])
    expected = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert [Job.objects.get(pk=job.pk).traceparent for job in [alone, *many]] == [expected] * 4


def test_with_the_api_alone_an_attempt_makes_no_span(monkeypatch) -> None:
    tracing.reset()
    job = django_pgjobs.enqueue("tests.ok", {})
    made: list[int] = []
    processing = tracing._processing

    def counted(found: Any, claimed: Any, worker_id: str) -> Any:
        made.append(claimed.id)
        return processing(found, claimed, worker_id)

    monkeypatch.setattr(tracing, "_processing", counted)
    [run] = drain()
    assert run.succeeded and made == []

    # An SDK set up globally once the worker runs: the next attempt is recorded.
    exporter, provider = global_sdk(monkeypatch)
    second = django_pgjobs.enqueue("tests.ok", {})
    [run] = drain()
    assert run.succeeded and made == [second.pk] and job.pk != second.pk
    assert [s.name for s in exporter.get_finished_spans()] == ["send default", "process default"]
    provider.shutdown()


def test_tracing_off_records_nothing_and_stores_nothing(traces) -> None:
    with override_settings(PGJOBS_TRACING=False):
        assert tracing.tracer() is None
        with traces.request():
            job = django_pgjobs.enqueue("tests.ok", {})
        drain()
    assert [s.name for s in traces.spans()] == ["POST /orders"]
    assert Job.objects.get(pk=job.pk).traceparent is None
    # Turned back on when the setting goes.
    assert tracing.tracer() is not None


OTEL_MISSING = ("opentelemetry-api is not installed; the otel extra brings it: "
                "pip install './django-pgjobs[otel]' (see the README's Install)")


def test_without_the_package_tracing_is_off_and_jobs_still_run(monkeypatch, caplog) -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "opentelemetry"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed
    tracing.reset()
    try:
        assert tracing.tracer() is None
        job = django_pgjobs.enqueue("tests.ok", {})
        assert Job.objects.get(pk=job.pk).traceparent is None
        assert drain()[0].succeeded
        with override_settings(PGJOBS_TRACING=True):
            assert tracing.tracer() is None
        assert (f"PGJOBS_TRACING is True but {OTEL_MISSING}. No spans are recorded"
                in caplog.text)
        with override_settings(PGJOBS_TRACING=True):
            [error] = check_settings()
        assert isinstance(error, Error)
        assert error.msg == f"PGJOBS_TRACING is True but {OTEL_MISSING}"
        # The command it names is the README's, for the extra pyproject.toml defines.
        assert "pip install './django-pgjobs[otel]'" in (ROOT / "README.md").read_text()
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"]
        assert [r.split(">")[0] for r in extras["otel"]] == ["opentelemetry-api"]
    finally:
        monkeypatch.undo()
        tracing.reset()


def test_a_tracing_setting_that_is_not_a_choice_is_reported(settings) -> None:
    settings.PGJOBS_TRACING = "yes"
    [error] = check_settings()
    assert error.msg == ("PGJOBS_TRACING must be None (trace when opentelemetry-api is "
                         "installed), True or False, got 'yes'")


SCRIPT = """
import sys
if sys.argv[1] == "not-installed":
    sys.modules["opentelemetry"] = None
import django
django.setup()
from django.conf import settings
if sys.argv[1] == "off":
    settings.PGJOBS_TRACING = False
from django.db import IntegrityError, connection, transaction
import django_pgjobs
from django_pgjobs.testing import drain

class Rollback(Exception):
    pass

try:
    with transaction.atomic():
        job = django_pgjobs.enqueue("demo.noop", {"n": 1})
        [run] = drain()
        assert run.succeeded and job.traceparent is None, run
        raise Rollback
except Rollback:
    pass
print(sorted(name for name, module in sys.modules.items()
             if name.split(".")[0] == "opentelemetry" and module is not None))
"""


@pytest.mark.parametrize("how", ["off", "not-installed"])
def test_enqueue_and_run_import_no_opentelemetry_module_when_tracing_is_off(how) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], env=worker_env(), cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
