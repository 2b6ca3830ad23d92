"""A poll-only worker behind a real PgBouncer in transaction pooling mode.

PgBouncer hands each transaction whichever server connection is free, so anything a worker
keeps in its session (LISTEN, prepared statements, server-side cursors) would break or leak.
The test starts PgBouncer (Debian's package, installed by .ci/install-pgbouncer) on a loopback
port with a pool of two server connections and runs a real worker with five client connections
(three executors, the settler and the main thread) through it.

PgBouncer refuses to run as root. It runs as the user that can reach the test's server: the
owner of the socket directory for a server reached by Unix socket (the embedded server's data
directory, which only its owner may enter), the postgres user for one reached over TCP.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

import django_pgjobs
from django_pgjobs.models import Job
from django_pgjobs.status import AttemptOutcome, JobStatus
from tests.conftest import ended_attempts

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POOL_SIZE = 2
CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {dir}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 50
server_reset_query =
ignore_startup_parameters = extra_float_digits
logfile = {dir}/pgbouncer.log
pidfile = {dir}/pgbouncer.pid
"""


def pgbouncer_binary() -> str | None:
    return shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    def __init__(self, directory: Path, port: int) -> None:
        self.directory = directory
        self.port = port

    def admin(self, command: str) -> list[dict[str, str]]:
        """Run a command on PgBouncer's admin console; return its rows as dicts."""
        result = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-X", "-A",
             "-F", "\t", "-P", "footer=off", "-c", command, "pgbouncer"],
            capture_output=True, text=True, check=True, timeout=30,
        )
        header, *rows = result.stdout.splitlines()
        names = header.split("\t")
        return [dict(zip(names, row.split("\t"), strict=True)) for row in rows]

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.fail("PgBouncer is not installed: `make test` installs it (.ci/install-pgbouncer)")
    # Not under pytest's own temporary directory, which only its owner may enter.
    directory = Path(tempfile.mkdtemp(prefix="pgjobs-pgbouncer-"))
    try:
        yield from _run_pgbouncer(binary, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _run_pgbouncer(binary: str, directory: Path) -> Iterator[PgBouncer]:
    settings = connection.settings_dict
    host = settings["HOST"] or "127.0.0.1"
    bouncer = PgBouncer(directory, free_port())
    (directory / "userlist.txt").write_text('"postgres" ""\n')
    ini = directory / "pgbouncer.ini"
    ini.write_text(CONFIG.format(
        host=host, port=settings["PORT"] or 5432,
        listen_port=bouncer.port, dir=directory, user="postgres", pool_size=POOL_SIZE,
    ))
    command = [binary, "-d", str(ini)]
    if os.geteuid() == 0:
        user = run_as(host)
        for path in (directory, *directory.iterdir()):
            shutil.chown(path, user)
        command = ["runuser", "-u", user, "--", *command]
    subprocess.run(command, check=True, timeout=30)
    pid_file = directory / "pgbouncer.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not _accepts(bouncer.port):
        if time.monotonic() > deadline:
            raise AssertionError(f"PgBouncer did not start:\n{bouncer.log()}")
        time.sleep(0.05)
    pid = int(pid_file.read_text().strip())
    try:
        yield bouncer
    finally:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def run_as(host: str) -> str:
    """The unprivileged user PgBouncer runs as to reach the server at ``host``."""
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "postgres"


def _accepts(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def xacts(bouncer: PgBouncer, database: str) -> int:
    rows = [r for r in bouncer.admin("SHOW STATS") if r["database"] == database]
    return int(rows[0]["total_xact_count"]) if rows else 0


def test_a_poll_only_worker_drains_through_transaction_pooling(pgbouncer, start_worker) -> None:
    database = connection.settings_dict["NAME"]
    jobs = [django_pgjobs.enqueue("demo.noop", {"n": n}) for n in range(40)]
    before = xacts(pgbouncer, database)
    url = (f"postgres://postgres@127.0.0.1:{pgbouncer.port}/{database}"
           "?disable_server_side_cursors=true")
    worker = start_worker("--no-listen", "--burst", "--concurrency", "3", "--batch-size", "2",
                          "--poll-interval", "0.05", DATABASE_URL=url)
    assert worker.wait(120) == 0, worker.output()

    output = worker.output()
    assert "listen=False" in output
    assert "database error" not in output
    assert "worker " in output and "claimed 40, settled 40 {'succeeded': 40}, lost 0" in output
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.SUCCEEDED).count() \
        == 40
    assert [a.outcome for a in ended_attempts()] == [AttemptOutcome.SUCCEEDED] * 40
    # Every claim and settlement went through PgBouncer's pool of two server connections.
    assert xacts(pgbouncer, database) - before >= 40 // 2 + 1
    pools = [p for p in pgbouncer.admin("SHOW POOLS") if p["database"] == database]
    assert pools and pools[0]["pool_mode"] == "transaction"
    servers = [s for s in pgbouncer.admin("SHOW SERVERS") if s["database"] == database]
    assert len(servers) <= POOL_SIZE
    assert "prepared statement" not in pgbouncer.log()


def test_statements_prepared_behind_transaction_pooling_by_mistake_lose_nothing(
    pgbouncer, start_worker
) -> None:
    # Preparing forced on, and no DISABLE_SERVER_SIDE_CURSORS: a statement prepared in one
    # transaction's server connection may be missing from the next one's, or already there.
    # Such a claim or settle fails and is sent again; every job still runs and settles once.
    database = connection.settings_dict["NAME"]
    jobs = [django_pgjobs.enqueue("demo.noop", {"n": n}) for n in range(40)]
    url = f"postgres://postgres@127.0.0.1:{pgbouncer.port}/{database}"
    worker = start_worker("--no-listen", "--burst", "--concurrency", "3", "--batch-size", "2",
                          "--poll-interval", "0.05", DATABASE_URL=url,
                          PGJOBS_PREPARED_STATEMENTS="true")
    assert worker.wait(120) == 0, worker.output()

    output = worker.output()
    assert "claimed 40, settled 40 {'succeeded': 40}, lost 0" in output, output
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.SUCCEEDED).count() \
        == 40
    assert [a.outcome for a in ended_attempts()] == [AttemptOutcome.SUCCEEDED] * 40
