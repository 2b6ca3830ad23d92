"""The vacuum horizon watch on private servers, for the holders the shared test server cannot
have: a prepared transaction (max_prepared_transactions), replication slots (a standby's, and a
logical one: wal_level=logical), and a standby's hot_standby_feedback through its WAL sender.

One primary per module, migrated, in a temporary directory; each test that needs a standby
makes its own (pg_basebackup takes well under a second) so that none outlives its test and the
others see the primary alone."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.test import override_settings

from django_pgjobs import stats
from django_pgjobs.admin.dashboard import health
from django_pgjobs.checks import check_database
from tests.clusters import Standby, add_alias, drop_alias, restart_with, server_settings
from tests.conftest import wait_for
from tests.harness.server import PrivateServer

pytestmark = [pytest.mark.slow, pytest.mark.django_db(databases=["default"])]

ALIAS = "pgjobs_horizon"  # the private primary's job database, while a test runs
GID = "nightly-batch"
SLOT = "pgjobs_test_slot"
LOGICAL_SLOT = "pgjobs_test_decoding"
STANDBY_NAME = "reports-replica"  # the standby's cluster_name: its WAL receiver's application
BURNT = 1200  # transactions begun while something holds the horizon
WARN_XIDS = 1000  # the smallest PGJOBS_HORIZON_WARN_XIDS its rule allows, below BURNT

ENQUEUE = (
    "INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, "
    "base_priority, run_at, attempts, max_attempts, snoozes, deadline, lease_seconds, "
    "trace_id, failure_class, terminal_reason, last_error, created_at, updated_at) "
    "SELECT 'demo.noop', 1, %s, '{}', 'ready', 0, 0, now(), 0, 5, 0, "
    "now() + interval '1 day', 30, '', '', '', '', now(), now() "
    "FROM generate_series(1, %s)"
)


@dataclass(frozen=True)
class Cluster:
    primary: PrivateServer
    work: Path

    def connect(self, database: str = "queue") -> psycopg.Connection[Any]:
        return psycopg.connect(
            host=self.primary.socket_dir,
            port=self.primary.port,
            user="postgres",
            dbname=database,
            autocommit=True,
        )

    def run(self, statement: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with self.connect() as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def burn(self, n: int = BURNT) -> None:
        """Begin and commit ``n`` transactions that each take a transaction id."""
        self.run(
            f"DO $$ BEGIN FOR i IN 1..{int(n)} LOOP PERFORM pg_current_xact_id(); "
            "COMMIT; END LOOP; END $$"
        )

    def standby(self, **settings: str) -> Standby:
        return Standby(
            self.primary,
            Path(tempfile.mkdtemp(prefix="standby-", dir=self.work)),
            settings=settings,
        )


@pytest.fixture(scope="module")
def cluster(django_db_blocker: Any) -> Iterator[Cluster]:
    """A migrated primary that allows prepared transactions and logical decoding."""
    with tempfile.TemporaryDirectory(prefix="pgjobs-horizon-") as work, django_db_blocker.unblock():
        (Path(work) / "primary").mkdir()
        primary = PrivateServer(Path(work) / "primary")
        try:
            restart_with(primary, {"max_prepared_transactions": "4", "wal_level": "logical"})
            primary.create_database("queue")
            add_alias(ALIAS, server_settings(primary.socket_dir, primary.port, "queue"))
            try:
                call_command("migrate", database=ALIAS, verbosity=0)
            finally:
                drop_alias(ALIAS)
            yield Cluster(primary, Path(work))
        finally:
            primary.close()


@pytest.fixture
def queue(cluster: Cluster) -> Iterator[str]:
    """The primary's job database as a Django alias, for this test only."""
    primary = cluster.primary
    add_alias(ALIAS, server_settings(primary.socket_dir, primary.port, "queue"))
    try:
        yield ALIAS
    finally:
        drop_alias(ALIAS)


@pytest.fixture
def prepared(cluster: Cluster) -> Iterator[None]:
    """A transaction that enqueued a job and was prepared as 'nightly-batch', then left."""
    with cluster.connect() as conn:
        conn.execute("BEGIN")
        conn.execute(ENQUEUE, ["nightly", 1])
        conn.execute(f"PREPARE TRANSACTION '{GID}'")
    try:
        yield
    finally:
        if cluster.run("SELECT 1 FROM pg_prepared_xacts WHERE gid = %s", [GID]):
            cluster.run(f"ROLLBACK PREPARED '{GID}'")


