-- name: count_prunable_jobs
SELECT count(*)
FROM pgjobs_job
WHERE status = %(status)s
  AND status IN ('succeeded', 'dead', 'cancelled')
  AND finished_at < now() - make_interval(secs => %(retention)s::float8)

-- name: count_expired_receipts
SELECT count(*) FROM pgjobs_receipt WHERE expires_at < now()
