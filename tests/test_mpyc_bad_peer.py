"""An MPyC party whose peer sends what it cannot take, or nothing at all.

A corrupted party holds a certificate from the deployment's CA, so it gets through the
engine's TLS and can then send anything on its links. These tests put that party
between Alice's real worker and Bob (a relay that terminates both TLS sessions with the
run's own certificates and rewrites Alice's messages to Bob), or play Alice outright
(a fake that dials Bob and Carol, then stays silent or never dials). The honest party
must stop within a bounded time and name the peer, not itself: a failure of its own
would be pinned on it by the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import ssl
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ppfs.contract import FailureKind, failure_kind
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.mpyc_party import RawWire
from ppfs.errors import EngineError, PeerLostError, TimedOutError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import prepare_inputs, run_select
from ppfs.step2a import Security, Step2AShape, mirror
from ppfs.synthetic import make_table

FRAME = struct.Struct("<qI")
PROLOGUE = 2 + 16  # party number, one PRSS key (3 parties, threshold 1)
MARKER = b"RAW-PEER-BYTES-" * 4  # what a bad peer sent: never to be logged

Address = tuple[str, int]
# a payload of Alice's -> what Bob gets instead: a payload, or frames (program counter,
# the size its header claims, the bytes that follow) sent in its place
Frames = list[tuple[int, int, bytes]]
Tamper = Callable[[bytes], bytes | Frames | None]


def _cfg(root: Path, i: int) -> tuple[Path, Path, Path]:
    d = root / "mpyc" / f"P{i}" / ".config"
    return d / f"party_{i}.crt", d / f"party_{i}.key", d / "mpyc_ca.crt"


def _client_ctx(root: Path, me: int) -> ssl.SSLContext:
    crt, key, ca = _cfg(root, me)
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.load_cert_chain(crt, keyfile=key)
    ctx.load_verify_locations(cafile=ca)
    return ctx


def _array_payload(payload: bytes) -> np.ndarray | None:
    """Alice's payload as an array of shares, when it is one (scalars are not RawWire)."""
    if len(payload) < 64 or payload[:1] != b"a":
        return None
    with contextlib.suppress(ValueError):
        arr = RawWire.loads(payload)
        return arr if isinstance(arr, np.ndarray) and arr.size > 1 else None
    return None


def garbage(payload: bytes) -> bytes | None:
    """Alice's first array of shares to Bob replaced by bytes that do not parse."""
    if _array_payload(payload) is None:
        return None
    return b"a\x01\x01" + (10**6).to_bytes(8, "little") + MARKER


def one_short(payload: bytes) -> bytes | None:
    """Alice's first array of shares to Bob, well formed but one value short."""
    arr = _array_payload(payload)
    return None if arr is None else RawWire.dumps(arr.reshape(-1)[:-1])


def oversized(payload: bytes) -> Frames | None:
    """A header announcing a message of 4 GiB in place of Alice's first array: a party
    that believed it would keep up to 4 GiB for it."""
    if _array_payload(payload) is None:
        return None
    return [(1 << 40, (1 << 32) - 1, MARKER)]


def flood(payload: bytes) -> Frames | None:
    """Before Alice's first array, 256 MB of messages for steps far ahead, each of a size
    a message of this job may have: a party would keep them all, unread."""
    if _array_payload(payload) is None:
        return None
    chunk = MARKER * (1 << 14)  # 1 MiB
    return [((1 << 40) + i, len(chunk), chunk) for i in range(256)]


