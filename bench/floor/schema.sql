-- The least a SKIP LOCKED queue needs: a ready flag, an order, a lease token to fence the settle,
-- and a partial index holding only the ready rows in claim order.
DROP TABLE IF EXISTS floor_job;
CREATE TABLE floor_job (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    priority smallint NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    status text NOT NULL DEFAULT 'ready',
    attempts integer NOT NULL DEFAULT 0,
    payload jsonb NOT NULL,
    lease_token uuid,
    lease_expires_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX floor_job_claim_idx ON floor_job (queue, priority DESC, run_at, id)
    WHERE status = 'ready';
