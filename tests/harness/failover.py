"""The failover harness: ``python -m tests.harness.failover [--mode sync|async|readonly|all]``.

A private primary and a streaming standby made from it with ``pg_basebackup -R`` (the embedded
distribution's binaries), workers and an enqueuer on one connection string that lists both
servers with ``target_session_attrs=read-write``. Each enqueue is an order row and its charge job
in one transaction; each charge writes a ledger row under an idempotency receipt. Mid-drain the
primary stops taking writes (the switch) and the standby is promoted; the workers must find it
and finish the work. Three ways, one run each (``all``, the default, runs the three in turn):

- ``sync``: synchronous replication; the primary is stopped as a crash stops it
  (``pg_ctl stop -m immediate``). Every invariant must hold: every acknowledged enqueue exists,
  an order and its job are both there or both gone, every job ends, no order is charged twice.
- ``async``: asynchronous replication with a forced window of lag. A few slower charges are
  enqueued and replicated; then the standby's WAL receiver is cut off (its ``primary_conninfo``
  emptied and the configuration reloaded: the standby stays up, it only stops receiving) and
  the primary goes on committing for a second, the slower charges running and settling in
  that second, before it is crashed. The crashed primary is then started again on its own, and
  what it had committed is compared with the promoted standby: acknowledged enqueues,
  settlements and receipts lost, charges that ran on both servers. Those are reported; the
  order-and-job pairing, every job ending and the window having lost something are enforced.
- ``readonly``: synchronous replication; the primary is not stopped but turned read-only for
  every session, open ones included (``default_transaction_read_only`` set and the
  configuration reloaded; a session opened before must see it), and the standby is promoted
  once it has all the primary committed. Workers still connected to the old primary have their
  writes refused (SQLSTATE 25006), and the host list's ``target_session_attrs=read-write``
  must take their reconnects to the new one. Enforced besides the sync invariants: every
  worker settles jobs on the new primary within 10 s of the switch, and its listener leaves
  the old primary with it (a listener writes nothing, so no refusal tells it); single jobs
  enqueued on the new primary once its backlog is drained are claimed in under 0.5 s (the
  median), woken by a notification, where the run's workers poll only every 2 s; nothing the old
  primary committed is missing from the new one; the workers' logs explain the refusals as a
  read-only server.

The exit status is 0 only if every enforced check held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg

MODES = ("sync", "async", "readonly")
SETTLE_SECONDS = 90.0
# async: how long the primary goes on committing after its standby stopped receiving WAL.
LAG_SECONDS = 1.0
# async: slower charges enqueued, and replicated, just before the standby stops receiving: they
# run and settle inside the window, so it holds settlements and effects, not only enqueues.
SLOW_CHARGES = 4
SLOW_CHARGE_SECONDS = 0.25
# readonly: every worker must settle on the new primary this soon after the switch (a reconnect
# backs off at most 5 s; a listener's ping of its server comes every 30 s).
RESUME_SECONDS = 10.0
# readonly: how long after its worker a listener may take to leave the old primary: well over
# its reconnect on a shared machine, well under the 30 s of its periodic ping.
LISTENER_GRACE_SECONDS = 5.0
# readonly: the enqueues stopped, how soon the new primary's backlog must be drained.
READONLY_DRAIN_SECONDS = 10.0
# readonly: the poll interval of the run's workers, long enough that a pickup woken by a
# notification (milliseconds) and one found by a poll (a fraction of the interval, the
# executors' polls being spread over it) cannot be mistaken for each other.
READONLY_POLL_SECONDS = 2.0
# readonly: single jobs enqueued on the new primary, once its workers are on it, to time pickups.
PROBES = 9
PROBE_SPACING_SECONDS = 0.3
# A pickup woken by a notification takes milliseconds, one found by a poll about half the poll
# interval: the median probe must be under this, a quarter of the interval, which tells the two
# apart on a busy machine too.
NOTIFIED_PICKUP_SECONDS = READONLY_POLL_SECONDS / 4
TERMINAL = "('succeeded', 'dead', 'cancelled')"


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
    synchronous = mode in ("sync", "readonly")
    try:
        primary.create_database("failover")
        if synchronous:
            _admin(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
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
        if synchronous:
            _wait_sync(primary)
        standby.wait_for(primary, "failover")

        timings = dict(TIMINGS)
        if mode == "readonly":
            timings["PGJOBS_POLL_INTERVAL_SECONDS"] = str(READONLY_POLL_SECONDS)
        env = {**os.environ, **timings, "DATABASE_URL": url, "PGJOBS_LOG_LEVEL": "INFO"}
        env.pop("PGJOBS_DATABASE_NAME", None)
        pool = WorkerPool(workers, ["--concurrency", "2", "--batch-size", "5",
                                    "--shutdown-grace", "10"], env, workdir / "logs")
        pool.start()
        pool.wait_started(60)
        worker_ids = [m.worker_id for m in pool.running()]
        enqueuer = Enqueuer()
        enqueuer.start(per_second=60)
        time.sleep(seconds / 2)

        figures: dict[str, Any] = {"mode": mode}
        checks: list[Check] = []
        watch: ListenerWatch | None = None
        if mode == "async":
            enqueuer.acked += _enqueue_slow(SLOW_CHARGES, SLOW_CHARGE_SECONDS)
            figures.update(_open_lag_window(primary, standby))
        switched = time.monotonic()
        if mode == "readonly":
            watch = ListenerWatch(primary, switched)
            watch.start()
            checks.append(_turn_read_only(primary, standby, switched, figures))
        else:
            # The primary dies as in a crash.
            _pg_ctl(primary, ["-w", "-m", "immediate", "stop"], primary.pgdata)
        promote_wall = time.time()
        _pg_ctl(primary, ["-w", "promote"], standby.pgdata)
        promoted = time.monotonic()
        acked_before = len(enqueuer.acked)
        settled_by = _each_worker_settled(standby, worker_ids, promote_wall, switched,
                                          timeout=RESUME_SECONDS if watch else 30.0)
        resumed = min((t for t in settled_by.values() if t is not None), default=None)
        time.sleep(seconds / 2)
        enqueuer.stop()
        acked_after = len(enqueuer.acked) - acked_before
        old_state: dict[str, dict[str, Any]] | None = None
        if watch is not None:
            checks += _after_read_only(primary, standby, workers, switched, settled_by, watch,
                                       figures)
            old_state = _state(primary)  # as it was at the switch: it has written nothing since
            # The old primary retired, as an operator would once the failover is done: whatever
            # is still connected to it reconnects, and the rest of the run checks the data.
            _pg_ctl(primary, ["-w", "-m", "fast", "stop"], primary.pgdata)
        drained = _wait_drained(standby)
        codes = pool.shutdown(30)
        exits = [f"{e.worker_id} exited {e.returncode}" for e in pool.exits]
        logs = _read_only_lines(workdir / "logs")
        pool = None
        connections.close_all()
        if old_state is None:
            # The crashed primary, started again on its own (no worker can reach it any more:
            # they have exited), says what it had committed that the new primary lacks.
            _restart(primary)
            old_state = _state(primary)
        comparison = _compare(old_state, standby, enqueuer.acked)

        figures.update({
            "acknowledged enqueues": len(enqueuer.acked),
            "enqueues refused during the failover": enqueuer.failed,
            "why they were refused": enqueuer.errors,
            "promoted s after the switch": round(promoted - switched, 2),
            "workers resumed s after the switch": resumed,
            "each worker's first settlement on the new primary s after the switch": settled_by,
            "acknowledged enqueues after the promotion": acked_after,
            "worker log lines saying read-only": logs,
            "workers exited": codes,
        })
        figures.update(comparison)
        every_worker = all(v is not None for v in settled_by.values())
        checks += [
            *([] if watch else [
                Check("workers settled jobs on the promoted standby", resumed is not None,
                      "no settlement seen on the new primary" if resumed is None
                      else f"{resumed}s after the switch"),
                Check("every worker settled jobs on the promoted standby", every_worker,
                      f"first settlement s after the switch, by worker: {settled_by}",
                      enforced=False)]),
            Check("enqueues went on against the promoted standby", acked_after > 0,
                  f"{acked_after} acknowledged after the promotion"),
            *_check(mode, standby, enqueuer.acked, drained, codes, exits),
        ]
        checks += _comparison_checks(mode, comparison, logs)
        return checks, figures
    finally:
        if pool is not None:
            pool.shutdown(10)
        connections.close_all()
        if standby is not None:
            standby.close()
        primary.close()


def _connect(server: Any, dbname: str = "failover") -> psycopg.Connection:
    return psycopg.connect(host=server.socket_dir, port=server.port, user="postgres",
                           dbname=dbname, autocommit=True, connect_timeout=5)


def _admin(server: Any, *statements: str) -> None:
    with _connect(server, "postgres") as conn:
        for statement in statements:
            conn.execute(statement)
        conn.execute("SELECT pg_reload_conf()")


def _pg_ctl(primary: Any, args: list[str], pgdata: Path) -> None:
    primary._embedded.pg_ctl(args, pgdata=pgdata, user=primary._server.system_user,
                             timeout=60)


def _restart(server: Any) -> None:
    """Start a server stopped by ``pg_ctl stop -m immediate`` (crash recovery runs)."""
    server._server.ensure_postgres_running()
    info = server._server.get_postmaster_info()
    server.socket_dir = str(info.socket_dir)
    server.port = int(info.port or 5432)


def _wait_sync(primary: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _connect(primary, "postgres") as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication "
                               "WHERE sync_state = 'sync'").fetchone()
        if row and row[0]:
            return
        time.sleep(0.1)
    raise RuntimeError("the standby never became synchronous")


def _open_lag_window(primary: Any, standby: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Stop the standby receiving WAL while it stays up, then let the primary commit for
    ``LAG_SECONDS``: what it commits meanwhile reaches no standby.

    ``pg_wal_replay_pause()`` would not do: it pauses replay, but the WAL receiver goes on
    receiving and flushing, and a promotion replays all of it. Stopping the standby would do,
    but it would have to start again before its promotion. ``primary_conninfo`` is reloadable
    (since PostgreSQL 13): emptied, the WAL receiver stops and none starts again. Both ends are
    watched until the connection is gone (``pg_stat_wal_receiver`` on the standby,
    ``pg_stat_replication`` on the primary).
    """
    standby.wait_for(primary, "failover")  # the slow charges are on the standby
    started = time.monotonic()
    _admin(standby, "ALTER SYSTEM SET primary_conninfo = ''")
    deadline = started + timeout
    while True:
        with _connect(standby, "postgres") as conn:
            receiving = conn.execute("SELECT count(*) FROM pg_stat_wal_receiver").fetchone()
        with _connect(primary, "postgres") as conn:
            sending = conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()
        if receiving and sending and receiving[0] == 0 and sending[0] == 0:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the standby's WAL receiver did not stop")
        time.sleep(0.05)
    cut = time.monotonic() - started
    time.sleep(LAG_SECONDS)
    return {"standby stopped receiving s": round(cut, 2), "lag window s": LAG_SECONDS,
            "WAL bytes the standby never received": _unreceived(primary, standby)}


