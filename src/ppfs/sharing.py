"""Replicated additive secret sharing over Z_2^64 and its binary share format.

A value x is split into n additive components, x = c_0 + ... + c_{n-1} mod 2^64.
With 3 parties, party i holds (c_i, c_{i-1}); with 4 parties party i holds every
component except c_i (MP-SPDZ's Rep4 layout). Each component is therefore held
by at least two parties, which is what lets the active settings detect a party
that alters its copy.

On disk and on the wire a party's share of one matrix is a :class:`ShareBundle`:
a magic string, a JSON header (scheme, parties, party, shape, fractional bits,
dataset id, kind, components, SHA-256 of the payload) and the raw little-endian
uint64 components. Nothing here executes code on load.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ppfs.durable import write_atomic_parts, write_durable_parts
from ppfs.errors import ShareFormatError

MAGIC = b"PPFSSHR1"
_U32 = struct.Struct("<I")
_MAX_HEADER = 1 << 16
# the most a serialized bundle holds besides its words: magic, header length, header
BUNDLE_HEAD_MAX = len(MAGIC) + _U32.size + _MAX_HEADER
# os.urandom is read this many bytes at a time into the words' own buffer, so a large
# draw never holds a second copy of itself
_URANDOM_CHUNK = 1 << 24


class Scheme(enum.Enum):
    """Replicated sharing layout, named after the party count."""

    REP3 = "rep3"
    REP4 = "rep4"

    @property
    def parties(self) -> int:
        return 3 if self is Scheme.REP3 else 4

    @classmethod
    def for_parties(cls, n: int) -> Scheme:
        if n == 3:
            return cls.REP3
        if n == 4:
            return cls.REP4
        raise ValueError(f"replicated sharing supports 3 or 4 parties, not {n}")

    def components_of(self, party: int) -> tuple[int, ...]:
        """Indices of the components party ``party`` holds, in ascending order."""
        n = self.parties
        if not 0 <= party < n:
            raise ValueError(f"party index {party} out of range for {n} parties")
        if self is Scheme.REP3:
            return tuple(sorted((party, (party - 1) % n)))
        return tuple(j for j in range(n) if j != party)

    def holders_of(self, component: int) -> tuple[int, ...]:
        """Parties that hold component ``component``."""
        return tuple(i for i in range(self.parties) if component in self.components_of(i))


def random_words(shape: int | tuple[int, ...]) -> np.ndarray:
    """Uniform uint64 words of ``shape`` from the OS CSPRNG (``os.urandom``).

    Every secret the project draws (share components, mask words) comes from here,
    never from numpy's generators: those are not cryptographic, and a long run of
    their output gives away their state and so every other word they drew.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError("a shape has no negative dimension")
    count = int(np.prod(dims, dtype=np.int64))
    words = np.empty(count, dtype="<u8")
    buf = words.data.cast("B")
    for start in range(0, 8 * count, _URANDOM_CHUNK):
        end = min(start + _URANDOM_CHUNK, 8 * count)
        buf[start:end] = os.urandom(end - start)
    return words.astype(np.uint64, copy=False).reshape(dims)


def share(raw: np.ndarray, scheme: Scheme) -> list[np.ndarray]:
    """Split int64/uint64 ``raw`` into ``scheme.parties`` uint64 components; all but
    the last are uniform words from :func:`random_words`."""
    # a C-ordered copy (int64 wraps to its value mod 2^64): the bundles then share the
    # components' buffers instead of copying them for every holder
    last = np.asarray(raw).astype(np.uint64, order="C")
    comps = [random_words(last.shape) for _ in range(scheme.parties - 1)]
    for c in comps:
        last -= c  # uint64 arithmetic wraps mod 2^64
    comps.append(last)
    return comps


def reconstruct(components: Sequence[np.ndarray]) -> np.ndarray:
    """Sum components mod 2^64 and return signed int64 values.

    Only the recipient of a result ever calls this on secret data.
    """
    total = np.zeros_like(np.asarray(components[0], dtype=np.uint64))
    for c in components:
        total += np.asarray(c, dtype=np.uint64)
    return total.view(np.int64)