@pytest.fixture
def slot_standby(cluster: Cluster) -> Iterator[Standby]:
    """A standby that streams through the physical slot 'pgjobs_test_slot', with feedback on:
    its feedback gives the slot an xmin. The slot is dropped at the end."""
    cluster.run("SELECT pg_create_physical_replication_slot(%s, true)", [SLOT])
    standby = None
    try:
        standby = cluster.standby(
            hot_standby_feedback="on", wal_receiver_status_interval="1", primary_slot_name=SLOT
        )
        yield standby
    finally:
        if standby is not None:
            standby.close()  # a second close (after the test's own) does nothing
        drop_slot(cluster, SLOT)


@pytest.fixture
def logical_slot(cluster: Cluster) -> Iterator[str]:
    """A logical slot (test_decoding) in the job database that nothing consumes."""
    cluster.run("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", [LOGICAL_SLOT])
    try:
        yield LOGICAL_SLOT
    finally:
        drop_slot(cluster, LOGICAL_SLOT)


@pytest.fixture
def feedback_standby(cluster: Cluster) -> Iterator[tuple[Standby, int]]:
    """A standby with hot_standby_feedback on (every second), and the pid of its WAL sender on
    the primary."""
    standby = cluster.standby(
        hot_standby_feedback="on", wal_receiver_status_interval="1", cluster_name=STANDBY_NAME
    )
    try:
        rows = wait_for(
            lambda: cluster.run(
                "SELECT pid FROM pg_stat_replication WHERE application_name = %s "
                "AND state = 'streaming'",
                [STANDBY_NAME],
            ),
            30,
        )
        assert isinstance(rows, list)
        yield standby, int(rows[0][0])
    finally:
        standby.close()


def drop_slot(cluster: Cluster, name: str) -> None:
    """Drop the slot once nothing streams through it (a stopped standby's WAL sender may take a
    moment to exit); nothing when there is none."""

    def dropped() -> bool:
        rows = cluster.run("SELECT active FROM pg_replication_slots WHERE slot_name = %s", [name])
        if rows and not rows[0][0]:
            cluster.run("SELECT pg_drop_replication_slot(%s)", [name])
            return True
        return not rows

    wait_for(dropped, 30, interval=0.2, what=lambda: f"the slot {name} is still in use")


def of_kind(alias: str, kind: str) -> list[stats.HorizonHolder]:
    return [h for h in stats.horizon(using=alias) if h.kind == kind]


def w004(alias: str) -> list[str]:
    return [m.msg for m in check_database([alias]) if m.id == "pgjobs.W004"]


def gauges(alias: str) -> dict[str, float]:
    """pgjobs_horizon_held_seconds and pgjobs_horizon_held_xids, as a scrape reads them."""
    from prometheus_client import CollectorRegistry, generate_latest

    from django_pgjobs.metrics import StatsCollector

    registry = CollectorRegistry()
    registry.register(StatsCollector(using=alias))
    lines = generate_latest(registry).decode().splitlines()
    return {
        name.removeprefix("pgjobs_horizon_held_"): float(value)
        for name, value in (
            line.split() for line in lines if line.startswith("pgjobs_horizon_held_")
        )
    }


def horizon_table(alias: str) -> list[str]:
    """The rows of pgjobs_stats's vacuum horizon table (or its line saying there are none)."""
    out = StringIO()
    call_command("pgjobs_stats", "--database", alias, stdout=out)
    section = out.getvalue().split("Vacuum horizon", 1)[1].split("\n\n", 1)[0]
    return section.splitlines()[1:]


def row_of(table: list[str], holder: str) -> str:
    [row] = [line for line in table if line.split()[0] == holder]
    return row


def behind(message: str) -> int:
    """The "N transactions behind" a holder is said to be."""
    found = re.search(r"([\d,]+) transactions behind", message)
    assert found, message
    return int(found.group(1).replace(",", ""))


def vacuum_cutoff_age(cluster: Cluster) -> int:
    """How many transactions old the cutoff of a VACUUM of pgjobs_job is: how far back the
    horizon it may not clean past is held."""
    said: list[str] = []
    with cluster.connect() as conn:
        conn.add_notice_handler(lambda diag: said.append(diag.message_primary or ""))
        conn.execute("VACUUM (VERBOSE) pgjobs_job")
    ages = [
        int(m.group(1))
        for text in said
        for m in [re.search(r"removable cutoff: \d+, which was (\d+) XIDs old", text)]
        if m
    ]
    assert ages, f"no removable cutoff in VACUUM's report: {said}"
    return ages[0]


def eventually(
    predicate: Callable[[], object], timeout: float = 15.0, what: Callable[[], str] | None = None
) -> Any:
    return wait_for(predicate, timeout, interval=0.2, what=what)


# A prepared transaction.


