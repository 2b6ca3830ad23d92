"""Helpers for testing code that enqueues jobs, and for running those jobs in a test.

``enqueued_jobs``, ``assert_enqueued`` and ``refute_enqueued`` read the jobs waiting to run
(scheduled, ready or retrying) on the test's own connection, so they see what the code under test
enqueued in the test's transaction. ``drain`` runs due jobs in the calling thread through the
path a worker takes (``transitions.claim_jobs``, ``executor.execute``, ``transitions.settle``),
one job at a time, until nothing is due; it works inside Django's ``TestCase`` (the test's
transaction) and ``TransactionTestCase`` alike. Timeouts end attempts as a worker ends them, and
outside the test's transaction a process-isolated handler runs in a child process.
docs/testing.md shows them in use; the pytest plugin (``django_pgjobs.pytest_plugin``) hands
them out as the ``pgjobs`` fixture.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone
from psycopg import pq

from .claimed import ClaimedJob
from .context import JobContext
from .exceptions import PayloadInvalid
from .executor import broke_around, execute, timed_out
from .models import Job
from .outcomes import Outcome
from .registry import DJANGO_TASK_PREFIX, Handler, redactor_for, registry
from .status import WAITING_STATUSES, AttemptOutcome, JobStatus
from .transitions import claim_jobs, promote_jobs_due_by, ready_queues, settle
from .validation import queue_problem, seconds_of, shown, whole_number_problem
from .worker.isolation import ChildProcess

# The worker id drain claims under, as attempts and leases record it.
WORKER_ID = "pgjobs-testing"
# drain() without max_jobs stops with an error after this many jobs while more are due: a job
# that enqueues itself forever would otherwise never let the test end.
DRAIN_LIMIT = 10_000
# How far a job's run_at (or its delay) may be from the expected one and still match.
TIME_TOLERANCE = timedelta(seconds=1)
PROMOTE_BATCH = 1000
_SHOWN_JOBS = 20


class _Any:
    """Matches any value (in a payload: the key must be there)."""

    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
_UNSET: Any = object()

# Options matched against a column of the job as it is: name -> Job attribute.
_COLUMNS = {
    "queue": "queue",
    "priority": "base_priority",  # as enqueued: aging raises ``priority`` while a job waits
    "max_attempts": "max_attempts",
    "attempts": "attempts",
    "idempotency_key": "idempotency_key",
    "trace_id": "trace_id",
    "fairness_key": "fairness_key",
    "payload_version": "payload_version",
    "status": "status",
}
MATCH_OPTIONS = frozenset({*_COLUMNS, "payload", "args", "kwargs", "run_at", "delay"})


# --- what was enqueued -------------------------------------------------------------------------


def enqueued_jobs(task: Any = None, *, using: str = DEFAULT_DB_ALIAS, **match: Any) -> list[Job]:
    """The jobs waiting to run (scheduled, ready, retrying) that match, oldest first.

    ``task`` is a task name, a ``@django_pgjobs.job`` handler or a django.tasks ``@task`` (None:
    any task). ``match`` takes the options ``assert_enqueued`` takes.
    """
    name = None if task is None else task_name(task)
    checks = _checks(match)
    return [job for job in _waiting(name, using) if _mismatch(checks, job) is None]


def assert_enqueued(task: Any = None, *, using: str = DEFAULT_DB_ALIAS, **match: Any) -> Job:
    """Assert that a waiting job of ``task`` matches; return the oldest one that does.

    ``payload`` matches partially and recursively: only the keys it gives are compared, nested
    mappings the same way, lists element by element, and ``ANY`` matches any value. ``args``
    and ``kwargs`` do the same for a django.tasks task's arguments. ``run_at`` (an aware
    datetime) and ``delay`` (seconds or a timedelta after enqueue) match within a second;
    ``queue``, ``priority`` (as enqueued), ``max_attempts``, ``attempts``, ``idempotency_key``,
    ``trace_id``, ``fairness_key``, ``payload_version`` and ``status`` must be equal.
    When none matches, the AssertionError lists the jobs of that task that are waiting, and
    what differs in each.
    """
    name = None if task is None else task_name(task)
    checks = _checks(match)
    candidates = _waiting(name, using)
    for job in candidates:
        if _mismatch(checks, job) is None:
            return job
    raise AssertionError(_not_found(name, match, checks, candidates, using))


def refute_enqueued(task: Any = None, *, using: str = DEFAULT_DB_ALIAS, **match: Any) -> None:
    """Assert that no waiting job of ``task`` matches (with no options: none of ``task`` at all)."""
    found = enqueued_jobs(task, using=using, **match)
    if found:
        name = None if task is None else task_name(task)
        wanted = _described(match)
        lines = [f"Expected no enqueued job of {_task_label(name)}{wanted}, found {len(found)}:"]
        lines += [f"  {_job_line(job, redactor_for(job.task).payload(job.payload))}"
                  for job in found[:_SHOWN_JOBS]]
        if len(found) > _SHOWN_JOBS:
            lines.append(f"  ... and {len(found) - _SHOWN_JOBS} more")
        raise AssertionError("\n".join(lines))


def task_name(task: Any) -> str:
    """The job name of ``task``: a name as it is, a handler's name, a django.tasks task's."""
    if isinstance(task, str):
        return task
    if isinstance(task, Handler):
        return task.name
    module_path = getattr(task, "module_path", None)
    if isinstance(module_path, str) and callable(getattr(task, "enqueue", None)):
        return DJANGO_TASK_PREFIX + module_path  # a django.tasks Task, named as the backend does
    raise TypeError(
        f"task must be a task name, a @django_pgjobs.job handler or a django.tasks task, "
        f"not {type(task).__name__}"
    )


def _waiting(name: str | None, using: str) -> list[Job]:
    jobs = Job.objects.using(using).filter(status__in=WAITING_STATUSES)
    if name is not None:
        jobs = jobs.filter(task=name)
    return list(jobs.order_by("id"))


Check = tuple[str, Any]


def _checks(match: Mapping[str, Any]) -> list[Check]:
    """The options as (name, expected) pairs, refused by name when they cannot mean anything."""
    unknown = sorted(set(match) - MATCH_OPTIONS)
    if unknown:
        raise TypeError(f"unknown match option(s) {', '.join(unknown)} (known: "
                        f"{', '.join(sorted(MATCH_OPTIONS))})")
    status = match.get("status")
    if status is not None and status is not ANY and status not in WAITING_STATUSES:
        raise ValueError(f"status must be one of {', '.join(WAITING_STATUSES)} (an enqueued job "
                         f"waits to run), got {shown(status)}")
    run_at = match.get("run_at")
    if isinstance(run_at, datetime) and timezone.is_naive(run_at):
        raise ValueError("run_at is a naive datetime; give an aware one")
    delay = match.get("delay")
    if delay is not None and delay is not ANY and seconds_of(delay) is None:
        raise ValueError(f"delay must be seconds or a timedelta, got {shown(delay)}")
    return list(match.items())


def _mismatch(checks: list[Check], job: Job, shown_payload: Any = _UNSET) -> str | None:
    """What about ``job`` differs from the checks (the first difference), or None.

    Values are compared in the payload, and quoted from ``shown_payload`` (its redacted copy,
    for a failure message) when given.
    """
    if shown_payload is _UNSET:
        shown_payload = job.payload
    for option, expected in checks:
        if option == "payload":
            problem = _differs(_as_stored(job, expected), _plain(job), "payload", shown_payload)
        elif option in ("args", "kwargs"):
            payload = job.payload if isinstance(job.payload, dict) else {}
            if option not in payload:
                return f"the payload has no {option} (not a django.tasks task)"
            problem = _differs(expected, payload[option], option,
                               _part(shown_payload, option))
        elif option == "run_at":
            problem = _time_differs("run_at", expected, job.run_at)
        elif option == "delay":
            problem = _delay_differs(expected, job.run_at - job.created_at)
        else:
            problem = _differs(expected, getattr(job, _COLUMNS[option]), option)
        if problem is not None:
            return problem
    return None


def _as_stored(job: Job, expected: Any) -> Any:
    """``expected`` as the job's row would hold it: a typed payload's JSON form."""
    handler = registry.resolve(job.task, may_import=False)
    if handler is None or handler.payload_type is None or isinstance(
            expected, dict | list | str | int | float | bool | None):
        return expected  # JSON already (or matchers in it, like ANY)
    try:
        return handler.payload_type.dump(expected)
    except PayloadInvalid:
        return expected  # differs, and the message quotes it as given


def _plain(job: Job) -> Any:
    handler = registry.resolve(job.task, may_import=False)
    return job.payload if handler is None else handler.readable_payload(job.payload)


def _differs(expected: Any, actual: Any, path: str, display: Any = _UNSET) -> str | None:
    """Where ``actual`` differs from ``expected``; ``display`` is what to quote for ``actual``."""
    if display is _UNSET:
        display = actual
    if expected is ANY:
        return None
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path} is {shown(display)}, expected a mapping"
        for key, value in expected.items():
            if key not in actual:
                return f"{path} has no key {key!r}"
            problem = _differs(value, actual[key], f"{path}[{key!r}]", _part(display, key))
            if problem is not None:
                return problem
        return None
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return f"{path} is {shown(display, 80)}, expected {shown(list(expected), 80)}"
        for index, (want, have) in enumerate(zip(expected, actual, strict=True)):
            problem = _differs(want, have, f"{path}[{index}]", _part(display, index))
            if problem is not None:
                return problem
        return None
    # JSON keeps true and 1 apart; Python's == does not.
    same_kind = isinstance(expected, bool) == isinstance(actual, bool)
    if same_kind and expected == actual:
        return None
    return f"{path} is {shown(display)}, expected {shown(expected)}"


def _part(display: Any, key: Any) -> Any:
    """The part of a displayed value at ``key``: a redacted value hides all its parts."""
    if isinstance(display, Mapping) and key in display:
        return display[key]
    if isinstance(display, list) and isinstance(key, int) and 0 <= key < len(display):
        return display[key]
    return display


def _time_differs(option: str, expected: Any, actual: datetime) -> str | None:
    if expected is ANY or (isinstance(expected, datetime)
                           and abs(actual - expected) <= TIME_TOLERANCE):
        return None
    return f"{option} is {actual.isoformat()}, expected {shown(expected, 60)}"


def _delay_differs(expected: Any, actual: timedelta) -> str | None:
    if expected is ANY:
        return None
    seconds = seconds_of(expected) or 0.0
    if abs(actual - timedelta(seconds=seconds)) <= TIME_TOLERANCE:
        return None
    return f"delay is {actual.total_seconds():g}s, expected {seconds:g}s"


def _not_found(
    name: str | None, match: Mapping[str, Any], checks: list[Check], candidates: list[Job],
    using: str,
) -> str:
    lines = [f"Expected an enqueued job of {_task_label(name)}{_described(match)}."]
    if candidates:
        lines.append(f"Enqueued jobs of {_task_label(name)} ({len(candidates)}):")
        for job in candidates[:_SHOWN_JOBS]:
            # Test output lands in CI logs: a job's payload is quoted redacted, as the admin
            # shows it to viewers.
            shown_payload = redactor_for(job.task).payload(job.payload)
            lines.append(f"  {_job_line(job, shown_payload)}\n"
                         f"    differs: {_mismatch(checks, job, shown_payload)}")
        if len(candidates) > _SHOWN_JOBS:
            lines.append(f"  ... and {len(candidates) - _SHOWN_JOBS} more")
        return "\n".join(lines)
    others = Counter(
        Job.objects.using(using).filter(status__in=WAITING_STATUSES).values_list("task", flat=True)
    )
    if name is not None and registry.resolve(name, may_import=False) is None:
        lines.append(f"No handler is registered under the name {name!r}.")
    if others:
        listed = ", ".join(f"{task!r} ({count})" for task, count in sorted(others.items()))
        lines.append(f"None of that task is enqueued; enqueued: {listed}.")
    else:
        lines.append("Nothing is enqueued.")
    return "\n".join(lines)


def _task_label(name: str | None) -> str:
    return "any task" if name is None else f"task {name!r}"


def _described(match: Mapping[str, Any]) -> str:
    if not match:
        return ""
    return " with " + ", ".join(f"{key}={shown(value, 80)}" for key, value in match.items())


def _job_line(job: Job, shown_payload: Any) -> str:
    return (f"job {job.pk}: task={job.task!r} queue={job.queue!r} priority={job.base_priority} "
            f"status={job.status} run_at={job.run_at.isoformat()} "
            f"payload={shown(shown_payload, 200)}")


# --- running due jobs ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRun:
    """One attempt that ``drain`` ran, as it was settled."""

    job_id: int
    task: str
    attempt: int
    outcome: str  # the attempt's outcome (AttemptOutcome): succeeded, failed, dead, snoozed, ...
    status: str  # the job's status after it (JobStatus): succeeded, retrying, dead, ...
    result: Any  # what the handler returned (as stored, decoded JSON) when it succeeded
    error: str
    failure_class: str
    traceback: str

    @property
    def succeeded(self) -> bool:
        return self.outcome == AttemptOutcome.SUCCEEDED


class Drained(list[JobRun]):
    """The attempts one ``drain`` ran, in the order it ran them."""

    @property
    def outcomes(self) -> dict[str, int]:
        """How many attempts ended in each outcome."""
        return dict(Counter(str(run.outcome) for run in self))

    def of(self, task: Any) -> list[JobRun]:
        """The attempts of ``task`` (a name, a handler or a django.tasks task)."""
        name = task_name(task)
        return [run for run in self if run.task == name]


class JobFailed(AssertionError):
    """``drain(raise_errors=True)`` ran a job whose attempt failed."""

    def __init__(self, run: JobRun) -> None:
        super().__init__(
            f"job {run.job_id} ({run.task}) attempt {run.attempt} ended {run.outcome} "
            f"({run.failure_class or 'no failure class'}), job now {run.status}: {run.error}"
            + (f"\n{run.traceback}" if run.traceback else "")
        )
        self.run = run


def drain(
    queues: str | Iterable[str] | None = None,
    *,
    max_jobs: int | None = None,
    now: datetime | None = None,
    raise_errors: bool = False,
    using: str = DEFAULT_DB_ALIAS,
) -> Drained:
    """Run due jobs here, one at a time, until none is due; return what each attempt did.

    A job is due when it is ready, or scheduled or retrying with ``run_at`` at or before ``now``
    (default: ``django.utils.timezone.now()`` when drain starts, which time-machine and
    freezegun move). Jobs that jobs enqueue run too, and so do retries and snoozes that are due
    by ``now``: a retry whose backoff ends after it waits, however short the backoff, so what
    one drain runs does not depend on how fast it ran. ``now`` decides only which jobs are due:
    leases, deadlines and the times recorded come from the database clock, as in a worker.

    ``queues``: only these (default: every queue, in name order). ``max_jobs``: stop after
    that many attempts; without it, more than ``DRAIN_LIMIT`` is an error. ``raise_errors``:
    raise ``JobFailed`` for the first attempt that fails, once it is settled.
    """
    queue_list = _queue_list(queues)
    if max_jobs is not None:
        problem = whole_number_problem(max_jobs, 1, 10 * DRAIN_LIMIT)
        if problem is not None:
            raise ValueError(f"max_jobs {problem}")
    if now is not None and (not isinstance(now, datetime) or timezone.is_naive(now)):
        raise ValueError(f"now must be an aware datetime, got {shown(now)}")
    if using not in connections:
        raise ValueError(f"using must name a database in DATABASES, got {shown(using)}")
    limit = DRAIN_LIMIT if max_jobs is None else max_jobs
    # Read once: a clock read again on every pass would make a retry with a short backoff run
    # in this drain or not, by chance.
    when = timezone.now() if now is None else now
    runs = Drained()
    while True:
        _promote(when, queue_list, using)
        if len(runs) >= limit:
            if max_jobs is None and _ready(queue_list, using):
                raise AssertionError(
                    f"drain ran {DRAIN_LIMIT} jobs and more are due (a job that enqueues itself, "
                    "or snoozes for 0 seconds?); pass max_jobs to run a bounded number"
                )
            return runs
        job = _claim_next(queue_list, using)
        if job is None:
            return runs
        run = _run(job, using)
        runs.append(run)
        if raise_errors and run.outcome in (AttemptOutcome.FAILED, AttemptOutcome.DEAD):
            raise JobFailed(run)


def _queue_list(queues: str | Iterable[str] | None) -> list[str] | None:
    if queues is None:
        return None
    if isinstance(queues, str):
        listed = [queues]
    elif isinstance(queues, Iterable) and not isinstance(queues, bytes | bytearray | Mapping):
        listed = list(queues)
    else:
        raise ValueError(f"queues must be a queue name or a list of them, got {shown(queues)}")
    for queue in listed:
        problem = queue_problem(queue)
        if problem is not None:
            raise ValueError(f"queue {problem}")
    return sorted(set(listed))


def _promote(when: datetime, queues: list[str] | None, using: str) -> None:
    promoted = PROMOTE_BATCH
    while promoted == PROMOTE_BATCH:  # a full batch: there may be more
        promoted = len(promote_jobs_due_by(when, PROMOTE_BATCH, queues=queues, using=using))


def _ready(queues: list[str] | None, using: str) -> list[str]:
    """The queues drain serves that have ready jobs, in name order."""
    ready = sorted(ready_queues(using=using))
    return ready if queues is None else [queue for queue in ready if queue in queues]


def _claim_next(queues: list[str] | None, using: str) -> ClaimedJob | None:
    for queue in _ready(queues, using):
        claimed = claim_jobs(WORKER_ID, queue, 1, using=using)
        if claimed:
            return claimed[0]
    return None


def _run(job: ClaimedJob, using: str) -> JobRun:
    connection = connections[using]
    handler = registry.resolve(job.task)
    if (handler is not None and handler.isolation == "process"
            and not connection.in_atomic_block):
        outcome = _run_in_child(job, using)
    else:
        outcome = _run_here(job, using, connection)
    applied = settle([outcome], using=using)[outcome.lease_token]
    return JobRun(
        job_id=job.id, task=job.task, attempt=job.attempt,
        outcome=outcome.attempt_outcome if applied else AttemptOutcome.LOST,
        status=outcome.status if applied else JobStatus(
            Job.objects.using(using).values_list("status", flat=True).get(pk=job.id)),
        result=None if outcome.result_json is None else json.loads(outcome.result_json),
        error=outcome.error, failure_class=outcome.failure_class, traceback=outcome.traceback,
    )


def _run_here(job: ClaimedJob, using: str, connection: BaseDatabaseWrapper) -> Outcome:
    """Run ``job``'s handler in this thread; past its timeout, the outcome a worker records."""
    ctx = JobContext(job, worker_id=WORKER_ID, using=using)
    # In the test's transaction a handler's failed statement would abort everything after it
    # (outside one, as in a worker, it fails alone): run the attempt in a savepoint, and roll
    # back to it only when the handler left the transaction aborted. None outside a transaction.
    savepoint = connection.savepoint() if connection.in_atomic_block else None
    started = time.monotonic()
    outcome = execute(job, ctx)
    ran = time.monotonic() - started
    if savepoint is not None:
        if _aborted(connection):
            connection.savepoint_rollback(savepoint)
        else:
            connection.savepoint_commit(savepoint)
    if job.timeout_seconds is not None and ran >= job.timeout_seconds:
        # A worker settles the job at its timeout, whatever the handler reports later.
        return timed_out(job, ran_seconds=ran)
    return outcome


