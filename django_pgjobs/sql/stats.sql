-- name: stats_queue_counts
-- One branch per partial index, each repeating that index's predicate, so the planner reads only
-- live rows and the recent end of the finished index; old history is never visited.
SELECT queue, 'ready' AS status, count(*) FROM pgjobs_job
WHERE status = 'ready'
GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM pgjobs_job
WHERE status = 'running'
GROUP BY queue
UNION ALL
SELECT queue, 'throttled', count(*) FROM pgjobs_job
WHERE status = 'throttled'
GROUP BY queue
UNION ALL
SELECT queue, status, count(*) FROM pgjobs_job
WHERE status IN ('scheduled', 'retrying')
GROUP BY queue, status
UNION ALL
SELECT queue, 'pending', count(*) FROM pgjobs_job
WHERE status = 'pending'
GROUP BY queue
UNION ALL
SELECT queue, status, count(*) FROM pgjobs_job
WHERE status IN ('dead', 'cancelled') AND finished_at >= now() - make_interval(secs => %s)
GROUP BY queue, status

-- name: stats_paused_queues
-- One row per queue an operator paused (the table holds one row per queue ever paused).
SELECT name FROM pgjobs_queue WHERE paused ORDER BY name

-- name: stats_oldest_ready
-- The oldest ready job of each queue, found without reading the backlog: a skip scan over the
-- claim index (queue, priority DESC, run_at, id) visits the head of each (queue, priority)
-- group, which is that group's oldest run_at; the oldest of the heads is the queue's oldest.
-- The inner UNION ALL runs its second branch (the next queue) only when the first (the next
-- priority of this queue) finds nothing.
WITH RECURSIVE heads(queue, priority, run_at) AS (
    (SELECT queue, priority, run_at FROM pgjobs_job
     WHERE status = 'ready'
     ORDER BY queue, priority DESC, run_at, id
     LIMIT 1)
    UNION ALL
    SELECT nxt.queue, nxt.priority, nxt.run_at
    FROM heads AS h
    CROSS JOIN LATERAL (
        (SELECT j.queue, j.priority, j.run_at FROM pgjobs_job AS j
         WHERE j.status = 'ready' AND j.queue = h.queue AND j.priority < h.priority
         ORDER BY j.queue, j.priority DESC, j.run_at, j.id
         LIMIT 1)
        UNION ALL
        (SELECT j.queue, j.priority, j.run_at FROM pgjobs_job AS j
         WHERE j.status = 'ready' AND j.queue > h.queue
         ORDER BY j.queue, j.priority DESC, j.run_at, j.id
         LIMIT 1)
        LIMIT 1
    ) AS nxt
)
SELECT queue, GREATEST(0, extract(epoch FROM now() - min(run_at)))::float8
FROM heads
GROUP BY queue

-- name: stats_ended_attempts
-- The newest attempts that ended in the window, at most the cap of them, so a busy hour costs
-- the same as a quiet one: spliced into the statements below as {ended_attempts}. A success
-- has no attempt row: it is its job (lease_owner is kept only on such a job). So the newest
-- attempt rows (along the claimed_at index) and the newest successes (along the finished
-- index) are each read up to the cap, and the newest of both together kept: the sample is the
-- most recent claims whatever their outcome, and each statement reads what it needs from it.
SELECT job_id, number, claimed_at, duration_ms
FROM ((SELECT job_id, number, claimed_at, duration_ms FROM pgjobs_attempt
       WHERE claimed_at >= now() - make_interval(secs => %(window)s)
       ORDER BY claimed_at DESC
       LIMIT %(cap)s)
      UNION ALL
      (SELECT id, attempts, claimed_at, duration_ms FROM pgjobs_job
       WHERE status = 'succeeded' AND finished_at >= now() - make_interval(secs => %(window)s)
         AND lease_owner IS NOT NULL
         AND claimed_at >= now() - make_interval(secs => %(window)s)
       ORDER BY finished_at DESC
       LIMIT %(cap)s)) AS ended
ORDER BY claimed_at DESC
LIMIT %(cap)s

-- name: stats_attempt_numbers
-- The newest ended claims in the window (stats_ended_attempts), and the running attempts,
-- which are their jobs too (a few, through the lease index).
SELECT number, count(*)
FROM (
    SELECT number FROM ({ended_attempts}) AS ended
    UNION ALL
    SELECT attempts FROM pgjobs_job
    WHERE status = 'running' AND claimed_at >= now() - make_interval(secs => %(window)s)
) AS recent
GROUP BY number
ORDER BY number

