"""Soak: a sustained enqueue and claim load for minutes, watching the table age.

``python -m bench.soak [--minutes 3] [--rate 500]``: worker processes drain a steady stream of
no-op jobs while the workers' own prune step deletes finished jobs past a short retention. Every
sample prints dead tuples, table and index sizes, the ready backlog and the claim latency (a
probe claims batches of 10 from the workers' queue beside them, as a worker does, floors
included). A summary then compares the last third of the steady state with its first third:
the figures should stay flat, not grow with the history that went by.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench import harness
from bench.report import _fmt, _table

DATABASE = "bench_soak"
TABLES = ("pgjobs_job", "pgjobs_attempt")


def _stats_sql() -> str:
    return (
        "SELECT relname, n_live_tup, n_dead_tup, pg_relation_size(relid), pg_indexes_size(relid),"
        " pg_total_relation_size(relid), autovacuum_count FROM pg_stat_user_tables"
        " WHERE relname = ANY(%s)"
    )


class Producer(threading.Thread):
    """Enqueue ``rate`` jobs a second in batches every tenth of a second, until stopped."""

    def __init__(self, rate: int) -> None:
        super().__init__(daemon=True)
        self.rate = rate
        self.enqueued = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        from django.db import connections, transaction

        from django_pgjobs import JobSpec, enqueue_many

        per_tick = max(1, self.rate // 10)
        next_tick = time.monotonic()
        try:
            while not self.stopping.is_set():
                with transaction.atomic():
                    enqueue_many([JobSpec.of("bench.noop", {"n": self.enqueued + i})
                                  for i in range(per_tick)])
                self.enqueued += per_tick
                next_tick += 0.1
                self.stopping.wait(max(0.0, next_tick - time.monotonic()))
        finally:
            connections.close_all()


class Vacuumer(threading.Thread):
    """VACUUM the queue tables every ``interval`` seconds: autovacuum's part, when it is off."""

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.runs = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            harness.execute(DATABASE, "VACUUM (ANALYZE) pgjobs_job, pgjobs_attempt")
            self.runs += 1


class SnapshotHolder(threading.Thread):
    """Hold a REPEATABLE READ snapshot open on the soak's database for ``seconds``, from
    ``after`` seconds into the run: what an analytics query, a session idle in transaction or a
    lagging slot does to vacuum's horizon."""

    def __init__(self, after: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.after, self.seconds = after, seconds
        self.stopping = threading.Event()
        self.held: tuple[float, float] | None = None  # monotonic start and end of the hold

    def run(self) -> None:
        import psycopg
        from django.db import connection

        if self.stopping.wait(self.after):
            return
        params = connection.get_connection_params()
        for key in ("cursor_factory", "context"):
            params.pop(key, None)
        with psycopg.connect(**params, application_name="soak-held-snapshot") as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM pgjobs_job").fetchone()
            started = time.monotonic()
            self.stopping.wait(self.seconds)
            conn.rollback()
            self.held = (started, time.monotonic())


class QueueProbe(threading.Thread):
    """Claim batches of 10 from the workers' queue beside them, every ``interval`` seconds, as
    a worker does (floors included, while the horizon is held: ``worker.floors``), settle what
    it took, and time each claim; ``taken()`` hands over the timings since it was last asked."""

    def __init__(self, interval: float = 0.05, batch: int = 10) -> None:
        super().__init__(daemon=True)
        self.interval, self.batch = interval, batch
        self.stopping = threading.Event()
        self._timings: list[float] = []
        self._lock = threading.Lock()
        self._from_floors = 0  # of the claims since ``taken`` was last asked

    def run(self) -> None:
        from django.db import connections

        from django_pgjobs.outcomes import Outcome
        from django_pgjobs.transitions import claim_jobs, settle
        from django_pgjobs.worker.floors import ClaimFloors, HorizonWatch

        floors = ClaimFloors()
        watch = HorizonWatch(floors)
        worker = f"soak-probe-{uuid.uuid4().hex[:6]}"
        watched = 0.0
        try:
            while not self.stopping.wait(self.interval):
                if time.monotonic() - watched >= 5.0:  # a worker's rescue cadence
                    watch()
                    watched = time.monotonic()
                start_from = floors.start("default")
                start = time.perf_counter()
                jobs = claim_jobs(worker, "default", self.batch, floors=start_from)
                took = (time.perf_counter() - start) * 1000
                floors.claimed("default", jobs, limit=self.batch,
                               full_seconds=None if start_from is not None else took / 1000)
                with self._lock:
                    self._timings.append(took)
                    self._from_floors += start_from is not None
                if jobs:
                    settle([Outcome.succeeded(j, "null", 0) for j in jobs])
        finally:
            connections.close_all()

    def taken(self) -> tuple[list[float], int]:
        """The claims' timings since this was last asked, and how many started from floors."""
        with self._lock:
            timings, self._timings = self._timings, []
            from_floors, self._from_floors = self._from_floors, 0
        return timings, from_floors


def sample(elapsed: float, producer: Producer, vacuums: int, probe: QueueProbe
           ) -> dict[str, Any]:
    from django.db import connection

    timings, from_floors = probe.taken()
    claims = timings or [float("nan")]
    with connection.cursor() as cursor:
        cursor.execute(_stats_sql(), [list(TABLES)])
        tables = {row[0]: row[1:] for row in cursor.fetchall()}
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'ready'), "
                       "count(*) FILTER (WHERE status = 'succeeded') FROM pgjobs_job")
        ready, finished = cursor.fetchone()
    job, attempt = tables["pgjobs_job"], tables["pgjobs_attempt"]
    return {
        "t": round(elapsed), "enqueued": producer.enqueued, "ready": ready, "finished": finished,
        "job_live": job[0], "job_dead": job[1], "job_table_mb": job[2] / 2**20,
        "job_index_mb": job[3] / 2**20, "job_total_mb": job[4] / 2**20,
        "job_vacuums": job[5] + vacuums, "attempt_dead": attempt[1],
        "attempt_total_mb": attempt[4] / 2**20,
        "claim_p50_ms": harness.percentile(claims, 50),
        "claim_max_ms": max(claims),
        # Whether the probe claimed from floors, and how busy the machine was: a slow sample
        # says whether it was the claims' plan or the machine.
        "probe_claims": len(timings), "from_floors": from_floors,
        "load_average": os.getloadavg()[0],
    }


