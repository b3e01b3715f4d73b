"""Step 2A: what the secure computation computes, stated once for every engine.

The engines (MP-SPDZ, MPyC) implement exactly the integer algorithm below on
secret shares; :func:`mirror` runs the same algorithm in the clear on the encoded
values and so predicts the secure output bit for bit. It is the fixed-point
oracle of the tests.

Algorithm, for an (m x p) matrix D of encoded values (|D| < 2^(V-1)), labels as
the one-hot matrix L (m x (n-1)) and k:

1. Mean split: S_le = {x <= theta + 1 unit}, i.e. gt = [m*x - S > m] with S the
   column sum. Values within one encoding unit of the mean count as equal to it:
   mean-imputed cells (SPEED has thousands) *are* the mean, and without the band
   their side would be decided by rounding. Computed as x > theta' with the public
   divisor m: theta' = floor((S + m) / m) by secure long division over the p
   columns (V + 1 quotient bits; MP-SPDZ takes four per step), then one comparison
   of bit length V + 1 per entry, batched (for integer x, x > r/m <=> x > floor(r/m)).
2. Class counts by secure products (cost per output, not per instance):
   b = 1^T GT, B = L^T GT, a = m - b, A_c = colsum(L)_c - B_c, and the n-th class
   from a and b.
3. Exact score numerator and denominator as integers:
   G = m - Q with Q = AA/a + BB/b = (AA*b + BB*a) / (a*b), AA = sum_c A_c^2.
   a >= 1 always (some value is <= the mean); b = 0 exactly for a constant column,
   where Q = AA/m. Lower G is better, i.e. higher Q.
4. q = floor(Q * 2^F) by secure long division (any radix gives the same floor;
   MP-SPDZ takes four quotient bits per step), F = 62 - bitlen(m) so
   q < 2^62. q orders features exactly as Q does whenever distinct scores differ
   by more than 2^-F; exactly tied scores stay tied.
5. Oblivious top-k by ranks: one comparison per pair, rank_i = number of features
   that beat i (higher q, or equal q and lower index). T[j, r] = [rank_j == r] for
   r < k. Nobody learns a score, a rank or which feature was selected.
6. D' = D x T (exact: T is 0/1), selected index per rank idx_r = sum_j j*T[j, r].

The outputs (idx, then D' row by row) are opened only masked with random words the
result's recipient secret-shared like any input; only the recipient can unmask.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ppfs import scoring
from ppfs.errors import ParameterError
from ppfs.scoring import Scorer
from ppfs.sharing import Scheme, random_words
from ppfs.step2b import TrainConstants, TrainParams, model_outputs
from ppfs.step2b import check_shape as check_train_shape
from ppfs.step2b import constants as train_constants

# Mask words are drawn from [0, 2^MASK_WORD_BITS); a mask is w0 + 2^MASK_WORD_BITS * w1.
# Mod 2^64 that is uniform (w0 uniform on 60 bits, w1 mod 16 uniform on the top 4 bits);
# in a prime field of more than 101 bits it hides a value below 2^61 statistically.
MASK_WORD_BITS = 60
RING_BITS = 64


class Security(enum.Enum):
    PASSIVE_3PC = "passive-3pc"
    ACTIVE_3PC = "active-3pc"
    ACTIVE_4PC = "active-4pc"
    PASSIVE_4PC = "passive-4pc"  # MPyC only: MP-SPDZ's 4-party protocol is the active Rep4

    @property
    def parties(self) -> int:
        return 4 if self in (Security.ACTIVE_4PC, Security.PASSIVE_4PC) else 3

    @property
    def active(self) -> bool:
        return self in (Security.ACTIVE_3PC, Security.ACTIVE_4PC)

    @property
    def scheme(self) -> Scheme:
        return Scheme.for_parties(self.parties)


@dataclass(frozen=True)
class InputItem:
    """One input of the active settings: ``party`` inputs the sum (mod 2^64) of its
    share components ``components``."""

    party: int
    components: tuple[int, ...]


@dataclass(frozen=True)
class InputPlan:
    """How the parties' share components enter an active setting's program.

    ``items`` are input in this order, chunk by chunk; the value is the sum of the
    items in ``total``; each of ``checks`` is a signed sum of items, (item, +1 or -1)
    pairs, that is zero when every party input what it holds. The checks are opened
    before anything else, and the run stops unless all are zero. They catch any one
    party that inputs something else: for each party, the checks restricted to its
    own items form an invertible matrix mod 2 (every entry +-1 or 0), so any nonzero
    deviation of its inputs, whatever its 2-adic valuation, leaves some check
    nonzero mod 2^64.

    Active 4PC (party i holds every component but c_i): four inputs and one check
    per value, each party one input: party 0 inputs c1 + c2 + c3 and party 1 c0,
    party 2 c0 + c1 + c3 and party 3 c2; x is the first pair's sum, and the check
    is that both pairs' sums agree. Each party's input is in exactly one of the two.

    The 3PC settings have no plan: passive 3PC reads each party's components as its
    MP-SPDZ share, active 3PC reads them the same way and gives them their MACs in
    the program, where the SPDZ-wise check verifies them (ppfs.engines.mpspdz), and
    MPyC takes its inputs its own way.
    """

    items: tuple[InputItem, ...]
    total: tuple[int, ...]
    checks: tuple[tuple[tuple[int, int], ...], ...]

    def party_items(self, party: int) -> list[InputItem]:
        """The items ``party`` inputs, in program order (the order of its input file
        within each chunk)."""
        return [item for item in self.items if item.party == party]


def input_plan(security: Security) -> InputPlan:
    """The :class:`InputPlan` of ``security`` (the same as ``step2a.mpc``'s)."""
    if security is Security.ACTIVE_4PC:
        return InputPlan(
            items=(InputItem(0, (1, 2, 3)), InputItem(1, (0,)),
                   InputItem(2, (0, 1, 3)), InputItem(3, (2,))),
            total=(0, 1),
            checks=(((0, 1), (1, 1), (2, -1), (3, -1)),),
        )
    raise ParameterError(f"{security.value} inputs no share components by an input plan")


def bitlen(v: int) -> int:
    return int(v).bit_length()


@dataclass(frozen=True)
class Step2AShape:
    """Public parameters of one Step 2A run; everything the program is compiled for.

    ``reveal_reduced``: whether D' is among the outputs (the CLI, where the invoking
    user owns the data, reveals it; a training-only job for an analyst must not).
    ``train``: Step 2B's hyperparameters, or None for no training. Both are public
    and decide the program and the number of outputs, so the mirror and both
    engines agree on them.
    """

    m: int
    p: int
    n_classes: int
    k: int
    value_bits: int = 32
    reveal_reduced: bool = True
    train: TrainParams | None = field(default=None)
    scorer: Scorer = Scorer.MS_GINI

    def __post_init__(self) -> None:
        if self.m < 2:
            raise ParameterError(f"need at least 2 rows, got m={self.m}")
        if self.p < 2:
            raise ParameterError(f"need at least 2 feature columns, got p={self.p}")
        if not 1 <= self.k < self.p:
            raise ParameterError(f"k must satisfy 1 <= k < p = {self.p}, got k={self.k}")
        if self.n_classes < 2:
            raise ParameterError("the label needs at least two classes")
        if self.m >= 1 << 20:
            raise ParameterError(f"m={self.m} exceeds the supported 2^20 rows")
        if self.train is not None:
            check_train_shape(self.m, self.k, self.train)

    @property
    def threshold_offset(self) -> int:
        """B = 2^(V-1): S + m + m*B > 0, so the threshold division has a positive numerator."""
        return 1 << (self.value_bits - 1)

    @property
    def threshold_steps(self) -> int:
        """Quotient bits of floor((S + m + m*B) / m) <= 2^V + 1."""
        return self.value_bits + 1

    @property
    def threshold_bits(self) -> int:
        """Bit length for comparing the remainder with m << t in the threshold division."""
        return self.value_bits + bitlen(self.m) + 3

    @property
    def split_bits(self) -> int:
        """Bit length of theta' - x (signed). |x| <= 2^(V-1) - 1, so the mean S/m is too
        and theta' = floor(S/m) + 1 lies in [2 - 2^(V-1), 2^(V-1)]: theta' - x lies in
        [3 - 2^V, 2^V - 1], inside the V + 1 bits' [-2^V, 2^V)."""
        return self.value_bits + 1

    @property
    def score_frac_bits(self) -> int:
        return 62 - bitlen(self.m)

    @property
    def int_steps(self) -> int:
        """Integer-part steps of the long division: Q <= m < 2^bitlen(m)."""
        return bitlen(self.m)

    @property
    def div_int_bits(self) -> int:
        """Bit length for comparing r with D << t in the integer steps."""
        return min(RING_BITS - 1, 3 * bitlen(self.m) + 2)

    @property
    def div_frac_bits(self) -> int:
        """Bit length for comparing 2r with D in the fractional steps (2r < 2D <= m^2/2)."""
        return 2 * bitlen(self.m) + 2

    @property
    def rank_bits(self) -> int:
        return RING_BITS - 1

    @property
    def outputs(self) -> int:
        """Number of masked words opened: k indices, then m*k entries of D' (if
        revealed), then the model (if trained): p x n_models weights and n_models
        intercepts (:func:`ppfs.step2b.model_outputs`)."""
        return self.k + self.reduced_outputs + self.model_outputs

    @property
    def reduced_outputs(self) -> int:
        return self.m * self.k if self.reveal_reduced else 0

    @property
    def model_outputs(self) -> int:
        return model_outputs(self.p, self.n_classes) if self.train is not None else 0

    def train_constants(self) -> TrainConstants | None:
        if self.train is None:
            return None
        return train_constants(self.m, self.k, self.n_classes, self.value_bits, self.train)

    def train_args(self) -> list[str]:
        """Step 2B's part of the program arguments; empty for a plain Step 2A run."""
        c = self.train_constants()
        if c is None and self.reveal_reduced:
            return []
        return [str(int(self.reveal_reduced)), str(int(c is not None)),
                *(str(v) for v in (c.program_args() if c is not None else []))]

    def program_args(self) -> list[str]:
        """The public parameters that define the program (Step 2B's appended if any)."""
        return [str(self.m), str(self.p), str(self.n_classes), str(self.k),
                str(self.value_bits), *self.train_args()]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (job files); :meth:`from_dict` reads it back."""
        return {"m": self.m, "p": self.p, "n_classes": self.n_classes, "k": self.k,
                "value_bits": self.value_bits, "reveal_reduced": self.reveal_reduced,
                "train": self.train.to_dict() if self.train is not None else None,
                "scorer": self.scorer.value}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step2AShape:
        train = d.get("train")
        return cls(int(d["m"]), int(d["p"]), int(d["n_classes"]), int(d["k"]),
                   int(d.get("value_bits", 32)), bool(d.get("reveal_reduced", True)),
                   TrainParams.from_dict(train) if train else None,
                   Scorer(d.get("scorer", Scorer.MS_GINI.value)))


@dataclass(frozen=True)
class Step2AReference:
    q: list[int]  # scaled score numerators, higher is better
    selected: np.ndarray  # k column indices, best first
    reduced: np.ndarray  # m x k int64 raw values of D'


# Entries per block of columns in which mean_split works: bounds its temporaries
# (a few 8-byte words per entry of one block) whatever the table's size.
SPLIT_BLOCK = 1 << 22


def mirror(raw: np.ndarray, y: np.ndarray, shape: Step2AShape) -> Step2AReference:
    """The secure algorithm in the clear on encoded values: the fixed-point oracle.

    Exact integer arithmetic throughout. MS-GINI needs the mean split and counts
    only, so it runs on machine integers at any size (about one byte per entry
    beyond ``raw``); Pearson and chi-squared use Python integers.
    """
    raw = np.asarray(raw)
    y = np.asarray(y)
    p = raw.shape[1]
    gt = mean_split(raw)
    if shape.scorer is Scorer.MS_GINI:
        q = ms_gini_q(gt, y, shape)
    else:
        q = scorer_q(raw.astype(object), gt, y, shape)
    order = sorted(range(p), key=lambda j: (-q[j], j))[: shape.k]
    sel = np.array(order, dtype=np.int64)
    return Step2AReference(q=q, selected=sel, reduced=raw[:, sel].astype(np.int64))


def mean_split(raw: np.ndarray) -> np.ndarray:
    """gt = [m*x - S > m] per entry (S the column sum), as an (m, p) bool array.

    In int64, block by block of columns, when |m*x - S| <= 2 m max|x| stays below
    2^63 (always for encoded values: |x| < 2^39, m < 2^20); else in Python integers.
    """
    m, p = raw.shape
    gt = np.empty((m, p), dtype=bool)
    if raw.size == 0:
        return gt
    peak = max(int(raw.max()), -int(raw.min()))
    machine = 2 * m * peak < 1 << 63
    step = max(1, SPLIT_BLOCK // m)
    for j in range(0, p, step):
        if machine:
            x = raw[:, j : j + step].astype(np.int64)
            gt[:, j : j + step] = (m * x - x.sum(axis=0)[None, :]) > m
        else:
            d = raw[:, j : j + step].astype(object)
            gt[:, j : j + step] = (m * d - d.sum(axis=0)[None, :]) > m
    return gt


def ms_gini_q(gt: np.ndarray, y: np.ndarray, shape: Step2AShape) -> list[int]:
    """MS-GINI's q = floor(Q * 2^F) per column from the mean split (steps 2-4)."""
    m, p = gt.shape
    F = shape.score_frac_bits
    b = np.count_nonzero(gt, axis=0)
    n_c = [int(np.count_nonzero(y == c)) for c in range(shape.n_classes)]
    above_c = [np.count_nonzero(gt[y == c], axis=0) for c in range(shape.n_classes)]
    q: list[int] = []
    for j in range(p):
        bj = int(b[j])
        a = m - bj
        bb = sum(int(v[j]) ** 2 for v in above_c)
        aa = sum((n - int(v[j])) ** 2 for n, v in zip(n_c, above_c, strict=True))
        if bj == 0:
            num, den = aa, m
        else:
            num, den = aa * bj + bb * a, a * bj
        q.append((num << F) // den)
    return q


def pearson_classes(n_classes: int) -> int:
    """Classes whose one-vs-rest r^2 is summed: class 0 alone for two classes."""
    return 1 if n_classes == 2 else n_classes


def scorer_q(d: np.ndarray, gt: np.ndarray, y: np.ndarray, shape: Step2AShape) -> list[int]:
    """Pearson's or chi-squared's q per column (:mod:`ppfs.scoring`) in the clear."""
    m, p = d.shape
    ops = scoring.PlainOps()
    if shape.scorer is Scorer.PEARSON:
        classes = range(pearson_classes(shape.n_classes))
        h = d >> scoring.DIGIT_BITS
        low = d - h * (1 << scoring.DIGIT_BITS)
        parts = [(low * low).sum(axis=0), (h * low).sum(axis=0), (h * h).sum(axis=0)]
        ind = [(y == c).astype(object) * 1 for c in classes]
        t = np.concatenate([(d * yc[:, None]).sum(axis=0) for yc in ind])
        n = np.concatenate([np.full(p, int(yc.sum()), dtype=object) for yc in ind])
        c = len(ind)
        tile = [np.concatenate([v] * c) for v in (d.sum(axis=0), *parts)]
        q = scoring.pearson_q(ops, m, shape.value_bits, tile[0], (tile[1], tile[2], tile[3]),
                              t, n, np.zeros(c * p, dtype=object))
    else:
        c = shape.n_classes
        below = ~gt
        a_c = np.concatenate([(below & (y == k)[:, None]).sum(axis=0).astype(object)
                              for k in range(c)])
        a = np.concatenate([below.sum(axis=0).astype(object)] * c)
        n = np.concatenate([np.full(p, int((y == k).sum()), dtype=object) for k in range(c)])
        q = scoring.chi2_q(ops, m, a_c, a, n, np.zeros(c * p, dtype=object))
    return [int(v) for v in np.asarray(q, dtype=object).reshape(c, p).sum(axis=0)]


def mask_values(words: np.ndarray) -> np.ndarray:
    """Masks mod 2^64 from (count, 2) mask words: w0 + 2^60 * w1."""
    w = words.astype(np.uint64)
    return w[:, 0] + (w[:, 1] << np.uint64(MASK_WORD_BITS))


def draw_mask_words(count: int) -> np.ndarray:
    """(count, 2) uniform mask words below 2^MASK_WORD_BITS, from the OS CSPRNG."""
    words = random_words((count, 2)) >> np.uint64(64 - MASK_WORD_BITS)
    return words.astype(np.int64)


def unmask(
    opened: np.ndarray, words: np.ndarray, shape: Step2AShape
) -> tuple[np.ndarray, np.ndarray]:
    """Recipient side: remove the masks; returns (selected indices, D' raw m x k).

    For a shape without D' among its outputs the second item is an empty m x 0 array.
    """
    out = unmask_all(opened, words, shape)
    reduced = out.reduced if out.reduced is not None else np.zeros((shape.m, 0), np.int64)
    return out.indices, reduced


@dataclass(frozen=True)
class Unmasked:
    indices: np.ndarray  # k selected column indices, best first
    reduced: np.ndarray | None  # m x k raw D', if revealed
    model: np.ndarray | None  # the model's words (ppfs.step2b.split_model_words), if trained


def unmask_all(opened: np.ndarray, words: np.ndarray, shape: Step2AShape) -> Unmasked:
    """Recipient side: remove the masks and split the words by output."""
    plain = (np.asarray(opened, dtype=np.uint64) - mask_values(words)).view(np.int64)
    if plain.shape != (shape.outputs,):
        raise ParameterError(f"expected {shape.outputs} opened words, got {plain.size}")
    idx = plain[: shape.k]
    pos = shape.k
    reduced = None
    if shape.reveal_reduced:
        reduced = plain[pos : pos + shape.m * shape.k].reshape(shape.m, shape.k)
        pos += shape.m * shape.k
    model = plain[pos:] if shape.train is not None else None
    return Unmasked(idx, reduced, model)
