"""Progress from inside the secure computation (MP-SPDZ): the program's public progress
lines, what the engine makes of them, and what a party daemon shows.

The MP-SPDZ tests run real parties on loopback and skip (with the reason) when MP-SPDZ
is not installed at $MPSPDZ_HOME / /opt/mp-spdz.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from party_runs import party_specs, run_every_party
from ppfs_party.jobs import JobRecord, JobRunner

from ppfs.engines.base import Progress, ProgressNote
from ppfs.engines.mpspdz import (
    PROGRESS_PREFIX,
    STAGES,
    MpSpdzEngine,
    ProgressPlan,
    _Capture,
)
from ppfs.engines.registry import mpspdz_home
from ppfs.local import prepare_inputs
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table

SETTINGS = [Security.PASSIVE_3PC, Security.ACTIVE_3PC, Security.ACTIVE_4PC]
SPEED = Step2AShape(8378, 122, 2, 67)
SPEED_TRAINED = Step2AShape(8378, 122, 2, 67, train=TrainParams(epochs=2, batch=64))

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(
    _reason is not None, reason=f"MP-SPDZ not available: {_reason}"
)


def _line(stage: str, done: int = 0, total: int = 1) -> bytes:
    return PROGRESS_PREFIX + f"{stage} {done} {total}".encode()


# ---------------------------------------------------------------- no MP-SPDZ needed


@pytest.mark.parametrize("security", SETTINGS, ids=lambda s: s.value)
@pytest.mark.parametrize("shape", [SPEED, SPEED_TRAINED, Step2AShape(126, 310, 2, 103)],
                         ids=["speed", "speed-trained", "lsvt"])
def test_plan_covers_the_run_in_program_order(security: Security, shape: Step2AShape) -> None:
    spans = ProgressPlan.for_shape(shape, security).spans
    assert list(spans) == list(STAGES)
    starts = [a for a, _ in spans.values()]
    ends = [b for _, b in spans.values()]
    # launching and connecting come first; then each stage begins where the last ended
    assert 0 < starts[0] < 0.5
    assert starts[1:] == ends[:-1]
    assert all(a <= b for a, b in spans.values())
    assert ends[-1] == pytest.approx(1.0)
    training = spans["training"]
    assert (training[1] > training[0]) == (shape.train is not None)


def test_notes_grow_as_the_program_goes_and_name_the_stage() -> None:
    plan = ProgressPlan.for_shape(SPEED_TRAINED, Security.ACTIVE_3PC)
    lines = [_line("inputs"), _line("thresholds")]
    lines += [_line("comparisons", r, 8378) for r in range(0, 8378, 1074)]
    lines += [_line("scores"), _line("ranking")]
    lines += [_line("selection", r, 8378) for r in range(0, 8378, 1074)]
    lines += [_line("training", s, 264) for s in range(0, 264, 8)]
    lines += [_line("opening")]
    notes = [plan.note(line) for line in lines]
    assert all(isinstance(n, ProgressNote) for n in notes)
    fractions = [n.fraction for n in notes if n is not None]
    assert fractions == sorted(fractions)
    assert fractions[0] > 0 and fractions[-1] < 1
    mid = plan.note(_line("comparisons", 4296, 8378))
    assert mid == "mean-split comparisons, 4,296 of 8,378 rows"
    assert plan.note(_line("opening")) == "opening the masked result"
    steps = plan.note(_line("training", 100, 264))
    assert steps is not None and steps.endswith("100 of 264 SGD steps")
    # a note is a message like any other for a consumer that shows text only
    assert steps.startswith("training")


@pytest.mark.parametrize("line", [
    PROGRESS_PREFIX + b"nonsense 1 2",          # a stage the plan does not know
    PROGRESS_PREFIX + b"comparisons 9 8",       # more done than there is
    PROGRESS_PREFIX + b"comparisons 1 0",
    PROGRESS_PREFIX + b"comparisons -1 8",
    PROGRESS_PREFIX + b"comparisons x 8",
    PROGRESS_PREFIX + b"comparisons 1 8 9",
    PROGRESS_PREFIX + b"comparisons",
    PROGRESS_PREFIX + b"\xff\xfe 1 2",
])
def test_a_line_that_is_not_well_formed_is_ignored(line: bytes) -> None:
    assert ProgressPlan.for_shape(SPEED, Security.PASSIVE_3PC).note(line) is None


class _Stream:
    """Stands for the party's stdout pipe: hands out the given chunks, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def read(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def test_capture_hands_progress_lines_over_and_keeps_the_rest(tmp_path: Path) -> None:
    text = b"".join([
        b"Using security parameter 40\n",
        *(_line("comparisons", r, 100_000) + b"\n" for r in range(0, 100_000, 10)),
        b"PPFS-RANGE-WEIGHTS\n",
        b"last words without a newline",
    ])
    # chunks that cut lines, the prefix among them, anywhere
    chunks = [text[i:i + 97] for i in range(0, len(text), 97)]
    seen: list[bytes] = []
    cap = _Capture(tmp_path / "stdout.log", cap=4096, on_progress=seen.append)
    asyncio.run(cap.drain(_Stream(chunks)))  # type: ignore[arg-type]
    assert seen == [_line("comparisons", r, 100_000) for r in range(0, 100_000, 10)]
    # 10,000 progress lines (over 300 KB) do not crowd out the marker after them
    kept = bytes(cap.kept)
    assert kept == (b"Using security parameter 40\nPPFS-RANGE-WEIGHTS\n"
                    b"last words without a newline")
    assert (tmp_path / "stdout.log").read_bytes() == kept


