"""Plans of the hot queries on small and on realistic history, and the pgjobs_explain command.

The small-history tests come first: the large history is built once, by a module fixture, when
the first test that needs it runs, and removed after the last test of this module.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_pgjobs import sql
from django_pgjobs.admin.display import EXACT_COUNT_MAX_ROWS
from django_pgjobs.explain import HOT_QUERIES, explain
from django_pgjobs.models import KEPT_SUCCESS, Attempt, Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.transitions import REPORT_FIELDS, claim_jobs
from tests.conftest import plan_nodes
from tests.history import build_history, clear_history

pytestmark = pytest.mark.django_db

FINISHED = 1_000_000
READY = 100_000
QUEUES = 8
BATCH = 10


def run_explain(*args: str) -> str:
    out = StringIO()
    call_command("pgjobs_explain", *args, stdout=out)
    return out.getvalue()


def explain_failure(*args: str) -> tuple[str, str]:
    out = StringIO()
    with pytest.raises(CommandError) as failure:
        call_command("pgjobs_explain", *args, stdout=out)
    return str(failure.value), out.getvalue()


def node_types(report) -> list[str]:
    return [node["Node Type"] for node in report.nodes()]


# The one way the settle may read attempts: a probe of the token's unique index, made for a
# report that did not apply (is it a takeover's attempt, to be kept beside, or the winning
# success sent again?).
BY_TOKEN = {("Index Only Scan", "pgjobs_attempt_lease_token_key"),
            ("Index Scan", "pgjobs_attempt_lease_token_key")}


def attempt_reads(nodes) -> set[tuple[str, str | None]]:
    """How a plan's nodes read pgjobs_attempt: (node type, index)."""
    return {(node["Node Type"], node.get("Index Name")) for node in nodes
            if "Scan" in node["Node Type"] and node.get("Relation Name") == "pgjobs_attempt"}


def seq_scanned(report) -> set[str]:
    """The tables a plan reads whole. The queue-state table (one row per paused queue) and the
    schedules (a few, here none) may be: reading them whole is the right plan for tables that
    small (the due-schedule test below holds the schedules' plan on 20,000 of them); the history
    tables may not."""
    return {node.get("Relation Name") for node in report.nodes()
            if node["Node Type"] == "Seq Scan"} - {"pgjobs_queue", "pgjobs_schedule"}


# --- small history ------------------------------------------------------------------------------


def test_every_hot_query_passes_on_a_small_table() -> None:
    with connection.cursor() as cursor:
        build_history(cursor, finished=500, ready=100, queues=4, scheduled=20, retrying=10,
                      due=10, running=20, receipts=100)
    output = run_explain("--queue", "q1", "--query", "all")
    assert output.count("\nOK\n") == len(HOT_QUERIES)
    assert "PROBLEM" not in output
    # The claim reads its batch through the claim index even when the table is tiny.
    assert "Index Scan using pgjobs_job_claim_idx on pgjobs_job (actual rows=10 loops=1)" in output
    assert "note: pgjobs_attempt, pgjobs_job, pgjobs_receipt hold at most 10000 rows" in output


