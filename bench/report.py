"""Turn a results dictionary into the tables and target checks the runner prints.

Targets are reported, never enforced: the machine is shared and the figures are noisy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from bench.clients.timing import AUTOCOMMIT

HEADLINE = (4, 1, 10)  # pgjobs processes, threads, batch compared with the peers
PEERS = ("pgqueuer", "procrastinate", "django-tasks-db", "chancy", "oban")


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.rjust(w) if i else c.ljust(w)
                              for i, (c, w) in enumerate(zip(r, widths, strict=True))) + " |"
            for r in rows]
    return "\n".join([line, rule, *body])


def _target(label: str, value: float | None, goal: str, met: bool | None) -> list[str]:
    verdict = "n/a" if met is None else ("met" if met else "NOT met")
    return [label, _fmt(value, 2), goal, verdict]


def _ratio(rates: dict[str, float], ours: str, theirs: str) -> str:
    if ours not in rates or theirs not in rates:
        return ""
    return _fmt(rates[ours] / rates[theirs], 2)


def _drain_targets(
    head: dict[str, Any], pgq: dict[str, Any], drain: list[dict[str, Any]]
) -> list[list[str]]:
    """The headline drain against PgQueuer's, and its server work against every peer's."""
    ratio = head["jobs_per_s"] / pgq["jobs_per_s"]
    rows = [_target("drain ÷ PgQueuer's (batch 10)", ratio, ">= 1.0", ratio >= 1.0),
            _target("drain ÷ PgQueuer's (batch 10), the moonshot", ratio, ">= 1.5",
                    ratio >= 1.5)]
    if head["cpu_us_per_job"] is not None and pgq["cpu_us_per_job"]:
        ratio = head["cpu_us_per_job"] / pgq["cpu_us_per_job"]
        rows.append(_target("worker CPU per job ÷ PgQueuer's", ratio, "<= 1.0", ratio <= 1.0))
    peers = [r for r in drain if r["system"] in PEERS]
    ours = head.get("server_cpu_us_per_job")
    theirs = [r["server_cpu_us_per_job"] for r in peers if r.get("server_cpu_us_per_job")]
    if ours is not None and theirs:
        ratio = ours / min(theirs)
        rows.append(_target("server CPU per job ÷ the lowest peer's", ratio, "<= 1.0",
                            ratio <= 1.0))
    tuples = head.get("tuples_written_per_job")
    if tuples is not None:
        rows.append(_target("tuples written per job", tuples, "<= 3", tuples <= 3.0))
    for key, label in (("wal_bytes_per_job", "WAL bytes"),
                       ("transactions_per_job", "transactions")):
        if head.get(key) is not None and pgq.get(key):
            ratio = head[key] / pgq[key]
            rows.append(_target(f"{label} per job ÷ PgQueuer's", ratio, "<= 1.0", ratio <= 1.0))
    return rows


def _ratio_row(name: str, head: dict[str, Any], row: dict[str, Any]) -> list[str]:
    """pgjobs's headline ÷ ``row``, in the steady state and end to end."""
    ours, theirs = head.get("end_to_end_jobs_per_s"), row.get("end_to_end_jobs_per_s")
    return [name, f"{row['jobs']:,}", _fmt(head["jobs_per_s"] / row["jobs_per_s"], 2),
            _fmt(row.get("end_to_end_seconds"), 2),
            _fmt(ours / theirs, 2) if ours and theirs else "n/a"]


def headline_drain(drain: list[dict[str, Any]]) -> dict[str, Any] | None:
    for row in drain:
        if row["system"] == "pgjobs" and (row["processes"], row["concurrency"],
                                          row["batch"]) == HEADLINE:
            return row
    return None


def floor_for(drain: list[dict[str, Any]], clients: int, batch: int) -> dict[str, Any] | None:
    return next((r for r in drain if r["system"] == "pgbench floor"
                 and r["processes"] == clients and r["batch"] == batch), None)


