"""Workflows: jobs that wait for other jobs, written in the caller's transaction.

A ``JobSpec`` may name the jobs it waits for (``after``): specs of the same ``enqueue_many``
call, saved jobs, or job ids, each alone (it must succeed) or in an ``After`` that says what it
requires. ``chain``, ``group`` and ``chord`` build the common shapes. The whole graph is checked
before any SQL (``InvalidDependency``, ``DependencyCycle``), then written with the jobs, so a
rollback leaves no half-built workflow. The database moves each dependent on as its
dependencies end (the trigger of migration 0014, docs/workflows.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.db import transaction

from . import encryption, transitions
from .conf import checked
from .exceptions import DependencyCycle, InvalidDependency
from .models import Job
from .options import JobSpec
from .registry import registry
from .status import TERMINAL_STATUSES, Requires
from .validation import shown


@dataclass(frozen=True)
class After:
    """An edge: wait for ``job`` (a JobSpec of the same call, a saved Job, or a job id) to end
    as ``requires`` asks: ``"succeeded"`` (the default), ``"finished"`` (however it ended) or
    ``"failed"`` (dead or cancelled: an error handler). When it ends otherwise, the waiting job
    ends cancelled, saying which job ended how."""

    job: Any
    requires: str = Requires.SUCCEEDED


def chain(*specs: JobSpec, requires: str = Requires.SUCCEEDED) -> list[JobSpec]:
    """Each spec after the one before it: the second starts once the first ended as required."""
    out: list[JobSpec] = []
    for spec in specs:
        out.append(spec if not out else _after(spec, [After(out[-1], requires)]))
    return out


def group(*specs: JobSpec) -> list[JobSpec]:
    """Specs that run independently, side by side (what ``chord`` waits for)."""
    return list(specs)


def chord(specs: Iterable[JobSpec], callback: JobSpec, *,
          requires: str = Requires.SUCCEEDED) -> list[JobSpec]:
    """``specs`` side by side, then ``callback`` once every one of them ended as required: a
    fan-in. With ``requires="finished"`` the callback runs however they ended."""
    members = list(specs)
    return [*members, _after(callback, [After(spec, requires) for spec in members])]


def _after(spec: JobSpec, edges: Sequence[After]) -> JobSpec:
    if not isinstance(spec, JobSpec):
        raise InvalidDependency(f"workflows are built of JobSpec objects, got {shown(spec)}")
    return replace(spec, after=(*spec.after, *edges))


@dataclass(frozen=True)
class _Edge:
    dependent: int  # the dependent's place in the call
    upstream_place: int | None  # the upstream's place in the call, or
    upstream_id: int | None  # the id of a job enqueued before
    requires: str


def edges_of(specs: Sequence[JobSpec], alias: str) -> list[_Edge]:
    """Every edge of ``specs``, checked; raise ``InvalidDependency`` before any SQL."""
    limit = checked("MAX_DEPENDENCIES")
    places = {id(spec): place for place, spec in enumerate(specs)}
    edges: list[_Edge] = []
    for place, spec in enumerate(specs):
        if isinstance(spec.after, str | bytes) or not isinstance(spec.after, tuple):
            raise InvalidDependency(f"after must be a list of jobs, got {shown(spec.after)}")
        if len(spec.after) > limit:
            raise InvalidDependency(
                f"{spec.task if isinstance(spec.task, str) else spec.task.name!r} depends on "
                f"{len(spec.after)} jobs, more than PGJOBS_MAX_DEPENDENCIES ({limit})")
        seen: set[tuple[str, int]] = set()
        for entry in spec.after:
            edge = entry if isinstance(entry, After) else After(entry)
            if edge.requires not in Requires.values:
                raise InvalidDependency(
                    f"requires must be one of {', '.join(Requires.values)}, got "
                    f"{shown(edge.requires)}")
            target = edge.job
            if isinstance(target, JobSpec):
                upstream = places.get(id(target))
                if upstream is None:
                    raise InvalidDependency(
                        "a JobSpec can only depend on a JobSpec of the same enqueue_many call")
                if upstream == place:
                    raise DependencyCycle("a job cannot depend on itself")
                key = ("place", upstream)
                made = _Edge(place, upstream, None, edge.requires)
            else:
                job_id = _job_id(target, alias)
                key = ("id", job_id)
                made = _Edge(place, None, job_id, edge.requires)
            if key in seen:
                raise InvalidDependency("a job names the same job twice in its after")
            seen.add(key)
            edges.append(made)
    _refuse_cycles(len(specs), edges)
    return edges


def _job_id(target: Any, alias: str) -> int:
    if isinstance(target, Job):
        if target.pk is None:
            raise InvalidDependency("a job can only depend on a saved job")
        if target._state.db is not None and target._state.db != alias:
            raise InvalidDependency(
                f"job {target.pk} lives in database {target._state.db!r}, not {alias!r}: "
                "a workflow's jobs share one database")
        return int(target.pk)
    if type(target) is int and 0 < target < 2**63:
        return target
    raise InvalidDependency(
        f"after takes JobSpecs of the same call, saved Jobs or job ids, got {shown(target)}")


def _refuse_cycles(count: int, edges: Sequence[_Edge]) -> None:
    """Kahn's algorithm over the call's own edges: whatever is left over is in a cycle."""
    waits = [0] * count
    feeds: list[list[int]] = [[] for _ in range(count)]
    for edge in edges:
        if edge.upstream_place is not None:
            waits[edge.dependent] += 1
            feeds[edge.upstream_place].append(edge.dependent)
    free = [place for place in range(count) if waits[place] == 0]
    done = 0
    while free:
        place = free.pop()
        done += 1
        for dependent in feeds[place]:
            waits[dependent] -= 1
            if waits[dependent] == 0:
                free.append(dependent)
    if done < count:
        raise DependencyCycle(
            f"{count - done} jobs of this call depend on each other in a cycle")


@dataclass
class Graph:
    """The extra per-row values of a workflow's INSERT, by place."""

    pending: list[int]
    has_dependents: list[bool]
    workflow_id: str


