"""The party daemon's gRPC server: mutual TLS, PartyService and the health service.

TLS admits any certificate of the deployment CA; PartyService then answers the
gateway's control identity only (ppfs_party.control_access); health answers any.

Lifecycle (grpc.aio): :func:`start_party_server` opens the state, binds (port 0 in
tests: the bound port comes back) and marks the services SERVING; :meth:`PartyServer.stop`
marks them NOT_SERVING, stops every unfinished job (killing its engine process)
and gives in-flight calls ``grace`` seconds. Staged upload parts past their expiry are
aborted before the server binds and every few minutes while it runs
(:func:`expire_staged_parts`); the jobs that ended more than ``--job-retention-days``
ago are pruned (ppfs_party.jobs.JobRunner.prune) likewise, then every hour
(:func:`prune_jobs`). A party whose certificates or key statement have ended
does not start; renewed ones are picked up while it runs (ppfs_party.lifetimes).
:func:`serve` runs until SIGTERM/SIGINT, holding the state directory's lock
(ppfs.state_lock) from before it opens the state: a second daemon on the same state
would take this one's jobs for interrupted and delete their files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ppfs.metrics_listener import MetricsListener, serve_metrics
from ppfs.state_lock import hold_state_dir
from ppfs.v1 import party_pb2, party_pb2_grpc
from ppfs_party.config import PartySettings
from ppfs_party.control_access import GatewayOnly
from ppfs_party.lifetimes import ControlCertificates, refuse_expired, watch_lifetimes
from ppfs_party.servicer import PartyServicer
from ppfs_party.state import PartyState, open_state

log = logging.getLogger("ppfs.party")

SERVICE_NAME = party_pb2.DESCRIPTOR.services_by_name["PartyService"].full_name
MAX_MESSAGE = 8 * 1024 * 1024
# how often a running daemon looks for staged parts past their expiry (at most; a
# quarter of the expiry when that is shorter): a part outlives its expiry by this much
STAGED_CHECK_SECONDS = 300.0
# how often a running daemon prunes the jobs past their retention
JOB_PRUNE_SECONDS = 3600.0

SERVER_OPTIONS = [
    # Server-initiated pings every 60 s keep an idle stream (a long WatchJob, an upload
    # paused by the client) alive across NAT/load balancers: Azure drops idle TCP
    # flows after ~4 minutes.
    ("grpc.keepalive_time_ms", 60_000),
    # A peer that does not answer a ping within 20 s is gone: free its call.
    ("grpc.keepalive_timeout_ms", 20_000),
    # Ping even with no call open, so the gateway's pooled connection stays up.
    ("grpc.keepalive_permit_without_calls", 1),
    # Accept client pings as often as every 30 s (the gateway pings every 60 s);
    # more frequent pings are a misbehaving client and get the connection closed.
    ("grpc.http2.min_ping_interval_without_data_ms", 30_000),
    ("grpc.http2.max_pings_without_data", 0),
    # Upload chunks are <= 1 MiB and result parts a few MB: 8 MiB bounds memory per call.
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
]


@dataclass
class PartyServer:
    server: grpc.aio.Server
    port: int
    state: PartyState
    health: health.aio.HealthServicer
    metrics: MetricsListener | None = field(default=None)
    # its periodic checks (staged parts' expiry, the certificates' ends)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def drain(self, seconds: float, stop_now: asyncio.Event) -> None:
        """Before :meth:`stop`: take no new job, and give the unfinished ones up to
        ``seconds`` to end (less if ``stop_now`` is set), so that a planned stop (an
        upgrade, a renewal) fails none of them."""
        jobs = self.state.jobs
        name = self.state.settings.name
        jobs.draining = True
        n = jobs.unfinished()
        if n == 0:
            return
        log.info("[Party.server] %s stopping: letting %d unfinished job%s end (at most "
                 "%.0f s; stop it again to stop them now)", name, n, "s" * (n > 1), seconds)
        left = await jobs.drain(seconds, stop_now)
        if left:
            log.warning("[Party.server] %s: %d job%s still unfinished; stopping them", name,
                        left, "s" * (left > 1))
        else:
            log.info("[Party.server] %s: every job ended", name)

    async def stop(self, grace: float | None = None) -> None:
        grace = self.state.settings.stop_grace if grace is None else grace
        for task in self.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.state.jobs.shutdown()
        await self.server.stop(grace)
        try:
            await asyncio.to_thread(self.state.audit.flush_left_out)
        except OSError as exc:  # a full disk at stop: the count is in the metrics only
            log.warning("[Party.server] could not write the audit count of refusals "
                        "left out: %s", exc.strerror or type(exc).__name__)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        log.info("[Party.server] %s stopped", self.state.settings.name)


async def _every(interval: float, check: Callable[[], Awaitable[object]], what: str) -> None:
    """Run ``check`` every ``interval`` seconds until cancelled; a failed round is
    logged and the next one tries again."""
    while True:
        await asyncio.sleep(interval)
        try:
            await check()
        except Exception:  # never let the check die
            log.exception("[Party.server] %s failed", what)


async def expire_staged_parts(state: PartyState) -> None:
    """Abort the staged parts past their expiry, every few minutes, until cancelled."""
    await _every(min(STAGED_CHECK_SECONDS, state.settings.staged_expiry / 4),
                 state.store.expire_staged, "the check of staged parts' expiry")


async def prune_jobs(state: PartyState) -> None:
    """Prune the jobs past their retention, every hour (sooner with a retention of a
    few hours), until cancelled."""
    await _every(min(JOB_PRUNE_SECONDS, state.settings.job_retention / 4),
                 state.jobs.prune, "the pruning of ended jobs")


async def start_party_server(
    settings: PartySettings, state: PartyState | None = None
) -> PartyServer:
    """Start a party daemon in this event loop; returns it with its bound port."""
    if state is None:
        state = await asyncio.to_thread(open_state, settings)
    # those that aged while the daemon was down, before it answers a commit of them
    await state.store.expire_staged()
    # and the jobs that ended more than --job-retention-days ago, however long it was down
    await state.jobs.prune()
    # refused here, before the port opens, once anything it presents has ended; its
    # renewal is picked up while it runs
    refuse_expired(state)
    credentials = ControlCertificates(state.keys, settings).credentials()
    # every PartyService call must come from the gateway's client identity, checked
    # from its TLS certificate; the health service is left open to the deployment
    server = grpc.aio.server(options=SERVER_OPTIONS,
                             interceptors=[GatewayOnly(state, SERVICE_NAME)])
    party_pb2_grpc.add_PartyServiceServicer_to_server(PartyServicer(state), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_secure_port(settings.listen, credentials)
    if port == 0:
        raise OSError(f"cannot listen on {settings.listen}")
    await server.start()
    for service in ("", SERVICE_NAME):
        await health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    log.info("[Party.server] %s listening on port %d", settings.name, port)
    metrics = None
    if settings.metrics_listen:
        metrics = serve_metrics(settings.metrics_listen, state.metrics.registry)
        log.info("[Party.server] %s metrics on port %d", settings.name, metrics.port)
    tasks = [asyncio.create_task(expire_staged_parts(state), name="staged-expiry"),
             asyncio.create_task(prune_jobs(state), name="job-retention"),
             asyncio.create_task(watch_lifetimes(state), name="certificate-lifetimes")]
    return PartyServer(server, port, state, health_servicer, metrics, tasks)


async def serve(settings: PartySettings) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully; refuse at once
    (StateDirInUse) if another process serves this state directory."""
    # held while serving; the kernel drops it however the process ends
    lock = await asyncio.to_thread(hold_state_dir, settings.state_dir)
    try:
        await _serve_locked(settings)
    finally:
        lock.release()


async def _serve_locked(settings: PartySettings) -> None:
    party = await start_party_server(settings)
    if settings.port_file is not None:
        tmp = settings.port_file.with_name(settings.port_file.name + ".tmp")
        tmp.write_text(f"{party.port}\n")
        tmp.replace(settings.port_file)
    stop, stop_now = asyncio.Event(), asyncio.Event()

    def on_signal() -> None:  # the first asks to stop, a second to stop at once
        (stop_now if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    if settings.drain_seconds > 0:
        await party.drain(settings.drain_seconds, stop_now)
    await party.stop()
