"""Typed payloads: a job's payload checked against the class its handler declares.

``@job(payload=Model)`` names a pydantic v2 model, a dataclass or a TypedDict. Enqueue stores
``PayloadType.dump(value)``, plain JSON the queue can keep, and the worker hands the handler
``PayloadType.load(stored)``, the typed object again. Both refuse a value that does not match
with ``PayloadInvalid``, naming the first place that does not (``payload.items[2].sku``).

pydantic models convert themselves, under their own config. Dataclasses and TypedDicts are
converted here, with nothing to install: ``_compile`` lists the annotations they may use, and
any other is refused when the handler is declared rather than when a job is enqueued. pydantic
is optional: it is only looked for once something has imported it.

Problems name types and declared choices, never the value given: payloads may be secrets, and
these messages end up in logs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import itertools
import json
import math
import sys
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Literal, Union

from .exceptions import InvalidJobOption, PayloadInvalid, PayloadNotJSON
from .payloads import INT_MAX_ABS, encode_json
from .validation import storable_text_problem

_SCALARS = (str, int, float, bool, type(None))
# The exact value of a str, int or float subclass (a StrEnum member's text, an IntEnum's int):
# str() of a (str, Enum) member would give its name instead.
_EXACT: dict[type, Callable[[Any], Any]] = {str: str.__str__, int: int.__index__,
                                            float: float.__float__}
# Values stored as text, each with how it is read back.
_TEXT: dict[type, Callable[[str], Any]] = {dt.datetime: dt.datetime.fromisoformat,
                                           dt.date: dt.date.fromisoformat,
                                           Decimal: Decimal, uuid.UUID: uuid.UUID}


def _describe(tp: Any) -> str:
    """``tp`` as a person would write it: ``int``, ``list[Card]``, ``int | None``."""
    if tp is type(None) or tp is Ellipsis:
        return "None" if tp is type(None) else "..."
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Union or origin is types.UnionType:
        return " | ".join(map(_describe, args))
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None and args:
        return f"{_describe(origin)}[{', '.join(map(_describe, args))}]"
    return getattr(tp, "__name__", None) or repr(tp).replace("typing.", "")


def _got(value: object) -> str:
    return "None" if value is None else type(value).__name__


def _is_pydantic(tp: object) -> bool:
    """Whether ``tp`` is a pydantic v2 model class (if it is, pydantic has been imported)."""
    base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
    return (isinstance(tp, type) and base is not None and issubclass(tp, base)
            and hasattr(tp, "model_validate"))


def _is_typeddict(tp: object) -> bool:
    # On Python 3.11, typing_extensions.TypedDict (which pydantic asks for) is a class of its own.
    extensions = sys.modules.get("typing_extensions")
    return typing.is_typeddict(tp) or (extensions is not None and extensions.is_typeddict(tp))


def _check_json(value: Any, path: str) -> Any:
    """``value`` itself if it is storable JSON; else ``PayloadInvalid`` at the bad place."""
    try:
        encode_json(value, root=path)
    except PayloadNotJSON as exc:
        raise PayloadInvalid(exc.path, str(exc)[len(f"not JSON at {exc.path}: "):]) from None
    return value


class _Unsupported(Exception):
    """An annotation with no conversion; the record holding it adds which field it is."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.field: str | None = None


class _Codec:
    """One annotation: ``convert(value, path, load)`` gives the JSON form of a typed value, or
    with ``load`` the typed value of a JSON form (a value already typed is taken as well)."""

    name = "value"

    def convert(self, value: Any, path: str, load: bool) -> Any:
        raise NotImplementedError

    def wrong(self, path: str, value: object) -> PayloadInvalid:
        return PayloadInvalid(path, f"expected {self.name}, got {_got(value)}")


class _Scalar(_Codec):
    """str, int, float, bool or None, stored as itself."""

    def __init__(self, tp: type) -> None:
        self.tp = tp

    def convert(self, value: Any, path: str, load: bool) -> Any:
        tp = self.tp
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                value = float(value)
            except OverflowError:
                raise PayloadInvalid(path, "integer too large for a float") from None
        # bool is an int to Python, never to a payload.
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise self.wrong(path, value)
        if isinstance(value, float) and not math.isfinite(value):
            raise PayloadInvalid(path, "not a finite number")
        if isinstance(value, int) and not -INT_MAX_ABS < value < INT_MAX_ABS:
            raise PayloadInvalid(path, "integer beyond ±2**1024, which JSON readers cannot hold")
        if isinstance(value, str) and (problem := storable_text_problem(value)) is not None:
            raise PayloadInvalid(path, problem)
        return value if type(value) is tp else _EXACT[tp](value)


