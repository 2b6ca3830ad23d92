"""Profile the hot path: round trips per claim and settle, and where a worker's CPU goes.

``python -m bench.profile_hot_path [--jobs 20000]``:

1. Round trips: libpq's protocol trace around one ``claim_jobs`` and one ``settle`` (every
   ReadyForQuery the server sends ends one round trip), and around single and bulk enqueues.
2. Worker CPU: py-spy samples a real ``pgjobs_worker --burst`` draining ``--jobs`` no-op jobs;
   samples are grouped by phase (claim, execute, settle, wake-ups, maintenance) and by function.
3. Server time: planning and execution of the claim, the settle and the enqueue INSERT, read
   from EXPLAIN ANALYZE in transactions that are rolled back (median of several).
4. Enqueue CPU: where an ``enqueue_many`` of 1 and of 1000 jobs spends its time, then cProfile over
   single enqueues and bulk enqueues, by own time.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import harness

DATABASE = "bench_profile"
PHASES = [  # first match wins, searched from the innermost frame outwards
    ("claim", ("claim_jobs", "_claim ")),
    ("settle", ("settle ", "flush ")),
    ("execute", ("execute (django_pgjobs/executor.py",)),
    ("wake-ups", ("notify.py", "_idle ", "listen")),
    ("maintenance", ("maintenance.py", "_run_step")),
]


def count_round_trips(action: Callable[[], Any]) -> tuple[int, int]:
    """Run ``action`` on the default connection under libpq's trace; (round trips, messages)."""
    from django.db import connection
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().splitlines()
    sent = [line for line in lines if line.startswith("F")]
    return sum("ReadyForQuery" in line for line in lines), len(sent)


def round_trips() -> list[list[str]]:
    from django.db import transaction

    from django_pgjobs import JobSpec, enqueue, enqueue_many
    from django_pgjobs.outcomes import Outcome
    from django_pgjobs.transitions import claim_jobs, settle, settle_and_claim

    enqueue_many([JobSpec.of("bench.noop", {"n": i}) for i in range(100)])
    claim_jobs("profile-warmup", "default", 10)  # compiles and caches the claim text
    held = claim_jobs("profile", "default", 10)  # what settle_and_claim settles
    claimed: list[Any] = []
    rows = []

    def single() -> None:
        with transaction.atomic():
            enqueue("bench.noop", {"n": 1})

    def bulk() -> None:
        with transaction.atomic():
            enqueue_many([JobSpec.of("bench.noop", {"n": i}) for i in range(100)])

    def claim() -> None:
        claimed.extend(claim_jobs("profile", "default", 10))

    def settle_batch() -> None:
        settle([Outcome.succeeded(j, "null", 0) for j in claimed])

    def settle_then_claim() -> None:
        # What a worker sends per batch: the last batch's outcomes with the next claim.
        settle_and_claim([Outcome.succeeded(j, "null", 0) for j in held],
                         "profile", "default", 10)

    for label, action in (("enqueue (one job, in transaction.atomic)", single),
                          ("enqueue_many (100 jobs, in transaction.atomic)", bulk),
                          ("claim_jobs (batch 10)", claim),
                          ("settle (batch of 10 outcomes)", settle_batch),
                          ("settle_and_claim (10 outcomes, batch 10)", settle_then_claim)):
        trips, messages = count_round_trips(action)
        rows.append([label, str(trips), str(messages)])
    return rows


