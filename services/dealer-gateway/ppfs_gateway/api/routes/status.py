"""What the console shows about the deployment's health and who is signed in.

``GET /v1/deployment/status`` asks every party for its identity now (not the cached
one ``/v1/deployment`` serves), with a short deadline, and reports whether it answered,
how fast, what it runs, the SHA-256 fingerprints of the public keys and
certificates it reports, and when the first of them ends (a warning within
:data:`ppfs.pki.RENEW_WITHIN`, a problem once ended); likewise for the gateway's own
certificates and, to an admin, for the bearer tokens that end within 30 days or have
ended (by role and subject, never the token). Kept apart from ``/v1/deployment``, which
clients encode with.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import time
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding
from fastapi import APIRouter
from grpc import aio
from pydantic import BaseModel

import ppfs
from ppfs.keycert import KeyStatement, UntrustedPartyKey
from ppfs.pki import Lifetime, certificate_end
from ppfs.step2a import Security
from ppfs.v1 import party_pb2 as pb
from ppfs_gateway.api.deps import PartiesDep, PrincipalDep, ResourcesDep
from ppfs_gateway.core.config import Role, Settings
from ppfs_gateway.parties import Parties, PartyClient
from ppfs_gateway.revocations import RevocationFile

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
    # when the first of its certificates and key statement ends (ISO 8601, UTC)
    certificates_end: str | None = None
    warnings: list[str] = []
    # told to stop: it takes no new job while its unfinished ones end
    stopping: bool = False
    # how old the identity is that the gateway serves clients (GET /v1/deployment), in
    # seconds (None: none fetched yet), and why its last refresh did not replace it (the
    # party did not answer, or what it reports now failed a check; "" if it did)
    identity_age_seconds: float | None = None
    identity_problem: str = ""


class DeploymentStatusOut(BaseModel):
    gateway_version: str
    healthy: bool
    scheme: str
    securities: list[str]
    parties: list[PartyStatusOut]
    # the gateway's own certificates ending soon or ended; to an admin, also the bearer
    # tokens ending soon or ended
    warnings: list[str] = []


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


_PARTY_RENEW = "the operator renews it with `ppfs pki sign` on that party's state directory"
_GATEWAY_RENEW = {
    "client": "renew it with `ppfs pki client` and restart the gateway",
    "https": "renew it with `ppfs pki https` and restart the gateway",
}
_REPORTED = Path("(as the party reports it)")


def _party_lifetimes(ident: pb.PartyIdentity) -> list[Lifetime]:
    """What the party reports, as it reports it: for showing only (clients check the
    key statement themselves)."""
    pems = [("control-plane certificate", ident.tls_certificate_pem)]
    with contextlib.suppress(ValueError):  # none reported, or not PEM: nothing to show
        pems += [("MPC certificate", c.public_bytes(Encoding.PEM))
                 for c in x509.load_pem_x509_certificates(ident.mpc_certificate_pem)]
    found: list[Lifetime] = []
    for what, pem in pems:
        try:
            found.append(Lifetime(what, _REPORTED, certificate_end(pem), _PARTY_RENEW))
        except ValueError:
            continue
    if ident.key_statement:
        try:
            end = KeyStatement.from_bytes(ident.key_statement).end
            found.append(Lifetime("key statement", _REPORTED, end, _PARTY_RENEW))
        except UntrustedPartyKey:
            pass
    return found


def _warnings(lives: list[Lifetime], now: dt.datetime) -> tuple[list[str], str]:
    """(lines for those ending soon, the line for the first one ended or '')."""
    soon, ended = [], ""
    for life in sorted(lives, key=lambda x: x.not_after):
        phrase = life.phrase(now)
        if phrase is None:
            continue
        if life.not_after <= now:
            ended = ended or f"{phrase}: {life.renew}"
        else:
            soon.append(f"{phrase}: {life.renew}")
    return soon, ended


# a revocation list served this close to going stale is reported: clients refuse the
# parties whose key statements ask for it once it is stale
REVOCATIONS_WITHIN = dt.timedelta(days=1)
_REVOCATIONS_RENEW = ("have the deployment CA re-issue it (`ppfs pki revocations`) and "
                      "install it; clients refuse parties whose key statements ask for it "
                      "once it is stale")


def revocation_warnings(revocations: RevocationFile,
                        now: dt.datetime | None = None) -> list[str]:
    """A line when the revocation list the gateway serves goes stale within a day or
    has gone stale (nothing when it serves none)."""
    try:
        rl = revocations.served()
    except UntrustedPartyKey:
        return []
    if rl is None or revocations.path is None:
        return []
    life = Lifetime("revocation list", revocations.path, rl.stale_after, _REVOCATIONS_RENEW)
    line = life.problem(now or dt.datetime.now(dt.UTC), REVOCATIONS_WITHIN)
    return [] if line is None else [line.replace("expired on", "went stale on")
                                    .replace("expires on", "goes stale on")]


def gateway_warnings(settings: Settings, now: dt.datetime | None = None) -> list[str]:
    """Lines for the gateway's own certificates that end soon or have ended."""
    now = now or dt.datetime.now(dt.UTC)
    files = [("client", "client identity certificate", settings.tls.client_cert),
             ("https", "HTTPS certificate", settings.https_cert)]
    out = []
    for kind, what, path in files:
        if path is None:
            continue
        try:
            life = Lifetime(what, path, certificate_end(path.read_bytes()), _GATEWAY_RENEW[kind])
        except (OSError, ValueError):
            continue
        line = life.problem(now)
        if line is not None:
            out.append(line)
    return out


