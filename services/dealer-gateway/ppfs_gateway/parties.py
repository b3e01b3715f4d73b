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
from grpc import aio

from ppfs.engines.base import PARTY_NAMES
from ppfs.v1 import party_pb2 as pb
from ppfs.v1 import party_pb2_grpc as pb_grpc
from ppfs_gateway.core.config import PartyEndpoint, Settings
from ppfs_gateway.errors import NotFound, PartyFailed, PartyRejected, PartyUnavailable

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


class Parties:
    """All parties of the deployment, in party order, and their cached identities."""

    def __init__(self, clients: Sequence[PartyClient]) -> None:
        self.clients = list(clients)
        self._identities: list[pb.PartyIdentity] | None = None
        self._fetched = 0.0  # time.monotonic() of the cached identities
        self._refresh: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self.refresh_seconds = IDENTITY_REFRESH_SECONDS

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
        return cls(clients)

    def __len__(self) -> int:
        return len(self.clients)

    async def identities(self) -> list[pb.PartyIdentity]:
        """Every party's identity (fetched once, then cached and fetched again in the
        background once older than :attr:`refresh_seconds`); checks party order."""
        async with self._lock:
            if self._identities is None:
                self._identities = await self._fetch_identities()
                self._fetched = time.monotonic()
            elif (time.monotonic() - self._fetched > self.refresh_seconds
                  and (self._refresh is None or self._refresh.done())):
                self._refresh = asyncio.create_task(self._refresh_identities())
            return self._identities

    async def _fetch_identities(self) -> list[pb.PartyIdentity]:
        got = await asyncio.gather(*(c.identity() for c in self.clients))
        for c, ident in zip(self.clients, got, strict=True):
            if ident.index != c.index:
                raise PartyRejected(
                    f"the party configured as {c.name} reports index {ident.index}"
                )
        return list(got)

    async def _refresh_identities(self) -> None:
        try:
            got = await self._fetch_identities()
        except Exception as exc:  # a party away: the cached identities stay
            log.info("[Gateway.Parties] identities not refreshed: %s", type(exc).__name__)
            self._fetched = time.monotonic()
            return
        async with self._lock:
            self._identities, self._fetched = got, time.monotonic()

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._refresh
        await asyncio.gather(*(c.channel.close() for c in self.clients))
