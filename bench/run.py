"""Run the benchmarks and print the figures: ``python -m bench.run [--quick] [--only ...]``.

Everything runs against one PostgreSQL server (BENCH_DATABASE_URL, default the local one), each
system in a ``bench_*`` database of its own, one after the other so none competes with another.
Results also go to bench/results/latest.json; the chart of a full run to docs/benchmarks.png.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import floor, harness, report
from bench.clients.timing import AUTOCOMMIT
from bench.peers.chancy_app import CONCURRENCY as CHANCY_FETCH
from bench.systems import (
    ALL,
    CHANCY,
    DJANGO_TASKS_DB,
    FLOOR_DATABASE,
    OBAN,
    OBAN_LIMIT,
    PGJOBS,
    PGJOBS_CLAIM_APART,
    PGJOBS_CLAIM_NO_PAUSE,
    PGJOBS_SERVER_BINDING,
    PGQUEUER,
    PROCRASTINATE,
    System,
)

RESULTS = harness.ROOT / "bench" / "results"
SECTIONS = ("enqueue", "drain", "startup", "pickup", "history", "experiments")


@dataclass(frozen=True)
class Sizes:
    enqueue_single: int
    enqueue_bulk: int
    drain_jobs: int
    floor_jobs: int
    slow_peer_jobs: int
    pickup_samples: int
    history: tuple[int, ...]
    history_claims: int
    drain_timeout: float
    repeats: int
    startup_samples: int


QUICK = Sizes(300, 4000, 2000, 10000, 1000, 10, (10_000, 50_000), 50, 120, 1, 2)
FULL = Sizes(2000, 40000, 20000, 100000, 8000, 100, (10_000, 100_000, 1_000_000), 200, 300, 3,
             7)
# The systems whose workers' start-up is timed: the headline's peers, then the slow two.
STARTUP_SYSTEMS = (PGJOBS, PGQUEUER, CHANCY, OBAN, PROCRASTINATE, DJANGO_TASKS_DB)
ENQUEUERS = [PGJOBS, PGJOBS_SERVER_BINDING, DJANGO_TASKS_DB, PROCRASTINATE, PGQUEUER, CHANCY,
             OBAN]

# (processes, executor threads per process, claim batch); the first is the headline.
PGJOBS_DRAINS = [(4, 1, 10), (1, 1, 10), (2, 1, 10), (4, 2, 10), (4, 1, 1), (4, 1, 50)]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare(systems: list[System]) -> None:
    # Workers import django_pgjobs and the peers' glue from this checkout. Compiled once here,
    # as pip compiles an installed package, so that no worker compiles them at start-up (a
    # PYTHONDONTWRITEBYTECODE environment would make every one of them do it, 80 ms apiece).
    for python in sorted({system.interpreter for system in systems}):
        subprocess.run([python, "-m", "compileall", "-q", "django_pgjobs", "bench"],
                       cwd=harness.ROOT, check=True, stdout=subprocess.DEVNULL)
    for system in systems:
        harness.recreate_database(system.database)
        if system.name in ("pgjobs", "django-tasks-db"):
            harness.manage(system.database, "migrate", "--verbosity", "0")
        else:
            harness.measure(system.client, "setup", system.database,
                            python=system.interpreter)
    harness.recreate_database(FLOOR_DATABASE)
    floor.setup(FLOOR_DATABASE)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def run_enqueue(sizes: Sizes) -> dict[str, Any]:
    """Every contender ``sizes.repeats`` times, interleaved; the median of each is kept."""
    single: dict[str, list[float]] = {}
    bulk: dict[str, list[float]] = {}
    for repeat in range(sizes.repeats):
        for system in ENQUEUERS:
            log(f"enqueue: {system.name} ({repeat + 1}/{sizes.repeats})")
            answers = [(single, harness.measure(system.client, "enqueue_single", system.database,
                                                env=system.env, python=system.interpreter,
                                                n=sizes.enqueue_single))]
            if system.client != "django-tasks-db":  # it has no bulk enqueue
                answers.append((bulk, harness.measure(system.client, "enqueue_bulk",
                                                      system.database, env=system.env,
                                                      python=system.interpreter,
                                                      n=sizes.enqueue_bulk)))
            for table, rates in answers:
                for name, rate in rates.items():
                    if key := _variant(name, system):
                        table.setdefault(key, []).append(rate)
        single.setdefault("floor", []).append(
            floor.enqueue_single(FLOOR_DATABASE, sizes.enqueue_single)["floor"])
        bulk.setdefault("floor", []).append(
            floor.enqueue_bulk(FLOOR_DATABASE, sizes.enqueue_bulk)["floor"])
    return {
        "single_per_s": {k: _median(v) for k, v in single.items()},
        "bulk_per_s": {k: _median(v) for k, v in bulk.items()},
        "single_runs": single, "bulk_runs": bulk, "bulk_chunk": 1000,
    }


def _variant(name: str, system: System) -> str | None:
    """The name a figure is kept under; a variant keeps its own, not its ORM baselines."""
    if not system.kind:
        return name
    base = name.removesuffix(AUTOCOMMIT)
    return system.name + name[len(base):] if base == system.kind else None


def _drain_system(
    system: System, jobs: int, processes: int, concurrency: int, batch: int, sizes: Sizes
) -> dict[str, Any]:
    log_path = RESULTS / "logs" / f"drain-{system.client}.log"
    command = system.worker_command(burst=True, concurrency=concurrency, batch=batch)
    python = system.interpreter
    harness.measure(system.client, "reset", system.database, python=python)
    startup = harness.startup_cpu(system.database, command, log_path, system.env,
                                  ready_sql=system.ready_sql)
    if not system.exits_when_empty:  # the rows of the worker stopped there (Chancy's, Oban's)
        harness.measure(system.client, "reset", system.database, python=python)
    harness.measure(system.client, "preload", system.database, python=python, n=jobs)
    result = harness.drain(
        system.database, system.remaining_sql, jobs, [command] * processes, log_path,
        timeout=sizes.drain_timeout, startup_cpu_seconds=startup, env=system.env,
        exits_when_empty=system.exits_when_empty,
    )
    harness.measure(system.client, "reset", system.database, python=python)
    return {"system": system.name, "processes": processes, "concurrency": concurrency,
            "batch": batch, "worker": system.describe(command), **result.as_dict()}


def _drain_floor(jobs: int, clients: int, batch: int, sizes: Sizes) -> dict[str, Any]:
    # The floor needs many jobs to last long enough to time at batch 10 and over, but at batch 1
    # it is as slow as the workers and the queue's own size will do.
    jobs = jobs if batch >= 10 else sizes.drain_jobs
    floor.reset(FLOOR_DATABASE)
    floor.preload(FLOOR_DATABASE, jobs)
    result = harness.drain(
        FLOOR_DATABASE, floor.REMAINING_SQL, jobs,
        [floor.drain_command(FLOOR_DATABASE, jobs, clients, batch)],
        RESULTS / "logs" / "drain-floor.log", timeout=sizes.drain_timeout, python_workers=False,
    )
    floor.reset(FLOOR_DATABASE)
    return {"system": "pgbench floor", "processes": clients, "concurrency": 1, "batch": batch,
            "worker": f"pgbench -M prepared -f bench/floor/claim_settle.sql -c {clients} "
                      f"-D batch={batch}",
            **result.as_dict()}


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(rows, key=lambda r: r["jobs_per_s"])
    return {**ordered[len(ordered) // 2], "runs": [round(r["jobs_per_s"]) for r in rows]}


def run_drain(sizes: Sizes) -> list[dict[str, Any]]:
    p, c, b = PGJOBS_DRAINS[0]
    # The comparisons the targets rest on run ``repeats`` times, interleaved, and keep the
    # median: on a shared machine a single run says more about the neighbours than the queue.
    headline = [
        ("pgjobs", lambda: _drain_system(PGJOBS, sizes.drain_jobs, p, c, b, sizes)),
        ("pgjobs (server-side binding)",
         lambda: _drain_system(PGJOBS_SERVER_BINDING, sizes.drain_jobs, p, c, b, sizes)),
        ("pgbench floor", lambda: _drain_floor(sizes.floor_jobs, p * c, b, sizes)),
        ("pgqueuer", lambda: _drain_system(PGQUEUER, sizes.drain_jobs, p, 1, b, sizes)),
    ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in headline}
    for repeat in range(sizes.repeats):
        for name, action in headline:
            log(f"drain: {name} {p} processes, batch {b} ({repeat + 1}/{sizes.repeats})")
            runs[name].append(action())
    rows = [_median_row(r) for r in runs.values()]
    for processes, concurrency, batch in PGJOBS_DRAINS[1:]:
        log(f"drain: pgjobs {processes} processes x {concurrency} threads, batch {batch}")
        rows.append(_drain_system(PGJOBS, sizes.drain_jobs, processes, concurrency, batch, sizes))
    for clients, batch in sorted({(p * c, b) for p, c, b in PGJOBS_DRAINS[1:]}):
        if (clients, batch) == (p * c, b):
            continue
        log(f"drain: pgbench floor {clients} clients, batch {batch}")
        rows.append(_drain_floor(sizes.floor_jobs, clients, batch, sizes))
    # Chancy drains as many jobs as the headline. It has no batch size: its fetches take up to
    # its queue's concurrency (bench/peers/chancy_app.py), which its row shows as the batch.
    log(f"drain: {CHANCY.name} {p} processes")
    rows.append(_drain_system(CHANCY, sizes.drain_jobs, p, 1, CHANCY_FETCH, sizes))
    # Oban likewise: a fetch takes up to its queue's limit less the jobs still running.
    log(f"drain: {OBAN.name} {p} processes")
    rows.append(_drain_system(OBAN, sizes.drain_jobs, p, 1, OBAN_LIMIT, sizes))
    for peer in (PROCRASTINATE, DJANGO_TASKS_DB):
        log(f"drain: {peer.name} 4 processes")
        rows.append(_drain_system(peer, sizes.slow_peer_jobs, 4, 1, 1, sizes))
    return rows


def run_experiments(sizes: Sizes) -> list[dict[str, Any]]:
    """Candidate hot-path changes (bench/experiments.py) against the code as it is, interleaved."""
    p, c, b = PGJOBS_DRAINS[0]
    systems = (PGJOBS, PGJOBS_CLAIM_APART, PGJOBS_CLAIM_NO_PAUSE)
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for repeat in range(sizes.repeats):
        for system in systems:
            log(f"experiment: {system.name} ({repeat + 1}/{sizes.repeats})")
            runs[system.name].append(_drain_system(system, sizes.drain_jobs, p, c, b, sizes))
    return [_median_row(r) for r in runs.values()]


def run_startup(sizes: Sizes) -> dict[str, Any]:
    """One worker process spawned on a queue holding one no-op job: seconds from the spawn
    until the table shows the job done. Start-up as a deploy or an autoscaler meets it: the
    interpreter, the imports, the framework's set-up, the first connection and claim."""
    results = {}
    for system in STARTUP_SYSTEMS:
        python = system.interpreter
        command = system.worker_command(burst=True)
        samples = []
        for sample in range(sizes.startup_samples):
            log(f"start-up: {system.name} ({sample + 1}/{sizes.startup_samples})")
            harness.measure(system.client, "reset", system.database, python=python)
            harness.measure(system.client, "preload", system.database, python=python, n=1)
            samples.append(harness.first_job_done(
                system.database, system.remaining_sql, command,
                RESULTS / "logs" / f"startup-{system.client}.log", system.env))
        harness.measure(system.client, "reset", system.database, python=python)
        results[system.name] = {"median_s": _median(samples),
                                "samples": [round(s, 3) for s in samples]}
    return results


