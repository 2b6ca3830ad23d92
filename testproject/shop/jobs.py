"""The shop's handlers (discovered at start-up like any app's jobs module)."""

from __future__ import annotations

from typing import Any

from django.core.mail import send_mail

from django_pgjobs import Permanent, job
from django_pgjobs.context import JobContext

from . import gateway
from .models import Order
from .tasks import send_receipt


@job("shop.charge", queue="billing", max_attempts=5)
def charge(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Charge the order once (a receipt guards the provider call), then send its receipt."""
    order = Order.objects.get(pk=payload["order_id"])
    if order.amount_cents == 0:
        raise Permanent(f"order {order.reference} has nothing to charge")
    with ctx.receipt("shop.charge", key=f"order:{order.pk}") as receipt:
        if receipt.done:
            return receipt.result
        charge_id = gateway.charge_card(order.reference, order.amount_cents,
                                        idempotency_key=receipt.key)
        Order.objects.filter(pk=order.pk).update(charged=True, charge_id=charge_id)
        receipt.result = {"charge_id": charge_id}
    send_receipt.enqueue(order.pk)
    return receipt.result


@job("shop.remind_unpaid")
def remind_unpaid(ctx: JobContext, payload: dict[str, Any]) -> bool:
    """A day after the order, remind the customer if it is still not charged."""
    order = Order.objects.get(pk=payload["order_id"])
    if order.charged:
        return False
    send_mail(f"Your order {order.reference}", "We could not charge your card yet.",
              "shop@example.com", [order.email])
    return True
