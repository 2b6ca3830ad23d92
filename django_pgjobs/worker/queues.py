"""Which queue a claim tries first: weighted turns over the queues a worker serves.

A worker given queues takes them in a smooth weighted round-robin; one serving every queue
takes turns over the queues that have ready jobs, read again at most once a second, and over
the queues its notifications name meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from ..transitions import ready_queues
from .connections import refuse_read_only_server

# How long the list of queues with ready jobs is trusted by a worker that serves every queue.
QUEUE_REFRESH_SECONDS = 1.0


def weighted_rotation(weights: Mapping[str, int]) -> list[str]:
    """One cycle of queue turns in which each queue appears ``weight`` times, spread evenly.

    Smooth weighted round-robin: {"billing": 3, "default": 1} gives billing, billing, default,
    billing, so no queue waits longer than its share between turns.
    """
    total = sum(weights.values())
    current = dict.fromkeys(weights, 0)
    cycle = []
    for _ in range(total):
        for queue, weight in weights.items():
            current[queue] += weight
        chosen = max(current, key=lambda q: current[q])
        current[chosen] -= total
        cycle.append(chosen)
    return cycle


def check_weights(weights: Mapping[str, int], queues: Sequence[str] | None) -> dict[str, int]:
    """``weights`` if every one is a whole number from 1 to 100 for a served queue."""
    for queue, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
            raise ValueError(f"queue weight for {queue!r} must be a whole number from 1 to 100, "
                             f"got {weight!r}")
        if queues is None or queue not in queues:
            raise ValueError(f"queue weight given for {queue!r}, which the worker does not serve")
    return dict(weights)


class QueueRotation:
    """The order in which one claim tries the queues; shared by a worker's executors."""

    def __init__(
        self, queues: Sequence[str] | None, weights: Mapping[str, int], *, using: str
    ) -> None:
        self.queues = list(queues) if queues is not None else None
        self.weights = check_weights(weights, self.queues)
        self.using = using
        # The turns an explicit queue list takes; a queue without a weight has weight 1.
        self._schedule = weighted_rotation(
            {q: self.weights.get(q, 1) for q in self.queues}
        ) if self.queues else []
        self._turn = 0
        self._known: list[str] = []
        # When the list was read; never yet: -inf; 0.0 once a claim found nothing.
        self._read_at = float("-inf")

    def order(self) -> list[str]:
        """The queues to try for the next claim, first choice first."""
        if self.queues is not None:
            queues, schedule = self.queues, self._schedule
        else:
            now = time.monotonic()
            if now - self._read_at > QUEUE_REFRESH_SECONDS:
                self._known = ready_queues(using=self.using)
                self._read_at = now
                if not self._known:
                    # Nothing anywhere, or a read-only server (the old primary after a
                    # failover) where nothing will ever be: the latter is refused, and the
                    # worker reconnects.
                    refuse_read_only_server(self.using)
            queues = schedule = self._known
        if not queues:
            return []
        # Each claim starts at the next turn of the cycle and falls back to the other queues in
        # order, so a flooded queue gets at most its share of claims while other queues have
        # ready work, and all of them when they have none.
        turn = self._turn = (self._turn + 1) % len(schedule)
        start = queues.index(schedule[turn])
        return queues[start:] + queues[:start]

    def found_nothing(self) -> None:
        """No queue tried had work: a worker serving every queue reads them again next time."""
        if self.queues is None:
            self._read_at = 0.0

    def noticed(self, queue: str) -> None:
        """A notification said ``queue`` has a ready job (the listener's thread calls this).

        A worker serving every queue takes it at its word: after a claim that found nothing,
        the notified queue is the one known to have work, so the next claim goes straight to it
        without reading the list again (one round trip less between enqueue and pickup); while
        the list is fresh, the queue joins it. The list is read again once it is a second old.
        """
        if self.queues is not None:
            return
        if self._read_at == 0.0:
            self._known = [queue]
            self._read_at = time.monotonic()
        elif queue not in self._known:
            self._known = [*self._known, queue]

    def labels(self) -> list[str]:
        """The served queues as the start-up log line shows them (``*`` for every queue)."""
        if self.queues is None:
            return ["*"]
        return [f"{q}:{self.weights[q]}" if q in self.weights else q for q in self.queues]


__all__ = ["QueueRotation", "check_weights", "weighted_rotation"]
