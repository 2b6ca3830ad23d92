"""The failover harness: ``python -m tests.harness.failover [--mode sync|async|both]``.

A private primary and a streaming standby made from it with ``pg_basebackup -R`` (the embedded
distribution's binaries), workers and an enqueuer on one connection string that lists both
servers with ``target_session_attrs=read-write``. Mid-drain the primary is stopped the way a
crash stops it (``pg_ctl stop -m immediate``) and the standby is promoted; the workers must find
it and finish the work. Each enqueue is an order row and its charge job in one transaction; each
charge writes a ledger row under an idempotency receipt.

Synchronous replication: every invariant must hold (every acknowledged enqueue exists, an order
and its job are both there or both gone, every job ends, no order is charged twice). Asynchronous:
what was lost and what ran twice is reported, not failed; the order-and-job pairing must still
hold. The exit status is 0 only if every checked invariant held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

SETTLE_SECONDS = 90.0


@dataclass
class Enqueuer:
    """Orders and their charge jobs, one transaction each, as fast as the server commits them;
    ``acked`` are the references whose commit returned."""

    acked: list[str] = field(default_factory=list)
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # each refusal's first line, counted
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self, per_second: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(per_second,), daemon=True)
        self._thread.start()

    def _run(self, per_second: float) -> None:
        from django.db import DatabaseError, connection, transaction

        import django_pgjobs
        from testproject.demo.models import Order

        n = 0
        while not self._stop.is_set():
            # A fresh reference per try: a commit whose reply was lost may have happened, and
            # trying its reference again would fail on the unique reference for ever.
            reference = f"FO-{n:06d}"
            n += 1
            try:
                with transaction.atomic():
                    order = Order.objects.create(reference=reference, amount_cents=100 + n)
                    django_pgjobs.enqueue("demo.charge", {"order_id": order.pk,
                                                          "reference": reference})
                self.acked.append(reference)
            except DatabaseError as exc:
                self.failed += 1
                said = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                self.errors[said[:160]] = self.errors.get(said[:160], 0) + 1
                connection.close()  # the next try reconnects, to whichever server writes
                self._stop.wait(0.05)
            self._stop.wait(1.0 / per_second)
        connection.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    enforced: bool = True


def run_mode(mode: str, workdir: Path, *, workers: int, seconds: float) -> tuple[list[Check],
                                                                                 dict[str, Any]]:
    from django.core.management import call_command
    from django.db import connection, connections

    from tests.clusters import Standby
    from tests.harness.pool import TIMINGS, WorkerPool
    from tests.harness.server import PrivateServer

    (workdir / "primary").mkdir(parents=True)
    primary = PrivateServer(workdir / "primary")
    standby: Standby | None = None
    pool: WorkerPool | None = None
    try:
        primary.create_database("failover")
        if mode == "sync":
            with psycopg.connect(host=primary.socket_dir, port=primary.port, user="postgres",
                                 dbname="postgres", autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
        # The standby's copy of the configuration must not make it wait, once promoted, for a
        # synchronous standby of its own that no one made (Patroni and managed services
        # rewrite this at a failover).
        standby = Standby(primary, workdir / "standby",
                          settings={"synchronous_standby_names": ""})
        url = (f"postgres://postgres@/failover?host={quote(primary.socket_dir)},"
               f"{quote(standby.socket_dir)}&port={primary.port},{standby.port}"
               "&target_session_attrs=read-write&connect_timeout=3")
        os.environ["DATABASE_URL"] = url
        connections["default"].settings_dict["OPTIONS"] = {
            "host": f"{primary.socket_dir},{standby.socket_dir}",
            "port": f"{primary.port},{standby.port}",
            "target_session_attrs": "read-write", "connect_timeout": 3,
        }
        connection.close()
        call_command("migrate", verbosity=0)
        connection.close()
        if mode == "sync":
            _wait_sync(primary)
        standby.wait_for(primary, "failover")

        env = {**os.environ, **TIMINGS, "DATABASE_URL": url, "PGJOBS_LOG_LEVEL": "INFO"}
        env.pop("PGJOBS_DATABASE_NAME", None)
        pool = WorkerPool(workers, ["--concurrency", "2", "--batch-size", "5",
                                    "--shutdown-grace", "10"], env, workdir / "logs")
        pool.start()
        pool.wait_started(60)
        enqueuer = Enqueuer()
        enqueuer.start(per_second=60)
        time.sleep(seconds / 2)

        # The failover: the primary dies as in a crash, the standby is promoted.
        killed = time.monotonic()
        primary._embedded.pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=primary.pgdata,
                                 user=primary._server.system_user, timeout=60)
        primary._embedded.pg_ctl(["-w", "promote"], pgdata=standby.pgdata,
                                 user=primary._server.system_user, timeout=60)
        promoted = time.monotonic()
        acked_before = len(enqueuer.acked)
        resumed = _first_settlement_after(standby, promoted_wall=time.time())
        time.sleep(seconds / 2)
        enqueuer.stop()
        acked_after = len(enqueuer.acked) - acked_before
        drained = _wait_drained(standby)
        codes = pool.shutdown(30)
        pool = None
        figures = {
            "mode": mode, "acknowledged enqueues": len(enqueuer.acked),
            "enqueues refused during the failover": enqueuer.failed,
            "why they were refused": enqueuer.errors,
            "promote took s": round(promoted - killed, 2),
            "workers resumed s after the kill": None if resumed is None
            else round(resumed - killed, 2),
            "workers exited": codes,
        }
        figures["acknowledged enqueues after the promotion"] = acked_after
        checks = [
            Check("workers settled jobs on the promoted standby", resumed is not None,
                  "no settlement seen on the new primary" if resumed is None
                  else f"{resumed - killed:.2f}s after the kill"),
            Check("enqueues went on against the promoted standby", acked_after > 0,
                  f"{acked_after} acknowledged after the promotion"),
            *_check(mode, standby, enqueuer.acked, drained, codes),
        ]
        return checks, figures
    finally:
        if pool is not None:
            pool.shutdown(10)
        connections.close_all()
        if standby is not None:
            standby.close()
        primary.close()


def _connect(server: Any) -> psycopg.Connection:
    return psycopg.connect(host=server.socket_dir, port=server.port, user="postgres",
                           dbname="failover", autocommit=True)


def _wait_sync(primary: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(host=primary.socket_dir, port=primary.port, user="postgres",
                             dbname="postgres", autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication "
                               "WHERE sync_state = 'sync'").fetchone()
        if row and row[0]:
            return
        time.sleep(0.1)
    raise RuntimeError("the standby never became synchronous")


def _first_settlement_after(server: Any, *, promoted_wall: float,
                            timeout: float = 60.0) -> float | None:
    """When (monotonic) the new primary first shows a job settled after the promotion."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with _connect(server) as conn:
                row = conn.execute("SELECT count(*) FROM pgjobs_job WHERE finished_at > "
                                   "to_timestamp(%s)", [promoted_wall]).fetchone()
            if row and row[0]:
                return time.monotonic()
        except psycopg.Error:
            pass
        time.sleep(0.05)
    return None


