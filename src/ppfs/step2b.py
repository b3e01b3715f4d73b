"""Step 2B: logistic regression trained inside MPC on D', stated once for every engine.

Step 2B runs in the same secure program as Step 2A, on D' and the labels exactly as
Step 2A leaves them (nothing is persisted in between). Both engines implement the
integer algorithm below on secret shares; :func:`mirror` runs it in the clear. The
only difference is rounding: the engines truncate probabilistically (a / 2^f rounded
down or up, at random), the mirror rounds down. (MP-SPDZ in active 3PC, where opening
a masked value costs a check of every product so far, truncates exactly, rounding down
as the mirror does, in the sequential steps on few values per column; the SGD step's
two truncations, of the update and of A (values below 2^61), within a unit of the
floor (floor - 1, floor or floor + 1, by the chance of its shares' low bits), in half
the rounds of its exact truncation; and the m*k truncations of the standardisation,
step 2, with a cheaper mask that leaves them -1 to +2 units off the floor, without
bias. In every setting MP-SPDZ's SGD step takes the sigmoid from the untruncated
forward product q, so that nothing waits for its truncation: the linear parts as
trunc(q * slope, Q + F) where the mirror has trunc(trunc(q, Q) * slope, F), the
mirror's value or one unit above, and the pieces chosen on q, exactly:
[trunc(q, Q) <= cut] = [q < (cut + 1) 2^Q].) The tests bound the effect (see
:func:`weight_tolerance`).

Every value is an integer; "fixed point with F bits" means the integer round(v * 2^F).
F = ``TrainParams.frac_bits`` (16). trunc(a, f) = a / 2^f rounded (down in the mirror).

Standardisation (D' columns carry secret power-of-two scales; standardising makes
them drop out). For each selected column r, with x the m encoded values:

1. Centre: mu = floor(S / m) (S the column sum; Step 2A already computed it for every
   column, the selected ones are picked by T). c = x - mu is an exact integer,
   |c| < 2^V. (The centred column's mean, (S mod m)/m < 1 unit, is left to the intercept.)
2. Pre-shift: c^ = trunc(c, s) (c of bit length V + 1) with the public
   s = max(0, V - floor((61 - bitlen(m)) / 2)),
   so that U = sum c^2 < 2^61 fits the 64-bit ring (s = 5, 7, 9 bits for the paper's
   shapes with V = 32). A column encoded up to the owner's target 2^23 keeps 14 to 18
   significant bits in c^; only a column whose spread is tiny against its largest
   value loses precision here, and then only in how well it is scaled: the model
   reported in original units uses the same sigma, so it stays consistent.
3. Spread: W = U + m, i.e. sigma^2 = W / m = U / m + 1 in units of 2^s encoding units
   (the + 1 keeps a constant column invertible; there c^ = 0, so its weight stays 0).
4. Inverse square root without division: E = #{t in 1..30 : W >= 4^t} (30 comparisons
   per column) gives 4^E <= W < 4^(E+1); v = trunc(W * 4^(30-E), 62 - F) lies in
   [1/4, 1); y = 1/sqrt(v) by y0 = 2.13 - 1.21 v (relative error <= 0.088) and three
   Newton steps y <- y (3 - v y^2) / 2 (relative error 7e-8, far below 2^-F).
   Then 1/sigma = sqrt(m) * y * 2^-(E+1): g = trunc(y * round(sqrt(m) 2^F), F) and
   kappa = g * 2^(30-E) = 2^(F+31) / sigma. The secret power of two is linear in the
   comparison bits b_t (telescoping: 2^(30-E) = 2^30 - sum_t b_t 2^(30-t)): exact, no
   further comparison.
5. c~ = c^ * 2^(30-E), exact (a product, no truncation): |c~| < 2^31, since
   |c^| <= sqrt(U) < sqrt(W) < 2^(E+1). The standardised value with F bits is
   z = c~ g / 2^31 = c^ kappa / 2^31 (|z| <= sqrt(m)); training never forms it: the
   scale g goes into the weights instead (per SGD step k values, not m*k once).

Training: one model per class against the rest (one model for two classes: class 1
against class 0), all updated together. A public permutation of the rows from the
job's seed (:func:`row_permutation`, affine: i -> (a i + b) mod m) is applied once;
each epoch then visits the rows in that order in batches of B (the last batch of an
epoch may be smaller). The state: w (k x n_models weights on z, F bits), w0
(intercepts), and A, the forward weights on c~: A ~ g w / 2^S_A, so that
C~ A ~ 2^(31 - S_A) Z w. Per batch of size b (C~_b its rows of c~, t targets in
{0, 2^F}, eta_b = round(lr / b * 2^20)), for all models at once:

    u = trunc(C~_b A, Q) + w0                    Q = F + 31 - S_A
    e = sig(u) - t
    h = C~_b^T e                                 exact, |h| < 2^(F+31) sqrt(b)
    w <- w - trunc(h ge, S_U)
    w0 <- w0 - trunc(colsum(e) eta_b, 20)
    A <- trunc(g w, S_A)

with the per-column step sizes ge = trunc(g eta_b, X), computed once per column and
batch size (:func:`step_sizes`), and S_U = 51 + F - X, so that trunc(h ge, S_U) is
Z_b^T e eta_b / 2^(F+20): the SGD step on z. The public shifts
(:func:`training_shifts`): S_A the smallest keeping the forward sum below 2^61 for
|z| < 2 (isqrt(m) + 1) and |w| up to the epoch's bound (:func:`check_shape`); X the
smallest keeping |h ge| below 2^61. The cost: per SGD step k n_models more values
truncated (A) than training on Z itself, against m*k truncations once to form Z.

sig is MP-SPDZ's five-piece linear approximation (``ml.approx_sigmoid(n=5)``), with its
constants rounded to F bits: 1e-4 below -5; 0.02776 u + 0.145 on [-5, -2.5);
0.17 u + 0.5 on [-2.5, 2.5]; 0.02776 u + 0.85498 on (2.5, 5]; 1 - 1e-4 above 5. The
pieces are selected by the comparisons [u <= cut] (4 per value, 48 bits).

Output in the original units (only to the model owner, masked like all outputs):
alpha_r = w_r / sigma_r per encoding unit, with ALPHA_FRAC = F + 31 fractional bits:
alpha = trunc(trunc(w * g, F) * 2^(30-E), s); the intercept
beta = w0 - sum_r trunc(w_r * ratio_r, F) with ratio = mu / sigma (F bits), computed
without leaving the ring as ratio = trunc(trunc(trunc(mu, s) * 2^(30-E), t) * g, 31 - t)
with the public t = max(0, bitlen(round(sqrt(m) 2^F)) + 1 - s), so that every product
stays below 2^62 whatever mu / sigma is. The weights are expanded to all p columns by
T (zero for the columns not selected): alpha_full = T alpha. The recipient, who knows
the selected columns and their public exponents e_j, gets the weight per real unit as
alpha_j * 2^(f + e_j - ALPHA_FRAC) and the intercept as beta * 2^-F.

Ranges, checked inside MPC (m < 2^20 and k < 2^9 are public and checked before the
run). Two checks; each reveals one public bit, "out of range", and nothing else:

- ratio (before training): a selected, non-constant column (W > m) with
  |ratio| >= 2^(F + RATIO_BITS), i.e. a mean more than 2^15 times its spread. Such a
  column's spread is a few encoding units at most (its largest value encodes near
  2^23), too little to standardise it: the run stops before the SGD. A constant column
  is exempt (its weight stays exactly 0). 3k comparisons.
- weights (after training): some |w| or |w0| >= 2^(F + weight_bits) (standardised
  units; ``TrainParams.weight_bits``, at most WEIGHT_BITS = 10) at the end of some
  epoch; 2 (k + 1) n_models comparisons per epoch, summed in secret, one bit opened.
  Within one epoch a weight moves by a bounded amount (about lr * m / b), so
  :func:`check_shape` refuses before the run any public shape whose weights could
  wrap the ring within one epoch from the checked range (none of the paper's).

With both bits 0, every truncation acts on a value below 2^62 (bit length 63) and the
comparisons of u (48 bits) are exact. The m*k truncations of the standardisation are
sized to their values' bound (``TrainConstants.centre_bits``): an engine whose
truncation costs grow with the bit length may use it. The data owner's client
also refuses a column it can see is out of range (:func:`refuse_unstandardisable`)
before anything starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ppfs.errors import InputDataError, ParameterError

if TYPE_CHECKING:
    from ppfs.fixedpoint import FixedPoint

SIGMOID = "piecewise5"  # MP-SPDZ ml.approx_sigmoid(n=5)
ETA_FRAC = 20  # fractional bits of the per-batch learning rate lr / b
INV_SHIFT = 31  # kappa = 2^(F + INV_SHIFT) / sigma
E_MAX = 30  # W < 2^62 = 4^31
NEWTON_STEPS = 3
TRUNC_BITS = 63  # every truncated value stays below 2^62
SIGMOID_BITS = 48  # bit length of the comparisons u <= cut
# sigmoid pieces: cuts and (slope, offset) in real numbers; rounded to F bits
SIGMOID_CUTS = (-5.0, -2.5, 2.5, 5.0)
SIGMOID_TAIL = 1e-4
SIGMOID_SLOPES = (0.02776, 0.17)
SIGMOID_OFFSETS = (0.145, 0.5, 0.85498)
Y0 = (2.13, 1.21)  # 1/sqrt(v) ~ 2.13 - 1.21 v on [1/4, 1)
RATIO_BITS = 15  # checked: |mu / sigma| < 2^15 for the selected non-constant columns
WEIGHT_BITS = 10  # checked: |w|, |w0| < 2^weight_bits <= 2^10 in standardised units
RANGE_CHECK_BITS = 63  # bit length of the range comparisons
UPDATE_BASE = INV_SHIFT + ETA_FRAC  # the update's shift is UPDATE_BASE + F - X


def splitmix64(state: int) -> tuple[int, int]:
    """One step of SplitMix64: (new state, output)."""
    mask = (1 << 64) - 1
    state = (state + 0x9E3779B97F4A7C15) & mask
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return state, z ^ (z >> 31)


def permutation_coefficients(m: int, seed: int) -> tuple[int, int]:
    """(a, b) of the public batch order i -> (a i + b) mod m, gcd(a, m) = 1.

    a starts near 0.618 m (consecutive positions come from rows far apart, which
    mixes data sorted by class), moved by the seed and up to the next unit mod m.
    """
    if m == 1:
        return 1, 0
    _, r1 = splitmix64(seed)
    _, r2 = splitmix64(r1)
    a = (int(0.6180339887 * m) + r1 % max(1, m // 8)) % m or 1
    while math.gcd(a, m) != 1:
        a = a % m + 1
    return a, r2 % m


def row_permutation(m: int, seed: int) -> list[int]:
    """The public batch order: position i of every epoch holds row (a i + b) mod m.

    Public and independent of the data: it reveals nothing. The engines compute the
    same affine map from (a, b) (:func:`permutation_coefficients`).
    """
    a, b = permutation_coefficients(m, seed)
    return [(a * i + b) % m for i in range(m)]


@dataclass(frozen=True)
class TrainParams:
    """Public hyperparameters of Step 2B. Travel with the job; recorded in its result."""

    epochs: int = 10
    batch: int = 32
    lr: float = 0.5
    seed: int = 0
    frac_bits: int = 16
    sigmoid: str = SIGMOID
    weight_bits: int = WEIGHT_BITS  # the run aborts if a |weight| reaches 2^weight_bits

    def __post_init__(self) -> None:
        if not 1 <= self.epochs <= 10_000:
            raise ParameterError(f"epochs must be in [1, 10000], got {self.epochs}")
        if self.batch < 1:
            raise ParameterError(f"batch size must be positive, got {self.batch}")
        if not 0.0 < self.lr <= 4.0 or not math.isfinite(self.lr):
            raise ParameterError(f"learning rate must be in (0, 4], got {self.lr}")
        if not 12 <= self.frac_bits <= 20:
            raise ParameterError(f"training fractional bits must be in [12, 20], "
                                 f"got {self.frac_bits}")
        if not 0 <= self.seed < 1 << 63:
            raise ParameterError("the batch-order seed must be in [0, 2^63)")
        if self.sigmoid != SIGMOID:
            raise ParameterError(f"unsupported sigmoid approximation {self.sigmoid!r}")
        if not 1 <= self.weight_bits <= WEIGHT_BITS:
            raise ParameterError(f"the weight range must be 2^1 to 2^{WEIGHT_BITS}, "
                                 f"got 2^{self.weight_bits}")

    def to_dict(self) -> dict[str, object]:
        return {"epochs": self.epochs, "batch": self.batch, "lr": self.lr, "seed": self.seed,
                "frac_bits": self.frac_bits, "sigmoid": self.sigmoid,
                "weight_bits": self.weight_bits}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainParams:
        return cls(int(d["epochs"]), int(d["batch"]), float(d["lr"]), int(d["seed"]),
                   int(d["frac_bits"]), str(d["sigmoid"]),
                   int(d.get("weight_bits", WEIGHT_BITS)))


@dataclass(frozen=True)
class TrainConstants:
    """Everything the engines need, derived once from (m, k, V, n, params)."""

    m: int
    k: int
    n_models: int
    frac: int
    preshift: int
    sqrt_m: int
    epochs: int
    batch: int  # effective: min(batch, m)
    full_batches: int
    last_batch: int  # 0 if m is a multiple of the batch size
    eta_full: int
    eta_last: int
    perm_a: int
    perm_b: int
    y0_a: int
    y0_b: int
    cuts: tuple[int, ...]
    tail: int
    slopes: tuple[int, ...]
    offsets: tuple[int, ...]
    ratio_shift: int  # t: mu / sigma computed as trunc(trunc(mu^ 2^(30-E), t) g, 31 - t)
    ratio_limit: int  # 2^(F + RATIO_BITS)
    weight_limit: int  # 2^(F + weight_bits)
    centre_bits: int  # bit length of c = x - mu: V + 1
    fwd_shift: int  # S_A: the forward weights are a = g w / 2^S_A
    eta_shift: int  # X: the per-column step sizes are ge = trunc(g eta, X)
    upd_shift: int  # S_U = 51 + F - X: the weights' update is trunc(h ge, S_U)
    gw_bits: int  # |g w| < 2^(gw_bits - 1) within an epoch that starts in range

    @property
    def alpha_frac(self) -> int:
        return self.frac + INV_SHIFT

    @property
    def q_shift(self) -> int:
        """Q = F + 31 - S_A: u = trunc(q, Q) for q = C~_b a + 2^Q w0."""
        return self.frac + INV_SHIFT - self.fwd_shift

    @property
    def g_bound(self) -> int:
        """g < g_bound in every engine (:func:`g_bound`)."""
        return g_bound(self.m, self.frac)

    def batches(self) -> list[tuple[int, int, int]]:
        """(first row, size, scaled learning rate) of each batch of one epoch, in order,
        over the permuted rows; the last batch may be smaller."""
        out = [(i * self.batch, self.batch, self.eta_full) for i in range(self.full_batches)]
        if self.last_batch:
            out.append((self.full_batches * self.batch, self.last_batch, self.eta_last))
        return out

    def program_args(self) -> list[int]:
        """The compile-time arguments of the MP-SPDZ program's Step 2B part, in order.

        All non-negative (compile.py would read a leading '-' as an option): the cuts
        are symmetric, so only the positive two are passed.
        """
        assert self.cuts[0] == -self.cuts[3] and self.cuts[1] == -self.cuts[2]
        return [self.n_models, self.frac, self.preshift, self.sqrt_m, self.epochs,
                self.batch, self.full_batches, self.last_batch, self.eta_full,
                self.eta_last, self.perm_a, self.perm_b, self.y0_a, self.y0_b, self.cuts[2],
                self.cuts[3],
                self.tail, *self.slopes, *self.offsets, self.ratio_shift, self.ratio_limit,
                self.weight_limit, self.centre_bits, self.fwd_shift, self.eta_shift,
                self.upd_shift, self.gw_bits]


def n_models(n_classes: int) -> int:
    return 1 if n_classes == 2 else n_classes


def preshift(m: int, value_bits: int) -> int:
    return max(0, value_bits - (61 - int(m).bit_length()) // 2)


def constants(m: int, k: int, n_classes: int, value_bits: int,
              params: TrainParams) -> TrainConstants:
    f = params.frac_bits
    b = min(params.batch, m)
    full, last = divmod(m, b)
    perm_a, perm_b = permutation_coefficients(m, params.seed)

    def fx(v: float) -> int:
        return round(v * (1 << f))

    s = preshift(m, value_bits)
    sqrt_m = fx(math.sqrt(m))
    eta_full = round(params.lr / b * (1 << ETA_FRAC))
    eta_last = round(params.lr / last * (1 << ETA_FRAC)) if last else 0
    sa, x = training_shifts(m, k, params)
    return TrainConstants(
        m=m, k=k, n_models=n_models(n_classes), frac=f, preshift=s,
        sqrt_m=sqrt_m, epochs=params.epochs, batch=b, full_batches=full,
        last_batch=last, eta_full=eta_full, eta_last=eta_last,
        perm_a=perm_a, perm_b=perm_b, y0_a=fx(Y0[0]), y0_b=fx(Y0[1]),
        cuts=tuple(fx(c) for c in SIGMOID_CUTS), tail=fx(SIGMOID_TAIL),
        slopes=tuple(fx(s) for s in SIGMOID_SLOPES),
        offsets=tuple(fx(o) for o in SIGMOID_OFFSETS),
        ratio_shift=max(0, sqrt_m.bit_length() + 1 - s),
        ratio_limit=1 << (f + RATIO_BITS), weight_limit=1 << (f + params.weight_bits),
        centre_bits=value_bits + 1, fwd_shift=sa, eta_shift=x, upd_shift=UPDATE_BASE + f - x,
        gw_bits=math.ceil(math.log2(g_bound(m, f) * weight_peak(m, params))) + f + 1,
    )


def g_bound(m: int, frac: int) -> int:
    """An upper bound on g = trunc(y round(sqrt(m) 2^F), F) in every engine: y <= 2^(F+1)
    (v >= 1/4) plus a few units of the Newton steps' probabilistic rounding."""
    sqrt_m = round(math.sqrt(m) * (1 << frac))
    return 2 * sqrt_m + (sqrt_m >> 8) + 16


