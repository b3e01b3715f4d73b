"""The plaintext references: MS-GINI by hand, and the fixed-point mirror against it."""

from pathlib import Path

import numpy as np
import pytest

from ppfs import oracle, step2a
from ppfs.fixedpoint import FixedPoint
from ppfs.scoring import Scorer
from ppfs.step2a import Step2AShape, mirror, scorer_q
from ppfs.synthetic import make_table
from ppfs.table import read_csv

DATASETS = Path(__file__).resolve().parents[2] / "shared" / "datasets"


def test_ms_gini_by_hand():
    # column 0: mean 2.5, S_le = rows {0,1} (labels 0,0), S_gt = {2,3} (labels 1,1): pure split
    # column 1: mean 1.0, S_le = {0,1,2,3} (all equal): a constant column
    x = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]])
    y = np.array([0, 0, 1, 1])
    g = oracle.ms_gini(x, y, 2)
    # pure: 2*(1-1) + 2*(1-1) = 0; constant: 4*(1 - (0.5^2 + 0.5^2)) = 2
    np.testing.assert_allclose(g, [0.0, 2.0])
    assert list(oracle.top_k_lowest(g, 2)) == [0, 1]


def test_top_k_ties_lower_index_first():
    assert list(oracle.top_k_lowest(np.array([3.0, 1.0, 1.0, 0.5]), 3)) == [3, 1, 2]
    assert list(oracle.top_k_highest(np.array([3.0, 1.0, 3.0, 0.5]), 2)) == [0, 2]


def _mirror_selection(t, k):
    fp = FixedPoint()
    e = fp.choose_exponents(t.x, t.columns)
    raw = fp.encode(t.x, e, t.columns)
    return mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, k)), raw


