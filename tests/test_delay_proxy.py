"""The benchmark's TCP delay line: bytes intact and in order, each chunk late by the delay."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.delay_proxy import DelayLine, new_event_loop, serve


class FakeLoop:
    """A clock that moves only when told, and the timers due on it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any) -> object:
        self.timers.append((when, callback))
        return object()

    def advance_to(self, when: float) -> None:
        self.now = when
        while due := [t for t in self.timers if t[0] <= when]:
            self.timers.remove(due[0])
            due[0][1]()


class Transport:
    def __init__(self) -> None:
        self.written: list[tuple[float, bytes]] = []
        self.closed = False
        self.loop: FakeLoop | None = None

    def write(self, data: bytes) -> None:
        assert self.loop is not None and not self.closed
        if data:
            self.written.append((self.loop.now, data))

    def close(self) -> None:
        self.closed = True


def _line(delay: float) -> tuple[FakeLoop, Transport, DelayLine]:
    loop, transport = FakeLoop(), Transport()
    transport.loop = loop
    line = DelayLine(loop, delay)  # type: ignore[arg-type]
    line.attach(transport)  # type: ignore[arg-type]
    return loop, transport, line


def test_each_chunk_is_due_at_its_arrival_plus_the_delay_not_after_the_one_before() -> None:
    loop, transport, line = _line(0.5)
    for at, chunk in ((0.0, b"a"), (0.25, b"b"), (0.375, b"c")):
        loop.now = at
        line.push(chunk)
    loop.advance_to(0.4375)
    assert transport.written == []
    loop.advance_to(0.5)
    assert transport.written == [(0.5, b"a")]
    # A rate limiter would hold "b" until 1.0 and "c" until 1.5.
    loop.advance_to(0.875)
    assert transport.written == [(0.5, b"a"), (0.875, b"bc")]


def test_an_action_waits_for_the_chunks_pushed_before_it() -> None:
    loop, transport, line = _line(0.5)
    line.push(b"last")
    loop.now = 0.25
    line.push(transport.close)
    loop.advance_to(0.5)
    assert transport.written == [(0.5, b"last")] and not transport.closed
    loop.advance_to(0.75)
    assert transport.closed


def test_chunks_pushed_before_the_transport_is_attached_wait_for_it() -> None:
    loop, transport = FakeLoop(), Transport()
    transport.loop = loop
    line = DelayLine(loop, 0.5)  # type: ignore[arg-type]
    line.push(b"early")
    loop.advance_to(1.0)
    line.attach(transport)  # type: ignore[arg-type]
    loop.advance_to(1.0)
    assert transport.written == [(1.0, b"early")]


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every chunk in capitals, so the answer is not the question."""
    while data := await reader.read(65536):
        writer.write(data.upper())
        await writer.drain()
    writer.close()


async def _through_proxy(rtt: float) -> dict[str, Any]:
    upstream = await asyncio.start_server(_echo, "127.0.0.1", 0)
    upstream_port = upstream.sockets[0].getsockname()[1]
    (proxy,) = await serve([("127.0.0.1", 0)], ("127.0.0.1", upstream_port), rtt)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", proxy.sockets[0].getsockname()[1]
    )
    start = time.monotonic()
    writer.write(b"ping")
    await writer.drain()
    first_answer = await reader.readexactly(4)
    round_trip = time.monotonic() - start
    # Many numbered chunks, sent without waiting: they must come back whole and in order.
    chunks = [f"chunk {i:05d};".encode() * 50 for i in range(300)]
    for chunk in chunks:
        writer.write(chunk)
    # Half-close: the echo answers the rest, then closes, and that close must come through.
    writer.write_eof()
    received = await reader.read()
    writer.close()
    proxy.close()
    upstream.close()
    return {"first": first_answer, "round_trip": round_trip, "received": received,
            "expected": b"".join(chunk.upper() for chunk in chunks)}


def _run_through_proxy(rtt: float) -> dict[str, Any]:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(_through_proxy(rtt))
    finally:
        loop.close()


def test_bytes_cross_intact_and_in_order_both_ways() -> None:
    result = _run_through_proxy(0.0)
    assert result["first"] == b"PING"
    assert result["received"] == result["expected"]


def test_a_round_trip_takes_at_least_the_added_round_trip_time() -> None:
    result = _run_through_proxy(0.2)
    assert result["first"] == b"PING"
    assert result["round_trip"] >= 0.9 * 0.2
    assert result["received"] == result["expected"]