def _unreceived(primary: Any, standby: Any) -> int | None:
    """How far the primary's WAL is ahead of what the standby received, in bytes."""
    with _connect(primary) as conn:
        [written] = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone() or [None]
    with _connect(standby) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_receive_lsn())::bigint",
                           [written]).fetchone()
    return None if row is None else row[0]


def _turn_read_only(primary: Any, standby: Any, switched: float,
                    figures: dict[str, Any]) -> Check:
    """Make the primary refuse writes in every session, open ones included, and return once
    the standby has everything it committed.

    ``default_transaction_read_only`` is a reloadable setting: a backend applies a reload before
    the next command it reads, so each session's next transaction starts read-only (one already
    open keeps its mode until it ends). A session opened before the switch proves it: it must
    report ``transaction_read_only`` on and have a write refused with SQLSTATE 25006.
    """
    witness = _connect(primary)
    try:
        before = witness.execute("SHOW transaction_read_only").fetchone()
        _admin(primary, "ALTER SYSTEM SET default_transaction_read_only = on")
        seen: float | None = None
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            row = witness.execute("SHOW transaction_read_only").fetchone()
            if row and row[0] == "on":
                seen = time.monotonic()
                break
            time.sleep(0.01)
        refused = ""
        try:
            witness.execute("UPDATE demo_order SET charged = charged WHERE false")
        except psycopg.Error as exc:
            refused = exc.sqlstate or ""
    finally:
        witness.close()
    figures["old primary read-only for an open session s after the switch"] = (
        None if seen is None else round(seen - switched, 3))
    _wait_old_transactions(primary)
    standby.wait_for(primary, "failover")
    return Check("an open session on the old primary saw it turn read-only",
                 seen is not None and refused == "25006",
                 f"an open session's transaction_read_only went from "
                 f"{before[0] if before else '?'} to {'on' if seen else 'off'}; its write was "
                 f"{'refused with SQLSTATE ' + refused if refused else 'not refused'}")