def weight_peak(m: int, params: TrainParams) -> float:
    """Largest |w| (standardised units) within an epoch that starts in the checked range
    (:func:`check_shape`)."""
    b = min(params.batch, m)
    full, last = divmod(m, b)
    inv_sizes = full / b + (1 / last if last else 0.0)
    steps = full + (1 if last else 0)
    return (2.0 ** params.weight_bits + params.lr * math.sqrt(m * inv_sizes)
            + steps * 2.0 ** (2 - params.frac_bits))


def training_shifts(m: int, k: int, params: TrainParams) -> tuple[int, int]:
    """(S_A, X): the forward weights' shift and the step sizes' (module docstring).

    S_A is the smallest shift with 2^(31 - S_A) k 2 (isqrt(m) + 1) 2^(2F) w_peak <= 2^61
    (the forward sum, |z| below 2 (isqrt(m) + 1) 2^F) and Q + 2F = 3F + 31 - S_A <= 62:
    the sigmoid's linear parts from q, |q| < (5 2^F + 1) 2^Q where they count (|u| <= 5),
    times a slope below 2^(F-2), stay below 2^62. X is the smallest
    with 2^(F+31) sqrt(b) g_bound eta <= 2^61 for both batch sizes b (|h| < 2^(F+31)
    sqrt(b)).
    """
    f = params.frac_bits
    b = min(params.batch, m)
    last = m % b
    gb = g_bound(m, f)
    fwd = 2 * f - 30 + math.log2(k * 2 * (math.isqrt(m) + 1) * weight_peak(m, params))
    sa = max(0, 3 * f - 31, math.ceil(fwd))
    x = 0
    for size in (b, last):
        if size:
            eta = round(params.lr / size * (1 << ETA_FRAC))
            while size * (gb * eta) ** 2 << (2 * (f + INV_SHIFT)) > 1 << (2 * (61 + x)):
                x += 1
    return sa, x


