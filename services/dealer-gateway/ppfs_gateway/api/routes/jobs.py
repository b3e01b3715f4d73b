from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, status
from fastapi.responses import StreamingResponse

from ppfs.contract import SignedRequest
from ppfs.engines.base import PARTY_NAMES
from ppfs_gateway.api.deps import BearerDep, JobsDep, PrincipalDep, ResourcesDep
from ppfs_gateway.api.schemas import (
    JobCreate,
    JobOut,
    JobValidate,
    JobValidOut,
    PartyStateOut,
    ResultOut,
    ResultPartOut,
    TrainingIn,
    b64decode,
    b64encode,
)
from ppfs_gateway.core.config import Role
from ppfs_gateway.errors import InvalidRequest
from ppfs_gateway.jobs import JobCoordinator, JobSpec, job_failure_kind
from ppfs_gateway.registry import FINAL_STATES, JobRecord

router = APIRouter(tags=["jobs"])


def job_out(job: JobRecord) -> JobOut:
    r = job.request
    return JobOut(
        id=job.id,
        state=job.state,  # type: ignore[arg-type]
        error=job.error,
        failure_kind=job_failure_kind(job),
        submitter=job.submitter,
        dataset_ids=r["dataset_ids"],
        combination=r["combination"],
        label_column=r["label_column"],
        k=r["k"],
        security=r["security"],
        engine=r["engine"],
        scorer=r.get("scorer", "ms-gini"),
        mask_upload_id=r["mask_upload_id"],
        training=TrainingIn(**r["training"]) if r.get("training") else None,
        m=r["m"],
        p=r["p"],
        outputs=r["outputs"],
        columns=r["columns"],
        column_exponents=r["column_exponents"],
        classes=r["classes"],
        frac_bits=r["frac_bits"],
        description_sha256=job.description_sha256,
        created_at=job.created_at,
        updated_at=job.updated_at,
        parties=[
            PartyStateOut(
                index=p.party,
                name=PARTY_NAMES[p.party],
                state=p.state,
                phase=p.phase,
                progress=p.progress,
                error=p.error,
                program_sha256=p.program_sha256,
                seconds=p.seconds,
                bytes_sent=p.bytes_sent,
                failure_kind=p.failure,
            )
            for p in job.parties
        ],
    )


def _spec(body: JobCreate | JobValidate) -> JobSpec:
    key = (
        b64decode(body.recipient_public_key, "recipient_public_key")
        if body.recipient_public_key is not None
        else bytes(32)
    )
    if len(key) != 32:
        raise InvalidRequest("recipient_public_key must be a 32-byte X25519 public key")
    return JobSpec(
        dataset_ids=tuple(body.dataset_ids),
        combination=body.combination,
        label_column=body.label_column,
        k=body.k,
        security=body.security,
        engine=body.engine,
        scorer=body.scorer,
        recipient_public_key=key,
        mask_upload_id=body.mask_upload_id or "validate",
        training=body.training.model_dump() if body.training else None,
        request=(SignedRequest(b64decode(body.request.statement, "request.statement"),
                               b64decode(body.request.signature, "request.signature"))
                 if body.request is not None else None),
    )


@router.post("/v1/jobs", status_code=status.HTTP_202_ACCEPTED, response_model=JobOut)
async def post_job(body: JobCreate, who: PrincipalDep, jobs: JobsDep) -> JobOut:
    """Submit Step 2A (and, with `training`, Step 2B) on data sets combined horizontally
    (same columns, rows appended) or vertically (same rows, columns joined)."""
    return job_out(await jobs.submit(who, _spec(body)))


@router.post("/v1/jobs/validate", response_model=JobValidOut)
async def validate_job(body: JobValidate, who: PrincipalDep, jobs: JobsDep) -> JobValidOut:
    """Every check of a submit, storing nothing: the job's shape and how many mask words
    it opens. Clients validate before they upload masks for a job."""
    plan = await jobs.validate(who, _spec(body))
    return JobValidOut(
        m=plan.shape.m,
        p=plan.shape.p,
        classes=list(plan.classes),
        columns=list(plan.columns),
        outputs=plan.shape.outputs,
    )


@router.get("/v1/jobs", response_model=list[JobOut])
def list_jobs(who: PrincipalDep, jobs: JobsDep) -> list[JobOut]:
    submitter = None if who.role is Role.ADMIN else who.subject
    return [job_out(j) for j in jobs.registry.list_jobs(submitter)]


@router.get("/v1/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: str, who: PrincipalDep, jobs: JobsDep) -> JobOut:
    return job_out(jobs.visible(who, job_id))


@router.post("/v1/jobs/{job_id}/cancel", response_model=JobOut)
async def cancel_job(job_id: str, who: PrincipalDep, jobs: JobsDep) -> JobOut:
    return job_out(await jobs.cancel(who, job_id))


# how often, at most, a job's event stream looks again at the token that opened it
EVENTS_KEEP_ALIVE = 15.0


async def _events(
    jobs: JobCoordinator, job_id: str, left: Callable[[], float | None]
) -> AsyncIterator[bytes]:
    """The job's states until it ends, or until the token that opened the stream is no
    longer in force (``left``: its seconds left, None once removed or ended): then the
    stream closes without ``end``, and the client's next request meets the 401."""
    last = ""
    while True:
        remaining = left()
        if remaining is None or remaining <= 0:
            return
        changed = jobs.change_event(job_id)  # before reading: no change can slip past
        job = jobs.registry.get_job(job_id)
        if job is None:
            return
        data = job_out(job).model_dump_json()
        if data != last:
            last = data
            yield f"event: job\ndata: {data}\n\n".encode()
        if job.state in FINAL_STATES:
            yield b"event: end\ndata: {}\n\n"
            return
        await jobs.wait_change(job_id, min(EVENTS_KEEP_ALIVE, remaining), changed)
        yield b": keep-alive\n\n"


@router.get(
    "/v1/jobs/{job_id}/events",
    responses={200: {"content": {"text/event-stream": {}}, "description": "job states"}},
)
def job_events(job_id: str, who: PrincipalDep, jobs: JobsDep, res: ResourcesDep,
               cred: BearerDep) -> StreamingResponse:
    """Server-sent events: one `job` event (the job as JSON) per change, then `end`. The
    stream closes early once its token is removed (a reload) or ends."""
    jobs.visible(who, job_id)
    token = cred.credentials if cred else None
    return StreamingResponse(
        _events(jobs, job_id, lambda: res.tokens.seconds_left(token, who)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/v1/jobs/{job_id}/result", response_model=ResultOut)
async def get_result(job_id: str, who: PrincipalDep, jobs: JobsDep) -> ResultOut:
    """Every party's result part, sealed to the job's recipient: only the recipient can open
    them and remove its masks."""
    parts = await jobs.fetch_result(who, job_id)
    return ResultOut(
        job_id=job_id,
        parts=[
            ResultPartOut(
                party_index=p.party_index,
                sealed=b64encode(p.sealed),
                signature=b64encode(p.signature),
                statement=b64encode(p.statement),
                statement_signature=b64encode(p.statement_signature),
            )
            for p in parts
        ],
    )
