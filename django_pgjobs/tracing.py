"""OpenTelemetry spans: one for each enqueue, one for each attempt, linked through the job.

Optional. With ``opentelemetry-api`` installed (the ``otel`` extra brings it) and
``PGJOBS_TRACING`` not False, an enqueue records a PRODUCER span and stores its W3C
``traceparent`` with the job; a worker records a CONSUMER span for every attempt, linked to that
enqueue. Without the package, or with ``PGJOBS_TRACING = False``, OpenTelemetry is never
imported and the callers pay one attribute check: ``tracer()`` answers None.

The names are the messaging semantic conventions' (https://opentelemetry.io/docs/specs/semconv/
messaging/), written out here: the Python package keeps them in a private module. What the
conventions do not name is under ``messaging.django_pgjobs.*``, their place for a system's own.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import wraps
from typing import Any, Protocol, TypeVar

from django.core.signals import setting_changed

from .claimed import ClaimedJob
from .conf import settings
from .exceptions import PgJobsError
from .outcomes import Outcome
from .redaction import database_error_text
from .status import AttemptOutcome
from .validation import TRACEPARENT, TRACEPARENT_MAX_LENGTH, missing_extra
from .version import VERSION

logger = logging.getLogger("django_pgjobs.tracing")

TRACER_NAME = "django_pgjobs"
SYSTEM = "django_pgjobs"  # messaging.system: the conventions list no value for PostgreSQL queues
# Attributes: the conventions' names, then ours.
MESSAGING_SYSTEM = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"
TASK = "messaging.django_pgjobs.task"
ATTEMPT = "messaging.django_pgjobs.attempt"
OUTCOME = "messaging.django_pgjobs.outcome"
STATUS = "messaging.django_pgjobs.status"
FAILURE_CLASS = "messaging.django_pgjobs.failure_class"
DEDUPLICATED = "messaging.django_pgjobs.deduplicated"

_FAILED = frozenset({AttemptOutcome.FAILED, AttemptOutcome.DEAD})


class _State:
    """What ``tracer()`` resolved: computed once, again when PGJOBS_TRACING changes."""

    resolved = False
    tracer: Any = None  # None: tracing is off
    trace: Any = None  # the opentelemetry.trace module
    propagator: Any = None  # W3C trace context only, whatever OTEL_PROPAGATORS says
    provider: Any = None  # set_tracer_provider()'s, or None: OpenTelemetry's global one


_state = _State()


def tracer() -> Any | None:
    """The tracer of django-pgjobs' spans, or None when tracing is off."""
    if _state.resolved:
        return _state.tracer
    return _resolve()


def set_tracer_provider(provider: Any | None) -> None:
    """Record django-pgjobs' spans with ``provider`` (None: OpenTelemetry's global provider).

    For tests and for applications that keep a provider of their own rather than the global
    one, which OpenTelemetry lets a process set only once.
    """
    _state.provider = provider
    reset()


def reset() -> None:
    """Resolve the tracer again on next use (the settings or the installed packages changed)."""
    _state.resolved = False
    _state.tracer = None


def _resolve() -> Any | None:
    found = None
    wanted = settings.TRACING
    if wanted is not False:
        try:
            # Imported on first use, never at import time: without the extra nothing is.
            trace = importlib.import_module("opentelemetry.trace")
            tracecontext = importlib.import_module(
                "opentelemetry.trace.propagation.tracecontext")
        except ImportError:
            if wanted is True:
                logger.warning("PGJOBS_TRACING is True but %s. No spans are recorded",
                               missing_extra("opentelemetry-api", "otel"))
        else:
            _state.trace = trace
            _state.propagator = tracecontext.TraceContextTextMapPropagator()
            found = trace.get_tracer(TRACER_NAME, VERSION, tracer_provider=_state.provider)
    _state.tracer = found
    _state.resolved = True
    return found


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGJOBS_TRACING":
        reset()


setting_changed.connect(_on_setting_changed)


# --- enqueue ---------------------------------------------------------------------------------


class Enqueued(Protocol):
    """What the spans of an enqueue name of each job, before its INSERT."""

    @property
    def task(self) -> str: ...

    @property
    def queue(self) -> str: ...


class Sending:
    """The spans of one enqueue: ``traceparents`` to store, ``sent(jobs)`` once inserted."""

    def __init__(self, spans: list[Any], traceparents: list[str | None] | None = None) -> None:
        self._spans = spans
        self.traceparents = (
            [_traceparent(span) for span in spans] if traceparents is None else traceparents)

    @classmethod
    def alike(cls, span: Any, count: int) -> Sending:
        """``count`` jobs that all carry ``span``'s context, with no span of their own."""
        return cls([], [_traceparent(span)] * count)

    def sent(self, jobs: Sequence[Any]) -> None:
        """Name the job of each span; a job that already existed is marked deduplicated."""
        if not self._spans:
            return
        for span, job in zip(self._spans, jobs, strict=True):
            span.set_attribute(MESSAGE_ID, str(job.pk))
            if job.created is False:
                span.set_attribute(DEDUPLICATED, True)


