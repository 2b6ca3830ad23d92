"""LISTEN/NOTIFY wake-ups: an idle worker claims within milliseconds of an enqueue's commit.

Enqueue sends ``pg_notify('pgjobs', <queue>)`` inside the enqueuing transaction, and PostgreSQL
delivers it only when that transaction commits, so a woken executor always finds the job
committed. The listener holds one dedicated connection of its own, outside Django's connection
handling, because LISTEN is session state that must outlive every query. Polling stays the
fallback: a notification missed while the listener reconnects costs at most one poll interval.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

from . import sql

logger = logging.getLogger("django_pgjobs.notify")

CHANNEL = "pgjobs"
# A job under a rate was given its key's slot before its time: the payload is the seconds until
# then, so a worker runs its rates step at that time rather than at its next poll.
RATES_CHANNEL = "pgjobs_rates"
# How long one wait for notifications lasts before the stop flag is looked at again.
RECEIVE_TIMEOUT_SECONDS = 0.25
# A connection that dies silently (no FIN, no error) is noticed by this round trip.
PING_SECONDS = 30.0
RECONNECT_MAX_SECONDS = 5.0


class ReadOnlyServer(psycopg.OperationalError):
    """The listening connection's server no longer takes writes: listen elsewhere."""


class Listener(threading.Thread):
    """Calls ``wake`` whenever a job becomes ready in one of ``queues`` (None: any queue).

    ``noticed``, if given, first hears which queue the notification named. ``rate_due``, if
    given, hears in how many seconds a job under a rate may start.
    """

    def __init__(
        self,
        wake: Callable[[], None],
        *,
        queues: Collection[str] | None = None,
        using: str = DEFAULT_DB_ALIAS,
        application_name: str = "pgjobs-listener",
        noticed: Callable[[str], None] | None = None,
        rate_due: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(name="pgjobs-listener", daemon=True)
        self.wake = wake
        self.noticed = noticed
        self.rate_due = rate_due
        self.queues = frozenset(queues) if queues is not None else None
        self.using = using
        self.application_name = application_name[:63]
        self.listening = threading.Event()
        self.reconnects = 0
        self._halt = threading.Event()
        self._check_now = threading.Event()

    def check_server(self) -> None:
        """Ping now rather than at the next ``PING_SECONDS``: the worker's own connection met a
        read-only server (a failover), and this one is most likely on the same."""
        self._check_now.set()

    def stop(self, timeout: float = 2.0) -> None:
        self._halt.set()
        self.join(timeout)

    def run(self) -> None:
        backoff = 0.1
        while not self._halt.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(sql.query("listen"))
                    self.listening.set()
                    backoff = 0.1
                    logger.info("listener.listening channel=%s", CHANNEL)
                    # Jobs enqueued while nobody listened sent notifications nobody got.
                    self.wake()
                    self._receive(conn)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._halt.is_set():
                    break
                self.reconnects += 1
                logger.warning("listener.lost reconnecting in %.1fs (polling meanwhile): %s",
                               backoff, exc)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_MAX_SECONDS)
        self.listening.clear()

    def _receive(self, conn: psycopg.Connection[Any]) -> None:
        pinged = time.monotonic()
        while not self._halt.is_set():
            for note in conn.notifies(timeout=RECEIVE_TIMEOUT_SECONDS):
                if note.channel == RATES_CHANNEL:
                    if self.rate_due is not None:
                        with contextlib.suppress(ValueError):
                            self.rate_due(float(note.payload))
                    continue
                if self.queues is None or note.payload in self.queues:
                    if self.noticed is not None:
                        self.noticed(note.payload)
                    self.wake()
            if self._check_now.is_set() or time.monotonic() - pinged >= PING_SECONDS:
                self._check_now.clear()
                row = conn.execute(sql.query("listener_ping")).fetchone()
                if row is not None and row[0]:
                    raise ReadOnlyServer("listening on a read-only server (a standby, or a "
                                         "primary demoted by a failover): it hears no "
                                         "enqueue; reconnecting")
                pinged = time.monotonic()

    def _connect(self) -> psycopg.Connection[Any]:
        params = connections[self.using].get_connection_params()
        # Django's cursor class and adapters are for its own connections; this one only listens.
        for key in ("cursor_factory", "context"):
            params.pop(key, None)
        params.setdefault("application_name", self.application_name)
        return psycopg.connect(**params, autocommit=True)
