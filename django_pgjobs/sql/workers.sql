-- The worker processes' heartbeat rows (pgjobs_worker), written by the worker that each row
-- names (django_pgjobs.workers): at start and then every heartbeat interval, and once more as
-- it stops. Times are the database's.

-- name: beat_worker
-- The worker is alive: its row, made at its first beat and refreshed at each.
INSERT INTO pgjobs_worker AS w (worker_id, host, pid, version, queues, concurrency, listens,
                                started_at, last_seen_at, running, stopped_at)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(version)s, %(queues)s::jsonb, %(concurrency)s,
        %(listens)s, now(), now(), %(running)s, NULL)
ON CONFLICT (worker_id) DO UPDATE
SET last_seen_at = now(), running = EXCLUDED.running, stopped_at = NULL

-- name: stop_worker
-- The worker stopped cleanly.
UPDATE pgjobs_worker SET stopped_at = now(), running = 0, last_seen_at = now()
WHERE worker_id = %(worker_id)s

-- name: prune_workers
-- Rows of workers not seen for the retention: stopped or gone long ago.
DELETE FROM pgjobs_worker
WHERE last_seen_at < now() - make_interval(secs => %(retention)s)
