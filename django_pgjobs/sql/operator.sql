-- name: notify_ready_queues
-- One notification per queue that has one of the given jobs ready, as enqueue sends.
SELECT count(pg_notify('pgjobs', q.queue))
FROM (SELECT DISTINCT queue FROM pgjobs_job WHERE id = ANY(%s::bigint[]) AND status = 'ready') AS q

-- name: notify_queue
-- The wake-up enqueue sends, for one queue made claimable again.
SELECT pg_notify('pgjobs', %s)