class _AnyJSON(_Codec):
    """``Any``: whatever it is, it must already be JSON."""

    def convert(self, value: Any, path: str, load: bool) -> Any:
        return _check_json(value, path)


class _Text(_Codec):
    """datetime, date, Decimal or UUID, stored as its ISO or canonical text."""

    def __init__(self, tp: type) -> None:
        self.tp = tp

    def convert(self, value: Any, path: str, load: bool) -> Any:
        if load and isinstance(value, str):
            try:
                value = _TEXT[self.tp](value)
            except (ValueError, ArithmeticError):  # Decimal's InvalidOperation is the latter
                raise PayloadInvalid(path, f"not a valid {self.name}") from None
        # A datetime is a date to Python; as a date it would lose its time.
        if not isinstance(value, self.tp) or (self.tp is dt.date
                                              and isinstance(value, dt.datetime)):
            raise self.wrong(path, value)
        if isinstance(value, Decimal) and not value.is_finite():
            raise PayloadInvalid(path, "not a finite number")
        if load:
            return value
        return value.isoformat() if isinstance(value, dt.date) else str(value)


class _Enum(_Codec):
    """An Enum, stored as its member's value."""

    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls = cls

    def convert(self, value: Any, path: str, load: bool) -> Any:
        if isinstance(value, self.cls):
            return value if load else value.value
        if load and isinstance(value, _SCALARS):
            try:
                member = self.cls(value)
            except ValueError:
                member = None
            # Same type as well as equal: True is not the member whose value is 1.
            if member is not None and type(member.value) is type(value):
                return member
        choices = ", ".join(repr(member.value) for member in self.cls)
        raise PayloadInvalid(path, f"expected a {self.name} value ({choices}), got {_got(value)}")


class _Literal(_Codec):
    def __init__(self, choices: tuple[Any, ...]) -> None:
        self.choices = choices

    def convert(self, value: Any, path: str, load: bool) -> Any:
        for choice in self.choices:
            if type(choice) is type(value) and choice == value:
                return choice
        choices = ", ".join(map(repr, self.choices))
        raise PayloadInvalid(path, f"expected one of {choices}, got {_got(value)}")


class _Array(_Codec):
    """list[T], tuple[T, ...] or tuple[A, B]: a JSON list (a tuple is loaded back as one)."""

    def __init__(self, items: list[_Codec], fixed: bool, as_tuple: bool) -> None:
        self.items, self.fixed, self.as_tuple = items, fixed, as_tuple

    def convert(self, value: Any, path: str, load: bool) -> Any:
        typed = tuple if self.as_tuple else list
        if not isinstance(value, (typed, list) if load else typed):
            raise self.wrong(path, value)
        if self.fixed and len(value) != len(self.items):
            raise PayloadInvalid(path, f"expected {len(self.items)} items, got {len(value)}")
        codecs = self.items if self.fixed else itertools.repeat(self.items[0])
        items = [codec.convert(item, f"{path}[{index}]", load)
                 for index, (codec, item) in enumerate(zip(codecs, value, strict=False))]
        return tuple(items) if load and self.as_tuple else items


class _Dict(_Codec):
    """dict[str, T]: a JSON object."""

    def __init__(self, item: _Codec) -> None:
        self.item = item

    def convert(self, value: Any, path: str, load: bool) -> Any:
        if not isinstance(value, dict):
            raise self.wrong(path, value)
        items = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise PayloadInvalid(path, f"a key of type {_got(key)}: JSON object keys are str")
            if (problem := storable_text_problem(key)) is not None:
                raise PayloadInvalid(path, f"a key {problem}")
            items[str.__str__(key)] = self.item.convert(item, f"{path}[{key!r}]", load)
        return items


class _Union(_Codec):
    """Union[...], Optional[T], T | None: the first member that takes the value."""

    def __init__(self, members: list[_Codec]) -> None:
        self.members = members

    def convert(self, value: Any, path: str, load: bool) -> Any:
        refusals = []
        for member in self.members:
            try:
                return member.convert(value, path, load)
            except PayloadInvalid as exc:
                if member.name != "None":
                    refusals.append(exc)
        # The one member that is not None, or one refusing deeper down, says more than the
        # union's name: Optional[Card] given a card of a wrong number says which field.
        deeper = [exc for exc in refusals if exc.path != path]
        if len(refusals) == 1 or deeper:
            raise (deeper or refusals)[0]
        raise self.wrong(path, value)


