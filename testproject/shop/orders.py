"""What the shop's views call: placing an order enqueues its charge in the same transaction."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction

from .jobs import charge, remind_unpaid
from .models import Order

REMIND_AFTER = timedelta(days=1)


def place_order(reference: str, amount_cents: int, *, email: str) -> Order:
    """Create the order and enqueue its charge and its reminder; all three commit together."""
    with transaction.atomic():
        order = Order.objects.create(reference=reference, amount_cents=amount_cents, email=email)
        charge.enqueue({"order_id": order.pk}, idempotency_key=f"charge:{reference}")
        remind_unpaid.enqueue({"order_id": order.pk}, delay=REMIND_AFTER)
    return order
