-- name: planner_rows
-- The planner's row estimate for a query the ORM compiled (spliced in below); nothing is
-- read, where count(*) over a big job history reads every matching row.
EXPLAIN (FORMAT JSON) {query}

-- name: jobs_by_idempotency_key
-- Ids of the jobs with this idempotency key, whatever their task. The unique index leads with
-- task, so walk its distinct tasks (a loose index scan, one probe each) and look the key up
-- under each: a few index probes instead of a scan of the whole table.
WITH RECURSIVE tasks(task) AS (
    (SELECT task FROM pgjobs_job WHERE idempotency_key IS NOT NULL ORDER BY task LIMIT 1)
    UNION ALL
    SELECT (SELECT j.task FROM pgjobs_job AS j
            WHERE j.idempotency_key IS NOT NULL AND j.task > t.task
            ORDER BY j.task LIMIT 1)
    FROM tasks AS t
    WHERE t.task IS NOT NULL
)
SELECT j.id
FROM tasks AS t
JOIN pgjobs_job AS j ON j.task = t.task AND j.idempotency_key = %s
WHERE t.task IS NOT NULL

-- name: filter_queues
-- The queues the job list's queue filter offers beyond the declared ones: every queue an
-- operator has paused or resumed (a paused queue claims nothing, so it may hold ready jobs or
-- none), the queues of running jobs (through the lease index), and the queues with ready jobs,
-- paused or not (a loose index scan over the claim index, one probe per queue).
WITH RECURSIVE ready(queue) AS (
    (SELECT queue FROM pgjobs_job WHERE status = 'ready' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgjobs_job AS j
            WHERE j.status = 'ready' AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM ready AS r
    WHERE r.queue IS NOT NULL
)
SELECT queue FROM ready WHERE queue IS NOT NULL
UNION
SELECT name FROM pgjobs_queue
UNION
SELECT queue FROM pgjobs_job WHERE status = 'running'
