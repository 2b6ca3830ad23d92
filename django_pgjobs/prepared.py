"""The hot statements, prepared once per connection and executed by name.

Parsing and planning the claim and the settle costs the server about as much again as running
them (``docs/benchmarks.md``), on every execution; so does the one-job INSERT, which is
prepared where no caller's transaction depends on it (``transitions.insert_job``). A prepared
statement is planned once: after five executions PostgreSQL keeps a generic plan, if it costs
no more than the custom ones.

They are SQL-level ``PREPARE`` and ``EXECUTE``, not the protocol's, so that a statement still
travels in the same simple-protocol message as the others of its transaction (Django binds
parameters client-side by default): the first use on a connection sends
``PREPARE name AS ...; EXECUTE name(...)``, every later one only the ``EXECUTE``.

Three things keep a generic plan honest:

- the statement's constants stay in its text (the claim's ``status = 'ready'``), so a generic
  plan can still use the partial index they select;
- each connection plans its statements again every ``REPLAN_SECONDS``: a plan made while a
  table was small cannot outlive the table's growth by longer than that, even where nothing
  ANALYZEs the table (an ANALYZE invalidates it at once);
- ``explain.py`` checks the generic plans themselves.

A statement made ``without_jit`` (the claim, the settle) runs with JIT compilation off: its
message starts with ``SET LOCAL jit = off`` when the transaction is the message's own or its
block's, never in a caller's, which the setting would outlive (``docs/claim-path.md``).

A prepared statement lives in the session, so behind a pooler that hands each transaction a
different server connection (PgBouncer in transaction mode) it must stay off: it is, by default,
on a database whose settings say ``DISABLE_SERVER_SIDE_CURSORS`` (what Django asks of such a
set-up) or that binds parameters server-side. ``PGJOBS_PREPARED_STATEMENTS`` decides otherwise.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.core.signals import setting_changed
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.asyncio import async_unsafe

from .conf import settings

logger = logging.getLogger("django_pgjobs.prepared")

REPLAN_SECONDS = 10.0
# Errors that say a statement this module counted on is not (or already) prepared in the
# session: someone ran DEALLOCATE or DISCARD, or a pooler moved the session. After this many,
# the database's statements go back to being sent in full.
_LOST_SESSION_LIMIT = 3
_LOST_SESSION_CODES = frozenset({"26000", "42P05"})  # invalid_sql_statement_name, duplicate

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%[s%]")


class Statement:
    """A statement with ``%s`` or ``%(name)s`` placeholders, and the name it is prepared under.

    The name carries a digest of the text: two versions of the library never share a name, and
    a name in ``pg_prepared_statements`` always means this text. A statement's values are a
    sequence for ``%s`` and a mapping for ``%(name)s`` (a name may stand in several places:
    prepared, it is one parameter).
    """

    def __init__(self, key: str, text: str, *, same_values: bool = False,
                 without_jit: bool = False, reads_times: bool = False) -> None:
        numbered, self.names, positional = _numbered(text)
        self.text = text
        # The same statement with ``%s`` in every place, to be sent in one message with others.
        self.positional = positional
        self.name = f"pgjobs_{key}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        self.arity = arity = len(self.names) if self.names else positional.count("%s")
        self.prepare = f"PREPARE {self.name} AS {numbered}"
        self.execute = (f"EXECUTE {self.name}({', '.join(['%s'] * arity)})" if arity
                        else f"EXECUTE {self.name}")
        # Sent with its values as literals, nothing left for psycopg to merge: ``%%`` is ``%``.
        self.prepare_sent = self.prepare.replace("%%", "%")
        # The same values call after call (a worker's queue and id): each session keeps the
        # EXECUTE with them written in.
        self.same_values = same_values
        self.without_jit = without_jit
        # Its answer has timestamptz columns, read by psycopg's loader where it may be.
        self.reads_times = reads_times
        # The names of its result's columns, read from its first result.
        self.columns: list[str] | None = None
        # Where a named statement's ``%s`` stand in ``positional``: the name of each.
        self._places = _PLACEHOLDER.findall(text) if self.names else []

    def arguments(self, values: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any]:
        """The values of the prepared statement's parameters, ``$1`` first."""
        if isinstance(values, Mapping):
            return [values[name] for name in self.names]
        return values

    def in_place(self, values: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any]:
        """The values of ``positional``'s ``%s``, in order."""
        if isinstance(values, Mapping):
            return [values[name] for name in self._places if name]
        return values