def test_the_settle_writes_attempts_without_reading_them_in_a_young_table() -> None:
    # A few thousand attempts, under the size where a sequential scan passes the plan check, and
    # statistics that call the table empty: a settle that looked its attempts up could read every
    # one of them here. It writes each attempt's row once instead; a late report finds its row
    # through the unique index on the token, as a conflict and as a probe, never a scan.
    with connection.cursor() as cursor:
        build_history(cursor, finished=5000, ready=100, queues=1, scheduled=0, retrying=0,
                      due=0, running=0, receipts=0)
    report = explain("settle", queue="q0", batch=BATCH)
    assert report.ok, report.render()
    assert attempt_reads(report.nodes()) <= BY_TOKEN, report.render()
    assert "pgjobs_job" not in seq_scanned(report), report.render()
    # Late reports, for jobs that exist and one that does not: each is checked by primary key.
    claimed = claim_jobs("late", "q0", BATCH)
    reports = [replace(Outcome.succeeded(c, "null", 1), lease_token=uuid.uuid4())
               for c in claimed]
    reports.append(replace(reports[0], job_id=-1, lease_token=uuid.uuid4()))
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.query("settle_jobs"), [
            None, None,  # no claim follows
            json.dumps([{f: getattr(o, f) for f in REPORT_FIELDS} for o in reports], default=str)])
        raw = cursor.fetchone()[0]
    nodes = plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], raw
    assert attempt_reads(nodes) <= BY_TOKEN, raw
    assert Attempt.objects.filter(outcome="lost").count() == BATCH


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "must be from 1 to 100000, got 0"),
        (["--batch-size", "ten"], "'ten' is not a whole number"),
        (["--query", "vacuum"], "invalid choice: 'vacuum'"),
        (["--max-rows-factor", "0.5"], "must be at least 1, got 0.5"),
        (["--queue", ""], "the queue must be a queue name \\(1 to 64 letters"),
        (["--database", "elsewhere"], "unknown database alias 'elsewhere'"),
    ],
)
def test_bad_flags_exit_with_a_clear_message(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("pgjobs_explain", *args, stdout=StringIO())


# --- realistic history --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def history(django_db_setup: None, django_db_blocker) -> Iterator[None]:
    """One million finished jobs, 100k ready ones across queues and priorities; ANALYZEd."""
    with django_db_blocker.unblock():
        with transaction.atomic(), connection.cursor() as cursor:
            build_history(cursor, finished=FINISHED, ready=READY, queues=QUEUES)
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                clear_history(cursor)


@pytest.mark.slow
def test_the_history_is_as_large_as_the_plans_claim(history: None) -> None:
    assert Job.objects.filter(status__in=["succeeded", "dead", "cancelled"]).count() == FINISHED
    assert Job.objects.filter(status="ready").count() == READY
    assert Job.objects.filter(status="ready").values("queue").distinct().count() == QUEUES
    assert Job.objects.filter(status="ready").values("priority").distinct().count() == 5
    # A success has no attempt row: only the dead and cancelled tenth, and the running jobs.
    assert Job.objects.filter(KEPT_SUCCESS).count() == (
        FINISHED * 9 // 10)
    assert Attempt.objects.count() == FINISHED // 10 + Job.objects.filter(status="running").count()


@pytest.mark.slow
@pytest.mark.parametrize(("prepare", "queue_cond"), [
    # Prepared, the plan is the generic one: the queue is its first parameter (the pause check
    # and the candidates take the same one), status = 'ready' is written in.
    (None, "((queue)::text = $1)"),
    (False, "((queue)::text = 'q3'::text)"),
])
def test_the_claim_reads_its_batch_through_the_claim_index_and_nothing_else(
    history: None, prepare: bool | None, queue_cond: str,
) -> None:
    with override_settings(PGJOBS_PREPARED_STATEMENTS=prepare):
        report = explain("claim", queue="q3", batch=10)
    assert report.ok, report.render()
    generic = "the generic plan of the prepared statement workers execute"
    assert (generic in report.notes) is (prepare is None)
    [scan] = [n for n in report.nodes() if n.get("Index Name") == "pgjobs_job_claim_idx"]
    assert (scan["Node Type"], scan["Actual Rows"], scan["Actual Loops"]) == ("Index Scan", 10, 1)
    assert scan["Index Cond"] == queue_cond
    assert seq_scanned(report) == set()
    assert not [t for t in node_types(report) if t.startswith("Bitmap")]
    # The candidates through the claim index, then each one again by primary key to update it.
    assert (report.rows_via_index, report.rows_read) == (10, 20)


@pytest.mark.slow
def test_every_hot_query_reads_about_its_batch_on_large_history(history: None) -> None:
    reports = {name: explain(name, queue="q3", batch=BATCH) for name in HOT_QUERIES}
    for report in reports.values():
        assert report.ok, report.render()
        assert seq_scanned(report) == set(), report.render()
    # Bounds, not exact counts: how many index entries a scan visits moves between PostgreSQL
    # majors (18 reads one row fewer than 15 for the loose scan of ready_queues). What must hold
    # on every major is that each query does its batch's work and reads about that much, however
    # large the history.
    bounds = {
        "claim": (BATCH, 2 * BATCH),  # the candidates, then each again by primary key
        "promote": (BATCH, 2 * BATCH),
        # No pending job in this history: the pending index alone, however large the rest.
        "expire_pending": (0, 2 * BATCH),
        "rescue": (BATCH, 2 * BATCH),
        "ready_queues": (QUEUES, QUEUES + 1),  # one probe per queue, one that finds none
        "settle": (BATCH, 2 * BATCH),  # the jobs by primary key; attempts are only written
        "aging": (BATCH, 2 * BATCH),
        "prune": (BATCH, 3 * BATCH),  # the finished jobs, their attempts, the rows deleted
        "schedules": (0, 2 * BATCH),  # no schedules in this history: see the test below
    }
    assert set(reports) == set(bounds)
    for name, report in reports.items():
        low, high = bounds[name]
        assert low <= report.rows_read <= high, (
            f"{name} read {report.rows_read} rows, expected {low} to {high}\n{report.render()}"
        )
    used = {name: {n.get("Index Name") for n in r.nodes()} for name, r in reports.items()}
    assert "pgjobs_job_pkey" in used["settle"]
    assert attempt_reads(reports["settle"].nodes()) <= BY_TOKEN, reports["settle"].render()
    assert any((i or "").startswith("pgjobs_attempt_job_id") for i in used["prune"])


@pytest.mark.slow
def test_the_command_explains_the_exact_claim_statement_and_leaves_nothing_behind(
    history: None,
) -> None:
    before = (Job.objects.filter(status="ready").count(), Attempt.objects.count())
    with CaptureQueriesContext(connection) as explained:
        output = run_explain("--queue", "q3", "--batch-size", "10")
    assert (Job.objects.filter(status="ready").count(), Attempt.objects.count()) == before

    with transaction.atomic(), CaptureQueriesContext(connection) as claimed:
        claim_jobs("pgjobs-explain", "q3", 10)
        transaction.set_rollback(True)
    # The statement workers prepare, explained by name with the values a claim sends.
    [claim_sql] = [q["sql"] for q in claimed.captured_queries
                   if q["sql"].startswith("EXECUTE pgjobs_claim10_")]
    assert [q["sql"] for q in explained.captured_queries
            if q["sql"].startswith("EXECUTE pgjobs_claim10_")] == [claim_sql]

    assert "-> Index Scan using pgjobs_job_claim_idx on pgjobs_job (actual rows=10 loops=1)" in (
        output)
    assert "rows read: 20, of them 20 from tables over 10000 rows (budget 80 for a batch of 10)" \
        in output
    assert output.rstrip().endswith("OK")


@pytest.mark.slow
def test_the_command_fails_when_the_claim_does_not_use_the_claim_index(history: None) -> None:
    with connection.cursor() as cursor:
        for switch in ("indexscan", "indexonlyscan", "bitmapscan"):
            cursor.execute(f"SET LOCAL enable_{switch} = off")
    message, output = explain_failure("--queue", "q3")
    assert message == "plan check failed for: claim"
    assert "PROBLEM: does not read pgjobs_job_claim_idx with an index scan (reads: Seq Scan " \
           "on pgjobs_job" in output
    assert "PROBLEM: sequential scan of pgjobs_job" in output


@pytest.mark.slow
def test_the_command_fails_when_the_claim_reads_far_more_rows_than_its_batch(
    history: None,
) -> None:
    # Another session holds the first 100 candidates, so the claim reads past them.
    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM pgjobs_job WHERE status = 'ready' AND queue = 'q3' "
                "ORDER BY priority DESC, run_at, id LIMIT 100 FOR UPDATE"
            )
            assert len(cursor.fetchall()) == 100
        message, output = explain_failure("--queue", "q3", "--batch-size", "10")
        # The same contention fits the budget of a larger factor.
        lenient = run_explain("--queue", "q3", "--batch-size", "10", "--max-rows-factor", "10")
    finally:
        holder.rollback()
        holder.close()
    assert message == "plan check failed for: claim"
    assert "PROBLEM: reads 120 rows for a batch of 10, more than 80 (4 x 2 per row)" in output
    assert "does not read" not in output
    assert "rows read: 120, of them 120 from tables over 10000 rows (budget 200" in lenient
    assert lenient.rstrip().endswith("OK")


# Every console page, as an operator opens it, with the history and a week of samples.
CONSOLE_PAGES = [
    "/admin/pgjobs/job/dashboard/", "/admin/pgjobs/job/dashboard/?range=24h",
    "/admin/pgjobs/job/dashboard/?range=7d", "/admin/pgjobs/job/",
    "/admin/pgjobs/job/?status__exact=dead", "/admin/pgjobs/job/?q=demo.",
    "/admin/pgjobs/job/?q=abc", "/admin/pgjobs/job/?queue=q3&status__exact=ready",
    "/admin/pgjobs/job/?finished=24h", "/admin/pgjobs/job/?status__exact=dead&finished=1h",
    "/admin/pgjobs/workerprocess/", "/admin/pgjobs/queuestate/", "/admin/pgjobs/schedule/",
    "/admin/pgjobs/keylimit/", "/admin/pgjobs/operatoraction/", "/admin/pgjobs/attempt/",
    "/admin/pgjobs/idempotencyreceipt/",
]
WEEK_OF_SAMPLES = """
INSERT INTO pgjobs_queue_sample (sampled_at, queue, ready, waiting, running,
                                 oldest_ready_seconds, succeeded, failed, dead)
SELECT date_bin(interval '60 seconds', now(), timestamptz '2000-01-01')
       - make_interval(mins => m), 'q' || q, 100, 5, 4, 30, 60, 1, 0
FROM generate_series(0, 7 * 24 * 60) AS m, generate_series(0, 7) AS q
"""


@pytest.mark.slow
def test_every_console_page_answers_from_indexes_on_a_million_finished_jobs(
    history: None,
) -> None:
    from django.test import Client

    from django_pgjobs import history as queue_history
    from django_pgjobs.workers import Heartbeat
    from tests.conftest import make_user

    Heartbeat("w1", queues=None, concurrency=4, listens=False, running=lambda: 0)()
    with connection.cursor() as cursor:
        cursor.execute(WEEK_OF_SAMPLES)
        cursor.execute("ANALYZE pgjobs_queue_sample")
    client = Client()
    client.force_login(make_user("root", superuser=True))
    with CaptureQueriesContext(connection) as ctx:
        for url in CONSOLE_PAGES:
            assert client.get(url).status_code == 200, url
    plans = {}
    with connection.cursor() as cursor:
        for query in ctx.captured_queries:
            text = query["sql"]
            if text.lstrip().upper().startswith(("SELECT", "WITH")) and "pgjobs_" in text:
                cursor.execute("EXPLAIN (FORMAT JSON) " + text)
                raw = cursor.fetchone()[0]
                plans[text] = plan_nodes((json.loads(raw) if isinstance(raw, str)
                                          else raw)[0]["Plan"])
    # Reading a small table whole is the right plan (a few receipts, the audit log of a few
    # actions); a table of more than 10,000 rows never is.
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relname LIKE 'pgjobs%%' "
                       "AND relkind = 'r' AND reltuples > 10000")
        large = {row[0] for row in cursor.fetchall()}
    assert {"pgjobs_job", "pgjobs_attempt", "pgjobs_queue_sample"} <= large
    # A list counts its rows exactly only while the planner expects at most 100,000 of them
    # (EstimatedCountPaginator): a bounded read, the one whole read allowed.
    read_whole = [(text[:160], n["Relation Name"]) for text, nodes in plans.items()
                  for n in nodes if n["Node Type"] == "Seq Scan"
                  and n.get("Relation Name") in large
                  and not (text.startswith("SELECT COUNT(*)")
                           and n["Plan Rows"] <= EXACT_COUNT_MAX_ROWS)]
    assert len(plans) > 20  # distinct statements
    assert read_whole == [], "\n".join(map(str, read_whole))

    # The sample: one statement per interval, reading what is live and the interval's end of
    # the finished index, never the history behind it.
    with CaptureQueriesContext(connection) as ctx:
        queue_history.sample_queues()
    assert len(ctx.captured_queries) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + ctx.captured_queries[0]["sql"])
        raw = cursor.fetchone()[0]
    nodes = plan_nodes((json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"])
    finished = [n for n in nodes if n.get("Index Name") == "pgjobs_job_finished_idx"]
    assert finished and all(n["Actual Rows"] * n["Actual Loops"] < 1000 for n in finished)
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name") in large]


SCHEDULES = """
INSERT INTO pgjobs_schedule (name, task, cron, timezone, payload, queue, misfire, catch_up_limit,
                             overlap, source, paused_at, next_tick_at, ticks_enqueued,
                             ticks_missed, ticks_skipped, last_skip_reason, last_error,
                             created_at, updated_at)
SELECT 'explain.' || i, 'tests.when', '* * * * *', 'UTC', '{}', '', 'skip', 100,
       CASE WHEN i %% 2 = 0 THEN 'skip' ELSE 'allow' END, 'admin',
       CASE WHEN i %% 4 = 1 THEN now() END,
       CASE WHEN i <= %s OR i %% 4 = 1 THEN now() - interval '1 minute'
            ELSE now() + make_interval(mins => i) END,
       0, 0, 0, '', '', now(), now()
FROM generate_series(1, %s) AS i
"""


def test_the_due_schedule_query_reads_the_due_index_and_about_its_batch() -> None:
    # 20,000 schedules: a quarter paused (and past due), 30 due, the rest due later. The plan
    # also reads pgjobs_job (each due schedule's last job): its statistics are set up here too,
    # or the planner and the plan check read what an earlier test left in pg_class (ANALYZE
    # writes reltuples in place, so a rolled-back test's large table outlives its rows).
    with connection.cursor() as cursor:
        cursor.execute(SCHEDULES, [30, 20_000])
        for table in ("pgjobs_schedule", "pgjobs_job"):
            cursor.execute(f"ANALYZE {table}")
    report = explain("schedules", batch=BATCH)
    assert report.ok, report.render()
    [scan] = [n for n in report.nodes() if n.get("Index Name") == "pgjobs_schedule_due_idx"]
    assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), report.render()
    assert not [n for n in report.nodes() if n["Node Type"] == "Seq Scan"
                and n.get("Relation Name") == "pgjobs_schedule"], report.render()
    # The batch through the due index (paused ones are not in it); the last jobs by key.
    assert BATCH <= report.rows_read <= 2 * BATCH, report.render()