def check_shape(m: int, k: int, params: TrainParams) -> None:
    """Refuse, before any run, a shape whose weights could wrap the ring in one epoch.

    The weights are checked at the end of every epoch (|w| < 2^weight_bits). Within an
    epoch, batch j moves a weight by at most lr / b_j * sum_{i in j} |z_i| <=
    lr * sqrt(S_j / b_j) (|e| <= 1, S_j the batch's sum of z^2), so the whole epoch by
    at most lr * sqrt(m * sum_j 1 / b_j) (Cauchy-Schwarz, sum_j S_j = m), plus two
    rounding units per step. The forward pass sums k products z * w with |z| <= sqrt(m),
    both with F fractional bits: that sum must stay below 2^62.
    """
    b = min(params.batch, m)
    full, last = divmod(m, b)
    steps = full + (1 if last else 0)
    w_peak = weight_peak(m, params)
    f = params.frac_bits
    sa, x = training_shifts(m, k, params)
    wide = (k * math.sqrt(m) * w_peak * 2.0 ** (2 * f) >= 2.0 ** 62
            or g_bound(m, f) * w_peak * 2.0 ** f >= 2.0 ** 62          # g w
            or w_peak * 2.0 ** (2 * f + INV_SHIFT - sa) >= 2.0 ** 60    # 2^Q w0
            or UPDATE_BASE + f - x < ETA_FRAC or sa >= f + INV_SHIFT)
    if wide:
        raise ParameterError(
            f"training {k} features on {m} rows in {steps} steps per epoch (lr {params.lr}) "
            f"could overflow the 64-bit fixed-point ring within one epoch; use a larger "
            f"batch, a smaller learning rate or fewer features")


