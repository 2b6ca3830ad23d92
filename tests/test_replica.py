"""Reading the figures from a replica (PGJOBS_STATS_DATABASE), on real servers: a private
primary and its streaming standby, made with pg_basebackup; and the checks that guard a
primary-and-standby setup."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections
from django.test import override_settings

from django_pgjobs import stats
from django_pgjobs.checks import check_database, check_hosts, host_messages, replica_messages
from django_pgjobs.workers import Heartbeat
from tests.clusters import Standby, add_alias, drop_alias, server_settings
from tests.harness.server import PrivateServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(databases=["default"])]

PRIMARY, REPLICA = "pgjobs_primary", "pgjobs_replica"


@pytest.fixture(scope="module")
def cluster(django_db_blocker: Any) -> Iterator[tuple[PrivateServer, Standby, Standby]]:
    """A migrated primary and two standbys of it: one with hot_standby_feedback, one without."""
    with tempfile.TemporaryDirectory(prefix="pgjobs-replica-") as work, \
            django_db_blocker.unblock():
        (Path(work) / "primary").mkdir()
        primary = PrivateServer(Path(work) / "primary")
        standbys: list[Standby] = []
        try:
            primary.create_database("queue")
            add_alias(PRIMARY, server_settings(primary.socket_dir, primary.port, "queue"))
            call_command("migrate", database=PRIMARY, verbosity=0)
            connections[PRIMARY].close()
            standbys.append(Standby(primary, Path(work) / "feedback",
                                    settings={"hot_standby_feedback": "on"}))
            standbys.append(Standby(primary, Path(work) / "quiet",
                                    settings={"hot_standby_feedback": "off"}))
            yield primary, standbys[0], standbys[1]
        finally:
            drop_alias(PRIMARY)
            for standby in standbys:
                standby.close()
            primary.close()


def enqueue_on(primary: PrivateServer, queue: str, n: int) -> None:
    with psycopg.connect(host=primary.socket_dir, port=primary.port, user="postgres",
                         dbname="queue", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, "
            "base_priority, run_at, attempts, max_attempts, snoozes, deadline, lease_seconds, "
            "trace_id, failure_class, terminal_reason, last_error, created_at, updated_at) "
            "SELECT 'demo.noop', 1, %s, '{}', 'ready', 0, 0, now(), 0, 5, 0, "
            "now() + interval '1 day', 30, '', '', '', '', now(), now() "
            "FROM generate_series(1, %s)", [queue, n])


def test_the_figures_come_from_the_replica_and_the_workers_from_the_primary(cluster) -> None:
    primary, _, replica = cluster
    enqueue_on(primary, "reports", 7)
    replica.wait_for(primary, "queue")
    Heartbeat("on-the-primary", queues=["reports"], concurrency=2, listens=False,
              running=lambda: 0)()
    add_alias(REPLICA, replica.connection_settings("queue"))
    try:
        with override_settings(PGJOBS_STATS_DATABASE=REPLICA):
            snap = stats.snapshot()
            with connections[REPLICA].cursor() as cursor:
                cursor.execute("SELECT pg_is_in_recovery()")
                assert cursor.fetchone() == (True,)  # it really is the standby
    finally:
        drop_alias(REPLICA)
    # The counts are the replica's (the default database has no job); the workers, the
    # default database's.
    assert {q.queue: q.ready for q in snap.queues} == {"reports": 7}
    assert [w.worker_id for w in snap.workers] == ["on-the-primary"]
    assert not snap.unserved()


def test_a_standby_with_hot_standby_feedback_as_the_stats_database_is_warned_of(cluster) -> None:
    _, feedback, quiet = cluster
    for alias, standby, warned in ((REPLICA, feedback, True), (REPLICA + "_quiet", quiet, False)):
        add_alias(alias, standby.connection_settings("queue"))
        try:
            with override_settings(PGJOBS_STATS_DATABASE=alias):
                ids = [m.id for m in replica_messages(alias)]
                assert ids == (["pgjobs.W006"] if warned else [])
                assert ("pgjobs.W006" in [m.id for m in check_database([alias])]) is warned
        finally:
            drop_alias(alias)


def test_the_primary_itself_is_no_replica_to_warn_of(cluster) -> None:
    primary, _, _ = cluster
    add_alias(REPLICA, server_settings(primary.socket_dir, primary.port, "queue"))
    try:
        assert replica_messages(REPLICA) == []
    finally:
        drop_alias(REPLICA)


def test_several_hosts_without_target_session_attrs_are_warned_of() -> None:
    base = dict(django_settings.DATABASES["default"])
    several = {**base, "HOST": "db-a.internal,db-b.internal", "OPTIONS": {}}
    targeted = {**several, "OPTIONS": {"target_session_attrs": "read-write"}}
    # A URL's ?host=a,b&port=... lands in the driver's options.
    in_options = {**base, "HOST": "", "OPTIONS": {"host": "/run/a,/run/b", "port": "5432,5432"}}
    warned = host_messages({"default": base, "a": several, "b": targeted, "c": in_options})
    assert [m.msg.split("'")[1] for m in warned] == ["a", "c"]
    assert "target_session_attrs" in warned[0].hint


def test_a_stats_database_that_is_not_configured_is_an_error() -> None:
    with override_settings(PGJOBS_STATS_DATABASE="nowhere"):
        assert [m.id for m in check_hosts()] == ["pgjobs.E013"]


def test_a_worker_that_reaches_a_standby_says_it_is_connected_to_a_read_only_server(
    cluster, tmp_path,
) -> None:
    from urllib.parse import quote

    from tests.conftest import WorkerProcess, wait_for, worker_env

    _, _, replica = cluster
    env = worker_env(PGJOBS_LOG_LEVEL="WARNING")
    env.pop("PGJOBS_DATABASE_NAME", None)
    env["DATABASE_URL"] = (f"postgres://postgres@/queue?host={quote(replica.socket_dir)}"
                           f"&port={replica.port}")
    worker = WorkerProcess(["--poll-interval", "0.2", "--no-listen"], env,
                           tmp_path / "worker.log")
    try:
        wait_for(lambda: "connected to a read-only server" in worker.output(), 30,
                 what=worker.output)
        assert "SQLSTATE 25006" in worker.output()
    finally:
        worker.stop()


def test_a_listener_whose_server_turns_read_only_leaves_it(cluster, monkeypatch, caplog) -> None:
    from django_pgjobs import notify
    from tests.conftest import wait_for

    primary, _, _ = cluster
    monkeypatch.setattr(notify, "PING_SECONDS", 0.2)
    woken: list[int] = []
    listener = notify.Listener(lambda: woken.append(1), using=PRIMARY,
                               application_name="pgjobs-listener read-only-test")
    listener.start()
    admin = psycopg.connect(host=primary.socket_dir, port=primary.port, user="postgres",
                            dbname="postgres", autocommit=True)
    try:
        assert listener.listening.wait(10)
        # The old primary, fenced after a failover: it still answers, and takes no write.
        admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        admin.execute("SELECT pg_reload_conf()")
        wait_for(lambda: listener.reconnects > 0, 10)
        # The listener counts the reconnect just before it logs why: wait for the line.
        wait_for(lambda: "listening on a read-only server" in caplog.text, 10)
    finally:
        admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
        admin.execute("SELECT pg_reload_conf()")
        admin.close()
        listener.stop()
