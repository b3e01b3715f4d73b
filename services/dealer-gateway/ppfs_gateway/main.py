"""The dealer-gateway FastAPI application.

``create_app(settings)`` builds the app; the lifespan opens the registry and the
party channels, reconciles unfinished jobs and closes everything on shutdown.
Errors leave as RFC 9457 problem details (``application/problem+json``), mapped
once here from the domain error hierarchy.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ppfs.errors import PpfsError
from ppfs_gateway.api.deps import GatewayResources
from ppfs_gateway.api.routes import datasets, deployment, health, jobs, status
from ppfs_gateway.api.schemas import problem_responses
from ppfs_gateway.auth import TokenTable
from ppfs_gateway.console import install_console
from ppfs_gateway.core.config import Settings
from ppfs_gateway.errors import classify
from ppfs_gateway.jobs import JobCoordinator
from ppfs_gateway.metrics import GatewayMetrics, MetricsMiddleware
from ppfs_gateway.metrics import router as metrics_router
from ppfs_gateway.parties import Parties
from ppfs_gateway.registry import Registry

log = logging.getLogger("ppfs.gateway")

PROBLEM = "application/problem+json"
TYPE_BASE = "https://ppfs.dev/problems/"


def problem(
    status: int, title: str, detail: str, slug: str, instance: str, **extra: Any
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        **extra,
    }
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


class BodyLimit:
    """Refuse request bodies above ``limit`` bytes with 413, before they are buffered."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, send)
            return
        # read the body here, up to the limit (routes buffer JSON bodies anyway), so an
        # oversize body is refused whatever Content-Length said
        chunks: list[bytes] = []
        seen = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                return  # client went away
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                await self._too_large(scope, send)
                return
            chunks.append(chunk)
            more = bool(msg.get("more_body", False))
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if delivered:
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        resp = problem(
            413,
            "Upload too large",
            f"request bodies are limited to {self.limit} bytes",
            "too-large",
            scope.get("path", ""),
        )
        await resp(scope, _no_receive, send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings, parties: Parties | None = None) -> FastAPI:
    """The app for ``settings``; ``parties`` replaces the mTLS channels in tests."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = Registry(settings.db_path)
        conn = parties or Parties.connect(settings)
        coordinator = JobCoordinator(registry, conn, settings.party_lost_seconds)
        app.state.resources = GatewayResources(
            settings=settings,
            registry=registry,
            parties=conn,
            jobs=coordinator,
            tokens=TokenTable(settings.tokens),
        )
        metrics.attach(coordinator)
        listener = metrics.listen(settings.metrics_listen)
        await coordinator.reconcile()
        log.info("[Gateway] started with %d parties", len(conn))
        try:
            yield
        finally:
            if listener is not None:
                listener.close()
            await coordinator.close()
            if parties is None:
                await conn.close()
            registry.close()
            log.info("[Gateway] stopped")

    app = FastAPI(
        title="ppfs dealer-gateway",
        version="1",
        description="Relays sealed, owner-signed uploads to the computing parties, starts and "
        "watches privacy-preserving feature selection jobs, and hands the recipient the "
        "parties' sealed result parts. It never sees a value.",
        lifespan=lifespan,
    )
    app.include_router(health.router)
    common = problem_responses(401, 403, 404, 409, 413, 422, 502)
    for module in (deployment, datasets, jobs, status):
        app.include_router(module.router, responses=common)
    metrics = app.state.metrics = GatewayMetrics()
    app.include_router(metrics_router)
    install_console(app)

    @app.exception_handler(PpfsError)
    async def domain_error(request: Request, exc: PpfsError) -> JSONResponse:
        status, title, slug = classify(exc)
        detail = str(exc) if status < 500 else "Internal server error."
        if status >= 500:
            log.warning("[Gateway] %s %s -> %d %s", request.method, request.url.path, status, title)
            if status == 502:
                detail = str(exc)  # names the party, nothing else
        return problem(status, title, detail, slug, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # name the fields and the problem, never echo the input (it may be a sealed part)
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in exc.errors()
        ]
        where = ", ".join(".".join(e["loc"]) for e in errors[:5])
        return problem(
            422,
            "Invalid request",
            f"invalid fields: {where}",
            "invalid",
            request.url.path,
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = {404: "Not found", 405: "Method not allowed"}.get(exc.status_code, "HTTP error")
        return problem(exc.status_code, title, str(exc.detail), "http", request.url.path)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error(
            "[Gateway] %s %s failed: %s", request.method, request.url.path, type(exc).__name__
        )
        return problem(
            500, "Internal server error", "Internal server error.", "internal", request.url.path
        )

    app.add_middleware(BodyLimit, limit=settings.max_upload_bytes)
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees every answer
    return app
