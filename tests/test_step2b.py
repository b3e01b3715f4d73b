"""Step 2B: logistic regression inside MPC against the fixed-point SGD oracle.

The oracle (:func:`ppfs.step2b.mirror`) runs the engines' integer algorithm in the
clear, rounding down where the engines truncate probabilistically; the weights are
compared in standardised units within :func:`ppfs.step2b.weight_tolerance` (its
docstring derives the bound). The oracle itself is checked against a floating-point
SGD with the same sigmoid, batch order and standardisation.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ppfs_cli.main import main

from ppfs import step2b
from ppfs.engines.mpspdz import MpSpdzEngine, compile_args
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import InputDataError, ParameterError, RangeAbortError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import Selection, prepare_inputs, run_select
from ppfs.scoring import Scorer
from ppfs.step2a import Security, Step2AShape, mirror, unmask_all
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable, read_csv

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")
SETTINGS = [Security.PASSIVE_3PC, Security.ACTIVE_3PC, Security.ACTIVE_4PC]


def _encoded(table: LabelledTable, fp: FixedPoint) -> tuple[np.ndarray, np.ndarray]:
    exps = fp.choose_exponents(table.x, table.columns)
    return fp.encode(table.x, exps, table.columns), exps


def _float_sgd(x: np.ndarray, y: np.ndarray, n_classes: int,
               params: TrainParams) -> tuple[np.ndarray, np.ndarray]:
    """Real-valued SGD: same standardisation (population std), sigmoid and batch order."""
    m = x.shape[0]
    z = (x - x.mean(axis=0)) / x.std(axis=0)
    t = step2b.targets(y, n_classes, 0).astype(float)
    perm = step2b.row_permutation(m, params.seed)
    z, t = z[perm], t[perm]
    w = np.zeros((x.shape[1], t.shape[1]))
    b = np.zeros(t.shape[1])

    def sig(u: np.ndarray) -> np.ndarray:
        return np.select([u <= -5, u <= -2.5, u <= 2.5, u <= 5],
                         [np.full_like(u, 1e-4), 0.02776 * u + 0.145, 0.17 * u + 0.5,
                          0.02776 * u + 0.85498], 1 - 1e-4)

    bs = min(params.batch, m)
    for _ in range(params.epochs):
        for s in range(0, m, bs):
            zb, tb = z[s:s + bs], t[s:s + bs]
            e = sig(zb @ w + b) - tb
            w -= params.lr / len(e) * zb.T @ e
            b -= params.lr / len(e) * e.sum(axis=0)
    return w, b


# ------------------------------------------------------------------ no MPC needed


def test_row_permutation_is_a_fixed_permutation() -> None:
    perm = step2b.row_permutation(1000, 7)
    assert sorted(perm) == list(range(1000))
    assert perm == step2b.row_permutation(1000, 7)
    assert perm != step2b.row_permutation(1000, 8)
    assert step2b.row_permutation(1, 3) == [0]


@pytest.mark.parametrize("n_classes", [2, 3])
def test_oracle_matches_real_valued_sgd(n_classes: int) -> None:
    table = make_table(300, 6, n_classes=n_classes, seed=4)
    fp = FixedPoint()
    raw, _ = _encoded(table, fp)
    params = TrainParams(epochs=4, batch=16, lr=0.5)
    ref = step2b.mirror(raw, table.y, n_classes, fp.value_bits, params)
    zf = (table.x - table.x.mean(axis=0)) / table.x.std(axis=0)
    # centring on floor(mean) shifts z by < 1 unit / sigma; sigma^2 = U/m + 1 unit^2
    assert np.abs(ref.z.astype(float) / 2**16 - zf).max() < 2e-3
    w, b = _float_sgd(table.x, table.y, n_classes, params)
    assert np.abs(ref.weights.astype(float) / 2**16 - w).max() < 0.02
    assert np.abs(ref.intercepts.astype(float) / 2**16 - b).max() < 0.02


def test_standardisation_removes_the_column_scale() -> None:
    table = make_table(200, 4, seed=5)
    fp = FixedPoint()
    raw, _ = _encoded(table, fp)
    c = step2b.constants(200, 4, 2, 32, TrainParams())
    z1 = step2b.standardise(raw, c, 32)[4].astype(float)
    z2 = step2b.standardise(raw >> np.array([0, 1, 2, 3]), c, 32)[4].astype(float)
    assert np.abs(z1 - z2).max() / 2**16 < 0.01


@pytest.mark.parametrize("m", [2, 7, 1000, 8378])
def test_standardisation_values_fit_their_bit_lengths(m: int) -> None:
    """c = x - mu stays within centre_bits (the length the MP-SPDZ program truncates it
    at), c~ below 2^31 and g below g_bound, also for the extreme columns: full
    range, one outlier (|c^| ~ sqrt(U), the largest |z|), constant, tiny spread."""
    rng = np.random.default_rng(m)
    lim = (1 << 31) - 1
    outlier = np.zeros(m, dtype=np.int64)
    outlier[m // 2] = lim
    cols = [np.where(np.arange(m) % 2 == 0, -lim - 1, lim), outlier,
            np.full(m, -lim - 1), rng.integers(-3, 3, m), rng.integers(-lim - 1, lim, m),
            (rng.standard_normal(m) * (1 << 20)).astype(np.int64)]
    raw = np.column_stack(cols).astype(np.int64)
    for f in (12, 16, 20):
        c = step2b.constants(m, raw.shape[1], 2, 32, TrainParams(frac_bits=f))
        st = step2b.standardise_columns(raw, c)
        centred = raw.astype(object) - st.mu[None, :]
        assert max(abs(int(v)) for v in centred.reshape(-1)) < 1 << (c.centre_bits - 1)
        assert max(abs(int(v)) for v in st.ct.reshape(-1)) < 1 << 31
        assert max(int(v) for v in st.g) < c.g_bound
        # z = c~ g / 2^31 stays below the forward bound's 2 (isqrt(m) + 1) 2^F
        assert max(abs(int(v)) for v in st.z.reshape(-1)) < 2 * (math.isqrt(m) + 1) << f


@pytest.mark.parametrize("m, k, batch, lr, f", [
    (2, 1, 1, 4.0, 20), (80, 3, 16, 0.5, 16), (8378, 67, 64, 0.5, 16),
    (632, 12, 32, 0.5, 12), (126, 103, 32, 0.5, 16), ((1 << 20) - 1, 2, 4096, 0.1, 20),
    (1000, 500, 7, 0.05, 16), (50, 2, 8, 0.5, 20), (24, 2, 8, 0.5, 16)])
def test_training_shifts_keep_every_value_in_the_ring(m: int, k: int, batch: int, lr: float,
                                                     f: int) -> None:
    """For shapes check_shape accepts, the worst cases of the SGD step's products stay
    below what their truncations and comparisons need: the forward sum (|z| < 2 (isqrt(m)
    + 1) 2^F, |w| up to the epoch's peak), g w, the gradient h (|h| < 2^(F+31) sqrt(b))
    times ge, the sigmoid's linear parts taken from q (MP-SPDZ: q * slope where its
    piece is selected), and the intercepts' update on the weights' shift: the update below 2^61
    (active 3PC truncates it by the top bits, trunc_near), g w below 2^(gw_bits - 1)."""
    params = TrainParams(epochs=1, batch=batch, lr=lr, frac_bits=f)
    step2b.check_shape(m, k, params)
    c = step2b.constants(m, k, 2, 32, params)
    w_peak = step2b.weight_peak(m, params) * 2.0**f
    z_bound = 2 * (math.isqrt(m) + 1) * 2.0**f
    # |c~ A| <= |c~| (g |w| / 2^S_A + 1) = |z| 2^(31 - S_A) |w| + |c~|, |c~| < 2^31
    assert k * (z_bound * 2.0 ** (31 - c.fwd_shift) * w_peak + 2.0**31) <= 2.0**61.01
    assert c.g_bound * w_peak < 2.0**62 and w_peak * 2.0**c.q_shift < 2.0**60
    assert c.g_bound * w_peak < 2.0 ** (c.gw_bits - 1)  # g w: the forward weights' trunc
    assert c.q_shift >= 1 and c.upd_shift >= step2b.ETA_FRAC
    # the sigmoid's linear parts from q where they count (|u| <= 5): q * slope < 2^62
    assert (5 * 2**f + 1) * 2**c.q_shift * max(c.slopes) < 2**62
    for _, size, eta in c.batches():
        h = 2.0 ** (f + 31) * math.sqrt(size)
        ge = c.g_bound * eta >> c.eta_shift
        assert h * ge <= 2.0**61
        assert size * 2**f * eta * 2 ** (c.upd_shift - step2b.ETA_FRAC) < 2**61
    # the intercepts' update on the weights' shift is the mirror's trunc(gb eta, 20)
    gb = np.random.default_rng(m).integers(-(1 << 30), 1 << 30, 2000).astype(object)
    eta = c.eta_full
    assert np.array_equal(_floor_div((gb * eta) << (c.upd_shift - step2b.ETA_FRAC),
                                     c.upd_shift), _floor_div(gb * eta, step2b.ETA_FRAC))


def _floor_div(a: np.ndarray, f: int) -> np.ndarray:
    return np.asarray(a, dtype=object) >> f


@pytest.mark.parametrize("f", [12, 16, 20])
def test_active_3pc_sigmoid_of_the_product(f: int) -> None:
    """MP-SPDZ's active 3PC takes the sigmoid of u = trunc(q, F) from q = Z_b W + 2^F w0
    itself: the pieces exactly as the mirror's, the value the mirror's or one unit
    above it (the linear parts as trunc(q * slope, 2F))."""
    c = step2b.constants(100, 3, 2, 32, TrainParams(frac_bits=f))
    rng = np.random.default_rng(f)
    one = 1 << f
    edges = [(cut + d) << f for cut in c.cuts for d in (0, 1)]
    q = np.array([*rng.integers(-7 << (2 * f), 7 << (2 * f), 20000).tolist(),
                  *[e + d for e in edges for d in (-1, 0, 1)],
                  *rng.integers(-(1 << 62), 1 << 62, 1000).tolist()], dtype=object)
    u = _floor_div(q, f)
    mirror = step2b.sigmoid_fx(u, c)
    le = [np.array([int(v < (cut + 1) * one) for v in q], dtype=object) for cut in c.cuts]
    assert all(np.array_equal(le_c, (u <= cut).astype(object))
               for le_c, cut in zip(le, c.cuts, strict=True))
    lin1, lin2 = (_floor_div(q * s, 2 * f) for s in c.slopes)
    sel = [le[0], le[1] - le[0], le[2] - le[1], le[3] - le[2], 1 - le[3]]
    pieces = [c.tail, lin1 + c.offsets[0], lin2 + c.offsets[1], lin1 + c.offsets[2],
              one - c.tail]
    mpc = sum(s * p for s, p in zip(sel, pieces, strict=True))
    diff = mpc - mirror
    assert set(diff.tolist()) <= {0, 1} and 1 in set(diff.tolist())


@pytest.mark.parametrize("m", [1, 21, 37, 61])
def test_active_3pc_shared_comparisons_in_the_clear(m: int) -> None:
    """The logic of the MP-SPDZ program's ltz_of_shifts (active 3PC), bit by bit in the
    clear: q's three random components (mod 2^64) carry-saved into X0 + X1, the carry into
    column m shared, each public constant K folded into the columns above m without an
    AND, and bit 63 of the rest is [q - K 2^m < 0] for every K."""
    rng = np.random.default_rng(m)
    mask = (1 << 64) - 1
    consts = [-(5 << 16) + 1, -(5 << 15) + 1, (5 << 15) + 1, (5 << 16) + 1, 0, 1, -1]
    consts = [kc for kc in consts if abs(kc) < 1 << (62 - m)]
    qs = [int(v) for v in rng.integers(-(1 << 62), 1 << 62, 300)]
    for kc in consts:
        qs += [(kc << m) + d for d in (-2, -1, 0, 1)]
    qs += [int(v) << m for v in rng.integers(-(1 << 8), 1 << 8, 100)]
    checked = 0
    for q in qs:
        for kc in consts:
            if not -(1 << 63) <= q - (kc << m) < 1 << 63:
                continue
            r = [int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2)) for _ in "ab"]
            comps = [r[0] & mask, r[1] & mask, (q - r[0] - r[1]) & mask]
            x0 = comps[0] ^ comps[1] ^ comps[2]                       # sums, 64 bits
            x1 = ((comps[0] & comps[1]) | (comps[0] & comps[2]) | (comps[1] & comps[2])) << 1
            assert (x0 + x1) & mask == q & mask
            mid = ((x0 & ((1 << m) - 1)) + (x1 & ((1 << m) - 1))) >> m
            k = (-kc << m) & mask
            s, c = [], []
            for i in range(m, 64):
                p_, g_ = ((x0 >> i) ^ (x1 >> i)) & 1, (x0 >> i) & (x1 >> i) & 1
                kb = (k >> i) & 1
                s.append(p_ ^ kb)
                c.append(g_ ^ (kb & p_))
            # columns m+1..62 of s + shifted c, carry in from column m: s_0 & mid
            a = sum(s[j] << j for j in range(1, 63 - m))
            b = sum(c[j - 1] << j for j in range(1, 63 - m))
            c63 = (a + b + ((s[0] & mid) << 1)) >> (63 - m)
            sign = s[63 - m] ^ c[62 - m] ^ c63
            assert sign == int(q - (kc << m) < 0), (q, kc)
            checked += 1
    assert checked > 500


@pytest.mark.parametrize("k, f", [(33, 5), (33, 9), (56, 31), (62, 2)])
def test_active_3pc_standardisation_mask_decodes(k: int, f: int) -> None:
    """The arithmetic of the MP-SPDZ program's trunc_many (active 3PC), in the clear:
    with R the sum of three components below 2^(n+1) (n = k + 1 - f), the opened
    t = (b + lo + 2^f R) mod 2^(k+2) and the 2-bit o + msb (1 - t's top bit) decode to
    floor(v / 2^f) - 1 to + 2."""
    rng = np.random.default_rng(k + f)
    kb = k + 1                                  # b's length, as in the program
    n = kb - f
    lim = 1 << (k - 1)
    v = [*rng.integers(-lim, lim, 20000).tolist(), -lim, lim - 1, 0, -1, 1]
    offsets = set()
    for x in v:
        lo = sum(int(r) for r in rng.integers(0, 1 << f, 3))
        big_r = sum(int(r) for r in rng.integers(0, 1 << (n + 1), 3))
        b = x + (1 << (kb - 1))
        t = (b + lo + big_r * (1 << f)) % (1 << (kb + 1))
        low = (t >> f) % (1 << n)
        top = t >> kb
        o, msb = big_r >> (n + 1), (big_r >> n) & 1
        y = o + msb * (1 - top)
        res = low - big_r + top * (1 << n) + y * (1 << (n + 1)) - (1 << (n - 1)) - 1
        offsets.add(res - (x >> f))
    assert offsets == {-1, 0, 1, 2}


@pytest.mark.parametrize("f", [8, 20, 39, 44, 60])
def test_active_3pc_truncation_by_top_bits_decodes(f: int) -> None:
    """The arithmetic of the MP-SPDZ program's trunc_near (active 3PC), in the clear:
    for |v| < 2^61 and random components of a = v + 2^61 (mod 2^64), the wraps W from
    the components' bits 62 and 63 alone ([B >= 2] + [A >= 2 or B odd]) are exact, and
    the components shifted, minus W 2^(64 - f), plus 1 are floor(v / 2^f) - 1 to + 1."""
    rng = np.random.default_rng(f)
    mask = (1 << 64) - 1
    lim = 1 << 61
    v = [*(int(x) for x in rng.integers(-lim + 1, lim, 20000)), lim - 1, -lim + 1, 0, -1, 1,
         *(int(x) << f for x in rng.integers(-(1 << (60 - f)), 1 << (60 - f), 200))]
    offsets = []
    for x in v:
        a = x + lim
        comps = [int(rng.integers(0, 1 << 63)) * 2 + int(rng.integers(0, 2)) for _ in "ab"]
        comps.append((a - comps[0] - comps[1]) & mask)
        wraps = sum(comps) >> 64
        ones = [[(c >> j) & 1 for c in comps] for j in (62, 63)]
        a_two, b_two = (int(sum(col) >= 2) for col in ones)
        b_odd = sum(ones[1]) % 2
        assert b_two + (a_two | b_odd) == wraps
        res = sum(c >> f for c in comps) - (wraps << (64 - f)) + 1 - (lim >> f)
        offsets.append(res - (x >> f))
    counts = {d: offsets.count(d) for d in set(offsets)}
    assert set(counts) == {-1, 0, 1}
    # the carry out of the low bits: 0, 1, 2 with chances near 1/6, 2/3, 1/6
    assert counts[0] > 0.6 * len(offsets) and min(counts[-1], counts[1]) > 0.12 * len(offsets)


def test_decoded_model_reproduces_the_standardised_scores() -> None:
    table = make_table(120, 5, n_classes=3, seed=6)
    fp = FixedPoint()
    raw, exps = _encoded(table, fp)
    params = TrainParams(epochs=3, batch=10)
    sel = np.array([4, 1, 2])
    ref = step2b.mirror(raw[:, sel], table.y, 3, fp.value_bits, params)
    full = np.zeros((5, 3), dtype=np.int64)
    full[sel] = ref.alpha.astype(np.int64)
    model = step2b.decode_model(full, ref.beta.astype(np.int64), exps, fp, params,
                                table.columns, table.classes)
    u_std = (ref.z.astype(float) @ ref.weights.astype(float)) / 2**32 \
        + ref.intercepts.astype(float) / 2**16
    np.testing.assert_allclose(model.decision(table.x), u_std, atol=5e-3)
    assert np.all(model.weights[:, [0, 3]] == 0)
    doc = model.to_json()
    assert doc["multiclass"] == "one-vs-rest" and len(doc["models"]) == 3
    assert set(doc["models"][0]["weights"]) == set(table.columns)


def test_shape_outputs_and_program_args() -> None:
    params = TrainParams(epochs=2, batch=8)
    plain = Step2AShape(50, 6, 3, 2)
    assert plain.train_args() == [] and plain.outputs == 2 + 100
    trained = Step2AShape(50, 6, 3, 2, train=params)
    assert trained.outputs == 2 + 100 + 3 * 7
    withheld = Step2AShape(50, 6, 2, 2, reveal_reduced=False, train=params)
    assert withheld.outputs == 2 + 7
    assert Step2AShape(50, 6, 2, 2, reveal_reduced=False).outputs == 2
    for shape in (trained, withheld):
        assert Step2AShape.from_dict(json.loads(json.dumps(shape.to_dict()))) == shape
        args = compile_args(shape, Security.ACTIVE_3PC)
        assert args[:6] == ["active-3pc", *shape.program_args()[:5]]
        assert args[14:] == shape.train_args()
        assert all(a.isdigit() for a in args[1:])  # compile.py reads '-' as an option
    assert len(trained.train_args()) == 2 + 30


def test_unmask_all_splits_the_outputs() -> None:
    shape = Step2AShape(4, 3, 2, 2, reveal_reduced=False, train=TrainParams())
    words = np.random.default_rng(0).integers(0, 1 << 60, size=(shape.outputs, 2))
    plain = np.arange(shape.outputs, dtype=np.int64) - 3
    from ppfs.step2a import mask_values

    opened = plain.astype(np.uint64) + mask_values(words)
    out = unmask_all(opened, words, shape)
    assert out.reduced is None and out.model is not None
    np.testing.assert_array_equal(out.indices, plain[:2])
    np.testing.assert_array_equal(out.model, plain[2:])


@pytest.mark.parametrize("kwargs", [{"epochs": 0}, {"batch": 0}, {"lr": 0.0}, {"lr": 9.0},
                                    {"frac_bits": 30}, {"sigmoid": "exact"}])
def test_bad_training_parameters_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ParameterError):
        TrainParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("args, message", [
    (["--weight-bits", "0"], "weight range"),
    (["--no-reduced"], "--no-reduced needs --train"),
    (["--train", "--no-reduced", "--out", "x.csv"], "--out needs D'"),
    (["--train", "--lr", "-1"], "learning rate"),
])
def test_cli_training_flags_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    args: list[str], message: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text("a,b,c,y\n" + "".join(f"{i},{i % 3},{i * i},{i % 2}\n" for i in range(20)))
    rc = main(["select", str(p), "--label", "y", "--k", "2", *args,
               "--workdir", str(tmp_path / "w")])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


# ------------------------------------------------------------------ secure runs


def _check_against_oracle(sel: Selection, table: LabelledTable, k: int,
                          params: TrainParams, scorer: Scorer = Scorer.MS_GINI) -> float:
    """Weights and intercepts of the secure run vs the oracle; returns the largest
    weight difference in standardised units."""
    fp = sel.fixed_point
    raw, _ = _encoded(table, fp)
    ref2a = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, k,
                                             fp.value_bits, scorer=scorer))
    np.testing.assert_array_equal(sel.indices, ref2a.selected)
    ref = step2b.mirror(raw[:, sel.indices], table.y, table.n_classes, fp.value_bits, params)
    assert sel.model_words is not None and sel.model is not None
    alpha_full, beta = step2b.split_model_words(sel.model_words, table.p, table.n_classes)
    unselected = np.setdiff1d(np.arange(table.p), sel.indices)
    assert np.all(alpha_full[unselected] == 0)
    c = step2b.constants(table.m, k, table.n_classes, fp.value_bits, params)
    kappa = ref.kappa.astype(float)[:, None]
    w_mpc = alpha_full[sel.indices].astype(float) * 2.0**c.preshift / kappa
    w_ref = ref.weights.astype(float) / 2**c.frac
    tol = step2b.weight_tolerance(ref, params)
    diff = float(np.abs(w_mpc - w_ref).max())
    assert diff <= tol, (diff, tol)
    ratio = np.abs(ref.ratio.astype(float)).sum() / 2**c.frac
    beta_diff = np.abs(beta.astype(float) - ref.beta.astype(float)).max() / 2**c.frac
    assert beta_diff <= tol * (1 + ratio) + 2.0**-c.frac * k, (beta_diff, tol)
    return diff


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
def test_mpspdz_training_matches_oracle(security: Security, n_classes: int,
                                        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
                                        ) -> None:
    table = make_table(80, 8, n_classes=n_classes, seed=3)
    params = TrainParams(epochs=3, batch=16, lr=0.5, seed=1)
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path_factory.getbasetemp() / "cache",
                          timeout=300)
    sel = asyncio.run(run_select(table, 3, security, engine, tmp_path, train=params))
    assert sel.reduced_raw.shape == (80, 3)
    _check_against_oracle(sel, table, 3, params)
    assert sel.model is not None and sel.model.accuracy(table.x, table.y) > 0.5


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
def test_mpspdz_training_with_twenty_fractional_bits_matches_oracle(
        security: Security, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """F = 20 on a small shape, where the forward weights' shift is the smallest: the
    sigmoid's linear parts that MP-SPDZ takes from q stay in the ring where they count
    (S_A keeps Q + 2F <= 62; with Q + F <= 61 alone, active 3PC's weights were 0.35 off
    the oracle's here, against a bound of 0.04)."""
    table = make_table(50, 4, seed=2)
    params = TrainParams(epochs=3, batch=8, lr=0.5, frac_bits=20)
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path_factory.getbasetemp() / "cache",
                          timeout=300)
    sel = asyncio.run(run_select(table, 2, security, engine, tmp_path, train=params))
    _check_against_oracle(sel, table, 2, params)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("scorer", [Scorer.PEARSON, Scorer.CHI2], ids=lambda s: s.value)
def test_mpspdz_training_after_another_scorer(scorer: Scorer, tmp_path: Path,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """Step 2B trains on the features the chosen scorer selected (Pearson computes the
    centres for training although its score needs no mean split)."""
    table = make_table(80, 8, n_classes=3, seed=3)
    params = TrainParams(epochs=3, batch=16, lr=0.5, seed=1)
    engine = MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path_factory.getbasetemp() / "cache",
                          timeout=300)
    sel = asyncio.run(run_select(table, 3, Security.PASSIVE_3PC, engine, tmp_path,
                                 train=params, scorer=scorer))
    _check_against_oracle(sel, table, 3, params, scorer)


@pytest.mark.parametrize("scorer", [Scorer.PEARSON, Scorer.CHI2], ids=lambda s: s.value)
def test_mpyc_training_after_another_scorer(scorer: Scorer, tmp_path: Path) -> None:
    table = make_table(24, 4, seed=2)
    params = TrainParams(epochs=1, batch=12, lr=0.5, seed=1)
    sel = asyncio.run(run_select(table, 2, Security.PASSIVE_3PC, MpycEngine(timeout=600),
                                 tmp_path, train=params, scorer=scorer))
    _check_against_oracle(sel, table, 2, params, scorer)


@needs_mpspdz
@pytest.mark.mpspdz
def test_mpspdz_training_only_withholds_reduced(tmp_path: Path) -> None:
    table = make_table(50, 5, seed=9)
    params = TrainParams(epochs=2, batch=20)  # last batch smaller (50 = 2 * 20 + 10)
    engine = MpSpdzEngine(mpspdz_home(), timeout=300)
    sel = asyncio.run(run_select(table, 2, Security.PASSIVE_3PC, engine, tmp_path,
                                 train=params, reveal_reduced=False))
    assert sel.run.opened.shape == (2 + 6,)
    assert sel.reduced_raw.shape == (50, 0)
    _check_against_oracle(sel, table, 2, params)


@pytest.mark.parametrize("n_classes", [2, 3], ids=["binary", "3class"])
@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.PASSIVE_4PC],
                         ids=lambda s: s.value)
