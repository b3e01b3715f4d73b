"""Plaintext reference scorers (numpy). Every secure result is tested against these.

``ms_gini`` is the paper's mean-split Gini score exactly as defined (Sec. IV.B):
theta is the column mean, S_le = {x <= theta}, S_gt = {x > theta},
G = |S_le| G(S_le) + |S_gt| G(S_gt) with the 1/m factor dropped; lower is better.
GI, PCC and MI are the comparison scorers of the paper's Table 1.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

# Relative to a column's largest magnitude, a value this close to the column mean
# counts as equal to it. Data sets with mean-imputed cells (SPEED) hold thousands of
# values that equal the mean mathematically but differ from a float64 mean by
# rounding noise; without the band the split of those rows is decided by that noise.
TIE_TOLERANCE = 1e-9


def _mean_split(x: np.ndarray) -> np.ndarray:
    theta = x.mean(axis=0)
    band = TIE_TOLERANCE * np.abs(x).max(axis=0, initial=0.0)
    return x > (theta + band)[None, :]


def ms_gini(x: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """MS-GINI score per column of ``x`` (m x p floats); lower is better.

    Float64: scores that are equal as rationals can differ here by rounding (1e-14),
    so rank with :func:`ms_gini_top_k`, which compares them exactly.
    """
    m = x.shape[0]
    gt = _mean_split(x)
    onehot = np.eye(n_classes, dtype=np.float64)[y]  # m x n
    b_counts = onehot.T @ gt.astype(np.float64)  # n x p
    a_counts = onehot.sum(axis=0)[:, None] - b_counts
    b = b_counts.sum(axis=0)
    a = m - b
    with np.errstate(divide="ignore", invalid="ignore"):
        ga = np.where(a > 0, a - (a_counts**2).sum(axis=0) / np.where(a > 0, a, 1), 0.0)
        gb = np.where(b > 0, b - (b_counts**2).sum(axis=0) / np.where(b > 0, b, 1), 0.0)
    return ga + gb


def ms_gini_exact(x: np.ndarray, y: np.ndarray, n_classes: int) -> list[Fraction]:
    """MS-GINI as exact rationals: the counts are integers, so G = a - AA/a + b - BB/b is too."""
    m = x.shape[0]
    gt = _mean_split(x)
    onehot = np.eye(n_classes, dtype=np.int64)[y]
    b_counts = onehot.T @ gt.astype(np.int64)  # n x p, exact
    a_counts = onehot.sum(axis=0)[:, None] - b_counts
    out = []
    for j in range(x.shape[1]):
        b = int(b_counts[:, j].sum())
        a = m - b
        g = Fraction(0)
        if a:
            g += a - Fraction(int((a_counts[:, j] ** 2).sum()), a)
        if b:
            g += b - Fraction(int((b_counts[:, j] ** 2).sum()), b)
        out.append(g)
    return out


def ms_gini_top_k(x: np.ndarray, y: np.ndarray, n_classes: int, k: int) -> np.ndarray:
    """The k best columns by MS-GINI, best first, exact ties to the lower index."""
    g = ms_gini_exact(x, y, n_classes)
    return np.array(sorted(range(len(g)), key=lambda j: (g[j], j))[:k], dtype=np.int64)


def top_k_lowest(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k lowest scores, best first; ties go to the lower index."""
    order = np.lexsort((np.arange(len(scores)), scores))
    return order[:k]


