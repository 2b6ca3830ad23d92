"""PgQueuer: a worker process with the same no-op and pickup entrypoints (asyncpg driver).

``python -m bench.peers.pgqueuer_worker --dsn ... --batch-size N [--burst]``; --burst runs
PgQueuer's drain mode, which exits once the queue is empty.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from datetime import timedelta

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
from pgqueuer.types import QueueExecutionMode

from bench.probe import report_start


async def run_worker(dsn: str, batch_size: int, burst: bool) -> None:
    connection = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(connection)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        """Do nothing."""

    @qm.entrypoint("pickup")
    async def pickup(job: Job) -> None:
        """Report the moment this job started."""
        assert job.payload is not None
        payload = json.loads(job.payload)
        report_start(payload["n"], payload["port"])

    await qm.run(
        batch_size=batch_size,
        mode=QueueExecutionMode.drain if burst else QueueExecutionMode.continuous,
        dequeue_timeout=timedelta(seconds=1 if burst else 30),
    )
    await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    asyncio.run(run_worker(args.dsn, args.batch_size, args.burst))


if __name__ == "__main__":
    main()
