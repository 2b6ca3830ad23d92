-- name: task_result
-- A django.tasks job and its attempts in one round trip: the worker reads this before every run
-- of a task, and get_result() for every result.
SELECT j.id, j.task, j.status, j.queue, j.base_priority, j.payload::text, j.result::text,
       j.created_at, j.finished_at,
       a.worker_id, a.claimed_at, a.outcome, a.reported_outcome, a.failure_class, a.error,
       a.traceback
FROM pgjobs_job AS j
LEFT JOIN pgjobs_attempt AS a ON a.job_id = j.id
WHERE j.id = %s AND starts_with(j.task, %s)
ORDER BY a.claimed_at, a.id