-- name: stats_handler_latency
-- The handlers' times of the newest ended attempts (stats_ended_attempts) that have one.
WITH recent AS (
    SELECT job_id, duration_ms FROM ({ended_attempts}) AS ended
    WHERE duration_ms IS NOT NULL
)
SELECT j.task, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY r.duration_ms),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY r.duration_ms),
       max(r.duration_ms)
FROM recent AS r
JOIN pgjobs_job AS j ON j.id = r.job_id
GROUP BY j.task
ORDER BY j.task

-- name: stats_pickup_latency
-- From a job's first claim back to the time it became due. A retry or a snooze moves run_at,
-- and an operator's retry resets it, so only jobs whose run_at is still the original count.
WITH recent AS (
    -- First attempts among the newest ended ones (stats_ended_attempts), and those running.
    SELECT job_id, claimed_at FROM ({ended_attempts}) AS ended
    WHERE number = 1
    UNION ALL
    SELECT id, claimed_at FROM pgjobs_job
    WHERE status = 'running' AND attempts = 1
      AND claimed_at >= now() - make_interval(secs => %(window)s)
), waits AS (
    SELECT j.queue, extract(epoch FROM r.claimed_at - j.run_at)::float8 AS seconds
    FROM recent AS r
    JOIN pgjobs_job AS j ON j.id = r.job_id
    WHERE j.attempts <= 1 AND j.snoozes = 0 AND r.claimed_at >= j.run_at
)
SELECT queue, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY seconds),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY seconds),
       max(seconds)
FROM waits
GROUP BY queue
ORDER BY queue

-- name: stats_leases
SELECT count(*) FILTER (WHERE lease_expires_at < now()),
       count(*) FILTER (WHERE lease_expires_at >= now())
FROM pgjobs_job
WHERE status = 'running' AND lease_expires_at < now() + make_interval(secs => %s)

-- name: stats_failures
-- Failed attempts only, through the partial index on failed attempts: successes, the bulk of
-- the window, are never read. MATERIALIZED plans the attempt scan on its own; joined in one
-- plan, the planner would rather split the job lookups across parallel workers and feed them
-- from a parallel scan of every attempt in the window.
WITH failed AS MATERIALIZED (
    SELECT job_id, failure_class FROM pgjobs_attempt
    WHERE failure_class <> '' AND claimed_at >= now() - make_interval(secs => %s)
)
SELECT f.failure_class, j.task, count(*)
FROM failed AS f
JOIN pgjobs_job AS j ON j.id = f.job_id
GROUP BY f.failure_class, j.task
ORDER BY count(*) DESC, f.failure_class, j.task

-- name: stats_error_groups
-- Failed attempts grouped as an operator reads them: task, failure class and the first line of
-- the error with its numbers, ids and hex strings made alike ("order 4711 not found" and
-- "order 4712 not found" are one error). Counted, with the first and last time seen and the
-- newest job, the most frequent first; the window's failed attempts come through the partial
-- index on failed attempts, as for stats_failures.
WITH failed AS MATERIALIZED (
    SELECT job_id, failure_class, claimed_at,
           regexp_replace(regexp_replace(regexp_replace(
               left(split_part(error, E'\n', 1), 300),
               '[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}', '<id>', 'gi'),
               '(0x)?[0-9a-f]{8,}', '<hex>', 'gi'),
               '[0-9]+', 'N', 'g') AS message
    FROM pgjobs_attempt
    WHERE failure_class <> '' AND claimed_at >= now() - make_interval(secs => %(window)s)
)
SELECT j.task, f.failure_class, f.message, count(*) AS count, min(f.claimed_at) AS first_seen,
       max(f.claimed_at) AS last_seen, max(f.job_id) AS newest_job
FROM failed AS f
JOIN pgjobs_job AS j ON j.id = f.job_id
GROUP BY j.task, f.failure_class, f.message
ORDER BY count(*) DESC, last_seen DESC
LIMIT %(limit)s

