"""The MPyC engine against the fixed-point mirror and the float oracle.

Shapes stay small: MPyC spends about 1 ms per comparison element on 2 cores.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from ppfs.engines.base import INPUT_FILES, PartyRunSpec
from ppfs.engines.mpyc_engine import MpycEngine, free_ports
from ppfs.engines.mpyc_party import (
    SECINT_BITS,
    STATISTICAL_SECURITY,
    JobError,
    RawWire,
    additive_summands,
    bind_loopback,
    conversion_roles,
    make_secint,
    reconstruct_plain,
    required_prime_bits,
    set_message_limits,
    wrap_from_top_bits,
)
from ppfs.errors import EngineError, EngineUnavailableError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import prepare_inputs, run_select
from ppfs.oracle import ms_gini_top_k
from ppfs.sharing import Scheme, ShareBundle, bundles_for_all, share
from ppfs.step2a import Security, Step2AShape, mirror
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable

PASSIVE = [Security.PASSIVE_3PC, Security.PASSIVE_4PC]

EDGE = np.array(
    [0, 1, -1, 2, -2, (1 << 62) - 1, -((1 << 62) - 1), 1 << 61, -(1 << 61), 1 << 40,
     -(1 << 40), (1 << 31) - 1, -(1 << 31), (1 << 60) - 1, 12345, -98765],
    dtype=np.int64,
)


def _with_columns(table: LabelledTable, x: np.ndarray) -> LabelledTable:
    return LabelledTable(table.columns, x, table.label_column, table.classes, table.y)


def _run(table: LabelledTable, k: int, security: Security, workdir: Path,
         fp: FixedPoint | None = None, progress=None):
    fp = fp or FixedPoint()
    sel = asyncio.run(run_select(table, k, security, MpycEngine(timeout=120), workdir,
                                 fixed_point=fp, progress=progress))
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, sel.shape)
    return sel, ref


def _check(sel, ref, table: LabelledTable, k: int) -> None:
    assert sel.indices.tolist() == ref.selected.tolist()
    assert np.array_equal(sel.reduced_raw, ref.reduced)
    oracle = ms_gini_top_k(table.x, table.y, table.n_classes, k)
    assert sel.indices.tolist() == oracle.tolist()


# ---------------------------------------------------------------- conversion


@pytest.mark.parametrize("scheme", [Scheme.REP3, Scheme.REP4])
def test_conversion_roles_cover_components_disjointly(scheme: Scheme) -> None:
    roles = conversion_roles(scheme)
    assert set(roles.a_components).isdisjoint(roles.b_components)
    assert sorted(roles.a_components + roles.b_components) == list(range(scheme.parties))
    assert set(roles.a_components) <= set(scheme.components_of(roles.a_party))
    assert set(roles.b_components) <= set(scheme.components_of(roles.b_party))


@pytest.mark.parametrize("scheme", [Scheme.REP3, Scheme.REP4])
def test_conversion_plain_round_trip(scheme: Scheme) -> None:
    rng = np.random.default_rng(3)
    lim = (1 << 62) - 1
    values = np.concatenate([EDGE, rng.integers(-lim, lim, size=5000, endpoint=True)])
    raw = values.reshape(-1, 1)
    for _ in range(20):  # many random sharings of the edge values
        bundles = bundles_for_all(raw, scheme, dataset_id="t", kind="data", frac_bits=0)
        roles = conversion_roles(scheme)
        a = additive_summands(bundles[roles.a_party].components, roles, roles.a_party)
        b = additive_summands(bundles[roles.b_party].components, roles, roles.b_party)
        assert a is not None and b is not None
        for other in range(2, scheme.parties):
            assert additive_summands(bundles[other].components, roles, other) is None
        got = reconstruct_plain(a[0], a[1], b[0], b[1])
        assert [int(v) for v in got.reshape(-1)] == [int(v) for v in values]


def test_wrap_polynomial_is_exact() -> None:
    assert [wrap_from_top_bits(w) for w in (-3, -2, -1)] == [0, 0, 0]
    assert [wrap_from_top_bits(w) for w in (1, 2, 3)] == [120, 120, 120]


_CONVERT_HELPER = r'''
import json, sys
from pathlib import Path
import numpy as np
from ppfs.engines import mpyc_party as mp
from ppfs.sharing import ShareBundle
from ppfs.step2a import Security, Step2AShape

pid, security, workdir = int(sys.argv[1]), Security(sys.argv[2]), Path(sys.argv[3])
ports = [int(p) for p in sys.argv[4].split(",")]
mp.setup_logging()
bundle = ShareBundle.load(workdir / f"p{pid}.shr")
job = mp.PartyJob(
    party=pid, security=security, shape=Step2AShape(2, 2, 2, 1),
    addresses=tuple(("127.0.0.1", p) for p in ports), input_dir=workdir,
    status_path=workdir / f"s{pid}", result_path=workdir / f"r{pid}",
    output_path=None, bind_host="127.0.0.1", start_timeout=30, timeout=60, chunk=1000,
    ssl=False,
)
rt = mp.make_runtime(mp.import_mpyc_runtime(), job)
secint = rt.SecInt(mp.SECINT_BITS)
roles = mp.conversion_roles(security.scheme)
mine = mp.additive_summands(bundle.components, roles, pid)

async def main():
    await rt.start()
    x = mp.additive64_to_secint(rt, secint, mine, bundle.shape, roles)
    y = await rt.output(x, receivers=[0])
    if pid == 0:
        (workdir / "plain.json").write_text(json.dumps([str(int(v)) for v in y.reshape(-1)]))
    await rt.shutdown()

rt.run(main())
'''


async def _run_parties(argvs: list[list[str]], timeout: float) -> list[tuple[int, bytes]]:
    procs = [
        await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                             stderr=asyncio.subprocess.STDOUT)
        for argv in argvs
    ]
    try:
        outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)),
                                      timeout)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    return [(p.returncode or 0, out[0][-2000:]) for p, out in zip(procs, outs, strict=True)]


@pytest.mark.parametrize("security", PASSIVE)
def test_conversion_secure_round_trip(security: Security, tmp_path: Path) -> None:
    """Shares mod 2^64 in, exact secure integers out (opened here, in a test only)."""
    rng = np.random.default_rng(11)
    values = np.concatenate([EDGE, rng.integers(-(1 << 62) + 1, 1 << 62, size=200)])
    raw = values.reshape(-1, 2)
    scheme = security.scheme
    for i, b in enumerate(bundles_for_all(raw, scheme, dataset_id="t", kind="data",
                                          frac_bits=0)):
        b.save(tmp_path / f"p{i}.shr")
    helper = tmp_path / "convert_helper.py"
    helper.write_text(_CONVERT_HELPER)
    ports = ",".join(str(p) for p in free_ports(scheme.parties))
    argvs = [[sys.executable, str(helper), str(i), security.value, str(tmp_path), ports]
             for i in range(scheme.parties)]
    results = asyncio.run(_run_parties(argvs, 60))
    for code, out in results:
        assert code == 0, out.decode(errors="replace")
    got = [int(v) for v in json.loads((tmp_path / "plain.json").read_text())]
    assert got == [int(v) for v in values]


def test_share_components_are_uniform_looking() -> None:
    """Sanity of the test's premise: components of 0 are not 0."""
    comps = share(np.zeros((4, 4), dtype=np.int64), Scheme.REP3)
    assert any(np.any(c != 0) for c in comps)


