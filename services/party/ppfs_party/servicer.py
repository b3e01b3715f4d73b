"""ppfs.v1.PartyService: parse the request, delegate, map errors. Nothing else."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from ppfs.contract import FailureKind, JobState
from ppfs.errors import ParameterError
from ppfs.upload import Manifest, UploadRejected
from ppfs.v1 import party_pb2, party_pb2_grpc
from ppfs.withdrawal import SignedRevocation, SignedWithdrawal
from ppfs_party.errors import TooManyOpenCallsError, UploadTimedOutError, to_status
from ppfs_party.jobs import JobRecord
from ppfs_party.metrics import PartyMetrics
from ppfs_party.state import PartyState
from ppfs_party.store import UploadHeader

log = logging.getLogger("ppfs.party")

R = TypeVar("R")

# WatchJob streams open at once on one job: the gateway holds one per job and opens the
# next only after one ended, so a few cover a stream it has not yet seen end
WATCHERS_PER_JOB = 4


async def _abort(context: grpc.aio.ServicerContext[Any, Any], method: str,
                 exc: Exception, metrics: PartyMetrics | None = None) -> None:
    code, message = to_status(exc)
    if metrics is not None:
        metrics.refused(method, code.name)
    if code is grpc.StatusCode.INTERNAL:
        log.exception("[Party.%s] unexpected error", method)
    else:
        log.info("[Party.%s] refused: %s (%s)", method, code.name, type(exc).__name__)
    await context.abort(code, message)


def _unary(method: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    """Map any error of a unary handler once, through :func:`to_status`."""

    @functools.wraps(method)
    async def wrapper(self: PartyServicer, request: Any,
                      context: grpc.aio.ServicerContext[Any, Any]) -> R:
        try:
            return await method(self, request, context)
        except Exception as exc:
            await _abort(context, method.__name__, exc, self.state.metrics)
            raise  # not reached: abort raises

    return wrapper


_UPLOAD_STATUS = {
    "staged": party_pb2.UPLOAD_STATUS_STAGED,
    "committed": party_pb2.UPLOAD_STATUS_COMMITTED,
    "aborted": party_pb2.UPLOAD_STATUS_ABORTED,
    "damaged": party_pb2.UPLOAD_STATUS_DAMAGED,
}


def _signed_at(manifest: Manifest) -> str:
    """The manifest's signed time, or "" for one stored before parties checked it."""
    try:
        return manifest.signed_at()
    except UploadRejected:
        return ""


def job_status(rec: JobRecord) -> party_pb2.JobStatus:
    st = party_pb2.JobStatus(
        job_id=rec.job_id, state=JobState(rec.state).to_proto(), phase=rec.phase,
        progress=rec.progress, error=rec.error, program_sha256=rec.program_sha256,
        seconds=rec.seconds, bytes_sent=rec.bytes_sent,
        failure=(FailureKind(rec.failure).to_proto() if rec.failure
                 else party_pb2.FAILURE_KIND_UNSPECIFIED),
    )
    if rec.waited_seconds is not None:  # absent: unknown
        st.waited_seconds = max(0.0, rec.waited_seconds)
    return st


