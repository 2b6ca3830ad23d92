"""Procrastinate: enqueue (defer and batch_defer), preload, pickup."""

from __future__ import annotations

from typing import Any

from bench.clients.timing import AUTOCOMMIT, alternate, pickup_latencies
from bench.peers.procrastinate_app import app, noop
from bench.peers.procrastinate_app import pickup as pickup_task


def setup() -> dict[str, Any]:
    with app.open():
        app.schema_manager.apply_schema()
    return {}


def reset() -> dict[str, Any]:
    with app.open():
        app.connector.get_sync_connector().execute_query(
            "TRUNCATE procrastinate_jobs, procrastinate_events RESTART IDENTITY CASCADE"
        )
    return {}


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    def one_each(first: int, count: int) -> None:
        for i in range(first, first + count):
            noop.defer(n=i)

    with app.open():  # defer() commits on its own connection: there is no caller's transaction
        rates = alternate({"procrastinate" + AUTOCOMMIT: one_each}, n, rounds)
    reset()
    return rates


def enqueue_bulk(n: int, chunk: int = 1000, rounds: int = 4) -> dict[str, Any]:
    def batches(first: int, count: int) -> None:
        for start in range(first, first + count, chunk):
            noop.batch_defer(*({"n": i} for i in range(start, min(start + chunk, first + count))))

    with app.open():
        rates = alternate({"procrastinate": batches}, n, rounds)
    reset()
    return rates


def preload(n: int, chunk: int = 1000) -> dict[str, Any]:
    with app.open():
        for start in range(0, n, chunk):
            noop.batch_defer(*({"n": i} for i in range(start, min(start + chunk, n))))
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    with app.open():
        return pickup_latencies(lambda key, port: pickup_task.defer(n=key, port=port), samples)
