"""What one party sees during a job depends on the public shape alone.

A curious party keeps everything its daemon shows it: the engine's output and status
files, the progress its engine reports, its own log lines, its audit log, its job
record, the state of the job as the gateway watches it, and whatever files the job
leaves in its state directory. Here the same job (same shape, schema, k, training
parameters, job id and upload ids) runs through real party daemons (gRPC, mutual TLS)
on several generated data sets, each with fresh masks from the OS CSPRNG, and every
party's view is compared across them: after taking out what differs from one run to
the next by design (times, ports, keys and the hashes of sealed bytes, which are
random; the masked result words, of which only sizes are compared), the views must be
identical. Any value or share written anywhere a party keeps it would differ between
the data sets and fail the comparison. Every run's result is checked against the
plaintext oracle (the selection exactly, the model within its tolerance).

The MP-SPDZ case skips, with the reason, when MP-SPDZ is not installed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from party_harness import (
    Deployment,
    EngineWrapper,
    data_upload,
    describe_job,
    fetch_opened,
    identities,
    mask_upload,
    start_requests,
    upload_messages,
    watch_to_end,
)
from ppfs_party import state as party_state
from ppfs_party.server import start_party_server

from ppfs import step2b
from ppfs.contract import service_shape
from ppfs.engines.base import ProgressNote
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import RangeAbortError
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Security, draw_mask_words, mirror, unmask_all
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable
from ppfs.v1 import party_pb2, party_pb2_grpc

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")

M, P, K = 24, 4, 2
TRAIN = TrainParams(epochs=1, batch=12, lr=0.5, seed=1)
JOB_ID = "job-view"


# ---------------------------------------------------------------- the data sets


def data_sets() -> tuple[list[LabelledTable], np.ndarray]:
    """Three tables of one shape and one schema (the exponents of all of them): two
    random ones and one with a constant column and two equal columns (ties)."""
    tables = [make_table(M, P, seed=s, magnitudes=False) for s in (1, 2, 3)]
    x = tables[2].x.copy()
    x[:, 0] = 0.75                      # constant: MS-GINI's b = 0 case, Step 2B's exemption
    x[:, 3] = x[:, 1]                   # a tie between two columns' scores
    tables[2] = LabelledTable(tables[2].columns, x, tables[2].label_column,
                              tables[2].classes, tables[2].y)
    return tables, _schema(tables)


def _schema(tables: list[LabelledTable]) -> np.ndarray:
    return FixedPoint().choose_exponents(np.vstack([t.x for t in tables]), tables[0].columns)


# Step 2B's range checks: each opens one bit, and a run that stops on it must show a
# party nothing else either. RATIO: column 0 is 1e6 plus a little and decides the label
# (selected, its mean ~1e5 times its spread). WEIGHTS: column 0 separates the classes,
# and SGD at lr 4 in batches of 2 drives its weight past 2^2 in one epoch.
RATIO = TrainParams(epochs=1, batch=12, lr=0.5, seed=1)
WEIGHTS = TrainParams(epochs=1, batch=2, lr=4.0, weight_bits=2, seed=1)


def abort_data_sets(kind: str) -> tuple[list[LabelledTable], np.ndarray]:
    tables = []
    for seed in (21, 22):
        rng = np.random.default_rng(seed)      # public test data
        y = np.arange(M) % 2
        rng.shuffle(y)
        sign = 2 * y - 1
        if kind == "ratio":
            first = 1e6 + 3.0 * sign * (0.5 + rng.random(M))
        else:
            first = sign * (0.1 + rng.random(M))
        x = np.column_stack([first, rng.standard_normal((M, P - 1))])
        tables.append(LabelledTable(tuple(f"f{j:03d}" for j in range(P)), x, "label",
                                    ("0", "1"), y.astype(np.int64)))
    return tables, _schema(tables)


# ---------------------------------------------------------------- one job, seen by each party


class RecordingEngine(EngineWrapper):
    """The daemon's engine, with every progress message it reports kept (as the daemon
    gets them, before it coalesces them into the job's phase)."""

    def __init__(self, inner: Any, seen: dict[int, list[tuple[str, float | None]]]) -> None:
        super().__init__(inner)
        self.seen = seen

    async def run_party(self, spec: Any, progress: Any = None) -> Any:
        kept = self.seen.setdefault(spec.party, [])

        def record(message: str) -> None:
            kept.append((str(message),
                         message.fraction if isinstance(message, ProgressNote) else None))
            if progress is not None:
                progress(message)

        return await self.inner.run_party(spec, record)


