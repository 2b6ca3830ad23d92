from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from django_pgjobs.models import IdempotencyReceipt
from django_pgjobs.receipts import receipt
from testproject.demo.models import LedgerEntry

pytestmark = pytest.mark.django_db


def test_first_holder_performs_and_records_the_effect() -> None:
    with receipt("charge", "order:1", job_id=7) as r:
        assert r.done is False
        r.result = {"charge_id": "ch_1"}
    stored = IdempotencyReceipt.objects.get(scope="charge", key="order:1")
    assert (stored.job_id, stored.result) == (7, {"charge_id": "ch_1"})
    assert stored.expires_at > stored.created_at


def test_a_retry_finds_the_receipt_done_and_replays_the_result() -> None:
    with receipt("charge", "order:1") as r:
        r.result = {"charge_id": "ch_1"}
    with receipt("charge", "order:1") as again:
        assert again.done is True
        assert again.result == {"charge_id": "ch_1"}
        with pytest.raises(RuntimeError, match="already done"):
            again.result = {"charge_id": "ch_2"}
    assert IdempotencyReceipt.objects.count() == 1


def test_an_exception_rolls_back_the_receipt_with_the_local_side_effect() -> None:
    class ProviderDown(Exception):
        pass

    with pytest.raises(ProviderDown), receipt("charge", "order:2") as r:
        LedgerEntry.objects.create(kind="charge", key="2", job_id=1, attempt=1, worker_id="w",
                                   started_at="2026-01-01T00:00:00Z")
        r.result = {"partial": True}
        raise ProviderDown
    assert IdempotencyReceipt.objects.count() == 0
    assert LedgerEntry.objects.count() == 0
    with receipt("charge", "order:2") as retry:
        assert retry.done is False


def test_a_result_that_is_not_json_is_refused_before_commit() -> None:
    with pytest.raises(Exception, match="not JSON"), receipt("charge", "order:3") as r:
        r.result = {"when": object()}
    assert IdempotencyReceipt.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_holders_of_one_key_perform_the_effect_once() -> None:
    """A stale attempt and a fresh one race on the same key: one waits for the other."""
    performed: list[str] = []
    results: dict[str, object] = {}
    first_inside = threading.Event()

    def attempt(name: str, hold: float) -> None:
        try:
            with receipt("charge", "order:race") as r:
                if name == "first":
                    first_inside.set()
                if not r.done:
                    time.sleep(hold)
                    performed.append(name)
                    LedgerEntry.objects.create(kind="charge", key="race", job_id=1, attempt=1,
                                               worker_id=name, started_at="2026-01-01T00:00:00Z")
                    r.result = {"by": name}
                results[name] = r.result
        finally:
            connections.close_all()

    first = threading.Thread(target=attempt, args=("first", 0.5))
    first.start()
    assert first_inside.wait(10)
    second = threading.Thread(target=attempt, args=("second", 0.0))
    second.start()
    first.join(20)
    second.join(20)
    assert performed == ["first"]
    assert results == {"first": {"by": "first"}, "second": {"by": "first"}}
    assert LedgerEntry.objects.filter(key="race").count() == 1


def test_a_handler_uses_receipts_through_its_context() -> None:
    import django_pgjobs
    from django_pgjobs.context import JobContext
    from django_pgjobs.executor import execute
    from django_pgjobs.transitions import claim_jobs, settle
    from testproject.demo.models import Order

    order = Order.objects.create(reference="A-1", amount_cents=1250)
    for _ in range(2):  # the same intent enqueued twice under different keys: a duplicate run
        django_pgjobs.enqueue("demo.charge", {"order_id": order.pk})
    claimed = claim_jobs("w", "default", 2)
    outcomes = [execute(c, JobContext(c, worker_id="w", using="default")) for c in claimed]
    settle(outcomes)
    assert LedgerEntry.objects.filter(kind="charge").count() == 1
    assert [o.result_json for o in outcomes] == ['{"charged_cents": 1250}'] * 2