def _run_in_child(job: ClaimedJob, using: str) -> Outcome:
    """Run a process-isolated ``job`` in a child process, killed at its timeout, as a worker
    does. Only outside a transaction: a child cannot see what the test's transaction wrote."""
    child = ChildProcess(worker_id=WORKER_ID, using=using)
    killed = threading.Event()
    timers: list[threading.Timer] = []
    started: list[float] = []

    def kill() -> None:
        killed.set()
        child.kill(job)

    def start() -> None:
        # The timeout counts from the handler's start, not from the child's start-up.
        started.append(time.monotonic())
        if job.timeout_seconds is not None:
            timers.append(threading.Timer(job.timeout_seconds, kill))
            timers[0].start()

    try:
        outcome = child.run(job, started=start)
    finally:
        for timer in timers:
            timer.cancel()
        child.close()
    if outcome is not None:
        return outcome
    if killed.is_set():
        return timed_out(job, ran_seconds=time.monotonic() - started[0])
    # A worker would leave the job to its lease and the rescue step: here it fails at once.
    return broke_around(job, ChildProcessError("the child process running the job died"))


def _aborted(connection: BaseDatabaseWrapper) -> bool:
    raw = connection.connection
    return raw is not None and raw.info.transaction_status == pq.TransactionStatus.INERROR


