from django.db import migrations

# The hand-over's slot rows are found by their key's index, one probe per freed slot, never by
# reading the slot table whole. Planned generically for ten rows, the UPDATE of the slots joined
# them by hashing every row of pgjobs_key_slot: 2,000 rows of 1,000 keys cost 250 us of a 400 us
# hand-over (docs/limits.md, "What it costs"). A hand-over writes at most a few thousand slots,
# for which probing is never the slower.
PLAN = """
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[])
    SET enable_hashjoin = off SET enable_mergejoin = off;
"""

UNDO_PLAN = """
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[]) RESET enable_hashjoin;
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[]) RESET enable_mergejoin;
"""


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0016_claim_hand_over'),
    ]

    operations = [
        migrations.RunSQL(PLAN, UNDO_PLAN),
    ]
