"""A TCP delay line: every chunk reaches the other side a fixed time after it arrived.

``python -m bench.delay_proxy --listen HOST:PORT [--listen ...] --upstream HOST:PORT --rtt-ms 5``

Each accepted connection is joined to a new connection to the upstream. Each direction holds
every chunk for half the added round-trip time, scheduled for arrival + delay, and writes the
chunks in the order they came. Chunks in flight overlap, so the proxy adds latency without
capping throughput: a delay line, not a rate limiter. With ``--rtt-ms 0`` it is a plain hop.
Once every address is bound it prints one line, "listening", on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import selectors
import sys
from collections import deque
from collections.abc import Callable, Sequence

Address = tuple[str, int]


class DelayLine:
    """Chunks bound for one transport, each written ``delay`` seconds after it was pushed.

    An action (shutting the socket's sending side, closing it) travels in the same line, so it
    happens after every chunk pushed before it has been written.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._loop = loop
        self._delay = delay
        self._transport: asyncio.WriteTransport | None = None
        self._pending: deque[tuple[float, bytes | Callable[[], None]]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def attach(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._schedule()

    def push(self, item: bytes | Callable[[], None]) -> None:
        self._pending.append((self._loop.time() + self._delay, item))
        self._schedule()

    def _schedule(self) -> None:
        if self._timer is None and self._pending and self._transport is not None:
            self._timer = self._loop.call_at(self._pending[0][0], self._release)

    def _release(self) -> None:
        """Write every chunk that is due, joined in one write; wait for the next one."""
        self._timer = None
        assert self._transport is not None
        now = self._loop.time()
        chunks: list[bytes] = []
        while self._pending and self._pending[0][0] <= now:
            item = self._pending.popleft()[1]
            if isinstance(item, bytes):
                chunks.append(item)
                continue
            if chunks:
                self._transport.write(b"".join(chunks))
                chunks = []
            item()
        if chunks:
            self._transport.write(b"".join(chunks))
        self._schedule()


class _End(asyncio.Protocol):
    """One socket of a proxied connection: what it reads goes into its peer's delay line."""

    def __init__(
        self, outgoing: DelayLine, incoming: DelayLine | None = None, peer: _End | None = None
    ) -> None:
        self.outgoing = outgoing  # the line that writes to this end's socket
        self.incoming = incoming  # the line that carries what this end reads to its peer
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self._read_eof = self._sent_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.outgoing.attach(transport)

    def data_received(self, data: bytes) -> None:
        assert self.incoming is not None
        self.incoming.push(data)

    def eof_received(self) -> bool:
        # Half-closed: pass the end of data on, late, and keep carrying the other way.
        assert self.incoming is not None and self.peer is not None
        self._read_eof = True
        self.incoming.push(self.peer.shut_sending)
        return not self._sent_eof  # False closes the socket: both ways are done

    def shut_sending(self) -> None:
        assert self.transport is not None
        self._sent_eof = True
        if self._read_eof or not self.transport.can_write_eof():
            self.transport.close()
        else:
            self.transport.write_eof()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()  # writes what is buffered first

    def connection_lost(self, exc: Exception | None) -> None:
        if self.incoming is not None and self.peer is not None:
            self.incoming.push(self.peer.close)

    # A slow reader on one side stops reading on the other, as a real path would.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Client(_End):
    """The accepted end: it reads nothing until the upstream connection is open."""

    def __init__(self, upstream: Address, delay: float) -> None:
        super().__init__(DelayLine(asyncio.get_running_loop(), delay))
        self._upstream = upstream
        self._delay = delay

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.pause_reading()
        self._joining = asyncio.get_running_loop().create_task(self._join())

    async def _join(self) -> None:
        loop = asyncio.get_running_loop()
        assert self.transport is not None
        server_line = DelayLine(loop, self._delay)
        try:
            _, server = await loop.create_connection(
                lambda: _End(server_line, incoming=self.outgoing, peer=self), *self._upstream
            )
        except OSError:
            self.transport.close()
            return
        self.incoming, self.peer = server_line, server
        if self.transport.is_closing():
            server_line.push(server.close)
        else:
            self.transport.resume_reading()


async def serve(
    listen: Sequence[Address], upstream: Address, rtt_seconds: float
) -> list[asyncio.Server]:
    """Proxy each of ``listen`` to ``upstream``, adding ``rtt_seconds`` to each round trip."""
    loop = asyncio.get_running_loop()
    delay = rtt_seconds / 2
    return [
        await loop.create_server(lambda: _Client(upstream, delay), host, port)
        for host, port in listen
    ]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """An event loop whose timers keep sub-millisecond time.

    epoll takes its timeout in whole milliseconds, so on the default loop a 0.5 ms hold lasts
    about 1 ms; select takes microseconds. The proxy has a few dozen sockets at most.
    """
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def _address(text: str) -> Address:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=_address, action="append", required=True,
                        help="HOST:PORT to accept connections on (repeatable)")
    parser.add_argument("--upstream", type=_address, required=True, help="HOST:PORT to reach")
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="round-trip time to add, in milliseconds (half each way)")
    args = parser.parse_args(argv)

    async def run() -> None:
        await serve(args.listen, args.upstream, args.rtt_ms / 1000)
        print("listening", flush=True)
        await asyncio.Event().wait()

    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        loop.close()


if __name__ == "__main__":
    main()
