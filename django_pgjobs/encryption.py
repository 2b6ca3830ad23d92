"""Encrypted fields: values a handler names are stored as ciphertext, never as plaintext.

A handler declares paths (``@job(encrypted=["card.number", "token"])``, the path language of
redaction). Before the INSERT, the value at each path is replaced by an envelope, a string::

    pgjobs:enc:v1:<key id>:<base64url of nonce + AES-256-GCM ciphertext and tag>

The plaintext is the value's JSON, so a number, a list or a whole object can be encrypted. The
associated data binds an envelope to where it was written (``payload``, ``result`` or
``receipt``, the task or receipt scope, and the concrete path): an envelope copied into another
field, task or scope does not open. Envelopes say which key sealed them, so reading needs no
declaration: every envelope of a document opens with the key its id names, and the rotation
(``pgjobs_rotate_keys``) finds each one sealed under a key other than the first.

Keys come from ``PGJOBS_ENCRYPTION_KEYS``: a list of 32-byte keys in URL-safe base64; the first
encrypts, all decrypt. A key's id is derived from the key itself (the first 8 hex digits of a
SHA-256 under a label), so the list needs no names and a reordered list still opens everything.
What this covers and what it does not: docs/security.md.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .conf import settings
from .exceptions import EncryptedPathMissing, EncryptionNotConfigured, Undecryptable
from .payloads import encode_json
from .redaction import (
    ANY_STEP,
    ENVELOPE,
    ENVELOPE_PREFIX,
    compile_path,
    replace_envelopes,
)
from .validation import ENCRYPTION_KEY_BYTES, encryption_key_bytes, setting_problem

NONCE_BYTES = 12

# Where an envelope was written, the first part of its associated data.
PAYLOAD = "payload"
RESULT = "result"
RECEIPT = "receipt"


def new_key() -> str:
    """A fresh key for ``PGJOBS_ENCRYPTION_KEYS``."""
    return base64.urlsafe_b64encode(os.urandom(ENCRYPTION_KEY_BYTES)).decode("ascii")


def key_id(raw: bytes) -> str:
    """The id an envelope names its key by."""
    return hashlib.sha256(b"django-pgjobs key id\x00" + raw).hexdigest()[:8]


@dataclass(frozen=True)
class Keyring:
    """The configured keys: the first seals, each opens what names its id."""

    primary: str
    ciphers: dict[str, Any]  # key id -> AESGCM

    def seal(self, value: Any, associated: bytes, root: str = "value") -> str:
        """The envelope of ``value``; ``PayloadNotJSON`` at ``root`` if it is not JSON."""
        plaintext = encode_json(value, root=root,
                                max_depth=settings.MAX_PAYLOAD_DEPTH).encode("utf-8")
        nonce = os.urandom(NONCE_BYTES)
        sealed = self.ciphers[self.primary].encrypt(nonce, plaintext, associated)
        token = base64.urlsafe_b64encode(nonce + sealed).decode("ascii").rstrip("=")
        return f"{ENVELOPE_PREFIX}{self.primary}:{token}"

    def open(self, key: str, token: str, associated: bytes) -> Any:
        """The value of an envelope's parts; raise ``ValueError`` saying why it does not open."""
        from cryptography.exceptions import InvalidTag

        cipher = self.ciphers.get(key)
        if cipher is None:
            raise ValueError("PGJOBS_ENCRYPTION_KEYS no longer holds that key")
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        try:
            plaintext = cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], associated)
        except InvalidTag:
            raise ValueError("it was altered, or written for another field") from None
        return json.loads(plaintext)


def keyring() -> Keyring:
    """The keys of ``PGJOBS_ENCRYPTION_KEYS``; ``EncryptionNotConfigured`` if there are none."""
    configured = settings.ENCRYPTION_KEYS
    if not isinstance(configured, list | tuple) or not all(
            isinstance(key, str) for key in configured):
        raise EncryptionNotConfigured(
            f"PGJOBS_ENCRYPTION_KEYS {setting_problem('ENCRYPTION_KEYS', configured)}")
    return _keyring(tuple(configured))


@lru_cache(maxsize=8)
def _keyring(configured: tuple[str, ...]) -> Keyring:
    # Checked once per value of the setting, not at every enqueue (each key decoded).
    problem = setting_problem("ENCRYPTION_KEYS", configured)
    if problem is not None:
        raise EncryptionNotConfigured(f"PGJOBS_ENCRYPTION_KEYS {problem}")
    if not configured:
        raise EncryptionNotConfigured(
            "PGJOBS_ENCRYPTION_KEYS is empty, and a handler declares encrypted fields: set it "
            "to a list of keys (manage.py pgjobs_rotate_keys --generate-key prints one)")
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    raws = [encryption_key_bytes(text) for text in configured]
    ciphers = {key_id(raw): AESGCM(raw) for raw in raws if raw is not None}
    return Keyring(key_id(raws[0] or b""), ciphers)


def checked_paths(paths: Iterable[str], owner: str) -> tuple[str, ...]:
    """``paths`` as declared, each parsed once: ``ValueError`` naming ``owner`` for a bad one."""
    if isinstance(paths, str):
        raise ValueError(f"{owner}: encrypted= takes a list of paths, not one string")
    declared = tuple(paths)
    for path in declared:
        if not isinstance(path, str):
            raise ValueError(f"{owner}: an encrypted path must be a string, got "
                             f"{type(path).__name__}")
        try:
            compile_path(path)
        except ValueError as exc:
            raise ValueError(f"{owner}: {exc}") from None
    return declared


