-- name: enqueue_jobs
-- One INSERT for one or many jobs, in the caller's transaction. A job whose
-- (task, idempotency_key) already exists is skipped here and read back by the caller. Times come
-- from the database clock. When asked, the same statement sends one NOTIFY per queue that got a
-- ready job; PostgreSQL delivers it only if the caller's transaction commits.
-- The row source after FROM is one of the two blocks below; both give the relation u(...).
WITH inserted AS (
    INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                            run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                            idempotency_key, trace_id, fairness_key, traceparent, failure_class,
                            terminal_reason, last_error, created_at, updated_at)
    SELECT t.task, t.payload_version, t.queue, t.payload::jsonb,
           CASE WHEN t.due > now() THEN 'scheduled' ELSE 'ready' END,
           t.priority, t.priority, t.due, 0, t.max_attempts, 0,
           now() + make_interval(secs => t.max_age_seconds), t.lease_seconds,
           t.idempotency_key, t.trace_id, t.fairness_key, t.traceparent, '', '', '', now(), now()
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay_seconds)) AS due
        FROM {rows}
            AS u(task, payload_version, queue, payload, priority, run_at, delay_seconds,
                 max_attempts, max_age_seconds, lease_seconds, idempotency_key, trace_id,
                 fairness_key, traceparent)
    ) AS t
    ON CONFLICT (task, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, task, idempotency_key, status, run_at, deadline, created_at, queue
), notified AS (
    SELECT count(pg_notify('pgjobs', n.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'ready' AND %s::boolean) AS n
)
SELECT i.id, i.task, i.idempotency_key, i.status, i.run_at, i.deadline, i.created_at,
       (SELECT sent FROM notified)
FROM inserted AS i

-- name: enqueue_rows_many
-- Many jobs: one array per column.
unnest(%s::text[], %s::int[], %s::text[], %s::text[], %s::int[], %s::timestamptz[],
       %s::float8[], %s::int[], %s::float8[], %s::int[], %s::text[], %s::text[], %s::text[],
       %s::text[])

-- name: enqueue_rows_one
-- One job, the common call: VALUES plans in a fraction of the time unnest takes.
(VALUES (%s::text, %s::int, %s::text, %s::text, %s::int, %s::timestamptz, %s::float8, %s::int,
         %s::float8, %s::int, %s::text, %s::text, %s::text, %s::text))