@dataclass
class Run:
    """One job on one data set: what each party saw, and the recipient's result."""

    root: Path
    ports: list[int]
    progress: dict[int, list[tuple[str, float | None]]] = field(default_factory=dict)
    log: list[logging.LogRecord] = field(default_factory=list)
    final: list[party_pb2.JobStatus] = field(default_factory=list)
    opened: np.ndarray | None = None


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0].startswith("ppfs"):
            self.records.append(record)


async def _run_job(run: Run, dep: Deployment, table: LabelledTable, exps: np.ndarray,
                   security: Security, engine: str, train: TrainParams,
                   aborts: str | None) -> tuple[np.ndarray, Any]:
    servers = [await start_party_server(s) for s in dep.settings]
    run.ports += [srv.port for srv in servers]
    channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
    try:
        stubs = [party_pb2_grpc.PartyServiceStub(c) for c in channels]
        ids = await identities(stubs)
        box = [i.box_public_key for i in ids]
        fp = FixedPoint()
        raw = fp.encode(table.x, exps, table.columns)
        owner, recipient = dep.add_owner("owner"), dep.add_owner("recipient")
        data = data_upload(owner, box, raw, table.columns, [int(e) for e in exps],
                           dataset_id="ds",
                           upload_id="up-data", onehot=table.one_hot(),
                           label_column=table.label_column, classes=table.classes)
        shape = service_shape(table.m, table.p, table.n_classes, K, fp.value_bits, train)
        words = draw_mask_words(shape.outputs)  # the recipient's, fresh for every job
        masks = mask_upload(recipient, box, words, dataset_id="masks", upload_id="up-mask")
        for up in (data, masks):
            for i, stub in enumerate(stubs):
                await stub.PutUploadPart(upload_messages(up, i))
        desc = describe_job(JOB_ID, [[data]], mask=masks, k=K, security=security.value,
                            engine=engine, recipient_public_key=bytes(recipient.box.public_key),
                            peers=dep.peer_addresses(), train=train)
        for stub in stubs:
            await stub.StartJob(start_requests(desc))
        run.final = list(await asyncio.gather(*(watch_to_end(s, JOB_ID) for s in stubs)))
        if aborts is not None:
            # every party stops on the one public bit, blaming none, naming the check
            assert [(f.state, f.error) for f in run.final] == [
                (party_pb2.JOB_STATE_FAILED, step2b.abort_message(aborts))] * len(stubs)
            return raw, None
        assert [f.state for f in run.final] == [party_pb2.JOB_STATE_SUCCEEDED] * len(stubs), \
            [f.error for f in run.final]
        parts = await fetch_opened(stubs, ids, JOB_ID, recipient.box)
        assert all(np.array_equal(p, parts[0]) for p in parts)
        run.opened = parts[0]
        return raw, unmask_all(parts[0], words, shape)
    finally:
        for c in channels:
            await c.close()
        # each job's end (removing its share copies) is over before its party stops
        for srv in servers:
            for _ in range(600):
                if not srv.state.jobs._tasks:
                    break
                await asyncio.sleep(0.05)
        for srv in servers:
            await srv.stop(0)


