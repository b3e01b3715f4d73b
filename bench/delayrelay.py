"""A loopback TCP relay that delays data, to measure what network latency costs.

:class:`DelayRelay` listens on a loopback port and forwards every connection it
accepts to one target address. Each chunk read from either side is stamped with
the time it arrived and written to the other side ``delay`` seconds later, in
order: the data is delayed, not throttled (the relay keeps reading while earlier
chunks wait, so a run sees latency and no bandwidth limit of the relay's own).
A round trip through a relay therefore takes at least ``2 * delay`` more than a
direct one.

:class:`RelayMesh` hosts relays in an event loop of their own (a background
thread, so the benchmarked code can run its own loop) and builds, for each party
of an MPC run, the address list that party dials: its own real address and, for
every peer, a relay in front of that peer. With one relay per ordered pair, every
byte between two parties passes one relay, whichever party opened the connection.

The relay measures how long it actually held each chunk (``hold``): a sleeping
process wakes late on a loaded machine, so the real one-way delay is somewhat above
the nominal one; benchmarks report the measured figure. The mesh's loop waits with
select(2), whose timeout has microsecond resolution (epoll's, asyncio's default on
Linux, is rounded up to whole milliseconds, which would turn a 0.5 ms delay into
1 ms or more). Only loopback addresses are accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import selectors
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 1 << 16
CONNECT_PATIENCE = 60.0  # seconds a relay keeps trying to reach a target not yet listening
CONNECT_RETRY = 0.02


def _check_loopback(host: str) -> None:
    if host == "localhost":
        return
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"the delay relay works on loopback only, not on {host}")


@dataclass
class DirectionStats:
    """What one direction of a relay forwarded, and how long it held it."""

    arrived: int = 0  # bytes read from the sender (forwarded or still held)
    bytes: int = 0  # bytes written to the receiver
    chunks: int = 0
    hold_sum: float = 0.0
    hold_max: float = 0.0

    def add(self, other: DirectionStats) -> None:
        self.arrived += other.arrived
        self.bytes += other.bytes
        self.chunks += other.chunks
        self.hold_sum += other.hold_sum
        self.hold_max = max(self.hold_max, other.hold_max)

    @property
    def hold_mean(self) -> float:
        return self.hold_sum / self.chunks if self.chunks else 0.0


@dataclass
class RelayStats:
    connections: int = 0
    to_target: DirectionStats = field(default_factory=DirectionStats)
    from_target: DirectionStats = field(default_factory=DirectionStats)


async def _forward(
    reader: asyncio.StreamReader,
    writer: asyncio.Future[asyncio.StreamWriter],
    delay: float,
    stats: DirectionStats,
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it arrived.

    Reading never waits for writing, so chunks are only delayed, never slowed down
    by the relay; a queue keeps them in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        while True:
            try:
                data = await reader.read(CHUNK)
            except OSError:
                data = b""
            stats.arrived += len(data)
            queue.put_nowait((loop.time(), data))
            if not data:
                return

    async def send() -> None:
        out = await writer
        while True:
            arrived, data = await queue.get()
            wait = arrived + delay - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    if out.can_write_eof():
                        out.write_eof()
                return
            hold = loop.time() - arrived
            out.write(data)
            stats.bytes += len(data)
            stats.chunks += 1
            stats.hold_sum += hold
            stats.hold_max = max(stats.hold_max, hold)
            await out.drain()

    receiving = asyncio.ensure_future(receive())
    try:
        await send()
    finally:
        receiving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiving


class DelayRelay:
    """Forward connections from a loopback port to ``target``, delaying each direction
    by ``delay`` seconds (the one-way delay; a round trip gains ``2 * delay``)."""

    def __init__(self, target: tuple[str, int], delay: float, host: str = "127.0.0.1") -> None:
        if delay < 0:
            raise ValueError("the delay must not be negative")
        _check_loopback(host)
        _check_loopback(target[0])
        self.target = target
        self.delay = delay
        self.host = host
        self.stats = RelayStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        """Start listening on a free loopback port; returns the port."""
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None, "start() first"
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _connect_target(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + CONNECT_PATIENCE
        while True:
            try:
                return await asyncio.open_connection(*self.target)
            except OSError:
                # the target may not listen yet: a party dials its peers as it starts
                if loop.time() > give_up:
                    raise
                await asyncio.sleep(CONNECT_RETRY)

    async def _accept(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        loop = asyncio.get_running_loop()
        t_writer: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
        c_writer_ready: asyncio.Future[asyncio.StreamWriter] = loop.create_future()
        c_writer_ready.set_result(c_writer)
        upstream = asyncio.ensure_future(
            _forward(c_reader, t_writer, self.delay, self.stats.to_target)
        )
        t_w: asyncio.StreamWriter | None = None
        try:
            t_reader, t_w = await self._connect_target()
            t_writer.set_result(t_w)
            downstream = asyncio.ensure_future(
                _forward(t_reader, c_writer_ready, self.delay, self.stats.from_target)
            )
            try:
                await asyncio.gather(upstream, downstream)
            finally:
                downstream.cancel()
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await upstream
            for w in (c_writer, t_w):
                if w is not None:
                    w.close()
                    with contextlib.suppress(Exception):
                        await w.wait_closed()
            self._tasks.discard(task)


class RelayMesh:
    """Relays in a background event loop, one per ordered pair of parties.

    ``view(party, peers)`` gives the address list party ``party`` should dial: its own
    real address and, for every other party, a relay (created on first use) that
    forwards to that party's real address with the mesh's one-way delay."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.relays: dict[tuple[int, int], DelayRelay] = {}
        # select(2): microsecond timeouts (few sockets, far below its descriptor limit)
        self._loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-relay",
                                        daemon=True)
        self._thread.start()
        self._lock = threading.Lock()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def relay(self, src: int, dst: int, target: tuple[str, int]) -> tuple[str, int]:
        with self._lock:
            r = self.relays.get((src, dst))
            if r is None or r.target != target:
                if r is not None:
                    self._run(r.close())
                r = DelayRelay(target, self.delay)
                self._run(r.start())
                self.relays[(src, dst)] = r
            return r.address

    def view(
        self, party: int, peers: Sequence[tuple[str, int]]
    ) -> tuple[tuple[str, int], ...]:
        return tuple(
            addr if j == party else self.relay(party, j, addr) for j, addr in enumerate(peers)
        )

    def reset(self) -> None:
        """Close every relay (between runs: the next run gets fresh ones)."""
        with self._lock:
            for r in self.relays.values():
                self._run(r.close())
            self.relays.clear()

    def totals(self) -> DirectionStats:
        """Both directions of every relay, added up."""
        total = DirectionStats()
        for r in self.relays.values():
            total.add(r.stats.to_target)
            total.add(r.stats.from_target)
        return total

    def close(self) -> None:
        self.reset()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> RelayMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
