"""The scorers of Step 2A besides MS-GINI: Pearson correlation and chi-squared.

Stated once and run by three backends: the plaintext mirror (Python integers), the
MPyC party (secure integers) and the MP-SPDZ program (``step2a.mpc`` imports this
module at compile time). Every operation is exact integer arithmetic on secret values;
the only non-linear steps are :meth:`Ops.floor2` (exact floor(v / 2^w)),
:meth:`Ops.is_zero` and :meth:`Ops.ltz`, so the secure result equals the mirror's bit
for bit.

Both scores are a sum over classes of ratios A_c / D_c with 0 <= A_c <= D_c, where A_c
and D_c are integers far wider than the 64-bit ring (up to 144 bits for m < 2^20
rows and values below 2^31 in magnitude). They are held as *limbs*: a number is
sum_i L_i 2^(20 i) with each limb a ring element whose bound is tracked in the clear
(:class:`Big`). Carries are propagated by exact floors, so products of numbers are
convolutions of 20-bit digits (below 2^41 per term) and never wrap.

Pearson, class c (one-vs-rest indicator y_c; two classes: class 0 only, the label
as 0/1): r_c^2 = N_c^2 / (Vx * Vy_c) with N_c = m T_c - S n_c, Vx = m W - S^2,
Vy_c = n_c (m - n_c), from the exact secret sums S = sum x, W = sum x^2,
T_c = sum x y_c and n_c = sum y_c. W needs 82 bits; each x is split as
x = 2^20 h + l (any h, e.g. a probabilistic truncation: the sum is exact however h
rounds), so W = sum l^2 + 2^20 * 2 sum h l + 2^40 sum h^2 with every sum in the ring.

Chi-squared (Pearson's statistic of the mean split's 2 x n table): with a_c the rows
of class c at or below the threshold, a = sum a_c, b = m - a,
chi2 = sum_c (m a_c - a n_c)^2 / (a b n_c); the score is chi2 / m = sum_c A_c / D_c
with A_c = (m a_c - a n_c)^2, D_c = m a b n_c (each term is a 2 x 2 phi^2 times
(m - n_c) / m, so A_c <= D_c).

:func:`ratio_q` turns A/D into q = floor(2^F A'' / D'') where A'', D'' are A and D
without their low 20 t bits, t chosen from D's top non-zero digit so that
D'' in [2^40, 2^60) (or t = 0, and the division is exact, when D < 2^60):
|A''/D'' - A/D| < 2^-40, so |q - 2^F A/D| < 1 + 2^(F-40). With F = 38 and C
terms, q orders features exactly as the true scores whenever they differ by more
than 2.5 C 2^-38, and identical inputs give identical q. D = 0 (a constant column;
for a class absent from the label, every feature alike) gives q = -1: constant
columns rank last. Ties in q go to the lower column index, as for MS-GINI.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

DIGIT_BITS = 20
RATIO_FRAC_BITS = 38
WINDOW_DIGITS = 3  # D'' holds three digits: [2^40, 2^60)
DIVISION_BITS = 63  # 2r - D'' in (-2^60, 2^61)


class Scorer(enum.Enum):
    MS_GINI = "ms-gini"
    PEARSON = "pearson"
    CHI2 = "chi2"


SCORER_NAMES = tuple(s.value for s in Scorer)


class Ops(Protocol):
    """The non-linear operations a backend provides on vectors of secret integers."""

    def floor2(self, v: Any, w: int, bits: int) -> Any:
        """Exact floor(v / 2^w) for |v| < 2^bits."""

    def is_zero(self, v: Any, bits: int) -> Any:
        """[v == 0] for |v| < 2^bits."""

    def ltz(self, v: Any, bits: int) -> Any:
        """[v < 0] for |v| < 2^(bits - 2) (the engines' convention for LTZ lengths)."""

    def settle(self, v: Any) -> Any:
        """Evaluate now (MPyC); the identity elsewhere."""


class PlainOps:
    """The mirror's backend: numpy object arrays of Python integers."""

    def floor2(self, v: Any, w: int, bits: int) -> Any:
        return v >> w

    def is_zero(self, v: Any, bits: int) -> Any:
        return (v == 0).astype(object) * 1

    def ltz(self, v: Any, bits: int) -> Any:
        return (v < 0).astype(object) * 1

    def settle(self, v: Any) -> Any:
        return v


def _bits(bound: int) -> int:
    """Signed bit length covering |v| <= bound."""
    return max(2, int(bound).bit_length() + 1)


@dataclass
class Big:
    """sum_i limbs[i] * 2^(20 i), each |limbs[i]| <= bounds[i] (public bounds)."""

    limbs: list[Any]
    bounds: list[int]

    def normalized(self, ops: Ops, top_bound: int | None = None) -> Big:
        """Exact carries: every limb but the last in [0, 2^20); limbs are appended
        until the last one is below 2^20 too (for a non-negative number) or its
        bound stops shrinking."""
        limbs, bounds = list(self.limbs), list(self.bounds)
        out: list[Any] = []
        out_b: list[int] = []
        i = 0
        while True:
            v, bnd = limbs[i], bounds[i]
            last = i == len(limbs) - 1
            if last and bnd < (1 << DIGIT_BITS):
                out.append(v)
                out_b.append(bnd)
                break
            c = ops.floor2(v, DIGIT_BITS, _bits(bnd))
            out.append(v - c * (1 << DIGIT_BITS))
            out_b.append((1 << DIGIT_BITS) - 1)
            cb = (bnd >> DIGIT_BITS) + 1
            if last:
                limbs.append(c)
                bounds.append(cb)
            else:
                limbs[i + 1] = limbs[i + 1] + c
                bounds[i + 1] += cb
            i += 1
        return Big(out, out_b)


def digits_of(ops: Ops, v: Any, bound: int) -> Big:
    """A single ring element |v| <= bound as normalized limbs."""
    return Big([v], [bound]).normalized(ops)


def mul(a: Big, b: Big) -> Big:
    """Product by convolution (limbs must be digits, i.e. normalized, to stay small)."""
    n = len(a.limbs) + len(b.limbs) - 1
    limbs: list[Any] = [None] * n
    bounds = [0] * n
    for i, (x, bx) in enumerate(zip(a.limbs, a.bounds, strict=True)):
        for j, (y, by) in enumerate(zip(b.limbs, b.bounds, strict=True)):
            t = x * y
            limbs[i + j] = t if limbs[i + j] is None else limbs[i + j] + t
            bounds[i + j] += bx * by
    return Big(limbs, bounds)


def lincomb(terms: list[tuple[Any, int, Big]]) -> Big:
    """sum of coef * big; coef a public int (its bound is |coef|) or a secret vector
    with the public bound given beside it."""
    n = max(len(b.limbs) for _, _, b in terms)
    limbs: list[Any] = [0] * n
    bounds = [0] * n
    for coef, bound, big in terms:
        cb = abs(coef) if isinstance(coef, int) else bound
        for i, (v, vb) in enumerate(zip(big.limbs, big.bounds, strict=True)):
            limbs[i] = limbs[i] + coef * v
            bounds[i] += cb * vb
    return Big(limbs, bounds)


def ratio_q(ops: Ops, num: Big, den: Big, zeros: Any) -> Any:
    """q = floor(2^F A'' / D'') for normalized 0 <= A <= D (see the module docstring);
    -1 where D = 0. ``zeros`` is a zero vector of the right length (backend type)."""
    n = max(len(num.limbs), len(den.limbs), WINDOW_DIGITS)
    a = list(num.limbs) + [zeros] * (n - len(num.limbs))
    d = list(den.limbs) + [zeros] * (n - len(den.limbs))
    if max(den.bounds[-1], num.bounds[-1]) >= 1 << DIGIT_BITS:
        raise ValueError("ratio_q needs fully normalized operands")
    top = WINDOW_DIGITS - 1

    def window(x: list[Any], t: int) -> Any:
        return sum((x[t - i] * (1 << (DIGIT_BITS * (top - i))) for i in range(1, top + 1)),
                   x[t] * (1 << (DIGIT_BITS * top)))

    if n > WINDOW_DIGITS:
        nz = [1 - z for z in _zeros_of(ops, d[WINDOW_DIGITS:])]
        # f_t = [t is the top non-zero digit], t >= 3; the rest (t <= 2) falls to t = 2
        none_above = 1
        dd = 0
        aa = 0
        for t in range(n - 1, top, -1):
            f = nz[t - WINDOW_DIGITS] * none_above
            dd = dd + f * window(d, t)
            aa = aa + f * window(a, t)
            none_above = ops.settle(none_above * (1 - nz[t - WINDOW_DIGITS]))
        dd = dd + none_above * window(d, top)
        aa = aa + none_above * window(a, top)
    else:
        dd, aa = window(d, top), window(a, top)
    dd, aa = ops.settle(dd), ops.settle(aa)
    const = ops.is_zero(dd, DIGIT_BITS * WINDOW_DIGITS + 1)
    dd = dd + const
    ge = 1 - ops.ltz(aa - dd, DIVISION_BITS)
    r = aa - ge * dd
    q = ge * (1 << RATIO_FRAC_BITS)
    for f in range(RATIO_FRAC_BITS - 1, -1, -1):
        r = r * 2
        ge = 1 - ops.ltz(r - dd, DIVISION_BITS)
        r = ops.settle(r - ge * dd)
        q = q + ge * (1 << f)
    return ops.settle(q - const)


def _zeros_of(ops: Ops, digits: list[Any]) -> list[Any]:
    return [ops.is_zero(x, DIGIT_BITS + 1) for x in digits]


# ---------------------------------------------------------------------- scores


def pearson_q(
    ops: Ops, m: int, value_bits: int, s: Any, w_parts: tuple[Any, Any, Any], t: Any, n: Any,
    zeros: Any,
) -> Any:
    """q of r_c^2 per element: vectors over (class, feature), all of one length.

    ``s`` = sum x, ``w_parts`` = (sum l^2, sum h l, sum h^2) of the split
    x = 2^20 h + l, ``t`` = sum x y_c, ``n`` = sum y_c.
    """
    vmax = 1 << (value_bits - 1)  # |x| < vmax
    hmax = (vmax >> DIGIT_BITS) + 1
    lmax = 1 << DIGIT_BITS
    sb = m * vmax
    s_d = digits_of(ops, s, sb)
    t_d = digits_of(ops, t, sb)
    # N = m T - n S
    nn = lincomb([(m, m, t_d), (-n, m, s_d)]).normalized(ops)
    a = mul(nn, nn).normalized(ops)
    # Vx = m W - S^2
    l2, hl, h2 = w_parts
    w = Big([l2, 2 * hl, h2], [m * lmax * lmax, 2 * m * hmax * lmax, m * hmax * hmax])
    w = w.normalized(ops)
    s2 = mul(s_d, s_d)
    vx = lincomb([(m, m, w), (-1, 1, s2)]).normalized(ops)
    vy = digits_of(ops, n * (m - n), m * m)
    d = mul(vx, vy).normalized(ops)
    return ratio_q(ops, a, d, zeros)


def chi2_q(ops: Ops, m: int, a_c: Any, a: Any, n: Any, zeros: Any) -> Any:
    """q of (m a_c - a n_c)^2 / (m a b n_c) per element (class, feature)."""
    dev = digits_of(ops, m * a_c - a * n, m * m)
    num = mul(dev, dev).normalized(ops)
    ab = digits_of(ops, a * (m - a), m * m)
    nm = digits_of(ops, n * m, m * m)
    den = mul(ab, nm).normalized(ops)
    return ratio_q(ops, num, den, zeros)
