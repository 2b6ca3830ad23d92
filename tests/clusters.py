"""Private PostgreSQL clusters for tests that need more than one server: a primary and a
streaming standby made from it with ``pg_basebackup -R``, from the embedded distribution's own
binaries, in a temporary directory, on Unix sockets only, deleted at the end."""

from __future__ import annotations

import contextlib
import os
import pwd
import time
from pathlib import Path
from typing import Any

import psycopg
from django.db import connections

from tests.harness.server import PrivateServer


class Standby:
    """A streaming standby of ``primary`` under ``directory`` (hot standby, read-only)."""

    def __init__(self, primary: PrivateServer, directory: Path, *,
                 settings: dict[str, str] | None = None) -> None:
        embedded = primary._embedded
        user = primary._server.system_user
        self.pgdata = directory / "pgdata"
        self.pgdata.mkdir(parents=True, mode=0o700)
        if user is not None:  # as root, the embedded server runs as its own user
            entry = pwd.getpwnam(user)
            os.chown(directory, entry.pw_uid, entry.pw_gid)
            os.chown(self.pgdata, entry.pw_uid, entry.pw_gid)
        embedded.pg_basebackup(
            ["-R", "-X", "stream", "-c", "fast", "-D", str(self.pgdata),
             "-h", primary.socket_dir, "-p", str(primary.port), "-U", "postgres"],
            user=user, timeout=120,
        )
        # The embedded server keeps its socket, lock and log in its data directory: the copy
        # must not start with the primary's.
        for leftover in [*self.pgdata.glob(".s.PGSQL.*"), self.pgdata / "log",
                         self.pgdata / "postmaster.pid"]:
            leftover.unlink(missing_ok=True)
        with (self.pgdata / "postgresql.auto.conf").open("a") as conf:
            for name, value in (settings or {}).items():
                conf.write(f"{name} = '{value}'\n")
        self._server = embedded.get_server(self.pgdata, cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.port = int(info.port or 5432)

    def connection_settings(self, database: str) -> dict[str, Any]:
        """A Django DATABASES entry for ``database`` on this standby."""
        return server_settings(self.socket_dir, self.port, database)

    def wait_for(self, primary: PrivateServer, database: str, timeout: float = 30.0) -> None:
        """Return once this standby has replayed everything the primary has written."""
        with psycopg.connect(host=primary.socket_dir, port=primary.port, user="postgres",
                             dbname=database, autocommit=True) as conn:
            [lsn] = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone() or [None]
        deadline = time.monotonic() + timeout
        with psycopg.connect(host=self.socket_dir, port=self.port, user="postgres",
                             dbname=database, autocommit=True) as conn:
            while time.monotonic() < deadline:
                row = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                   [lsn]).fetchone()
                if row and row[0]:
                    return
                time.sleep(0.05)
        raise TimeoutError(f"the standby did not replay up to {lsn} in {timeout}s")

    def close(self) -> None:
        self._server.cleanup()


def server_settings(socket_dir: str, port: int, database: str) -> dict[str, Any]:
    """A Django DATABASES entry for ``database`` on a server listening at ``socket_dir``."""
    return {
        "ENGINE": "django.db.backends.postgresql", "NAME": database, "USER": "postgres",
        "PASSWORD": "", "HOST": socket_dir, "PORT": str(port), "OPTIONS": {},
        "ATOMIC_REQUESTS": False, "AUTOCOMMIT": True, "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False, "TIME_ZONE": None,
        "TEST": {"MIRROR": None, "NAME": None, "CHARSET": None, "COLLATION": None,
                 "MIGRATE": True, "DEPENDENCIES": []},
    }


def restart_with(server: PrivateServer, settings: dict[str, str]) -> None:
    """Write ``settings`` into ``server``'s postgresql.auto.conf and restart it cleanly: for the
    settings a server reads only when it starts (max_prepared_transactions, wal_level)."""
    with (server.pgdata / "postgresql.auto.conf").open("a") as conf:
        for name, value in settings.items():
            conf.write(f"{name} = '{value}'\n")
    server._embedded.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata,
                            user=server._server.system_user, timeout=60)
    server._server.ensure_postgres_running()
    info = server._server.get_postmaster_info()
    server.socket_dir, server.port = str(info.socket_dir), int(info.port or 5432)
    with psycopg.connect(host=server.socket_dir, port=server.port, user="postgres",
                         dbname="postgres", autocommit=True) as conn:
        for name, value in settings.items():
            [shown] = conn.execute("SELECT current_setting(%s)", [name]).fetchone() or [None]
            if shown != value:
                raise RuntimeError(f"{name} is {shown!r} after the restart, not {value!r}")


def add_alias(alias: str, entry: dict[str, Any]) -> None:
    """A database alias made at run time, connected at once: a test allows only the databases
    it declares, and these servers exist only while its module runs."""
    connections.settings[alias] = entry
    connections[alias].connect()


def drop_alias(alias: str) -> None:
    if alias in connections:
        connections[alias].close()
    connections.settings.pop(alias, None)
    with contextlib.suppress(AttributeError):
        delattr(connections._connections, alias)