def _numbered(text: str) -> tuple[str, list[str], str]:
    """``text`` with its placeholders numbered ``$1, $2, ...`` (``%%`` stays: psycopg unescapes
    it), the parameters' names in that order (none for ``%s``), and ``text`` with ``%s`` only."""
    names: list[str] = []
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        name = match.group(1)
        if name is not None:
            if name not in names:
                names.append(name)
            return f"${names.index(name) + 1}"
        if match.group() == "%%":
            return "%%"
        count += 1
        return f"${count}"

    def positional(match: re.Match[str]) -> str:
        return "%s" if match.group(1) is not None else match.group()

    numbered = _PLACEHOLDER.sub(number, text)
    if names and count:
        raise ValueError("a statement takes %s or %(name)s placeholders, not both")
    return numbered, names, _PLACEHOLDER.sub(positional, text)


@dataclass
class _Session:
    """What one session holds: each statement's name and when it was planned."""

    planned_at: dict[str, float] = field(default_factory=dict)
    known: bool = True  # False after an error: the session is read before it is trusted
    # EXECUTEs with their values written in, of statements that repeat them.
    bound: dict[tuple[Any, ...], str] = field(default_factory=dict)


# Keyed by the psycopg connection, not Django's wrapper of it: a pool hands one connection to
# one wrapper after another, and its session keeps what was prepared on it.
_sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
_lost_sessions: dict[str, int] = {}
# Each alias's answer to ``enabled``.
_decided: dict[str, bool] = {}


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DATABASES" or setting.startswith("PGJOBS_"):
        _decided.clear()


setting_changed.connect(_on_setting_changed)


def enabled(using: str) -> bool:
    """Whether the hot statements are prepared on database ``using``.

    Decided from the settings at the first call for an alias, and kept: a single enqueue asks
    twice, and reading them was a fiftieth of its client's CPU. Decided again once a setting
    changes (``setting_changed``) or the alias's sessions keep losing their statements.
    """
    decided = _decided.get(using)
    if decided is None:
        decided = _decided[using] = _decide(using)
    return decided


def _decide(using: str) -> bool:
    chosen = settings.PREPARED_STATEMENTS
    if _lost_sessions.get(using, 0) >= _LOST_SESSION_LIMIT:
        return False
    database = connections[using].settings_dict
    binds_server_side = bool(database.get("OPTIONS", {}).get("server_side_binding"))
    if binds_server_side:
        # EXECUTE takes its arguments as SQL literals: it cannot carry bound parameters.
        return False
    if chosen is None:
        return not database.get("DISABLE_SERVER_SIDE_CURSORS", False)
    return bool(chosen)


def run(
    using: str, statements: Sequence[tuple[Statement, Sequence[Any] | Mapping[str, Any]]], *,
    whole_block: bool = False, connection: BaseDatabaseWrapper | None = None,
) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    """Run ``statements`` in order, in one message where the connection allows.

    Return each statement's column names and rows. Prepared where ``enabled``, each is sent as
    ``EXECUTE`` (preceded, on first use or when due to be planned again, by its ``PREPARE``).
    ``whole_block``: the statements are all that their ``transaction.atomic()`` block runs;
    when it is the outermost block, the message opens and commits the transaction itself.
    ``connection``: ``using``'s, where the caller holds it already.
    """
    if connection is None:
        connection = connections[using]
    reads_times = any(statement.reads_times for statement, _ in statements)
    kept = _kept_cursor(connection)
    if kept is None:
        with connection.cursor() as cursor:
            if reads_times:
                read_times_with_psycopgs_loader(connection, cursor.cursor)
            return _run(connection, cursor, using, statements, whole_block)
    if reads_times and not kept.reads_times:
        read_times_with_psycopgs_loader(connection, kept.cursor.cursor)
        kept.reads_times = True
    return _run(connection, kept.cursor, using, statements, whole_block)


@dataclass
class _Kept:
    """The cursor ``run`` keeps on a Django wrapper of a connection, and what it was made for.

    Kept on the wrapper, not in ``_sessions``: the cursor holds its psycopg connection, and a
    value of a weak-keyed dictionary that holds its own key keeps it forever.
    """

    cursor: Any  # Django's cursor wrapper (``cursor.cursor.connection``: the psycopg connection)
    timezone: Any  # Django's time zone for the connection, when it was made
    session_zone: bytes | None  # the session's TimeZone, when it was made
    reads_times: bool = False  # psycopg's timestamptz loader registered


