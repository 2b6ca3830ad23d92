-- name: listen
-- The channel enqueue notifies on (its payload is the queue name).
LISTEN pgjobs

-- name: listener_ping
-- A round trip that proves the listening connection is still alive.
SELECT 1
