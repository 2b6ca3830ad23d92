"""Pickup probes: a handler reports the moment it started over UDP, by default on loopback.

The harness stamps the time right after the enqueuing transaction commits; the handler stamps
the time it starts and sends it here. Both clocks are the same machine's wall clock. UDP keeps
the report off the database, so it does not add to the load it measures. BENCH_PROBE_HOST, in
the harness's and the workers' environment alike, moves the listener off loopback: workers in
a network namespace report to this host's end of their link (``bench.netns``).
"""

from __future__ import annotations

import os
import socket
import time

HOST = os.environ.get("BENCH_PROBE_HOST", "127.0.0.1")


def report_start(key: int, port: int) -> None:
    """Send "<key> <start time>" to the harness listening on ``port``."""
    started = time.time()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(f"{key} {started!r}".encode(), (HOST, port))


class PickupListener:
    """The harness side: a bound UDP socket that waits for one key's report."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((HOST, 0))
        self.port: int = self.sock.getsockname()[1]

    def wait(self, key: int, timeout: float) -> float | None:
        """Return the start time reported for ``key``, or None after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(256)
            except TimeoutError:
                return None
            got, _, started = data.decode().partition(" ")
            if int(got) == key:
                return float(started)

    def close(self) -> None:
        self.sock.close()
