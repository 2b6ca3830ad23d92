"""Chancy: migrate and declare the queue, enqueue (push and push_many), preload, pickup."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from bench.clients.timing import AUTOCOMMIT, alternate, pickup_latencies
from bench.peers.chancy_app import QUEUE, app, noop
from bench.peers.chancy_app import pickup as pickup_task

# The jobs of one drain, and the workers and the leader they leave behind (the queue stays).
TABLES = "chancy_jobs, chancy_workers, chancy_leader"


_loop = asyncio.new_event_loop()


def _run(work: Coroutine[Any, Any, Any]) -> Any:
    return _loop.run_until_complete(work)


def _with_app(work: Callable[[], Any]) -> Any:
    """Call ``work`` with the app's pool open (each coroutine in it goes through ``_run``)."""
    _run(app.__aenter__())
    try:
        return work()
    finally:
        _run(app.__aexit__(None, None, None))


def setup() -> dict[str, Any]:
    async def go() -> None:
        await app.migrate()  # its tables and its default plugins' (``chancy misc migrate``)
        await app.declare(QUEUE, upsert=True)

    _with_app(lambda: _run(go()))
    return {}


def reset() -> dict[str, Any]:
    async def go() -> None:
        async with app.pool.connection() as conn:
            await conn.execute(f"TRUNCATE {TABLES}")

    _with_app(lambda: _run(go()))
    return {}


async def _push_each(first: int, count: int) -> None:
    for i in range(first, first + count):
        await app.push(noop.job.with_kwargs(n=i))


async def _push_many(first: int, count: int, chunk: int) -> None:
    jobs = [noop.job.with_kwargs(n=i) for i in range(first, first + count)]
    async for _ in app.push_many(jobs, batch_size=chunk):
        pass


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    # push() commits on a connection of its pool: there is no caller's transaction around it.
    rates = _with_app(lambda: alternate(
        {"chancy" + AUTOCOMMIT: lambda first, count: _run(_push_each(first, count))},
        n, rounds))
    reset()
    return rates


def enqueue_bulk(n: int, chunk: int = 1000, rounds: int = 4) -> dict[str, Any]:
    # push_many() commits each chunk of ``batch_size`` jobs in a transaction of its own.
    rates = _with_app(lambda: alternate(
        {"chancy": lambda first, count: _run(_push_many(first, count, chunk))}, n, rounds))
    reset()
    return rates


def preload(n: int, chunk: int = 1000) -> dict[str, Any]:
    _with_app(lambda: _run(_push_many(0, n, chunk)))
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    def probe(key: int, port: int) -> None:
        _run(app.push(pickup_task.job.with_kwargs(n=key, port=port)))

    return _with_app(lambda: pickup_latencies(probe, samples))
