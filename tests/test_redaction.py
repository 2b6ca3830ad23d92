"""The one redactor: secret keys at any depth, handler paths, and scrubbing of text and logs."""

from __future__ import annotations

import io
import logging
import traceback
from typing import Any

import pytest
from django.test import override_settings

from django_pgjobs import job
from django_pgjobs.redaction import REDACTED, RedactingFilter, Redactor, compile_path
from django_pgjobs.registry import redactor_for


def redact_payload(payload: Any, *, task: str | None = None) -> Any:
    return redactor_for(task).payload(payload)


def scrub_text(text: str, *, payload: Any = None, task: str | None = None) -> str:
    return redactor_for(task).text(text, payload)


@job("tests.redaction.signup", redact=("customer.email", "items[*].pan", "notes[1]"))
def signup(ctx: Any, payload: Any) -> None:
    """A handler that declares redaction paths."""


KEYS = ("password", "api_key", "authorization", "card", "token")


def test_secret_keys_are_hidden_at_any_depth_whatever_their_case_and_separators() -> None:
    payload = {
        "user": "ada",
        "Password": "hunter22",
        "headers": {"X-Authorization": "Bearer abc.def", "X-Api-Key": "k-123", "accept": "json"},
        "cards": [{"cardNumber": 4111111111111111, "holder": "Ada"}],
        "meta": {"deep": {"deeper": {"refresh_token": "rt-999", "apiKey": "k-456"}}},
    }
    assert Redactor(KEYS).payload(payload) == {
        "user": "ada",
        "Password": REDACTED,
        "headers": {"X-Authorization": REDACTED, "X-Api-Key": REDACTED, "accept": "json"},
        # "cards" contains "card": the whole list is hidden, not only the numbers in it.
        "cards": REDACTED,
        "meta": {"deep": {"deeper": {"refresh_token": REDACTED, "apiKey": REDACTED}}},
    }


def test_keys_match_whole_words_only() -> None:
    redactor = Redactor(("card", "pass", "api_key", "session"))
    assert redactor.payload({
        "discard_reason": "dup", "passenger": "Ada", "cards": [1], "db_pass": "x",
        "xApiKeyId": "k", "api": "v1", "sessionid": "s", "session_token": "t",
        "HTTPCardHolder": "Grace", "key": "order:1",
    }) == {
        "discard_reason": "dup", "passenger": "Ada", "cards": REDACTED, "db_pass": REDACTED,
        "xApiKeyId": REDACTED, "api": "v1", "sessionid": "s", "session_token": REDACTED,
        "HTTPCardHolder": REDACTED, "key": "order:1",
    }


def test_redacting_leaves_the_original_untouched() -> None:
    payload = {"password": "p4ss", "items": [{"token": "t0k"}]}
    Redactor(KEYS).payload(payload)
    assert payload == {"password": "p4ss", "items": [{"token": "t0k"}]}


def test_scalars_and_lists_without_secret_keys_pass_through() -> None:
    assert Redactor(KEYS).payload([1, "two", None, {"n": 3}]) == [1, "two", None, {"n": 3}]
    assert Redactor(KEYS).payload("password") == "password"


def test_handler_paths_hide_what_keys_do_not_name() -> None:
    redactor = Redactor(KEYS, ("customer.email", "items[*].pan", "notes[1]", "tags.*"))
    payload = {
        "customer": {"email": "ada@example.com", "name": "Ada"},
        "items": [{"pan": "5555444433331111", "qty": 1}, {"pan": "4000056655665556"}],
        "notes": ["public", "private note", "public"],
        "tags": {"a": 1, "b": 2},
        "other": {"email": "kept@example.com"},
    }
    assert redactor.payload(payload) == {
        "customer": {"email": REDACTED, "name": "Ada"},
        "items": [{"pan": REDACTED, "qty": 1}, {"pan": REDACTED}],
        "notes": ["public", REDACTED, "public"],
        "tags": {"a": REDACTED, "b": REDACTED},
        "other": {"email": "kept@example.com"},
    }


def test_a_path_may_start_with_a_list_and_ignores_shapes_it_does_not_fit() -> None:
    redactor = Redactor((), ("[*].email", "customer.email"))
    assert redactor.payload([{"email": "a@b.c"}, {"name": "x"}]) == [
        {"email": REDACTED}, {"name": "x"},
    ]
    assert redactor.payload({"customer": "just a string"}) == {"customer": "just a string"}


@pytest.mark.parametrize("bad", ["", " a", "a..b", "a[x]", "a.[0]", "a[0", "a]"])
def test_malformed_paths_are_refused_with_the_path_in_the_message(bad: str) -> None:
    with pytest.raises(ValueError, match="redaction path"):
        compile_path(bad)


