"""factory-boy factories for jobs in every state."""

from __future__ import annotations

import uuid
from datetime import timedelta

import factory
from django.utils import timezone

from django_pgjobs.models import Attempt, IdempotencyReceipt, Job, Schedule
from django_pgjobs.status import AttemptOutcome, JobStatus, ScheduleSource, TerminalReason


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    task = "demo.noop"
    queue = "default"
    payload = factory.Sequence(lambda n: {"n": n})
    status = JobStatus.READY
    priority = 0
    base_priority = factory.SelfAttribute("priority")
    max_attempts = 5
    lease_seconds = 30
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(days=1))

    class Params:
        scheduled = factory.Trait(
            status=JobStatus.SCHEDULED,
            run_at=factory.LazyFunction(lambda: timezone.now() + timedelta(hours=1)),
        )
        running = factory.Trait(
            status=JobStatus.RUNNING,
            attempts=1,
            lease_owner="factory-worker",
            lease_token=factory.LazyFunction(uuid.uuid4),
            lease_expires_at=factory.LazyFunction(lambda: timezone.now() + timedelta(seconds=30)),
            claimed_at=factory.LazyFunction(timezone.now),
            started_at=factory.LazyFunction(timezone.now),
        )
        retrying = factory.Trait(
            status=JobStatus.RETRYING,
            attempts=1,
            failure_class="transient",
            run_at=factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=5)),
        )
        succeeded = factory.Trait(
            status=JobStatus.SUCCEEDED,
            attempts=1,
            terminal_reason=TerminalReason.SUCCEEDED,
            finished_at=factory.LazyFunction(timezone.now),
        )
        dead = factory.Trait(
            status=JobStatus.DEAD,
            attempts=5,
            failure_class="permanent",
            terminal_reason=TerminalReason.PERMANENT_ERROR,
            last_error="ValueError: bad input",
            finished_at=factory.LazyFunction(timezone.now),
        )
        cancelled = factory.Trait(
            status=JobStatus.CANCELLED,
            terminal_reason=TerminalReason.OPERATOR,
            finished_at=factory.LazyFunction(timezone.now),
        )


class AttemptFactory(factory.django.DjangoModelFactory):
    """An attempt that ended (a running attempt has no row: its job is its record)."""

    class Meta:
        model = Attempt

    job = factory.SubFactory(JobFactory, succeeded=True)
    number = 1
    worker_id = "factory-worker"
    lease_token = factory.LazyFunction(uuid.uuid4)
    outcome = AttemptOutcome.SUCCEEDED
    reported_outcome = factory.SelfAttribute("outcome")
    finished_at = factory.LazyFunction(timezone.now)


class ReceiptFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = IdempotencyReceipt

    scope = "charge"
    key = factory.Sequence(lambda n: f"order:{n}")
    result = {"ok": True}
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(days=7))


class ScheduleFactory(factory.django.DjangoModelFactory):
    """An operator's schedule of ``tests.when`` every second, due now."""

    class Meta:
        model = Schedule

    name = factory.Sequence(lambda n: f"tests.schedule.{n}")
    task = "tests.when"
    cron = "* * * * * *"
    timezone = "UTC"
    payload = factory.Sequence(lambda n: {"schedule": n})
    source = ScheduleSource.ADMIN
    next_tick_at = factory.LazyFunction(lambda: timezone.now().replace(microsecond=0))
