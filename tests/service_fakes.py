"""Test harness for the gateway and the client: a fake deployment of parties behind
the real gRPC contract (mutual TLS, port 0), and the gateway on uvicorn (port 0).

The fake parties verify sealed parts and owner-signed manifests like real ones, but
compute Step 2A *in the clear* from all parties' shares (ppfs.step2a.mirror): they
test the gateway's and the client's plumbing, failure handling and leakage, not MPC.
End-to-end tests against the real party daemon live in test_e2e_service.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import uvicorn
from cryptography.hazmat.primitives import serialization
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient, OwnerTable
from ppfs_gateway.core.config import Settings
from ppfs_gateway.main import create_app

from ppfs.contract import (
    DatasetSchema,
    JobContract,
    ResultStatement,
    plan,
    seal_result,
    service_shape,
)
from ppfs.engines.base import PARTY_NAMES
from ppfs.fixedpoint import FixedPoint
from ppfs.holdings import Held, HoldingsStatement
from ppfs.keycert import KEY_VALIDITY, TrustAnchor, certify_party_keys
from ppfs.pki import CertificateAuthority, party_key_and_csr, write_cert
from ppfs.sharing import ShareBundle, components_from_bundles, reconstruct
from ppfs.step2a import mask_values, mirror
from ppfs.synthetic import make_table
from ppfs.upload import Manifest, UploadRejected, open_sealed, unpack_bundles, verify_manifest
from ppfs.v1 import party_pb2 as pb
from ppfs.v1 import party_pb2_grpc as pb_grpc

T = TypeVar("T")


class LoopThread:
    """An asyncio loop in a daemon thread, for servers the synchronous tests talk to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@dataclass
class FakeJob:
    desc: pb.JobDescription
    status: pb.JobStatus
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    opened: np.ndarray | None = None


