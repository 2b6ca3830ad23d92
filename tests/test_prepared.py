"""The hot statements prepared once per session: what is sent, and how a session recovers."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DataError, ProgrammingError, connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_pgjobs import prepared
from django_pgjobs.models import Job
from django_pgjobs.prepared import Statement
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs, settle, settle_and_claim
from tests.conftest import succeeded
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

ADD_ONE = Statement("test_add_one", "SELECT %s::int + 1 AS n, '100%%' AS share")
DIVIDE = Statement("test_divide", "SELECT 10 / %s::int AS q")


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch) -> Iterator[None]:
    """Each test starts from a session that holds none of the library's statements."""
    monkeypatch.setattr(prepared, "_lost_sessions", {})
    monkeypatch.setattr(prepared, "_decided", {})
    prepared.reset("default")
    yield
    prepared.reset("default")


def sent(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries]


def held() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cursor.fetchall()}


def test_the_first_use_prepares_in_the_same_message_and_later_ones_send_only_execute() -> None:
    with CaptureQueriesContext(connection) as queries:
        first = prepared.run("default", [(ADD_ONE, [1])])
        second = prepared.run("default", [(ADD_ONE, [41])])
    assert first == [(["n", "share"], [(2, "100%")])]
    assert second == [(["n", "share"], [(42, "100%")])]
    assert sent(queries) == [
        f"PREPARE {ADD_ONE.name} AS SELECT $1::int + 1 AS n, '100%' AS share;\n"
        f"EXECUTE {ADD_ONE.name}(1)",
        f"EXECUTE {ADD_ONE.name}(41)",
    ]
    assert held() == {ADD_ONE.name}


def test_the_name_carries_a_digest_of_the_text() -> None:
    other = Statement("test_add_one", "SELECT %s::int + 2 AS n")
    assert ADD_ONE.name.startswith("pgjobs_test_add_one_") and other.name != ADD_ONE.name
    assert (ADD_ONE.arity, ADD_ONE.execute) == (1, f"EXECUTE {ADD_ONE.name}(%s)")


def test_several_statements_go_in_one_message_and_answer_in_order() -> None:
    prepared.run("default", [(ADD_ONE, [0])])
    with CaptureQueriesContext(connection) as queries:
        results = prepared.run("default", [(DIVIDE, [5]), (ADD_ONE, [2])])
    assert results == [(["q"], [(2,)]), (["n", "share"], [(3, "100%")])]
    [message] = sent(queries)
    assert message.startswith(f"PREPARE {DIVIDE.name} AS ") and message.endswith(
        f"EXECUTE {DIVIDE.name}(5);\nEXECUTE {ADD_ONE.name}(2)")


NAMED = Statement("test_named", "SELECT %(a)s::int * 10 + %(b)s::int AS n, %(a)s::int AS a")


@pytest.mark.parametrize("enabled", [True, False])
def test_a_named_value_is_one_parameter_wherever_it_stands(enabled: bool) -> None:
    assert (NAMED.names, NAMED.arity) == (["a", "b"], 2)
    assert NAMED.prepare == f"PREPARE {NAMED.name} AS SELECT $1::int * 10 + $2::int AS n, " \
                            "$1::int AS a"
    with override_settings(PGJOBS_PREPARED_STATEMENTS=enabled), \
            CaptureQueriesContext(connection) as queries:
        # Beside a positional statement, in one message.
        results = prepared.run("default", [(ADD_ONE, [1]), (NAMED, {"b": 2, "a": 4})])
    assert results == [(["n", "share"], [(2, "100%")]), (["n", "a"], [(42, 4)])]
    [message] = sent(queries)
    assert message.endswith(f"EXECUTE {NAMED.name}(4, 2)" if enabled else
                            "SELECT 4::int * 10 + 2::int AS n, 4::int AS a")


def test_a_statement_takes_one_kind_of_placeholder() -> None:
    with pytest.raises(ValueError, match="not both"):
        Statement("test_mixed", "SELECT %s::int + %(a)s::int")


