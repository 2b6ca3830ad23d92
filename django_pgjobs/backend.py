"""A ``django.tasks`` backend over django-pgjobs.

``TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}``. Enqueueing a
``@task`` inserts a job named ``django.tasks:<module path>`` in the caller's transaction, its
arguments as the payload. A worker resolves that name to the task function on first use
(``registry.resolve``), so a ``@task`` runs under ``pgjobs_worker`` unchanged, with leases, retries,
the admin and the metrics of any other job. ``get_result`` reads the job and its attempts back
with Django's meanings. Works with Django 6's ``django.tasks`` and with the ``django-tasks``
backport on Django 5.2.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
import sys
import traceback
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections
from django.dispatch import Signal
from django.utils import timezone
from django.utils.module_loading import import_string

from . import sql
from .conf import settings
from .exceptions import EnqueueError, InvalidJobOption, Permanent
from .redaction import Redactor
from .registry import DJANGO_TASK_PREFIX, Handler, redactor_for, registry
from .status import AttemptOutcome, JobStatus
from .validation import TASK_NAME, queue_problem

if TYPE_CHECKING:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    from .context import JobContext
else:
    try:
        from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json
    except ImportError:  # Django < 6: the django-tasks backport has the same API
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

logger = logging.getLogger("django_pgjobs.backend")

# OPTIONS keys that set the job options of every task the backend enqueues; OPTIONS["queues"]
# maps a queue name to the same keys for that queue only.
JOB_OPTIONS = ("max_attempts", "lease_seconds", "max_age_seconds")
BACKEND_OPTIONS = (*JOB_OPTIONS, "database", "heartbeat", "queues")

_STATUS = {
    JobStatus.SCHEDULED: TaskResultStatus.READY,
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


class InvalidTaskOption(InvalidTask, InvalidJobOption):
    """A task refused by django-pgjobs' rules: Django's ``InvalidTask`` and our ``EnqueueError``."""


class PgJobsBackend(BaseTaskBackend):
    """Tasks as django-pgjobs jobs: durable, same-transaction enqueue, leases and retries."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Called when a @task module is imported: nothing here may touch the database.
        super().__init__(alias, params)
        self.using = str(self.options.get("database", DEFAULT_DB_ALIAS))

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        name = task_name(task)
        if TASK_NAME.fullmatch(name) is None:
            raise InvalidTaskOption(
                f"Task module path {task.module_path!r} is too long for a job name "
                f"(at most {200 - len(DJANGO_TASK_PREFIX)} characters)."
            )
        problem = _queue_problem(task.queue_name)
        if problem:
            raise InvalidTaskOption(problem)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task as a job in the caller's transaction and return its result."""
        from .enqueuing import enqueue

        self.validate_task(task)
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        # The task's module is imported (we hold the Task): nothing new is imported here.
        handler = registry.resolve(task_name(task), may_import=False)
        if handler is None:
            raise InvalidTaskOption(
                f"Task {task.module_path!r} cannot be imported by its module path, so no "
                "worker could run it."
            )
        try:
            job = enqueue(
                handler, {"args": args, "kwargs": kwargs, "backend": self.alias},
                queue=task.queue_name, priority=task.priority, run_at=task.run_after,
                using=self.using, **self.job_options(task.queue_name),
            )
        except InvalidJobOption as exc:
            raise InvalidTaskOption(str(exc)) from exc
        result: TaskResult[..., Any] = TaskResult(
            task=task, id=str(job.pk), status=TaskResultStatus.READY,
            enqueued_at=job.created_at, started_at=None, finished_at=None,
            last_attempted_at=None, args=args, kwargs=kwargs, backend=self.alias, errors=[],
            worker_ids=[],
        )
        send_robust(task_enqueued, type(self), result)
        return result

    async def aenqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id."""
        return load_result(result_id, default_backend=self.alias, using=self.using)

    async def aget_result(self, result_id: str) -> TaskResult:
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    def job_options(self, queue: str) -> dict[str, Any]:
        """The enqueue options OPTIONS gives tasks of ``queue`` (its own entry wins)."""
        merged = {k: self.options[k] for k in JOB_OPTIONS if k in self.options}
        merged.update(dict(self.options.get("queues", {})).get(queue, {}))
        options: dict[str, Any] = {}
        if "max_attempts" in merged:
            options["max_attempts"] = merged["max_attempts"]
        if "lease_seconds" in merged:
            options["lease"] = timedelta(seconds=merged["lease_seconds"])
        if "max_age_seconds" in merged:
            options["max_age"] = timedelta(seconds=merged["max_age_seconds"])
        return options

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = list(super().check(**kwargs))
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("django_pgjobs"):
            messages.append(checks.Error(
                f"{where} uses PgJobsBackend, but django_pgjobs is not in INSTALLED_APPS.",
                hint="Add 'django_pgjobs' to INSTALLED_APPS.", id="pgjobs.E101",
            ))
        if self.using not in connections:
            messages.append(checks.Error(
                f"{where} OPTIONS['database'] names an unknown database {self.using!r}.",
                id="pgjobs.E102",
            ))
        elif connections[self.using].vendor != "postgresql":
            messages.append(checks.Error(
                f"{where} stores tasks in database {self.using!r}, which uses "
                f"{connections[self.using].vendor}; PgJobsBackend needs PostgreSQL.",
                id="pgjobs.E102",
            ))
        for problem in option_problems(self.options):
            messages.append(checks.Error(f"{where} {problem}", id="pgjobs.E103"))
        for queue in sorted(self.queues):
            queue_problem = _queue_problem(queue)
            if queue_problem:
                messages.append(
                    checks.Error(f"{where} QUEUES: {queue_problem}", id="pgjobs.E104")
                )
        return messages


def task_name(task: Task) -> str:
    """The job name a task is enqueued under."""
    return DJANGO_TASK_PREFIX + task.module_path


def option_problems(options: dict[str, Any]) -> list[str]:
    """What is wrong with a PgJobsBackend OPTIONS dict, one sentence each."""
    problems = [f"OPTIONS has an unknown key {key!r} (known: {', '.join(BACKEND_OPTIONS)})."
                for key in options if key not in BACKEND_OPTIONS]
    if not isinstance(options.get("heartbeat", False), bool):
        problems.append("OPTIONS['heartbeat'] must be True or False.")
    if not isinstance(options.get("database", DEFAULT_DB_ALIAS), str):
        problems.append("OPTIONS['database'] must be a database alias.")
    queues = options.get("queues", {})
    if not isinstance(queues, dict):
        return [*problems, "OPTIONS['queues'] must map queue names to options."]
    for where, values in [("OPTIONS", options), *((f"OPTIONS['queues'][{q!r}]", v)
                                                   for q, v in queues.items())]:
        if not isinstance(values, dict):
            problems.append(f"{where} must be a dict.")
            continue
        if values is not options:
            problems += [f"{where} has an unknown key {key!r} (known: {', '.join(JOB_OPTIONS)})."
                         for key in values if key not in JOB_OPTIONS]
        for key in JOB_OPTIONS:
            value = values.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or value < 1 or (key == "max_attempts"
                                                       and not isinstance(value, int))):
                problems.append(f"{where}[{key!r}] must be a number >= 1"
                                + (" (a whole number)." if key == "max_attempts" else "."))
    return problems


def _queue_problem(queue: str) -> str | None:
    problem = queue_problem(queue)
    if problem is not None:
        return f"Queue {queue!r} is not valid for backend: the queue {problem}."
    declared = settings.QUEUES
    if declared is not None and queue not in declared:
        return f"Queue {queue!r} is not valid for backend: PGJOBS_QUEUES does not declare it."
    return None


# --- results ---------------------------------------------------------------------------------


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
    task = _find_task(job.task, may_import=True)
    if task is None:
        raise TaskResultDoesNotExist(
            f"{job.id}: task {job.task[len(DJANGO_TASK_PREFIX):]!r} can no longer be imported"
        )
    payload = _json(job.payload)
    payload = payload if isinstance(payload, dict) else {}
    backend = str(payload.get("backend") or default_backend)
    task = _as_enqueued(task, priority=job.base_priority, queue_name=job.queue, backend=backend)
    # An attempt handed back unstarted (worker stopping) never ran the task.
    ran = [a for a in attempts if a.outcome != AttemptOutcome.RELEASED]
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


# --- the worker side -------------------------------------------------------------------------


class TaskFailed(Exception):
    """What Django's ``task_finished`` receiver logs for a failed task: the scrubbed error.

    Django logs the exception being handled when the signal is sent; sending it while this one
    is handled (rather than the task's own, whose message and frames may quote secrets) keeps
    the log line as redacted as the stored error.
    """


def _find_task(name: str, may_import: bool) -> Task | None:
    """The ``Task`` that job name ``name`` names; import its module only if ``may_import``."""
    if not name.startswith(DJANGO_TASK_PREFIX):
        return None
    path = name[len(DJANGO_TASK_PREFIX):]
    module_path, _, attribute = path.rpartition(".")
    if may_import:
        try:
            task = import_string(path)
        except ImportError:
            return None
    else:
        module = sys.modules.get(module_path)
        task = getattr(module, attribute, None) if module is not None else None
    return task if isinstance(task, Task) else None


def resolve_handler(name: str, may_import: bool = True) -> Handler | None:
    """The handler that runs the django.tasks task ``name`` names, or None if it is not one."""
    task = _find_task(name, may_import)
    if task is None:
        return None
    backend = _backend(task.backend)
    options = backend.options if isinstance(backend, PgJobsBackend) else {}
    heartbeat = options.get("heartbeat") is True
    lease = timedelta(seconds=options.get("lease_seconds", settings.LEASE_SECONDS))
    try:
        return TaskHandler(task, heartbeat=heartbeat, lease=lease if heartbeat else None)
    except EnqueueError:
        return None


class TaskHandler(Handler):
    """The handler of a django.tasks ``Task``: runs it and redacts its arguments by name.

    A task's payload is ``{"args": [...], "kwargs": {...}}``. Keyword arguments are hidden by
    the key rule like any mapping key; a positional argument is hidden when the parameter it
    binds to has a secret name, and ``@django_pgjobs.redact(...)`` paths name parameters.
    """

    def __init__(self, task: Task, **options: Any) -> None:
        super().__init__(_runner(task), name=task_name(task), **options)
        parameters = list(inspect.signature(task.func).parameters.values())
        if task.takes_context:
            parameters = parameters[1:]  # the context is not among the enqueued arguments
        self.positional = tuple(p.name for p in parameters if p.kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        self.var_positional = next(
            (p.name for p in parameters if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
        self.declared = tuple(getattr(task.func, "pgjobs_redact", ()))
        self.redact_paths_for = self.argument_paths

    def argument_paths(self, payload: Any, keys: tuple[str, ...]) -> list[str]:
        """The paths that hide the secret arguments of this payload."""
        if not isinstance(payload, dict) or not isinstance(payload.get("args"), list):
            return []
        count = len(payload["args"])
        names = Redactor(keys)
        paths = [f"args[{i}]" for i, name in enumerate(self.positional[:count])
                 if names.is_secret(name)]
        if self.var_positional is not None and names.is_secret(self.var_positional):
            paths += [f"args[{i}]" for i in range(len(self.positional), count)]
        for path in self.declared:
            paths.append(f"kwargs.{path}")
            head, rest = re.match(r"([^.\[]*)(.*)", path).groups()  # type: ignore[union-attr]
            if head in self.positional:
                paths.append(f"args[{self.positional.index(head)}]{rest}")
        return paths


def _backend(alias: str) -> BaseTaskBackend | None:
    from django.utils.connection import ConnectionDoesNotExist

    try:
        return task_backends[alias]
    except (ConnectionDoesNotExist, KeyError, LookupError):
        return None


def _runner(task: Task) -> Any:
    def run(ctx: JobContext, payload: Any) -> Any:
        alias = str(payload.get("backend") or task.backend)
        backend = _backend(alias)
        sender = type(backend) if backend is not None else PgJobsBackend
        running = load_result(str(ctx.job_id), default_backend=alias, using=ctx.using)
        send_robust(task_started, sender, running)
        try:
            if task.takes_context:
                value = task.call(TaskContext(task_result=running), *running.args,
                                  **running.kwargs)
            else:
                value = task.call(*running.args, **running.kwargs)
            try:
                value = normalize_json(value)
            except (TypeError, ValueError) as exc:
                # The task already ran; a retry would return the same thing.
                raise Permanent(f"task returned a value that is not JSON: {exc}") from exc
        except BaseException as exc:
            scrub = redactor_for(ctx.job.task)
            failed = replace(
                running, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
                errors=[*running.errors, TaskError(
                    exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                    traceback=scrub.text("".join(traceback.format_exception(exc)), payload),
                )],
            )
            summary = scrub.text(f"{type(exc).__qualname__}: {exc}", payload)
            try:
                raise TaskFailed(summary) from None
            except TaskFailed:
                send_robust(task_finished, sender, failed)
            # The worker classifies the task's own exception (retry or dead), as for any job.
            raise
        finished = replace(running, status=TaskResultStatus.SUCCESSFUL,
                           finished_at=timezone.now())
        object.__setattr__(finished, "_return_value", value)
        send_robust(task_finished, sender, finished)
        return value

    run.__name__ = run.__qualname__ = task.name
    run.__module__ = task.func.__module__
    return run


def send_robust(signal: Signal, sender: type, result: TaskResult) -> None:
    """Send ``signal``; a receiver that raises is logged and cannot change the task's outcome."""
    for receiver, response in signal.send_robust(sender=sender, task_result=result):
        if isinstance(response, Exception):
            logger.error("receiver %r of %s failed for task result %s", receiver,
                         _signal_name(signal), result.id, exc_info=response)


def _signal_name(signal: Signal) -> str:
    names = {id(task_enqueued): "task_enqueued", id(task_started): "task_started",
             id(task_finished): "task_finished"}
    return names.get(id(signal), "signal")


registry.add_resolver(DJANGO_TASK_PREFIX, resolve_handler)

__all__ = [
    "InvalidTaskOption",
    "PgJobsBackend",
    "TaskFailed",
    "TaskHandler",
    "load_result",
    "option_problems",
    "resolve_handler",
    "task_name",
]
