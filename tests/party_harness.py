"""A local deployment for tests (and for the gateway's tests): a deployment CA, party
state directories with signed certificates, registered owners, mutual-TLS channels,
and what a data owner and a result recipient do on their side.

    dep = Deployment.create(tmp_path, parties=3)
    owner = dep.add_owner("hospital-a")
    servers = [await start_party_server(s) for s in dep.settings]
    channel = dep.channel(i, servers[i].port)   # grpc.aio, mutual TLS as "gateway"
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from nacl.public import PrivateKey
from nacl.signing import SigningKey, VerifyKey
from ppfs_party.audit import AuditLog
from ppfs_party.config import PartySettings
from ppfs_party.keys import sign_party_requests
from ppfs_party.server import PartyServer, start_party_server
from ppfs_party.state import open_state
from ppfs_party.store import ShareStore, StoredUpload, UploadHeader, register_owner

from ppfs.contract import (
    Combination,
    Consent,
    DatasetSchema,
    JobContract,
    JobRequest,
    PinnedDataset,
    PinnedUpload,
    Reveal,
    SignedConsent,
    SignedRequest,
    description_sha256,
    plan,
    service_shape,
)
from ppfs.durable import free_port_ranges
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.fixedpoint import FixedPoint
from ppfs.pki import CertificateAuthority, issue_client_identity
from ppfs.scoring import Scorer
from ppfs.sharing import Scheme, ShareBundle, bundles_for_all
from ppfs.step2a import Security, Step2AShape, draw_mask_words, mirror, unmask_all
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable
from ppfs.upload import (
    SIGNED_AT_FORMAT,
    Manifest,
    open_sealed,
    pack_bundles,
    seal,
    sign_manifest,
)
from ppfs.v1 import party_pb2, party_pb2_grpc

CHUNK = 64 * 1024

CHANNEL_OPTIONS = [
    # Client pings every 60 s keep long WatchJob streams alive below Azure's ~4 min
    # idle-TCP cutoff; the party accepts pings every 30 s or slower.
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    # Same limit as the party: chunks <= 1 MiB, result parts a few MB.
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
]





@dataclass
class Owner:
    """A registered principal: a data owner, or a result recipient (``box`` opens the
    results sealed to it; its mask uploads name that key)."""

    owner_id: str
    key: SigningKey
    box: PrivateKey = field(default_factory=PrivateKey.generate)


@dataclass
class Deployment:
    root: Path
    ca: CertificateAuthority
    settings: list[PartySettings]
    client_key: bytes
    client_cert: bytes
    owners: dict[str, Owner] = field(default_factory=dict)

    @classmethod
    def create(cls, root: Path, parties: int = 3, **overrides: object) -> Deployment:
        """CA, per-party state (keys made by each party, CSRs signed by the CA) and a
        client certificate for the caller (the gateway's role)."""
        ca = CertificateAuthority.create("ppfs test deployment CA")
        count = int(overrides.pop("mpc_port_count", 1))  # type: ignore[call-overload]
        ports = free_port_ranges(parties, count)
        settings = []
        for i in range(parties):
            s = PartySettings(
                state_dir=root / f"party{i}", index=i, listen="127.0.0.1:0",
                mpc_host="127.0.0.1", mpc_port_base=ports[i], mpc_port_count=count,
                mpc_bind_host="127.0.0.1",
            )
            s = replace(s, **overrides)  # type: ignore[arg-type]
            open_state(s)  # first start: the party makes its keys and requests
            sign_party_requests(ca, s.state_dir, i, s.tls_name)
            settings.append(s)
        key, cert = issue_client_identity(ca, "gateway", root / "gateway" / "gateway.key")
        return cls(root, ca, settings, key, cert)

    def add_owner(self, owner_id: str) -> Owner:
        owner = Owner(owner_id, SigningKey.generate())
        for s in self.settings:
            register_owner(s.state_dir, owner_id, bytes(owner.key.verify_key))
        self.owners[owner_id] = owner
        return owner

    def channel(self, index: int, port: int) -> grpc.aio.Channel:
        creds = grpc.ssl_channel_credentials(
            root_certificates=self.ca.cert_pem(), private_key=self.client_key,
            certificate_chain=self.client_cert,
        )
        options = [
            *CHANNEL_OPTIONS,
            # the party's certificate names the party (alice, bob, ...), not 127.0.0.1
            ("grpc.ssl_target_name_override", self.settings[index].control_name),
        ]
        return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=options)

    def peer_addresses(self) -> list[str]:
        return [f"{s.mpc_host}:{s.mpc_port_base}" for s in self.settings]