def send_tracer() -> Any | None:
    """The tracer for an enqueue's spans, or None when tracing is off or they could neither
    be recorded nor carry a context to the jobs (``_nothing_to_send``): the jobs then store no
    traceparent, and the enqueue enters no span at all (entering one that does nothing was a
    twentieth of a single enqueue's client CPU)."""
    found = _state.tracer if _state.resolved else _resolve()
    return None if found is None or _nothing_to_send() else found


@contextmanager
def sending(found: Any, jobs: Sequence[Enqueued]) -> Iterator[Sending]:
    """Spans for an enqueue of ``jobs`` with ``send_tracer()``'s tracer: ``send {queue}``, and a
    ``create`` span per job of many.

    One job's creation context is the send span itself; for many, each job gets a child span
    of its own, so every job's attempts link to a span that names that job. A send span that
    is not recorded has no children: its context is every job's.
    """
    trace = _state.trace
    queues = sorted({job.queue for job in jobs})
    destination = queues[0] if len(queues) == 1 else None
    attributes: dict[str, Any] = {MESSAGING_SYSTEM: SYSTEM, OPERATION_NAME: "send",
                                  OPERATION_TYPE: "send"}
    if destination is not None:
        attributes[DESTINATION] = destination
    if len(jobs) == 1:
        attributes[TASK] = jobs[0].task
    else:
        attributes[BATCH_COUNT] = len(jobs)
    name = "send" if destination is None else f"send {destination}"
    # OpenTelemetry would record an escaping exception whole: a database error's text quotes
    # the failing row. _refused records what may be shown.
    with found.start_as_current_span(name, kind=trace.SpanKind.PRODUCER, attributes=attributes,
                                     record_exception=False,
                                     set_status_on_exception=False) as span:
        creates: list[Any] = []
        if len(jobs) == 1:
            sending = Sending([span])
        elif not span.is_recording():
            # Not sampled, or no SDK at all: a create span per job would not be recorded either
            # (the SDK's samplers decide alike for the spans of one trace). Each job carries
            # this span's context instead, which propagates the trace all the same. A thousand
            # create spans were a fifth of a bulk enqueue's Python.
            sending = Sending.alike(span, len(jobs))
        else:
            creates = [found.start_span(f"create {job.queue}", kind=trace.SpanKind.PRODUCER,
                                        attributes={MESSAGING_SYSTEM: SYSTEM,
                                                    OPERATION_NAME: "create",
                                                    OPERATION_TYPE: "create",
                                                    DESTINATION: job.queue, TASK: job.task})
                       for job in jobs]
            sending = Sending(creates)
        try:
            yield sending
        except BaseException as exc:
            _refused(span, exc)
            raise
        finally:
            for create in creates:
                create.end()


def _refused(span: Any, exc: BaseException) -> None:
    """Mark an enqueue's span failed by ``exc``, with no data of the rows in it.

    Our own errors are written from checked values; a database error keeps its primary message
    and SQLSTATE, never its DETAIL or CONTEXT; any other error is named by its type alone.
    """
    if not span.is_recording():
        return
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    message = str(exc) if isinstance(exc, PgJobsError) else database_error_text(exc)
    span.set_attribute(ERROR_TYPE, name)
    span.add_event("exception", {"exception.type": name,
                                 **({"exception.message": message} if message else {})})
    trace = _state.trace
    span.set_status(trace.Status(trace.StatusCode.ERROR, message[:200] if message else None))


def _nothing_to_send() -> bool:
    """Whether an enqueue's span could neither be recorded nor carry a context to its jobs.

    With the API alone (OpenTelemetry's global provider still a proxy), a span records nothing
    and carries its parent's context; with no trace going on, that context is invalid and the
    job stores no traceparent. Making the span anyway was a twelfth of a single enqueue's time.
    Asked on every enqueue: an SDK may be set up later, a request's trace may be current.
    """
    return _no_sdk() and not _state.trace.get_current_span().get_span_context().is_valid


def _no_sdk() -> bool:
    """Whether spans record nothing: no provider of ours, and OpenTelemetry's global one still
    the proxy it is until an SDK sets a real one (asked anew each time: that may happen later)."""
    return (_state.provider is None
            and isinstance(_state.trace.get_tracer_provider(), _state.trace.ProxyTracerProvider))


