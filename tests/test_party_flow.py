"""Party daemons over real gRPC (loopback, port 0, mutual TLS): upload, job, result.

A data owner (or two) shares and seals its data, the recipient shares mask words;
every party runs its own engine party; the recipient checks every part's signature,
unseals, finds all parts equal, unmasks and compares with the fixed-point mirror.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
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
from ppfs_party.server import SERVICE_NAME, start_party_server

from ppfs.contract import service_shape
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import EngineError
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Security, draw_mask_words, mirror, unmask_all
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable
from ppfs.v1 import party_pb2, party_pb2_grpc

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")


@pytest.fixture(scope="session")
def mpspdz_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("party-mpspdz-cache")


def _encode(table: LabelledTable) -> tuple[np.ndarray, np.ndarray, FixedPoint]:
    fp = FixedPoint()
    exps = fp.choose_exponents(table.x, table.columns)
    return fp.encode(table.x, exps, table.columns), exps, fp


async def run_scenario(
    dep: Deployment,
    table: LabelledTable,
    k: int,
    security: Security,
    engine: str,
    combination: str,
    peers: list[str] | None = None,
) -> float:
    """Two owners upload (split by rows or by columns), the recipient uploads masks,
    the job runs on every party (at ``peers``, default each party's first MPC port);
    returns the job's wall time."""
    n = security.parties
    servers = [await start_party_server(s) for s in dep.settings]
    channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
    try:
        stubs = [party_pb2_grpc.PartyServiceStub(c) for c in channels]
        ids = await identities(stubs)
        box = [i.box_public_key for i in ids]
        raw, exps, fp = _encode(table)
        onehot = table.one_hot()
        a, b = dep.add_owner("owner-a"), dep.add_owner("owner-b")
        rec = dep.add_owner("recipient")
        cols = list(table.columns)
        label = dict(onehot=None, label_column=table.label_column, classes=table.classes)
        if combination == "horizontal":
            half = table.m // 2
            ups = [
                data_upload(
                    a,
                    box,
                    raw[:half],
                    cols,
                    exps,
                    dataset_id="ds-a",
                    upload_id="up-a",
                    onehot=onehot[:half],
                    label_column=table.label_column,
                    classes=table.classes,
                ),
                data_upload(
                    b,
                    box,
                    raw[half:],
                    cols,
                    exps,
                    dataset_id="ds-b",
                    upload_id="up-b",
                    onehot=onehot[half:],
                    label_column=table.label_column,
                    classes=table.classes,
                ),
            ]
        else:
            cut = table.p // 2
            ups = [
                data_upload(
                    a,
                    box,
                    raw[:, :cut],
                    cols[:cut],
                    exps[:cut],
                    dataset_id="ds-a",
                    upload_id="up-a",
                ),
                data_upload(
                    b,
                    box,
                    raw[:, cut:],
                    cols[cut:],
                    exps[cut:],
                    dataset_id="ds-b",
                    upload_id="up-b",
                    **{**label, "onehot": onehot},
                ),
            ]
        shape = service_shape(table.m, table.p, table.n_classes, k, fp.value_bits, None)
        words = draw_mask_words(shape.outputs)
        ups.append(mask_upload(rec, box, words, dataset_id="mask-1", upload_id="up-mask"))
        for up in ups:
            for i, stub in enumerate(stubs):
                resp = await stub.PutUploadPart(upload_messages(up, i))
                assert resp.upload_id == up.upload_id
        info = await stubs[0].GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds-a"))
        assert info.upload_ids == ["up-a"] and info.rows > 0

        recipient_box = rec.box
        desc = describe_job(
            f"job-{uuid.uuid4().hex[:8]}", [[ups[0]], [ups[1]]], mask=ups[2], k=k,
            security=security.value, engine=engine, combination=combination,
            recipient_public_key=bytes(recipient_box.public_key),
            peers=dep.peer_addresses() if peers is None else peers,
        )
        assert desc.m == table.m and desc.p == table.p and desc.outputs == shape.outputs
        t0 = time.monotonic()
        started = [await s.StartJob(start_requests(desc)) for s in stubs]
        # answered at once: compiling is the job's first phase, not part of StartJob
        assert all(r.state == party_pb2.JOB_STATE_QUEUED for r in started)
        finals = await asyncio.gather(*(watch_to_end(s, desc.job_id) for s in stubs))
        elapsed = time.monotonic() - t0
        assert [f.state for f in finals] == [party_pb2.JOB_STATE_SUCCEEDED] * n, [
            f.error for f in finals
        ]
        assert all(
            f.progress == 1.0 and f.program_sha256 == finals[0].program_sha256 for f in finals
        )
        assert finals[0].program_sha256
        parts = await fetch_opened(stubs, ids, desc.job_id, recipient_box)
        assert all(np.array_equal(p, parts[0]) for p in parts)
        out = unmask_all(parts[0], words, shape)
        ref = mirror(raw, table.y, shape)
        np.testing.assert_array_equal(out.indices, ref.selected)
        assert out.reduced is None and parts[0].size == shape.k  # D' never leaves MPC
        # the audit log records the opening, never a value
        entries = [
            json.loads(line)
            for line in (dep.settings[0].state_dir / "audit.log").read_text().splitlines()
        ]
        released = [e for e in entries if e["event"] == "result.released"]
        assert released and released[0]["what"] == f"masked outputs, {shape.outputs} words"
        assert {"upload.accepted", "job.accepted", "job.succeeded"} <= {e["event"] for e in entries}
        # job inputs (share copies) are gone once the job ended
        for s in dep.settings:
            assert not (s.state_dir / "jobs" / desc.job_id / "inputs").exists()
        return elapsed
    finally:
        for c in channels:
            await c.close()
        for srv in servers:
            await srv.stop(0)


def test_horizontal_mpyc_passive_3pc(tmp_path: Path) -> None:
    table = make_table(30, 5, seed=1)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    asyncio.run(run_scenario(dep, table, 2, Security.PASSIVE_3PC, "mpyc", "horizontal"))


def test_vertical_mpyc_passive_4pc(tmp_path: Path) -> None:
    table = make_table(30, 5, n_classes=3, seed=2)
    dep = Deployment.create(tmp_path, 4, engines=("mpyc",))
    asyncio.run(run_scenario(dep, table, 2, Security.PASSIVE_4PC, "mpyc", "vertical"))


@needs_mpspdz
@pytest.mark.mpspdz
@pytest.mark.parametrize("combination", ["horizontal", "vertical"])
def test_mpspdz_passive_3pc(combination: str, tmp_path: Path, mpspdz_cache: Path) -> None:
    table = make_table(40, 6, seed=3)
    dep = Deployment.create(tmp_path, 3, engines=("mp-spdz",), mpspdz_cache=mpspdz_cache)
    asyncio.run(run_scenario(dep, table, 3, Security.PASSIVE_3PC, "mp-spdz", combination))


@needs_mpspdz
@pytest.mark.mpspdz
def test_mpspdz_active_4pc_vertical(tmp_path: Path, mpspdz_cache: Path) -> None:
    table = make_table(40, 6, n_classes=3, seed=4)
    dep = Deployment.create(tmp_path, 4, engines=("mp-spdz",), mpspdz_cache=mpspdz_cache)
    asyncio.run(run_scenario(dep, table, 2, Security.ACTIVE_4PC, "mp-spdz", "vertical"))


@needs_mpspdz
@pytest.mark.mpspdz
def test_mpspdz_active_3pc_horizontal(tmp_path: Path, mpspdz_cache: Path) -> None:
    # active 3PC's inputs go to MP-SPDZ's memory file from the bundles the daemon hands
    # over in memory (its loaded uploads' arrays, read-only)
    table = make_table(40, 6, seed=5)
    dep = Deployment.create(tmp_path, 3, engines=("mp-spdz",), mpspdz_cache=mpspdz_cache)
    asyncio.run(run_scenario(dep, table, 2, Security.ACTIVE_3PC, "mp-spdz", "horizontal"))


def test_identity_health_and_mutual_tls(tmp_path: Path) -> None:
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))

    async def scenario() -> None:
        srv = await start_party_server(dep.settings[1])
        try:
            async with dep.channel(1, srv.port) as ch:
                ident = await party_pb2_grpc.PartyServiceStub(ch).GetIdentity(
                    party_pb2.GetIdentityRequest()
                )
                assert (ident.index, ident.name) == (1, "Bob")
                assert len(ident.box_public_key) == 32 and len(ident.signing_public_key) == 32
                assert b"BEGIN CERTIFICATE" in ident.mpc_certificate_pem
                assert list(ident.engines) == ["mpyc"]
                health = health_pb2_grpc.HealthStub(ch)
                for service in ("", SERVICE_NAME):
                    resp = await health.Check(health_pb2.HealthCheckRequest(service=service))
                    assert resp.status == health_pb2.HealthCheckResponse.SERVING
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await party_pb2_grpc.PartyServiceStub(ch).GetJob(
                        party_pb2.GetJobRequest(job_id="nope")
                    )
                assert info.value.code() == grpc.StatusCode.NOT_FOUND
            # a client without a certificate from the deployment CA is refused
            creds = grpc.ssl_channel_credentials(root_certificates=dep.ca.cert_pem())
            async with grpc.aio.secure_channel(
                f"127.0.0.1:{srv.port}",
                creds,
                options=[("grpc.ssl_target_name_override", "bob")],
            ) as anon:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await party_pb2_grpc.PartyServiceStub(anon).GetIdentity(
                        party_pb2.GetIdentityRequest(), timeout=5
                    )
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        finally:
            await srv.stop(0)

    asyncio.run(scenario())