def _wait_old_transactions(primary: Any, timeout: float = 30.0) -> None:
    """Wait until no transaction the switch found open on the primary (read-write, begun
    before it) is still running: once they end, the primary writes nothing more."""
    with _connect(primary) as conn:
        [cutoff] = conn.execute("SELECT clock_timestamp()").fetchone() or [None]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() AND xact_start < %s", [cutoff]).fetchone()
            if row and row[0] == 0:
                return
            time.sleep(0.02)
    raise RuntimeError("transactions begun before the switch did not end")


def _each_worker_settled(server: Any, worker_ids: list[str], promoted_wall: float,
                         switched: float, timeout: float = 30.0) -> dict[str, float | None]:
    """For each worker, seconds from the switch to its first attempt settled on the new primary
    (an attempt row is written by the settlement, or, for a success, the job keeps the worker;
    none of either is written there before the promotion)."""
    found: dict[str, float | None] = dict.fromkeys(worker_ids)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(v is None for v in found.values()):
        with _connect(server) as conn:
            rows = conn.execute("SELECT worker_id FROM pgjobs_attempt "
                                "WHERE finished_at > to_timestamp(%s) "
                                "UNION SELECT lease_owner FROM pgjobs_job "
                                "WHERE status = 'succeeded' AND lease_owner IS NOT NULL "
                                "AND finished_at > to_timestamp(%s)",
                                [promoted_wall, promoted_wall])
            for (worker_id,) in rows.fetchall():
                if worker_id in found and found[worker_id] is None:
                    found[worker_id] = round(time.monotonic() - switched, 2)
        time.sleep(0.05)
    return found


