from importlib import import_module

from django.db import migrations

# The job table's row triggers ask only a short question in their WHEN clause; the rest of each
# condition moved to the top of the trigger's function.
#
# PostgreSQL prepares a trigger's WHEN clause anew for every statement that may fire it: it reads
# the clause's stored tree and simplifies it, as it does a CHECK constraint (migration 0019).
# The four row triggers of an UPDATE of status, with whole conditions, cost every claim and
# settlement about 55 us of server time on PostgreSQL 15, whatever its rows (docs/benchmarks.md;
# an INSERT's two cost too little to measure). Each
# WHEN now tests one column, which every job that the trigger may concern has (a limit key, a
# held slot, a rate, dependents, the throttled status); a job without one costs the trigger that
# test alone, as before, and one with one enters the function, which tests the rest and returns
# at once where the old WHEN was false. What each trigger does, and for which rows, is unchanged.
GUARDED = """
CREATE OR REPLACE FUNCTION pgjobs_limit_park() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    next_at timestamptz;
BEGIN
    -- Its triggers' WHEN: a limit key. A job that becomes ready: inserted so, or (an UPDATE)
    -- from outside the limit's statuses, or a rated job sent back from running.
    IF (NEW.status = 'ready' AND (TG_OP = 'INSERT'
            OR OLD.status NOT IN ('ready', 'running', 'throttled')
            OR (OLD.status = 'running' AND OLD.rate_interval IS NOT NULL))) IS NOT TRUE THEN
        RETURN NEW;
    END IF;
    NEW.limit_slot := NULL;
    IF TG_OP = 'UPDATE' OR (NEW.idempotency_key IS NULL AND NEW.unique_key IS NULL
                            AND NEW.schedule_id IS NULL) THEN
        IF TG_OP = 'INSERT' THEN
            PERFORM pgjobs_limit_slots(NEW.limit_key, NEW.limit_max);
        END IF;
        NEW.limit_slot := pgjobs_limit_take(NEW.limit_key, NEW.limit_max, NEW.id);
    END IF;
    IF NEW.limit_slot IS NULL THEN
        NEW.status := 'throttled';
    ELSIF NEW.rate_interval IS NOT NULL THEN
        next_at := pgjobs_rate_next(NEW.limit_key, NEW.rate_interval, NEW.rate_burst,
                                    NEW.rate_weight);
        IF next_at > clock_timestamp() THEN
            NEW.status := 'throttled';
            NEW.run_at := next_at;
            PERFORM pg_notify('pgjobs_rates',
                              extract(epoch FROM next_at - clock_timestamp())::text);
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION pgjobs_limit_parked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Its trigger's WHEN: throttled. A job with a key or a tick, which the INSERT's BEFORE
    -- trigger parked without taking a slot.
    IF (NEW.idempotency_key IS NOT NULL OR NEW.unique_key IS NOT NULL
            OR NEW.schedule_id IS NOT NULL) IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    PERFORM pgjobs_limit_slots(NEW.limit_key, NEW.limit_max);
    PERFORM pgjobs_limit_admit(NEW.limit_key, NEW.limit_max);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgjobs_limit_release() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    released text;
BEGIN
    -- Its trigger's WHEN: a held slot. A job that leaves the limit's statuses.
    IF (OLD.status IN ('ready', 'running', 'throttled')
            AND NEW.status NOT IN ('ready', 'running', 'throttled')) IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    IF OLD.rate_interval IS NULL THEN
        released := concat_ws(',', NULLIF(current_setting('pgjobs.released', true), ''),
                              OLD.id::text);
        IF length(released) < 1024 THEN
            PERFORM set_config('pgjobs.released', released, true);
        ELSE
            -- An UPDATE of thousands of jobs (an operator's bulk cancel): their slots are
            -- handed on in batches of one or two hundred, not noted in one ever longer text
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

CREATE OR REPLACE FUNCTION pgjobs_rate_start() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cost interval;
BEGIN
    -- Its trigger's WHEN: a rate. A job that starts, holding its slot.
    IF (OLD.status = 'ready' AND NEW.status = 'running'
            AND OLD.limit_slot IS NOT NULL) IS NOT TRUE THEN
        RETURN NEW;
    END IF;
    cost := make_interval(
        secs => NEW.rate_weight * pgjobs_rate_spacing(NEW.limit_key, NEW.rate_interval));
    INSERT INTO pgjobs_key_rate AS r (key, tat)
    VALUES (NEW.limit_key, NEW.claimed_at + cost)
    ON CONFLICT (key) DO UPDATE
    SET tat = GREATEST(r.tat, NEW.claimed_at) + cost;
    IF pgjobs_limit_hand_over(OLD.limit_key, OLD.limit_max, OLD.limit_slot, OLD.id) THEN
        PERFORM pg_notify('pgjobs', NEW.queue);
    END IF;
    NEW.limit_slot := NULL;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION pgjobs_dependency_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Its trigger's WHEN: jobs depend on it. A job that ends, other than by the resolution
    -- itself (reason 'dependency'), which its loop resolves.
    IF (NEW.status IN ('succeeded', 'dead', 'cancelled')
            AND OLD.status NOT IN ('succeeded', 'dead', 'cancelled')
            AND NEW.terminal_reason <> 'dependency') IS NOT TRUE THEN
        RETURN NULL;
    END IF;
    PERFORM pgjobs_dependencies_resolve(ARRAY[NEW.id], ARRAY[NEW.status::text]);
    RETURN NULL;
END
$$;
"""

