"""Run one claimed job and turn what happened into an ``Outcome``.

Whatever the handler raises is its outcome; of the code around it (a payload's upgrade), an
``Exception`` is, while an interrupt or ``SystemExit`` stops the caller as anywhere else.

``execute`` runs a handler in the calling thread; ``aexecute`` awaits an async handler on the
caller's event loop. Both share every step but the call, so a job means the same either way.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import time
import traceback
from dataclasses import replace
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import DatabaseError

from . import encryption
from .claimed import ClaimedJob
from .conf import settings
from .context import JobContext
from .exceptions import (
    EncryptedPathMissing,
    EncryptionNotConfigured,
    PayloadInvalid,
    Snooze,
    TimedOut,
    Undecryptable,
)
from .limits import RateLimited
from .outcomes import Outcome
from .payloads import written_out
from .registry import Handler, redactor_for, registry
from .retry import Decision, classify, decide, decision_of
from .status import FailureClass, TerminalReason
from .tracing import traced_async_attempt, traced_attempt

ERROR_MAX_CHARS = 4000
TRACEBACK_MAX_CHARS = 32000

logger = logging.getLogger("django_pgjobs.executor")


@traced_attempt  # an OpenTelemetry span around the attempt, when tracing is on
def execute(job: ClaimedJob, ctx: JobContext) -> Outcome:
    """Run the handler for ``job`` and say what should become of it."""
    started = time.monotonic()
    ready = _prepare(job, started)
    if isinstance(ready, Outcome):
        return ready
    handler, payload = ready
    try:
        result = handler(ctx, payload)
        if inspect.isawaitable(result):
            # An async handler run by a caller that has no event loop for it (a test helper,
            # a thread executor): run it to its end here. async_to_sync, not asyncio.run, so
            # the sync code it calls (the async ORM's queries) runs back in this thread, on this
            # thread's connection and in its transaction (a test's).
            result = async_to_sync(_awaited)(result)
    except BaseException as exc:  # a handler's failure is data, never the worker's crash
        return _raised(job, handler, started, exc)
    finally:
        _flush_progress(ctx)
    return _returned(job, handler, started, result)


@traced_async_attempt
async def aexecute(job: ClaimedJob, ctx: JobContext) -> Outcome:
    """``execute`` for an async handler, on the caller's event loop; cancelling it cancels the
    handler, and the outcome then says it was cancelled."""
    started = time.monotonic()
    ready = _prepare(job, started)
    if isinstance(ready, Outcome):
        return ready
    handler, payload = ready
    try:
        result = handler(ctx, payload)
        if inspect.isawaitable(result):
            result = await result
    except BaseException as exc:
        return _raised(job, handler, started, exc)
    finally:
        if ctx.progress_unwritten is not None:  # the database call only when there is one
            await sync_to_async(_flush_progress, thread_sensitive=True)(ctx)
    return _returned(job, handler, started, result)


def _flush_progress(ctx: JobContext) -> None:
    """The handler's last progress, if a call within the second left it unwritten. A database
    error here is the handler's progress lost, never its outcome."""
    if ctx.progress_unwritten is None:
        return
    try:
        ctx.flush_progress()
    except DatabaseError as exc:
        ctx.progress_unwritten = None
        logger.warning("job.progress_lost id=%s: %s", ctx.job.id, type(exc).__name__)


# A result's JSON shorter than this many characters is at most four times as many bytes, under
# the smallest PGJOBS_MAX_RESULT_BYTES allowed: the setting is read only for longer ones.
RESULT_CHECKED_FROM = 16 * 1024


def timed_out(job: ClaimedJob, *, ran_seconds: float) -> Outcome:
    """The outcome of a job still running at its timeout: failed, class ``timeout``.

    The retry policy decides what follows, unless the handler lists ``TimedOut`` in its
    ``permanent_on``, which makes the timeout permanent.
    """
    handler = registry.resolve(job.task)
    permanent = handler is not None and any(
        issubclass(TimedOut, kind) for kind in handler.permanent_on)
    decision = decide(
        FailureClass.PERMANENT if permanent else FailureClass.TIMEOUT, attempts=job.attempt,
        max_attempts=job.max_attempts, created_at=job.created_at, deadline=job.deadline,
        now=job.database_now(),
    )
    return Outcome.failed(
        job, FailureClass.TIMEOUT, decision,
        error=f"timed out: still running after {ran_seconds:.1f}s "
              f"(timeout {job.timeout_seconds:g}s)",
        duration_ms=int(ran_seconds * 1000),
    )