def test_a_prepared_transaction_is_listed_with_its_name_role_and_age(
    cluster: Cluster,
    queue: str,
    prepared: None,
) -> None:
    cluster.burn(10)
    [holder] = of_kind(queue, "prepared transaction")
    assert (holder.holder, holder.role, holder.state, holder.application_name) == (
        GID,
        "postgres",
        "prepared",
        "",
    )
    assert holder.seconds is not None and 0 <= holder.seconds < 60
    assert holder.xids >= 10
    assert not holder.holds  # younger than five minutes, fewer than 500,000 behind
    assert holder.described().startswith(f"Prepared transaction {GID} (role postgres) open ")


@override_settings(PGJOBS_HORIZON_WARN_SECONDS=1)
def test_a_prepared_transaction_older_than_the_threshold_is_named_everywhere(
    cluster: Cluster,
    queue: str,
    prepared: None,
) -> None:
    time.sleep(1.2)
    # It is all that holds this primary's horizon: the gauges are its figures.
    [holder] = stats.horizon(using=queue)
    assert (holder.kind, holder.holder) == ("prepared transaction", GID)
    assert holder.holds and holder.seconds is not None and holder.seconds >= 1.0

    [warning] = w004(queue)
    assert f"Prepared transaction {GID} (role postgres) open " in warning

    [sentence] = health(stats.snapshot(using=queue))[0]
    assert sentence.startswith(f"Prepared transaction {GID} (role postgres) open ")
    assert "keeps vacuum from removing the rows of finished jobs" in sentence

    held = gauges(queue)
    assert held["seconds"] >= holder.seconds and held["xids"] >= holder.xids

    row = row_of(horizon_table(queue), GID)
    assert "prepared transaction" in row and "postgres" in row and row.endswith("HOLDS")


@override_settings(PGJOBS_HORIZON_WARN_XIDS=WARN_XIDS)
def test_a_prepared_transaction_further_behind_than_the_threshold_is_named(
    cluster: Cluster,
    queue: str,
    prepared: None,
) -> None:
    [holder] = of_kind(queue, "prepared transaction")
    assert not holder.holds
    cluster.burn()
    [holder] = of_kind(queue, "prepared transaction")
    assert holder.xids >= BURNT and holder.holds
    # Its xid is what vacuum may not clean past.
    assert vacuum_cutoff_age(cluster) >= BURNT

    [warning] = w004(queue)
    assert f"Prepared transaction {GID} (role postgres)" in warning
    assert behind(warning) >= BURNT
    assert gauges(queue)["xids"] >= BURNT
    assert row_of(horizon_table(queue), GID).endswith("HOLDS")


@override_settings(PGJOBS_HORIZON_WARN_SECONDS=1)
def test_a_prepared_transaction_committed_holds_nothing(
    cluster: Cluster,
    queue: str,
    prepared: None,
) -> None:
    time.sleep(1.2)
    assert [h.holder for h in of_kind(queue, "prepared transaction")] == [GID]
    cluster.run(f"COMMIT PREPARED '{GID}'")
    assert cluster.run("SELECT count(*) FROM pgjobs_job WHERE queue = 'nightly'") == [(1,)]
    assert of_kind(queue, "prepared transaction") == []
    assert w004(queue) == []
    cluster.run("DELETE FROM pgjobs_job WHERE queue = 'nightly'")


# Replication slots.


@override_settings(PGJOBS_HORIZON_WARN_XIDS=WARN_XIDS)
def test_a_physical_slot_with_its_standbys_feedback_is_listed_active_then_inactive(
    cluster: Cluster,
    queue: str,
    slot_standby: Standby,
) -> None:
    def slot() -> stats.HorizonHolder | None:
        return next((h for h in of_kind(queue, "replication slot") if h.holder == SLOT), None)

    # The standby's first feedback gives the slot its xmin.
    holder = eventually(slot, what=lambda: f"listed: {stats.horizon(using=queue)}")
    assert (holder.state, holder.seconds, holder.application_name, holder.role) == (
        "active",
        None,
        "",
        "",
    )
    assert not holder.holds

    # The standby goes away; its slot stays, and keeps the xmin it last fed back.
    slot_standby.close()
    eventually(
        lambda: (s := slot()) is not None and s.state == "inactive",
        what=lambda: f"listed: {stats.horizon(using=queue)}",
    )
    cluster.burn()
    holder = slot()
    assert holder is not None and holder.state == "inactive"
    assert holder.xids >= BURNT and holder.holds
    assert vacuum_cutoff_age(cluster) >= BURNT  # it really holds vacuum back

    [warning] = w004(queue)
    assert f"Replication slot {SLOT} (inactive), " in warning and behind(warning) >= BURNT
    assert gauges(queue)["xids"] >= BURNT
    row = row_of(horizon_table(queue), SLOT)
    assert "replication slot" in row and "inactive" in row and row.endswith("HOLDS")

    drop_slot(cluster, SLOT)
    assert slot() is None
    assert w004(queue) == []