def test_a_statement_is_planned_again_once_its_plan_is_old(monkeypatch) -> None:
    prepared.run("default", [(ADD_ONE, [1])])
    monkeypatch.setattr(prepared, "REPLAN_SECONDS", 0.0)
    with CaptureQueriesContext(connection) as queries:
        assert prepared.run("default", [(ADD_ONE, [2])]) == [(["n", "share"], [(3, "100%")])]
    [message] = sent(queries)
    assert message.startswith(f"DEALLOCATE {ADD_ONE.name};\nPREPARE {ADD_ONE.name} AS ")
    assert held() == {ADD_ONE.name}


def test_after_an_error_the_session_is_read_again_before_it_is_trusted() -> None:
    # The PREPARE ran, then the EXECUTE failed: the statement outlives the rollback.
    with pytest.raises(DataError), transaction.atomic():
        prepared.run("default", [(DIVIDE, [0])])
    assert held() == {DIVIDE.name}
    with CaptureQueriesContext(connection) as queries:
        assert prepared.run("default", [(DIVIDE, [2])]) == [(["q"], [(5,)])]
    assert [q.split(" ")[0] for q in sent(queries)] == ["SELECT", "EXECUTE"]


def test_a_statement_deallocated_behind_its_back_is_prepared_again() -> None:
    prepared.run("default", [(ADD_ONE, [1])])
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")
    with pytest.raises(ProgrammingError, match="does not exist"), transaction.atomic():
        prepared.run("default", [(ADD_ONE, [1])])
    assert prepared.run("default", [(ADD_ONE, [4])]) == [(["n", "share"], [(5, "100%")])]
    assert prepared.enabled("default")


def test_sessions_that_keep_losing_their_statements_stop_preparing(caplog) -> None:
    for _ in range(3):
        prepared.run("default", [(ADD_ONE, [1])])
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        with pytest.raises(ProgrammingError), transaction.atomic():
            prepared.run("default", [(ADD_ONE, [1])])
    assert "pooler in transaction mode" in caplog.text
    assert [r.levelno for r in caplog.records if r.name == "django_pgjobs.prepared"] == [
        logging.WARNING]
    assert not prepared.enabled("default")
    with CaptureQueriesContext(connection) as queries:
        assert prepared.run("default", [(ADD_ONE, [6])]) == [(["n", "share"], [(7, "100%")])]
    assert sent(queries) == ["SELECT 6::int + 1 AS n, '100%' AS share"]


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_prepares_again() -> None:
    prepared.run("default", [(ADD_ONE, [1])])
    connection.close()
    with CaptureQueriesContext(connection) as queries:
        prepared.run("default", [(ADD_ONE, [1])])
    assert sent(queries)[0].startswith(f"PREPARE {ADD_ONE.name} AS ")


@pytest.mark.parametrize(("setting", "database", "expected"), [
    (None, {}, True),
    # What Django asks of a database behind a pooler in transaction mode.
    (None, {"DISABLE_SERVER_SIDE_CURSORS": True}, False),
    (True, {"DISABLE_SERVER_SIDE_CURSORS": True}, True),
    (False, {}, False),
    # EXECUTE takes SQL literals, which server-side binding would not give it.
    (True, {"server_side_binding": True}, False),
])
def test_where_statements_are_prepared(monkeypatch, setting, database, expected) -> None:
    settings_dict = connections["default"].settings_dict
    for key, value in database.items():
        if key == "server_side_binding":
            monkeypatch.setitem(settings_dict.setdefault("OPTIONS", {}), key, value)
        else:
            monkeypatch.setitem(settings_dict, key, value)
    with override_settings(PGJOBS_PREPARED_STATEMENTS=setting):
        assert prepared.enabled("default") is expected


def test_the_decision_is_kept_and_made_again_when_a_setting_changes() -> None:
    assert prepared.enabled("default")
    with override_settings(PGJOBS_PREPARED_STATEMENTS=False):
        assert not prepared.enabled("default")
        assert not prepared.enabled("default")
    assert prepared.enabled("default")


