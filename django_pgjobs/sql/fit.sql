-- name: fit_claims
-- Claims in the window that have ended, each count from an index alone: the attempt rows by
-- when they were claimed, and the successes, which have no row, by when their jobs finished.
-- An estimate for sizing, not a tally: a success claimed just before the window counts, and in
-- the first window after migration 0018 a success settled before it counts twice (its row and
-- its job); reading every job of an hour's successes to tell would cost millions of reads.
SELECT (SELECT count(*) FROM pgjobs_attempt
        WHERE claimed_at >= now() - make_interval(secs => %(window)s))
     + (SELECT count(*) FROM pgjobs_job
        WHERE status = 'succeeded' AND finished_at >= now() - make_interval(secs => %(window)s))

-- name: fit_max_job_id
SELECT COALESCE(max(id), 0) FROM pgjobs_job

-- name: fit_jobs_after
-- Jobs inserted since the first reading: ids are increasing, so a primary key range scan counts
-- them (gaps left by rolled-back inserts do not count).
SELECT count(*) FROM pgjobs_job WHERE id > %s

-- name: fit_payloads
-- The newest jobs by primary key: what is being enqueued now, at a bounded cost. Sizes are of
-- the JSON text, the measure PGJOBS_MAX_PAYLOAD_BYTES limits.
SELECT count(*), percentile_cont(0.95) WITHIN GROUP (ORDER BY size), max(size)
FROM (
    SELECT octet_length(payload::text) AS size FROM pgjobs_job ORDER BY id DESC LIMIT %s
) AS newest

-- name: fit_storage
SELECT pg_table_size('pgjobs_job'), pg_indexes_size('pgjobs_job'),
       pg_total_relation_size('pgjobs_attempt'), pg_database_size(current_database())

-- name: fit_table_health
-- Row churn and vacuum state of the job table, and its share of all row writes in this
-- database since the statistics were last reset.
SELECT t.n_live_tup, t.n_dead_tup, GREATEST(t.last_vacuum, t.last_autovacuum),
       extract(epoch FROM now() - GREATEST(t.last_vacuum, t.last_autovacuum))::float8,
       (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables
        WHERE relname IN ('pgjobs_job', 'pgjobs_attempt')),
       (SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables)
FROM pg_stat_user_tables AS t
WHERE t.relid = 'pgjobs_job'::regclass