async def _alice_alone(dep: Deployment, stub: Any, table: LabelledTable, masks: int
                       ) -> tuple[Any, list[Any], Any, list[bytes], Any]:
    """Alice's parts only (her engine will wait for peers until cancelled): one data
    upload and ``masks`` mask uploads (m1, m2, ..), stored on her. Returns (data upload,
    mask uploads, recipient, the three box keys as sent, shape)."""
    ident = await stub.GetIdentity(party_pb2.GetIdentityRequest())
    box = [ident.box_public_key] * 3  # only Alice's part is sent
    raw, exps, fp = _encode(table)
    owner, rec = dep.add_owner("owner-a"), dep.add_owner("recipient")
    up = data_upload(owner, box, raw, table.columns, exps, dataset_id="ds", upload_id="u1",
                     onehot=table.one_hot(), label_column=table.label_column,
                     classes=table.classes)
    shape = service_shape(table.m, table.p, table.n_classes, 1, fp.value_bits, None)
    ms = [mask_upload(rec, box, draw_mask_words(shape.outputs), dataset_id="m",
                      upload_id=f"m{i}") for i in range(1, masks + 1)]
    for u in (up, *ms):
        await stub.PutUploadPart(upload_messages(u, 0))
    return up, ms, rec, box, shape


async def _engine_pid(dep: Deployment, job_id: str) -> int:
    """Alice's engine worker for the job, once it runs."""
    pid_file = dep.settings[0].state_dir / "jobs" / job_id / "engine" / "worker.pid"
    t0 = time.monotonic()
    while not pid_file.exists():
        assert time.monotonic() - t0 < 30
        await asyncio.sleep(0.05)
    return int(pid_file.read_text())


