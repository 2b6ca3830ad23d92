"""django-pgjobs handlers for the benchmark (discovered like any app's ``jobs`` module)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from django_pgjobs import Limit, Rate, job
from django_pgjobs.context import JobContext

from .probe import report_start


@job("bench.noop")
def noop(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Do nothing: the benchmark measures the queue, not the work."""


@job("bench.pickup")
def pickup(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Report the moment this handler started."""
    report_start(payload["n"], payload["port"])


@job("bench.await_io")
async def await_io(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Wait on simulated I/O the way async code does: the event loop runs others meanwhile."""
    await asyncio.sleep(payload["seconds"])


@job("bench.block_io")
def block_io(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Wait on simulated I/O the way blocking code does: the thread is held for the wait."""
    time.sleep(payload["seconds"])


# --- lifecycle controls: handlers that run until a cancel reaches them ----------------------

LONG = timedelta(minutes=5)


@job("bench.cancel.poll", lease=LONG, max_attempts=3)
def cancel_poll(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A thread handler that checks ``ctx.cancelled`` between steps of work."""
    while not ctx.cancelled:
        time.sleep(0.01)


@job("bench.cancel.heartbeat", lease=timedelta(seconds=30), heartbeat=True, max_attempts=3)
def cancel_heartbeat(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A thread handler that only heartbeats: the cancel reaches it as ``Cancelled``."""
    while True:
        ctx.heartbeat()
        time.sleep(0.01)


@job("bench.cancel.process", lease=LONG, max_attempts=3, isolation="process")
def cancel_process(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A blocking handler in a child process, which checks nothing: the worker kills it."""
    while True:
        time.sleep(0.01)


@job("bench.cancel.async", lease=LONG, max_attempts=3)
async def cancel_async(ctx: JobContext, payload: dict[str, Any]) -> None:
    """An async handler awaiting for ever: the cancel cancels its task."""
    while True:
        await asyncio.sleep(0.01)


# --- limits (bench/limits.py) ------------------------------------------------------------------


@job("bench.limited", limit=Limit(2, key=lambda p: p["key"]))
def limited(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Do nothing, at most two at once per key."""


@job("bench.hot", limit=Limit(1, key=lambda p: p["key"]))
def hot(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Do nothing, one at a time per key."""


@job("bench.rated_fast", limit=Rate(100, per=1, burst=10, key=lambda p: p["key"]))
def rated_fast(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Do nothing, at most 100 starts a second per key (10 at once after a pause)."""


@job("bench.rated_slow", limit=Rate(5, per=1, key=lambda p: p["key"]))
def rated_slow(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Do nothing, at most 5 starts a second per key, evenly spaced."""