def test_mpyc_training_matches_oracle(security: Security, n_classes: int,
                                      tmp_path: Path) -> None:
    table = make_table(30, 4, n_classes=n_classes, seed=2)
    params = TrainParams(epochs=1, batch=12, lr=0.5)  # batches of 12, 12, 6
    sel = asyncio.run(run_select(table, 2, security, MpycEngine(timeout=300), tmp_path,
                                 train=params, reveal_reduced=n_classes == 2))
    _check_against_oracle(sel, table, 2, params)


def test_training_only_inputs_have_one_mask_per_output(tmp_path: Path) -> None:
    table = make_table(20, 3, seed=1)
    params = TrainParams(epochs=1, batch=5)
    prep = prepare_inputs(table, 1, Security.PASSIVE_3PC, tmp_path, train=params,
                          reveal_reduced=False)
    assert prep.inputs.shape.outputs == 1 + (3 + 1)  # the index, then p weights + intercept
    assert prep.mask_words.shape == (prep.inputs.shape.outputs, 2)


def test_cli_train_json(tmp_path: Path) -> None:
    """`ppfs select --train --json` on the engine found here; the owner's accuracy."""
    p = tmp_path / "d.csv"
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        cls = i % 2
        rows.append(f"{rng.normal() + 2 * cls},{rng.normal()},{1e6 * rng.normal()},{cls}\n")
    p.write_text("a,b,c,y\n" + "".join(rows))
    engine = [] if _reason is None else ["--engine", "mpyc"]
    proc = subprocess.run(
        [sys.executable, "-m", "ppfs_cli", "select", str(p), "--label", "y", "--k", "2",
         "--train", "--epochs", "2", "--batch", "20", "--json", *engine],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    model = res["model"]
    assert model["multiclass"] == "binary" and model["epochs"] == 2
    weights = model["models"][0]["weights"]
    assert set(weights) == {"a", "b", "c"}
    unselected = {"a", "b", "c"} - set(res["selected"])
    assert all(weights[c] == 0.0 for c in unselected)
    assert "a" in res["selected"] and weights["a"] > 0
    t = read_csv(p, "y")
    x = t.x
    u = x @ np.array([weights[c] for c in t.columns]) + model["models"][0]["intercept"]
    assert res["train_accuracy"] == pytest.approx(float(np.mean((u >= 0) == t.y)))
    assert res["train_accuracy"] > 0.7


# ------------------------------------------------------------------ ranges


def _far_from_zero_table(m: int = 30) -> LabelledTable:
    """Column 'a' is 1e6 +- 3 and decides the label: MS-GINI selects it first, and
    its mean is ~4e5 times its spread (the ratio check's range is 2^15).

    The spread is wide enough that every run sees the column as non-constant: its
    centred values are 12-37 encoding units, pre-shifted by 2^4 with random rounding,
    so most stay nonzero whichever way they round (at +- 0.3 they were 1-4 units and
    could all round to 0, about one run in a hundred, exempting the column)."""
    rng = np.random.default_rng(11)
    y = np.arange(m) % 2
    x = np.column_stack([1e6 + 3.0 * (2 * y - 1) * (0.5 + rng.random(m)),
                         rng.standard_normal(m), rng.standard_normal(m)])
    return LabelledTable(("a", "b", "c"), x, "y", ("0", "1"), y)


def _separable_table(m: int = 30) -> LabelledTable:
    """Column 'a' separates the classes: SGD at lr 4 in batches of 2 drives its weight
    to ~5.9 in one epoch (a weight range of 2^2 = 4 is exceeded by a wide margin)."""
    rng = np.random.default_rng(5)
    y = np.arange(m) % 2
    rng.random(m)  # the draws _separable_table was designed with
    x = np.column_stack([(2 * y - 1) * (0.1 + rng.random(m)), rng.standard_normal(m),
                         rng.standard_normal(m)])
    return LabelledTable(("a", "b", "c"), x, "y", ("0", "1"), y)


RATIO_PARAMS = TrainParams(epochs=1, batch=10, lr=0.5)
WEIGHT_PARAMS = TrainParams(epochs=1, batch=2, lr=4.0, weight_bits=2)


def _mirror_of(table: LabelledTable, k: int, params: TrainParams) -> step2b.TrainReference:
    fp = FixedPoint()
    raw, _ = _encoded(table, fp)
    sel = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, k)).selected
    return step2b.mirror(raw[:, sel], table.y, table.n_classes, fp.value_bits, params)


