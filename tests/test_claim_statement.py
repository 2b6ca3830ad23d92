"""The claim's statement is written whole in ``sql/jobs.sql``; its candidates are the ORM's
``select_for_update(skip_locked=True)`` query, and ``pgjobs_explain --show-sql`` prints what
runs."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_pgjobs import prepared
from django_pgjobs.transitions import claim_candidates, claim_jobs, claim_statement
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def written_candidates(limit: int) -> str:
    """The claim's candidates, their LIMIT the batch: the statement's limit is the batch less
    what a settlement in its transaction handed the claim (none outside settle_and_claim)."""
    text = claim_statement(limit).text
    candidates = text.split("WITH candidates AS (\n", 1)[1].split("\n), claimed AS (", 1)[0]
    room = f"LIMIT pgjobs_claim_room({limit})\n"
    assert candidates.count(room) == 1
    return candidates.replace(room, f"LIMIT {limit}\n")


def compiled_candidates(queue: str, limit: int) -> str:
    """The ORM's query as the claim's transaction compiles it, values written in as sent."""
    with transaction.atomic():
        text, params = claim_candidates(queue, limit).query.get_compiler(
            using="default").as_sql()
    return connection.ops.compose_sql(text, params)  # type: ignore[attr-defined, no-any-return]


def same_sql(text: str) -> str:
    """``text`` with what does not change its meaning left out: layout, and the quotes of
    identifiers (Django 6 quotes the subquery's alias, Django 5.2 does not)."""
    text = re.sub(r"\s+", " ", text.replace('"', ""))
    return re.sub(r"\( | \)", lambda m: m.group().strip(), text).strip()


@pytest.mark.parametrize("limit", [1, 10, 250])
def test_the_written_candidates_are_the_orm_query_compiled(limit: int) -> None:
    queue = "it's a queue"  # a quote in the name: the parameter, not the text, carries it
    written = written_candidates(limit).replace(
        "%(queue)s", connection.ops.compose_sql("%s", [queue]))  # type: ignore[attr-defined]
    assert same_sql(written) == same_sql(compiled_candidates(queue, limit))


def test_the_comparison_tells_a_different_query_apart() -> None:
    compiled = compiled_candidates("q", 10)
    written = written_candidates(10).replace("%(queue)s", "'q'")
    assert same_sql(written) == same_sql(compiled)
    for change in [("DESC", "ASC"), (" SKIP LOCKED", ""), ("'ready'", "'scheduled'"),
                   ("LIMIT 10", "LIMIT 11"), ("NOT EXISTS", "EXISTS")]:
        assert same_sql(written.replace(*change)) != same_sql(compiled), change


def test_the_statement_takes_the_queue_and_the_worker_and_writes_in_the_rest() -> None:
    statement = claim_statement(10)
    assert statement.names == ["queue", "worker_id"]
    assert "'ready'" in statement.text and "LIMIT pgjobs_claim_room(10)\n" in statement.text
    assert claim_statement(10) is statement  # one statement per batch size, prepared as one
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ValueError, match="batch size"):
            claim_statement(bad)  # type: ignore[arg-type]


def test_show_sql_prints_the_text_the_claim_prepares() -> None:
    # The command checks the claim's plan too: the table's statistics are this test's, not
    # what an earlier test's rolled-back history left in pg_class.
    JobFactory.create_batch(20)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pgjobs_job")
    out = StringIO()
    call_command("pgjobs_explain", "--show-sql", "--batch-size", "7", stdout=out)
    printed = out.getvalue().split("\n\n", 1)[0]

    prepared.reset("default")
    with transaction.atomic(), CaptureQueriesContext(connection) as claimed:
        claim_jobs("w", "default", 7)
        transaction.set_rollback(True)
    [sent] = [q["sql"] for q in claimed.captured_queries if "PREPARE pgjobs_claim7_" in q["sql"]]
    body = sent.split(" AS ", 1)[1].split(";\nEXECUTE ", 1)[0]
    assert body == printed.replace("%(queue)s", "$1").replace("%(worker_id)s", "$2")