def _check_against_oracle(raw: np.ndarray, table: LabelledTable, out: Any,
                          train: TrainParams, aborts: str | None) -> None:
    """The selection equals the mirror's; the model is the Step 2B mirror's within its
    tolerance (the engines round at random where the mirror rounds down)."""
    fp = FixedPoint()
    ref2a = mirror(raw, table.y, service_shape(table.m, table.p, table.n_classes, K,
                                               fp.value_bits, None))
    ref = step2b.mirror(raw[:, ref2a.selected], table.y, table.n_classes, fp.value_bits, train)
    assert ref.aborted == aborts
    if aborts is not None:
        return
    np.testing.assert_array_equal(out.indices, ref2a.selected)
    alpha_full, beta = step2b.split_model_words(out.model, table.p, table.n_classes)
    unselected = np.setdiff1d(np.arange(table.p), out.indices)
    assert np.all(alpha_full[unselected] == 0)
    c = step2b.constants(table.m, K, table.n_classes, fp.value_bits, train)
    kappa = ref.kappa.astype(float)[:, None]
    w_mpc = alpha_full[out.indices].astype(float) * 2.0**c.preshift / kappa
    w_ref = ref.weights.astype(float) / 2**c.frac
    tol = step2b.weight_tolerance(ref, train)
    assert float(np.abs(w_mpc - w_ref).max()) <= tol
    ratio = np.abs(ref.ratio.astype(float)).sum() / 2**c.frac
    beta_diff = np.abs(beta.astype(float) - ref.beta.astype(float)).max() / 2**c.frac
    assert beta_diff <= tol * (1 + ratio) + 2.0**-c.frac * K


def run_on(root: Path, table: LabelledTable, exps: np.ndarray, security: Security,
           engine: str, monkeypatch: pytest.MonkeyPatch, train: TrainParams = TRAIN,
           aborts: str | None = None, wrap: Any = None, **settings: Any) -> Run:
    """The job on ``table`` through its own deployment under ``root``."""
    dep = Deployment.create(root, security.parties, engines=(engine,), **settings)
    run = Run(root, [s.mpc_port_base for s in dep.settings])
    usable = party_state.usable_engines
    with monkeypatch.context() as patch:
        patch.setattr(party_state, "usable_engines", lambda s: {
            n: RecordingEngine(e if wrap is None else wrap(e), run.progress)
            for n, e in usable(s).items()})
        keep = _Keep(run.log)
        logger = logging.getLogger()
        old_level = logger.level
        logger.addHandler(keep)
        logger.setLevel(logging.INFO)
        try:
            raw, out = asyncio.run(_run_job(run, dep, table, exps, security, engine, train,
                                            aborts))
        finally:
            logger.removeHandler(keep)
            logger.setLevel(old_level)
    _check_against_oracle(raw, table, out, train, aborts)
    return run


# ---------------------------------------------------------------- a party's view, normalised

# What differs between two runs of one job by design, whatever the data: wall-clock
# times and durations, and memory peaks.
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:\+00:00|Z)?")
_DURATION = re.compile(r"(?i)(?<![\w.+/-])(\d+(?:\.\d+)?(?:e[+-]?\d+)?)(\s*(?:s|seconds?|ms)\b)")
_CPU_TIME = re.compile(r"(?i)(\btime\s*=\s*)\d+(?:\.\d+)?(?:e[+-]?\d+)?")
# process ids (the engine's worker processes)
_PID = re.compile(r"\bpid=\d+")
_TIME_KEYS = {"seconds", "mpc_seconds", "max_rss_kb", "phases", "ts", "created_at",
              "updated_at", "t"}
# the files whose bytes are random by design: keys, certificates, signatures, key
# statements and signed manifests (names compared); sealed uploads and the masked
# result words (names and sizes compared)
_KEY_FILES = re.compile(
    r"(\.key|\.pem|\.crt|\.csr|\.sig|\.0|manifest[^/]*|party-keys\.json|owners\.json"
    r"|\.lock|server\.port|worker\.pid|peak-rss)$")
