"""One party lies about the result: it seals and signs, with its own certified key,
opened words (or a statement) other than those the parties computed. Every honest party
sends the same words, so the recipient refuses the result and names the party whose
part differs from all the others, which agree; it never names an honest party in its
place, and never opens a wrong result."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from service_fakes import RealCluster, Stack, horizontal_setup, make_stack, wait_final

from ppfs import oracle
from ppfs.contract import ResultRejected
from ppfs.engines.base import PARTY_NAMES
from ppfs.engines.registry import get_engine
from ppfs.step2a import Step2AShape, mirror


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _honest_result_first(s: Stack, k: int = 2, **submit: str) -> str:
    """A finished job whose honest result opens and matches the mirror and the oracle."""
    t, ids, raw = horizontal_setup(s)
    analyst, key = s.client("analyst-1"), s.keys["analyst-1"]
    for owner, d in zip(("owner-a", "owner-b"), ids, strict=True):  # what real parties ask
        s.client(owner).consent(s.keys[owner], d, "analyst-1", key.box_public_key)
    job = analyst.submit(key, ids, label="label", k=k, **submit)
    done = wait_final(analyst, job["id"], timeout=300)
    assert done["state"] == "succeeded", done
    got = analyst.fetch_result(key, job["id"])
    ref = mirror(raw, t.y, Step2AShape(t.m, t.p, t.n_classes, k))
    assert got.indices.tolist() == ref.selected.tolist()
    assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, k).tolist()
    return str(job["id"])


def _refusal(s: Stack, job_id: str) -> str:
    with pytest.raises(ResultRejected) as info:
        s.client("analyst-1").fetch_result(s.keys["analyst-1"], job_id)
    return str(info.value)


@pytest.fixture(params=[3, 4], ids=["3pc", "4pc"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(tmp_path, n=request.param)
    yield s
    s.close()


@pytest.mark.parametrize("liar", [0, 1, -1], ids=["first", "second", "last"])
def test_the_party_that_seals_other_words_is_named(stack: Stack, liar: int) -> None:
    n = stack.cluster.n
    job_id = _honest_result_first(stack, security=f"active-{n}pc")
    liar %= n
    stack.cluster.tamper_result = liar
    err = _refusal(stack, job_id)
    honest = [PARTY_NAMES[i] for i in range(n) if i != liar]
    assert (f"the parties' results disagree: {PARTY_NAMES[liar]}'s differs from those of "
            f"{_and(honest)}, which agree") in err, err
    assert "do not trust this result" in err


def test_the_party_that_signs_another_schema_alone_is_named(stack: Stack) -> None:
    job_id = _honest_result_first(stack, security=f"active-{stack.cluster.n}pc")
    stack.cluster.tamper_statement = 0
    err = _refusal(stack, job_id)
    honest = [PARTY_NAMES[i] for i in range(1, stack.cluster.n)]
    assert (f"the parties' signed statements disagree: Alice's differs from those of "
            f"{_and(honest)}, which agree") in err, err


def test_without_one_odd_party_out_nobody_is_named(tmp_path: Path) -> None:
    """Two of four parties lie alike: no party stands out, none is named as the one."""
    s = make_stack(tmp_path, n=4)
    try:
        job_id = _honest_result_first(s, security="active-4pc")
        s.cluster.tamper_result = frozenset({0, 1})
        err = _refusal(s, job_id)
        assert ("the parties' results disagree (Alice and Bob alike, Carol and Dave alike): "
                "more than one party sent another result") in err, err
        assert "differs from those of" not in err
    finally:
        s.close()


# -- the real party daemons in an active setting -----------------------------------


@pytest.mark.mpspdz
@pytest.mark.parametrize(("n", "security"), [(3, "active-3pc"), (4, "active-4pc")])
def test_an_active_party_sealing_altered_words_is_named(
    tmp_path: Path, n: int, security: str
) -> None:
    """The daemons ran the job on MP-SPDZ and the honest result is right; then Alice's
    daemon seals and signs, with its own key, the opened words with one word altered
    (as a corrupted Alice would): the recipient refuses, naming Alice."""
    if (reason := get_engine("mp-spdz").unavailable_reason()) is not None:
        pytest.skip(f"MP-SPDZ is not usable here: {reason}")
    s = make_stack(tmp_path, cluster=RealCluster(n, tmp_path, engines=("mp-spdz",)))
    try:
        job_id = _honest_result_first(s, security=security, engine="mp-spdz")
        kept = s.cluster.servers[0].state.jobs.jobs_dir / job_id / "opened.u64"
        words = np.frombuffer(kept.read_bytes(), dtype="<u8").copy()
        words[0] ^= np.uint64(1)
        kept.write_bytes(words.tobytes())
        err = _refusal(s, job_id)
        honest = [PARTY_NAMES[i] for i in range(1, n)]
        assert (f"the parties' results disagree: Alice's differs from those of "
                f"{_and(honest)}, which agree") in err, err
    finally:
        s.close()
        shutil.rmtree(tmp_path / "parties", ignore_errors=True)