def _wait_drained(server: Any, timeout: float = SETTLE_SECONDS) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with _connect(server) as conn:
            row = conn.execute(f"SELECT count(*) FROM pgjobs_job WHERE status NOT IN {TERMINAL}"
                               ).fetchone()
        if row and row[0] == 0:
            return True
        time.sleep(0.2)
    return False


def _enqueue_slow(count: int, seconds: float) -> list[str]:
    """Enqueue ``count`` charges that take ``seconds`` each; return their references."""
    from django.db import connection, transaction

    import django_pgjobs
    from testproject.demo.models import Order

    references = [f"FO-slow-{n}" for n in range(count)]
    for reference in references:
        with transaction.atomic():
            order = Order.objects.create(reference=reference, amount_cents=1)
            django_pgjobs.enqueue("demo.charge", {"order_id": order.pk, "reference": reference,
                                                  "sleep": seconds})
    connection.close()
    return references


class ListenerWatch(threading.Thread):
    """From the switch on, when (seconds after it) no worker's listener is left on ``server``.

    Gives up a little after a listener's own check of its server (``notify.PING_SECONDS``)."""

    def __init__(self, server: Any, switched: float) -> None:
        super().__init__(name="listener-watch", daemon=True)
        self.server = server
        self.switched = switched
        self.left: float | None = None

    def run(self) -> None:
        from django_pgjobs.notify import PING_SECONDS

        deadline = self.switched + PING_SECONDS + 5.0
        while time.monotonic() < deadline:
            try:
                if _listeners(self.server) == 0:
                    self.left = round(time.monotonic() - self.switched, 2)
                    return
            except psycopg.Error:
                pass
            time.sleep(0.1)


