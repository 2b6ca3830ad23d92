"""A worker's claim, with the settlement that rides along, is one round trip with its BEGIN and
COMMIT; inside a caller's transaction it leaves that transaction alone."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext
from psycopg import pq

from django_pgjobs import prepared
from django_pgjobs.models import Job
from django_pgjobs.prepared import Statement
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs, settle_and_claim
from tests.conftest import succeeded
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db(transaction=True)


def round_trips(action: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``action`` under libpq's protocol trace; (ReadyForQuery messages, its answer)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            answer = action()
        finally:
            pgconn.untrace()
        trace.seek(0)
        return sum("ReadyForQuery" in line for line in trace.read().splitlines()), answer


def sent(queries: CaptureQueriesContext) -> list[str]:
    """The messages sent, without the BEGIN and COMMIT Django logs for its atomic blocks."""
    return [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]


def committed_statuses() -> dict[int, str]:
    """Job statuses as another session sees them: only what was committed."""
    settings = connection.settings_dict
    with psycopg.connect(dbname=settings["NAME"], user=settings["USER"], host=settings["HOST"],
                         port=settings["PORT"] or None, password=settings["PASSWORD"] or None,
                         autocommit=True) as other:
        return dict(other.execute("SELECT id, status FROM pgjobs_job").fetchall())


def test_a_claim_with_its_settlement_is_one_round_trip_and_commits_both() -> None:
    jobs = JobFactory.create_batch(6)
    first = claim_jobs("w1", "default", 3)  # a fresh connection's first claim prepares
    with CaptureQueriesContext(connection) as queries:
        trips, (applied, second) = round_trips(lambda: settle_and_claim(
            [succeeded(c) for c in first], "w1", "default", 3))
    assert trips == 1
    [message] = sent(queries)
    assert message.startswith("BEGIN;\n") and message.endswith(";\nCOMMIT")
    assert "EXECUTE pgjobs_settle_" in message and "EXECUTE pgjobs_claim3_" in message
    assert list(applied.values()) == [True] * 3
    assert sorted(c.id for c in first + second) == sorted(j.pk for j in jobs)
    assert committed_statuses() == {**{c.id: JobStatus.SUCCEEDED for c in first},
                                    **{c.id: JobStatus.RUNNING for c in second}}
    # Django and psycopg agree the block is over: the next claim goes the same way.
    assert connection.get_autocommit() and connection.connection.autocommit
    assert round_trips(lambda: claim_jobs("w1", "default", 3))[0] == 1


def test_a_claim_inside_a_callers_transaction_neither_begins_nor_commits_it() -> None:
    before = JobFactory.create_batch(2)
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        # The caller's block has sent nothing yet when the claim, a block inside it, runs.
        claimed = claim_jobs("w1", "default", 5)
        assert len(claimed) == 2
        added = JobFactory()
        # Nothing the caller's transaction did, the claim included, is visible yet.
        assert committed_statuses() == {job.pk: JobStatus.READY for job in before}
        transaction.set_rollback(True)
    [message] = [text for text in sent(queries) if "pgjobs_claim5_" in text]
    assert message.startswith(("PREPARE pgjobs_claim5_", "EXECUTE pgjobs_claim5_"))
    assert "COMMIT" not in message
    assert not Job.objects.filter(pk=added.pk).exists()
    assert set(Job.objects.values_list("status", flat=True)) == {JobStatus.READY}


def test_a_failed_message_commits_nothing_and_the_next_claim_works() -> None:
    jobs = JobFactory.create_batch(4)
    first = claim_jobs("w1", "default", 2)
    # jsonb refuses a NUL character: the settle fails, and with it the whole message.
    bad = [replace(succeeded(c), error="nul \x00 here") for c in first]
    with pytest.raises(DataError):
        settle_and_claim(bad, "w1", "default", 2)
    statuses = committed_statuses()
    assert sorted(statuses.values()) == [JobStatus.READY] * 2 + [JobStatus.RUNNING] * 2
    assert {statuses[c.id] for c in first} == {JobStatus.RUNNING}
    assert connection.get_autocommit() and connection.connection.autocommit
    # The first use after an error reads which statements the session holds, in the block.
    applied, second = settle_and_claim(
        [succeeded(c) for c in first], "w1", "default", 2)
    assert list(applied.values()) == [True, True]
    assert sorted(c.id for c in first + second) == sorted(j.pk for j in jobs)
    trips, (applied, third) = round_trips(lambda: settle_and_claim(
        [succeeded(c) for c in second], "w1", "default", 2))
    assert trips == 1 and list(applied.values()) == [True, True] and third == []
    assert set(committed_statuses().values()) == {JobStatus.SUCCEEDED}


def test_a_connection_of_other_transaction_characteristics_gets_psycopgs_own_begin() -> None:
    JobFactory.create_batch(2)
    claim_jobs("w1", "default", 1)
    connection.connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        with CaptureQueriesContext(connection) as queries:
            trips, claimed = round_trips(lambda: claim_jobs("w1", "default", 1))
    finally:
        connection.connection.isolation_level = None
    assert trips == 3 and len(claimed) == 1  # BEGIN ISOLATION LEVEL ..., the claim, COMMIT
    [message] = sent(queries)
    # The block is the claim's own: JIT off for it (prepared.Statement's without_jit).
    assert message.startswith("SET LOCAL jit = off;\nEXECUTE pgjobs_claim1_")
    assert committed_statuses()[claimed[0].id] == JobStatus.RUNNING


def test_a_block_inside_another_without_a_savepoint_does_not_commit_the_outer_one() -> None:
    job = JobFactory(priority=0)
    touch = Statement("test_touch", "UPDATE pgjobs_job SET priority = 7 RETURNING id")
    with transaction.atomic():
        with transaction.atomic(savepoint=False):  # sends nothing: no SAVEPOINT
            assert prepared.run("default", [(touch, [])], whole_block=True) == [
                (["id"], [(job.pk,)])]
        transaction.set_rollback(True)
    assert Job.objects.get(pk=job.pk).priority == 0