class FakeParty(pb_grpc.PartyServiceServicer):
    def __init__(self, cluster: FakeCluster, index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.box = PrivateKey.generate()
        self.signing = SigningKey.generate()
        self.uploads: dict[str, tuple[Manifest, dict[str, ShareBundle]]] = {}
        self.staged: dict[str, tuple[Manifest, dict[str, ShareBundle]]] = {}
        self.aborted: set[str] = set()
        self.jobs: dict[str, FakeJob] = {}
        self.tombstones: set[str] = set()
        self.received_headers: list[pb.UploadPartHeader] = []
        # what GetIdentity states: the CA that certifies the keys (None: the deployment's),
        # for how long, the index it reports, and a stop under way (as a SIGTERM'd party)
        self.key_ca: CertificateAuthority | None = None
        self.key_validity = KEY_VALIDITY
        self.reported_index: int | None = None
        self.stopping = False
        self.stop_seconds_left = 0
        # the key statement it serves as signed once (None: signed anew for each call)
        self.statement: tuple[bytes, bytes] | None = None

    async def GetIdentity(self, request: Any, context: Any) -> pb.PartyIdentity:
        ca = self.key_ca or self.cluster.ca
        statement, signature = self.statement or certify_party_keys(
            ca.key, ca.cert, self.index, PARTY_NAMES[self.index], bytes(self.box.public_key),
            bytes(self.signing.verify_key), validity=self.key_validity)
        return pb.PartyIdentity(
            stopping=self.stopping, stop_seconds_left=self.stop_seconds_left,
            key_statement=statement, key_statement_signature=signature,
            deployment_ca_pem=self.cluster.ca.cert_pem(),
            index=self.index if self.reported_index is None else self.reported_index,
            name=PARTY_NAMES[self.index],
            box_public_key=bytes(self.box.public_key),
            signing_public_key=bytes(self.signing.verify_key),
            engines=["mp-spdz", "mpyc"],
            mpc_host="127.0.0.1",
            mpc_port_base=15000 + 10 * self.index,
            mpc_port_count=self.cluster.mpc_port_count,
        )

    async def PutUploadPart(self, request_iterator: Any, context: Any) -> Any:
        header: pb.UploadPartHeader | None = None
        sealed = bytearray()
        async for msg in request_iterator:
            if msg.HasField("header"):
                header = msg.header
            else:
                sealed += msg.chunk
        if header is None or len(sealed) != header.sealed_size:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no header or short part")
        assert header is not None
        self.received_headers.append(header)
        key = self.cluster.owners.get(header.owner_id)
        if key is None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "owner not registered")
        try:
            man = verify_manifest(header.manifest, header.manifest_signature, key)
            if hashlib.sha256(bytes(sealed)).hexdigest() != man.part_sha256[self.index]:
                raise UploadRejected("sealed part does not match the manifest")
            bundles = unpack_bundles(open_sealed(bytes(sealed), self.box))
        except UploadRejected as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if header.upload_id in {*self.uploads, *self.staged, *self.aborted}:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "upload replayed")
        where = self.staged if header.staged else self.uploads
        where[header.upload_id] = (man, {b.kind: b for b in bundles})
        return pb.PutUploadPartResponse(
            dataset_id=man.dataset_id,
            upload_id=man.upload_id,
            rows=man.rows,
            columns=len(man.columns),
        )

    async def CommitUpload(self, request: Any, context: Any) -> pb.UploadDecisionResponse:
        uid = request.upload_id
        if uid in self.staged:
            self.uploads[uid] = self.staged.pop(uid)
        elif uid not in self.uploads:
            await context.abort(grpc.StatusCode.NOT_FOUND, "upload not staged")
        return pb.UploadDecisionResponse(upload_id=uid, status=pb.UPLOAD_STATUS_COMMITTED)

    async def AbortUpload(self, request: Any, context: Any) -> pb.UploadDecisionResponse:
        uid = request.upload_id
        if uid in self.uploads:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "committed")
        self.staged.pop(uid, None)
        self.aborted.add(uid)
        return pb.UploadDecisionResponse(upload_id=uid, status=pb.UPLOAD_STATUS_ABORTED)

    async def ListUploads(self, request: Any, context: Any) -> pb.ListUploadsResponse:
        held = [
            pb.HeldUpload(upload_id=u, manifest_sha256=m.digest(), rows=m.rows, status=st)
            for where, st in ((self.uploads, pb.UPLOAD_STATUS_COMMITTED),
                              (self.staged, pb.UPLOAD_STATUS_STAGED))
            for u, (m, _) in where.items()
            if m.dataset_id == request.dataset_id
        ]
        return pb.ListUploadsResponse(dataset_id=request.dataset_id,
                                      uploads=sorted(held, key=lambda h: h.upload_id))

    async def StateHoldings(self, request: Any, context: Any) -> pb.StateHoldingsResponse:
        held = tuple(Held(u, m.digest(), m.rows, st)
                     for where, st in ((self.uploads, "committed"), (self.staged, "staged"))
                     for u, (m, _) in sorted(where.items())
                     if m.dataset_id == request.dataset_id and m.owner_id == request.owner_id)
        statement, signature = HoldingsStatement(
            self.index, request.owner_id, request.dataset_id, request.challenge.hex(),
            held).sign(self.signing)
        return pb.StateHoldingsResponse(statement=statement, signature=signature)

    async def GetDataset(self, request: Any, context: Any) -> pb.DatasetInfo:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "fake")
        raise AssertionError

    async def StartJob(self, request: pb.StartJobRequest, context: Any) -> Any:
        blob = request.job.SerializeToString(deterministic=True)
        if hashlib.sha256(blob).hexdigest() != request.description_sha256:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "description hash differs")
        if request.job.job_id in self.jobs:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, "job exists")
        if request.job.job_id in self.tombstones:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "cancelled before start")
        if self.stopping:  # as a party that was told to stop (ppfs_party PartyStoppingError)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"{PARTY_NAMES[self.index]} is stopping")
        if self.cluster.refuse_start == self.index:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refusing on purpose")
        job = FakeJob(
            pb.JobDescription.FromString(blob),
            pb.JobStatus(job_id=request.job.job_id, state=pb.JOB_STATE_QUEUED, phase="queued"),
        )
        self.jobs[job.desc.job_id] = job
        self.cluster.maybe_run(job.desc.job_id)
        return pb.StartJobResponse(job_id=job.desc.job_id, program_sha256="f" * 64)

    def set(self, job_id: str, **kw: Any) -> None:
        job = self.jobs[job_id]
        for k, v in kw.items():
            setattr(job.status, k, v)
        job.changed.set()
        job.changed = asyncio.Event()

    async def CancelJob(self, request: Any, context: Any) -> pb.CancelJobResponse:
        job = self.jobs.get(request.job_id)
        if job is None:  # remembered: a later StartJob of this id is refused
            self.tombstones.add(request.job_id)
            return pb.CancelJobResponse(state=pb.JOB_STATE_CANCELLED, remembered=True)
        if job.status.state not in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED):
            self.set(request.job_id, state=pb.JOB_STATE_CANCELLED, phase="cancelled")
        return pb.CancelJobResponse(state=job.status.state)

    async def GetJob(self, request: Any, context: Any) -> pb.JobStatus:
        job = self.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such job")
        assert job is not None
        return job.status

    async def WatchJob(self, request: Any, context: Any) -> AsyncIterator[pb.JobEvent]:
        job = self.jobs.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such job")
        assert job is not None
        while True:
            ev = job.changed
            st = pb.JobStatus()
            st.CopyFrom(job.status)
            yield pb.JobEvent(status=st)
            if st.state in (pb.JOB_STATE_SUCCEEDED, pb.JOB_STATE_FAILED, pb.JOB_STATE_CANCELLED):
                return
            await ev.wait()

    async def FetchResultPart(self, request: Any, context: Any) -> pb.SealedResultPart:
        job = self.jobs.get(request.job_id)
        if job is None or job.opened is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no result")
        assert job is not None and job.opened is not None
        words = job.opened.copy()
        lying = self.cluster.tamper_result
        if self.index == lying or (isinstance(lying, frozenset) and self.index in lying):
            words[0] += np.uint64(1)
        sealed, sig = seal_result(
            job.desc.job_id, words, job.desc.recipient_public_key, self.signing
        )
        contract = JobContract.from_proto(job.desc)
        schemas = []
        for d in contract.datasets:  # what this party verified: the owner-signed manifests
            man = self.uploads[d.uploads[0].upload_id][0]
            schemas.append(DatasetSchema(d.dataset_id, man.columns, man.column_exponents,
                                         man.label_column, man.classes, man.frac_bits, d.rows))
        verified = plan(schemas, contract.combination, contract.label_column)
        if self.cluster.tamper_statement == self.index:  # it relabels the result alone
            verified = replace(verified, columns=tuple(reversed(verified.columns)))
        statement, statement_sig = ResultStatement.for_job(
            contract, hashlib.sha256(job.desc.SerializeToString(deterministic=True)).hexdigest(),
            self.index, sealed, verified).sign(self.signing)
        return pb.SealedResultPart(
            job_id=job.desc.job_id, party_index=self.index, sealed=sealed, signature=sig,
            statement=statement, statement_signature=statement_sig,
        )


