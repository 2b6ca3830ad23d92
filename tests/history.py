"""Realistic queue history built in the database with generate_series, for plan tests.

Finished jobs spread over thirty days, each after one attempt: a success kept on its job (its
worker, claim and handler time), a dead or cancelled job's attempt in its own row; ready jobs
spread across queues and priorities; scheduled, retrying and running jobs (some due, some with
expired leases); receipts, half of them expired. Then ANALYZE, so the planner sees what a
production table holds.
"""

from __future__ import annotations

from typing import Any

PRIORITIES = "ARRAY[-10, 0, 0, 5, 10, 50]"

_FINISHED = f"""
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                        run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                        trace_id, failure_class, terminal_reason, last_error, result,
                        created_at, updated_at, started_at, finished_at, lease_owner,
                        claimed_at, duration_ms)
SELECT 'demo.noop', 1, 'q' || (g %% %(queues)s), jsonb_build_object('n', g),
       s.status, p.priority, p.priority, t.at, 1, 5, 0, t.at + interval '3 days', 30, '',
       CASE s.status WHEN 'dead' THEN 'permanent' ELSE '' END,
       CASE s.status WHEN 'dead' THEN 'permanent_error' WHEN 'cancelled' THEN 'operator'
                     ELSE 'succeeded' END,
       '', NULL, t.at, t.at + interval '1 second', t.at, t.at + interval '1 second',
       CASE s.status WHEN 'succeeded' THEN 'history-worker' END, t.at,
       CASE s.status WHEN 'succeeded' THEN 3 END
FROM generate_series(1, %(finished)s) AS g,
     LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / %(finished)s) AS at) AS t,
     LATERAL (SELECT CASE WHEN g %% 20 = 0 THEN 'dead' WHEN g %% 20 = 1 THEN 'cancelled'
                          ELSE 'succeeded' END AS status) AS s,
     LATERAL (SELECT ({PRIORITIES})[1 + g %% 6] AS priority) AS p
"""

_LIVE = f"""
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                        run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                        lease_owner, lease_token, lease_expires_at, heartbeat_at, trace_id,
                        failure_class, terminal_reason, last_error, created_at, updated_at)
SELECT 'demo.noop', 1, 'q' || (g %% %(queues)s), jsonb_build_object('n', g), l.status,
       p.priority, p.priority, l.run_at, l.attempts, 5, 0, now() + interval '3 days', 30,
       CASE WHEN l.status = 'running' THEN 'history-worker' END,
       CASE WHEN l.status = 'running' THEN gen_random_uuid() END,
       CASE WHEN l.status = 'running' THEN now() + (l.lease_offset * interval '1 second') END,
       CASE WHEN l.status = 'running' THEN now() END,
       '', '', '', '', now() - interval '1 hour', now()
FROM generate_series(1, %(live)s) AS g,
     LATERAL (SELECT ({PRIORITIES})[1 + g %% 6] AS priority) AS p,
     LATERAL (
         SELECT status, run_at, attempts, lease_offset FROM (VALUES
             -- ready: waiting up to an hour
             (g <= %(ready)s, 'ready', now() - (g %% 3600) * interval '1 second', 0, 0),
             -- scheduled and retrying in the future, and scheduled jobs already due
             (g > %(ready)s AND g <= %(scheduled_to)s, 'scheduled',
              now() + (g %% 86400 + 60) * interval '1 second', 0, 0),
             (g > %(scheduled_to)s AND g <= %(retrying_to)s, 'retrying',
              now() + (g %% 3600 + 60) * interval '1 second', 1, 0),
             (g > %(retrying_to)s AND g <= %(due_to)s, 'scheduled',
              now() - (g %% 600) * interval '1 second', 0, 0),
             -- running: half with leases that expired, half still held
             (g > %(due_to)s, 'running', now() - interval '1 minute', 1,
              CASE WHEN g %% 2 = 0 THEN -60 ELSE 60 END)
         ) AS v(pick, status, run_at, attempts, lease_offset)
         WHERE pick
     ) AS l
"""

_ATTEMPTS = """
INSERT INTO pgjobs_attempt (job_id, number, worker_id, lease_token, claimed_at, finished_at,
                            outcome, reported_outcome, failure_class, error, traceback,
                            duration_ms)
SELECT id, 1, COALESCE(lease_owner, 'history-worker'), COALESCE(lease_token, gen_random_uuid()),
       COALESCE(started_at, now()), finished_at,
       CASE status WHEN 'running' THEN 'running' WHEN 'dead' THEN 'dead'
                   ELSE 'failed' END,
       '', failure_class, '', '', 3
FROM pgjobs_job
WHERE status IN ('dead', 'cancelled', 'running')
"""

_RECEIPTS = """
INSERT INTO pgjobs_receipt (scope, key, job_id, result, created_at, expires_at)
SELECT 'charge', 'order:' || g, NULL, '{"ok": true}'::jsonb, now(),
       now() + ((g %% 50) - 25) * interval '1 day' + interval '1 hour'
FROM generate_series(1, %(receipts)s) AS g
"""

# A tenth of the finished jobs waited for the job before them (chains of workflows), their
# edges resolved long since: the prune deletes them with either job.
_EDGES = """
INSERT INTO pgjobs_dependency (job_id, upstream_id, requires, upstream_status)
SELECT j.id, u.id, 'finished', u.status
FROM pgjobs_job AS j
JOIN pgjobs_job AS u ON u.id = j.id - 1
WHERE j.id % 10 = 0 AND j.status IN ('succeeded', 'dead', 'cancelled')
"""


def build_history(
    cursor: Any,
    *,
    finished: int,
    ready: int,
    queues: int = 8,
    scheduled: int = 5000,
    retrying: int = 2000,
    due: int = 1000,
    running: int = 1000,
    receipts: int = 50_000,
) -> None:
    """Insert the history and ANALYZE it; call inside a transaction."""
    scheduled_to = ready + scheduled
    retrying_to = scheduled_to + retrying
    due_to = retrying_to + due
    params = {"finished": finished, "ready": ready, "scheduled_to": scheduled_to,
              "retrying_to": retrying_to, "due_to": due_to, "live": due_to + running,
              "queues": queues, "receipts": receipts}
    cursor.execute("SET LOCAL synchronous_commit = off")
    cursor.execute(_FINISHED, params)
    cursor.execute(_LIVE, params)
    cursor.execute(_ATTEMPTS)
    cursor.execute(_RECEIPTS, params)
    cursor.execute(_EDGES)
    for table in ("pgjobs_job", "pgjobs_attempt", "pgjobs_receipt", "pgjobs_dependency"):
        cursor.execute(f"ANALYZE {table}")


def clear_history(cursor: Any) -> None:
    cursor.execute("TRUNCATE pgjobs_attempt, pgjobs_receipt, pgjobs_dependency, pgjobs_job")