# ------------------------------------------------------------------ the mirror


def trunc(a: Any, f: int) -> Any:
    """a / 2^f rounded down (object arrays of Python ints, or an int)."""
    return a >> f if f else a


def sigmoid_fx(u: np.ndarray, c: TrainConstants) -> np.ndarray:
    """The five-piece sigmoid on fixed-point integers (object array)."""
    one = 1 << c.frac
    le = [np.vectorize(lambda v, cut=cut: int(v <= cut), otypes=[object])(u) for cut in c.cuts]
    lin1 = trunc(u * c.slopes[0], c.frac)
    lin2 = trunc(u * c.slopes[1], c.frac)
    pieces = [c.tail, lin1 + c.offsets[0], lin2 + c.offsets[1], lin1 + c.offsets[2],
              one - c.tail]
    sel = [le[0], le[1] - le[0], le[2] - le[1], le[3] - le[2], 1 - le[3]]
    out: np.ndarray = sum(s * pc for s, pc in zip(sel, pieces, strict=True))
    return out


def targets(y: np.ndarray, n_classes: int, frac: int) -> np.ndarray:
    """(m, n_models) targets in {0, 2^F}: class 1 for two classes, else one per class."""
    t = (y == 1)[:, None] if n_classes == 2 else y[:, None] == np.arange(n_classes)[None, :]
    return (t.astype(np.int64) << frac).astype(object)