class FakeCluster:
    """n fake parties that share nothing but this coordinator (which computes in clear)."""

    def __init__(self, n: int, root: Path) -> None:
        self.n = n
        self.root = root
        self.owners: dict[str, bytes] = {}
        self.parties = [FakeParty(self, i) for i in range(n)]
        self.servers: list[grpc.aio.Server | None] = [None] * n
        self.ports: list[int] = [0] * n
        self.fail_party: int | None = None
        self.refuse_start: int | None = None
        # the party (or parties) that seal and sign altered opened words
        self.tamper_result: int | frozenset[int] | None = None
        self.tamper_statement: int | None = None  # the party that signs another schema
        self.hold = False  # keep jobs running until released
        self.mpc_port_count = 1  # each party's MPC ports (GetIdentity)
        self.release = asyncio.Event()
        # the computations under way: held here so none is collected mid-run, and
        # ended by stop() instead of being left pending when the loop closes
        self._runs: set[asyncio.Task[None]] = set()
        self.ca = CertificateAuthority.create("test deployment CA")
        self.tls_dir = root / "pki"
        write_cert(self.tls_dir / "ca.pem", self.ca.cert)
        gw_csr = party_key_and_csr(self.tls_dir / "gateway.key", "gateway")
        write_cert(self.tls_dir / "gateway.pem", self.ca.issue(gw_csr))

    def register_owner(self, subject: str, verify_key: bytes) -> None:
        self.owners[subject] = verify_key

    async def start(self) -> None:
        for i in range(self.n):
            await self.start_party(i)

    async def start_party(self, i: int) -> None:
        name = PARTY_NAMES[i].lower()
        key_path = self.tls_dir / f"{name}.key"
        if not key_path.exists():
            csr = party_key_and_csr(key_path, name)
            write_cert(self.tls_dir / f"{name}.pem", self.ca.issue(csr))
        creds = grpc.ssl_server_credentials(
            [(key_path.read_bytes(), (self.tls_dir / f"{name}.pem").read_bytes())],
            root_certificates=self.ca.cert.public_bytes(serialization.Encoding.PEM),
            require_client_auth=True,
        )
        server = grpc.aio.server(options=[("grpc.http2.min_ping_interval_without_data_ms", 30_000)])
        pb_grpc.add_PartyServiceServicer_to_server(self.parties[i], server)
        port = server.add_secure_port(f"127.0.0.1:{self.ports[i]}", creds)
        await server.start()
        self.ports[i] = port
        self.servers[i] = server

    async def stop_party(self, i: int) -> None:
        server = self.servers[i]
        if server is not None:
            await server.stop(0)
            self.servers[i] = None

    async def stop(self) -> None:
        for task in self._runs:
            task.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)
        for i in range(self.n):
            await self.stop_party(i)

    def gateway_settings(
        self, state_dir: Path, tokens: list[dict[str, str]], **kw: Any
    ) -> Settings:
        return Settings.model_validate(
            {
                "state_dir": str(state_dir),
                "parties": [
                    {"address": f"127.0.0.1:{p}", "tls_server_name": PARTY_NAMES[i].lower()}
                    for i, p in enumerate(self.ports)
                ],
                "tls": {
                    "ca_cert": str(self.tls_dir / "ca.pem"),
                    "client_cert": str(self.tls_dir / "gateway.pem"),
                    "client_key": str(self.tls_dir / "gateway.key"),
                },
                "tokens": tokens,
                **kw,
            }
        )

    # -- the computation, in the clear --------------------------------------------------

    def maybe_run(self, job_id: str) -> None:
        if all(job_id in p.jobs for p in self.parties):
            task = asyncio.get_running_loop().create_task(self._run(job_id))
            self._runs.add(task)
            task.add_done_callback(self._runs.discard)

    def _matrix(self, upload_ids: list[str], kind: str) -> np.ndarray:
        rows = []
        for u in upload_ids:
            comps = components_from_bundles(
                {i: p.uploads[u][1][kind] for i, p in enumerate(self.parties)}
            )
            rows.append(reconstruct(comps))
        return np.concatenate(rows, axis=0)

    async def _run(self, job_id: str) -> None:
        for p in self.parties:
            p.set(job_id, state=pb.JOB_STATE_RUNNING, phase="ranking", progress=0.5)
        if self.hold:
            await self.release.wait()
        if self.parties[0].jobs[job_id].status.state == pb.JOB_STATE_CANCELLED:
            return
        if self.fail_party is not None:
            p = self.parties[self.fail_party]
            p.set(
                job_id, state=pb.JOB_STATE_FAILED, phase="failed",
                error="engine exited with code 1", failure=pb.FAILURE_KIND_OWN,
            )
            return
        desc = self.parties[0].jobs[job_id].desc
        p0 = self.parties[0]
        per_ds = []
        for d in desc.datasets:  # exactly the pinned uploads
            ups = [u.upload_id for u in d.uploads]
            man = p0.uploads[ups[0]][0]
            data = self._matrix(ups, "data")
            labels = self._matrix(ups, "labels") if man.label_column else None
            per_ds.append((man, data, labels))
        axis = 0 if desc.combination != pb.COMBINATION_VERTICAL else 1
        raw = np.concatenate([d for _, d, _ in per_ds], axis=axis)
        if axis == 0:
            onehot = np.concatenate([lab for _, _, lab in per_ds if lab is not None], axis=0)
        else:
            onehot = next(lab for _, _, lab in per_ds if lab is not None)
        n_classes = onehot.shape[1] + 1
        y = np.where(onehot.sum(axis=1) == 0, n_classes - 1, onehot.argmax(axis=1))
        contract = JobContract.from_proto(desc)
        train = contract.training
        shape = service_shape(raw.shape[0], raw.shape[1], n_classes, desc.k, 32, train,
                              contract.scorer)
        ref = mirror(raw, y, shape)
        words = self._matrix([desc.mask_upload_id], "mask")
        parts = [ref.selected]  # a service job never opens D'
        if train is not None:
            from ppfs import step2b

            p = shape.p
            tr = step2b.mirror(raw[:, ref.selected], y, n_classes, shape.value_bits, train)
            alpha_full = np.zeros((p, step2b.n_models(n_classes)), dtype=object)
            alpha_full[ref.selected] = tr.alpha
            parts += [alpha_full.reshape(-1), tr.beta]
        values = np.concatenate([np.asarray(v, dtype=object) for v in parts]).astype(np.int64)
        opened = values.view(np.uint64) + mask_values(words)
        for p in self.parties:
            p.jobs[job_id].opened = opened
            p.set(
                job_id,
                state=pb.JOB_STATE_SUCCEEDED,
                phase="done",
                progress=1.0,
                program_sha256="f" * 64,
                seconds=0.1,
            )