_KEPT = "_pgjobs_kept_cursor"


@async_unsafe
def _kept_cursor(connection: BaseDatabaseWrapper) -> _Kept | None:
    """The cursor ``run`` keeps on ``connection``, or None: make one of Django's each time.

    Making a cursor was a tenth of a single enqueue's client CPU. A kept one is made by
    ``connection.cursor()``, and used only where a new one would be the same: it is made anew
    once the psycopg connection, Django's time zone or the session's changed, or it was closed.
    None where Django's cursor does more than make one: while queries are logged (each needs
    Django's debug wrapper), before the connection's health check, or on a connection shared
    between threads. Unlike a closed one, it keeps its last result until the next statement.
    """
    raw = connection.connection
    if raw is None or connection.queries_logged or connection.allow_thread_sharing or (
            connection.health_check_enabled  # type: ignore[attr-defined]
            and not connection.health_check_done):  # type: ignore[attr-defined]
        return None
    if raw not in _sessions:  # not preparing here, or not yet: nothing is kept before a session
        return None
    kept: _Kept | None = connection.__dict__.get(_KEPT)
    timezone = connection.timezone
    session_zone = raw.pgconn.parameter_status(b"TimeZone")
    if (kept is None or kept.cursor.cursor.connection is not raw or kept.cursor.cursor.closed
            or kept.timezone is not timezone or kept.session_zone != session_zone):
        kept = _Kept(connection.cursor(), timezone, session_zone)
        connection.__dict__[_KEPT] = kept
    else:
        connection.validate_thread_sharing()
    return kept


def _run(
    connection: BaseDatabaseWrapper, cursor: Any, using: str,
    statements: Sequence[tuple[Statement, Sequence[Any] | Mapping[str, Any]]], whole_block: bool,
) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    if not isinstance(cursor.cursor, psycopg.ClientCursor):
        # Server-side binding: one statement per message, each in full (and JIT as the
        # server has it: turning it off would cost a round trip of its own).
        results = []
        for statement, params in statements:
            cursor.execute(statement.positional, statement.in_place(params))
            results += _results(connection, cursor.cursor, [(statement, params)])
        return results
    session = _session(connection, cursor) if enabled(using) else None
    # Asked after _session, which may have read the session's statements in the block.
    carried = whole_block and _carries_its_transaction(connection, cursor.cursor)
    head = [WITHOUT_JIT] if _without_jit(connection, statements, whole_block) else []
    if session is None:
        texts = [*head, *(statement.positional for statement, _ in statements)]
        values = [value for statement, params in statements
                  for value in statement.in_place(params)]
        with _transaction_carried(cursor.cursor, carried):
            cursor.execute(";\n".join(_carry(texts, carried)), values)
            return _results(connection, cursor.cursor, statements)
    texts = head
    planned: list[str] = []
    now = time.monotonic()
    raw = cursor.cursor
    # libpq's own copy of what the server last reported (psycopg's ConnectionInfo would decode
    # the name and the value first).
    conforming = raw.connection.pgconn.parameter_status(b"standard_conforming_strings") == b"on"
    for statement, params in statements:
        planned_at = session.planned_at.get(statement.name)
        if planned_at is None or now - planned_at >= REPLAN_SECONDS:
            if planned_at is not None:
                texts.append(f"DEALLOCATE {statement.name}")
            texts.append(statement.prepare_sent)
            planned.append(statement.name)
        texts.append(_bound(session, raw, conforming, statement, statement.arguments(params)))
    try:
        # Every value is a literal in the text already: psycopg has nothing to merge, which
        # was a fifth of a worker's Python.
        with _transaction_carried(raw, carried):
            cursor.execute(";\n".join(_carry(texts, carried)))
            results = _results(connection, raw, statements)
    except Exception as error:
        _forget(session, using, error)
        raise
    for name in planned:
        session.planned_at[name] = now
    return results