@dataclass(frozen=True)
class TrainReference:
    mu: np.ndarray  # (k,) integer centres
    exponent: np.ndarray  # (k,) E
    kappa: np.ndarray  # (k,) 2^(F+31) / sigma (sigma in units of 2^s)
    z: np.ndarray  # (m, k) standardised values, F bits
    weights: np.ndarray  # (k, n_models) standardised weights, F bits
    intercepts: np.ndarray  # (n_models,) F bits
    alpha: np.ndarray  # (k, n_models) weight per encoding unit, ALPHA_FRAC bits
    beta: np.ndarray  # (n_models,) intercept in original units, F bits
    ratio: np.ndarray  # (k,) mu / sigma, F bits
    steps: int
    fwd_row: float  # max over the rows of sum_r |c~_r| / 2^Q: a unit of A in u, at most
    step_rel: float  # 1 / min(ge): a unit of the step sizes relative to them
    path: int  # sum over the SGD steps of the largest |step| of a weight (units 2^-F)
    ratio_out_of_range: np.ndarray  # (k,) bool: the ratio check's flag per column
    weight_epoch: int | None  # first epoch at whose end the weight check failed

    @property
    def aborted(self) -> str | None:
        """The check that stops the run ("ratio" first, then "weights"), or None."""
        if bool(self.ratio_out_of_range.any()):
            return "ratio"
        return "weights" if self.weight_epoch is not None else None