class GatewayThread:
    """The gateway app on uvicorn, port 0, in a thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=5,
            ssl_certfile=str(settings.https_cert) if settings.https_cert else None,
            ssl_keyfile=str(settings.https_key) if settings.https_key else None,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        scheme = "https" if settings.https_cert else "http"
        self.url = f"{scheme}://{'localhost' if settings.https_cert else '127.0.0.1'}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def tokens(*entries: tuple[str, str]) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Token config for (role, subject) pairs, and subject -> token."""
    out, by = [], {}
    for role, subject in entries:
        tok = hashlib.sha256(f"{role}:{subject}:{time.time_ns()}".encode()).hexdigest()
        out.append({"token": tok, "role": role, "subject": subject})
        by[subject] = tok
    return out, by


def dump(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)


@contextlib.contextmanager
def nothing() -> Any:
    yield


class RealCluster:
    """The party daemons (ppfs_party) in this process, mutual TLS, port 0."""

    def __init__(self, n: int, root: Path, engines: tuple[str, ...], **overrides: Any) -> None:
        from party_harness import Deployment

        self.n = n
        self.root = root
        self.dep = Deployment.create(root / "parties", parties=n, engines=engines, **overrides)
        self.servers: list[Any] = []
        self.tls_dir = root / "pki"
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        (self.tls_dir / "ca.pem").write_bytes(self.dep.ca.cert_pem())
        (self.tls_dir / "gateway.pem").write_bytes(self.dep.client_cert)
        (self.tls_dir / "gateway.key").write_bytes(self.dep.client_key)

    def register_owner(self, subject: str, verify_key: bytes) -> None:
        from ppfs_party.store import register_owner

        for s in self.dep.settings:
            register_owner(s.state_dir, subject, verify_key)

    async def start(self) -> None:
        from ppfs_party.server import start_party_server

        self.servers = [await start_party_server(s) for s in self.dep.settings]

    async def stop(self) -> None:
        for srv in self.servers:
            await srv.stop(0)
        self.servers = []

    def gateway_settings(
        self, state_dir: Path, tokens: list[dict[str, str]], **kw: Any
    ) -> Settings:
        # the gateway's stall floor is the parties' smallest stall limit, as a deployment
        # configures it (0 runs no stall watch; none set: the engines' default, above the
        # gateway's default floor)
        limits = [s.stall_timeout for s in self.dep.settings if s.stall_timeout]
        if limits:
            kw.setdefault("stall_floor_seconds", min(limits))
        return Settings.model_validate(
            {
                "state_dir": str(state_dir),
                "parties": [
                    {"address": f"127.0.0.1:{srv.port}", "tls_server_name": s.control_name}
                    for srv, s in zip(self.servers, self.dep.settings, strict=True)
                ],
                "tls": {
                    "ca_cert": str(self.tls_dir / "ca.pem"),
                    "client_cert": str(self.tls_dir / "gateway.pem"),
                    "client_key": str(self.tls_dir / "gateway.key"),
                },
                "tokens": tokens,
                **kw,
            }
        )