def read_times_with_psycopgs_loader(connection: BaseDatabaseWrapper, raw: Any) -> None:
    """Read psycopg cursor ``raw``'s timestamptz columns with psycopg's own loader, compiled
    when it is.

    Django's loader is pure Python (it pins the time zone it wants): three times parsed with
    it were a sixth of a single enqueue's client CPU, and a third of reading a bulk enqueue's
    rows back. Where psycopg's loader gives the very time zone Django's would (UTC unless the
    database's TIME_ZONE says otherwise; not at all with USE_TZ = False), the values are the
    same. Registering it costs a cursor about 9 µs: only statements that read times ask
    (``Statement(reads_times=True)``).
    """
    if connection.timezone is raw.connection.info.timezone:
        raw.adapters.register_loader("timestamptz", _TIMESTAMPTZ_LOADER)


_TIMESTAMPTZ_LOADER = psycopg.adapters.get_loader(
    psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT)


def _carries_its_transaction(connection: BaseDatabaseWrapper, raw: Any) -> bool:
    """Whether the message may send its block's BEGIN and COMMIT itself.

    In ``transaction.atomic()`` psycopg sends BEGIN before the block's first statement and
    COMMIT at its end, each a round trip of its own, which costs client and server CPU as well
    as time (``docs/claim-path.md``). Sent as ``BEGIN; ...; COMMIT`` in the statements'
    message, the transaction is the same, in one round trip. Only for an outermost
    block that has sent nothing yet (a block inside a test's or a caller's transaction would end
    it), with the connection's default transaction characteristics (psycopg's own BEGIN would
    name any others).
    """
    conn = raw.connection
    return (len(connection.atomic_blocks) == 1
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            and not conn.autocommit and conn.isolation_level is None
            and conn.read_only is None and conn.deferrable is None)


WITHOUT_JIT = "SET LOCAL jit = off"


def _without_jit(connection: BaseDatabaseWrapper, statements: Sequence[tuple[Statement, Any]],
                 whole_block: bool) -> bool:
    """Whether the message turns JIT off for its statements: one of them asks, and the
    transaction the setting lasts for is the message's own (autocommit with no transaction
    open: the message is one implicit transaction) or that of an outermost block that holds
    only these statements and commits at its end (not a savepoint in a transaction the caller
    manages)."""
    if not any(statement.without_jit for statement, _ in statements):
        return False
    if outside_any_transaction(connection):
        return True
    return (whole_block and len(connection.atomic_blocks) == 1
            and connection.commit_on_exit and not connection.savepoint_ids)


def outside_any_transaction(connection: BaseDatabaseWrapper) -> bool:
    """Whether a statement sent now is its own transaction: autocommit, and no transaction
    the caller opened with a ``BEGIN`` of its own."""
    if connection.connection is None:
        connection.ensure_connection()
    # What get_autocommit() answers once connected, read without its second look at the
    # connection: asked on every single enqueue.
    if not connection.autocommit:
        return False
    status = connection.connection.info.transaction_status
    return bool(status == psycopg.pq.TransactionStatus.IDLE)


def _carry(texts: list[str], carried: bool) -> list[str]:
    return ["BEGIN", *texts, "COMMIT"] if carried else texts


@contextmanager
def _transaction_carried(raw: Any, carried: bool) -> Iterator[None]:
    """While the message runs, keep psycopg from sending a BEGIN of its own.

    Once it is committed, the block's end finds the connection idle, and psycopg sends no
    COMMIT. If a statement fails, the server skips the rest of the message, COMMIT included: the
    transaction is left failed, and the block's end rolls it back as it would have.
    """
    if not carried:
        yield
        return
    conn = raw.connection
    conn.autocommit = True
    try:
        yield
    finally:
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = False


def _results(
    connection: BaseDatabaseWrapper, raw: Any, statements: Sequence[tuple[Statement, Any]]
) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    """Each statement's column names and rows, skipping the results of PREPARE and DEALLOCATE.

    Read from psycopg's cursor itself: Django's wrapper looks each method up anew, and builds
    a description per access; a statement's column names never change.
    """
    results = []
    with connection.wrap_database_errors:
        for index, (statement, _) in enumerate(statements):
            if index:
                raw.nextset()
            while raw.pgresult is None or raw.pgresult.status != psycopg.pq.ExecStatus.TUPLES_OK:
                if not raw.nextset():
                    raise RuntimeError("a statement gave no result to read")
            if statement.columns is None:
                statement.columns = [column.name for column in raw.description]
            results.append((statement.columns, raw.fetchall()))
    return results