class _Record(_Codec):
    """A TypedDict, and the base of a dataclass: named fields, each with its codec and whether
    it is required."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.name = cls.__name__
        self.fields: dict[str, tuple[_Codec, bool]] = {}

    def convert(self, value: Any, path: str, load: bool) -> Any:
        if not isinstance(value, dict):
            raise self.wrong(path, value)
        return self.convert_fields(value, path, load)

    def convert_fields(self, data: dict[Any, Any], path: str, load: bool) -> dict[str, Any]:
        for key in data:
            if key not in self.fields:
                raise PayloadInvalid(path, f"unknown field {key!r}")
        for name, (_, required) in self.fields.items():
            if required and name not in data:
                raise PayloadInvalid(path, f"missing field {name!r}")
        return {name: codec.convert(data[name], f"{path}.{name}", load)
                for name, (codec, _) in self.fields.items() if name in data}


class _Dataclass(_Record):
    def convert(self, value: Any, path: str, load: bool) -> Any:
        if isinstance(value, self.cls):
            # Each field is checked too: a dataclass does not check its own annotations.
            value = self.convert_fields({name: getattr(value, name) for name in self.fields},
                                        path, False)
            if not load:
                return value
        elif not load or not isinstance(value, dict):
            raise self.wrong(path, value)
        fields = self.convert_fields(value, path, True)
        try:
            return self.cls(**fields)
        except (TypeError, ValueError) as exc:  # refused by its __init__ or __post_init__
            raise PayloadInvalid(path, f"{self.name}() refused it: {exc}") from None


class _Pydantic(_Codec):
    """A pydantic model, converted by pydantic under the model's own config.

    The stored form is what the worker reads back: the model's JSON dump by alias, without
    computed fields, read back in pydantic's JSON mode (where a strict model takes a datetime
    as its ISO text). A model whose dump still does not read back (a validator that refuses its
    own output) is refused at enqueue, not found out by the worker.
    """

    def __init__(self, cls: Any) -> None:
        self.cls = cls
        self.name = cls.__name__

    def convert(self, value: Any, path: str, load: bool) -> Any:
        model = self._validated(value, path)
        if load:
            return model
        # A model may allow NaN, which its JSON dump keeps as a float.
        dumped = _check_json(model.model_dump(mode="json", by_alias=True,
                                              exclude_computed_fields=True), path)
        try:
            self.cls.model_validate_json(json.dumps(dumped))
        except sys.modules["pydantic"].ValidationError as exc:
            where, problem = _first_error(exc)
            raise PayloadInvalid(path + where, f"the model's JSON form does not validate back "
                                 f"as {self.name}: {problem}") from None
        return dumped

    def _validated(self, value: Any, path: str) -> Any:
        pydantic = sys.modules["pydantic"]
        try:
            if isinstance(value, dict):
                try:
                    text = json.dumps(value, allow_nan=False)
                except (TypeError, ValueError):  # typed values in it: validated as Python
                    return self.cls.model_validate(value)
                return self.cls.model_validate_json(text)
            return self.cls.model_validate(value)
        except pydantic.ValidationError as exc:
            where, problem = _first_error(exc)
            raise PayloadInvalid(path + where, problem) from None


def _first_error(exc: Any) -> tuple[str, str]:
    """Where a pydantic ``ValidationError``'s first error is (``.card.number``), and what."""
    error = exc.errors()[0]
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                    for part in error["loc"])
    return where, error["msg"]