# --- the helpers as one object (the pytest fixture) ---------------------------------------------


class Helpers:
    """This module's helpers bound to one database: what the ``pgjobs`` fixture gives a test."""

    ANY = ANY

    def __init__(self, using: str = DEFAULT_DB_ALIAS) -> None:
        self.using = using

    def enqueued_jobs(self, task: Any = None, **match: Any) -> list[Job]:
        return enqueued_jobs(task, using=self.using, **match)

    def assert_enqueued(self, task: Any = None, **match: Any) -> Job:
        return assert_enqueued(task, using=self.using, **match)

    def refute_enqueued(self, task: Any = None, **match: Any) -> None:
        refute_enqueued(task, using=self.using, **match)

    def drain(
        self, queues: str | Iterable[str] | None = None, *, max_jobs: int | None = None,
        now: datetime | None = None, raise_errors: bool = False,
    ) -> Drained:
        return drain(queues, max_jobs=max_jobs, now=now, raise_errors=raise_errors,
                     using=self.using)


__all__ = [
    "ANY",
    "DRAIN_LIMIT",
    "Drained",
    "Helpers",
    "JobFailed",
    "JobRun",
    "assert_enqueued",
    "drain",
    "enqueued_jobs",
    "refute_enqueued",
    "task_name",
]
