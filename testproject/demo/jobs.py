"""Demo handlers: each shows one behaviour of the queue."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.utils import timezone

from django_pgjobs import Limit, Permanent, Rate, RateLimited, Transient, job
from django_pgjobs.context import JobContext

from .models import LedgerEntry, Order


def _ledger(ctx: JobContext, kind: str, key: str, started: Any) -> None:
    LedgerEntry.objects.create(
        kind=kind, key=key, job_id=ctx.job_id, attempt=ctx.attempt, worker_id=ctx.worker_id,
        started_at=started,
    )


@job("demo.noop")
def noop(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Succeed at once."""
    return {"n": payload.get("n")}


@job("demo.work", lease=timedelta(seconds=3))
def work(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Sleep a little and write an unreceipted side effect (duplicates show in the ledger)."""
    started = timezone.now()
    time.sleep(payload.get("sleep", 0.01))
    _ledger(ctx, "work", str(payload["n"]), started)


@job("demo.flaky", max_attempts=5, lease=timedelta(seconds=3))
def flaky(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Fail transiently on the first ``failures`` attempts, then succeed."""
    if ctx.attempt <= payload.get("failures", 1):
        raise Transient(f"upstream timed out (attempt {ctx.attempt})")
    return "ok"


@job("demo.invalid")
def invalid(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Reject bad input: a permanent failure, dead at once."""
    raise ValidationError(f"order {payload.get('order')!r} has no line items")


@job("demo.charge", lease=timedelta(seconds=3))
def charge(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Charge an order exactly once: the ledger row and the receipt commit together."""
    order = Order.objects.get(pk=payload["order_id"])
    started = timezone.now()
    with ctx.receipt("charge", key=f"order:{order.pk}") as receipt:
        if receipt.done:
            return receipt.result
        time.sleep(payload.get("sleep", 0.0))
        _ledger(ctx, "charge", str(order.pk), started)
        Order.objects.filter(pk=order.pk).update(charged=True)
        receipt.result = {"charged_cents": order.amount_cents}
    return receipt.result


@job("demo.long", lease=timedelta(seconds=2), heartbeat=True)
def long_running(ctx: JobContext, payload: dict[str, Any]) -> str:
    """Run longer than the lease; heartbeats keep it owned."""
    deadline = time.monotonic() + payload.get("seconds", 3)
    while time.monotonic() < deadline:
        if ctx.lease_lost:
            raise Transient("lease lost; stopping")
        time.sleep(0.05)
    return "done"


@job("demo.poison", max_attempts=3, lease=timedelta(seconds=2))
def poison(ctx: JobContext, payload: dict[str, Any]) -> None:
    """Kill the worker process that runs it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)


@job("demo.bad_return")
def bad_return(ctx: JobContext, payload: dict[str, Any]) -> object:
    """Return something that is not JSON."""
    return object()


@job("demo.permission")
def permission(ctx: JobContext, payload: dict[str, Any]) -> None:
    raise Permanent("the API key was revoked")


@job("demo.tick", lease=timedelta(seconds=10))
def tick(ctx: JobContext, payload: dict[str, Any]) -> str | None:
    """A schedule's job: record which tick ran, after sleeping as long as asked."""
    started = timezone.now()
    time.sleep(payload.get("sleep", 0.0))
    tick_at = ctx.scheduled_at.isoformat() if ctx.scheduled_at else "-"
    _ledger(ctx, "tick", f"{payload.get('schedule', '-')}@{tick_at}", started)
    return tick_at


@job("demo.upgraded", version=2)
def upgraded(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Take version 2 payloads; version 1 ones are upgraded first (and the upgrade may fail)."""
    return {"account": payload["account"]}


@upgraded.upgrade(from_version=1)
def _upgraded_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    if "account_id" not in payload:
        raise ValueError(f"cannot upgrade {payload!r}: no account_id")
    return {"account": payload["account_id"], "password": payload.get("password")}


@job("demo.process_effects", lease=timedelta(seconds=30), isolation="process")
def process_effects(ctx: JobContext, payload: dict[str, Any]) -> str:
    """In a child process, write ledger rows one after another, ``count`` in all."""
    started = timezone.now()
    for n in range(payload.get("count", 1000)):
        _ledger(ctx, "process_effect", f"{ctx.job_id}:{n}", started)
        time.sleep(payload.get("every", 0.05))
    return "done"


@job("demo.sleep_process", timeout=1.0, max_attempts=1, isolation="process")
def sleep_process(ctx: JobContext, payload: dict[str, Any]) -> int:
    """In a child process, sleep as long as asked (past the 1 s timeout, if asked), then say
    which process ran it."""
    time.sleep(payload.get("seconds", 0.0))
    return os.getpid()


@job("demo.export", lease=timedelta(seconds=2), limit=Limit(1, key=lambda p: p["customer"]))
def export(ctx: JobContext, payload: dict[str, Any]) -> float:
    """One export per customer at a time, however many workers run: sleeps ``seconds``."""
    time.sleep(payload.get("seconds", 0.05))
    return payload.get("seconds", 0.05)


@job("demo.call_provider", limit=Rate(20, per=1, key=lambda p: p["provider"]))
def call_provider(ctx: JobContext, payload: dict[str, Any]) -> None:
    """A call to a payment provider that takes at most 20 a second: the rate is the
    provider's, whichever workers run the calls."""
    if payload.get("retry_after") is not None:
        raise RateLimited(retry_after=payload["retry_after"])


@job("demo.card_payment", encrypted=["card.number"], encrypted_result=["authorization"])
def card_payment(ctx: JobContext, payload: dict[str, Any]) -> dict[str, Any]:
    """Charge a card whose number is stored encrypted, and store the authorization so too."""
    number = payload["card"]["number"]
    if not number.isdigit():
        raise Permanent("the card number is not a number")
    time.sleep(payload.get("sleep", 0))
    return {"authorization": f"auth-{number[-4:]}-{payload['order']}", "order": payload["order"]}
