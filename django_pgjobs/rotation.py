"""Key rotation: every encrypted value sealed again under the first key, batch by batch.

``PGJOBS_ENCRYPTION_KEYS`` lists the new key first and keeps the old ones, so every process
seals with the new key and still opens the old values; ``rotate_keys`` then walks the job and
receipt tables in id order, one bounded window per statement, and writes each value sealed
under another key again. Workers keep running: a write lands only where the row still holds what
was read (a worker that settled a job in between wrote its result, which the next pass reads and
seals again), so nothing a worker wrote is lost. A window's write skips the rows another
transaction holds (a worker settling a batch of jobs in its own order: waiting on one of them
while holding others could close a deadlock cycle), then writes each of those alone, waiting
for it. Once the pass ends with nothing left under an old key, the old key can go.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import encryption, receipts, transitions
from .exceptions import RotationStalled, Undecryptable

# How often in a row one window is read again and nothing in it could be written, because
# each row changed after it was read, before giving up.
WINDOW_PASSES = 10


@dataclass
class Rotation:
    """What one pass did."""

    rows_read: int = 0
    rows_written: int = 0
    values_resealed: int = 0
    # Rows whose values do not open under any configured key: (table, id, why).
    unopened: list[tuple[str, int, str]] = field(default_factory=list)


def rotate_keys(*, batch: int, using: str,
                progress: Callable[[str, int], None] | None = None) -> Rotation:
    """Seal every encrypted value of jobs and receipts under the first key; say what was done."""
    rotation = Rotation()
    encryption.keyring()  # EncryptionNotConfigured before anything is read
    for table in ("job", "receipt"):
        after = 0
        passes = 0
        while window := _window(table, after, batch, using):
            pending = _resealed_rows(table, window, rotation)
            written = _write(table, pending, using) if pending else set()
            for row_id in pending.keys() - written:  # held by another transaction, or changed
                written |= _write(table, {row_id: pending[row_id]}, using)
            rotation.rows_written += len(written)
            rotation.values_resealed += sum(n for row_id, (_, n) in pending.items()
                                            if row_id in written)
            if len(written) < len(pending):
                # Rows changed since they were read (a worker settled a job): the window is
                # read again, and what is sealed under the first key now is left alone.
                passes = 0 if written else passes + 1
                if passes < WINDOW_PASSES:
                    continue
                raise RotationStalled(f"pgjobs_{table} rows after id {after} changed each time "
                                      f"they were read, {WINDOW_PASSES} times in a row")
            passes = 0
            rotation.rows_read += len(window)
            after = window[-1][0]
            if progress is not None:
                progress(table, after)
    return rotation


def stale_values(*, batch: int, using: str) -> dict[str, int]:
    """How many encrypted values each key other than the first still seals, by key id."""
    primary = encryption.keyring().primary
    counts: dict[str, int] = {}
    for table in ("job", "receipt"):
        after = 0
        while window := _window(table, after, batch, using):
            for row in window:
                for text in row[3:]:
                    for _, key in encryption.envelopes(_parsed(text)):
                        if key != primary:
                            counts[key] = counts.get(key, 0) + 1
            after = window[-1][0]
    return counts


def _window(table: str, after: int, batch: int, using: str) -> list[tuple[Any, ...]]:
    if table == "job":
        return transitions.jobs_to_reseal(after, batch, using=using)
    return receipts.receipts_to_reseal(after, batch, using=using)


def _resealed_rows(table: str, window: list[tuple[Any, ...]],
                   rotation: Rotation) -> dict[int, tuple[dict[str, Any], int]]:
    """The rows of ``window`` holding a value under an old key: each row to write, and how many
    values it seals again, by id."""
    wheres = (encryption.PAYLOAD, encryption.RESULT) if table == "job" else (encryption.RECEIPT,)
    rows = {}
    for row_id, owner, sealed, *texts in window:
        if not sealed:
            continue
        try:
            done = [encryption.resealed(_parsed(text), where=where, owner=owner)
                    for text, where in zip(texts, wheres, strict=True)]
        except Undecryptable as exc:
            if (table, row_id, str(exc)) not in rotation.unopened:
                rotation.unopened.append((table, row_id, str(exc)))
            continue
        count = sum(n for _, n in done)
        if not count:
            continue
        # None: the column is left as it is (so a JSON null stays a JSON null).
        new = [_written(value) if n else None for value, n in done]
        if table == "job":
            row = {"id": row_id, "payload": new[0], "result": new[1],
                   "was_payload": texts[0], "was_result": texts[1]}
        else:
            row = {"id": row_id, "result": new[0], "was_result": texts[0]}
        rows[row_id] = (row, count)
    return rows


class _Number(str):
    """A number as the row's text wrote it: written back the same, never through a float."""


def _parsed(text: str | None) -> Any:
    return None if text is None else json.loads(text, parse_float=_Number, parse_int=_Number)


def _written(value: Any) -> str:
    """``value`` as JSON text, its numbers as they were read (``_Number``)."""
    if type(value) is _Number:
        return str.__str__(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_written(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(map(_written, value)) + "]"
    return json.dumps(value, ensure_ascii=False)


def _write(table: str, pending: dict[int, tuple[dict[str, Any], int]], using: str) -> set[int]:
    rows = [row for row, _ in pending.values()]
    if table == "job":
        return transitions.reseal_jobs(rows, using=using)
    return receipts.reseal_receipts(rows, using=using)


__all__ = ["Rotation", "rotate_keys", "stale_values"]
