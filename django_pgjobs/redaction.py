"""One redactor for payloads, errors, tracebacks, logs and exports.

Two rules decide what is hidden:

- keys: a mapping key is secret when the words of an entry of ``PGJOBS_REDACT_KEYS`` stand in
  it as whole words, at any depth. A key's words are its parts in snake, kebab or camel case
  (``"X-Api-Key"`` and ``"xApiKey"`` are ``x api key``, so both match ``"api_key"``); a word may
  carry a plural ``s`` (``"cards"`` matches ``"card"``), but ``"card"`` does not hide
  ``"discard_reason"`` and ``"pass"`` does not hide ``"passenger"``.
- paths: a handler declares ``redact=("customer.email", "items[*].pan")``. A path is segments
  joined by ``.``; a segment is a key or ``*`` (every key of a mapping), optionally followed by
  ``[*]`` (every element of a list) or ``[N]`` (element N); a path may start with ``[*]`` for a
  payload that is a list. Keys that contain ``.``, ``[`` or ``]`` cannot be named by a path.

A hidden value shows as ``[redacted]``, whole (a secret mapping hides everything under it). Text
(error messages, tracebacks, log lines, and the strings of a payload or result as shown) is
scrubbed three ways: every hidden value of the job's payload (and of a shown document itself)
is replaced wherever it appears; ``<secret key>=<value>`` and ``<secret key>: <value>`` pairs
are replaced whatever their value (a name ending in ``Error``, ``Exception`` or ``Warning``
before a colon is an exception class, not a key); and the password of a URL or DSN
(``scheme://user:password@host``) is replaced. A number of a shown document equal to a hidden
value is hidden too.

What an application writes into free text under no key (``"charged 4111..."``) cannot be found
unless the payload holds the same value: see docs/security.md.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg

from .conf import settings

REDACTED = "[redacted]"
# A value stored encrypted (django_pgjobs.encryption): a viewer sees the id of its key only.
ENVELOPE_PREFIX = "pgjobs:enc:v1:"
ENVELOPE = re.compile(r"pgjobs:enc:v1:([0-9a-f]{8}):([A-Za-z0-9_-]{38,})")
ENCRYPTED_SHOWN_AS = "[encrypted, key {}]"
# Shorter hidden values are not scrubbed out of text: replacing every "1" or "ab" in a traceback
# would destroy it without protecting anything worth protecting.
MIN_SCRUB_CHARS = 3

_SEGMENT = re.compile(r"^(?P<key>[^.\[\]]*)(?P<indexes>(?:\[(?:\*|\d+)\])*)$")
_INDEX = re.compile(r"\[(\*|\d+)\]")
ANY_STEP = object()
# The words of a key: runs of capitals before a capitalised word (HTTPHeader: HTTP, Header),
# capitalised or lower-case words, digits.
_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
_EXCEPTION_CLASS = re.compile(r"(?:Error|Exception|Warning)$")
# Any ``name: value`` or ``name=value`` pair; whether the name is secret is decided per match.
_PAIR = re.compile(
    r"(?P<head>(?P<key>[A-Za-z_][\w.-]*)(?P<quote>['\"]?)\s*(?P<sep>[:=])\s*"
    r"(?:(?:bearer|basic|token)\s+)?)"
    r"(?:\"[^\"]*\"|'[^']*'|[^\s,;&'\")\]}]+)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:)(?P<password>[^\s@/?#]+)(?=@)"
)


@dataclass(frozen=True)
class Redacted:
    """A redacted copy of a value, and the text of what was hidden (for scrubbing)."""

    value: Any
    secrets: tuple[str, ...]


@dataclass(frozen=True)
class Redactor:
    """Hide secret keys and declared paths in payloads, and their values in text.

    ``paths_for``, when given, adds paths that depend on the value itself (a django.tasks
    payload's positional arguments, named by the function's parameters).
    """

    keys: tuple[str, ...]
    paths: tuple[str, ...] = ()
    paths_for: Callable[[Any, tuple[str, ...]], Iterable[str]] | None = None

    def redact(self, value: Any) -> Redacted:
        """Return a copy of ``value`` with secrets replaced, and the secrets' text."""
        hidden: list[Any] = []
        keys = _key_words(self.keys)
        copy = _redact_keys(value, keys, hidden)
        paths = self.paths
        if self.paths_for is not None:
            paths = (*paths, *self.paths_for(value, self.keys))
        for path in paths:
            copy = _redact_path(copy, compile_path(path), hidden)
        return Redacted(copy, tuple(_secret_texts(hidden)))

    def is_secret(self, key: str) -> bool:
        """Whether a mapping key (or an argument's name) is secret under these keys."""
        return _is_secret_key(key, _key_words(self.keys))

    def payload(self, value: Any, also: Any = None) -> Any:
        """Return a copy of ``value`` (a payload, a result) as a viewer may see it.

        Secret keys and paths are hidden, and every value left is scrubbed as text is: a
        result written as free text (``"auth_code=RCPT-4242"``) hides its secret as an error of
        the same shape does, and so does a value that repeats a hidden one. ``also`` is another
        document whose hidden values are scrubbed too: a result, shown with its job's payload,
        loses the ``customer.email`` its handler echoed under a key of its own.
        """
        redacted = self.redact(masked(value))
        secrets = redacted.secrets
        if also is not None:
            secrets = tuple(dict.fromkeys((*secrets, *self.redact(also).secrets)))
        return _scrub_values(redacted.value, lambda text: self._scrubbed(text, secrets))

    def text(self, text: str, payload: Any = None) -> str:
        """Scrub ``payload``'s secret values, ``key=value`` secrets and URL passwords."""
        if not text:
            return text
        return self._scrubbed(text, self.redact(payload).secrets if payload is not None else ())

    def _scrubbed(self, text: str, secrets: tuple[str, ...]) -> str:
        if secrets:
            text = _secret_values_pattern(secrets).sub(REDACTED, text)
        text = _URL_PASSWORD.sub(lambda m: m["head"] + REDACTED, text)
        return _scrub_pairs(_key_words(self.keys), text)


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs ``key=value`` secrets from messages and tracebacks.

    Attach it to a handler (``"filters": {"redact": {"()": "django_pgjobs.redaction.
    RedactingFilter"}}``). Log lines carry no payloads, so only the key rule applies here.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        redactor = Redactor(tuple(settings.REDACT_KEYS))
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
    """Parse a redaction path into steps: a key (str), an index (int) or any (``ANY_STEP``)."""
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
            steps.append(ANY_STEP if key == "*" else key)
        elif position > 0:
            raise ValueError(f"redaction path {path!r}: only the first segment may start with [")
        for index in _INDEX.findall(match["indexes"]):
            steps.append(ANY_STEP if index == "*" else int(index))
    return tuple(steps)


def _redact_path(value: Any, steps: Sequence[object], hidden: list[Any]) -> Any:
    if not steps:
        if _shown_encrypted(value):
            return value  # hidden as well, and says how
        hidden.append(value)
        return REDACTED
    step, rest = steps[0], steps[1:]
    if isinstance(value, dict):
        if isinstance(step, int):
            return value
        return {
            k: _redact_path(v, rest, hidden) if step is ANY_STEP or k == step else v
            for k, v in value.items()
        }
    if isinstance(value, list):
        if isinstance(step, str):
            return value
        return [
            _redact_path(v, rest, hidden) if step is ANY_STEP or i == step else v
            for i, v in enumerate(value)
        ]
    return value


# --- keys -----------------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def key_words(key: str) -> tuple[str, ...]:
    """A key's words, lower case: ``"X-Api-Key"`` and ``"xApiKey"`` are ``("x", "api", "key")``."""
    return tuple(word.lower() for word in _WORD.findall(key))


@lru_cache(maxsize=32)
def _key_words(keys: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(words for words in map(key_words, keys) if words)


@lru_cache(maxsize=4096)
def _is_secret_key(key: object, keys: tuple[tuple[str, ...], ...]) -> bool:
    if not isinstance(key, str):
        return False
    words = key_words(key)
    for entry in keys:
        last = len(words) - len(entry)
        for start in range(last + 1):
            if all(word == part or word == part + "s"
                   for word, part in zip(words[start:], entry, strict=False)):
                return True
    return False


def _redact_keys(value: Any, keys: tuple[tuple[str, ...], ...], hidden: list[Any]) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if _shown_encrypted(v):
                out[k] = v  # hidden as well, and says how
            elif _is_secret_key(k, keys):
                hidden.append(v)
                out[k] = REDACTED
            else:
                out[k] = _redact_keys(v, keys, hidden)
        return out
    if isinstance(value, list):
        return [_redact_keys(v, keys, hidden) for v in value]
    return value


# --- text -----------------------------------------------------------------------------------


_SHOWN_ENCRYPTED = re.compile(r"\[encrypted, key [0-9a-f]{8}\]")


def _shown_encrypted(value: Any) -> bool:
    """Whether ``value`` is exactly what ``masked`` shows for an encrypted value."""
    return isinstance(value, str) and _SHOWN_ENCRYPTED.fullmatch(value) is not None


def masked(value: Any) -> Any:
    """``value`` with each encrypted value shown as ``[encrypted, key …]``."""
    return replace_envelopes(value, lambda envelope, _: ENCRYPTED_SHOWN_AS.format(envelope[1]))


def replace_envelopes(
    value: Any, replace: Callable[[re.Match[str], tuple[object, ...]], Any],
    location: tuple[object, ...] = (),
) -> Any:
    """A copy of ``value`` with each encrypted value (``ENVELOPE``) replaced by what
    ``replace(match, location)`` gives; ``location`` is its keys and indexes from the top."""
    if isinstance(value, str):
        match = ENVELOPE.fullmatch(value) if value.startswith(ENVELOPE_PREFIX) else None
        return value if match is None else replace(match, location)
    if isinstance(value, dict):
        return {k: replace_envelopes(v, replace, (*location, k)) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_envelopes(v, replace, (*location, i)) for i, v in enumerate(value)]
    return value


def _scrub_values(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` with ``scrub`` applied to every string in it (not to mapping keys).

    A number equal to a hidden value is hidden: a card number echoed as a number is as secret
    as one echoed in a string.
    """
    if isinstance(value, str):
        return value if value == REDACTED else scrub(value)
    if isinstance(value, dict):
        return {k: _scrub_values(v, scrub) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_values(v, scrub) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return REDACTED if scrub(json.dumps(value)) == REDACTED else value
    return value


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
            if leaf is None or isinstance(leaf, bool) or leaf == REDACTED or _shown_encrypted(
                    leaf):
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


def database_cause(exc: BaseException) -> psycopg.Error | None:
    """The driver's error behind ``exc`` (itself, or the one Django wraps); None if none."""
    cause = exc if isinstance(exc, psycopg.Error) else exc.__cause__
    return cause if isinstance(cause, psycopg.Error) else None


def database_error_text(exc: BaseException) -> str | None:
    """A database error's primary message and SQLSTATE; None for an error of anything else.

    The server's report also has DETAIL and CONTEXT parts, which quote the data that failed (a
    CHECK's DETAIL is the whole failing row, payload and all): they are left out.
    """
    cause = database_cause(exc)
    if cause is None:
        return None
    primary = cause.diag.message_primary
    if not primary:
        return type(cause).__name__
    return f"{primary} (SQLSTATE {cause.sqlstate})" if cause.sqlstate else primary


def _scrub_pairs(keys: tuple[tuple[str, ...], ...], text: str) -> str:
    out, pos = [], 0
    while (match := _PAIR.search(text, pos)) is not None:
        key = match["key"]
        exception_class = (
            match["sep"] == ":" and not match["quote"] and _EXCEPTION_CLASS.search(key)
        )
        if exception_class or not _is_secret_key(key, keys):
            # "CardError: ..." names an exception class; "amount=100" is no secret. Look again
            # after the separator: the value may hold a pair of its own.
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
    "database_error_text",
    "key_words",
]
