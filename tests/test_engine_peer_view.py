"""Per-party peer addresses in the MP-SPDZ engine: each party dials its peers where it
is told (here: through the benchmarks' delay relays) and still binds its own port."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from ppfs.engines.base import PartyRunSpec, PartyTls
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import ParameterError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import run_select
from ppfs.step2a import Security, Step2AShape, mirror
from ppfs.synthetic import make_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from delayrelay import RelayMesh

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")


def test_own_dial_address_must_be_the_own_listening_one(tmp_path: Path) -> None:
    peers = (("127.0.0.1", 5000), ("127.0.0.1", 5001), ("127.0.0.1", 5002))
    tls = PartyTls(tmp_path / "k", tmp_path / "c", tmp_path / "ca")
    engine = MpSpdzEngine(tmp_path)
    for dial in (
        (("127.0.0.1", 5000), ("127.0.0.1", 6001), ("127.0.0.1", 6002)),  # own entry moved
        (("127.0.0.1", 6000), ("127.0.0.1", 5001)),  # one missing
    ):
        spec = PartyRunSpec(Security.PASSIVE_3PC, Step2AShape(8, 3, 2, 1), 1, tmp_path,
                            tmp_path / "w", peers, tls, dial=dial)
        with pytest.raises(ParameterError, match="own address"):
            engine._setup_party(spec, tmp_path, "x", "0" * 64)
    assert not (tmp_path / "w").exists()


@pytest.mark.mpspdz
@needs_mpspdz
def test_run_through_relays_matches_mirror(tmp_path: Path) -> None:
    table = make_table(40, 6, seed=3)
    k = 2
    with RelayMesh(0.0005) as mesh:
        engine = MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path / "cache", timeout=300,
                              peer_view=mesh.view)
        sel = asyncio.run(run_select(table, k, Security.PASSIVE_3PC, engine, tmp_path / "run"))
        carried = mesh.totals()
        relays = {(src, dst): r.address for (src, dst), r in mesh.relays.items()}
    fp = FixedPoint()
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, k))
    np.testing.assert_array_equal(sel.indices, ref.selected)
    np.testing.assert_array_equal(sel.reduced_raw, ref.reduced)
    # party i's HOSTS: its own port, a relay for each peer
    lines = [(tmp_path / "run" / "mpspdz" / f"P{i}" / "HOSTS").read_text().split()
             for i in range(3)]
    own = [lines[i][i] for i in range(3)]
    assert len(set(own)) == 3
    for i in range(3):
        for j in range(3):
            if j != i:
                assert lines[i][j] == "{}:{}".format(*relays[(i, j)])
                assert lines[i][j] not in own
    # all MPC traffic went through the relays, and rounds are reported per party
    assert carried.bytes >= sel.run.bytes_sent * 0.9
    assert all(p.rounds > 0 for p in sel.run.parties)
