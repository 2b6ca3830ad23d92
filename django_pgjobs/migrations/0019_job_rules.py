from django.db import migrations, models

import django_pgjobs.models

# The job table's rules, checked by one PL/pgSQL function instead of nineteen CHECK constraints.
#
# PostgreSQL builds a table's CHECK expressions anew for every statement that writes it: it reads
# each one's stored tree and simplifies it before the first row. For pgjobs_job's nineteen (ten
# of the project's, nine that Django adds for its positive integer fields, most of them repeating
# a rule of the ten) that cost about 120 us a statement on PostgreSQL 15, whatever its rows:
# a third of the server's time for a single enqueue, and as much again for every claim and
# every settlement. A PL/pgSQL function's expression is planned once per session and kept; the
# table's one CHECK now only calls it, which costs a few microseconds more a row (a statement of
# a thousand rows gains nothing; one of one to fifty gains most of those 120 us).
#
# Each rule keeps its name: a row that breaks one is refused with check_violation naming it as
# a CHECK constraint of that name would (the first broken, in the order below). A rule whose
# expression is NULL passes, as in a CHECK constraint. The limits' values are those of
# django_pgjobs.validation (PRIORITY_MIN and PRIORITY_MAX, MAX_RUNNING_LIMIT) and the statuses
# those of status.JobStatus; tests/test_job_rules.py holds the two together.
RULES = """
CREATE FUNCTION pgjobs_job_rules(
    status varchar, priority smallint, base_priority smallint, attempts integer,
    max_attempts integer, snoozes integer, lease_seconds integer, payload_version smallint,
    lease_owner varchar, lease_token uuid, lease_expires_at timestamptz,
    finished_at timestamptz, timeout_seconds float8, schedule_id bigint,
    scheduled_at timestamptz, limit_key varchar, limit_max integer, limit_slot smallint,
    rate_interval float8, rate_burst integer, rate_weight integer,
    pending_dependencies integer
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN NOT (status IN ('pending', 'scheduled', 'throttled', 'ready', 'running',
                             'retrying', 'succeeded', 'dead', 'cancelled'))
            THEN 'pgjobs_job_status_valid'
        WHEN NOT (priority BETWEEN -100 AND 100 AND base_priority BETWEEN -100 AND 100)
            THEN 'pgjobs_job_priority_range'
        -- Only a running job holds a lease, and a running job holds a whole one.
        WHEN NOT (status = 'running' AND lease_token IS NOT NULL AND lease_owner IS NOT NULL
                      AND lease_expires_at IS NOT NULL
                  OR status <> 'running' AND lease_token IS NULL
                      AND lease_expires_at IS NULL)
            THEN 'pgjobs_job_lease_state'
        WHEN NOT (status NOT IN ('succeeded', 'dead', 'cancelled') OR finished_at IS NOT NULL)
            THEN 'pgjobs_job_terminal_finished'
        WHEN NOT (max_attempts >= 1 AND lease_seconds >= 1)
            THEN 'pgjobs_job_bounds'
        WHEN NOT (attempts >= 0 AND snoozes >= 0 AND payload_version >= 0 AND limit_slot >= 0
                  AND rate_burst >= 0)
            THEN 'pgjobs_job_counts'
        WHEN NOT (timeout_seconds IS NULL OR timeout_seconds > 0)
            THEN 'pgjobs_job_timeout_positive'
        WHEN NOT (limit_key IS NULL AND limit_max IS NULL
                  OR limit_key IS NOT NULL AND limit_max BETWEEN 1 AND 10000)
            THEN 'pgjobs_job_limit_pair'
        -- A rate's three columns come together, on a key of one slot.
        WHEN NOT (rate_interval IS NULL AND rate_burst IS NULL AND rate_weight IS NULL
                  OR limit_key IS NOT NULL AND limit_max = 1 AND rate_interval > 0
                      AND rate_weight >= 1 AND rate_burst >= rate_weight
                      AND rate_burst <= 10000)
            THEN 'pgjobs_job_rate_whole'
        WHEN NOT (status <> 'pending' OR pending_dependencies >= 1)
            THEN 'pgjobs_job_pending_waits'
        WHEN NOT ((schedule_id IS NULL) = (scheduled_at IS NULL))
            THEN 'pgjobs_job_tick_pair'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "pgjobs_job" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, TABLE = 'pgjobs_job';
    END IF;
    RETURN true;
END
$$;
"""
UNDO_RULES = "DROP FUNCTION pgjobs_job_rules"

# The columns the rules read, in the function's order.
RULE_COLUMNS = (
    "status", "priority", "base_priority", "attempts", "max_attempts", "snoozes",
    "lease_seconds", "payload_version", "lease_owner", "lease_token", "lease_expires_at",
    "finished_at", "timeout_seconds", "schedule", "scheduled_at", "limit_key", "limit_max",
    "limit_slot", "rate_interval", "rate_burst", "rate_weight", "pending_dependencies",
)

# The constraints the function replaces (Django's positive-integer checks go with their fields).
REPLACED = (
    "pgjobs_job_priority_range", "pgjobs_job_status_valid", "pgjobs_job_lease_state",
    "pgjobs_job_terminal_finished", "pgjobs_job_bounds", "pgjobs_job_timeout_positive",
    "pgjobs_job_limit_pair", "pgjobs_job_rate_whole", "pgjobs_job_pending_waits",
    "pgjobs_job_tick_pair",
)

# The positive integer fields, made plain: their "not below 0" is a rule above, or implied by one.
PLAIN_INTEGERS = (
    ("payload_version", models.SmallIntegerField(default=1)),
    ("attempts", models.IntegerField(default=0)),
    ("max_attempts", models.IntegerField()),
    ("snoozes", models.IntegerField(default=0)),
    ("lease_seconds", models.IntegerField()),
    ("limit_max", models.IntegerField(blank=True, null=True)),
    ("limit_slot", models.SmallIntegerField(blank=True, null=True)),
    ("rate_burst", models.IntegerField(blank=True, null=True)),
    ("rate_weight", models.IntegerField(blank=True, null=True)),
)


class Migration(migrations.Migration):

    dependencies = [
        ("pgjobs", "0018_success_on_the_job"),
    ]

    operations = [
        migrations.RunSQL(RULES, UNDO_RULES),
        *(migrations.RemoveConstraint(model_name="job", name=name) for name in REPLACED),
        *(migrations.AlterField(model_name="job", name=name, field=field)
          for name, field in PLAIN_INTEGERS),
        migrations.AddConstraint(
            model_name="job",
            constraint=django_pgjobs.models.RulesCheck(
                condition=models.Func(*(models.F(c) for c in RULE_COLUMNS),
                                      function="pgjobs_job_rules",
                                      output_field=models.BooleanField()),
                name="pgjobs_job_rules",
            ),
        ),
    ]
