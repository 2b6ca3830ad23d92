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

from django_pgjobs import Limit, Rate, job
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


# --- lifecycle control: timeouts, cancellation, receipts past the lease ----------------------

# Long enough that only a timeout or a cancel can end these, not the lease.
LONG_LEASE = timedelta(seconds=60)


def _mark(ctx: JobContext, what: str) -> None:
    """Record that this attempt saw ``what`` (its cancel, its timeout): an Effect row."""
    Effect.objects.create(key=f"{what}:{ctx.job_id}:{ctx.attempt}", receipted=False,
                          job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)


def _forever(ctx: JobContext, task: str) -> None:
    # Blocking code that checks nothing: only a killed process stops it.
    _started(ctx, task)
    while True:
        time.sleep(0.05)


@job("chaos.forever", lease=LEASE, timeout=1.0, max_attempts=2)
def forever(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Loop forever in a thread: the worker settles it at its timeout and leaves the thread."""
    _forever(ctx, "chaos.forever")


@job("chaos.forever_process", lease=LEASE, timeout=1.0, max_attempts=2, isolation="process")
def forever_process(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Loop forever in a child process: the worker kills the child at the timeout."""
    _forever(ctx, "chaos.forever_process")


@job("chaos.late_after_timeout", lease=LONG_LEASE, timeout=1.0, max_attempts=1)
def late_after_timeout(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Notice the timeout, then return anyway: the late report must be recorded lost."""
    run = _started(ctx, "chaos.late_after_timeout")
    while not ctx.timed_out:
        time.sleep(0.02)
    _mark(ctx, "saw_timeout")
    _finished(run)
    return "finished late"


@job("chaos.until_cancelled", lease=LONG_LEASE, max_attempts=5)
def until_cancelled(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Work until an operator cancels it, then fail: the job must end cancelled, not retried."""
    run = _started(ctx, "chaos.until_cancelled")
    Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
    while not ctx.cancelled:
        time.sleep(0.02)
    _mark(ctx, "saw_cancel")
    raise RuntimeError("stopped after a cancel")


@job("chaos.cancel_heartbeat", lease=timedelta(seconds=3), heartbeat=True, max_attempts=5)
def cancel_heartbeat(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Heartbeat until the heartbeat raises: a cancel reaches it as ``Cancelled``."""
    from django_pgjobs import Cancelled

    run = _started(ctx, "chaos.cancel_heartbeat")
    Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
    try:
        while True:
            ctx.heartbeat()
            time.sleep(0.05)
    except Cancelled:
        _mark(ctx, "saw_cancel")
        raise


@job("chaos.cancel_process", lease=LONG_LEASE, max_attempts=5, isolation="process")
def cancel_process(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Block in a child process: a cancel kills the child."""
    run = _started(ctx, "chaos.cancel_process")
    Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
    while True:
        time.sleep(0.05)


@job("chaos.cancel_async", lease=LONG_LEASE, max_attempts=5)
async def cancel_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Await forever: a cancel cancels the task."""
    import asyncio

    from asgiref.sync import sync_to_async

    run = await sync_to_async(_started)(ctx, "chaos.cancel_async")
    await Run.objects.filter(pk=run.pk).aupdate(stage=Run.Stage.HOLDING)
    try:
        while True:
            await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        await sync_to_async(_mark)(ctx, "saw_cancel")
        raise


@job("chaos.receipt_hold", lease=LEASE, max_attempts=5)
def receipt_hold(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Perform the effect inside a receipt, then hold inside the block (on the first attempt)."""
    run = _started(ctx, "chaos.receipt_hold")
    holds = ctx.attempt == 1
    if holds:
        # Marked before the block: inside it nothing commits until the block ends.
        Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
    with ctx.receipt(RECEIPT_SCOPE, key=payload["key"]) as receipt:
        if receipt.done:
            _finished(run)
            return receipt.result
        Effect.objects.create(key=payload["key"], receipted=True, job_id=ctx.job_id,
                              attempt=ctx.attempt, worker_id=ctx.worker_id)
        if holds:
            time.sleep(payload.get("hold_seconds", 1.5))
        receipt.result = {"key": payload["key"], "attempt": ctx.attempt}
    _finished(run)
    return receipt.result


# --- a process-isolated handler whose worker is killed while it writes -----------------------


@job("chaos.process_effects", lease=timedelta(seconds=5), max_attempts=10, isolation="process")
def process_effects(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """In a child process, write ``count`` effects one after another (marked holding after the
    fifth, on the first attempt, so the harness can kill the worker mid-way)."""
    run = _started(ctx, "chaos.process_effects")
    for n in range(payload.get("count", 40)):
        Effect.objects.create(key=f"{payload['key']}:{ctx.attempt}:{n}", receipted=False,
                              job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id)
        if n == 4 and ctx.attempt == 1:
            Run.objects.filter(pk=run.pk).update(stage=Run.Stage.HOLDING)
        time.sleep(payload.get("every", 0.05))
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


# --- batches with jobs waiting behind the first, and schedules' jobs --------------------------

# Long enough that a job waiting behind the rest of its batch still has the lease to start.
BATCH_LEASE = timedelta(seconds=10)


@job("chaos.queued", lease=BATCH_LEASE, max_attempts=5)
def queued(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Work a while, checking for a cancel: the jobs claimed with it wait behind it meanwhile.

    Its ``Run`` row is its start: a job cancelled with no row was cancelled before it started.
    """
    run = _started(ctx, "chaos.queued")
    ends = time.monotonic() + payload.get("work_seconds", 0.5)
    while time.monotonic() < ends:
        if ctx.cancelled:
            _mark(ctx, "saw_cancel")
            raise RuntimeError("stopped after a cancel")
        time.sleep(0.02)
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@job("chaos.scheduled", lease=BATCH_LEASE, max_attempts=5)
def scheduled(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """A schedule's job: work ``work_seconds`` (longer than the tick interval shows overlaps)."""
    run = _started(ctx, "chaos.scheduled")
    time.sleep(payload.get("work_seconds", 0.05))
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@job("chaos.rated", lease=LEASE, max_attempts=10,
     limit=Rate(5, per=1, burst=2, key=lambda p: p["group"]))
def rated(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Work under a rate of five starts a second per group, two at once: the harness replays
    the rate over the recorded starts."""
    run = _started(ctx, "chaos.rated")
    time.sleep(payload.get("work_seconds", 0.0))
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}


@job("chaos.limited", lease=LEASE, max_attempts=10, limit=Limit(2, key=lambda p: p["group"]))
def limited(ctx: JobContext, payload: dict[str, Any]) -> Any:
    """Work under a limit of two per group: the harness checks no group ever ran three."""
    run = _started(ctx, "chaos.limited")
    time.sleep(payload.get("work_seconds", 0.0))
    _finished(run)
    return {"attempt": ctx.attempt, "worker": ctx.worker_id}
