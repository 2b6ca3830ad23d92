"""Run the benchmarks and print the figures: ``python -m bench.run [--quick] [--only ...]``.

Everything runs against one PostgreSQL server (BENCH_DATABASE_URL, default the local one), each
system in a ``bench_*`` database of its own, one after the other so none competes with another.
Results also go to bench/results/latest.json, which ``python -m bench.chart`` draws.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import floor, harness, report
from bench.systems import (
    ALL,
    DJANGO_TASKS_DB,
    FLOOR_DATABASE,
    PGJOBS,
    PGQUEUER,
    PROCRASTINATE,
    System,
)

RESULTS = harness.ROOT / "bench" / "results"
SECTIONS = ("enqueue", "drain", "pickup", "history")


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


QUICK = Sizes(300, 4000, 2000, 10000, 1000, 10, (10_000, 50_000), 50, 120)
FULL = Sizes(2000, 40000, 20000, 100000, 8000, 100, (10_000, 100_000, 1_000_000), 200, 300)

# (processes, executor threads per process, claim batch); the first is the headline.
PGJOBS_DRAINS = [(4, 1, 10), (1, 1, 10), (2, 1, 10), (4, 2, 10), (4, 1, 1), (4, 1, 50)]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def prepare(systems: list[System]) -> None:
    for system in systems:
        harness.recreate_database(system.database)
        if system.name in ("pgjobs", "django-tasks-db"):
            harness.manage(system.database, "migrate", "--verbosity", "0")
        else:
            harness.measure(system.name, "setup", system.database)
    harness.recreate_database(FLOOR_DATABASE)
    floor.setup(FLOOR_DATABASE)


def run_enqueue(sizes: Sizes) -> dict[str, Any]:
    single: dict[str, float] = {}
    bulk: dict[str, float] = {}
    for system in ALL:
        log(f"enqueue: {system.name}")
        single.update(harness.measure(system.name, "enqueue_single", system.database,
                                      n=sizes.enqueue_single))
        if system.name != "django-tasks-db":  # it has no bulk enqueue
            bulk.update(harness.measure(system.name, "enqueue_bulk", system.database,
                                        n=sizes.enqueue_bulk))
    single.update(floor.enqueue_single(FLOOR_DATABASE, sizes.enqueue_single))
    bulk.update(floor.enqueue_bulk(FLOOR_DATABASE, sizes.enqueue_bulk))
    return {"single_per_s": single, "bulk_per_s": bulk, "bulk_chunk": 1000}


def _drain_system(
    system: System, jobs: int, processes: int, concurrency: int, batch: int, sizes: Sizes
) -> dict[str, Any]:
    log_path = RESULTS / "logs" / f"drain-{system.name}.log"
    command = system.worker_command(burst=True, concurrency=concurrency, batch=batch)
    harness.measure(system.name, "reset", system.database)
    startup = harness.startup_cpu(system.database, command, log_path)
    harness.measure(system.name, "preload", system.database, n=jobs)
    result = harness.drain(
        system.database, system.remaining_sql, jobs, [command] * processes, log_path,
        timeout=sizes.drain_timeout, startup_cpu_seconds=startup,
    )
    harness.measure(system.name, "reset", system.database)
    return {"system": system.name, "processes": processes, "concurrency": concurrency,
            "batch": batch, **result.as_dict()}


def _drain_floor(jobs: int, clients: int, batch: int, sizes: Sizes) -> dict[str, Any]:
    floor.reset(FLOOR_DATABASE)
    floor.preload(FLOOR_DATABASE, jobs)
    result = harness.drain(
        FLOOR_DATABASE, floor.REMAINING_SQL, jobs,
        [floor.drain_command(FLOOR_DATABASE, jobs, clients, batch)],
        RESULTS / "logs" / "drain-floor.log", timeout=sizes.drain_timeout, python_workers=False,
    )
    floor.reset(FLOOR_DATABASE)
    return {"system": "pgbench floor", "processes": clients, "concurrency": 1, "batch": batch,
            **result.as_dict()}


def run_drain(sizes: Sizes) -> list[dict[str, Any]]:
    rows = []
    for processes, concurrency, batch in PGJOBS_DRAINS:
        log(f"drain: pgjobs {processes} processes x {concurrency} threads, batch {batch}")
        rows.append(_drain_system(PGJOBS, sizes.drain_jobs, processes, concurrency, batch, sizes))
    for clients, batch in sorted({(p * c, b) for p, c, b in PGJOBS_DRAINS}):
        log(f"drain: pgbench floor {clients} clients, batch {batch}")
        rows.append(_drain_floor(sizes.floor_jobs, clients, batch, sizes))
    log("drain: pgqueuer 4 processes, batch 10")
    rows.append(_drain_system(PGQUEUER, sizes.drain_jobs, 4, 1, 10, sizes))
    for peer in (PROCRASTINATE, DJANGO_TASKS_DB):
        log(f"drain: {peer.name} 4 processes")
        rows.append(_drain_system(peer, sizes.slow_peer_jobs, 4, 1, 1, sizes))
    return rows


def run_pickup(sizes: Sizes) -> dict[str, Any]:
    results = {}
    for system in ALL:
        log(f"pickup: {system.name}")
        harness.measure(system.name, "reset", system.database)
        workers = harness.Workers.start(
            [system.worker_command(burst=False)], harness.child_env(system.database),
            RESULTS / "logs" / f"pickup-{system.name}.log",
        )
        try:
            results[system.name] = harness.measure(
                system.name, "pickup", system.database, samples=sizes.pickup_samples
            )
        finally:
            workers.stop()
        harness.measure(system.name, "reset", system.database)
    return results


def run_history(sizes: Sizes) -> dict[str, Any]:
    log(f"claim latency versus history: {', '.join(map(str, sizes.history))} finished rows")
    return harness.measure(PGJOBS.name, "claim_history", PGJOBS.database, timeout=1800,
                           sizes=list(sizes.history), claims=sizes.history_claims)


def machine() -> dict[str, Any]:
    version = harness.execute("postgres", "SHOW server_version")[0][0]
    memory_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal"))
    cpu = next((line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    packages = {}
    for name in ("django", "django-pgjobs", "django-tasks-db", "procrastinate", "pgqueuer",
                 "psycopg", "asyncpg"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "cores": os.cpu_count(), "cpu": cpu, "memory_gib": round(memory_kb / 1024 / 1024, 1),
        "postgresql": version, "python": platform.python_version(), "packages": packages,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=harness.ROOT,
                                 capture_output=True, text=True).stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the runner")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    results: dict[str, Any] = {"quick": args.quick, "machine": machine(), "sizes": sizes.__dict__,
                               "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    log("preparing bench databases")
    prepare(ALL)
    sections = {"enqueue": run_enqueue, "drain": run_drain, "pickup": run_pickup,
                "history": run_history}
    for name in args.only:
        results[name] = sections[name](sizes)
    results["seconds"] = round(time.monotonic() - started)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(report.render(results))
    log(f"done in {results['seconds']} s; results in {args.output}")


if __name__ == "__main__":
    main()
