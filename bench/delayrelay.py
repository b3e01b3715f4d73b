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

:class:`RelayProcess` serves many relays (listen port -> target) from a process of
its own, to carry a whole local stack's MPC traffic without sharing a GIL with the
benchmark (which also drives the gateway): this module run as a script,

    python bench/delayrelay.py --delay-ms 0.5 --relay 15004=127.0.0.1:15000 ...

A single-threaded epoll loop (:class:`EpollRelays`) watches every socket; it sleeps
in select(2) on the epoll descriptor itself, so its timeouts have microsecond
resolution whatever the number of sockets (epoll_wait's own timeout is whole
milliseconds). It raises its own priority first (SCHED_FIFO 1 when permitted, else a
lower nice value) so a busy machine wakes it on time, and reports which. Its ``stats``
are the same figures as RelayMesh's, plus its CPU seconds and how late it woke up for
chunks that were due (its own share of a hold above the delay; the rest is a receiver
whose buffer was full, so the chunk waited for it). Chunks sent before the target
listened (a party dials its peers as it starts) are counted apart (``waited``), not in
the hold. Hold is measured from the moment the relay read a chunk: time the data
waited in the kernel before the relay woke up is not in it (small at real-time
priority).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import hashlib
import heapq
import ipaddress
import itertools
import json
import os
import resource
import select
import selectors
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

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
    # chunks that arrived before the target listened, so waited for it (RelayProcess
    # only): forwarded, not in chunks and the hold, which are the delay of a live link
    waited: int = 0

    def add(self, other: DirectionStats) -> None:
        self.arrived += other.arrived
        self.bytes += other.bytes
        self.chunks += other.chunks
        self.hold_sum += other.hold_sum
        self.hold_max = max(self.hold_max, other.hold_max)
        self.waited += other.waited

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


# --------------------------------------------------------------------------- process

Relay = tuple[int, tuple[str, int]]  # (listen port, target address)