@pytest.mark.parametrize("n_classes", [2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mirror_matches_float_oracle_random(n_classes, seed):
    t = make_table(300, 25, n_classes=n_classes, seed=seed)
    ref, raw = _mirror_selection(t, 10)
    plain = oracle.ms_gini_top_k(t.x, t.y, n_classes, 10)
    np.testing.assert_array_equal(ref.selected, plain)
    np.testing.assert_array_equal(ref.reduced, raw[:, plain])


def test_mirror_constant_and_tied_columns():
    t = make_table(80, 6, seed=3)
    x = t.x.copy()
    x[:, 2] = 5.0  # constant
    x[:, 4] = x[:, 1]  # exact duplicate: tied score, lower index first
    t = type(t)(t.columns, x, t.label_column, t.classes, t.y)
    ref, _ = _mirror_selection(t, 5)
    plain = oracle.ms_gini_top_k(t.x, t.y, 2, 5)
    np.testing.assert_array_equal(ref.selected, plain)
    pos = list(ref.selected)
    assert pos.index(1) < pos.index(4)


def test_mirror_no_overflow_at_100k_rows():
    t = make_table(100_000, 4, seed=4)
    ref, _ = _mirror_selection(t, 2)
    assert max(ref.q) < 2**62
    np.testing.assert_array_equal(ref.selected, oracle.ms_gini_top_k(t.x, t.y, 2, 2))


@pytest.mark.parametrize("name, k", [("cogload", 12), ("lsvt", 103), ("speed", 67)])
def test_mirror_matches_float_oracle_on_paper_data(name, k):
    path = DATASETS / name / f"{name}.csv"
    if not path.exists():
        pytest.skip(f"data set not found at {path}")
    t = read_csv(path, "label")
    ref, _ = _mirror_selection(t, k)
    plain = oracle.ms_gini_top_k(t.x, t.y, t.n_classes, k)
    np.testing.assert_array_equal(ref.selected, plain)


def test_comparison_scorers_sane():
    t = make_table(400, 8, seed=9, magnitudes=False, informative=2)
    pcc = oracle.abs_pearson(t.x, t.y)
    mi = oracle.mutual_information(t.x, t.y, 2)
    gi = oracle.gini_impurity_best_split(t.x, t.y, 2)
    ms = oracle.ms_gini(t.x, t.y, 2)
    assert np.all(gi <= ms + 1e-9)  # the best threshold is at least as good as the mean
    # the strongest column (class shift 1.5 sigma) is first for every scorer
    assert np.argmax(pcc) == np.argmax(mi) == np.argmin(gi) == np.argmin(ms)


def test_exact_ties_are_ordered_by_index_even_when_float_rounding_differs():
    # Two columns with different values but the same split counts: equal scores as
    # rationals; float64 evaluation order can make them differ in the last bit.
    rng = np.random.default_rng(11)
    y = rng.integers(0, 2, size=97)
    base = rng.normal(size=97)
    x = np.stack([base * 3.0, base, -base, base + 0.5], axis=1)
    g = oracle.ms_gini_exact(x, y, 2)
    assert g[0] == g[1] == g[2] == g[3]  # -base splits into the mirrored sides: same score
    assert list(oracle.ms_gini_top_k(x, y, 2, 3)) == [0, 1, 2]


def _mirror_q_in_python_integers(raw, y, shape):
    """The mirror's scores as first written: every step on Python integers (slow,
    memory-hungry, obviously exact); the vectorised mirror must agree bit for bit."""
    m, p = raw.shape
    d = raw.astype(object)
    gt = (m * d - d.sum(axis=0)[None, :]) > m
    if shape.scorer is not Scorer.MS_GINI:
        return scorer_q(d, gt, np.asarray(y), shape)
    q = []
    for j in range(p):
        above = gt[:, j]
        b = int(above.sum())
        a = m - b
        bb = sum(int((above & (y == c)).sum()) ** 2 for c in range(shape.n_classes))
        aa = sum(int((~above & (y == c)).sum()) ** 2 for c in range(shape.n_classes))
        num, den = (aa, m) if b == 0 else (aa * b + bb * a, a * b)
        q.append((num << shape.score_frac_bits) // den)
    return q


def _raw_cases():
    rng = np.random.default_rng(21)
    lim = 2**31 - 1
    for n in (2, 3, 5):
        t = make_table(257, 19, n_classes=n, seed=n)
        fp = FixedPoint()
        yield "encoded", fp.encode(t.x, fp.choose_exponents(t.x, t.columns), t.columns), t.y, n
    x = rng.integers(-lim, lim + 1, size=(64, 7))
    x[:, 0] = lim  # constant at the top of the range
    x[:, 1] = -lim
    x[:, 2] = x[:, 3]  # tied columns
    x[::2, 4] = lim  # extremes alternating: m*x - S at its largest
    x[1::2, 4] = -lim
    x[:, 5] = rng.integers(-2, 3, size=64)  # many entries within one unit of the mean
    yield "32-bit extremes", x, rng.integers(0, 3, size=64), 3
    yield "40-bit", rng.integers(-(2**39) + 1, 2**39, size=(300, 6)), rng.integers(0, 2, 300), 2
    yield "two rows", np.array([[5, -5, 0], [6, -5, 1]]), np.array([0, 1]), 2
    # beyond machine integers: m * x - S reaches 2^63, the Python-integer path
    yield "huge", rng.integers(-(2**61), 2**61, size=(9, 5)), np.arange(9) % 2, 2


@pytest.mark.parametrize("scorer", list(Scorer), ids=lambda s: s.value)
def test_vectorised_mirror_equals_python_integer_mirror(scorer):
    for what, raw, y, n in _raw_cases():
        if scorer is not Scorer.MS_GINI and what == "huge":
            continue  # the other scorers assume encoded values
        m, p = raw.shape
        shape = Step2AShape(m, p, n, min(3, p - 1), scorer=scorer)
        ref = mirror(raw, y, shape)
        assert ref.q == _mirror_q_in_python_integers(raw, y, shape), what
        order = sorted(range(p), key=lambda j: (-ref.q[j], j))[: shape.k]
        np.testing.assert_array_equal(ref.selected, order)
        np.testing.assert_array_equal(ref.reduced, raw[:, order])


def test_mean_split_blocks_of_columns_agree(monkeypatch):
    t = make_table(50, 40, seed=7)
    fp = FixedPoint()
    raw = fp.encode(t.x, fp.choose_exponents(t.x, t.columns), t.columns)
    whole = step2a.mean_split(raw)
    monkeypatch.setattr(step2a, "SPLIT_BLOCK", 3 * 50)  # three columns per block
    np.testing.assert_array_equal(step2a.mean_split(raw), whole)
