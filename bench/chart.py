"""Draw a results file as a PNG: ``python -m bench.chart [results.json] [out.png]``.

Left, drain throughput per system (pgjobs at every shape measured, the peers and the pgbench
floors); right, pickup latency p50 and p99 per system on a log scale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt

from bench.harness import ROOT

_COLORS = {"pgjobs": "#1f6f4a", "pgbench floor": "#9aa0a6", "pgqueuer": "#d97706",
           "procrastinate": "#7c3aed", "django-tasks-db": "#2563eb", "chancy": "#db2777",
           "oban": "#0891b2"}


_ORDER = ["pgjobs", "pgjobs (server-side binding)", "pgqueuer", "chancy", "oban",
          "procrastinate", "django-tasks-db", "pgbench floor"]
_SHORT = {"pgjobs (server-side binding)": "pgjobs server-bound"}


def _label(row: dict[str, Any]) -> str:
    name = _SHORT.get(row["system"], row["system"])
    if row["system"] == "pgbench floor":
        return f"floor {row['processes']} clients b{row['batch']}"
    threads = f"x{row['concurrency']}t" if row["concurrency"] > 1 else ""
    batch = f" b{row['batch']}" if row["system"] != "procrastinate" and row["system"] != (
        "django-tasks-db") else ""
    return f"{name} {row['processes']}p{threads}{batch}"


def _color(system: str) -> str:
    return _COLORS.get(system, _COLORS["pgjobs"] if system.startswith("pgjobs") else "#555")


def draw(results: dict[str, Any], out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5),
                                      gridspec_kw={"width_ratios": [1.6, 1]})
    drain = sorted(results.get("drain", []), key=lambda r: (
        _ORDER.index(r["system"]) if r["system"] in _ORDER else len(_ORDER),
        r["processes"] * r["concurrency"], r["batch"]))
    labels = [_label(r) for r in drain]
    rates = [r["jobs_per_s"] for r in drain]
    left.barh(labels, rates, color=[_color(r["system"]) for r in drain])
    left.invert_yaxis()
    left.set_xlabel("jobs/s (no-op jobs, steady state)")
    left.set_title("Drain throughput")
    for y, rate in enumerate(rates):
        left.text(rate, y, f" {rate:,.0f}", va="center", fontsize=8)
    left.set_xlim(0, max(rates, default=1) * 1.18)

    pickup = results.get("pickup", {})
    names = list(pickup)
    xs = range(len(names))
    right.bar([x - 0.2 for x in xs], [pickup[n]["p50_ms"] for n in names], width=0.4,
              label="p50", color=[_COLORS.get(n, "#555") for n in names])
    right.bar([x + 0.2 for x in xs], [pickup[n]["p99_ms"] for n in names], width=0.4,
              label="p99", color=[_COLORS.get(n, "#555") for n in names], alpha=0.45)
    right.set_xticks(list(xs), names, rotation=15)
    right.set_yscale("log")
    right.set_ylabel("ms from enqueue commit to handler start (log)")
    right.set_title("Pickup latency, idle worker (solid p50, light p99)")
    for x, n in zip(xs, names, strict=True):
        right.text(x - 0.2, pickup[n]["p50_ms"], f"{pickup[n]['p50_ms']:.1f}", ha="center",
                   va="bottom", fontsize=8)

    m = results["machine"]
    fig.suptitle(f"django-pgjobs benchmarks: {m['cores']} cores, PostgreSQL {m['postgresql']} "
                 "(shared, noisy machine; see docs/benchmarks.md)", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def default_output(results: dict[str, Any]) -> Path:
    """docs/benchmarks.png for a full run of every section, else a file under bench/results."""
    # A quick or partial run only checks the runner: it must not replace the published chart.
    if results.get("quick") or not ("drain" in results and "pickup" in results):
        return ROOT / "bench" / "results" / "benchmarks-partial.png"
    return ROOT / "docs" / "benchmarks.png"


def main() -> None:
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "bench/results/latest.json"
    results = json.loads(source.read_text())
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else default_output(results)
    draw(results, out)
    print(out)


if __name__ == "__main__":
    main()