-- name: stats_throughput
-- Jobs finished per minute, counted from the finished index alone (status, finished_at).
WITH minutes AS (
    SELECT generate_series(
        date_trunc('minute', now()) - make_interval(mins => %s - 1),
        date_trunc('minute', now()),
        interval '1 minute'
    ) AS minute
), finished AS (
    SELECT date_trunc('minute', finished_at) AS minute, status
    FROM pgjobs_job
    WHERE status IN ('succeeded', 'dead')
      AND finished_at >= date_trunc('minute', now()) - make_interval(mins => %s - 1)
)
SELECT m.minute,
       count(f.status) FILTER (WHERE f.status = 'succeeded'),
       count(f.status) FILTER (WHERE f.status = 'dead')
FROM minutes AS m
LEFT JOIN finished AS f ON f.minute = m.minute
GROUP BY m.minute
ORDER BY m.minute

-- name: late_schedules
-- Active schedules whose last due tick was not enqueued in time: one is due and older than the
-- grace now (no worker has enqueued it), or the last tick handled was handled later than the
-- grace after its time. The table holds one row per schedule, so this reads it whole.
SELECT name, task, pending, due_at,
       GREATEST(0, extract(epoch FROM (CASE WHEN pending THEN now() ELSE last_handled_at END)
                                      - due_at))::float8 AS late_seconds
FROM (
    SELECT name, task, last_handled_at,
           next_tick_at < now() - make_interval(secs => %(grace)s) AS pending,
           CASE WHEN next_tick_at < now() - make_interval(secs => %(grace)s) THEN next_tick_at
                ELSE last_tick_at END AS due_at
    FROM pgjobs_schedule
    WHERE paused_at IS NULL AND retired_at IS NULL
) AS s
WHERE pending
   OR last_handled_at > due_at + make_interval(secs => %(grace)s)
ORDER BY due_at
LIMIT %(limit)s

-- name: schedule_counts
SELECT count(*) FILTER (WHERE retired_at IS NULL AND paused_at IS NULL),
       count(*) FILTER (WHERE retired_at IS NULL AND paused_at IS NOT NULL),
       count(*) FILTER (WHERE retired_at IS NOT NULL)
FROM pgjobs_schedule

-- name: stats_limit_keys
-- The limit keys with a job holding a slot, a job waiting for one, or an operator's limit: what
-- holds their slots (ready and running jobs), the limit in force, and what waits. The busiest
-- first (most waiting), then by key. Held slots come from pgjobs_key_slot, waiting jobs from
-- the throttled index; each key's limit (or rate) is the operator's, else its jobs' declared
-- one. A
-- rate's key: its one slot is held by the job that starts next (ready, or throttled until its
-- time), its running jobs hold none and are counted from the running jobs; its rate (starts a
-- second, burst) as its jobs declare it, when its next job may start, and until when a
-- handler's RateLimited holds it back.
WITH held AS (
    SELECT s.key, count(*) FILTER (WHERE j.status = 'running') AS running,
           count(*) FILTER (WHERE j.status = 'ready') AS ready, max(j.limit_max) AS declared,
           max(j.run_at) FILTER (WHERE j.status = 'throttled') AS next_start_at,
           max(j.rate_interval) AS rate_interval, max(j.rate_burst) AS rate_burst
    FROM pgjobs_key_slot AS s
    JOIN pgjobs_job AS j ON j.id = s.job_id
    GROUP BY s.key
), rated_running AS (
    SELECT limit_key AS key, count(*) AS running, max(rate_interval) AS rate_interval,
           max(rate_burst) AS rate_burst
    FROM pgjobs_job
    WHERE status = 'running' AND rate_interval IS NOT NULL
    GROUP BY limit_key
), waiting AS (
    SELECT limit_key AS key, count(*) AS waiting, max(limit_max) AS declared,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE limit_slot IS NULL))
               AS oldest_seconds,
           max(rate_interval) AS rate_interval, max(rate_burst) AS rate_burst
    FROM pgjobs_job
    WHERE status = 'throttled'
    GROUP BY limit_key
), keys AS (
    SELECT key FROM held UNION SELECT key FROM waiting UNION SELECT key FROM rated_running
    UNION SELECT key FROM pgjobs_key_limit
)
SELECT k.key, COALESCE(h.running, 0) + COALESCE(r.running, 0) AS running,
       COALESCE(h.ready, 0) AS ready,
       COALESCE(l.max_running, GREATEST(h.declared, w.declared)) AS max_running,
       l.key IS NOT NULL AS set_by_operator, COALESCE(w.waiting, 0) AS waiting,
       w.oldest_seconds AS oldest_waiting_seconds,
       COALESCE(l.rate_count / l.rate_per_seconds,
                1.0 / COALESCE(h.rate_interval, w.rate_interval, r.rate_interval))
           AS rate_per_second,
       COALESCE(l.rate_burst, h.rate_burst, w.rate_burst, r.rate_burst) AS rate_burst,
       CASE WHEN h.next_start_at IS NOT NULL
            THEN GREATEST(extract(epoch FROM h.next_start_at - clock_timestamp()), 0)
       END AS next_start_seconds,
       extract(epoch FROM q.blocked_until - clock_timestamp()) AS held_back_seconds