def _row(s: dict[str, Any]) -> list[str]:
    return [str(s["t"]), f"{s['enqueued']:,}", f"{s['ready']:,}", f"{s['finished']:,}",
            f"{s['job_dead']:,}", _fmt(s["job_table_mb"], 1), _fmt(s["job_index_mb"], 1),
            _fmt(s["attempt_total_mb"], 1), str(s["job_vacuums"]),
            _fmt(s["claim_p50_ms"], 2), _fmt(s["claim_max_ms"], 2),
            f"{s['from_floors']}/{s['probe_claims']}", _fmt(s["load_average"], 2)]


HEADERS = ["s", "enqueued", "ready", "finished rows", "job dead tuples", "job table MB",
           "job indexes MB", "attempt total MB", "vacuums", "claim p50 ms", "claim max ms",
           "from floors", "load"]


def hold_summary(samples: list[dict[str, Any]], hold_from: float, hold_to: float) -> str:
    """The steady state just before the held snapshot beside the last samples under it."""
    before = [s for s in samples if s["t"] <= hold_from][-3:]
    during = [s for s in samples if hold_from < s["t"] <= hold_to][-3:]
    if not before or not during:
        return "(too few samples around the hold)"
    return _compare(before, during, ["figure", "before the hold", "end of the hold",
                                     "end ÷ before"],
                    [*FIGURES[:3], FIGURES[4], ("claim_max_ms", "claim max ms")])


FIGURES = (("job_total_mb", "job table + indexes MB"),
           ("attempt_total_mb", "attempt table + indexes MB"),
           ("job_dead", "job dead tuples"), ("finished", "finished rows kept"),
           ("claim_p50_ms", "claim p50 ms"))


def _compare(first: list[dict[str, Any]], last: list[dict[str, Any]], headers: list[str],
             figures: Any) -> str:
    """Each figure's mean over ``first`` and over ``last``, and their ratio, as a table."""
    rows = []
    for key, label in figures:
        a = sum(s[key] for s in first) / len(first)
        b = sum(s[key] for s in last) / len(last)
        rows.append([label, _fmt(a, 2), _fmt(b, 2), _fmt(b / a, 2) if a else "n/a"])
    return _table(headers, rows)


