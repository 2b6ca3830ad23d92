"""Procrastinate: the app, the same no-op and pickup tasks, and a worker entry point.

Run a worker with ``python -m bench.peers.procrastinate_app --dsn ... --concurrency N
[--burst]``; with --burst it exits once the queue is empty (procrastinate's ``wait=False``).
"""

from __future__ import annotations

import argparse
import logging
import os

import procrastinate

from bench.probe import report_start

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_PROCRASTINATE_DSN", "")
    )
)


@app.task(name="noop")
def noop(n: int) -> None:
    """Do nothing."""


@app.task(name="pickup")
def pickup(n: int, port: int) -> None:
    """Report the moment this task started."""
    report_start(n, port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--burst", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    app.run_worker(concurrency=args.concurrency, wait=not args.burst)


if __name__ == "__main__":
    main()