def raise_priority() -> str:
    """Real-time priority if permitted, else a lower nice value; says which applied."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return "SCHED_FIFO 1"
    except (OSError, AttributeError):
        pass
    for step in (-10, -5):
        try:
            return f"nice {os.nice(step)}"
        except OSError:
            continue
    return f"none (nice {os.nice(0)})"


class _Direction:
    """One direction of a relayed connection: chunks read from ``src``, each written to
    ``dst`` once ``delay`` has passed since it was read, in order (b"": end of stream)."""

    def __init__(self, stats: DirectionStats) -> None:
        self.src: socket.socket | None = None
        self.dst: socket.socket | None = None  # None while the target is being dialled
        self.queue: deque[tuple[float, bytes]] = deque()
        self.sent = 0  # bytes of the head chunk written
        self.counted = False  # the head chunk's hold is in the stats
        self.reading = True
        self.blocked = False  # dst's send buffer was full: waiting for it to drain
        self.done = False  # the end of the stream was passed on
        self.scheduled: float | None = None  # due time of the pending timer, if any
        self.stats = stats


class _Link:
    """An accepted connection and its connection to the target."""

    def __init__(self, client: socket.socket, target: tuple[str, int], stats: RelayStats,
                 give_up: float) -> None:
        self.client = client
        self.target_addr = target
        self.target: socket.socket | None = None
        self.connected = False
        self.connected_at = float("inf")  # when the target took the connection
        self.give_up = give_up
        self.up = _Direction(stats.to_target)
        self.down = _Direction(stats.from_target)
        self.up.src = client
        self.down.dst = client
        self.closed = False


class EpollRelays:
    """Relays from loopback ports to targets, all in one epoll loop of this thread.

    ``relays``: (listen port, target) pairs; each gets its own :class:`RelayStats`.
    ``control``: a readable stream of commands, one a line: ``stats`` (answered on
    ``reply`` with one JSON line, :meth:`report`), ``reset`` (the same answer, then
    every relay's figures start again from zero), ``quit`` (or the end of the stream)
    stops."""

    def __init__(self, relays: Sequence[Relay], delay: float, host: str = "127.0.0.1") -> None:
        if delay < 0:
            raise ValueError("the delay must not be negative")
        _check_loopback(host)
        for _, target in relays:
            _check_loopback(target[0])
        self.delay = delay
        self.ep = select.epoll()
        self.stats: dict[int, RelayStats] = {}
        self._listeners: dict[int, tuple[socket.socket, tuple[str, int], RelayStats]] = {}
        self._handlers: dict[int, Callable[[int], None]] = {}  # fd -> f(epoll events)
        self._masks: dict[int, int] = {}
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._links: set[_Link] = set()
        # how late the loop woke for chunks whose time had come (its own share of the hold;
        # the rest of a hold above the delay is a receiver that took no more data)
        self.late = DirectionStats()
        self.running = True
        for port, target in relays:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                sock.close()
                self.close()
                raise OSError(exc.errno, f"relay port {port}: {exc.strerror}") from None
            sock.listen(128)
            sock.setblocking(False)
            st = self.stats[port] = RelayStats()
            fd = sock.fileno()
            self._listeners[fd] = (sock, target, st)
            self._watch(sock, select.EPOLLIN, lambda _ev, fd=fd: self._accept(fd))

    # ------------------------------------------------------------------ plumbing
    def _watch(self, sock: socket.socket, mask: int,
               handler: Callable[[int], None] | None = None) -> None:
        """Watch ``sock`` for ``mask``; 0 stops watching it (a socket watched for nothing
        would still report hang-ups, again and again)."""
        fd = sock.fileno()
        if handler is not None:
            self._handlers[fd] = handler
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if mask == 0:
            self.ep.unregister(fd)
            del self._masks[fd]
        elif old == 0:
            self.ep.register(fd, mask)
            self._masks[fd] = mask
        else:
            self.ep.modify(fd, mask)
            self._masks[fd] = mask

    def _forget(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        fd = sock.fileno()
        if fd >= 0:
            if self._masks.pop(fd, 0):
                self.ep.unregister(fd)
            self._handlers.pop(fd, None)
        sock.close()

    def _at(self, due: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (due, next(self._seq), action))

    # ------------------------------------------------------------------ connections
    def _accept(self, fd: int) -> None:
        sock, target, stats = self._listeners[fd]
        while True:
            try:
                client, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # e.g. out of descriptors: pause this port a moment (the peer retries)
                # rather than be told again and again that a connection waits
                self._watch(sock, 0)
                self._at(time.monotonic() + 0.05, lambda: self._watch(sock, select.EPOLLIN))
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stats.connections += 1
            link = _Link(client, target, stats, time.monotonic() + CONNECT_PATIENCE)
            self._links.add(link)
            self._handlers[client.fileno()] = lambda ev, lk=link: self._client_event(lk, ev)
            self._update(link)
            self._dial(link)

    def _dial(self, link: _Link) -> None:
        if link.closed:
            return
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        t.setblocking(False)
        t.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link.target = t
        err = t.connect_ex(link.target_addr)
        self._handlers[t.fileno()] = lambda ev, lk=link: self._target_event(lk, ev)
        if err in (0, errno.EINPROGRESS):
            self._watch(t, select.EPOLLOUT)
            return
        self._dial_failed(link)

    def _dial_failed(self, link: _Link) -> None:
        # the target may not listen yet: a party dials its peers as it starts
        self._forget(link.target)
        link.target = None
        if time.monotonic() > link.give_up:
            self._abort(link)
        else:
            self._at(time.monotonic() + CONNECT_RETRY, lambda: self._dial(link))

    def _connected(self, link: _Link) -> None:
        assert link.target is not None
        if link.target.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
            self._dial_failed(link)
            return
        try:
            link.target.getpeername()
        except OSError:
            return  # still connecting
        link.connected = True
        link.connected_at = time.monotonic()
        link.up.dst = link.target
        link.down.src = link.target
        self._update(link)
        self._flush(link, link.up)

    def _update(self, link: _Link) -> None:
        """Watch each socket for what its directions need now."""
        if link.closed:
            return
        up, down = link.up, link.down
        mask = (select.EPOLLIN if up.reading else 0) | (select.EPOLLOUT if down.blocked else 0)
        self._watch(link.client, mask)
        if link.target is not None and link.connected:
            mask = ((select.EPOLLIN if down.reading else 0)
                    | (select.EPOLLOUT if up.blocked else 0))
            self._watch(link.target, mask)

    def _client_event(self, link: _Link, ev: int) -> None:
        self._side_event(link, ev, writes=link.down, reads=link.up)

    def _target_event(self, link: _Link, ev: int) -> None:
        if not link.connected:
            if ev & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                self._connected(link)
            return
        self._side_event(link, ev, writes=link.up, reads=link.down)

    def _side_event(self, link: _Link, ev: int, *, writes: _Direction,
                    reads: _Direction) -> None:
        """One socket's event: flush what waits for it (``writes``: the direction it
        receives), then read what it sent (``reads``: the direction it is the source of)."""
        if ev & select.EPOLLOUT and writes.blocked:
            writes.blocked = False
            self._flush(link, writes)
        if link.closed:
            return
        if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR) and reads.reading:
            self._read(link, reads)
        self._update(link)

    def _read(self, link: _Link, d: _Direction) -> None:
        assert d.src is not None
        try:
            data = d.src.recv(CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._abort(link)
            return
        now = time.monotonic()
        d.stats.arrived += len(data)
        d.queue.append((now, data))
        if not data:
            d.reading = False
        if len(d.queue) == 1:
            self._schedule(link, d)

    def _schedule(self, link: _Link, d: _Direction) -> None:
        due = d.queue[0][0] + self.delay
        if d.scheduled is not None and d.scheduled <= due:
            return  # an earlier timer flushes this head (and reschedules)
        d.scheduled = due

        def fire() -> None:
            if d.scheduled == due:
                late = time.monotonic() - due
                self.late.chunks += 1
                self.late.hold_sum += late
                self.late.hold_max = max(self.late.hold_max, late)
                d.scheduled = None
                self._flush(link, d)

        self._at(due, fire)

    def _flush(self, link: _Link, d: _Direction) -> None:
        """Write every chunk whose time has come, as far as ``dst`` takes it."""
        if link.closed or d.dst is None or d.blocked:
            return
        now = time.monotonic()
        while d.queue and d.queue[0][0] + self.delay <= now:
            arrived, data = d.queue[0]
            if not data:
                d.queue.popleft()
                d.done = True
                with contextlib.suppress(OSError):
                    d.dst.shutdown(socket.SHUT_WR)
                if link.up.done and link.down.done:
                    self._abort(link)  # both ends finished: close
                    return
                continue
            if not d.counted:
                d.counted = True
                hold = now - arrived
                if arrived < link.connected_at:
                    d.stats.waited += 1  # held up by the target, not by the delay
                else:
                    d.stats.chunks += 1
                    d.stats.hold_sum += hold
                    d.stats.hold_max = max(d.stats.hold_max, hold)
            try:
                n = d.dst.send(memoryview(data)[d.sent:])
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError:
                self._abort(link)
                return
            d.stats.bytes += n
            d.sent += n
            if d.sent < len(data):
                d.blocked = True
                self._update(link)
                return
            d.queue.popleft()
            d.sent = 0
            d.counted = False
        if d.queue:
            self._schedule(link, d)

    def _abort(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        self._forget(link.client)
        self._forget(link.target)
        self._links.discard(link)

    # ------------------------------------------------------------------ loop
    def totals(self) -> DirectionStats:
        total = DirectionStats()
        for st in self.stats.values():
            total.add(st.to_target)
            total.add(st.from_target)
        return total

    def report(self) -> dict[str, Any]:
        use = resource.getrusage(resource.RUSAGE_SELF)
        total = self.totals()
        return {
            "connections": sum(st.connections for st in self.stats.values()),
            "bytes": total.bytes, "chunks": total.chunks, "waited": total.waited,
            "hold_mean_ms": total.hold_mean * 1e3, "hold_max_ms": total.hold_max * 1e3,
            "late_mean_ms": self.late.hold_mean * 1e3, "late_max_ms": self.late.hold_max * 1e3,
            "cpu_seconds": use.ru_utime + use.ru_stime, "implementation": "python",
            "relays": {str(port): asdict(st) for port, st in self.stats.items()},
        }

    def serve(self, control: IO[str] | None = None, reply: IO[str] | None = None) -> None:
        """Relay until ``quit`` (or the end of ``control``); without ``control``, until
        :attr:`running` is cleared (from a signal handler)."""
        buf = b""
        if control is not None:
            cfd = control.fileno()
            os.set_blocking(cfd, False)

            def command(_: int) -> None:
                nonlocal buf
                try:
                    data = os.read(cfd, 4096)
                except BlockingIOError:
                    return
                if not data:
                    self.running = False
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    word = line.decode().strip()
                    if word in ("stats", "reset") and reply is not None:
                        reply.write(json.dumps(self.report()) + "\n")
                        reply.flush()
                    if word == "reset":
                        self.late = DirectionStats()
                        for st in self.stats.values():
                            st.connections = 0
                            st.to_target, st.from_target = DirectionStats(), DirectionStats()
                    elif word == "quit":
                        self.running = False

            self._handlers[cfd] = command
            self.ep.register(cfd, select.EPOLLIN)
        epfd = self.ep.fileno()
        while self.running:
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                heapq.heappop(self._timers)[2]()
                now = time.monotonic()
            timeout = max(0.0, self._timers[0][0] - now) if self._timers else 1.0
            # select(2) on the epoll descriptor: a timeout in microseconds
            ready, _, _ = select.select([epfd], [], [], timeout)
            if not ready:
                continue
            for fd, ev in self.ep.poll(0):
                handler = self._handlers.get(fd)
                if handler is not None:
                    handler(ev)

    def close(self) -> None:
        for link in list(self._links):
            self._abort(link)
        for sock, _, _ in self._listeners.values():
            self._forget(sock)
        self._listeners.clear()
        self.ep.close()


NATIVE_SOURCE = Path(__file__).resolve().with_name("delayrelay.c")
IMPLEMENTATIONS = ("auto", "c", "python")


def native_relay() -> tuple[Path | None, str]:
    """The C relay (delayrelay.c, the same program as :class:`EpollRelays`), built with
    the machine's C compiler (``$CC``, else cc) into a cache directory on first use and
    kept under its source's hash: (path, "") or (None, why it cannot be had)."""
    source = NATIVE_SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ppfs-bench"
    binary = cache / f"delayrelay-{digest}"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary, ""
    cc = shlex.split(os.environ.get("CC") or "cc")
    if shutil.which(cc[0]) is None:
        return None, f"no C compiler ({cc[0]} not found)"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    try:
        r = subprocess.run([*cc, "-O2", "-o", str(tmp), str(NATIVE_SOURCE)],
                           capture_output=True, text=True, check=False, timeout=120)
        if r.returncode != 0:
            return None, f"{cc[0]} could not build delayrelay.c: {r.stderr.strip()[-300:]}"
        os.replace(tmp, binary)
    finally:
        tmp.unlink(missing_ok=True)
    return binary, ""


