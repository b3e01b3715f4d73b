"""Fixed-point encoding of real columns into Z_2^64.

A value x of column j is encoded as ``round(x * 2^(f + e_j)) mod 2^64``: ``f`` is
the job's fractional bits (16 by default) and ``e_j`` a per-column power-of-two
exponent. Real columns span many magnitudes (LSVT reaches 8e10, other columns
stay near 1e-4), so the data owner's client picks ``e_j`` from the data so that
the column's largest magnitude encodes just below ``2^target_bits``; the exponents
are part of the data set's public schema, so every owner of a data set encodes
with the same ones. MS-GINI does not change under a positive per-column scale.

Every encoded value must satisfy ``|raw| < 2^(value_bits - 1)``: that bound is
what the secure protocols size their comparisons for. ``target_bits`` leaves
``value_bits - 1 - target_bits`` bits of headroom for other owners' rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ppfs.errors import InputDataError

# The exponent f + e_j must stay in this range; a column whose magnitude would
# need more is refused (no power-of-two scale fits it into the value range).
MAX_TOTAL_EXPONENT = 64
# A schema's scale may give a column at most this many bits fewer than the column's own
# scale would (another owner's values up to 2^12 times larger than this owner's).
MAX_SCALE_LOSS = 12


MAX_FRAC_BITS = 40  # fractional bits an encoding may have


@dataclass(frozen=True)
class FixedPoint:
    """Parameters of the encoding. Travels with each job and is recorded in its result."""

    frac_bits: int = 16
    value_bits: int = 32
    target_bits: int = 23

    def __post_init__(self) -> None:
        if not 0 <= self.frac_bits <= MAX_FRAC_BITS:
            raise ValueError(f"frac_bits must be in [0, {MAX_FRAC_BITS}], got {self.frac_bits}")
        if not 8 <= self.value_bits <= 40:
            raise ValueError(f"value_bits must be in [8, 40], got {self.value_bits}")
        if not 1 <= self.target_bits < self.value_bits - 1:
            raise ValueError(f"target_bits must be in [1, value_bits - 2], got {self.target_bits}")

    @property
    def limit(self) -> int:
        """Exclusive bound on |raw|."""
        return 1 << (self.value_bits - 1)

    def choose_exponents(self, x: np.ndarray, columns: Sequence[str]) -> np.ndarray:
        """Per-column exponents e_j so the column maximum encodes below 2^target_bits."""
        _refuse_non_finite(x, columns)
        exps = np.zeros(x.shape[1], dtype=np.int64)
        for j in range(x.shape[1]):
            col = np.abs(x[:, j])
            peak = float(col.max()) if col.size else 0.0
            if peak == 0.0:
                continue
            _, e2 = math.frexp(peak)  # peak < 2^e2, peak >= 2^(e2-1)
            total = self.target_bits - e2
            if abs(total) > MAX_TOTAL_EXPONENT:
                row = int(col.argmax())
                raise InputDataError(
                    f"column {columns[j]!r}, row {row + 1}: magnitude {peak:.3g} cannot be "
                    f"represented by any power-of-two scale (supported magnitudes are about "
                    f"2^{self.target_bits - MAX_TOTAL_EXPONENT} to "
                    f"2^{self.target_bits + MAX_TOTAL_EXPONENT})"
                )
            exps[j] = total - self.frac_bits
        return exps

    def check_scales(
        self, x: np.ndarray, exponents: Sequence[int] | np.ndarray, columns: Sequence[str]
    ) -> None:
        """Refuse a schema's exponents that would leave a column's largest magnitude fewer
        than ``target_bits - MAX_SCALE_LOSS`` significant bits (its own scale would give it
        ``target_bits``): another owner's far larger values, or a scale nobody's data
        needs, which would quantise this table to a few levels."""
        own = self.choose_exponents(x, columns)
        for j, col in enumerate(columns):
            loss = int(own[j]) - int(exponents[j])
            if loss > MAX_SCALE_LOSS and np.any(x[:, j] != 0):
                raise InputDataError(
                    f"column {col!r}: the schema's scale 2^{int(exponents[j])} leaves this "
                    f"table's largest value only {self.target_bits - loss} significant bits "
                    f"(its own scale, 2^{int(own[j])}, gives {self.target_bits}): check that "
                    "the schema is this data set's"
                )

    def encode(self, x: np.ndarray, exponents: np.ndarray, columns: Sequence[str]) -> np.ndarray:
        """Encode an (m, p) float matrix to int64 raw values, refusing out-of-range values."""
        _refuse_non_finite(x, columns)
        if x.ndim != 2 or x.shape[1] != len(exponents):
            raise ValueError("x must be (m, p) with one exponent per column")
        raw = np.ldexp(x, (self.frac_bits + exponents)[None, :].astype(np.int32))
        np.rint(raw, out=raw)  # in place: one float copy of the table, not three
        too_big = (raw >= self.limit) | (raw <= -self.limit)
        if too_big.any():
            row, col = (int(v) for v in np.argwhere(too_big)[0])
            bound = math.ldexp(1.0, self.value_bits - 1 - self.frac_bits - int(exponents[col]))
            raise InputDataError(
                f"column {columns[col]!r}, row {row + 1}: value {x[row, col]:.6g} is too large "
                f"for the column's scale 2^{int(exponents[col])} in this data set's schema "
                f"(|x| must stay below {bound:.6g})"
            )
        return raw.astype(np.int64)

    def decode(self, raw: np.ndarray, exponents: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`encode` (up to rounding). ``raw`` is int64 (signed)."""
        total = (self.frac_bits + np.asarray(exponents, dtype=np.int64)).astype(np.int32)
        return np.ldexp(np.asarray(raw, dtype=np.float64), -total)


def _refuse_non_finite(x: np.ndarray, columns: Sequence[str]) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        row, col = (int(v) for v in np.argwhere(bad)[0])
        kind = "NaN" if np.isnan(x[row, col]) else "an infinite value"
        raise InputDataError(f"column {columns[col]!r}, row {row + 1}: {kind} cannot be encoded")