# -- a whole stack: parties, gateway, tokens and client keys -------------------------

SUBJECTS = (
    ("data_owner", "owner-a"),
    ("data_owner", "owner-b"),
    ("analyst", "analyst-1"),
    ("admin", "admin"),
)


@dataclass
class Daemon:
    proc: Any  # asyncio.subprocess.Process
    port: int


class DaemonCluster(RealCluster):
    """The party daemons as processes of their own (RealCluster runs them in this
    process), so that a signal can kill or freeze one alone."""

    async def start(self) -> None:
        from party_harness import spawn_party

        self.servers = []
        for s in self.dep.settings:
            proc, port = await spawn_party(s, self.root / f"party{s.index}.log")
            self.servers.append(Daemon(proc, port))

    async def stop(self) -> None:
        for d in self.servers:
            if d.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d.proc.pid, signal.SIGCONT)  # a frozen one, too
                    d.proc.terminate()
                await d.proc.wait()
        self.servers = []


@dataclass
class Stack:
    loop: LoopThread
    cluster: FakeCluster
    gateway: GatewayThread
    token: dict[str, str]
    keys: dict[str, ClientKeys]
    root: Path
    token_config: list[dict[str, str]]

    @property
    def ca_pem(self) -> Path:
        """The deployment CA certificate: the clients' trust anchor (out of band)."""
        return self.cluster.tls_dir / "ca.pem"

    def client(self, subject: str) -> GatewayClient:
        return GatewayClient(self.gateway.url, self.token[subject], timeout=30,
                             trust=TrustAnchor.parse(str(self.ca_pem)))

    def close(self) -> None:
        self.gateway.stop()
        self.loop.run(self.cluster.stop())
        self.loop.stop()

    def restart_gateway(self, **kw: object) -> None:
        self.gateway.stop()
        self.gateway = GatewayThread(
            self.cluster.gateway_settings(self.root / "gateway", self.token_config, **kw)
        )