def _moved_checks(settled_by: dict[str, float | None], watch: ListenerWatch) -> list[Check]:
    """readonly: the workers, and then their listeners, left the old primary promptly."""
    times = [t for t in settled_by.values() if t is not None]
    every = len(times) == len(settled_by)
    # A worker that did not move within the bound: its listener is given the bound instead.
    moved = max(times) if every else RESUME_SECONDS
    workers_moved = (f"the last worker moved at {moved}s" if every
                     else f"not every worker had moved by {moved:g}s")
    return [
        Check(f"every worker settled jobs on the new primary within {RESUME_SECONDS:g}s of the "
              f"switch", every and moved <= RESUME_SECONDS,
              f"first settlement there s after the switch: {settled_by} (None: not within "
              f"{RESUME_SECONDS:g}s)"),
        Check("the listeners left the old primary with their workers",
              watch.left is not None and watch.left <= moved + LISTENER_GRACE_SECONDS,
              (f"the last listener left {watch.left}s after the switch" if watch.left
               is not None else "a listener was still on the old primary at the end")
              + f"; {workers_moved}; {LISTENER_GRACE_SECONDS:g}s of grace"),
    ]


def _listeners(server: Any) -> int:
    with _connect(server) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE application_name LIKE 'pgjobs-listener%%'").fetchone()
    return row[0] if row else 0


def _after_read_only(old: Any, new: Any, workers: int, switched: float,
                     settled_by: dict[str, float | None], watch: ListenerWatch,
                     figures: dict[str, Any]) -> list[Check]:
    """readonly, once the enqueues have stopped: how soon the new primary's backlog drained,
    where the listeners are and how fast single jobs are picked up, when the listeners left."""
    started = time.monotonic()
    drained = _wait_drained(new, timeout=READONLY_DRAIN_SECONDS)
    took = round(time.monotonic() - started, 2)
    checks, probed = _probe_listeners(old, new, workers, switched)
    watch.join()
    figures["backlog on the new primary drained s after the enqueues stopped"] = (
        took if drained else None)
    figures.update(probed)
    figures["listeners had all left the old primary s after the switch"] = watch.left
    return [
        Check(f"the new primary's backlog drained within {READONLY_DRAIN_SECONDS:g}s of the "
              f"enqueues stopping", drained,
              f"in {took}s" if drained else f"jobs still waiting after {took}s"),
        *checks, *_moved_checks(settled_by, watch),
    ]


def _probe_listeners(old: Any, new: Any, workers: int,
                     switched: float) -> tuple[list[Check], dict[str, Any]]:
    """Once the enqueues have stopped and the backlog drained (or its bound passed): where the
    listeners are, and how fast single jobs enqueued on the new primary are claimed (a
    notification wakes an idle executor at once; without one, the first poll to come finds it)."""
    from django.db import connection

    import django_pgjobs

    on_old, on_new = _listeners(old), _listeners(new)
    probed = round(time.monotonic() - switched, 2)
    connection.close()
    ids = []
    for n in range(PROBES):
        ids.append(django_pgjobs.enqueue("demo.noop", {"n": n}).pk)
        time.sleep(PROBE_SPACING_SECONDS)
    connection.close()
    waits: list[float] = []
    deadline = time.monotonic() + 4 * READONLY_POLL_SECONDS
    while time.monotonic() < deadline:
        with _connect(new) as conn:
            waits = [row[0] for row in conn.execute(
                "SELECT extract(epoch FROM claimed_at - created_at)::float FROM pgjobs_job "
                "WHERE id = ANY(%s) AND claimed_at IS NOT NULL ORDER BY id", [ids]).fetchall()]
        if len(waits) == len(ids):
            break
        time.sleep(0.1)
    median = statistics.median(waits) if waits else None
    figures = {
        "poll interval s": READONLY_POLL_SECONDS,
        "listeners on the old primary, new primary when probed": [on_old, on_new],
        "probed s after the switch": probed,
        "pickup s of single jobs on the new primary (claimed - created)":
            [round(w, 3) for w in waits],
        "pickup p50 s": None if median is None else round(median, 3),
    }
    checks = [
        Check("every listener left the read-only old primary for the new one",
              on_old == 0 and on_new == workers,
              f"{on_old} listening on the old primary, {on_new} of {workers} on the new one, "
              f"{probed}s after the switch"),
        Check("jobs enqueued on the new primary after the switch were picked up",
              len(waits) == len(ids), f"{len(waits)} of {len(ids)} claimed"),
        Check("pickups on the new primary were woken by notifications, not polls",
              median is not None and median < NOTIFIED_PICKUP_SECONDS,
              f"{'no pickup' if median is None else f'p50 {median:.3f}s'} (under "
              f"{NOTIFIED_PICKUP_SECONDS}s wanted; the workers poll every "
              f"{READONLY_POLL_SECONDS}s)"),
    ]
    return checks, figures


