"""django-pgjobs: enqueue next to bare ORM inserts, preload, pickup, claim versus history."""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.db import connection, transaction
from psycopg import sql

from bench.clients.timing import AUTOCOMMIT, alternate, pickup_latencies
from bench.harness import percentile
from django_pgjobs import JobSpec, enqueue, enqueue_many
from django_pgjobs.models import Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import JobStatus
from django_pgjobs.transitions import claim_jobs, settle


def reset() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE pgjobs_job, pgjobs_attempt, pgjobs_receipt, pgjobs_key_slot,"
                       " pgjobs_key_limit RESTART IDENTITY")
    return {}


def _bare_job(i: int) -> Job:
    # What a hand-rolled queue would insert into the same table: no validation, no NOTIFY.
    return Job(task="bench.noop", queue="default", payload={"n": i}, status=JobStatus.READY,
               max_attempts=20, lease_seconds=30)


def enqueue_single(n: int, rounds: int = 4) -> dict[str, Any]:
    """Each job in its own transaction: enqueue() versus a bare objects.create().

    In ``transaction.atomic()``, as a caller with data of its own to write enqueues; and in
    autocommit, where the INSERT is its own transaction (``AUTOCOMMIT`` marks that figure).
    """

    def pgjobs(first: int, count: int) -> None:
        for i in range(first, first + count):
            with transaction.atomic():
                enqueue("bench.noop", {"n": i})

    def pgjobs_autocommit(first: int, count: int) -> None:
        for i in range(first, first + count):
            enqueue("bench.noop", {"n": i})

    def orm(first: int, count: int) -> None:
        for i in range(first, first + count):
            with transaction.atomic():
                Job.objects.create(task="bench.noop", queue="default", payload={"n": i},
                                   status=JobStatus.READY, max_attempts=20, lease_seconds=30)

    rates = alternate({"pgjobs": pgjobs, "orm_create": orm,
                       "pgjobs" + AUTOCOMMIT: pgjobs_autocommit}, n, rounds)
    reset()
    return rates


def enqueue_bulk(n: int, chunk: int = 1000, rounds: int = 4) -> dict[str, Any]:
    """``chunk`` jobs per transaction: enqueue_many() versus bulk_create()."""

    def pgjobs(first: int, count: int) -> None:
        for start in range(first, first + count, chunk):
            with transaction.atomic():
                enqueue_many([JobSpec.of("bench.noop", {"n": i})
                              for i in range(start, min(start + chunk, first + count))])

    def orm(first: int, count: int) -> None:
        for start in range(first, first + count, chunk):
            with transaction.atomic():
                Job.objects.bulk_create(
                    [_bare_job(i) for i in range(start, min(start + chunk, first + count))]
                )

    rates = alternate({"pgjobs": pgjobs, "orm_bulk_create": orm}, n, rounds)
    reset()
    return rates


def preload(n: int, chunk: int = 1000, task: str = "bench.noop",
            payload: dict[str, Any] | None = None) -> dict[str, Any]:
    for start in range(0, n, chunk):
        with transaction.atomic():
            enqueue_many([JobSpec.of(task, {"n": i, **(payload or {})})
                          for i in range(start, min(start + chunk, n))])
    return {"jobs": n}


def pickup(samples: int) -> dict[str, Any]:
    def probe(key: int, port: int) -> None:
        with transaction.atomic():
            enqueue("bench.pickup", {"n": key, "port": port})

    return pickup_latencies(probe, samples)


# --- claim latency versus history ------------------------------------------------------------


def _copy_finished(template_id: int, rows: int) -> None:
    """Add ``rows`` finished jobs (and their attempt rows, which a success has none of) copied
    from a real finished job.

    Copying every column but the keys keeps this right when the schema gains columns.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_name IN ('pgjobs_job', 'pgjobs_attempt') ORDER BY ordinal_position"
        )
        columns: dict[str, list[str]] = {"pgjobs_job": [], "pgjobs_attempt": []}
        for table, column in cursor.fetchall():
            columns[table].append(column)
        job_cols = [c for c in columns["pgjobs_job"] if c != "id"]
        attempt_cols = [c for c in columns["pgjobs_attempt"]
                        if c not in ("id", "job_id", "lease_token")]
        cursor.execute("SELECT coalesce(max(id), 0) FROM pgjobs_job")
        last_id = cursor.fetchone()[0]
        ident = sql.SQL(", ").join
        cursor.execute(
            sql.SQL("INSERT INTO pgjobs_job ({cols}) SELECT {cols} FROM pgjobs_job, "
                    "generate_series(1, %s) WHERE id = %s").format(
                cols=ident(map(sql.Identifier, job_cols))
            ).as_string(connection.connection),
            [rows, template_id],
        )
        cursor.execute(
            sql.SQL("INSERT INTO pgjobs_attempt (job_id, lease_token, {cols}) "
                    "SELECT j.id, gen_random_uuid(), {acols} FROM pgjobs_job AS j "
                    "CROSS JOIN (SELECT * FROM pgjobs_attempt WHERE job_id = %s) AS a "
                    "WHERE j.id > %s").format(
                cols=ident(map(sql.Identifier, attempt_cols)),
                acols=ident(sql.Identifier("a", c) for c in attempt_cols),
            ).as_string(connection.connection),
            [template_id, last_id],
        )


def _succeed(jobs: list[Any]) -> None:
    settle([
        Outcome.succeeded(j, "null", 0)
        for j in jobs
    ])


def _explained_claim(batch: int) -> dict[str, Any]:
    """The server's side of one claim: buffers touched and execution time, which the machine's
    noise barely moves (the claim runs under EXPLAIN ANALYZE and is rolled back)."""
    try:
        from django_pgjobs.explain import explain
    except ImportError:  # a version without the EXPLAIN checks
        return {}
    report = explain("claim", batch=batch)
    buffers = report.buffers
    return {
        "buffers": buffers["hit"] + buffers["read"], "rows_read": report.rows_read,
        "server_ms": report.plan.get("Execution Time"),
        "planning_ms": report.plan.get("Planning Time"),
    }


def claim_history(
    sizes: list[int], claims: int = 200, batch: int = 10, ready: int = 20000
) -> dict[str, Any]:
    """Claim latency (batch ``batch``) with ``ready`` ready jobs as finished history grows."""
    reset()
    worker = f"bench-history-{uuid.uuid4().hex[:6]}"
    enqueue("bench.noop", {"n": -1})
    template = claim_jobs(worker, "default", 1)
    _succeed(template)
    template_id = template[0].id
    history = 1
    results = []
    for size in sizes:
        if size > history:
            _copy_finished(template_id, size - history)
            history = size
        # Keep the ready backlog at ``ready`` for every size.
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pgjobs_job WHERE status = 'ready'")
            missing = ready - cursor.fetchone()[0]
        if missing > 0:
            preload(missing)
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE pgjobs_job")
            cursor.execute("VACUUM ANALYZE pgjobs_attempt")
        timings = []
        for _ in range(claims):
            start = time.perf_counter()
            jobs = claim_jobs(worker, "default", batch)
            timings.append((time.perf_counter() - start) * 1000)
            _succeed(jobs)
        history += claims * batch
        results.append({
            "finished_rows": size, "p50_ms": percentile(timings, 50),
            "p99_ms": percentile(timings, 99), "mean_ms": sum(timings) / len(timings),
            **_explained_claim(batch),
        })
    reset()
    return {"batch": batch, "ready": ready, "sizes": results}
