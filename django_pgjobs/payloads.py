"""JSON that comes back exactly as it was given: payloads, results and receipt results.

``json.dumps`` alone is too forgiving for a queue: it turns tuples into lists and integer keys
into strings (the handler would get back something other than what was enqueued), and it writes
text that PostgreSQL's jsonb refuses (a NUL character, a lone surrogate) or that other readers
cannot parse (integers of thousands of digits). ``encode_json`` refuses all of these before
anything is sent, naming the path of the first bad value.

jsonb keeps a number as a decimal and prints it without an exponent: ``1e+16`` would come back
as the integer 10000000000000000. Floats that Python writes with a positive exponent are
written out in full with a fraction (``10000000000000000.0``), which comes back a float.
"""

from __future__ import annotations

import json
import json.encoder
import math
from decimal import Decimal
from typing import Any

from .exceptions import PayloadNotJSON, PayloadTooLarge
from .validation import nesting_problem, storable_text_problem

# Integers beyond this are refused: json.dumps raises on more than 4,300 digits, and no JSON
# reader outside Python holds them. 2**1024 (309 digits) is a double's range.
INT_MAX_ABS = 2**1024
# From here on, repr() of a float has an exponent and no fraction.
_FLOAT_WRITTEN_OUT = 1e16

_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
# JSONEncoder.encode builds its C encoder anew on every call, which cost three times the
# encoding of a small payload: this one is built once, with the same options. It looks for no
# cycles (no markers): _check, which runs first, bounds the depth of what reaches it.
_make_c_encoder = getattr(json.encoder, "c_make_encoder", None)  # None without the C module
_C_ENCODER = None if _make_c_encoder is None else _make_c_encoder(
    None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", False, False, False)


def _encode(value: Any) -> str:
    if _C_ENCODER is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODER(value, 0))


def encode_json(
    value: Any, *, root: str = "payload", limit: int | None = None, max_depth: int | None = None
) -> str:
    """``value`` as compact JSON text; raise ``PayloadNotJSON`` or ``PayloadTooLarge``.

    ``limit`` bounds the encoded size in bytes, ``max_depth`` the nesting of lists and objects.
    """
    exponent = _check(value, root, 0, max_depth if max_depth is not None else 10_000)
    encoded = written_out(value) if exponent else _encode(value)
    if limit is not None:
        size = len(encoded) if encoded.isascii() else len(encoded.encode("utf-8"))
        if size > limit:
            raise PayloadTooLarge(size, limit)
    return encoded


def written_out(value: Any) -> str:
    """``value`` as compact JSON with every float in full: what jsonb gives back as a float.

    For values ``json.dumps`` takes: tuples are written as lists and keys as it writes them.
    Rare enough for plain recursion.
    """
    if isinstance(value, str):
        return json.encoder.encode_basestring(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if -_FLOAT_WRITTEN_OUT < value < _FLOAT_WRITTEN_OUT:
            return float.__repr__(value)
        return f"{Decimal(float.__repr__(value)):f}.0"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(key)}:{written_out(item)}"
                              for key, item in value.items()) + "}"
    return "[" + ",".join(written_out(item) for item in value) + "]"


def _key(key: Any) -> str:
    # json.dumps's keys: str, and float (as repr), bool, None and int written as text.
    if not isinstance(key, str):
        key = float.__repr__(key) if isinstance(key, float) else written_out(key)
    return json.encoder.encode_basestring(key)


def _check(value: Any, path: str, depth: int, max_depth: int) -> bool:
    """Raise if ``value`` is not storable JSON; say whether it holds a float of an exponent."""
    # The recursion is bounded by max_depth, far below Python's own limit.
    if isinstance(value, str):
        problem = storable_text_problem(value)
        if problem is not None:
            raise PayloadNotJSON(path, problem)
        return False
    if value is None or isinstance(value, bool):
        return False
    if isinstance(value, int):
        if not -INT_MAX_ABS < value < INT_MAX_ABS:
            raise PayloadNotJSON(path, "an integer beyond ±2**1024 has no JSON reader outside "
                                 "Python; send it as a string")
        return False
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadNotJSON(path, f"{value!r} is not a finite number")
        return not -_FLOAT_WRITTEN_OUT < value < _FLOAT_WRITTEN_OUT
    if isinstance(value, list | dict):
        if depth >= max_depth:
            raise PayloadNotJSON(path, nesting_problem(max_depth))
        # Most items are scalars of the usual kinds, tested here inline; only the others cost
        # a call, and a path.
        listed = isinstance(value, list)
        pairs = enumerate(value) if isinstance(value, list) else value.items()
        exponent = False
        for key, item in pairs:
            if not listed and not (type(key) is str and key.isascii() and "\x00" not in key):
                if not isinstance(key, str):
                    raise PayloadNotJSON(
                        path, f"key {key!r} is a {type(key).__name__}, not a string")
                problem = storable_text_problem(key)
                if problem is not None:
                    raise PayloadNotJSON(path, f"key {key!r} {problem}")
            kind = type(item)
            if not ((kind is int and -INT_MAX_ABS < item < INT_MAX_ABS)
                    or (kind is str and item.isascii() and "\x00" not in item)
                    or item is None or kind is bool
                    or (kind is float and -_FLOAT_WRITTEN_OUT < item < _FLOAT_WRITTEN_OUT)):
                exponent = _check(item, f"{path}[{key}]" if listed else f"{path}[{key!r}]",
                                  depth + 1, max_depth) or exponent
        return exponent
    raise PayloadNotJSON(path, f"{type(value).__name__} is not JSON (use str, int, float, "
                         "bool, None, list or dict)")


__all__ = ["INT_MAX_ABS", "encode_json", "written_out"]