def _read_only_lines(log_dir: Path) -> dict[str, Any]:
    """Lines of the workers' logs that name a refusal as the server being read-only."""
    from django_pgjobs.worker.connections import READ_ONLY_TEXT

    said, explained = {}, 0
    for path in sorted(log_dir.glob("*.log")):
        lines = [line for line in path.read_text(errors="replace").splitlines()
                 if "read-only" in line]
        said[path.stem] = len(lines)
        explained += sum(READ_ONLY_TEXT in line for line in lines)
    return {"by worker": said, "total": sum(said.values()),
            "explained by the worker": explained}


def _state(server: Any) -> dict[str, dict[str, Any]]:
    """Per order reference: its charge job's end, its receipt and its charges' ledger rows.

    By reference, not by id: ids come from sequences, and the new primary may hand out again
    an id the old one had given to a commit the new one never received."""
    with _connect(server) as conn:
        rows = conn.execute(
            "SELECT o.reference, j.status, j.finished_at, "
            "  (SELECT r.created_at FROM pgjobs_receipt r "
            "   WHERE r.scope = 'charge' AND r.key = 'order:' || o.id), "
            "  ARRAY(SELECT l.attempt || '/' || l.worker_id || '/' || l.finished_at "
            "        FROM demo_ledgerentry l WHERE l.kind = 'charge' AND l.key = o.id::text "
            "        ORDER BY l.id) "
            "FROM demo_order o LEFT JOIN pgjobs_job j "
            "  ON j.task = 'demo.charge' AND j.payload->>'reference' = o.reference "
            "WHERE o.reference LIKE 'FO-%%'").fetchall()
    return {ref: {"status": status, "finished": finished, "receipt": receipt, "ledger": ledger}
            for ref, status, finished, receipt, ledger in rows}


def _compare(before: dict[str, dict[str, Any]], new: Any, acked: list[str]) -> dict[str, Any]:
    """What the old primary had committed (``before``) that the new one lacks or redid."""
    after = _state(new)
    settled = [ref for ref, s in before.items() if s["finished"] is not None and ref in after]
    with_receipt = [ref for ref, s in before.items() if s["receipt"] is not None]
    charged = [ref for ref, s in before.items() if s["ledger"]]
    return {
        "acknowledged enqueues lost": sum(ref not in after for ref in acked),
        "enqueues the old primary committed that the new one lacks":
            sum(ref not in after for ref in before),
        "settlements lost (the job ran again on the new primary)":
            sum(after[ref]["finished"] != before[ref]["finished"] for ref in settled),
        "receipts lost with their enqueue": sum(ref not in after for ref in with_receipt),
        "receipts lost and taken again (the job ran again)": sum(
            ref in after and after[ref]["receipt"] != before[ref]["receipt"]
            for ref in with_receipt),
        # The charge's ledger row is its effect: one on each server is an effect done twice
        # (an email sent or a card charged twice, had it been outside the database).
        "charges that ran on both servers": sum(
            ref in after and bool(after[ref]["ledger"])
            and not set(before[ref]["ledger"]) <= set(after[ref]["ledger"])
            for ref in charged),
    }