def test_claims_and_settles_prepared_go_on_where_those_sent_in_full_left_off() -> None:
    jobs = JobFactory.create_batch(9)
    with override_settings(PGJOBS_PREPARED_STATEMENTS=False):
        first = claim_jobs("w1", "default", 3)
        applied_first, second = settle_and_claim(
            [succeeded(c) for c in first], "w1", "default", 3)
    assert held() == set()
    applied_second, third = settle_and_claim(
        [succeeded(c) for c in second], "w2", "default", 3)
    # And, in this test's transaction that goes on after them, the end of the settlement's
    # hand-over to the claim.
    assert held() == {name for name in held() if name.startswith((
        "pgjobs_claim3_", "pgjobs_settle_", "pgjobs_claim_to_end_"))}
    assert len(held()) == 3
    assert [c.id for c in first + second + third] == [j.id for j in jobs]
    assert list(applied_first.values()) == list(applied_second.values()) == [True] * 3
    assert {c.lease_owner for c in third} == {"w2"}
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 6
    assert Job.objects.filter(status=JobStatus.RUNNING, lease_owner="w2").count() == 3


ECHO = Statement("test_echo", "SELECT %s::text AS v, '%%s' AS mark")
TRICKY = [
    "plain", "it's", "''", "back\\slash", "\\'", "ends with \\", "%s and %(name)s and %%",
    "x'); DROP TABLE pgjobs_job; --", "line\nbreak\ttab", "caf\u00e9 \U0001f600", "$1 $$ $q$",
    '{"json": "it\'s \\"quoted\\""}', "",
]


@pytest.mark.parametrize("conforming", ["on", "off"])
def test_every_value_comes_back_as_it_was_written_into_the_execute(conforming) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        # Without standard-conforming strings a backslash escapes: psycopg writes those.
        cursor.execute(f"SET LOCAL standard_conforming_strings = {conforming}")
        cursor.execute("SET LOCAL escape_string_warning = off")
        answers = [prepared.run("default", [(ECHO, [value])]) for value in TRICKY]
    assert answers == [[(["v", "mark"], [(value, "%s")])] for value in TRICKY]
    assert Job.objects.count() == 0  # the table is still there to count


def test_a_statement_of_the_same_values_keeps_its_execute_for_the_session() -> None:
    same = Statement("test_same", "SELECT %s::text || %s::text AS v", same_values=True)
    with CaptureQueriesContext(connection) as queries:
        first = [prepared.run("default", [(same, ["a", "b"])]) for _ in range(2)]
        other = prepared.run("default", [(same, ["a", "c"])])
    assert first == [[(["v"], [("ab",)])]] * 2 and other == [(["v"], [("ac",)])]
    assert sent(queries)[1:] == [f"EXECUTE {same.name}('a', 'b')", f"EXECUTE {same.name}('a', 'c')"]
    session = prepared._sessions[connection.connection]
    assert set(session.bound.values()) == {
        f"EXECUTE {same.name}('a', 'b')", f"EXECUTE {same.name}('a', 'c')"}
    for n in range(100):  # a churn of values is not kept without bound
        prepared.run("default", [(same, ["a", str(n)])])
    assert len(session.bound) <= 64


TYPED = Statement(
    "test_typed", "SELECT %s::int8 AS i, %s::float8 AS f, %s::boolean AS b, %s::text AS t, "
    "%s::timestamptz AS at")


