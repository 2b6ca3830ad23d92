"""What a per-key limit costs: a limited drain beside an unlimited one, and head-of-line.

``python -m bench.limits [--jobs 20000] [--processes 4] [--repeats 3]`` (``make bench-limits``)

In one run, on one database, interleaved:

- **Unlimited**: ``--jobs`` no-op jobs, drained by ``--processes`` workers (burst mode).
- **Limited**: as many no-op jobs under ``Limit(2)`` per key over 1,000 keys, drained alike.
  The rate is taken between 5% and 95% done, like every drain of ``make bench``; the ratio
  limited / unlimited is the cost of the limit (the target is at least 0.8).
- **Head-of-line**: 10,000 jobs of one key at limit 1, enqueued first, beside 100 keys of 10
  jobs each (limit 1 too). Reported: how long the 1,000 others take to finish, against 1,000
  unlimited jobs drained alone by the same workers. A limit that blocked the line would make the
  others wait behind the hot key's 10,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench import harness
from bench.systems import PGJOBS

DATABASE = "bench_limits"
LOG = harness.ROOT / "bench" / "results" / "logs" / "limits.log"
REMAINING = {
    "bench.noop": "SELECT count(*) FROM pgjobs_job WHERE task = 'bench.noop' "
                  "AND status <> 'succeeded'",
    "bench.limited": "SELECT count(*) FROM pgjobs_job WHERE task = 'bench.limited' "
                     "AND status <> 'succeeded'",
}


def preload(task: str, jobs: int, keys: int) -> None:
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_key_slot RESTART IDENTITY")
    for start in range(0, jobs, 1000):
        with transaction.atomic():
            enqueue_many([JobSpec.of(task, {"n": i, "key": f"k{i % keys}"})
                          for i in range(start, min(start + 1000, jobs))])


def drain(task: str, jobs: int, processes: int) -> dict[str, Any]:
    preload(task, jobs, keys=1000)
    command = PGJOBS.worker_command(burst=True, batch=10)
    result = harness.drain(DATABASE, REMAINING[task], jobs, [command] * processes, LOG,
                           timeout=600, env=PGJOBS.env)
    return result.as_dict()


def head_of_line(processes: int) -> dict[str, float]:
    """Seconds for 1,000 jobs to finish: beside a hot key's 10,000, and alone (unlimited)."""
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many
    from django_pgjobs.models import Job

    timings = {}
    for case in ("beside a hot key", "alone, unlimited"):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_key_slot "
                           "RESTART IDENTITY")
        with transaction.atomic():
            if case == "beside a hot key":
                for start in range(0, 10_000, 1000):
                    enqueue_many([JobSpec.of("bench.hot", {"n": i, "key": "hot"})
                                  for i in range(start, start + 1000)])
                enqueue_many([JobSpec.of("bench.hot", {"n": i, "key": f"k{i % 100}"})
                              for i in range(1000)])
            else:
                enqueue_many([JobSpec.of("bench.noop", {"n": i}) for i in range(1000)])
        others = (Job.objects.exclude(payload__key="hot") if case == "beside a hot key"
                  else Job.objects.all())
        harness.execute(DATABASE, "VACUUM ANALYZE")
        command = PGJOBS.worker_command(burst=False, batch=10)
        workers = harness.Workers.start([command] * processes,
                                        harness.child_env(DATABASE, **PGJOBS.env), LOG)
        start = time.monotonic()
        try:
            while others.exclude(status="succeeded").exists():
                if time.monotonic() - start > 600:
                    raise RuntimeError(f"{case}: the 1,000 jobs did not finish in 600 s")
                time.sleep(0.01)
            timings[case] = time.monotonic() - start
        finally:
            workers.stop()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    harness.recreate_database(DATABASE)
    harness.manage(DATABASE, "migrate", "--verbosity", "0")
    os.environ.update(harness.child_env(DATABASE))
    import django

    django.setup()

    rates: dict[str, list[float]] = {"bench.noop": [], "bench.limited": []}
    for repeat in range(args.repeats):
        for task in rates:
            print(f"[{repeat + 1}/{args.repeats}] {task}: {args.jobs} jobs, "
                  f"{args.processes} processes", flush=True)
            rates[task].append(drain(task, args.jobs, args.processes)["jobs_per_s"])
    print(f"\n{'drain':44} {'jobs/s (median)':>16}  runs")
    labels = {"bench.noop": "unlimited",
              "bench.limited": "limited: 1,000 keys, at most 2 each"}
    for task, values in rates.items():
        print(f"{labels[task]:44} {statistics.median(values):16,.0f}  "
              f"{', '.join(f'{v:,.0f}' for v in values)}")
    ratio = statistics.median(rates["bench.limited"]) / statistics.median(rates["bench.noop"])
    print(f"\nratio (limited / unlimited): {ratio:.3f}")

    timings = head_of_line(args.processes)
    print(f"\n{'head-of-line: 1,000 jobs of 100 keys finish in':52} {'s':>7}")
    for case, seconds in timings.items():
        print(f"  {case:50} {seconds:7.2f}")
    print(f"ratio (alone / beside the hot key): "
          f"{timings['alone, unlimited'] / timings['beside a hot key']:.3f}")


if __name__ == "__main__":
    main()
