"""django-pgjobs handlers for the benchmark (discovered like any app's ``jobs`` module)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from django_pgjobs import job
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
