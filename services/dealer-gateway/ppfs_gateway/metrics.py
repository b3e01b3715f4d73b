"""The gateway's Prometheus metrics: jobs, uploads, refusals and HTTP requests.

One :class:`GatewayMetrics` per app (its own ``CollectorRegistry``, no process-global
state). It is served two ways:

* ``GET /metrics`` on the API listener, for an **admin** bearer token only (Prometheus
  sends it with ``authorization: {credentials_file: ...}``), so the public HTTPS port
  leaks nothing to anyone else;
* optionally on a separate plain-HTTP listener (``metrics_listen`` in the config,
  ``--metrics-listen HOST:PORT``) without authentication, for an internal network only.

Labels are bounded sets (states, failure kinds, route templates, problem slugs); no
label or sample carries a value, a token, a key, a job id or a data set id.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ppfs.metrics_listener import MetricsListener, serve_metrics
from ppfs_gateway.api.deps import PrincipalDep
from ppfs_gateway.core.config import Role
from ppfs_gateway.jobs import job_failure_kind
from ppfs_gateway.registry import FINAL_STATES, JobRecord

if TYPE_CHECKING:
    from ppfs_gateway.auth import TokenTable
    from ppfs_gateway.jobs import JobCoordinator
    from ppfs_gateway.registry import Registry

log = logging.getLogger("ppfs.gateway")

PROBLEM = b"application/problem+json"
# seconds: a tiny job takes a few, a large one hours
DURATION_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
BYTES_BUCKETS = tuple(float(4**i) * 1024 for i in range(13))  # 1 KiB .. 16 GiB
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
JOB_STATES = ("queued", "running", "succeeded", "failed", "cancelled")
# the method label's values: the server accepts any token as a method, and a label
# value per token sent would let any client, even one without a token, grow the series
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def _parse(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


class _JobsByState(Collector):
    """``ppfs_gateway_jobs{state}``: the jobs in the registry now, read at scrape time."""

    def __init__(self) -> None:
        self.registry: Registry | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "ppfs_gateway_jobs", "Jobs in the registry by state", labels=["state"]
        )
        counts = self.registry.count_jobs_by_state() if self.registry is not None else {}
        for state in JOB_STATES:
            g.add_metric([state], counts.get(state, 0))
        yield g


class _TokenEnds(Collector):
    """``ppfs_gateway_token_expiry_timestamp_seconds{role}``: per role, the soonest end
    among the tokens in force that have one, read at scrape time (a reload shows at
    once). By role only: which subject's token it is, an admin reads in
    /v1/deployment/status."""

    def __init__(self) -> None:
        self.tokens: TokenTable | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily(
            "ppfs_gateway_token_expiry_timestamp_seconds",
            "Per role, when the first of its bearer tokens that have an end ends (Unix time)",
            labels=["role"],
        )
        ends = self.tokens.earliest_ends() if self.tokens is not None else {}
        for role, end in sorted(ends.items()):
            g.add_metric([role.value], end.timestamp())
        yield g


class GatewayMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._jobs_now = _JobsByState()
        r.register(self._jobs_now)
        self._token_ends = _TokenEnds()
        r.register(self._token_ends)
        self.jobs_submitted = Counter(
            "ppfs_gateway_jobs_submitted", "Jobs accepted for submission",
            ["engine", "security"], registry=r,
        )  # fmt: skip
        self.jobs_finished = Counter(
            "ppfs_gateway_jobs_finished", "Jobs that reached a final state",
            ["state", "failure_kind"], registry=r,
        )  # fmt: skip
        self.job_seconds = Histogram(
            "ppfs_gateway_job_duration_seconds", "Submission to final state",
            ["state"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.phase_seconds = Histogram(
            "ppfs_gateway_job_phase_duration_seconds",
            "Time a job spent queued at the gateway, and running on the parties",
            ["phase"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.party_seconds = Histogram(
            "ppfs_gateway_job_party_engine_seconds",
            "Engine run time each party reports for a succeeded job",
            ["party"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.job_bytes = Histogram(
            "ppfs_gateway_job_bytes_sent",
            "Bytes the parties' engines sent for one succeeded job, summed over the parties",
            buckets=BYTES_BUCKETS, registry=r,
        )  # fmt: skip
        self.uploads = Counter(
            "ppfs_gateway_upload_requests", "Upload requests by outcome",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.upload_bytes = Histogram(
            "ppfs_gateway_upload_request_bytes",
            "Size of accepted upload request bodies (sealed parts, base64)",
            buckets=BYTES_BUCKETS, registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "ppfs_gateway_refusals", "Requests refused with a problem response, by reason",
            ["status", "reason"], registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "ppfs_gateway_http_requests", "HTTP requests by route template and status",
            ["method", "route", "status"], registry=r,
        )  # fmt: skip
        self.request_seconds = Histogram(
            "ppfs_gateway_http_request_duration_seconds",
            "Time to the response head, by route template",
            ["method", "route"], buckets=HTTP_BUCKETS, registry=r,
        )  # fmt: skip
        self._running: dict[str, float] = {}  # job id -> when it was seen running
        self._final: set[str] = set()

    def watch_tokens(self, tokens: TokenTable) -> None:
        self._token_ends.tokens = tokens

    # -- jobs --------------------------------------------------------------------

    def attach(self, jobs: JobCoordinator) -> None:
        self._jobs_now.registry = jobs.registry
        jobs.on_change = self.job_changed
        # jobs already final when the gateway starts are not counted again
        self._final.update(
            j.id for j in jobs.registry.list_jobs(None) if j.state in FINAL_STATES
        )

    def job_changed(self, job: JobRecord) -> None:
        if job.id in self._final:
            return
        req = job.request
        if job.state == "queued" and job.id not in self._running:
            self._running.setdefault(job.id, 0.0)
            engine, security = str(req.get("engine", "")), str(req.get("security", ""))
            self.jobs_submitted.labels(engine, security).inc()
            return
        now = time.time()
        if job.state == "running" and not self._running.get(job.id):
            self._running[job.id] = now
            self.phase_seconds.labels("queued").observe(max(0.0, now - _parse(job.created_at)))
            return
        if job.state not in FINAL_STATES:
            return
        self._final.add(job.id)
        started = self._running.pop(job.id, 0.0)
        end = _parse(job.updated_at)
        self.jobs_finished.labels(job.state, job_failure_kind(job)).inc()
        self.job_seconds.labels(job.state).observe(max(0.0, end - _parse(job.created_at)))
        if started:
            self.phase_seconds.labels("running").observe(max(0.0, end - started))
        if job.state == "succeeded":
            for p in job.parties:
                self.party_seconds.labels(str(p.party)).observe(p.seconds)
            sent = sum(p.bytes_sent for p in job.parties)
            if sent:
                self.job_bytes.observe(sent)

    def listen(self, address: str | None) -> MetricsListener | None:
        """Serve these metrics without authentication on ``address`` (internal only)."""
        if not address:
            return None
        listener = serve_metrics(address, self.registry)
        log.info("[Gateway] metrics on port %d", listener.port)
        return listener

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsMiddleware:
    """Counts every HTTP request by route template and status, upload requests and
    their sizes, and refusals by the problem type's slug (read from the small
    problem+json body, never from the request)."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 0
        problem = False
        body = bytearray()

        async def observe(msg: Message) -> None:
            nonlocal status, problem
            if msg["type"] == "http.response.start":
                status = int(msg["status"])
                headers = dict(msg.get("headers") or [])
                problem = headers.get(b"content-type", b"").startswith(PROBLEM)
            elif msg["type"] == "http.response.body" and problem and len(body) < 8192:
                body.extend(msg.get("body", b""))
            await send(msg)

        try:
            await self.app(scope, receive, observe)
        finally:
            self._record(scope, status or 500, bytes(body), time.perf_counter() - start)

    def _record(self, scope: Scope, status: int, body: bytes, seconds: float) -> None:
        m = self.metrics
        method = str(scope.get("method", ""))
        if method not in HTTP_METHODS:
            method = "other"
        route = getattr(scope.get("route"), "path", None)
        path = str(scope.get("path", ""))
        if route is None:
            route = "/console" if path.startswith("/console") else "unmatched"
        m.requests.labels(method, route, str(status)).inc()
        m.request_seconds.labels(method, route).observe(seconds)
        if method in ("POST", "PUT") and "/uploads" in route:
            if status < 300:
                m.uploads.labels("accepted").inc()
                length = dict(scope.get("headers") or []).get(b"content-length", b"")
                if length.isdigit():
                    m.upload_bytes.observe(int(length))
            else:
                m.uploads.labels("refused" if status < 500 else "failed").inc()
        if 400 <= status < 500:
            m.refusals.labels(str(status), _slug(body)).inc()


def _slug(body: bytes) -> str:
    try:
        kind = str(json.loads(body).get("type", ""))
    except (ValueError, AttributeError):
        return "other"
    slug = kind.rsplit("/", 1)[-1]
    return slug if slug.replace("-", "").isalnum() and len(slug) <= 40 else "other"


router = APIRouter(tags=["monitoring"])


@router.get("/metrics", include_in_schema=False)
def get_metrics(request: Request, who: PrincipalDep) -> Response:
    """Prometheus text format; admins only (the internal listener needs no token)."""
    who.require(Role.ADMIN)
    metrics: GatewayMetrics = request.app.state.metrics
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
