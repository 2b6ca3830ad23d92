-- Every statement that writes pgjobs_job, and pgjobs_attempt, whose rows are written only with
-- their job's: the settle inserts the row of an attempt it ends other than by success (the job
-- row keeps a success), the prune deletes them
-- with their job. transitions.py runs each of them, from the INSERT that creates jobs in their
-- caller's transaction (enqueue checks them first) to the prune.

-- name: claim_jobs
-- The claim, whole: up to a batch of ready jobs of one queue, for one worker (the batch size is
-- written in per size; the queue and the worker's id are its two parameters). The batch counts
-- the jobs the transaction's settlement handed this claim with their limit key's slot
-- (settle_and_claim; pgjobs_claim_room is the batch less those, and the batch itself in any
-- other transaction): the claim starts them with the ones it takes.
-- The candidates are the ORM's Job.objects.select_for_update(skip_locked=True) query of
-- transitions.claim_candidates, written out as Django compiles it (a test compiles that query in
-- the claim's transaction.atomic() on each supported Django and proves this text equal, its
-- LIMIT the batch). They
-- read the claim index in its own order, skip rows another claim holds, and probe the queue's
-- pause once per claim, not per row (an InitPlan of one primary-key read): a paused queue's
-- claim reads no index entry. 'ready' is written in, not bound, so a prepared statement's generic
-- plan can still use the partial index it defines.
-- Kept in their own CTE the candidates are an optimisation fence: the planner cannot fold them
-- into the UPDATE and lock more rows than their LIMIT. Lease expiry comes from the database clock
-- as of this statement, not of the transaction's BEGIN. claimed_at is the clock as the row is
-- taken (clock_timestamp()): a statement's time is read before the statement finds the row, and
-- could precede the finished_at of the settlement that released it. The attempt gets no row of
-- its own until it ends: while it runs, the job's lease columns and claimed_at are its record.
WITH candidates AS (
    SELECT "pgjobs_job"."id" AS "id"
    FROM "pgjobs_job"
    WHERE (NOT EXISTS(SELECT 1 AS "a" FROM "pgjobs_queue" U0
                      WHERE (U0."name" = %(queue)s AND U0."paused") LIMIT 1)
           AND "pgjobs_job"."queue" = %(queue)s
           AND "pgjobs_job"."status" = 'ready')
    ORDER BY "pgjobs_job"."priority" DESC, "pgjobs_job"."run_at" ASC, 1 ASC
    LIMIT pgjobs_claim_room({limit})
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE pgjobs_job AS j
    SET status = 'running',
        attempts = j.attempts + 1,
        lease_owner = %(worker_id)s,
        lease_token = gen_random_uuid(),
        lease_expires_at = statement_timestamp() + make_interval(secs => j.lease_seconds),
        heartbeat_at = statement_timestamp(),
        -- The clock as the row is taken: after the settlement that made it claimable committed.
        claimed_at = clock_timestamp(),
        started_at = COALESCE(j.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        limit_slot = COALESCE(c.slot, j.limit_slot)
    FROM (
        SELECT c.id, NULL::integer AS slot FROM candidates AS c
        -- And the jobs this transaction's settlement handed this claim with their key's slot
        -- (pgjobs_limit_hand_over_released), still throttled: they count in the batch, which
        -- is why the LIMIT above is the batch less them.
        UNION ALL
        SELECT h.id, h.slot FROM pgjobs_claim_handed() AS h
    ) AS c
    WHERE j.id = c.id AND (c.slot IS NULL OR j.status = 'throttled')
    RETURNING j.id, j.task, j.payload_version, j.payload, j.attempts, j.max_attempts,
              j.snoozes, j.deadline, j.lease_seconds, j.lease_token, j.lease_expires_at,
              j.trace_id, j.queue, j.priority, j.created_at, j.run_at, j.scheduled_at,
              j.lease_owner, j.timeout_seconds, j.traceparent
)
-- The result's columns are named after the fields of claimed.ClaimedJob, which reads them by
-- name. Times as whole microseconds since the epoch (the _us columns): exact, and the worker
-- turns an integer into a datetime for a fraction of what parsing timestamptz text costs.
SELECT id, task, payload_version, payload, attempts AS attempt, max_attempts, snoozes,
       (extract(epoch FROM deadline) * 1000000)::int8 AS deadline_us, lease_seconds, lease_owner,
       lease_token, (extract(epoch FROM lease_expires_at) * 1000000)::int8 AS lease_expires_at_us,
       trace_id, queue, priority, (extract(epoch FROM created_at) * 1000000)::int8 AS created_at_us,
       (extract(epoch FROM run_at) * 1000000)::int8 AS run_at_us, timeout_seconds,
       (extract(epoch FROM scheduled_at) * 1000000)::int8 AS scheduled_at_us, traceparent
FROM claimed
ORDER BY priority DESC, run_at, id

-- name: claim_candidates_from_floors
-- The claim's candidates while a snapshot is held open (worker.floors): the same ready jobs of
-- the queue in the same order, read from a floor for each priority instead of from the start
-- of the claim index. While vacuum's horizon is held back, the index keeps the entry of every
-- job claimed since, and a claim from the start visits the row of each to learn it is no
-- longer ready: after 30,000 jobs 1,962 buffers and 3.1 ms, where one that starts past them
-- read 60. A floor is the (run_at, id) of the last job the worker claimed at that priority;
-- the row comparison is a range of the index (queue, priority DESC, run_at, id), one per
-- priority, each read in the index's order and locked as the full claim locks (skip what
-- another claim holds). A job that becomes ready behind its floor (a retry or scheduled job
-- promoted late, a handed slot, an aged priority, an enqueue that committed late) or at a
-- priority without one waits for the worker's next full claim. Spliced in place of the
-- claim_jobs candidates by transitions.claim_statement. The floors are one JSON array, run_at
-- in microseconds since the epoch: PostgreSQL guesses a hundred rows for it whether it is
-- planned for the values or not, so the prepared statement keeps its generic plan (given
-- arrays, whose length a plan for the values knows, every claim was planned anew).
    SELECT c.id
    FROM jsonb_to_recordset(%(floors)s::jsonb) AS f(priority smallint, run_at_us bigint,
                                                   id bigint)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM pgjobs_job AS j
        WHERE NOT EXISTS(SELECT 1 FROM pgjobs_queue AS q WHERE q.name = %(queue)s AND q.paused)
          AND j.queue = %(queue)s AND j.status = 'ready'
          AND j.priority = f.priority
          AND (j.run_at, j.id) > ('epoch'::timestamptz + f.run_at_us * interval '1 microsecond',
                                  f.id)
        ORDER BY j.run_at, j.id
        LIMIT pgjobs_claim_room({limit})
        FOR UPDATE OF j SKIP LOCKED
    ) AS c
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT pgjobs_claim_room({limit})