def test_cancel_kills_the_engine_process(tmp_path: Path) -> None:
    """Only Alice starts the job: her engine waits for peers until cancelled."""
    table = make_table(20, 4, seed=6)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))

    async def scenario() -> None:
        srv = await start_party_server(dep.settings[0])
        try:
            async with dep.channel(0, srv.port) as ch:
                stub = party_pb2_grpc.PartyServiceStub(ch)
                up, (mask,), rec, box, shape = await _alice_alone(dep, stub, table, 1)
                desc = describe_job(
                    "j1", [[up]], mask=mask, k=1, security="passive-3pc", engine="mpyc",
                    recipient_public_key=bytes(rec.box.public_key),
                    peers=dep.peer_addresses(),
                )
                await stub.StartJob(start_requests(desc))
                pid = await _engine_pid(dep, "j1")
                resp = await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))
                assert resp.state == party_pb2.JOB_STATE_CANCELLED
                final = await watch_to_end(stub, "j1")
                assert final.state == party_pb2.JOB_STATE_CANCELLED
                assert not Path(f"/proc/{pid}").exists() or "Z" in Path(
                    f"/proc/{pid}/stat").read_text().split()[2]
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.FetchResultPart(party_pb2.FetchResultPartRequest(job_id="j1"))
                assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                # a second job is running when the party is stopped (SIGTERM path)
                mask2 = mask_upload(rec, box, draw_mask_words(shape.outputs),
                                    dataset_id="m", upload_id="m2")
                await stub.PutUploadPart(upload_messages(mask2, 0))
                desc = describe_job(
                    "j2", [[up]], mask=mask2, k=1, security="passive-3pc", engine="mpyc",
                    recipient_public_key=bytes(rec.box.public_key), peers=dep.peer_addresses())
                await stub.StartJob(start_requests(desc))
        finally:
            await srv.stop(0)
        # restarted: the stopped job is reported failed, not lost
        srv = await start_party_server(dep.settings[0])
        try:
            async with dep.channel(0, srv.port) as ch:
                st = await party_pb2_grpc.PartyServiceStub(ch).GetJob(
                    party_pb2.GetJobRequest(job_id="j2"))
                assert st.state == party_pb2.JOB_STATE_FAILED
                assert st.error in ("party stopped", "party restarted")
        finally:
            await srv.stop(0)

    asyncio.run(scenario())


