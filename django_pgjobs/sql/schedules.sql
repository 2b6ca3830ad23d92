-- name: due_schedules
-- The schedules whose next tick has come, in cursor order, through the partial due index;
-- only those whose handler this worker has (a worker of an older deploy leaves the rest to
-- others). FOR NO KEY UPDATE SKIP LOCKED: a schedule another worker is enqueueing is skipped,
-- not waited for, and the lock does not block the foreign-key check of the job rows inserted
-- for it. After a lock is won the row is re-read, so a cursor another worker just moved past
-- now is not due any more. previous_busy: the overlap rule's question, whether the schedule's
-- last job still waits or runs. %(now)s is NULL in production (the database clock); tests
-- pass an instant to walk a schedule through a day. The statement that locks the rows also
-- bounds how long this transaction may hold them (set_config(..., true) is SET LOCAL, so it
-- ends with the transaction, and holds under PgBouncer's transaction pooling): a later
-- statement that runs longer than %(hold)s is cancelled, and a worker that stops sending for
-- longer (stopped, frozen, cut off) loses its session, which rolls the pass back and frees the
-- rows for the next worker's pass.
WITH hold AS MATERIALIZED (
    SELECT set_config('idle_in_transaction_session_timeout', %(hold)s, true),
           set_config('statement_timeout', %(hold)s, true)
)
SELECT s.id, s.name, s.task, s.cron, s.timezone, s.payload, s.queue, s.priority, s.misfire,
       s.catch_up_limit, s.overlap, s.next_tick_at, s.last_job_id,
       s.overlap = 'skip' AND EXISTS (
           SELECT 1 FROM pgjobs_job AS j
           WHERE j.id = s.last_job_id
             AND j.status IN ('pending', 'scheduled', 'throttled', 'ready', 'running',
                              'retrying')
       ) AS previous_busy,
       COALESCE(%(now)s::timestamptz, now()) AS db_now
FROM pgjobs_schedule AS s, hold
WHERE s.paused_at IS NULL AND s.retired_at IS NULL AND s.next_tick_at IS NOT NULL
  AND s.next_tick_at <= COALESCE(%(now)s::timestamptz, now())
  AND s.task = ANY(%(tasks)s::text[])
ORDER BY s.next_tick_at
LIMIT %(limit)s
FOR NO KEY UPDATE OF s SKIP LOCKED

-- name: advance_schedules
-- One statement for the batch: each schedule's cursor, what it handled and its counters. The
-- rows are locked by due_schedules in this transaction.
UPDATE pgjobs_schedule AS s
SET next_tick_at = u.next_tick_at,
    last_tick_at = COALESCE(u.last_tick_at, s.last_tick_at),
    last_handled_at = CASE WHEN u.last_tick_at IS NULL THEN s.last_handled_at ELSE now() END,
    last_job_id = COALESCE(u.last_job_id, s.last_job_id),
    ticks_enqueued = s.ticks_enqueued + u.enqueued,
    ticks_missed = s.ticks_missed + u.missed,
    ticks_skipped = s.ticks_skipped + u.skipped,
    last_skipped_at = COALESCE(u.last_skipped_at, s.last_skipped_at),
    last_skip_reason = CASE WHEN u.skip_reason = '' THEN s.last_skip_reason
                            ELSE u.skip_reason END,
    last_error = '',
    last_error_at = NULL,
    updated_at = now()
FROM jsonb_to_recordset(%s::jsonb) AS u(
    id bigint, next_tick_at timestamptz, last_tick_at timestamptz, last_job_id bigint,
    enqueued int, missed int, skipped int, last_skipped_at timestamptz, skip_reason text
)
WHERE s.id = u.id

-- name: record_schedule_errors
-- The schedules of the batch whose ticks could not be planned: why, and when. Their cursor and
-- counters stay; each pass tries them again.
UPDATE pgjobs_schedule AS s
SET last_error = u.error, last_error_at = now(), updated_at = now()
FROM jsonb_to_recordset(%s::jsonb) AS u(id bigint, error text)
WHERE s.id = u.id

-- name: sync_schedules
-- The declared schedules (code and settings) in one statement. A new one is inserted with its
-- first tick; a changed or retired one is updated, its cursor moved to the next tick after now
-- when its expression, zone or retirement changed (a change of payload keeps the cursor). An
-- operator's schedule (source 'admin') of the same name is never touched. Returns the names
-- written and whether each was inserted.
INSERT INTO pgjobs_schedule AS s (
    name, task, cron, timezone, payload, queue, priority, misfire, catch_up_limit, overlap,
    source, next_tick_at, ticks_enqueued, ticks_missed, ticks_skipped, last_skip_reason,
    last_error, created_at, updated_at)
SELECT d.name, d.task, d.cron, d.timezone, d.payload, d.queue, d.priority, d.misfire,
       d.catch_up_limit, d.overlap, d.source, d.next_tick_at, 0, 0, 0, '', '', now(), now()
FROM jsonb_to_recordset(%s::jsonb) AS d(
    name text, task text, cron text, timezone text, payload jsonb, queue text, priority int,
    misfire text, catch_up_limit int, overlap text, source text, next_tick_at timestamptz
)
ON CONFLICT (name) DO UPDATE
SET task = EXCLUDED.task, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
    payload = EXCLUDED.payload, queue = EXCLUDED.queue, priority = EXCLUDED.priority,
    misfire = EXCLUDED.misfire, catch_up_limit = EXCLUDED.catch_up_limit,
    overlap = EXCLUDED.overlap, source = EXCLUDED.source,
    next_tick_at = CASE
        WHEN s.retired_at IS NOT NULL OR s.cron <> EXCLUDED.cron
             OR s.timezone <> EXCLUDED.timezone THEN EXCLUDED.next_tick_at
        ELSE s.next_tick_at END,
    retired_at = NULL,
    updated_at = now()
WHERE s.source <> 'admin'
  AND (s.retired_at IS NOT NULL
       OR (s.task, s.cron, s.timezone, s.payload, s.queue, s.priority, s.misfire,
           s.catch_up_limit, s.overlap, s.source)
          IS DISTINCT FROM (EXCLUDED.task, EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.payload,
                            EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.misfire,
                            EXCLUDED.catch_up_limit, EXCLUDED.overlap, EXCLUDED.source))
RETURNING s.name, (s.xmax = 0) AS inserted

-- name: retire_schedules
-- Declared schedules that code and settings no longer declare: retired, never deleted, so the
-- jobs that name them keep their schedule.
UPDATE pgjobs_schedule
SET retired_at = now(), updated_at = now()
WHERE source IN ('code', 'settings') AND retired_at IS NULL AND NOT (name = ANY(%s::text[]))
RETURNING name

-- name: admin_schedules_named
SELECT name FROM pgjobs_schedule WHERE source = 'admin' AND name = ANY(%s::text[]) ORDER BY name