def _compile(tp: Any, memo: dict[type, _Codec]) -> _Codec:
    """The codec of annotation ``tp``; ``_Unsupported`` if it has none."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    codec: _Codec
    if tp is Any:
        codec = _AnyJSON()
    elif tp in _SCALARS:
        codec = _Scalar(tp)
    elif origin is Literal:
        # Enum members are left out: an IntEnum member would never equal the int it is stored as.
        if not all(type(arg) in (str, int, bool, type(None)) for arg in args):
            raise _Unsupported(f"{_describe(tp)} may only list str, int, bool or None values")
        codec = _Literal(args)
    elif origin is Union or origin is types.UnionType:
        codec = _Union([_compile(arg, memo) for arg in args])
    elif tp is list or origin is list:
        codec = _Array([_compile(args[0] if args else Any, memo)], False, False)
    elif tp is tuple or origin is tuple:
        variadic = not args or (len(args) == 2 and args[1] is Ellipsis)
        items = [_compile(arg, memo) for arg in (args[:1] if variadic else args)] or [_AnyJSON()]
        codec = _Array(items, not variadic, True)
    elif tp is dict or origin is dict:
        if args and args[0] is not str:
            raise _Unsupported(f"{_describe(tp)}: JSON object keys are str")
        codec = _Dict(_compile(args[1] if args else Any, memo))
    elif origin is not None or not isinstance(tp, type):
        raise _Unsupported(f"{_describe(tp)} cannot be converted to JSON and back")
    elif tp in _TEXT:
        codec = _Text(tp)
    elif issubclass(tp, enum.Enum):
        if not all(type(member.value) in _SCALARS for member in tp):
            raise _Unsupported(f"the values of {tp.__name__} are not all str, int, float, bool "
                               "or None")
        codec = _Enum(tp)
    elif _is_pydantic(tp):
        return _Pydantic(tp)
    elif dataclasses.is_dataclass(tp) or _is_typeddict(tp):
        return memo[tp] if tp in memo else _record(tp, memo)
    else:
        raise _Unsupported(f"{_describe(tp)} cannot be converted to JSON and back")
    codec.name = _describe(tp)
    return codec


def _record(cls: type, memo: dict[type, _Codec]) -> _Codec:
    """The codec of a dataclass or a TypedDict, and of the types of its fields."""
    # Known before its fields are compiled: a record may hold itself (a tree of nodes).
    codec = memo[cls] = _Dataclass(cls) if dataclasses.is_dataclass(cls) else _Record(cls)
    try:
        hints = typing.get_type_hints(cls)
        marked = typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # a name the annotations use is not defined in the class's module
        raise _Unsupported(f"the annotations of {cls.__name__} cannot be resolved: {exc}") from None
    if dataclasses.is_dataclass(cls):
        # Fields not taken by __init__ are not stored: the class computes them again.
        missing = dataclasses.MISSING
        fields = [(f.name, f.default is missing and f.default_factory is missing)
                  for f in dataclasses.fields(cls) if f.init]
    else:
        # Python 3.11 misses Required/NotRequired in string annotations (from __future__ import
        # annotations) when it sets __required_keys__; resolved, they say it.
        required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
        marks = {name: _required_mark(marked[name]) for name in hints}
        fields = [(name, marks[name] is typing.Required
                   or (marks[name] is not typing.NotRequired and name in required_keys))
                  for name in hints]
    for name, required in fields:
        try:
            codec.fields[name] = (_compile(hints[name], memo), required)
        except _Unsupported as exc:
            if exc.field is None:  # the innermost record names the field
                exc.field = f"field {name!r} of {cls.__name__} ({_describe(hints[name])})"
            raise
    return codec


def _required_mark(annotation: Any) -> Any:
    """``Required`` or ``NotRequired`` if ``annotation`` says either, also inside ``Annotated``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    return typing.get_origin(annotation)


def _kind(declared: object) -> str | None:
    """Which of the three kinds of payload class ``declared`` is, if any."""
    if not isinstance(declared, type) or typing.get_origin(declared) is not None:
        return None
    if _is_pydantic(declared):
        return "pydantic"
    if dataclasses.is_dataclass(declared):
        return "dataclass"
    return "typeddict" if _is_typeddict(declared) else None


class PayloadType:
    """The class a handler declared with ``@job(payload=...)``, and its conversion to JSON."""

    kind: str
    model: type

    def __init__(self, kind: str, model: type, codec: _Codec) -> None:
        self.kind, self.model, self._codec = kind, model, codec

    def __repr__(self) -> str:
        return f"PayloadType({self.kind} {self.model.__qualname__})"

    @classmethod
    def of(cls, declared: object, task: str) -> PayloadType:
        """The payload type of ``declared``; ``InvalidJobOption`` if it cannot be one."""
        kind = _kind(declared)
        if kind is None:
            shown = (_describe(declared)
                     if isinstance(declared, type) or typing.get_origin(declared)
                     else f"an instance of {type(declared).__name__}")
            raise InvalidJobOption(f"task {task!r}: payload= takes a pydantic v2 model, a "
                                   f"dataclass or a TypedDict class, not {shown}")
        try:
            codec = _compile(declared, {})
        except _Unsupported as exc:
            where = f" {exc.field}" if exc.field else ""
            raise InvalidJobOption(f"task {task!r}: payload{where}: {exc.problem}") from None
        return cls(kind, typing.cast(type, declared), codec)

    def dump(self, value: object, root: str = "payload") -> object:
        """The JSON form of ``value``: an instance of the model, or a dict that validates."""
        if self.kind == "typeddict" or (self.kind == "dataclass" and isinstance(value, dict)):
            # A dict is read as the model first: its values may be typed or in their JSON form.
            value = self._convert(value, root, True)
        return self._convert(value, root, False)

    def load(self, value: object, root: str = "payload") -> object:
        """The typed value of a JSON form: a model or dataclass instance, or a checked dict."""
        return self._convert(value, root, True)

    def _convert(self, value: object, root: str, load: bool) -> object:
        try:
            return self._codec.convert(value, root, load)
        except RecursionError:  # a tree of records, or an Any, nested past Python's stack
            raise PayloadInvalid(root, "nested too deeply to convert") from None


__all__ = ["PayloadType"]
