from __future__ import annotations

from fastapi import APIRouter

from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Security
from ppfs_gateway.api.deps import PartiesDep, PrincipalDep, ResourcesDep
from ppfs_gateway.api.schemas import DeploymentOut, FixedPointOut, PartyOut, b64encode

router = APIRouter(tags=["deployment"])


@router.get("/v1/deployment", response_model=DeploymentOut)
async def get_deployment(_who: PrincipalDep, parties: PartiesDep,
                         res: ResourcesDep) -> DeploymentOut:
    """The parties' public identities (from their GetIdentity) with the deployment CA's
    statements of their keys and its revocation list, the sharing scheme and the
    fixed-point parameters a client encodes with. Clients check every key statement
    (and the list, for a statement that asks for it) against their own trust anchor."""
    ids = await parties.identities()
    rl, rl_sig = res.revocations.current()
    fp = FixedPoint()
    n = len(ids)
    return DeploymentOut(
        parties=[
            PartyOut(
                index=i.index,
                name=i.name,
                box_public_key=b64encode(i.box_public_key),
                signing_public_key=b64encode(i.signing_public_key),
                mpc_address=f"{i.mpc_host}:{i.mpc_port_base}",
                engines=list(i.engines),
                key_statement=b64encode(i.key_statement),
                key_statement_signature=b64encode(i.key_statement_signature),
            )
            for i in ids
        ],
        scheme="rep3" if n == 3 else "rep4",
        securities=[s.value for s in Security if s.parties == n],
        fixed_point=FixedPointOut(
            frac_bits=fp.frac_bits, value_bits=fp.value_bits, target_bits=fp.target_bits
        ),
        deployment_ca_pem=next((i.deployment_ca_pem.decode("ascii", "replace") for i in ids
                                if i.deployment_ca_pem), ""),
        revocation_list=b64encode(rl),
        revocation_list_signature=b64encode(rl_sig),
    )
