"""What happens after a failure: the policy table, classification and backoff. No database.

``docs/retry-matrix.md`` is generated from ``POLICY`` (``manage.py pgjobs_retry_matrix``); a test
fails when the committed document and this table disagree.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import TypeVar

import psycopg
from django.core.exceptions import (
    ObjectDoesNotExist,
    PermissionDenied,
    SuspiciousOperation,
    ValidationError,
)
from django.db import InterfaceError as DjangoInterfaceError
from django.db import OperationalError as DjangoOperationalError

from .conf import settings
from .exceptions import Permanent, RetryAfter, Transient
from .status import FailureClass, JobStatus, TerminalReason


class Delay(Enum):
    NONE = "none"
    EXPONENTIAL = "exponential"  # min(cap, base * 2**(attempt-1)) * U(0, 1): capped, full jitter
    HINT = "hint"  # the handler's RetryAfter seconds, plus up to 10% jitter, never sooner
    DEPLOY_WINDOW = "deploy window"  # fixed short waits, bounded by the unknown-task window


@dataclass(frozen=True)
class Rule:
    retries: bool
    delay: Delay
    uses_attempt: bool
    bounded_by: str
    examples: str


POLICY: dict[FailureClass, Rule] = {
    FailureClass.TRANSIENT: Rule(
        retries=True,
        delay=Delay.EXPONENTIAL,
        uses_attempt=True,
        bounded_by="max_attempts, deadline",
        examples="Transient; connection and timeout errors; deadlocks and serialization "
        "failures; django.db OperationalError and InterfaceError",
    ),
    FailureClass.RATE_LIMITED: Rule(
        retries=True,
        delay=Delay.HINT,
        uses_attempt=True,
        bounded_by="max_attempts, deadline",
        examples="RetryAfter(seconds)",
    ),
    FailureClass.PERMANENT: Rule(
        retries=False,
        delay=Delay.NONE,
        uses_attempt=True,
        bounded_by="first failure",
        examples="Permanent; ValidationError, PermissionDenied, ObjectDoesNotExist, "
        "SuspiciousOperation; a payload that cannot be upgraded; a return value that is not JSON "
        "or that PostgreSQL cannot store (a NUL character)",
    ),
    FailureClass.LEASE_EXPIRED: Rule(
        retries=True,
        delay=Delay.EXPONENTIAL,
        uses_attempt=True,
        bounded_by="max_attempts, deadline",
        examples="the worker died, stalled or lost its connection past the lease",
    ),
    FailureClass.TIMEOUT: Rule(
        retries=True,
        delay=Delay.EXPONENTIAL,
        uses_attempt=True,
        bounded_by="max_attempts, deadline",
        examples="still running at its timeout (timeout= on the handler or the job); permanent "
        "instead when the handler lists TimedOut in permanent_on",
    ),
    FailureClass.UNKNOWN: Rule(
        retries=True,
        delay=Delay.EXPONENTIAL,
        uses_attempt=True,
        bounded_by="max_attempts, deadline",
        examples="any other exception, including SystemExit and KeyboardInterrupt from a handler",
    ),
    FailureClass.UNKNOWN_TASK: Rule(
        retries=True,
        delay=Delay.DEPLOY_WINDOW,
        uses_attempt=False,
        bounded_by="PGJOBS_UNKNOWN_TASK_RETRY_SECONDS from enqueue, deadline",
        examples="no handler of that name in this worker (a rolling deploy)",
    ),
    FailureClass.UNSUPPORTED_VERSION: Rule(
        retries=True,
        delay=Delay.DEPLOY_WINDOW,
        uses_attempt=False,
        bounded_by="PGJOBS_UNKNOWN_TASK_RETRY_SECONDS from enqueue, deadline",
        examples="payload version newer than this worker's handler (a rolling deploy)",
    ),
    FailureClass.UNKNOWN_KEY: Rule(
        retries=True,
        delay=Delay.DEPLOY_WINDOW,
        uses_attempt=False,
        bounded_by="PGJOBS_UNKNOWN_TASK_RETRY_SECONDS from enqueue, deadline",
        examples="a field encrypted under a key missing from this worker's "
        "PGJOBS_ENCRYPTION_KEYS (a new key deployed to some workers only, or an old key "
        "removed before pgjobs_rotate_keys ran)",
    ),
}

_TERMINAL_REASON = {
    FailureClass.UNKNOWN_TASK: TerminalReason.UNKNOWN_TASK,
    FailureClass.UNSUPPORTED_VERSION: TerminalReason.UNSUPPORTED_VERSION,
    FailureClass.UNKNOWN_KEY: TerminalReason.UNKNOWN_KEY,
}

PERMANENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    Permanent,
    ValidationError,
    PermissionDenied,
    ObjectDoesNotExist,
    SuspiciousOperation,
)
TRANSIENT_EXCEPTIONS: tuple[type[BaseException], ...] = (
    Transient,
    DjangoOperationalError,
    DjangoInterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    TimeoutError,
    ConnectionError,
)


@dataclass(frozen=True)
class Decision:
    """The next state of a job after a failed attempt."""

    status: JobStatus
    delay_seconds: float | None
    terminal_reason: str
    # False when the failure gives its attempt back (a deploy-window wait).
    counts_attempt: bool = True


@dataclass(frozen=True)
class Verdict:
    """What a handler decided about the exception it raises, recorded as that exception."""

    permanent: bool = False  # no retry can help
    retry_in: float | None = None  # wait exactly this long instead of the exponential backoff


# The attribute a verdict travels in, on the exception instance itself: the exception is stored
# and shown as what it is (its class, its traceback) while the verdict decides what follows. The
# django.tasks backend gives them: a return value Django cannot normalise is permanent, and its
# OPTIONS["backoff"] picks the wait of a task's failures.
_VERDICT = "_pgjobs_verdict"

E = TypeVar("E", bound=BaseException)


def with_verdict(exc: E, verdict: Verdict) -> E:
    """Attach ``verdict`` to ``exc`` (then raise it) and return it."""
    setattr(exc, _VERDICT, verdict)
    return exc


# The attribute a decision already made about an exception travels in: the django.tasks backend
# decides when its task fails (whether Django's task_finished is due), and the worker records
# that decision rather than draw a second one that could disagree near a deadline or a jitter.
_DECISION = "_pgjobs_decision"


def with_decision(exc: E, decision: Decision) -> E:
    """Attach the ``decision`` made about ``exc`` (then raise it) and return it."""
    setattr(exc, _DECISION, decision)
    return exc


def decision_of(exc: BaseException) -> Decision | None:
    """The decision attached to ``exc`` by ``with_decision``, if any."""
    decision = getattr(exc, _DECISION, None)
    return decision if isinstance(decision, Decision) else None


def backoff_replaceable(failure_class: FailureClass) -> bool:
    """Whether a verdict's ``retry_in`` replaces the wait of this class (an exponential one)."""
    rule = POLICY[failure_class]
    return rule.retries and rule.delay is Delay.EXPONENTIAL