def make_stack(
    tmp_path: Path, n: int = 3, cluster: Any = None, extra: int = 0, **kw: object
) -> Stack:
    """Parties, gateway, tokens and keys; ``extra`` more data owners owner-0, owner-1, ..."""
    loop = LoopThread()
    cluster = cluster or FakeCluster(n, tmp_path)
    loop.run(cluster.start())
    subjects = (*SUBJECTS, *(("data_owner", f"owner-{i}") for i in range(extra)))
    cfg, by = tokens(*subjects)
    keys = {}
    for _, subject in subjects:
        keys[subject] = ClientKeys.generate(subject).save(tmp_path / "keys" / f"{subject}.key")
        cluster.register_owner(subject, keys[subject].verify_key)
    gw = GatewayThread(cluster.gateway_settings(tmp_path / "gateway", cfg, **kw))
    return Stack(loop, cluster, gw, by, keys, tmp_path, cfg)


def owner_table(t, rows=slice(None), cols=None, label=True) -> OwnerTable:
    cols = list(range(t.p)) if cols is None else cols
    return OwnerTable(
        tuple(t.columns[j] for j in cols),
        t.x[rows][:, cols],
        t.label_column if label else "",
        t.classes if label else (),
        t.y[rows] if label else None,
    )


def wait_running(client: GatewayClient, job_id: str, timeout: float = 30) -> None:
    """Until the gateway shows the job running."""
    deadline = time.monotonic() + timeout
    while client.get_job(job_id)["state"] != "running":
        assert time.monotonic() < deadline, f"job {job_id} did not start running"
        time.sleep(0.05)