def worker_profile(jobs: int, out: Path) -> tuple[list[list[str]], list[list[str]], int]:
    """py-spy a burst worker (1 process, 1 thread, batch 10) over ``jobs`` no-op jobs."""
    harness.measure("pgjobs", "reset", DATABASE)
    harness.measure("pgjobs", "preload", DATABASE, n=jobs)
    harness.execute(DATABASE, "VACUUM ANALYZE")
    py_spy = shutil.which("py-spy") or str(Path(harness.PYTHON).parent / "py-spy")
    subprocess.run(
        [py_spy, "record", "--gil", "--format", "raw", "--rate", "250", "--output", str(out), "--",
         harness.PYTHON, harness.MANAGE, "pgjobs_worker", "--burst", "--batch-size", "10",
         "--log-level", "WARNING"],
        env=harness.child_env(DATABASE), cwd=harness.ROOT, check=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    phases: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = stack.split(";")
        total += count
        own[frames[-1]] += count
        phase = "start-up and other"
        for frame in reversed(frames):
            found = next((name for name, marks in PHASES if any(m in frame for m in marks)), None)
            if found:
                phase = found
                break
        phases[phase] += count
    phase_rows = [[name, f"{100 * n / total:.1f}%"] for name, n in phases.most_common()]
    top_rows = [[frame[:95], f"{100 * n / total:.1f}%"] for frame, n in own.most_common(15)]
    return phase_rows, top_rows, total


def _first_statement_explained(action: Callable[[], Any]) -> tuple[float, float]:
    """Planning and execution of the first statement ``action`` sends, rolled back."""
    from django.db import connection, transaction

    found: list[tuple[float, float]] = []

    def explain_first(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        if not found:
            found.append((0.0, 0.0))  # set first: the EXPLAIN below comes through here too
            # Already inside the transaction that is rolled back below.
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
                plan = cursor.fetchone()[0]
            plan = (plan if isinstance(plan, list) else json.loads(plan))[0]
            found[0] = (plan["Planning Time"], plan["Execution Time"])
        return execute(statement, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(explain_first):
        action()
        transaction.set_rollback(True)
    return found[0]


def server_times(repeats: int = 9) -> list[list[str]]:
    """Median planning and execution time of each hot statement, as the server reports them."""
    from django_pgjobs import JobSpec, enqueue_many
    from django_pgjobs.models import Job
    from django_pgjobs.status import JobStatus

    enqueue_many([JobSpec.of("bench.noop", {"n": i}) for i in range(2000)])
    rows = []

    def add(label: str, runs: list[tuple[float, float]], jobs: int) -> None:
        plan_ms, exec_ms = sorted(runs, key=lambda t: t[1])[len(runs) // 2]
        rows.append([label, f"{plan_ms:.3f}", f"{exec_ms:.3f}",
                     f"{(plan_ms + exec_ms) * 1000 / jobs:.0f}"])

    try:
        from django_pgjobs.explain import explain
    except ImportError:  # a version without the EXPLAIN checks
        explain = None
    for name in ("claim", "settle"):
        for batch in (10, 50):
            if explain is not None:
                add(f"{name} (batch {batch})",
                    [(r.plan["Planning Time"], r.plan["Execution Time"])
                     for r in (explain(name, batch=batch) for _ in range(repeats))], batch)
    for count in (1, 1000):
        specs = [JobSpec.of("bench.noop", {"n": i}) for i in range(count)]
        add(f"enqueue_many INSERT ({count} job{'s' if count > 1 else ''})",
            [_first_statement_explained(lambda specs=specs: enqueue_many(specs))
             for _ in range(repeats)], count)
    add("Job.objects.create() INSERT, for comparison",
        [_first_statement_explained(lambda: Job.objects.create(
            task="bench.noop", queue="default", payload={"n": 1}, status=JobStatus.READY,
            max_attempts=20, lease_seconds=30)) for _ in range(repeats)], 1)
    return rows


def enqueue_breakdown(count: int, repeats: int) -> list[list[str]]:
    """Where an enqueue_many of ``count`` jobs in ``transaction.atomic()`` spends its time.

    Before the INSERT is sent is validation; the INSERT includes BEGIN, binding and the server;
    after it come reading the rows back and pairing them with the jobs; then the COMMIT.
    Medians of ``repeats`` runs, in ms for the call and µs per job.
    """
    from django.db import connection, transaction

    from django_pgjobs import JobSpec, enqueue_many

    specs = [JobSpec.of("bench.noop", {"n": i}) for i in range(count)]
    marks: dict[str, float] = {}

    def timed(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        marks["sent"] = time.perf_counter()
        try:
            return execute(statement, params, many, context)
        finally:
            marks["returned"] = time.perf_counter()

    spent: dict[str, list[float]] = collections.defaultdict(list)
    with connection.execute_wrapper(timed):
        for _ in range(repeats):
            start = time.perf_counter()
            with transaction.atomic():
                enqueue_many(specs)
                done = time.perf_counter()
            committed = time.perf_counter()
            spent["before the INSERT: validation, atomic, cursor"].append(marks["sent"] - start)
            spent["the INSERT (BEGIN, binding, server)"].append(marks["returned"] - marks["sent"])
            spent["reading back and pairing the rows"].append(done - marks["returned"])
            spent["COMMIT"].append(committed - done)
            spent["all told"].append(committed - start)
    return [[f"{label}, {count} job{'s' if count > 1 else ''}",
             f"{statistics.median(v) * 1000:.3f}", f"{statistics.median(v) * 1e6 / count:.1f}"]
            for label, v in spent.items()]


def enqueue_profile(n: int = 2000) -> tuple[str, str]:
    from django.db import transaction

    from django_pgjobs import JobSpec, enqueue, enqueue_many

    def single() -> None:
        for i in range(n):
            with transaction.atomic():
                enqueue("bench.noop", {"n": i})

    def bulk() -> None:
        for _ in range(n // 1000 or 1):
            with transaction.atomic():
                enqueue_many([JobSpec.of("bench.noop", {"n": i}) for i in range(1000)])

    texts = []
    for action in (single, bulk):
        profiler = cProfile.Profile()
        profiler.runcall(action)
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(14)
        texts.append(buffer.getvalue())
    return texts[0], texts[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20000)
    args = parser.parse_args()
    from bench.report import _table

    harness.recreate_database(DATABASE)
    harness.manage(DATABASE, "migrate", "--verbosity", "0")
    os.environ.update({k: v for k, v in harness.child_env(DATABASE).items()
                       if k.startswith(("BENCH_", "DJANGO_"))})
    import django

    django.setup()
    print("Round trips (ReadyForQuery messages) and protocol messages sent")
    print(_table(["operation", "round trips", "messages sent"], round_trips()))
    out = harness.ROOT / "bench" / "results" / "worker-profile.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    phases, top, total = worker_profile(args.jobs, out)
    print(f"\nWorker CPU by phase ({total} py-spy samples of busy threads, {args.jobs} jobs)")
    print(_table(["phase", "share of samples"], phases))
    print("\nWorker functions by own time")
    print(_table(["function (file:line)", "share"], top))
    harness.measure("pgjobs", "reset", DATABASE)
    print("\nServer time per statement (EXPLAIN ANALYZE, median; rolled back)")
    print(_table(["statement", "planning ms", "execution ms", "µs per job"], server_times()))
    harness.measure("pgjobs", "reset", DATABASE)
    print("\nenqueue_many of 1 job (median of 500) and of 1000 jobs (median of 5)")
    print(_table(["part", "ms", "µs per job"],
                 enqueue_breakdown(1, 500) + enqueue_breakdown(1000, 5)))
    harness.measure("pgjobs", "reset", DATABASE)
    single, bulk = enqueue_profile()
    print("\nenqueue() x 2000, one per transaction: cProfile by own time\n" + single)
    print("enqueue_many() x 1000 jobs: cProfile by own time\n" + bulk)


if __name__ == "__main__":
    main()
