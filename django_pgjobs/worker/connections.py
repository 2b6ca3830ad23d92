"""Connection handling for the worker's threads: each holds its own Django connection.

A worker is one long-running "request" per thread, so Django's per-request connection handling
does not apply: these functions drop a connection an error left unusable, honour CONN_MAX_AGE,
and describe failures in one log line that never quotes data or a password.
"""

from __future__ import annotations

import threading
import time

import psycopg
from django.db import DatabaseError, connections

from .. import redaction, sql


def refresh_connection(using: str) -> None:
    """Drop this thread's connection if an error left it unusable or CONN_MAX_AGE (> 0) passed.

    Unlike ``close_old_connections``, a CONN_MAX_AGE of 0 does not close the connection after
    every claim: a worker is one long-running "request".
    """
    connection = connections[using]
    if connection.connection is None:
        return
    if connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            reset_connection(using)
            return
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    if max_age and connection.close_at is not None and time.monotonic() >= connection.close_at:
        reset_connection(using)


def database_reachable(using: str) -> bool:
    """Refresh this thread's connection and say whether the database answers."""
    refresh_connection(using)
    connection = connections[using]
    if connection.connection is not None:
        return True
    try:
        connection.ensure_connection()
    except DatabaseError:
        return False
    return True


def reset_connection(using: str) -> None:
    """Drop this thread's connection after an error; the next query reconnects."""
    try:
        connections[using].close()
    except DatabaseError:
        connections[using].connection = None


def database_target(using: str) -> str:
    """Where ``using`` connects, for a log line: user@host:port/name, never the password."""
    params = connections[using].settings_dict
    host = params.get("HOST") or "(local socket)"
    return f"{params.get('USER') or '-'}@{host}:{params.get('PORT') or 5432}/{params.get('NAME')}"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error as one line of at most ``limit`` characters (drivers' messages span several)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def database_error_text(exc: BaseException) -> str:
    """A database error as one line, without the DETAIL and CONTEXT parts of the server's report.

    Those parts quote the data that failed (a jsonb cast's CONTEXT echoes the JSON, results and
    all), which must not reach a log; ``redaction.database_error_text`` keeps what went wrong.
    """
    if is_read_only_error(exc):
        return READ_ONLY_TEXT
    text = redaction.database_error_text(exc)
    return one_line(exc) if text is None else one_line(Exception(text))


def refuse_read_only_server(using: str) -> None:
    """Raise the read-only refusal a write would meet when ``using``'s server takes no writes.

    A worker that only reads (an idle one lists the queues with ready jobs) would otherwise stay
    on the old primary after a failover, finding nothing there for ever.
    """
    connection = connections[using]
    with connection.cursor() as cursor:
        cursor.execute(sql.query("listener_ping"))
        row = cursor.fetchone()
    if row is not None and row[0]:
        with connection.wrap_database_errors:
            raise psycopg.errors.ReadOnlySqlTransaction(
                "the server is read-only (a standby, or a primary demoted by a failover)")


def is_read_only_error(exc: BaseException) -> bool:
    cause = redaction.database_cause(exc)
    return cause is not None and cause.sqlstate == READ_ONLY_SQLSTATE


# A write refused because the server is read-only: a standby, or the old primary after a
# failover, still reached through a connection made before it (docs/reliability.md).
READ_ONLY_SQLSTATE = "25006"
READ_ONLY_TEXT = ("connected to a read-only server (a standby, or a primary demoted by a "
                  "failover); reconnecting: with several hosts and target_session_attrs="
                  "read-write, the next connection finds the primary [SQLSTATE 25006]")


class Outage:
    """Since when this worker's database calls have been failing; shared by its threads."""

    def __init__(self) -> None:
        self._since: float | None = None
        self._lock = threading.Lock()

    def failed(self) -> float:
        """Record a failure; return for how many seconds calls have been failing."""
        now = time.monotonic()
        with self._lock:
            if self._since is None:
                self._since = now
            return now - self._since

    def recovered(self) -> None:
        with self._lock:
            self._since = None


__all__ = [
    "Outage",
    "database_error_text",
    "database_reachable",
    "database_target",
    "one_line",
    "refresh_connection",
    "reset_connection",
]
