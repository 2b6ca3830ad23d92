"""The same shop tested with pytest: the pgjobs fixture, and time-machine's time_machine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from testproject.shop import gateway
from testproject.shop.jobs import charge, remind_unpaid
from testproject.shop.models import Order
from testproject.shop.orders import place_order
from testproject.shop.tasks import send_receipt


def test_an_order_is_charged_and_gets_its_receipt(pgjobs) -> None:
    order = place_order("A-1", 1200, email="ada@example.com")
    pgjobs.assert_enqueued(charge, payload={"order_id": order.pk})

    [charged] = pgjobs.drain("billing")
    assert charged.succeeded
    pgjobs.assert_enqueued(send_receipt, args=[order.pk], queue="emails")

    [receipt] = pgjobs.drain("emails")
    assert receipt.result == "sent"
    assert send_receipt.get_result(str(receipt.job_id)).return_value == "sent"
    assert Order.objects.get(pk=order.pk).receipt_sent


def test_a_reminder_goes_out_a_day_later_on_a_travelled_clock(pgjobs, time_machine,
                                                              monkeypatch) -> None:
    time_machine.move_to(timezone.now(), tick=False)
    monkeypatch.setattr(gateway, "charge_card", _unavailable)
    place_order("A-1", 1200, email="ada@example.com")
    pgjobs.drain("billing", max_jobs=1)

    time_machine.shift(timedelta(hours=23))
    assert pgjobs.drain("default") == []
    time_machine.shift(timedelta(hours=2))
    [reminder] = pgjobs.drain("default")
    assert reminder.task == remind_unpaid.name and reminder.result is True
    assert [m.to for m in mail.outbox] == [["ada@example.com"]]


@pytest.mark.django_db(transaction=True)
def test_charges_commit_as_under_a_worker(pgjobs) -> None:
    order = place_order("A-1", 1200, email="ada@example.com")
    runs = pgjobs.drain()
    assert runs.outcomes == {"succeeded": 2}
    assert Order.objects.get(pk=order.pk).charged
    pgjobs.refute_enqueued(charge)
    pgjobs.assert_enqueued(remind_unpaid, payload={"order_id": order.pk})


def _unavailable(*args: object, **kwargs: object) -> str:
    raise gateway.GatewayUnavailable("timed out")
