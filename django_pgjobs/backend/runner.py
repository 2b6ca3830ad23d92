"""The worker's side of a task: the handler that runs a ``Task`` and redacts its arguments."""

from __future__ import annotations

import inspect
import logging
import re
import traceback
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.dispatch import Signal
from django.utils import timezone
from django.utils.connection import ConnectionDoesNotExist

from ..conf import settings
from ..exceptions import EnqueueError, Snooze
from ..redaction import Redactor
from ..registry import Handler, redactor_for
from ..retry import (
    Decision,
    Verdict,
    backoff_replaceable,
    classify,
    decide,
    with_decision,
    with_verdict,
)
from ..status import JobStatus
from ..validation import DURATION_MAX_SECONDS, number_problem, shown
from .compat import (
    BaseTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from .names import find_task, task_name
from .options import backoff_of, pgjobs_options
from .results import load_result

if TYPE_CHECKING:
    # Annotations only: this module is imported when a @task is declared, maybe before Django
    # has loaded the models that the context's module needs.
    from ..context import JobContext

logger = logging.getLogger("django_pgjobs.backend")


class TaskFailed(Exception):
    """What Django's ``task_finished`` receiver logs for a failed task: the scrubbed error.

    Django logs the exception being handled when the signal is sent; sending it while this one
    is handled (rather than the task's own, whose message and frames may quote secrets) keeps
    the log line as redacted as the stored error.
    """


def resolve_handler(name: str, may_import: bool = True) -> Handler | None:
    """The handler that runs the django.tasks task ``name`` names, or None if it is not one."""
    task = find_task(name, may_import)
    if task is None:
        return None
    backend = _backend(task.backend)
    options = pgjobs_options(backend)
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

    try:
        return task_backends[alias]
    except (ConnectionDoesNotExist, KeyError, LookupError):
        return None


def _runner(task: Task) -> Any:
    """The job handler that runs ``task``: a coroutine function when the task's function is one,
    so the worker runs it on its event loop like any async handler, not one per thread."""
    if inspect.iscoroutinefunction(task.func):
        return _async_runner(task)

    def run(ctx: JobContext, payload: Any) -> Any:
        run_ = _TaskRun(task, ctx, payload)
        running = run_.started()
        try:
            value = _normalized(task.call(*run_.arguments(running), **running.kwargs))
        except BaseException as exc:
            run_.failed(running, exc)
            raise  # the worker classifies the task's own exception (retry or dead)
        return run_.finished(running, value)

    return _named(run, task)


def _async_runner(task: Task) -> Any:
    async def run(ctx: JobContext, payload: Any) -> Any:
        run_ = _TaskRun(task, ctx, payload)
        # Loading the result and sending Django's signals are the ORM's and receivers' sync
        # code: they run in a thread, the task itself on the loop.
        running = await sync_to_async(run_.started)()
        try:
            value = _normalized(await task.acall(*run_.arguments(running), **running.kwargs))
        except BaseException as exc:
            await sync_to_async(run_.failed)(running, exc)
            raise
        return await sync_to_async(run_.finished)(running, value)

    return _named(run, task)


def _named(run: Any, task: Task) -> Any:
    run.__name__ = run.__qualname__ = task.name
    run.__module__ = task.func.__module__
    return run


class _TaskRun:
    """One run of a task: its result as Django sees it, and the signals around it."""

    def __init__(self, task: Task, ctx: JobContext, payload: Any) -> None:
        self.task, self.ctx, self.payload = task, ctx, payload
        self.alias = str(payload.get("backend") or task.backend)
        self.backend = _backend(self.alias)
        # The alias the job was enqueued through may be gone from TASKS since.
        self.sender = type(self.backend) if self.backend is not None else BaseTaskBackend

    def started(self) -> TaskResult:
        running = load_result(str(self.ctx.job_id), default_backend=self.alias,
                              using=self.ctx.using)
        send_robust(task_started, self.sender, running)
        return running

    def arguments(self, running: TaskResult) -> list[Any]:
        if self.task.takes_context:
            return [TaskContext(task_result=running), *running.args]
        return list(running.args)

    def failed(self, running: TaskResult, exc: BaseException) -> None:
        if isinstance(exc, Snooze):
            return  # not a failure: the job waits and runs again, its attempt given back
        scrub = redactor_for(self.ctx.job.task)
        failed = replace(
            running, status=TaskResultStatus.FAILED, finished_at=timezone.now(),
            errors=[*running.errors, TaskError(
                exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                traceback=scrub.text("".join(traceback.format_exception(exc)), self.payload),
            )],
        )
        summary = scrub.text(f"{type(exc).__qualname__}: {exc}", self.payload)
        _apply_backoff(exc, failed, self.ctx, self.backend)
        decision = _decision(exc, self.ctx)
        if decision.status is JobStatus.RETRYING:
            # Not finished: get_result() reads READY until the next attempt, so Django's
            # task_finished (and its ERROR log) waits for the attempt that ends the job.
            job = self.ctx.job
            logger.warning(
                "task %s (result %s) failed attempt %d of %d and will run again at about %s: %s",
                failed.task.name, failed.id, job.attempt, job.max_attempts,
                (job.database_now() + timedelta(seconds=decision.delay_seconds or 0.0)).isoformat(
                    timespec="milliseconds"), summary,
            )
            return
        try:
            raise TaskFailed(summary) from None
        except TaskFailed:
            send_robust(task_finished, self.sender, failed)

    def finished(self, running: TaskResult, value: Any) -> Any:
        finished = replace(running, status=TaskResultStatus.SUCCESSFUL,
                           finished_at=timezone.now())
        object.__setattr__(finished, "_return_value", value)
        send_robust(task_finished, self.sender, finished)
        return value


def _normalized(value: Any) -> Any:
    """The return value as Django normalises it; what Django cannot is the task's failure."""
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as exc:
        # Recorded as the exception normalize_json raised, with its traceback, as Django's own
        # backends record it. The task already ran; running it again would return the same.
        with_verdict(exc, Verdict(permanent=True))
        raise


def _decision(exc: BaseException, ctx: JobContext) -> Decision:
    """What the worker will do after this failure: retry (when) or end the job.

    Decided once, here: the decision is attached to the exception and the worker records it as
    it is, so the job ends exactly when this run sent ``task_finished``. A task's handler has no
    retry_on or permanent_on of its own.
    """
    failure_class, hint = classify(exc)
    job = ctx.job
    decision = decide(failure_class, attempts=job.attempt, max_attempts=job.max_attempts,
                      created_at=job.created_at, deadline=job.deadline, now=job.database_now(),
                      hint_seconds=hint)
    with_decision(exc, decision)
    return decision


def _apply_backoff(
    exc: BaseException, failed: TaskResult, ctx: JobContext, backend: BaseTaskBackend | None
) -> None:
    """Let OPTIONS["backoff"] choose the wait after a failure the policy would back off from.

    ``backoff(exception, task_result)`` gets the result as this run left it (FAILED, the new
    error appended) and returns seconds to wait, or None to stop retrying. It is not asked
    when the attempts are used up, nor for failures that say their own wait (``RetryAfter``)
    or are permanent.
    """
    backoff = backoff_of(pgjobs_options(backend))
    if backoff is None or ctx.job.attempt >= ctx.job.max_attempts:
        return
    if not backoff_replaceable(classify(exc)[0]):
        return
    try:
        seconds = backoff(exc, failed)
    except Exception:  # a broken backoff must not change how the task failed
        logger.exception("OPTIONS['backoff'] of backend %r raised for task result %s; the "
                         "default backoff applies", failed.backend, failed.id)
        return
    if seconds is None:
        with_verdict(exc, Verdict(permanent=True))
        return
    problem = number_problem(seconds, 0, DURATION_MAX_SECONDS)
    if problem is not None:
        logger.error("OPTIONS['backoff'] of backend %r returned %s for task result %s: it %s; "
                     "the default backoff applies", failed.backend, shown(seconds), failed.id,
                     problem)
        return
    with_verdict(exc, Verdict(retry_in=float(seconds)))


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
