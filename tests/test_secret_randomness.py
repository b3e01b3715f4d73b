"""Every secret (share component, mask word) comes from the OS CSPRNG, never numpy.

numpy's generators are patched to raise, then an upload, a job submitted with fresh
masks and ``ppfs select`` run, and must succeed. One use stays allowed: a seeded
``default_rng`` called from :mod:`ppfs.synthetic`, which makes the public synthetic
test tables. Step 2B's public batch order needs no exception: it is an affine map of
the job's public seed (:func:`ppfs.step2b.row_permutation`), not a numpy generator.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ppfs_cli.main import main
from service_fakes import Stack, horizontal_setup

from ppfs import oracle
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table

# the legacy module-level functions (bound methods of numpy's global RandomState)
LEGACY = (
    "bytes", "choice", "integers", "normal", "permutation", "rand", "randint", "randn",
    "random", "random_integers", "random_sample", "ranf", "sample", "seed", "shuffle",
    "uniform", "standard_normal", "binomial", "poisson", "exponential", "get_state",
)
# constructors of generators and bit generators
CONSTRUCTORS = ("Generator", "RandomState", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
OWN_PACKAGES = ("ppfs", "ppfs_client", "ppfs_gateway", "ppfs_party")


class NumpyRandomUsed(AssertionError):
    pass


def _refuse(name: str) -> Any:
    def refuse(*_a: Any, **_k: Any) -> Any:
        raise NumpyRandomUsed(f"np.random.{name} used where a secret is drawn")

    return refuse


@pytest.fixture
def no_numpy_random(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """numpy's generators raise; the list collects what was attempted (threads too)."""
    attempts: list[str] = []
    real_generator, real_pcg64 = np.random.Generator, np.random.PCG64

    def default_rng(seed: Any = None) -> np.random.Generator:
        caller = sys._getframe(1).f_globals.get("__name__")
        if seed is not None and caller == "ppfs.synthetic":
            return real_generator(real_pcg64(seed))  # public synthetic test data
        attempts.append(f"default_rng from {caller}")
        raise NumpyRandomUsed(f"np.random.default_rng({seed!r}) called from {caller}")

    monkeypatch.setattr(np.random, "default_rng", default_rng)
    for name in LEGACY + CONSTRUCTORS:
        if hasattr(np.random, name):
            monkeypatch.setattr(np.random, name, _refuse(name))
    # no generator made before the patch may hide in one of the project's modules
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.split(".")[0] in OWN_PACKAGES:
            for attr, value in vars(mod).items():
                assert not isinstance(
                    value, np.random.bit_generator.BitGenerator | np.random.mtrand.RandomState
                ), f"{mod_name}.{attr}"
                assert type(value).__name__ != "Generator", f"{mod_name}.{attr}"
    yield attempts


def test_patch_refuses_unseeded_and_legacy_use(no_numpy_random: list[str]) -> None:
    with pytest.raises(NumpyRandomUsed):
        np.random.default_rng()
    with pytest.raises(NumpyRandomUsed):
        np.random.default_rng(5)  # seeded, but not from the synthetic-data module
    with pytest.raises(NumpyRandomUsed):
        np.random.randint(0, 10)
    with pytest.raises(NumpyRandomUsed):
        np.random.Generator(None)
    assert make_table(5, 2, seed=1).m == 5


def test_upload_and_masked_submit_draw_no_numpy_randomness(
    no_numpy_random: list[str], stack: Stack
) -> None:
    t, ids, raw = horizontal_setup(stack)  # two uploads, shared by the client
    analyst = stack.client("analyst-1")
    keys = stack.keys["analyst-1"]
    job = analyst.submit(keys, ids, label="label", k=2, engine="mpyc")  # fresh masks
    states = [ev["state"] for ev in analyst.events(job["id"])]
    assert states[-1] == "succeeded", states
    got = analyst.fetch_result(keys, job["id"])
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, 2))
    assert got.indices.tolist() == ref.selected.tolist()
    assert no_numpy_random == []


def test_select_draws_no_numpy_randomness(
    no_numpy_random: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = make_table(24, 3, seed=13)
    csv = tmp_path / "t.csv"
    lines = [",".join([*t.columns, "y"])]
    lines += [",".join([*(repr(float(v)) for v in t.x[i]), str(t.y[i])]) for i in range(t.m)]
    csv.write_text("\n".join(lines) + "\n")
    rc = main(["select", str(csv), "--label", "y", "--k", "1", "--engine", "mpyc", "--json",
               "--workdir", str(tmp_path / "w")])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    assert no_numpy_random == []
    res = json.loads(out)
    plain = oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 1)
    assert res["selected"] == [t.columns[j] for j in plain]
