"""Pearson and chi-squared: the limb arithmetic, the fixed-point mirror against the
exact oracle, and the overflow bounds (m < 2^20 rows, values below 2^31)."""

import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from ppfs import oracle, scoring
from ppfs.fixedpoint import FixedPoint
from ppfs.scoring import Scorer
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table
from ppfs.table import read_csv

DATASETS = Path(os.environ.get("PPFS_DATASETS",
                               Path(__file__).resolve().parents[2] / "shared" / "datasets"))
SCORERS = [Scorer.PEARSON, Scorer.CHI2]


class CheckedOps(scoring.PlainOps):
    """The mirror's backend, asserting every bound the engines rely on."""

    def floor2(self, v, w, bits):
        assert bits <= 63 and all(abs(int(t)) < 1 << (bits - 1) for t in v)
        return super().floor2(v, w, bits)

    def is_zero(self, v, bits):
        assert all(abs(int(t)) < 1 << (bits - 1) for t in v)
        return super().is_zero(v, bits)

    def ltz(self, v, bits):
        assert bits <= 63 and all(abs(int(t)) < 1 << (bits - 2) for t in v)
        return super().ltz(v, bits)


def _limbs_value(big):
    return sum(int(v[0]) << (scoring.DIGIT_BITS * i) for i, v in enumerate(big.limbs))


def _exact_scores(raw, y, n_classes, scorer):
    x = raw.astype(np.float64)
    if scorer is Scorer.PEARSON:
        return oracle.pearson_exact(x, y, n_classes)
    m = raw.shape[0]
    d = raw.astype(object)
    gt = (m * d - d.sum(axis=0)[None, :]) > m
    out = []
    for j in range(raw.shape[1]):
        below = ~gt[:, j]
        a = int(below.sum())
        if a == m:
            out.append(Fraction(-1))
            continue
        s = Fraction(0)
        for c in range(n_classes):
            n = int((y == c).sum())
            a_c = int((below & (y == c)).sum())
            s += Fraction((m * a_c - a * n) ** 2, m * a * (m - a) * n)
        out.append(s)
    return out


@pytest.mark.parametrize("value", [-(2**31) + 1, -1234567890, 2**31 - 1, 3, 0])
def test_normalized_limbs_are_exact(value):
    ops = CheckedOps()
    big = scoring.Big([np.array([value * (2**29 - 7)], dtype=object)], [2**61]).normalized(ops)
    assert _limbs_value(big) == value * (2**29 - 7)
    assert all(0 <= int(v[0]) < 1 << scoring.DIGIT_BITS for v in big.limbs[:-1])
    sq = scoring.mul(big, big).normalized(ops)
    assert _limbs_value(sq) == (value * (2**29 - 7)) ** 2


@pytest.mark.parametrize("scorer", SCORERS)
def test_q_is_within_the_stated_bound_of_the_exact_score(scorer):
    rng = np.random.default_rng(5)
    for n_classes in (2, 3):
        raw = rng.integers(-(2**30), 2**30, size=(60, 8))
        raw[:, 3] = 7  # constant
        raw[:, 5] = raw[:, 5] >> 25  # a few distinct values
        y = rng.integers(0, n_classes, size=60)
        shape = Step2AShape(60, 8, n_classes, 3, scorer=scorer)
        q = mirror(raw, y, shape).q
        exact = _exact_scores(raw, y, n_classes, scorer)
        terms = 1 if (scorer is Scorer.PEARSON and n_classes == 2) else n_classes
        for qj, ej in zip(q, exact, strict=True):
            if ej < 0:
                assert qj == -terms
            else:
                assert abs(Fraction(qj, 2**scoring.RATIO_FRAC_BITS) - ej) <= Fraction(
                    5 * terms, 2 ** (scoring.RATIO_FRAC_BITS + 1))


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_no_overflow_at_the_bounds(scorer, n_classes, monkeypatch):
    """m = 2^20 - 1 rows, values at +-(2^31 - 1): every floor, test and comparison stays
    inside its stated bit length (CheckedOps), and q matches the exact score."""
    monkeypatch.setattr(scoring, "PlainOps", CheckedOps)
    m = (1 << 20) - 1
    rng = np.random.default_rng(7)
    lim = 2**31 - 1
    raw = np.empty((m, 4), dtype=np.int64)
    raw[:, 0] = np.where(rng.random(m) < 0.5, lim, -lim)  # extreme values
    raw[:, 1] = lim  # constant at the top
    raw[:, 2] = rng.integers(-lim, lim, size=m)
    y = rng.integers(0, n_classes, size=m)
    raw[:, 3] = np.where(y == 0, lim, -lim)  # perfectly informative
    shape = Step2AShape(m, 4, n_classes, 3, scorer=scorer)
    ref = mirror(raw, y, shape)
    assert max(ref.q) < 2**62
    exact = _exact_scores(raw, y, n_classes, scorer)
    assert list(ref.selected) == sorted(range(4), key=lambda j: (-exact[j], j))[:3]
    assert ref.selected[-1] != 1 or n_classes == 0  # the constant column is not among the top 3


def _table(n_classes, seed, m=200, p=12):
    t = make_table(m, p, n_classes=n_classes, seed=seed)
    x = t.x.copy()
    x[:, 2] = 3.5  # constant
    return type(t)(t.columns, x, t.label_column, t.classes, t.y)


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_mirror_matches_exact_oracle(scorer, n_classes, seed):
    t = _table(n_classes, seed)
    fp = FixedPoint()
    raw = fp.encode(t.x, fp.choose_exponents(t.x, t.columns), t.columns)
    for k in (1, t.p - 1):
        ref = mirror(raw, t.y, Step2AShape(t.m, t.p, n_classes, k, scorer=scorer))
        plain = oracle.scorer_top_k(scorer.value, t.x, t.y, n_classes, k)
        np.testing.assert_array_equal(ref.selected, plain)
    assert 2 not in ref.selected  # k = p - 1: the constant column, ranked last, is left out


@pytest.mark.parametrize("scorer", SCORERS)
@pytest.mark.parametrize("name, k", [("cogload", 12), ("lsvt", 103)])
def test_mirror_matches_oracle_on_paper_data(scorer, name, k):
    path = DATASETS / name / f"{name}.csv"
    if not path.exists():
        pytest.skip(f"data set not found at {path}")
    t = read_csv(path, "label")
    fp = FixedPoint()
    raw = fp.encode(t.x, fp.choose_exponents(t.x, t.columns), t.columns)
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, k, scorer=scorer))
    # Pearson is exact on the values the parties hold: LSVT has columns whose float
    # scores differ by 1e-17 and whose encodings score exactly alike (a tie, lower
    # index first). Chi-squared depends on the split only: the float data decides.
    data = raw.astype(np.float64) if scorer is Scorer.PEARSON else t.x
    np.testing.assert_array_equal(
        ref.selected, oracle.scorer_top_k(scorer.value, data, t.y, t.n_classes, k))