def top_k_highest(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k highest scores, best first; ties go to the lower index."""
    order = np.lexsort((np.arange(len(scores)), -np.asarray(scores, dtype=np.float64)))
    return order[:k]


def gini_impurity_best_split(x: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """GI: weighted Gini impurity at the best threshold over sorted candidate splits.

    Returned in the same unit as :func:`ms_gini` (sum over both sides, no 1/m); lower
    is better.
    """
    m, p = x.shape
    out = np.empty(p)
    onehot = np.eye(n_classes)[y]
    total = onehot.sum(axis=0)
    for j in range(p):
        order = np.argsort(x[:, j], kind="stable")
        xs = x[order, j]
        left = np.cumsum(onehot[order], axis=0)[:-1]  # counts in the first i+1 rows
        sizes = np.arange(1, m)
        right = total[None, :] - left
        valid = xs[1:] != xs[:-1]  # a split only between distinct values
        g_left = sizes - (left**2).sum(axis=1) / sizes
        g_right = (m - sizes) - (right**2).sum(axis=1) / (m - sizes)
        g = g_left + g_right
        out[j] = g[valid].min() if valid.any() else m - (total**2).sum() / m
    return out


def abs_pearson(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """PCC: |Pearson correlation| of each column with the label; higher is better."""
    xc = x - x.mean(axis=0)
    yc = y.astype(np.float64) - y.mean()
    den = np.sqrt((xc**2).sum(axis=0) * (yc**2).sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, (xc * yc[:, None]).sum(axis=0) / np.where(den > 0, den, 1), 0.0)
    return np.abs(r)


def mutual_information(x: np.ndarray, y: np.ndarray, n_classes: int, bins: int = 10) -> np.ndarray:
    """MI between each column (equal-frequency binned) and the label; higher is better."""
    m, p = x.shape
    out = np.empty(p)
    py = np.bincount(y, minlength=n_classes) / m
    for j in range(p):
        edges = np.unique(np.quantile(x[:, j], np.linspace(0, 1, bins + 1)[1:-1]))
        xb = np.searchsorted(edges, x[:, j], side="right")
        joint = np.zeros((len(edges) + 1, n_classes))
        np.add.at(joint, (xb, y), 1.0)
        joint /= m
        px = joint.sum(axis=1)
        nz = joint > 0
        out[j] = (joint[nz] * np.log(joint[nz] / (px[:, None] * py[None, :])[nz])).sum()
    return out


def _exact_ints(col: np.ndarray) -> list[int]:
    """A float column as integers, all scaled by one power of two (exact)."""
    ratios = [float(v).as_integer_ratio() for v in col]
    shift = max(d.bit_length() - 1 for _, d in ratios)
    return [n << (shift - (d.bit_length() - 1)) for n, d in ratios]


def pearson_classes(n_classes: int) -> list[int]:
    """Classes whose one-vs-rest r^2 is summed: class 0 alone for two classes (the
    label as 0/1), every class otherwise."""
    return [0] if n_classes == 2 else list(range(n_classes))


def pearson_exact(x: np.ndarray, y: np.ndarray, n_classes: int) -> list[Fraction]:
    """Pearson score per column as exact rationals: sum over one-vs-rest classes of
    r_c^2 (:func:`pearson_classes`); -1 for a constant column (ranks last)."""
    m = x.shape[0]
    y = np.asarray(y)
    out = []
    for j in range(x.shape[1]):
        v = _exact_ints(x[:, j])
        s = sum(v)
        vx = m * sum(t * t for t in v) - s * s
        if vx == 0:
            out.append(Fraction(-1))
            continue
        score = Fraction(0)
        for c in pearson_classes(n_classes):
            ind = y == c
            n = int(ind.sum())
            vy = n * (m - n)
            if vy == 0:
                continue
            t = sum(val for val, i in zip(v, ind, strict=True) if i)
            score += Fraction((m * t - s * n) ** 2, vx * vy)
        out.append(score)
    return out


def chi2_exact(x: np.ndarray, y: np.ndarray, n_classes: int) -> list[Fraction]:
    """Pearson's chi-squared of the mean split's 2 x n table, divided by m, as exact
    rationals; -1 for a constant column (no split; ranks last)."""
    m = x.shape[0]
    gt = _mean_split(x)
    y = np.asarray(y)
    out = []
    for j in range(x.shape[1]):
        below = ~gt[:, j]
        a = int(below.sum())
        b = m - a
        if b == 0:
            out.append(Fraction(-1))
            continue
        score = Fraction(0)
        for c in range(n_classes):
            n = int((y == c).sum())
            if n == 0:
                continue
            a_c = int((below & (y == c)).sum())
            score += Fraction((m * a_c - a * n) ** 2, m * a * b * n)
        out.append(score)
    return out


def scorer_top_k(scorer: str, x: np.ndarray, y: np.ndarray, n_classes: int, k: int) -> np.ndarray:
    """The k best columns by ``scorer`` (ms-gini, pearson, chi2), best first, exact
    ties to the lower index."""
    if scorer == "ms-gini":
        return ms_gini_top_k(x, y, n_classes, k)
    scores = (pearson_exact if scorer == "pearson" else chi2_exact)(x, y, n_classes)
    return np.array(sorted(range(len(scores)), key=lambda j: (-scores[j], j))[:k],
                    dtype=np.int64)
