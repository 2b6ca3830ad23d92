"""A task's result read back from its job and attempts, with Django's meanings."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections

from .. import sql
from ..registry import DJANGO_TASK_PREFIX
from ..status import AttemptOutcome, FailureClass, JobStatus
from .compat import (
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)
from .names import find_task

_STATUS = {
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.THROTTLED: TaskResultStatus.READY,  # waiting for its limit key's free slot
    JobStatus.PENDING: TaskResultStatus.READY,  # waiting for the jobs it depends on
    JobStatus.READY: TaskResultStatus.READY,
    JobStatus.RETRYING: TaskResultStatus.READY,  # "ready to be executed again"
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.DEAD: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,  # django.tasks has no cancelled status
}
_FAILED_OUTCOMES = {AttemptOutcome.FAILED, AttemptOutcome.DEAD, AttemptOutcome.LEASE_EXPIRED}
_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*$")
_MAX_RESULT_ID = 2**63 - 1


class _JobRow(NamedTuple):
    id: int
    task: str
    status: str
    queue: str
    base_priority: int
    payload: Any
    result: Any
    created_at: datetime
    finished_at: datetime | None


class _AttemptRow(NamedTuple):
    worker_id: str
    claimed_at: datetime
    outcome: str
    reported_outcome: str
    failure_class: str
    error: str
    traceback: str


def load_result(result_id: str, *, default_backend: str, using: str) -> TaskResult:
    """Read a task's job and attempts back as a ``TaskResult``."""
    job_id = _job_id(result_id)
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("task_result"), [job_id, DJANGO_TASK_PREFIX])
        rows = cursor.fetchall()
    if not rows:
        raise TaskResultDoesNotExist(result_id)
    job = _JobRow(*rows[0][:9])
    attempts = [_AttemptRow(*row[9:]) for row in rows if row[9] is not None]
    return _to_result(job, attempts, default_backend)


def _job_id(result_id: Any) -> int:
    try:
        job_id = int(str(result_id), 10)
    except ValueError:
        raise TaskResultDoesNotExist(result_id) from None
    if not 0 < job_id <= _MAX_RESULT_ID or str(job_id) != str(result_id):
        raise TaskResultDoesNotExist(result_id)
    return job_id


def _to_result(job: _JobRow, attempts: list[_AttemptRow], default_backend: str) -> TaskResult:
    task = find_task(job.task, may_import=True)
    if task is None:
        raise TaskResultDoesNotExist(
            f"{job.id}: task {job.task[len(DJANGO_TASK_PREFIX):]!r} can no longer be imported"
        )
    payload = _json(job.payload)
    payload = payload if isinstance(payload, dict) else {}
    backend = str(payload.get("backend") or default_backend)
    task = _as_enqueued(task, priority=job.base_priority, queue_name=job.queue, backend=backend,
                        run_after=_run_after(payload.get("run_after")))
    ran = [a for a in attempts if _ran(a)]
    status = _STATUS[JobStatus(job.status)]
    result: TaskResult[..., Any] = TaskResult(
        task=task, id=str(job.id), status=status, enqueued_at=job.created_at,
        started_at=ran[0].claimed_at if ran else None,
        finished_at=job.finished_at if status in _FINISHED else None,
        last_attempted_at=ran[-1].claimed_at if ran else None,
        args=list(payload.get("args", [])), kwargs=dict(payload.get("kwargs", {})),
        backend=backend, errors=[_task_error(a) for a in ran if _failed(a)],
        worker_ids=[a.worker_id for a in ran],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", _json(job.result))
    return result


def _ran(attempt: _AttemptRow) -> bool:
    """Whether the attempt ran the task, as Django counts runs (``attempts``, ``worker_ids``).

    Not an attempt handed back unstarted (a worker stopping), nor one by a worker that could
    not import the task or read its payload's version (a rolling deploy): neither ran it, and
    the job's own attempt counter gives both back.
    """
    return (attempt.outcome != AttemptOutcome.RELEASED
            and attempt.failure_class not in _DEPLOY_WINDOW_CLASSES)


_DEPLOY_WINDOW_CLASSES = {FailureClass.UNKNOWN_TASK, FailureClass.UNSUPPORTED_VERSION}


def _run_after(value: Any) -> datetime | None:
    # Written by the backend's enqueue as an ISO 8601 text with its offset.
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def _json(text: str | None) -> Any:
    # The query casts jsonb to text, so a stored JSON string and a decoded one cannot be confused.
    return None if text is None else json.loads(text)


_FINISHED = {TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED}


def _as_enqueued(task: Task, **fields: Any) -> Task:
    changed = {k: v for k, v in fields.items() if getattr(task, k) != v}
    if not changed:
        return task
    try:
        return replace(task, **changed)
    except InvalidTask:
        # The settings changed since the job was enqueued; the task as declared still names it.
        return task


def _failed(attempt: _AttemptRow) -> bool:
    return attempt.outcome in _FAILED_OUTCOMES or (
        attempt.outcome == AttemptOutcome.LOST
        and attempt.reported_outcome in (AttemptOutcome.FAILED, AttemptOutcome.DEAD)
    )


def _task_error(attempt: _AttemptRow) -> TaskError:
    return TaskError(exception_class_path=_exception_path(attempt),
                     traceback=attempt.traceback or attempt.error)


def _exception_path(attempt: _AttemptRow) -> str:
    # The executor writes errors as "module.Class: message" ("Class: message" for builtins).
    head = attempt.error.split(":", 1)[0].strip()
    if attempt.traceback and _CLASS_PATH.match(head):
        return head if "." in head else f"builtins.{head}"
    if attempt.failure_class == "lease_expired":
        return "django_pgjobs.exceptions.LeaseLost"
    return "django_pgjobs.exceptions.PgJobsError"