def _traceparent(span: Any) -> str | None:
    carrier: dict[str, str] = {}
    _state.propagator.inject(carrier, context=_state.trace.set_span_in_context(span))
    value = carrier.get("traceparent")
    # Nothing is stored for a span that is not sampled into any trace (no SDK, no parent).
    if (value is None or len(value) > TRACEPARENT_MAX_LENGTH
            or TRACEPARENT.fullmatch(value) is None):
        return None
    return value


# --- an attempt ------------------------------------------------------------------------------


class _Runner(Protocol):
    @property
    def worker_id(self) -> str: ...


C = TypeVar("C", bound=_Runner)


def traced_attempt(
    execute: Callable[[ClaimedJob, C], Outcome],
) -> Callable[[ClaimedJob, C], Outcome]:
    """Run ``execute`` in a ``process {queue}`` span linked to the job's enqueue, when tracing.

    The span is current while the handler runs, so the handler's own spans are its children.
    """

    @wraps(execute)
    def traced(job: ClaimedJob, ctx: C) -> Outcome:
        found = _attempt_tracer()
        if found is None:
            return execute(job, ctx)
        with _processing(found, job, ctx.worker_id) as span:
            outcome = execute(job, ctx)
            _record(span, outcome)
        return outcome

    return traced


def traced_async_attempt(
    execute: Callable[[ClaimedJob, C], Awaitable[Outcome]],
) -> Callable[[ClaimedJob, C], Awaitable[Outcome]]:
    """``traced_attempt`` for an async handler's attempt: the span is current in its task."""

    @wraps(execute)
    async def traced(job: ClaimedJob, ctx: C) -> Outcome:
        found = _attempt_tracer()
        if found is None:
            return await execute(job, ctx)
        with _processing(found, job, ctx.worker_id) as span:
            outcome = await execute(job, ctx)
            _record(span, outcome)
        return outcome

    return traced


def _attempt_tracer() -> Any | None:
    """The tracer for an attempt's span, or None when nothing would record it.

    With the API alone, OpenTelemetry's global provider is a proxy until an SDK sets a real
    one, and its spans record nothing. An attempt's span is a root (linked to the enqueue, not
    its child), so without an SDK it carries no context either: skipping it changes nothing
    but the cost, which is more than a no-op job's own. Asked for every attempt, since an SDK
    may be set up after the worker started. Enqueue keeps its span while a trace is going on
    (``_nothing_to_send``): a request's context reaches a job through a span that records
    nothing.
    """
    found = _state.tracer if _state.resolved else _resolve()
    return None if found is None or _no_sdk() else found


@contextmanager
def _processing(found: Any, job: ClaimedJob, worker_id: str) -> Iterator[Any]:
    trace = _state.trace
    links = []
    if job.traceparent:
        enqueued = trace.get_current_span(
            _state.propagator.extract({"traceparent": job.traceparent})).get_span_context()
        if enqueued.is_valid:
            links.append(trace.Link(enqueued))
    attributes = {
        MESSAGING_SYSTEM: SYSTEM, OPERATION_NAME: "process", OPERATION_TYPE: "process",
        DESTINATION: job.queue, MESSAGE_ID: str(job.id), CLIENT_ID: worker_id, TASK: job.task,
        ATTEMPT: job.attempt,
    }
    with found.start_as_current_span(f"process {job.queue}", kind=trace.SpanKind.CONSUMER,
                                     attributes=attributes, links=links) as span:
        yield span


def _record(span: Any, outcome: Outcome) -> None:
    if not span.is_recording():
        return  # no SDK: build nothing nobody reads
    span.set_attribute(OUTCOME, outcome.attempt_outcome.value)
    span.set_attribute(STATUS, outcome.status.value)
    if outcome.failure_class:
        span.set_attribute(FAILURE_CLASS, outcome.failure_class)
    if outcome.attempt_outcome not in _FAILED:
        return
    span.set_attribute(ERROR_TYPE, outcome.failure_class or outcome.terminal_reason or "_OTHER")
    if outcome.error:
        # The error and traceback as stored: scrubbed of the job's secrets already.
        event = {"exception.type": _exception_type(outcome.error),
                 "exception.message": outcome.error}
        if outcome.traceback:
            event["exception.stacktrace"] = outcome.traceback
        span.add_event("exception", event)
    trace = _state.trace
    span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error[:200] or None))


def _exception_type(error: str) -> str:
    # The executor writes "module.Class: message" ("Class: message" for builtins).
    head = error.split(":", 1)[0].strip()
    return head if head.replace(".", "").replace("_", "").isalnum() else "_OTHER"


__all__ = [
    "Sending",
    "reset",
    "sending",
    "set_tracer_provider",
    "traced_async_attempt",
    "traced_attempt",
    "tracer",
]