def test_capture_without_a_reader_keeps_everything_up_to_its_cap(tmp_path: Path) -> None:
    cap = _Capture(tmp_path / "stdout.log", cap=64)
    asyncio.run(cap.drain(_Stream([_line("inputs") + b"\n"] * 10)))  # type: ignore[arg-type]
    assert bytes(cap.kept) == ((_line("inputs") + b"\n") * 10)[:64]


def test_a_party_shows_the_engines_fraction_within_its_run() -> None:
    rec = JobRecord(job_id="j", description_hex="", description_sha256="", engine="mp-spdz",
                    security="passive-3pc", progress=0.1)
    half = JobRunner._phase(rec, ProgressNote("building D'", 0.5))
    assert half["phase"] == "building D'"
    assert half["progress"] == pytest.approx(0.1 + 0.89 * 0.5)
    # never backwards, never 100 % before the result is stored
    rec.progress = 0.9
    assert JobRunner._phase(rec, ProgressNote("x", 0.2))["progress"] == 0.9
    assert JobRunner._phase(rec, ProgressNote("x", 1.0))["progress"] == pytest.approx(0.99)
    # a note's text does not pull the bar to a stage needle's value: only its fraction
    rec.progress = 0.1
    opening = JobRunner._phase(rec, ProgressNote("opening", 0.2))
    assert opening["progress"] == pytest.approx(0.1 + 0.89 * 0.2)


def test_progress_alone_is_not_written_to_disk(tmp_path: Path) -> None:
    # a progress note changes the record its watchers see, not the one on disk (no
    # fsync per note; a restarted party reports the job failed, whatever its progress)
    settings = SimpleNamespace(state_dir=tmp_path, max_concurrent_jobs=1)
    runner = JobRunner(settings, None, None, None, {})  # type: ignore[arg-type]
    runner.open()
    rec = JobRecord(job_id="j", description_hex="", description_sha256="", engine="mp-spdz",
                    security="passive-3pc")
    runner._records["j"] = rec
    on_disk = tmp_path / "jobs" / "j.json"

    async def main() -> None:
        await runner._update(rec, state="running", phase="starting", progress=0.04)
        before = on_disk.read_bytes()
        await runner._update(rec, keep=False, **JobRunner._phase(
            rec, ProgressNote("building D'", 0.5)))
        assert on_disk.read_bytes() == before
        assert runner.get("j").phase == "building D'"
        assert runner._version["j"] == 2            # the watchers were woken both times
        await runner._update(rec, state="succeeded", phase="done", progress=1.0)

    asyncio.run(main())
    assert json.loads(on_disk.read_text())["phase"] == "done"