def test_mirror_models_the_range_checks() -> None:
    ref = _mirror_of(_far_from_zero_table(), 2, RATIO_PARAMS)
    assert ref.aborted == "ratio"
    assert abs(int(ref.ratio[0])) >= 2 ** (16 + step2b.RATIO_BITS)  # 'a', selected first
    assert not ref.ratio_out_of_range[1]
    ref = _mirror_of(_separable_table(), 2, WEIGHT_PARAMS)
    assert ref.aborted == "weights" and ref.weight_epoch == 0
    assert float(np.abs(ref.weights.astype(float)).max()) / 2**16 > 5.0
    # the same data within the default range, and the data of the other tests: no abort
    ok = TrainParams(epochs=1, batch=2, lr=4.0)
    assert _mirror_of(_separable_table(), 2, ok).aborted is None
    assert _mirror_of(make_table(30, 4, seed=2), 2, RATIO_PARAMS).aborted is None


def test_constant_column_is_exempt_from_the_ratio_check() -> None:
    fp = FixedPoint()
    table = make_table(40, 3, seed=1)
    x = table.x.copy()
    x[:, 1] = 5.0  # constant: mean / spread is unbounded, its weight stays 0
    raw = fp.encode(x, fp.choose_exponents(x, table.columns), table.columns)
    ref = step2b.mirror(raw, table.y, 2, fp.value_bits, TrainParams(epochs=1, batch=10))
    assert ref.aborted is None and np.all(ref.weights[1] == 0)
    step2b.refuse_unstandardisable(raw, table.columns, fp.value_bits, TrainParams())


