"""Typed payloads end to end: enqueue checks and stores the JSON form, handlers get the model."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NotRequired, TypedDict

import pydantic
import pytest
from django.db import connection, transaction

from django_pgjobs import (
    InvalidJobOption,
    JobSpec,
    PayloadInvalid,
    Schedule,
    enqueue,
    enqueue_many,
    job,
)
from django_pgjobs.checks import check_schedules
from django_pgjobs.models import Job
from django_pgjobs.registry import registry
from django_pgjobs.status import FailureClass, JobStatus
from django_pgjobs.testing import assert_enqueued, drain, refute_enqueued

pytestmark = pytest.mark.django_db


class Currency(enum.Enum):
    EUR = "EUR"
    USD = "USD"


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class Order:
    order_id: int
    currency: Currency
    total: Decimal
    placed_at: datetime
    lines: list[Line]
    note: str | None = None
    tags: tuple[str, ...] = field(default_factory=tuple)


class Card(pydantic.BaseModel):
    number: str
    exp: str


class Charge(pydantic.BaseModel):
    order_id: int
    amount_cents: int = pydantic.Field(gt=0)
    card: Card


class Notice(TypedDict):
    user_id: int
    subject: str
    cc: NotRequired[list[str]]


ORDER = Order(7, Currency.EUR, Decimal("19.90"), datetime(2026, 12, 5, 9, 0, tzinfo=UTC),
              [Line("A-1", 2), Line("B-2", 1)], tags=("gift",))
ORDER_JSON = {"order_id": 7, "currency": "EUR", "total": "19.90",
              "placed_at": "2026-12-05T09:00:00+00:00",
              "lines": [{"sku": "A-1", "qty": 2}, {"sku": "B-2", "qty": 1}], "note": None,
              "tags": ["gift"]}

received: list[Any] = []


@pytest.fixture(autouse=True)
def handlers() -> Iterator[None]:
    received.clear()
    declared = []

    def declare(name: str, **options: Any) -> None:
        job(name, **options)(lambda ctx, payload: received.append(payload))
        declared.append(name)

    declare("tests.typed.order", payload=Order)
    declare("tests.typed.charge", payload=Charge, encrypted=["card.number"])
    declare("tests.typed.notice", payload=Notice)
    yield
    for name in declared:
        registry.remove(name)


def stored(job_id: int) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM pgjobs_job WHERE id = %s", [job_id])
        return json.loads(cursor.fetchone()[0])


def test_a_dataclass_payload_is_stored_as_json_and_handed_back_as_the_dataclass() -> None:
    j = enqueue("tests.typed.order", ORDER)
    assert j.payload == ORDER_JSON == stored(j.pk)
    drain(raise_errors=True)
    assert received == [ORDER] and isinstance(received[0].lines[0], Line)
    assert received[0].currency is Currency.EUR and received[0].tags == ("gift",)


def test_a_dict_of_the_same_shape_is_checked_and_taken_as_well() -> None:
    j = registry.get("tests.typed.order").enqueue(ORDER_JSON)  # type: ignore[union-attr]
    assert stored(j.pk) == ORDER_JSON
    drain(raise_errors=True)
    assert received == [ORDER]


def test_a_pydantic_model_round_trips_and_its_encrypted_field_is_stored_encrypted() -> None:
    charge = Charge(order_id=1, amount_cents=1990, card=Card(number="4242424242424242",
                                                              exp="12/30"))
    j = enqueue("tests.typed.charge", charge)
    raw = stored(j.pk)
    assert raw["card"]["number"].startswith("pgjobs:enc:v1:") and raw["card"]["exp"] == "12/30"
    assert "4242424242424242" not in str(raw)
    drain(raise_errors=True)
    assert received == [charge] and isinstance(received[0], Charge)


def test_a_typeddict_payload_is_checked_and_handed_back_as_a_dict() -> None:
    enqueue("tests.typed.notice", {"user_id": 3, "subject": "hi"})
    drain(raise_errors=True)
    assert received == [{"user_id": 3, "subject": "hi"}]


@pytest.mark.parametrize("task, payload, path, problem", [
    ("tests.typed.order", {**ORDER_JSON, "lines": [{"sku": "A-1", "qty": "2"}]},
     "payload.lines[0].qty", "int"),
    # The value given is never quoted: a payload may hold secrets, and errors reach logs.
    ("tests.typed.order", {**ORDER_JSON, "currency": "GBP"}, "payload.currency",
     "expected a Currency value ('EUR', 'USD')"),
    ("tests.typed.order", {k: v for k, v in ORDER_JSON.items() if k != "total"}, "payload",
     "missing field 'total'"),
    ("tests.typed.order", {**ORDER_JSON, "discount": 1}, "payload", "unknown field 'discount'"),
    ("tests.typed.charge", {"order_id": 1, "amount_cents": 0,
                            "card": {"number": "4242", "exp": "1"}}, "payload.amount_cents",
     "greater than 0"),
    ("tests.typed.charge", {"order_id": 1, "amount_cents": 5, "card": {"exp": "1"}},
     "payload.card.number", "required"),
    ("tests.typed.notice", {"user_id": True, "subject": "x"}, "payload.user_id", "bool"),
])
def test_a_payload_that_does_not_fit_is_refused_naming_the_field_and_nothing_is_written(
        task: str, payload: Any, path: str, problem: str) -> None:
    with transaction.atomic():
        enqueue("tests.ok", {"before": True})
        with pytest.raises(PayloadInvalid) as caught:
            enqueue_many([JobSpec.of(task, ORDER if task.endswith("order") else payload),
                          JobSpec.of(task, payload)])
        assert caught.value.path == path and problem.lower() in caught.value.problem.lower()
        # The caller's transaction is usable, and holds only its own job.
        assert list(Job.objects.values_list("task", flat=True)) == ["tests.ok"]


def test_an_older_payload_version_is_upgraded_then_checked_and_stored_as_given() -> None:
    @job("tests.typed.versioned", version=2, payload=Line)
    def versioned(ctx: Any, payload: Line) -> None:
        received.append(payload)

    @versioned.upgrade(1)
    def rename(payload: dict[str, Any]) -> dict[str, Any]:
        return {"sku": payload["code"], "qty": payload["count"]}

    try:
        j = enqueue(versioned, {"code": "A-1", "count": 3}, payload_version=1)
        assert stored(j.pk) == {"code": "A-1", "count": 3}
        with pytest.raises(PayloadInvalid, match=r"payload\.qty"):
            enqueue(versioned, {"code": "A-1", "count": "3"}, payload_version=1)
        with pytest.raises(PayloadInvalid, match=r"upgrade from version 1 failed: KeyError"):
            enqueue(versioned, {"sku": "A-1"}, payload_version=1)
        drain(raise_errors=True)
        assert received == [Line("A-1", 3)]
    finally:
        registry.remove("tests.typed.versioned")


def test_a_stored_payload_that_no_longer_fits_fails_as_permanent_saying_where() -> None:
    j = enqueue("tests.typed.order", ORDER)
    Job.objects.filter(pk=j.pk).update(payload={**ORDER_JSON, "total": "many"})
    [run] = drain()
    assert (run.status, run.failure_class) == (JobStatus.DEAD, FailureClass.PERMANENT)
    assert "does not match the handler's model" in run.error and "payload.total" in run.error
    assert received == []


def test_a_declaration_that_is_not_a_model_is_refused_at_import() -> None:
    for declared in (int, ORDER, dict):
        with pytest.raises(InvalidJobOption, match="payload= takes"):
            job("tests.typed.bad", payload=declared)(lambda ctx, payload: None)
    assert registry.get("tests.typed.bad") is None


def test_a_schedule_whose_payload_does_not_fit_is_a_system_check_error() -> None:
    job("tests.typed.nightly", payload=Line,
        schedules=[Schedule("0 3 * * *", name="tests.typed.nightly",
                            payload={"sku": "A-1", "qty": "x"})])(lambda ctx, payload: None)
    try:
        [error] = check_schedules()
        assert error.id == "pgjobs.E012" and "payload.qty" in error.msg
    finally:
        registry.remove("tests.typed.nightly")


def test_the_testing_helpers_compare_with_the_model_and_the_decrypted_fields() -> None:
    charge = Charge(order_id=1, amount_cents=1990, card=Card(number="4242424242424242",
                                                              exp="12/30"))
    enqueue("tests.typed.order", ORDER)
    enqueue("tests.typed.charge", charge)
    assert_enqueued("tests.typed.order", payload=ORDER)
    assert_enqueued("tests.typed.order", payload=ORDER_JSON)
    assert_enqueued("tests.typed.charge", payload=charge)
    refute_enqueued("tests.typed.charge", payload=charge.model_copy(update={"order_id": 2}))
    with pytest.raises(AssertionError) as caught:
        assert_enqueued("tests.typed.charge",
                        payload={**charge.model_dump(), "card": {"number": "4000000000000002",
                                                                 "exp": "12/30"}})
    # The failure quotes the job as a viewer may see it: never the decrypted card number.
    assert "4242424242424242" not in str(caught.value)


class Aliased(pydantic.BaseModel):
    card_number: str = pydantic.Field(alias="cardNumber")


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    when: datetime
    amount: Decimal


class Computed(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    net: int
    tax: int

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def gross(self) -> int:
        return self.net + self.tax


class Picky(pydantic.BaseModel):
    code: str

    @pydantic.field_validator("code")
    @classmethod
    def upper_only(cls, value: str) -> str:
        if value != value.upper():
            raise ValueError("must be upper case")
        return value.lower()  # its own output no longer passes


@pytest.mark.parametrize("model, given", [
    (Aliased, Aliased(cardNumber="4242")),
    (Strict, Strict(when=datetime(2026, 12, 5, tzinfo=UTC), amount=Decimal("1.10"))),
    (Computed, Computed(net=10, tax=2)),
])
def test_a_pydantic_model_enqueued_is_one_the_worker_reads_back(model: Any, given: Any) -> None:
    job("tests.typed.model", payload=model)(lambda ctx, payload: received.append(payload))
    try:
        enqueue("tests.typed.model", given)
        [run] = drain()
        assert run.status == JobStatus.SUCCEEDED, run.error
        assert received == [given]
    finally:
        registry.remove("tests.typed.model")


def test_a_model_whose_json_form_does_not_validate_back_is_refused_at_enqueue() -> None:
    job("tests.typed.picky", payload=Picky)(lambda ctx, payload: None)
    try:
        with transaction.atomic():
            with pytest.raises(PayloadInvalid, match="does not validate back as Picky") as caught:
                enqueue("tests.typed.picky", Picky(code="ABC"))
            assert caught.value.path == "payload.code"
            assert Job.objects.count() == 0
    finally:
        registry.remove("tests.typed.picky")
