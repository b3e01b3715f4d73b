"""The benchmarks' delay relays (in a thread's event loop, and as a process of their own):
data intact and in order, held for the delay, loopback only."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from ppfs.durable import free_port_ranges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from delayrelay import DelayRelay, EpollRelays, RelayMesh, RelayProcess, native_relay

DELAY = 0.05


@pytest.fixture(params=["python", "c"])
def implementation(request: pytest.FixtureRequest) -> str:
    """Each RelayProcess test runs the relay in Python and in C (delayrelay.c), which
    must behave the same; the C one skips, saying why, where no C compiler builds it."""
    if request.param == "c":
        binary, why = native_relay()
        if binary is None:
            pytest.skip(f"the C relay cannot be built here: {why}")
    return str(request.param)


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(4096):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


def test_bytes_arrive_intact_in_order_and_delayed() -> None:
    async def main() -> None:
        server = await _echo_server()
        target = server.sockets[0].getsockname()[:2]
        relay = DelayRelay(target, DELAY)
        port = await relay.start()
        assert relay.address[0] == "127.0.0.1"
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # many small writes and one large one: order across chunks must be kept
        pieces = [os.urandom(n) for n in (1, 7, 300, 4096, 70_000, 1_000_000, 5)]
        sent = b"".join(pieces)
        t0 = loop.time()
        for p in pieces:
            writer.write(p)
        await writer.drain()
        first = await reader.readexactly(1)
        round_trip = loop.time() - t0
        rest = await reader.readexactly(len(sent) - 1)
        writer.write_eof()
        assert await reader.read() == b""  # the end of the stream is relayed too
        writer.close()
        await relay.close()
        server.close()
        await server.wait_closed()
        assert first + rest == sent
        # one relay hop each way: the echo cannot come back before twice the delay
        assert round_trip >= 2 * DELAY
        st = relay.stats
        assert st.connections == 1
        assert st.to_target.bytes == len(sent) and st.from_target.bytes == len(sent)
        assert st.to_target.hold_max >= DELAY and st.from_target.hold_max >= DELAY
        assert min(st.to_target.hold_sum / st.to_target.chunks,
                   st.from_target.hold_mean) >= DELAY

    asyncio.run(asyncio.wait_for(main(), 60))


def test_reading_does_not_wait_for_the_delay() -> None:
    """Delay, not throttling: while the first chunk is still held, the relay has
    already read every later one (and forwarded none)."""
    async def main() -> None:
        received = bytearray()

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(4096):
                received.extend(data)
            writer.close()

        server = await asyncio.start_server(sink, "127.0.0.1", 0)
        relay = DelayRelay(server.sockets[0].getsockname()[:2], 30.0)
        port = await relay.start()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        n = 20
        for i in range(n):
            writer.write(i.to_bytes(4, "big"))
            await writer.drain()
            await asyncio.sleep(0.001)
        while relay.stats.to_target.arrived < 4 * n:
            await asyncio.sleep(0.01)
        assert received == b""  # everything read, nothing forwarded before its time
        writer.close()
        await relay.close()
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 20))


def test_relay_waits_for_a_target_that_is_not_listening_yet() -> None:
    async def main() -> None:
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        target = probe.getsockname()[:2]
        probe.close()
        relay = DelayRelay(target, 0.0)
        port = await relay.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"early")  # sent before the target exists: queued, not lost
        await writer.drain()
        await asyncio.sleep(0.2)

        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.readexactly(5))
            await w.drain()
            w.close()

        server = await asyncio.start_server(echo, *target)
        assert await reader.readexactly(5) == b"early"
        writer.close()
        await relay.close()
        server.close()
        await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        DelayRelay(("10.0.0.1", 80), 0.0)
    with pytest.raises(ValueError, match="loopback"):
        DelayRelay(("127.0.0.1", 80), 0.0, host="0.0.0.0")
    with pytest.raises(ValueError, match="negative"):
        DelayRelay(("127.0.0.1", 80), -1.0)


def test_mesh_gives_each_party_relays_for_its_peers_and_its_own_address() -> None:
    peers = (("127.0.0.1", 1111), ("127.0.0.1", 2222), ("127.0.0.1", 3333))
    with RelayMesh(0.001) as mesh:
        views = [mesh.view(i, peers) for i in range(3)]
        for i, view in enumerate(views):
            assert view[i] == peers[i]
            others = [view[j] for j in range(3) if j != i]
            assert all(a[0] == "127.0.0.1" and a not in peers for a in others)
        assert len(mesh.relays) == 6
        assert mesh.relays[(0, 2)].target == peers[2]
        # the same pair asked again keeps its relay
        assert mesh.view(0, peers) == views[0]
        assert len({r.address for r in mesh.relays.values()}) == 6


# ------------------------------------------------------------------ relay process


def _echo_thread() -> tuple[socket.socket, int]:
    """A blocking echo server in a thread; returns its socket and port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return

            def echo(c: socket.socket = conn) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def _relay_ports(n: int) -> list[int]:
    return [free_port_ranges(1, n)[0] + j for j in range(n)]