def wait_final(client: GatewayClient, job_id: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get_job(job_id)
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {job}")


def horizontal_setup(s: Stack, m: int = 40, p: int = 8, seed: int = 3):
    t = make_table(m, p, seed=seed)
    half = m // 2
    a, b, admin = s.client("owner-a"), s.client("owner-b"), s.client("admin")
    ds_a = a.create_dataset("hospital-a")
    a.upload_table(s.keys["owner-a"], owner_table(t, slice(0, half)), ds_a["id"])
    admin.grant(ds_a["id"], "owner-b")  # owner b encodes with a's public schema
    exps = b.get_dataset(ds_a["id"])["column_exponents"]
    ds_b = b.create_dataset("hospital-b")
    b.upload_table(s.keys["owner-b"], owner_table(t, slice(half, m)), ds_b["id"], exponents=exps)
    for d in (ds_a, ds_b):
        admin.grant(d["id"], "analyst-1")
    fp = FixedPoint()
    raw = fp.encode(t.x, np.asarray(exps), t.columns)
    return t, [ds_a["id"], ds_b["id"]], raw


CLIENT_ENV = ("PPFS_GATEWAY", "PPFS_TOKEN", "PPFS_KEY", "PPFS_DEPLOYMENT_CA")


def run_cli(capsys: Any, s: Stack, subject: str, *argv: str) -> tuple[int, str, str]:
    """`ppfs ARGV` in this process as ``subject`` (gateway, token, key file and trust
    anchor from the environment, as a user's env file sets them): (exit code, stdout,
    stderr)."""
    from ppfs_cli.main import main

    os.environ.update({
        "PPFS_GATEWAY": s.gateway.url, "PPFS_TOKEN": s.token[subject],
        "PPFS_KEY": str(s.keys[subject].path), "PPFS_DEPLOYMENT_CA": str(s.ca_pem),
    })
    try:
        rc = main(list(argv))
    finally:
        for k in CLIENT_ENV:
            os.environ.pop(k, None)
    out, err = capsys.readouterr()
    return rc, out, err


def pending_decisions(s: Stack) -> list[tuple[str, int, str]]:
    """The gateway's upload decisions not yet acknowledged: (upload, party, decision)."""
    db = sqlite3.connect(s.root / "gateway" / "registry.sqlite3")
    try:
        return db.execute(
            "SELECT upload_id, party, decision FROM upload_decisions"
            " WHERE done = 0 AND decision != 'staging'"
        ).fetchall()
    finally:
        db.close()


def wait_until(what: Callable[[], object], timeout: float = 30.0) -> None:
    """Wait until ``what()`` is true; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.1)
