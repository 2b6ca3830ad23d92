"""EXPLAIN (ANALYZE, BUFFERS) of the hot queries, through the very functions that run them.

Each check calls the production function (``claim_jobs``, ``promote_due_jobs``, ...) inside a
transaction that is always rolled back. A Django execute wrapper runs the function's statement
once under EXPLAIN and then once more for the function itself, so the plan is the plan of the
exact SQL and parameters production sends, and nothing either run wrote survives.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from . import prepared, sql
from .maintenance import AGING_KEYSET_START, AgingPolicy, prune_jobs, retention_seconds
from .outcomes import Held, Outcome
from .schedules import enqueue_due_ticks
from .status import JobStatus
from .transitions import (
    claim_jobs,
    expire_pending_jobs,
    prepare_worker_statements,
    promote_due_jobs,
    raise_waiting_priorities,
    ready_queues,
    rescue_expired_leases,
    settle,
)

TABLES = ("pgjobs_job", "pgjobs_attempt", "pgjobs_receipt", "pgjobs_schedule")
INDEX_SCANS = ("Index Scan", "Index Only Scan")
# Nodes that read rows of a table (a ModifyTable names its table too, but reads nothing).
SCANS = ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan",
         "Tid Range Scan", "Sample Scan")
DEFAULT_MAX_ROWS_FACTOR = 4.0
# A sequential scan is the right plan for a table this small, and no sign of a missing index.
SMALL_TABLE_ROWS = 10_000
# The statements workers prepare (transitions.prepare_worker_statements).
PREPARED = frozenset({"claim", "settle"})
_EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
_TRANSACTION_CONTROL = ("SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT")


@dataclass(frozen=True)
class HotQuery:
    """A statement the queue runs all the time, the index it must use, and its row budget."""

    name: str
    # The indexes any one of which serves the statement without touching history.
    indexes: tuple[str, ...]
    # Rows the statement may read from the pgjobs tables, per row of its batch: a claim reads
    # each candidate once through the claim index and once more by primary key to update it.
    reads_per_row: int
    describe: str
    # The table whose index must serve it once that table is large.
    table: str = "pgjobs_job"

    @property
    def index_names(self) -> str:
        return " or ".join(self.indexes)


HOT_QUERIES = {
    q.name: q for q in (
        HotQuery("claim", ("pgjobs_job_claim_idx",), 2,
                 "claim a batch of ready jobs of one queue (transitions.claim_jobs)"),
        HotQuery("promote", ("pgjobs_job_due_idx",), 2,
                 "make due scheduled and retrying jobs ready (transitions.promote_due_jobs)"),
        # Every worker runs it on the rescue step's cadence, pending jobs or none.
        HotQuery("expire_pending", ("pgjobs_job_pending_idx",), 1,
                 "end pending jobs whose deadline passed (transitions.expire_pending_jobs)"),
        HotQuery("rescue", ("pgjobs_job_lease_idx",), 1,
                 "find running jobs whose lease expired (transitions.rescue_expired_leases)"),
        HotQuery("ready_queues", ("pgjobs_job_claim_idx",), 1,
                 "list the queues that have ready jobs (transitions.ready_queues)"),
        # By primary key: the token says the job runs, so no plan reads every running job.
        HotQuery("settle", ("pgjobs_job_pkey",), 2,
                 "settle a batch of outcomes under their lease tokens (transitions.settle)"),
        HotQuery("aging", ("pgjobs_job_claim_idx",), 2,
                 "raise waiting jobs' priority, one batch (transitions.raise_waiting_priorities)"),
        HotQuery("prune", ("pgjobs_job_finished_idx",), 3,
                 "delete finished jobs past retention with their attempts "
                 "(maintenance.prune_jobs)"),
        # Every worker runs it about once a second: the due schedules through the due index,
        # and for each one the last job by primary key (the overlap rule's question).
        HotQuery("schedules", ("pgjobs_schedule_due_idx",), 2,
                 "lock the schedules whose next tick is due (periodic.enqueue_due_ticks)",
                 table="pgjobs_schedule"),
    )
}


@dataclass
class PlanReport:
    """One hot query's plan and what it touched."""

    query: HotQuery
    batch: int
    plan: dict[str, Any]
    rows_read: int
    # Rows read from tables large enough for the budget to apply.
    rows_counted: int
    rows_via_index: int
    row_budget: int
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def buffers(self) -> dict[str, int]:
        """Shared buffers of the whole statement: hit, read, dirtied, written."""
        top = self.plan["Plan"]
        return {kind: int(top.get(f"Shared {kind.title()} Blocks", 0))
                for kind in ("hit", "read", "dirtied", "written")}

    def nodes(self) -> Iterator[dict[str, Any]]:
        return _walk(self.plan["Plan"])

    def render(self) -> str:
        """The plan as an indented tree, then one summary line and the verdict."""
        lines = [f"-- {self.query.name}: {self.query.describe}"]
        _render(self.plan["Plan"], 0, lines)
        b = self.buffers
        lines.append(
            f"rows read: {self.rows_read}, of them {self.rows_counted} from tables over "
            f"{SMALL_TABLE_ROWS} rows (budget {self.row_budget} for a batch of {self.batch}); "
            f"through {self.query.index_names}: {self.rows_via_index}"
        )
        lines.append(
            f"buffers: hit {b['hit']}, read {b['read']}, dirtied {b['dirtied']}, written "
            f"{b['written']}; planning {self.plan.get('Planning Time', 0):.3f} ms, execution "
            f"{self.plan.get('Execution Time', 0):.3f} ms"
        )
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"PROBLEM: {p}" for p in self.problems] or ["OK"]
        return "\n".join(lines)