@pytest.mark.parametrize("values", [
    [0, 0.0, False, None, None],
    [-(2**62), -1.5e-300, True, "x", None],
    [2**62, 1.7976931348623157e308, None, None, None],
    [None, float("inf"), None, None, None],
])
def test_none_bools_ints_and_floats_are_written_as_literals_the_parameter_types_read_back(
        values) -> None:
    [(_, [row])] = prepared.run("default", [(TYPED, values)])
    assert list(row) == values


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_in_autocommit_is_prepared_and_one_in_a_transaction_sent_in_full() -> None:
    from django_pgjobs import enqueue

    with CaptureQueriesContext(connection) as queries:
        first = enqueue("tests.ok", {"n": 1}, priority=-3, timeout=2.5, max_attempts=7)
        enqueue("tests.ok", {"n": 2})
        with transaction.atomic():
            enqueue("tests.ok", {"n": 3})
    statements = [q for q in sent(queries) if "pgjobs_job" in q or "EXECUTE" in q]
    assert statements[0].startswith("PREPARE pgjobs_insert_job_")
    assert statements[1].startswith("EXECUTE pgjobs_insert_job_")
    assert statements[2].lstrip().startswith("-- One job") and "INSERT INTO pgjobs_job" in (
        statements[2])
    stored = Job.objects.get(pk=first.pk)
    assert (stored.priority, stored.timeout_seconds, stored.max_attempts, stored.payload) == (
        -3, 2.5, 7, {"n": 1})
    assert (first.run_at, first.deadline) == (stored.run_at, stored.deadline)


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_with_a_key_in_autocommit_is_prepared_apart_and_still_dedupes() -> None:
    from django_pgjobs import enqueue

    with CaptureQueriesContext(connection) as queries:
        plain = enqueue("tests.ok", {"n": 1})
        first = enqueue("tests.ok", {"n": 2}, idempotency_key="k")
        again = enqueue("tests.ok", {"n": 3}, idempotency_key="k")
    prepares = [q for q in sent(queries) if q.startswith("PREPARE pgjobs_insert_job_")]
    assert len(prepares) == 2
    assert ["ON CONFLICT DO NOTHING" in q for q in prepares] == [False, True]
    assert (first.created, again.created, again.pk) == (True, False, first.pk)
    assert sorted(Job.objects.values_list("pk", flat=True)) == sorted([plain.pk, first.pk])


@pytest.mark.parametrize("use_tz", [True, False])
@pytest.mark.django_db(transaction=True)
def test_enqueued_times_are_read_by_psycopgs_loader_and_equal_the_stored_ones(
        monkeypatch, settings, use_tz: bool) -> None:
    from django.db.backends.postgresql.psycopg_any import BaseTzLoader

    from django_pgjobs import enqueue

    settings.USE_TZ = use_tz
    djangos = BaseTzLoader.load
    read = []
    monkeypatch.setattr(BaseTzLoader, "load", lambda self, data: read.append(data) or djangos(
        self, data))
    answered = [enqueue("tests.ok", {"n": n}) for n in range(2)]  # prepared
    with transaction.atomic():
        answered.append(enqueue("tests.ok", {"n": 2}))  # sent in full
    # Django's loader reads the times only where it gives another zone: without time zones.
    assert len(read) == (0 if use_tz else 3 * 3)
    read.clear()
    times = [(j.created_at, j.run_at, j.deadline) for j in answered]
    stored = [(j.created_at, j.run_at, j.deadline) for j in
              (Job.objects.get(pk=job.pk) for job in answered)]
    assert repr(times) == repr(stored)


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_whose_statement_the_session_lost_is_sent_in_full_and_nothing_fails() -> None:
    from django_pgjobs import enqueue

    enqueue("tests.ok", {"n": 1})  # prepared in the session
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # the application's code, behind the library's back
    # Autocommit: the EXECUTE fails, nothing was written, and the row is sent again in full.
    enqueue("tests.ok", {"n": 2})
    with transaction.atomic():  # in a transaction nothing is prepared: it cannot fail there
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
        enqueue("tests.ok", {"n": 3})
        assert Job.objects.count() == 3
    with CaptureQueriesContext(connection) as queries:
        enqueue("tests.ok", {"n": 4})  # the session was read again: prepared anew
    assert any(q.startswith("PREPARE pgjobs_insert_job_") for q in sent(queries))
    assert sorted(j.payload["n"] for j in Job.objects.all()) == [1, 2, 3, 4]


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_after_a_raw_begin_is_sent_in_full_inside_that_transaction() -> None:
    from django_pgjobs import enqueue

    enqueue("tests.ok", {"n": 1})  # prepared in the session
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")  # the caller's own transaction, unknown to Django
        cursor.execute("DEALLOCATE ALL")
    with CaptureQueriesContext(connection) as queries:
        enqueue("tests.ok", {"n": 2})
    assert not any("EXECUTE pgjobs_insert_job_" in q for q in sent(queries))
    with connection.cursor() as cursor:
        cursor.execute("ROLLBACK")  # the caller's to end: its job goes with it
    assert sorted(j.payload["n"] for j in Job.objects.all()) == [1]