# ---------------------------------------------------------------- real MP-SPDZ parties


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> MpSpdzEngine:
    return MpSpdzEngine(mpspdz_home(), cache_dir=tmp_path_factory.mktemp("cache"),
                        timeout=300)


def _run_every_party(engine: MpSpdzEngine, seed: int, security: Security,
                     train: TrainParams | None, root: Path,
                     reveal_reduced: bool = True) -> list[list[ProgressNote]]:
    """Each party run as a daemon runs it (run_party); the notes each one reported."""
    # 3 chunks of comparisons and of D' (2^17 // 200 = 655 rows a chunk)
    table = make_table(1500, 200, seed=seed)
    prep = prepare_inputs(table, 5, security, root / "inputs", train=train,
                          reveal_reduced=reveal_reduced)
    notes: list[list[ProgressNote]] = [[] for _ in range(security.parties)]

    def recorder(i: int) -> Progress:
        def progress(message: str) -> None:
            if isinstance(message, ProgressNote):
                notes[i].append(message)
        return progress

    got = run_every_party(engine, party_specs(engine, prep.inputs, root / "run"), recorder)
    assert not [g for g in got if isinstance(g, BaseException)], got
    return notes


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize(("security", "train", "reveal_reduced"), [
    (Security.PASSIVE_3PC, TrainParams(epochs=2, batch=64), True),
    (Security.ACTIVE_3PC, None, True),
    (Security.PASSIVE_3PC, None, False),
], ids=["passive-3pc-trained", "active-3pc", "passive-3pc-selection-only"])
def test_every_party_reports_every_stage_in_order(
    engine: MpSpdzEngine, security: Security, train: TrainParams | None,
    reveal_reduced: bool, tmp_path: Path
) -> None:
    notes = _run_every_party(engine, 1, security, train, tmp_path, reveal_reduced)
    # D' is built only for whoever reads it: its owner, or training; a job that only
    # selects (a service job, which never opens D') skips it
    builds = reveal_reduced or train is not None
    expected = [s for s in STAGES if (s != "training" or train is not None)
                and (s != "selection" or builds)]
    for party in notes:
        stages = [n.removeprefix("").split(",")[0] for n in party]
        order = list(dict.fromkeys(stages))
        assert order == [STAGES[s][0] for s in expected]
        fractions = [n.fraction for n in party]
        assert fractions == sorted(fractions)
        assert sum("mean-split comparisons" in n for n in party) == 3
        assert sum("building D'" in n for n in party) == (3 if builds else 0)
        if train is not None:
            # 1500 / 64: 23 full steps and a shorter last one per epoch, 48 in all; a
            # line before training and at each full step (at most 17 an epoch)
            sgd = [n for n in party if n.endswith("SGD steps")]
            assert len(sgd) == 1 + 2 * 23
            assert sgd[0].endswith(" 0 of 48 SGD steps")
            assert sgd[-1].endswith(" 46 of 48 SGD steps")
    # every party prints the same public lines (each daemon shows its own run)
    assert all(party == notes[0] for party in notes)


@needs_mpspdz
@pytest.mark.mpspdz
def test_progress_lines_depend_on_the_shape_alone(engine: MpSpdzEngine,
                                                  tmp_path: Path) -> None:
    # two data sets of one shape: the same lines, word for word (nothing data-dependent
    # is printed; print_ln refuses a secret at compile time)
    a = _run_every_party(engine, 1, Security.PASSIVE_3PC, None, tmp_path / "a")
    b = _run_every_party(engine, 2, Security.PASSIVE_3PC, None, tmp_path / "b")
    assert [str(n) for n in a[1]] == [str(n) for n in b[1]]
    assert [n.fraction for n in a[2]] == [n.fraction for n in b[2]]
