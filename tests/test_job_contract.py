"""The job contract: one definition of a job, its states and failure kinds; pinned
inputs; quick StartJob with compiling as a phase; cancels that race a start; session
tags that keep engines of different jobs apart; a complete audit log.

Party tests run real party servers (loopback, port 0, mutual TLS) on MPyC with tiny
tables; a slow compile is an engine wrapper whose ``prepare`` waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from party_harness import (
    Deployment,
    SealedUpload,
    SlowEngine,
    data_upload,
    describe_job,
    fetch_opened,
    identities,
    mask_upload,
    start_requests,
    upload_messages,
    watch_to_end,
)
from party_runs import party_specs, run_every_party
from ppfs_party import state as party_state
from ppfs_party.errors import CorruptStateError
from ppfs_party.jobs import JobRunner
from ppfs_party.kept import RevocationBook
from ppfs_party.server import start_party_server
from procs import processes_in

from ppfs.contract import (
    STORED_CONTRACT_VERSIONS,
    TIME_FORMAT,
    Combination,
    Consent,
    FailureKind,
    JobContract,
    JobState,
    PinnedDataset,
    PinnedUpload,
    Reveal,
    description_sha256,
    failure_kind,
    service_shape,
)
from ppfs.engines.base import Engine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.errors import ParameterError, SessionMismatchError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import prepare_inputs
from ppfs.scoring import Scorer
from ppfs.step2a import Security, Step2AShape, draw_mask_words, mirror, unmask_all
from ppfs.synthetic import make_table
from ppfs.upload import Manifest
from ppfs.v1 import party_pb2, party_pb2_grpc
from ppfs.withdrawal import Revocation, RevocationReceipt, Withdrawal, WithdrawalReceipt

Stub = party_pb2_grpc.PartyServiceStub


# ------------------------------------------------------------------ definitions


def test_states_and_failure_kinds_are_defined_once() -> None:
    states = party_pb2.JobState.DESCRIPTOR.values_by_name
    proto_states = {n.removeprefix("JOB_STATE_") for n in states}
    assert proto_states - {"UNSPECIFIED"} == {s.name for s in JobState}
    kinds = party_pb2.FailureKind.DESCRIPTOR.values_by_name
    proto_kinds = {n.removeprefix("FAILURE_KIND_") for n in kinds}
    assert proto_kinds - {"UNSPECIFIED"} == {k.name for k in FailureKind}
    for s in JobState:
        assert JobState.from_proto(s.to_proto()) is s
    for k in FailureKind:
        assert FailureKind.from_proto(k.to_proto()) is k


# ------------------------------------------------------------------ harness


def _slow_engines(monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[SlowEngine]:
    made: list[SlowEngine] = []

    def usable(settings: Any) -> dict[str, Engine]:
        e = SlowEngine(MpycEngine(), seconds)
        made.append(e)
        return {"mpyc": e}  # type: ignore[dict-item]

    monkeypatch.setattr(party_state, "usable_engines", usable)
    return made


@dataclasses.dataclass
class World:
    dep: Deployment
    stubs: list[Stub]
    box: list[bytes]
    raw: np.ndarray
    y: np.ndarray
    data: SealedUpload
    recipient: PrivateKey
    fp: FixedPoint

    def masks(self, shape: Step2AShape, upload_id: str, seed: int
              ) -> tuple[SealedUpload, np.ndarray]:
        words = draw_mask_words(shape.outputs)  # OS CSPRNG; `seed` only names the upload
        rec = self.dep.owners["recipient"]
        return mask_upload(rec, self.box, words, dataset_id=f"m-{upload_id}",
                           upload_id=upload_id), words

    async def put(self, up: SealedUpload, parties: range | list[int] | None = None) -> None:
        for i in parties if parties is not None else range(len(self.stubs)):
            await self.stubs[i].PutUploadPart(upload_messages(up, i))

    def job(self, job_id: str, datasets: list[list[SealedUpload]], mask: SealedUpload,
            k: int = 1, peers: list[str] | None = None,
            scorer: Scorer = Scorer.MS_GINI) -> party_pb2.JobDescription:
        return describe_job(
            job_id, datasets, mask=mask, k=k, security="passive-3pc", engine="mpyc",
            recipient_public_key=bytes(self.recipient.public_key),
            peers=peers or self.dep.peer_addresses(), scorer=scorer,
        )

    def shape(self) -> Step2AShape:
        return service_shape(self.raw.shape[0], self.raw.shape[1], 2, 1,
                             self.fp.value_bits, None)

    def part(self, rows: int, dataset_id: str, upload_id: str) -> SealedUpload:
        """Another upload with the first one's schema (its first ``rows`` rows)."""
        man = Manifest.from_bytes(self.data.manifest)
        return data_upload(self.dep.owners["owner-a"], self.box, self.raw[:rows],
                           man.columns, man.column_exponents, dataset_id=dataset_id,
                           upload_id=upload_id, onehot=np.zeros((rows, 1)),
                           label_column=man.label_column, classes=man.classes)

    def audit(self, i: int) -> list[dict[str, Any]]:
        path = self.dep.settings[i].state_dir / "audit.log"
        return [json.loads(line) for line in path.read_text().splitlines()]