@override_settings(PGJOBS_HORIZON_WARN_XIDS=WARN_XIDS)
def test_a_logical_slot_that_holds_only_the_catalogs_is_not_warned_of_as_holding_job_rows(
    cluster: Cluster,
    queue: str,
    logical_slot: str,
) -> None:
    [(catalog_xmin, xmin)] = cluster.run(
        "SELECT catalog_xmin IS NOT NULL, xmin IS NOT NULL FROM pg_replication_slots "
        "WHERE slot_name = %s",
        [logical_slot],
    )
    assert (catalog_xmin, xmin) == (True, False)
    cluster.burn()
    # A logical slot's catalog_xmin holds back the system catalogs only: vacuum of the job
    # table cleans up to now.
    assert vacuum_cutoff_age(cluster) < BURNT
    # So it is not what keeps finished jobs' rows in the table.
    assert [h for h in stats.horizon(using=queue) if h.holds] == []
    assert w004(queue) == []
    assert gauges(queue)["xids"] < BURNT


# A standby's feedback.


@override_settings(PGJOBS_HORIZON_WARN_XIDS=WARN_XIDS)
def test_a_standby_query_under_hot_standby_feedback_is_listed_as_its_wal_sender(
    cluster: Cluster,
    queue: str,
    feedback_standby: tuple[Standby, int],
) -> None:
    standby, walsender = feedback_standby

    def sender() -> stats.HorizonHolder | None:
        return next((h for h in of_kind(queue, "session") if h.holder == str(walsender)), None)

    with psycopg.connect(
        host=standby.socket_dir, port=standby.port, user="postgres", dbname="queue"
    ) as report:
        report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        report.execute("SELECT count(*) FROM pgjobs_job").fetchone()
        cluster.burn()
        holder = eventually(
            lambda: (s := sender()) is not None and s.xids >= BURNT and s,
            what=lambda: f"listed: {stats.horizon(using=queue)}",
        )
        assert (holder.application_name, holder.role) == (STANDBY_NAME, "postgres")
        assert holder.holds
        assert vacuum_cutoff_age(cluster) >= BURNT  # the standby's snapshot holds the primary
        [warning] = w004(queue)
        assert f"A session (pid {walsender}, '{STANDBY_NAME}', role postgres" in warning
        row = row_of(horizon_table(queue), str(walsender))
        assert STANDBY_NAME in row and row.endswith("HOLDS")
        report.rollback()

    # The standby's next feedback lets go.
    eventually(
        lambda: (s := sender()) is None or s.xids < BURNT,
        what=lambda: f"listed: {stats.horizon(using=queue)}",
    )
    assert w004(queue) == []


@override_settings(PGJOBS_HORIZON_WARN_SECONDS=1)
def test_a_standby_with_feedback_and_no_query_holds_nothing_however_long_connected(
    cluster: Cluster,
    queue: str,
    feedback_standby: tuple[Standby, int],
) -> None:
    _, walsender = feedback_standby
    # The WAL sender keeps the xmin the standby feeds back, of no snapshot: its replay point.
    # It has been connected for longer than the threshold: that is no transaction held open.
    time.sleep(1.5)
    cluster.burn(5)
    # Vacuum finds nothing held once the next feedback arrives (every second)...
    eventually(lambda: vacuum_cutoff_age(cluster) < 5)
    # ...so nothing is named as holding it.
    assert [h for h in stats.horizon(using=queue) if h.holds] == []
    assert [m for m in w004(queue) if f"pid {walsender}" in m] == []
    assert gauges(queue)["seconds"] < 1.0


# Nothing at all.


@override_settings(PGJOBS_HORIZON_WARN_SECONDS=1, PGJOBS_HORIZON_WARN_XIDS=WARN_XIDS)
def test_with_no_prepared_transaction_slot_or_standby_nothing_is_listed(
    cluster: Cluster,
    queue: str,
) -> None:
    assert cluster.run("SELECT count(*) FROM pg_prepared_xacts") == [(0,)]
    assert cluster.run("SELECT count(*) FROM pg_replication_slots") == [(0,)]
    assert cluster.run("SELECT count(*) FROM pg_stat_replication") == [(0,)]
    with cluster.connect() as idle:  # a session that only connected holds nothing
        idle.execute("SELECT 1").fetchone()
        # An autovacuum worker holds a snapshot while it runs: wait it out.
        eventually(
            lambda: stats.horizon(using=queue) == [],
            what=lambda: f"listed: {stats.horizon(using=queue)}",
        )
    assert w004(queue) == []
    assert gauges(queue) == {"seconds": 0.0, "xids": 0.0}
    assert horizon_table(queue) == ["  (nothing holds it: vacuum can clean up to now)"]
