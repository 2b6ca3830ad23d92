"""One harness run: start the workers, inject every fault, drain, check, report.

Import this only after Django is set up against the harness's private server (see
``tests.harness.__main__``).
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import connection

from testproject.chaos.jobs import LEASE
from tests.harness import db, scenarios
from tests.harness.invariants import Check, check_all
from tests.harness.pool import WorkerPool
from tests.harness.records import RunRecord
from tests.harness.server import PrivateServer


@dataclass(frozen=True)
class Profile:
    name: str
    workers: int
    concurrency: int
    batch_size: int
    feed_per_second: float  # bulk effect jobs enqueued per second, all run long
    rounds: int  # times the six targeted faults are repeated
    replay_keys: int
    replays_per_key: int
    replay_threads: int
    ordinary_jobs: int
    flood_seconds: float
    flood_per_second: float
    poison_jobs: int
    random_seconds: float
    random_every: tuple[float, float]  # seconds between random faults
    random_restarts: int  # database restarts among the random faults
    later_jobs: int
    drain_seconds: float


PROFILES = {
    # The test suite's run: every fault at least once, about a minute and a half.
    "ci": Profile("ci", workers=3, concurrency=2, batch_size=5, feed_per_second=10, rounds=1,
                  replay_keys=10, replays_per_key=4, replay_threads=4, ordinary_jobs=20,
                  flood_seconds=3, flood_per_second=200, poison_jobs=1, random_seconds=10,
                  random_every=(1.0, 2.5), random_restarts=0, later_jobs=2, drain_seconds=90),
    # make chaos: a few minutes of everything, repeated.
    "long": Profile("long", workers=4, concurrency=2, batch_size=5, feed_per_second=25,
                    rounds=3, replay_keys=50, replays_per_key=5, replay_threads=8,
                    ordinary_jobs=100, flood_seconds=8, flood_per_second=300, poison_jobs=2,
                    random_seconds=240, random_every=(0.5, 2.0), random_restarts=3,
                    later_jobs=5, drain_seconds=180),
}


def run(profile: Profile, seed: int, server: PrivateServer, workdir: Path,
        worker_env: dict[str, str], *, hold_snapshot: bool = False,
        ) -> tuple[RunRecord, list[Check], dict[str, Any]]:
    """Run ``profile`` against the workers' database on ``server``; return what happened.

    ``hold_snapshot``: a session holds a snapshot open through the run, as a long report
    would, so the workers claim from floors (``worker.floors``) under every fault.
    """
    record = RunRecord(profile.name, seed, profile.workers, profile.concurrency)
    rng = random.Random(seed)
    pool = WorkerPool(
        profile.workers,
        ["--concurrency", str(profile.concurrency), "--batch-size", str(profile.batch_size),
         "--shutdown-grace", "15"],
        worker_env, workdir / "logs",
    )
    ctx = scenarios.Context(pool, server, record, rng, LEASE.total_seconds())
    started = time.monotonic()
    holder = (scenarios.SnapshotHolder(worker_env["DATABASE_URL"], workdir / "logs")
              if hold_snapshot else None)
    if holder is not None:
        holder.start()
    pool.start()
    feeder = scenarios.Feeder(record, profile.feed_per_second, 10**9, seed)
    editor = scenarios.ScheduleEditor(record, seed)
    try:
        pool.wait_started(90)
        record.started_at = db.db_now()
        feeder.start()
        editor.start()
        scenarios.enqueue_later(record, profile.later_jobs)
        replay_keys = [f"replay:{i}" for i in range(profile.replay_keys)]
        scenarios.replay_enqueues(record, rng, replay_keys, profile.replays_per_key,
                                  profile.replay_threads)
        for round_no in range(profile.rounds):
            scenarios.run_targets(ctx, round_no)
        scenarios.restart_database(ctx, "targeted")
        scenarios.lifecycle_controls(ctx)
        scenarios.cancel_before_start(ctx)
        scenarios.kill_under_process_handlers(ctx, profile.rounds)
        scenarios.poison_and_flood(ctx, profile.ordinary_jobs, profile.flood_seconds,
                                   profile.flood_per_second, profile.poison_jobs)
        scenarios.random_faults(ctx, profile.random_seconds, profile.random_every,
                                profile.random_restarts)
        feeder.halt.set()
        feeder.join(60)
        if feeder.error is not None:
            record.notes.append(f"the feeder failed: {feeder.error!r}")
        scenarios.stop_schedules(editor)
        record.drained = scenarios.drain(profile.drain_seconds)
        # Replays after the jobs finished: still the same jobs while the rows are retained.
        scenarios.replay_enqueues(record, rng, replay_keys, 1, profile.replay_threads)
    finally:
        feeder.halt.set()
        editor.halt.set()
        if holder is not None:
            holder.halt.set()
            holder.join(10)
            record.notes.extend(holder.problems())
        record.shutdown_codes = pool.shutdown(30)
        record.exits = list(pool.exits)
        record.wall_seconds = time.monotonic() - started
    checks, figures = db.retrying(lambda: check_all(record, LEASE.total_seconds()))
    connection.close()
    return record, checks, figures


def render(record: RunRecord, checks: list[Check], figures: dict[str, Any]) -> str:
    """The run's figures and invariants, for people."""
    plain = figures["plain"]
    outcomes = figures["attempts_by_outcome"]
    lines = [
        f"django-pgjobs failure harness: profile {record.profile}, seed {record.seed}, "
        f"{record.workers} workers x {record.concurrency} executors, "
        f"{record.wall_seconds:.0f} s",
        "",
        f"faults      kills {figures['kills']} (+{figures['poison_kills']} by the poison job), "
        f"stops {figures['stops']}, disconnects {figures['disconnects']}, "
        f"database restarts {figures['restarts']}; {figures['worker_processes']} worker "
        "processes in all",
        f"jobs        {figures['jobs']} {figures['jobs_by_status']}; lost {figures['jobs_lost']}",
        f"attempts    {figures['attempts']}: lease expired {outcomes.get('lease_expired', 0)}, "
        f"late reports lost {outcomes.get('lost', 0)} (kept beside a takeover "
        f"{figures['late_reports_kept_beside']}), failed {outcomes.get('failed', 0)}, "
        f"released {outcomes.get('released', 0)}",
        f"effects     receipted {figures['receipted_effects']} "
        f"(duplicates {figures['receipted_duplicates']}); "
        f"plain {plain['effects']} for {plain['jobs']} jobs (duplicates {plain['duplicates']} "
        f"on {plain['keys_repeated']} keys)",
        f"recovery    held jobs claimed again within "
        f"{_seconds(figures['recovery_targeted_max_s'])} (bound "
        f"{figures['recovery_bound_s']:.2f} s); other interrupted jobs rescued within "
        f"{_seconds(figures['recovery_bystanders_rescued_max_s'])}, claimed again within "
        f"{_seconds(figures['recovery_bystanders_reclaimed_max_s'])} (median "
        f"{_seconds(figures['recovery_bystanders_reclaimed_median_s'])}, queueing included)",
        f"enqueues    {figures['replayed_enqueues']} replayed under "
        f"{len(record.replays.calls)} idempotency keys",
        "",
        "invariants",
    ]
    for check in checks:
        lines.append(f"  {'ok  ' if check.ok else 'FAIL'} {check.name}: {check.summary}")
        lines += [f"         - {problem}" for problem in check.problems[:8]]
        if len(check.problems) > 8:
            lines.append(f"         - ... {len(check.problems) - 8} more")
    for note in record.notes:
        lines.append(f"  note {note}")
    return "\n".join(lines)


def to_json(record: RunRecord, checks: list[Check], figures: dict[str, Any]) -> str:
    data = {
        "record": dataclasses.asdict(record),
        "checks": [dataclasses.asdict(c) | {"problems": c.problems[:50]} for c in checks],
        "figures": figures,
    }
    return json.dumps(data, indent=2, default=str)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"
