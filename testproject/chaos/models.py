"""The failure harness's ledger: every run of a handler and every side effect it performed.

Times come from the database clock (``Now()`` is the statement's timestamp), the same clock the
queue uses for claims, leases and settlements, so the harness can compare them.
"""

from django.db import models
from django.db.models.functions import Now


class Run(models.Model):
    """One execution of a harness handler: who ran which attempt, from when to when."""

    class Stage(models.TextChoices):
        STARTED = "started", "started"
        # Holding still at the point the payload named, so the harness can strike.
        HOLDING = "holding", "holding"
        FINISHED = "finished", "finished"

    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    # Joins the run to its Attempt row: attempt numbers repeat after a release or a snooze.
    lease_token = models.UUIDField()
    task = models.CharField(max_length=100)
    worker_id = models.CharField(max_length=200)
    pid = models.IntegerField()
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.STARTED)
    started_at = models.DateTimeField(db_default=Now())
    # NULL when the run never returned: killed, stopped for good, or its handler raised.
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job_id", "stage"], name="chaos_run_job_stage_idx")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on {self.worker_id} ({self.stage})"


class Effect(models.Model):
    """One side effect performed; a key seen twice is a duplicate."""

    key = models.CharField(max_length=100)
    # True when the effect was written under an idempotency receipt, in its transaction.
    receipted = models.BooleanField()
    job_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        indexes = [models.Index(fields=["key"], name="chaos_effect_key_idx")]

    def __str__(self) -> str:
        return f"{self.key} by job {self.job_id} attempt {self.attempt}"