def test_relay_process_forwards_intact_in_order_and_delayed(implementation: str) -> None:
    servers = [_echo_thread() for _ in range(2)]
    ports = _relay_ports(2)
    relays = [(p, ("127.0.0.1", s[1])) for p, s in zip(ports, servers, strict=True)]
    with RelayProcess(relays, DELAY, implementation=implementation) as relay:
        assert relay.implementation == implementation
        assert relay.priority  # says what it got (SCHED_FIFO 1, a nice value or none)
        for port in ports:
            with socket.create_connection(("127.0.0.1", port)) as c:
                t0 = time.monotonic()
                c.sendall(b"p")
                assert c.recv(1) == b"p"
                round_trip = time.monotonic() - t0
                assert round_trip >= 2 * DELAY  # one relay hop each way
                pieces = [os.urandom(n) for n in (1, 7, 300, 4096, 70_000, 1_000_000, 5)]
                sent = b"".join(pieces)
                got = bytearray()

                def read(sock: socket.socket = c, want: int = len(sent),
                         into: bytearray = got) -> None:
                    while len(into) < want:
                        into.extend(sock.recv(65536))

                reader = threading.Thread(target=read)
                reader.start()
                for p in pieces:
                    c.sendall(p)
                reader.join(30)
                assert bytes(got) == sent
                c.shutdown(socket.SHUT_WR)
                assert c.recv(1) == b""  # the end of the stream is relayed both ways
        report = relay.stats()
        total = relay.totals()
        after = relay.reset()
        zeroed = relay.stats()
    for srv, _ in servers:
        srv.close()
    assert report["connections"] == 2
    assert total.bytes == 2 * 2 * (1 + len(sent))
    assert total.hold_mean >= DELAY and report["hold_mean_ms"] >= DELAY * 1e3
    for port in ports:  # every chunk of every direction held at least the delay
        st = report["relays"][str(port)]
        for d in ("to_target", "from_target"):
            assert st[d]["chunks"] and st[d]["hold_sum"] / st[d]["chunks"] >= DELAY
            assert st[d]["bytes"] == st[d]["arrived"] == 1 + len(sent)
    assert after["bytes"] == report["bytes"] and after["cpu_seconds"] > 0
    # the loop's own lateness is part of each hold above the delay
    assert 0 <= report["late_mean_ms"] <= report["late_max_ms"] <= report["hold_max_ms"]
    assert zeroed["bytes"] == 0 and zeroed["connections"] == 0


def test_relay_process_waits_for_a_target_that_is_not_listening_yet(implementation: str) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    target = probe.getsockname()[:2]
    probe.close()
    port = _relay_ports(1)[0]
    with RelayProcess([(port, target)], 0.0, priority=False,
                      implementation=implementation) as relay:
        assert relay.priority == "not raised"
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(b"early")  # sent before the target exists: queued, not lost
            time.sleep(0.2)
            srv = socket.socket()
            srv.bind(target)
            srv.listen()
            conn, _ = srv.accept()
            with conn:
                assert conn.recv(5) == b"early"
                conn.sendall(b"late")
                assert c.recv(4) == b"late"
            srv.close()
        report = relay.stats()
    assert report["connections"] == 1
    # what waited for the target is forwarded but kept out of the hold
    st = report["relays"][str(port)]
    assert st["to_target"]["waited"] == 1 and st["to_target"]["chunks"] == 0
    assert st["to_target"]["bytes"] == 5
    assert st["from_target"]["chunks"] == 1 and st["from_target"]["waited"] == 0


def test_relay_process_refuses_a_busy_port_and_other_hosts(implementation: str) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    with pytest.raises(OSError, match="did not start"):
        RelayProcess([(busy.getsockname()[1], ("127.0.0.1", 80))], 0.0, priority=False,
                     implementation=implementation)
    busy.close()
    with pytest.raises(OSError, match="did not start"):
        RelayProcess([(_relay_ports(1)[0], ("10.0.0.1", 80))], 0.0, priority=False,
                     implementation=implementation)
    with pytest.raises(ValueError, match="loopback"):
        EpollRelays([(_relay_ports(1)[0], ("10.0.0.1", 80))], 0.0)
    with pytest.raises(ValueError, match="negative"):
        EpollRelays([], -0.001)
