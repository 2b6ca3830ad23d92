-- name: prune_jobs
-- Delete one bounded batch of jobs that finished in one terminal state longer ago than its
-- retention, with their attempts, in one statement (one short transaction). The terminal states
-- are spelled out in both WHERE clauses on purpose: whatever state the caller names, a job that
-- can still run never matches, and the DELETE repeats the test as the guard on the write itself.
-- SKIP LOCKED leaves a row an operator is retrying at this moment alone.
WITH doomed AS (
    SELECT id
    FROM pgjobs_job
    WHERE status = %(status)s
      AND status IN ('succeeded', 'dead', 'cancelled')
      AND finished_at < now() - make_interval(secs => %(retention)s::float8)
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM pgjobs_attempt AS a
    USING doomed
    WHERE a.job_id = doomed.id
    RETURNING a.id
), jobs AS (
    DELETE FROM pgjobs_job AS j
    USING doomed
    WHERE j.id = doomed.id AND j.status IN ('succeeded', 'dead', 'cancelled')
    RETURNING j.id
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM attempts)

-- name: count_prunable_jobs
SELECT count(*)
FROM pgjobs_job
WHERE status = %(status)s
  AND status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at < now() - make_interval(secs => %(retention)s::float8)

-- name: prune_receipts
-- Delete one bounded batch of receipts past their expiry (set when written, from the receipt
-- retention), oldest first.
WITH doomed AS (
    SELECT id
    FROM pgjobs_receipt
    WHERE expires_at < now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM pgjobs_receipt AS r
USING doomed
WHERE r.id = doomed.id AND r.expires_at < now()

-- name: count_expired_receipts
SELECT count(*) FROM pgjobs_receipt WHERE expires_at < now()