def explain(
    name: str,
    *,
    queue: str = "default",
    batch: int = 10,
    max_rows_factor: float = DEFAULT_MAX_ROWS_FACTOR,
    using: str = DEFAULT_DB_ALIAS,
) -> PlanReport:
    """Run hot query ``name`` under EXPLAIN (ANALYZE, BUFFERS) and check its plan."""
    query = HOT_QUERIES[name]
    if batch < 1:
        raise ValueError("batch must be at least 1")
    with transaction.atomic(using=using):
        try:
            if name in PREPARED:
                # As workers run them (prepared.Statement's without_jit): no JIT in the timing.
                with connections[using].cursor() as cursor:
                    cursor.execute(prepared.WITHOUT_JIT)
            generic = name in PREPARED and _generic_plans(batch, using)
            plan = _RUNNERS[name](queue, batch, using)
            sizes = _table_sizes(using)
        finally:
            transaction.set_rollback(True, using=using)
    report = _check(query, batch, plan, sizes, max_rows_factor)
    if generic:
        report.notes.append("the generic plan of the prepared statement workers execute")
    return report


def _generic_plans(batch: int, using: str) -> bool:
    """Where workers prepare the claim and the settle, explain the plan they settle on.

    PostgreSQL tries custom plans for a prepared statement's first five executions, then keeps
    a generic one if it looks no dearer: forcing the generic plan checks the one that lasts.
    """
    if not prepare_worker_statements(batch, using=using):
        return False
    with connections[using].cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
    return True


def _check(
    query: HotQuery, batch: int, plan: dict[str, Any], sizes: dict[str, float], factor: float
) -> PlanReport:
    def large(table: str) -> bool:
        # reltuples is -1 before the first ANALYZE: size unknown, so check everything.
        rows = sizes.get(table, -1.0)
        return rows < 0 or rows > SMALL_TABLE_ROWS

    scans = [n for n in _walk(plan["Plan"])
             if n["Node Type"] in SCANS and n.get("Relation Name") in TABLES]
    rows_read = sum(_rows(n) for n in scans)
    via_index = [n for n in _walk(plan["Plan"]) if n.get("Index Name") in query.indexes]
    rows_via_index = sum(_rows(n) for n in via_index)
    if query.name == "ready_queues":
        # One probe per queue found, plus the probe that finds no next queue.
        budget_rows = int(plan["Plan"].get("Actual Rows", 0)) + 1
    else:
        budget_rows = batch
    budget = int(factor * query.reads_per_row * budget_rows)
    counted = sum(_rows(n) for n in scans if large(n["Relation Name"]))
    report = PlanReport(query, batch, plan, rows_read, counted, rows_via_index, budget)
    small = sorted(t for t in TABLES if not large(t))
    if small:
        report.notes.append(
            f"{', '.join(small)} hold{'s' if len(small) == 1 else ''} at most "
            f"{SMALL_TABLE_ROWS} rows: scans of {'it' if len(small) == 1 else 'them'} are not "
            "checked, since reading a few pages beats any index"
        )
    if large(query.table) and not any(n["Node Type"] in INDEX_SCANS for n in via_index):
        used = sorted({f"{n['Node Type']} on {n['Relation Name']}"
                       + (f" using {n['Index Name']}" if "Index Name" in n else "")
                       for n in scans})
        report.problems.append(
            f"does not read {query.index_names} with an index scan (reads: "
            f"{', '.join(used) or '-'})"
        )
    for node in scans:
        table = node["Relation Name"]
        if node["Node Type"] == "Seq Scan" and large(table):
            report.problems.append(f"sequential scan of {table} (about "
                                   f"{max(sizes.get(table, 0), 0):.0f} rows)")
    if counted > budget:
        report.problems.append(
            f"reads {counted} rows for a batch of {batch}, more than {budget} "
            f"({factor:g} x {query.reads_per_row} per row)"
        )
    return report


# --- running the production functions under EXPLAIN ----------------------------------------


