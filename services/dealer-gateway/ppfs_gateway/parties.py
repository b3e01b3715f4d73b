"""The gateway's gRPC client to the computing parties (ppfs.v1.PartyService).

One channel per party over mutual TLS: the gateway presents its own client
certificate from the deployment CA and accepts only party certificates from that
CA. Every failure is turned into a gateway error naming the party; the party's
own error text is passed on only as the short, public message its error catalog
produced, capped in length.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from cryptography import x509
from grpc import aio

from ppfs.engines.base import PARTY_NAMES
from ppfs.keycert import TrustAnchor, UntrustedPartyKey, ca_fingerprint, verify_party_keys
from ppfs.v1 import party_pb2 as pb
from ppfs.v1 import party_pb2_grpc as pb_grpc
from ppfs_gateway.core.config import PartyEndpoint, Settings
from ppfs_gateway.errors import (
    NotFound,
    PartyFailed,
    PartyRefusesConnections,
    PartyRejected,
    PartyUnavailable,
)

log = logging.getLogger("ppfs.gateway")

CHUNK = 1 << 20  # bytes of sealed data per PutUploadPart message
_MAX_DETAIL = 200
# what a party answers for an error it does not name (ppfs_party.errors.INTERNAL_MESSAGE)
PARTY_INTERNAL = "Internal server error."
# An upload part gets an instant answer's time plus one second per this many bytes
# (about 2 Mbit/s): a slow but working WAN link between gateway and party, and the
# party's own opening and writing of the part, clear that rate many times over, while a
# party that froze as a small part (an output mask, a few rows) was sent is named within
# seconds, not after the whole transfer deadline.
UPLOAD_FLOOR_BYTES_PER_SECOND = 256 << 10
# What a withdrawal takes a party beyond a call it answers at once: stopping the engines of
# the jobs it concerns (each killed and waited for) and deleting the uploads' files (a
# rename and an unlink per file, however large): seconds, so that a frozen party holds the
# owner's command for well under a transfer's time
WITHDRAW_EXTRA_SECONDS = 30.0
# A party's identity is fetched once and served from the cache; one older than this is
# fetched again in the background (the cached one is served meanwhile, and kept if the
# party does not answer): a party's renewed key statement reaches clients without a
# gateway restart.
IDENTITY_REFRESH_SECONDS = 60.0
# A party that reported a stop is asked again this often (at most), so that it shows as
# back soon after it is
STOPPING_REFRESH_SECONDS = 5.0

# What gRPC's asyncio client reports, in place of the party's status, for a streaming
# call whose message it was still writing when the party answered and closed the call
LOST_STATUS = "Internal error from Core"

_REJECTED = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def channel_options(server_name: str) -> list[tuple[str, int | str]]:
    return [
        # We dial parties by address (often an IP or a compose service name) but their
        # certificates name the party: check the certificate against that name.
        ("grpc.ssl_target_name_override", server_name),
        # Ping an idle connection every 60 s, well below Azure's ~4 min idle-TCP cutoff.
        # Not more often: parties accept client pings at most every 30 s and close
        # the connection of a client that pings faster. A dead party is noticed within
        # the 60 s budget by the job watcher's GetJob polls, not by keepalive.
        ("grpc.keepalive_time_ms", 60_000),
        # A ping not answered within 20 s marks the connection dead.
        ("grpc.keepalive_timeout_ms", 20_000),
        # WatchJob streams stay open for the whole job with long silences between
        # events; keep pinging while no call or no data is in flight.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Result parts carry D' (m*k masked words, sealed): allow up to 256 MiB
        # instead of the 4 MiB default.
        ("grpc.max_receive_message_length", 256 << 20),
        # We send sealed uploads in 1 MiB chunks; leave headroom for the header.
        ("grpc.max_send_message_length", 8 << 20),
        # Reconnect quickly after a party restart: at most 5 s between attempts.
        ("grpc.max_reconnect_backoff_ms", 5_000),
    ]


def client_credentials(settings: Settings) -> grpc.ChannelCredentials:
    tls = settings.tls
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca_cert.read_bytes(),
        private_key=tls.client_key.read_bytes(),
        certificate_chain=tls.client_cert.read_bytes(),
    )


def upload_part_seconds(size: int, rpc_seconds: float, transfer_seconds: float) -> float:
    """The deadline of a call that sends ``size`` bytes to a party: ``rpc_seconds`` and
    one second per UPLOAD_FLOOR_BYTES_PER_SECOND begun, at most ``transfer_seconds``."""
    return min(rpc_seconds + math.ceil(size / UPLOAD_FLOOR_BYTES_PER_SECOND),
               transfer_seconds)


def _name(index: int) -> str:
    return PARTY_NAMES[index] if index < len(PARTY_NAMES) else f"party {index}"


@dataclass
class PartyClient:
    index: int
    endpoint: PartyEndpoint
    channel: aio.Channel
    stub: pb_grpc.PartyServiceStub
    rpc_seconds: float  # a call the party answers at once
    # a call that moves a result part, or the cap of an upload part's (upload_part_seconds)
    transfer_seconds: float = 120.0

    @property
    def name(self) -> str:
        return _name(self.index)

    def _error(self, exc: aio.AioRpcError, what: str, seconds: float) -> Exception:
        code = exc.code()
        detail = (exc.details() or "")[:_MAX_DETAIL]
        log.warning("[Gateway.%s] party=%s status=%s", what, self.name, code.name)
        if code in _REJECTED:
            return PartyRejected(f"{self.name} refused {what}: {detail}")
        if code == grpc.StatusCode.NOT_FOUND:
            return NotFound(f"{self.name}: {detail or 'not found'}")
        if code == grpc.StatusCode.INTERNAL and detail and detail != PARTY_INTERNAL:
            # it answered, naming its own failure (a write of its files): not a lost party
            return PartyFailed(f"{self.name} failed {what}: {detail}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            # connected but silent: a frozen (stopped, swapping) or overloaded party
            return PartyUnavailable(
                f"{self.name} did not answer {what} within {seconds:g} s (frozen or "
                "overloaded?)")
        if code == grpc.StatusCode.UNAVAILABLE and "Connection refused" in (exc.details() or ""):
            # its host answered that nothing listens there: the daemon is not running
            return PartyRefusesConnections(
                f"{self.name} did not answer {what} ({code.name.lower()})")
        return PartyUnavailable(f"{self.name} did not answer {what} ({code.name.lower()})")

    async def ready(self, seconds: float) -> bool:
        """Wait (at most ``seconds``) for the channel to connect: a party that just
        restarted is reached at once instead of after the channel's reconnect backoff."""
        try:
            await asyncio.wait_for(self.channel.channel_ready(), seconds)
        except (TimeoutError, asyncio.CancelledError, aio.AioRpcError):
            return False
        return True

    async def identity(self) -> pb.PartyIdentity:
        try:
            return await self.stub.GetIdentity(pb.GetIdentityRequest(), timeout=self.rpc_seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "GetIdentity", self.rpc_seconds) from None

    async def put_upload_part(
        self, header: pb.UploadPartHeader, sealed: bytes
    ) -> pb.PutUploadPartResponse:
        async def chunks() -> AsyncIterator[pb.UploadPartChunk]:
            yield pb.UploadPartChunk(header=header)
            for off in range(0, len(sealed), CHUNK):
                yield pb.UploadPartChunk(chunk=sealed[off : off + CHUNK])

        seconds = upload_part_seconds(header.ByteSize() + len(sealed), self.rpc_seconds,
                                      self.transfer_seconds)
        try:
            return await self.stub.PutUploadPart(chunks(), timeout=seconds)
        except aio.AioRpcError as exc:
            if (exc.code(), exc.details()) == (grpc.StatusCode.INTERNAL, LOST_STATUS):
                # the party answered and closed the call while the part was still being
                # written: it refused it (a party that went away gives UNAVAILABLE)
                log.warning("[Gateway.the upload] party=%s ended the call early", self.name)
                raise PartyRejected(
                    f"{self.name} refused the upload before all of it was sent (its "
                    "reason did not reach the gateway: gRPC reports the write it cut "
                    "short instead)") from None
            raise self._error(exc, "the upload", seconds) from None

    async def decide_upload(
        self, dataset_id: str, upload_id: str, commit: bool, timeout: float | None = None
    ) -> pb.UploadDecisionResponse:
        req = pb.UploadDecisionRequest(dataset_id=dataset_id, upload_id=upload_id)
        what = "CommitUpload" if commit else "AbortUpload"
        seconds = timeout or self.rpc_seconds
        try:
            call = self.stub.CommitUpload if commit else self.stub.AbortUpload
            return await call(req, timeout=seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, what, seconds) from None

    async def list_uploads(
        self, dataset_id: str, timeout: float | None = None, verify: bool = False
    ) -> pb.ListUploadsResponse:
        """What the party holds of a data set; ``verify``: it reads every share file of
        it first (a damaged one is set aside and listed damaged)."""
        seconds = timeout or self.rpc_seconds
        try:
            return await self.stub.ListUploads(
                pb.ListUploadsRequest(dataset_id=dataset_id, verify=verify), timeout=seconds
            )
        except aio.AioRpcError as exc:
            raise self._error(exc, "ListUploads", seconds) from None

    async def withdraw(self, statement: bytes, signature: bytes
                       ) -> pb.WithdrawUploadsResponse:
        """Relay an owner's signed withdrawal; the party's signed receipt. The party
        stops jobs and deletes files first: WITHDRAW_EXTRA_SECONDS more than a call it
        answers at once (never more than a transfer's time)."""
        seconds = min(self.rpc_seconds + WITHDRAW_EXTRA_SECONDS, self.transfer_seconds)
        try:
            return await self.stub.WithdrawUploads(
                pb.WithdrawUploadsRequest(statement=statement, signature=signature),
                timeout=seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "WithdrawUploads", seconds) from None

    async def revoke_consents(self, statement: bytes, signature: bytes
                              ) -> pb.RevokeConsentsResponse:
        """Relay an owner's signed revocation of its consents; the party's receipt."""
        try:
            return await self.stub.RevokeConsents(
                pb.RevokeConsentsRequest(statement=statement, signature=signature),
                timeout=self.rpc_seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "RevokeConsents", self.rpc_seconds) from None

    async def state_holdings(self, dataset_id: str, owner_id: str, challenge: bytes
                             ) -> pb.StateHoldingsResponse:
        """The party's signed statement of what it holds of an owner's uploads of a
        data set, answering the owner's challenge."""
        try:
            return await self.stub.StateHoldings(
                pb.StateHoldingsRequest(dataset_id=dataset_id, owner_id=owner_id,
                                        challenge=challenge), timeout=self.rpc_seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "StateHoldings", self.rpc_seconds) from None

    async def start_job(self, req: pb.StartJobRequest) -> pb.StartJobResponse:
        try:
            return await self.stub.StartJob(req, timeout=self.rpc_seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "StartJob", self.rpc_seconds) from None

    async def cancel_job(self, job_id: str) -> pb.CancelJobResponse:
        try:
            return await self.stub.CancelJob(
                pb.CancelJobRequest(job_id=job_id), timeout=self.rpc_seconds
            )
        except aio.AioRpcError as exc:
            raise self._error(exc, "CancelJob", self.rpc_seconds) from None

    async def get_job(self, job_id: str, timeout: float | None = None) -> pb.JobStatus:
        seconds = timeout or self.rpc_seconds
        try:
            return await self.stub.GetJob(pb.GetJobRequest(job_id=job_id), timeout=seconds)
        except aio.AioRpcError as exc:
            raise self._error(exc, "GetJob", seconds) from None

    def watch_job(self, job_id: str) -> AsyncIterator[pb.JobEvent]:
        # no deadline: the stream lives as long as the job; liveness is checked apart
        return self.stub.WatchJob(pb.WatchJobRequest(job_id=job_id))

    async def fetch_result_part(self, job_id: str) -> pb.SealedResultPart:
        try:
            return await self.stub.FetchResultPart(
                pb.FetchResultPartRequest(job_id=job_id), timeout=self.transfer_seconds
            )
        except aio.AioRpcError as exc:
            raise self._error(exc, "FetchResultPart", self.transfer_seconds) from None


