from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError
from django.db import OperationalError

from django_pgjobs import Permanent, RetryAfter, Transient
from django_pgjobs.retry import (
    POLICY,
    Verdict,
    backoff_seconds,
    classify,
    decide,
    retry_matrix_markdown,
    with_verdict,
)
from django_pgjobs.status import FailureClass, JobStatus, TerminalReason

NOW = datetime(2026, 1, 1, tzinfo=UTC)
DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (Transient("503"), FailureClass.TRANSIENT),
        (RetryAfter(30), FailureClass.RATE_LIMITED),
        (Permanent("no"), FailureClass.PERMANENT),
        (ValidationError("bad"), FailureClass.PERMANENT),
        (PermissionDenied(), FailureClass.PERMANENT),
        (ObjectDoesNotExist(), FailureClass.PERMANENT),
        (OperationalError("server closed the connection"), FailureClass.TRANSIENT),
        (psycopg.errors.SerializationFailure(), FailureClass.TRANSIENT),
        (psycopg.errors.DeadlockDetected(), FailureClass.TRANSIENT),
        (TimeoutError(), FailureClass.TRANSIENT),
        (ConnectionResetError(), FailureClass.TRANSIENT),
        (KeyError("x"), FailureClass.UNKNOWN),
        (SystemExit(1), FailureClass.UNKNOWN),
    ],
)
def test_default_classification(exc: BaseException, expected: FailureClass) -> None:
    assert classify(exc)[0] == expected


def test_handler_mappings_come_before_the_defaults() -> None:
    assert classify(KeyError("x"), retry_on=[KeyError])[0] == FailureClass.TRANSIENT
    assert classify(TimeoutError(), permanent_on=[TimeoutError])[0] == FailureClass.PERMANENT
    # The package's own exceptions say what the handler meant, whatever the mappings.
    assert classify(Transient("x"), permanent_on=[Transient])[0] == FailureClass.TRANSIENT
    assert classify(RetryAfter(7)) == (FailureClass.RATE_LIMITED, 7.0)


def test_backoff_is_capped_exponential_with_full_jitter() -> None:
    random.seed(1)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (10, 60.0), (200, 60.0)]:
        samples = [backoff_seconds(attempt, base=1.0, cap=60.0) for _ in range(400)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8  # the jitter spreads over the whole range
        assert min(samples) < ceiling * 0.2


def test_transient_failures_retry_until_attempts_run_out() -> None:
    decision = decide(FailureClass.TRANSIENT, attempts=2, max_attempts=3, created_at=NOW,
                      deadline=None, now=NOW)
    assert decision.status == JobStatus.RETRYING and decision.delay_seconds is not None
    assert decision.counts_attempt is True
    last = decide(FailureClass.TRANSIENT, attempts=3, max_attempts=3, created_at=NOW,
                  deadline=None, now=NOW)
    assert (last.status, last.terminal_reason) == (JobStatus.DEAD,
                                                   TerminalReason.ATTEMPTS_EXHAUSTED)


def test_permanent_failures_are_dead_at_once() -> None:
    decision = decide(FailureClass.PERMANENT, attempts=1, max_attempts=20, created_at=NOW,
                      deadline=None, now=NOW)
    assert (decision.status, decision.terminal_reason) == (JobStatus.DEAD,
                                                           TerminalReason.PERMANENT_ERROR)


def test_rate_limited_waits_at_least_the_hint() -> None:
    for _ in range(50):
        decision = decide(FailureClass.RATE_LIMITED, attempts=1, max_attempts=5, created_at=NOW,
                          deadline=None, now=NOW, hint_seconds=30)
        assert 30 <= decision.delay_seconds <= 33


def test_a_retry_that_would_end_after_the_deadline_is_dead_instead() -> None:
    decision = decide(FailureClass.RATE_LIMITED, attempts=1, max_attempts=5, created_at=NOW,
                      deadline=NOW + timedelta(seconds=10), now=NOW, hint_seconds=30)
    assert (decision.status, decision.terminal_reason) == (JobStatus.DEAD,
                                                           TerminalReason.DEADLINE_PASSED)


def test_unknown_task_retries_without_using_attempts_within_the_deploy_window(settings) -> None:
    settings.PGJOBS_UNKNOWN_TASK_RETRY_SECONDS = 600
    inside = decide(FailureClass.UNKNOWN_TASK, attempts=50, max_attempts=3, created_at=NOW,
                    deadline=None, now=NOW + timedelta(seconds=599))
    assert inside.status == JobStatus.RETRYING and inside.counts_attempt is False
    assert 0 < inside.delay_seconds <= 60
    after = decide(FailureClass.UNSUPPORTED_VERSION, attempts=1, max_attempts=3, created_at=NOW,
                   deadline=None, now=NOW + timedelta(seconds=600))
    assert (after.status, after.terminal_reason) == (JobStatus.DEAD,
                                                     TerminalReason.UNSUPPORTED_VERSION)


def test_a_verdict_on_an_exception_decides_while_the_exception_stays_itself() -> None:
    type_error = with_verdict(TypeError("Unsupported type"), Verdict(permanent=True))
    assert isinstance(type_error, TypeError)
    assert classify(type_error) == (FailureClass.PERMANENT, None)
    # A wait replaces the exponential backoff of the class the exception has, exactly.
    assert classify(with_verdict(KeyError("x"), Verdict(retry_in=7.5))) == (
        FailureClass.UNKNOWN, 7.5)
    assert classify(with_verdict(Transient("503"), Verdict(retry_in=0))) == (
        FailureClass.TRANSIENT, 0)
    decision = decide(FailureClass.UNKNOWN, attempts=1, max_attempts=3, created_at=NOW,
                      deadline=None, now=NOW, hint_seconds=7.5)
    assert (decision.status, decision.delay_seconds) == (JobStatus.RETRYING, 7.5)
    # It does not override what the exception says for itself, nor the attempt budget.
    assert classify(with_verdict(RetryAfter(30), Verdict(retry_in=1))) == (
        FailureClass.RATE_LIMITED, 30)
    assert classify(with_verdict(Permanent("no"), Verdict(retry_in=1))) == (
        FailureClass.PERMANENT, None)
    last = decide(FailureClass.UNKNOWN, attempts=3, max_attempts=3, created_at=NOW,
                  deadline=None, now=NOW, hint_seconds=7.5)
    assert (last.status, last.terminal_reason) == (JobStatus.DEAD,
                                                   TerminalReason.ATTEMPTS_EXHAUSTED)


def test_every_failure_class_has_a_rule() -> None:
    assert set(POLICY) == set(FailureClass)


def test_committed_retry_matrix_matches_the_policy_table() -> None:
    committed = (DOCS / "retry-matrix.md").read_text(encoding="utf-8")
    assert committed == retry_matrix_markdown(), (
        "docs/retry-matrix.md is stale: run manage.py pgjobs_retry_matrix --write "
        "docs/retry-matrix.md"
    )