async def spawn_party(
    settings: PartySettings, log_path: Path, start_timeout: float = 30.0
) -> tuple[asyncio.subprocess.Process, int]:
    """Run a party daemon as its own process (``python -m ppfs_party serve``) on port 0;
    returns the process and its bound control-plane port."""
    port_file = settings.state_dir / "server.port"
    port_file.unlink(missing_ok=True)
    argv = [
        sys.executable, "-m", "ppfs_party", "serve",
        "--state-dir", str(settings.state_dir), "--index", str(settings.index),
        "--listen", settings.listen, "--mpc-host", settings.mpc_host,
        "--mpc-port", str(settings.mpc_port_base), "--port-file", str(port_file),
        "--mpc-port-count", str(settings.mpc_port_count),
        "--max-upload-bytes", str(settings.max_upload_bytes),
        "--max-concurrent-jobs", str(settings.max_concurrent_jobs),
        "--drain-seconds", str(settings.drain_seconds),
    ]
    if settings.mpc_bind_host:
        argv += ["--mpc-bind-host", settings.mpc_bind_host]
    if settings.tls_name:
        argv += ["--tls-name", settings.tls_name]
    if settings.mpspdz_cache:
        argv += ["--mpspdz-cache", str(settings.mpspdz_cache)]
    if settings.job_timeout is not None:
        argv += ["--job-timeout", str(settings.job_timeout)]
    if settings.stall_timeout is not None:
        argv += ["--stall-timeout", str(settings.stall_timeout)]
    for engine in settings.engines:
        argv += ["--engine", engine]
    with open(log_path, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )
    deadline = time.monotonic() + start_timeout
    while not port_file.is_file():
        if proc.returncode is not None or time.monotonic() > deadline:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
            raise RuntimeError(f"party {settings.index} did not start; see {log_path}")
        await asyncio.sleep(0.05)
    return proc, int(port_file.read_text())


# ---------------------------------------------------------------- data owner side


@dataclass(frozen=True)
class SealedUpload:
    manifest: bytes
    signature: bytes
    parts: list[bytes]
    dataset_id: str
    upload_id: str
    owner_id: str
    owner_key: SigningKey | None = None  # the owner side's key: signs its consents


def seal_bundles(
    owner: Owner, box_keys: Sequence[bytes], per_party: Sequence[Sequence[ShareBundle]], *,
    dataset_id: str, upload_id: str, rows: int, columns: Sequence[str] = (),
    exponents: Sequence[int] = (), label_column: str = "", classes: Sequence[str] = (),
    frac_bits: int = 16, recipient_public_key: bytes = b"",
) -> SealedUpload:
    scheme = Scheme.for_parties(len(box_keys))
    parts = [seal(pack_bundles(b), k) for b, k in zip(per_party, box_keys, strict=True)]

    manifest = Manifest(
        dataset_id=dataset_id, upload_id=upload_id, owner_id=owner.owner_id,
        scheme=scheme.value, rows=rows, columns=tuple(columns),
        column_exponents=tuple(int(e) for e in exponents), label_column=label_column,
        classes=tuple(classes), frac_bits=frac_bits,
        part_sha256=tuple(hashlib.sha256(p).hexdigest() for p in parts),
        created_at=dt.datetime.now(dt.UTC).strftime(SIGNED_AT_FORMAT),
        recipient_public_key=base64.b64encode(recipient_public_key).decode(),
    )
    return SealedUpload(manifest.to_bytes(), sign_manifest(manifest, owner.key), parts,
                        dataset_id, upload_id, owner.owner_id, owner.key)


def data_upload(
    owner: Owner, box_keys: Sequence[bytes], raw: np.ndarray, columns: Sequence[str],
    exponents: Sequence[int], *, dataset_id: str, upload_id: str,
    onehot: np.ndarray | None = None, label_column: str = "", classes: Sequence[str] = (),
    frac_bits: int = 16,
) -> SealedUpload:
    """Share encoded values (and the one-hot label) and seal one part per party."""
    scheme = Scheme.for_parties(len(box_keys))
    per_party: list[list[ShareBundle]] = [[] for _ in box_keys]
    for kind, matrix, frac in (("data", raw, frac_bits), ("labels", onehot, 0)):
        if matrix is None:
            continue
        for i, b in enumerate(bundles_for_all(matrix, scheme, dataset_id=dataset_id,
                                              kind=kind, frac_bits=frac)):
            per_party[i].append(b)
    return seal_bundles(owner, box_keys, per_party, dataset_id=dataset_id, upload_id=upload_id,
                        rows=raw.shape[0], columns=columns, exponents=exponents,
                        label_column=label_column, classes=classes, frac_bits=frac_bits)


