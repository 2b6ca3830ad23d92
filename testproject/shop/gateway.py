"""A stand-in payment provider: what the shop's charge job calls (tests replace it)."""

from __future__ import annotations

import hashlib


class GatewayUnavailable(ConnectionError):
    """The provider did not answer (a connection error: django-pgjobs retries it)."""


def charge_card(reference: str, amount_cents: int, *, idempotency_key: str) -> str:
    """Charge ``amount_cents`` for order ``reference``; return the provider's charge id."""
    return "ch_" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
