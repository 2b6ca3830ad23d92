-- name: listen
-- The channel enqueue notifies on (its payload is the queue name), and the one a claim notifies
-- on when a job under a rate must wait for its time (its payload is the seconds until then).
LISTEN pgjobs; LISTEN pgjobs_rates

-- name: listener_ping
-- A round trip that proves the listening connection is still alive.
SELECT 1
