"""Handlers the in-process tests use (registered at import, like an app's jobs module)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from django.db import connection

from django_pgjobs import (
    Limit,
    Permanent,
    Rate,
    RateLimited,
    RetryAfter,
    Snooze,
    Transient,
    job,
)
from django_pgjobs.context import JobContext

events: list[tuple[str, Any]] = []
gate = threading.Event()


@job("tests.ok")
def ok(ctx: JobContext, payload: Any) -> Any:
    events.append(("ok", payload))
    return {"echo": payload}


@job("tests.transient", max_attempts=3)
def transient(ctx: JobContext, payload: Any) -> None:
    raise Transient("upstream 503")


@job("tests.permanent")
def permanent(ctx: JobContext, payload: Any) -> None:
    raise Permanent("card declined: do not retry")


@job("tests.unknown_error")
def unknown_error(ctx: JobContext, payload: Any) -> None:
    raise KeyError("surprise")


@job("tests.rate_limited")
def rate_limited(ctx: JobContext, payload: Any) -> None:
    raise RetryAfter(120)


@job("tests.snooze")
def snooze(ctx: JobContext, payload: Any) -> None:
    raise Snooze(payload.get("seconds", 60))


@job("tests.system_exit")
def system_exit(ctx: JobContext, payload: Any) -> None:
    raise SystemExit(3)


@job("tests.keyboard_interrupt")
def keyboard_interrupt(ctx: JobContext, payload: Any) -> None:
    raise KeyboardInterrupt


@job("tests.bad_return")
def bad_return(ctx: JobContext, payload: Any) -> Any:
    return {"when": object()}


@job("tests.retry_on", retry_on=[LookupError], permanent_on=[ZeroDivisionError])
def retry_on(ctx: JobContext, payload: Any) -> None:
    if payload["raise"] == "lookup":
        raise LookupError("maybe later")
    raise ZeroDivisionError("never")


@job("tests.versioned", version=3)
def versioned(ctx: JobContext, payload: Any) -> Any:
    return payload


@versioned.upgrade(from_version=1)
def _v1_to_v2(payload: Any) -> Any:
    return {**payload, "currency": "EUR"}


@versioned.upgrade(from_version=2)
def _v2_to_v3(payload: Any) -> Any:
    rest = dict(payload)
    amount = rest.pop("amount")
    return {**rest, "amount_cents": amount * 100}


@job("tests.gated", lease=timedelta(seconds=30))
def gated(ctx: JobContext, payload: Any) -> str:
    """Block until the test opens the gate (or 10 s pass)."""
    events.append(("gated-start", ctx.job_id))
    gate.wait(10)
    return "released"


@job("tests.long", lease=timedelta(seconds=1), heartbeat=True)
def long(ctx: JobContext, payload: Any) -> str:
    deadline = time.monotonic() + payload.get("seconds", 2.5)
    while time.monotonic() < deadline:
        time.sleep(0.02)
    answer = "done" if not ctx.lease_lost else "lost"
    events.append(("long-returned", (ctx.job_id, answer)))
    return answer


@job("tests.hang_once", lease=timedelta(seconds=1))
def hang_once(ctx: JobContext, payload: Any) -> str:
    """Hang far past the lease on the first attempt (until the test opens the gate)."""
    if ctx.attempt == 1:
        events.append(("hang-start", ctx.job_id))
        gate.wait(30)
        return "late"
    return "second attempt"


@job("tests.sleep", lease=timedelta(seconds=5))
def sleep(ctx: JobContext, payload: Any) -> str:
    time.sleep(payload["seconds"])
    return "slept"


@job("tests.short_lease", lease=timedelta(seconds=2))
def short_lease(ctx: JobContext, payload: Any) -> str:
    return "ok"


@job("tests.gated_db", lease=timedelta(seconds=30))
def gated_db(ctx: JobContext, payload: Any) -> int:
    """Block until the gate opens, then use the database."""
    from django_pgjobs.models import Job

    events.append(("gated-db-start", ctx.job_id))
    gate.wait(10)
    return Job.objects.count()


@job("tests.when")
def when(ctx: JobContext, payload: Any) -> Any:
    """Say which tick this job is for."""
    return {"scheduled_at": None if ctx.scheduled_at is None else ctx.scheduled_at.isoformat(),
            "payload": payload}
@job("tests.fan_out")
def fan_out(ctx: JobContext, payload: Any) -> int:
    """Enqueue ``n`` jobs of tests.ok, the higher-numbered first in priority."""
    for n in range(payload["n"]):
        ok.enqueue({"child": n}, priority=n)
    return int(payload["n"])


@job("tests.forever")
def forever(ctx: JobContext, payload: Any) -> None:
    """Enqueue the next generation of itself, for ever."""
    forever.enqueue({"generation": payload["generation"] + 1})


@job("tests.aborts_transaction", max_attempts=1)
def aborts_transaction(ctx: JobContext, payload: Any) -> None:
    """Fail a statement outside any atomic block (in a test's transaction, that aborts it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


@job("tests.current_span")
def current_span(ctx: JobContext, payload: Any) -> str:
    """Return the id of the span current while the handler runs (OpenTelemetry, if any)."""
    from opentelemetry import trace  # only the tracing tests enqueue this handler

    return f"{trace.get_current_span().get_span_context().span_id:016x}"


@job("tests.current_span_async")
async def current_span_async(ctx: JobContext, payload: Any) -> str:
    """tests.current_span for an async handler, run on the worker's event loop."""
    from opentelemetry import trace

    return f"{trace.get_current_span().get_span_context().span_id:016x}"


@job("tests.upgrade_fails", version=2)
def upgrade_fails(ctx: JobContext, payload: Any) -> Any:
    """Never reached from version 1: its upgrade raises, quoting the payload it was given."""
    return payload


@upgrade_fails.upgrade(from_version=1)
def _upgrade_fails_v1_to_v2(payload: Any) -> Any:
    raise ValueError(f"cannot upgrade {payload!r}")


@job("tests.upgrade_fails_async", version=2)
async def upgrade_fails_async(ctx: JobContext, payload: Any) -> Any:
    """tests.upgrade_fails for an async handler, run on the worker's event loop."""
    return payload


@upgrade_fails_async.upgrade(from_version=1)
def _upgrade_fails_async_v1_to_v2(payload: Any) -> Any:
    raise ValueError(f"cannot upgrade {payload!r}")


@job("tests.returns_when_timed_out", timeout=0.3, lease=timedelta(seconds=30), max_attempts=1)
def returns_when_timed_out(ctx: JobContext, payload: Any) -> str:
    """Run until told of the timeout (or 30 s pass), then return at once."""
    deadline = time.monotonic() + 30
    while not ctx.timed_out and time.monotonic() < deadline:
        time.sleep(0.01)
    events.append(("told", ctx.job_id))
    return "late"


@job("tests.stuck_past_timeout", timeout=1.0, lease=timedelta(seconds=30), max_attempts=1)
def stuck_past_timeout(ctx: JobContext, payload: Any) -> str:
    """Run on past the timeout until the test opens the gate (or 30 s pass), then return."""
    events.append(("stuck-start", ctx.job_id))
    gate.wait(30)
    events.append(("stuck-end", ctx.job_id))
    return "late"


# --- limits (tests/test_limits.py) ----------------------------------------------------------------


@job("tests.limited", limit=Limit(2, key=lambda p: p["customer"]))
def limited(ctx: JobContext, payload: Any) -> None:
    time.sleep(payload.get("seconds", 0))


@job("tests.limited_by_fairness_key", limit=Limit(1, key="fairness_key"))
def limited_by_fairness_key(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.capped", limit=Limit(1))
def capped(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.shared_a", limit=Limit(1, name="provider"))
def shared_a(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.shared_b", limit=Limit(1, name="provider"))
def shared_b(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.capped_per_queue", limit=Limit(1, key="queue", name="per-queue"))
def capped_per_queue(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.capped_per_queue_too", limit=Limit(1, key="queue", name="per-queue"))
def capped_per_queue_too(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.limited_bad_key", limit=Limit(1, key=lambda p: p["customer"]))
def limited_bad_key(ctx: JobContext, payload: Any) -> None:
    return None


# --- rates (tests/test_rates.py) ------------------------------------------------------------------


@job("tests.rated", limit=Rate(1, per=1, burst=3, key=lambda p: p["account"],
                               weight=lambda p: p.get("weight", 1)))
def rated(ctx: JobContext, payload: Any) -> None:
    return None


@job("tests.rated_provider", limit=Rate(1, per=timedelta(seconds=1), name="provider-api"))
def rated_provider(ctx: JobContext, payload: Any) -> None:
    if payload.get("retry_after") is not None:
        raise RateLimited(payload.get("key"), payload["retry_after"])


@job("tests.collect")
def collect(ctx: JobContext, payload: Any) -> Any:
    """Return what the jobs this one depended on ended as, and their results."""
    return [{"job_id": d.job_id, "task": d.task, "status": d.status, "result": d.result}
            for d in ctx.dependencies()]


@job("tests.progress")
def progress(ctx: JobContext, payload: Any) -> Any:
    """Report progress ``payload["steps"]`` times, as fast as it can."""
    for step in range(1, payload["steps"] + 1):
        ctx.progress(step, payload["steps"], f"step {step}")
    return payload["steps"]


@job("tests.big_result", max_attempts=3)
def big_result(ctx: JobContext, payload: Any) -> Any:
    return "x" * payload["size"]


@job("tests.aprogress")
async def aprogress(ctx: JobContext, payload: Any) -> Any:
    """Report progress ``payload["steps"]`` times from an async handler."""
    for step in range(1, payload["steps"] + 1):
        await ctx.aprogress(step, payload["steps"])
    return payload["steps"]


# --- encrypted fields (tests/test_encryption.py) ---


@job("tests.encrypted_charge", encrypted=["card.number", "token"],
     encrypted_result=["receipt_token", "provider.provider_token"])
def encrypted_charge(ctx: JobContext, payload: Any) -> Any:
    events.append(("encrypted_charge", payload))
    if payload.get("fail"):
        raise ValueError(f"card {payload['card']['number']} was declined")
    with ctx.receipt("tests.provider", key=f"charge:{payload['order']}",
                     encrypted=["provider_token"]) as receipt:
        if not receipt.done:
            receipt.result = {"provider_token": f"pt-{payload['token']}", "order": payload["order"]}
    return {"receipt_token": f"rt-{payload['token']}", "order": payload["order"],
            "provider": receipt.result}