class RelayProcess:
    """:class:`EpollRelays` in a process of its own: this file run as a script, or the
    same program in C (delayrelay.c), which spends a fraction of the Python one's CPU in
    user space (the kernel's TCP for the extra hop costs the same for both).

    ``relays``: (listen port, target) pairs, every port on loopback; ``delay``: the
    one-way delay in seconds. ``implementation``: "c", "python", or "auto" (C when a
    compiler is at hand, else Python); ``self.implementation`` says which runs.
    Starting returns once every port listens. ``stats()`` asks the process for its
    figures (see :meth:`EpollRelays.report`), ``totals()`` as :class:`DirectionStats`;
    ``priority`` says what the process got."""

    def __init__(self, relays: Sequence[Relay], delay: float, *, priority: bool = True,
                 implementation: str = "auto") -> None:
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation: one of {', '.join(IMPLEMENTATIONS)}")
        if delay < 0:
            raise ValueError("the delay must not be negative")
        binary: Path | None = None
        if implementation != "python":
            binary, why = native_relay()
            if binary is None and implementation == "c":
                raise OSError(f"the C relay is not available: {why}")
        self.implementation = "c" if binary is not None else "python"
        head = [str(binary)] if binary is not None else [sys.executable,
                                                         str(Path(__file__).resolve())]
        argv = [*head, "--delay-ms", repr(delay * 1e3)]
        for port, (host, tport) in relays:
            argv += ["--relay", f"{port}={host}:{tport}"]
        if not priority:
            argv.append("--no-priority")
        self.delay = delay
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise OSError(f"the relay process did not start (exit code {code})")
        ready = json.loads(line)
        self.pid: int = self.proc.pid
        self.priority: str = ready["priority"]

    def _ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise OSError("the relay process ended")
        result: dict[str, Any] = json.loads(line)
        return result

    def stats(self) -> dict[str, Any]:
        """The figures so far (:meth:`EpollRelays.report`)."""
        return self._ask("stats")

    def reset(self) -> dict[str, Any]:
        """The figures so far; the relays' then start again from zero (not the CPU time)."""
        return self._ask("reset")

    def totals(self) -> DirectionStats:
        return report_totals(self.stats())

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def __enter__(self) -> RelayProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ProcessMesh:
    """:class:`RelayMesh`'s interface (``view``, ``totals``, ``close``) over one
    :class:`RelayProcess`: the relays for every ordered pair are started together on
    the first ``view`` call, which gives every party's real address. Ports for the
    relays are picked below the ephemeral range, so that no connection the relays or
    the parties open can take one first."""

    def __init__(self, delay: float, implementation: str = "auto") -> None:
        self.delay = delay
        self.implementation = implementation  # RelayProcess's; once started, which runs
        self.proc: RelayProcess | None = None
        self.peers: tuple[tuple[str, int], ...] = ()
        self.ports: dict[tuple[int, int], int] = {}

    def _start(self, peers: Sequence[tuple[str, int]]) -> None:
        from ppfs.durable import free_port_ranges

        n = len(peers)
        pairs = [(i, j) for i in range(n) for j in range(n) if i != j]
        bases = free_port_ranges(len(pairs), 1, host="127.0.0.1")
        self.ports = dict(zip(pairs, bases, strict=True))
        self.proc = RelayProcess(
            [(self.ports[(i, j)], (peers[j][0], int(peers[j][1]))) for i, j in pairs], self.delay,
            implementation=self.implementation,
        )
        self.implementation = self.proc.implementation
        self.peers = tuple((h, int(p)) for h, p in peers)

    def view(
        self, party: int, peers: Sequence[tuple[str, int]]
    ) -> tuple[tuple[str, int], ...]:
        if self.proc is None:
            self._start(peers)
        elif tuple((h, int(p)) for h, p in peers) != self.peers:
            raise ValueError("a process mesh serves one run: the peers' addresses changed")
        return tuple(
            addr if j == party else ("127.0.0.1", self.ports[(party, j)])
            for j, addr in enumerate(peers)
        )

    def totals(self) -> DirectionStats:
        return self.proc.totals() if self.proc is not None else DirectionStats()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def __enter__(self) -> ProcessMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def report_totals(report: dict[str, Any]) -> DirectionStats:
    """Both directions of every relay in a :meth:`EpollRelays.report`, added up."""
    total = DirectionStats()
    for st in report["relays"].values():
        for key in ("to_target", "from_target"):
            total.add(DirectionStats(**st[key]))
    return total


def _parse_relay(text: str) -> Relay:
    port, eq, target = text.partition("=")
    host, colon, tport = target.rpartition(":")
    if not eq or not colon or not port.isdigit() or not tport.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected PORT=HOST:PORT")
    return int(port), (host, int(tport))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="delaying TCP relays on loopback, one process")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay")
    ap.add_argument("--relay", type=_parse_relay, action="append", required=True,
                    metavar="PORT=HOST:PORT", help="listen on PORT, forward to HOST:PORT")
    ap.add_argument("--no-priority", action="store_true", help="keep the normal priority")
    args = ap.parse_args(argv)
    priority = "not raised" if args.no_priority else raise_priority()
    relays = EpollRelays(args.relay, args.delay_ms / 1e3)
    try:
        sys.stdout.write(json.dumps({"ready": True, "priority": priority,
                                     "implementation": "python"}) + "\n")
        sys.stdout.flush()
        relays.serve(sys.stdin, sys.stdout)
    finally:
        relays.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
