"""Idempotency receipts: a side effect that must not repeat is recorded once per (scope, key).

The receipt row commits in the same transaction as the handler's local database side effect, so
either both happen or neither does. Held by a job, the block commits only while that job still
holds its lease: its last statement locks the job's row and checks the token, and a worker that
lost the lease inside the block (it stalled past it, the job timed out or was cancelled) rolls
the block back with ``LeaseLost``, so a stale holder's local side effects never commit.

For an external provider, pass ``receipt.key`` as the provider's idempotency key and store its
response as ``receipt.result``: a retry after an ambiguous outcome finds the receipt done and
replays the stored result instead of calling again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from . import encryption, sql
from .conf import settings
from .exceptions import LeaseLost
from .payloads import encode_json
from .validation import KEY_MAX_LENGTH, RECEIPT_SCOPE_MAX_LENGTH

_UNSET = object()


class Receipt:
    """What a handler sees inside ``ctx.receipt(...)``."""

    def __init__(self, scope: str, key: str, *, done: bool, result: Any,
                 encrypted: tuple[str, ...] = ()) -> None:
        self.scope = scope
        self.key = key
        self.done = done
        self.encrypted = encrypted
        self._result = result
        self._new_result: Any = _UNSET
        self._stored: str | None = None

    @property
    def result(self) -> Any:
        return self._result if self._new_result is _UNSET else self._new_result

    @result.setter
    def result(self, value: Any) -> None:
        if self.done:
            raise RuntimeError(f"receipt {self.scope}:{self.key} is already done")
        # Refused before the effect commits: not JSON, or a declared encrypted path missing.
        self._stored = _encode(encryption.seal(value, self.encrypted, where=encryption.RECEIPT,
                                               owner=self.scope))
        self._new_result = value

    def __repr__(self) -> str:
        return f"<Receipt {self.scope}:{self.key} done={self.done}>"


def _encode(result: Any) -> str:
    return encode_json(result, root="receipt result", limit=settings.MAX_PAYLOAD_BYTES,
                       max_depth=settings.MAX_PAYLOAD_DEPTH)


@contextmanager
def receipt(
    scope: str,
    key: str,
    *,
    job_id: int | None = None,
    lease_token: uuid.UUID | None = None,
    retention_seconds: float | None = None,
    encrypted: Iterable[str] = (),
    using: str = DEFAULT_DB_ALIAS,
) -> Iterator[Receipt]:
    """Hold the receipt for ``(scope, key)`` for the block, in one transaction.

    When ``receipt.done`` is true the effect already happened (``receipt.result`` is what it
    returned); otherwise perform it and set ``receipt.result``. An exception in the block rolls
    back the receipt together with the block's own database writes. ``encrypted`` names paths
    of the result stored encrypted (docs/security.md); a done receipt's result is decrypted.
    """
    paths = encryption.checked_paths(encrypted, f"receipt {scope!r}")
    if not scope or not key or len(scope) > RECEIPT_SCOPE_MAX_LENGTH or len(key) > KEY_MAX_LENGTH:
        raise ValueError(f"receipt scope (<= {RECEIPT_SCOPE_MAX_LENGTH} chars) and key "
                         f"(<= {KEY_MAX_LENGTH} chars) must be non-empty")
    retention = (
        settings.RECEIPT_RETENTION_SECONDS if retention_seconds is None else retention_seconds
    )
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(sql.query("take_receipt"), [scope, key, job_id, float(retention)])
        row = cursor.fetchone()
        if row is not None:
            receipt_id = row[0]
            held = Receipt(scope, key, done=False, result=None, encrypted=paths)
        else:
            cursor.execute(sql.query("read_receipt"), [scope, key])
            receipt_id, stored = cursor.fetchone()
            value = json.loads(stored) if isinstance(stored, str) else stored
            value = encryption.opened(value, paths, where=encryption.RECEIPT, owner=scope)
            held = Receipt(scope, key, done=True, result=value, encrypted=paths)
        yield held
        if not held.done and held._new_result is not _UNSET:
            cursor.execute(
                sql.query("record_receipt_result"),
                [held._stored, receipt_id],
            )
        if job_id is not None and lease_token is not None:
            # Locked until this transaction ends, so the lease cannot pass to another attempt
            # between the check and the commit (the rescue step and settle wait for it).
            cursor.execute(sql.query("lease_still_held"), [job_id, lease_token])
            if cursor.fetchone() is None:
                raise LeaseLost(f"job {job_id}: lease lost inside receipt {scope}:{key}; the "
                                "block was rolled back")


def delete_expired_receipts(limit: int, *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Delete up to ``limit`` receipts past their expiry, oldest first; return how many."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("prune_receipts"), {"limit": limit})
        return cursor.rowcount


def receipts_to_reseal(after: int, limit: int, *, using: str) -> list[tuple[Any, ...]]:
    """(id, scope, sealed, result) of the next ``limit`` receipts after id ``after``; the result
    as the row's text, and None unless ``sealed`` (it holds an encrypted value)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("receipts_to_reseal"), {"after": after, "limit": limit})
        return [(i, scope, sealed, result if sealed else None)
                for i, scope, sealed, result in cursor.fetchall()]


def reseal_receipts(rows: list[dict[str, Any]], *, using: str) -> set[int]:
    """Write each receipt's new ``result`` (JSON text) where it still holds the text
    ``was_result``; the ids written (``sql.resealed_rows``: a batch skips held rows)."""
    with connections[using].cursor() as cursor:
        cursor.execute(sql.resealed_rows("reseal_receipts", len(rows)), {"rows": json.dumps(rows)})
        return {row[0] for row in cursor.fetchall()}