@dataclass
class KnownIdentity:
    """The identity the gateway serves for one party, and how its refreshes went."""

    identity: pb.PartyIdentity
    fetched: float  # time.monotonic() it was fetched
    tried: float  # time.monotonic() of the last attempt to refresh it
    # why the last refresh did not replace it (did not answer, failed a check); "" when
    # it did
    problem: str = ""


def deployment_anchors(ca_pem: bytes) -> list[TrustAnchor]:
    """The deployment CA certificates the gateway holds (its ``tls.ca_cert``, perhaps a
    bundle while the CA is replaced), each a trust anchor to check key statements with."""
    try:
        certs = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return []
    return [TrustAnchor(ca_fingerprint(c), c) for c in certs]


class Parties:
    """All parties of the deployment, in party order, and their cached identities.

    Each party's identity is fetched once, then again in the background once older than
    :attr:`refresh_seconds`, every party on its own: one that does not answer keeps its
    last good identity while the others' are renewed. A refreshed identity replaces the
    cached one only if it passes every check (:meth:`observe`)."""

    def __init__(self, clients: Sequence[PartyClient], ca_pem: bytes = b"") -> None:
        self.clients = list(clients)
        self._known: list[KnownIdentity | None] = [None] * len(self.clients)
        self._refresh: list[asyncio.Task[None] | None] = [None] * len(self.clients)
        self._lock = asyncio.Lock()
        self.refresh_seconds = IDENTITY_REFRESH_SECONDS
        # what a key statement must be signed by for a refresh to be taken
        self.anchors = deployment_anchors(ca_pem)

    @classmethod
    def connect(cls, settings: Settings) -> Parties:
        creds = client_credentials(settings)
        clients = []
        for i, ep in enumerate(settings.parties):
            channel = aio.secure_channel(
                ep.address, creds, options=channel_options(ep.tls_server_name)
            )
            clients.append(
                PartyClient(
                    i, ep, channel, pb_grpc.PartyServiceStub(channel),
                    settings.party_rpc_seconds, settings.party_transfer_seconds,
                )
            )
        return cls(clients, settings.tls.ca_cert.read_bytes())

    def __len__(self) -> int:
        return len(self.clients)

    def known(self, index: int) -> KnownIdentity | None:
        """What the gateway serves for party ``index`` (None: not fetched yet)."""
        return self._known[index]

    async def identities(self) -> list[pb.PartyIdentity]:
        """Every party's identity (each fetched once, then cached and fetched again in
        the background once older than :attr:`refresh_seconds`); checks party order.
        A party never fetched yet is fetched now: its failure is raised (the others
        fetched meanwhile are kept)."""
        if any(k is None for k in self._known):
            async with self._lock:
                missing = [c for c in self.clients if self._known[c.index] is None]
                got = await asyncio.gather(*(c.identity() for c in missing),
                                           return_exceptions=True)
                failed: BaseException | None = None
                for c, ident in zip(missing, got, strict=True):
                    if isinstance(ident, BaseException):
                        failed = failed or ident
                    elif ident.index != c.index:
                        failed = failed or PartyRejected(
                            f"the party configured as {c.name} reports index {ident.index}")
                    else:
                        now = time.monotonic()
                        self._known[c.index] = KnownIdentity(ident, now, now)
                if failed is not None:
                    raise failed
        now = time.monotonic()
        out = []
        for c in self.clients:
            k = self._known[c.index]
            assert k is not None
            # a stopping party is looked at again soon: its stop shows until it is back
            every = min(self.refresh_seconds, STOPPING_REFRESH_SECONDS) \
                if k.identity.stopping else self.refresh_seconds
            task = self._refresh[c.index]
            if now - k.tried > every and (task is None or task.done()):
                k.tried = now
                self._refresh[c.index] = asyncio.create_task(self._refresh_one(c))
            out.append(k.identity)
        return out

    async def _refresh_one(self, c: PartyClient) -> None:
        try:
            ident = await c.identity()
        except Exception as exc:  # a party away: its cached identity stays
            self.unanswered(c.index, str(exc))
            return
        self.observe(c.index, ident)

    def unanswered(self, index: int, why: str) -> None:
        """Party ``index`` did not answer a refresh: its cached identity stays."""
        k = self._known[index]
        if k is not None:
            if not k.problem:
                log.info("[Gateway.Parties] %s's identity not refreshed: %s", _name(index),
                         why[:_MAX_DETAIL])
            k.problem = why[:_MAX_DETAIL]

    def check(self, index: int, ident: pb.PartyIdentity) -> str:
        """Why ``ident``, as party ``index`` reported it now, may not replace its cached
        identity ("" if it may): it reports another index or name, or its keys are not
        certified now by the deployment CA the gateway holds (the check a client makes,
        :func:`ppfs.keycert.verify_party_keys`; never the relayed CA)."""
        if ident.index != index:
            return f"reports index {ident.index}"
        # the configured name, not the cached one: a party first seen under another name
        # (a first fetch is not checked) is served once it states its own
        name = self.clients[index].name
        if ident.name != name:
            return f"reports the name {ident.name[:64]!r}, not {name!r}"
        if not self.anchors:  # nothing to check with: checked, it would pass unchecked
            return "the gateway holds no deployment CA certificate to check its keys with"
        why = ""
        for anchor in self.anchors:
            try:
                verify_party_keys(
                    anchor, index=ident.index, name=ident.name,
                    box_public_key=ident.box_public_key,
                    signing_public_key=ident.signing_public_key,
                    statement=ident.key_statement, signature=ident.key_statement_signature,
                    # the clients check the revocation list, each against its own anchor
                    revocations=None)
            except UntrustedPartyKey as exc:
                why = why or str(exc)
                continue
            return ""
        return why

    def observe(self, index: int, ident: pb.PartyIdentity) -> str:
        """Take ``ident``, just reported by party ``index``, as its identity if it passes
        every check (:meth:`check`); otherwise keep the cached one and note why. The
        reason it was not taken, or ""."""
        now = time.monotonic()
        k = self._known[index]
        if k is None:  # first sight: as a first fetch, which clients check themselves
            if ident.index != index:
                return f"reports index {ident.index}"
            self._known[index] = KnownIdentity(ident, now, now)
            return ""
        why = self.check(index, ident)
        if why:
            problem = f"the identity it reports now is not served: {why}"[:_MAX_DETAIL]
            if problem != k.problem:
                log.warning("[Gateway.Parties] %s: %s", _name(index), problem)
            k.problem = problem
            return why
        k.identity, k.fetched, k.problem = ident, now, ""
        return ""

    async def probe(self, seconds: float) -> list[pb.PartyIdentity | None]:
        """Every party's identity asked now (each call at most ``seconds``), None for one
        that did not answer; each answer is also taken as the party's identity if it
        passes every check (:meth:`observe`)."""
        async def one(c: PartyClient) -> pb.PartyIdentity | None:
            try:
                ident = await c.stub.GetIdentity(pb.GetIdentityRequest(), timeout=seconds)
            except aio.AioRpcError as exc:
                self.unanswered(c.index, f"did not answer ({exc.code().name.lower()})")
                return None
            self.observe(c.index, ident)
            return ident

        return list(await asyncio.gather(*(one(c) for c in self.clients)))

    async def close(self) -> None:
        for task in self._refresh:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await asyncio.gather(*(c.channel.close() for c in self.clients))