SHORT_WHENS = """
DROP TRIGGER pgjobs_limit_park_insert ON pgjobs_job;
CREATE TRIGGER pgjobs_limit_park_insert BEFORE INSERT ON pgjobs_job FOR EACH ROW
    WHEN (NEW.limit_key IS NOT NULL) EXECUTE FUNCTION pgjobs_limit_park();
DROP TRIGGER pgjobs_limit_park_update ON pgjobs_job;
CREATE TRIGGER pgjobs_limit_park_update BEFORE UPDATE OF status ON pgjobs_job FOR EACH ROW
    WHEN (NEW.limit_key IS NOT NULL) EXECUTE FUNCTION pgjobs_limit_park();
DROP TRIGGER pgjobs_rate_start ON pgjobs_job;
CREATE TRIGGER pgjobs_rate_start BEFORE UPDATE OF status ON pgjobs_job FOR EACH ROW
    WHEN (OLD.rate_interval IS NOT NULL) EXECUTE FUNCTION pgjobs_rate_start();
DROP TRIGGER pgjobs_limit_parked ON pgjobs_job;
CREATE TRIGGER pgjobs_limit_parked AFTER INSERT ON pgjobs_job FOR EACH ROW
    WHEN (NEW.status = 'throttled') EXECUTE FUNCTION pgjobs_limit_parked();
DROP TRIGGER pgjobs_limit_release ON pgjobs_job;
CREATE TRIGGER pgjobs_limit_release AFTER UPDATE OF status ON pgjobs_job FOR EACH ROW
    WHEN (OLD.limit_slot IS NOT NULL) EXECUTE FUNCTION pgjobs_limit_release();
DROP TRIGGER pgjobs_dependency_ended ON pgjobs_job;
CREATE TRIGGER pgjobs_dependency_ended AFTER UPDATE OF status ON pgjobs_job FOR EACH ROW
    WHEN (NEW.has_dependents) EXECUTE FUNCTION pgjobs_dependency_ended();
"""

def _written(migration: str, text: str, head: str) -> str:
    """The statement that starts with ``head`` in migration ``migration``'s ``text``."""
    written = getattr(import_module(f"django_pgjobs.migrations.{migration}"), text)
    start = written.index(head)
    # A function ends at the first "$$;" after its body opens; a trigger at its first ";".
    end = (written.index("$$;", written.index("AS $$", start) + 5) + 3
           if head.startswith("CREATE FUNCTION") else written.index(";", start) + 1)
    return written[start:end]


def _function_before(migration: str, text: str, name: str) -> str:
    return "CREATE OR REPLACE" + _written(
        migration, text, f"CREATE FUNCTION {name}(").removeprefix("CREATE")


def _trigger_before(migration: str, text: str, name: str) -> str:
    return (f"DROP TRIGGER {name} ON pgjobs_job;\n"
            + _written(migration, text, f"CREATE TRIGGER {name} "))


# The triggers and their functions as migrations 0011, 0014 and 0017 left them.
WHOLE_WHENS = "\n".join([
    *(_trigger_before("0011_limits", "LIMITS", name) for name in (
        "pgjobs_limit_park_insert", "pgjobs_limit_park_update", "pgjobs_rate_start",
        "pgjobs_limit_parked", "pgjobs_limit_release")),
    _trigger_before("0014_workflows", "WORKFLOWS", "pgjobs_dependency_ended"),
])
UNGUARDED = "\n".join([
    *(_function_before("0011_limits", "LIMITS", name) for name in (
        "pgjobs_limit_park", "pgjobs_limit_parked", "pgjobs_rate_start")),
    import_module("django_pgjobs.migrations.0017_hand_over_plan")._release(
        1024, "one or two hundred"),
    _function_before("0014_workflows", "WORKFLOWS", "pgjobs_dependency_ended"),
])


class Migration(migrations.Migration):

    dependencies = [
        ("pgjobs", "0019_job_rules"),
    ]

    operations = [
        migrations.RunSQL(GUARDED + SHORT_WHENS, WHOLE_WHENS + UNGUARDED),
    ]