def run_pickup(sizes: Sizes) -> dict[str, Any]:
    results = {}
    for system in ALL:
        log(f"pickup: {system.name}")
        harness.measure(system.name, "reset", system.database, python=system.interpreter)
        workers = harness.Workers.start(
            [system.worker_command(burst=False)], harness.child_env(system.database),
            RESULTS / "logs" / f"pickup-{system.name}.log",
        )
        try:
            results[system.name] = harness.measure(
                system.name, "pickup", system.database, python=system.interpreter,
                samples=sizes.pickup_samples,
            )
        finally:
            workers.stop()
        harness.measure(system.name, "reset", system.database, python=system.interpreter)
    return results


def run_history(sizes: Sizes) -> dict[str, Any]:
    log(f"claim latency versus history: {', '.join(map(str, sizes.history))} finished rows")
    return harness.measure(PGJOBS.name, "claim_history", PGJOBS.database, timeout=1800,
                           sizes=list(sizes.history), claims=sizes.history_claims)


def machine() -> dict[str, Any]:
    version = harness.execute("postgres", "SHOW server_version")[0][0]
    server = dict(harness.execute(
        "postgres",
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
        [["shared_buffers", "synchronous_commit", "autovacuum", "max_connections", "fsync"]],
    ))
    memory_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal"))
    cpu = next((line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    packages = {}
    for name in ("django", "django-pgjobs", "django-tasks-db", "procrastinate", "pgqueuer",
                 "chancy", "psycopg", "asyncpg"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    # Oban is installed in its own virtualenv, on another Python: that one answers for it.
    oban = harness.measure(OBAN.client, "versions", OBAN.database, python=OBAN.interpreter)
    packages["oban"] = f"{oban['oban']} (Python {oban['python']})"
    return {
        "cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "postgresql": version, "server_settings": server, "python": platform.python_version(),
        "packages": packages, "load_average_at_start": os.getloadavg()[0],
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT,
                                 capture_output=True, text=True).stdout.strip(),
    }


@contextlib.contextmanager
def neighbour(noisy: bool) -> Iterator[None]:
    """With ``noisy``, one process that keeps a core busy (a pure Python loop) for as long as
    the block runs: every system is measured beside it alike."""
    if not noisy:
        yield
        return
    log("noisy: a CPU-bound neighbour process runs beside every measurement")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the runner")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--drain-jobs", type=int, metavar="N",
                        help="jobs per drain at the headline size: pgjobs at every shape, "
                             "PgQueuer, Chancy and Oban (default 20,000, 2,000 with --quick); "
                             "the floor at batch 10 and over and the two slow peers keep theirs")
    parser.add_argument("--noisy", action="store_true",
                        help="run with a CPU-bound neighbour process the whole time, as "
                             "production workers share their cores")
    args = parser.parse_args()
    for system in ALL:
        if not Path(system.interpreter).exists():
            parser.error(f"{system.name} runs on {system.interpreter}, which does not exist: "
                         "`make bench` makes its virtualenv")
    sizes = QUICK if args.quick else FULL
    if args.drain_jobs:
        sizes = dataclasses.replace(sizes, drain_jobs=args.drain_jobs)
    started = time.monotonic()
    results: dict[str, Any] = {"quick": args.quick, "noisy": args.noisy, "machine": machine(),
                               "sizes": sizes.__dict__,
                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    log("preparing bench databases")
    prepare(ALL)
    sections = {"enqueue": run_enqueue, "drain": run_drain, "startup": run_startup,
                "pickup": run_pickup,
                "history": run_history, "experiments": run_experiments}
    with neighbour(args.noisy):
        for name in args.only:
            results[name] = sections[name](sizes)
    results["seconds"] = round(time.monotonic() - started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(report.render(results))
    if "drain" in results or "pickup" in results:
        from bench import chart  # matplotlib: only the bench virtualenv has it

        out = chart.default_output(results)
        chart.draw(results, out)
        log(f"chart in {out}")
    log(f"done in {results['seconds']} s; results in {args.output}")


if __name__ == "__main__":
    main()
