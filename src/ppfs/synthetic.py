"""Synthetic labelled data, for demos, tests and benchmarks of paper-sized shapes."""

from __future__ import annotations

import numpy as np

from ppfs.table import LabelledTable


def make_table(
    m: int,
    p: int,
    *,
    n_classes: int = 2,
    informative: int | None = None,
    seed: int = 0,
    magnitudes: bool = True,
) -> LabelledTable:
    """A table whose first ``informative`` columns shift with the class.

    With ``magnitudes`` the columns are spread over many orders of magnitude
    (1e-4 .. 1e10) and signs, as real data are.
    """
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, size=m)
    y[:n_classes] = np.arange(n_classes)  # every class present
    x = rng.normal(size=(m, p))
    inf = informative if informative is not None else max(1, p // 4)
    strength = np.linspace(1.5, 0.1, num=inf)
    x[:, :inf] += strength[None, :] * y[:, None]
    if magnitudes:
        scale = 10.0 ** rng.uniform(-4, 10, size=p)
        offset = rng.normal(size=p) * scale
        x = x * scale[None, :] + offset[None, :]
    perm = rng.permutation(p)  # informative columns not simply the first ones
    x = x[:, perm]
    columns = tuple(f"f{j:03d}" for j in range(p))
    return LabelledTable(
        columns, x, "label", tuple(str(c) for c in range(n_classes)), y.astype(np.int64)
    )