def test_owner_refuses_a_column_out_of_range() -> None:
    table = _far_from_zero_table()
    fp = FixedPoint()
    raw, _ = _encoded(table, fp)
    with pytest.raises(InputDataError, match=r"column 'a'.*times its spread"):
        step2b.refuse_unstandardisable(raw, table.columns, fp.value_bits, RATIO_PARAMS)


def test_shape_that_could_wrap_within_an_epoch_is_refused() -> None:
    with pytest.raises(ParameterError, match="overflow"):
        Step2AShape(1 << 19, 500, 2, 400, train=TrainParams(batch=1, lr=4.0))
    Step2AShape(1 << 19, 500, 2, 100, train=TrainParams(batch=64, lr=0.5))


@pytest.mark.parametrize("engine", ["mpyc", "mp-spdz"])
def test_cli_refuses_far_from_zero_column(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          engine: str) -> None:
    """`ppfs select --train`: exit 2 with one line naming the column, before any MPC."""
    if engine == "mp-spdz" and _reason is not None:
        pytest.skip(f"MP-SPDZ not available: {_reason}")
    table = _far_from_zero_table()
    p = tmp_path / "d.csv"
    p.write_text("a,b,c,y\n" + "".join(
        ",".join(repr(float(v)) for v in r) + f",{c}\n"
        for r, c in zip(table.x, table.y, strict=True)))
    rc = main(["select", str(p), "--label", "y", "--k", "2", "--train", "--epochs", "1",
               "--engine", engine, "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "column 'a'" in err[-1] and "times its spread" in err[-1]
    assert not list((tmp_path / "w").glob("p*/inputs/*.shr"))  # nothing was shared


@pytest.mark.parametrize("engine", ["mpyc", "mp-spdz"])
def test_cli_weight_out_of_range_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         engine: str) -> None:
    """`ppfs select --train`: a weight past its range stops the secure run (one bit)."""
    if engine == "mp-spdz" and _reason is not None:
        pytest.skip(f"MP-SPDZ not available: {_reason}")
    table = _separable_table()
    assert _mirror_of(table, 2, WEIGHT_PARAMS).aborted == "weights"
    p = tmp_path / "d.csv"
    p.write_text("a,b,c,y\n" + "".join(
        ",".join(repr(float(v)) for v in r) + f",{c}\n"
        for r, c in zip(table.x, table.y, strict=True)))
    rc = main(["select", str(p), "--label", "y", "--k", "2", "--train", "--epochs", "1",
               "--batch", "2", "--lr", "4", "--weight-bits", "2", "--engine", engine])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1] == f"ppfs: error: {step2b.abort_message('weights')}"


