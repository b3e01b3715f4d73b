"""The dealer-gateway FastAPI application.

``create_app(settings)`` builds the app; the lifespan opens the registry and the
party channels, reconciles unfinished jobs and closes everything on shutdown.
Errors leave as RFC 9457 problem details (``application/problem+json``), mapped
once here from the domain error hierarchy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ppfs.errors import PpfsError
from ppfs_gateway.api.deps import PRINCIPAL_STATE, GatewayResources
from ppfs_gateway.api.routes import datasets, deployment, health, jobs, status
from ppfs_gateway.api.schemas import problem_responses
from ppfs_gateway.auth import TokenTable
from ppfs_gateway.console import SecurityHeaders, install_console
from ppfs_gateway.core.config import Settings
from ppfs_gateway.errors import Unauthenticated, classify, job_created, storage_error
from ppfs_gateway.jobs import JobCoordinator
from ppfs_gateway.metrics import GatewayMetrics, MetricsMiddleware
from ppfs_gateway.metrics import router as metrics_router
from ppfs_gateway.parties import Parties
from ppfs_gateway.registry import Registry
from ppfs_gateway.revocations import RevocationFile

log = logging.getLogger("ppfs.gateway")

PROBLEM = "application/problem+json"
TYPE_BASE = "https://ppfs.dev/problems/"


def problem(
    status: int, title: str, detail: str, slug: str, instance: str,
    headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        "instance": instance,
        **extra,
    }
    if status == 401:
        headers = {**(headers or {}), "WWW-Authenticate": "Bearer"}
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=headers)


def _no_job(exc: Exception, slug: str) -> dict[str, Any]:
    """A submission refused before its job was recorded states so, with the reason (the
    problem type's slug): the client then drops the signed request it kept for the job
    it might have become. Not trusted on its own: a client keeps that request as refused,
    and refuses a result the parties signed as its answer."""
    return {"job_created": False, "no_job_reason": slug} if job_created(exc) is False else {}


# query parameter names that would carry a credential; such a request is refused
_CREDENTIAL_PARAM = re.compile(
    r"token|auth|bearer|secret|password|passwd|api[_-]?key|credential|session", re.IGNORECASE
)
SPOOL_CHUNK = 1 << 20  # bytes handed to the app per message when a spooled body is replayed


def query_names(query_string: bytes) -> list[str]:
    return [name for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)]


class RequestGuard:
    """The first thing every request meets, before any byte of its body is read.

    1. A credential in the query string (``?token=...``) is refused with 400: query
       strings end up in access logs, proxies' logs and browser histories.
    2. Every ``/v1/`` request is authenticated from its ``Authorization`` header; a
       missing, unknown or expired token is answered 401 at once and the body is never
       read. The principal found is kept with the request (``scope["state"]``): the
       routes take it from there, so a reload of the tokens while the request runs
       (its body arriving, say) does not refuse it half-way.
       Bodies are taken under ``/v1/`` only: a POST, PUT or PATCH anywhere else is
       answered 404 at once, its body never read.
    3. A body declared or found larger than ``limit`` is refused with 413.
    4. An accepted body is streamed into a private temporary file in ``spool_dir``
       (mode 0600), never held in memory while it arrives, handed to the app from
       there in chunks, and deleted when the request is over.

    Early refusals carry ``Connection: close``, so the server stops receiving the body.
    """

    def __init__(self, app: ASGIApp, limit: int, tokens: TokenTable, spool_dir: Path) -> None:
        self.app = app
        self.limit = limit
        self.tokens = tokens
        self.spool_dir = spool_dir

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if any(_CREDENTIAL_PARAM.search(n) for n in query_names(scope.get("query_string", b""))):
            await self._refuse(scope, send, 400, "Credential in the query string",
                               "credentials are never accepted in a query string; send "
                               "'Authorization: Bearer <token>' instead (and replace this "
                               "token: it may have been recorded along the way)",
                               "token-in-query")
            return
        headers = dict(scope.get("headers") or [])
        if path.startswith("/v1/"):
            try:
                who = self.tokens.authenticate(_bearer_token(headers.get(b"authorization")))
                scope.setdefault("state", {})[PRINCIPAL_STATE] = who
            except Unauthenticated as exc:
                status, title, slug = classify(exc)
                await self._refuse(scope, send, status, title, str(exc), slug)
                return
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._too_large(scope, send)
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        if not path.startswith("/v1/"):  # no body is taken there: none is read or kept
            await self._refuse(scope, send, 404, "Not found",
                               "requests with a body go to /v1/ only", "not-found")
            return
        try:
            self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="body-", dir=self.spool_dir)  # mode 0600
        except OSError as exc:
            await self._cannot_spool(scope, send, exc)
            return
        failed: OSError | None = None
        try:
            with os.fdopen(fd, "w+b") as spool:
                try:
                    complete = await self._spool(receive, spool)
                except _ClientGone:
                    return
                except OSError as exc:  # answered once the spool file is deleted
                    failed = exc
                else:
                    if not complete:
                        await self._too_large(scope, send)
                        return
                    spool.seek(0)
                    await self.app(scope, _replay(spool, receive), send)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(name)
        if failed is not None:  # nothing of the body is kept
            await self._cannot_spool(scope, send, failed)

    async def _spool(self, receive: Receive, spool: BinaryIO) -> bool:
        """Write the body to ``spool``; False once it passes the limit."""
        seen = 0
        more = True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                raise _ClientGone
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                return False
            spool.write(chunk)
            more = bool(msg.get("more_body", False))
        return True

    async def _cannot_spool(self, scope: Scope, send: Send, exc: OSError) -> None:
        err = storage_error(exc, "receiving the request's body")
        log.error("[Gateway] %s %s: %s", scope.get("method"), scope.get("path", ""), err)
        status, title, slug = classify(err)
        await self._refuse(scope, send, status, title, str(err), slug)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        await self._refuse(scope, send, 413, "Upload too large",
                           f"request bodies are limited to {self.limit} bytes", "too-large")

    @staticmethod
    async def _refuse(
        scope: Scope, send: Send, status: int, title: str, detail: str, slug: str
    ) -> None:
        resp = problem(status, title, detail, slug, scope.get("path", ""))
        resp.headers["Connection"] = "close"
        await resp(scope, _no_receive, send)


class _ClientGone(Exception):
    """The client went away while its body was arriving."""


def _bearer_token(value: bytes | None) -> str | None:
    if not value:
        return None
    scheme, _, token = value.decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _replay(spool: BinaryIO, receive: Receive) -> Receive:
    """The spooled body as ASGI messages, then the real channel (for disconnects)."""
    done = False

    async def replay() -> Message:
        nonlocal done
        if done:
            return await receive()
        chunk = spool.read(SPOOL_CHUNK)
        more = bool(chunk) and spool.tell() < os.fstat(spool.fileno()).st_size
        done = not more
        return {"type": "http.request", "body": chunk, "more_body": more}

    return replay


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


class DropQueryString(logging.Filter):
    """Keep query strings out of the access log: only method, path and status remain."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], args[2].split("?", 1)[0], *args[3:])
        return True


def private_state_dir(state_dir: Path) -> None:
    """The state directory (registry, spooled bodies, logs) readable by the gateway only."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    spool = state_dir / "spool"
    if spool.is_dir():  # bodies left by a crash
        for leftover in spool.glob("body-*"):
            with contextlib.suppress(OSError):
                leftover.unlink()


def create_app(settings: Settings, parties: Parties | None = None) -> FastAPI:
    """The app for ``settings``; ``parties`` replaces the mTLS channels in tests.

    ``app.state.tokens`` is its one :class:`TokenTable`: ``ppfs gateway serve`` calls its
    ``reload`` on SIGHUP."""
    tokens = TokenTable(settings.tokens, settings.tokens_file)
    revocations = RevocationFile(settings.revocation_list)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        private_state_dir(settings.state_dir)
        registry = Registry(settings.db_path)
        conn = parties or Parties.connect(settings)
        coordinator = JobCoordinator(registry, conn, settings.party_lost_seconds,
                                     settings.max_concurrent_jobs,
                                     rpc_seconds=settings.party_rpc_seconds,
                                     stall_floor=settings.stall_floor_seconds)
        app.state.resources = GatewayResources(
            settings=settings,
            registry=registry,
            parties=conn,
            jobs=coordinator,
            tokens=tokens,
            revocations=revocations,
        )
        metrics.attach(coordinator)
        listener = metrics.listen(settings.metrics_listen)
        await coordinator.reconcile()
        log.info("[Gateway] started with %d parties", len(conn))
        tokens.log_ending()
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
        # no interactive docs pages (Swagger UI, ReDoc): they load script from a CDN on the
        # origin whose session storage holds the console's token. /openapi.json stays.
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(health.router)
    common = problem_responses(401, 403, 404, 409, 413, 422, 502, 503, 507)
    for module in (deployment, datasets, jobs, status):
        app.include_router(module.router, responses=common)
    app.state.tokens = tokens
    app.state.revocations = revocations
    metrics = app.state.metrics = GatewayMetrics()
    metrics.watch_tokens(tokens)
    app.include_router(metrics_router)
    install_console(app)

    @app.exception_handler(PpfsError)
    async def domain_error(request: Request, exc: PpfsError) -> JSONResponse:
        status, title, slug = classify(exc)
        detail = str(exc) if status < 500 else "Internal server error."
        if status >= 500:
            log.warning("[Gateway] %s %s -> %d %s", request.method, request.url.path, status, title)
            if status in (502, 503, 507):
                detail = str(exc)  # names the party, or the gateway's disk, nothing else
        retry = getattr(exc, "retry_after", None)
        return problem(status, title, detail, slug, request.url.path,
                       headers={"Retry-After": str(retry)} if retry is not None else None,
                       **_no_job(exc, slug))

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
            500, "Internal server error", "Internal server error.", "internal", request.url.path,
            **_no_job(exc, "internal"),
        )

    app.add_middleware(
        RequestGuard,
        limit=settings.max_upload_bytes,
        tokens=tokens,
        spool_dir=settings.state_dir / "spool",
    )
    app.add_middleware(SecurityHeaders)  # outside the guard: its refusals carry them too
    app.add_middleware(MetricsMiddleware, metrics=metrics)  # outermost: sees every answer
    return app
