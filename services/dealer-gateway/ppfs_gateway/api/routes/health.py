from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness of the gateway process (no authentication, no party calls)."""
    return {"status": "ok"}
