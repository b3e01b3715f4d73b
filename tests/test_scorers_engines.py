"""Pearson and chi-squared inside MPC: every engine and security setting selects what
the mirror and the exact oracle select (order included), on two and three classes,
with a constant column, at k = 1 and k = p - 1, and at the overflow bounds.

MPyC shapes stay tiny (m = 24, p = 4); MP-SPDZ tests skip with the reason when
MP-SPDZ is absent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from ppfs import oracle
from ppfs.engines.base import Step2AInputs
from ppfs.engines.mpspdz import MpSpdzEngine, compile_args
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.fixedpoint import FixedPoint
from ppfs.local import run_select
from ppfs.scoring import Scorer
from ppfs.sharing import bundles_for_all
from ppfs.step2a import Security, Step2AShape, draw_mask_words, mirror, unmask
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable

SCORERS = [Scorer.PEARSON, Scorer.CHI2]
MPSPDZ_SETTINGS = [Security.PASSIVE_3PC, Security.ACTIVE_3PC, Security.ACTIVE_4PC]
_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ: {_reason}")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mpspdz-cache")


def _table(m: int, p: int, n_classes: int, seed: int) -> LabelledTable:
    t = make_table(m, p, n_classes=n_classes, seed=seed)
    x = t.x.copy()
    x[:, 1] = 2.5  # a constant column: ranks last
    return LabelledTable(t.columns, x, t.label_column, t.classes, t.y)


def _check(table: LabelledTable, k: int, scorer: Scorer, security: Security, engine,
           workdir: Path) -> None:
    fp = FixedPoint()
    sel = asyncio.run(run_select(table, k, security, engine, workdir, fixed_point=fp,
                                 scorer=scorer))
    assert sel.shape.scorer is scorer
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, sel.shape)
    assert sel.indices.tolist() == ref.selected.tolist()
    np.testing.assert_array_equal(sel.reduced_raw, ref.reduced)
    expected = oracle.scorer_top_k(scorer.value, table.x, table.y, table.n_classes, k)
    assert sel.indices.tolist() == expected.tolist()
    if k == table.p - 1:
        assert 1 not in sel.indices.tolist()  # the constant column is the one left out


def _run_raw(raw: np.ndarray, y: np.ndarray, shape: Step2AShape, security: Security,
             engine, workdir: Path) -> np.ndarray:
    """Share encoded values directly (values no encoder would produce: the bounds)."""
    dirs = tuple(workdir / f"p{i}" / "inputs" for i in range(security.parties))
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    onehot = np.eye(shape.n_classes, dtype=np.int64)[y][:, : shape.n_classes - 1]
    words = draw_mask_words(shape.outputs)
    for kind, matrix in (("data", raw), ("labels", onehot), ("mask", words)):
        for i, b in enumerate(bundles_for_all(matrix, security.scheme, dataset_id="bounds",
                                              kind=kind, frac_bits=0)):
            b.save(dirs[i] / f"{kind}.shr")
    run = asyncio.run(engine.run_step2a(Step2AInputs(shape, security, dirs), workdir))
    idx, _ = unmask(run.opened, words, shape)
    return idx


def _bounds_data(m: int, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns at +-(2^31 - 1): extreme values, a constant at the top, a label copy."""
    rng = np.random.default_rng(11)
    lim = 2**31 - 1
    y = np.arange(m) % n_classes
    raw = np.empty((m, 3), dtype=np.int64)
    raw[:, 0] = np.where(rng.random(m) < 0.5, lim, -lim)
    raw[:, 1] = lim
    raw[:, 2] = np.where(y == 0, lim, -lim + (y % 2))
    return raw, y


def test_scorer_is_a_compile_time_argument() -> None:
    base = Step2AShape(50, 6, 2, 2)
    args = {s: compile_args(Step2AShape(50, 6, 2, 2, scorer=s), Security.PASSIVE_3PC)
            for s in Scorer}
    assert args[Scorer.MS_GINI] == compile_args(base, Security.PASSIVE_3PC)
    assert args[Scorer.PEARSON][-1] == "pearson" and args[Scorer.CHI2][-1] == "chi2"
    assert len({tuple(a) for a in args.values()}) == 3
    trained = Step2AShape(50, 6, 2, 2, reveal_reduced=False, scorer=Scorer.CHI2)
    assert compile_args(trained, Security.PASSIVE_3PC)[-3:] == ["0", "0", "chi2"]


def test_shape_round_trips_the_scorer() -> None:
    shape = Step2AShape(50, 6, 3, 2, scorer=Scorer.PEARSON)
    assert Step2AShape.from_dict(shape.to_dict()) == shape
    legacy = shape.to_dict()
    del legacy["scorer"]
    assert Step2AShape.from_dict(legacy).scorer is Scorer.MS_GINI


# ------------------------------------------------------------------- MP-SPDZ


@needs_mpspdz
@pytest.mark.parametrize("security", MPSPDZ_SETTINGS, ids=lambda s: s.value)
@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: s.value)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_mpspdz_matches_mirror_and_oracle(security, scorer, n_classes, cache_dir, tmp_path):
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=cache_dir, timeout=300)
    table = _table(60, 6, n_classes, seed=n_classes)
    for k in (1, table.p - 1):
        _check(table, k, scorer, security, engine, tmp_path / f"k{k}")