@dataclass(frozen=True)
class Standardised:
    """Steps 1-5 and the ratio mu / sigma, as object arrays of Python ints."""

    mu: np.ndarray  # (k,)
    w: np.ndarray  # (k,) W = sum c^2 + m (W == m: a constant column)
    exponent: np.ndarray  # (k,) E
    g: np.ndarray  # (k,)
    kappa: np.ndarray  # (k,)
    ct: np.ndarray  # (m, k) c~ = c^ 2^(30-E), |c~| < 2^31: what training reads
    z: np.ndarray  # (m, k) trunc(c~ g, 31), the standardised values (for reference)
    ratio: np.ndarray  # (k,) mu / sigma, F bits

    def ratio_out_of_range(self, c: TrainConstants) -> np.ndarray:
        """The ratio check: non-constant columns with |mu / sigma| >= 2^RATIO_BITS."""
        return np.array([int(w) > c.m and abs(int(r)) >= c.ratio_limit
                         for w, r in zip(self.w, self.ratio, strict=True)], dtype=bool)


def standardise_columns(reduced: np.ndarray, c: TrainConstants) -> Standardised:
    m = c.m
    f = c.frac
    x = np.asarray(reduced).astype(object)
    mu = x.sum(axis=0) // m
    ch = trunc(x - mu[None, :], c.preshift)
    w = (ch * ch).sum(axis=0) + m
    e = np.array([sum(int(wr >= 4**t) for t in range(1, E_MAX + 1)) for wr in w], dtype=object)
    p30 = np.array([1 << (E_MAX - int(er)) for er in e], dtype=object)
    v = trunc(w * p30 * p30, 2 * E_MAX + 2 - f)
    y = c.y0_a - trunc(c.y0_b * v, f)
    for _ in range(NEWTON_STEPS):
        vy2 = trunc(v * trunc(y * y, f), f)
        y = trunc(y * (3 * (1 << f) - vy2), f + 1)
    g = trunc(y * c.sqrt_m, f)
    kappa = g * p30
    ct = ch * p30[None, :]
    z = trunc(ct * g[None, :], INV_SHIFT)
    ratio = trunc(trunc(trunc(mu, c.preshift) * p30, c.ratio_shift) * g,
                  INV_SHIFT - c.ratio_shift)
    return Standardised(mu=mu, w=w, exponent=e, g=g, kappa=kappa, ct=ct, z=z, ratio=ratio)


