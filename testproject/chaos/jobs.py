"""Handlers of the failure harness's workload, and handlers that misbehave on purpose.

Every handler records its run in the ``Run`` ledger and its side effect in ``Effect``. A payload
can ask a handler to hold still at a named point on one attempt (``hold``, ``hold_attempt``,
``hold_seconds``): the run's stage says "holding", so the harness knows when to kill, stop or
disconnect the worker running it. Holds are shorter than the lease, so a missed fault shows up as
a job that simply succeeded on its first attempt.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

from django.db.models.functions import Now

from django_pgjobs import job
from django_pgjobs.context import JobContext

from .models import Effect, Run

# Short leases, so that faults are detected and recovered from within seconds.
LEASE = timedelta(seconds=2)
RECEIPT_SCOPE = "chaos-effect"


def _started(ctx: JobContext, task: str) -> Run:
    return Run.objects.create(
        job_id=ctx.job_id, attempt=ctx.attempt, lease_token=ctx.job.lease_token, task=task,
        worker_id=ctx.worker_id, pid=os.getpid(),
    )


def _finished(run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(stage=Run.Stage.FINISHED, finished_at=Now())


def _hold(ctx: JobContext, run: Run, payload: dict[str, Any], point: str) -> None:
    if payload.get("hold") != point or ctx.attempt != payload.get("hold_attempt", 1):
        return
    Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
    time.sleep(payload.get("hold_seconds", 1.5))


def _effect(ctx: JobContext, key: str, *, receipted: bool) -> Any:
    if not receipted:
        Effect.objects.create(
            key=key, receipted=False, job_id=ctx.job_id, attempt=ctx.attempt,
            worker_id=ctx.worker_id,
        )
        return {"key": key, "attempt": ctx.attempt}
    with ctx.receipt(RECEIPT_SCOPE, key=key) as receipt:
        if receipt.done:
            return receipt.result
        Effect.objects.create(
            key=key, receipted=True, job_id=ctx.job_id, attempt=ctx.attempt,
            worker_id=ctx.worker_id,
        )
        receipt.result = {"key": key, "attempt": ctx.attempt}
    return receipt.result


def _perform(ctx: JobContext, payload: dict[str, Any], task: str, *, receipted: bool) -> Any:
    run = _started(ctx, task)
    _hold(ctx, run, payload, "before_effect")
    time.sleep(payload.get("work_seconds", 0.0))
    effect = _effect(ctx, payload["key"], receipted=receipted)
    _hold(ctx, run, payload, "after_effect")
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id, "effect": effect}


@job("chaos.plain_effect", lease=LEASE, max_attempts=10)
def plain_effect(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Perform an effect with no receipt: a retry after the effect repeats it."""
    return _perform(ctx, payload, "chaos.plain_effect", receipted=False)


@job("chaos.receipted_effect", lease=LEASE, max_attempts=10)
def receipted_effect(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Perform an effect under an idempotency receipt: it happens once however often it runs."""
    return _perform(ctx, payload, "chaos.receipted_effect", receipted=True)


@job("chaos.tick", lease=LEASE, max_attempts=10)
def tick(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Do a little work with no side effect (floods, ordinary jobs, jobs for later)."""
    run = _started(ctx, "chaos.tick")
    time.sleep(payload.get("work_seconds", 0.0))
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@job("chaos.poison", lease=LEASE, max_attempts=3)
def poison(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Kill the worker process that runs it, every time."""
    _started(ctx, "chaos.poison")
    os.kill(os.getpid(), signal.SIGKILL)


# --- handlers that misbehave: each must get a recorded outcome and leave the worker working ---


@job("chaos.not_json", lease=LEASE, max_attempts=2)
def not_json(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Return a value that JSON cannot encode."""
    _started(ctx, "chaos.not_json")
    return {"at": object()}


@job("chaos.too_deep", lease=LEASE, max_attempts=2)
def too_deep(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Return a value nested too deeply for the JSON encoder."""
    _started(ctx, "chaos.too_deep")
    value: list[Any] = []
    for _ in range(payload.get("depth", 100_000)):
        value = [value]
    return value


@job("chaos.nul_result", lease=LEASE, max_attempts=2)
def nul_result(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Return valid JSON that PostgreSQL's jsonb refuses (a NUL character)."""
    _started(ctx, "chaos.nul_result")
    return {"text": "before\x00after"}


@job("chaos.nul_error", lease=LEASE, max_attempts=2)
def nul_error(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Raise an error whose message PostgreSQL's text type refuses (a NUL character)."""
    _started(ctx, "chaos.nul_error")
    raise ValueError("bad byte: \x00")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot describe itself")


@job("chaos.unprintable", lease=LEASE, max_attempts=2)
def unprintable(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Raise an exception whose ``str()`` raises."""
    _started(ctx, "chaos.unprintable")
    raise _Unprintable


@job("chaos.system_exit", lease=LEASE, max_attempts=2)
def system_exit(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Call ``sys.exit`` from a handler."""
    _started(ctx, "chaos.system_exit")
    raise SystemExit(3)


@job("chaos.keyboard_interrupt", lease=LEASE, max_attempts=2)
def keyboard_interrupt(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Raise KeyboardInterrupt from a handler."""
    _started(ctx, "chaos.keyboard_interrupt")
    raise KeyboardInterrupt


@job("chaos.hang", lease=timedelta(seconds=1), max_attempts=3)
def hang(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """On the first attempt, run far past the lease without heartbeats; later attempts return."""
    run = _started(ctx, "chaos.hang")
    if ctx.attempt == 1:
        time.sleep(payload.get("hang_seconds", 30.0))
    _finished(run)
    return {"attempt": ctx.attempt}