def _secure_abort(table: LabelledTable, params: TrainParams, engine: object,
                  security: Security, tmp_path: Path) -> str:
    with pytest.raises(RangeAbortError) as info:
        asyncio.run(run_select(table, 2, security, engine, tmp_path,  # type: ignore[arg-type]
                               train=params, refuse_out_of_range=False))
    msg = str(info.value)
    assert "\n" not in msg and "only this one bit was revealed" in msg
    return msg


@pytest.mark.parametrize("case", ["ratio", "weights"])
def test_mpyc_range_checks_match_the_mirror(case: str, tmp_path: Path) -> None:
    table, params = ((_far_from_zero_table(), RATIO_PARAMS) if case == "ratio"
                     else (_separable_table(), WEIGHT_PARAMS))
    assert _mirror_of(table, 2, params).aborted == case
    msg = _secure_abort(table, params, MpycEngine(timeout=300), Security.PASSIVE_3PC, tmp_path)
    assert msg == step2b.abort_message(case)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("case", ["ratio", "weights"])
@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
def test_mpspdz_range_checks_match_the_mirror(case: str, security: Security,
                                              tmp_path: Path) -> None:
    table, params = ((_far_from_zero_table(), RATIO_PARAMS) if case == "ratio"
                     else (_separable_table(), WEIGHT_PARAMS))
    assert _mirror_of(table, 2, params).aborted == case
    msg = _secure_abort(table, params, MpSpdzEngine(mpspdz_home(), timeout=300), security,
                        tmp_path)
    assert msg == step2b.abort_message(case)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.ACTIVE_3PC],
                         ids=lambda s: s.value)