def standardise(reduced: np.ndarray, c: TrainConstants, value_bits: int) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps 1-5: returns (mu, E, g, kappa, z) as object arrays."""
    st = standardise_columns(reduced, c)
    return st.mu, st.exponent, st.g, st.kappa, st.z


def step_sizes(g: np.ndarray, c: TrainConstants) -> dict[int, np.ndarray]:
    """Per batch learning rate eta: the per-column step sizes ge = trunc(g eta, X), as
    object arrays."""
    return {eta: trunc(g * eta, c.eta_shift)
            for eta in {c.eta_full, *([c.eta_last] if c.last_batch else [])}}


def weights_out_of_range(weights: np.ndarray, inter: np.ndarray, c: TrainConstants) -> bool:
    """The weight check at the end of an epoch: some |w| or |w0| >= 2^weight_bits."""
    return any(abs(int(v)) >= c.weight_limit
               for v in [*np.asarray(weights).reshape(-1), *np.asarray(inter).reshape(-1)])


def mirror(reduced: np.ndarray, y: np.ndarray, n_classes: int, value_bits: int,
           params: TrainParams) -> TrainReference:
    """Step 2B in the clear on D' (raw encoded values, m x k) and the labels.

    Python integers never wrap: the mirror computes on past a failed check and
    records it (``TrainReference.aborted``), where the engines stop.
    """
    m, k = reduced.shape
    c = constants(m, k, n_classes, value_bits, params)
    f = c.frac
    st = standardise_columns(reduced, c)
    mu, e, g = st.mu, st.exponent, st.g
    t = targets(np.asarray(y), n_classes, f)
    perm = row_permutation(m, params.seed)
    cp, tp = st.ct[perm], t[perm]
    sizes = step_sizes(g, c)
    gcol = g[:, None]
    weights = np.zeros((k, c.n_models), dtype=object)
    fwd = np.zeros((k, c.n_models), dtype=object)  # A = trunc(g w, S_A)
    inter = np.zeros(c.n_models, dtype=object)
    steps = path = 0
    weight_epoch: int | None = None
    batches = c.batches()
    for epoch in range(c.epochs):
        for start, size, eta in batches:
            cb, tb = cp[start:start + size], tp[start:start + size]
            u = trunc(cb.dot(fwd), c.q_shift) + inter[None, :]
            err = sigmoid_fx(u, c) - tb
            h = cb.T.dot(err)
            step = trunc(h * sizes[eta][:, None], c.upd_shift)
            path += max(abs(int(v)) for v in step.reshape(-1))
            weights = weights - step
            inter = inter - trunc(err.sum(axis=0) * eta, ETA_FRAC)
            fwd = trunc(weights * gcol, c.fwd_shift)
            steps += 1
        if weight_epoch is None and weights_out_of_range(weights, inter, c):
            weight_epoch = epoch
    p30 = np.array([1 << (E_MAX - int(er)) for er in e], dtype=object)
    mant = trunc(weights * g[:, None], f)
    alpha = trunc(mant * p30[:, None], c.preshift)
    beta = inter - trunc(weights * st.ratio[:, None], f).sum(axis=0)
    return TrainReference(mu=mu, exponent=e, kappa=st.kappa, z=st.z, weights=weights,
                          intercepts=inter, alpha=alpha, beta=beta, ratio=st.ratio,
                          steps=steps,
                          path=path,
                          fwd_row=max(float(sum(abs(int(v)) for v in row))
                                      for row in st.ct) / 2.0 ** c.q_shift,
                          step_rel=max(1 / max(1, int(v)) for ge in sizes.values()
                                       for v in ge),
                          ratio_out_of_range=st.ratio_out_of_range(c),
                          weight_epoch=weight_epoch)


def refuse_unstandardisable(raw: np.ndarray, columns: tuple[str, ...] | list[str],
                            value_bits: int, params: TrainParams) -> None:
    """The data owner's side of the ratio check, on every column of its own data.

    Raises :class:`~ppfs.errors.InputDataError` naming the first column the secure
    ratio check would stop on if it were selected (any column may be), before
    anything is shared. The owner sees only its own plaintext here.
    """
    m, p = raw.shape
    c = constants(m, p, 2, value_bits, params)
    st = standardise_columns(raw, c)
    bad = st.ratio_out_of_range(c)
    if bad.any():
        j = int(np.argmax(bad))
        ratio = abs(int(st.ratio[j])) / 2.0 ** c.frac
        raise InputDataError(
            f"column {columns[j]!r}: its mean is about {ratio:.3g} times its spread, more "
            f"than the 2^{RATIO_BITS} = {1 << RATIO_BITS} training (Step 2B) can "
            f"standardise at this column's encoding scale; subtract a constant (e.g. its "
            f"mean) from the column first, or leave it out")


ABORT_MESSAGES = {
    "ratio": ("Step 2B stopped before training: a selected column's mean is more than "
              f"2^{RATIO_BITS} times its spread, beyond what its fixed-point encoding can "
              "standardise (only this one bit was revealed); subtract a constant such as "
              "the mean from that column, or leave it out"),
    "weights": ("Step 2B stopped after training: a model weight or intercept left the range "
                "|w| < 2^weight_bits (standardised units, 2^10 by default) its fixed-point "
                "encoding carries (only this one bit was revealed); lower the learning rate "
                "or the number of epochs"),
}


def abort_message(kind: str) -> str:
    """The one-line error for a failed range check (``kind``: "ratio" or "weights")."""
    return ABORT_MESSAGES.get(kind, "Step 2B stopped: data out of its encodable range")


# ------------------------------------------------------------------ the model


@dataclass(frozen=True)
class Model:
    """What the model owner learns: weights per real unit for all p columns."""

    classes: tuple[str, ...]
    columns: tuple[str, ...]
    weights: np.ndarray  # (n_models, p), zero for the columns not selected
    intercepts: np.ndarray  # (n_models,)
    params: TrainParams

    def decision(self, x: np.ndarray) -> np.ndarray:
        """(m, n_models) linear scores u = x w + b in original units."""
        return np.asarray(x, dtype=np.float64) @ self.weights.T + self.intercepts[None, :]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class indices: u >= 0 for two classes (sig(0) = 1/2), else argmax over models."""
        u = self.decision(x)
        if u.shape[1] == 1:
            return (u[:, 0] >= 0).astype(np.int64)
        return np.argmax(u, axis=1).astype(np.int64)

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(np.mean(self.predict(x) == np.asarray(y)))

    def to_json(self) -> dict[str, Any]:
        names = [f"class {self.classes[1]} vs {self.classes[0]}"] if len(self.classes) == 2 \
            else [f"class {c} vs rest" for c in self.classes]
        models = [
            {"target": names[i],
             "weights": {col: float(w) for col, w in zip(self.columns, self.weights[i],
                                                         strict=True)},
             "intercept": float(self.intercepts[i])}
            for i in range(self.weights.shape[0])
        ]
        out: dict[str, Any] = {
            "kind": "logistic-regression",
            "multiclass": "binary" if len(self.classes) == 2 else "one-vs-rest",
            "classes": list(self.classes),
            "sigmoid": self.params.sigmoid,
            "epochs": self.params.epochs, "batch": self.params.batch, "lr": self.params.lr,
            "seed": self.params.seed, "frac_bits": self.params.frac_bits,
        }
        out["models"] = models
        return out


