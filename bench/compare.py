"""Drain the same jobs with this checkout and another revision, interleaved, in one run.

``python -m bench.compare REV [--repeats 3] [--jobs 20000] [--processes 4] [--batch 10]``

A restructuring or a hot-path change is judged against the code it replaces on the same machine
in the same minutes: the other revision is checked out into ``bench/results/checkouts/<sha>``
(a git worktree) and its workers run from there, so each side drains with its own code while the
jobs, the database and the neighbours are the same. Both revisions must agree on the schema
(the migrations are this checkout's), unless ``--own-schema``: then each drain starts from a
database made anew and migrated by its side's own code, for a change to the schema itself.
Prints jobs/s, worker and server CPU per job and peak RSS per side, the medians, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import harness
from bench.systems import PGJOBS, System

CHECKOUTS = harness.ROOT / "bench" / "results" / "checkouts"


def checkout(rev: str) -> tuple[str, Path]:
    """A worktree of ``rev`` (made once, reused); return its commit and its path."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=harness.ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    path = CHECKOUTS / sha[:12]
    if not (path / "bench" / "manage.py").exists():
        CHECKOUTS.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(path), sha], cwd=harness.ROOT,
                       check=True, capture_output=True)
    return sha, path


def drain(system: System, root: Path, jobs: int, processes: int, batch: int,
          own_schema: bool = False) -> dict[str, Any]:
    """One drain of ``jobs`` preloaded jobs by workers running the code under ``root``."""
    command = system.worker_command(burst=True, batch=batch)
    command[1] = str(root / "bench" / "manage.py")  # the manage.py that puts its tree first
    log = harness.ROOT / "bench" / "results" / "logs" / f"compare-{root.name}.log"
    if own_schema:
        harness.recreate_database(system.database)
        subprocess.run([harness.PYTHON, command[1], "migrate", "--verbosity", "0"],
                       env=harness.child_env(system.database), cwd=root, check=True)
    harness.measure(system.client, "reset", system.database)
    startup = harness.startup_cpu(system.database, command, log, system.env)
    harness.measure(system.client, "preload", system.database, n=jobs)
    result = harness.drain(system.database, system.remaining_sql, jobs, [command] * processes,
                           log, timeout=300, startup_cpu_seconds=startup, env=system.env)
    harness.measure(system.client, "reset", system.database)
    return result.as_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev", help="the revision to compare this checkout with (e.g. HEAD~5)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--own-schema", action="store_true",
                        help="each side drains in a database migrated by its own code")
    args = parser.parse_args()

    sha, other = checkout(args.rev)
    here = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=harness.ROOT,
                          capture_output=True, text=True, check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           cwd=harness.ROOT, capture_output=True, text=True).stdout.strip()
    sides = {f"this checkout ({here}{'+changes' if dirty else ''})": harness.ROOT,
             f"{args.rev} ({sha[:12]})": other}
    system = replace(PGJOBS)
    harness.recreate_database(system.database)
    harness.manage(system.database, "migrate", "--verbosity", "0")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for repeat in range(args.repeats):
        for name, root in sides.items():
            print(f"[{repeat + 1}/{args.repeats}] {name}: {args.processes} processes, "
                  f"batch {args.batch}, {args.jobs} jobs", flush=True)
            runs[name].append(drain(system, root, args.jobs, args.processes, args.batch,
                                    args.own_schema))
    print()
    print(f"{'':44} {'jobs/s (median)':>16} {'runs':>24} {'CPU us/job':>11} "
          f"{'server us/job':>13} {'RSS MB':>7}")
    medians = {}
    for name, results in runs.items():
        rates = [r["jobs_per_s"] for r in results]
        medians[name] = statistics.median(rates)
        cpu = statistics.median(r["cpu_us_per_job"] for r in results)
        rss = statistics.median(r["max_rss_mb"] for r in results)
        servers = [r["server_cpu_us_per_job"] for r in results]
        server = statistics.median(servers) if None not in servers else float("nan")
        incomplete = "" if all(r["complete"] for r in results) else "  (a drain did not finish)"
        print(f"{name:44} {medians[name]:16,.0f} {', '.join(f'{x:,.0f}' for x in rates):>24} "
              f"{cpu:11.0f} {server:13.0f} {rss:7.1f}{incomplete}")
    first, second = medians.values()
    print(f"\nratio (this checkout / {args.rev}): {first / second:.3f}")


if __name__ == "__main__":
    main()
