"""What a per-key limit costs: a limited drain beside an unlimited one, and head-of-line.

``python -m bench.limits [--jobs 20000] [--processes 4] [--repeats 3] [--rate-seconds 60]
[--only-drains | --only-rates]``
(``make bench-limits``)

In one run, on one database, interleaved:

- **Unlimited**: ``--jobs`` no-op jobs, drained by ``--processes`` workers (burst mode).
- **Limited, keys full**: as many no-op jobs under ``Limit(2)`` per key over 1,000 keys,
  drained alike: 18 of each key's 20 jobs wait throttled, and each end of a run hands its slot
  to the next. The rate is taken between 5% and 95% done, like every drain of ``make bench``;
  the ratio limited / unlimited is the cost of the limit (the target is at least 0.8), printed
  as the ratio of the medians and as the median of each repeat's ratio.
- **Limited, keys not full**: as many jobs under ``Limit(2)``, each of its own key: every job
  takes a slot as it is enqueued and none waits; the cost of the slots alone.
- **Head-of-line**: 10,000 jobs of one key at limit 1, enqueued first, beside 100 keys of 10
  jobs each (limit 1 too). Reported: how long the 1,000 others take to finish, against the same
  1,000 without the hot key, and against 1,000 unlimited jobs, by the same workers. A limit that
  blocked the line would make the others wait behind the hot key's 10,000.
- **Rates held**: one key under ``Rate(100, per=1, burst=10)`` and one under ``Rate(5, per=1)``,
  each with more jobs than ``--rate-seconds`` at its rate can start, run by the same workers at
  once. Reported from the attempts' recorded starts: the starts of each key in the
  ``--rate-seconds`` after its first, against what its rate allows in that time (its burst
  included), and how many starts the rate (the generic cell rate algorithm, replayed over the
  recorded starts) would have refused: it must be none.
"""

from __future__ import annotations

import argparse
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


def drain(task: str, jobs: int, processes: int, keys: int = 1000) -> dict[str, Any]:
    preload(task, jobs, keys=keys)
    command = PGJOBS.worker_command(burst=True, batch=10)
    result = harness.drain(DATABASE, REMAINING[task], jobs, [command] * processes, LOG,
                           timeout=600, env=PGJOBS.env)
    return result.as_dict()


def head_of_line(processes: int) -> dict[str, float]:
    """Seconds for 1,000 jobs of 100 keys to finish: beside a hot key's 10,000, alone, and
    alone without a limit."""
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many
    from django_pgjobs.models import Job

    timings = {}
    for case in ("beside a hot key", "alone", "alone, unlimited"):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_key_slot "
                           "RESTART IDENTITY")
        with transaction.atomic():
            if case == "beside a hot key":
                for start in range(0, 10_000, 1000):
                    enqueue_many([JobSpec.of("bench.hot", {"n": i, "key": "hot"})
                                  for i in range(start, start + 1000)])
            if case != "alone, unlimited":
                enqueue_many([JobSpec.of("bench.hot", {"n": i, "key": f"k{i % 100}"})
                              for i in range(1000)])
            else:
                enqueue_many([JobSpec.of("bench.noop", {"n": i, "key": "-"})
                              for i in range(1000)])
        others = Job.objects.exclude(payload__key="hot")
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


RATES = {  # task: (starts a second, burst)
    "bench.rated_fast": (100, 10),
    "bench.rated_slow": (5, 1),
}


def rates_held(processes: int, seconds: float) -> dict[str, dict[str, float]]:
    """Each rate key's starts in ``seconds`` from its first, and the refused starts."""
    from datetime import timedelta

    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many
    from django_pgjobs.models import KEPT_SUCCESS, Attempt, Job

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_key_slot, pgjobs_key_rate "
                       "RESTART IDENTITY")
    for task, (per_second, _) in RATES.items():
        total = int(per_second * (seconds + 10) * 1.2)
        for start in range(0, total, 1000):
            with transaction.atomic():
                enqueue_many([JobSpec.of(task, {"n": i, "key": "provider"})
                              for i in range(start, min(start + 1000, total))])
    harness.execute(DATABASE, "VACUUM ANALYZE")
    command = PGJOBS.worker_command(burst=False, batch=10)
    workers = harness.Workers.start([command] * processes,
                                    harness.child_env(DATABASE, **PGJOBS.env), LOG)
    try:
        time.sleep(seconds + 5)
    finally:
        workers.stop()
    held = {}
    for task, (per_second, burst) in RATES.items():
        # Every attempt's start: the rows of those that did not succeed, and the successes,
        # which have none (their jobs keep them).
        starts = sorted([*Attempt.objects.filter(job__task=task).values_list("claimed_at",
                                                                             flat=True),
                         *Job.objects.filter(KEPT_SUCCESS, task=task)
                         .values_list("claimed_at", flat=True)])
        first = starts[0]
        within = [s for s in starts if s < first + timedelta(seconds=seconds)]
        allowed = per_second * seconds + burst - 1
        held[task] = {"starts": len(within), "allowed": allowed,
                      "ratio": len(within) / allowed,
                      "refused": len(refused_starts(starts, 1 / per_second, burst))}
    return held