def render(results: dict[str, Any]) -> str:
    out: list[str] = []
    m = results["machine"]
    out.append(f"machine: {m['cores']} cores ({m['cpu']}), {m['memory_gib']} GiB, "
               f"PostgreSQL {m['postgresql']}, Python {m['python']}, commit {m['commit']}")
    out.append("versions: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v))
    out.append("server: " + ", ".join(f"{k}={v}" for k, v in m["server_settings"].items())
               + f"; machine load average at start {m['load_average_at_start']:.1f}")
    if results.get("noisy"):
        out.append("NOISY RUN: a CPU-bound neighbour process kept a core busy throughout")
    if results.get("quick"):
        out.append("QUICK RUN: small sizes, figures only check the runner")
    targets: list[list[str]] = []

    enqueue = results.get("enqueue")
    if enqueue:
        single, bulk = enqueue["single_per_s"], enqueue["bulk_per_s"]
        auto = {name.removesuffix(AUTOCOMMIT): rate for name, rate in single.items()
                if name.endswith(AUTOCOMMIT)}
        single = {name: rate for name, rate in single.items() if not name.endswith(AUTOCOMMIT)}
        rows = []
        for name in ("pgjobs", "pgjobs (server-side binding)", "orm_create", "orm_bulk_create",
                     "django-tasks-db", "procrastinate", "pgqueuer", "chancy", "oban",
                     "floor"):
            if name in single or name in auto or name in bulk:
                rows.append([name, _fmt(single.get(name)), _fmt(auto.get(name)),
                             _fmt(bulk.get(name)), _ratio(single, "pgjobs", name),
                             _ratio(auto, "pgjobs", name), _ratio(bulk, "pgjobs", name)])
        out += ["", "Enqueue (jobs/s, one client; single = one job per transaction, in "
                "transaction.atomic() or in autocommit; bulk = "
                f"{enqueue['bulk_chunk']} per transaction)",
                _table(["system", "single in atomic/s", "single autocommit/s", "bulk/s",
                        "pgjobs ÷ it (atomic)", "pgjobs ÷ it (autocommit)",
                        "pgjobs ÷ it (bulk)"], rows)]
        ratio = single["orm_create"] / single["pgjobs"]
        targets.append(_target("single enqueue in atomic, time ÷ bare objects.create()", ratio,
                               "<= 1.1", ratio <= 1.1))
        if "pgjobs" in auto and "django-tasks-db" in auto:
            ratio = auto["pgjobs"] / auto["django-tasks-db"]
            targets.append(_target("single enqueue in autocommit ÷ django-tasks-db's", ratio,
                                   ">= 1.0", ratio >= 1.0))
        if "pgqueuer" in bulk:
            ratio = bulk["pgjobs"] / bulk["pgqueuer"]
            targets.append(_target("bulk enqueue ÷ PgQueuer's", ratio, ">= 0.8", ratio >= 0.8))

    drain = results.get("drain")
    if drain:
        rows = []
        for r in drain:
            base = ""
            if r["system"].startswith("pgjobs"):
                f = floor_for(drain, r["processes"] * r["concurrency"], r["batch"])
                base = _fmt(r["jobs_per_s"] / f["jobs_per_s"], 2) if f else ""
            rows.append([r["system"], str(r["processes"]), str(r["concurrency"]), str(r["batch"]),
                         f"{r['jobs']:,}", _fmt(r["jobs_per_s"]), base,
                         _fmt(r.get("end_to_end_seconds"), 2),
                         _fmt(r.get("end_to_end_jobs_per_s")), _fmt(r["cpu_us_per_job"]),
                         _fmt(r.get("server_cpu_us_per_job")),
                         _fmt(r["max_rss_mb"], 1), _fmt(r.get("wal_bytes_per_job")),
                         _fmt(r.get("transactions_per_job"), 2),
                         _fmt(r.get("tuples_written_per_job"), 1),
                         "" if r["complete"] else "incomplete"])
        out += ["", "Drain (no-op jobs, steady state between 5% and 95% done; end to end from "
                "spawning the workers until nothing is outstanding, start-up included; server "
                "work per job over the whole drain, from PostgreSQL's counters)",
                _table(["system", "processes", "threads", "batch", "jobs", "jobs/s", "÷ floor",
                        "end-to-end s", "end-to-end jobs/s",
                        "worker CPU µs/job", "server CPU µs/job", "worker RSS MB",
                        "WAL bytes/job", "xacts/job",
                        "tuples/job", ""], rows)]
        workers: dict[str, str] = {}
        for r in drain:  # the first shape of each: the others change only the flags above
            if r.get("worker"):
                workers.setdefault(r["system"], r["worker"])
        if workers:
            out += ["", "Drain workers (each system's first shape above; each run by its own "
                    "command, with these settings)",
                    *(f"- {name}: {worker}" for name, worker in workers.items())]
        head = headline_drain(drain)
        if head:
            ratios = [_ratio_row("pgjobs", head, head)]
            for r in drain:
                if r["system"] not in ("pgjobs", "pgbench floor"):
                    ratios.append(_ratio_row(r["system"], head, r))
            f = floor_for(drain, HEADLINE[0] * HEADLINE[1], HEADLINE[2])
            if f:
                ratios.append(_ratio_row("pgbench floor (same shape)", head, f))
            out += ["", "pgjobs drain (4 processes, batch 10) ÷ each: steady state (5% to 95%) "
                    "and end to end (start-up included; it weighs more the fewer the jobs)",
                    _table(["vs", "jobs", "steady ratio", "end-to-end s", "end-to-end ratio"],
                           ratios)]
            pgq = next((r for r in drain if r["system"] == "pgqueuer"), None)
            if pgq:
                targets += _drain_targets(head, pgq, drain)
            if f:
                ratio = head["jobs_per_s"] / f["jobs_per_s"]
                targets.append(_target("drain ÷ pgbench floor (batch 10)", ratio, ">= 0.6",
                                       ratio >= 0.6))

    startup = results.get("startup")
    if startup:
        base = startup.get("pgjobs", {}).get("median_s")
        rows = [[name, _fmt(r["median_s"], 2),
                 _fmt(r["median_s"] / base, 2) if base else "-",
                 ", ".join(f"{s:.2f}" for s in r["samples"])] for name, r in startup.items()]
        out += ["", "Worker start-up (one process spawned on a queue of one no-op job: seconds "
                "until it is done; median)",
                _table(["system", "s", "÷ pgjobs", "samples"], rows)]
        if base and "pgqueuer" in startup:
            ratio = base / startup["pgqueuer"]["median_s"]
            targets.append(_target("worker start-up ÷ PgQueuer's", ratio, "<= 1.0",
                                   ratio <= 1.0))

    pickup = results.get("pickup")
    if pickup:
        rows = [[name, _fmt(p["p50_ms"], 1), _fmt(p["p99_ms"], 1), _fmt(p["max_ms"], 1),
                 str(p["samples"]), str(p["missed"])] for name, p in pickup.items()]
        out += ["", "Pickup latency (idle worker, ms from the enqueue's commit to handler start)",
                _table(["system", "p50 ms", "p99 ms", "max ms", "samples", "missed"], rows)]
        if "pgjobs" in pickup:
            p50 = pickup["pgjobs"]["p50_ms"]
            targets.append(_target("pickup p50 (ms)", p50, "<= 3", p50 <= 3))
            if "pgqueuer" in pickup:
                ratio = p50 / pickup["pgqueuer"]["p50_ms"]
                targets.append(_target("pickup p50 ÷ PgQueuer's", ratio, "<= 1.0", ratio <= 1.0))

    history = results.get("history")
    if history:
        sizes = history["sizes"]
        rows = [[f"{s['finished_rows']:,}", _fmt(s["p50_ms"], 2), _fmt(s["p99_ms"], 2),
                 _fmt(s["mean_ms"], 2), _fmt(s.get("server_ms"), 3),
                 _fmt(s.get("planning_ms"), 3), _fmt(s.get("buffers")),
                 _fmt(s.get("rows_read"))] for s in sizes]
        out += ["", f"Claim latency versus finished history (batch {history['batch']}, "
                f"{history['ready']:,} ready jobs)",
                _table(["finished rows", "p50 ms", "p99 ms", "mean ms", "server ms (EXPLAIN)",
                        "planning ms", "buffers", "rows read"], rows)]
        if len(sizes) > 1:
            ratio = sizes[-1]["p50_ms"] / sizes[0]["p50_ms"]
            targets.append(_target(
                f"claim p50 at {sizes[-1]['finished_rows']:,} ÷ at {sizes[0]['finished_rows']:,}",
                ratio, "<= 1.3", ratio <= 1.3))

    experiments = results.get("experiments")
    if experiments:
        base = experiments[0]
        rows = [[r["system"], _fmt(r["jobs_per_s"]), _fmt(r["jobs_per_s"] / base["jobs_per_s"], 2),
                 _fmt(r["cpu_us_per_job"]), ", ".join(map(str, r.get("runs", [])))]
                for r in experiments]
        out += ["", "Experiments (drain, 4 processes, batch 10; median of interleaved runs)",
                _table(["variant", "jobs/s", "÷ as is", "worker CPU µs/job", "runs"], rows)]

    if targets:
        out += ["", "Targets for this machine (reported, not enforced)",
                _table(["figure", "value", "target", ""], targets)]
    return "\n".join(out)


def render_remote(results: dict[str, Any]) -> str:
    """The table of ``bench.remote``: drain, pickup and server work per placement and batch."""
    m = results["machine"]
    out = [f"machine: {m['cores']} cores, PostgreSQL {m['postgresql']}, commit {m['commit']}; "
           f"load average at start {m['load_average_at_start']:.1f}"]
    if results.get("quick"):
        out.append("QUICK RUN: small sizes, figures only check the scenario")
    rows = [[r["placement"], _fmt(r["select_1_ms"], 2), str(r["threads"]), str(r["batch"]),
             f"{r['jobs']:,}",
             _fmt(r["jobs_per_s"]), _fmt(r["pickup"]["p50_ms"], 1),
             _fmt(r["pickup"]["p99_ms"], 1), _fmt(r["wal_bytes_per_job"]),
             _fmt(r["transactions_per_job"], 2), _fmt(r["tuples_written_per_job"], 2),
             _fmt(r["cpu_us_per_job"]), _fmt(r["proxy_cpu_us_per_job"]),
             _fmt(r["load_average"], 1), f"{r['commits_elsewhere']:,}",
             "" if r["complete"] else "incomplete"]
            for r in results["rows"]]
    out += ["", "Workers on other hosts (4 processes; drain between 5% and 95% done)",
            _table(["workers", "SELECT 1 ms", "threads", "batch", "jobs", "jobs/s", "pickup p50 ms",
                    "pickup p99 ms", "WAL B/job", "commits/job", "rows written/job",
                    "worker CPU µs/job", "proxy CPU µs/job", "load",
                    "commits elsewhere", ""], rows)]
    named = results.get("pickup_named_queue")
    if named:
        p = named["pickup"]
        out += ["", f"Pickup, {named['placement']}, batch {named['batch']}, workers started with "
                f"--queue default: p50 {_fmt(p['p50_ms'], 1)} ms, p99 {_fmt(p['p99_ms'], 1)} ms "
                f"({p['samples']} samples, {p['missed']} missed)"]
    return "\n".join(out)
