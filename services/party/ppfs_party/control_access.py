"""Who may call PartyService: the gateway's control-plane client identity, no one else.

Mutual TLS proves only that a caller holds *some* certificate from the deployment CA;
every party holds several (its control and MPC certificates). So each PartyService call
is checked against the caller's TLS certificate: it must carry the gateway usage that
only ``ppfs pki client`` gives (``ppfs.pki.GATEWAY_CONTROL_USAGE``; a party's
certificates never carry it) and be named the gateway (``--gateway-name``, default
``gateway``). Anything else is refused with PERMISSION_DENIED before the handler runs,
logged, counted and written to the audit log. The standard health service stays open to
any certificate of the deployment (each party's container health check uses its own).

:func:`caller_problem` is the pure check; :class:`GatewayOnly` applies it to every
method of PartyService, including ones added later.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from cryptography import x509

from ppfs.pki import has_gateway_usage, single_common_name
from ppfs_party.errors import CallerNotGatewayError, to_status
from ppfs_party.state import PartyState

log = logging.getLogger("ppfs.party")

PEM_PROPERTY = "x509_pem_cert"  # grpc's auth-context key for the peer's leaf certificate


def _printable(name: str) -> str:
    """A certificate name fit for a message: printable, short."""
    return "".join(c if c.isprintable() else "?" for c in name)[:64]


def caller_problem(auth: Mapping[str, Sequence[bytes]], gateway_name: str) -> str | None:
    """None when the TLS peer in ``auth`` (grpc ``context.auth_context()``) is the
    gateway's control identity named ``gateway_name``, else what is wrong with it.
    The certificate chain was verified by TLS (deployment CA) before this runs."""
    pems = auth.get(PEM_PROPERTY) or []
    if len(pems) != 1:
        return "the call carries no client certificate"
    try:
        cert = x509.load_pem_x509_certificate(pems[0])
    except ValueError:
        return "the client certificate cannot be read"
    cn = single_common_name(cert.subject)
    shown = repr(_printable(cn)) if cn is not None else "a subject other than one CN"
    if not has_gateway_usage(cert):
        return (f"the caller's certificate ({shown}) is not the gateway's control "
                "identity (issued by `ppfs pki client`): a party's own certificates "
                "cannot call PartyService")
    if cn != gateway_name:
        return (f"the caller's certificate is a gateway identity named {shown}, not "
                f"{_printable(gateway_name)!r}, the gateway this party serves "
                "(--gateway-name)")
    return None


Behaviour = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]


class GatewayOnly(grpc.aio.ServerInterceptor):
    """Refuse every call of ``service`` (its full name) that :func:`caller_problem`
    finds fault with; other services (health) pass unchanged."""

    def __init__(self, state: PartyState, service: str) -> None:
        self.state = state
        self.prefix = f"/{service}/"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = str(handler_call_details.method)
        if handler is None or not method.startswith(self.prefix):
            return handler
        return _guarded(handler, method.removeprefix(self.prefix), self._refuse_unless_gateway)

    async def _refuse_unless_gateway(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        problem = caller_problem(context.auth_context(), self.state.settings.gateway_name)
        if problem is None:
            return
        code, message = to_status(CallerNotGatewayError(problem))
        self.state.metrics.refused(method, code.name)
        log.warning("[Party.%s] refused: %s", method, problem)
        await asyncio.to_thread(self.state.audit.record, "call.refused", method=method,
                                reason=problem)
        await context.abort(code, message)


Check = Callable[[str, grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


def _guarded(handler: grpc.RpcMethodHandler, method: str, check: Check
             ) -> grpc.RpcMethodHandler:
    """``handler`` with ``check`` run before its behaviour, for each of the four kinds."""
    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await check(method, context)
            return await inner_uu(request, context)

        return grpc.unary_unary_rpc_method_handler(unary_unary, **codec)
    if handler.stream_unary is not None:
        inner_su = handler.stream_unary

        async def stream_unary(request_iterator: Any, context: Any) -> Any:
            await check(method, context)
            return await inner_su(request_iterator, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **codec)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(method, context)
            async for item in _responses(inner_us(request, context)):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **codec)
    inner_ss = handler.stream_stream

    async def stream_stream(request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        await check(method, context)
        async for item in _responses(inner_ss(request_iterator, context)):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **codec)


async def _responses(result: Any) -> AsyncIterator[Any]:
    """A streaming behaviour's responses, whether it is an async generator or a
    coroutine that writes through the context (then it yields nothing here)."""
    if inspect.isawaitable(result):
        await result
        return
    async for item in result:
        yield item
