"""The vacuum horizon watch: a session that holds a snapshot open is named, on a real server,
by the dashboard, pgjobs_stats, the metrics and a system check."""

from __future__ import annotations

import time
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_pgjobs import stats
from django_pgjobs.checks import check_database
from tests.conftest import holding_snapshot, session

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/pgjobs/job/dashboard/"


@pytest.fixture
def report() -> Iterator[int]:
    """A session of 'nightly-report' holding a REPEATABLE READ snapshot; its pid."""
    with holding_snapshot("nightly-report") as pid:
        yield pid


def mine(pid: int) -> stats.HorizonHolder:
    [holder] = [h for h in stats.horizon() if h.kind == "session" and h.holder == str(pid)]
    return holder


def test_a_session_holding_a_snapshot_is_listed_with_its_application_and_state(
    report: int,
) -> None:
    holder = mine(report)
    assert (holder.application_name, holder.state) == ("nightly-report", "idle in transaction")
    assert holder.seconds is not None and holder.seconds >= 0 and holder.xids >= 0
    assert not holder.holds  # younger than five minutes


def test_a_session_that_only_connected_holds_nothing() -> None:
    with session("idle-client") as idle:
        pid = idle.info.backend_pid
        assert [h for h in stats.horizon() if h.holder == str(pid)] == []


@override_settings(PGJOBS_HORIZON_WARN_SECONDS=1)
def test_past_the_threshold_the_dashboard_stats_metrics_and_checks_name_it(
    report: int, login,
) -> None:
    time.sleep(1.2)
    assert mine(report).holds

    page = login("view_job").get(DASHBOARD).content.decode()
    health = page.split('id="pgjobs-health"', 1)[1].split("</div>", 1)[0]
    assert f"A session (pid {report}, &#x27;nightly-report&#x27;" in health
    assert "keeps vacuum from removing the rows of finished jobs" in health
    assert 'id="pgjobs-horizon"' in page

    out = StringIO()
    call_command("pgjobs_stats", stdout=out)
    line = next(row for row in out.getvalue().splitlines() if row.lstrip().startswith(str(report)))
    assert "nightly-report" in line and "HOLDS" in line

    [warning] = [m for m in check_database(["default"]) if m.id == "pgjobs.W004"
                 and f"pid {report}" in m.msg]
    assert "nightly-report" in warning.msg

    from prometheus_client import CollectorRegistry, generate_latest

    from django_pgjobs.metrics import StatsCollector

    registry = CollectorRegistry()
    registry.register(StatsCollector())
    held = next(line for line in generate_latest(registry).decode().splitlines()
                if line.startswith("pgjobs_horizon_held_seconds "))
    assert float(held.split()[1]) >= 1.0


def test_with_the_snapshot_gone_nothing_is_named(login) -> None:
    with override_settings(PGJOBS_HORIZON_WARN_SECONDS=1):
        with session("short-report") as held:
            held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            held.execute("SELECT 1").fetchone()
            pid = held.info.backend_pid
            held.rollback()
        time.sleep(1.2)
        assert [h for h in stats.horizon() if h.holder == str(pid)] == []
        assert not [m for m in check_database(["default"]) if f"pid {pid}" in m.msg]