def mask_upload(
    recipient: Owner, box_keys: Sequence[bytes], words: np.ndarray, *, dataset_id: str,
    upload_id: str, recipient_public_key: bytes | None = None,
) -> SealedUpload:
    """The result recipient's mask words, shared and sealed like any data; the signed
    manifest names the recipient's box key (default: ``recipient.box``)."""
    scheme = Scheme.for_parties(len(box_keys))
    bundles = bundles_for_all(words, scheme, dataset_id=dataset_id, kind="mask",
                              frac_bits=0)
    return seal_bundles(recipient, box_keys, [[b] for b in bundles], dataset_id=dataset_id,
                        upload_id=upload_id, rows=words.shape[0], columns=("w0", "w1"),
                        exponents=(0, 0),
                        recipient_public_key=(bytes(recipient.box.public_key)
                                              if recipient_public_key is None
                                              else recipient_public_key))


def describe_job(
    job_id: str, datasets: Sequence[Sequence[SealedUpload]], *, mask: SealedUpload,
    k: int, security: str, engine: str, recipient_public_key: bytes, peers: Sequence[str],
    combination: str = "horizontal", train: TrainParams | None = None,
    consents: Sequence[SignedConsent] | None = None, recipient: str | None = None,
    scorer: Scorer = Scorer.MS_GINI, request: SignedRequest | None = None,
) -> party_pb2.JobDescription:
    """The description a gateway would send: each data set pinned to exactly these
    uploads (in this order), planned from their manifests (ppfs.contract.plan). The
    recipient is the mask's owner; without ``consents`` every owner of an upload
    consents to what the job reveals to it; without ``request`` the recipient signs a
    request for exactly this job."""
    pinned, schemas = [], []
    for ups in datasets:
        mans = [Manifest.from_bytes(u.manifest) for u in ups]
        m0 = mans[0]
        pinned.append(PinnedDataset(m0.dataset_id, tuple(
            PinnedUpload(m.upload_id, m.digest(), m.rows) for m in mans)))
        schemas.append(DatasetSchema(m0.dataset_id, m0.columns, m0.column_exponents,
                                     m0.label_column, m0.classes, m0.frac_bits,
                                     sum(m.rows for m in mans)))
    comb = Combination(combination)
    label = next(s.label_column for s in schemas if s.label_column)
    planned = plan(schemas, comb, label)
    recipient = mask.owner_id if recipient is None else recipient
    if consents is None:
        reveal = Reveal.MODEL if train is not None else Reveal.SELECTION
        # one per owner and data set, as the gateway relays them (a party refuses one
        # relayed twice)
        consents = list(dict.fromkeys(
            Consent(u.owner_id, Manifest.from_bytes(u.manifest).dataset_id, recipient,
                    recipient_public_key, reveal).sign(u.owner_key)
            for ups in datasets for u in ups if u.owner_key is not None
        ))
    job = JobContract(
        job_id=job_id, datasets=tuple(pinned), combination=comb, label_column=label, k=k,
        security=Security(security), engine=engine,
        frac_bits=planned.frac_bits, recipient_public_key=recipient_public_key,
        mask_upload_id=mask.upload_id, m=planned.m, p=planned.p, classes=len(planned.classes),
        training=train, peer_mpc_addresses=tuple(peers), consents=tuple(consents),
        recipient=recipient, scorer=scorer,
    )
    if request is None and mask.owner_key is not None:
        # the recipient (the mask's owner) asks for exactly this job
        request = JobRequest.for_job(job).sign(mask.owner_key)
    return replace(job, request=request).to_proto()


# ---------------------------------------------------------------- one party's store, direct


