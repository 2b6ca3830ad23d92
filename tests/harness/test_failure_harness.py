"""The failure harness, CI-sized: real workers, every fault, every invariant asserted.

The run needs its own PostgreSQL server (it crashes and restarts it), so it runs as
``python -m tests.harness --profile ci`` in a subprocess and this test reads its JSON report.
It takes about a minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.slow

# What each targeted fault must leave behind (the job's attempt outcomes, releases left out;
# how often its side effect happened; which attempt's effect the job's result carries).
EXPECTED_TARGETS = {
    "kill_before_effect/plain": {
        "outcomes": ["lease_expired", "succeeded"], "effects": 1, "effect_from_attempt": 2},
    "kill_after_effect/plain": {
        "outcomes": ["lease_expired", "succeeded"], "effects": 2, "effect_from_attempt": 2},
    # The retry found the receipt and replayed the first attempt's stored result.
    "kill_after_effect/receipted": {
        "outcomes": ["lease_expired", "succeeded"], "effects": 1, "effect_from_attempt": 1},
    # The stopped worker's late report was kept beside the rescue's lease_expired and changed
    # nothing (first_reported is what it reported); without a receipt its resumed handler
    # repeated the effect and reported success; with one, its receipt block found the lease
    # gone and rolled back with LeaseLost (reported a failure).
    "stop_until_takeover/plain": {
        "outcomes": ["lease_expired", "succeeded"], "first_reported": "succeeded", "effects": 2,
        "effect_from_attempt": 2, "resumed_after_takeover": True},
    "stop_until_takeover/receipted": {
        "outcomes": ["lease_expired", "succeeded"], "first_reported": "failed", "effects": 1,
        "effect_from_attempt": 2, "resumed_after_takeover": True},
    "disconnect/plain": {
        "outcomes": ["failed", "succeeded"], "first_failure_class": "transient", "effects": 1,
        "effect_from_attempt": 2, "worker_went_on": True},
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("harness") / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PGJOBS_DATABASE_NAME"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.harness", "--profile", "ci", "--seed", "1",
         "--json", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert path.exists(), result.stdout + result.stderr
    data = json.loads(path.read_text())
    data["output"] = result.stdout + result.stderr
    data["returncode"] = result.returncode
    return data


def test_every_invariant_held(report: dict) -> None:
    failed = {c["name"]: c["problems"] for c in report["checks"] if not c["ok"]}
    assert failed == {}, report["output"]
    assert report["record"]["notes"] == [], report["output"]
    assert report["returncode"] == 0, report["output"]


def test_every_targeted_fault_ended_exactly_as_expected(report: dict) -> None:
    seen = {key.split(":", 2)[2]: value for key, value in report["figures"]["targets"].items()}
    assert set(seen) == set(EXPECTED_TARGETS)
    for name, expected in EXPECTED_TARGETS.items():
        assert seen[name]["status"] == "succeeded", name
        assert seen[name]["struck"] is True, name
        assert {k: seen[name][k] for k in expected} == expected, name


def test_the_run_injected_every_fault_and_lost_nothing(report: dict) -> None:
    figures = report["figures"]
    # Three targeted kills, and one of a worker whose child process is writing effects.
    assert figures["faults"]["kill/targeted"] == 3 + 1
    assert figures["faults"]["stop/targeted"] == 2
    assert figures["faults"]["disconnect/targeted"] == 1
    assert figures["restarts"] == 1
    assert figures["poison_kills"] == 3  # one poison job, max_attempts 3
    assert figures["jobs_lost"] == 0
    assert figures["receipted_duplicates"] == 0
    # At least the two the targeted faults force (kill after the effect, stop): at-least-once.
    assert figures["plain"]["duplicates"] >= 2
    # The stopped workers' late reports, each kept beside the rescue's record of its attempt.
    assert figures["late_reports_kept_beside"] >= 2
    assert figures["late_reports_lost"] == 0
    assert figures["jobs_by_status"]["scheduled"] == 2  # the jobs for later, still waiting
    # The poison job, and the two handlers that never return and time out.
    assert figures["jobs_by_status"]["dead"] == 1 + 2
    # Running handlers of four kinds, and the batched jobs cancelled while they waited.
    assert figures["jobs_by_status"]["cancelled"] == 4 + figures["queued_cancelled"]
    assert figures["flood"]["ordinary"] == 20
    assert figures["recovery_targeted_max_s"] <= figures["recovery_bound_s"]
    # Jobs under a limit of two per group ran beside the rest, and some group reached it.
    assert figures["limits"]["jobs"] > 0
    assert max(figures["limits"]["most_at_once"].values()) == 2
    # And jobs under a rate of five a second per group, over two groups.
    assert figures["rates"]["jobs"] > 0
    assert len(figures["rates"]["starts"]) == 2


def test_replayed_enqueues_returned_one_job_per_key(report: dict) -> None:
    calls = report["record"]["replays"]["calls"]
    assert len(calls) == 10
    for key, results in calls.items():
        assert len(results) == 5, key  # four replays at once, one after the job finished
        assert len({job_id for job_id, _ in results}) == 1, key
        assert [created for _, created in results].count(True) == 1, key


def test_a_cancel_reached_a_claimed_job_before_its_handler_started(report: dict) -> None:
    # Without one, "no handler started after its job's cancel" held without being tested.
    assert report["figures"]["cancels_before_start"] >= 1, report["output"]


def test_schedules_were_edited_while_their_ticks_were_enqueued(report: dict) -> None:
    edits = report["record"]["schedules"]
    assert len(edits["names"]) == 3
    assert set(edits["edits"]) == {"payload", "cron", "pause"}, edits
    assert edits["saved_over_a_tick"] >= 1, edits