def broke_around(job: ClaimedJob, exc: BaseException) -> Outcome:
    """The outcome of a job whose run failed outside its handler (in the worker's own code).

    The job fails like one whose handler raised something unknown, scrubbed the same way, and
    the retry policy decides what follows: the worker goes on with its other jobs.
    """
    return _failed(job, time.monotonic(), FailureClass.UNKNOWN,
                   f"the worker failed around the job: {_describe(exc)}",
                   "".join(traceback.format_exception(exc)))


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _prepare(job: ClaimedJob, started: float) -> tuple[Handler, Any] | Outcome:
    """The handler and the payload it takes, or the outcome of a job that cannot run."""
    if job.past_deadline():
        return Outcome.dead(job, TerminalReason.DEADLINE_PASSED,
                            "deadline passed before the job ran")
    handler = registry.resolve(job.task)
    if handler is None:
        return _failed(job, started, FailureClass.UNKNOWN_TASK,
                       f"no handler registered for task {job.task!r} in this worker", "")
    if job.payload_version > handler.version:
        return _failed(
            job, started, FailureClass.UNSUPPORTED_VERSION,
            f"payload version {job.payload_version} is newer than this worker's handler "
            f"(version {handler.version})", "",
        )
    try:
        return handler, handler.payload_for_handler(job.payload, job.payload_version)
    except Undecryptable as exc:
        # A key missing here may be configured on the next worker (a rotation rolling out):
        # retried within the deploy window, like an unknown task. An altered value never opens.
        return _failed(job, started,
                       FailureClass.UNKNOWN_KEY if exc.key_missing else FailureClass.PERMANENT,
                       str(exc), "")
    except PayloadInvalid as exc:  # the stored payload does not fit the handler's model
        return _failed(job, started, FailureClass.PERMANENT,
                       f"the payload does not match the handler's model: {exc}", "")
    except LookupError as exc:  # a missing upgrade step: no retry can decode this payload
        return _failed(job, started, FailureClass.PERMANENT, _describe(exc), "")
    except Exception as exc:
        # An upgrade step is the handler's code: its error is classified, recorded and scrubbed
        # as the handler's own would be (a step that read something unreachable may work on
        # the next attempt), never the worker's crash.
        failure_class, hint = classify(
            exc, retry_on=handler.retry_on, permanent_on=handler.permanent_on)
        return _failed(job, started, failure_class,
                       f"payload upgrade from version {job.payload_version} failed: "
                       f"{_describe(exc)}", "".join(traceback.format_exception(exc)), hint)


def _raised(job: ClaimedJob, handler: Handler, started: float, exc: BaseException) -> Outcome:
    if isinstance(exc, RateLimited):
        # The key is held back whatever becomes of this job: the service said so.
        return replace(_snoozed(job, started, exc.seconds), push_back_key=exc.key,
                       push_back_seconds=exc.retry_after)
    if isinstance(exc, Snooze):
        return _snoozed(job, started, exc.seconds)
    tb = "".join(traceback.format_exception(exc))
    failure_class, hint = classify(
        exc, retry_on=handler.retry_on, permanent_on=handler.permanent_on
    )
    return _failed(job, started, failure_class, _describe(exc), tb, hint, decision_of(exc))


