"""The shop's data: orders, charged once and sent a receipt."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, unique=True)
    email = models.EmailField()
    amount_cents = models.PositiveIntegerField()
    charged = models.BooleanField(default=False)
    charge_id = models.CharField(max_length=64, blank=True, default="")
    receipt_sent = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.reference
