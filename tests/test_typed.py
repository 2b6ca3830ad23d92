"""Typed payloads: pydantic models, dataclasses and TypedDicts to JSON and back.

Pure conversion, no database: every kind comes back equal to what was given after a trip
through JSON text, and every refusal names the exact place at fault.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import subprocess
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal, NotRequired, Optional, Required, TypedDict

import pydantic
import pydantic.v1
import pytest
import typing_extensions

from django_pgjobs.exceptions import EnqueueError, InvalidJobOption, PayloadInvalid
from django_pgjobs.payloads import encode_json
from django_pgjobs.typed import PayloadType

ROOT = Path(__file__).resolve().parent.parent
UTC_NOON = dt.datetime(2024, 3, 1, 12, 30, tzinfo=dt.UTC)
REF = uuid.UUID("12345678-1234-5678-1234-567812345678")


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


@dataclasses.dataclass
class Card:
    number: str
    expires: dt.date


@dataclasses.dataclass
class Item:
    sku: str
    qty: int


@dataclasses.dataclass
class Order:
    card: Card
    items: list[Item]
    tags: dict[str, int] = dataclasses.field(default_factory=dict)
    color: Color = Color.RED
    size: Size | None = None
    dims: tuple[float, ...] = ()
    pair: tuple[int, str] | None = None
    price: Decimal = Decimal("0")
    ref: uuid.UUID | None = None
    placed: dt.datetime | None = None
    mode: Literal["fast", "slow"] = "fast"
    note: Optional[str] = None  # noqa: UP045  (the typing spelling is supported too)
    extra: Any = None
    count: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.count = len(self.items)


FULL_ORDER = Order(
    card=Card("4242", dt.date(2030, 1, 31)), items=[Item("a", 1), Item("b", 2)],
    tags={"x": 1}, color=Color.GREEN, size=Size.LARGE, dims=(1.5, 2.0), pair=(7, "seven"),
    price=Decimal("10.10"), ref=REF, placed=UTC_NOON, mode="slow", note="ring twice",
    extra={"k": [1, None, True]},
)
FULL_ORDER_JSON = {
    "card": {"number": "4242", "expires": "2030-01-31"},
    "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}],
    "tags": {"x": 1}, "color": "green", "size": 2, "dims": [1.5, 2.0], "pair": [7, "seven"],
    "price": "10.10", "ref": "12345678-1234-5678-1234-567812345678",
    "placed": "2024-03-01T12:30:00+00:00", "mode": "slow", "note": "ring twice",
    "extra": {"k": [1, None, True]},
}


@dataclasses.dataclass
class Qty:
    qty: int
    ratio: float = 1.0


@dataclasses.dataclass
class Node:
    value: int
    children: list[Node] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError("n must be positive")


class Line(TypedDict):
    sku: str
    qty: int


class Basket(TypedDict, total=False):
    lines: list[Line]
    coupon: str


class Delivery(TypedDict):
    address: str
    window: tuple[dt.datetime, dt.datetime]
    color: Color
    lines: list[Line]
    tags: NotRequired[dict[str, int]]


class Coupon(TypedDict, total=False):
    code: Required[str]
    percent: int


class ExtLine(typing_extensions.TypedDict):
    sku: str
    qty: typing_extensions.NotRequired[int]


class PLine(pydantic.BaseModel):
    sku: str
    qty: int


class PCart(pydantic.BaseModel):
    at: dt.datetime
    lines: list[PLine]
    ratio: float = 1.0


@dataclasses.dataclass
class Shipment:
    cart: PCart
    tracking: str | None = None


def through_json(value: object) -> Any:
    return json.loads(json.dumps(value))


def refusal(call: Any, *args: Any) -> tuple[str, str]:
    with pytest.raises(PayloadInvalid) as caught:
        call(*args)
    return caught.value.path, caught.value.problem


# --- dataclasses -------------------------------------------------------------------------


def test_dataclass_round_trip_of_every_supported_annotation():
    pt = PayloadType.of(Order, "shop.charge")
    assert (pt.kind, pt.model) == ("dataclass", Order)
    dumped = pt.dump(FULL_ORDER)
    assert dumped == FULL_ORDER_JSON
    assert encode_json(dumped) == json.dumps(FULL_ORDER_JSON, separators=(",", ":"))
    loaded = pt.load(through_json(dumped))
    assert loaded == FULL_ORDER
    assert isinstance(loaded, Order)
    assert loaded.color is Color.GREEN and loaded.size is Size.LARGE
    assert loaded.dims == (1.5, 2.0) and loaded.pair == (7, "seven")
    assert type(loaded.price) is Decimal and type(loaded.ref) is uuid.UUID
    assert loaded.placed == UTC_NOON and loaded.placed.utcoffset() == dt.timedelta(0)
    assert loaded.count == 2  # init=False: not stored, computed again


def test_dataclass_defaults_round_trip_and_naive_datetime_stays_naive():
    pt = PayloadType.of(Order, "shop.charge")
    order = Order(Card("1", dt.date(2031, 2, 3)), [], placed=dt.datetime(2024, 1, 2, 3, 4, 5))
    dumped = pt.dump(order)
    assert dumped == {
        "card": {"number": "1", "expires": "2031-02-03"}, "items": [], "tags": {},
        "color": "red", "size": None, "dims": [], "pair": None, "price": "0", "ref": None,
        "placed": "2024-01-02T03:04:05", "mode": "fast", "note": None, "extra": None,
    }
    loaded = pt.load(through_json(dumped))
    assert loaded == order and loaded.placed.tzinfo is None


def test_dataclass_accepts_a_dict_in_json_form_or_with_typed_values():
    pt = PayloadType.of(Order, "shop.charge")
    assert pt.dump(FULL_ORDER_JSON) == FULL_ORDER_JSON
    typed = dataclasses.asdict(FULL_ORDER)
    del typed["count"]
    assert pt.dump(typed) == FULL_ORDER_JSON
    assert pt.dump({"card": {"number": "9", "expires": "2030-01-01"}, "items": []})["tags"] == {}


def test_float_takes_an_int_and_gives_a_float_int_refuses_a_float():
    pt = PayloadType.of(Qty, "t")
    assert pt.dump(Qty(3, 2)) == {"qty": 3, "ratio": 2.0}
    loaded = pt.load({"qty": 3, "ratio": 2})
    assert loaded == Qty(3, 2.0) and type(loaded.ratio) is float
    assert refusal(pt.load, {"qty": 3.0}) == ("payload.qty", "expected int, got float")


def test_bool_is_refused_for_int():
    pt = PayloadType.of(Qty, "t")
    assert refusal(pt.dump, Qty(True)) == ("payload.qty", "expected int, got bool")
    assert refusal(pt.load, {"qty": False}) == ("payload.qty", "expected int, got bool")
    assert refusal(pt.dump, {"qty": 1, "ratio": True}) == ("payload.ratio",
                                                           "expected float, got bool")


def test_an_instance_built_with_a_wrong_type_is_refused_at_its_field():
    pt = PayloadType.of(Qty, "t")
    assert refusal(pt.dump, Qty("3")) == ("payload.qty", "expected int, got str")


def test_nan_and_infinity_are_refused():
    pt = PayloadType.of(Qty, "t")
    assert refusal(pt.dump, Qty(1, float("nan"))) == ("payload.ratio", "not a finite number")
    assert refusal(pt.load, {"qty": 1, "ratio": float("-inf")}) == ("payload.ratio",
                                                                    "not a finite number")
    order = PayloadType.of(Order, "t")
    bad_any = dataclasses.replace(FULL_ORDER, extra={"k": [float("inf")]})
    assert refusal(order.dump, bad_any) == ("payload.extra['k'][0]", "inf is not a finite number")
    bad_price = dataclasses.replace(FULL_ORDER, price=Decimal("NaN"))
    assert refusal(order.dump, bad_price) == ("payload.price", "not a finite number")


@pytest.mark.parametrize(("change", "path", "problem"), [
    ({"card": {"number": 4242, "expires": "2030-01-31"}}, "payload.card.number",
     "expected str, got int"),
    ({"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "2"}]}, "payload.items[1].qty",
     "expected int, got str"),
    ({"tags": {"a": "x"}}, "payload.tags['a']", "expected int, got str"),
    ({"tags": {"a": 1, "b": None}}, "payload.tags['b']", "expected int, got None"),
    ({"card": {"number": "1", "expires": "2030-02-30"}}, "payload.card.expires",
     "not a valid date"),
    ({"card": {"number": "1", "expires": "2030-02-03T00:00:00"}}, "payload.card.expires",
     "not a valid date"),
    ({"color": "blue"}, "payload.color", "expected a Color value ('red', 'green'), got str"),
    ({"size": 3}, "payload.size", "expected a Size value (1, 2), got int"),
    ({"size": True}, "payload.size", "expected a Size value (1, 2), got bool"),
    ({"mode": "slower"}, "payload.mode", "expected one of 'fast', 'slow', got str"),
    ({"dims": [1.0, "x"]}, "payload.dims[1]", "expected float, got str"),
    ({"dims": "1.0"}, "payload.dims", "expected tuple[float, ...], got str"),
    ({"pair": [1, "a", 2]}, "payload.pair", "expected 2 items, got 3"),
    ({"pair": ["1", "a"]}, "payload.pair[0]", "expected int, got str"),
    ({"price": "ten"}, "payload.price", "not a valid Decimal"),
    ({"price": 10.1}, "payload.price", "expected Decimal, got float"),
    ({"ref": "not-a-uuid"}, "payload.ref", "not a valid UUID"),
    ({"placed": "yesterday"}, "payload.placed", "not a valid datetime"),
    ({"note": "a\x00b"}, "payload.note",
     "contains a NUL character, which PostgreSQL cannot store"),
    ({"extra": {1: "x"}}, "payload.extra", "key 1 is a int, not a string"),
    ({"tags": {1: 1}}, "payload.tags", "a key of type int: JSON object keys are str"),
    ({"items": {"sku": "a", "qty": 1}}, "payload.items", "expected list[Item], got dict"),
    ({"zz": 1}, "payload", "unknown field 'zz'"),
    ({"count": 3}, "payload", "unknown field 'count'"),
    ({"card": {"number": "1"}}, "payload.card", "missing field 'expires'"),
])
def test_each_refusal_names_its_exact_path(change, path, problem):
    pt = PayloadType.of(Order, "t")
    given = {**FULL_ORDER_JSON, **change}
    assert refusal(pt.dump, given) == (path, problem)
    assert refusal(pt.load, given) == (path, problem)


def test_a_missing_required_field_and_a_bad_top_level_value():
    pt = PayloadType.of(Order, "t")
    assert refusal(pt.dump, {"items": []}) == ("payload", "missing field 'card'")
    assert refusal(pt.dump, [1]) == ("payload", "expected Order, got list")
    assert refusal(pt.load, None) == ("payload", "expected Order, got None")
    assert refusal(pt.dump, Card("1", dt.date(2030, 1, 1))) == ("payload",
                                                                 "expected Order, got Card")


def test_str_and_int_subclasses_are_stored_as_plain_str_and_int():
    class Mood(str, enum.Enum):  # noqa: UP042  (str() of this one gives "Mood.CALM")
        CALM = "calm"

    pt = PayloadType.of(Item, "t")
    dumped = pt.dump(Item(Mood.CALM, Size.LARGE))
    assert dumped == {"sku": "calm", "qty": 2}
    assert type(dumped["sku"]) is str and type(dumped["qty"]) is int


def test_integers_json_readers_cannot_hold_are_refused():
    pt = PayloadType.of(Qty, "t")
    assert refusal(pt.dump, Qty(2**1024)) == (
        "payload.qty", "integer beyond ±2**1024, which JSON readers cannot hold")
    assert refusal(pt.dump, Qty(1, 2**1024)) == ("payload.ratio", "integer too large for a float")


def test_nesting_past_the_stack_is_refused_not_crashed():
    pt = PayloadType.of(Node, "t")
    tree = Node(0)
    for value in range(1, 5000):
        tree = Node(value, [tree])
    assert refusal(pt.dump, tree) == ("payload", "nested too deeply to convert")


def test_the_root_is_the_one_given():
    pt = PayloadType.of(Qty, "t")
    assert refusal(pt.dump, {"qty": "1"}, "result") == ("result.qty", "expected int, got str")


def test_the_error_is_an_enqueue_error_with_the_payload_message():
    with pytest.raises(EnqueueError, match=r"^invalid payload at payload\.card\.number: "
                                            r"expected str, got int$"):
        PayloadType.of(Card, "t").load({"number": 1, "expires": "2030-01-01"}, "payload.card")


def test_post_init_refusals_become_payload_invalid():
    pt = PayloadType.of(Positive, "t")
    assert refusal(pt.load, {"n": 0}) == ("payload", "Positive() refused it: n must be positive")
    assert pt.load({"n": 2}) == Positive(2)


def test_a_recursive_dataclass_round_trips():
    pt = PayloadType.of(Node, "t")
    tree = Node(1, [Node(2), Node(3, [Node(4)])])
    dumped = pt.dump(tree)
    assert dumped == {"value": 1, "children": [
        {"value": 2, "children": []},
        {"value": 3, "children": [{"value": 4, "children": []}]},
    ]}
    assert pt.load(through_json(dumped)) == tree
    bad = {"value": 1, "children": [{"value": 2, "children": [{"value": "x"}]}]}
    assert refusal(pt.load, bad) == ("payload.children[0].children[0].value",
                                     "expected int, got str")


def test_optional_nested_dataclass_reports_the_inner_field():
    @dataclasses.dataclass
    class Wallet:
        card: Card | None = None

    pt = PayloadType.of(Wallet, "t")
    assert pt.load({"card": None}) == Wallet(None)
    assert refusal(pt.load, {"card": {"number": 1, "expires": "2030-01-01"}}) == (
        "payload.card.number", "expected str, got int")
    assert refusal(pt.load, {"card": {"number": "1"}}) == ("payload.card",
                                                           "missing field 'expires'")
    assert refusal(pt.load, {"card": "4242"}) == ("payload.card", "expected Card, got str")


def test_union_members_are_tried_in_order():
    @dataclasses.dataclass
    class Either:
        a: int | str
        b: float | int
        c: Item | dict[str, Any]

    pt = PayloadType.of(Either, "t")
    assert pt.dump(Either(1, 2, Item("s", 1))) == {"a": 1, "b": 2.0, "c": {"sku": "s", "qty": 1}}
    loaded = pt.load({"a": "x", "b": 2, "c": {"sku": "s", "qty": 1}})
    assert loaded == Either("x", 2.0, Item("s", 1)) and type(loaded.b) is float
    assert pt.load({"a": 1, "b": 1.5, "c": {"other": 1}}).c == {"other": 1}
    assert refusal(pt.load, {"a": None, "b": 1, "c": {}}) == ("payload.a",
                                                              "expected int | str, got None")


def test_pydantic_model_inside_a_dataclass():
    pt = PayloadType.of(Shipment, "t")
    shipment = Shipment(PCart(at=UTC_NOON, lines=[PLine(sku="a", qty=1)]), "TRK")
    dumped = pt.dump(shipment)
    assert dumped == {"cart": {"at": "2024-03-01T12:30:00Z", "lines": [{"sku": "a", "qty": 1}],
                               "ratio": 1.0}, "tracking": "TRK"}
    assert pt.load(through_json(dumped)) == shipment
    bad = {"cart": {"at": "2024-03-01T12:30:00Z", "lines": [{"sku": "a", "qty": 1},
                                                           {"sku": "b", "qty": "many"}]}}
    assert refusal(pt.load, bad) == (
        "payload.cart.lines[1].qty",
        "Input should be a valid integer, unable to parse string as an integer")


# --- TypedDicts --------------------------------------------------------------------------


def test_typeddict_round_trip_converts_values_and_returns_a_plain_dict():
    pt = PayloadType.of(Delivery, "t")
    assert (pt.kind, pt.model) == ("typeddict", Delivery)
    later = UTC_NOON + dt.timedelta(hours=2)
    delivery: Delivery = {"address": "1 Main St", "window": (UTC_NOON, later),
                          "color": Color.RED, "lines": [{"sku": "a", "qty": 2}]}
    dumped = pt.dump(delivery)
    assert dumped == {"address": "1 Main St",
                      "window": ["2024-03-01T12:30:00+00:00", "2024-03-01T14:30:00+00:00"],
                      "color": "red", "lines": [{"sku": "a", "qty": 2}]}
    loaded = pt.load(through_json(dumped))
    assert loaded == delivery and type(loaded) is dict
    assert type(loaded["window"]) is tuple and loaded["color"] is Color.RED
    assert pt.dump(dumped) == dumped  # the JSON form is a valid dict as well


def test_typeddict_optional_keys_and_refusals():
    pt = PayloadType.of(Delivery, "t")
    base = {"address": "x", "window": [UTC_NOON.isoformat()] * 2, "color": "red", "lines": []}
    assert pt.load({**base, "tags": {"a": 1}})["tags"] == {"a": 1}
    assert refusal(pt.dump, {**base, "tags": {"a": "1"}}) == ("payload.tags['a']",
                                                              "expected int, got str")
    assert refusal(pt.dump, {**base, "lines": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": True}]}
                   ) == ("payload.lines[1].qty", "expected int, got bool")
    assert refusal(pt.dump, {**base, "other": 1}) == ("payload", "unknown field 'other'")
    del base["color"]
    assert refusal(pt.load, base) == ("payload", "missing field 'color'")


def test_typeddict_total_false_may_be_empty():
    pt = PayloadType.of(Basket, "t")
    assert pt.dump({}) == {}
    assert pt.load({"coupon": "X"}) == {"coupon": "X"}
    basket: Basket = {"lines": [{"sku": "a", "qty": 1}], "coupon": "Y"}
    assert pt.load(through_json(pt.dump(basket))) == basket
    assert refusal(pt.dump, {"lines": [{"sku": "a"}]}) == ("payload.lines[0]",
                                                           "missing field 'qty'")


def test_required_and_not_required_hold_in_string_annotations():
    # This module's annotations are strings (from __future__ import annotations).
    coupon = PayloadType.of(Coupon, "t")
    assert coupon.load({"code": "X"}) == {"code": "X"}
    assert refusal(coupon.load, {"percent": 5}) == ("payload", "missing field 'code'")
    ext = PayloadType.of(ExtLine, "t")
    assert ext.kind == "typeddict"
    assert ext.dump({"sku": "a"}) == {"sku": "a"}
    assert refusal(ext.dump, {"qty": 1}) == ("payload", "missing field 'sku'")


# --- pydantic ----------------------------------------------------------------------------


def test_pydantic_round_trip_from_an_instance_or_a_dict():
    pt = PayloadType.of(PCart, "t")
    assert (pt.kind, pt.model) == ("pydantic", PCart)
    cart = PCart(at=UTC_NOON, lines=[PLine(sku="a", qty=1)], ratio=0.5)
    dumped = pt.dump(cart)
    assert dumped == {"at": "2024-03-01T12:30:00Z", "lines": [{"sku": "a", "qty": 1}],
                      "ratio": 0.5}
    assert pt.dump({"at": UTC_NOON, "lines": [{"sku": "a", "qty": 1}], "ratio": 0.5}) == dumped
    loaded = pt.load(through_json(dumped))
    assert loaded == cart and isinstance(loaded, PCart)


def test_pydantic_errors_use_the_first_errors_location_and_message():
    pt = PayloadType.of(PCart, "t")
    bad = {"at": "2024-03-01T12:30:00Z", "lines": [{"sku": "a", "qty": 1}, {"sku": "b"}]}
    assert refusal(pt.dump, bad) == ("payload.lines[1].qty", "Field required")
    assert refusal(pt.load, {"at": "soon", "lines": "x"}) == (
        "payload.at", "Input should be a valid datetime or date, input is too short")
    assert refusal(pt.load, 5) == (
        "payload", "Input should be a valid dictionary or instance of PCart")


def test_pydantic_nan_is_refused_even_where_the_model_allows_it():
    pt = PayloadType.of(PCart, "t")
    cart = PCart(at=UTC_NOON, lines=[], ratio=float("nan"))
    assert refusal(pt.dump, cart) == ("payload['ratio']", "nan is not a finite number")


# --- declarations ------------------------------------------------------------------------


class V1Model(pydantic.v1.BaseModel):
    x: int


class NotAPayload:
    x: int


@pytest.mark.parametrize(("declared", "shown"), [
    (FULL_ORDER, "an instance of Order"),
    (PCart(at=UTC_NOON, lines=[]), "an instance of PCart"),
    (dict, "dict"),
    (int, "int"),
    (list[int], "list[int]"),
    (None, "an instance of NoneType"),
    (V1Model, "V1Model"),
    (NotAPayload, "NotAPayload"),
])
def test_what_is_not_a_payload_class_is_refused(declared, shown):
    with pytest.raises(InvalidJobOption) as caught:
        PayloadType.of(declared, "shop.charge")
    assert str(caught.value) == ("task 'shop.charge': payload= takes a pydantic v2 model, a "
                                 f"dataclass or a TypedDict class, not {shown}")


@dataclasses.dataclass
class HasSet:
    name: str
    seen: list[set[int]]


@dataclasses.dataclass
class HoldsHasSet:
    inner: HasSet | None


class IntKeys(TypedDict):
    counts: dict[int, str]


class Shape(enum.Enum):
    BOX = (1, 2)


@dataclasses.dataclass
class HasShape:
    shape: Shape


@dataclasses.dataclass
class HasEnumLiteral:
    size: Literal[Size.SMALL]


@dataclasses.dataclass
class HasBytes:
    data: bytes


@dataclasses.dataclass
class Unresolvable:
    x: NoSuchName  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(("declared", "message"), [
    (HasSet, "payload field 'seen' of HasSet (list[set[int]]): set[int] cannot be converted "
             "to JSON and back"),
    (HoldsHasSet, "payload field 'seen' of HasSet (list[set[int]]): set[int] cannot be "
                  "converted to JSON and back"),
    (IntKeys, "payload field 'counts' of IntKeys (dict[int, str]): dict[int, str]: JSON object "
              "keys are str"),
    (HasShape, "payload field 'shape' of HasShape (Shape): the values of Shape are not all str, "
               "int, float, bool or None"),
    (HasEnumLiteral, "payload field 'size' of HasEnumLiteral (Literal[<Size.SMALL: 1>]): "
                     "Literal[<Size.SMALL: 1>] may only list str, int, bool or None values"),
    (HasBytes, "payload field 'data' of HasBytes (bytes): bytes cannot be converted to JSON "
               "and back"),
    (Unresolvable, "payload: the annotations of Unresolvable cannot be resolved: name "
                   "'NoSuchName' is not defined"),
])
def test_unsupported_annotations_are_refused_when_declared(declared, message):
    with pytest.raises(InvalidJobOption) as caught:
        PayloadType.of(declared, "shop.charge")
    assert str(caught.value) == f"task 'shop.charge': {message}"


# --- round trips of every kind -----------------------------------------------------------


@pytest.mark.parametrize(("declared", "value"), [
    (Order, FULL_ORDER),
    (Node, Node(0)),
    (Shipment, Shipment(PCart(at=UTC_NOON, lines=[]))),
    (Delivery, {"address": "a", "window": (UTC_NOON, UTC_NOON), "color": Color.GREEN,
                "lines": [], "tags": {"t": 0}}),
    (Basket, {"lines": []}),
    (PCart, PCart(at=UTC_NOON, lines=[PLine(sku="z", qty=-1)])),
])
def test_every_kind_round_trips_through_json_text(declared, value):
    pt = PayloadType.of(declared, "t")
    dumped = pt.dump(value)
    encode_json(dumped)  # storable as it is: no tuples, no other keys than str, no NaN
    assert pt.load(json.loads(json.dumps(dumped))) == value


def test_the_module_imports_and_works_without_pydantic():
    code = (
        "import sys\n"
        "sys.modules['pydantic'] = None\n"
        "import dataclasses, django_pgjobs.typed as typed\n"
        "@dataclasses.dataclass\n"
        "class P:\n"
        "    n: int\n"
        "pt = typed.PayloadType.of(P, 't')\n"
        "print(pt.kind, pt.dump(P(3)), pt.load({'n': 4}), 'pydantic' in sys.modules and "
        "sys.modules['pydantic'] is None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "dataclass {'n': 3} P(n=4) True\n"


class MarkedInsideAnnotated(TypedDict, total=False):
    must: Annotated[Required[int], "a note"]
    may: Annotated[NotRequired[int], "another"]


def test_a_typeddict_field_marked_required_inside_annotated_is_required() -> None:
    kind = PayloadType.of(MarkedInsideAnnotated, "t")
    assert kind.dump({"must": 1}) == {"must": 1}
    with pytest.raises(PayloadInvalid) as caught:
        kind.dump({"may": 1})
    assert (caught.value.path, caught.value.problem) == ("payload", "missing field 'must'")
