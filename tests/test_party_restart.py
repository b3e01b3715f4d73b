"""Party daemons as separate processes: restarts and a party killed mid-job."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from nacl.public import PrivateKey
from party_harness import (
    Deployment,
    data_upload,
    describe_job,
    fetch_opened,
    identities,
    mask_upload,
    spawn_party,
    start_requests,
    upload_messages,
    watch_to_end,
)
from procs import processes_in

from ppfs.contract import service_shape
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Security, Step2AShape, draw_mask_words, mirror, unmask_all
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable
from ppfs.v1 import party_pb2, party_pb2_grpc

Stub = party_pb2_grpc.PartyServiceStub
_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()


def _engine_processes(root: Path) -> list[int]:
    return processes_in(root)


class Cluster:
    """Party daemons as processes, their channels, one owner and one recipient."""

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.procs: list[asyncio.subprocess.Process | None] = [None] * len(dep.settings)
        self.channels: list[grpc.aio.Channel | None] = [None] * len(dep.settings)
        self.stubs: list[Stub] = []
        self.owner = dep.add_owner("owner-a")
        self.recipient = dep.add_owner("recipient")

    async def start(self, i: int) -> None:
        proc, port = await spawn_party(self.dep.settings[i],
                                       self.dep.root / f"party{i}.log")
        self.procs[i] = proc
        old = self.channels[i]
        if old is not None:
            await old.close()
        ch = self.dep.channel(i, port)
        self.channels[i] = ch
        stub = Stub(ch)
        if len(self.stubs) > i:
            self.stubs[i] = stub
        else:
            self.stubs.append(stub)

    async def stop(self, i: int, sig: int = signal.SIGTERM) -> None:
        proc = self.procs[i]
        if proc is not None and proc.returncode is None:
            proc.send_signal(sig)
            await asyncio.wait_for(proc.wait(), 30)
        self.procs[i] = None

    async def close(self) -> None:
        for i in range(len(self.procs)):
            await self.stop(i, signal.SIGKILL)
        for ch in self.channels:
            if ch is not None:
                await ch.close()

    async def upload(self, table: LabelledTable, k: int, mask_id: str
                     ) -> tuple[np.ndarray, np.ndarray, Step2AShape]:
        ids = await identities(self.stubs)
        box = [i.box_public_key for i in ids]
        fp = FixedPoint()
        exps = fp.choose_exponents(table.x, table.columns)
        raw = fp.encode(table.x, exps, table.columns)
        shape = service_shape(table.m, table.p, table.n_classes, k, fp.value_bits, None)
        up = data_upload(self.owner, box, raw, table.columns, exps, dataset_id="ds",
                         upload_id="up-data", onehot=table.one_hot(),
                         label_column=table.label_column, classes=table.classes)
        for i, stub in enumerate(self.stubs):
            await stub.PutUploadPart(upload_messages(up, i))
        self.data_up = up
        words = self.add_mask(box, shape, mask_id)
        return raw, words, shape

    def add_mask(self, box: list[bytes], shape: Step2AShape, mask_id: str) -> np.ndarray:
        words = draw_mask_words(shape.outputs)
        self._pending_mask = mask_upload(self.recipient, box, words, dataset_id=f"m-{mask_id}",
                                         upload_id=mask_id)
        self.masks = {**getattr(self, "masks", {}), mask_id: self._pending_mask}
        return words

    async def send_mask(self) -> None:
        for i, stub in enumerate(self.stubs):
            await stub.PutUploadPart(upload_messages(self._pending_mask, i))

    def job(self, job_id: str, mask_id: str, security: Security, engine: str, k: int,
            recipient: PrivateKey) -> party_pb2.JobDescription:
        return describe_job(
            job_id, [[self.data_up]], mask=self.masks[mask_id], k=k, security=security.value,
            engine=engine, recipient_public_key=bytes(recipient.public_key),
            peers=self.dep.peer_addresses(),
        )

    async def run_job(self, desc: party_pb2.JobDescription, raw: np.ndarray, y: np.ndarray,
                      words: np.ndarray, shape: Step2AShape, recipient: PrivateKey) -> None:
        for stub in self.stubs:
            await stub.StartJob(start_requests(desc))
        finals = await asyncio.gather(*(watch_to_end(s, desc.job_id) for s in self.stubs))
        assert all(f.state == party_pb2.JOB_STATE_SUCCEEDED for f in finals), [
            f.error for f in finals]
        ids = await identities(self.stubs)
        parts = await fetch_opened(self.stubs, ids, desc.job_id, recipient)
        assert all(np.array_equal(p, parts[0]) for p in parts)
        out = unmask_all(parts[0], words, shape)
        ref = mirror(raw, y, shape)
        np.testing.assert_array_equal(out.indices, ref.selected)
        assert out.reduced is None and parts[0].size == shape.k  # D' never leaves MPC


def test_party_restarted_between_upload_and_job(tmp_path: Path) -> None:
    table = make_table(30, 5, seed=11)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))

    async def scenario() -> None:
        cluster = Cluster(dep)
        try:
            for i in range(3):
                await cluster.start(i)
            raw, words, shape = await cluster.upload(table, 2, "mask-1")
            await cluster.send_mask()
            await cluster.stop(1)  # SIGTERM: graceful stop, state on disk
            await cluster.start(1)
            recipient = cluster.recipient.box
            desc = cluster.job("job-1", "mask-1", Security.PASSIVE_3PC, "mpyc", 2, recipient)
            await cluster.run_job(desc, raw, table.y, words, shape, recipient)
        finally:
            await cluster.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("security", "engine"),
    [
        (Security.PASSIVE_3PC, "mpyc"),
        pytest.param(Security.ACTIVE_4PC, "mp-spdz", marks=[
            pytest.mark.mpspdz,
            pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}"),
        ]),
    ],
    ids=["mpyc-passive-3pc", "mpspdz-active-4pc"],
)
def test_party_killed_mid_job_then_resubmitted(security: Security, engine: str,
                                               tmp_path: Path) -> None:
    # big enough that the run is still going when the victim is killed (MP-SPDZ's active
    # 4PC finishes 1,000 x 40 in about half a second on an idle machine: too close to the
    # moment the victim is killed)
    table = make_table(150, 30, seed=12) if engine == "mpyc" else make_table(8000, 60, seed=12)
    small = 2
    n = security.parties
    dep = Deployment.create(tmp_path, n, engines=(engine,), job_timeout=600.0)
    victim = 1
    # MPyC reports its phases: wait for the comparisons; MP-SPDZ reports "running"
    computing = 0.3 if engine == "mpyc" else 0.1

    async def scenario() -> None:
        cluster = Cluster(dep)
        try:
            for i in range(n):
                await cluster.start(i)
            raw, _, shape = await cluster.upload(table, small, "mask-1")
            await cluster.send_mask()
            recipient = cluster.recipient.box
            desc = cluster.job("job-1", "mask-1", security, engine, small, recipient)
            for stub in cluster.stubs:
                await stub.StartJob(start_requests(desc))
            # wait until every party's engine is computing (each party assembles and
            # compiles as the job's first phases, so engines start at different times),
            # then kill the victim's daemon mid-run
            t_wait = time.monotonic()
            while True:
                states = [await stub.GetJob(party_pb2.GetJobRequest(job_id="job-1"))
                          for stub in cluster.stubs]
                for st in states:
                    assert st.state in (party_pb2.JOB_STATE_QUEUED,
                                        party_pb2.JOB_STATE_RUNNING), (st.state, st.error)
                if all(st.state == party_pb2.JOB_STATE_RUNNING and st.progress >= computing
                       for st in states) and all(
                        _engine_processes(s.state_dir) for s in dep.settings):
                    break
                assert time.monotonic() - t_wait < 120
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # the engines connect to each other within it
            t0 = time.monotonic()
            await cluster.stop(victim, signal.SIGKILL)
            others = [i for i in range(n) if i != victim]
            finals = await asyncio.wait_for(asyncio.gather(
                *(watch_to_end(cluster.stubs[i], "job-1") for i in others)), 60)
            elapsed = time.monotonic() - t0
            assert all(f.state == party_pb2.JOB_STATE_FAILED for f in finals), finals
            assert elapsed < 60
            # no engine process of any party is left behind (the victim's died with it)
            deadline = time.monotonic() + 10
            while any(_engine_processes(s.state_dir) for s in dep.settings):
                assert time.monotonic() < deadline, [
                    _engine_processes(s.state_dir) for s in dep.settings]
                await asyncio.sleep(0.1)

            await cluster.start(victim)
            st = await cluster.stubs[victim].GetJob(party_pb2.GetJobRequest(job_id="job-1"))
            assert st.state == party_pb2.JOB_STATE_FAILED and st.error == "party restarted"
            # resubmitted (a new job id and fresh masks) after the restart: succeeds
            box = [i.box_public_key for i in await identities(cluster.stubs)]
            words2 = cluster.add_mask(box, shape, "mask-2")
            await cluster.send_mask()
            desc2 = cluster.job("job-2", "mask-2", security, engine, small, recipient)
            await cluster.run_job(desc2, raw, table.y, words2, shape, recipient)
            # a mask is never used twice
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await cluster.stubs[0].StartJob(start_requests(
                    cluster.job("job-3", "mask-2", security, engine, small, recipient)))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await cluster.close()

    asyncio.run(scenario())