def _returned(job: ClaimedJob, handler: Handler, started: float, result: Any) -> Outcome:
    if handler.encrypted_result:
        try:
            result = encryption.seal(result, handler.encrypted_result, where=encryption.RESULT,
                                     owner=handler.name)
        except EncryptionNotConfigured as exc:  # this worker lacks the keys; another may not
            return _failed(job, started, FailureClass.UNKNOWN_KEY, str(exc), "")
        except (EncryptedPathMissing, TypeError, ValueError) as exc:
            # Never stored in plaintext; the side effects happened and a retry would return
            # the same.
            return _failed(job, started, FailureClass.PERMANENT,
                           f"the handler's result could not be encrypted: {_describe(exc)}", "")
    try:
        result_json = json.dumps(result, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        # The side effects already happened and a retry would fail the same way.
        return _failed(job, started, FailureClass.PERMANENT,
                       f"handler returned a value that is not JSON: {_describe(exc)}", "")
    if "e+" in result_json:  # a float jsonb would give back as an integer, perhaps
        # Deep enough that json.dumps only just wrote it: stored as json.dumps wrote it.
        with contextlib.suppress(RecursionError):
            result_json = written_out(result)
    # Valid JSON that jsonb refuses would fail the settlement of the worker's whole batch, or be
    # stored as no result at all: say why instead.
    if "\\u0000" in result_json and _holds_nul(result):
        return _failed(job, started, FailureClass.PERMANENT,
                       "handler returned a value with a NUL character, which PostgreSQL cannot "
                       "store", "")
    if not result_json.isascii():
        try:
            result_json.encode("utf-8")
        except UnicodeEncodeError as exc:
            return _failed(job, started, FailureClass.PERMANENT,
                           "handler returned a value with a lone surrogate "
                           f"({result_json[exc.start]!r}), which is not UTF-8 and which "
                           "PostgreSQL cannot store", "")
    if len(result_json) > RESULT_CHECKED_FROM:  # smaller ones are within any allowed limit
        limit = int(settings.MAX_RESULT_BYTES)
        size = len(result_json.encode("utf-8"))
        if size > limit:
            return _failed(job, started, FailureClass.PERMANENT,
                           f"handler returned a result of {size} bytes, more than "
                           f"PGJOBS_MAX_RESULT_BYTES ({limit}): store it elsewhere and return "
                           "a reference to it", "")
    return Outcome.succeeded(job, result_json, _ms(started))


def _failed(
    job: ClaimedJob,
    started: float,
    failure_class: FailureClass,
    error: str,
    tb: str,
    hint: float | None = None,
    decided: Decision | None = None,
) -> Outcome:
    """The failed outcome; ``decided``: what follows, when the handler decided it already."""
    decision = decided or decide(
        failure_class, attempts=job.attempt, max_attempts=job.max_attempts,
        created_at=job.created_at, deadline=job.deadline, now=job.database_now(),
        hint_seconds=hint,
    )
    return Outcome.failed(
        job, failure_class, decision,
        error=_stored_text(job, error, ERROR_MAX_CHARS, keep_end=False),
        traceback=_stored_text(job, tb, TRACEBACK_MAX_CHARS, keep_end=True),
        duration_ms=_ms(started),
    )


def _snoozed(job: ClaimedJob, started: float, seconds: float) -> Outcome:
    if job.snoozes >= settings.MAX_SNOOZES:
        return Outcome.dead(job, TerminalReason.SNOOZE_LIMIT,
                            f"snoozed {job.snoozes} times (PGJOBS_MAX_SNOOZES)", _ms(started))
    seconds = min(seconds, float(settings.MAX_SNOOZE_SECONDS))
    wakes_at = job.database_now() + timedelta(seconds=seconds)
    if job.deadline is not None and wakes_at >= job.deadline:
        return Outcome.dead(job, TerminalReason.DEADLINE_PASSED,
                            "snooze would end after the deadline", _ms(started))
    return Outcome.snoozed(job, seconds, _ms(started))


def _describe(exc: BaseException) -> str:
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    try:
        text = str(exc)
    except Exception:  # an exception that cannot describe itself is still recorded
        text = "<exception str() failed>"
    return f"{name}: {text}" if text else name


def _stored_text(job: ClaimedJob, text: str, limit: int, *, keep_end: bool) -> str:
    """``text`` as stored: scrubbed of the job's secrets first, then cut to ``limit``.

    Scrubbing before the cut matters: a secret straddling the cut would otherwise survive as a
    fragment that no longer matches the value it is part of.
    """
    if not text:
        return text
    text = _storable(redactor_for(job.task).text(text, _readable(job)))
    if len(text) <= limit:
        return text
    return text[-limit:] if keep_end else text[:limit]


def _readable(job: ClaimedJob) -> Any:
    handler = registry.resolve(job.task)
    return job.payload if handler is None else handler.readable_payload(job.payload)


def _storable(text: str) -> str:
    """``text`` as PostgreSQL text can hold it: NUL and lone surrogates spelled out."""
    text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
