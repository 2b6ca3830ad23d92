from importlib import import_module

from django.db import migrations


def _function_before(name: str) -> str:
    """Function ``name`` as migration 0011 wrote it, to put back."""
    limits = import_module("django_pgjobs.migrations.0011_limits").LIMITS
    start = limits.index(f"CREATE FUNCTION {name}(")
    end = limits.index("$$;", limits.index("AS $$", start) + 5) + 3
    return "CREATE OR REPLACE" + limits[start:end].removeprefix("CREATE")


def _body_before(name: str) -> str:
    """The body of function ``name`` as migration 0011 wrote it, between its ``$$``."""
    function = _function_before(name)
    return function[function.index("AS $$") + 5:function.rindex("$$;")]


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
#   more (pgjobs_claim_to, in the settle statement): a job of that queue handed a slot is left
#   throttled, holding it, for the claim statement sent next, which starts it with the jobs it
#   takes (and takes that many fewer); it is written once, from throttled to running, instead
#   of being made ready for the claim to write it again.
# pgjobs_limit_room_of's body ($$ROOM_RULE$$ below) is migration 0011's room rule, the body of
# its pgjobs_limit_room: the rule is written once.
HAND_OVER = """
-- How many jobs a claim of `batch` may still take in this transaction: the batch the settlement
-- was told of (pgjobs_claim_to), else `batch`, less the jobs the settlement handed the claim.
-- 0 for batch 0 where no claim follows. One expression, which the planner writes in.
CREATE FUNCTION pgjobs_claim_room(batch integer) RETURNS integer
LANGUAGE sql STABLE AS $$
    SELECT COALESCE(NULLIF(current_setting('pgjobs.claim_batch', true), '')::integer, batch)
           - COALESCE(cardinality(string_to_array(
                 NULLIF(current_setting('pgjobs.claim_handed', true), ''), ',')), 0)
$$;

-- The jobs this transaction's settlement handed to its claim, and the slot each was handed: the
-- claim statement starts them with the jobs it takes.
CREATE FUNCTION pgjobs_claim_handed() RETURNS TABLE (id bigint, slot integer)
LANGUAGE sql STABLE AS $$
    SELECT split_part(h, ':', 1)::bigint, split_part(h, ':', 2)::integer
    FROM unnest(string_to_array(NULLIF(current_setting('pgjobs.claim_handed', true), ''), ','))
         AS h
$$;

-- A worker's claim transaction, in its settle statement: a slot its settlement frees may go to
-- the key's next job for the claim that follows, if it is in `queue` (and the queue is not
-- paused), up to the claim's `batch`. Set for this transaction only; pgjobs_claim_to(NULL, NULL)
-- ends it.
-- (PL/pgSQL, like pgjobs_limit_room below: a LANGUAGE sql function that cannot be inlined is
-- planned again at every call, 30 to 60 us here.)
CREATE FUNCTION pgjobs_claim_to(queue text, batch integer) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('pgjobs.claim_queue', COALESCE(queue, ''), true),
            set_config('pgjobs.claim_batch', COALESCE(batch::text, ''), true),
            set_config('pgjobs.claim_handed', '', true);
END
$$;

-- How many slots of key k (whose job declares `cap`) may be held now: its limit (the cap,
-- unless an operator set one in pgjobs_key_limit), or none while a slot at or above it is still
-- held (a limit lowered while jobs ran: nothing new starts until those end). Every taking and
-- handing over asks this: one key at a time (pgjobs_limit_room), or each key of a statement's
-- hand-over, into whose query the planner writes this set-returning LANGUAGE sql function.
CREATE FUNCTION pgjobs_limit_room_of(k text, cap integer) RETURNS TABLE (room integer)
LANGUAGE sql STABLE AS $$ROOM_RULE$$;

-- Migration 0011's function, asking the one above; in PL/pgSQL its plan is kept.
CREATE OR REPLACE FUNCTION pgjobs_limit_room(k text, cap integer) RETURNS integer
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT r.room FROM pgjobs_limit_room_of(k, cap) AS r);
END
$$;

-- After a job that held a slot left ready, running and (under a rate, waiting for its time)
-- throttled: settled, rescued, cancelled, dead-lettered, snoozed. Noted here; the statement's
-- own trigger hands its slot on with the others the statement freed.
CREATE OR REPLACE FUNCTION pgjobs_limit_release() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    released text;
BEGIN
    IF OLD.rate_interval IS NULL THEN
        released := concat_ws(',', NULLIF(current_setting('pgjobs.released', true), ''),
                              OLD.id::text);
        IF length(released) < 16384 THEN
            PERFORM set_config('pgjobs.released', released, true);
        ELSE
            -- An UPDATE of thousands of jobs (an operator's bulk cancel): their slots are
            -- handed on in batches of a few thousand, not noted in one ever longer text
            -- (appending to it is quadratic). This runs after the statement's rows are all
            -- written, like the statement trigger.
            PERFORM set_config('pgjobs.released', '', true);
            PERFORM pgjobs_limit_hand_over_many(string_to_array(released, ',')::bigint[]);
        END IF;
    ELSE
        PERFORM set_config('pgjobs.released_rated',
                           concat_ws(',',
                                     NULLIF(current_setting('pgjobs.released_rated', true), ''),
                                     OLD.id::text), true);
    END IF;
    RETURN NULL;
END
$$;

-- After an UPDATE whose rows' runs ended holding slots (pgjobs_limit_release noted them): in
-- one pass, each freed slot goes to its key's next throttled job (highest priority, oldest), or
-- is freed when none waits, or when the key's limit was lowered under it (the limits step then
-- gives free slots below the new limit once the key has room). One write of each slot row:
-- handed over, never freed and taken again. A job handed a slot is left for the claim that
-- follows in this transaction, when there is one for its queue with room (pgjobs_claim_to),
-- which starts it; else it is ready. (A rate's slot is handed on alone, as a claim hands it,
-- pgjobs_limit_hand_over: its next job may have to wait for its time.) Its statements' plans
-- are kept generic: a custom plan of the hand-over costs more to make than to run.
CREATE FUNCTION pgjobs_limit_hand_over_many(released bigint[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    handed text[];
    ready_jobs bigint[];
    ready_slots integer[];
BEGIN
    WITH freed AS (
        -- Numbered per key, lowest slot first: a key's slots with room come first, and its
        -- first freed slot goes to its first waiting job.
        SELECT j.limit_key AS key, j.limit_slot AS slot, j.id AS holder,
               j.limit_slot < r.room AS has_room,
               row_number() OVER (PARTITION BY j.limit_key ORDER BY j.limit_slot) AS nth
        FROM pgjobs_job AS j
        CROSS JOIN LATERAL pgjobs_limit_room_of(j.limit_key, j.limit_max) AS r
        WHERE j.id = ANY(released)
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
              AND j.rate_interval IS NULL
              -- Handed to this transaction's claim already (by an earlier statement of this
              -- transaction: a nested one, the workflows' trigger's, hands on slots the outer
              -- statement freed before it): it holds a slot, though its row does not say so
              -- yet, and this transaction's own lock does not skip it.
              AND j.id NOT IN (SELECT h.id FROM pgjobs_claim_handed() AS h)
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
    )
    SELECT array_agg(s.next_job || ':' || s.slot) FILTER (WHERE s.to_claim),
           array_agg(s.next_job) FILTER (WHERE NOT s.to_claim),
           array_agg(s.slot) FILTER (WHERE NOT s.to_claim)
    INTO handed, ready_jobs, ready_slots
    FROM started AS s;
    IF handed IS NOT NULL THEN
        -- Still throttled, holding its slot: the claim statement sent next in this transaction
        -- (sql/jobs.sql, claim_jobs) starts it with the jobs it takes, in its one write, and
        -- takes that many fewer (pgjobs_claim_room counts them).
        PERFORM set_config('pgjobs.claim_handed',
                           concat_ws(',', NULLIF(current_setting('pgjobs.claim_handed'), ''),
                                     array_to_string(handed, ',')), true);
    END IF;
    IF ready_jobs IS NOT NULL THEN
        UPDATE pgjobs_job AS j
        SET status = 'ready', limit_slot = r.slot, updated_at = statement_timestamp()
        FROM unnest(ready_jobs, ready_slots) AS r(id, slot)
        WHERE j.id = r.id;
    END IF;
END
$$;

-- After every UPDATE of a job's status: the slots its rows freed, if any, are handed on, a
-- rate's one by one and the others together. This runs for every such statement, so it only
-- looks (the hand-over above sets what its plans need).
CREATE FUNCTION pgjobs_limit_hand_over_released() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    released text := current_setting('pgjobs.released', true);
    rated text := current_setting('pgjobs.released_rated', true);
BEGIN
    IF rated <> '' OR released <> '' THEN
        -- Cleared first: the hand-overs' own UPDATEs run this trigger again.
        PERFORM set_config('pgjobs.released_rated', '', true),
                set_config('pgjobs.released', '', true);
    END IF;
    IF rated <> '' THEN
        PERFORM pgjobs_limit_hand_over(j.limit_key, j.limit_max, j.limit_slot, j.id)
        FROM pgjobs_job AS j
        WHERE j.id = ANY(string_to_array(rated, ',')::bigint[])
        ORDER BY j.id;
    END IF;
    IF released <> '' THEN
        PERFORM pgjobs_limit_hand_over_many(string_to_array(released, ',')::bigint[]);
    END IF;
    RETURN NULL;
END
$$;

-- No WHEN: a statement trigger's is read before the statement's row triggers run.
CREATE TRIGGER pgjobs_limit_hand_over_released AFTER UPDATE OF status ON pgjobs_job
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgjobs_limit_hand_over_released();
""".replace("$$ROOM_RULE$$", "$$" + _body_before("pgjobs_limit_room") + "$$")


UNDO_HAND_OVER = (_function_before("pgjobs_limit_release") + "\n"
                  + _function_before("pgjobs_limit_room") + """
DROP TRIGGER pgjobs_limit_hand_over_released ON pgjobs_job;
DROP FUNCTION pgjobs_limit_hand_over_released();
DROP FUNCTION pgjobs_limit_hand_over_many(bigint[]);
DROP FUNCTION pgjobs_claim_to(text, integer);
DROP FUNCTION pgjobs_claim_handed();
DROP FUNCTION pgjobs_claim_room(integer);
DROP FUNCTION pgjobs_limit_room_of(text, integer);
""")


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0015_encrypted_fields'),
    ]

    operations = [
        migrations.RunSQL(HAND_OVER, UNDO_HAND_OVER),
    ]
