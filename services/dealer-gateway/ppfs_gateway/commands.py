"""`ppfs gateway serve`, `ppfs up` and `ppfs demo-service`.

ppfs gateway serve --config gateway.json [--host H] [--port P] [--port-file F]
ppfs up [--parties 3|4] [--state-dir .ppfs]      # a local development stack
ppfs demo-service [--parties 3|4]                # the main job, through the service
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from ppfs.errors import ParameterError, PpfsError
from ppfs.logfmt import configure_logging

EXIT_FAILED = 1
EXIT_USAGE = 2


def add_commands(sub: Any) -> None:
    gw = sub.add_parser("gateway", help="the dealer-gateway REST service")
    gsub = gw.add_subparsers(dest="gateway_command", required=True)
    serve = gsub.add_parser("serve", help="run the gateway (OpenAPI at /docs)")
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
    serve.set_defaults(func=_serve)

    up = sub.add_parser(
        "up",
        help="start a local stack: parties and gateway, with a fresh development PKI",
        description="Start the party daemons and the gateway as local processes with a freshly "
        "generated development PKI, keys and bearer tokens under --state-dir (reused when it "
        "exists). Prints the gateway URL and where the tokens are; Ctrl-C stops everything.",
    )
    _stack_args(up)
    up.set_defaults(func=_up)

    demo = sub.add_parser(
        "demo-service",
        help="run the main job through the service: upload, Step 2A + 2B, fetch the result",
        description="Start a local stack, split a synthetic data set between two data owners, "
        "upload both halves, submit Step 2A and Step 2B (training) as the analyst, watch it, "
        "fetch and open the result (selection and model), and compare the selection with the "
        "plaintext MS-GINI choice.",
    )
    _stack_args(demo, default_dir=None)
    demo.add_argument("--rows", type=int, default=200)
    demo.add_argument("--cols", type=int, default=12)
    demo.add_argument("--k", type=int, default=4)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--epochs", type=int, default=5, help="Step 2B epochs (0: no training)")
    demo.set_defaults(func=_demo)


def _stack_args(p: argparse.ArgumentParser, default_dir: str | None = ".ppfs") -> None:
    p.add_argument("--parties", type=int, choices=(3, 4), default=3)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(default_dir) if default_dir else None,
        help="keys, certificates, tokens, registry, logs"
        + (" (default ./.ppfs)" if default_dir else " (default: a temporary directory)"),
    )
    p.add_argument("--port", type=int, default=8080, help="gateway port (0: any free port)")
    p.add_argument(
        "--engine",
        choices=["mp-spdz", "mpyc"],
        default=None,
        help="engine for the demo job (default: mp-spdz when found, else mpyc)",
    )


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from ppfs_gateway.core.config import load_settings
    from ppfs_gateway.main import DropQueryString, create_app

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
    config = uvicorn.Config(
        create_app(settings),
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

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if args.port_file is not None and server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            tmp = args.port_file.with_name(args.port_file.name + ".tmp")
            tmp.write_text(str(port))
            tmp.replace(args.port_file)
        await task

    asyncio.run(run())
    return 0


def _up(args: argparse.Namespace) -> int:
    from ppfs_gateway.devstack import run_stack

    try:
        return asyncio.run(run_stack(args))
    except ParameterError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PpfsError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 0


def _demo(args: argparse.Namespace) -> int:
    from ppfs_gateway.devstack import run_demo

    try:
        return asyncio.run(run_demo(args))
    except ParameterError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PpfsError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
