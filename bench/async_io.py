"""One worker process drains jobs that wait on I/O: async handlers next to thread handlers.

``python -m bench.async_io [--jobs 2000] [--seconds 0.1] [--repeats 1]``

Each job waits ``--seconds`` (100 ms) of simulated I/O: ``asyncio.sleep`` in an ``async def``
handler, ``time.sleep`` in a plain one. One ``pgjobs_worker`` process drains them, with async
handlers run on its event loop at several ``--async-concurrency`` values, and plain handlers on
several executor-thread counts. Prints the wall time of the whole drain (start-up included),
the rate between 5% and 95% done, and the worker's CPU per job and peak RSS. The floor is
jobs x seconds / concurrency: the time the waits take if nothing else costs anything.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench import harness
from bench.systems import PGJOBS

DATABASE = "bench_async"
# (label, task, worker flags, jobs waiting at once): one worker process each. An executor thread
# runs its claimed batch one job after another, so thread variants claim one job at a time (a
# batch of 50 would leave most of 100 threads idle on 2,000 jobs); the async executor hands each
# job of its batch to the loop at once.
ASYNC, THREADS = ["--batch-size", "50"], ["--batch-size", "1"]
VARIANTS = [
    ("async, --async-concurrency 50 (default)", "bench.await_io",
     [*ASYNC, "--async-concurrency", "50"], 50),
    ("async, --async-concurrency 200", "bench.await_io", [*ASYNC, "--async-concurrency", "200"],
     200),
    ("async, --async-concurrency 500", "bench.await_io", [*ASYNC, "--async-concurrency", "500"],
     500),
    ("threads, --concurrency 8", "bench.block_io", [*THREADS, "--concurrency", "8"],
     8),
    ("threads, --concurrency 50", "bench.block_io", [*THREADS, "--concurrency", "50"], 50),
    ("threads, --concurrency 100 (the most)", "bench.block_io",
     [*THREADS, "--concurrency", "100"], 100),
]


def run(jobs: int, seconds: float, repeats: int) -> list[dict[str, Any]]:
    harness.recreate_database(DATABASE)
    harness.manage(DATABASE, "migrate", "--verbosity", "0")
    log = harness.ROOT / "bench" / "results" / "logs" / "async-io.log"
    rows = []
    for label, task, flags, width in VARIANTS:
        for repeat in range(repeats):
            command = [harness.PYTHON, harness.MANAGE, "pgjobs_worker", "--burst",
                       "--log-level", "WARNING", *flags]
            harness.measure("pgjobs", "reset", DATABASE)
            harness.measure("pgjobs", "preload", DATABASE, n=jobs, task=task,
                            payload={"seconds": seconds})
            print(f"[{repeat + 1}/{repeats}] {label}: {jobs} jobs x {seconds * 1000:g} ms",
                  flush=True)
            drained = harness.drain(DATABASE, PGJOBS.remaining_sql, jobs, [command], log,
                                    timeout=600)
            rows.append({"variant": label, "floor_s": jobs * seconds / width,
                         **drained.as_dict()})
    harness.measure("pgjobs", "reset", DATABASE)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    rows = run(args.jobs, args.seconds, args.repeats)
    print()
    print(f"{'one worker process':42} {'wall s':>8} {'floor s':>8} {'jobs/s':>8} "
          f"{'CPU us/job':>11} {'RSS MB':>7} {'done':>5}")
    for row in rows:
        print(f"{row['variant']:42} {row['seconds']:8.2f} {row['floor_s']:8.2f} "
              f"{row['jobs_per_s']:8.0f} {row['cpu_us_per_job']:11.0f} {row['max_rss_mb']:7.1f} "
              f"{'yes' if row['complete'] else 'NO':>5}")


if __name__ == "__main__":
    main()
