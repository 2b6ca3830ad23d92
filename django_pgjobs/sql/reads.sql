-- What a worker reads between claims: which queues have ready jobs, which of its running jobs an
-- operator asked to stop, and the database's clock.

-- name: ready_queues
-- The distinct queues that have ready jobs and are not paused, read as a loose index scan over
-- the claim index (one index probe per queue instead of a scan of every ready row).
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM pgjobs_job WHERE status = 'ready' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgjobs_job AS j
            WHERE j.status = 'ready' AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM q
    WHERE q.queue IS NOT NULL
)
SELECT q.queue FROM q
WHERE q.queue IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM pgjobs_queue AS p WHERE p.name = q.queue AND p.paused)

-- name: cancel_requested
-- The jobs of a worker's that an operator asked to stop, by primary key.
SELECT id FROM pgjobs_job
WHERE id = ANY(%s::bigint[]) AND status = 'running' AND cancel_requested_at IS NOT NULL

-- name: db_now
SELECT now()

-- name: pending_queues_with_work_running
-- The queues whose pending jobs may still be released by work under way: a burst worker waits
-- for them while any job is ready or running (in any queue: a dependency may be in another).
SELECT DISTINCT queue FROM pgjobs_job
WHERE status = 'pending'
  AND EXISTS (SELECT 1 FROM pgjobs_job WHERE status IN ('ready', 'running'))