def _served(parties: Parties, c: PartyClient) -> dict[str, Any]:
    """What the gateway serves for the party: the fields of PartyStatusOut on it."""
    k = parties.known(c.index)
    if k is None:
        return {}
    return {"identity_age_seconds": round(time.monotonic() - k.fetched, 1),
            "identity_problem": k.problem}


async def _probe(parties: Parties, c: PartyClient) -> PartyStatusOut:
    start = time.perf_counter()
    try:
        ident = await c.stub.GetIdentity(pb.GetIdentityRequest(), timeout=PROBE_SECONDS)
    except aio.AioRpcError as exc:
        parties.unanswered(c.index, f"{c.name} did not answer GetIdentity "
                                    f"({exc.code().name.lower()})")
        return PartyStatusOut(
            index=c.index, name=c.name, reachable=False, latency_ms=None,
            problem=f"did not answer ({exc.code().name.lower()})", engines=[],
            software_version="", engine_versions={}, mpc_address="", fingerprints=None,
            **_served(parties, c),
        )  # fmt: skip
    ms = (time.perf_counter() - start) * 1000
    parties.observe(c.index, ident)  # a renewal is served from now on, if it checks out
    tls = _cert_fingerprints(ident.tls_certificate_pem)
    lives = _party_lifetimes(ident)
    soon, ended = _warnings(lives, dt.datetime.now(dt.UTC))
    problem = f"reports index {ident.index}" if ident.index != c.index else ended
    if ident.name != c.name:  # shown under its configured name, never under the one it claims
        problem = "; ".join(x for x in (f"reports the name {ident.name[:64]!r}", problem) if x)
    if ident.stopping:
        left = (f", at most {ident.stop_seconds_left} s more" if ident.stop_seconds_left
                else "")
        problem = "; ".join(x for x in (problem, (
            "stopping: it takes no new job while its unfinished ones end" + left)) if x)
    return PartyStatusOut(
        index=c.index,
        name=c.name,
        reachable=True,
        latency_ms=round(ms, 1),
        problem=problem,
        engines=[_short(e) for e in ident.engines[:_MAX_LISTED]],
        software_version=_short(ident.software_version),
        engine_versions={_short(k): _short(v) for k, v in
                         sorted(ident.engine_versions.items())[:_MAX_LISTED]},
        mpc_address=f"{_short(ident.mpc_host, _MAX_HOST)}:{ident.mpc_port_base}",
        fingerprints=KeyFingerprints(
            box_public_key=_sha256(ident.box_public_key),
            signing_public_key=_sha256(ident.signing_public_key),
            tls_certificate=tls[0] if tls else "",
            mpc_certificates=_cert_fingerprints(ident.mpc_certificate_pem),
        ),
        certificates_end=(min(x.not_after for x in lives).strftime("%Y-%m-%dT%H:%M:%SZ")
                          if lives else None),
        warnings=soon,
        stopping=ident.stopping,
        **_served(parties, c),
    )


# What a party states of its software reaches every console poll: bounded, so that a
# party stating megabytes of it (or thousands of engines) is shown, not echoed whole.
_MAX_LISTED = 8  # engines, engine versions
_MAX_TEXT = 64  # a version or an engine's name
_MAX_HOST = 253  # a DNS name


def _short(text: str, limit: int = _MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@router.get("/v1/deployment/status", response_model=DeploymentStatusOut)
async def get_deployment_status(
    who: PrincipalDep, parties: PartiesDep, res: ResourcesDep,
) -> DeploymentStatusOut:
    """Every party probed now: reachable, latency, engines and versions, key
    fingerprints, certificates' ends; to an admin, the tokens ending soon."""
    found = await asyncio.gather(*(_probe(parties, c) for c in parties.clients))
    n = len(found)
    # a party whose served identity is not the one it reports now (or could not report)
    stale = [f"the gateway serves {p.name}'s identity as fetched {p.identity_age_seconds:g} s "
             f"ago: {p.identity_problem}" for p in found
             if p.identity_problem and p.identity_age_seconds is not None]
    return DeploymentStatusOut(
        gateway_version=ppfs.__version__,
        healthy=all(p.reachable and not p.problem for p in found),
        scheme="rep3" if n == 3 else "rep4",
        securities=[s.value for s in Security if s.parties == n],
        parties=list(found),
        warnings=[*await asyncio.to_thread(gateway_warnings, res.settings),
                  *revocation_warnings(res.revocations), *stale,
                  *(res.tokens.ending() if who.role is Role.ADMIN else ())],
    )


@router.get("/v1/principal", response_model=PrincipalOut, tags=["auth"])
def get_principal(who: PrincipalDep) -> PrincipalOut:
    """Who the bearer token belongs to (role and subject id; never the token)."""
    return PrincipalOut(role=who.role.value, subject=who.subject)
