-- name: lowest_ready_priority
-- The lowest priority level of a queue's ready jobs: where aging has the most to do.
SELECT min(priority) FROM pgjobs_job WHERE status = 'ready' AND queue = %s

-- name: table_row_estimates
-- The planner's own row estimates (from the last ANALYZE), not a count.
SELECT relname, reltuples FROM pg_class WHERE relname = ANY(%s::text[])