# --- JIT ---------------------------------------------------------------------------------

SEEN_JIT = """
CREATE TABLE test_jit_seen (statement text, jit text);
CREATE FUNCTION test_jit_seen() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO test_jit_seen VALUES (NEW.status, current_setting('jit'));
    RETURN NEW;
END $$;
CREATE TRIGGER test_jit_seen BEFORE UPDATE ON pgjobs_job
    FOR EACH ROW EXECUTE FUNCTION test_jit_seen();
"""


@pytest.fixture
def jit_seen() -> Iterator[Callable[[], list[tuple[str, str]]]]:
    """What ``jit`` was as each UPDATE of a job ran, by the job's new status, in order. The
    session's own setting is on."""
    with connection.cursor() as cursor:
        cursor.execute(SEEN_JIT)
        cursor.execute("SET jit = on")

    def seen() -> list[tuple[str, str]]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement, jit FROM test_jit_seen")
            return cursor.fetchall()

    try:
        yield seen
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_jit_seen ON pgjobs_job; "
                           "DROP FUNCTION test_jit_seen(); DROP TABLE test_jit_seen; "
                           "RESET jit")


def session_jit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        return cursor.fetchone()[0]


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.django_db(transaction=True)
def test_a_workers_claim_and_settle_run_without_jit_and_the_session_keeps_its_setting(
        enabled: bool, jit_seen: Callable[[], list[tuple[str, str]]]) -> None:
    # Past jit_above_cost every execution of the claim was compiled again, 30 to 60 ms.
    for _ in range(3):
        JobFactory(status=JobStatus.READY, queue="jit")
    with override_settings(PGJOBS_PREPARED_STATEMENTS=enabled):
        [first] = claim_jobs("w", "jit", 1)
        assert session_jit() == "on"  # SET LOCAL: the handler's queries plan as they would
        settle([succeeded(first)])
        [second] = settle_and_claim([], "w", "jit", 1)[1]
        [third] = settle_and_claim([succeeded(second)], "w", "jit", 1)[1]
        assert session_jit() == "on"
        # In a transaction of the caller's, the setting would outlive the claim: left alone.
        with transaction.atomic():
            settle_and_claim([succeeded(third)], "w", "jit", 1)
            assert session_jit() == "on"
    assert jit_seen() == [("running", "off"), ("succeeded", "off"), ("running", "off"),
                        ("succeeded", "off"), ("running", "off"), ("succeeded", "on")]


@pytest.mark.django_db(transaction=True)
def test_jit_is_left_alone_in_a_transaction_the_caller_opened_or_manages(
        jit_seen: Callable[[], list[tuple[str, str]]]) -> None:
    JobFactory.create_batch(2, status=JobStatus.READY, queue="jit")
    [claimed] = claim_jobs("w", "jit", 1)
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")  # the caller's own, unknown to Django: settle() runs inside it
        try:
            settle([succeeded(claimed)])
            assert session_jit() == "on"
        finally:
            cursor.execute("ROLLBACK")
    transaction.set_autocommit(False)  # the caller manages the transaction: atomic() is a savepoint
    try:
        claim_jobs("w", "jit", 1)
        assert session_jit() == "on"
    finally:
        transaction.rollback()
        transaction.set_autocommit(True)
    # The first claim's own; what ran in the caller's transactions was rolled back with them.
    assert jit_seen() == [("running", "off")]


@pytest.mark.django_db(transaction=True)
def test_outside_any_transaction_connects_and_reads_the_session() -> None:
    connection.close()
    assert prepared.outside_any_transaction(connection)
    assert connection.connection is not None
    with connection.cursor() as cursor:
        connection.connection.autocommit = False
        cursor.execute("SELECT 1")  # psycopg's own BEGIN: a transaction Django did not open
        assert not prepared.outside_any_transaction(connection)
        connection.connection.rollback()
        connection.connection.autocommit = True
    with transaction.atomic():
        assert not prepared.outside_any_transaction(connection)
    assert prepared.outside_any_transaction(connection)


