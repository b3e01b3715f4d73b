"""The MPyC workers draw no secret from Python's ``random`` or numpy's generators.

MPyC splits inputs into Shamir shares, draws its PRSS keys and, without PRSS, its
random masks; a Mersenne Twister (``random``) or numpy generator there would make a
long run of shares predictable. The workers are processes of their own, so the
patch of ``test_secret_randomness.py`` does not reach them: here a ``sitecustomize``
on their PYTHONPATH wraps every drawing function of ``random`` (module and
``random.Random``, not ``SystemRandom``) and of ``numpy.random``, and records which
module called it. A run must match the mirror and the oracle, and nothing in
``mpyc`` or ``ppfs`` may have drawn from them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.fixedpoint import FixedPoint
from ppfs.local import run_select
from ppfs.oracle import ms_gini_top_k
from ppfs.step2a import Security, Step2AShape, mirror
from ppfs.synthetic import make_table

SITECUSTOMIZE = '''
import os, random, sys
_LOG = os.environ.get("PPFS_RANDOM_LOG")

def _note(what):
    caller = sys._getframe(2).f_globals.get("__name__", "?")
    with open(_LOG, "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {what} {caller}\\n")

def _module_fn(name, real):
    def fn(*a, **k):
        _note("random." + name)
        return real(*a, **k)
    return fn

def _method(name, real):
    def fn(self, *a, **k):
        if not isinstance(self, random.SystemRandom):
            _note("random.Random." + name)
        return real(self, *a, **k)
    return fn

if _LOG:
    NAMES = ("random", "getrandbits", "randrange", "randint", "choice", "choices",
             "shuffle", "sample", "uniform", "randbytes", "gauss", "seed", "_randbelow")
    for _n in NAMES:
        if hasattr(random, _n):
            setattr(random, _n, _module_fn(_n, getattr(random, _n)))
        if hasattr(random.Random, _n):
            setattr(random.Random, _n, _method(_n, getattr(random.Random, _n)))
    import numpy.random as _npr
    for _n in ("default_rng", "random", "randint", "integers",
               "bytes", "choice", "permutation", "shuffle", "rand", "randn", "seed",
               "uniform", "normal", "random_sample"):
        if hasattr(_npr, _n):
            setattr(_npr, _n, _module_fn("numpy." + _n, getattr(_npr, _n)))
    _note("loaded")
'''


def _draws(log: Path) -> list[tuple[int, str, str]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        pid, what, caller = line.split(" ", 2)
        out.append((int(pid), what, caller))
    return out


@pytest.fixture
def watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "draws.log"
    monkeypatch.setenv("PPFS_RANDOM_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", str(site))
    return log


def test_the_watch_records_a_draw(watched: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "import random, numpy.random as r; random.random(); random.Random(1).choice([1]); " \
           "r.default_rng(); random.SystemRandom().choice([1])"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    what = [w for _, w, caller in _draws(watched) if caller == "__main__"]
    assert what == ["random.random", "random.Random.choice", "random.numpy.default_rng"]


def test_mpyc_workers_draw_nothing_from_random_or_numpy(watched: Path, tmp_path: Path) -> None:
    table = make_table(40, 6, seed=8)
    k = 2
    sel = asyncio.run(run_select(table, k, Security.PASSIVE_3PC, MpycEngine(timeout=120),
                                 tmp_path / "run"))
    fp = FixedPoint()
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, k))
    np.testing.assert_array_equal(sel.indices, ref.selected)
    np.testing.assert_array_equal(sel.reduced_raw, ref.reduced)
    assert sel.indices.tolist() == ms_gini_top_k(table.x, table.y, table.n_classes, k).tolist()
    workers = {int((tmp_path / "run" / "mpyc" / f"P{i}" / "worker.pid").read_text())
               for i in range(3)}
    draws = _draws(watched)
    loaded = {pid for pid, what, _ in draws if what == "loaded"}
    assert workers <= loaded  # every worker ran under the watch
    secret = [(what, caller) for pid, what, caller in draws
              if pid in workers and what != "loaded"
              and caller.split(".")[0] in ("mpyc", "ppfs", "__main__")]
    assert secret == []