def test_a_queued_job_holds_no_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one engine slot busy (Alice alone: her engine waits for peers), a second job
    waits queued without assembling its inputs; it assembles them once the slot is
    free."""
    import ppfs_party.jobs as jobs_module

    assembled: list[str] = []
    real = jobs_module.assemble

    def counting(store: Any, job: Any, *args: Any, **kwargs: Any) -> Any:
        assembled.append(job.job_id)
        return real(store, job, *args, **kwargs)

    monkeypatch.setattr(jobs_module, "assemble", counting)
    table = make_table(20, 4, seed=6)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))

    async def phase(stub: Any, job_id: str, want: str) -> None:
        t0 = time.monotonic()
        while (await stub.GetJob(party_pb2.GetJobRequest(job_id=job_id))).phase != want:
            assert time.monotonic() - t0 < 60, want
            await asyncio.sleep(0.05)

    async def scenario() -> None:
        srv = await start_party_server(dep.settings[0])
        try:
            async with dep.channel(0, srv.port) as ch:
                stub = party_pb2_grpc.PartyServiceStub(ch)
                up, masks, rec, _, _ = await _alice_alone(dep, stub, table, 2)
                descs = [describe_job(
                    f"j{i}", [[up]], mask=masks[i - 1], k=1, security="passive-3pc",
                    engine="mpyc", recipient_public_key=bytes(rec.box.public_key),
                    peers=dep.peer_addresses(),
                ) for i in (1, 2)]
                await stub.StartJob(start_requests(descs[0]))
                await _engine_pid(dep, "j1")
                await stub.StartJob(start_requests(descs[1]))
                await phase(stub, "j2", "waiting for the engine")
                await asyncio.sleep(0.3)  # it stays there while j1 holds the slot
                assert assembled == ["j1"]
                assert (await stub.GetJob(party_pb2.GetJobRequest(job_id="j2"))).state == (
                    party_pb2.JOB_STATE_QUEUED)
                await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))
                t0 = time.monotonic()
                while assembled != ["j1", "j2"]:
                    assert time.monotonic() - t0 < 30
                    await asyncio.sleep(0.05)
                await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j2"))
                final = await watch_to_end(stub, "j2")
                assert final.state == party_pb2.JOB_STATE_CANCELLED
        finally:
            await srv.stop(0)

    asyncio.run(scenario())


# what an MP-SPDZ party's directory may hold of its shares when its run ends early
# (a set-up thread still writing its input as the run is cancelled)
ENGINE_SHARE_COPIES = ("Persistence/Transactions-P0.data", "Player-Data/Input-Binary-P0-0",
                       "Player-Data/Memory-R-P0", "Player-Data/3-SYMR-64/Player-MAC-Keys-MR-P0")


class LeavingEngine(EngineWrapper):
    """MPyC, whose run leaves share copies in its directory beside its log; then it
    waits for peers (job j1, until cancelled) or fails (job j2)."""


    async def run_party(self, spec: Any, progress: Any = None) -> Any:
        leave(spec.workdir)
        (spec.workdir / "stderr.log").write_text("the engine's log\n")
        if spec.workdir.parent.name == "j2":
            raise EngineError("the engine failed", party=spec.name)
        return await self.inner.run_party(spec, progress)


def leave(party_dir: Path) -> None:
    for name in ENGINE_SHARE_COPIES:
        (party_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (party_dir / name).write_bytes(b"share words")


def test_a_job_that_ends_keeps_no_share_copy(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """However a job ends (cancelled or failed), what its engine left of its shares is
    deleted, and a party starting again deletes what an earlier run left; the engine's
    log stays."""
    usable = party_state.usable_engines
    monkeypatch.setattr(party_state, "usable_engines", lambda settings: {
        n: LeavingEngine(e) for n, e in usable(settings).items()})
    table = make_table(20, 4, seed=6)
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    jobs = dep.settings[0].state_dir / "jobs"

    def left(job_id: str) -> list[str]:
        return [n for n in ENGINE_SHARE_COPIES if (jobs / job_id / "engine" / n).exists()]

    async def scenario() -> None:
        srv = await start_party_server(dep.settings[0])
        try:
            async with dep.channel(0, srv.port) as ch:
                stub = party_pb2_grpc.PartyServiceStub(ch)
                up, masks, rec, _, _ = await _alice_alone(dep, stub, table, 2)
                for i in (1, 2):
                    await stub.StartJob(start_requests(describe_job(
                        f"j{i}", [[up]], mask=masks[i - 1], k=1, security="passive-3pc",
                        engine="mpyc", recipient_public_key=bytes(rec.box.public_key),
                        peers=dep.peer_addresses())))
                    if i == 1:
                        await _engine_pid(dep, "j1")
                        await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))
                final = await watch_to_end(stub, "j2")
                assert final.state == party_pb2.JOB_STATE_FAILED
                t0 = time.monotonic()
                while left("j2"):  # removed once the job has ended
                    assert time.monotonic() - t0 < 30, left("j2")
                    await asyncio.sleep(0.05)
                assert left("j1") == []
                for job_id in ("j1", "j2"):
                    assert (jobs / job_id / "engine" / "stderr.log").read_text()
                    assert not (jobs / job_id / "inputs").exists()
        finally:
            await srv.stop(0)
        # copies an earlier run left behind are deleted when the party starts again
        leave(jobs / "j1" / "engine")
        srv = await start_party_server(dep.settings[0])
        await srv.stop(0)
        assert left("j1") == []

    asyncio.run(scenario())