# Passive 3PC runs every scorer with two and with three classes at the bounds; the two
# active settings, where one run takes up to a minute, split the class counts between
# them, so each scorer also meets the bounds with two and with three classes in an active
# setting. The limbs' widths do not depend on the protocol, and each protocol's
# comparisons and truncations run at those widths in every case it runs. Every
# combination also runs at small m above.
ACTIVE_CLASSES_AT_THE_BOUNDS = {
    (Security.ACTIVE_3PC, Scorer.PEARSON): 3,
    (Security.ACTIVE_3PC, Scorer.CHI2): 2,
    (Security.ACTIVE_4PC, Scorer.PEARSON): 2,
    (Security.ACTIVE_4PC, Scorer.CHI2): 3,
}
OVERFLOW_BOUND_CASES = [
    (n_classes, scorer, security)
    for security in MPSPDZ_SETTINGS
    for scorer in SCORERS
    for n_classes in (2, 3)
    if security is Security.PASSIVE_3PC
    or ACTIVE_CLASSES_AT_THE_BOUNDS[security, scorer] == n_classes
]


@needs_mpspdz
@pytest.mark.parametrize(
    ("n_classes", "scorer", "security"), OVERFLOW_BOUND_CASES,
    ids=lambda v: v.value if isinstance(v, Scorer | Security) else str(v),
)
def test_mpspdz_at_the_overflow_bounds(security, scorer, n_classes, cache_dir, tmp_path):
    """m = 2^20 - 1 rows of values at +-(2^31 - 1), where the limbs reach their widest
    (63-bit shifts). Up to a minute each in the active settings."""
    m = (1 << 20) - 1
    raw, y = _bounds_data(m, n_classes)
    shape = Step2AShape(m, 3, n_classes, 2, reveal_reduced=False, scorer=scorer)
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=cache_dir, timeout=1800)
    idx = _run_raw(raw, y, shape, security, engine, tmp_path)
    ref = mirror(raw, y, shape)
    assert idx.tolist() == ref.selected.tolist()
    exact = (oracle.pearson_exact if scorer is Scorer.PEARSON else oracle.chi2_exact)(
        raw.astype(np.float64), y, n_classes)
    assert idx.tolist() == sorted(range(3), key=lambda j: (-exact[j], j))[:2]
    assert 1 not in idx.tolist()


@needs_mpspdz
@pytest.mark.parametrize("scorer", [Scorer.MS_GINI, Scorer.CHI2], ids=lambda s: s.value)
def test_active_3pc_direct_mean_split_at_the_value_bounds(scorer, cache_dir, tmp_path):
    """With few rows, active 3PC compares m*x with S + m directly instead of dividing
    out the threshold first (step2a.mpc, DIRECT_SPLIT): at values +-(2^31 - 1) the
    difference reaches its widest (a column at the top but for one row at the bottom)."""
    m = 45
    raw3, y = _bounds_data(m, 2)
    lim = 2**31 - 1
    raw = np.empty((m, 4), dtype=np.int64)
    raw[:, :3] = raw3
    raw[:, 3] = lim
    raw[0, 3] = -lim
    shape = Step2AShape(m, 4, 2, 2, reveal_reduced=False, scorer=scorer)
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=cache_dir, timeout=300)
    idx = _run_raw(raw, y, shape, Security.ACTIVE_3PC, engine, tmp_path)
    assert idx.tolist() == mirror(raw, y, shape).selected.tolist()


# ---------------------------------------------------------------------- MPyC


@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.PASSIVE_4PC],
                         ids=lambda s: s.value)
@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: s.value)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_mpyc_matches_mirror_and_oracle(security, scorer, n_classes, tmp_path):
    table = _table(24, 4, n_classes, seed=1)
    k = 1 if security is Security.PASSIVE_4PC else table.p - 1
    _check(table, k, scorer, security, MpycEngine(timeout=600), tmp_path)


@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.PASSIVE_4PC],
                         ids=lambda s: s.value)
@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: s.value)
def test_mpyc_other_end_of_k(security, scorer, tmp_path):
    """The k the test above does not run in this setting (k = 1 in 3PC, k = p - 1 in 4PC),
    on two classes: every setting is checked at both ends."""
    table = _table(24, 4, 2, seed=2)
    k = table.p - 1 if security is Security.PASSIVE_4PC else 1
    _check(table, k, scorer, security, MpycEngine(timeout=600), tmp_path)


@pytest.mark.parametrize("scorer", SCORERS, ids=lambda s: s.value)
def test_mpyc_at_the_value_bound(scorer, tmp_path):
    """Values at +-(2^31 - 1) (the row bound is the mirror's and MP-SPDZ's test: the
    limb arithmetic is the same code)."""
    raw, y = _bounds_data(24, 2)
    shape = Step2AShape(24, 3, 2, 2, reveal_reduced=False, scorer=scorer)
    idx = _run_raw(raw, y, shape, Security.PASSIVE_3PC, MpycEngine(timeout=600), tmp_path)
    assert idx.tolist() == mirror(raw, y, shape).selected.tolist()
    assert 1 not in idx.tolist()


def test_select_cli_scorer(tmp_path, capsys):
    """`ppfs select --scorer pearson --json` reports the scorer and its selection."""
    import json

    from ppfs_cli import main as cli

    table = _table(24, 4, 2, seed=3)
    path = tmp_path / "d.csv"
    rows = [",".join([*table.columns, "label"])]
    rows += [",".join([*(repr(float(v)) for v in r), str(table.classes[c])])
             for r, c in zip(table.x, table.y, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    code = cli.main(["select", str(path), "--label", "label", "--k", "2", "--engine", "mpyc",
                     "--scorer", "pearson", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scorer"] == "pearson"
    expected = oracle.scorer_top_k("pearson", table.x, table.y, 2, 2)
    assert out["selected"] == [table.columns[j] for j in expected]
    with pytest.raises(SystemExit) as info:
        cli.main(["select", str(path), "--label", "label", "--k", "2", "--scorer", "gini"])
    assert info.value.code == 2
