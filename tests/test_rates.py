"""Rates: at most count starts of one key per period, spaced by the generic cell rate algorithm,
held by the database: a key's one slot is held by the job that starts next, and the claim that
starts it charges the key and hands the slot on."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

import django_pgjobs
from django_pgjobs import InvalidJobOption, InvalidLimitKey, Limit, Rate, RateLimited
from django_pgjobs.context import JobContext
from django_pgjobs.executor import execute
from django_pgjobs.maintenance import RateStep, Step
from django_pgjobs.models import Job, KeyRate, KeySlot
from django_pgjobs.outcomes import Outcome
from django_pgjobs.stats import key_limits
from django_pgjobs.transitions import (
    cancel_jobs,
    claim_jobs,
    rescue_expired_leases,
    set_key_limit,
    settle,
    start_rate_heads,
)
from tests.conftest import ended_attempts, succeeded, wait_for

pytestmark = pytest.mark.django_db


def statuses(*jobs: Job) -> list[str]:
    return [Job.objects.get(pk=j.pk).status for j in jobs]


def rated(account: str, n: int, **payload: Any) -> list[Job]:
    return [django_pgjobs.enqueue("tests.rated", {"account": account, "i": i, **payload})
            for i in range(n)]


def run_job(claimed: Any) -> Outcome:
    return execute(claimed, JobContext(claimed, worker_id="w", using="default"))


def holder(key: str) -> int | None:
    return KeySlot.objects.get(key=key, n=0).job_id


def gcra_violations(starts: list[tuple[datetime, int]], interval: float, burst: int) -> list[int]:
    """The starts (by index) a rate of one unit per ``interval`` with ``burst`` would refuse."""
    tat: datetime | None = None
    refused = []
    for i, (at, weight) in enumerate(sorted(starts)):
        cost = timedelta(seconds=weight * interval)
        if tat is not None and at < tat + cost - timedelta(seconds=burst * interval):
            refused.append(i)
        tat = max(tat or at, at) + cost
    return refused


# --- declaring a rate -----------------------------------------------------------------------------


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Rate(0, per=1), "Rate count must be a whole number from 1 to 10000, got 0"),
    (lambda: Rate(-1, per=1), "got -1"),
    (lambda: Rate(math.nan, per=1), "got nan"),  # type: ignore[arg-type]
    (lambda: Rate(5), "Rate needs its period"),
    (lambda: Rate(5, per=0), "Rate per .* must be a finite number"),
    (lambda: Rate(5, per=-1), "got -1"),
    (lambda: Rate(5, per=math.nan), "got nan"),
    (lambda: Rate(5, per=math.inf), "got inf"),
    (lambda: Rate(5, per=timedelta(0)), "Rate per"),
    (lambda: Rate(5, per="1s"), "must be a number, got '1s'"),  # type: ignore[arg-type]
    (lambda: Rate(5, per=1, burst=0), "Rate burst must be a whole number"),
    (lambda: Rate(5, per=1, burst=math.inf), "Rate burst"),  # type: ignore[arg-type]
    (lambda: Rate(5, per=1, weight=0), "Rate weight must be a whole number"),
    (lambda: Rate(5, per=1, burst=2, weight=3), "at most the burst \\(2\\)"),
    (lambda: Rate(5, per=1, key=5), "Rate key must be a function"),  # type: ignore[arg-type]
    (lambda: Rate(5, per=1, name="two words"), "Rate name must be a task name"),
    (lambda: django_pgjobs.job("tests.clash", limit=Limit(1, name="provider-api"))(
        lambda ctx, p: None), "its Limit is named 'provider-api', which task "
                              "'tests.rated_provider' names its Rate"),
])
def test_a_bad_rate_is_refused_where_it_is_declared(make, message) -> None:
    with pytest.raises(InvalidJobOption, match=message):
        make()


@pytest.mark.parametrize(("payload", "message"), [
    ({}, r"the limit key function raised KeyError"),
    ({"account": "a", "weight": 0}, "the rate weight function's answer must be a whole number"),
    ({"account": "a", "weight": 4}, r"must be at most the burst \(3\)"),
    ({"account": "a", "weight": "2"}, "got '2'"),
    ({"account": "a", "weight": None}, "got None"),
])
def test_a_key_or_weight_that_fails_is_refused_before_any_sql(payload, message) -> None:
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidLimitKey,
                                                                          match=message):
            django_pgjobs.enqueue("tests.rated", payload)
        assert queries.captured_queries == []
        django_pgjobs.enqueue("tests.ok", {})
    assert list(Job.objects.values_list("task", flat=True)) == ["tests.ok"]


def test_a_job_under_a_rate_records_its_key_rate_and_weight() -> None:
    job = django_pgjobs.enqueue("tests.rated", {"account": "acme", "weight": 2})
    row = Job.objects.get(pk=job.pk)
    assert (row.limit_key, row.limit_max, row.rate_interval, row.rate_burst, row.rate_weight) == (
        "tests.rated:acme", 1, 1.0, 3, 2)
    assert (job.limit_key, job.rate_weight) == ("tests.rated:acme", 2)


# --- one slot, charged at the claim ---------------------------------------------------------------


def test_one_job_of_a_key_is_ready_at_a_time_and_each_claim_hands_the_slot_on() -> None:
    jobs = rated("acme", 5)
    other = rated("other", 1)[0]
    assert [j.status for j in jobs] == ["ready"] + ["throttled"] * 4
    assert other.status == "ready"
    # Burst 3: three start back to back, each claim making the next ready in its statement
    # (not in its own answer: the claim chose its rows before).
    for n in range(3):
        claimed = claim_jobs("w", "default", 10)
        assert [c.id for c in claimed] == ([jobs[0].pk, other.pk] if n == 0 else [jobs[n].pk])
        assert holder("tests.rated:acme") == jobs[n + 1].pk
    # The fourth waits a second after the first: throttled, holding the slot, its run_at set.
    assert statuses(*jobs) == ["running"] * 3 + ["throttled"] * 2
    fourth = Job.objects.get(pk=jobs[3].pk)
    claimed_at = Job.objects.get(pk=jobs[0].pk).claimed_at
    assert fourth.limit_slot == 0
    assert fourth.run_at == claimed_at + timedelta(seconds=1)
    assert claim_jobs("w", "default", 10) == []
    tat = KeyRate.objects.get(key="tests.rated:acme").tat
    assert tat == max(Job.objects.get(pk=jobs[2].pk).claimed_at, claimed_at + timedelta(seconds=2)
                      ) + timedelta(seconds=1)


def test_the_rate_step_starts_the_next_job_when_its_time_comes_and_says_when_the_next_is() -> None:
    jobs = rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    started, next_in = start_rate_heads(100)
    assert started == 0
    assert next_in is not None and 0 < next_in <= 1.0
    # Its time has come (moved, not waited for).
    Job.objects.filter(pk=jobs[3].pk).update(run_at=F("run_at") - timedelta(seconds=5))
    started, next_in = start_rate_heads(100)
    assert (started, next_in) == (1, None)
    assert statuses(*jobs[3:]) == ["ready", "throttled"]
    [c] = claim_jobs("w", "default", 10)
    assert c.id == jobs[3].pk
    # The last job is given the slot, to wait for its own time.
    last = Job.objects.get(pk=jobs[4].pk)
    assert (last.status, last.limit_slot) == ("throttled", 0)


def test_the_rate_step_runs_again_when_the_next_job_is_due_not_after_its_interval() -> None:
    run = RateStep()
    step = Step("rates", 30.0, run, due_again_in=run.due_again_in)
    rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    step.schedule_next(100.0, run(connection.alias))
    assert 100.0 < step.next_due <= 101.0
    run.next_in = None
    step.schedule_next(100.0, 0)
    assert step.next_due >= 100.0 + 27


def test_a_heavier_job_uses_more_of_the_burst() -> None:
    light, heavy, after = (django_pgjobs.enqueue("tests.rated", {"account": "a", "weight": w})
                           for w in (1, 3, 1))
    claim_jobs("w", "default", 10)
    # One unit used: the next weighs 3 and the burst is 3, so it waits for the first unit back.
    head = Job.objects.get(pk=heavy.pk)
    assert (head.status, head.limit_slot) == ("throttled", 0)
    claimed_at = Job.objects.get(pk=light.pk).claimed_at
    assert head.run_at == claimed_at + timedelta(seconds=1)
    assert statuses(after) == ["throttled"]


def test_drain_runs_a_burst_now_and_the_rest_when_its_now_is_past_their_turns() -> None:
    from django_pgjobs import testing

    jobs = rated("acme", 6)
    assert testing.drain().outcomes == {"succeeded": 3}
    assert statuses(*jobs) == ["succeeded"] * 3 + ["throttled"] * 3
    later = testing.drain(now=datetime.now().astimezone() + timedelta(days=1))
    assert later.outcomes == {"succeeded": 3}


# --- the slot's other ways out --------------------------------------------------------------------


def test_cancelling_the_job_holding_the_slot_hands_it_on() -> None:
    first, second, third = rated("acme", 3)
    cancel_jobs([first.pk])
    assert statuses(first, second, third) == ["cancelled", "ready", "throttled"]
    assert holder("tests.rated:acme") == second.pk


def test_cancelling_a_job_waiting_for_its_time_hands_the_slot_on() -> None:
    jobs = rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    cancel_jobs([jobs[3].pk])
    assert holder("tests.rated:acme") == jobs[4].pk
    last = Job.objects.get(pk=jobs[4].pk)
    assert (last.status, last.limit_slot) == ("throttled", 0)


def test_a_started_job_holds_no_slot_and_its_end_frees_nothing() -> None:
    first, second = rated("other", 2)
    [c] = claim_jobs("w", "default", 10)
    assert Job.objects.get(pk=first.pk).limit_slot is None
    assert holder("tests.rated:other") == second.pk
    settle([succeeded(c)])
    assert holder("tests.rated:other") == second.pk
    assert statuses(second) == ["ready"]


def test_a_rescued_job_waits_its_turn_again() -> None:
    first, second = rated("acme", 2)
    [c] = claim_jobs("w", "default", 1)
    Job.objects.filter(pk=c.id).update(lease_expires_at=datetime.now().astimezone()
                                       - timedelta(seconds=1), max_attempts=5)
    [rescued] = rescue_expired_leases(10)
    assert rescued.status == "retrying"
    from django_pgjobs.transitions import promote_jobs_due_by
    promote_jobs_due_by(datetime.now().astimezone() + timedelta(days=1), 10)
    # Back from retrying it is one more job of the key: the slot is the second's.
    assert statuses(first, second) == ["throttled", "ready"]


def test_a_snoozed_job_comes_back_through_the_rate() -> None:
    first, second = rated("acme", 2)
    [c] = claim_jobs("w", "default", 1)
    settle([Outcome.snoozed(c, 0, 1)])  # ready at once, by its outcome
    assert statuses(first, second) == ["throttled", "ready"]


def test_an_operators_rate_replaces_the_declared_one_and_times_the_next_job_again() -> None:
    from django_pgjobs.models import KeyLimit, OperatorAction
    from django_pgjobs.transitions import Actor, set_key_rate

    jobs = rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    waiting = Job.objects.get(pk=jobs[3].pk)
    assert waiting.status == "throttled"
    # A hundred a second: the three starts charged carry over as three units of 10 ms, so the
    # waiting job's turn, a second away under the declared rate, is now 10 ms away.
    assert set_key_rate("tests.rated:acme", 100, 1, burst=3, actor=Actor("op"),
                        reason="bigger plan") is True
    timed = Job.objects.get(pk=jobs[3].pk)
    assert timed.status == "ready" or timed.run_at < waiting.run_at - timedelta(seconds=0.9)
    time.sleep(0.05)
    start_rate_heads(100)
    [c] = claim_jobs("w", "default", 10)
    # The start is charged at the operator's spacing (10 ms a unit), not the declared second.
    after = KeyRate.objects.get(key="tests.rated:acme").tat
    before = Job.objects.get(pk=jobs[2].pk).claimed_at
    assert after - max(before, c_claimed(c)) < timedelta(seconds=1)
    row = KeyLimit.objects.get(key="tests.rated:acme")
    assert (row.max_running, row.rate_count, row.rate_per_seconds, row.rate_burst, row.rate) == (
        None, 100, 1.0, 3, "100 per 1s, burst 3")
    [key] = [k for k in key_limits() if k.key == "tests.rated:acme"]
    assert (key.rate, key.set_by_operator) == ("100/s, burst 3", True)
    action = OperatorAction.objects.get(action="set_key_limit")
    assert (action.actor_name, action.reason, action.detail["rate_count"]) == (
        "op", "bigger plan", 100)


def test_a_lowered_rate_carries_the_starts_already_charged_over_to_the_new_one() -> None:
    from django_pgjobs.transitions import set_key_rate

    jobs = rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    # Three starts at once, three units ahead of the rate (a second each): at one every ten
    # minutes, burst 1, that is one unit (the most a burst of one carries), so the next job
    # waits ten minutes.
    set_key_rate("tests.rated:acme", 1, timedelta(minutes=10))
    nxt = Job.objects.get(pk=jobs[3].pk)
    assert (nxt.status, nxt.limit_slot) == ("throttled", 0)
    assert nxt.run_at > datetime.now().astimezone() + timedelta(minutes=9)


def c_claimed(claimed: Any) -> datetime:
    return Job.objects.get(pk=claimed.id).claimed_at


@pytest.mark.parametrize(("key", "count", "per", "message"), [
    ("tests.rated:acme", 0, 1, "Rate count must be a whole number"),
    ("tests.rated:acme", 5, 0, "Rate per"),
    ("tests.rated:acme", 5, math.nan, "got nan"),
    ("tests.rated:acme", 5, None, "Rate needs its period"),
    ("tests.limited:acme", 5, 1, "is not a rate's"),
    ("a\nb", 5, 1, "key must not contain control characters"),
])
def test_a_bad_operator_rate_is_refused_and_writes_nothing(key, count, per, message) -> None:
    from django_pgjobs.models import KeyLimit, OperatorAction
    from django_pgjobs.transitions import set_key_rate

    with pytest.raises(ValueError, match=message):
        set_key_rate(key, count, per)
    assert not KeyLimit.objects.exists() and not OperatorAction.objects.exists()


def test_an_operator_sets_a_rate_keys_rate_in_the_admin_and_not_a_max_running(login) -> None:
    from django_pgjobs.models import KeyLimit

    rated("acme", 2)
    client = login("view_keylimit", "add_keylimit")
    refused = client.post("/admin/pgjobs/keylimit/add/",
                          {"key": "tests.rated:acme", "max_running": "3"})
    assert refused.status_code == 200 and "This is a Rate&#x27;s key" in refused.content.decode()
    assert not KeyLimit.objects.exists()
    done = client.post("/admin/pgjobs/keylimit/add/", {
        "key": "tests.rated:acme", "rate_count": "10", "rate_per_seconds": "1",
        "reason": "provider raised our quota"})
    assert done.status_code == 302
    assert KeyLimit.objects.get().rate == "10 per 1s, burst 1"
    refused = client.post("/admin/pgjobs/keylimit/add/",
                          {"key": "tests.limited:x", "rate_count": "3", "rate_per_seconds": "1"})
    assert "This is a Limit&#x27;s key" in refused.content.decode()


def test_an_operator_limit_cannot_widen_a_rates_one_slot() -> None:
    rated("acme", 1)
    with pytest.raises(ValueError, match="is a rate's"):
        set_key_limit("tests.rated:acme", 5)


# --- a handler pushes back ------------------------------------------------------------------------


def held_back_until(key: str) -> datetime | None:
    return KeyRate.objects.get(key=key).blocked_until


def test_rate_limited_holds_the_key_back_and_its_next_job_waits_for_it() -> None:
    jobs = [django_pgjobs.enqueue("tests.rated_provider", {"retry_after": 30} if i == 0 else {})
            for i in range(3)]
    [c] = claim_jobs("w", "default", 10)
    outcome = run_job(c)
    assert (outcome.status, outcome.push_back_key, outcome.push_back_seconds) == (
        "scheduled", None, 30.0)
    before = datetime.now().astimezone()
    settle([outcome])
    until = held_back_until("provider-api:")
    assert until is not None and until >= before + timedelta(seconds=29)
    # The job itself comes back in 30 s without using an attempt; the key's next job, given
    # the slot when the first started, now waits until the key may start again.
    first = Job.objects.get(pk=jobs[0].pk)
    assert (first.status, first.attempts) == ("scheduled", 0)
    nxt = Job.objects.get(pk=jobs[1].pk)
    assert (nxt.status, nxt.limit_slot, nxt.run_at) == ("throttled", 0, until)
    assert key_limits()[0].held_back_seconds > 28


def test_rate_limited_can_name_another_key_and_a_stale_report_still_pushes_it_back() -> None:
    import uuid

    django_pgjobs.enqueue("tests.rated_provider", {"retry_after": 5, "key": "tests.rated:acme"})
    [c] = claim_jobs("w", "default", 10)
    outcome = run_job(c)
    assert outcome.push_back_key == "tests.rated:acme"
    forged = uuid.uuid4()
    assert settle([replace(outcome, lease_token=forged)]) == {forged: False}
    assert held_back_until("tests.rated:acme") is not None
    # Held back: its next enqueued job waits though the key never started one.
    waiting = rated("acme", 1)[0]
    assert (waiting.status, Job.objects.get(pk=waiting.pk).limit_slot) == ("throttled", 0)


def test_rate_limited_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="retry_after must be a finite number"):
        RateLimited(None, -1)
    with pytest.raises(ValueError, match="retry_after must be a finite number"):
        RateLimited(None, math.inf)
    with pytest.raises(ValueError, match="key must not contain control characters"):
        RateLimited("a\nb", 1)
    assert RateLimited(retry_after=timedelta(minutes=1)).retry_after == 60.0


def test_a_push_back_rides_in_the_claims_transaction() -> None:
    from django_pgjobs.transitions import settle_and_claim

    django_pgjobs.enqueue("tests.rated_provider", {"retry_after": 10})
    [c] = claim_jobs("w", "default", 10)
    with CaptureQueriesContext(connection) as queries:
        applied, _ = settle_and_claim([run_job(c)], "w", "default", 10)
    assert list(applied.values()) == [True]
    assert len([q for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]) == 1
    assert held_back_until("provider-api:") is not None


# --- operators see it -----------------------------------------------------------------------------


def test_stats_show_a_rate_keys_rate_running_jobs_and_next_start() -> None:
    rated("acme", 5)
    for _ in range(3):
        claim_jobs("w", "default", 10)
    [key] = [k for k in key_limits() if k.key == "tests.rated:acme"]
    assert (key.running, key.ready, key.waiting, key.rate) == (3, 0, 2, "1/s, burst 3")
    assert key.next_start_seconds is not None and 0 < key.next_start_seconds <= 1


def test_a_jobs_page_shows_its_rate(login) -> None:
    job = rated("acme", 1, weight=2)[0]
    page = login("view_job").get(f"/admin/pgjobs/job/{job.pk}/change/").content.decode()
    assert "1 a second, burst 3" in page


# --- real workers ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_workers_keep_a_keys_rate_and_other_keys_run_beside_it(start_worker) -> None:
    # demo.call_provider: 20 a second per provider, burst 1.
    hot = [django_pgjobs.enqueue("demo.call_provider", {"provider": "hot", "i": i})
           for i in range(30)]
    cold = django_pgjobs.enqueue_many(
        [django_pgjobs.JobSpec.of("demo.call_provider", {"provider": f"k{i}"}) for i in range(40)])
    for n in range(3):
        start_worker("--worker-id", f"w{n}", "--concurrency", "4", "--poll-interval", "1")
    wait_for(lambda: Job.objects.filter(status="succeeded").count() == 70, 60)
    starts = [a.claimed_at for a in ended_attempts(*(j.pk for j in hot))]
    assert len(starts) == 30
    assert gcra_violations([(s, 1) for s in starts], 0.05, 1) == []
    # The 40 other keys did not queue behind the hot one: all of them started before the hot
    # key's last start (it needs 30 x 50 ms).
    assert max(a.claimed_at for a in ended_attempts(*(j.pk for j in cold))) < max(starts)



def test_the_failure_harness_check_of_rates_sees_a_start_its_rate_refused() -> None:
    from types import SimpleNamespace

    from tests.harness.invariants import rates_never_exceeded

    base = datetime(2026, 1, 1).astimezone()
    job = SimpleNamespace(task="chaos.rated", limit_key="chaos.rated:g0")

    def snap(*offsets: float) -> Any:
        return SimpleNamespace(jobs={1: job}, attempts={1: [
            SimpleNamespace(claimed_at=base + timedelta(seconds=o)) for o in offsets]})

    # 5 a second, burst 2: two at once, then one every 0.2 s.
    check, figures = rates_never_exceeded(snap(0, 0, 0.2, 0.4))
    assert check.ok and figures["starts"] == {"chaos.rated:g0": 4}
    check, _ = rates_never_exceeded(snap(0, 0, 0.1))
    assert not check.ok and "came 0.100s before its rate allowed" in check.problems[0]


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_makes_the_next_job_wait_tells_the_workers_when_it_may_start() -> None:
    import threading

    from django_pgjobs.notify import Listener

    heard: list[float] = []
    got = threading.Event()

    def rate_due(seconds: float) -> None:
        heard.append(seconds)
        got.set()

    listener = Listener(lambda: None, rate_due=rate_due, application_name="pgjobs-test-rates")
    listener.start()
    try:
        assert listener.listening.wait(10)
        # One a second, burst 1: the second job's turn is a second after the first's claim.
        for _ in range(2):
            django_pgjobs.enqueue("tests.rated_provider", {})
        claim_jobs("w", "default", 10)
        assert got.wait(10)
        assert 0 < heard[0] <= 1.0
    finally:
        listener.stop()


def test_a_worker_told_of_a_rates_next_start_runs_its_rates_step_then() -> None:
    from django_pgjobs.worker import Worker

    worker = Worker(concurrency=1, install_signals=False)
    [step] = [s for s in worker.steps if s.name == "rates"]
    step.next_due = 10.0**9
    worker.rate_due(0.5)
    import time

    assert time.monotonic() < step.next_due <= time.monotonic() + 0.5
