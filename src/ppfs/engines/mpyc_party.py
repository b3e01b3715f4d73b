"""One MPyC party of Step 2A, run as its own process.

    python -m ppfs.engines.mpyc_party --job JOB.json --party I

The job file (JSON, written by :class:`ppfs.engines.mpyc_engine.MpycEngine`) holds
public parameters only: the shape, the security setting, every party's address, and
this party's input directory, TLS directory, status, result and output paths. The
party reads its own :class:`~ppfs.sharing.ShareBundle` files and nothing else.

What the party does, in order:

1. Converts the replicated additive 64-bit shares into MPyC secure integers
   exactly (:func:`conversion_roles`, :func:`additive_summands`,
   :func:`additive64_to_secint`): two parties whose components cover every
   component disjointly input the sums of their components plus the top two bits
   of each sum; a degree-5 polynomial in those bits gives the wrap-around
   ``q in {0, 1}`` of the sum, so no comparison is needed.
2. Runs the algorithm of :mod:`ppfs.step2a` exactly (:func:`select_top_k`).
3. Opens only ``value + mask`` with ``mask = w0 + 2^60 * w1`` (the recipient's
   shared mask words) to every party; each writes the opened words mod 2^64 as raw
   little-endian uint64 to its output path.

Nothing travels between the parties through pickle: MPyC's marshalling is replaced
by :class:`RawWire` (fixed-width raw buffers). Share values and opened words are
never logged; errors name their type and a fixed reason only.

Before any of this, right after connecting, every party inputs the job's session
tag (``session_tag`` in the job file, ppfs.contract.session_tag: 252 bits, input as
words of 63 bits, ppfs.engines.base.session_words) as a private input; the
differences of party 0's words and each other party's are opened (public values)
and the party stops with exit code 5 unless all are zero: peers running another job
never get to compute with this party's data. The share files are read only after
this check.

A peer that goes away, sends a message that does not parse or fit, or goes silent
is named in the party's result (``reason``, and ``peer`` for a message): the peer
whose link is gone, whose message it is, or whose message the party has waited for
longest when its time runs out.

Exit codes: 0 done, 1 internal error, 2 bad job or inputs, 3 a peer was lost,
4 timed out, 5 the peers run another job (session tags differ), 6 a Step 2B range
check failed, 7 a peer sent a message that does not parse or fit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import math
import os
import resource
import struct
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ppfs import scoring, step2b
from ppfs.durable import write_durable
from ppfs.engines.base import PARTY_NAMES, session_words
from ppfs.errors import ParameterError, PpfsError, ShareFormatError
from ppfs.scoring import Scorer
from ppfs.sharing import Scheme, ShareBundle
from ppfs.step2a import (
    MASK_WORD_BITS,
    RING_BITS,
    Security,
    Step2AShape,
    bitlen,
    pearson_classes,
)

log = logging.getLogger("ppfs.mpyc_party")

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_JOB = 2
EXIT_PEER_LOST = 3
EXIT_TIMEOUT = 4
EXIT_SESSION = 5
EXIT_OUT_OF_RANGE = 6  # a Step 2B range check failed: one public bit, nothing else
EXIT_PEER_FAULT = 7  # a peer sent a message this party cannot take (named in result.json)

JOB_VERSION = 1
# MPyC's statistical security parameter k (its -K option; MPyC's default is 30): the
# random masks of every comparison and truncation exceed the masked value by k bits,
# so an opened masked value tells its value apart with probability about 2^-k.
STATISTICAL_SECURITY = 40
# Bit length of the secure integer type. MPyC picks a prime of l + k + 2 = 138 bits.
# That covers every need at once (:func:`required_prime_bits`): the share conversion
# needs p > 2^66; a comparison or truncation of bit length L adds an (L + k)-bit mask,
# so it needs p > 2^(L+k+2), the longest L being 63 (ranking, Step 2B's truncations):
# 105 bits; the opened value + mask, below 2^121 + 2^62, must not wrap (it is read
# signed, so p > 2^123).
SECINT_BITS = 96
# Elements per comparison batch: each batch is awaited before the next is scheduled,
# so memory stays bounded (MPyC builds the whole lazy graph otherwise).
DEFAULT_CHUNK = 50_000
WATCHDOG_PERIOD = 0.2
_TWO63 = 1 << 63
_MASK64 = (1 << 64) - 1


class PeerLostError(ConnectionError):
    """A peer's connection closed mid-run (it crashed or was killed)."""


class PeerFaultError(PpfsError):
    """A peer sent a message this party cannot take; ``peer`` is its party number."""

    def __init__(self, peer: int, what: str) -> None:
        super().__init__(f"{party_name(peer)} {what}")
        self.peer = peer


class MalformedMessage(ValueError):
    """A message from party ``peer`` (None: not known) does not parse or does not fit.

    Raised where MPyC unmarshals or recombines what peers sent; the message names
    the peer and a fixed reason, never the bytes."""

    def __init__(self, peer: int | None, what: str = "sent a malformed message") -> None:
        super().__init__(what)
        self.peer = peer
        self.what = what


def party_name(pid: int) -> str:
    return PARTY_NAMES[pid] if 0 <= pid < len(PARTY_NAMES) else f"party {pid}"


class PeerPayload(bytes):
    """A message's payload as received, tagged with the party that sent it."""

    peer: int | None = None


# what went wrong with peers' messages in this process: (peer, reason), first one first
FAULTS: list[tuple[int, str]] = []
LINKED: set[int] = set()  # the peers whose link came up (a link gone later is lost)


def record_fault(peer: int | None, what: str) -> None:
    if peer is not None and not FAULTS:
        FAULTS.append((peer, what))


class JobError(PpfsError):
    """The job file or the party's inputs are unusable."""


class SessionError(PpfsError):
    """Another party input a different session tag: it runs another job."""


class OutOfRangeError(PpfsError):
    """A Step 2B range check opened 1; ``kind`` names the check ("ratio", "weights")."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


# --------------------------------------------------------------------------- job


@dataclass(frozen=True)
class PartyJob:
    party: int
    security: Security
    shape: Step2AShape
    addresses: tuple[tuple[str, int], ...]
    input_dir: Path
    status_path: Path
    result_path: Path
    output_path: Path | None  # party 0 only
    bind_host: str | None
    start_timeout: float
    timeout: float
    chunk: int
    ssl: bool
    session_tag: int = 0

    @classmethod
    def load(cls, path: Path, party: int) -> PartyJob:
        try:
            raw = json.loads(path.read_text())
            if raw.get("version") != JOB_VERSION:
                raise JobError("unsupported job file version")
            security = Security(raw["security"])
            shape = Step2AShape.from_dict(raw["shape"])
            addresses = tuple((str(h), int(p)) for h, p in raw["addresses"])
            out = raw.get("output_path")
            job = cls(
                party=party,
                security=security,
                shape=shape,
                addresses=addresses,
                input_dir=Path(raw["input_dir"]),
                status_path=Path(raw["status_path"]),
                result_path=Path(raw["result_path"]),
                output_path=Path(out) if out else None,
                bind_host=raw.get("bind_host") or None,
                start_timeout=float(raw.get("start_timeout", 60.0)),
                timeout=float(raw.get("timeout", 3600.0)),
                chunk=int(raw.get("chunk", DEFAULT_CHUNK)),
                ssl=bool(raw.get("ssl", True)),
                session_tag=int(raw.get("session_tag", 0)),
            )
        except JobError:
            raise
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise JobError(f"job file is unusable ({type(exc).__name__})") from None
        if security.active:
            raise JobError(f"MPyC runs passive security only, not {security.value}")
        if int(raw.get("party", party)) != party:
            raise JobError("job file belongs to another party")
        if len(addresses) != security.parties or not 0 <= party < security.parties:
            raise JobError("party index or address list does not match the security setting")
        if party == 0 and job.output_path is None:
            raise JobError("party 0 needs an output path")
        if job.chunk < 1:
            raise JobError("chunk must be positive")
        try:
            session_words(job.session_tag)
        except ParameterError as exc:
            raise JobError(str(exc)) from None
        return job


class StatusFile:
    """Appends fixed phase names (never data) to the party's status file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.t0 = time.monotonic()
        self.times: dict[str, float] = {}

    def phase(self, name: str) -> None:
        elapsed = time.monotonic() - self.t0
        self.times[name] = round(elapsed, 3)
        log.info("[MpycParty.phase] %s t=%.2fs", name, elapsed)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")