def kept_cursor() -> Any:
    kept = connections["default"].__dict__.get(prepared._KEPT)
    return None if kept is None else kept.cursor


@pytest.mark.django_db(transaction=True)
def test_run_keeps_a_cursor_of_djangos_and_its_execute_wrappers_see_every_statement() -> None:
    prepared.run("default", [(ADD_ONE, [1])])  # the session is made, with Django's cursor
    seen: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                context: dict[str, Any]) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        assert prepared.run("default", [(ADD_ONE, [1])]) == [(["n", "share"], [(2, "100%")])]
        kept = kept_cursor()
        assert prepared.run("default", [(ADD_ONE, [2])]) == [(["n", "share"], [(3, "100%")])]
    assert kept_cursor() is kept is not None
    assert seen == [f"EXECUTE {ADD_ONE.name}(1)", f"EXECUTE {ADD_ONE.name}(2)"]
    # Queries logged: each run makes Django's debug cursor, which logs it.
    with CaptureQueriesContext(connection) as queries:
        prepared.run("default", [(ADD_ONE, [3])])
    assert sent(queries) == [f"EXECUTE {ADD_ONE.name}(3)"]
    # Closed behind its back: made again.
    kept.close()
    assert prepared.run("default", [(ADD_ONE, [4])]) == [(["n", "share"], [(5, "100%")])]
    assert kept_cursor() is not kept
    # A connection shared between threads: Django's cursor each time, none kept anew.
    kept = kept_cursor()
    kept.close()
    connection.inc_thread_sharing()
    try:
        prepared.run("default", [(ADD_ONE, [5])])
    finally:
        connection.dec_thread_sharing()
    assert kept_cursor() is kept


@pytest.mark.django_db(transaction=True)
def test_a_closed_connection_is_not_kept_alive_by_its_kept_cursor() -> None:
    import gc
    import weakref

    prepared.run("default", [(ADD_ONE, [1])])
    prepared.run("default", [(ADD_ONE, [1])])  # on the kept cursor
    assert kept_cursor() is not None
    gone = weakref.ref(connection.connection)
    connection.close()
    prepared.run("default", [(ADD_ONE, [1])])  # a new connection: its own session, then cursor
    prepared.run("default", [(ADD_ONE, [1])])
    gc.collect()
    assert gone() is None
    assert kept_cursor().cursor.connection is connection.connection


@pytest.mark.django_db(transaction=True)
def test_the_kept_cursor_is_made_again_when_the_session_changes_its_time_zone() -> None:
    from django_pgjobs import enqueue

    enqueue("tests.ok", {"n": 0})
    first = enqueue("tests.ok", {"n": 1})  # on the kept cursor, psycopg's loader in UTC
    assert first.created_at.utcoffset().total_seconds() == 0
    with connection.cursor() as cursor:
        cursor.execute("SET TIME ZONE 'Asia/Kolkata'")  # the application's, behind Django's back
    try:
        again = enqueue("tests.ok", {"n": 2})
        # What Django's own cursor gives: its time zone (UTC), whatever the session's.
        assert again.created_at.utcoffset().total_seconds() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET TIME ZONE 'UTC'")


@pytest.mark.django_db(transaction=True)
def test_the_kept_cursor_reads_times_in_the_zone_django_reads_them(settings) -> None:
    from django_pgjobs import enqueue

    zoned = [enqueue("tests.ok", {"n": n}) for n in range(2)]  # the second on the kept cursor
    assert all(job.created_at.tzinfo is not None for job in zoned)
    settings.USE_TZ = False  # Django's cursor would read naive times now
    naive = [enqueue("tests.ok", {"n": n}) for n in range(2)]
    assert all(job.created_at.tzinfo is None for job in naive)
    stored = Job.objects.get(pk=naive[1].pk)
    assert (naive[1].created_at, naive[1].run_at) == (stored.created_at, stored.run_at)
