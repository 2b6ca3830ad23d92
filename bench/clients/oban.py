"""Oban for Python: install, enqueue (enqueue and enqueue_many), preload, pickup.

Oban needs Python 3.12 or newer: ``bench.measure`` runs this module with the Oban virtualenv's
interpreter (``OBAN`` in bench/systems.py), never in the runner's process. The client is an Oban
instance with no queues (Oban's client mode: it enqueues, it runs nothing) on a pool made with
Oban's defaults (``Oban.create_pool``), on uvloop's event loop, as Oban's own commands run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Coroutine
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import uvloop
from oban import Oban

from bench.clients.timing import AUTOCOMMIT, alternate, pickup_latencies
from bench.peers.oban_app import noop
from bench.peers.oban_app import pickup as pickup_job

# The jobs of one drain, and the producers and the leader its workers leave behind.
TABLES = "oban_jobs, oban_producers, oban_leaders"
# Oban's own command-line entry point, installed beside this interpreter.
CLI = str(Path(sys.executable).parent / "oban")

_loop = uvloop.new_event_loop()


def _run(work: Coroutine[Any, Any, Any]) -> Any:
    return _loop.run_until_complete(work)


def _dsn() -> str:
    return os.environ["BENCH_DATABASE_URL"]


class _Client:
    """An Oban instance in client mode with its pool open, for the ``with`` block."""

    def __enter__(self) -> Oban:
        self.pool = _run(Oban.create_pool(_dsn()))
        return Oban(pool=self.pool)

    def __exit__(self, *exc: object) -> None:
        _run(self.pool.close())


def setup() -> dict[str, Any]:
    # Oban's documented install: its CLI creates the tables, types and indexes.
    subprocess.run([CLI, "install", "--dsn", _dsn()], check=True, capture_output=True)
    return {}


def reset() -> dict[str, Any]:
    with psycopg.connect(_dsn(), autocommit=True) as conn:
        conn.execute(f"TRUNCATE {TABLES} RESTART IDENTITY".encode())
    return {}


def versions() -> dict[str, Any]:
    return {"oban": metadata.version("oban"), "python": platform.python_version()}


async def _enqueue_each(oban: Oban, first: int, count: int) -> None:
    for i in range(first, first + count):
        await oban.enqueue(noop.new(n=i))


async def _enqueue_many(oban: Oban, first: int, count: int, chunk: int) -> None:
    for start in range(first, first + count, chunk):
        await oban.enqueue_many(noop.new(n=i) for i in range(start, min(start + chunk,
                                                                          first + count)))


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    # enqueue() takes a connection of the pool and commits before it returns: there is no
    # caller's transaction around it.
    with _Client() as oban:
        rates = alternate(
            {"oban" + AUTOCOMMIT: lambda first, count: _run(_enqueue_each(oban, first, count))},
            n, rounds)
    reset()
    return rates


def enqueue_bulk(n: int, chunk: int = 1000, rounds: int = 4) -> dict[str, Any]:
    # enqueue_many() inserts its jobs on one connection of the pool and commits them together.
    with _Client() as oban:
        rates = alternate(
            {"oban": lambda first, count: _run(_enqueue_many(oban, first, count, chunk))},
            n, rounds)
    reset()
    return rates


def preload(n: int, chunk: int = 1000) -> dict[str, Any]:
    with _Client() as oban:
        _run(_enqueue_many(oban, 0, n, chunk))
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    with _Client() as oban:
        return pickup_latencies(
            lambda key, port: _run(oban.enqueue(pickup_job.new(n=key, port=port))), samples)