_MASKED_FILES = re.compile(r"(\.sealed|part[^/]*|opened\.u64)$")


def _text(text: str, run: Run) -> str:
    """``text`` with what stands for the same thing in every run named alike: the run's
    directory, its ports (as whole numbers: a port's digits inside a time, "Time =
    0.0412345 seconds", are the time's), times, durations and process ids."""
    for root in (str(run.root.resolve()), str(run.root)):
        text = text.replace(root, "<root>")
    for i, port in enumerate(run.ports):
        text = re.sub(rf"(?<![\d.]){port}(?!\d)", f"<port{i}>", text)
    text = _TIMESTAMP.sub("<ts>", text)
    text = _PID.sub("pid=<pid>", text)
    text = _CPU_TIME.sub(r"\1<n>", text)
    return _DURATION.sub(r"<n>\2", text)


def _json(value: Any, run: Run, random_keys: frozenset[str] = frozenset()) -> Any:
    if isinstance(value, dict):
        return {k: "<random>" if k in random_keys else "<time>" if k in _TIME_KEYS
                else _json(v, run, random_keys) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v, run, random_keys) for v in value]
    if isinstance(value, str):
        return _text(value, run)
    if isinstance(value, int) and value in run.ports:
        return f"<port{run.ports.index(value)}>"
    return value


# Fields of the audit log and the job record that are hashes or fingerprints of random
# bytes (sealed parts, the parties' and the recipient's fresh keys).
_RANDOM_FIELDS = frozenset({"description_sha256", "description_hex", "manifest_sha256",
                            "recipient_key", "consents_spent", "spent_consents",
                            "mpc_port", "peers", "session_tag"})


def party_view(run: Run, party: int, state_dir: Path) -> dict[str, Any]:
    view: dict[str, Any] = {}
    files: dict[str, Any] = {}
    for f in sorted(state_dir.rglob("*")):
        rel = f.relative_to(state_dir).as_posix()
        if f.is_dir():
            files[rel] = "dir"
            continue
        if f.is_symlink() and not f.exists():
            files[rel] = "dangling link"
            continue
        if f.is_symlink():
            files[rel] = "link"
            continue
        if _KEY_FILES.search(rel):
            files[rel] = "random"
            continue
        if _MASKED_FILES.search(rel):
            files[rel] = ("size", f.stat().st_size)
            continue
        data = f.read_bytes()
        try:
            text = data.decode()
        except UnicodeDecodeError:
            files[rel] = ("binary", len(data))
            continue
        if f.suffix == ".json" or rel.endswith("result.json"):
            try:
                files[rel] = _json(json.loads(text), run, _RANDOM_FIELDS)
                continue
            except ValueError:
                pass
        if rel == "audit.log":
            files[rel] = [_json(json.loads(line), run, _RANDOM_FIELDS)
                          for line in text.splitlines()]
            continue
        files[rel] = _text(text, run).splitlines()
    view["files"] = files
    view["progress"] = [(_text(msg, run), frac) for msg, frac in run.progress[party]]
    status = run.final[party]
    view["status"] = (status.state, status.phase, status.progress, status.error,
                      status.bytes_sent, status.program_sha256)
    return view


def daemon_log(run: Run) -> list[str]:
    """Every log line the daemons (and the engines in their process) wrote, with its
    exception text: the daemons share this process, so their lines are compared as one
    sorted list (their interleaving is a matter of timing)."""
    lines = []
    for r in run.log:
        line = f"{r.name} {r.levelname} {r.getMessage()}"
        if r.exc_info and r.exc_info[1] is not None:
            line += f" {r.exc_info[1]!r}"
        lines.append(_text(line, run))
    return sorted(lines)