def model_outputs(p: int, n_classes: int) -> int:
    """Opened words of the model: alpha_full (p x n_models, row-major), then intercepts."""
    return n_models(n_classes) * (p + 1)


def split_model_words(plain: np.ndarray, p: int, n_classes: int) -> tuple[np.ndarray,
                                                                        np.ndarray]:
    """(alpha_full (p, n_models), beta (n_models,)) from the unmasked int64 words."""
    nm = n_models(n_classes)
    words = np.asarray(plain, dtype=np.int64)
    return words[: p * nm].reshape(p, nm), words[p * nm: p * nm + nm]


def decode_model(alpha_full: np.ndarray, beta: np.ndarray, exponents: np.ndarray,
                 fp: FixedPoint, params: TrainParams, columns: tuple[str, ...],
                 classes: tuple[str, ...]) -> Model:
    """The recipient's side: weights per real unit from the opened fixed-point words."""
    alpha_frac = params.frac_bits + INV_SHIFT
    shift = (fp.frac_bits + np.asarray(exponents, dtype=np.int64) - alpha_frac).astype(np.int32)
    w = np.ldexp(np.asarray(alpha_full, dtype=np.float64), shift[:, None])  # (p, nm)
    b = np.ldexp(np.asarray(beta, dtype=np.float64), -params.frac_bits)
    return Model(classes=classes, columns=columns, weights=w.T.copy(), intercepts=b,
                 params=params)


def weight_tolerance(ref: TrainReference, params: TrainParams) -> float:
    """Bound on |w_MPC - w_mirror| (standardised units) from rounding alone, for the
    mirror's run ``ref``.

    Each probabilistic truncation in MPC differs from the mirror's (rounding down) by
    at most one unit (two for the standardisation's pre-shift in active 3PC with
    MP-SPDZ, and one for the sigmoid's linear part that MP-SPDZ takes from the
    untruncated product). The standardisation puts at most a few units into each z
    (g carries the Newton steps' errors, relative 2^-(F-3); c^ its pre-shift's, well
    below a unit of z). With k the features, z_max = max |z| and w_max = max |w|
    (standardised), per SGD step, for one weight:

    - the updates' truncations (weights and intercepts): 2 units;
    - the forward pass: u = trunc(C~_b A, Q) + w0 differs by at most
      (k + 1) (1 + w_max) units (one from its truncation, k z-errors times |w|) plus
      A's rounding, a unit of each A: at most fwd_row units (the largest sum_r |c~_r|
      / 2^Q over the rows). That moves sig by at most 0.17 times as much (the largest
      slope), sig's own rounding adds a unit, and the gradient averages b such terms
      times |z| <= z_max, scaled by lr:
      per_step = 2 + lr z_max (1 + 0.17 ((k + 1) (1 + w_max) + fwd_row)).

    The SGD map w -> w - eta grad(w) is non-expansive for the step sizes used
    (eta * 0.17 * |z|^2 < 2), so the per-step differences add at most linearly:
    steps * per_step units. The step sizes ge, where an engine's g differs from the
    mirror's, may be a unit off: step_rel (1 / min(ge)) of each step, whose sum is the
    mirror's path (the sum of its largest steps) plus at most per_step more per step.
    A piece of the sigmoid that flips at u = +-5 (where the approximation jumps by
    0.006) adds lr * 0.006 * z_max; one flip is allowed for.
    """
    f = params.frac_bits
    unit = 2.0 ** -f
    k = ref.weights.shape[0]
    z_max = float(np.abs(ref.z.astype(float)).max()) * unit
    w_max = float(np.abs(ref.weights.astype(float)).max()) * unit
    forward = (k + 1) * (1 + w_max) + ref.fwd_row
    per_step = 2 + params.lr * z_max * (1 + 0.17 * forward)
    rounding = ref.steps * per_step * (1 + ref.step_rel) + ref.step_rel * ref.path
    return rounding * unit + params.lr * 0.006 * z_max