class _Capture:
    """Execute wrapper: EXPLAIN the first data statement, then run it for the caller."""

    def __init__(self) -> None:
        self.plan: dict[str, Any] | None = None

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: dict[str, Any]) -> Any:
        if self.plan is None and not many and not sql.lstrip().upper().startswith(
            _TRANSACTION_CONTROL
        ):
            execute(_EXPLAIN + sql, params, many, context)
            row = context["cursor"].fetchone()
            value = row[0]
            self.plan = (json.loads(value) if isinstance(value, str) else value)[0]
        return execute(sql, params, many, context)


def _captured(run: Callable[[], object], using: str) -> dict[str, Any]:
    capture = _Capture()
    with connections[using].execute_wrapper(capture):
        run()
    if capture.plan is None:
        raise RuntimeError("the function ran no statement to explain")
    return capture.plan


def _claim(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: claim_jobs("pgjobs-explain", queue, batch, using=using), using)


def _promote(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: promote_due_jobs(batch, using=using), using)


def _expire_pending(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: expire_pending_jobs(batch, using=using), using)


def _rescue(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: rescue_expired_leases(batch, using=using), using)


def _ready_queues(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: ready_queues(using=using), using)


def _settle(queue: str, batch: int, using: str) -> dict[str, Any]:
    # Settle what a real claim just took, as a worker would (all of it rolled back after).
    claimed = claim_jobs("pgjobs-explain", queue, batch, using=using)
    held: list[Held] = list(claimed) or [_Nobody(0, uuid.uuid4(), "", 0, "", "")]
    outcomes = [Outcome.succeeded(job, "null", 1) for job in held]
    return _captured(lambda: settle(outcomes, using=using), using)


class _Nobody(NamedTuple):
    """A lease nobody holds: what settle is explained with when the queue had nothing."""

    id: int
    lease_token: uuid.UUID
    task: str
    attempt: int
    lease_owner: str
    trace_id: str


def _aging(queue: str, batch: int, using: str) -> dict[str, Any]:
    # The lowest priority level of the queue: the one with the most waiting to do.
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("lowest_ready_priority"), [queue])
        row = cursor.fetchone()
    level = row[0] if row and row[0] is not None else 0
    policy = AgingPolicy.from_settings()
    return _captured(lambda: raise_waiting_priorities(
        queue, level, after=AGING_KEYSET_START, limit=batch, step=policy.step,
        interval_seconds=policy.interval_seconds, cap=policy.cap, using=using,
    ), using)


def _schedules(queue: str, batch: int, using: str) -> dict[str, Any]:
    return _captured(lambda: enqueue_due_ticks(limit=batch, using=using), using)


def _prune(queue: str, batch: int, using: str) -> dict[str, Any]:
    retention = retention_seconds(JobStatus.SUCCEEDED)
    return _captured(lambda: prune_jobs(
        JobStatus.SUCCEEDED, retention if retention is not None else 0.0, batch, using=using,
    ), using)


_RUNNERS: dict[str, Callable[[str, int, str], dict[str, Any]]] = {
    "claim": _claim, "promote": _promote, "expire_pending": _expire_pending,
    "rescue": _rescue, "ready_queues": _ready_queues,
    "settle": _settle, "aging": _aging, "prune": _prune, "schedules": _schedules,
}


# --- reading plans ------------------------------------------------------------------------------


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def _rows(node: dict[str, Any]) -> int:
    """Rows a scan node read: those it returned plus those its filters threw away."""
    per_loop = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                + node.get("Rows Removed by Index Recheck", 0))
    return round(float(per_loop) * node.get("Actual Loops", 1))


def _table_sizes(using: str) -> dict[str, float]:
    with connections[using].cursor() as cursor:
        cursor.execute(sql.query("table_row_estimates"), [list(TABLES)])
        return {name: float(rows) for name, rows in cursor.fetchall()}


def _render(node: dict[str, Any], depth: int, lines: list[str]) -> None:
    label = node["Node Type"]
    if "Index Name" in node:
        label += f" using {node['Index Name']}"
    if "Relation Name" in node:
        label += f" on {node['Relation Name']}"
    if "CTE Name" in node:
        label += f" {node['CTE Name']}"
    label += f" (actual rows={node.get('Actual Rows', 0):g} loops={node.get('Actual Loops', 1)})"
    hit, read = node.get("Shared Hit Blocks", 0), node.get("Shared Read Blocks", 0)
    if hit or read:
        label += f" buffers hit={hit} read={read}"
    indent = "  " * depth
    lines.append(f"{indent}{'-> ' if depth else ''}{label}")
    for key in ("Index Cond", "Filter", "Rows Removed by Filter", "Sort Key", "Join Filter"):
        if key in node:
            value = node[key]
            if isinstance(value, list):
                value = ", ".join(value)
            lines.append(f"{indent}     {key}: {value}")
    for child in node.get("Plans", []):
        _render(child, depth + 1, lines)