def test_the_task_s_declared_paths_and_the_setting_s_keys_combine() -> None:
    payload = {"customer": {"email": "ada@example.com"}, "password": "hunter22",
               "items": [{"pan": "4111"}], "notes": ["a", "b"]}
    assert redact_payload(payload, task="tests.redaction.signup") == {
        "customer": {"email": REDACTED}, "password": REDACTED,
        "items": [{"pan": REDACTED}], "notes": ["a", REDACTED],
    }
    # Another task's paths do not apply; the keys still do.
    assert redact_payload(payload, task="tests.ok")["customer"] == {"email": "ada@example.com"}
    assert redact_payload(payload, task="no.such.task")["password"] == REDACTED


@override_settings(PGJOBS_REDACT_KEYS=("colour",))
def test_the_keys_come_from_the_setting_at_call_time() -> None:
    assert redact_payload({"favourite_colour": "blue", "password": "x"}) == {
        "favourite_colour": REDACTED, "password": "x",
    }


def test_secret_values_are_scrubbed_out_of_errors_in_every_form_they_appear() -> None:
    payload = {"api_key": "sk_live_51H8", "customer": {"email": "ada@example.com"},
               "note": "it's \"quoted\""}
    redactor = Redactor(KEYS, ("customer.email", "note"))
    error = (
        "ValueError: key sk_live_51H8 rejected for ada@example.com; "
        "payload was {'api_key': 'sk_live_51H8', 'note': 'it\\'s \"quoted\"'}"
    )
    assert redactor.text(error, payload) == (
        f"ValueError: key {REDACTED} rejected for {REDACTED}; "
        f"payload was {{'api_key': {REDACTED}, 'note': '{REDACTED}'}}"
    )


def test_a_real_traceback_loses_the_secret_its_message_repeated() -> None:
    payload = {"card_number": "4111111111111111", "amount": 100}

    def charge(p: dict[str, Any]) -> None:
        raise RuntimeError(f"card {p['card_number']} declined")

    try:
        charge(payload)
    except RuntimeError as exc:
        tb = "".join(traceback.format_exception(exc))
    assert "4111111111111111" in tb
    scrubbed = scrub_text(tb, payload=payload)
    assert "4111111111111111" not in scrubbed
    assert f"RuntimeError: card {REDACTED} declined" in scrubbed
    assert ", in charge" in scrubbed  # the rest is still readable


def test_key_value_pairs_are_scrubbed_even_when_the_value_is_not_in_the_payload() -> None:
    text = (
        'POST /v1/charges failed: Authorization: Bearer eyJhbGciOi.xyz; retry with '
        'password="correct horse" api-key=k_99 and {"token": "t-1"}; amount=100'
    )
    assert Redactor(KEYS).text(text) == (
        f"POST /v1/charges failed: Authorization: Bearer {REDACTED}; retry with "
        f'password={REDACTED} api-key={REDACTED} and {{"token": {REDACTED}}}; amount=100'
    )


def test_very_short_values_are_hidden_in_payloads_but_not_scrubbed_from_text() -> None:
    payload = {"pin": "12", "password": "ab"}
    redacted = Redactor(("pin", "password")).redact(payload)
    assert redacted.value == {"pin": REDACTED, "password": REDACTED}
    assert redacted.secrets == ()
    assert Redactor(("pin",)).text("line 12, in handler", payload) == "line 12, in handler"


def test_numbers_and_nested_values_under_a_secret_key_are_scrubbed_too() -> None:
    payload = {"card": {"number": 4242424242424242, "cvc": "314", "ok": True}}
    redacted = Redactor(("card",)).redact(payload)
    assert redacted.secrets == ("4242424242424242", "314")
    assert Redactor(("card",)).text("4242424242424242 / 314 / True", payload) == (
        f"{REDACTED} / {REDACTED} / True"
    )


def test_strings_of_a_shown_payload_or_result_are_scrubbed_like_error_text() -> None:
    redactor = Redactor((*KEYS, "auth"))  # "auth" is among the default keys
    result = {"receipt": "auth_code=RCPT-4242 at 10:02", "status": "ok", "n": 3,
              "callback": "https://app:hunter22@hooks.example/x", "token": "tok-123456",
              "log": ["sent tok-123456"]}
    assert redactor.payload(result) == {
        "receipt": f"auth_code={REDACTED} at 10:02", "status": "ok", "n": 3,
        "callback": f"https://app:{REDACTED}@hooks.example/x", "token": REDACTED,
        "log": [f"sent {REDACTED}"],
    }
    assert redactor.payload("auth_code=RCPT-4242") == f"auth_code={REDACTED}"
    assert redactor.payload(["password: pw-1", 7, None]) == [f"password: {REDACTED}", 7, None]


