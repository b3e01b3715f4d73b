"""The stall watch (ppfs.engines.stall): a run whose parties neither compute nor print
for the stall limit is stopped, one in which any watched process computes is not.

The sampler reads a process tree's CPU time from /proc (a busy child against a sleeping
one); the decision is pure (an injected clock and samples)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ppfs.contract import FailureKind, failure_kind
from ppfs.engines.stall import StallWatch, TreeSample, proc_available, sample_tree
from ppfs.errors import StalledError

needs_proc = pytest.mark.skipif(not proc_available(),
                                reason="no Linux /proc here: the stall watch is off")

# a parent (like the pdeathsig launcher with --peak-rss) that waits for a child it starts
_PARENT = ("import subprocess, sys; "
           "subprocess.run([sys.executable, '-c', sys.argv[1]])")
_BUSY = "while True: pass"
_SLEEPING = "import time; time.sleep(60)"


def _spawn(child_code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _PARENT, child_code])


def _cpu_over(pid: int, seconds: float) -> tuple[TreeSample, TreeSample]:
    first = sample_tree(pid)
    assert first is not None
    time.sleep(seconds)
    last = sample_tree(pid)
    assert last is not None
    return first, last


def _child_of(proc: subprocess.Popen[bytes]) -> int:
    """The child the parent started (waited for), once both have finished starting."""
    deadline = time.monotonic() + 10
    while True:
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as fh:
            kids = fh.read().split()
        if kids:
            time.sleep(0.3)
            return int(kids[0])
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _end(proc: subprocess.Popen[bytes], child: int | None) -> None:
    if child is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    proc.kill()
    proc.wait()


@needs_proc
def test_the_sampler_counts_a_busy_descendant_and_not_a_sleeping_one() -> None:
    busy, sleeping = _spawn(_BUSY), _spawn(_SLEEPING)
    kids: list[int | None] = [None, None]
    try:
        kids = [_child_of(busy), _child_of(sleeping)]
        b0, b1 = _cpu_over(busy.pid, 1.0)
        s0, s1 = _cpu_over(sleeping.pid, 1.0)
        # the busy grandchild's CPU is the parent tree's (the parent itself only waits)
        assert b1.cpu_seconds - b0.cpu_seconds > 0.3
        assert s1.cpu_seconds - s0.cpu_seconds < 0.05
        assert not b1.stopped and not s1.stopped
    finally:
        for p, kid in zip((busy, sleeping), kids, strict=True):
            _end(p, kid)
    for p in (busy, sleeping):
        assert sample_tree(p.pid) is None  # a process that is gone is not sampled


@needs_proc
def test_the_sampler_sees_a_stopped_descendant() -> None:
    proc = _spawn(_SLEEPING)
    child: int | None = None
    try:
        child = _child_of(proc)
        assert not (s := sample_tree(proc.pid)) or not s.stopped
        os.kill(child, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while not (s := sample_tree(proc.pid)) or not s.stopped:
            assert time.monotonic() < deadline, s
            time.sleep(0.02)
    finally:
        _end(proc, child)


# ---- the decision, pure ---------------------------------------------------------------


def _idle(cpu: float, stopped: bool = False) -> TreeSample:
    return TreeSample(cpu, stopped)


def test_a_run_in_which_nothing_happens_stalls_after_the_limit() -> None:
    w = StallWatch(limit=10.0)
    for t in range(0, 10, 3):  # 0, 3, 6, 9: less than 10 s without progress
        w.observe(float(t), {0: _idle(1.0), 1: _idle(2.0)}, printed=100)
        assert not w.stalled
    w.observe(12.0, {0: _idle(1.0), 1: _idle(2.0)}, printed=100)
    assert w.stalled and w.idle_seconds(12.0) == 12.0
    assert w.stopped == frozenset()


def test_cpu_within_the_noise_allowance_is_no_progress() -> None:
    w = StallWatch(limit=6.0)
    cpu = 1.0
    for t in range(0, 13, 3):
        cpu += 0.01  # a timer's wake-ups: 0.3 % of a CPU
        w.observe(float(t), {0: _idle(cpu)}, printed=0)
    assert w.stalled


def test_a_slow_peer_that_computes_is_never_cut() -> None:
    # one watched party computes for an hour while the others wait (no output at all):
    # never stalled, whatever the limit
    w = StallWatch(limit=6.0)
    busy = 0.0
    for t in range(0, 3600, 3):
        busy += 0.5  # a sixth of a CPU, well above the allowance
        w.observe(float(t), {0: _idle(5.0), 1: _idle(busy), 2: _idle(7.0)}, printed=0)
        assert not w.stalled, t


def test_output_alone_is_progress() -> None:
    w = StallWatch(limit=6.0)
    for n, t in enumerate(range(0, 60, 3)):
        w.observe(float(t), {0: _idle(1.0)}, printed=n)  # a line every sample
        assert not w.stalled
    w.observe(63.0, {0: _idle(1.0)}, printed=19)
    w.observe(66.0, {0: _idle(1.0)}, printed=19)
    assert w.stalled  # six seconds since the last line


def test_progress_restarts_the_count_and_stopped_parties_are_reported() -> None:
    w = StallWatch(limit=6.0)
    w.observe(0.0, {0: _idle(1.0), 1: _idle(1.0)}, printed=0)
    w.observe(3.0, {0: _idle(1.0), 1: _idle(1.0)}, printed=0)
    w.observe(5.0, {0: _idle(2.0), 1: _idle(1.0)}, printed=0)  # party 0 computed
    w.observe(9.0, {0: _idle(2.0), 1: _idle(1.0, stopped=True)}, printed=0)
    assert not w.stalled and w.idle_seconds(9.0) == 4.0
    w.observe(11.0, {0: _idle(2.0), 1: _idle(1.0, stopped=True)}, printed=0)
    assert w.stalled and w.stopped == frozenset({1})


def test_a_party_gone_between_samples_is_no_progress() -> None:
    w = StallWatch(limit=4.0)
    w.observe(0.0, {0: _idle(1.0), 1: _idle(1.0)}, printed=0)
    w.observe(3.0, {0: _idle(1.0), 1: None}, printed=0)
    w.observe(6.0, {0: _idle(1.0), 1: None}, printed=0)
    assert w.stalled


def test_a_stall_is_its_own_failure_kind_that_blames_no_reporter() -> None:
    kind = failure_kind(StalledError("no progress"))
    assert kind is FailureKind.STALLED
    assert kind.collective and not kind.symptom


# ---- the limits' settings ---------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--timeout", "0"], "--timeout 0: give 0 < SECONDS"),
    (["--timeout", "-5"], "--timeout -5: give 0 < SECONDS"),
    (["--stall-timeout", "-1"], "--stall-timeout -1: give 0 <= SECONDS"),
    (["--stall-timeout", "1e9"], "--stall-timeout 1e+09: give 0 <= SECONDS"),
])
def test_select_refuses_a_limit_out_of_range(tmp_path, capsys, args, message) -> None:
    from ppfs_cli.main import main

    csv = tmp_path / "good.csv"
    csv.write_text("a,b,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    rc = main(["select", str(csv), "--label", "y", "--k", "1", "--engine", "mpyc", *args,
               "--workdir", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2, err
    assert message in err[-1], err
    assert not (tmp_path / "w").exists()  # nothing was started


@pytest.mark.parametrize("field, value, message", [
    ("stall_timeout", -1.0, "stall_timeout (--stall-timeout) must be 0 .. 86400"),
    ("stall_timeout", 90_000.0, "stall_timeout (--stall-timeout) must be 0 .. 86400"),
    ("job_timeout", 0.0, "job_timeout (--job-timeout) must be more than 0"),
])
def test_party_settings_refuse_a_limit_out_of_range(tmp_path, field, value, message) -> None:
    from ppfs_party.config import PartySettings

    from ppfs.errors import ParameterError

    with pytest.raises(ParameterError, match=re.escape(message)):
        PartySettings(state_dir=tmp_path, index=0, **{field: value})
    assert PartySettings(state_dir=tmp_path, index=0, stall_timeout=0.0).stall_timeout == 0.0


def test_party_serve_takes_the_stall_limit(tmp_path) -> None:
    import argparse

    from ppfs_party.commands import _settings, add_commands

    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    argv = ["party", "serve", "--state-dir", str(tmp_path), "--index", "1"]
    assert _settings(parser.parse_args(argv)).stall_timeout is None  # the engine's default
    args = parser.parse_args([*argv, "--stall-timeout", "120"])
    assert _settings(args).stall_timeout == 120.0


# ---- what a stalled run says ------------------------------------------------------------


def _stalled_watch(stopped: set[int], parties: int = 3) -> StallWatch:
    w = StallWatch(limit=300.0)
    for t in (0.0, 150.0, 300.0):
        w.observe(t, {i: _idle(1.0, stopped=i in stopped) for i in range(parties)}, 0)
    assert w.stalled
    return w


@pytest.mark.parametrize("engine", ["mp-spdz", "mpyc"])
def test_every_party_on_one_machine_names_the_stopped_one(engine) -> None:
    from types import SimpleNamespace

    from ppfs.engines import mpspdz, mpyc_engine

    parties = [SimpleNamespace(index=i, name=n) for i, n in enumerate(("Alice", "Bob", "Carol"))]
    stalled = mpspdz._stalled if engine == "mp-spdz" else mpyc_engine._stalled
    err = stalled(parties, _stalled_watch({1}), True)
    assert isinstance(err, StalledError) and err.party == "Bob"
    assert "made no progress for 300 s" in str(err) and "Bob" in str(err)
    assert "is stopped" in str(err)
    # none stopped: nobody is named (the run stalled all the same)
    err = stalled(parties, _stalled_watch(set()), True)
    assert isinstance(err, StalledError) and err.party is None
    assert "a peer stopped answering" in str(err)
    assert not any(n in str(err) for n in ("Alice", "Bob", "Carol"))


@pytest.mark.parametrize("engine", ["mp-spdz", "mpyc"])
def test_a_party_daemon_names_no_peer_but_its_own_suspended_engine(engine) -> None:
    from types import SimpleNamespace

    from ppfs.engines import mpspdz, mpyc_engine

    own = [SimpleNamespace(index=1, name="Bob")]
    stalled = mpspdz._stalled if engine == "mp-spdz" else mpyc_engine._stalled
    # waiting on its peers: it cannot see which froze, and says so, naming nobody
    err = stalled(own, _stalled_watch(set(), parties=1), False)
    assert isinstance(err, StalledError) and err.party is None
    assert failure_kind(err) is FailureKind.STALLED
    text = str(err)
    assert "a peer stopped answering" in text and "cannot be seen from here" in text
    assert not any(n in text for n in ("Alice", "Bob", "Carol", "Dave"))
    # its own engine suspended: that is its own failure, and it says so
    watch = StallWatch(limit=300.0)
    for t in (0.0, 150.0, 300.0):
        watch.observe(t, {1: _idle(1.0, stopped=True)}, 0)
    err = stalled(own, watch, False)
    assert not isinstance(err, StalledError) and err.party == "Bob"
    assert failure_kind(err) is FailureKind.OWN
    assert "this party's (Bob)" in str(err) and "stopped (suspended)" in str(err)


def test_without_proc_there_is_no_watch(monkeypatch, tmp_path) -> None:
    import ppfs.engines.stall as stall

    monkeypatch.setattr(stall, "_PROC", str(tmp_path / "no-proc"))
    assert not stall.proc_available()
    assert stall.sample_tree(os.getpid()) is None


@pytest.mark.parametrize("engine", ["mp-spdz", "mpyc"])
def test_a_stall_carries_how_long_the_party_waited(engine) -> None:
    # the gateway weighs a stall report against how long the other parties had waited
    # when they lost the reporter's engine: the report says how long its reporter did
    from types import SimpleNamespace

    from ppfs.engines import mpspdz, mpyc_engine

    own = [SimpleNamespace(index=1, name="Bob")]
    stalled = mpspdz._stalled if engine == "mp-spdz" else mpyc_engine._stalled
    err = stalled(own, _stalled_watch(set(), parties=1), False)
    assert isinstance(err, StalledError) and err.waited == 300.0


def test_a_job_status_reports_the_wait_only_when_known() -> None:
    from ppfs_party.jobs import JobRecord
    from ppfs_party.servicer import job_status

    rec = JobRecord(job_id="j", description_hex="", description_sha256="", engine="mpyc",
                    security="passive", state="failed", failure="peer_lost",
                    ended_at="2026-01-01T00:00:00+00:00")
    assert not job_status(rec).HasField("waited_seconds")  # unknown: absent, not 0
    rec.waited_seconds = 2.5
    assert job_status(rec).waited_seconds == 2.5
    # a pruned record keeps it, with the rest of the job's public outcome
    assert rec.pruned_record(0.0, 30.0).waited_seconds == 2.5