def _bound(
    session: _Session, raw: Any, conforming: bool, statement: Statement, params: Sequence[Any]
) -> str:
    """``statement``'s EXECUTE with ``params`` written in as literals."""
    if not params:
        return statement.execute
    # How a literal is written depends on standard_conforming_strings, which a session may SET.
    key = (statement.name, conforming, *params) if statement.same_values else None
    text = session.bound.get(key) if key is not None else None
    if text is None:
        literals = ", ".join(_literal(raw, conforming, p) for p in params)
        text = f"EXECUTE {statement.name}({literals})"
        if key is not None:
            if len(session.bound) >= 64:  # a worker has a queue or two: more means churn
                session.bound.clear()
            session.bound[key] = text
    return text


def _literal(raw: Any, conforming: bool, value: Any) -> str:
    """``value`` as an SQL literal for this connection.

    ASCII text (the settle's JSON document always is) is quoted here: where strings conform
    to the standard, a quote doubled is the only escape there is. None, booleans, integers and
    finite floats are written here too (an enqueue's row is mostly these); anything else
    psycopg quotes. The prepared statement gave each parameter its type, which the literal is
    read as.
    """
    kind = type(value)
    if kind is str:
        if conforming and value.isascii():
            return "'" + value.replace("'", "''") + "'"
    elif value is None:
        return "NULL"
    elif kind is bool:
        return "true" if value else "false"
    elif kind is int:
        return int.__repr__(value)
    elif kind is float and math.isfinite(value):
        return float.__repr__(value)
    return str(raw.mogrify("%s", [value]))


def _session(connection: BaseDatabaseWrapper, cursor: Any) -> _Session:
    """The session state of ``connection``: read from the server after an error, else kept."""
    session = _sessions.get(connection.connection)
    if session is None:
        session = _sessions[connection.connection] = _Session()
    if not session.known:
        # What an interrupted message left prepared (PREPARE outlives a rollback) is what the
        # server says, with the time of this reading: planned again REPLAN_SECONDS from now.
        session.planned_at = dict.fromkeys(_held(cursor), time.monotonic())
        session.known = True
    return session


def _held(cursor: Any) -> list[str]:
    """The names of this module's statements the server holds in the session."""
    cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'pgjobs\\_%'")
    return [name for (name,) in cursor.fetchall()]


def lost_statement(error: BaseException) -> bool:
    """Whether ``error`` says a statement this module counted on was not prepared in the
    session (or was already): the statement can be sent again in full."""
    cause = error.__cause__ if error.__cause__ is not None else error
    return getattr(cause, "sqlstate", None) in _LOST_SESSION_CODES


def _forget(session: _Session, using: str, error: BaseException) -> None:
    session.known = False
    if lost_statement(error):
        count = _lost_sessions[using] = _lost_sessions.get(using, 0) + 1
        if count >= _LOST_SESSION_LIMIT:
            _decided[using] = False
        if count == _LOST_SESSION_LIMIT:
            logger.warning(
                "prepared statements keep disappearing from the sessions of database %r (is a "
                "pooler in transaction mode in between?); its statements are sent in full from "
                "now on: set PGJOBS_PREPARED_STATEMENTS = False, or DISABLE_SERVER_SIDE_CURSORS "
                "in its settings", using,
            )


def prepare(using: str, statements: Sequence[Statement]) -> None:
    """Prepare ``statements`` on ``using``'s connection again, now (for plan checks).

    The plans are made under the session's settings and the tables' statistics of this moment,
    and each statement's next ``run`` sends its ``EXECUTE`` alone.
    """
    connection = connections[using]
    with connection.cursor() as cursor:
        session = _session(connection, cursor)
        for statement in statements:
            try:
                if statement.name in session.planned_at:
                    cursor.execute(f"DEALLOCATE {statement.name}")
                    del session.planned_at[statement.name]
                cursor.execute(statement.prepare_sent)
            except Exception as error:
                _forget(session, using, error)
                raise
            session.planned_at[statement.name] = time.monotonic()


def reset(using: str) -> None:
    """Deallocate every statement of this module in ``using``'s session and forget them."""
    connection = connections[using]
    with connection.cursor() as cursor:
        for name in _held(cursor):
            cursor.execute(f"DEALLOCATE {name}")
        _sessions[connection.connection] = _Session()


__all__ = ["REPLAN_SECONDS", "Statement", "enabled", "lost_statement", "prepare", "reset",
           "run"]
