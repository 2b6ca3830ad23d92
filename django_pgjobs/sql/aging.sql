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
