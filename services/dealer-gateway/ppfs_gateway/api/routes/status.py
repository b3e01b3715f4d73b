"""What the console shows about the deployment's health and who is signed in.

``GET /v1/deployment/status`` asks every party for its identity now (not the cached
one ``/v1/deployment`` serves), with a short deadline, and reports whether it answered,
how fast, what it runs and the SHA-256 fingerprints of the public keys and
certificates it reports. Kept apart from ``/v1/deployment``, which clients encode with.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from fastapi import APIRouter
from grpc import aio
from pydantic import BaseModel

import ppfs
from ppfs.step2a import Security
from ppfs.v1 import party_pb2 as pb
from ppfs_gateway.api.deps import PartiesDep, PrincipalDep
from ppfs_gateway.parties import PartyClient

router = APIRouter(tags=["deployment"])

PROBE_SECONDS = 3.0


class PrincipalOut(BaseModel):
    role: str
    subject: str


class KeyFingerprints(BaseModel):
    """SHA-256 (hex) of each public key as the party reports it, and of the DER of each
    certificate it presents."""

    box_public_key: str
    signing_public_key: str
    tls_certificate: str
    mpc_certificates: list[str]


class PartyStatusOut(BaseModel):
    index: int
    name: str
    reachable: bool
    latency_ms: float | None
    problem: str
    engines: list[str]
    software_version: str
    engine_versions: dict[str, str]
    mpc_address: str
    fingerprints: KeyFingerprints | None


class DeploymentStatusOut(BaseModel):
    gateway_version: str
    healthy: bool
    scheme: str
    securities: list[str]
    parties: list[PartyStatusOut]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _cert_fingerprints(pem: bytes) -> list[str]:
    if not pem:
        return []
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []
    return [_sha256(c.public_bytes(Encoding.DER)) for c in certs]


async def _probe(c: PartyClient) -> PartyStatusOut:
    start = time.perf_counter()
    try:
        ident = await c.stub.GetIdentity(pb.GetIdentityRequest(), timeout=PROBE_SECONDS)
    except aio.AioRpcError as exc:
        return PartyStatusOut(
            index=c.index, name=c.name, reachable=False, latency_ms=None,
            problem=f"did not answer ({exc.code().name.lower()})", engines=[],
            software_version="", engine_versions={}, mpc_address="", fingerprints=None,
        )  # fmt: skip
    ms = (time.perf_counter() - start) * 1000
    tls = _cert_fingerprints(ident.tls_certificate_pem)
    return PartyStatusOut(
        index=c.index,
        name=ident.name or c.name,
        reachable=True,
        latency_ms=round(ms, 1),
        problem="" if ident.index == c.index else f"reports index {ident.index}",
        engines=list(ident.engines),
        software_version=ident.software_version,
        engine_versions=dict(ident.engine_versions),
        mpc_address=f"{ident.mpc_host}:{ident.mpc_port_base}",
        fingerprints=KeyFingerprints(
            box_public_key=_sha256(ident.box_public_key),
            signing_public_key=_sha256(ident.signing_public_key),
            tls_certificate=tls[0] if tls else "",
            mpc_certificates=_cert_fingerprints(ident.mpc_certificate_pem),
        ),
    )


@router.get("/v1/deployment/status", response_model=DeploymentStatusOut)
async def get_deployment_status(_who: PrincipalDep, parties: PartiesDep) -> DeploymentStatusOut:
    """Every party probed now: reachable, latency, engines and versions, key fingerprints."""
    found = await asyncio.gather(*(_probe(c) for c in parties.clients))
    n = len(found)
    return DeploymentStatusOut(
        gateway_version=ppfs.__version__,
        healthy=all(p.reachable and not p.problem for p in found),
        scheme="rep3" if n == 3 else "rep4",
        securities=[s.value for s in Security if s.parties == n],
        parties=list(found),
    )


@router.get("/v1/principal", response_model=PrincipalOut, tags=["auth"])
def get_principal(who: PrincipalDep) -> PrincipalOut:
    """Who the bearer token belongs to (role and subject id; never the token)."""
    return PrincipalOut(role=who.role.value, subject=who.subject)