def assert_same_view(runs: list[Run], parties: int) -> None:
    first = runs[0]
    for other in runs[1:]:
        for i in range(parties):
            a = party_view(first, i, first.root / f"party{i}")
            b = party_view(other, i, other.root / f"party{i}")
            for what in a:
                assert a[what] == b[what], (f"party {i}'s {what} differ between data sets",
                                            _first_difference(a[what], b[what]))
        assert daemon_log(first) == daemon_log(other)
    # the masked result words differ (fresh masks), as they must
    opened = [r.opened.tobytes() for r in runs if r.opened is not None]
    assert len(set(opened)) == len(opened)


def _first_difference(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return key, _first_difference(a.get(key), b.get(key))
    if isinstance(a, list) and isinstance(b, list):
        for n, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return n, _first_difference(x, y)
        return "length", len(a), len(b)
    return a, b


# ---------------------------------------------------------------- the tests


def test_a_party_sees_the_same_mpyc_job_whatever_the_data(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables, exps = data_sets()
    runs = [run_on(tmp_path / f"d{n}", t, exps, Security.PASSIVE_3PC, "mpyc", monkeypatch)
            for n, t in enumerate(tables)]
    assert_same_view(runs, 3)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("security", [Security.PASSIVE_3PC, Security.ACTIVE_3PC,
                                      Security.ACTIVE_4PC], ids=lambda s: s.value)
def test_a_party_sees_the_same_mpspdz_job_whatever_the_data(
        security: Security, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tables, exps = data_sets()
    cache = tmp_path_factory.getbasetemp() / "mpspdz-cache"
    runs = [run_on(tmp_path / f"d{n}", t, exps, security, "mp-spdz", monkeypatch,
                   mpspdz_cache=cache)
            for n, t in enumerate(tables)]
    assert_same_view(runs, security.parties)


@pytest.mark.parametrize("kind", ["ratio", "weights"])
def test_a_range_abort_shows_a_party_one_bit_whatever_the_data(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tables, exps = abort_data_sets(kind)
    train = RATIO if kind == "ratio" else WEIGHTS
    runs = [run_on(tmp_path / f"d{n}", t, exps, Security.PASSIVE_3PC, "mpyc", monkeypatch,
                   train=train, aborts=kind) for n, t in enumerate(tables)]
    assert_same_view(runs, 3)


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("kind", ["ratio", "weights"])
def test_a_range_abort_shows_an_mpspdz_party_one_bit_whatever_the_data(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    tables, exps = abort_data_sets(kind)
    train = RATIO if kind == "ratio" else WEIGHTS
    cache = tmp_path_factory.getbasetemp() / "mpspdz-cache"
    runs = [run_on(tmp_path / f"d{n}", t, exps, Security.PASSIVE_3PC, "mp-spdz", monkeypatch,
                   train=train, aborts=kind, mpspdz_cache=cache)
            for n, t in enumerate(tables)]
    assert_same_view(runs, 3)


class StoppingEngine(EngineWrapper):
    """An engine whose run reports three stages at once and then stops on the ratio
    check, as a run does that fails between two looks of its daemon."""


    async def run_party(self, spec: Any, progress: Any = None) -> Any:
        for stage in ("ranking", "selection", "training"):
            progress(f"mpyc: {stage}")
        raise RangeAbortError(step2b.abort_message("ratio"))


def test_a_failed_jobs_record_shows_how_far_its_run_went(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the record of a job whose run ended between two looks of its daemon counts every
    # stage the run reported (here "selection", 0.9), whenever the daemon looked
    tables, exps = abort_data_sets("ratio")
    run = run_on(tmp_path, tables[0], exps, Security.PASSIVE_3PC, "mpyc", monkeypatch,
                 train=RATIO, aborts="ratio", wrap=StoppingEngine)
    for i, status in enumerate(run.final):
        record = json.loads((tmp_path / f"party{i}" / "jobs" / f"{JOB_ID}.json").read_text())
        assert (record["state"], record["progress"]) == ("failed", 0.9)
        assert status.progress == pytest.approx(0.9)
