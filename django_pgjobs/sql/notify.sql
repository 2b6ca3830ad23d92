-- name: listen
-- The channel enqueue notifies on (its payload is the queue name), and the one a claim notifies
-- on when a job under a rate must wait for its time (its payload is the seconds until then).
LISTEN pgjobs; LISTEN pgjobs_rates

-- name: listener_ping
-- A round trip that proves the listening connection is still alive, and says whether its server
-- still takes writes: a listener on a server that turned read-only (the old primary after a
-- failover) hears nothing more, since the jobs are enqueued on the new one.
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::boolean
