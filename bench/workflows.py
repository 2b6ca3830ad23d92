"""What workflows cost: chains and chords drained beside plain jobs, in one run.

``python -m bench.workflows [--chains 1000] [--length 10] [--chords 100] [--width 100]
[--processes 4] [--repeats 3]`` (``make bench-workflows``)

Each case is enqueued whole, then drained by ``--processes`` listening workers (batch 10), and
read back from the jobs' own times (the database clock): throughput from the first claim to the
last finish, and for every job that waited, its hand-over: from the moment its last
dependency's settlement committed (that job's ``finished_at``) to its own claim. The cases:

- **plain**: as many no-op jobs as the chains hold, no edges;
- **chains**: ``--chains`` chains of ``--length`` no-op jobs, each after the one before;
- **chords**: ``--chords`` groups of ``--width`` no-op jobs, each with a callback after all of
  its group (a fan-in of ``--width``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench import harness
from bench.systems import PGJOBS

DATABASE = "bench_workflows"
LOG = harness.ROOT / "bench" / "results" / "logs" / "workflows.log"
TIMEOUT_SECONDS = 600


def preload(case: str, args: argparse.Namespace) -> int:
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, chain, chord, enqueue_many

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_dependency "
                       "RESTART IDENTITY")
    total = 0
    if case == "plain":
        jobs = args.chains * args.length
        for start in range(0, jobs, 1000):
            with transaction.atomic():
                total += len(enqueue_many([JobSpec.of("bench.noop", {"n": i})
                                           for i in range(start, min(start + 1000, jobs))]))
    elif case == "chains":
        for start in range(0, args.chains, 100):
            specs = []
            for c in range(start, min(start + 100, args.chains)):
                specs += chain(*(JobSpec.of("bench.noop", {"chain": c, "step": s})
                                 for s in range(args.length)))
            with transaction.atomic():
                total += len(enqueue_many(specs))
    else:
        for c in range(args.chords):
            group = [JobSpec.of("bench.noop", {"chord": c, "member": m})
                     for m in range(args.width)]
            with transaction.atomic():
                total += len(enqueue_many(chord(group, JobSpec.of("bench.noop",
                                                                  {"chord": c}))))
    return total


def drain(case: str, args: argparse.Namespace) -> dict[str, Any]:
    total = preload(case, args)
    harness.execute(DATABASE, "VACUUM ANALYZE")
    command = PGJOBS.worker_command(burst=False, batch=10)
    workers = harness.Workers.start([command] * args.processes,
                                    harness.child_env(DATABASE, **PGJOBS.env), LOG)
    started = time.monotonic()
    try:
        while time.monotonic() - started < TIMEOUT_SECONDS:
            left = harness.execute(DATABASE, "SELECT count(*) FROM pgjobs_job "
                                   "WHERE status <> 'succeeded'")[0][0]
            if left == 0:
                break
            time.sleep(0.2)
    finally:
        workers.stop()
    [(first_claim, last_finish, done)] = harness.execute(
        DATABASE, "SELECT min(claimed_at), max(finished_at), count(*) FROM pgjobs_job "
                  "WHERE status = 'succeeded'")
    seconds = (last_finish - first_claim).total_seconds()
    handovers = [row[0] * 1000 for row in harness.execute(DATABASE, """
        SELECT extract(epoch FROM j.claimed_at - max(u.finished_at))
        FROM pgjobs_job AS j
        JOIN pgjobs_dependency AS d ON d.job_id = j.id
        JOIN pgjobs_job AS u ON u.id = d.upstream_id
        WHERE j.status = 'succeeded'
        GROUP BY j.id, j.claimed_at""")]
    return {"jobs": total, "done": done, "jobs_per_s": done / seconds if seconds else 0.0,
            "handover_p50_ms": statistics.median(handovers) if handovers else None,
            "handover_p95_ms": harness.percentile(handovers, 95) if handovers else None,
            "waited": len(handovers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--length", type=int, default=10)
    parser.add_argument("--chords", type=int, default=100)
    parser.add_argument("--width", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    harness.fresh_django(DATABASE)

    cases = ("plain", "chains", "chords")
    results: dict[str, list[dict[str, Any]]] = {case: [] for case in cases}
    for repeat in range(args.repeats):
        for case in cases:
            print(f"[{repeat + 1}/{args.repeats}] {case}", flush=True)
            results[case].append(drain(case, args))
    print(f"\n{'drain, ' + str(args.processes) + ' listening workers':40} {'jobs':>7} "
          f"{'jobs/s':>8} {'hand-over p50 ms':>17} {'p95 ms':>8}  jobs/s of each run")
    medians = {}
    for case, runs in results.items():
        medians[case] = statistics.median(r["jobs_per_s"] for r in runs)
        p50 = [r["handover_p50_ms"] for r in runs if r["handover_p50_ms"] is not None]
        p95 = [r["handover_p95_ms"] for r in runs if r["handover_p95_ms"] is not None]
        label = {"plain": "plain jobs", "chains": f"{args.chains:,} chains of {args.length}",
                 "chords": f"{args.chords:,} chords of {args.width}"}[case]
        print(f"{label:40} {runs[0]['jobs']:7,} {medians[case]:8,.0f} "
              f"{statistics.median(p50) if p50 else float('nan'):17.1f} "
              f"{statistics.median(p95) if p95 else float('nan'):8.1f}  "
              + ", ".join(f"{r['jobs_per_s']:,.0f}" for r in runs))
        incomplete = [r for r in runs if r["done"] < r["jobs"]]
        if incomplete:
            print(f"  INCOMPLETE: {len(incomplete)} runs left jobs unfinished")
    for case in cases[1:]:
        print(f"ratio ({case} / plain): {medians[case] / medians['plain']:.3f}")


if __name__ == "__main__":
    main()
