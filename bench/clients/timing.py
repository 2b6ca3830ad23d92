"""Timing helpers shared by the clients."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from bench.harness import percentile
from bench.probe import PickupListener

# The suffix of a single-enqueue figure taken in autocommit (each enqueue its own transaction,
# no transaction.atomic() around it); the other single figures are taken inside one.
AUTOCOMMIT = " (autocommit)"


def alternate(
    blocks: dict[str, Callable[[int, int], None]], n: int, rounds: int
) -> dict[str, float]:
    """Time each block on ``n`` items split in ``rounds`` interleaved rounds; return items/s.

    Interleaving spreads the machine's background noise over every contender alike.
    """
    spent = dict.fromkeys(blocks, 0.0)
    per_round = max(1, n // rounds)
    for r in range(rounds):
        for name, block in blocks.items():
            start = time.perf_counter()
            block(r * per_round, per_round)
            spent[name] += time.perf_counter() - start
    return {name: per_round * rounds / seconds for name, seconds in spent.items()}


def pickup_latencies(
    enqueue: Callable[[int, int], Any], samples: int, timeout: float = 15.0
) -> dict[str, Any]:
    """Enqueue one probe at a time to an idle worker; milliseconds from commit to handler start.

    ``enqueue(key, port)`` must return only once the enqueuing transaction has committed.
    """
    listener = PickupListener()
    latencies: list[float] = []
    missed = 0
    try:
        for key in range(-2, samples):  # two warm-up probes, not counted
            enqueue(key, listener.port)
            committed = time.time()
            started = listener.wait(key, timeout)
            if started is None:
                missed += 1
                continue
            if key >= 0:
                latencies.append((started - committed) * 1000)
            # Let the worker go idle again (its poll timer restarts at a random phase).
            time.sleep(random.uniform(0.05, 0.15))
    finally:
        listener.close()
    return {
        "samples": len(latencies),
        "missed": missed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies, default=float("nan")),
    }
