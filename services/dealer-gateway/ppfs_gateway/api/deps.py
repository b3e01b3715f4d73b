"""Typed dependencies of the routes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ppfs_gateway.auth import Principal, TokenTable
from ppfs_gateway.core.config import Settings
from ppfs_gateway.jobs import JobCoordinator
from ppfs_gateway.parties import Parties
from ppfs_gateway.registry import Registry
from ppfs_gateway.revocations import RevocationFile


@dataclass
class GatewayResources:
    """Everything the lifespan creates, handed to the routes."""

    settings: Settings
    registry: Registry
    parties: Parties
    jobs: JobCoordinator
    tokens: TokenTable
    revocations: RevocationFile


def get_resources(request: Request) -> GatewayResources:
    res: GatewayResources = request.app.state.resources
    return res


ResourcesDep = Annotated[GatewayResources, Depends(get_resources)]


def get_registry(res: ResourcesDep) -> Registry:
    return res.registry


def get_parties(res: ResourcesDep) -> Parties:
    return res.parties


def get_jobs(res: ResourcesDep) -> JobCoordinator:
    return res.jobs


_bearer = HTTPBearer(auto_error=False, description="per-role bearer token")


# where the request guard keeps the principal it authenticated (request.state)
PRINCIPAL_STATE = "ppfs_principal"


def get_principal(
    request: Request,
    res: ResourcesDep,
    cred: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The principal the request guard found when the request arrived (a reload of the
    tokens since does not change it); else (outside /v1/) the token's, looked up now."""
    found = getattr(request.state, PRINCIPAL_STATE, None)
    if isinstance(found, Principal):
        return found
    return res.tokens.authenticate(cred.credentials if cred else None)


RegistryDep = Annotated[Registry, Depends(get_registry)]
PartiesDep = Annotated[Parties, Depends(get_parties)]
JobsDep = Annotated[JobCoordinator, Depends(get_jobs)]
PrincipalDep = Annotated[Principal, Depends(get_principal)]
# the bearer credential itself, for a route whose answer outlives the request (an event
# stream looks again whether its token is still in force)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
