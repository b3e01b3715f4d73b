"""The web console at ``/console``: static HTML, CSS and JavaScript from this package
(no build step, nothing from a CDN), and the security headers of every response.

The console is a client of the public REST API like any other: the operator pastes a
bearer token, kept in the tab's sessionStorage and sent in the Authorization header of
every call (job events too: it reads the event stream with fetch(), not EventSource,
which cannot send headers). It never asks for a result: results stay sealed to their
recipient, who fetches and opens them with ``ppfs result fetch``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).with_name("console_static")

# No inline script or style anywhere, no third-party origin, no framing.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
# API answers are data, never a page to render or frame.
API_CSP = "default-src 'none'; frame-ancestors 'none'"

_COMMON = (
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=()"),
)


class SecurityHeaders:
    """Adds the security headers to every response: a strict CSP for the console and
    the API (the OpenAPI document included), HSTS over HTTPS. API answers (job states,
    schemas, sealed results, metrics, problem details) are never stored by a cache.

    It is the outermost layer but the metrics', so the refusals made before the app
    (``main.RequestGuard``: no token, a credential in the query string, a body too large)
    carry the headers too: they echo the request's path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = str(scope.get("path", ""))
        csp: bytes | None = None
        cache: bytes | None = None
        if path == "/console" or path.startswith("/console/"):
            csp, cache = CONSOLE_CSP.encode(), b"no-cache"
        elif path.startswith("/v1/") or path in ("/metrics", "/healthz", "/openapi.json"):
            csp, cache = API_CSP.encode(), b"no-store"
        https = scope.get("scheme") == "https"

        async def add(msg: Message) -> None:
            if msg["type"] == "http.response.start":
                # ours replace the app's (the event stream's "no-cache" becomes "no-store")
                replaced = {b"x-frame-options"} | ({b"cache-control"} if cache else set())
                headers = [
                    (k, v) for k, v in msg.get("headers", []) if k.lower() not in replaced
                ]
                headers.extend(_COMMON)
                if csp is not None:
                    headers.append((b"content-security-policy", csp))
                if cache is not None:
                    headers.append((b"cache-control", cache))
                if https:
                    headers.append((b"strict-transport-security", b"max-age=31536000"))
                msg["headers"] = headers
            await send(msg)

        await self.app(scope, receive, add)


def install_console(app: FastAPI) -> None:
    """Serve the console at /console/ (the app adds :class:`SecurityHeaders` itself,
    outside its request guard)."""

    @app.get("/console", include_in_schema=False)
    def console_root() -> RedirectResponse:
        # relative, so it works behind a TLS-terminating proxy and under a path prefix
        return RedirectResponse("console/", status_code=308)

    app.mount("/console", StaticFiles(directory=STATIC, html=True), name="console")
