-- Claim a batch (one statement, its own transaction), then settle the batch in one fenced
-- statement: a row changes only while it is still running under the token it was claimed with.
WITH candidates AS (
    SELECT id FROM floor_job
    WHERE status = 'ready' AND queue = 'default'
    ORDER BY priority DESC, run_at, id
    LIMIT :batch
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE floor_job AS j
    SET status = 'running', attempts = j.attempts + 1, lease_token = gen_random_uuid(),
        lease_expires_at = now() + interval '30 seconds'
    FROM candidates AS c
    WHERE j.id = c.id
    RETURNING j.id, j.lease_token
)
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens
FROM claimed
\gset
UPDATE floor_job AS j
SET status = 'succeeded', lease_token = NULL, lease_expires_at = NULL, finished_at = now()
FROM unnest(:ids::bigint[], :tokens::uuid[]) AS s(id, token)
WHERE j.id = s.id AND j.lease_token = s.token AND j.status = 'running';