def classify(
    exc: BaseException,
    *,
    retry_on: Iterable[type[BaseException]] = (),
    permanent_on: Iterable[type[BaseException]] = (),
) -> tuple[FailureClass, float | None]:
    """Return the failure class of ``exc`` and the retry hint in seconds, if any.

    The hint is a ``RetryAfter``'s seconds, or the ``retry_in`` of a ``Verdict`` attached to
    the exception (``with_verdict``); a permanent verdict makes the failure permanent.
    """
    failure_class, hint = _classify_type(exc, retry_on, permanent_on)
    verdict = getattr(exc, _VERDICT, None)
    if not isinstance(verdict, Verdict):
        return failure_class, hint
    if verdict.permanent:
        return FailureClass.PERMANENT, None
    if verdict.retry_in is not None and backoff_replaceable(failure_class):
        return failure_class, verdict.retry_in
    return failure_class, hint


def _classify_type(
    exc: BaseException,
    retry_on: Iterable[type[BaseException]],
    permanent_on: Iterable[type[BaseException]],
) -> tuple[FailureClass, float | None]:
    if isinstance(exc, RetryAfter):
        return FailureClass.RATE_LIMITED, exc.seconds
    if isinstance(exc, Permanent):
        return FailureClass.PERMANENT, None
    if isinstance(exc, Transient):
        return FailureClass.TRANSIENT, None
    if isinstance(exc, tuple(permanent_on)):
        return FailureClass.PERMANENT, None
    if isinstance(exc, tuple(retry_on)):
        return FailureClass.TRANSIENT, None
    if isinstance(exc, PERMANENT_EXCEPTIONS):
        return FailureClass.PERMANENT, None
    if isinstance(exc, TRANSIENT_EXCEPTIONS):
        return FailureClass.TRANSIENT, None
    return FailureClass.UNKNOWN, None


def backoff_seconds(attempt: int, *, base: float | None = None, cap: float | None = None) -> float:
    """Capped exponential backoff with full jitter for the retry after ``attempt``."""
    base = settings.RETRY_BASE_SECONDS if base is None else base
    cap = settings.RETRY_MAX_SECONDS if cap is None else cap
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 62))
    return random.uniform(0, ceiling)


