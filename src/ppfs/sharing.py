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

import numpy as np

from ppfs.durable import write_atomic, write_durable
from ppfs.errors import ShareFormatError

MAGIC = b"PPFSSHR1"
_U32 = struct.Struct("<I")
_MAX_HEADER = 1 << 16


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
    return np.frombuffer(os.urandom(8 * count), dtype="<u8").astype(np.uint64).reshape(dims)


def share(raw: np.ndarray, scheme: Scheme) -> list[np.ndarray]:
    """Split int64/uint64 ``raw`` into ``scheme.parties`` uint64 components; all but
    the last are uniform words from :func:`random_words`."""
    x = np.asarray(raw).astype(np.uint64, copy=False)
    comps = [random_words(x.shape) for _ in range(scheme.parties - 1)]
    last = x.copy()
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

    def to_bytes(self) -> bytes:
        order = sorted(self.components)
        # the components' own memory, hashed and joined once (no intermediate copies)
        payload = [np.ascontiguousarray(self.components[j], dtype="<u8").data for j in order]
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
            "components": order,
            "sha256": digest.hexdigest(),
        }
        hdr = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        return b"".join([MAGIC, _U32.pack(len(hdr)), hdr, *payload])

    @classmethod
    def from_bytes(cls, blob: bytes) -> ShareBundle:
        if len(blob) < len(MAGIC) + 4 or not blob.startswith(MAGIC):
            raise ShareFormatError("not a ppfs share bundle (bad magic)")
        (hlen,) = _U32.unpack_from(blob, len(MAGIC))
        start = len(MAGIC) + 4
        if hlen > _MAX_HEADER or start + hlen > len(blob):
            raise ShareFormatError("share bundle header is truncated or oversized")
        try:
            header = json.loads(blob[start : start + hlen])
            scheme = Scheme(header["scheme"])
            party = int(header["party"])
            rows, cols = (int(v) for v in header["shape"])
            order = [int(j) for j in header["components"]]
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
        if rows < 0 or cols < 0 or tuple(order) != scheme.components_of(party):
            raise ShareFormatError("share bundle shape or component list is inconsistent")
        payload = blob[start + hlen :]
        if len(payload) != 8 * rows * cols * len(order):
            raise ShareFormatError("share bundle payload has the wrong length")
        if hashlib.sha256(payload).hexdigest() != digest:
            raise ShareFormatError("share bundle checksum mismatch")
        flat = np.frombuffer(payload, dtype="<u8").astype(np.uint64)
        size = rows * cols
        comps = {
            j: flat[t * size : (t + 1) * size].reshape(rows, cols) for t, j in enumerate(order)
        }
        return cls(scheme, party, dataset_id, kind, (rows, cols), frac_bits, comps)

    def save(self, path: Path, *, durable: bool = True) -> None:
        """Write atomically: a reader never sees a half-written bundle. ``durable``
        (the default) also syncs it to disk before returning; an embedded run's inputs,
        deleted when the run ends, need not survive a crash."""
        if durable:
            write_durable(path, self.to_bytes())
        else:
            write_atomic(path, self.to_bytes())

    @classmethod
    def load(cls, path: Path) -> ShareBundle:
        return cls.from_bytes(path.read_bytes())


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
