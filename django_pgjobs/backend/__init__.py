"""A ``django.tasks`` backend over django-pgjobs.

``TASKS = {"default": {"BACKEND": "django_pgjobs.backend.PgJobsBackend"}}``. Enqueueing a
``@task`` inserts a job named ``django.tasks:<module path>`` in the caller's transaction, its
arguments as the payload. A worker resolves that name to the task function on first use
(``registry.resolve``), so a ``@task`` runs under ``pgjobs_worker`` unchanged, with leases,
retries, the admin and the metrics of any other job. ``get_result`` reads the job and its
attempts back with Django's meanings. Works with Django 6's ``django.tasks`` and with the
``django-tasks`` backport on Django 5.2.

``options`` holds what OPTIONS may say, ``results`` reads results back, ``runner`` is the
worker's side (the handler of a task), ``names`` maps tasks to job names, ``compat`` picks
Django's task API.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections

from ..exceptions import InvalidJobOption
from ..registry import DJANGO_TASK_PREFIX, registry
from ..validation import TASK_NAME
from .compat import (
    BaseTaskBackend,
    Task,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .names import task_name
from .options import InvalidTaskOption, job_options, option_problems, task_queue_problem
from .results import load_result
from .runner import TaskFailed, TaskHandler, resolve_handler, send_robust


class PgJobsBackend(BaseTaskBackend):
    """Tasks as django-pgjobs jobs: durable, same-transaction enqueue, leases and retries."""

    is_pgjobs_backend = True  # its OPTIONS are django-pgjobs' (options.pgjobs_options)
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
        problem = task_queue_problem(task.queue_name)
        if problem:
            raise InvalidTaskOption(problem)

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert the task as a job in the caller's transaction and return its result."""
        # Not at module level: Django builds backends when @task modules are imported, which
        # may be before the models enqueue writes are loaded.
        from ..enqueuing import check_nesting, enqueue

        self.validate_task(task)
        # normalize_json recurses: an argument nested past the payload's depth limit is refused
        # first, by that limit, instead of escaping as a RecursionError.
        check_nesting({"args": args, "kwargs": kwargs})
        args, kwargs = normalize_json(args), normalize_json(kwargs)
        # The task's module is imported (we hold the Task): nothing new is imported here.
        handler = registry.resolve(task_name(task), may_import=False)
        if handler is None:
            raise InvalidTaskOption(
                f"Task {task.module_path!r} cannot be imported by its module path, so no "
                "worker could run it."
            )
        payload: dict[str, Any] = {"args": args, "kwargs": kwargs, "backend": self.alias}
        if task.run_after is not None:
            # The job's run_at moves with retries and snoozes; get_result() gives the task back
            # as it was enqueued, run_after included.
            payload["run_after"] = task.run_after.isoformat()
        try:
            job = enqueue(
                handler, payload,
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
        return job_options(self.options, queue)

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
            queue_problem = task_queue_problem(queue)
            if queue_problem:
                messages.append(
                    checks.Error(f"{where} QUEUES: {queue_problem}", id="pgjobs.E104")
                )
        return messages


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