def _run(tmp_path: Path, scenario: Callable[[World], Awaitable[None]], **overrides: Any
         ) -> None:
    async def main() -> None:
        dep = Deployment.create(tmp_path, 3, engines=("mpyc",), **overrides)
        servers = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        try:
            stubs = [Stub(c) for c in channels]
            box = [i.box_public_key for i in await identities(stubs)]
            table = make_table(12, 3, seed=4)
            fp = FixedPoint()
            exps = fp.choose_exponents(table.x, table.columns)
            raw = fp.encode(table.x, exps, table.columns)
            owner = dep.add_owner("owner-a")
            dep.add_owner("recipient")
            data = data_upload(owner, box, raw, table.columns, exps, dataset_id="ds",
                               upload_id="up-1", onehot=table.one_hot(),
                               label_column=table.label_column, classes=table.classes)
            w = World(dep, stubs, box, raw, table.y, data, dep.owners["recipient"].box, fp)
            await w.put(data)
            await scenario(w)
        finally:
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    asyncio.run(main())
    assert processes_in(tmp_path) == []  # no engine process left behind


async def _refusal(stub: Stub, desc: party_pb2.JobDescription) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.StartJob(start_requests(desc))
    assert info.value.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                 grpc.StatusCode.FAILED_PRECONDITION)
    return info.value.details() or ""


async def _check_result(w: World, desc: party_pb2.JobDescription, words: np.ndarray) -> None:
    ids = await identities(w.stubs)
    parts = await fetch_opened(w.stubs, ids, desc.job_id, w.recipient)
    assert all(np.array_equal(p, parts[0]) for p in parts)
    shape = JobContract.from_proto(desc).shape
    out = unmask_all(parts[0], words, shape)
    np.testing.assert_array_equal(out.indices, mirror(w.raw, w.y, shape).selected)


# ------------------------------------------------------------------ scorer


def test_scorer_is_part_of_the_contract() -> None:
    base = JobContract(
        job_id="j", datasets=(PinnedDataset("ds", (PinnedUpload("u", "0" * 64, 30),)),),
        combination=Combination.HORIZONTAL, label_column="y", k=2,
        security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16,
        recipient_public_key=bytes(32), mask_upload_id="m", m=30, p=5, classes=2)
    digests = set()
    for scorer in Scorer:
        job = dataclasses.replace(base, scorer=scorer)
        desc = job.to_proto()
        assert desc.scorer == scorer.value
        back = JobContract.from_proto(desc)
        assert back == job and back.shape.scorer is scorer
        digests.add(description_sha256(desc))
    assert len(digests) == 3  # the description hash (and the session tag) binds the scorer
    desc = base.to_proto()
    desc.scorer = ""
    assert JobContract.from_proto(desc).scorer is Scorer.MS_GINI
    desc.scorer = "gini-impurity"
    with pytest.raises(ParameterError, match="unknown scorer"):
        JobContract.from_proto(desc)


def test_a_new_job_needs_this_contract_version_a_stored_one_may_be_older() -> None:
    """A party accepts new jobs only under the current contract (it checks the
    recipient's request, which version 2 lacked), but still reads the jobs it recorded
    before an upgrade, so that their results stay fetchable."""
    base = JobContract(
        job_id="j", datasets=(PinnedDataset("ds", (PinnedUpload("u", "0" * 64, 30),)),),
        combination=Combination.HORIZONTAL, label_column="y", k=2,
        security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16,
        recipient_public_key=bytes(32), mask_upload_id="m", m=30, p=5, classes=2)
    old = base.to_proto()
    old.contract_version = 2
    with pytest.raises(ParameterError, match="version 2 is not 3"):
        JobContract.from_proto(old)
    assert JobContract.from_proto(old, versions=STORED_CONTRACT_VERSIONS) == base
    old.contract_version = 1
    with pytest.raises(ParameterError, match="version 1"):
        JobContract.from_proto(old, versions=STORED_CONTRACT_VERSIONS)