@dataclass
class StoreParty:
    """Party 0's state directory and keys, with a wall clock the test moves (``now``;
    None: the real one); :meth:`store` opens the store as a (re)started daemon does."""

    state: Path
    box: PrivateKey
    owner: Owner
    others: tuple[bytes, bytes]  # the other two parties' box keys
    seed: int = 0  # of the test data in every part
    now: float | None = None

    @classmethod
    def create(cls, state: Path, seed: int = 0, now: float | None = None) -> StoreParty:
        owner = Owner("owner-a", SigningKey.generate())
        register_owner(state, owner.owner_id, bytes(owner.key.verify_key))
        others = (bytes(PrivateKey.generate().public_key),
                  bytes(PrivateKey.generate().public_key))
        return cls(state, PrivateKey.generate(), owner, others, seed, now)

    def store(self, **settings: Any) -> ShareStore:
        clock = time.time if self.now is None else (lambda: float(self.now or 0.0))
        s = ShareStore(self.state, 0, self.box, AuditLog(self.state / "audit.log"), 1 << 20,
                       clock=clock, **settings)
        s.open()
        return s

    def sealed(self, upload_id: str, rows: int = 6) -> SealedUpload:
        """A part of owner-a's upload ``upload_id`` into data set "ds" (labelled rows)."""
        raw = np.random.default_rng(self.seed).integers(-1000, 1000, size=(rows, 3))
        onehot = (np.arange(rows) % 2).reshape(rows, 1)
        return data_upload(self.owner, [bytes(self.box.public_key), *self.others], raw,
                           ["a", "b", "c"], [0, 0, 0], dataset_id="ds", upload_id=upload_id,
                           onehot=onehot, label_column="y", classes=("0", "1"))

    def staged_dir(self, upload_id: str) -> Path:
        return self.state / "staged" / upload_id

    def audit(self, event: str) -> list[dict[str, object]]:
        return [e for e in AuditLog(self.state / "audit.log").entries() if e["event"] == event]


async def put_part(store: ShareStore, up: SealedUpload, staged: bool = True,
                   repair: tuple[bytes, bytes] = (b"", b"")) -> StoredUpload:
    """Party 0's part of ``up`` into ``store``, as the daemon receives it (with the
    owner's signed repair, if given)."""

    async def chunks() -> AsyncIterator[bytes]:
        yield up.parts[0]

    header = UploadHeader(up.dataset_id, up.upload_id, up.owner_id, up.manifest, up.signature,
                          len(up.parts[0]), staged, *repair)
    return await store.put(header, chunks())


def upload_messages(
    up: SealedUpload, party: int, sealed: bytes | None = None
) -> Iterator[party_pb2.UploadPartChunk]:
    """Header, then the sealed bytes in chunks (``sealed`` overrides the real part)."""
    data = up.parts[party] if sealed is None else sealed
    yield party_pb2.UploadPartChunk(header=party_pb2.UploadPartHeader(
        dataset_id=up.dataset_id, upload_id=up.upload_id, owner_id=up.owner_id,
        manifest=up.manifest, manifest_signature=up.signature, sealed_size=len(data),
    ))
    for lo in range(0, len(data), CHUNK):
        yield party_pb2.UploadPartChunk(chunk=data[lo : lo + CHUNK])


# ---------------------------------------------------------------- recipient side


Stub = party_pb2_grpc.PartyServiceStub
# a test's body against running daemons: their servers, stubs and box public keys
Scenario = Callable[["Deployment", list[PartyServer], list[Stub], list[bytes]], Awaitable[None]]


def run_parties(tmp_path: Path, scenario: Scenario, owners: Sequence[str] = ("owner-a",),
                **overrides: object) -> Deployment:
    """Three MPyC party daemons over gRPC with mutual TLS, the given data owners
    registered; ``scenario`` runs against them, then they stop. ``overrides`` go to
    every party's settings."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",), **overrides)
    for owner in owners:
        dep.add_owner(owner)
    serve_parties(dep, scenario)
    return dep


def serve_parties(dep: Deployment, scenario: Scenario) -> None:
    """Start ``dep``'s party daemons from their state (again, after :func:`run_parties`:
    a restart), run ``scenario`` against them, stop them."""

    async def main() -> None:
        servers = [await start_party_server(s) for s in dep.settings]
        channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
        try:
            stubs = [Stub(c) for c in channels]
            box = [i.box_public_key for i in await identities(stubs)]
            await scenario(dep, servers, stubs, box)
        finally:
            for c in channels:
                await c.close()
            for srv in servers:
                await srv.stop(0)

    asyncio.run(main())


async def identities(stubs: Sequence[party_pb2_grpc.PartyServiceStub]
                     ) -> list[party_pb2.PartyIdentity]:
    return [await s.GetIdentity(party_pb2.GetIdentityRequest()) for s in stubs]


def start_requests(desc: party_pb2.JobDescription) -> party_pb2.StartJobRequest:
    return party_pb2.StartJobRequest(job=desc, description_sha256=description_sha256(desc))


async def watch_to_end(stub: party_pb2_grpc.PartyServiceStub, job_id: str,
                       timeout: float = 300.0) -> party_pb2.JobStatus:
    last = None
    call = stub.WatchJob(party_pb2.WatchJobRequest(job_id=job_id), timeout=timeout)
    async for event in call:
        last = event.status
    if last is None:
        raise RuntimeError(f"WatchJob({job_id}) ended without an event")
    return last


async def fetch_opened(
    stubs: Sequence[party_pb2_grpc.PartyServiceStub], ids: Sequence[party_pb2.PartyIdentity],
    job_id: str, recipient_box: PrivateKey,
) -> list[np.ndarray]:
    """Every party's result part, signature checked, unsealed by the recipient."""
    out = []
    for stub, ident in zip(stubs, ids, strict=True):
        part = await stub.FetchResultPart(party_pb2.FetchResultPartRequest(job_id=job_id))
        VerifyKey(ident.signing_public_key).verify(job_id.encode() + part.sealed,
                                                   part.signature)  # raises if forged
        if part.party_index != ident.index:
            raise ValueError("a result part names another party")
        out.append(np.frombuffer(open_sealed(part.sealed, recipient_box), dtype="<u8")
                   .astype(np.uint64))
    return out


