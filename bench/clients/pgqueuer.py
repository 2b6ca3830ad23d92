"""PgQueuer (asyncpg driver): enqueue (single and list), preload, pickup."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Queries

from bench.clients.timing import AUTOCOMMIT, pickup_latencies


def _dsn() -> str:
    return os.environ["BENCH_DATABASE_URL"]


async def _queries() -> tuple[asyncpg.Connection, Queries]:
    connection = await asyncpg.connect(_dsn())
    return connection, Queries(AsyncpgDriver(connection))


def _payload(i: int) -> bytes:
    return json.dumps({"n": i}).encode()


def setup() -> dict[str, Any]:
    async def go() -> None:
        connection, queries = await _queries()
        await queries.install()
        await connection.close()

    asyncio.run(go())
    return {}


def reset() -> dict[str, Any]:
    async def go() -> None:
        connection = await asyncpg.connect(_dsn())
        await connection.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        await connection.close()

    asyncio.run(go())
    return {}


async def _timed(n: int, rounds: int, chunk: int | None) -> float:
    connection, queries = await _queries()
    spent = 0.0
    per_round = max(1, n // rounds)
    for r in range(rounds):
        first = r * per_round
        start = time.perf_counter()
        if chunk is None:
            for i in range(first, first + per_round):
                await queries.enqueue("noop", _payload(i))
        else:
            for s in range(first, first + per_round, chunk):
                ids = range(s, min(s + chunk, first + per_round))
                await queries.enqueue(["noop"] * len(ids), [_payload(i) for i in ids],
                                      [0] * len(ids))
        spent += time.perf_counter() - start
    await connection.close()
    return per_round * rounds / spent


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    rate = asyncio.run(_timed(n, rounds, None))
    reset()
    return {"pgqueuer" + AUTOCOMMIT: rate}  # each enqueue() is its own statement, in autocommit


def enqueue_bulk(n: int, chunk: int = 1000, rounds: int = 4) -> dict[str, Any]:
    rate = asyncio.run(_timed(n, rounds, chunk))
    reset()
    return {"pgqueuer": rate}


def preload(n: int, chunk: int = 1000) -> dict[str, Any]:
    asyncio.run(_timed(n, 1, chunk))
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    connection, queries = loop.run_until_complete(_queries())

    def probe(key: int, port: int) -> None:
        payload = json.dumps({"n": key, "port": port}).encode()
        loop.run_until_complete(queries.enqueue("pickup", payload))

    try:
        return pickup_latencies(probe, samples)
    finally:
        loop.run_until_complete(connection.close())
        loop.close()
