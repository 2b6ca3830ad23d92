"""The failover harness, short: a primary crashed mid-drain and its standby promoted, under
synchronous and asynchronous replication (the latter with a forced window of lag), and a
primary turned read-only under its workers while its standby is promoted.

It needs its own servers, so it runs as ``python -m tests.harness.failover`` in a subprocess
and this test reads its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.slow

# readonly: the checks on how soon the workers and their listeners leave the old primary.
PROMPTNESS = (
    "every worker settled jobs on the new primary within 10s of the switch",
    "the new primary's backlog drained within 10s of the enqueues stopping",
    "jobs enqueued on the new primary after the switch were picked up",
    "the listeners left the old primary with their workers",
    "every listener left the read-only old primary for the new one",
    "pickups on the new primary were woken by notifications, not polls",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("failover") / "report.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("PGJOBS_DATABASE_NAME", "DATABASE_URL")}
    result = subprocess.run(
        [sys.executable, "-m", "tests.harness.failover", "--mode", "all", "--workers", "2",
         "--seconds", "6", "--json", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    assert path.exists(), result.stdout + result.stderr
    data = json.loads(path.read_text())
    data["output"] = result.stdout + result.stderr
    data["returncode"] = result.returncode
    return data


def checks(report: dict, mode: str) -> dict[str, dict]:
    return {c["name"]: c for c in report[mode]["checks"]}


def test_the_exit_status_says_whether_every_enforced_check_held(report: dict) -> None:
    held = all(c["ok"] for mode in ("sync", "async", "readonly")
               for c in report[mode]["checks"] if c["enforced"])
    assert (report["returncode"] == 0) == held, report["output"]


def test_under_synchronous_replication_every_invariant_holds_across_the_failover(
    report: dict,
) -> None:
    for name, check in checks(report, "sync").items():
        assert check["ok"], (name, check["detail"], report["output"])
    figures = report["sync"]["figures"]
    assert figures["acknowledged enqueues"] > 0
    assert figures["workers resumed s after the switch"] is not None, report["output"]
    assert figures["acknowledged enqueues lost"] == 0


def test_under_asynchronous_replication_the_lag_window_loses_work_and_pairs_still_hold(
    report: dict,
) -> None:
    found = checks(report, "async")
    figures = report["async"]["figures"]
    # Reported, not failed: what an asynchronous standby had not received is gone.
    assert not found["every acknowledged enqueue exists after the failover"]["enforced"]
    # The forced window really lost work: if cutting the standby off stops working, this fails
    # rather than a run that lost nothing passing for one that survived a loss.
    assert found["the forced window of lag lost commits"]["ok"], report["output"]
    assert figures["acknowledged enqueues lost"] > 0, report["output"]
    assert figures["charges that ran on both servers"] > 0, report["output"]
    for name in ("an order and its job are both there or both gone", "every job ended",
                 "every worker drained and exited 0",
                 "workers settled jobs on the promoted standby",
                 "enqueues went on against the promoted standby"):
        assert found[name]["ok"], (name, found[name]["detail"], report["output"])


def test_with_the_old_primary_read_only_nothing_is_lost_and_the_work_ends_on_the_new_one(
    report: dict,
) -> None:
    found = checks(report, "readonly")
    for name, check in found.items():
        if name not in PROMPTNESS:
            assert check["ok"], (name, check["detail"], report["output"])
    figures = report["readonly"]["figures"]
    assert figures["acknowledged enqueues lost"] == 0
    assert figures["acknowledged enqueues after the promotion"] > 0
    assert figures["worker log lines saying read-only"]["explained by the worker"] > 0


def test_with_the_old_primary_read_only_workers_and_listeners_leave_it_promptly(
    report: dict,
) -> None:
    found = checks(report, "readonly")
    for name in PROMPTNESS:
        assert found[name]["ok"], (name, found[name]["detail"], report["output"])