def test_a_hidden_value_repeated_elsewhere_is_scrubbed_too() -> None:
    redactor = Redactor(("card",))
    document = {"HTTPCardHolder": "Ada Lovelace", "card_number": 4111111111111111,
                "passenger": "Ada Lovelace", "note": "booked for Ada Lovelace",
                "ref": 4111111111111111, "seats": 2}
    assert redactor.payload(document) == {
        "HTTPCardHolder": REDACTED, "card_number": REDACTED,
        "passenger": REDACTED, "note": f"booked for {REDACTED}",
        "ref": REDACTED, "seats": 2,
    }


def test_a_result_loses_the_hidden_values_of_the_payload_it_is_shown_with() -> None:
    redactor = redactor_for("tests.redaction.signup")
    payload = {"customer": {"email": "ada@example.com"}, "items": [{"pan": 5555444433331111}]}
    result = {"sent_to": "ada@example.com", "log": ["welcome mail to ada@example.com"],
              "charged": 5555444433331111, "count": 1}
    assert redactor.payload(result, also=payload) == {
        "sent_to": REDACTED, "log": [f"welcome mail to {REDACTED}"], "charged": REDACTED,
        "count": 1,
    }
    # Alone, the result names no secret key or path: nothing in it is hidden.
    assert redactor.payload(result) == result


def test_empty_text_stays_empty() -> None:
    assert redactor_for("tests.redaction.signup").text("", {"password": "x"}) == ""


def test_the_logging_filter_scrubs_messages_and_tracebacks() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("tests.redaction.filter")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("calling upstream with %s", "token=abc123 user=ada")
        try:
            raise ConnectionError("refused: password=hunter22")
        except ConnectionError:
            log.exception("upstream failed")
    finally:
        log.removeHandler(handler)
    out = stream.getvalue()
    assert f"WARNING calling upstream with token={REDACTED} user=ada" in out
    assert f"ConnectionError: refused: password={REDACTED}" in out
    assert "abc123" not in out and "hunter22" not in out


def test_an_exception_class_name_is_not_taken_for_a_secret_key() -> None:
    redactor = Redactor(KEYS)
    assert redactor.text("CardError: card expired") == "CardError: card expired"
    # Only names that look like exception classes are exempt before a colon.
    assert redactor.text("TokenExpired: password=hunter22") == f"TokenExpired: {REDACTED}"
    assert redactor.text("AuthTokenError: password=hunter22") == (
        f"AuthTokenError: password={REDACTED}"
    )
    assert redactor.text("Authorization: Basic dXNlcg==") == f"Authorization: Basic {REDACTED}"


def test_camel_case_secret_keys_before_a_colon_are_scrubbed() -> None:
    text = "upstream said apiKey: k-1 accessToken: t-2 clientSecret: s-3 userId: 7"
    assert redactor_for(None).text(text) == (
        f"upstream said apiKey: {REDACTED} accessToken: {REDACTED} clientSecret: {REDACTED} "
        "userId: 7"
    )


def test_passwords_in_urls_and_dsns_are_scrubbed() -> None:
    text = ("could not connect to postgres://app:s3cr3t-pw@db.internal:5432/main; "
            "fetching https://ada:hunter22@example.com/x and redis://:only-pw@cache:6379/0; "
            "http://example.com/a@b stays")
    assert redactor_for(None).text(text) == (
        f"could not connect to postgres://app:{REDACTED}@db.internal:5432/main; "
        f"fetching https://ada:{REDACTED}@example.com/x and redis://:{REDACTED}@cache:6379/0; "
        "http://example.com/a@b stays"
    )


@pytest.mark.parametrize("key", ["pwd", "db_pass", "passphrase", "credentials", "jwt",
                                 "private_key", "cookie", "session", "userPassword",
                                 "X-Session-Id", "awsCredentials", "SSH_PRIVATE_KEY"])
def test_the_default_keys_hide_common_secret_names(key: str) -> None:
    assert redactor_for(None).payload({key: "v"}) == {key: REDACTED}


@pytest.mark.parametrize("key", ["passenger", "compass", "discard_reason", "author", "keys",
                                 "tokenizer_name", "cardinality"])
def test_the_default_keys_leave_words_that_merely_contain_them(key: str) -> None:
    assert redactor_for(None).payload({key: "v"}) == {key: "v"}


def test_only_the_exact_encrypted_marker_escapes_redaction() -> None:
    from django_pgjobs.redaction import Redactor

    redactor = Redactor(("password",))
    shown = redactor.payload({"password": "[encrypted, key 0] hunter2",
                              "token": "pgjobs:enc:v1:1a2b3c4d:" + "A" * 40})
    assert shown["password"] == "[redacted]"
    assert shown["token"] == "[encrypted, key 1a2b3c4d]"
    assert "hunter2" not in redactor.text("login failed: [encrypted, key 0] hunter2",
                                          {"password": "[encrypted, key 0] hunter2"})
