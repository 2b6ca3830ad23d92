-- The per-key limits' slots (pgjobs_key_slot). The triggers of pgjobs_job take and free them as
-- jobs start waiting, become ready and end their runs (docs/limits.md); these statements are the
-- maintenance that catches what those cannot see, and an operator's change of a key's limit.

-- name: orphaned_slots
-- Held slots whose holder does not hold them as this statement sees it: gone (deleted), or
-- changed by a writer the triggers did not see. A holder is ready or running, or under a rate
-- throttled until its time. One window of slot rows a run, held or free: ids after `after` up
-- to `until` (the caller adds the window's size: a sum here would take the type psycopg gives
-- each number under server-side binding, smallint for 30,000), read by the primary key, so that a run's work is bounded however many
-- slots there are (a holder is checked by its primary key, about a microsecond each; every held
-- slot read at every run took 134 ms at 100,000 held). Answers where a look that starts over
-- starts (before the first slot row) and the last slot row's id (both NULL when there is none;
-- the next window starts over when this one reached the last), and beside them each orphan
-- found in the window, locked, skipping any another transaction holds (it may be taking or
-- freeing it); free_orphaned_slots reads them again after the lock.
WITH slots AS (
    SELECT min(s.id) - 1 AS first, max(s.id) AS last FROM pgjobs_key_slot AS s
)
SELECT slots.first, slots.last, o.key, o.n, o.job_id
FROM slots
LEFT JOIN LATERAL (
    SELECT s.key, s.n, s.job_id
    FROM pgjobs_key_slot AS s
    WHERE s.id > %(after)s AND s.id <= %(until)s AND s.job_id IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM pgjobs_job AS j
                      WHERE j.id = s.job_id AND j.limit_key = s.key AND j.limit_slot = s.n
                        AND j.status IN ('ready', 'running', 'throttled'))
    LIMIT %(batch)s
    FOR UPDATE OF s SKIP LOCKED
) AS o ON true

-- name: orphaned_slots_start
-- Where a worker's first look for orphaned slots starts: a slot row id at random, so that
-- workers started together, or restarted before one look went round, read different windows.
SELECT COALESCE(min(s.id) - 1 + floor(random() * (max(s.id) - min(s.id) + 1))::bigint, 0)
FROM pgjobs_key_slot AS s

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