# ------------------------------------------------------------------ wire


def test_raw_wire_round_trip_and_refusals() -> None:
    arr = np.array([0, 1, (1 << 64) - 1, 1 << 64, (1 << 127) + 5, 42], dtype=object)
    back = RawWire.loads(RawWire.dumps(arr))
    assert back.dtype == object and [int(v) for v in back] == [int(v) for v in arr]
    small = np.arange(6, dtype=object).reshape(2, 3)
    assert np.array_equal(RawWire.loads(RawWire.dumps(small)), small)
    assert RawWire.loads(RawWire.dumps(-7)) == -7
    assert RawWire.loads(RawWire.dumps(np.array([], dtype=object))).size == 0
    with pytest.raises(TypeError):
        RawWire.dumps({"not": "an array"})
    with pytest.raises(ValueError):
        RawWire.dumps(np.array([-1], dtype=object))
    with pytest.raises(ValueError):
        RawWire.loads(b"\x80\x04K\x01.")  # a pickle stream is refused
    with pytest.raises(ValueError):
        RawWire.loads(RawWire.dumps(arr)[:-1])


def test_raw_wire_sends_field_elements_at_the_fields_width(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a job has set its field, an array's message has the same length whatever
    its values: a message that happened to hold only small elements used to be a word
    per element shorter, so a party's bytes sent varied from run to run."""
    import ppfs.engines.mpyc_party as mpyc_party

    monkeypatch.setattr(RawWire, "words", 1)
    monkeypatch.setattr(mpyc_party, "MESSAGE_LIMITS", list(mpyc_party.MESSAGE_LIMITS))
    set_message_limits(Step2AShape(m=4, p=3, n_classes=2, k=1), 127)
    assert RawWire.words == 2
    small = np.array([3, 0, 1], dtype=object)
    large = np.array([3, (1 << 126) + 1, 1], dtype=object)
    assert len(RawWire.dumps(small)) == len(RawWire.dumps(large))
    assert [int(v) for v in RawWire.loads(RawWire.dumps(small))] == [3, 0, 1]


def test_parties_listen_on_loopback_only() -> None:
    loop = asyncio.new_event_loop()
    try:
        bind_loopback(SimpleNamespace(_loop=loop), "127.0.0.1")

        async def listen() -> list[str]:
            server = await loop.create_server(asyncio.Protocol, port=0)  # as MPyC calls it
            hosts = [s.getsockname()[0] for s in server.sockets]
            server.close()
            return hosts

        assert loop.run_until_complete(listen()) == ["127.0.0.1"]
    finally:
        loop.close()


# ------------------------------------------------------------------ engine


def test_engine_protocol_surface() -> None:
    engine = MpycEngine()
    assert engine.name == "mpyc"
    assert engine.unavailable_reason() is None
    assert engine.supports(Security.PASSIVE_3PC) and engine.supports(Security.PASSIVE_4PC)
    assert not engine.supports(Security.ACTIVE_3PC)
    assert not engine.supports(Security.ACTIVE_4PC)


def test_engine_refuses_active_security(tmp_path: Path) -> None:
    table = make_table(20, 4, seed=1)
    prep = prepare_inputs(table, 2, Security.ACTIVE_3PC, tmp_path)
    with pytest.raises(EngineUnavailableError):
        asyncio.run(MpycEngine().run_step2a(prep.inputs, tmp_path))


def _cases() -> dict[str, tuple[LabelledTable, int, FixedPoint | None]]:
    base = make_table(40, 6, seed=2)
    x = base.x.copy()
    oracle = ms_gini_top_k(x, base.y, 2, 6)
    x[:, oracle[-1]] = x[:, oracle[0]]  # duplicate of the best column: an exact tie
    x[:, oracle[-2]] = -3.25  # constant column (b = 0)
    ties = _with_columns(base, x)
    return {
        "base": (base, 2, None),
        "ties-and-constant": (ties, 3, None),
        "k1": (make_table(40, 6, seed=4), 1, None),
        "k-p-1": (make_table(40, 6, seed=5), 5, None),
        "n3": (make_table(45, 6, n_classes=3, seed=6), 2, None),
        "n5": (make_table(50, 6, n_classes=5, seed=7), 3, None),
        "large-values": (make_table(40, 6, seed=8), 2,
                         FixedPoint(frac_bits=16, value_bits=40, target_bits=38)),
    }


CASES = _cases()


@pytest.mark.parametrize("security", PASSIVE, ids=lambda s: s.value)
@pytest.mark.parametrize("case", list(CASES))
def test_select_matches_mirror_and_oracle(case: str, security: Security,
                                          tmp_path: Path) -> None:
    table, k, fp = CASES[case]
    messages: list[str] = []
    sel, ref = _run(table, k, security, tmp_path, fp, progress=messages.append)
    _check(sel, ref, table, k)
    assert sel.run.engine == "mpyc"
    assert sel.run.opened.dtype == np.uint64 and sel.run.opened.shape == (sel.shape.outputs,)
    assert len(sel.run.parties) == security.parties
    assert all(p.exit_code == 0 and p.bytes_sent > 0 for p in sel.run.parties)
    assert sel.run.bytes_sent == sum(p.bytes_sent for p in sel.run.parties)
    assert any("ranking" in msg for msg in messages)
    if case == "ties-and-constant":
        best = ref.selected[0]
        twin = [j for j in range(table.p) if j != best
                and np.array_equal(table.x[:, j], table.x[:, best])]
        assert twin and ref.q[twin[0]] == ref.q[best]
        assert twin[0] in sel.indices.tolist()
    if case == "large-values":
        assert np.abs(sel.reduced_raw).max() >= 1 << 36
    # Masked words only on disk and in the run: they differ from the plain results.
    assert not np.array_equal(sel.run.opened[: k].view(np.int64), sel.indices)
    # every party ran at 40-bit statistical security, in a field large enough for it
    for i in range(security.parties):
        result = json.loads((tmp_path / "mpyc" / f"P{i}" / "result.json").read_text())
        assert result["statistical_security"] == STATISTICAL_SECURITY >= 40
        assert result["prime_bits"] >= required_prime_bits(STATISTICAL_SECURITY)


def test_statistical_security_is_checked() -> None:
    """The prime covers the longest comparison (63 bits) plus 40-bit masks, the
    conversion (p > 2^66) and the opened value + mask (p > 2^123)."""
    assert required_prime_bits(40) == max(63 + 40 + 2, 124)
    assert required_prime_bits(40) <= SECINT_BITS + 40 + 2
    weak = SimpleNamespace(options=SimpleNamespace(sec_param=30))
    with pytest.raises(JobError, match="30-bit statistical security"):
        make_secint(weak)


def _pids(root: Path, n: int) -> list[int]:
    return [int((root / "mpyc" / f"P{i}" / "worker.pid").read_text()) for i in range(n)]


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


@pytest.mark.parametrize("security", PASSIVE, ids=lambda s: s.value)
def test_killed_party_fails_fast_and_leaves_no_process(security: Security,
                                                       tmp_path: Path) -> None:
    table = make_table(150, 30, seed=9)
    prep = prepare_inputs(table, 3, security, tmp_path)
    victim = 1  # Bob

    async def scenario() -> tuple[EngineError, float, list[int]]:
        task = asyncio.create_task(MpycEngine(timeout=120).run_step2a(prep.inputs, tmp_path))
        status = tmp_path / "mpyc" / f"P{victim}" / "status.txt"
        t_wait = time.monotonic()
        while not (status.exists() and "mean-split" in status.read_text()):
            assert not task.done(), "the run ended before the party could be killed"
            assert time.monotonic() - t_wait < 60
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        pids = _pids(tmp_path, security.parties)
        t0 = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        with pytest.raises(EngineError) as info:
            await task
        return info.value, time.monotonic() - t0, pids

    err, elapsed, pids = asyncio.run(scenario())
    assert err.party == "Bob"
    assert "Bob" in str(err) and "SIGKILL" in str(err)
    assert elapsed < 5.0
    assert all(_gone(pid) for pid in pids)


def test_corrupt_share_names_its_party(tmp_path: Path) -> None:
    table = make_table(20, 4, seed=3)
    prep = prepare_inputs(table, 2, Security.PASSIVE_3PC, tmp_path)
    path = prep.inputs.party_dirs[2] / "data.shr"
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    t0 = time.monotonic()
    with pytest.raises(EngineError) as info:
        asyncio.run(MpycEngine(timeout=60).run_step2a(prep.inputs, tmp_path))
    assert info.value.party == "Carol"
    assert "checksum" in str(info.value)
    assert time.monotonic() - t0 < 30
    assert all(_gone(pid) for pid in _pids(tmp_path, 3))


def test_timeout_stops_every_party(tmp_path: Path) -> None:
    table = make_table(300, 40, seed=4)  # about 10 s of comparisons
    prep = prepare_inputs(table, 3, Security.PASSIVE_3PC, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="timed out"):
        asyncio.run(MpycEngine(timeout=1.5).run_step2a(prep.inputs, tmp_path))
    assert time.monotonic() - t0 < 10
    assert all(_gone(pid) for pid in _pids(tmp_path, 3))


def test_worker_logs_hold_no_opened_words(tmp_path: Path) -> None:
    table = make_table(30, 4, seed=12)
    sel, _ = _run(table, 2, Security.PASSIVE_3PC, tmp_path)
    logs = "".join(
        (tmp_path / "mpyc" / f"P{i}" / name).read_text(errors="replace")
        for i in range(3) for name in ("worker.out", "worker.err")
    )
    for word in sel.run.opened.tolist():
        assert str(word) not in logs
    assert "Traceback" not in logs


def test_cancel_while_the_inputs_are_written_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a party daemon hands the engine its bundles in memory and removes the run's input
    # directory once the run has ended: a cancelled run ends only after the thread
    # writing them there has, or they would be written after the removal and stay
    engine = MpycEngine(timeout=60)
    prep = prepare_inputs(make_table(12, 3, seed=1), 1, Security.PASSIVE_3PC,
                          tmp_path / "given")
    spec = engine._embedded_specs(prep.inputs, [tmp_path / f"P{i}" for i in range(3)])[0]
    bundles = [ShareBundle.load(spec.input_dir / f) for f in INPUT_FILES]
    spec = dataclasses.replace(spec, input_dir=tmp_path / "job" / "inputs", bundles=bundles)
    real = PartyRunSpec.write_input_files
    writing = threading.Event()

    def slow_write(self: PartyRunSpec) -> None:
        writing.set()
        time.sleep(0.5)  # as large bundles take their time
        real(self)

    monkeypatch.setattr(PartyRunSpec, "write_input_files", slow_write)

    async def cancelled() -> None:
        task = asyncio.ensure_future(engine.run_party(spec))
        await asyncio.to_thread(writing.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        shutil.rmtree(spec.input_dir, ignore_errors=True)  # the daemon's cleanup

    asyncio.run(cancelled())  # returns once every thread has ended
    assert not spec.input_dir.exists()
