-- Every statement that writes pgjobs_receipt (receipts.py runs them), and the reads that go with
-- them.

-- name: take_receipt
-- Insert first, read after: a second holder of the same (scope, key) waits here on the unique
-- index until the first one's transaction ends, so two attempts cannot both see "not done".
INSERT INTO pgjobs_receipt (scope, key, job_id, result, created_at, expires_at)
VALUES (%s, %s, %s, NULL, now(), now() + make_interval(secs => %s))
ON CONFLICT (scope, key) DO NOTHING
RETURNING id

-- name: read_receipt
SELECT id, result FROM pgjobs_receipt WHERE scope = %s AND key = %s

-- name: record_receipt_result
UPDATE pgjobs_receipt SET result = %s::jsonb WHERE id = %s

-- name: lease_still_held
-- The job still runs under this token; its row stays locked (FOR SHARE) until the receipt's
-- transaction ends, so no settlement or rescue can take the lease before the commit.
SELECT 1 FROM pgjobs_job WHERE id = %s AND lease_token = %s AND status = 'running' FOR SHARE

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

-- name: receipts_to_reseal
-- One window of receipts in id order after %(after)s, for pgjobs_rotate_keys; the result as text
-- only for those that hold an encrypted value.
WITH window_rows AS (
    SELECT id, scope, result::text AS result
    FROM pgjobs_receipt
    WHERE id > %(after)s
    ORDER BY id
    LIMIT %(limit)s
)
SELECT id, scope, sealed, CASE WHEN sealed THEN result END
FROM (SELECT id, scope, result,
             coalesce(strpos(result, 'pgjobs:enc:v1:') > 0, false) AS sealed
      FROM window_rows) AS marked
ORDER BY id

-- name: reseal_receipts
-- Write the receipt results sealed again, where the row still holds the text that was read;
-- locked first as reseal_jobs locks its rows ({skip_locked} likewise).
WITH c AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb) AS c(id bigint, result text, was_result text)
), locked AS (
    SELECT r.id
    FROM pgjobs_receipt AS r JOIN c ON c.id = r.id
    WHERE r.result::text IS NOT DISTINCT FROM c.was_result
    FOR NO KEY UPDATE OF r {skip_locked}
)
UPDATE pgjobs_receipt AS r
SET result = c.result::jsonb
FROM c JOIN locked ON locked.id = c.id
WHERE r.id = c.id
RETURNING r.id