def _associated(where: str, owner: str, location: Sequence[object]) -> bytes:
    return "\x00".join((where, owner, json.dumps(list(location)))).encode("utf-8")


# --- writing -------------------------------------------------------------------------------


def seal(value: Any, paths: Sequence[str], *, where: str, owner: str,
         keep_sealed: bool = False) -> Any:
    """A copy of ``value`` with the value at each path sealed; ``value`` itself is left alone.

    A path of keys and indexes must name a value; one with a ``*`` may match none (an empty
    list). What a caller gives is always sealed, an envelope-shaped string too: one copied from
    another job's row must not open as this job's. ``keep_sealed``: the value is a row's, as
    stored (a replay's), and its envelopes stay as they are.
    """
    if not paths:
        return value
    ring = keyring()
    for path in paths:
        steps = compile_path(path)
        found = [False]

        def sealed(old: Any, location: tuple[object, ...], found: list[bool] = found) -> Any:
            found[0] = True
            if keep_sealed and isinstance(old, str) and ENVELOPE.fullmatch(old):
                return old
            return ring.seal(old, _associated(where, owner, location), spelled(where, location))

        value = _replace_at(value, steps, (), sealed)
        if not found[0] and ANY_STEP not in steps:
            raise EncryptedPathMissing(where, path)
    return value


def _replace_at(value: Any, steps: Sequence[object], location: tuple[object, ...],
                replace: Callable[[Any, tuple[object, ...]], Any]) -> Any:
    if not steps:
        return replace(value, location)
    step, rest = steps[0], steps[1:]
    if isinstance(value, dict) and not isinstance(step, int):
        return {k: _replace_at(v, rest, (*location, k), replace)
                if step is ANY_STEP or k == step else v for k, v in value.items()}
    if isinstance(value, list) and not isinstance(step, str):
        return [_replace_at(v, rest, (*location, i), replace)
                if step is ANY_STEP or i == step else v for i, v in enumerate(value)]
    return value


# --- reading -------------------------------------------------------------------------------


def envelopes(value: Any) -> list[tuple[tuple[object, ...], str]]:
    """Each envelope of ``value``: its location and the id of the key that sealed it."""
    found: list[tuple[tuple[object, ...], str]] = []

    def note(envelope: re.Match[str], location: tuple[object, ...]) -> str:
        found.append((location, envelope[1]))
        return envelope[0]

    replace_envelopes(value, note)
    return found


def holds_envelopes(value: Any) -> bool:
    """Whether ``value`` may hold an envelope: asked of every payload a worker runs, so a loop
    over a stack rather than ``envelopes``' nested generators (half the time)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item.startswith(ENVELOPE_PREFIX):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def opened(value: Any, paths: Sequence[str], *, where: str, owner: str) -> Any:
    """``value`` with the envelopes at ``paths`` opened; ``Undecryptable`` names the first that
    does not. Only the declared paths: a string elsewhere that looks like an envelope is data
    (a user's text) and stays as it is."""
    if not paths or not holds_envelopes(value):
        return value
    rings: list[Keyring] = []

    def open_if_sealed(old: Any, location: tuple[object, ...]) -> Any:
        match = (ENVELOPE.fullmatch(old) if isinstance(old, str)
                 and old.startswith(ENVELOPE_PREFIX) else None)
        if match is None:
            return old  # written before the path was declared encrypted
        if not rings:
            rings.append(keyring_for_reading(where))
        return _open(rings[0], match, where, owner, location)

    for path in paths:
        value = _replace_at(value, compile_path(path), (), open_if_sealed)
    return value


def sealed_at(value: Any, paths: Sequence[str], *, where: str) -> list[str]:
    """The spelled locations of the envelopes at ``paths`` (what a reveal would decrypt)."""
    found: list[str] = []

    def note(old: Any, location: tuple[object, ...]) -> Any:
        if isinstance(old, str) and ENVELOPE.fullmatch(old):
            found.append(spelled(where, location))
        return old

    for path in paths:
        _replace_at(value, compile_path(path), (), note)
    return found


def keyring_for_reading(where: str) -> Keyring:
    try:
        return keyring()
    except EncryptionNotConfigured as exc:
        raise Undecryptable(where, where, "-", str(exc), key_missing=True) from None


def _open(ring: Keyring, envelope: re.Match[str], where: str, owner: str,
          location: tuple[object, ...]) -> Any:
    try:
        return ring.open(envelope[1], envelope[2], _associated(where, owner, location))
    except ValueError as exc:
        raise Undecryptable(where, spelled(where, location), envelope[1], str(exc),
                            key_missing=envelope[1] not in ring.ciphers) from None


def resealed(value: Any, *, where: str, owner: str) -> tuple[Any, int]:
    """``value`` with each envelope not sealed by the first key sealed by it; how many."""
    ring = keyring()
    count = [0]

    def again(envelope: re.Match[str], location: tuple[object, ...]) -> Any:
        if envelope[1] == ring.primary:
            return envelope[0]
        count[0] += 1
        plain = _open(ring, envelope, where, owner, location)
        return ring.seal(plain, _associated(where, owner, location))

    return replace_envelopes(value, again), count[0]


def spelled(root: str, location: Sequence[object]) -> str:
    """A location as the error messages of payloads write it: ``payload.card.number``."""
    text = root
    for step in location:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text


__all__ = [
    "PAYLOAD", "RECEIPT", "RESULT", "Keyring", "checked_paths", "envelopes", "holds_envelopes",
    "key_id", "keyring", "new_key", "opened", "resealed", "seal", "spelled",
]
