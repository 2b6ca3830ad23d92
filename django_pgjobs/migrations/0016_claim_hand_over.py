from importlib import import_module

from django.db import migrations

# The end of a run hands its limit key's slot on once per statement, not once per job, and a
# worker's settlement hands it straight to the claim sent with it (docs/limits.md, "Handing a
# slot on"). Each statement a trigger runs pays for opening pgjobs_job's checks, indexes and
# triggers again (about 115 us on PostgreSQL 15, against 9 us per row of a statement that writes
# many): a settlement of ten jobs of full keys paid that thirty times, now three times.
#
# - The row trigger after an update only notes the job whose run ended (pgjobs.released, a
#   transaction-local setting); the statement trigger after the same UPDATE hands all their slots
#   on together (pgjobs_limit_hand_over_released).
# - A worker's settle-and-claim transaction says who claims, from which queue and how many jobs
#   more (pgjobs_claim_to, in the settle statement): a slot handed to a job of that queue starts
#   it under that worker's lease in the one write that takes it out of throttled, instead of
#   making it ready for the claim to write it again; the claim statement returns it with the jobs
#   it took, and takes that many fewer.
HAND_OVER = """
-- How many jobs a claim of `batch` may still take in this transaction: its batch, less the jobs
-- this transaction's settlement started for it (pgjobs_claim_to set the room). 0 for batch 0.
CREATE FUNCTION pgjobs_claim_room(batch integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(NULLIF(current_setting('pgjobs.claim_room', true), '')::integer, batch)
$$;

-- The jobs this transaction's settlement started for its claim.
CREATE FUNCTION pgjobs_claim_handed() RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT string_to_array(NULLIF(current_setting('pgjobs.claim_handed', true), ''),
                           ',')::bigint[]
$$;

-- A worker's claim transaction, in its settle statement: a slot its settlement frees may start
-- the key's next job, if it is in `queue` (and the queue is not paused), under `worker`'s lease,
-- up to `room` jobs. Set for this transaction only; pgjobs_claim_to(NULL, NULL, NULL) ends it.
-- (PL/pgSQL, like pgjobs_limit_room below: a LANGUAGE sql function that cannot be inlined is
-- planned again at every call, 30 to 60 us here.)
CREATE FUNCTION pgjobs_claim_to(worker text, queue text, room integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('pgjobs.claim_worker', COALESCE(worker, ''), true),
            set_config('pgjobs.claim_queue', COALESCE(queue, ''), true),
            set_config('pgjobs.claim_room', COALESCE(room::text, ''), true),
            set_config('pgjobs.claim_handed', '', true);
END
$$;

-- How many slots of each key (with the cap its job declares) may be held now: its limit (the
-- cap, unless an operator set one in pgjobs_key_limit), or none while a slot at or above it is
-- still held (a limit lowered while jobs ran: nothing new starts until those end). Every taking
-- and handing over asks this, for one key (pgjobs_limit_room) or for a statement's keys at once.
CREATE FUNCTION pgjobs_limit_rooms(keys text[], caps integer[])
RETURNS TABLE (limit_key text, room integer)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT DISTINCT k.k, CASE WHEN EXISTS (SELECT 1 FROM pgjobs_key_slot AS o
                                           WHERE o.key = k.k AND o.n >= c.cap
                                             AND o.job_id IS NOT NULL)
                              THEN 0 ELSE c.cap END
    FROM unnest(keys, caps) AS k(k, cap)
    CROSS JOIN LATERAL (
        SELECT COALESCE((SELECT l.max_running FROM pgjobs_key_limit AS l WHERE l.key = k.k),
                        k.cap) AS cap
    ) AS c;
END
$$;

-- Migration 0011's function, asking the one above; in PL/pgSQL its plan is kept.
CREATE OR REPLACE FUNCTION pgjobs_limit_room(k text, cap integer) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT r.room FROM pgjobs_limit_rooms(ARRAY[k], ARRAY[cap]) AS r);
END
$$;

-- After a job that held a slot left ready, running and (under a rate, waiting for its time)
-- throttled: settled, rescued, cancelled, dead-lettered, snoozed. Noted here; the statement's
-- own trigger hands its slot on with the others the statement freed.
CREATE OR REPLACE FUNCTION pgjobs_limit_release() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('pgjobs.released',
                       concat_ws(',', NULLIF(current_setting('pgjobs.released', true), ''),
                                 OLD.id::text), true);
    RETURN NULL;
END
$$;

-- After an UPDATE whose rows' runs ended holding slots (pgjobs_limit_release noted them): in
-- one pass, each freed slot goes to its key's next throttled job (highest priority, oldest), or
-- is freed when none waits, or when the key's limit was lowered under it (the limits step then
-- gives free slots below the new limit once the key has room). One write of each slot row:
-- handed over, never freed and taken again. A job handed a slot starts at once under the lease
-- of the claim that follows in this transaction, when there is one for its queue with room
-- (pgjobs_claim_to); else it is ready. Under a rate, each slot is handed on alone, as a claim
-- hands it (pgjobs_limit_hand_over): its next job may have to wait for its time.
-- Its statements' plans are kept generic: a custom plan of the hand-over costs more to make
-- than to run.
CREATE FUNCTION pgjobs_limit_hand_over_released() RETURNS trigger
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    released bigint[] := string_to_array(NULLIF(current_setting('pgjobs.released', true), ''),
                                         ',')::bigint[];
    handed bigint[];
BEGIN
    IF released IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('pgjobs.released', '', true);
    PERFORM pgjobs_limit_hand_over(j.limit_key, j.limit_max, j.limit_slot, j.id)
    FROM pgjobs_job AS j
    WHERE j.id = ANY(released) AND j.rate_interval IS NOT NULL
    ORDER BY j.id;
    WITH ended AS (
        SELECT j.limit_key AS key, j.limit_max AS cap, j.limit_slot AS slot, j.id AS holder
        FROM pgjobs_job AS j
        WHERE j.id = ANY(released) AND j.rate_interval IS NULL
    ), freed AS (
        -- Numbered per key, lowest slot first: a key's slots with room come first, and its
        -- first freed slot goes to its first waiting job.
        SELECT e.key, e.slot, e.holder, e.slot < r.room AS has_room,
               row_number() OVER (PARTITION BY e.key ORDER BY e.slot) AS nth
        FROM ended AS e
        JOIN pgjobs_limit_rooms(ARRAY(SELECT e.key FROM ended AS e),
                                ARRAY(SELECT e.cap FROM ended AS e)) AS r
          ON r.limit_key = e.key
    ), wanted AS (
        SELECT f.key, count(*) FILTER (WHERE f.has_room) AS n
        FROM freed AS f
        GROUP BY f.key
    ), waiting AS (
        SELECT w.key, n.id, n.queue,
               row_number() OVER (PARTITION BY w.key
                                  ORDER BY n.priority DESC, n.run_at, n.id) AS nth
        FROM wanted AS w
        CROSS JOIN LATERAL (
            SELECT j.id, j.queue, j.priority, j.run_at
            FROM pgjobs_job AS j
            WHERE j.limit_key = w.key AND j.status = 'throttled' AND j.limit_slot IS NULL
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT w.n
            FOR UPDATE SKIP LOCKED
        ) AS n
        WHERE w.n > 0
    ), moved AS (
        UPDATE pgjobs_key_slot AS s
        SET job_id = w.id
        FROM freed AS f
        LEFT JOIN waiting AS w ON w.key = f.key AND w.nth = f.nth AND f.has_room
        WHERE s.key = f.key AND s.n = f.slot AND s.job_id = f.holder
        RETURNING w.id AS next_job, w.queue, f.slot
    ), given AS (
        -- Which of them the claim that follows takes (pgjobs_claim_to): those of its queue,
        -- unless it is paused, up to its room.
        SELECT m.next_job, m.slot,
               COALESCE(m.queue = current_setting('pgjobs.claim_queue', true)
                        AND NOT EXISTS (SELECT 1 FROM pgjobs_queue AS q
                                        WHERE q.name = m.queue AND q.paused), false) AS ours
        FROM moved AS m
        WHERE m.next_job IS NOT NULL
    ), started AS (
        SELECT g.next_job, g.slot,
               g.ours AND row_number() OVER (PARTITION BY g.ours ORDER BY g.next_job)
                          <= pgjobs_claim_room(0) AS to_claim
        FROM given AS g
    ), written AS (
        -- Ready, holding the slot; or started for the claim, written as the claim statement
        -- (sql/jobs.sql, claim_jobs) writes a job it takes, and returned by it.
        UPDATE pgjobs_job AS j
        SET status = CASE WHEN s.to_claim THEN 'running' ELSE 'ready' END,
            limit_slot = s.slot,
            attempts = j.attempts + CASE WHEN s.to_claim THEN 1 ELSE 0 END,
            lease_owner = CASE WHEN s.to_claim
                               THEN current_setting('pgjobs.claim_worker', true) END,
            lease_token = CASE WHEN s.to_claim THEN gen_random_uuid() END,
            lease_expires_at = CASE WHEN s.to_claim
                                    THEN statement_timestamp()
                                         + make_interval(secs => j.lease_seconds) END,
            heartbeat_at = CASE WHEN s.to_claim THEN statement_timestamp()
                                ELSE j.heartbeat_at END,
            claimed_at = CASE WHEN s.to_claim THEN clock_timestamp() ELSE j.claimed_at END,
            started_at = CASE WHEN s.to_claim THEN COALESCE(j.started_at, statement_timestamp())
                              ELSE j.started_at END,
            updated_at = statement_timestamp()
        FROM started AS s
        WHERE j.id = s.next_job
        RETURNING j.id, s.to_claim
    )
    SELECT array_agg(w.id) FILTER (WHERE w.to_claim) INTO handed
    FROM written AS w;
    IF handed IS NOT NULL THEN
        PERFORM set_config('pgjobs.claim_room',
                           (pgjobs_claim_room(0) - cardinality(handed))::text, true),
                set_config('pgjobs.claim_handed',
                           concat_ws(',', NULLIF(current_setting('pgjobs.claim_handed'), ''),
                                     array_to_string(handed, ',')), true);
    END IF;
    RETURN NULL;
END
$$;

-- No WHEN: a statement trigger's is read before the statement's row triggers run.
CREATE TRIGGER pgjobs_limit_hand_over_released AFTER UPDATE OF status ON pgjobs_job
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgjobs_limit_hand_over_released();
"""


def _function_before(name: str) -> str:
    """Function ``name`` as migration 0011 wrote it, to put back."""
    limits = import_module("django_pgjobs.migrations.0011_limits").LIMITS
    start = limits.index(f"CREATE FUNCTION {name}(")
    end = limits.index("$$;", limits.index("AS $$", start) + 5) + 3
    return "CREATE OR REPLACE" + limits[start:end].removeprefix("CREATE")


UNDO_HAND_OVER = (_function_before("pgjobs_limit_release") + "\n"
                  + _function_before("pgjobs_limit_room") + """
DROP TRIGGER pgjobs_limit_hand_over_released ON pgjobs_job;
DROP FUNCTION pgjobs_limit_hand_over_released();
DROP FUNCTION pgjobs_claim_to(text, text, integer);
DROP FUNCTION pgjobs_claim_handed();
DROP FUNCTION pgjobs_claim_room(integer);
DROP FUNCTION pgjobs_limit_rooms(text[], integer[]);
""")


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0015_encrypted_fields'),
    ]

    operations = [
        migrations.RunSQL(HAND_OVER, UNDO_HAND_OVER),
    ]
