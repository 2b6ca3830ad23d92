"""Named SQL statements for what the ORM cannot say.

Each ``*.sql`` file in this folder holds blocks that start with a ``-- name: <name>`` line.
Parameters are always bound (``%s`` or ``%(name)s``); the only text ever spliced in is a whole
number the code chose (the claim's ``{limit}``), another block of these files (``{rows}``), a
lock's wait policy (``resealed_rows``) or an INSERT's conflict clause (``inserted_rows``),
never a value.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def _load_all() -> dict[str, str]:
    queries: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        parts = _BLOCK.split(entry.read_text(encoding="utf-8"))
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"SQL block {name!r} is defined twice")
            queries[name] = body.strip()
    return queries


def query(name: str) -> str:
    """Return the SQL text of the block called ``name``."""
    return _load_all()[name]


def resealed_rows(name: str, count: int) -> str:
    """The reseal block ``name`` for ``count`` rows: a batch skips rows another transaction
    holds (``SKIP LOCKED``), since waiting on one while holding others could close a deadlock
    cycle; a single row waits for its lock, which cannot."""
    return query(name).replace("{skip_locked}", "SKIP LOCKED" if count > 1 else "")


def inserted_rows(name: str, keyed: bool) -> str:
    """The INSERT block ``name`` for rows of which some (``keyed``) or none have a key or a tick.

    A row with an idempotency key, a unique key or a schedule tick may be refused by a unique
    index, and is then skipped (``ON CONFLICT DO NOTHING``) and read back by the caller. A row
    with none of them can conflict with nothing; without the clause PostgreSQL inserts it
    without the speculative insertion that checks every unique index first.
    """
    return query(name).replace("{on_conflict}", "ON CONFLICT DO NOTHING" if keyed else "")