def summary(samples: list[dict[str, Any]], warmup_seconds: float) -> str:
    """Compare the last third of the steady state with its first third.

    The steady state starts once the first finished jobs have passed retention and been pruned,
    and a vacuum has followed: before that the history is still filling up, as it should.
    """
    steady = [s for s in samples if s["t"] > warmup_seconds] or samples
    samples = steady
    third = max(1, len(samples) // 3)
    return _compare(samples[:third], samples[-third:],
                    ["figure", "first third", "last third", "last ÷ first"], FIGURES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=500, help="jobs enqueued per second")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--sample-seconds", type=float, default=15.0)
    parser.add_argument("--retention-seconds", type=float, default=30.0,
                        help="retention of finished jobs for the workers' prune step")
    parser.add_argument("--prune-interval", type=float, default=5.0)
    parser.add_argument("--vacuum-seconds", type=float, default=30.0,
                        help="when the server's autovacuum is off, VACUUM the queue tables this "
                             "often (0: never, to see what happens without vacuum)")
    parser.add_argument("--hold-snapshot", type=float, default=0.0, metavar="SECONDS",
                        help="hold a REPEATABLE READ snapshot open this long, from the start "
                             "of the steady state (0: none)")
    parser.add_argument("--no-floors", action="store_true",
                        help="claims never start from floors, even while the snapshot is held "
                             "(PGJOBS_CLAIM_FLOORS_AFTER_SECONDS = 0), to compare")
    parser.add_argument("--output", type=Path,
                        default=harness.ROOT / "bench" / "results" / "soak.json")
    args = parser.parse_args()

    autovacuum = harness.execute("postgres", "SHOW autovacuum")[0][0] == "on"
    harness.recreate_database(DATABASE)
    harness.manage(DATABASE, "migrate", "--verbosity", "0")
    overrides = {
        "PGJOBS_RETENTION_SECONDS": dict.fromkeys(("succeeded", "cancelled", "dead"),
                                                  args.retention_seconds),
        "PGJOBS_PRUNE_INTERVAL_SECONDS": args.prune_interval,
        "PGJOBS_CLAIM_FLOORS_AFTER_SECONDS": 0 if args.no_floors else 30.0,
    }
    env = harness.child_env(DATABASE, BENCH_PGJOBS_SETTINGS=json.dumps(overrides))
    os.environ.update({k: env[k] for k in ("DJANGO_SETTINGS_MODULE", "BENCH_DB_NAME",
                                           "BENCH_DATABASE_URL", "BENCH_PGJOBS_SETTINGS")})
    import django

    django.setup()

    print(f"soak: {args.minutes} min, {args.rate} jobs/s, {args.workers} worker processes, "
          f"retention {args.retention_seconds} s, prune every {args.prune_interval} s",
          file=sys.stderr)
    vacuumer = Vacuumer(args.vacuum_seconds)
    if autovacuum:
        print("soak: the server's autovacuum is on and does the vacuuming", file=sys.stderr)
    elif args.vacuum_seconds > 0:
        print(f"soak: the server's autovacuum is off: the soak runs VACUUM (ANALYZE) on the "
              f"queue tables every {args.vacuum_seconds} s in its place", file=sys.stderr)
        vacuumer.start()
    else:
        print("soak: autovacuum is off and --vacuum-seconds 0: nothing vacuums", file=sys.stderr)
    command = [harness.PYTHON, harness.MANAGE, "pgjobs_worker", "--queue", "default",
               "--log-level", "WARNING"]
    workers = harness.Workers.start([command] * args.workers, env,
                                    harness.ROOT / "bench" / "results" / "logs" / "soak.log")
    producer = Producer(args.rate)
    probe = QueueProbe()
    samples: list[dict[str, Any]] = []
    warmup = args.retention_seconds + args.prune_interval + args.vacuum_seconds
    holder = SnapshotHolder(warmup, args.hold_snapshot)
    start = time.monotonic()
    producer.start()
    probe.start()
    if args.hold_snapshot > 0:
        print(f"soak: a REPEATABLE READ snapshot is held from {warmup:.0f} s for "
              f"{args.hold_snapshot:.0f} s", file=sys.stderr)
        holder.start()
    print(" | ".join(HEADERS))
    try:
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            time.sleep(min(args.sample_seconds, max(0.0, args.minutes * 60 - elapsed)))
            samples.append(sample(time.monotonic() - start, producer, vacuumer.runs, probe))
            print(" | ".join(_row(samples[-1])), flush=True)
    finally:
        producer.stopping.set()
        probe.stopping.set()
        vacuumer.stopping.set()
        holder.stopping.set()
        producer.join(10)
        probe.join(10)
        workers.stop()
    print()
    print(_table(HEADERS, [_row(s) for s in samples]))
    print()
    print(f"steady state: the samples after {warmup:.0f} s (retention, one prune interval and one "
          "vacuum interval)")
    print(summary(samples, warmup))
    print(f"the probe made {sum(s['from_floors'] for s in samples):,} of its claims from floors")
    if args.hold_snapshot > 0:
        hold_to = warmup + args.hold_snapshot
        print()
        print(f"held snapshot: the steady state before {warmup:.0f} s beside the end of the "
              f"hold ({hold_to:.0f} s)")
        print(hold_summary(samples, warmup, hold_to))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"args": vars(args) | {"output": str(args.output)},
                                       "server_autovacuum": autovacuum, "samples": samples},
                                      indent=2))


if __name__ == "__main__":
    main()