FROM keys AS k
LEFT JOIN held AS h ON h.key = k.key
LEFT JOIN waiting AS w ON w.key = k.key
LEFT JOIN rated_running AS r ON r.key = k.key
LEFT JOIN pgjobs_key_limit AS l ON l.key = k.key
LEFT JOIN pgjobs_key_rate AS q ON q.key = k.key AND q.blocked_until > clock_timestamp()
ORDER BY COALESCE(w.waiting, 0) DESC, k.key
LIMIT %(limit)s

-- name: stats_workers
-- The worker processes' heartbeat rows, live first, then by when last seen. Live: not stopped,
-- seen within two heartbeats and, for a worker that listens, its listening session (named after
-- it) still connected; a killed worker's session ends with its process, so it is seen gone at
-- once. A worker started in the last two seconds may not be listening yet, and counts as live
-- on its heartbeat alone.
SELECT w.worker_id, w.host, w.pid, w.version, w.queues, w.concurrency, w.started_at,
       w.last_seen_at, extract(epoch FROM clock_timestamp() - w.last_seen_at) AS seen_seconds_ago,
       w.running,
       CASE WHEN w.stopped_at IS NOT NULL THEN 'stopped'
            WHEN w.last_seen_at < clock_timestamp() - make_interval(secs => 2 * %(heartbeat)s)
                 THEN 'gone'
            WHEN w.listens
                 AND w.started_at < clock_timestamp() - interval '2 seconds'
                 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a
                                 WHERE a.datname = current_database()
                                   AND a.application_name
                                       = left('pgjobs-listener ' || w.worker_id, 63))
                 THEN 'gone'
            ELSE 'live' END AS state
FROM pgjobs_worker AS w
ORDER BY w.stopped_at IS NOT NULL, w.last_seen_at DESC
LIMIT %(limit)s

-- name: stats_horizon
-- What holds back the horizon of this database: the oldest transaction id vacuum must keep
-- rows for. A session with an open snapshot or transaction here (a long query, an idle
-- transaction, a REPEATABLE READ report), a standby's feedback through its WAL sender, a
-- replication slot, a prepared transaction: while one holds it, vacuum removes no row that died
-- after it, and every finished job's row stays in the table and its indexes. The oldest first.
-- Reading other roles' sessions needs pg_read_all_stats (pg_monitor has it); without it they
-- show no xmin and are not listed. No query text: it may hold what redaction hides.
SELECT * FROM (
    SELECT 'session' AS kind, pid::text AS holder, application_name, usename AS role,
           COALESCE(state, '') AS state,
           -- A WAL sender has no transaction: its standby's feedback is judged by its xids.
           extract(epoch FROM now() - xact_start)::float8 AS seconds,
           age(COALESCE(backend_xmin, backend_xid))::bigint AS xids
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid()
      AND COALESCE(backend_xmin, backend_xid) IS NOT NULL
      AND (datname = current_database() OR backend_type = 'walsender')
    UNION ALL
    SELECT 'replication slot', slot_name::text, '', '', CASE WHEN active THEN 'active'
           ELSE 'inactive' END, NULL,
           age(xmin)::bigint
    FROM pg_replication_slots
    -- A logical slot's catalog_xmin holds back only the system catalogs, never job rows.
    WHERE xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', gid, '', owner::text, 'prepared',
           extract(epoch FROM now() - prepared)::float8, age(transaction)::bigint
    FROM pg_prepared_xacts
    WHERE database = current_database()
) AS holders
ORDER BY xids DESC
LIMIT %(limit)s