class AliceToBob:
    """Alice dials Bob here; this dials Bob as Alice and hands Alice's messages on,
    the first one ``tamper`` rewrites rewritten (the others as they are)."""

    def __init__(self, root: Path, tamper: Tamper | None) -> None:
        self.root = root
        self.tamper = tamper
        self.bob: Address | None = None
        self.port = 0
        self.tampered = 0
        self.tasks: list[asyncio.Task[None]] = []

    def view(self, i: int, peers: tuple[Address, ...]) -> tuple[Address, ...]:
        self.bob = peers[1]
        return (peers[0], ("127.0.0.1", self.port), peers[2]) if i == 0 else peers

    async def start(self) -> asyncio.Server:
        relay = self

        class Held(asyncio.Protocol):
            """Alice's TCP connection, unread until Bob is reached (then TLS)."""

            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                transport.pause_reading()  # her TLS hello waits in the socket
                relay.tasks.append(asyncio.create_task(relay._accept(transport)))

        loop = asyncio.get_running_loop()
        server = await loop.create_server(Held, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _accept(self, transport: asyncio.Transport) -> None:
        assert self.bob is not None
        deadline = time.monotonic() + 30
        while True:  # Bob first: Alice's handshake succeeds only when Bob is reached
            try:
                up_r, up_w = await asyncio.open_connection(
                    *self.bob, ssl=_client_ctx(self.root, 0), server_hostname="MPyC party 1")
                break
            except OSError:
                if time.monotonic() > deadline:
                    transport.close()
                    return
                await asyncio.sleep(0.1)
        crt, key, _ = _cfg(self.root, 1)
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(crt, keyfile=key)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        proto = asyncio.StreamReaderProtocol(reader)
        tls = await loop.start_tls(transport, proto, server_ctx, server_side=True)
        assert tls is not None
        proto.connection_made(tls)
        writer = asyncio.StreamWriter(tls, proto, reader, loop)
        self.tasks += [asyncio.create_task(self._raw(up_r, writer)),
                       asyncio.create_task(self._frames(reader, up_w))]

    @staticmethod
    async def _raw(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        dst.close()

    async def _frames(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            dst.write(await src.readexactly(PROLOGUE))
            while True:
                head = await src.readexactly(FRAME.size)
                pc, size = FRAME.unpack(head)
                payload = await src.readexactly(size)
                if self.tamper is not None and not self.tampered:
                    bad = self.tamper(payload)
                    if isinstance(bad, list):  # frames in its place
                        self.tampered += 1
                        for f_pc, claimed, body in bad:
                            dst.write(FRAME.pack(f_pc, claimed) + body)
                            await dst.drain()
                        continue
                    if bad is not None:
                        self.tampered += 1
                        head, payload = FRAME.pack(pc, len(bad)), bad
                dst.write(head + payload)
                await dst.drain()
        dst.close()


def _worker_logs(root: Path) -> bytes:
    return b"".join((root / "mpyc" / f"P{i}" / name).read_bytes()
                    for i in range(3) for name in ("worker.out", "worker.err")
                    if (root / "mpyc" / f"P{i}" / name).exists())


def _gone(root: Path) -> bool:
    pids = [int((root / "mpyc" / f"P{i}" / "worker.pid").read_text()) for i in range(3)]
    return not any(os.path.exists(f"/proc/{pid}") for pid in pids)


def _relayed_select(tmp_path: Path, tamper: Tamper | None) -> tuple[object, AliceToBob, float]:
    table = make_table(40, 6, seed=5)

    async def main() -> tuple[object, AliceToBob, float]:
        relay = AliceToBob(tmp_path, tamper)
        server = await relay.start()
        engine = MpycEngine(timeout=120, peer_view=relay.view)
        t0 = time.monotonic()
        try:
            out: object = await run_select(table, 2, Security.PASSIVE_3PC, engine, tmp_path)
        except EngineError as exc:
            out = exc
        elapsed = time.monotonic() - t0
        server.close()
        for t in relay.tasks:
            t.cancel()
        return out, relay, elapsed

    out, relay, elapsed = asyncio.run(main())
    if tamper is None:  # the relay itself changes nothing: the run is right
        fp = FixedPoint()
        raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
        ref = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, 2))
        assert not isinstance(out, EngineError), out
        np.testing.assert_array_equal(out.indices, ref.selected)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(out.reduced_raw, ref.reduced)  # type: ignore[attr-defined]
    return out, relay, elapsed


def test_relay_that_changes_nothing_gives_the_right_result(tmp_path: Path) -> None:
    _, relay, _ = _relayed_select(tmp_path, None)
    assert relay.tasks  # Alice's link to Bob did go through it


@pytest.mark.parametrize("tamper", [garbage, one_short], ids=lambda t: t.__name__)
def test_message_bob_cannot_take_names_alice_not_bob(tmp_path: Path, tamper: Tamper) -> None:
    err, relay, elapsed = _relayed_select(tmp_path, tamper)
    assert relay.tampered == 1
    assert isinstance(err, PeerLostError), err
    # a symptom at Bob's: the gateway looks for the cause, and Bob names Alice
    assert failure_kind(err).symptom
    assert err.party == "Alice"
    assert str(err).startswith("MPyC party Bob failed: Alice sent ")
    bob = json.loads((tmp_path / "mpyc" / "P1" / "result.json").read_text())
    assert bob["exit_code"] == 7 and bob["peer"] == 0
    assert elapsed < 30
    assert _gone(tmp_path)
    logs = _worker_logs(tmp_path)
    assert MARKER[:15] not in logs
    assert b"Traceback" not in logs


@pytest.mark.parametrize(("tamper", "what"), [
    (oversized, "Alice sent a message larger than this job's"),
    (flood, "Alice sent more ahead of time than this job's messages"),
], ids=["oversized", "flood"])
def test_more_than_a_jobs_messages_is_refused_naming_the_sender(
        tmp_path: Path, tamper: Tamper, what: str) -> None:
    # MPyC would keep a message of up to 4 GiB, and any number of them for steps not
    # reached yet; Bob keeps no more than the job's messages could be, and names Alice
    err, relay, elapsed = _relayed_select(tmp_path, tamper)
    assert relay.tampered == 1
    assert isinstance(err, PeerLostError), err
    assert failure_kind(err).symptom and err.party == "Alice"
    assert str(err) == f"MPyC party Bob failed: {what}"
    bob = json.loads((tmp_path / "mpyc" / "P1" / "result.json").read_text())
    assert bob["exit_code"] == 7 and bob["peer"] == 0
    assert bob["max_rss_kb"] < 200 * 1024  # the flood's 256 MB were not kept
    assert elapsed < 60
    assert _gone(tmp_path)
    assert MARKER[:15] not in _worker_logs(tmp_path)


# ------------------------------------------------------------- a silent Alice


async def _fake_alice(peers: tuple[Address, ...], root: Path, stop: asyncio.Event) -> int:
    """Dial Bob and Carol as Alice, send her number and PRSS keys, then nothing."""
    links = []
    for j in (1, 2):
        deadline = time.monotonic() + 30
        while True:
            try:
                _, w = await asyncio.open_connection(
                    *peers[j], ssl=_client_ctx(root, 0), server_hostname=f"MPyC party {j}")
                break
            except OSError:
                assert time.monotonic() < deadline, "Bob or Carol never listened"
                await asyncio.sleep(0.1)
        w.write((0).to_bytes(2, "little") + os.urandom(16))
        await w.drain()
        links.append(w)
    await stop.wait()
    for w in links:
        w.close()
    return len(links)


def _bob_and_carol(tmp_path: Path, alice_dials: bool, timeout: float
                   ) -> tuple[list[BaseException | object], float]:
    prep = prepare_inputs(make_table(30, 5, seed=6), 2, Security.PASSIVE_3PC,
                          tmp_path / "given")
    engine = MpycEngine(timeout=timeout, start_timeout=timeout)
    dirs = [tmp_path / "mpyc" / f"P{i}" for i in range(3)]
    specs = engine._embedded_specs(prep.inputs, dirs)
    specs = [dataclasses.replace(s, timeout=timeout) for s in specs]

    async def main() -> tuple[list[BaseException | object], float]:
        stop = asyncio.Event()
        alice = asyncio.create_task(_fake_alice(specs[0].peers, tmp_path, stop)) \
            if alice_dials else None
        t0 = time.monotonic()
        got = await asyncio.gather(*(engine.run_party(s) for s in specs[1:]),
                                   return_exceptions=True)
        elapsed = time.monotonic() - t0
        stop.set()
        if alice is not None:
            assert await alice == 2  # she did reach both
        return list(got), elapsed

    return asyncio.run(main())


def _names_alice_or_lost_the_other(got: list[BaseException | object], what: str) -> None:
    """Bob and Carol each time out naming Alice (``what``), or, the other one having
    stopped first, report losing it (a symptom); at least one names Alice. Where the
    other honest party had not connected yet either (a slow start), it is named after
    Alice."""
    named = 0
    for name, other, err in (("Bob", "Carol", got[0]), ("Carol", "Bob", got[1])):
        if isinstance(err, TimedOutError):
            assert failure_kind(err) is FailureKind.TIMEOUT
            assert str(err) in (f"MPyC party {name} failed: {what}",
                                f"MPyC party {name} failed: {what}, {other}")
            named += 1
        else:
            assert isinstance(err, PeerLostError), err
            assert str(err) == f"MPyC party {name} failed: lost its connection to {other}"
    assert named >= 1


def test_silent_peer_is_named_when_time_runs_out(tmp_path: Path) -> None:
    got, elapsed = _bob_and_carol(tmp_path, alice_dials=True, timeout=6.0)
    _names_alice_or_lost_the_other(got, "timed out waiting for a message from Alice")
    assert elapsed < 6.0 + 12.0  # the limit, the workers' start and stop


def test_peer_that_never_dials_is_named(tmp_path: Path) -> None:
    got, elapsed = _bob_and_carol(tmp_path, alice_dials=False, timeout=4.0)
    _names_alice_or_lost_the_other(got, "timed out: no MPC connection with Alice")
    assert elapsed < 4.0 + 12.0
