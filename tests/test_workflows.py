"""Workflows: jobs that wait for other jobs (chains, groups, chords), resolved by the statement
that ends each dependency, exactly once, on real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections, transaction

import django_pgjobs
from django_pgjobs import After, DependencyCycle, InvalidDependency, chain, chord
from django_pgjobs.enqueuing import JobSpec
from django_pgjobs.models import Dependency, Job
from django_pgjobs.outcomes import Outcome
from django_pgjobs.status import JobStatus, TerminalReason
from django_pgjobs.testing import drain
from django_pgjobs.transitions import (
    Actor,
    cancel_jobs,
    claim_jobs,
    expire_pending_jobs,
    settle,
)
from tests.conftest import succeeded

pytestmark = pytest.mark.django_db


def ok(n: Any, **options: Any) -> JobSpec:
    return JobSpec.of("tests.ok", {"n": n}, **options)


def statuses(jobs: list[Job]) -> list[str]:
    by_id = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    return [by_id[j.pk] for j in jobs]


def test_a_chain_runs_one_job_after_another_and_each_waits_outside_the_claim() -> None:
    jobs = django_pgjobs.enqueue_many(chain(ok(1), ok(2), ok(3)))
    assert [j.status for j in jobs] == ["ready", "pending", "pending"]
    assert [j.pending_dependencies for j in jobs] == [None, 1, 1]
    assert len({j.workflow_id for j in jobs}) == 1 and jobs[0].workflow_id is not None
    assert Job.objects.get(pk=jobs[0].pk).workflow_id == jobs[0].workflow_id
    # Only the head can be claimed.
    [claimed] = claim_jobs("w", "default", 10)
    assert claimed.id == jobs[0].pk
    settle([succeeded(claimed)])
    assert statuses(jobs) == ["succeeded", "ready", "pending"]
    runs = drain()
    assert [r.job_id for r in runs] == [jobs[1].pk, jobs[2].pk]
    assert statuses(jobs) == ["succeeded"] * 3


def test_a_chord_calls_back_once_its_whole_group_succeeded_with_their_results() -> None:
    group = [ok(n) for n in range(5)]
    jobs = django_pgjobs.enqueue_many(chord(group, JobSpec.of("tests.collect", {})))
    callback = jobs[-1]
    assert callback.status == "pending" and callback.pending_dependencies == 5
    runs = drain()
    assert runs[-1].job_id == callback.pk  # the callback last, after all five
    callback.refresh_from_db()
    assert callback.status == "succeeded"
    assert callback.result == [
        {"job_id": j.pk, "task": "tests.ok", "status": "succeeded", "result": {"echo": {"n": n}}}
        for n, j in enumerate(jobs[:5])
    ]


def test_a_failed_dependency_cancels_the_chain_below_it_saying_why() -> None:
    jobs = django_pgjobs.enqueue_many(chain(JobSpec.of("tests.permanent", {}), ok(2), ok(3)))
    drain()
    assert statuses(jobs) == ["dead", "cancelled", "cancelled"]
    second, third = Job.objects.get(pk=jobs[1].pk), Job.objects.get(pk=jobs[2].pk)
    assert second.terminal_reason == third.terminal_reason == TerminalReason.DEPENDENCY
    assert second.last_error == f"job {jobs[0].pk}, which it depends on, ended dead"
    assert third.last_error == f"job {jobs[1].pk}, which it depends on, ended cancelled"
    assert second.finished_at is not None and second.attempts == 0


def test_each_policy_runs_or_cancels_as_its_edge_requires() -> None:
    failing = JobSpec.of("tests.permanent", {})
    passing = ok("up")
    specs = [
        failing, passing,
        ok("needs-success", after=[failing]),
        ok("whatever", after=[After(failing, "finished")]),
        ok("on-failure", after=[After(failing, "failed")]),
        ok("on-failure-of-success", after=[After(passing, "failed")]),
        ok("both-finished", after=[After(failing, "finished"), After(passing, "finished")]),
    ]
    jobs = django_pgjobs.enqueue_many(specs)
    drain()
    assert statuses(jobs) == ["dead", "succeeded", "cancelled", "succeeded", "succeeded",
                              "cancelled", "succeeded"]


def test_a_cancelled_dependent_with_a_finished_edge_below_it_still_runs() -> None:
    first, second = JobSpec.of("tests.permanent", {}), ok(2)
    specs = [first, JobSpec.of("tests.ok", {"n": 2}, after=[first]), second]
    middle = specs[1]
    specs[2] = JobSpec.of("tests.ok", {"n": 3}, after=[After(middle, "finished")])
    jobs = django_pgjobs.enqueue_many(specs)
    drain()
    assert statuses(jobs) == ["dead", "cancelled", "succeeded"]


def test_a_long_chain_cascades_its_cancellation_in_one_statement() -> None:
    jobs = django_pgjobs.enqueue_many(chain(*[ok(n) for n in range(300)]))
    cancel_jobs([jobs[0].pk], actor=Actor("test"), reason="stop")
    assert set(statuses(jobs)) == {"cancelled"}
    assert Job.objects.filter(pk__in=[j.pk for j in jobs[1:]],
                              terminal_reason="dependency").count() == 299


def test_a_job_can_depend_on_jobs_enqueued_before_even_finished_ones() -> None:
    earlier = django_pgjobs.enqueue("tests.ok", {"n": 0})
    drain()
    running = django_pgjobs.enqueue("tests.ok", {"n": 1})
    jobs = django_pgjobs.enqueue_many([
        JobSpec.of("tests.ok", {"n": 2}, after=[earlier]),
        JobSpec.of("tests.ok", {"n": 3}, after=[running.pk]),
        JobSpec.of("tests.ok", {"n": 4}, after=[After(earlier, "failed")]),
    ])
    # The first ended before: resolved in the enqueue itself.
    assert [j.status for j in jobs] == ["ready", "pending", "cancelled"]
    assert Job.objects.get(pk=running.pk).has_dependents
    drain()
    assert statuses(jobs) == ["succeeded", "succeeded", "cancelled"]


def test_a_dependent_due_later_waits_for_its_run_at_once_its_dependencies_ended() -> None:
    from datetime import timedelta

    first = ok(1)
    jobs = django_pgjobs.enqueue_many([first, ok(2, after=[first], delay=timedelta(hours=1))])
    [claimed] = claim_jobs("w", "default", 10)
    settle([succeeded(claimed)])
    assert statuses(jobs) == ["succeeded", "scheduled"]


def test_a_rolled_back_enqueue_leaves_no_job_and_no_edge() -> None:
    before = (Job.objects.count(), Dependency.objects.count())
    with pytest.raises(RuntimeError), transaction.atomic():
        django_pgjobs.enqueue_many(chord([ok(1), ok(2)], ok(3)))
        raise RuntimeError("the caller's work failed")
    assert (Job.objects.count(), Dependency.objects.count()) == before


@pytest.mark.parametrize(("specs", "error", "says"), [
    (lambda: [ok(1, after=[After(1, "sometimes")])], InvalidDependency, "requires must be"),
    (lambda: [ok(1, after=[ok(0)])], InvalidDependency, "same enqueue_many call"),
    (lambda: [ok(1, after=["12"])], InvalidDependency, "got '12'"),
    (lambda: [ok(1, after="12")], InvalidDependency, "got '12'"),
    (lambda: [ok(1, after=[True])], InvalidDependency, "got True"),
    (lambda: [ok(1, after=[-4])], InvalidDependency, "got -4"),
    (lambda: [ok(1, after=[Job(task="x")])], InvalidDependency, "saved job"),
    (lambda: [ok(1, after=[5, 5])], InvalidDependency, "same job twice"),
    (lambda: [ok(1, after=[2**62])], InvalidDependency, "does not exist"),
    (lambda: _cycle(), DependencyCycle, "cycle"),
    (lambda: _self(), DependencyCycle, "itself"),
])
def test_bad_workflows_are_refused_by_name_with_nothing_written_and_the_transaction_usable(
    specs: Any, error: type[Exception], says: str,
) -> None:
    before = (Job.objects.count(), Dependency.objects.count())
    with transaction.atomic():
        with pytest.raises(error, match=says):
            django_pgjobs.enqueue_many(specs())
        assert Job.objects.count() == before[0]  # the caller's transaction still works
    assert (Job.objects.count(), Dependency.objects.count()) == before


def _cycle() -> list[JobSpec]:
    # A JobSpec is frozen: a cycle needs two specs that name each other, built by hand.
    a = JobSpec.__new__(JobSpec)
    b = JobSpec("tests.ok", {"n": "b"}, {}, after=(a,))
    object.__setattr__(a, "task", "tests.ok")
    object.__setattr__(a, "payload", {"n": "a"})
    object.__setattr__(a, "options", {})
    object.__setattr__(a, "tick", None)
    object.__setattr__(a, "after", (b,))
    return [a, b]


def _self() -> list[JobSpec]:
    a = JobSpec.__new__(JobSpec)
    for name, value in (("task", "tests.ok"), ("payload", {}), ("options", {}), ("tick", None),
                        ("after", (a,))):
        object.__setattr__(a, name, value)
    return [a]


def test_too_many_dependencies_are_refused(settings: Any) -> None:
    settings.PGJOBS_MAX_DEPENDENCIES = 3
    with pytest.raises(InvalidDependency, match="more than PGJOBS_MAX_DEPENDENCIES"):
        django_pgjobs.enqueue_many(chord([ok(n) for n in range(4)], ok("cb")))
    assert not Job.objects.exists()


def test_a_dependency_in_another_database_is_refused() -> None:
    other = Job(pk=7, task="tests.ok")
    other._state.db = "elsewhere"
    with pytest.raises(InvalidDependency, match="lives in database 'elsewhere'"):
        django_pgjobs.enqueue_many([ok(1, after=[other])])


def test_a_pending_job_past_its_deadline_ends_dead_and_its_dependents_cancelled() -> None:
    from datetime import timedelta

    first = ok(1)
    second = ok(2, after=[first], max_age=timedelta(seconds=1))
    jobs = django_pgjobs.enqueue_many([first, second, ok(3, after=[second])])
    created = Job.objects.get(pk=jobs[0].pk).created_at
    Job.objects.filter(pk=jobs[1].pk).update(deadline=created - timedelta(seconds=1))
    assert expire_pending_jobs(100) == [jobs[1].pk]
    assert statuses(jobs) == ["ready", "dead", "cancelled"]
    assert Job.objects.get(pk=jobs[1].pk).terminal_reason == TerminalReason.DEADLINE_PASSED


def test_progress_is_written_under_the_lease_at_most_once_a_second() -> None:
    job = django_pgjobs.enqueue("tests.progress", {"steps": 500})
    with connection.execute_wrapper(_count_progress_writes) as _:
        drain()
    job.refresh_from_db()
    assert job.status == "succeeded"
    # The first call writes; the other 499 come within the same second and are held back, and
    # the last of them is written when the handler returns: two writes, the last word kept.
    assert job.progress == {"done": 500, "total": 500, "message": "step 500"}
    assert _writes == [2]


_writes: list[int] = []


def _count_progress_writes(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    if "SET progress" in sql:
        _writes[:] = [(_writes or [0])[0] + 1]
    return execute(sql, params, many, context)


def test_a_stale_workers_progress_changes_nothing() -> None:
    from django_pgjobs.context import JobContext

    django_pgjobs.enqueue("tests.ok", {"n": 1})
    [claimed] = claim_jobs("w", "default", 1)
    settle([Outcome.released(claimed, "handed back")])
    ctx = JobContext(claimed, worker_id="w", using="default")
    ctx.progress(1, 2, "late")
    assert ctx.lease_lost
    assert Job.objects.get(pk=claimed.id).progress is None


@pytest.mark.parametrize("bad", [(-1, None, ""), (float("nan"), 1, ""), (1, float("inf"), ""),
                                 (True, None, ""), (1, 2, "x" * 201)])
def test_bad_progress_is_refused(bad: tuple[Any, Any, Any]) -> None:
    from django_pgjobs.context import JobContext

    django_pgjobs.enqueue("tests.ok", {"n": 1})
    [claimed] = claim_jobs("w", "default", 1)
    with pytest.raises(ValueError, match="progress"):
        JobContext(claimed, worker_id="w", using="default").progress(*bad)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("round_", range(10))
def test_a_fan_in_whose_last_two_dependencies_settle_at_once_calls_back_exactly_once(
    round_: int,
) -> None:
    a, b = ok("a"), ok("b")
    jobs = django_pgjobs.enqueue_many([a, b, ok("callback", after=[a, b])])
    first = claim_jobs("w1", "default", 1)
    second = claim_jobs("w2", "default", 1)
    assert {first[0].id, second[0].id} == {jobs[0].pk, jobs[1].pk}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def settle_one(claimed: Any) -> None:
        try:
            barrier.wait(5)
            with transaction.atomic():
                settle([succeeded(claimed)])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=settle_one, args=(c,)) for c in (*first, *second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert not errors
    callback = Job.objects.get(pk=jobs[2].pk)
    assert (callback.status, callback.pending_dependencies) == (JobStatus.READY, 0)
    assert claim_jobs("w3", "default", 10)[0].id == callback.pk
    assert claim_jobs("w3", "default", 10) == []


def test_a_jobs_page_shows_its_progress_edges_and_workflow_tree(admin_client: Any) -> None:
    failing = JobSpec.of("tests.permanent", {})
    jobs = django_pgjobs.enqueue_many(
        [failing, *chord([ok(1, after=[After(failing, "finished")]), ok(2)], ok("cb"))])
    Job.objects.filter(pk=jobs[1].pk).update(progress={"done": 3, "total": 7, "message": "half"})
    page = admin_client.get(f"/admin/pgjobs/job/{jobs[1].pk}/change/").content.decode()
    assert "3 of 7: half" in page
    assert f"job {jobs[0].pk}</a>" in page and "requires finished; not ended yet" in page
    assert f"job {jobs[3].pk}</a>" in page and "which requires succeeded" in page
    # The tree: the failing job at the root, job 1 under it, the callback under job 1 (and
    # again, not expanded, under job 2); "this job" marks the page's own.
    tree = page.split("All jobs of workflow")[0].split("pgjobs-tree")[1:]
    assert len(tree) == 5
    assert f"?workflow={jobs[0].workflow_id}" in page
    assert "← this job" in page and "(shown above)" in page
    # A running job's page reloads itself; a finished one's does not.
    assert "data-pgjobs-live" in page or "pgjobs-live" in page
    listed = admin_client.get(f"/admin/pgjobs/job/?workflow={jobs[0].workflow_id}")
    assert listed.status_code == 200
    assert {j.pk for j in listed.context["cl"].result_list} == {j.pk for j in jobs}


def test_retrying_a_failed_job_reopens_the_branch_its_failure_cancelled() -> None:
    from django_pgjobs.models import OperatorAction
    from django_pgjobs.transitions import retry_jobs

    failing = JobSpec.of("tests.permanent", {})
    other = ok("other")
    second = ok(2, after=[failing])
    third = ok(3, after=[second])
    blocked = ok(4, after=[failing, After(other, "failed")])  # its other edge ends unmet
    handler = ok(5, after=[After(failing, "failed")])  # ran: the failure was what it waited for
    jobs = django_pgjobs.enqueue_many([failing, other, second, third, blocked, handler])
    drain()
    assert statuses(jobs) == ["dead", "succeeded", "cancelled", "cancelled", "cancelled",
                              "succeeded"]
    assert retry_jobs([jobs[0].pk], actor=Actor("ops"), reason="fixed the bug") == 1
    assert statuses(jobs) == ["ready", "succeeded", "pending", "pending", "cancelled",
                              "succeeded"]
    reopened = Job.objects.get(pk=jobs[2].pk)
    assert (reopened.pending_dependencies, reopened.terminal_reason, reopened.finished_at) == (
        1, "", None)
    audit = OperatorAction.objects.filter(action="retry").latest("id")
    assert audit.detail["dependents_reopened"] == 2
    # The retried job now fails again: the branch is cancelled again, saying why.
    drain()
    assert statuses(jobs)[:4] == ["dead", "succeeded", "cancelled", "cancelled"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_while_settling_the_last_dependency_leaves_the_callback_to_its_rescue(
    start_worker: Any,
) -> None:
    """The settlement and the callback's release are one commit: a worker killed before it
    commits releases nothing, and the rescue of the lost attempt runs it again and releases
    the callback once."""
    from datetime import timedelta

    from tests.conftest import wait_for

    a = JobSpec.of("demo.noop", {"n": "last member"})
    jobs = django_pgjobs.enqueue_many([a, JobSpec.of("demo.noop", {"n": "callback"}, after=[a])])
    [claimed] = claim_jobs("doomed-worker", "default", 1)
    # The doomed worker's settlement never commits: its transaction is rolled back as a
    # killed backend's would be, after the callback was made ready inside it.
    with pytest.raises(RuntimeError), transaction.atomic():
        settle([succeeded(claimed)])
        assert Job.objects.get(pk=jobs[1].pk).status == JobStatus.READY
        raise RuntimeError("killed before the commit")
    assert statuses(jobs) == ["running", "pending"]
    Job.objects.filter(pk=jobs[0].pk).update(lease_expires_at=claimed_expiry(timedelta(0)))
    worker = start_worker("--concurrency", "2")
    wait_for(lambda: statuses(jobs) == ["succeeded", "succeeded"], 30,
             what=lambda: str(statuses(jobs)) + worker.log_path.read_text()[-2000:])
    callback = Job.objects.get(pk=jobs[1].pk)
    assert callback.attempts == 1
    worker.stop()


def claimed_expiry(after: Any) -> Any:
    from django.utils import timezone

    return timezone.now() + after


def test_a_workflow_is_cancelled_mid_run_from_a_jobs_page_through_the_cancel_plan(
    admin_client: Any,
) -> None:
    from django_pgjobs.models import OperatorAction

    jobs = django_pgjobs.enqueue_many(chain(ok(1), ok(2), ok(3), ok(4)))
    [claimed] = claim_jobs("w", "default", 1)
    settle([succeeded(claimed)])  # the first ran; the second is ready, two pending
    page = admin_client.get(f"/admin/pgjobs/job/{jobs[2].pk}/change/").content.decode()
    assert "Its workflow has 3 unfinished jobs" in page and "pgjobs-workflow-cancel" in page
    ids = [str(j.pk) for j in jobs[1:]]
    plan = admin_client.post("/admin/pgjobs/job/", {
        "action": "cancel_selected", "index": "0", "_selected_action": ids})
    assert plan.status_code == 200 and statuses(jobs)[1:] == ["ready", "pending", "pending"]
    assert f'name="pgjobs_ids" value="{",".join(ids)}"' in plan.content.decode()
    done = admin_client.post("/admin/pgjobs/job/", {
        "action": "cancel_selected", "_selected_action": ids[0], "pgjobs_confirm": "yes",
        "pgjobs_ids": ",".join(ids), "reason": "wrong album"})
    assert done.status_code == 302
    assert statuses(jobs) == ["succeeded", "cancelled", "cancelled", "cancelled"]
    audit = OperatorAction.objects.filter(action="cancel").latest("id")
    assert sorted(audit.job_ids) == sorted(int(i) for i in ids) and audit.reason == "wrong album"
    # A finished workflow offers no button.
    page = admin_client.get(f"/admin/pgjobs/job/{jobs[2].pk}/change/").content.decode()
    assert "pgjobs-workflow-cancel" not in page


def test_one_job_enqueued_alone_may_wait_for_jobs_enqueued_before() -> None:
    first = django_pgjobs.enqueue("tests.ok", {"n": 1})
    second = django_pgjobs.enqueue("tests.collect", {}, after=[first])
    assert (second.status, second.pending_dependencies) == ("pending", 1)
    drain()
    second.refresh_from_db()
    assert second.result == [{"job_id": first.pk, "task": "tests.ok", "status": "succeeded",
                              "result": {"echo": {"n": 1}}}]


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_waits_for_pending_jobs_that_running_work_will_release(
    start_worker: Any,
) -> None:
    """A burst worker that finds nothing ready still waits while pending jobs may be released
    by a job running elsewhere: it exits once the whole chain has run, not before."""
    import time

    jobs = django_pgjobs.enqueue_many(chain(*(JobSpec.of("demo.noop", {"n": n})
                                              for n in range(4))))
    [held] = claim_jobs("elsewhere", "default", 1)  # the first link runs on another worker
    worker = start_worker("--burst", "--concurrency", "1", "--batch-size", "1")
    time.sleep(1.5)
    assert worker.proc.poll() is None, "the burst worker left a chain behind"
    settle([succeeded(held)])
    assert worker.wait(60) == 0
    assert statuses(jobs) == ["succeeded"] * 4


def test_a_result_larger_than_the_bound_fails_the_job_as_permanent(settings: Any) -> None:
    settings.PGJOBS_MAX_RESULT_BYTES = 64 * 1024
    small = django_pgjobs.enqueue("tests.big_result", {"size": 60 * 1024})
    big = django_pgjobs.enqueue("tests.big_result", {"size": 70 * 1024})
    drain()
    small.refresh_from_db()
    big.refresh_from_db()
    assert small.status == "succeeded" and len(small.result) == 60 * 1024
    assert (big.status, big.failure_class, big.attempts) == ("dead", "permanent", 1)
    assert "more than PGJOBS_MAX_RESULT_BYTES (65536)" in big.last_error


def test_a_released_job_of_a_full_limit_key_waits_throttled_for_its_slot() -> None:
    holder = django_pgjobs.enqueue("tests.capped", {"n": 0})
    [running] = claim_jobs("w", "default", 1)
    assert running.id == holder.pk  # it holds the key's one slot
    first = ok(1)
    jobs = django_pgjobs.enqueue_many([first, JobSpec.of("tests.capped", {"n": 1},
                                                         after=[first])])
    [claimed] = claim_jobs("w", "default", 1)
    settle([succeeded(claimed)])
    assert statuses(jobs) == ["succeeded", "throttled"]
    settle([succeeded(running)])  # the slot is freed and handed to it
    assert statuses(jobs) == ["succeeded", "ready"]


def test_the_prune_deletes_a_workflows_edges_with_either_of_their_jobs() -> None:
    from datetime import timedelta

    from django_pgjobs.transitions import delete_finished_jobs

    failing = JobSpec.of("tests.permanent", {})
    jobs = django_pgjobs.enqueue_many([*chain(ok(1), ok(2)), failing, ok(3, after=[failing])])
    drain()
    assert statuses(jobs) == ["succeeded", "succeeded", "dead", "cancelled"]
    assert Dependency.objects.count() == 2
    Job.objects.update(finished_at=Job.objects.get(pk=jobs[0].pk).created_at
                       - timedelta(days=30))
    # Only the succeeded ones go (their successes had no attempt rows): the edge between them
    # goes with them; the dead job and the job cancelled for it stay, and so does their edge.
    assert delete_finished_jobs("succeeded", 60, 100) == (2, 0)
    assert list(Dependency.objects.values_list("job_id", "upstream_id")) == [
        (jobs[3].pk, jobs[2].pk)]
    # A dead upstream pruned alone takes the edge with it; the dependent stays as it ended.
    assert delete_finished_jobs("dead", 60, 100)[0] == 1
    assert not Dependency.objects.exists()


def test_an_async_handlers_last_progress_is_kept_too() -> None:
    job = django_pgjobs.enqueue("tests.aprogress", {"steps": 50})
    drain()
    job.refresh_from_db()
    assert (job.status, job.progress) == ("succeeded", {"done": 50, "total": 50, "message": ""})