def _wait_drained(server: Any) -> bool:
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        with _connect(server) as conn:
            row = conn.execute("SELECT count(*) FROM pgjobs_job WHERE status NOT IN "
                               "('succeeded', 'dead', 'cancelled')").fetchone()
        if row and row[0] == 0:
            return True
        time.sleep(0.2)
    return False


def _check(mode: str, server: Any, acked: list[str], drained: bool,
           codes: dict[str, int | None]) -> list[Check]:
    with _connect(server) as conn:
        orders = {ref: pk for pk, ref in conn.execute(
            "SELECT id, reference FROM demo_order WHERE reference LIKE 'FO-%%'").fetchall()}
        jobs = [row[0] for row in conn.execute(
            "SELECT (payload->>'order_id')::bigint FROM pgjobs_job "
            "WHERE task = 'demo.charge'").fetchall()]
        unfinished = conn.execute("SELECT count(*) FROM pgjobs_job WHERE status NOT IN "
                                  "('succeeded', 'dead', 'cancelled')").fetchone()
        twice = conn.execute("SELECT count(*) FROM (SELECT key FROM demo_ledgerentry "
                             "WHERE kind = 'charge' GROUP BY key HAVING count(*) > 1) AS d"
                             ).fetchone()
        dead = conn.execute("SELECT count(*) FROM pgjobs_job WHERE status = 'dead'").fetchone()
    lost = [ref for ref in acked if ref not in orders]
    unacknowledged = len(set(orders) - set(acked))
    with_job = set(jobs)
    alone = [ref for ref, pk in orders.items() if pk not in with_job]
    orphans = [pk for pk in with_job if pk not in set(orders.values())]
    sync = mode == "sync"
    return [
        Check("every acknowledged enqueue exists after the failover", not lost,
              f"{len(lost)} of {len(acked)} acknowledged orders missing", enforced=sync),
        Check("an order and its job are both there or both gone", not alone and not orphans,
              f"{len(alone)} orders without their job, {len(orphans)} jobs without their order"),
        Check("every job ended", drained and unfinished is not None and unfinished[0] == 0,
              f"{unfinished[0] if unfinished else '?'} jobs not finished"),
        Check("no order charged twice", twice is not None and twice[0] == 0,
              f"{twice[0] if twice else '?'} orders charged more than once", enforced=sync),
        Check("no charge ended dead", dead is not None and dead[0] == 0,
              f"{dead[0] if dead else '?'} jobs dead"),
        Check("every worker drained and exited 0", all(c == 0 for c in codes.values()),
              f"exit codes {codes}"),
        # Not an invariant: an enqueue whose reply the crash cut off may have committed. The
        # caller saw an error; an idempotency key makes its retry safe.
        Check("enqueues that committed though their caller saw an error", True,
              f"{unacknowledged} (the crash cut off the reply)", enforced=False),
    ]


def render(mode: str, checks: list[Check], figures: dict[str, Any]) -> str:
    lines = [f"failover, {mode} replication"]
    lines += [f"  {name}: {value}" for name, value in figures.items() if name != "mode"]
    for check in checks:
        mark = "ok" if check.ok else ("FAIL" if check.enforced else "reported")
        lines.append(f"  [{mark}] {check.name}: {check.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.failover", description=__doc__)
    parser.add_argument("--mode", choices=["sync", "async", "both"], default="both")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="how long the enqueuer runs, half before the failover")
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    parser.add_argument("--json", type=Path, help="also write each mode's checks and figures")
    args = parser.parse_args(argv)

    os.environ.pop("PGJOBS_DATABASE_NAME", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    # Django's settings need a DATABASE_URL to start; each mode points it at its own servers.
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@/failover?host=/nonexistent")
    import django

    django.setup()
    ok = True
    report: dict[str, Any] = {}
    for mode in (["sync", "async"] if args.mode == "both" else [args.mode]):
        workdir = Path(tempfile.mkdtemp(prefix=f"pgjobs-failover-{mode}-"))
        try:
            checks, figures = run_mode(mode, workdir, workers=args.workers,
                                       seconds=args.seconds)
            print(render(mode, checks, figures), flush=True)
            ok = ok and all(c.ok for c in checks if c.enforced)
            report[mode] = {"checks": [vars(c) for c in checks], "figures": figures}
        finally:
            if args.keep:
                print(f"  logs: {workdir / 'logs'}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
