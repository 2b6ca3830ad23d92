-- The per-key limits' slots (pgjobs_key_slot). The triggers of pgjobs_job take and free them as
-- jobs start waiting, become ready and end their runs (docs/limits.md); these statements are the
-- maintenance that catches what those cannot see, and an operator's change of a key's limit.

-- name: orphaned_slots
-- Held slots whose holder does not hold them as this statement sees it: gone (deleted), or
-- changed by a writer the triggers did not see. A holder is ready or running, or under a rate
-- throttled until its time. One window a run: the next `scan` held slots after slot row `after`,
-- in the order of their ids, so that a run's work is bounded however many slots are held (a
-- holder is checked by its primary key, about a microsecond each; 100,000 held slots read whole
-- took 134 ms every run). Answers the window's last id and whether the window was full (if
-- not, it reached the last held slot, and the next window starts over), and beside them each
-- orphan found in the window, locked, skipping any another transaction holds (it may be taking
-- or freeing it); free_orphaned_slots reads them again after the lock.
WITH scanned AS (
    SELECT max(w.id) AS last, count(*) = %(scan)s AS full
    FROM (SELECT s.id FROM pgjobs_key_slot AS s
          WHERE s.id > %(after)s AND s.job_id IS NOT NULL
          ORDER BY s.id
          LIMIT %(scan)s) AS w
)
SELECT scanned.last, scanned.full, o.key, o.n, o.job_id
FROM scanned
LEFT JOIN LATERAL (
    SELECT s.key, s.n, s.job_id
    FROM pgjobs_key_slot AS s
    WHERE s.id > %(after)s AND s.id <= scanned.last AND s.job_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pgjobs_job AS j
                      WHERE j.id = s.job_id AND j.limit_key = s.key AND j.limit_slot = s.n
                        AND j.status IN ('ready', 'running', 'throttled'))
    LIMIT %(batch)s
    FOR UPDATE OF s SKIP LOCKED
) AS o ON true

-- name: free_orphaned_slots
-- Free the slots orphaned_slots locked whose holder still does not hold them. This statement's
-- snapshot is taken after the lock: a holder that committed in between is seen, and keeps its
-- slot.
UPDATE pgjobs_key_slot AS s
SET job_id = NULL
FROM jsonb_to_recordset(%(slots)s::jsonb) AS o(key text, n int, job_id bigint)
WHERE s.key = o.key AND s.n = o.n AND s.job_id = o.job_id
  AND NOT EXISTS (SELECT 1 FROM pgjobs_job AS j
                  WHERE j.id = s.job_id AND j.limit_key = s.key AND j.limit_slot = s.n
                    AND j.status IN ('ready', 'running', 'throttled'))
RETURNING s.key, s.n, o.job_id

-- name: admit_waiting_keys
-- Keys with a free slot and a throttled job, and what each gave: a slot freed while the job that
-- would have taken it was not yet committed (so the freeing statement could not see it) is
-- given here. Each key's limit as its oldest throttled job was enqueued with.
SELECT k.key, pgjobs_limit_admit(k.key, k.limit_max) AS admitted
FROM (SELECT DISTINCT ON (s.key) s.key, j.limit_max
      FROM pgjobs_key_slot AS s
      JOIN pgjobs_job AS j ON j.limit_key = s.key AND j.status = 'throttled'
      WHERE s.job_id IS NULL
      ORDER BY s.key, j.run_at
      LIMIT %(batch)s) AS k

-- name: make_key_slots
-- A key's slots up to a limit an operator raised (an enqueue makes those its own limit needs).
SELECT pgjobs_limit_slots(%(key)s, %(max_running)s)

-- name: admit_key
-- Give a key's free slots to its throttled jobs now (after its limit was raised); how many.
SELECT pgjobs_limit_admit(%(key)s, %(max_running)s)

-- name: retime_rate_key
-- After an operator changed a rate key's rate: what it was charged is carried over to the new
-- spacing, and its next job is given the slot again under the new rate. Whether there was one.
SELECT pgjobs_rate_retime(%(key)s, %(was)s, %(spacing)s, %(burst)s)

-- name: push_back_rates
-- Handlers' RateLimited: each key (a job's own when none was named) starts nothing for the
-- seconds given.
SELECT pgjobs_rate_push_back(COALESCE(p.key, (SELECT j.limit_key FROM pgjobs_job AS j
                                              WHERE j.id = p.job_id)), p.seconds)
FROM jsonb_to_recordset(%s::jsonb) AS p(job_id bigint, key text, seconds float8)
WHERE COALESCE(p.key, (SELECT j.limit_key FROM pgjobs_job AS j WHERE j.id = p.job_id)) IS NOT NULL