# ------------------------------------------------------------ share conversion


@dataclass(frozen=True)
class ConversionRoles:
    """Two parties whose held components cover all components disjointly."""

    a_party: int
    a_components: tuple[int, ...]
    b_party: int
    b_components: tuple[int, ...]


def conversion_roles(scheme: Scheme) -> ConversionRoles:
    """Party 0 inputs the sum of all its components, party 1 the sum of the rest.

    Rep3: A=0 sums {c0, c2}, B=1 uses {c1}; Rep4: A=0 sums {c1, c2, c3}, B=1 uses {c0}.
    """
    a_comps = scheme.components_of(0)
    b_comps = tuple(j for j in range(scheme.parties) if j not in a_comps)
    if not b_comps or not set(b_comps) <= set(scheme.components_of(1)):
        raise ValueError(f"no disjoint cover of the components for {scheme.value}")
    return ConversionRoles(0, a_comps, 1, b_comps)


def additive_summands(
    components: Mapping[int, np.ndarray], roles: ConversionRoles, party: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """This party's input to the conversion: (summand mod 2^64, its top two bits).

    Party A's summand carries the offset 2^63, so that for |x| < 2^62 the true sum
    x + 2^63 lies in (2^62, 3*2^62) and wraps at most once. Other parties: None.
    """
    if party == roles.a_party:
        comps, offset = roles.a_components, np.uint64(_TWO63)
    elif party == roles.b_party:
        comps, offset = roles.b_components, np.uint64(0)
    else:
        return None
    total = np.zeros_like(np.asarray(components[comps[0]], dtype=np.uint64)) + offset
    for j in comps:
        total += np.asarray(components[j], dtype=np.uint64)  # wraps mod 2^64
    return total, total >> np.uint64(62)


def wrap_from_top_bits(w: Any) -> Any:
    """120 * q from w = (top bits of u) + (top bits of v) - 3, exactly.

    w is in {-3, -2, -1} when the sum did not wrap (q = 0) and in {1, 2, 3} when it
    did (q = 1); the polynomial w * (w^4 - 15 w^2 + 74) + 60 is 0 on the former and
    120 on the latter. Works on ints, numpy object arrays and MPyC secure arrays.
    """
    w2 = w * w
    return w * (w2 * w2 - 15 * w2 + 74) + 60


def reconstruct_plain(u: np.ndarray, uh: np.ndarray, v: np.ndarray, vh: np.ndarray) -> np.ndarray:
    """The conversion in the clear (for tests): returns exact Python ints."""
    s = u.astype(object) + v.astype(object)
    q120 = wrap_from_top_bits(uh.astype(object) + vh.astype(object) - 3)
    if np.any((q120 != 0) & (q120 != 120)):
        raise ValueError("a value is out of the convertible range |x| < 2^62")
    return s - (q120 // 120) * (1 << RING_BITS) - _TWO63


def additive64_to_secint(
    rt: Any, secint: Any, mine: tuple[np.ndarray, np.ndarray] | None,
    shape: tuple[int, ...], roles: ConversionRoles,
) -> Any:
    """Secure integers equal to the 64-bit additively shared values (|x| < 2^62)."""
    placeholder = secint.array(None, shape)
    u = uh = v = vh = placeholder
    if rt.pid in (roles.a_party, roles.b_party):
        if mine is None:
            raise JobError("conversion party without summands")
        summand = secint.array(mine[0].astype(object))
        top = secint.array(mine[1].astype(object))
        if rt.pid == roles.a_party:
            u, uh = summand, top
        else:
            v, vh = summand, top
    s = rt.input(u, senders=roles.a_party) + rt.input(v, senders=roles.b_party)
    w = rt.input(uh, senders=roles.a_party) + rt.input(vh, senders=roles.b_party) - 3
    q120 = wrap_from_top_bits(w)
    return s - q120 * (secint.field(1 << RING_BITS) / 120) - _TWO63


# ----------------------------------------------------------------- wire format


class RawWire:
    """Stands in for the ``pickle`` module inside ``mpyc.runtime``.

    MPyC marshals numpy share arrays with pickle; a peer could then make a party
    execute code. This replacement writes fixed-width raw buffers instead: a tag,
    the shape and the values as little-endian 64-bit words, never anything that
    names code. It handles exactly what MPyC sends: non-negative integer arrays
    (field elements) and plain integers (the shutdown barrier).
    """

    _INT = b"i"
    _ARR = b"a"
    _HDR = struct.Struct("<BB")  # words per value, ndim
    # 64-bit words per value sent, set per job to those of its prime field
    # (set_message_limits): every array of field elements goes out at this width
    # whatever its values, so that a message's length depends on its shape alone
    words = 1

    @classmethod
    def dumps(cls, obj: Any) -> bytes:
        if isinstance(obj, (int, np.integer)) and not isinstance(obj, bool):
            return cls._INT + int(obj).to_bytes(16, "little", signed=True)
        if isinstance(obj, np.ndarray):
            flat = obj.reshape(-1)
            if flat.size and int(flat.min()) < 0:
                raise ValueError("RawWire sends non-negative field elements only")
            top = int(flat.max()) if flat.size else 0
            words = max(cls.words, (top.bit_length() + 63) // 64)
            parts = [
                cls._ARR,
                cls._HDR.pack(words, obj.ndim),
                struct.pack(f"<{obj.ndim}Q", *obj.shape),
            ]
            parts.extend(
                ((flat >> (64 * j)) & _MASK64).astype("<u8").tobytes() for j in range(words)
            )
            return b"".join(parts)
        raise TypeError(f"RawWire cannot send {type(obj).__name__}")

    @classmethod
    def loads(cls, data: bytes | bytearray | memoryview) -> Any:
        peer = getattr(data, "peer", None)
        try:
            return cls._loads(data)
        except MalformedMessage as exc:
            exc.peer = peer
            record_fault(peer, exc.what)
            raise

    @classmethod
    def _loads(cls, data: bytes | bytearray | memoryview) -> Any:
        buf = bytes(data)
        if buf[:1] == cls._INT and len(buf) == 17:
            return int.from_bytes(buf[1:], "little", signed=True)
        if buf[:1] != cls._ARR or len(buf) < 1 + cls._HDR.size:
            raise MalformedMessage(None)
        words, ndim = cls._HDR.unpack_from(buf, 1)
        off = 1 + cls._HDR.size
        if words < 1 or len(buf) < off + 8 * ndim:
            raise MalformedMessage(None)
        shape = struct.unpack_from(f"<{ndim}Q", buf, off)
        off += 8 * ndim
        n = math.prod(shape)  # exact: a product that wraps cannot match the length
        if len(buf) != off + 8 * n * words:
            raise MalformedMessage(None)
        out = np.zeros(n, dtype=object)
        for j in range(words):
            w = np.frombuffer(buf, dtype="<u8", count=n, offset=off + 8 * n * j).astype(object)
            out += w << (64 * j)
        try:
            return out.reshape(shape)
        except (ValueError, OverflowError):  # an empty array of absurd dimensions
            raise MalformedMessage(None) from None


def checked_recombine(
    recombine: Callable[..., Any], own_pid: Callable[[], int | None]
) -> Callable[..., Any]:
    """MPyC's ``thresha.np_recombine``, first checking that every share it is given has
    as many values as this party's own (or, without one, as most of them): a peer's
    share of another length is its malformed message, named, not this party's error."""

    @functools.wraps(recombine)
    def checked(field: Any, points: Any, x_rs: Any = 0) -> Any:
        sizes = [(int(x) - 1, np.size(share)) for x, share in points]
        own = own_pid()
        mine = [n for pid, n in sizes if pid == own]
        counts = [n for _, n in sizes]
        expected = mine[0] if mine else max(set(counts), key=counts.count)
        for pid, n in sizes:
            if n != expected:
                record_fault(pid, "sent a share of the wrong length")
                raise MalformedMessage(pid, "sent a share of the wrong length")
        return recombine(field, points, x_rs)

    checked.checks_sizes = True  # type: ignore[attr-defined]
    return checked


# ------------------------------------------------------------------- runtime


def import_mpyc_runtime() -> Any:
    """Import MPyC with this process's own argv hidden from its import-time parser;
    rebind its wire format (:class:`RawWire`), its connection handler
    (:func:`peer_checked_exchanger`) and its recombination of peers' shares
    (:func:`checked_recombine`)."""
    os.environ.setdefault("MPYC_NOUVLOOP", "1")  # plain asyncio loop: see bind_loopback
    saved = sys.argv
    sys.argv = saved[:1]
    try:
        import mpyc.asyncoro
        import mpyc.runtime
        import mpyc.thresha
    finally:
        sys.argv = saved
    mpyc.runtime.pickle = RawWire
    # the runtime looks the class up when each connection is made
    exchanger = mpyc.asyncoro.MessageExchanger
    if not getattr(exchanger, "checks_peers", False):
        mpyc.asyncoro.MessageExchanger = peer_checked_exchanger(exchanger)
    if not getattr(mpyc.thresha.np_recombine, "checks_sizes", False):
        mpyc.thresha.np_recombine = checked_recombine(
            mpyc.thresha.np_recombine, lambda: getattr(mpyc.asyncoro.runtime, "pid", None))
    return mpyc.runtime


def peer_certificate_names(cert: Mapping[str, Any] | None) -> list[str]:
    """The common names in a peer certificate as ``ssl`` decodes it (``peercert``)."""
    if not cert:
        return []
    return [str(value) for rdn in cert.get("subject", ()) for key, value in rdn
            if key == "commonName"]


def refuse_peer(rt: Any, claimed: int, cert: Mapping[str, Any] | None) -> str | None:
    """Why a connection to this party's listening port must be refused, or None.

    MPyC's listening side takes the dialler's party number from the first two bytes
    it sends and records the connection as that party's, replacing any before it;
    only the dialling side checks the certificate's name. Left so, a corrupted party
    (any holder of a certificate from the deployment's CA) could dial in as another
    party, displace the real link and receive the shares meant for that party. Here
    the claim must be a party that dials this one (a lower number: the higher ones
    are dialled by this party), not yet connected, and, with TLS, named by the
    certificate the dialler presented (``MPyC party <i>``)."""
    if not 0 <= claimed < rt.pid:
        return f"a peer claims party number {claimed}, which does not dial party {rt.pid}"
    if rt.parties[claimed].protocol is not None:
        return f"a second connection claims party {claimed}"
    if rt.options.ssl:
        names = peer_certificate_names(cert)
        if names != [f"MPyC party {claimed}"]:
            shown = ", ".join(repr(n) for n in names) or "no name"
            return f"a peer claims party {claimed} with a certificate for {shown}"
    return None


_FRAME = struct.Struct("<qI")  # MPyC's message header: program counter, payload size

# The most one peer may send this party: in one message, and unread at once (messages
# for steps this party has not reached yet), in bytes. MPyC itself takes any message
# up to 4 GiB and buffers unread ones without end. Set per job (set_message_limits) from
# its public shape: the largest message an honest party sends holds some 34 m*p field
# elements (the mean split's comparisons), and the limits leave several times that.
MESSAGE_LIMITS = [1 << 32, 1 << 34]


def set_message_limits(shape: Step2AShape, modulus_bits: int) -> None:
    """The limits for a job of ``shape`` over a prime of ``modulus_bits`` bits."""
    words = (modulus_bits + 63) // 64  # RawWire's 64-bit words per field element
    RawWire.words = words
    elements = 128 * (shape.m * (shape.p + shape.n_classes) + 4096)
    most = 8 * words * elements + 1024
    MESSAGE_LIMITS[:] = [most, 4 * most]


def peer_checked_exchanger(base: type) -> type:
    """MPyC's connection handler (``mpyc.asyncoro.MessageExchanger``) with

    - the listening side's check of :func:`refuse_peer` before the peer's claim, its
      PRSS keys or any message is taken; a refused connection is dropped and never
      registered (the honest peer can still connect);
    - every payload tagged with the party that sent it (:class:`PeerPayload`), so that
      a message that does not parse names its sender;
    - a second message for a step whose message from that peer is still unread
      taken as that peer's fault, where MPyC's own handler fails with an error of
      its own;
    - the time since this party waits for each message it has asked a peer for
      (:func:`longest_wait`), to name the peer a stalled run waits for;
    - a message larger than any of this job's, or more of them kept unread at once
      than the job's messages could be (:data:`MESSAGE_LIMITS`), taken as that peer's
      fault before its bytes are kept, where MPyC would buffer up to 4 GiB a message
      and any number of them.

    MPyC 0.11's handler is reimplemented here (the version is pinned)."""

    class PeerCheckedExchanger(base):
        checks_peers = True
        refused = False
        peer_pid: int | None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.waits: dict[int, float] = {}  # pc -> since when this party waits for it
            self.unread = 0  # bytes of this peer's messages kept for steps not reached

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return
            buf = self.bytes
            buf.extend(data)
            rt = self.runtime
            if self.peer_pid is None:  # the dialler's prologue: its number, PRSS keys
                if len(buf) < 2:
                    return
                claimed = int.from_bytes(buf[:2], "little")
                reason = refuse_peer(rt, claimed, self.transport.get_extra_info("peercert"))
                if reason is not None:
                    self._drop(f"refused a connection: {reason}")
                    return
                keys = 0 if rt.options.no_prss else rt._prss_keys_from_peer(claimed)
                if len(buf) < 2 + keys:
                    return
                self.peer_pid = claimed
                del buf[:2]
                if keys:
                    rt._prss_keys_from_peer(claimed, buf)
                    del buf[:keys]
                rt.set_protocol(claimed, self)
                LINKED.add(claimed)
            while len(buf) >= _FRAME.size:
                pc, size = _FRAME.unpack_from(buf)
                if size > MESSAGE_LIMITS[0]:  # refused before its bytes are kept
                    record_fault(self.peer_pid, "sent a message larger than this job's")
                    self._drop("a peer sent a message larger than this job's")
                    return
                end = _FRAME.size + size
                if len(buf) < end:
                    break
                with memoryview(buf) as view:
                    payload = PeerPayload(view[_FRAME.size:end])
                payload.peer = self.peer_pid
                del buf[:end]
                waiting = self.buffers.pop(pc, None)
                if waiting is None:
                    self.unread += len(payload)
                    if self.unread > MESSAGE_LIMITS[1]:
                        record_fault(self.peer_pid, "sent more ahead of time than this job's "
                                                    "messages")
                        self._drop("a peer sent more ahead of time than this job's messages")
                        return
                    self.buffers[pc] = payload
                elif isinstance(waiting, asyncio.Future) and not waiting.done():
                    self.waits.pop(pc, None)
                    waiting.set_result(payload)
                else:  # an unread message for this step is there already
                    record_fault(self.peer_pid, "sent two messages for one step")
                    self._drop("a peer sent two messages for one step")
                    return

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if self.peer_pid is not None:  # this party dialled: the link is up
                LINKED.add(self.peer_pid)

        def receive(self, pc: int) -> Any:
            payload = super().receive(pc)
            if isinstance(payload, asyncio.Future):
                if not payload.done():
                    self.waits.setdefault(pc, time.monotonic())
            else:  # one it kept: read now
                self.unread -= len(payload)
            return payload

        def _drop(self, reason: str) -> None:
            self.refused = True
            log.warning("[MpycParty.connect] %s", reason)
            self.bytes.clear()
            self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer_pid is None:  # never registered as any party's link
                return
            super().connection_lost(exc)

    PeerCheckedExchanger.__name__ = PeerCheckedExchanger.__qualname__ = "PeerCheckedExchanger"
    return PeerCheckedExchanger


def make_runtime(mpyc_runtime: Any, job: PartyJob) -> Any:
    """A fresh Runtime for this party; MPyC's module globals are rebound to it."""
    argv = [sys.argv[0]]
    for host, port in job.addresses:
        argv += ["-P", f"{host}:{port}"]
    argv += ["-I", str(job.party), "--no-log", "-K", str(STATISTICAL_SECURITY)]
    if job.ssl:
        argv.append("--ssl")
    saved = sys.argv
    sys.argv = argv
    try:
        rt = mpyc_runtime.setup()
    finally:
        sys.argv = saved
    if job.bind_host:
        bind_loopback(rt, job.bind_host)
    return rt


def required_prime_bits(sec_param: int) -> int:
    """Bits the field's prime needs for this program at statistical security ``sec_param``."""
    longest = max(RING_BITS - 1, step2b.TRUNC_BITS, step2b.SIGMOID_BITS)
    return max(RING_BITS + 3, longest + sec_param + 2, 2 * MASK_WORD_BITS + 4)


def make_secint(rt: Any) -> Any:
    """The secure integer type, after checking the runtime's statistical security and
    that its prime is large enough for every comparison at that security."""
    k = int(rt.options.sec_param)
    if k < STATISTICAL_SECURITY:
        raise JobError(f"MPyC runs with {k}-bit statistical security, "
                       f"below {STATISTICAL_SECURITY}")
    secint = rt.SecInt(SECINT_BITS)
    bits = int(secint.field.modulus).bit_length()
    if bits < required_prime_bits(k):
        raise JobError(f"MPyC's prime has {bits} bits; {required_prime_bits(k)} are needed")
    return secint


def bind_loopback(rt: Any, host: str) -> None:
    """Make the party listen on ``host`` only (MPyC binds every interface)."""
    loop = rt._loop
    create_server = loop.create_server

    @functools.wraps(create_server)
    def bound(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("host", host)
        return create_server(*args, **kwargs)

    try:
        loop.create_server = bound
    except AttributeError:  # an event loop that refuses instance attributes
        log.warning("[MpycParty.bind] cannot restrict the listening address")


def lost_peers(rt: Any) -> list[int]:
    """The peers whose link came up and is gone."""
    lost = []
    for p in rt.parties:
        if p.pid == rt.pid or p.pid not in LINKED:
            continue
        proto = p.protocol
        if proto is None or proto.transport is None or proto.transport.is_closing():
            lost.append(p.pid)
    return lost


def peer_trouble(rt: Any) -> Exception | None:
    """Why the run cannot go on because of a peer (its message did not parse or fit,
    or its link is gone), naming the peer; None while all is well."""
    if FAULTS:
        peer, what = FAULTS[0]
        return PeerFaultError(peer, what)
    lost = lost_peers(rt)
    if lost:
        return PeerLostError("lost its connection to " + ", ".join(party_name(i) for i in lost))
    return None


def longest_wait(rt: Any) -> int | None:
    """The peer whose message this party has waited for longest (None: none awaited)."""
    since: list[tuple[float, int]] = []
    for p in rt.parties:
        waits = getattr(p.protocol, "waits", None) if p.pid != rt.pid else None
        if waits:
            since.append((min(waits.values()), p.pid))
    return min(since)[1] if since else None


def stalled(rt: Any, connecting: bool) -> TimeoutError:
    """The time-out, naming the peers a party still waits for (never a value)."""
    if connecting:
        missing = [p.pid for p in rt.parties if p.pid != rt.pid and p.protocol is None]
        if missing:
            names = ", ".join(party_name(i) for i in missing)
            return TimeoutError(f"timed out: no MPC connection with {names}")
        return TimeoutError("timed out while connecting")
    peer = longest_wait(rt)
    if peer is not None:
        return TimeoutError(f"timed out waiting for a message from {party_name(peer)}")
    return TimeoutError("timed out")


async def guarded(
    coro: Awaitable[Any], deadline: float, check_peers: Callable[[], Exception | None] | None,
    parent: int, on_timeout: Callable[[], Exception] | None = None,
) -> Any:
    """Await ``coro`` but give up when a peer is lost or misbehaves (``check_peers``
    says why), the deadline passes (``on_timeout`` says what was awaited) or the
    engine (our parent process) is gone."""
    task = asyncio.ensure_future(coro)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCHDOG_PERIOD)
            if done:
                return task.result()
            trouble = check_peers() if check_peers is not None else None
            if trouble is not None:
                raise trouble
            if time.monotonic() > deadline:
                raise on_timeout() if on_timeout is not None else TimeoutError("timed out")
            if os.getppid() != parent:
                raise PeerLostError("the engine process is gone")
    finally:
        if not task.done():
            task.cancel()


def bytes_sent(rt: Any) -> int:
    total = 0
    for p in rt.parties:
        if p.pid != rt.pid and p.protocol is not None:
            total += int(getattr(p.protocol, "nbytes_sent", 0))
    return total


# ----------------------------------------------------------------- Step 2A


@dataclass
class PartyInputs:
    data: tuple[np.ndarray, np.ndarray] | None
    labels: tuple[np.ndarray, np.ndarray] | None
    mask: tuple[np.ndarray, np.ndarray] | None


def load_inputs(job: PartyJob, roles: ConversionRoles) -> PartyInputs:
    shape = job.shape
    scheme = job.security.scheme
    expected = {
        "data": (shape.m, shape.p),
        "labels": (shape.m, shape.n_classes - 1),
        "mask": (shape.outputs, 2),
    }
    out: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}
    dataset: str | None = None
    for kind, dims in expected.items():
        try:
            bundle = ShareBundle.load(job.input_dir / f"{kind}.shr")
        except OSError:
            raise JobError(f"cannot read this party's {kind} share") from None
        except ShareFormatError as exc:
            raise JobError(f"{kind} share: {exc}") from None
        if bundle.kind != kind or bundle.shape != dims:
            raise JobError(f"{kind} share has the wrong kind or shape")
        if bundle.scheme is not scheme or bundle.party != job.party:
            raise JobError(f"{kind} share belongs to another scheme or party")
        if dataset is None:
            dataset = bundle.dataset_id
        elif bundle.dataset_id != dataset:
            raise JobError("the share files belong to different datasets")
        out[kind] = additive_summands(bundle.components, roles, job.party)
    return PartyInputs(out["data"], out["labels"], out["mask"])


async def select_top_k(
    rt: Any, secint: Any, job: PartyJob, inputs: PartyInputs, roles: ConversionRoles,
    status: StatusFile,
) -> np.ndarray | None:
    """Step 2A on secret shares; returns the opened words (party 0) or None."""
    sh = job.shape
    m, p, n, k = sh.m, sh.p, sh.n_classes, sh.k

    status.phase("converting shares")
    x = additive64_to_secint(rt, secint, inputs.data, (m, p), roles)
    lab = additive64_to_secint(rt, secint, inputs.labels, (m, n - 1), roles)
    words = additive64_to_secint(rt, secint, inputs.mask, (sh.outputs, 2), roles)
    x = secint.array(await rt.gather(x))

    # 1. gt = [m*x - S > m] = [x > theta'] with theta' = floor((S + m) / m), the
    # division by the public m done by restoring long division over the p columns.
    theta = None  # Pearson needs no split; Step 2B needs the centres
    if sh.scorer is not Scorer.PEARSON or sh.train is not None:
        status.phase("mean-split thresholds")
        offset = sh.threshold_offset
        rem = x.sum(axis=0) + m + m * offset  # positive
        quo = secint.array(np.zeros(p, dtype=object))
        for t in reversed(range(sh.threshold_steps)):
            ge = 1 - rt.np_sgn(rem - (m << t), l=sh.threshold_bits, LT=True)
            rem = rem - ge * (m << t)
            quo = quo + ge * (1 << t)
        theta = secint.array(await rt.gather(quo - offset))

    if sh.scorer is Scorer.PEARSON:
        status.phase("pearson sums and scores")
        q = await _pearson_q(rt, secint, sh, x, lab)
    else:
        q = await _split_scores(rt, secint, job, x, lab, theta, status)

    # 5. Ranks from one comparison per pair i < j: lt = [q_i < q_j] means j beats i;
    # otherwise (q_i >= q_j) i beats j, ties going to the lower index.
    status.phase("ranking")
    first, second = np.triu_indices(p, k=1)
    pair_parts = []
    step = _batch(job.chunk, sh.rank_bits)
    for lo in range(0, len(first), step):
        sl = slice(lo, lo + step)
        lt = rt.np_sgn(q[first[sl]] - q[second[sl]], l=sh.rank_bits, LT=True)
        pair_parts.append(secint.array(await rt.gather(lt)))
    lt_all = pair_parts[0] if len(pair_parts) == 1 else rt.np_concatenate(pair_parts)
    rank = _ranks_from_pairs(rt, secint, lt_all, first, second, p)

    # 6. T[j, r] = [rank_j == r], selected indices and D' = D x T.
    status.phase("selection")
    offsets = rank.reshape(p, 1) - np.arange(k, dtype=object).reshape(1, k)
    sel = rt.np_sgn(offsets, l=bitlen(p) + 1, EQ=True)  # (p, k)
    idx = (sel * np.arange(p, dtype=object).reshape(p, 1)).sum(axis=0)
    parts = [idx]
    # D' only for whoever reads it: its owner, or training (a job that only selects
    # never opens it); whether it is built depends on the public shape alone
    reduced: Any = x @ sel if sh.reveal_reduced or sh.train is not None else None  # (m, k)
    if sh.reveal_reduced:
        parts.append(reduced.reshape(-1))
    if sh.train is not None:
        # Step 2B on D' and the labels as they are here (ppfs.step2b)
        status.phase("training")
        alpha_full, beta = await train_logistic(rt, secint, sh, reduced, theta, sel, lab)
        parts += [alpha_full.reshape(-1), beta]
    values = parts[0] if len(parts) == 1 else rt.np_concatenate(parts)

    # Open value + mask to every party (each hands its copy to the recipient).
    status.phase("opening masked outputs")
    masks = words[:, 0] + words[:, 1] * (1 << MASK_WORD_BITS)
    opened = await rt.output(values + masks, raw=True)
    modulus = int(secint.field.modulus)
    half = modulus // 2
    ints = [int(v) % modulus for v in opened.value.reshape(-1)]
    return np.array(
        [((v - modulus) if v > half else v) & _MASK64 for v in ints], dtype=np.uint64
    )


async def _split_scores(
    rt: Any, secint: Any, job: PartyJob, x: Any, lab: Any, theta: Any, status: StatusFile
) -> Any:
    """The mean split's class counts scored by MS-GINI or chi-squared: q per column."""
    sh = job.shape
    m, p, n = sh.m, sh.p, sh.n_classes
    status.phase("mean-split comparisons")
    diff = (theta.reshape(1, p) - x).reshape(-1)  # < 0 exactly where x > theta'
    parts = []
    step = _batch(job.chunk, sh.split_bits)
    for lo in range(0, m * p, step):
        gt = rt.np_sgn(diff[lo : lo + step], l=sh.split_bits, LT=True)
        parts.append(secint.array(await rt.gather(gt)))
    del diff
    gt_all = (parts[0] if len(parts) == 1 else rt.np_concatenate(parts)).reshape(m, p)

    # 2. Class counts: n-1 classes by products, the n-th from a and b.
    status.phase("class counts and scores")
    b = gt_all.sum(axis=0)
    a = m - b
    above = lab.T @ gt_all  # (n-1, p)
    below = lab.sum(axis=0).reshape(n - 1, 1) - above
    above_n = b - above.sum(axis=0)
    below_n = a - below.sum(axis=0)
    if sh.scorer is Scorer.CHI2:
        # chi-squared of the 2 x n table (ppfs.scoring.chi2_q), over (class, column)
        a_c = rt.np_concatenate([below.reshape(-1), below_n])
        cnt = rt.np_concatenate([lab.sum(axis=0),
                                 secint.array(np.array([m], dtype=object)) - lab.sum()])
        n_all = (cnt.reshape(n, 1) + secint.array(np.zeros((n, p), dtype=object))).reshape(-1)
        a_all = rt.np_concatenate([a] * n)
        a_c, a_all, n_all = [secint.array(await rt.gather(v)) for v in (a_c, a_all, n_all)]
        q = scoring.chi2_q(_MpycOps(rt), m, a_c, a_all, n_all,
                           secint.array(np.zeros(n * p, dtype=object)))
        return secint.array(await rt.gather(q.reshape(n, p).sum(axis=0)))
    bb = (above * above).sum(axis=0) + above_n * above_n
    aa = (below * below).sum(axis=0) + below_n * below_n

    # 3. Q = N/D with N = AA*b + BB*a, D = a*b; a constant column (b = 0) has
    # N = D = 0 here and becomes N = AA, D = m.
    const = rt.np_sgn(b, l=bitlen(m) + 1, EQ=True)
    num = aa * b + bb * a + const * aa
    den = a * b + const * m

    # 4. q = floor(N * 2^F / D) by restoring long division, vectorised over features.
    status.phase("long division")
    frac = sh.score_frac_bits
    rem = num
    q = secint.array(np.zeros(p, dtype=object))
    for t in reversed(range(sh.int_steps)):
        shifted = den * (1 << t)
        ge = 1 - rt.np_sgn(rem - shifted, l=sh.div_int_bits, LT=True)
        rem = rem - ge * shifted
        q = q + ge * (1 << (frac + t))
    for t in reversed(range(frac)):
        rem = rem * 2
        ge = 1 - rt.np_sgn(rem - den, l=sh.div_frac_bits, LT=True)
        rem = rem - ge * den
        q = q + ge * (1 << t)
    q = secint.array(await rt.gather(q))
    return q


class _MpycOps:
    """:class:`ppfs.scoring.Ops` on MPyC secure arrays."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt

    def floor2(self, v: Any, w: int, bits: int) -> Any:
        t = self.rt.np_trunc(v, f=w, l=bits)  # floor or floor + 1
        return t - self.rt.np_sgn(v - t * (1 << w), l=w + 2, LT=True)

    def is_zero(self, v: Any, bits: int) -> Any:
        return self.rt.np_sgn(v, l=bits, EQ=True)

    def ltz(self, v: Any, bits: int) -> Any:
        return self.rt.np_sgn(v, l=bits, LT=True)

    def settle(self, v: Any) -> Any:
        return v


async def _pearson_q(rt: Any, secint: Any, sh: Step2AShape, x: Any, lab: Any) -> Any:
    """Pearson's q per column (ppfs.scoring.pearson_q) from exact secret sums."""
    m, p, n = sh.m, sh.p, sh.n_classes
    # any rounding: the sums below are exact; |x| < 2^(V-1)
    h = rt.np_trunc(x, f=scoring.DIGIT_BITS, l=sh.value_bits + 1)
    low = x - h * (1 << scoring.DIGIT_BITS)
    parts = [(low * low).sum(axis=0), (h * low).sum(axis=0), (h * h).sum(axis=0)]
    s = x.sum(axis=0)
    t = lab.T @ x  # (n-1, p)
    counts = lab.sum(axis=0)
    c = pearson_classes(n)
    if c == 1:
        t_all, n_all = t[0], counts[0] + secint.array(np.zeros(p, dtype=object))
    else:
        t_all = rt.np_concatenate([t.reshape(-1), s - t.sum(axis=0)])
        cnt = rt.np_concatenate([counts, secint.array(np.array([m], dtype=object))
                                 - counts.sum()])
        n_all = (cnt.reshape(c, 1) + secint.array(np.zeros((c, p), dtype=object))).reshape(-1)
    tile = [rt.np_concatenate([v] * c) if c > 1 else v for v in (s, *parts)]
    tile = [secint.array(await rt.gather(v)) for v in tile]
    t_all = secint.array(await rt.gather(t_all))
    n_all = secint.array(await rt.gather(n_all))
    zeros = secint.array(np.zeros(c * p, dtype=object))
    q = scoring.pearson_q(_MpycOps(rt), m, sh.value_bits, tile[0],
                          (tile[1], tile[2], tile[3]), t_all, n_all, zeros)
    q = q.reshape(c, p).sum(axis=0) if c > 1 else q
    return secint.array(await rt.gather(q))


async def _settle(rt: Any, secint: Any, a: Any) -> Any:
    """Evaluate a lazy secure array now (bounds MPyC's graph and memory)."""
    return secint.array(await rt.gather(a))


def _trunc(rt: Any, a: Any, f: int) -> Any:
    """a / 2^f rounded down or up at random, |a| < 2^62 (as MP-SPDZ's trunc_pr)."""
    return rt.np_trunc(a, f=f, l=step2b.TRUNC_BITS) if f else a


async def train_logistic(
    rt: Any, secint: Any, sh: Step2AShape, reduced: Any, theta: Any, sel: Any, lab: Any,
) -> tuple[Any, Any]:
    """Step 2B (:mod:`ppfs.step2b`) on secret D' (m x k): returns (T alpha, beta)."""
    c, params = sh.train_constants(), sh.train
    assert c is not None and params is not None
    m, k, nm, f = sh.m, sh.k, c.n_models, c.frac
    one = 1 << f
    emax, inv = step2b.E_MAX, step2b.INV_SHIFT

    # 1.-3. centres, pre-shifted centred values, W = sum c^2 + m
    mu = await _settle(rt, secint, (theta - 1) @ sel)  # (k,)
    ch = await _settle(rt, secint, _trunc(rt, reduced - mu.reshape(1, k), c.preshift))
    w = (ch * ch).sum(axis=0) + m
    # 4. P30 = 2^(30-E) = 2^30 - sum_t [W >= 4^t] 2^(30-t); v, Newton, g, kappa
    pow4 = np.array([4**t for t in range(1, emax + 1)], dtype=object).reshape(emax, 1)
    pow2 = np.array([1 << (emax - t) for t in range(1, emax + 1)], dtype=object)
    ge = 1 - rt.np_sgn((w.reshape(1, k) - pow4).reshape(-1), l=step2b.TRUNC_BITS, LT=True)
    p30 = await _settle(rt, secint, (1 << emax) - pow2 @ ge.reshape(emax, k))
    v = _trunc(rt, w * p30 * p30, 2 * emax + 2 - f)
    y = c.y0_a - _trunc(rt, v * c.y0_b, f)
    for _ in range(step2b.NEWTON_STEPS):
        vy2 = _trunc(rt, v * _trunc(rt, y * y, f), f)
        y = _trunc(rt, y * (3 * one - vy2), f + 1)
    g = await _settle(rt, secint, _trunc(rt, y * c.sqrt_m, f))
    # mu / sigma without leaving 2^62, and the ratio check (one public bit)
    t_r = c.ratio_shift
    ratio = await _settle(rt, secint, _trunc(
        rt, _trunc(rt, _trunc(rt, mu, c.preshift) * p30, t_r) * g, inv - t_r))
    lim = c.ratio_limit
    cmp = rt.np_sgn(rt.np_concatenate([w - (m + 1), ratio - lim, ratio + (lim - 1)]),
                    l=step2b.RANGE_CHECK_BITS, LT=True)
    const, below, above_neg = cmp[:k], cmp[k:2 * k], cmp[2 * k:]
    flags = (1 - const) * ((1 - below) + above_neg)  # non-constant and |ratio| >= lim
    await _open_range_bit(rt, flags.sum(), 2 * k, "ratio")
    # 5. c~ = c^ 2^(30-E) (exact), targets, the public batch order, the step sizes
    ct = await _settle(rt, secint, ch * p30.reshape(1, k))
    if sh.n_classes == 2:
        t = (1 - lab[:, 0]).reshape(m, 1) * one
    else:
        rest = (1 - lab.sum(axis=1)).reshape(m, 1)
        t = rt.np_concatenate([lab, rest], axis=1) * one
    perm = np.asarray(step2b.row_permutation(m, params.seed), dtype=np.int64)
    cp = ct[perm]
    tp = await _settle(rt, secint, t[perm])
    sizes = {}
    for eta in {b[2] for b in c.batches()}:
        ge = await _settle(rt, secint, _trunc(rt, g * eta, c.eta_shift))
        sizes[eta] = ge.reshape(k, 1)
    gcol = g.reshape(k, 1)

    def sigmoid(u: Any) -> Any:
        n = u.shape
        flat = u.reshape(-1)
        le = 1 - rt.np_sgn(rt.np_concatenate([cut - flat for cut in c.cuts]),
                           l=step2b.SIGMOID_BITS, LT=True)
        size = flat.shape[0]
        lin = _trunc(rt, rt.np_concatenate([flat * c.slopes[0], flat * c.slopes[1]]), f)
        l0, l1, l2, l3 = (le[i * size:(i + 1) * size] for i in range(4))
        lin1, lin2 = lin[:size], lin[size:]
        s = (c.tail * l0 + (lin1 + c.offsets[0]) * (l1 - l0)
             + (lin2 + c.offsets[1]) * (l2 - l1) + (lin1 + c.offsets[2]) * (l3 - l2)
             + (one - c.tail) * (1 - l3))
        return s.reshape(n)

    weights = secint.array(np.zeros((k, nm), dtype=object))
    fwd = secint.array(np.zeros((k, nm), dtype=object))  # A ~ g w / 2^S_A
    inter = secint.array(np.zeros(nm, dtype=object))
    batches = c.batches()
    wl = c.weight_limit
    out_of_range = secint(0)  # number of weight-check failures, opened only as [> 0]
    for _ in range(c.epochs):
        for start, size, eta in batches:
            cb, tb = cp[start:start + size], tp[start:start + size]
            u = _trunc(rt, cb @ fwd, c.q_shift) + inter.reshape(1, nm)
            err = sigmoid(u) - tb
            grad_b = err.sum(axis=0)
            weights = await _settle(rt, secint,
                                    weights - _trunc(rt, cb.T @ err * sizes[eta], c.upd_shift))
            inter = await _settle(rt, secint,
                                  inter - _trunc(rt, grad_b * eta, step2b.ETA_FRAC))
            fwd = await _settle(rt, secint, _trunc(rt, weights * gcol, c.fwd_shift))
        # the weight check at the end of the epoch: [|v| >= 2^weight_bits]
        bad, weights, inter, fwd = await weight_check(rt, secint, wl, weights, inter, fwd)
        out_of_range = out_of_range + bad
    await _open_range_bit(rt, out_of_range, 2 * (k + 1) * nm * c.epochs, "weights")
    # the model in original units, expanded to all p columns by T
    mant = _trunc(rt, weights * g.reshape(k, 1), f)
    alpha = _trunc(rt, mant * p30.reshape(k, 1), c.preshift)
    beta = inter - _trunc(rt, weights * ratio.reshape(k, 1), f).sum(axis=0)
    return sel @ alpha, beta


async def weight_check(
    rt: Any, secint: Any, limit: int, weights: Any, inter: Any, fwd: Any
) -> tuple[Any, Any, Any, Any]:
    """The end-of-epoch weight check: (the number of weights and intercepts with
    |v| >= ``limit``, secret; then weights, intercepts and forward weights with those set
    to zero). The run stops once training ends if the count is not zero, but the epochs
    until then compute on these values: zeroed, every later product, truncation and
    comparison stays within the bits it is sized for, and so within what MPyC's
    statistical masks hide (2^40 times the largest value an opening is sized for),
    however far the weights strayed. In range, nothing changes (a product by 1 is exact)."""
    k, nm = weights.shape
    wv = rt.np_concatenate([weights.reshape(-1), inter])
    lt = rt.np_sgn(rt.np_concatenate([wv - limit, wv + (limit - 1)]),
                   l=step2b.RANGE_CHECK_BITS, LT=True)
    n = wv.shape[0]
    bad = (1 - lt[:n]) + lt[n:]                 # 0 or 1 each: one side at most
    keep = await _settle(rt, secint, 1 - bad)
    kw = keep[:k * nm].reshape(k, nm)
    return (bad.sum(), await _settle(rt, secint, weights * kw),
            await _settle(rt, secint, inter * keep[k * nm:]),
            await _settle(rt, secint, fwd * kw))


async def _open_range_bit(rt: Any, count: Any, most: int, kind: str) -> None:
    """Open [count > 0] (one public bit) for a secret count in [0, most]; raise if 1."""
    zero = rt.sgn(count, l=max(2, most.bit_length() + 1), EQ=True)
    if int(await rt.output(1 - zero)):
        raise OutOfRangeError(kind)


def _batch(chunk: int, bits: int) -> int:
    """Elements per comparison batch: ``chunk`` at 40 bits, fewer for longer ones."""
    return max(1000, chunk * 40 // max(bits, 40))


def _ranks_from_pairs(
    rt: Any, secint: Any, lt: Any, first: np.ndarray, second: np.ndarray, p: int
) -> Any:
    """rank_i = #{j > i: q_j > q_i} + #{j < i: q_j >= q_i} from lt over pairs i < j.

    Pairs come in row-major order (first, second); both sums are segment sums of a
    cumulative sum, once in that order and once ordered by the second index.
    """
    zero = secint.array(np.zeros(1, dtype=object))
    starts = np.searchsorted(first, np.arange(p), side="left")
    ends = np.searchsorted(first, np.arange(p), side="right")
    cs = rt.np_concatenate([zero, rt.np_cumsum(lt)])
    later = cs[ends] - cs[starts]  # j > i that beat i
    order = np.lexsort((first, second))
    sec_sorted = second[order]
    starts2 = np.searchsorted(sec_sorted, np.arange(p), side="left")
    ends2 = np.searchsorted(sec_sorted, np.arange(p), side="right")
    cs2 = rt.np_concatenate([zero, rt.np_cumsum(lt[order])])
    earlier_lt = cs2[ends2] - cs2[starts2]  # j < i with q_j < q_i: i beats those
    return later + np.arange(p, dtype=object) - earlier_lt


# --------------------------------------------------------------------- main


def write_result(path: Path, result: dict[str, Any]) -> None:
    write_durable(path, json.dumps(result, sort_keys=True).encode())


class _RedactingFormatter(logging.Formatter):
    """Caps messages and drops exception messages: only types and code locations."""

    MAX = 400

    def format(self, record: logging.LogRecord) -> str:
        msg = super().format(record)
        return msg if len(msg) <= self.MAX else msg[: self.MAX] + " [truncated]"

    def formatException(self, ei: Any) -> str:
        etype, _, tb = ei
        name = etype.__name__ if etype is not None else "Exception"
        return "".join(traceback.format_tb(tb)) + name + " (message withheld)"


def setup_logging() -> None:
    """Before MPyC is imported, so its basicConfig leaves ours in place."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_RedactingFormatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    log.setLevel(logging.INFO)


async def check_session(rt: Any, secint: Any, tag: int) -> None:
    """Every party inputs its session tag (its words, :func:`session_words`); the
    differences to party 0's are opened (public: zero exactly when the tags agree).
    SessionError unless all are zero."""
    tags = rt.input([secint(w) for w in session_words(tag)],
                    senders=list(range(len(rt.parties))))
    diffs = await rt.output([a - b for t in tags[1:] for a, b in zip(tags[0], t, strict=True)])
    if any(int(d) != 0 for d in diffs):
        raise SessionError("the peers run another job (session tags differ)")


def run_party(job: PartyJob) -> int:
    t_start = time.monotonic()
    parent = os.getppid()
    status = StatusFile(job.status_path)
    roles = conversion_roles(job.security.scheme)

    mpyc_runtime = import_mpyc_runtime()
    rt = make_runtime(mpyc_runtime, job)
    secint = make_secint(rt)
    set_message_limits(job.shape, int(secint.field.modulus).bit_length())
    deadline = time.monotonic() + job.timeout
    stats: dict[str, Any] = {
        "party": job.party,
        "statistical_security": int(rt.options.sec_param),
        "prime_bits": int(secint.field.modulus).bit_length(),
    }

    async def session() -> None:
        status.phase("connecting")
        await guarded(rt.start(), min(deadline, time.monotonic() + job.start_timeout), None,
                      parent, lambda: stalled(rt, connecting=True))
        t_mpc = time.monotonic()
        status.phase("checking the session")
        await guarded(check_session(rt, secint, job.session_tag), deadline,
                      lambda: peer_trouble(rt), parent, lambda: stalled(rt, connecting=False))
        status.phase("loading shares")  # only now, with peers of this very job
        inputs = load_inputs(job, roles)
        opened = await guarded(
            select_top_k(rt, secint, job, inputs, roles, status), deadline,
            lambda: peer_trouble(rt), parent, lambda: stalled(rt, connecting=False),
        )
        stats["bytes_sent"] = bytes_sent(rt)
        stats["mpc_seconds"] = time.monotonic() - t_mpc
        if opened is not None and job.output_path is not None:
            write_durable(job.output_path, opened.astype("<u8").tobytes())
        status.phase("shutting down")
        await guarded(rt.shutdown(), min(deadline, time.monotonic() + 60.0), None, parent,
                      lambda: stalled(rt, connecting=False))

    failures: list[BaseException] = []

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # in place of asyncio's and MPyC's handlers, which print stacks and the reprs of
        # tasks and futures: kept for run_party to judge, logged by type only
        exc = context.get("exception")
        if exc is not None:
            failures.append(exc)
        log.warning("[MpycParty.loop] an event loop callback failed (%s)",
                    type(exc).__name__ if exc is not None else "no exception")

    rt._loop.set_exception_handler(handler)
    try:
        rt.run(session())
    except (RuntimeError, MalformedMessage) as exc:
        # MPyC stops its event loop when one of its coroutines fails ("Event loop stopped
        # before Future completed"): a peer's message that did not parse or fit, or a
        # peer's link that is gone, is the cause then
        trouble = peer_trouble(rt) or misfit_input(failures if failures else [exc])
        if trouble is not None:
            raise trouble from None
        raise
    status.phase("done")
    stats["seconds"] = time.monotonic() - t_start
    stats["exit_code"] = EXIT_OK
    stats["phases"] = status.times  # seconds since start at which each phase began
    stats["max_rss_kb"] = peak_rss_kb()
    write_result(job.result_path, stats)
    return EXIT_OK


def misfit_input(failures: list[BaseException]) -> PeerFaultError | None:
    """A peer's input share that parsed but does not have the input's shape: MPyC's
    ``Runtime._distribute`` reshapes each payload ``r`` right after unmarshalling it, and
    the payload that failed, tagged with its sender (:class:`PeerPayload`), is still in
    that frame when the failure is judged. (Not the payload unmarshalled last: other
    coroutines take theirs before the failure reaches the event loop's handler.)"""
    for exc in failures:
        if not isinstance(exc, ValueError):
            continue
        tb, inside = exc.__traceback__, False
        while tb is not None:
            code = tb.tb_frame.f_code
            inside = inside or (code.co_name == "_distribute" and code.co_filename.endswith(
                os.path.join("mpyc", "runtime.py")))
            peer = getattr(tb.tb_frame.f_locals.get("r"), "peer", None) if inside else None
            if isinstance(peer, int):
                return PeerFaultError(peer, "sent an input share of the wrong length")
            tb = tb.tb_next
    return None


def peak_rss_kb() -> int:
    """This worker's peak resident memory, KiB: its own address space's high-water mark
    (``ru_maxrss`` would also count the process it was forked from, before its exec)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _fail(job: PartyJob | None, code: int, reason: str, peer: int | None = None) -> int:
    log.error("[MpycParty.fail] code=%d reason=%s", code, reason)
    if job is not None:
        with contextlib.suppress(OSError):
            result: dict[str, Any] = {
                "party": job.party, "exit_code": code, "reason": reason[:200],
                "max_rss_kb": peak_rss_kb()}
            if peer is not None:
                result["peer"] = peer
            write_result(job.result_path, result)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ppfs.engines.mpyc_party", allow_abbrev=False)
    parser.add_argument("--job", type=Path, required=True)
    parser.add_argument("--party", type=int, required=True)
    args = parser.parse_args(argv)
    setup_logging()
    job: PartyJob | None = None
    try:
        job = PartyJob.load(args.job, args.party)
        return run_party(job)
    except JobError as exc:
        return _fail(job, EXIT_BAD_JOB, str(exc))
    except SessionError as exc:
        return _fail(job, EXIT_SESSION, str(exc))
    except OutOfRangeError as exc:
        return _fail(job, EXIT_OUT_OF_RANGE, exc.kind)
    except PeerFaultError as exc:
        return _fail(job, EXIT_PEER_FAULT, str(exc), exc.peer)
    except PeerLostError as exc:
        return _fail(job, EXIT_PEER_LOST, str(exc) or "an MPC peer was lost")
    except TimeoutError as exc:
        return _fail(job, EXIT_TIMEOUT, str(exc) or "timed out")
    except Exception as exc:
        log.error("[MpycParty.fail] internal error", exc_info=True)
        return _fail(job, EXIT_INTERNAL, f"internal error ({type(exc).__name__})")


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit at once: after a lost peer MPyC may leave tasks and sockets behind.
    os._exit(code)
