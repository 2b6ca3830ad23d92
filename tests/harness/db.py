"""The harness's own database access: it must ride through the restarts it causes."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connection

import django_pgjobs
from django_pgjobs.models import Job

T = TypeVar("T")


def reconnect() -> None:
    """Drop this thread's connection; the next query opens a new one."""
    try:
        connection.close()
    except DatabaseError:
        connection.connection = None


def retrying(fn: Callable[[], T], *, timeout: float = 60.0) -> T:
    """Call ``fn``, reconnecting and calling it again while the database is unreachable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (OperationalError, InterfaceError):
            if time.monotonic() > deadline:
                raise
            reconnect()
            time.sleep(0.2)


def db_now() -> datetime:
    """The database clock: the one claims, leases and the ledger use."""

    def read() -> datetime:
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]

    return retrying(read)


def terminate_backends(worker_id: str) -> int:
    """pg_terminate_backend every connection a worker opened; return how many.

    The worker's own connections carry its id as application_name (PGAPPNAME); a connection
    it names itself (such as its listener's) ends with a space and its id.
    """

    def terminate() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() "
                "AND (application_name = %s OR application_name LIKE %s)",
                [worker_id, f"% {worker_id}"],
            )
            return int(cursor.fetchone()[0])

    return retrying(terminate)


def enqueue(task: str, key: str, payload: dict[str, Any], **options: Any) -> Job:
    """Enqueue under idempotency key ``key``: a retry after a lost reply finds the same job."""
    return retrying(
        lambda: django_pgjobs.enqueue(task, payload, idempotency_key=key, **options)
    )


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """Poll ``predicate`` (through restarts) until it returns something truthy, or time out."""
    deadline = time.monotonic() + timeout
    while True:
        value = retrying(predicate)
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
