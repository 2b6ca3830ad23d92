"""Candidate changes to the hot path, measured without touching the library's code.

A worker started with ``BENCH_EXPERIMENT=<name>`` (see ``bench.apps``) runs with the named
change patched in, so ``bench.run`` can drain the same jobs with and without it, interleaved.
These are measurements for whoever changes the library, not alternatives to ship from here.
"""

from __future__ import annotations

import os
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction


def claim_in_autocommit(
    worker_id: str, queue: str, limit: int, *, using: str = DEFAULT_DB_ALIAS
) -> list[Any]:
    """``claim_jobs`` without its BEGIN and COMMIT: the claim is one statement, atomic alone.

    Django only compiles the locking subquery inside a transaction, so the first claim of each
    batch size compiles it in one; every later claim sends the cached text in autocommit.
    """
    from django_pgjobs import transitions
    from django_pgjobs.claimed import claimed_jobs

    key = (using, limit)
    if key not in transitions._claim_sql_cache:
        with transaction.atomic(using=using):
            transitions._claim_statement(using, limit)
    claim_sql, params, queue_at = transitions._claim_sql_cache[key]
    params = [*params, worker_id]
    params[queue_at] = queue
    with connections[using].cursor() as cursor:
        cursor.execute(claim_sql, params)
        columns = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    return claimed_jobs(columns, rows)


EXPERIMENTS = {
    "claim_autocommit": ("django_pgjobs.worker.core", "claim_jobs", claim_in_autocommit),
}


def apply_from_environment() -> None:
    """Patch in the experiment BENCH_EXPERIMENT names, if any."""
    name = os.environ.get("BENCH_EXPERIMENT")
    if not name:
        return
    import importlib

    module_name, attribute, replacement = EXPERIMENTS[name]
    module = importlib.import_module(module_name)
    if not hasattr(module, attribute):
        raise RuntimeError(f"experiment {name}: {module_name}.{attribute} no longer exists")
    setattr(module, attribute, replacement)