class EngineWrapper:
    """An engine that is ``inner`` but for what a subclass redefines (a test's fault or
    probe around a real engine)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class SlowEngine(EngineWrapper):
    """MPyC whose ``prepare`` takes ``seconds`` the first time a program is seen
    (a slow compile), then finds it in its cache."""

    def __init__(self, inner: MpycEngine, seconds: float) -> None:
        super().__init__(inner)
        self.seconds = seconds
        self.compiles: list[str] = []  # program hashes compiled (finished), in order
        self.cache: set[str] = set()

    async def prepare(self, shape: Step2AShape, security: Security) -> str:
        digest = await self.inner.prepare(shape, security)
        if digest not in self.cache:
            await asyncio.sleep(self.seconds)
            self.compiles.append(digest)
            self.cache.add(digest)
        return digest


class ProcessCluster:
    """Party daemons as processes (:func:`spawn_party`), their channels, one owner and
    one recipient."""

    def __init__(self, dep: Deployment) -> None:
        self.dep = dep
        self.procs: list[asyncio.subprocess.Process | None] = [None] * len(dep.settings)
        self.channels: list[grpc.aio.Channel | None] = [None] * len(dep.settings)
        self.stubs: list[party_pb2_grpc.PartyServiceStub] = []
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
        stub = party_pb2_grpc.PartyServiceStub(ch)
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


@dataclass
class PartiesInProcess:
    """Three parties served in the test's event loop, with a job running on them."""

    dep: Deployment
    servers: list[PartyServer]
    cluster: ProcessCluster  # its upload and job helpers, on these servers
    late: party_pb2.JobDescription  # a second job, on masks of its own, not sent
    stopped: set[int] = field(default_factory=set)

    async def stop(self, index: int) -> None:
        """Stop one party as its daemon does on a stop with no drain."""
        self.stopped.add(index)
        await self.servers[index].stop(0)


@contextlib.asynccontextmanager
async def parties_running_a_long_job(tmp_path: Path) -> AsyncIterator[PartiesInProcess]:
    """Alice, Bob and Carol served in this event loop on MPyC, all three running the job
    "job-long" (the caller makes its compile outlast every wait: :class:`SlowEngine`),
    and "job-late" made on masks of its own for the caller to send; stopped at the end."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    servers = [await start_party_server(s) for s in dep.settings]
    channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
    cluster = ProcessCluster(dep)
    cluster.stubs = [party_pb2_grpc.PartyServiceStub(c) for c in channels]
    stopped: set[int] = set()
    try:
        _, _, shape = await cluster.upload(make_table(12, 3, seed=4), 1, "mask-1")
        await cluster.send_mask()
        rec = dep.owners["recipient"].box
        desc = cluster.job("job-long", "mask-1", Security.PASSIVE_3PC, "mpyc", 1, rec)
        for stub in cluster.stubs:
            await stub.StartJob(start_requests(desc))
        cluster.add_mask([i.box_public_key for i in await identities(cluster.stubs)],
                         shape, "mask-2")
        await cluster.send_mask()
        late = cluster.job("job-late", "mask-2", Security.PASSIVE_3PC, "mpyc", 1, rec)
        parties = PartiesInProcess(dep, servers, cluster, late, stopped)
        yield parties
    finally:
        for c in channels:
            await c.close()
        for i, srv in enumerate(servers):
            if i not in stopped:
                await srv.stop(0)