-- name: claim_to_end
-- After the claim, in a transaction that goes on (a test's, or one its caller opened): nothing
-- more goes to that claim, and a later claim in it takes its whole batch.
SELECT pgjobs_claim_to(NULL, NULL)

-- name: settle_jobs
-- One fenced statement for a whole batch of outcomes. A job row changes only while it is still
-- running under the reported lease token; an outcome whose token no longer matches changes
-- nothing of the job and is recorded on its attempt (see the attempt rows below). A job an
-- operator asked to stop never goes back to waiting: an outcome that would retry, release or
-- snooze it ends it cancelled, and its attempt then counts like any that ended the job.
-- Lease and schedule times are the statement's, like the claim's: sent inside a longer
-- transaction (a test's, django_pgjobs.testing.drain), now() would be that transaction's start,
-- before the attempt was even claimed. When an attempt ended is the clock's as its row is
-- written (clock_timestamp()): before this statement commits, so before any later claim of the
-- same job stamps its claimed_at, and never before the attempt's own claimed_at.
WITH claim AS (
    -- In a worker's settle-and-claim transaction, the queue and the batch of the claim that
    -- follows: a limit key's slot this statement frees goes with the key's next job to that
    -- claim, which starts it, if it is of that queue (pgjobs_limit_hand_over_released).
    -- NULLs elsewhere: the next job is made ready. Transaction-local.
    SELECT pgjobs_claim_to(%s, %s)
), reported AS (
    -- The batch arrives as one JSON array of objects keyed by these columns, which are the
    -- fields of outcomes.Outcome of the same names (transitions.settle builds them).
    SELECT r.*
    FROM claim, jsonb_to_recordset(%s::jsonb) AS r(
        job_id bigint, lease_token uuid, attempt int, worker_id text, status text,
        attempt_outcome text, delay_seconds float8, counted boolean, adds_snooze boolean,
        failure_class text, terminal_reason text, error text, traceback text, result_json text,
        duration_ms int
    )
), settled AS (
    UPDATE pgjobs_job AS j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL
                           AND r.status IN ('retrying', 'ready', 'scheduled')
                      THEN 'cancelled' ELSE r.status END,
        run_at = CASE WHEN r.delay_seconds IS NULL OR j.cancel_requested_at IS NOT NULL
                      THEN j.run_at
                      ELSE statement_timestamp() + make_interval(secs => r.delay_seconds) END,
        -- The claim counted the attempt; an outcome that does not count it gives it back,
        -- unless a pending cancel ends the job with it: that attempt keeps its row (outcome
        -- cancelled), so it keeps its count.
        attempts = j.attempts - CASE WHEN r.counted OR j.cancel_requested_at IS NOT NULL
                                     THEN 0 ELSE 1 END,
        snoozes = j.snoozes + CASE WHEN r.adds_snooze THEN 1 ELSE 0 END,
        -- A success writes no attempt row: the job keeps that attempt's facts (its worker, its
        -- claimed_at and finished_at, its handler's time). Any other outcome has a row.
        lease_owner = CASE WHEN r.status = 'succeeded' THEN j.lease_owner END,
        duration_ms = CASE WHEN r.status = 'succeeded' THEN r.duration_ms END,
        lease_token = NULL,
        lease_expires_at = NULL,
        failure_class = CASE WHEN r.failure_class = '' THEN j.failure_class
                             ELSE r.failure_class END,
        terminal_reason = CASE WHEN j.cancel_requested_at IS NOT NULL
                                    AND r.status IN ('retrying', 'ready', 'scheduled')
                               THEN 'operator' ELSE r.terminal_reason END,
        last_error = CASE WHEN r.error = '' THEN j.last_error ELSE r.error END,
        result = r.result_json::jsonb,
        finished_at = CASE WHEN r.status IN ('succeeded', 'dead', 'cancelled')
                                OR j.cancel_requested_at IS NOT NULL
                           THEN GREATEST(clock_timestamp(), j.claimed_at) END,
        updated_at = statement_timestamp()
    FROM reported AS r
    -- The reported jobs by their primary key, each still running under the reported token:
    -- only a running job holds a token (the table's rule pgjobs_job_lease_state), so the
    -- token's match says it. Neither is left to the planner. Told "running" as well, it may
    -- read every running job from the lease index and hash them; told only the join, it
    -- guesses a hundred reports and may read the whole table. While a snapshot is held open
    -- either grows with every attempt since: the lease index kept 40,000 entries after 40,000
    -- jobs, and the settlement read 3,160 buffers, against about three a report this way.
    WHERE j.id = ANY(ARRAY(SELECT job_id FROM reported)) AND j.id = r.job_id
      AND j.lease_token = r.lease_token
    RETURNING r.lease_token, j.status, j.claimed_at, j.finished_at
), written AS (
    -- Each attempt's row is written here, once, now that its outcome is known, except the
    -- row of an attempt that succeeded: its job row holds that attempt (see the SET above).
    -- Most attempts succeed, and this row and its four index entries were a third of the
    -- tuples and WAL a drained job cost. Matched on the token, not the job: one batch can
    -- hold a stale report and the winning report for the same job (a handler ran past its
    -- lease and the retry finished before the flush).
    INSERT INTO pgjobs_attempt AS a (job_id, number, worker_id, lease_token, claimed_at,
                                     finished_at, outcome, reported_outcome, failure_class, error,
                                     traceback, duration_ms)
    SELECT r.job_id, r.attempt, r.worker_id, r.lease_token,
           COALESCE(s.claimed_at, statement_timestamp()),
           -- The job's own finished_at when this attempt ended it: one time for one event.
           COALESCE(s.finished_at, GREATEST(clock_timestamp(), s.claimed_at)),
           CASE WHEN s.lease_token IS NULL THEN 'lost'
                -- A pending cancel ended the job: the attempt says so, and reported_outcome
                -- keeps what the handler said.
                WHEN s.status = 'cancelled' THEN 'cancelled'
                ELSE r.attempt_outcome END,
           r.attempt_outcome, r.failure_class, r.error, r.traceback, r.duration_ms
    FROM reported AS r
    LEFT JOIN settled AS s ON s.lease_token = r.lease_token
    -- A late report about a job that is gone (pruned) has nothing left to be recorded against.
    -- Nor has the success that won, sent again (its reply was lost after the commit): its job
    -- holds it, by worker and number, and its token has no row. A report whose token has a row
    -- always goes on to the conflict below, even one with the job's worker and number (an
    -- operator's retry starts the count again: the same worker can end attempt 1 twice). A
    -- job that succeeded before migration 0018 has no lease_owner, and then nothing matches.
    -- Scalar subqueries, not EXISTS, evaluated for reports that did not apply alone: each
    -- probes one index for that report, where EXISTS may be planned as a hash of every id.
    WHERE CASE WHEN s.lease_token IS NOT NULL THEN s.status <> 'succeeded'
               ELSE (SELECT x.lease_token IS NOT NULL
                            OR NOT COALESCE(g.status = 'succeeded'
                                            AND r.attempt_outcome = 'succeeded'
                                            AND g.lease_owner = r.worker_id
                                            AND g.attempts = r.attempt, false)
                     FROM pgjobs_job AS g
                     LEFT JOIN pgjobs_attempt AS x ON x.lease_token = r.lease_token
                     WHERE g.id = r.job_id) END
    -- The token has a row already when its attempt ended without its holder: the rescue step
    -- took it over (lease expired), or the worker did (timed out, cancelled). That row is the
    -- attempt's history and stays as it is; the holder's late report is recorded beside it, in
    -- reported_outcome alone. A row the holder's own report wrote is left whole: a batch sent
    -- again after its reply was lost (the connection dropped after the commit) changes
    -- nothing. A running row is one a worker older than migration 0008 wrote at claim time;
    -- it is completed like a new one. (Such a worker settles its own claims: a success, which
    -- writes no row here, comes only from a claim of this version, which wrote none.) The conflict waits for a concurrent rescue of the same token to commit,
    -- so its row is never missed.
    ON CONFLICT (lease_token) DO UPDATE
    SET finished_at = CASE WHEN a.outcome = 'running' THEN EXCLUDED.finished_at
                           ELSE a.finished_at END,
        outcome = CASE WHEN a.outcome = 'running' THEN EXCLUDED.outcome ELSE a.outcome END,
        reported_outcome = EXCLUDED.reported_outcome,
        failure_class = CASE WHEN a.outcome = 'running' THEN EXCLUDED.failure_class
                             ELSE a.failure_class END,
        error = CASE WHEN a.outcome = 'running' THEN EXCLUDED.error ELSE a.error END,
        traceback = CASE WHEN a.outcome = 'running' THEN EXCLUDED.traceback
                         ELSE a.traceback END,
        duration_ms = CASE WHEN a.outcome = 'running' THEN EXCLUDED.duration_ms
                           ELSE a.duration_ms END
    WHERE a.outcome IN ('running', 'lease_expired', 'timed_out', 'cancelled')
      AND a.reported_outcome IN ('', 'lease_expired', 'timed_out', 'cancelled')
    RETURNING a.lease_token
)
-- Applied: the report settled its job. A report that lost its lease, one about a job that is
-- gone, and one sent again all answer false.
SELECT r.lease_token, s.lease_token IS NOT NULL AS applied
FROM reported AS r
LEFT JOIN settled AS s ON s.lease_token = r.lease_token

-- name: extend_leases
-- A heartbeat extends from the statement's time: a handler may send it inside its own transaction.
UPDATE pgjobs_job AS j
SET lease_expires_at = statement_timestamp() + make_interval(secs => j.lease_seconds),
    heartbeat_at = statement_timestamp(),
    updated_at = statement_timestamp()
FROM unnest(%s::bigint[], %s::uuid[]) AS h(id, token)
-- Still held: the token says the job is running, as in settle_jobs, and for the same reason.
WHERE j.id = h.id AND j.lease_token = h.token
RETURNING j.id, j.lease_expires_at, j.cancel_requested_at IS NOT NULL

-- name: promote_due_jobs
-- Scheduled and retrying jobs whose time has come become ready, oldest first, in one bounded
-- batch; SKIP LOCKED lets several workers promote at once without waiting on each other.
WITH due AS (
    SELECT id
    FROM pgjobs_job
    WHERE status IN ('scheduled', 'retrying') AND run_at <= now()
    ORDER BY run_at
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgjobs_job AS j
SET status = 'ready', updated_at = now()
FROM due
WHERE j.id = due.id
RETURNING j.queue

-- name: start_rate_heads
-- The jobs under a rate whose time has come: each holds its key's slot, waiting as throttled
-- until the rate allows its start (pgjobs_rate_give set its run_at to then). They become ready,
-- and their queues' workers are woken. The answer: how many, and in how many seconds the next
-- one's time comes (NULL: none waits).
WITH due AS (
    SELECT id
    FROM pgjobs_job
    WHERE status = 'throttled' AND limit_slot IS NOT NULL AND run_at <= clock_timestamp()
    ORDER BY run_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), started AS (
    UPDATE pgjobs_job AS j
    SET status = 'ready', updated_at = statement_timestamp()
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.queue
)
SELECT (SELECT count(*) FROM started) AS started,
       (SELECT count(pg_notify('pgjobs', q.queue))
        FROM (SELECT DISTINCT queue FROM started) AS q) AS notified,
       (SELECT extract(epoch FROM min(w.run_at) - clock_timestamp())
        FROM pgjobs_job AS w
        WHERE w.status = 'throttled' AND w.limit_slot IS NOT NULL
          AND w.id NOT IN (SELECT id FROM started)) AS next_in

-- name: promote_jobs_due_by
-- promote_due_jobs as of a given time instead of the database clock, for the given queues (NULL:
-- every queue): how django_pgjobs.testing.drain(now=...) runs scheduled and retrying jobs before
-- the database's time for them has come, and jobs under a rate whose turn it is (they hold
-- their key's slot, throttled until their time). Only the status changes; run_at (when the job
-- was due), the deadline and everything the lease depends on stay as they are.
WITH due AS (
    SELECT id
    FROM pgjobs_job
    WHERE (status IN ('scheduled', 'retrying')
           OR (status = 'throttled' AND limit_slot IS NOT NULL))
      AND run_at <= %(when)s::timestamptz
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
    ORDER BY run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgjobs_job AS j
SET status = 'ready', updated_at = statement_timestamp()
FROM due
WHERE j.id = due.id
RETURNING j.queue

-- name: raise_waiting_priorities
-- One bounded batch of aging inside one (queue, priority) level of the claim index, in (run_at,
-- id) order after a keyset position. A job's aged priority is its base priority plus one step
-- per whole interval it has been ready, capped. It has been ready since its run_at, or since it
-- was enqueued when that is later: a run_at given in the past is when the job was wanted, not a
-- wait it served, and counting from it would raise a job enqueued at -100 with a run_at of last
-- week to the cap in one step. The claim's ORDER BY (priority DESC, run_at, id) then breaks ties
-- between equal priorities in favour of the longest wait. Rows a claim holds are skipped, not
-- waited for. The last row of the batch is returned so the caller can continue after it.
WITH due AS (
    SELECT id, run_at,
           LEAST(%(cap)s, base_priority + %(step)s * floor(
               extract(epoch FROM now() - GREATEST(run_at, created_at))
               / %(interval)s::float8))::smallint AS aged
    FROM pgjobs_job
    WHERE status = 'ready' AND queue = %(queue)s AND priority = %(priority)s
      AND run_at <= now() - make_interval(secs => %(interval)s::float8)
      AND (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint)
      AND LEAST(%(cap)s, base_priority + %(step)s * floor(
              extract(epoch FROM now() - GREATEST(run_at, created_at))
              / %(interval)s::float8)) > priority
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), aged AS (
    UPDATE pgjobs_job AS j
    SET priority = due.aged, updated_at = now()
    FROM due
    WHERE j.id = due.id AND j.status = 'ready' AND j.priority < due.aged
    RETURNING j.id
)
SELECT (SELECT count(*) FROM aged),
       count(*),
       (array_agg(due.run_at ORDER BY due.run_at DESC, due.id DESC))[1],
       (array_agg(due.id ORDER BY due.run_at DESC, due.id DESC))[1]
FROM due

-- name: prune_jobs
-- Delete one bounded batch of jobs that finished in one terminal state longer ago than its
-- retention, with their attempts and edges, in one statement (one short transaction). The terminal states
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
), edges_in AS (
    -- A workflow's edges go with either of their jobs (both ended long since), each way
    -- through its own index.
    DELETE FROM pgjobs_dependency AS d
    USING doomed
    WHERE d.job_id = doomed.id
), edges_out AS (
    DELETE FROM pgjobs_dependency AS d
    USING doomed
    WHERE d.upstream_id = doomed.id
), jobs AS (
    DELETE FROM pgjobs_job AS j
    USING doomed
    WHERE j.id = doomed.id AND j.status IN ('succeeded', 'dead', 'cancelled')
    RETURNING j.id
)
SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM attempts)

-- name: insert_jobs
-- One INSERT for one or many jobs, in the caller's transaction. A job that a unique index
-- refuses (its task and idempotency key exist; its unique key is held by an active job, or in
-- its period; its schedule's tick already has a job) is skipped here and read back by the
-- caller. Times come from the database clock; a unique period starts at the epoch's multiple of
-- its length. When asked, the same statement sends one NOTIFY per queue that got a ready job;
-- PostgreSQL delivers it only if the caller's transaction commits.
-- Its rows: what a combination of task and options gives its jobs comes as one array per
-- column, an element per combination; each job's own values as one JSON document, a JSON array
-- per job: its combination's number, its payload, then its schedule id, tick, traceparent,
-- limit key and weight under a rate when it has any of them, and a workflow's job then its
-- count of dependencies (pending while above 0), whether jobs depend on it, and its
-- workflow's id. A job with a limit key is
-- inserted ready and waits as throttled unless a slot of its key is free (the triggers of
-- docs/limits.md). The jobs are inserted, and answered, in the document's order. One job alone
-- goes through insert_job, planned faster.
WITH inserted AS (
    INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                            run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                            idempotency_key, unique_key, unique_period_start, timeout_seconds,
                            trace_id, fairness_key, limit_key, limit_max, rate_interval,
                            rate_burst, rate_weight, schedule_id, scheduled_at, traceparent,
                            pending_dependencies, has_dependents, workflow_id,
                            failure_class, terminal_reason, last_error, created_at, updated_at)
    SELECT t.task, t.payload_version, t.queue, t.payload::jsonb,
           CASE WHEN t.pending_dependencies > 0 THEN 'pending'
                WHEN t.due > now() THEN 'scheduled' ELSE 'ready' END,
           t.priority, t.priority, t.due, 0, t.max_attempts, 0,
           now() + make_interval(secs => t.max_age_seconds), t.lease_seconds,
           t.idempotency_key, t.unique_key,
           to_timestamp(floor(extract(epoch FROM now()) / t.unique_period) * t.unique_period),
           t.timeout_seconds, t.trace_id, t.fairness_key, t.limit_key, t.limit_max,
           t.rate_interval, t.rate_burst, t.rate_weight, t.schedule_id, t.scheduled_at,
           t.traceparent, t.pending_dependencies, COALESCE(t.has_dependents, false),
           t.workflow_id, '', '', '', now(), now()
    FROM (
        SELECT u.*, COALESCE(u.run_at, now() + make_interval(secs => u.delay_seconds)) AS due
        FROM (
            SELECT c.task, c.payload_version, c.queue, j.value -> 1, c.priority, c.run_at,
                   c.delay_seconds, c.max_attempts, c.max_age_seconds, c.lease_seconds,
                   c.idempotency_key, c.unique_key, c.unique_period, c.timeout_seconds,
                   c.trace_id, c.fairness_key, c.limit_max, c.rate_interval, c.rate_burst,
                   (j.value ->> 2)::bigint, (j.value ->> 3)::timestamptz, j.value ->> 5,
                   (j.value ->> 6)::int, j.value ->> 4, (j.value ->> 7)::int,
                   (j.value ->> 8)::boolean, (j.value ->> 9)::uuid
            FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS j(value, place)
            JOIN unnest(%s::text[], %s::int[], %s::text[], %s::int[], %s::timestamptz[],
                        %s::float8[], %s::int[], %s::float8[], %s::int[], %s::text[],
                        %s::text[], %s::float8[], %s::float8[], %s::text[], %s::text[],
                        %s::int[], %s::float8[], %s::int[])
                 WITH ORDINALITY AS c(task, payload_version, queue, priority, run_at,
                                      delay_seconds, max_attempts, max_age_seconds,
                                      lease_seconds, idempotency_key, unique_key, unique_period,
                                      timeout_seconds, trace_id, fairness_key, limit_max,
                                      rate_interval, rate_burst, number)
              ON c.number = (j.value ->> 0)::bigint
            ORDER BY j.place
        ) AS u(task, payload_version, queue, payload, priority, run_at, delay_seconds,
               max_attempts, max_age_seconds, lease_seconds, idempotency_key, unique_key,
               unique_period, timeout_seconds, trace_id, fairness_key, limit_max,
               rate_interval, rate_burst, schedule_id, scheduled_at, limit_key, rate_weight,
               traceparent, pending_dependencies, has_dependents, workflow_id)
    ) AS t
    -- Any unique index: the idempotency key's, the unique key's (while active, per period), the
    -- schedule tick's; left out when no row has a key or a tick ({on_conflict}, sql.inserted_rows).
    {on_conflict}
    RETURNING id, task, idempotency_key, unique_key, schedule_id, scheduled_at, status, run_at,
              deadline, created_at, queue
), notified AS (
    SELECT count(pg_notify('pgjobs', n.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM inserted WHERE status = 'ready' AND %s::boolean) AS n
)
-- Read back by column name (enqueuing pairs each answer with its row).
SELECT i.id, i.task, i.idempotency_key, i.unique_key, i.schedule_id, i.scheduled_at, i.status,
       i.run_at, i.deadline, i.created_at, (SELECT sent FROM notified) AS notified
FROM inserted AS i

-- name: insert_job
-- One job, the common call: the same row and answer as insert_jobs, in the shape PostgreSQL
-- plans fastest (a third of insert_jobs' planning time): the values in VALUES itself, and the
-- NOTIFY in RETURNING, sent only when the job was inserted ready.
INSERT INTO pgjobs_job (task, payload_version, queue, payload, status, priority, base_priority,
                        run_at, attempts, max_attempts, snoozes, deadline, lease_seconds,
                        idempotency_key, unique_key, unique_period_start, timeout_seconds,
                        trace_id, fairness_key, limit_key, limit_max, rate_interval, rate_burst,
                        rate_weight, schedule_id, scheduled_at, traceparent, failure_class,
                        terminal_reason, last_error, created_at, updated_at)
VALUES (%(task)s, %(payload_version)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN COALESCE(%(run_at)s::timestamptz,
                           now() + make_interval(secs => %(delay_seconds)s::float8)) > now()
             THEN 'scheduled' ELSE 'ready' END,
        %(priority)s, %(priority)s,
        COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay_seconds)s::float8)),
        0, %(max_attempts)s, 0, now() + make_interval(secs => %(max_age_seconds)s::float8),
        %(lease_seconds)s, %(idempotency_key)s, %(unique_key)s,
        to_timestamp(floor(extract(epoch FROM now()) / %(unique_period)s::float8)
                     * %(unique_period)s::float8),
        %(timeout_seconds)s::float8, %(trace_id)s, %(fairness_key)s, %(limit_key)s,
        %(limit_max)s::int, %(rate_interval)s::float8, %(rate_burst)s::int,
        %(rate_weight)s::int, %(schedule_id)s::bigint, %(scheduled_at)s::timestamptz,
        %(traceparent)s, '', '', '', now(), now())
{on_conflict}
-- Read back by column name, like insert_jobs' answer.
RETURNING id, task, idempotency_key, unique_key, schedule_id, scheduled_at, status, run_at,
          deadline, created_at,
          CASE WHEN status = 'ready' AND %(notify)s::boolean
               THEN pg_notify('pgjobs', queue) IS NULL END AS notified

-- name: unique_key_holder
-- The job that holds a unique key now: an active one, or the one of the current period (the
-- caller's transaction sees the same now() as its INSERT did).
SELECT id FROM pgjobs_job
WHERE task = %(task)s AND unique_key = %(key)s
  AND CASE WHEN %(period)s::float8 IS NULL
           THEN unique_period_start IS NULL
                AND status IN ('pending', 'scheduled', 'throttled', 'ready', 'running',
                               'retrying')
           ELSE unique_period_start = to_timestamp(
                    floor(extract(epoch FROM now()) / %(period)s::float8) * %(period)s::float8)
      END

-- name: lock_upstream_jobs
-- The jobs that new edges depend on, locked in id order until the enqueuing transaction ends:
-- a settlement of one of them waits, and then finds the new edges committed; one that ended
-- before shows here as ended, and the edges are resolved at once (resolve_dependencies).
SELECT id, status, workflow_id FROM pgjobs_job
WHERE id = ANY(%s::bigint[])
ORDER BY id
FOR NO KEY UPDATE

-- name: insert_dependencies
-- A workflow's edges, and the mark on each job they depend on that has none yet: its end then
-- looks for its dependents (the trigger pgjobs_dependency_ended).
WITH edges AS (
    INSERT INTO pgjobs_dependency (job_id, upstream_id, requires, upstream_status)
    SELECT e.job_id, e.upstream_id, e.requires, ''
    FROM unnest(%(jobs)s::bigint[], %(upstreams)s::bigint[], %(requires)s::text[])
         AS e(job_id, upstream_id, requires)
), marked AS (
    UPDATE pgjobs_job SET has_dependents = true
    WHERE id = ANY(%(upstreams)s::bigint[]) AND NOT has_dependents
)
SELECT 1

-- name: resolve_dependencies
-- Edges whose job had already ended when they were written: resolved now, as its settlement
-- would have.
SELECT pgjobs_dependencies_resolve(%(ids)s::bigint[], %(statuses)s::text[])

-- name: dependency_results
-- What a running job's handler reads of the jobs it depends on: each one's task, how it ended
-- and its result, in the order the edges were written.
SELECT d.upstream_id, j.task, j.status, j.result, d.requires
FROM pgjobs_dependency AS d
JOIN pgjobs_job AS j ON j.id = d.upstream_id
WHERE d.job_id = %s
ORDER BY d.id

-- name: record_progress
-- A handler's progress, written only while its attempt still holds the lease.
UPDATE pgjobs_job
SET progress = %(progress)s::jsonb
WHERE id = %(id)s AND lease_token = %(token)s AND status = 'running'
RETURNING id

-- name: expire_pending_jobs
-- Pending jobs whose deadline passed before their dependencies ended: dead, with the reason.
-- Their own dependents are resolved by the trigger, as for any job that ends.
WITH expired AS (
    SELECT id FROM pgjobs_job
    WHERE status = 'pending' AND deadline < now()
    ORDER BY deadline
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE pgjobs_job AS j
SET status = 'dead', terminal_reason = 'deadline_passed',
    last_error = 'its deadline passed while it waited for the jobs it depends on',
    finished_at = clock_timestamp(), updated_at = now()
FROM expired
WHERE j.id = expired.id
RETURNING j.id

-- name: reopen_dependencies
-- After an operator's retry: the retried jobs' dependents that their end had cancelled wait
-- for them again, down the branch (pgjobs_dependencies_reopen, migration 0014).
SELECT pgjobs_dependencies_reopen(%s::bigint[])

-- name: jobs_to_reseal
-- One window of jobs in id order after %(after)s, for pgjobs_rotate_keys: every id of the window
-- (the next one starts after the last), with the payload and result as text only for the rows
-- that hold an encrypted value, so a window of plain jobs sends ids only.
WITH window_rows AS (
    SELECT id, task, payload::text AS payload, result::text AS result
    FROM pgjobs_job
    WHERE id > %(after)s
    ORDER BY id
    LIMIT %(limit)s
)
SELECT id, task, sealed,
       CASE WHEN sealed THEN payload END, CASE WHEN sealed THEN result END
FROM (SELECT id, task, payload, result,
             strpos(payload, 'pgjobs:enc:v1:') > 0
             OR coalesce(strpos(result, 'pgjobs:enc:v1:') > 0, false) AS sealed
      FROM window_rows) AS marked
ORDER BY id

-- name: reseal_jobs
-- Write the payloads and results pgjobs_rotate_keys sealed again (a null: left as it is), each
-- only where the row still holds the text that was read: a result a worker wrote since is read
-- and sealed again, never lost. The rows are locked first, and checked as they are when locked
-- (a row changed since it was read is left out). {skip_locked} is SKIP LOCKED for a batch: a
-- row another transaction holds (a worker settling a batch of jobs in its own order) is left
-- out rather than waited for, as waiting could close a deadlock cycle with that worker; and
-- nothing for one row alone, which waits (one row lock cannot close a cycle).
WITH c AS (
    SELECT * FROM jsonb_to_recordset(%(rows)s::jsonb)
        AS c(id bigint, payload text, result text, was_payload text, was_result text)
), locked AS (
    SELECT j.id
    FROM pgjobs_job AS j JOIN c ON c.id = j.id
    WHERE j.payload::text = c.was_payload
      AND j.result::text IS NOT DISTINCT FROM c.was_result
    FOR NO KEY UPDATE OF j {skip_locked}
)
UPDATE pgjobs_job AS j
SET payload = coalesce(c.payload::jsonb, j.payload), result = coalesce(c.result::jsonb, j.result)
FROM c JOIN locked ON locked.id = c.id
WHERE j.id = c.id
RETURNING j.id