def _check(mode: str, server: Any, acked: list[str], drained: bool,
           codes: dict[str, int | None], exits: list[str]) -> list[Check]:
    with _connect(server) as conn:
        orders = {ref: pk for pk, ref in conn.execute(
            "SELECT id, reference FROM demo_order WHERE reference LIKE 'FO-%%'").fetchall()}
        jobs = [row[0] for row in conn.execute(
            "SELECT (payload->>'order_id')::bigint FROM pgjobs_job "
            "WHERE task = 'demo.charge'").fetchall()]
        unfinished = conn.execute(f"SELECT count(*) FROM pgjobs_job WHERE status NOT IN "
                                  f"{TERMINAL}").fetchone()
        twice = conn.execute("SELECT count(*) FROM (SELECT key FROM demo_ledgerentry "
                             "WHERE kind = 'charge' GROUP BY key HAVING count(*) > 1) AS d"
                             ).fetchone()
        dead = conn.execute("SELECT count(*) FROM pgjobs_job WHERE status = 'dead'").fetchone()
    lost = [ref for ref in acked if ref not in orders]
    unacknowledged = len(set(orders) - set(acked))
    with_job = set(jobs)
    alone = [ref for ref, pk in orders.items() if pk not in with_job]
    orphans = [pk for pk in with_job if pk not in set(orders.values())]
    synchronous = mode != "async"
    return [
        Check("every acknowledged enqueue exists after the failover", not lost,
              f"{len(lost)} of {len(acked)} acknowledged orders missing", enforced=synchronous),
        Check("an order and its job are both there or both gone", not alone and not orphans,
              f"{len(alone)} orders without their job, {len(orphans)} jobs without their order"),
        Check("every job ended", drained and unfinished is not None and unfinished[0] == 0,
              f"{unfinished[0] if unfinished else '?'} jobs not finished"),
        Check("no order charged twice", twice is not None and twice[0] == 0,
              f"{twice[0] if twice else '?'} orders charged more than once",
              enforced=synchronous),
        Check("no charge ended dead", dead is not None and dead[0] == 0,
              f"{dead[0] if dead else '?'} jobs dead"),
        Check("every worker drained and exited 0",
              all(c == 0 for c in codes.values()) and not exits,
              f"exit codes {codes}" + (f"; exited during the run: {exits}" if exits else "")),
        # Not an invariant: an enqueue whose reply the failover cut off may have committed. The
        # caller saw an error; an idempotency key makes its retry safe.
        Check("enqueues that committed though their caller saw an error", True,
              f"{unacknowledged} (the failover cut off the reply)", enforced=False),
    ]


def _comparison_checks(mode: str, comparison: dict[str, Any],
                       logs: dict[str, Any]) -> list[Check]:
    missing = comparison["enqueues the old primary committed that the new one lacks"]
    undone = comparison["settlements lost (the job ran again on the new primary)"]
    if mode == "async":
        acked = comparison["acknowledged enqueues lost"]
        return [Check("the forced window of lag lost commits", missing > 0 or undone > 0,
                      f"{acked} acknowledged enqueues lost ({missing} committed in all), "
                      f"{undone} settlements lost")]
    if mode == "sync":
        # A commit written on the primary but not yet confirmed by the standby when the crash
        # came: on the old primary, never acknowledged, not on the new one.
        return [Check("commits the crashed primary had that the promoted standby lacks",
                      True, f"{missing} enqueues, {undone} settlements (none acknowledged)",
                      enforced=False)]
    return [
        Check("nothing the old primary committed is missing from the new one",
              missing == 0 and undone == 0,
              f"{missing} enqueues, {undone} settlements missing"),
        Check("the workers' logs name the refused writes as read-only",
              logs["explained by the worker"] > 0,
              f"{logs['total']} lines ({logs['explained by the worker']} with the worker's "
              f"own explanation), by worker {logs['by worker']}"),
    ]


def render(mode: str, checks: list[Check], figures: dict[str, Any]) -> str:
    lines = [f"failover, {mode}"]
    lines += [f"  {name}: {value}" for name, value in figures.items() if name != "mode"]
    for check in checks:
        mark = "ok" if check.ok else ("FAIL" if check.enforced else "reported")
        lines.append(f"  [{mark}] {check.name}: {check.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.harness.failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=[*MODES, "all"], default="all",
                        help="which failover to run (all: the three in turn)")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="how long the enqueuer runs, half before the switch")
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
    for mode in (MODES if args.mode == "all" else [args.mode]):
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