def decide(
    failure_class: FailureClass,
    *,
    attempts: int,
    max_attempts: int,
    created_at: datetime,
    deadline: datetime | None,
    now: datetime,
    hint_seconds: float | None = None,
) -> Decision:
    """Apply the policy table to a failed attempt."""
    rule = POLICY[failure_class]
    if not rule.retries:
        return Decision(JobStatus.DEAD, None, TerminalReason.PERMANENT_ERROR)
    if rule.delay is Delay.DEPLOY_WINDOW:
        window = timedelta(seconds=settings.UNKNOWN_TASK_RETRY_SECONDS)
        if now >= created_at + window:
            return Decision(JobStatus.DEAD, None, _TERMINAL_REASON[failure_class])
        delay = random.uniform(0.5, 1.0) * min(60.0, window.total_seconds() / 10)
    elif attempts >= max_attempts:
        return Decision(JobStatus.DEAD, None, TerminalReason.ATTEMPTS_EXHAUSTED)
    elif rule.delay is Delay.HINT and hint_seconds is not None:
        delay = hint_seconds * random.uniform(1.0, 1.1)
    elif hint_seconds is not None:
        delay = hint_seconds  # a verdict's wait (a task backend's backoff), as it was given
    else:
        delay = backoff_seconds(attempts)
    if deadline is not None and now + timedelta(seconds=delay) >= deadline:
        return Decision(JobStatus.DEAD, None, TerminalReason.DEADLINE_PASSED)
    return Decision(JobStatus.RETRYING, delay, "", rule.uses_attempt)


def retry_matrix_markdown() -> str:
    """The policy table as Markdown, for docs/retry-matrix.md."""
    lines = [
        "# Retry and terminal-state matrix",
        "",
        "Generated from `django_pgjobs/retry.py` by `manage.py pgjobs_retry_matrix`; a test fails",
        "when this file and the code disagree. Do not edit by hand.",
        "",
        "| failure class | retries | wait before the next attempt | uses an attempt | ends when "
        "| terminal reason | raised by |",
        "|---|---|---|---|---|---|---|",
    ]
    for failure_class, rule in POLICY.items():
        if not rule.retries:
            reason = TerminalReason.PERMANENT_ERROR.value
        elif failure_class in _TERMINAL_REASON:
            reason = f"{_TERMINAL_REASON[failure_class].value}, deadline_passed"
        else:
            reason = "attempts_exhausted, deadline_passed"
        lines.append(
            f"| `{failure_class.value}` | {'yes' if rule.retries else 'no'} | {rule.delay.value} "
            f"| {'yes' if rule.uses_attempt else 'no'} | {rule.bounded_by} | {reason} "
            f"| {rule.examples} |"
        )
    lines += [
        "",
        "Waits:",
        "",
        "- **exponential**: `uniform(0, min(PGJOBS_RETRY_MAX_SECONDS, "
        "PGJOBS_RETRY_BASE_SECONDS * 2**(attempt-1)))` (full jitter).",
        "- **hint**: the `RetryAfter(seconds)` the handler raised, times `uniform(1.0, 1.1)`: "
        "never sooner than asked.",
        "- **deploy window**: `uniform(0.5, 1.0) * min(60, PGJOBS_UNKNOWN_TASK_RETRY_SECONDS / 10)`"
        " seconds, until the window that starts at enqueue closes.",
        "- A django.tasks backend's `OPTIONS[\"backoff\"]` replaces the **exponential** wait of a "
        "task's failures with the seconds it returns (exactly), or ends the job as `permanent` "
        "when it returns None ([django.tasks](django-tasks.md#retries)).",
        "",
        "Any retry whose wait would end at or after the job's deadline ends the job as dead with "
        "`deadline_passed` instead.",
        "",
        "Not failures:",
        "",
        "- **Snooze(seconds)**: the job waits and runs again without using an attempt; after "
        "`PGJOBS_MAX_SNOOZES` snoozes it is dead with `snooze_limit`, and the deadline still "
        "applies.",
        "- **released**: a job handed back unstarted (shutdown, too little lease left to start) "
        "is ready again at once and its attempt is not counted.",
        "- **success**: `succeeded`, terminal reason `succeeded`.",
        "",
        f"Job states after a decision: `{JobStatus.RETRYING.value}` (waiting out the backoff), "
        f"`{JobStatus.DEAD.value}` (terminal).",
        "",
    ]
    return "\n".join(lines)
