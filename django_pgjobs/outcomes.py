"""The ways out of RUNNING: what the holder of a lease reports for one attempt.

Every way is a named constructor of ``Outcome``, and ``WAYS_OUT`` lists which state each
attempt outcome may send the job to. ``transitions.settle`` applies an outcome only while the
reporter still holds the lease, and refuses one whose pair of attempt outcome and job state is
not on the list, so no code path can invent a transition.

- ``succeeded`` -> succeeded (the executor: the handler returned);
- ``failed`` -> retrying (the executor: the handler raised and the policy retries; the attempt
  is given back for an unknown task or a payload from a newer deploy);
- ``dead`` -> dead (the executor: the policy ends the job, or it can no longer run: deadline,
  snooze limit);
- ``snoozed`` -> scheduled or ready, the attempt given back (the handler raised ``Snooze``);
- ``released`` -> ready, the attempt given back (the worker: handed back unstarted because it
  is stopping, the lease is too short to start, or the database is away);
- ``lease_expired`` -> retrying or dead (the rescue step: the holder's lease ran out);
- ``timed_out`` -> retrying or dead (the worker: the handler was still running at its timeout;
  the policy for the ``timeout`` class decides);
- ``cancelled`` -> cancelled (the worker: an operator asked the running job to stop; the rescue
  step, for a job whose worker is gone).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Protocol

from .retry import Decision
from .status import AttemptOutcome, FailureClass, JobStatus, TerminalReason

WAYS_OUT: dict[AttemptOutcome, frozenset[JobStatus]] = {
    AttemptOutcome.SUCCEEDED: frozenset({JobStatus.SUCCEEDED}),
    AttemptOutcome.FAILED: frozenset({JobStatus.RETRYING}),
    AttemptOutcome.DEAD: frozenset({JobStatus.DEAD}),
    AttemptOutcome.SNOOZED: frozenset({JobStatus.SCHEDULED, JobStatus.READY}),
    AttemptOutcome.RELEASED: frozenset({JobStatus.READY}),
    AttemptOutcome.LEASE_EXPIRED: frozenset({JobStatus.RETRYING, JobStatus.DEAD}),
    AttemptOutcome.TIMED_OUT: frozenset({JobStatus.RETRYING, JobStatus.DEAD}),
    AttemptOutcome.CANCELLED: frozenset({JobStatus.CANCELLED}),
}


# Failures that are not the handler's report but a takeover of its attempt, by the rescue step
# (the lease ran out) or by the worker (the timeout passed).
_TAKEN_OVER = {
    FailureClass.LEASE_EXPIRED: AttemptOutcome.LEASE_EXPIRED,
    FailureClass.TIMEOUT: AttemptOutcome.TIMED_OUT,
}


class Held(Protocol):
    """What names the attempt an outcome settles: a job id and the lease it was claimed under."""

    @property
    def id(self) -> int: ...
    @property
    def lease_token(self) -> uuid.UUID: ...
    @property
    def task(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def lease_owner(self) -> str: ...
    @property
    def trace_id(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's report. Build it with a named constructor, never directly."""

    job_id: int
    lease_token: uuid.UUID
    # The attempt's number and the worker that held it: its row is written when it ends.
    attempt: int
    worker_id: str
    status: JobStatus
    attempt_outcome: AttemptOutcome
    # From the database clock at settlement; None keeps run_at as it is.
    delay_seconds: float | None = None
    # False: the claim's attempt is given back (snoozed, released, a deploy-window wait).
    counted: bool = True
    adds_snooze: bool = False
    failure_class: str = ""
    terminal_reason: str = ""
    error: str = ""
    traceback: str = ""
    result_json: str | None = None
    duration_ms: int | None = None
    # A handler's RateLimited: its key (None: the job's own) starts nothing for these seconds.
    push_back_key: str | None = None
    push_back_seconds: float | None = None
    # For log lines only.
    task: str = ""
    trace_id: str = ""

    @classmethod
    def succeeded(cls, job: Held, result_json: str, duration_ms: int) -> Outcome:
        """The handler returned; its result is stored with the job."""
        return cls(*_names(job), JobStatus.SUCCEEDED, AttemptOutcome.SUCCEEDED,
                   terminal_reason=TerminalReason.SUCCEEDED, result_json=result_json,
                   duration_ms=duration_ms, task=job.task, trace_id=job.trace_id)

    @classmethod
    def failed(
        cls, job: Held, failure_class: FailureClass, decision: Decision, *, error: str,
        traceback: str = "", duration_ms: int | None = None,
    ) -> Outcome:
        """The attempt failed; the retry policy's ``decision`` says retry or dead."""
        dead = decision.status == JobStatus.DEAD
        if failure_class in _TAKEN_OVER:
            attempt_outcome = _TAKEN_OVER[failure_class]
        else:
            attempt_outcome = AttemptOutcome.DEAD if dead else AttemptOutcome.FAILED
        return cls(*_names(job), decision.status, attempt_outcome,
                   delay_seconds=decision.delay_seconds, counted=decision.counts_attempt,
                   failure_class=failure_class.value, terminal_reason=decision.terminal_reason,
                   error=error, traceback=traceback, duration_ms=duration_ms, task=job.task,
                   trace_id=job.trace_id)

    @classmethod
    def dead(
        cls, job: Held, reason: TerminalReason, error: str, duration_ms: int | None = None
    ) -> Outcome:
        """The job cannot run again, through no failure of its handler (deadline, snooze limit)."""
        return cls(*_names(job), JobStatus.DEAD, AttemptOutcome.DEAD, terminal_reason=reason,
                   error=error, duration_ms=duration_ms, task=job.task, trace_id=job.trace_id)

    @classmethod
    def snoozed(cls, job: Held, seconds: float, duration_ms: int) -> Outcome:
        """The handler asked to run again after ``seconds``, without using an attempt."""
        status = JobStatus.SCHEDULED if seconds > 0 else JobStatus.READY
        return cls(*_names(job), status, AttemptOutcome.SNOOZED,
                   delay_seconds=seconds, counted=False, adds_snooze=True, duration_ms=duration_ms,
                   task=job.task, trace_id=job.trace_id)

    @classmethod
    def released(cls, job: Held, reason: str) -> Outcome:
        """Handed back unstarted: ready at once, the attempt not counted."""
        return cls(*_names(job), JobStatus.READY, AttemptOutcome.RELEASED, counted=False,
                   error=reason, task=job.task, trace_id=job.trace_id)

    @classmethod
    def cancelled(cls, job: Held, error: str) -> Outcome:
        """An operator asked the running job to stop: it ends cancelled, never retried."""
        return cls(*_names(job), JobStatus.CANCELLED, AttemptOutcome.CANCELLED,
                   terminal_reason=TerminalReason.OPERATOR, error=error, task=job.task,
                   trace_id=job.trace_id)

    def without_text(self) -> Outcome:
        """This outcome without the error, traceback and result that could not be stored."""
        return replace(self, error="the worker's report could not be stored", traceback="",
                       result_json=None)

    def problem(self) -> str | None:
        """Why ``settle`` must refuse this outcome, or None when it is a way out of RUNNING."""
        allowed = WAYS_OUT.get(self.attempt_outcome)
        if allowed is None or self.status not in allowed:
            return (f"job {self.job_id}: attempt outcome {self.attempt_outcome.value!r} cannot "
                    f"send a running job to {self.status.value!r}")
        return None


def _names(job: Held) -> tuple[int, uuid.UUID, int, str]:
    # The fields an Outcome starts with: which job, which lease, which attempt, whose.
    return job.id, job.lease_token, job.attempt, job.lease_owner


__all__ = ["WAYS_OUT", "Held", "Outcome"]