@pytest.mark.parametrize("scorer", [Scorer.PEARSON, Scorer.CHI2], ids=lambda s: s.value)
def test_party_job_runs_the_scorer_it_states(tmp_path: Path, scorer: Scorer) -> None:
    async def scenario(w: World) -> None:
        shape = dataclasses.replace(w.shape(), scorer=scorer)
        mask, words = w.masks(shape, "mask-1", 1)
        await w.put(mask)
        desc = w.job("job-s", [[w.data]], mask, scorer=scorer)
        for s in w.stubs:
            await s.StartJob(start_requests(desc))
        states = await asyncio.gather(*(watch_to_end(s, "job-s") for s in w.stubs))
        assert all(st.state == party_pb2.JOB_STATE_SUCCEEDED for st in states), states
        assert JobContract.from_proto(desc).shape.scorer is scorer
        await _check_result(w, desc, words)

    _run(tmp_path, scenario)


# ------------------------------------------------------------------ pinned inputs


def test_job_runs_only_on_the_uploads_it_pins(tmp_path: Path) -> None:
    async def scenario(w: World) -> None:
        shape = w.shape()
        mask, _ = w.masks(shape, "mask-1", 1)
        await w.put(mask)
        # an upload of the same data set held by Bob only, not named by the job
        extra = w.part(4, "ds", "up-extra")
        await w.put(extra, [1])
        # an upload named by the job that nobody holds
        missing = _renamed(extra, "up-missing")
        desc = w.job("j-pins", [[w.data]], mask)
        why = await _refusal(w.stubs[1], desc)
        assert "Bob holds upload 'up-extra' of data set 'ds' not named by the job" in why
        desc2 = w.job("j-missing", [[w.data, missing]], mask)
        why = await _refusal(w.stubs[0], desc2)
        assert "Alice does not hold upload 'up-missing' of data set 'ds'" in why
        # a description whose m does not match the pinned uploads
        bad = w.job("j-m", [[w.data]], mask)
        bad.m += 1
        bad.outputs = JobContract.from_proto(bad).outputs
        why = await _refusal(w.stubs[0], bad)
        assert "m=12" in why and "m=13" in why
        # one upload pinned three times (its rows stacked again, m to match): each party
        # refuses, though the recipient's signed request names the data set only
        again = w.job("j-again", [[w.data, w.data, w.data]], mask)
        assert again.m == 36
        for stub in w.stubs:
            why = await _refusal(stub, again)
            assert "the job pins upload 'up-1' of data set 'ds' more than once" in why, why
        refused = {e["job_id"] for e in w.audit(0) if e["event"] == "job.refused"}
        assert {"j-missing", "j-m", "j-again"} <= refused
        assert {"j-pins"} <= {e["job_id"] for e in w.audit(1) if e["event"] == "job.refused"}

    _run(tmp_path, scenario)


