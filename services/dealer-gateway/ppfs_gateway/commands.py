"""`ppfs gateway serve`.

ppfs gateway serve --config gateway.json [--host H] [--port P] [--port-file F]
    [--make-keys]    # its keys made here, their requests in STATE_DIR/csr/ for the CA
    [--require-https]  # refuse to start without an HTTPS certificate and key

SIGHUP makes it read its tokens file (and its revocation list) again (``kill -HUP PID``,
``docker compose kill -s HUP gateway``): tokens added, removed or given an end take effect
without a restart; a file that does not parse is refused as a whole and logged, the
tokens (or the list) in force stay.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from ppfs.errors import ParameterError
from ppfs.logfmt import configure_logging
from ppfs.state_lock import StateDirInUse, hold_state_dir

EXIT_FAILED = 1
EXIT_USAGE = 2


def add_commands(sub: Any) -> None:
    gw = sub.add_parser("gateway", help="the dealer-gateway REST service")
    gsub = gw.add_subparsers(dest="gateway_command", required=True)
    serve = gsub.add_parser("serve", help="run the gateway (OpenAPI at /openapi.json)")
    serve.add_argument(
        "--config", type=Path, default=None, help="JSON config (or PPFS_GATEWAY_CONFIG)"
    )
    serve.add_argument("--host", default=None, help="listen address (default from the config)")
    serve.add_argument("--port", type=int, default=None, help="port; 0 picks a free one")
    serve.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
    serve.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="also serve Prometheus metrics here, plain HTTP without authentication: an "
        "internal address only (GET /metrics on the API needs an admin token)",
    )
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=None,
        help="log lines as text or one JSON object per line (default: $PPFS_LOG_FORMAT, "
        "else text)",
    )
    serve.add_argument(
        "--make-keys",
        action="store_true",
        help="make the private keys the config names that do not exist yet (its TLS "
        "client key, its HTTPS key), here where the gateway runs, and write their "
        "certificate requests to STATE_DIR/csr/ for the CA (`ppfs pki client --csr`, "
        "`ppfs pki https --csr`); until their certificates are installed it exits (2) "
        "saying so",
    )
    serve.add_argument(
        "--require-https",
        action="store_true",
        help="refuse to start unless the config names an HTTPS certificate and key "
        "(https_cert, https_key): a gateway that clients reach over a network never "
        "takes bearer tokens over plain HTTP",
    )
    serve.set_defaults(func=_serve)


def _key_pairs(settings: Any) -> list[tuple[str, Path, Path]]:
    """(request file name, key, certificate) of each key pair the config names."""
    pairs = [("client.csr", settings.tls.client_key, settings.tls.client_cert)]
    if settings.https_key is not None:
        pairs.append(("https.csr", settings.https_key, settings.https_cert))
    return pairs


def check_keys(settings: Any, make_keys: bool) -> str | None:
    """With ``make_keys``: make each missing key and its certificate request. Then the
    problem that keeps the gateway from serving, if any: a key or certificate missing
    (naming the requests to have signed), a certificate for another key than its own, or
    one that has ended."""
    import datetime as dt

    from ppfs.pki import (
        certificate_end,
        certificate_matches_key,
        key_request,
        party_key_and_csr,
        replace_public_file,
    )

    csr_dir = settings.state_dir / "csr"
    waiting: list[str] = []
    for request, key, cert in _key_pairs(settings):
        if make_keys and not key.exists():
            party_key_and_csr(key, request.removesuffix(".csr"))
        if not key.exists():
            return f"no private key at {key} (--make-keys makes it here)"
        if make_keys and not cert.exists():
            csr_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            replace_public_file(csr_dir / request, key_request(key, request.removesuffix(".csr")))
        if not cert.exists():
            waiting.append(request)
            continue
        try:  # its own files, as the operator placed them (links followed)
            matches = certificate_matches_key(cert.read_bytes(), key.read_bytes())
        except (ValueError, TypeError):  # not PEM, or a key under a passphrase
            return (f"{cert} or {key} does not parse (a PEM certificate and an unencrypted "
                    "PEM private key)")
        if not matches:
            return (f"{cert} certifies another key than {key}: install the certificate "
                    f"signed from this key's request ({csr_dir / request})")
        end = certificate_end(cert.read_bytes())
        if end <= dt.datetime.now(dt.UTC):
            renew = "ppfs pki client" if request == "client.csr" else "ppfs pki https --csr"
            return (f"{cert}: the certificate expired on {end:%Y-%m-%d %H:%M} UTC: have the "
                    f"deployment CA renew it ({renew}) and install it")
    if waiting:
        how = {"client.csr": "ppfs pki client --csr", "https.csr": "ppfs pki https --csr"}
        todo = "; ".join(f"{csr_dir / r} ({how[r]})" for r in waiting)
        return f"waiting for certificates: have the deployment CA sign {todo}"
    return None


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ppfs_gateway.core.config import load_settings
    from ppfs_gateway.errors import GatewayError
    from ppfs_gateway.main import DropQueryString, create_app
    from ppfs_gateway.registry import Registry

    os.umask(0o077)  # the registry, spooled bodies and any log it writes: owner only
    configure_logging(args.log_format)
    overrides: dict[str, Any] = {}
    if args.host is not None:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.metrics_listen is not None:
        overrides["metrics_listen"] = args.metrics_listen
    try:
        settings = load_settings(args.config, **overrides)
    except ParameterError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.require_https and settings.https_cert is None:
        print(f"ppfs gateway serve: error: --require-https, but {args.config or 'the config'} "
              "names no https_cert and https_key: bearer tokens would cross the network in "
              "the clear (make the folder with `make-secrets.sh --https-name NAME`)",
              file=sys.stderr)
        return EXIT_USAGE
    # one gateway per state directory, for this process's life (a second one would delete
    # the first one's spooled bodies and share its registry)
    try:
        hold_state_dir(settings.state_dir)
    except (StateDirInUse, OSError) as exc:
        print(f"ppfs gateway serve: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    # a registry there is read before serving: one that cannot be read is one line here
    # (the app opens it again in its lifespan; a new one is made there)
    try:
        if settings.db_path.exists():
            Registry(settings.db_path).close()
    except GatewayError as exc:
        print(f"ppfs gateway serve: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        problem = check_keys(settings, args.make_keys)
    except OSError as exc:
        problem = str(exc)
    if problem is not None:
        print(f"ppfs gateway serve: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    from ppfs_gateway.api.routes.status import gateway_warnings, revocation_warnings

    app = create_app(settings)
    for line in [*gateway_warnings(settings),  # also in /v1/deployment/status
                 *revocation_warnings(app.state.revocations)]:
        logging.getLogger("ppfs.gateway").warning("[Gateway] %s", line)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="info",
        # uvicorn's loggers go through ours (text or JSON, with redaction)
        log_config=None,
        ssl_certfile=str(settings.https_cert) if settings.https_cert else None,
        ssl_keyfile=str(settings.https_key) if settings.https_key else None,
        # the access log holds method, path and status only: no header, no query string
        access_log=True,
    )
    server = uvicorn.Server(config)
    # after uvicorn.Config has set up its loggers
    logging.getLogger("uvicorn.access").addFilter(DropQueryString())

    async def run() -> bool:
        # SIGHUP: the tokens file read again (rotation without a restart); uvicorn
        # handles SIGINT and SIGTERM, not this one
        # and the revocation list (also read again whenever the file changes)
        def reload() -> None:
            app.state.tokens.reload()
            app.state.revocations.reload()

        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if args.port_file is not None and server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            tmp = args.port_file.with_name(args.port_file.name + ".tmp")
            tmp.write_text(str(port))
            tmp.replace(args.port_file)
        started = server.started
        await task
        return started

    # a gateway that never served (its start failed: logged) does not exit as a success
    return 0 if asyncio.run(run()) else EXIT_FAILED
