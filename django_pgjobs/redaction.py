"""One redactor for payloads, errors, tracebacks, logs and exports.

Two rules decide what is hidden:

- keys: a mapping key is secret when its normalised form (lower case, letters and digits only)
  contains a normalised entry of ``PGJOBS_REDACT_KEYS``, at any depth. ``"X-Api-Key"`` matches
  ``"api_key"``; the match errs toward hiding (``"card"`` also hides ``"discard_reason"``).
- paths: a handler declares ``redact=("customer.email", "items[*].pan")``. A path is segments
  joined by ``.``; a segment is a key or ``*`` (every key of a mapping), optionally followed by
  ``[*]`` (every element of a list) or ``[N]`` (element N); a path may start with ``[*]`` for a
  payload that is a list. Keys that contain ``.``, ``[`` or ``]`` cannot be named by a path.

A hidden value shows as ``[redacted]``, whole (a secret mapping hides everything under it). Text
(error messages, tracebacks, log lines) is scrubbed twice: every hidden value of the job's
payload is replaced wherever it appears, and ``<secret key>=<value>`` or ``<secret key>: <value>``
pairs are replaced whatever their value.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .conf import settings

REDACTED = "[redacted]"
# Shorter hidden values are not scrubbed out of text: replacing every "1" or "ab" in a traceback
# would destroy it without protecting anything worth protecting.
MIN_SCRUB_CHARS = 3

_SEGMENT = re.compile(r"^(?P<key>[^.\[\]]*)(?P<indexes>(?:\[(?:\*|\d+)\])*)$")
_INDEX = re.compile(r"\[(\*|\d+)\]")
_ANY = object()
_CAMEL_CASE = re.compile(r"[a-z][A-Z]")


@dataclass(frozen=True)
class Redacted:
    """A redacted copy of a value, and the text of what was hidden (for scrubbing)."""

    value: Any
    secrets: tuple[str, ...]


@dataclass(frozen=True)
class Redactor:
    """Hide secret keys and declared paths in payloads, and their values in text."""

    keys: tuple[str, ...]
    paths: tuple[str, ...] = ()

    def redact(self, value: Any) -> Redacted:
        """Return a copy of ``value`` with secrets replaced, and the secrets' text."""
        hidden: list[Any] = []
        copy = _redact_keys(value, _normalised_keys(self.keys), hidden)
        for path in self.paths:
            copy = _redact_path(copy, compile_path(path), hidden)
        return Redacted(copy, tuple(_secret_texts(hidden)))

    def payload(self, value: Any) -> Any:
        """Return a copy of ``value`` with secrets replaced."""
        return self.redact(value).value

    def text(self, text: str, payload: Any = None) -> str:
        """Scrub ``payload``'s secret values and any ``key=value`` secrets out of ``text``."""
        if not text:
            return text
        secrets = self.redact(payload).secrets if payload is not None else ()
        if secrets:
            text = _secret_values_pattern(secrets).sub(REDACTED, text)
        pattern = _key_value_pattern(tuple(self.keys))
        return _scrub_pairs(pattern, text) if pattern is not None else text


def redactor_for(task: str | None = None) -> Redactor:
    """The redactor for ``task``: the configured keys plus the paths its handler declares."""
    from .registry import registry

    handler = registry.get(task) if task else None
    paths = tuple(handler.redact) if handler is not None else ()
    return Redactor(tuple(settings.REDACT_KEYS), paths)


def redact_payload(payload: Any, *, task: str | None = None) -> Any:
    """Return ``payload`` as an operator without the raw-payload permission may see it."""
    return redactor_for(task).payload(payload)


