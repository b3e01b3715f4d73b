"""The MP-SPDZ engine against the fixed-point mirror and the plaintext MS-GINI oracle.

Runs real MP-SPDZ parties on loopback; skipped (with the reason) when MP-SPDZ is not
installed at $MPSPDZ_HOME / /opt/mp-spdz.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from party_runs import party_specs, run_every_party
from procs import processes_in

import ppfs.engines.mpspdz as mpspdz
import ppfs.engines.mpspdz_check as mpspdz_check
from ppfs.engines.base import Step2AInputs
from ppfs.engines.mpspdz import MpSpdzEngine, compile_args, subject_hash, write_party_input
from ppfs.engines.mpspdz_check import check_spdzwise
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import EngineError, IntegrityError, SessionMismatchError, ShareFormatError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import prepare_inputs, run_select
from ppfs.oracle import ms_gini_top_k
from ppfs.pki import CertificateAuthority, party_key_and_csr, write_cert
from ppfs.sharing import ShareBundle
from ppfs.step2a import Security, Step2AShape, input_plan, mirror, unmask
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable

SETTINGS = [Security.PASSIVE_3PC, Security.ACTIVE_3PC, Security.ACTIVE_4PC]
ACTIVE = [Security.ACTIVE_3PC, Security.ACTIVE_4PC]

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(
    _reason is not None, reason=f"MP-SPDZ not available: {_reason}"
)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mpspdz-cache")


@pytest.fixture
def engine(cache_dir: Path) -> MpSpdzEngine:
    return MpSpdzEngine(mpspdz_home(), cache_dir=cache_dir, timeout=300)


def _encoded(table: LabelledTable, fp: FixedPoint) -> np.ndarray:
    return fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)


def _engine_processes(root: Path) -> list[int]:
    return processes_in(root)


def _check(table: LabelledTable, k: int, security: Security, engine: MpSpdzEngine, tmp: Path,
           fp: FixedPoint | None = None, *, oracle: bool = True) -> None:
    fp = fp or FixedPoint()
    sel = asyncio.run(run_select(table, k, security, engine, tmp, fixed_point=fp))
    shape = Step2AShape(table.m, table.p, table.n_classes, k, fp.value_bits)
    ref = mirror(_encoded(table, fp), table.y, shape)
    np.testing.assert_array_equal(sel.indices, ref.selected)
    np.testing.assert_array_equal(sel.reduced_raw, ref.reduced)
    if oracle:
        expected = ms_gini_top_k(table.x, table.y, table.n_classes, k)
        np.testing.assert_array_equal(sel.indices, expected)
    run = sel.run
    assert run.engine == "mp-spdz"
    assert run.opened.dtype == np.uint64 and run.opened.shape == (shape.outputs,)
    assert run.program_hash is not None and len(run.program_hash) == 64
    assert [p.party for p in run.parties] == ["Alice", "Bob", "Carol", "Dave"][: security.parties]
    assert all(p.exit_code == 0 and p.bytes_sent > 0 for p in run.parties)
    assert run.bytes_sent == sum(p.bytes_sent for p in run.parties)
    # each party's peak memory, as its launcher reports it (ppfs.engines.pdeathsig)
    assert all(p.peak_rss_bytes is not None and p.peak_rss_bytes > 1 << 20
               for p in run.parties)
    # the engine keeps no copy of share data once done
    for i in range(security.parties):
        pdata = tmp / "mpspdz" / f"P{i}" / "Player-Data"
        assert not (pdata / f"Input-Binary-P{i}-0").exists()
        assert not list(pdata.glob("Memory-*"))
        assert not mpspdz.persistence_file(tmp / "mpspdz" / f"P{i}", i).exists()
        assert not list(pdata.glob("*/Player-MAC-Keys-*"))  # active 3PC's MAC key shares
    assert _engine_processes(tmp) == []


# ---------------------------------------------------------------- no MP-SPDZ needed


def test_registry_builds_this_engine() -> None:
    from ppfs.engines.registry import get_engine

    eng = get_engine("mp-spdz")
    assert isinstance(eng, MpSpdzEngine) and eng.name == "mp-spdz"
    assert eng.home == mpspdz_home()


def test_unavailable_and_unsupported(tmp_path: Path) -> None:
    eng = MpSpdzEngine(tmp_path / "nowhere")
    reason = eng.unavailable_reason()
    assert reason is not None and "\n" not in reason
    (tmp_path / "home").mkdir()
    assert "compile" in (MpSpdzEngine(tmp_path / "home").unavailable_reason() or "")
    assert not eng.supports(Security.PASSIVE_4PC)
    assert not MpSpdzEngine(mpspdz_home()).supports(Security.PASSIVE_4PC)


def test_compile_args_are_derived_from_shape() -> None:
    shape = Step2AShape(632, 120, 2, 12)
    args = compile_args(shape, Security.ACTIVE_3PC)
    assert args[0] == "active-3pc"
    assert args[1:6] == shape.program_args()
    assert args[6:] == [str(v) for v in (shape.split_bits, shape.score_frac_bits,
                                         shape.int_steps, shape.div_int_bits,
                                         shape.div_frac_bits, shape.rank_bits,
                                         shape.threshold_steps, shape.threshold_bits)]



def test_preprocessing_batch_follows_the_public_shape() -> None:
    """Active settings get one batch per up to m*p items (bounded both ways), passive none;
    the option depends on the public shape only, so every party passes the same one."""
    big, small = Step2AShape(8378, 122, 2, 67), Step2AShape(20, 5, 2, 2)
    assert mpspdz.preprocessing_batch(big, Security.PASSIVE_3PC) == []
    assert mpspdz.preprocessing_batch(big, Security.ACTIVE_3PC) == ["-b", "100000"]
    assert mpspdz.preprocessing_batch(Step2AShape(632, 120, 2, 12),
                                      Security.ACTIVE_4PC) == ["-b", "75840"]
    assert mpspdz.preprocessing_batch(small, Security.ACTIVE_4PC) == ["-b", "1000"]


def _as_given(bundle: ShareBundle, component: np.ndarray) -> np.ndarray:
    """A component as the party gives it to MP-SPDZ: flat; a mask's two words per
    output folded to w0 + 2^60 w1 mod 2^64 (the mask the program adds)."""
    if bundle.kind != "mask":
        return component.ravel()
    words = component.astype(object)
    return np.array([(int(w0) + (int(w1) << 60)) % 2**64 for w0, w1 in words],
                    dtype=np.uint64)


@pytest.mark.parametrize("security", SETTINGS)
def test_party_input_file_is_components_in_program_order(
    security: Security, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a chunk of 5 entries (the program's is 2^17) so that 21 data entries take five
    # chunks and each party's items interleave chunk by chunk
    monkeypatch.setattr(mpspdz, "INPUT_CHUNK", 5)
    monkeypatch.setattr(mpspdz, "_WRITE_ENTRIES", 7)   # passive 3PC: several writes too
    table = make_table(7, 3, n_classes=3, seed=2)
    prep = prepare_inputs(table, 2, security, tmp_path)
    shape = prep.inputs.shape
    plan = input_plan(security) if security is Security.ACTIVE_4PC else None
    for i in range(security.parties):
        out, persisted = tmp_path / f"in{i}", tmp_path / f"Persistence-{i}"
        memory = tmp_path / f"Memory-{i}"
        write_party_input(security, shape, i, prep.inputs.party_dirs[i], out, 12345 + i,
                          persisted, memory)
        words = np.fromfile(out, dtype="<u8")
        # the session tag comes first, in words of 63 bits, the lowest first
        expected = [np.array([12345 + i, 0, 0, 0], dtype=np.uint64)]
        shares = []
        bundles = [ShareBundle.load(prep.inputs.party_dirs[i] / f)
                   for f in ("data.shr", "labels.shr", "mask.shr")]
        for b in bundles:
            flat = {j: _as_given(b, c) for j, c in b.components.items()}
            size = len(next(iter(flat.values())))
            if plan is not None:                 # active 4PC's items, chunk by chunk
                for start in range(0, size, 5):
                    for item in plan.party_items(i):
                        part = sum(flat[j][start:start + 5].astype(object)
                                   for j in item.components)
                        expected.append(np.array([v % 2**64 for v in part], dtype=np.uint64))
            if security.parties == 3:            # Rep3's share of party i: (a_i, a_{i-1})
                shares += [np.stack([flat[i], flat[(i - 1) % 3]], axis=1)]
        if security in mpspdz.MEMORY_INPUT:
            # the tag, then the digests of c_i and c_{i-1}; the pairs in the memory file
            for j in (i, (i - 1) % 3):
                expected.append(np.array(mpspdz.component_digest(bundles, j), dtype=np.uint64))
            np.testing.assert_array_equal(words, np.concatenate(expected))
            raw = memory.read_bytes()
            pairs = np.concatenate(shares)
            n = len(pairs)
            head = f"0\n0\n{8192 + n}\n0\n".encode()
            assert raw.startswith(head) and raw.endswith(b"0\n0\nM")
            body = np.frombuffer(raw[len(head):-5], dtype=np.uint8).reshape(-1, 52)
            assert len(body) == 8192 + n and not body[:8192].any()
            got = body[8192:]
            np.testing.assert_array_equal(got[:, 0:8].copy().view("<u8").ravel(), pairs[:, 0])
            np.testing.assert_array_equal(got[:, 13:21].copy().view("<u8").ravel(), pairs[:, 1])
            assert not got[:, 8:13].any() and not got[:, 21:].any()   # zero MAC shares
            assert not persisted.exists()
        elif security in mpspdz.PERSISTED:
            np.testing.assert_array_equal(words, expected[0])     # the tag only
            raw = persisted.read_bytes()
            assert raw.startswith(mpspdz.REP3_HEADER)
            got = np.frombuffer(raw[len(mpspdz.REP3_HEADER):], dtype="<u8")
            np.testing.assert_array_equal(got, np.concatenate(shares).ravel())
        else:
            np.testing.assert_array_equal(words, np.concatenate(expected))
            assert not persisted.exists()


@pytest.mark.parametrize("security", SETTINGS)
def test_bundles_handed_in_memory_give_the_same_input_and_the_same_checks(
    security: Security, tmp_path: Path
) -> None:
    # a party daemon hands the engine its assembled bundles in memory: the engine's
    # files are byte for byte those written from the same bundles on disk, and a
    # bundle that is not this party's is refused all the same
    table = make_table(9, 3, seed=4)
    prep = prepare_inputs(table, 2, security, tmp_path)
    shape, d = prep.inputs.shape, prep.inputs.party_dirs[1]
    files = ("data.shr", "labels.shr", "mask.shr")
    written = []
    for way in ("disk", "memory"):
        out, persisted, memory = (tmp_path / f"{name}-{way}" for name in
                                  ("in", "Persistence", "Memory"))
        given = [ShareBundle.load(d / f) for f in files] if way == "memory" else None
        write_party_input(security, shape, 1, d if given is None else tmp_path / "none",
                          out, 7, persisted, memory, given)
        written.append([p.read_bytes() if p.exists() else None
                        for p in (out, persisted, memory)])
    assert written[0] == written[1] and sum(len(b) for b in written[0] if b) > 8 * 9 * 3
    others = [ShareBundle.load(prep.inputs.party_dirs[0] / f) for f in files]
    with pytest.raises(ShareFormatError, match="is not its data share"):
        write_party_input(security, shape, 1, d, tmp_path / "x", 7, tmp_path / "xp",
                          tmp_path / "xm", others)
    with pytest.raises(ShareFormatError, match="needs data, labels and mask"):
        write_party_input(security, shape, 1, d, tmp_path / "y", 7, tmp_path / "yp",
                          tmp_path / "ym", others[:2])


def test_input_chunk_is_the_programs() -> None:
    # the writer's chunk and the program's must agree, or the parties read their
    # items out of order
    program = (Path(mpspdz.__file__).parent / "mpspdz_programs" / "step2a.mpc").read_text()
    assert "\nCHUNK = 1 << 17\n" in program
    assert mpspdz.INPUT_CHUNK == 1 << 17


def test_memory_layout_and_digests_are_the_programs() -> None:
    # active 3PC: the memory file's base address and the digest width are stated in
    # the program and in the writer; they must agree
    program = (Path(mpspdz.__file__).parent / "mpspdz_programs" / "step2a.mpc").read_text()
    assert f"\nMEMORY_BASE = {mpspdz_check.USER_MEM} " in program
    assert f"\nDIGEST_WORDS = {mpspdz.DIGEST_WORDS} " in program


def test_program_input_plan_is_the_python_one() -> None:
    # step2a.mpc states the plan again (it is compiled without ppfs.step2a); both
    # statements must be the same plan
    program = (Path(mpspdz.__file__).parent / "mpspdz_programs" / "step2a.mpc").read_text()
    block = program[program.index("if SECURITY == 'active-4pc':\n    ITEMS"):]
    block = block[:block.index("\n\n")]
    for security in [Security.ACTIVE_4PC]:
        scope: dict[str, object] = {"SECURITY": security.value}
        exec(block, scope)  # the repository's own program text
        plan = input_plan(security)
        assert scope["ITEMS"] == [(it.party, it.components) for it in plan.items]
        assert scope["TOTAL"] == list(plan.total)
        assert scope["CHECKS"] == [list(c) for c in plan.checks]


# What MP-SPDZ 0.4.2 printed (abridged help text) when a TLS handshake failed: captured
# from real runs of three parties, one killed during the handshake or holding a
# certificate from another CA.
_HELP = (b" failed. Make sure both sides  have the necessary certificate "
         b"(Player-Data/P0.pem in the default configuration on their side and ...\n"
         b"See also https://mp-spdz.readthedocs.io/en/latest/troubleshooting.html"
         b"#handshake-failures\nSignature (should match the other side): ab/cd\n")
_CUT_SERVER = b"Server-side handshake with P2" + _HELP + b"SSL error: handshake: stream truncated\n"
_CUT_CLIENT = (b"Client-side handshake with P0" + _HELP
               + b"SSL error: handshake: Connection reset by peer\n")
_REJECTED = (b"Server-side handshake with P2" + _HELP
             + b"SSL error: handshake: certificate verify failed\n")
_REFUSED = (b"Client-side handshake with P1" + _HELP
            + b"SSL error: handshake: tlsv1 alert unknown ca\n")
_GONE_AFTER = b"Fatal error: read_some: stream truncated\n"


def test_handshake_cut_short_is_a_lost_peer_not_a_certificate() -> None:
    # a peer stopped mid-handshake (its container stopped, its process killed): the
    # party that notices reports a lost peer and names it, never a certificate fault
    for stderr, peer in ((_CUT_SERVER, "Carol"), (_CUT_CLIENT, "Alice")):
        assert mpspdz._lost_a_peer(stderr)
        reason = mpspdz._reason(stderr)
        assert f"handshake with {peer} was cut short" in reason
        assert "certificate" not in reason
    assert mpspdz._lost_a_peer(_GONE_AFTER)
    assert mpspdz._lost_peers(_CUT_SERVER) == [2]


# What MP-SPDZ 0.4.2 printed, and nothing else, on a survivor when a peer (daemon and
# engine) was killed outright in the middle of an active run: the survivor's own thread
# was reading from or writing to the vanished peer inside an instruction. Captured from
# real runs (active 3PC and 4PC); the program names are as they were.
_CUT_IN_INSTRUCTION = (
    b"Fatal error at step2a-active-3pc-5000-20-2-2-32-33-49-13-41-28-63-33-48-0-0-"
    b"LTZ(20)_48-1:142 (ANDS): read_some: stream truncated\n",
    b"Fatal error at step2a-active-3pc-5000-20-2-2-32-33-49-13-41-28-63-33-48-0-0-"
    b"LTZ(20)_48-1:142 (ANDS): write_some: Broken pipe\n",
    b"Fatal error at step2a-active-3pc-5000-20-2-2-32-33-49-13-41-28-63-33-48-0-0-0:93 "
    b"(SHRSI): read_some: stream truncated\n",
    b"Fatal error at step2a-active-4pc-3000-20-2-2-32-33-50-12-38-26-63-33-47-0-0-"
    b"LTZ(3000)_29-25:1234 (REVEAL): read_some: stream truncated\n",
)
# a failure of the party's own inside an instruction: not a lost peer
_OWN_IN_INSTRUCTION = (
    b"Fatal error at step2a-passive-3pc-20-4-2-2-32-33-54-8-26-18-63-33-43-0-0-0:12 "
    b"(INPUTB): not enough inputs in Player-Data/Input-Binary-P0-0\n",
    b"Fatal error at step2a-active-3pc-20-4-2-2-32-33-54-8-26-18-63-33-43-0-0-0:40 "
    b"(LDMS): Invalid memory file\n",
)


def test_a_peer_cut_off_inside_an_instruction_is_a_lost_peer() -> None:
    # a killed peer (its container killed, `docker stop` shorter than its drain): every
    # survivor reports a symptom, never a failure of its own (the gateway then finds
    # the party that went away)
    for stderr in _CUT_IN_INSTRUCTION:
        assert mpspdz._lost_a_peer(stderr), stderr
        reason = mpspdz._reason(stderr)
        assert reason == " (a peer's connection was cut: that peer went away)", reason
        assert "step2a" not in reason and "ANDS" not in reason
    for stderr in _OWN_IN_INSTRUCTION:
        assert not mpspdz._lost_a_peer(stderr), stderr


def test_a_file_of_its_own_read_short_is_not_a_lost_peer() -> None:
    # MP-SPDZ's own end_of_file exception (Tools/Exceptions.h: "End of file when reading
    # <what>") is thrown by a read of a local file (modp, gf2n, BitVector input); only
    # asio's bare "End of file" says a peer closed its connection
    for stderr in (b"Fatal error: End of file when reading gf2n \n",
                   b"Fatal error at step2a-active-3pc-20-4-0:12 (LDMS): End of file when "
                   b"reading modp \n"):
        assert not mpspdz._lost_a_peer(stderr), stderr
        assert "peer" not in mpspdz._reason(stderr)
    for stderr in (b"Fatal error: read_some: End of file\n",
                   b"Fatal error at step2a-active-3pc-20-4-0:93 (SHRSI): read_some: End of "
                   b"file [asio.misc:2]\n"):
        assert mpspdz._lost_a_peer(stderr), stderr


def test_a_run_a_peer_was_cut_from_is_blamed_on_that_peer_not_the_survivor() -> None:
    # the supervision of one party (a party daemon's run) raises a lost peer for it
    import asyncio
    from types import SimpleNamespace

    from ppfs.errors import PeerLostError

    class Proc:
        pid = 0
        returncode = 1

        async def wait(self) -> int:
            return 1

    async def main() -> None:
        async def nothing() -> None:
            return None

        party = SimpleNamespace(index=0, name="Alice", proc=Proc(), stopped_by_us=False,
                                err=SimpleNamespace(kept=bytearray(_CUT_IN_INSTRUCTION[1])),
                                out=SimpleNamespace(kept=bytearray()), ended=None,
                                drains=asyncio.ensure_future(nothing()))
        with pytest.raises(PeerLostError) as info:
            await MpSpdzEngine(mpspdz_home())._supervise([party], 5.0)
        assert str(info.value) == (
            "MP-SPDZ party 0 (Alice) failed with exit code 1 (a peer's connection was cut: "
            "that peer went away); its log is in its working directory")

    asyncio.run(main())


def test_handshake_refused_certificate_is_the_partys_own_failure() -> None:
    assert not mpspdz._lost_a_peer(_REJECTED)
    assert mpspdz._reason(_REJECTED) == (
        " (its TLS handshake with Carol failed: it rejected Carol's TLS certificate)")
    assert not mpspdz._lost_a_peer(_REFUSED)
    assert mpspdz._reason(_REFUSED) == (
        " (its TLS handshake with Bob failed: Bob rejected its TLS certificate)")
    # nothing of MP-SPDZ's own text (paths, signatures) is passed on
    assert "Player-Data" not in mpspdz._reason(_REJECTED)


def test_culprit_is_the_party_the_others_lost_in_a_handshake() -> None:
    # Carol stopped while Alice and Bob were shaking hands with her: both name her
    from types import SimpleNamespace

    def party(index: int, code: int, stderr: bytes) -> SimpleNamespace:
        return SimpleNamespace(index=index, proc=SimpleNamespace(returncode=code),
                               err=SimpleNamespace(kept=bytearray(stderr)),
                               stopped_by_us=False, name=mpspdz.PARTY_NAMES[index])

    carol = party(2, 1, b"")
    parties = [party(0, 1, _CUT_SERVER), party(1, 1, _CUT_SERVER), carol]
    assert mpspdz._culprit(parties, parties[0]) is carol  # type: ignore[arg-type]


def test_subject_hash_matches_openssl(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl command not installed")
    ca = CertificateAuthority.create("ppfs  MP-SPDZ run CA")
    certs = [ca.cert, ca.issue(party_key_and_csr(tmp_path / "P0.key", "P0"))]
    for n, cert in enumerate(certs):
        pem = tmp_path / f"c{n}.pem"
        write_cert(pem, cert)
        out = subprocess.run([openssl, "x509", "-hash", "-noout", "-in", str(pem)],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == subject_hash(cert)


# ---------------------------------------------------------------- secure runs


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
def test_matches_mirror_and_oracle(security: Security, engine: MpSpdzEngine,
                                   tmp_path: Path) -> None:
    _check(make_table(60, 8, seed=3), 3, security, engine, tmp_path)


def _edge_table(kind: str) -> tuple[LabelledTable, int, FixedPoint | None]:
    rng = np.random.default_rng(11)
    if kind == "constant-and-ties-n3-kmax":
        m, n = 48, 3
        y = np.arange(m) % n
        x = rng.normal(size=(m, 6))
        x[:, 0] += y                      # informative
        x[:, 2] = 4.25                    # constant column: b == 0
        x[:, 3] = x[:, 0] * 3.0 - 1.0     # same split as column 0: tied score
        x[:, 5] = x[:, 1]                 # duplicated column: tied score
        return _table(x, y, n), 5, None  # k = p - 1
    if kind == "k1-n5":
        m, n = 70, 5
        y = np.arange(m) % n
        x = rng.normal(size=(m, 5))
        x[:, 3] += 2.0 * (y >= 2)
        return _table(x, y, n), 1, None
    if kind == "negative-large":
        m, n = 40, 2
        y = np.arange(m) % n
        x = -np.abs(rng.normal(size=(m, 4))) * 1e9
        x[:, 1] += 3e8 * y
        x[:, 3] = -x[:, 3]
        # 40-bit values: raw entries close to +-2^38, comparisons of 47 bits
        return _table(x, y, n), 2, FixedPoint(value_bits=40, target_bits=38)
    raise AssertionError(kind)


def _table(x: np.ndarray, y: np.ndarray, n: int) -> LabelledTable:
    cols = tuple(f"c{j}" for j in range(x.shape[1]))
    return LabelledTable(cols, x, "label", tuple(str(c) for c in range(n)), y.astype(np.int64))


EDGE_KINDS = ["constant-and-ties-n3-kmax", "k1-n5", "negative-large"]
EDGE_CASES = [(s, k) for s in SETTINGS for k in EDGE_KINDS]


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize(("security", "kind"), EDGE_CASES,
                         ids=[f"{s.value}-{k}" for s, k in EDGE_CASES])
def test_edge_cases(security: Security, kind: str, engine: MpSpdzEngine, tmp_path: Path) -> None:
    table, k, fp = _edge_table(kind)
    _check(table, k, security, engine, tmp_path, fp)


@needs_mpspdz
@pytest.mark.mpspdz
def test_many_rows_no_overflow(engine: MpSpdzEngine, tmp_path: Path) -> None:
    # m = 100000: m*x - S needs 50 bits, a*b ~ 2^31, N*2^F close to 2^62
    table = make_table(100_000, 3, seed=5, informative=1)
    _check(table, 2, Security.PASSIVE_3PC, engine, tmp_path, oracle=False)
    fp = FixedPoint()
    shape = Step2AShape(table.m, table.p, table.n_classes, 2, fp.value_bits)
    assert max(mirror(_encoded(table, fp), table.y, shape).q) > 2**60  # scores use ~61 bits


def _stops_before_anything_opens(
    engine: MpSpdzEngine, inputs: Step2AInputs, workdir: Path
) -> IntegrityError:
    """The run fails its integrity check: no party wrote an output, none is left running."""
    with pytest.raises(IntegrityError) as info:
        asyncio.run(engine.run_step2a(inputs, workdir))
    assert "nothing was revealed" in str(info.value)
    for i in range(inputs.security.parties):
        assert not mpspdz.output_file(workdir / "mpspdz" / f"P{i}", i).exists()
    assert _engine_processes(workdir) == []
    return info.value


def _altered_inputs() -> list[tuple[Security, int, int, str]]:
    """(setting, party, component, kind): every component each party inputs in each
    active setting, the matrix it is altered in taking turns."""
    cases = []
    kinds = ["data", "labels", "mask"]
    for security in ACTIVE:
        for party in range(security.parties):
            if security is Security.ACTIVE_3PC:     # both components a party holds
                comps = sorted({party, (party - 1) % 3})
            else:
                comps = sorted({j for item in input_plan(security).party_items(party)
                                for j in item.components})
            cases += [(security, party, j, kinds[len(cases) % 3]) for j in comps]
    return cases


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize(
    ("security", "party", "component", "kind"), _altered_inputs(),
    ids=lambda v: v.value if isinstance(v, Security) else str(v),
)
def test_altered_share_is_detected_before_anything_opens(
    security: Security, party: int, component: int, kind: str, engine: MpSpdzEngine,
    tmp_path: Path,
) -> None:
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path)
    path = prep.inputs.party_dirs[party] / f"{kind}.shr"
    bundle = ShareBundle.load(path)
    comp = bundle.components[component].copy()
    # + 2^63 on the last row's first word (the change a parity check would miss); of a
    # mask's second word only the low 4 bits reach the mask mod 2^64, so not that one
    comp[-1, 0] ^= np.uint64(1 << 63)
    bundle.components[component] = comp
    bundle.save(path)
    _stops_before_anything_opens(engine, prep.inputs, tmp_path)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("party", range(3))
def test_active_3pc_party_computing_on_an_altered_share_is_caught(
    party: int, engine: MpSpdzEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a corrupted server that reports the digests of the shares it was given but
    # computes on an altered one (+ 2^63 on one entry of its own component): its copy
    # disagrees with the other holder's from the first multiplication on (the MACs),
    # and the SPDZ-wise check stops the run before anything is opened
    security = Security.ACTIVE_3PC
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path)
    real = mpspdz.write_party_input

    def altered_memory(security: Security, shape: Step2AShape, i: int, d: Path, out: Path,
                       session_tag: int = 0, persistence: Path | None = None,
                       memory: Path | None = None,
                       bundles: list[ShareBundle] | None = None) -> None:
        real(security, shape, i, d, out, session_tag, persistence, memory, bundles)
        if i == party:
            assert memory is not None
            with open(memory, "r+b") as fh:     # top byte of the last share's own component
                fh.seek(-5 - 52 + 7, os.SEEK_END)
                top = fh.read(1)[0]
                fh.seek(-1, os.SEEK_CUR)
                fh.write(bytes([top ^ 0x80]))

    monkeypatch.setattr(mpspdz, "write_party_input", altered_memory)
    error = _stops_before_anything_opens(engine, prep.inputs, tmp_path)
    assert "deviated from the protocol" in str(error)


@needs_mpspdz
@pytest.mark.mpspdz
def test_this_build_rejects_a_forged_mac(tmp_path: Path) -> None:
    # the check active 3PC runs first: three parties open the square of a value whose
    # MAC shares are zero, and this build's SPDZ-wise check must stop them
    home = mpspdz_home()
    binary = MpSpdzEngine(home)._binary(Security.ACTIVE_3PC)
    asyncio.run(check_spdzwise(home, binary, tmp_path))
    (verdict,) = (tmp_path / "checks").iterdir()
    assert verdict.read_text().strip() == "sound"


@needs_mpspdz
@pytest.mark.mpspdz
def test_parties_in_relative_working_directories(
    engine: MpSpdzEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a party daemon started with a relative --state-dir hands its engine a relative
    # working directory (<state>/jobs/<id>/engine): every party still completes, with
    # its own peak memory, and its share copies are gone
    monkeypatch.chdir(tmp_path)
    security = Security.PASSIVE_3PC
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, Path("inputs"))
    specs = party_specs(engine, prep.inputs, Path("state") / "jobs" / "j1")
    assert not any(s.workdir.is_absolute() for s in specs)
    got = run_every_party(engine, specs)
    ref = mirror(prep.raw, table.y, prep.inputs.shape)
    for spec, res in zip(specs, got, strict=True):
        assert not isinstance(res, BaseException), res
        assert res.peak_rss_bytes is not None and res.peak_rss_bytes > 1 << 20
        idx, reduced = unmask(res.opened, prep.mask_words, prep.inputs.shape)
        np.testing.assert_array_equal(idx, ref.selected)
        np.testing.assert_array_equal(reduced, ref.reduced)
        assert not mpspdz.persistence_file(spec.workdir, spec.party).exists()
    assert _engine_processes(tmp_path / "state") == []  # (this test's own cwd is tmp_path)


@needs_mpspdz
@pytest.mark.mpspdz
def test_altered_component_a_party_does_not_input_changes_nothing(
    engine: MpSpdzEngine, tmp_path: Path
) -> None:
    # in active 4PC party 1 holds c0, c2 and c3 but inputs only c0: what it holds
    # otherwise never reaches the computation, so altering it cannot change the result
    security = Security.ACTIVE_4PC
    assert 2 not in {j for it in input_plan(security).party_items(1) for j in it.components}
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path)
    path = prep.inputs.party_dirs[1] / "data.shr"
    bundle = ShareBundle.load(path)
    bundle.components[2] = bundle.components[2] + np.uint64(12345)
    bundle.save(path)
    run = asyncio.run(engine.run_step2a(prep.inputs, tmp_path))
    idx, reduced = unmask(run.opened, prep.mask_words, prep.inputs.shape)
    ref = mirror(prep.raw, table.y, prep.inputs.shape)
    np.testing.assert_array_equal(idx, ref.selected)
    np.testing.assert_array_equal(reduced, ref.reduced)


@needs_mpspdz
@pytest.mark.mpspdz
def test_honest_active_run_unmasks_only_with_mask(engine: MpSpdzEngine, tmp_path: Path) -> None:
    table = make_table(30, 4, seed=8)
    prep = prepare_inputs(table, 2, Security.ACTIVE_3PC, tmp_path)
    run = asyncio.run(engine.run_step2a(prep.inputs, tmp_path))
    idx, reduced = unmask(run.opened, prep.mask_words, prep.inputs.shape)
    ref = mirror(prep.raw, table.y, prep.inputs.shape)
    np.testing.assert_array_equal(idx, ref.selected)
    np.testing.assert_array_equal(reduced, ref.reduced)
    # the opened words themselves are not the result
    assert not np.array_equal(run.opened[:2].view(np.int64), ref.selected)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.ACTIVE_3PC],
                         ids=lambda s: s.value)
def test_failing_party_is_named_and_all_stopped(
    security: Security, engine: MpSpdzEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = make_table(30, 4, seed=9)
    prep = prepare_inputs(table, 2, security, tmp_path)
    real = mpspdz.write_party_input

    def short_input(security: Security, shape: Step2AShape, party: int, d: Path,
                    out: Path, session_tag: int = 0, persistence: Path | None = None,
                    memory: Path | None = None,
                    bundles: list[ShareBundle] | None = None) -> None:
        real(security, shape, party, d, out, session_tag, persistence, memory, bundles)
        if party == 1:  # Bob's input (his persisted shares / memory file) ends early
            short = (persistence if security in mpspdz.PERSISTED else
                     memory if security in mpspdz.MEMORY_INPUT else out)
            assert short is not None
            with open(short, "r+b") as fh:
                fh.truncate(os.path.getsize(short) // 2)

    monkeypatch.setattr(mpspdz, "write_party_input", short_input)
    with pytest.raises(EngineError) as info:
        asyncio.run(engine.run_step2a(prep.inputs, tmp_path))
    assert not isinstance(info.value, IntegrityError)
    assert info.value.party == "Bob"
    assert "Bob" in str(info.value) and "input file" in str(info.value)
    assert _engine_processes(tmp_path) == []


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("way", ["run_party", "run_step2a"])
def test_cancel_while_the_input_is_written_leaves_no_share_copy(
    way: str, engine: MpSpdzEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a party's input is written in a thread, which a cancel cannot stop: the run's
    # cleanup waits for it, or the copy written after the cleanup would stay on disk
    security = Security.PASSIVE_3PC
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path / "inputs")
    asyncio.run(engine.compile(prep.inputs.shape, security))  # cached before the race
    real = mpspdz.write_party_input
    writing = threading.Event()

    def slow_input(*args: Any, **kwargs: Any) -> None:
        writing.set()
        time.sleep(0.5)  # as a large input takes its time
        real(*args, **kwargs)

    monkeypatch.setattr(mpspdz, "write_party_input", slow_input)
    if way == "run_party":
        spec = party_specs(engine, prep.inputs, tmp_path / "run")[0]
        party_dir, run = spec.workdir, engine.run_party(spec)
    else:
        party_dir = tmp_path / "run" / "mpspdz" / "P0"
        run = engine.run_step2a(prep.inputs, tmp_path / "run")

    async def cancelled() -> None:
        task = asyncio.ensure_future(run)
        await asyncio.to_thread(writing.wait, 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())  # returns once every thread has ended
    assert (party_dir / "HOSTS").exists()  # the set-up had begun
    assert not mpspdz.persistence_file(party_dir, 0).exists()
    assert not (party_dir / "Player-Data" / "Input-Binary-P0-0").exists()


@needs_mpspdz
@pytest.mark.mpspdz
def test_killed_party_is_named_and_all_stopped(engine: MpSpdzEngine, tmp_path: Path) -> None:
    table = make_table(200, 20, seed=10)
    prep = prepare_inputs(table, 3, Security.ACTIVE_4PC, tmp_path)
    victim = tmp_path / "mpspdz" / "P2"

    def progress(msg: str) -> None:
        if msg.startswith("running"):
            pids = _engine_processes(victim)
            assert pids
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(EngineError) as info:
        asyncio.run(engine.run_step2a(prep.inputs, tmp_path, progress))
    assert info.value.party == "Carol"
    assert "signal" in str(info.value)
    assert _engine_processes(tmp_path) == []


@needs_mpspdz
@pytest.mark.mpspdz
def test_timeout_kills_every_party(engine: MpSpdzEngine, cache_dir: Path,
                                   tmp_path: Path) -> None:
    table = make_table(200, 20, seed=12)
    prep = prepare_inputs(table, 3, Security.ACTIVE_3PC, tmp_path)
    asyncio.run(engine.compile(prep.inputs.shape, Security.ACTIVE_3PC))  # cached
    quick = MpSpdzEngine(mpspdz_home(), cache_dir=cache_dir, timeout=0.05)
    with pytest.raises(EngineError, match="time limit"):
        asyncio.run(quick.run_step2a(prep.inputs, tmp_path))
    assert _engine_processes(tmp_path) == []


@needs_mpspdz
@pytest.mark.mpspdz
def test_compiled_once_per_protocol_and_shape(engine: MpSpdzEngine, cache_dir: Path) -> None:
    shape = Step2AShape(20, 3, 2, 1)

    async def both() -> tuple[tuple[Path, str, str], ...]:
        return (await engine.compile(shape, Security.PASSIVE_3PC),
                await engine.compile(shape, Security.PASSIVE_3PC),
                await engine.compile(shape, Security.ACTIVE_4PC))

    first, again, other = asyncio.run(both())
    assert first == again
    assert other[2] != first[2]
    assert cache_dir in first[0].parents
    assert not str(first[0]).startswith(str(mpspdz_home()))


def _stated_bit_triples(tmp_path: Path, security: Security, shape: Step2AShape) -> int:
    """The AND triples the compiled program states it needs (compile.py -v's count for
    the main tape; 0 when it states none)."""
    work = tmp_path / security.value
    (work / "Programs" / "Source").mkdir(parents=True)
    src = work / "Programs" / "Source" / f"{mpspdz.PROGRAM}.mpc"
    src.write_bytes(mpspdz.program_source())
    out = subprocess.run(
        mpspdz.compile_command(mpspdz_home(), src.relative_to(work), shape, security,
                               verbose=True),
        cwd=work, env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True,
        text=True, check=True,
    ).stdout
    main_tape = [ln for ln in out.splitlines() if ln.startswith("Tape requires")
                 and "integer inputs from player" in ln][-1]
    found = re.search(r"(\d+) bit triples", main_tape)
    return int(found.group(1)) if found else 0


@needs_mpspdz
@pytest.mark.mpspdz
def test_active_3pc_states_its_and_triples_as_unknown(tmp_path: Path) -> None:
    """Stated exactly, MP-SPDZ makes all of active 3PC's AND triples in one batch at the
    first AND (some 1.2 GB per party for SPEED's shape with training); stated beyond
    what it counts (2^64), it makes them in batches of the party's -b. The settings
    without AND triples state what they need."""
    shape = Step2AShape(20, 3, 2, 1)
    assert _stated_bit_triples(tmp_path, Security.ACTIVE_3PC, shape) >= 2**64
    assert _stated_bit_triples(tmp_path, Security.PASSIVE_3PC, shape) < 2**32


def test_program_hash_ignores_what_varies_between_identical_compilations(tmp_path: Path) -> None:
    """Parties compile the same program in different directories, and the compiler lists
    its options from a Python set: neither may change the program's hash."""
    hashes = []
    for i, (path, opts) in enumerate([("/a/compile.py", "edabit trunc_pr"),
                                      ("/b/x/compile.py", "trunc_pr edabit")]):
        programs = tmp_path / f"p{i}" / "Programs"
        (programs / "Bytecode").mkdir(parents=True)
        (programs / "Schedules").mkdir()
        (programs / "Bytecode" / "prog-0.bc").write_bytes(b"same bytecode")
        (programs / "Schedules" / "prog.sch").write_text(
            f"1\n1\nprog-0:10\n1 0\n0\n{path} -E ring prog\nR:64\nopts: {opts}\n")
        hashes.append(mpspdz.tree_hash(programs, "prog"))
    assert hashes[0] == hashes[1]
    (programs / "Bytecode" / "prog-0.bc").write_bytes(b"other bytecode")
    assert mpspdz.tree_hash(programs, "prog") != hashes[0]


@needs_mpspdz
@pytest.mark.mpspdz
def test_inputs_over_several_chunks_active(engine: MpSpdzEngine, tmp_path: Path) -> None:
    # m*p above the program's CHUNK (2^17): components are input chunk by chunk, both
    # copies in step; an honest run matches the mirror, a copy altered in the last
    # chunk is caught
    table = make_table(1400, 100, seed=12)
    _check(table, 3, Security.ACTIVE_3PC, engine, tmp_path / "honest", oracle=False)
    prep = prepare_inputs(table, 3, Security.ACTIVE_3PC, tmp_path / "altered")
    party = 2
    path = prep.inputs.party_dirs[party] / "data.shr"
    bundle = ShareBundle.load(path)
    j = (party - 1) % 3                  # the component Carol shares with Bob
    comp = bundle.components[j].copy()
    comp[(1 << 17) // 100, (1 << 17) % 100] += np.uint64(1)  # first entry of chunk 2
    bundle.components[j] = comp
    bundle.save(path)
    with pytest.raises(IntegrityError):
        asyncio.run(engine.run_step2a(prep.inputs, tmp_path / "altered"))


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
def test_every_party_names_a_session_mismatch_itself(
    security: Security, engine: MpSpdzEngine, tmp_path: Path
) -> None:
    # each party run as its daemon runs it (run_party), Carol in another job: every one
    # of them reads the program's verdict in its own output (all parties print it) and
    # stops with the session mismatch, none with a mere lost peer; no data was input
    from ppfs.contract import SESSION_TAG_BITS

    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path / "inputs")
    # Carol's tag differs in its top bit alone: every word of the tag is compared, not
    # the first one (63 bits: a gateway choosing job ids finds two descriptions of one
    # such tag with some 2^32 hashes)
    tag = (1 << (SESSION_TAG_BITS - 1)) | 11
    tags = [tag] * security.parties
    tags[2] = tag ^ (1 << (SESSION_TAG_BITS - 1))
    got = run_every_party(engine, party_specs(engine, prep.inputs, tmp_path / "run", tags))
    assert all(isinstance(g, SessionMismatchError) for g in got), got
    assert _engine_processes(tmp_path) == []


@needs_mpspdz
@pytest.mark.mpspdz
def test_a_party_whose_peers_never_come_reports_it_within_the_connect_time(
    engine: MpSpdzEngine, tmp_path: Path
) -> None:
    """A job started at one party only (a gateway that stopped, or held back the other
    starts): the party's engine gives up within MP-SPDZ's connect time (60 s), not its
    run's time limit, and says why, as a symptom (PeerLostError) for the gateway to
    look for the cause, rather than as a failure of its own. Alice waits for peers to
    dial her; Carol dials peers that never listen; both run at once, in two jobs."""
    from ppfs.errors import PeerLostError

    security = Security.PASSIVE_3PC
    table = make_table(30, 4, seed=7)
    prep = prepare_inputs(table, 2, security, tmp_path / "inputs")
    asyncio.run(engine.compile(prep.inputs.shape, security))
    alone = [party_specs(engine, prep.inputs, tmp_path / job)[i]
             for job, i in (("a", 0), ("c", 2))]

    async def both() -> list[BaseException | object]:
        return await asyncio.gather(*(engine.run_party(s) for s in alone),
                                    return_exceptions=True)

    t0 = time.monotonic()
    alice, carol = asyncio.run(both())
    assert time.monotonic() - t0 < 150  # the run's own limit here is 300 s
    assert isinstance(alice, PeerLostError), alice
    assert "no peer's engine connected to it within 60 s" in str(alice)
    assert isinstance(carol, PeerLostError), carol
    assert "could not reach a peer's engine within 60 s" in str(carol)
    assert _engine_processes(tmp_path) == []
