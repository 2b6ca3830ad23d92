"""The shop's django.tasks task: a receipt by email, once the order is charged."""

from __future__ import annotations

from django.core.mail import send_mail

try:
    from django.tasks import task
except ImportError:  # Django < 6: the django-tasks backport
    from django_tasks import task

from .models import Order


@task(queue_name="emails")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    send_mail(f"Receipt for {order.reference}", f"We charged {order.amount_cents} cents.",
              "shop@example.com", [order.email])
    Order.objects.filter(pk=order_id).update(receipt_sent=True)
    return "sent"