def test_a_job_id_names_one_job_and_a_refused_one_is_not_kept(tmp_path: Path) -> None:
    """A job's id names its record and its directory side by side, so an id such as
    'j.json' (whose directory would be job 'j''s record) is refused; a job whose record
    cannot be written is not known afterwards, and its masks stay unspent."""
    async def scenario(w: World) -> None:
        mask, _ = w.masks(w.shape(), "mask-1", 1)
        await w.put(mask)
        for stub in w.stubs:
            why = await _refusal(stub, w.job("j.json", [[w.data]], mask))
            assert "job id must be" in why, why
        blocked = w.dep.settings[0].state_dir / "jobs" / "j-blocked.json"
        blocked.mkdir(parents=True)  # where Alice would write the record
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.stubs[0].StartJob(start_requests(w.job("j-blocked", [[w.data]], mask)))
        assert info.value.code() == grpc.StatusCode.INTERNAL
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await w.stubs[0].GetJob(party_pb2.GetJobRequest(job_id="j-blocked"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        ok = w.job("j-ok", [[w.data]], mask)
        for stub in w.stubs:
            await stub.StartJob(start_requests(ok))  # the same masks: not spent above
        for stub in w.stubs:
            await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j-ok"))

    _run(tmp_path, scenario)


def test_tombstones_of_unseen_ids_are_bounded(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel of a job, or an abort of an upload, that a party never received is
    remembered (so that the job or part is refused if it arrives later), up to a bound:
    beyond it the party refuses, keeping its disk; known ones are still cancelled."""
    import ppfs_party.jobs as jobs
    import ppfs_party.store as store

    monkeypatch.setattr(jobs, "MAX_TOMBSTONES", 3)
    monkeypatch.setattr(store, "MAX_TOMBSTONES", 3)

    async def scenario(w: World) -> None:
        s = w.stubs[0]
        for i in range(3):
            await s.CancelJob(party_pb2.CancelJobRequest(job_id=f"never-{i}"))
            await s.AbortUpload(party_pb2.UploadDecisionRequest(dataset_id="ds",
                                                         upload_id=f"never-{i}"))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await s.CancelJob(party_pb2.CancelJobRequest(job_id="never-3"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 3 jobs cancelled before they started" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await s.AbortUpload(party_pb2.UploadDecisionRequest(dataset_id="ds",
                                                                upload_id="never-3"))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        jobs_dir = w.dep.settings[0].state_dir / "jobs"
        assert sorted(p.name for p in jobs_dir.glob("never-*.json")) == [
            f"never-{i}.json" for i in range(3)]
        # a remembered one is still refused when it arrives
        mask, _ = w.masks(w.shape(), "mask-1", 1)
        await w.put(mask)
        why = await _refusal(s, w.job("never-0", [[w.data]], mask))
        assert "cancelled" in why, why

    _run(tmp_path, scenario)


def test_a_data_sets_uploads_run_only_in_their_owners_signed_order(tmp_path: Path) -> None:
    """The job's writer (the gateway) cannot restack a data set's rows: every party
    requires its uploads in the order their owners signed (creation time, then id)."""
    async def scenario(w: World) -> None:
        mask, _ = w.masks(w.shape(), "mask-1", 1)
        await w.put(mask)
        later = w.part(4, "ds", "up-0")  # signed after up-1, though its id sorts first
        await w.put(later)
        assert Manifest.from_bytes(later.manifest).order_key() > \
            Manifest.from_bytes(w.data.manifest).order_key()
        swapped = w.job("j-swapped", [[later, w.data]], mask)
        for stub in w.stubs:
            why = await _refusal(stub, swapped)
            assert ("the job lists the uploads of data set 'ds' out of the order their "
                    "owners signed; in that order they are 'up-1', 'up-0'") in why
        for i in range(3):
            assert "j-swapped" in {e["job_id"] for e in w.audit(i)
                                   if e["event"] == "job.refused"}
        signed = w.job("j-signed", [[w.data, later]], mask)
        for stub in w.stubs:
            await stub.StartJob(start_requests(signed))  # accepted
        for stub in w.stubs:
            await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j-signed"))

    _run(tmp_path, scenario)


def _renamed(up: SealedUpload, upload_id: str) -> SealedUpload:
    """The same upload under another id (its manifest only; never sent to a party)."""
    man = dataclasses.replace(Manifest.from_bytes(up.manifest), upload_id=upload_id)
    return dataclasses.replace(up, manifest=man.to_bytes(), upload_id=upload_id)


# ------------------------------------------------------------------ quick start, slow compile


def test_slow_compile_is_a_phase_and_is_cached(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    engines = _slow_engines(monkeypatch, seconds=3.0)

    async def scenario(w: World) -> None:
        for n in (1, 2):
            shape = w.shape()
            mask, words = w.masks(shape, f"mask-{n}", n)
            await w.put(mask)
            desc = w.job(f"j-slow-{n}", [[w.data]], mask)
            # StartJob answers well inside a deadline shorter than the compile
            for s in w.stubs:
                resp = await s.StartJob(start_requests(desc), timeout=1.0)
                assert resp.state == party_pb2.JOB_STATE_QUEUED
            finals = await asyncio.gather(*(watch_to_end(s, desc.job_id) for s in w.stubs))
            assert all(f.state == party_pb2.JOB_STATE_SUCCEEDED for f in finals), finals
            await _check_result(w, desc, words)
        # the second job of the same shape found the program in the cache
        # (the first three engines belong to the deployment's set-up, not the servers)
        assert [len(e.compiles) for e in engines[-3:]] == [1, 1, 1]

    _run(tmp_path, scenario)


# ------------------------------------------------------------------ cancel races start


def test_cancel_while_compiling_and_before_start(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    engines = _slow_engines(monkeypatch, seconds=2.0)

    async def scenario(w: World) -> None:
        shape = w.shape()
        mask, _ = w.masks(shape, "mask-c", 3)
        await w.put(mask)
        desc = w.job("j-cancel", [[w.data]], mask)
        # Alice and Bob start (and compile); Carol hears of the cancel first
        for s in w.stubs[:2]:
            await s.StartJob(start_requests(desc))
        for s in w.stubs[:2]:  # cancel while the compile is under way
            while (await s.GetJob(party_pb2.GetJobRequest(job_id="j-cancel"))
                   ).phase != "compiling":
                await asyncio.sleep(0.02)
        acks = [await s.CancelJob(party_pb2.CancelJobRequest(job_id="j-cancel"))
                for s in w.stubs]
        assert [a.remembered for a in acks] == [False, False, True]
        assert all(a.state == party_pb2.JOB_STATE_CANCELLED for a in acks)
        why = await _refusal(w.stubs[2], desc)  # the late StartJob loses
        assert "cancelled before it reached Carol" in why
        for s in w.stubs:
            st = await s.GetJob(party_pb2.GetJobRequest(job_id="j-cancel"))
            assert st.state == party_pb2.JOB_STATE_CANCELLED
            assert st.failure == party_pb2.FAILURE_KIND_CANCELLED
        # the compile that was under way finishes into the cache all the same
        for _ in range(100):
            if all(e.compiles for e in engines[-3:-1]):
                break
            await asyncio.sleep(0.05)
        assert [len(e.compiles) for e in engines[-3:]] == [1, 1, 0]
        for i in range(3):
            events = [(e["event"], e.get("job_id")) for e in w.audit(i)]
            assert ("job.cancel", "j-cancel") in events
        assert ("job.refused", "j-cancel") in [(e["event"], e.get("job_id"))
                                               for e in w.audit(2)]

    _run(tmp_path, scenario)


def test_a_withdrawal_stops_the_jobs_that_use_its_uploads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the owner withdraws its data while a job on it compiles: every party stops the job
    # itself (it checks the owner's signature, not the gateway's word), and a job on the
    # data set started afterwards is refused, its upload gone
    _slow_engines(monkeypatch, seconds=2.0)

    async def scenario(w: World) -> None:
        mask, _ = w.masks(w.shape(), "mask-w", 5)
        await w.put(mask)
        desc = w.job("j-withdrawn", [[w.data]], mask)
        for s in w.stubs:
            await s.StartJob(start_requests(desc))
        signed = Withdrawal.now("owner-a", "ds").sign(w.dep.owners["owner-a"].key)
        for s in w.stubs:
            got = await s.WithdrawUploads(party_pb2.WithdrawUploadsRequest(
                statement=signed.statement, signature=signed.signature))
            assert WithdrawalReceipt.from_bytes(got.receipt).deleted == ("up-1",)
        for s in w.stubs:
            st = await s.GetJob(party_pb2.GetJobRequest(job_id="j-withdrawn"))
            assert st.state == party_pb2.JOB_STATE_FAILED
            assert st.failure == party_pb2.FAILURE_KIND_REFUSED
            assert st.error == "an upload it uses was withdrawn by its owner"
        later = w.job("j-after", [[w.data]], mask)
        assert "up-1" in await _refusal(w.stubs[0], later)
        for i in range(3):
            events = [(e["event"], e.get("job_id")) for e in w.audit(i)]
            assert ("job.cancel", "j-withdrawn") in events

    _run(tmp_path, scenario)


def test_another_owners_upload_while_a_job_waits_leaves_the_job_as_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # owner-b adds rows to the data set owner-a's recipient runs a job on, after every
    # party accepted the job and before it assembled its inputs (it compiles): the job
    # runs on the uploads it pinned, as the owners consented and the recipient asked,
    # and is not stopped by another owner's ordinary upload
    _slow_engines(monkeypatch, seconds=2.0)

    async def scenario(w: World) -> None:
        owner_b = w.dep.add_owner("owner-b")
        shape = w.shape()
        mask, words = w.masks(shape, "mask-b", 8)
        await w.put(mask)
        desc = w.job("j-accepted", [[w.data]], mask)
        for s in w.stubs:
            await s.StartJob(start_requests(desc))
        for s in w.stubs:
            while (await s.GetJob(party_pb2.GetJobRequest(job_id="j-accepted"))
                   ).phase != "compiling":
                await asyncio.sleep(0.02)
        man = Manifest.from_bytes(w.data.manifest)
        later = data_upload(owner_b, w.box, w.raw[:5], man.columns, man.column_exponents,
                            dataset_id="ds", upload_id="up-b", onehot=np.zeros((5, 1)),
                            label_column=man.label_column, classes=man.classes)
        await w.put(later)
        finals = await asyncio.gather(*(watch_to_end(s, "j-accepted") for s in w.stubs))
        assert all(f.state == party_pb2.JOB_STATE_SUCCEEDED for f in finals), finals
        await _check_result(w, desc, words)  # on the pinned rows alone
        # a job started now pins owner-b's rows too, or is refused naming them
        mask2, _ = w.masks(shape, "mask-b2", 9)
        await w.put(mask2)
        stale = w.job("j-stale", [[w.data]], mask2)
        assert "holds upload 'up-b' of data set 'ds' not named by the job" in \
            await _refusal(w.stubs[0], stale)

    _run(tmp_path, scenario)


def test_a_job_started_while_a_withdrawal_stops_the_others_is_stopped_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a turned gateway relays the owner's withdrawal and, while the party stops the job
    # already running on the data (an engine takes its time to die), starts another one
    # on the same upload: the party must not leave that job running on withdrawn rows
    _slow_engines(monkeypatch, seconds=5.0)
    stopping = asyncio.Event()
    started_meanwhile = asyncio.Event()
    stop_using = JobRunner.stop_using

    async def slow_stop(self: JobRunner, upload_ids: Any, reason: str) -> list[str]:
        stopped = await stop_using(self, upload_ids, reason)
        stopping.set()  # as long as an engine takes to die
        await started_meanwhile.wait()
        return stopped

    monkeypatch.setattr(JobRunner, "stop_using", slow_stop)

    async def scenario(w: World) -> None:
        mask, _ = w.masks(w.shape(), "mask-w1", 5)
        mask2, _ = w.masks(w.shape(), "mask-w2", 6)
        await w.put(mask)
        await w.put(mask2)
        first = w.job("j-running", [[w.data]], mask)
        await w.stubs[0].StartJob(start_requests(first))
        signed = Withdrawal.now("owner-a", "ds").sign(w.dep.owners["owner-a"].key)
        withdraw = asyncio.ensure_future(w.stubs[0].WithdrawUploads(
            party_pb2.WithdrawUploadsRequest(statement=signed.statement,
                                             signature=signed.signature)))
        await stopping.wait()
        late = w.job("j-meanwhile", [[w.data]], mask2)
        with contextlib.suppress(grpc.aio.AioRpcError):  # refused: as good
            await w.stubs[0].StartJob(start_requests(late))
        started_meanwhile.set()
        got = await withdraw
        assert WithdrawalReceipt.from_bytes(got.receipt).held == 0
        with contextlib.suppress(grpc.aio.AioRpcError):
            st = await w.stubs[0].GetJob(party_pb2.GetJobRequest(job_id="j-meanwhile"))
            assert st.state != party_pb2.JOB_STATE_QUEUED, st
            assert st.state != party_pb2.JOB_STATE_RUNNING, st
            assert st.error == "an upload it uses was withdrawn by its owner"

    _run(tmp_path, scenario)


def test_a_revoked_consent_stops_and_refuses_the_jobs_that_rely_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # owner-a revokes its consents to the recipient while a job on them compiles: every
    # party keeps the revocation (checked against owner-a's key, not the gateway's word),
    # stops the job and refuses one relying on a consent given before; a consent given
    # afterwards counts again
    _slow_engines(monkeypatch, seconds=2.0)

    async def scenario(w: World) -> None:
        owner = w.dep.owners["owner-a"]
        rec_key = bytes(w.recipient.public_key)
        before = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).strftime(TIME_FORMAT)
        old = Consent("owner-a", "ds", "recipient", rec_key, Reveal.SELECTION,
                      created_at=before).sign(owner.key)
        mask, _ = w.masks(w.shape(), "mask-r1", 6)
        await w.put(mask)
        running = w.job("j-revoked", [[w.data]], mask)
        for st in w.stubs:
            await st.StartJob(start_requests(running))
        signed = Revocation.now("owner-a", "ds", "recipient").sign(owner.key)
        forged = Revocation.now("owner-a", "ds", "recipient").sign(SigningKey.generate())
        for st in w.stubs:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await st.RevokeConsents(party_pb2.RevokeConsentsRequest(
                    statement=forged.statement, signature=forged.signature))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "not signed by the key registered" in (info.value.details() or "")
        for st in w.stubs:
            got = await st.RevokeConsents(party_pb2.RevokeConsentsRequest(
                statement=signed.statement, signature=signed.signature))
            receipt = RevocationReceipt.from_bytes(got.receipt)
            assert (receipt.recipient, receipt.jobs_stopped) == ("recipient", 1)
        for st in w.stubs:
            job = await st.GetJob(party_pb2.GetJobRequest(job_id="j-revoked"))
            assert job.state == party_pb2.JOB_STATE_FAILED
            assert job.failure == party_pb2.FAILURE_KIND_REFUSED
            assert job.error == "a consent it relies on was revoked by its owner"
        # a job relying on a consent given before the revocation: refused, naming it
        mask2, _ = w.masks(w.shape(), "mask-r2", 7)
        await w.put(mask2)
        refused = describe_job(
            "j-old-consent", [[w.data]], mask=mask2, k=1, security="passive-3pc",
            engine="mpyc", recipient_public_key=rec_key, peers=w.dep.peer_addresses(),
            consents=[old])
        assert "its owner revoked its consent" in await _refusal(w.stubs[1], refused)
        # the owner consents again, in a later second than the revocation (a consent
        # states its time to the second): the job runs
        await asyncio.sleep(1.05)
        again = w.job("j-new-consent", [[w.data]], mask2)
        for st in w.stubs:
            await st.StartJob(start_requests(again))
        for st in w.stubs:
            assert (await watch_to_end(st, "j-new-consent")).state == \
                party_pb2.JOB_STATE_SUCCEEDED

    _run(tmp_path, scenario)


def test_a_kept_revocation_survives_a_restart_and_a_damaged_one_stops_the_start(
    tmp_path: Path,
) -> None:
    owner = SigningKey.generate()
    signed = Revocation.now("owner-a", "ds", "recipient").sign(owner)
    consent = Consent("owner-a", "ds", "recipient", bytes(32), Reveal.SELECTION,
                      created_at="2025-01-01T00:00:00Z")
    later = dataclasses.replace(consent, created_at="2999-01-01T00:00:00Z")
    book = RevocationBook(tmp_path)
    book.open()
    book.keep(signed.digest, signed.statement, signed.signature,
              signed.verify(bytes(owner.verify_key)))
    again = RevocationBook(tmp_path)
    again.open()
    assert again.covers(consent) and not again.covers(later)
    assert not again.covers(dataclasses.replace(consent, recipient="someone-else"))
    (kept,) = (tmp_path / "revoked").glob("*.json")
    kept.write_bytes(kept.read_bytes()[:20])
    with pytest.raises(CorruptStateError, match="would count again"):
        RevocationBook(tmp_path).open()


# ------------------------------------------------------------------ two jobs, one session


def test_refused_job_never_shares_a_session_with_the_next(tmp_path: Path) -> None:
    """Job 1 is refused by Bob (he lacks an upload it pins) while Alice and Carol start
    it; job 2 follows at once on the same data set. First without the gateway's cancel,
    on the same MPC ports: the engines of the two jobs meet and stop at the session
    check, before any data. Then as the gateway does it (cancel everywhere, next port):
    job 2 succeeds and matches the mirror."""

    async def scenario(w: World) -> None:
        shape = w.shape()
        only_ac = w.part(4, "ds-2", "up-ac")
        await w.put(only_ac, [0, 2])
        ports = [s.mpc_port_base for s in w.dep.settings]
        same = [f"127.0.0.1:{p}" for p in ports]
        nxt = [f"127.0.0.1:{p + 1}" for p in ports]

        masks = [w.masks(shape, f"mask-{n}", 10 + n) for n in range(4)]
        for mk, _ in masks:
            await w.put(mk)
        # -- without a cancel, same ports: engines of two jobs meet
        job1 = w.job("j-one", [[w.data]], masks[0][0], peers=same)
        job2 = w.job("j-two", [[w.data]], masks[1][0], peers=same)
        # Bob "refuses" job 1 by never starting it; Alice and Carol run it, Bob runs job 2
        for i in (0, 2):
            await w.stubs[i].StartJob(start_requests(job1))
        await w.stubs[1].StartJob(start_requests(job2))
        bob = await watch_to_end(w.stubs[1], "j-two", timeout=120)
        assert bob.state == party_pb2.JOB_STATE_FAILED
        assert bob.failure == party_pb2.FAILURE_KIND_SESSION, bob.error
        for i in (0, 2):
            st = await watch_to_end(w.stubs[i], "j-one", timeout=120)
            assert st.state == party_pb2.JOB_STATE_FAILED
            assert st.failure == party_pb2.FAILURE_KIND_SESSION, st.error
        for i in range(3):  # nobody loaded shares: the check came first
            for job_id in ("j-one", "j-two"):
                status = w.dep.settings[i].state_dir / "jobs" / job_id / "engine" / "status.txt"
                if status.exists():
                    assert "loading shares" not in status.read_text()

        # -- as the gateway does it: refused at Bob, cancelled everywhere, next job at once
        job3 = w.job("j-three", [[w.data], [only_ac]], masks[2][0], peers=nxt)
        for i in (0, 2):
            await w.stubs[i].StartJob(start_requests(job3))
        why = await _refusal(w.stubs[1], job3)
        assert "Bob does not hold upload 'up-ac' of data set 'ds-2'" in why
        for s in w.stubs:
            await s.CancelJob(party_pb2.CancelJobRequest(job_id="j-three"))
        job4 = w.job("j-four", [[w.data]], masks[3][0], peers=same)
        for s in w.stubs:
            await s.StartJob(start_requests(job4))
        finals = await asyncio.gather(*(watch_to_end(s, "j-four", timeout=120)
                                        for s in w.stubs))
        assert all(f.state == party_pb2.JOB_STATE_SUCCEEDED for f in finals), [
            f.error for f in finals]
        assert all(f.failure == party_pb2.FAILURE_KIND_UNSPECIFIED for f in finals)
        await _check_result(w, job4, masks[3][1])
        for i in (0, 2):
            st = await w.stubs[i].GetJob(party_pb2.GetJobRequest(job_id="j-three"))
            assert st.state == party_pb2.JOB_STATE_CANCELLED
        for i in range(3):
            events = {(e["event"], e.get("job_id")) for e in w.audit(i)}
            assert ("job.cancel", "j-three") in events
        assert ("job.refused", "j-three") in {(e["event"], e.get("job_id"))
                                              for e in w.audit(1)}

    _run(tmp_path, scenario, mpc_port_count=2)


# ------------------------------------------------------------------ engine session check


def test_mpyc_session_tag_mismatch_stops_before_data(tmp_path: Path) -> None:
    table = make_table(8, 3, seed=2)
    security = Security.PASSIVE_3PC
    prep = prepare_inputs(table, 1, security, tmp_path / "inputs")
    engine = MpycEngine(start_timeout=30)
    # Carol runs another job
    specs = party_specs(engine, prep.inputs, tmp_path / "run", tags=[11, 11, 12])
    got = run_every_party(engine, specs)
    assert all(isinstance(g, SessionMismatchError) for g in got), got
    for d in (s.workdir for s in specs):
        phases = (d / "status.txt").read_text()
        assert "checking the session" in phases and "loading shares" not in phases
        assert not (d / "opened.u64").exists()
    assert processes_in(tmp_path) == []


def test_mpyc_tags_alike_but_past_their_first_word_stop_before_data(tmp_path: Path) -> None:
    """A gateway chooses every job id it sends, so it can look for two descriptions of
    one tag: with a 63-bit tag, some 2^32 hashes find two (a birthday search), and two
    honest parties would then run different jobs in one session. The tag holds 252 bits,
    and a difference in any of them stops the run at the session check."""
    from ppfs.contract import SESSION_TAG_BITS

    assert SESSION_TAG_BITS >= 250
    table = make_table(8, 3, seed=2)
    security = Security.PASSIVE_3PC
    prep = prepare_inputs(table, 1, security, tmp_path / "inputs")
    engine = MpycEngine(start_timeout=30)
    tag = (1 << (SESSION_TAG_BITS - 1)) | 11
    # Carol's tag differs from the others' in its top bit alone
    specs = party_specs(engine, prep.inputs, tmp_path / "run",
                        tags=[tag, tag, tag ^ (1 << (SESSION_TAG_BITS - 1))])
    got = run_every_party(engine, specs)
    assert all(isinstance(g, SessionMismatchError) for g in got), got
    for d in (s.workdir for s in specs):
        phases = (d / "status.txt").read_text()
        assert "checking the session" in phases and "loading shares" not in phases
    assert processes_in(tmp_path) == []


def test_session_tag_binds_job_id_and_description() -> None:
    from ppfs.contract import SESSION_TAG_BITS, session_tag

    a = session_tag("job-1", "a" * 64)
    assert 0 <= a < 1 << SESSION_TAG_BITS
    # all of a SHA-256 but a few bits: no two descriptions of one tag are to be found
    assert SESSION_TAG_BITS >= 250
    assert a != session_tag("job-2", "a" * 64)
    assert a != session_tag("job-1", "b" * 64)
    assert description_sha256(party_pb2.JobDescription(job_id="x")) != description_sha256(
        party_pb2.JobDescription(job_id="y"))


def test_collective_failures_blame_no_party() -> None:
    """A range check every party opened, or disagreeing copies of a share component, stop
    every party alike: the gateway names the reporter, never as the party that failed."""
    from ppfs_gateway.jobs import failure_reason

    from ppfs.errors import IntegrityError, RangeAbortError

    assert failure_kind(RangeAbortError("weights out of range")) is FailureKind.OUT_OF_RANGE
    assert failure_kind(IntegrityError("copies disagree")) is FailureKind.INTEGRITY
    for kind in (FailureKind.OUT_OF_RANGE, FailureKind.INTEGRITY):
        st = party_pb2.JobStatus(state=party_pb2.JOB_STATE_FAILED, error="stopped",
                                 failure=kind.to_proto())
        reason = failure_reason("Bob", st)
        assert "Bob failed" not in reason and "no party is blamed" in reason
    own = party_pb2.JobStatus(state=party_pb2.JOB_STATE_FAILED, error="disk full",
                              failure=FailureKind.OWN.to_proto())
    assert failure_reason("Bob", own) == "Bob failed: disk full"