def refused_starts(starts: list[Any], interval: float, burst: int) -> list[int]:
    """The starts (by index) a rate of one every ``interval`` seconds with ``burst`` refuses."""
    from datetime import timedelta

    cost, tolerance = timedelta(seconds=interval), timedelta(seconds=burst * interval)
    tat = None
    refused = []
    for i, at in enumerate(starts):
        if tat is not None and at < tat + cost - tolerance:
            refused.append(i)
        tat = max(tat or at, at) + cost
    return refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-seconds", type=float, default=60.0)
    parser.add_argument("--only-rates", action="store_true",
                        help="measure the rates held alone")
    parser.add_argument("--only-drains", action="store_true",
                        help="measure the three drains alone")
    args = parser.parse_args()
    harness.fresh_django(DATABASE)

    cases = {  # label: (task, keys)
        "unlimited": ("bench.noop", 1000),
        "limited: 1,000 keys, at most 2 each (full)": ("bench.limited", 1000),
        f"limited: {args.jobs:,} keys, at most 2 each": ("bench.limited", args.jobs),
    }
    if args.only_rates:
        report_rates(args.processes, args.rate_seconds)
        return
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in cases}
    for repeat in range(args.repeats):
        for label, (task, keys) in cases.items():
            print(f"[{repeat + 1}/{args.repeats}] {label}: {args.jobs} jobs, "
                  f"{args.processes} processes", flush=True)
            results[label].append(drain(task, args.jobs, args.processes, keys))
    print(f"\n{'drain':46} {'jobs/s (median)':>15} {'worker CPU us/job':>18} "
          f"{'server CPU us/job':>18}  runs")
    medians = {}
    for label, runs in results.items():
        medians[label] = statistics.median(r["jobs_per_s"] for r in runs)
        worker = [r["cpu_us_per_job"] for r in runs if r["cpu_us_per_job"] is not None]
        server = [r["server_cpu_us_per_job"] for r in runs
                  if r["server_cpu_us_per_job"] is not None]
        print(f"{label:46} {medians[label]:15,.0f} "
              f"{statistics.median(worker) if worker else float('nan'):18.0f} "
              f"{statistics.median(server) if server else float('nan'):18.0f}  "
              + ", ".join(f"{r['jobs_per_s']:,.0f}" for r in runs))
    unlimited = medians["unlimited"]
    for label in list(cases)[1:]:
        # Each repeat's limited drain against the unlimited one beside it, minutes apart: on a
        # shared host this moves less than the ratio of medians taken over the whole run.
        paired = [r["jobs_per_s"] / u["jobs_per_s"]
                  for r, u in zip(results[label], results["unlimited"], strict=True)]
        print(f"ratio ({label} / unlimited): {medians[label] / unlimited:.3f}; "
              f"repeat by repeat, median {statistics.median(paired):.3f} "
              f"({min(paired):.3f} to {max(paired):.3f})")
    if args.only_drains:
        return

    runs = [head_of_line(args.processes) for _ in range(args.repeats)]
    timings = {case: statistics.median(run[case] for run in runs) for case in runs[0]}
    print(f"\n{'head-of-line: 1,000 jobs of 100 keys finish in':52} {'s (median)':>10}  runs")
    for case, seconds in timings.items():
        print(f"  {case:50} {seconds:10.2f}  "
              f"{', '.join(f'{run[case]:.2f}' for run in runs)}")
    print(f"ratio (alone / beside the hot key): "
          f"{timings['alone'] / timings['beside a hot key']:.3f}; "
          f"(unlimited / beside the hot key): "
          f"{timings['alone, unlimited'] / timings['beside a hot key']:.3f}")
    report_rates(args.processes, args.rate_seconds)


def report_rates(processes: int, seconds: float) -> None:
    held = rates_held(processes, seconds)
    print(f"\n{f'rates held over {seconds:g} s (one key each)':44} {'starts':>8} "
          f"{'allowed':>8} {'ratio':>6} {'refused':>8}")
    for task, figures in held.items():
        per_second, burst = RATES[task]
        label = f"{task}: {per_second}/s, burst {burst}"
        print(f"  {label:42} {figures['starts']:8.0f} {figures['allowed']:8.0f} "
              f"{figures['ratio']:6.3f} {figures['refused']:8.0f}")


if __name__ == "__main__":
    main()