def test_mpspdz_separable_data_in_range_matches_oracle(security: Security,
                                                       tmp_path: Path) -> None:
    """The weight-check data within the default range trains, matching the oracle (in
    active 3PC with the update in two truncations: lr / b = 2, eta = 2^21 > 2^20)."""
    table = _separable_table()
    params = TrainParams(epochs=1, batch=2, lr=4.0)
    sel = asyncio.run(run_select(table, 2, security,
                                 MpSpdzEngine(mpspdz_home(), timeout=300), tmp_path,
                                 train=params))
    _check_against_oracle(sel, table, 2, params)


_WEIGHT_CHECK_HELPER = r'''
import json, sys
import numpy as np
from ppfs.engines import mpyc_party as mp

runtime = mp.import_mpyc_runtime()
saved, sys.argv = sys.argv, [sys.argv[0], "-M1", "--no-log", "-K", str(mp.STATISTICAL_SECURITY)]
rt = runtime.setup()
sys.argv = saved
secint = mp.make_secint(rt)
limit, w, b, a = json.loads(sys.argv[1])

async def main():
    await rt.start()
    arr = lambda v: secint.array(np.array(v, dtype=object))
    bad, w2, b2, a2 = await mp.weight_check(rt, secint, limit, arr(w), arr(b), arr(a))
    out = [int(await rt.output(bad))]
    for v in (w2, b2, a2):
        out.append([int(x) for x in (await rt.output(v)).reshape(-1)])
    print(json.dumps(out))
    await rt.shutdown()

rt.run(main())
'''


def test_mpyc_weight_check_zeroes_what_it_finds_out_of_range(tmp_path: Path) -> None:
    """MPyC masks an opened value statistically, 2^40 times the largest value the opening
    is sized for: after an epoch whose weight check fails (the run stops once training
    ends), the weights out of range are set to zero, so that the epochs still to run stay
    within those sizes however far the weights strayed; in range nothing changes."""
    limit = 1 << 20
    weights = [[0, limit - 1], [-(limit - 1), limit], [-limit, 5]]
    inter = [1 << 40, -3]
    fwd = [[11, 12], [13, 14], [15, 16]]
    helper = tmp_path / "weight_check.py"
    helper.write_text(_WEIGHT_CHECK_HELPER)
    out = subprocess.run([sys.executable, str(helper), json.dumps([limit, weights, inter, fwd])],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("["))  # not MPyC's log
    bad, w2, b2, a2 = json.loads(line)
    assert bad == 3                                   # limit, -limit, 2^40
    assert w2 == [0, limit - 1, -(limit - 1), 0, 0, 5]
    assert b2 == [0, -3]
    assert a2 == [11, 12, 13, 0, 0, 16]               # follow their weights