def scrub_text(text: str, *, payload: Any = None, task: str | None = None) -> str:
    """Return ``text`` (an error, a traceback, a log line) with the job's secrets removed."""
    return redactor_for(task).text(text, payload)


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs ``key=value`` secrets from messages and tracebacks.

    Attach it to a handler (``"filters": {"redact": {"()": "django_pgjobs.redaction.
    RedactingFilter"}}``). Log lines carry no payloads, so only the key rule applies here.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = redactor_for(None)
        record.msg = redactor.text(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redactor.text(record.exc_text)
        return True


# --- paths ----------------------------------------------------------------------------------


@lru_cache(maxsize=512)
def compile_path(path: str) -> tuple[object, ...]:
    """Parse a redaction path into steps: a key (str), an index (int) or any (``_ANY``)."""
    if not path or path.strip() != path:
        raise ValueError(f"redaction path {path!r} is empty or has surrounding spaces")
    steps: list[object] = []
    for position, segment in enumerate(path.split(".")):
        match = _SEGMENT.match(segment)
        if match is None or (not match["key"] and not match["indexes"]):
            raise ValueError(
                f"redaction path {path!r}: bad segment {segment!r} (use key, *, key[*] or key[N])"
            )
        key = match["key"]
        if key:
            steps.append(_ANY if key == "*" else key)
        elif position > 0:
            raise ValueError(f"redaction path {path!r}: only the first segment may start with [")
        for index in _INDEX.findall(match["indexes"]):
            steps.append(_ANY if index == "*" else int(index))
    return tuple(steps)


def _redact_path(value: Any, steps: Sequence[object], hidden: list[Any]) -> Any:
    if not steps:
        hidden.append(value)
        return REDACTED
    step, rest = steps[0], steps[1:]
    if isinstance(value, dict):
        if isinstance(step, int):
            return value
        return {
            k: _redact_path(v, rest, hidden) if step is _ANY or k == step else v
            for k, v in value.items()
        }
    if isinstance(value, list):
        if isinstance(step, str):
            return value
        return [
            _redact_path(v, rest, hidden) if step is _ANY or i == step else v
            for i, v in enumerate(value)
        ]
    return value


# --- keys -----------------------------------------------------------------------------------


def _normalise(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


@lru_cache(maxsize=32)
def _normalised_keys(keys: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in (_normalise(k) for k in keys) if n)


def _is_secret_key(key: object, keys: tuple[str, ...]) -> bool:
    if not isinstance(key, str):
        return False
    normal = _normalise(key)
    return any(k in normal for k in keys)


def _redact_keys(value: Any, keys: tuple[str, ...], hidden: list[Any]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _is_secret_key(k, keys):
                hidden.append(v)
                out[k] = REDACTED
            else:
                out[k] = _redact_keys(v, keys, hidden)
        return out
    if isinstance(value, list):
        return [_redact_keys(v, keys, hidden) for v in value]
    return value


# --- text -----------------------------------------------------------------------------------


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _secret_texts(hidden: Iterable[Any]) -> Iterator[str]:
    seen: set[str] = set()
    for value in hidden:
        for leaf in _leaves(value):
            if leaf is None or isinstance(leaf, bool) or leaf == REDACTED:
                continue
            text = leaf if isinstance(leaf, str) else json.dumps(leaf)
            # The forms a message is likely to repeat the value in: as is, repr'd, JSON-encoded.
            for form in (text, repr(text)[1:-1], json.dumps(text)[1:-1]):
                if len(form) >= MIN_SCRUB_CHARS and form not in seen:
                    seen.add(form)
                    yield form


@lru_cache(maxsize=256)
def _secret_values_pattern(secrets: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first, so a secret that contains another is replaced whole.
    ordered = sorted(secrets, key=len, reverse=True)
    return re.compile("|".join(re.escape(s) for s in ordered))


@lru_cache(maxsize=32)
def _key_value_pattern(keys: tuple[str, ...]) -> re.Pattern[str] | None:
    words = []
    for key in keys:
        parts = [re.escape(p) for p in re.split(r"[^A-Za-z0-9]+", key) if p]
        if parts:
            words.append("[-_ ]?".join(parts))
    if not words:
        return None
    return re.compile(
        r"(?P<head>(?P<key>[\w.-]*(?:" + "|".join(words) + r")[\w.-]*)(?P<quote>['\"]?)"
        r"\s*(?P<sep>[:=])\s*(?:(?:bearer|basic|token)\s+)?)"
        r"(?:\"[^\"]*\"|'[^']*'|[^\s,;&'\")\]}]+)",
        re.IGNORECASE,
    )


def _scrub_pairs(pattern: re.Pattern[str], text: str) -> str:
    out, pos = [], 0
    while (match := pattern.search(text, pos)) is not None:
        if match["sep"] == ":" and not match["quote"] and _CAMEL_CASE.search(match["key"]):
            # "CardError: ..." names an exception class, not a secret; look again after it.
            out.append(text[pos:match.end("sep")])
            pos = match.end("sep")
            continue
        out.append(text[pos:match.start()] + match["head"] + REDACTED)
        pos = match.end()
    out.append(text[pos:])
    return "".join(out)


__all__ = [
    "MIN_SCRUB_CHARS",
    "REDACTED",
    "Redacted",
    "RedactingFilter",
    "Redactor",
    "compile_path",
    "redact_payload",
    "redactor_for",
    "scrub_text",
]
