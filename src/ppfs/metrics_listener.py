"""A plain-HTTP listener that serves one Prometheus registry at ``/metrics``.

The daemons' metrics carry counts, sizes and durations only (never a value, a key or
a token); the listener has no authentication and belongs on an internal network
(``--metrics-listen 127.0.0.1:9100``, or a compose network with no published port).
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from ppfs.errors import ParameterError


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ParameterError(f"--metrics-listen takes HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


@dataclass
class MetricsListener:
    server: WSGIServer
    thread: Thread

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def serve_metrics(listen: str, registry: CollectorRegistry) -> MetricsListener:
    """Start serving ``registry`` on ``listen`` in a daemon thread."""
    host, port = parse_listen(listen)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsListener(server, thread)
