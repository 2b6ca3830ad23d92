"""Candidate changes to the hot path, measured without touching the library's code.

A worker started with ``BENCH_EXPERIMENT=<name>`` (see ``bench.apps``) runs with the named
change patched in, so ``bench.run`` can drain the same jobs with and without it, interleaved.
These are measurements for whoever changes the library, not alternatives to ship from here.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any


def transaction_not_carried(connection: Any, raw: Any) -> bool:
    """The claim's block as psycopg runs it alone: BEGIN and COMMIT a round trip each.

    Drained next to the code as it is, it prices the transaction the claim's message carries.
    """
    return False


@functools.cache
def claim_statement_without_pause(limit: int) -> Any:
    """The claim's statement as it was before paused queues: no probe of ``pgjobs_queue``.

    Drained next to the code as it is, it prices the pause check the claim carries.
    """
    from django_pgjobs import prepared, sql

    text = sql.query("claim_jobs").replace("{limit}", str(limit))
    pause = re.compile(r"NOT EXISTS\(SELECT 1 AS \"a\" FROM \"pgjobs_queue\".*?LIMIT 1\)\s*AND ",
                       re.DOTALL)
    unpaused, found = pause.subn("", text)
    if found != 1:
        raise RuntimeError("experiment claim_without_pause: the claim's pause check moved")
    return prepared.Statement(f"claimnopause{limit}", unpaused, same_values=True)


# Each experiment is the patches it applies: (module, attribute, replacement).
EXPERIMENTS = {
    "claim_begin_commit_apart": (
        ("django_pgjobs.prepared", "_carries_its_transaction", transaction_not_carried),
    ),
    "claim_without_pause": (
        ("django_pgjobs.transitions", "claim_statement", claim_statement_without_pause),
    ),
}


def apply_from_environment() -> None:
    """Patch in the experiment BENCH_EXPERIMENT names, if any."""
    name = os.environ.get("BENCH_EXPERIMENT")
    if not name:
        return
    import importlib

    for module_name, attribute, replacement in EXPERIMENTS[name]:
        module = importlib.import_module(module_name)
        if not hasattr(module, attribute):
            raise RuntimeError(f"experiment {name}: {module_name}.{attribute} no longer exists")
        setattr(module, attribute, replacement)
