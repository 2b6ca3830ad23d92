-- name: aging_levels
-- The distinct priorities below the cap that ready jobs of one queue hold, highest first, read
-- as a loose index scan over the claim index: one probe per priority level, never a scan of the
-- level's rows.
WITH RECURSIVE level(priority) AS (
    (SELECT priority
     FROM pgjobs_job
     WHERE status = 'ready' AND queue = %(queue)s AND priority < %(cap)s
     ORDER BY priority DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT j.priority
            FROM pgjobs_job AS j
            WHERE j.status = 'ready' AND j.queue = %(queue)s AND j.priority < level.priority
            ORDER BY j.priority DESC
            LIMIT 1)
    FROM level
    WHERE level.priority IS NOT NULL
)
SELECT priority FROM level WHERE priority IS NOT NULL

-- name: raise_waiting_priorities
-- One bounded batch of aging inside one (queue, priority) level of the claim index, in (run_at,
-- id) order after a keyset position. A job's aged priority is its base priority plus one step
-- per whole interval it has been ready, capped. It has been ready since its run_at, or since it
-- was enqueued when that is later: a run_at given in the past is when the job was wanted, not a
-- wait it served, and counting from it would raise a job enqueued at -100 with a run_at of last
-- week to the cap in one step. The claim's ORDER BY (priority DESC, run_at, id) then breaks ties
-- between equal priorities in favour of the longest wait. Rows a claim holds are skipped, not
-- waited for. The last row of the batch is returned so the caller can continue after it.
WITH due AS (
    SELECT id, run_at,
           LEAST(%(cap)s, base_priority + %(step)s * floor(
               extract(epoch FROM now() - GREATEST(run_at, created_at))
               / %(interval)s::float8))::smallint AS aged
    FROM pgjobs_job
    WHERE status = 'ready' AND queue = %(queue)s AND priority = %(priority)s
      AND run_at <= now() - make_interval(secs => %(interval)s::float8)
      AND (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint)
      AND LEAST(%(cap)s, base_priority + %(step)s * floor(
              extract(epoch FROM now() - GREATEST(run_at, created_at))
              / %(interval)s::float8)) > priority
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), aged AS (
    UPDATE pgjobs_job AS j
    SET priority = due.aged, updated_at = now()
    FROM due
    WHERE j.id = due.id AND j.status = 'ready' AND j.priority < due.aged
    RETURNING j.id
)
SELECT (SELECT count(*) FROM aged),
       count(*),
       (array_agg(due.run_at ORDER BY due.run_at DESC, due.id DESC))[1],
       (array_agg(due.id ORDER BY due.run_at DESC, due.id DESC))[1]
FROM due
