"""Candidate changes to the hot path, measured without touching the library's code.

A worker started with ``BENCH_EXPERIMENT=<name>`` (see ``bench.apps``) runs with the named
change patched in, so ``bench.run`` can drain the same jobs with and without it, interleaved.
These are measurements for whoever changes the library, not alternatives to ship from here.
"""

from __future__ import annotations

import os
from typing import Any


def transaction_not_carried(connection: Any, raw: Any) -> bool:
    """The claim's block as psycopg runs it alone: BEGIN and COMMIT a round trip each.

    Drained next to the code as it is, it prices the transaction the claim's message carries.
    """
    return False


def claim_statement_without_pause(
    using: str, limit: int
) -> tuple[str, list[Any], tuple[int, ...]]:
    """The claim's statement as it was before paused queues: no probe of ``pgjobs_queue``.

    Drained next to the code as it is, it prices the pause check the claim carries.
    """
    from django_pgjobs import sql, transitions
    from django_pgjobs.models import Job
    from django_pgjobs.status import JobStatus

    key = (using, limit)
    cached = _unpaused_claim_cache.get(key)
    if cached is None:
        candidates = (
            Job.objects.using(using)
            .select_for_update(skip_locked=True)
            .filter(status=JobStatus.READY, queue=transitions._QUEUE_SENTINEL)
            .order_by("-priority", "run_at", "id")
            .values("id")[:limit]
        )
        candidates_sql, params = candidates.query.get_compiler(using=using).as_sql()
        text = sql.query("claim_jobs").replace("{candidates}", candidates_sql)
        queue_at = tuple(i for i, p in enumerate(params) if p == transitions._QUEUE_SENTINEL)
        cached = (text, list(params), queue_at)
        _unpaused_claim_cache[key] = cached
    return cached


_unpaused_claim_cache: dict[tuple[str, int], tuple[str, list[Any], tuple[int, ...]]] = {}


# Each experiment is the patches it applies: (module, attribute, replacement).
EXPERIMENTS = {
    "claim_begin_commit_apart": (
        ("django_pgjobs.prepared", "_carries_its_transaction", transaction_not_carried),
    ),
    "claim_without_pause": (
        ("django_pgjobs.transitions", "_claim_statement", claim_statement_without_pause),
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