def enqueue_graph(specs: Sequence[JobSpec], insert: Any, alias: str) -> list[Job]:
    """Enqueue ``specs`` and their edges in one savepoint of the caller's transaction.

    ``insert(graph)`` inserts the rows (enqueuing's INSERT, with the graph's extra values) and
    answers with each place's job. Jobs enqueued before are locked first (a missing one is
    refused with nothing written); edges on jobs that had ended already are resolved at once.
    """
    edges = edges_of(specs, alias)
    before = sorted({e.upstream_id for e in edges if e.upstream_id is not None})
    with transaction.atomic(using=alias):
        found = transitions.lock_upstream_jobs(before, using=alias)
        missing = [job_id for job_id in before if job_id not in found]
        if missing:
            raise InvalidDependency(
                f"job {missing[0]} does not exist (or was pruned): nothing was enqueued")
        workflow = next((w for _, w in found.values() if w is not None), None)
        pending = [0] * len(specs)
        feeds = [False] * len(specs)
        for edge in edges:
            pending[edge.dependent] += 1
            if edge.upstream_place is not None:
                feeds[edge.upstream_place] = True
        jobs = insert(Graph(pending, feeds, str(workflow or uuid.uuid4())))
        # A spec a unique index refused is answered with the job that holds its key: a
        # dependent that already existed keeps the edges it has; an upstream that existed is
        # depended on as a job enqueued before.
        rows: list[tuple[int, int, str]] = []
        existing: list[int] = []
        for edge in edges:
            if not jobs[edge.dependent].created:
                continue
            if edge.upstream_place is None:
                assert edge.upstream_id is not None
                upstream_id = edge.upstream_id
            else:
                upstream_job = jobs[edge.upstream_place]
                upstream_id = int(upstream_job.pk)
                if not upstream_job.created:
                    existing.append(upstream_id)
            rows.append((int(jobs[edge.dependent].pk), upstream_id, edge.requires))
        if existing:
            found.update(transitions.lock_upstream_jobs(sorted(set(existing)), using=alias))
        transitions.insert_dependencies(rows, using=alias)
        depended_on = {upstream for _, upstream, _ in rows}
        ended = {job_id: status for job_id, (status, _) in found.items()
                 if status in TERMINAL_STATUSES and job_id in depended_on}
        if ended:
            transitions.resolve_dependencies(ended, using=alias)
            statuses = dict(Job.objects.using(alias).filter(pk__in=[r[0] for r in rows])
                            .values_list("pk", "status"))
            for job in jobs:
                job.status = statuses.get(job.pk, job.status)
    return jobs


def results_of(job_id: int, *, using: str) -> list[DependencyResult]:
    """What the jobs ``job_id`` depends on ended as, and their results, in edge order.

    A result its handler stored encrypted is decrypted (``Undecryptable`` if it cannot be).
    """
    return [DependencyResult(dependency, task, status, _readable_result(task, result), requires)
            for dependency, task, status, result, requires
            in transitions.dependency_results(job_id, using=using)]


def _readable_result(task: str, result: Any) -> Any:
    handler = registry.resolve(task)
    if handler is None or not handler.encrypted_result:
        return result
    return encryption.opened(result, handler.encrypted_result, where=encryption.RESULT,
                             owner=task)


@dataclass(frozen=True)
class DependencyResult:
    """One job a running job depended on: its id, task, how it ended and its result."""

    job_id: int
    task: str
    status: str
    result: Any
    requires: str


__all__ = ["After", "DependencyResult", "chain", "chord", "edges_of", "enqueue_graph", "group"]
