"""The shop's tests, written as an application writes them: Django's TestCase and the helpers."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

from django.core import mail
from django.db import IntegrityError
from django.test import TestCase
from django.utils import timezone

from django_pgjobs.testing import ANY, assert_enqueued, drain, enqueued_jobs, refute_enqueued
from testproject.shop import gateway
from testproject.shop.jobs import charge, remind_unpaid
from testproject.shop.orders import REMIND_AFTER, place_order
from testproject.shop.tasks import send_receipt


class PlaceOrderTests(TestCase):
    def test_placing_an_order_enqueues_its_charge_and_a_reminder(self) -> None:
        order = place_order("A-1", 1200, email="ada@example.com")

        job = assert_enqueued(charge, payload={"order_id": order.pk}, queue="billing",
                              idempotency_key="charge:A-1")
        self.assertEqual(job.max_attempts, 5)
        assert_enqueued(remind_unpaid, payload={"order_id": order.pk}, delay=REMIND_AFTER,
                        status="scheduled")
        refute_enqueued(send_receipt)  # only once the charge went through

    def test_placing_the_same_order_twice_enqueues_one_charge(self) -> None:
        order = place_order("A-1", 1200, email="ada@example.com")
        with self.assertRaises(IntegrityError):  # the reference is unique
            place_order("A-1", 1200, email="ada@example.com")
        self.assertEqual([j.payload for j in enqueued_jobs(charge)], [{"order_id": order.pk}])


class ChargeTests(TestCase):
    def test_a_charge_charges_once_and_sends_the_receipt(self) -> None:
        order = place_order("A-1", 1200, email="ada@example.com")

        runs = drain()

        self.assertEqual([(r.task, r.outcome) for r in runs], [
            ("shop.charge", "succeeded"),
            (f"django.tasks:{send_receipt.module_path}", "succeeded"),
        ])
        order.refresh_from_db()
        self.assertTrue(order.charged and order.receipt_sent)
        self.assertEqual(runs[0].result, {"charge_id": order.charge_id})
        self.assertEqual([m.to for m in mail.outbox], [["ada@example.com"]])
        # The reminder is still a day away.
        assert_enqueued(remind_unpaid, payload={"order_id": order.pk})

    def test_a_provider_outage_is_retried_and_the_customer_charged_once(self) -> None:
        order = place_order("A-1", 1200, email="ada@example.com")
        with mock.patch.object(gateway, "charge_card",
                               side_effect=gateway.GatewayUnavailable("timed out")):
            [failed] = drain("billing")
        self.assertEqual((failed.outcome, failed.status, failed.failure_class),
                         ("failed", "retrying", "transient"))
        self.assertIn("GatewayUnavailable: timed out", failed.error)
        refute_enqueued(send_receipt)

        # The retry's backoff has passed: it charges, and the receipt follows.
        runs = drain(now=timezone.now() + timedelta(hours=1))
        self.assertEqual([r.outcome for r in runs.of(charge)], ["succeeded"])
        self.assertEqual(runs.of(charge)[0].attempt, 2)
        self.assertEqual(len(runs.of(send_receipt)), 1)
        order.refresh_from_db()
        self.assertTrue(order.charged)

    def test_an_order_with_nothing_to_charge_is_dead_at_once(self) -> None:
        place_order("FREE-1", 0, email="ada@example.com")
        [run] = drain("billing")
        self.assertEqual((run.outcome, run.status, run.failure_class),
                         ("dead", "dead", "permanent"))
        self.assertIn("has nothing to charge", run.error)


class ReminderTests(TestCase):
    def test_an_unpaid_order_is_reminded_after_a_day(self) -> None:
        order = place_order("A-1", 1200, email="ada@example.com")
        with mock.patch.object(gateway, "charge_card", side_effect=gateway.GatewayUnavailable):
            drain("billing", max_jobs=1)

        self.assertEqual(drain("default"), [])  # not due yet
        [reminder] = drain("default", now=timezone.now() + REMIND_AFTER + timedelta(minutes=1))
        self.assertEqual((reminder.task, reminder.result), ("shop.remind_unpaid", True))
        self.assertEqual(mail.outbox[0].subject, f"Your order {order.reference}")
        assert_enqueued(charge, status="retrying", attempts=1, payload={"order_id": ANY})