@dataclass
class ShareBundle:
    """One party's components of one secret-shared matrix."""

    scheme: Scheme
    party: int
    dataset_id: str
    kind: str  # "data", "labels" or "mask"
    shape: tuple[int, int]
    frac_bits: int
    components: dict[int, np.ndarray] = field(default_factory=dict)

    @classmethod
    def for_party(
        cls,
        comps: Sequence[np.ndarray],
        scheme: Scheme,
        party: int,
        *,
        dataset_id: str,
        kind: str,
        frac_bits: int,
    ) -> ShareBundle:
        shape = tuple(int(s) for s in comps[0].shape)
        if len(shape) != 2:
            raise ValueError("shares are 2-D matrices")
        return cls(
            scheme=scheme,
            party=party,
            dataset_id=dataset_id,
            kind=kind,
            shape=(shape[0], shape[1]),
            frac_bits=frac_bits,
            components={
                j: np.ascontiguousarray(comps[j], dtype=np.uint64)
                for j in scheme.components_of(party)
            },
        )

    def _payload(self) -> list[memoryview]:
        """The components in ascending order as little-endian words, without copies
        (unless a component is not already contiguous little-endian uint64)."""
        return [
            np.ascontiguousarray(self.components[j], dtype="<u8").reshape(-1).data
            for j in sorted(self.components)
        ]

    def _head(self, payload: list[memoryview]) -> bytes:
        """Magic, header length and header (with the payload's SHA-256)."""
        digest = hashlib.sha256()
        for part in payload:
            digest.update(part)
        header = {
            "version": 1,
            "scheme": self.scheme.value,
            "parties": self.scheme.parties,
            "party": self.party,
            "dataset_id": self.dataset_id,
            "kind": self.kind,
            "shape": list(self.shape),
            "frac_bits": self.frac_bits,
            "components": sorted(self.components),
            "sha256": digest.hexdigest(),
        }
        hdr = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        return MAGIC + _U32.pack(len(hdr)) + hdr

    def to_bytes(self) -> bytes:
        payload = self._payload()
        return b"".join([self._head(payload), *payload])

    @classmethod
    def from_bytes(cls, blob: bytes) -> ShareBundle:
        header, start = _parse_head(blob, len(blob))
        payload = memoryview(blob)[start:]
        if len(payload) != header.payload_bytes:
            raise ShareFormatError("share bundle payload has the wrong length")
        return header.bundle(np.frombuffer(payload, dtype="<u8"))

    def save(self, path: Path, *, durable: bool = True) -> None:
        """Write atomically: a reader never sees a half-written bundle. ``durable``
        (the default) also syncs it to disk before returning; an embedded run's inputs,
        deleted when the run ends, need not survive a crash. The same bytes as
        :meth:`to_bytes`, streamed from the components' buffers."""
        payload = self._payload()
        write = write_durable_parts if durable else write_atomic_parts
        write(path, [self._head(payload), *payload])

    @classmethod
    def load(cls, path: Path) -> ShareBundle:
        """:meth:`from_bytes` of the file's contents, read straight into the words'
        buffer: one copy of the payload in memory, however large."""
        with open(path, "rb") as fh:
            header = _read_head(fh)
            flat = np.empty(header.payload_bytes // 8, dtype="<u8")
            if fh.readinto(flat.data.cast("B")) != header.payload_bytes:
                raise ShareFormatError("share bundle payload has the wrong length")
        return header.bundle(flat)


@dataclass(frozen=True)
class _Head:
    """A parsed, consistent bundle header; :meth:`bundle` checks the payload against it."""

    scheme: Scheme
    party: int
    dataset_id: str
    kind: str
    shape: tuple[int, int]
    frac_bits: int
    order: tuple[int, ...]
    digest: str

    @property
    def payload_bytes(self) -> int:
        return 8 * self.shape[0] * self.shape[1] * len(self.order)

    def bundle(self, flat: np.ndarray) -> ShareBundle:
        """The bundle of the payload ``flat`` (little-endian words, as stored): its
        checksum verified, its words copied only if ``flat`` is read-only."""
        if hashlib.sha256(flat.data).hexdigest() != self.digest:
            raise ShareFormatError("share bundle checksum mismatch")
        words = flat.astype(np.uint64, copy=not flat.flags.writeable)
        rows, cols = self.shape
        size = rows * cols
        comps = {
            j: words[t * size : (t + 1) * size].reshape(rows, cols)
            for t, j in enumerate(self.order)
        }
        return ShareBundle(self.scheme, self.party, self.dataset_id, self.kind, self.shape,
                           self.frac_bits, comps)


def _read_head(fh: BinaryIO) -> _Head:
    """The header of the bundle file open at its start in ``fh``, which is left at the
    payload's first byte; ShareFormatError unless the file's length is the header's."""
    size = os.fstat(fh.fileno()).st_size
    prefix = fh.read(len(MAGIC) + 4)
    if len(prefix) == len(MAGIC) + 4 and prefix.startswith(MAGIC):
        (hlen,) = _U32.unpack_from(prefix, len(MAGIC))
        prefix += fh.read(min(hlen, _MAX_HEADER + 1))
    header, start = _parse_head(prefix, size)
    if size - start != header.payload_bytes:
        raise ShareFormatError("share bundle payload has the wrong length")
    fh.seek(start)
    return header


def check_bundle_file(path: Path) -> _Head:
    """The header of the bundle stored at ``path``, once its payload was read and found
    whole and unchanged (its length and its SHA-256 those the header states), read in
    chunks without holding the payload; ShareFormatError (or OSError) otherwise."""
    with open(path, "rb") as fh:
        header = _read_head(fh)
        digest = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != header.digest:
        raise ShareFormatError("share bundle checksum mismatch")
    return header


def _parse_head(blob: bytes, total: int) -> tuple[_Head, int]:
    """The header at the start of ``blob`` (a bundle of ``total`` bytes, of which
    ``blob`` holds at least the magic and header) and where the payload starts."""
    if total < len(MAGIC) + 4 or len(blob) < len(MAGIC) + 4 or not blob.startswith(MAGIC):
        raise ShareFormatError("not a ppfs share bundle (bad magic)")
    (hlen,) = _U32.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + 4
    if hlen > _MAX_HEADER or start + hlen > min(total, len(blob)):
        raise ShareFormatError("share bundle header is truncated or oversized")
    try:
        header = json.loads(blob[start : start + hlen])
        scheme = Scheme(header["scheme"])
        party = int(header["party"])
        rows, cols = (int(v) for v in header["shape"])
        order = tuple(int(j) for j in header["components"])
        digest = str(header["sha256"])
        dataset_id = str(header["dataset_id"])
        kind = str(header["kind"])
        frac_bits = int(header["frac_bits"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ShareFormatError(
            f"share bundle header is malformed ({type(exc).__name__})"
        ) from None
    if header.get("version") != 1 or header.get("parties") != scheme.parties:
        raise ShareFormatError("share bundle version or party count is not supported")
    if rows < 0 or cols < 0 or order != scheme.components_of(party):
        raise ShareFormatError("share bundle shape or component list is inconsistent")
    head = _Head(scheme, party, dataset_id, kind, (rows, cols), frac_bits, order, digest)
    return head, start + hlen


def bundles_for_all(
    raw: np.ndarray,
    scheme: Scheme,
    *,
    dataset_id: str,
    kind: str,
    frac_bits: int,
) -> list[ShareBundle]:
    """Share ``raw`` and cut the components into one bundle per party."""
    comps = share(raw, scheme)
    return [
        ShareBundle.for_party(
            comps, scheme, i, dataset_id=dataset_id, kind=kind, frac_bits=frac_bits
        )
        for i in range(scheme.parties)
    ]


def components_from_bundles(bundles: Mapping[int, ShareBundle]) -> list[np.ndarray]:
    """Collect one copy of each component from a set of bundles (recipient side)."""
    scheme = next(iter(bundles.values())).scheme
    out: dict[int, np.ndarray] = {}
    for b in bundles.values():
        for j, c in b.components.items():
            out.setdefault(j, c)
    if sorted(out) != list(range(scheme.parties)):
        raise ShareFormatError("bundles do not cover every component")
    return [out[j] for j in range(scheme.parties)]
