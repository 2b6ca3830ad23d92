-- name: enqueue_jobs
-- One INSERT for one or many jobs, in the caller's transaction. A job that a unique index
-- refuses (its task and idempotency key exist; its unique key is held by an active job, or in
-- its period; its schedule's tick already has a job) is skipped here and read back by the
-- caller. Times come from the database clock; a unique period starts at the epoch's multiple of
-- its length. When asked, the same statement sends one NOTIFY per queue that got a ready job;
-- PostgreSQL delivers it only if the caller's transaction commits.
-- Its row source after FROM is the enqueue_rows_many block below, the relation u(...); one job
-- alone goes through enqueue_one, planned faster.
WITH inserted AS (
    INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                            run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                            idempotency_key, unique_key, unique_period_start, timeout_seconds,
                            trace_id, fairness_key, schedule_id, scheduled_at, traceparent,
                            failure_class,
                            terminal_reason, last_error, created_at, updated_at)
    SELECT t.task, t.payload_version, t.queue, t.payload::jsonb,
           CASE WHEN t.due > now() THEN 'scheduled' ELSE 'ready' END,
           t.priority, t.priority, t.due, 0, t.max_attempts, 0,
           now() + make_interval(secs => t.max_age_seconds), t.lease_seconds,
           t.idempotency_key, t.unique_key,
           to_timestamp(floor(extract(epoch FROM now()) / t.unique_period) * t.unique_period),
           t.timeout_seconds, t.trace_id, t.fairness_key, t.schedule_id, t.scheduled_at,
           t.traceparent, '', '', '', now(), now()
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay_seconds)) AS due
        FROM {rows}
            AS u(task, payload_version, queue, payload, priority, run_at, delay_seconds,
                 max_attempts, max_age_seconds, lease_seconds, idempotency_key, unique_key,
                 unique_period, timeout_seconds, trace_id, fairness_key, schedule_id,
                 scheduled_at, traceparent)
    ) AS t
    -- Any unique index: the idempotency key's, the unique key's (while active, per period), the
    -- schedule tick's.
    ON CONFLICT DO NOTHING
    RETURNING id, task, idempotency_key, unique_key, schedule_id, scheduled_at, status, run_at,
              deadline, created_at, queue
), notified AS (
    SELECT count(pg_notify('pgjobs', n.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'ready' AND %s::boolean) AS n
)
-- Read back by column name (enqueuing._pair_with_rows).
SELECT i.id, i.task, i.idempotency_key, i.unique_key, i.schedule_id, i.scheduled_at, i.status,
       i.run_at, i.deadline, i.created_at, (SELECT sent FROM notified) AS notified
FROM inserted AS i

-- name: existing_unique_job
-- The job that holds a unique key now: an active one, or the one of the current period (the
-- caller's transaction sees the same now() as its INSERT did).
SELECT id FROM pgjobs_job
WHERE task = %(task)s AND unique_key = %(key)s
  AND CASE WHEN %(period)s::float8 IS NULL
           THEN unique_period_start IS NULL
                AND status IN ('scheduled', 'ready', 'running', 'retrying')
           ELSE unique_period_start = to_timestamp(
                    floor(extract(epoch FROM now()) / %(period)s::float8) * %(period)s::float8)
      END

-- name: enqueue_rows_many
-- Many jobs. What a combination of task and options gives its jobs comes as one array per
-- column, an element per combination; each job's own values as one JSON document, a JSON array
-- per job: its combination's number, its payload, then its schedule id, tick and traceparent
-- when it has them. The jobs are inserted, and answered, in the document's order.
(SELECT c.task, c.payload_version, c.queue, j.value -> 1, c.priority, c.run_at,
        c.delay_seconds, c.max_attempts, c.max_age_seconds, c.lease_seconds, c.idempotency_key,
        c.unique_key, c.unique_period, c.timeout_seconds, c.trace_id, c.fairness_key,
        (j.value ->> 2)::bigint, (j.value ->> 3)::timestamptz, j.value ->> 4
 FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS j(value, place)
 JOIN unnest(%s::text[], %s::int[], %s::text[], %s::int[], %s::timestamptz[], %s::float8[],
             %s::int[], %s::float8[], %s::int[], %s::text[], %s::text[], %s::float8[],
             %s::float8[], %s::text[], %s::text[])
      WITH ORDINALITY AS c(task, payload_version, queue, priority, run_at, delay_seconds,
                           max_attempts, max_age_seconds, lease_seconds, idempotency_key,
                           unique_key, unique_period, timeout_seconds, trace_id, fairness_key,
                           number)
   ON c.number = (j.value ->> 0)::bigint
 ORDER BY j.place)

-- name: enqueue_one
-- One job, the common call: the same rows and answer as enqueue_jobs, in the shape PostgreSQL
-- plans fastest (a third of enqueue_jobs' planning time): the values in VALUES itself, and the
-- NOTIFY in RETURNING, sent only when the job was inserted ready.
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                        run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                        idempotency_key, unique_key, unique_period_start, timeout_seconds,
                        trace_id, fairness_key, schedule_id, scheduled_at, traceparent,
                        failure_class, terminal_reason, last_error, created_at, updated_at)
VALUES (%(task)s, %(payload_version)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN COALESCE(%(run_at)s::timestamptz,
                           now() + make_interval(secs => %(delay_seconds)s::float8)) > now()
             THEN 'scheduled' ELSE 'ready' END,
        %(priority)s, %(priority)s,
        COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay_seconds)s::float8)),
        0, %(max_attempts)s, 0, now() + make_interval(secs => %(max_age_seconds)s::float8),
        %(lease_seconds)s, %(idempotency_key)s, %(unique_key)s,
        to_timestamp(floor(extract(epoch FROM now()) / %(unique_period)s::float8)
                     * %(unique_period)s::float8),
        %(timeout_seconds)s::float8, %(trace_id)s, %(fairness_key)s, %(schedule_id)s::bigint,
        %(scheduled_at)s::timestamptz, %(traceparent)s, '', '', '', now(), now())
ON CONFLICT DO NOTHING
-- Read back by column name (enqueuing._pair_with_rows), like enqueue_jobs' answer.
RETURNING id, task, idempotency_key, unique_key, schedule_id, scheduled_at, status, run_at,
          deadline, created_at,
          CASE WHEN status = 'ready' AND %(notify)s::boolean
               THEN pg_notify('pgjobs', queue) IS NULL END AS notified
