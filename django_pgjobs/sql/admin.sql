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
