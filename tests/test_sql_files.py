"""The SQL files keep one owner per table: every statement that writes a table is in that
table's file, and one module runs the file's writes (docs/architecture.md, "Where the SQL is")."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import django_pgjobs

PACKAGE = Path(django_pgjobs.__file__).parent
BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
WRITE = re.compile(r"\b(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(pgjobs_\w+)", re.IGNORECASE)

# Each table's writes: the files that may hold them, and the module that runs each file.
OWNERS = {
    "pgjobs_job": {"jobs.sql": "transitions.py"},
    "pgjobs_attempt": {"jobs.sql": "transitions.py"},
    "pgjobs_dependency": {"jobs.sql": "transitions.py"},
    "pgjobs_receipt": {"receipts.sql": "receipts.py"},
    "pgjobs_schedule": {"schedules.sql": "schedules.py"},
    "pgjobs_key_slot": {"limits.sql": "transitions.py"},
    "pgjobs_worker": {"workers.sql": "workers.py"},
    "pgjobs_queue_sample": {"history.sql": "history.py"},
}


def blocks() -> dict[str, tuple[str, str]]:
    """Every named block: its file and its text without comments."""
    found = {}
    for entry in resources.files("django_pgjobs.sql").iterdir():
        if entry.name.endswith(".sql"):
            parts = BLOCK.split(entry.read_text(encoding="utf-8"))
            for name, body in zip(parts[1::2], parts[2::2], strict=True):
                found[name] = (entry.name, re.sub(r"--[^\n]*", "", body))
    return found


def callers(name: str) -> set[str]:
    """The package's modules that run the block called ``name``."""
    needles = (f'query("{name}")', f'resealed_rows("{name}"', f'inserted_rows("{name}"')
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
            if any(needle in p.read_text() for needle in needles)}


def test_every_write_is_in_its_tables_file_and_run_by_its_module() -> None:
    written = 0
    for name, (file, text) in blocks().items():
        for table in set(WRITE.findall(text)):
            owners = OWNERS.get(table)
            assert owners is not None, f"{name} in {file} writes {table}, which has no owner"
            assert file in owners, f"{name} writes {table} but is in {file}, not {set(owners)}"
            assert callers(name) == {owners[file]}, (name, callers(name))
            written += 1
    # The claim, the settle (job and attempt), heartbeats, promotions, aging, the prune (job and
    # attempt), the enqueue, receipts and schedules: the check has something to check.
    assert written >= 15


def test_the_check_finds_a_write_outside_its_tables_file() -> None:
    text = "-- name: stray\nUPDATE pgjobs_job SET status = 'ready'"
    parts = BLOCK.split(text)
    [table] = WRITE.findall(re.sub(r"--[^\n]*", "", parts[2]))
    assert table == "pgjobs_job" and "stray.sql" not in OWNERS[table]
