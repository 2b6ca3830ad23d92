-- name: task_result
-- A django.tasks job and its attempts in one round trip: the worker reads this before every run
-- of a task, and get_result() for every result. A running attempt has no row yet, and a
-- succeeded one none at all: the job's columns stand for either, as the last attempt.
SELECT j.id, j.task, j.status, j.queue, j.base_priority, j.payload::text, j.result::text,
       j.created_at, j.finished_at,
       a.worker_id, a.claimed_at, a.outcome, a.reported_outcome, a.failure_class, a.error,
       a.traceback
FROM pgjobs_job AS j
LEFT JOIN LATERAL (
    SELECT id, worker_id, claimed_at, outcome, reported_outcome, failure_class, error, traceback
    FROM pgjobs_attempt
    WHERE job_id = j.id
    UNION ALL
    SELECT NULL, j.lease_owner, j.claimed_at, 'running', '', '', '', ''
    WHERE j.status = 'running' AND j.claimed_at IS NOT NULL
      AND NOT EXISTS (SELECT FROM pgjobs_attempt WHERE lease_token = j.lease_token)
    UNION ALL
    -- Nor has an attempt that succeeded: the job keeps it, with its worker (Job.success_attempt).
    SELECT NULL, j.lease_owner, j.claimed_at, 'succeeded', 'succeeded', '', '', ''
    WHERE j.status = 'succeeded' AND j.lease_owner IS NOT NULL AND j.claimed_at IS NOT NULL
) AS a ON true
WHERE j.id = %s AND starts_with(j.task, %s)
ORDER BY a.claimed_at, a.id NULLS LAST
