"""The demo's business data: orders, and a ledger of side effects that handlers perform."""

from django.db import models


class Order(models.Model):
    reference = models.CharField(max_length=64, unique=True)
    amount_cents = models.PositiveIntegerField()
    charged = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.reference


class LedgerEntry(models.Model):
    """One row per time a handler performed a side effect (the effect we count duplicates of)."""

    kind = models.CharField(max_length=32)
    key = models.CharField(max_length=255)
    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["kind", "key"])]

    def __str__(self) -> str:
        return f"{self.kind}:{self.key}"
