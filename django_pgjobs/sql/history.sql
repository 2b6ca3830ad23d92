-- The queues' history (pgjobs_queue_sample): one row per queue per sampling interval, written by
-- the history step of whichever worker comes first (django_pgjobs.history), read by the admin's
-- charts. Times are the database's.

-- name: sample_queues
-- One statement per interval: each queue's state now and what finished in the interval that
-- just ended, written under the interval's end, and samples past the retention deleted. The
-- NOT EXISTS gate runs first and alone: when another worker has sampled this interval, nothing
-- below it is read. Every count comes from a partial index (the claim, lease, due, throttled
-- and finished indexes, the failed attempts' end index); the oldest ready job per queue from
-- stats_oldest_ready's skip scan over the claim index, which the code splices in.
WITH at AS (
    SELECT date_bin(make_interval(secs => %(interval)s), now(), %(origin)s)
           AS sampled_at
), pruned AS (
    DELETE FROM pgjobs_queue_sample
    WHERE sampled_at < now() - make_interval(secs => %(retention)s)
), live AS (
    SELECT queue, count(*) AS ready, 0 AS waiting, 0 AS running FROM pgjobs_job
    WHERE status = 'ready' GROUP BY queue
    UNION ALL
    SELECT queue, 0, count(*), 0 FROM pgjobs_job
    WHERE status IN ('scheduled', 'retrying') GROUP BY queue
    UNION ALL
    SELECT queue, 0, count(*), 0 FROM pgjobs_job
    WHERE status = 'throttled' GROUP BY queue
    UNION ALL
    SELECT queue, 0, count(*), 0 FROM pgjobs_job
    WHERE status = 'pending' GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, count(*) FROM pgjobs_job
    WHERE status = 'running' GROUP BY queue
), finished AS (
    SELECT queue, count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'dead') AS dead
    FROM pgjobs_job, at
    WHERE status IN ('succeeded', 'dead')
      AND finished_at >= at.sampled_at - make_interval(secs => %(interval)s)
      AND finished_at < at.sampled_at
    GROUP BY queue
), failed AS (
    SELECT j.queue, count(*) AS failed
    FROM pgjobs_attempt AS a
    JOIN pgjobs_job AS j ON j.id = a.job_id, at
    WHERE a.failure_class <> ''
      AND a.finished_at >= at.sampled_at - make_interval(secs => %(interval)s)
      AND a.finished_at < at.sampled_at
    GROUP BY j.queue
), oldest(queue, seconds) AS (
    -- The skip scan of stats_oldest_ready, spliced in whole by the code that runs this.
    {oldest_ready}
), per_queue AS (
    SELECT queue, sum(ready) AS ready, sum(waiting) AS waiting, sum(running) AS running,
           0 AS succeeded, 0 AS dead, 0 AS failed
    FROM live GROUP BY queue
    UNION ALL
    SELECT queue, 0, 0, 0, succeeded, dead, 0 FROM finished
    UNION ALL
    SELECT queue, 0, 0, 0, 0, 0, failed FROM failed
)
INSERT INTO pgjobs_queue_sample (sampled_at, queue, ready, waiting, running,
                                 oldest_ready_seconds, succeeded, failed, dead)
SELECT at.sampled_at, q.queue, sum(q.ready), sum(q.waiting), sum(q.running),
       (SELECT o.seconds FROM oldest AS o WHERE o.queue = q.queue),
       sum(q.succeeded), sum(q.failed), sum(q.dead)
FROM per_queue AS q, at
WHERE NOT EXISTS (SELECT 1 FROM pgjobs_queue_sample AS s, at
                  WHERE s.sampled_at = at.sampled_at)
GROUP BY at.sampled_at, q.queue
ON CONFLICT (sampled_at, queue) DO NOTHING

-- name: history_points
-- The samples of the last %(span)s seconds in buckets of %(bucket)s seconds, per queue (and
-- summed over every queue as the queue NULL): the most that waited or ran in the bucket, the
-- longest wait, and what finished in it. Read along the unique index's leading sampled_at.
SELECT date_bin(make_interval(secs => %(bucket)s), sampled_at, %(origin)s)
       AS bucket, queue,
       max(ready)::bigint, max(waiting)::bigint, max(running)::bigint,
       max(oldest_ready_seconds), sum(succeeded)::bigint, sum(failed)::bigint,
       sum(dead)::bigint
FROM pgjobs_queue_sample
WHERE sampled_at > now() - make_interval(secs => %(span)s)
GROUP BY bucket, queue
ORDER BY queue, bucket