class PartyServicer(party_pb2_grpc.PartyServiceServicer):
    def __init__(self, state: PartyState) -> None:
        self.state = state
        # the streams a caller could otherwise hold open without bound: each holds a
        # task, a socket and (uploads) a spool file until it ends
        self._open_uploads = 0
        self._watchers: dict[str, int] = {}

    @_unary
    async def GetIdentity(self, request: party_pb2.GetIdentityRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> party_pb2.PartyIdentity:
        return self.state.identity()

    async def PutUploadPart(
        self, request_iterator: AsyncIterator[party_pb2.UploadPartChunk],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> party_pb2.PutUploadPartResponse:
        limit = self.state.settings.max_open_uploads
        if self._open_uploads >= limit:
            await _abort(context, "PutUploadPart", TooManyOpenCallsError(
                f"this party has {limit} upload parts open already, its limit "
                "(--max-open-uploads); try again when one has ended"), self.state.metrics)
        self._open_uploads += 1
        try:
            return await self._put_upload_part(request_iterator, context)
        finally:
            self._open_uploads -= 1

    async def _put_upload_part(
        self, request_iterator: AsyncIterator[party_pb2.UploadPartChunk],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> party_pb2.PutUploadPartResponse:
        try:
            # the header within the party's time: a stream that never sends one holds
            # nothing for longer
            timeout = self.state.settings.upload_timeout
            try:
                async with asyncio.timeout(timeout):
                    first = await anext(aiter(request_iterator), None)
            except TimeoutError:
                raise UploadTimedOutError(
                    f"no upload header arrived within {timeout:g} s") from None
            if first is None or first.WhichOneof("part") != "header":
                raise ParameterError("an upload starts with its header")
            h = first.header
            header = UploadHeader(h.dataset_id, h.upload_id, h.owner_id, h.manifest,
                                  h.manifest_signature, h.sealed_size, h.staged, h.repair,
                                  h.repair_signature)

            async def chunks() -> AsyncIterator[bytes]:
                async for msg in request_iterator:
                    if msg.WhichOneof("part") != "chunk":
                        raise ParameterError("only sealed chunks may follow the header")
                    yield msg.chunk

            stored = await self.state.store.put(header, chunks())
            self.state.metrics.upload_stored(h.sealed_size)
            m = stored.manifest
            return party_pb2.PutUploadPartResponse(
                dataset_id=m.dataset_id, upload_id=m.upload_id, rows=m.rows,
                columns=len(m.columns),
            )
        except Exception as exc:
            await _abort(context, "PutUploadPart", exc, self.state.metrics)
            raise

    @_unary
    async def GetDataset(self, request: party_pb2.GetDatasetRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> party_pb2.DatasetInfo:
        return self.state.dataset_info(request.dataset_id)

    @_unary
    async def CommitUpload(self, request: party_pb2.UploadDecisionRequest,
                           context: grpc.aio.ServicerContext[Any, Any]
                           ) -> party_pb2.UploadDecisionResponse:
        status = await self.state.store.commit(request.dataset_id, request.upload_id)
        return party_pb2.UploadDecisionResponse(upload_id=request.upload_id,
                                                status=_UPLOAD_STATUS[status])

    @_unary
    async def AbortUpload(self, request: party_pb2.UploadDecisionRequest,
                          context: grpc.aio.ServicerContext[Any, Any]
                          ) -> party_pb2.UploadDecisionResponse:
        status = await self.state.store.abort(request.dataset_id, request.upload_id)
        return party_pb2.UploadDecisionResponse(upload_id=request.upload_id,
                                                status=_UPLOAD_STATUS[status])

    @_unary
    async def ListUploads(self, request: party_pb2.ListUploadsRequest,
                          context: grpc.aio.ServicerContext[Any, Any]
                          ) -> party_pb2.ListUploadsResponse:
        if request.verify:  # damaged share files are set aside, then listed as damaged
            await self.state.store.set_aside_damaged(
                self.state.store.held_uploads(request.dataset_id), from_disk=True)
        held = self.state.store.listing(request.dataset_id)
        return party_pb2.ListUploadsResponse(dataset_id=request.dataset_id, uploads=[
            party_pb2.HeldUpload(upload_id=u.manifest.upload_id,
                                 manifest_sha256=u.manifest.digest(), rows=u.manifest.rows,
                                 status=_UPLOAD_STATUS[status],
                                 signed_at=_signed_at(u.manifest))
            for u, status in held])

    @_unary
    async def StartJob(self, request: party_pb2.StartJobRequest,
                       context: grpc.aio.ServicerContext[Any, Any]
                       ) -> party_pb2.StartJobResponse:
        rec = await self.state.jobs.start(request.job, request.description_sha256)
        return party_pb2.StartJobResponse(job_id=rec.job_id, program_sha256=rec.program_sha256,
                                          state=JobState(rec.state).to_proto())

    @_unary
    async def CancelJob(self, request: party_pb2.CancelJobRequest,
                        context: grpc.aio.ServicerContext[Any, Any]
                        ) -> party_pb2.CancelJobResponse:
        rec, remembered = await self.state.jobs.cancel(request.job_id)
        return party_pb2.CancelJobResponse(state=JobState(rec.state).to_proto(),
                                           remembered=remembered)

    @_unary
    async def GetJob(self, request: party_pb2.GetJobRequest,
                     context: grpc.aio.ServicerContext[Any, Any]) -> party_pb2.JobStatus:
        return job_status(self.state.jobs.get(request.job_id))

    async def WatchJob(self, request: party_pb2.WatchJobRequest,
                       context: grpc.aio.ServicerContext[Any, Any]
                       ) -> AsyncIterator[party_pb2.JobEvent]:
        job_id = request.job_id
        open_now = self._watchers.get(job_id, 0)
        if open_now >= WATCHERS_PER_JOB:
            await _abort(context, "WatchJob", TooManyOpenCallsError(
                f"job {job_id[:64]!r} has {WATCHERS_PER_JOB} watchers at this party "
                "already, the most it allows; poll it (GetJob) or watch again when one "
                "has ended"), self.state.metrics)
        self._watchers[job_id] = open_now + 1
        try:
            async for rec in self.state.jobs.watch(job_id):
                yield party_pb2.JobEvent(status=job_status(rec))
        except Exception as exc:
            await _abort(context, "WatchJob", exc, self.state.metrics)
        finally:
            left = self._watchers[job_id] - 1
            if left:
                self._watchers[job_id] = left
            else:
                del self._watchers[job_id]

    @_unary
    async def FetchResultPart(self, request: party_pb2.FetchResultPartRequest,
                              context: grpc.aio.ServicerContext[Any, Any]
                              ) -> party_pb2.SealedResultPart:
        sealed, signature, statement, statement_sig = self.state.jobs.result_part(
            request.job_id)
        return party_pb2.SealedResultPart(
            job_id=request.job_id, party_index=self.state.settings.index, sealed=sealed,
            signature=signature, statement=statement, statement_signature=statement_sig,
        )

    @_unary
    async def WithdrawUploads(self, request: party_pb2.WithdrawUploadsRequest,
                              context: grpc.aio.ServicerContext[Any, Any]
                              ) -> party_pb2.WithdrawUploadsResponse:
        receipt, signature = await self.state.withdraw(
            SignedWithdrawal(request.statement, request.signature))
        return party_pb2.WithdrawUploadsResponse(receipt=receipt, receipt_signature=signature)

    @_unary
    async def RevokeConsents(self, request: party_pb2.RevokeConsentsRequest,
                             context: grpc.aio.ServicerContext[Any, Any]
                             ) -> party_pb2.RevokeConsentsResponse:
        receipt = await self.state.jobs.revoke(
            SignedRevocation(request.statement, request.signature))
        blob, signature = receipt.sign(self.state.keys.signing)
        return party_pb2.RevokeConsentsResponse(receipt=blob, receipt_signature=signature)

    @_unary
    async def StateHoldings(self, request: party_pb2.StateHoldingsRequest,
                            context: grpc.aio.ServicerContext[Any, Any]
                            ) -> party_pb2.StateHoldingsResponse:
        statement, signature = self.state.holdings(request.owner_id, request.dataset_id,
                                                   request.challenge)
        return party_pb2.StateHoldingsResponse(statement=statement, signature=signature)
