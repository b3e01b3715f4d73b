"""Container health check for the ppfs images (run by Docker's HEALTHCHECK).

PPFS_HEALTH_ROLE=party: the standard gRPC health service (grpc.health.v1) on
$PPFS_GRPC_HOST:$PPFS_GRPC_PORT (default 127.0.0.1:50051; the address the party listens on
when that is one network's only, as in docker-compose.yml) must answer SERVING. When the
control plane uses mutual TLS (PPFS_TLS_CA, PPFS_TLS_CERT, PPFS_TLS_KEY point at the
mounted files) the check connects with the party's own certificate; the server name checked is
PPFS_HEALTH_TLS_NAME (default: the DNS name in that certificate, else its CN).
Without those files a plaintext channel is used.

PPFS_HEALTH_ROLE=gateway: GET $PPFS_HEALTH_URL must return 2xx. Default
http(s)://127.0.0.1:$PPFS_HEALTH_PORT/healthz (port 8080), https when the gateway's config
($PPFS_GATEWAY_CONFIG, default /run/secrets/ppfs/gateway.json) names an https_cert;
certificate checks are skipped for this loopback probe only.

Exit code 0 healthy, 1 unhealthy; one line on stdout (Docker keeps it in `inspect`).
"""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request


def _cert_name(pem: bytes) -> str:
    """The first DNS name of the certificate, else its common name, else localhost."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(pem)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        dns = san.value.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0]
    except x509.ExtensionNotFound:
        pass
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(cn[0].value) if cn else "localhost"


def _party() -> str:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    host = os.environ.get("PPFS_GRPC_HOST", "") or "127.0.0.1"
    target = f"{host}:{os.environ.get('PPFS_GRPC_PORT', '50051')}"
    paths = [os.environ.get(k, "") for k in ("PPFS_TLS_CA", "PPFS_TLS_CERT", "PPFS_TLS_KEY")]
    options: list[tuple[str, str]] = []
    if all(paths) and all(os.path.isfile(p) for p in paths):
        ca, cert, key = (open(p, "rb").read() for p in paths)  # noqa: SIM115
        creds = grpc.ssl_channel_credentials(ca, key, cert)
        # the certificate names the party (e.g. "alice"), not 127.0.0.1
        name = os.environ.get("PPFS_HEALTH_TLS_NAME", "") or _cert_name(cert)
        options.append(("grpc.ssl_target_name_override", name))
        channel = grpc.secure_channel(target, creds, options=options)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=4)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    if resp.status != health_pb2.HealthCheckResponse.SERVING:
        raise RuntimeError(status)
    return status


def _gateway() -> str:
    url = os.environ.get("PPFS_HEALTH_URL", "")
    if not url:
        # HTTPS when the gateway's config names a certificate
        import json

        config = os.environ.get("PPFS_GATEWAY_CONFIG", "/run/secrets/ppfs/gateway.json")
        try:
            with open(config, encoding="utf-8") as fh:
                https = bool(json.load(fh).get("https_cert"))
        except (OSError, ValueError):
            https = False
        port = os.environ.get("PPFS_HEALTH_PORT", "8080")
        url = f"{'https' if https else 'http'}://127.0.0.1:{port}/healthz"
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # loopback probe of our own process
    with urllib.request.urlopen(url, timeout=4, context=ctx) as resp:  # noqa: S310
        return f"HTTP {resp.status}"


def main() -> int:
    role = os.environ.get("PPFS_HEALTH_ROLE", "party")
    try:
        print(_gateway() if role == "gateway" else _party())
    except Exception as exc:  # any failure is "unhealthy"; say which
        print(f"unhealthy: {type(exc).__name__}: {str(exc)[:200]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
