from importlib import import_module

from django.db import migrations

# Two costs of the statement-level hand-over of migration 0016 (docs/limits.md, "What it costs").
#
# - Its slot rows are found by their key's index, one probe per freed slot, never by reading the
#   slot table whole. Planned generically for ten rows, the UPDATE of the slots joined them by
#   hashing every row of pgjobs_key_slot: 2,000 rows of 1,000 keys cost 250 us of a 400 us
#   hand-over.
# - An UPDATE that ends the runs of many slot holders (an operator's bulk cancel) hands their
#   slots on in batches of 1,024 characters of ids (one or two hundred jobs), not of 16,384. The
#   plan pairs each freed slot with its key's next job by reading all of the batch's waiting
#   jobs, a cost that grows with the square of the batch: cancelling 20,000 holders took 6.9 s
#   in batches of about 2,300, and takes 1.3 s now.
PLAN = """
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[])
    SET enable_hashjoin = off SET enable_mergejoin = off;
"""

UNDO_PLAN = """
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[]) RESET enable_hashjoin;
ALTER FUNCTION pgjobs_limit_hand_over_many(bigint[]) RESET enable_mergejoin;
"""


def _release(batch_text: int, batches: str) -> str:
    """Migration 0016's pgjobs_limit_release, flushing its noted releases at ``batch_text``
    characters of ids (``batches`` says how many ids that is)."""
    hand_over = import_module("django_pgjobs.migrations.0016_claim_hand_over").HAND_OVER
    start = hand_over.index("CREATE OR REPLACE FUNCTION pgjobs_limit_release(")
    end = hand_over.index("$$;", hand_over.index("AS $$", start)) + 3
    function = hand_over[start:end]
    for was, now in (("length(released) < 16384", f"length(released) < {batch_text}"),
                     ("in batches of a few thousand", f"in batches of {batches}")):
        if was not in function:
            raise ValueError(f"migration 0016's pgjobs_limit_release has no {was!r}")
        function = function.replace(was, now)
    return function


class Migration(migrations.Migration):

    dependencies = [
        ('pgjobs', '0016_claim_hand_over'),
    ]

    operations = [
        migrations.RunSQL(PLAN, UNDO_PLAN),
        migrations.RunSQL(_release(1024, "one or two hundred"),
                          _release(16384, "a few thousand")),
    ]
