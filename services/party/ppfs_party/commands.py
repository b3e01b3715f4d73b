"""`ppfs party ...` and `ppfs pki ...`: the party daemon's command line.

    ppfs pki init  --ca-dir CA                       # the deployment CA (operator)
    ppfs party init --state-dir S --index I          # keys + certificate requests
    ppfs pki sign  --ca-dir CA --state-dir S --party P   # CA signs party P's requests
    ppfs pki client --ca-dir CA --name gateway --out DIR   # the gateway's client identity
        [--csr FILE]                                 # ... for a key the gateway made
    ppfs pki https --ca-dir CA --csr FILE --name DNS_OR_IP --out DIR   # its HTTPS cert
    ppfs pki fingerprint --ca-dir CA                 # the clients' trust anchor
    ppfs pki revoke --ca-dir CA --party P | --statement SHA256   # a stolen party key
    ppfs pki revocations --ca-dir CA                 # re-issue the revocation list (cron)
    ppfs pki statements --ca-dir CA                  # the key statements signed, revoked
    ppfs party add-owner --state-dir S --owner-id ID --public-key HEX
    ppfs party serve --state-dir S --index I --listen HOST:PORT --mpc-port P ...
        [--mpc-dial PARTY=HOST:+N ...]              # reach a peer through a relay
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from ppfs.engines.base import PARTY_NAMES
from ppfs.engines.stall import DEFAULT_STALL_SECONDS
from ppfs.errors import PpfsError
from ppfs.keycert import REVOCATION_FRESHNESS
from ppfs.logfmt import configure_logging
from ppfs.pki import (
    CA_VALIDITY,
    DEFAULT_GATEWAY_NAME,
    LEAF_VALIDITY,
    CertificateAuthority,
    PartyRequestRefused,
    certificate_end,
    certify_client_request,
    certify_https_key,
    issue_client_identity,
    load_ca,
    read_key_request,
    replace_public_file,
    save_ca,
)
from ppfs_party.config import (
    DEFAULT_BUNDLE_CACHE,
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_JOB_RETENTION_DAYS,
    DEFAULT_MAX_OPEN_UPLOADS,
    DEFAULT_MAX_UPLOAD,
    DEFAULT_STAGED_EXPIRY,
    DEFAULT_UPLOAD_TIMEOUT,
    MIN_UPLOAD_RATE,
    MpcDial,
    PartySettings,
)
from ppfs_party.keys import check_client_name, sign_party_requests
from ppfs_party.state import open_state
from ppfs_party.store import register_owner


def add_commands(subparsers: Any) -> None:
    party = subparsers.add_parser("party", help="run and administer a party daemon")
    psub = party.add_subparsers(dest="party_command", required=True)

    serve = psub.add_parser("serve", help="run the party daemon (gRPC, mutual TLS)")
    _state_args(serve)
    serve.add_argument("--listen", default="127.0.0.1:50051", metavar="HOST:PORT",
                       help="control-plane address (port 0: any free port)")
    serve.add_argument("--tls-name", default=None,
                       help="control-plane certificate name (default: the party's name)")
    serve.add_argument("--gateway-name", default=DEFAULT_GATEWAY_NAME, metavar="NAME",
                       help="accept PartyService calls only from the gateway's client "
                            "identity of this name (`ppfs pki client --name`; default "
                            f"{DEFAULT_GATEWAY_NAME})")
    serve.add_argument("--mpc-host", default="127.0.0.1",
                       help="where peers reach this party's engine")
    serve.add_argument("--mpc-port", type=int, default=14000,
                       help="this party's first engine port")
    serve.add_argument("--mpc-port-count", type=int, default=1,
                       help="engine ports --mpc-port .. +count-1; jobs rotate over them")
    serve.add_argument("--mpc-bind-host", default=None,
                       help="engine listens on this address only (default: every interface)")
    serve.add_argument("--mpc-dial", action="append", default=[],
                       metavar="PARTY=HOST:PORT|PARTY=HOST:+N",
                       help="dial that peer's engine here instead of the address the job "
                            "lists (a relay, a NAT); HOST:+N / HOST:-N: the peer's job port "
                            "shifted by N, HOST:PORT only with --mpc-port-count 1; PARTY an "
                            "index or a name (repeatable, one per peer)")
    serve.add_argument("--engine", action="append", choices=["mp-spdz", "mpyc"], default=None,
                       help="offer this engine (repeatable; default: every usable one)")
    serve.add_argument("--max-upload-bytes", type=int, default=DEFAULT_MAX_UPLOAD)
    serve.add_argument("--upload-timeout", type=float, default=DEFAULT_UPLOAD_TIMEOUT,
                       metavar="SECONDS",
                       help="refuse an upload part not received within SECONDS plus one "
                            f"second per {MIN_UPLOAD_RATE >> 10} KiB of it (default "
                            f"{DEFAULT_UPLOAD_TIMEOUT:g})")
    serve.add_argument("--max-open-uploads", type=int, default=DEFAULT_MAX_OPEN_UPLOADS,
                       metavar="N",
                       help="upload parts received at once (one per owner uploading); "
                            f"one more is refused until one ends (default "
                            f"{DEFAULT_MAX_OPEN_UPLOADS})")
    serve.add_argument("--staged-expiry-hours", type=float,
                       default=DEFAULT_STAGED_EXPIRY / 3600, metavar="HOURS",
                       help="abort an upload part still staged (neither committed nor "
                            "aborted by the gateway) HOURS after it arrived; a later "
                            f"commit of it is refused (default {DEFAULT_STAGED_EXPIRY / 3600:g})")
    serve.add_argument("--job-retention-days", type=float,
                       default=DEFAULT_JOB_RETENTION_DAYS, metavar="DAYS",
                       help="DAYS after a job ended, delete its files here (engine logs, "
                            "its result's masked outputs) and keep only a tombstone that "
                            "refuses it again; its result cannot be fetched after that "
                            f"(default {DEFAULT_JOB_RETENTION_DAYS:g})")
    serve.add_argument("--bundle-cache-mib", type=int, default=DEFAULT_BUNDLE_CACHE >> 20,
                       metavar="MIB",
                       help="keep loaded upload shares in memory for the next job, up to "
                            f"MIB MiB (default {DEFAULT_BUNDLE_CACHE >> 20}; 0: read them "
                            "for every job)")
    serve.add_argument("--max-concurrent-jobs", type=int, default=1, metavar="N",
                       help="engine runs at once; a job beyond waits queued (default 1)")
    serve.add_argument("--job-timeout", type=float, default=None,
                       help="engine time limit per run in seconds")
    serve.add_argument("--stall-timeout", type=float, default=None, metavar="S",
                       help="stop a run once this party's engine has neither computed nor "
                            "printed for S seconds: a peer stopped answering (default "
                            f"{DEFAULT_STALL_SECONDS:g}; 0: never)")
    serve.add_argument("--drain-seconds", type=float, default=DEFAULT_DRAIN_SECONDS,
                       metavar="S",
                       help="on SIGTERM or SIGINT, take no new job and give the unfinished "
                            "ones up to S seconds to end before stopping them (default "
                            f"{DEFAULT_DRAIN_SECONDS:.0f}; 0: stop them at once); a second "
                            "signal stops at once")
    serve.add_argument("--port-file", type=Path, default=None,
                       help="write the bound control-plane port to this file")
    serve.add_argument("--mpspdz-cache", type=Path, default=None,
                       help="compiled MP-SPDZ programs (default: STATE/cache/mpspdz)")
    serve.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                       help="serve Prometheus metrics here, plain HTTP without "
                            "authentication: an internal address only (default: off)")
    serve.add_argument("--log-format", choices=["text", "json"], default=None,
                       help="log lines as text or one JSON object per line "
                            "(default: $PPFS_LOG_FORMAT, else text)")
    serve.set_defaults(func=_serve)

    init = psub.add_parser("init", help="create the party's keys and certificate requests")
    _state_args(init)
    init.add_argument("--tls-name", default=None)
    init.set_defaults(func=_init)

    owner = psub.add_parser("add-owner", help="register a data owner's Ed25519 public key")
    owner.add_argument("--state-dir", type=Path, required=True)
    owner.add_argument("--owner-id", required=True)
    owner.add_argument("--public-key", required=True, metavar="HEX")
    owner.set_defaults(func=_add_owner)

    if "pki" in getattr(subparsers, "choices", {}):
        return
    pki = subparsers.add_parser("pki", help="the deployment CA: create it, sign requests")
    ksub = pki.add_subparsers(dest="pki_command", required=True)
    ca_init = ksub.add_parser("init", help="create the deployment CA (key stays in CA_DIR)")
    ca_init.add_argument("--ca-dir", type=Path, required=True)
    ca_init.add_argument("--valid-days", type=_days, default=CA_VALIDITY.days, metavar="DAYS",
                         help=f"how long the CA is valid (default {CA_VALIDITY.days}): what it "
                              "signs ends with it, and a new CA is a new trust anchor for "
                              "every client")
    ca_init.set_defaults(func=_pki_init)
    sign = ksub.add_parser(
        "sign", help="sign a party's certificate requests and key statement, for the party "
                     "named by --party only")
    sign.add_argument("--ca-dir", type=Path, required=True)
    sign.add_argument("--state-dir", type=Path, required=True)
    sign.add_argument("--party", type=_party_index, required=True, metavar="NAME|INDEX",
                      help="the party you mean to certify (alice, bob, carol, dave or "
                           "0..3): requests for any other party are refused")
    sign.add_argument("--tls-name", default=None,
                      help="the control-plane certificate name the party was set up with "
                           "(default: its name in lower case)")
    sign.add_argument("--valid-days", type=_days, default=LEAF_VALIDITY.days, metavar="DAYS",
                      help=_LEAF_DAYS_HELP)
    sign.add_argument("--revocable", action="store_true",
                      help="clients trust the key statement only with a fresh revocation "
                           "list of this CA that does not name it (`ppfs pki revocations`, "
                           "installed on the gateway as revocation_list): a stolen key can "
                           "then be revoked (`ppfs pki revoke`) before the statement ends")
    sign.set_defaults(func=_pki_sign)
    client = ksub.add_parser(
        "client", help="key and certificate for the gateway's control-plane client identity")
    client.add_argument("--ca-dir", type=Path, required=True)
    client.add_argument("--name", default=DEFAULT_GATEWAY_NAME,
                        help="its name; parties accept it with --gateway-name NAME "
                             f"(default {DEFAULT_GATEWAY_NAME}); never a party's "
                             "certificate name (alice, P0, MPyC party 0, ...)")
    client.add_argument("--out", type=Path, required=True)
    client.add_argument("--csr", type=Path, default=None, metavar="FILE",
                        help="certify the key of this request, made where the gateway runs "
                             "(`ppfs gateway serve --make-keys`), instead of making a key "
                             "here; the certificate names --name whatever the request says")
    client.add_argument("--valid-days", type=_days, default=LEAF_VALIDITY.days,
                        metavar="DAYS", help=_LEAF_DAYS_HELP)
    client.set_defaults(func=_pki_client)
    https = ksub.add_parser(
        "https", help="the gateway's HTTPS certificate, for the key of a request it made")
    https.add_argument("--ca-dir", type=Path, required=True)
    https.add_argument("--csr", type=Path, required=True, metavar="FILE",
                       help="the request `ppfs gateway serve --make-keys` wrote "
                            "(STATE/csr/https.csr)")
    https.add_argument("--name", action="append", required=True, metavar="DNS_OR_IP",
                       help="a name clients reach the gateway by (repeatable; the first is "
                            "also its common name)")
    https.add_argument("--out", type=Path, required=True,
                       help="folder for https.pem (and ca.pem)")
    https.add_argument("--valid-days", type=_days, default=LEAF_VALIDITY.days,
                       metavar="DAYS", help=_LEAF_DAYS_HELP)
    https.set_defaults(func=_pki_https)
    fpr = ksub.add_parser(
        "fingerprint",
        help="the CA certificate's SHA-256: give it to clients (--deployment-ca)",
    )
    fpr.add_argument("--ca-dir", type=Path, required=True)
    fpr.set_defaults(func=_pki_fingerprint)
    revoke = ksub.add_parser(
        "revoke", help="revoke a party's key statements (a stolen key) and re-issue the "
                       "revocation list")
    revoke.add_argument("--ca-dir", type=Path, required=True)
    which = revoke.add_mutually_exclusive_group(required=True)
    which.add_argument("--party", type=_party_index, metavar="NAME|INDEX",
                       help="every key statement of this party on record (its current "
                            "keys and any earlier statement a gateway could still present)")
    which.add_argument("--statement", metavar="SHA256",
                       help="the key statement with this SHA-256 (`ppfs pki statements`)")
    _revocation_list_args(revoke)
    revoke.set_defaults(func=_pki_revoke)
    reissue = ksub.add_parser(
        "revocations", help="re-issue the revocation list, fresh from now (run it from "
                            "cron well within its freshness, and install it on the gateway)")
    reissue.add_argument("--ca-dir", type=Path, required=True)
    _revocation_list_args(reissue)
    reissue.set_defaults(func=_pki_revocations)
    listed = ksub.add_parser(
        "statements", help="the key statements this CA signed, and which are revoked")
    listed.add_argument("--ca-dir", type=Path, required=True)
    listed.set_defaults(func=_pki_statements)


def _revocation_list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fresh-days", type=_fresh_days, default=REVOCATION_FRESHNESS.days,
                   metavar="DAYS",
                   help=f"how long clients take the list as fresh (default "
                        f"{REVOCATION_FRESHNESS.days}): re-issue it before then; a gateway "
                        "can replay an older list for at most this long")
    p.add_argument("--out", type=Path, default=None, metavar="FILE",
                   help="also write the list here (the gateway's revocation_list file); "
                        "it is always kept as CA_DIR/revocations.json")


def _state_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", type=Path, required=True,
                   help="keys, certificates, uploads, jobs and the audit log")
    p.add_argument("--index", type=int, required=True, choices=range(len(PARTY_NAMES)),
                   help="0 Alice, 1 Bob, 2 Carol, 3 Dave")


_LEAF_DAYS_HELP = (f"how long what it signs is valid (default {LEAF_VALIDITY.days}, never "
                   "past the CA's end); renew by signing again")


def _days(text: str) -> int:
    """``--valid-days``: a whole number of days, at least one."""
    try:
        days = int(text)
    except ValueError:
        days = 0
    if not 1 <= days <= 36500:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of days, 1..36500")
    return days


def _fresh_days(text: str) -> int:
    """``--fresh-days``: a whole number of days, 1..90."""
    try:
        days = int(text)
    except ValueError:
        days = 0
    if not 1 <= days <= 90:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of days, 1..90")
    return days


def _party_index(text: str) -> int:
    """``--party``: a name (any case) or an index."""
    names = [n.lower() for n in PARTY_NAMES]
    if text.isdigit() and int(text) < len(PARTY_NAMES):
        return int(text)
    if text.lower() in names:
        return names.index(text.lower())
    raise argparse.ArgumentTypeError(
        f"unknown party {text!r}: one of {', '.join(names)} or 0..{len(PARTY_NAMES) - 1}")


def _settings(args: argparse.Namespace) -> PartySettings:
    kwargs: dict[str, Any] = {"state_dir": args.state_dir, "index": args.index,
                              "tls_name": args.tls_name}
    if getattr(args, "listen", None) is not None:
        kwargs.update(
            listen=args.listen, mpc_host=args.mpc_host, mpc_port_base=args.mpc_port,
            mpc_port_count=args.mpc_port_count, gateway_name=args.gateway_name,
            max_concurrent_jobs=args.max_concurrent_jobs,
            mpc_bind_host=args.mpc_bind_host, max_upload_bytes=args.max_upload_bytes,
            upload_timeout=args.upload_timeout,
            max_open_uploads=args.max_open_uploads,
            staged_expiry=args.staged_expiry_hours * 3600,
            job_retention_days=args.job_retention_days,
            bundle_cache_bytes=args.bundle_cache_mib << 20,
            job_timeout=args.job_timeout, stall_timeout=args.stall_timeout,
            port_file=args.port_file,
            drain_seconds=args.drain_seconds,
            mpspdz_cache=args.mpspdz_cache, metrics_listen=args.metrics_listen,
            mpc_dial=tuple(MpcDial.parse(d) for d in args.mpc_dial),
        )
        if args.engine:
            kwargs["engines"] = tuple(args.engine)
    return PartySettings(**kwargs)


def _serve(args: argparse.Namespace) -> int:
    configure_logging(args.log_format)
    from ppfs_party.server import serve

    try:
        asyncio.run(serve(_settings(args)))
    except (PpfsError, OSError) as exc:
        print(f"ppfs party serve: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _init(args: argparse.Namespace) -> int:
    try:
        state = open_state(_settings(args))
    except (PpfsError, OSError) as exc:
        print(f"ppfs party init: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({
        "party": state.settings.name,
        "box_public_key": bytes(state.keys.box.public_key).hex(),
        "signing_public_key": bytes(state.keys.signing.verify_key).hex(),
        "certificate_requests": sorted(str(p) for p in (args.state_dir / "csr").glob("*.csr")),
    }, indent=1))
    return 0


def _add_owner(args: argparse.Namespace) -> int:
    try:
        register_owner(args.state_dir, args.owner_id, bytes.fromhex(args.public_key))
    except (PpfsError, ValueError, OSError) as exc:
        print(f"ppfs party add-owner: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _pki_init(args: argparse.Namespace) -> int:
    if (args.ca_dir / "ca.key").exists():
        print(f"ppfs: error: a CA exists already in {args.ca_dir}", file=sys.stderr)
        return 2
    save_ca(CertificateAuthority.create(validity=dt.timedelta(days=args.valid_days)),
            args.ca_dir)
    print(str(args.ca_dir / "ca.pem"))
    return 0


def _pki_sign(args: argparse.Namespace) -> int:
    from ppfs.revocation import list_lock, record_statement, refuse_revoked_keys

    def record(statement: bytes) -> None:
        with list_lock(args.ca_dir):  # not while a revocation reads what is on record
            refuse_revoked_keys(args.ca_dir, ca, statement)
            record_statement(args.ca_dir, statement)

    try:
        ca = load_ca(args.ca_dir)
        signed = sign_party_requests(ca, args.state_dir, args.party,
                                     args.tls_name, dt.timedelta(days=args.valid_days),
                                     revocable=args.revocable, record=record)
    except (ValueError, OSError) as exc:
        print(f"ppfs pki sign: error: {exc}", file=sys.stderr)
        return 2
    for item in signed:
        print(item)
    return 0


def _list_line(rl: Any, path: Path) -> str:
    return (f"{path}: {len(rl.revoked)} key statement{'s' * (len(rl.revoked) != 1)} "
            f"revoked; issued {rl.issued_at}, stale after {rl.next_update}: re-issue it "
            "before then (`ppfs pki revocations`) and install it on the gateway")


def _check_out(args: argparse.Namespace) -> None:
    """ValueError, before anything is revoked or issued, when ``--out`` holds a file that
    is not a revocation list (the CA key beside it, say): it is never replaced. A link
    there is replaced itself, never written through; a path not there yet is written."""
    from ppfs.keycert import parse_revocations_file
    from ppfs.pki import read_regular_file

    if args.out is None or args.out.is_symlink() or not args.out.exists():
        return
    try:
        parse_revocations_file(read_regular_file(args.out))
    except (ValueError, OSError):
        raise ValueError(f"{args.out} is not a revocation list: not replaced (--out names "
                         "the file the gateway reads, its revocation_list)") from None


def _write_out(args: argparse.Namespace) -> None:
    from ppfs.revocation import REVOCATIONS_FILE

    if args.out is not None:
        replace_public_file(args.out, (args.ca_dir / REVOCATIONS_FILE).read_bytes())


def _list_in_force(args: argparse.Namespace) -> Any:
    """The CA's list before a new one is issued, to compare with it (None if none reads)."""
    from ppfs.revocation import current_list

    try:
        return current_list(args.ca_dir, load_ca(args.ca_dir))
    except (ValueError, OSError):
        return None


def _warn_if_dated_before(before: Any, rl: Any, command: str) -> None:
    """A list issued before the one it replaces: the clock was set back since that one
    (clients that took it refuse this one as a replay), or ran ahead then (ppfs.revocation
    .issue does not follow a list issued in the future: no client took it)."""
    if before is not None and rl.issued < before.issued:
        print(f"ppfs pki {command}: warning: the list it replaces was issued at "
              f"{before.issued_at}, after this one ({rl.issued_at}): this machine's clock "
              "is behind, or it was ahead when that list was issued. If it is behind, set "
              "it right and issue the list again (`ppfs pki revocations`): clients that "
              "took that list refuse this one as a replay", file=sys.stderr)


def _pki_revoke(args: argparse.Namespace) -> int:
    from ppfs.revocation import REVOCATIONS_FILE, revoke

    before = _list_in_force(args)
    try:
        _check_out(args)
        new, rl = revoke(args.ca_dir, load_ca(args.ca_dir), party=args.party,
                         sha256=args.statement,
                         freshness=dt.timedelta(days=args.fresh_days))
        _write_out(args)
    except (ValueError, OSError) as exc:
        print(f"ppfs pki revoke: error: {exc}", file=sys.stderr)
        return 2
    _warn_if_dated_before(before, rl, "revoke")
    for r in new:
        print(f"revoked {r}")
        if not r.statement.revocation_list:
            print(f"ppfs pki revoke: warning: {r.sha256} does not ask for the revocation "
                  f"list: clients keep trusting it until {r.statement.not_after}; only a "
                  "new CA (a new trust anchor for every client) ends it sooner",
                  file=sys.stderr)
    if not new:
        print("nothing newly revoked: every statement named was revoked already")
    print(_list_line(rl, args.out or args.ca_dir / REVOCATIONS_FILE))
    return 0


def _pki_revocations(args: argparse.Namespace) -> int:
    from ppfs.revocation import REVOCATIONS_FILE, reissue

    before = _list_in_force(args)
    try:
        _check_out(args)
        rl = reissue(args.ca_dir, load_ca(args.ca_dir),
                     freshness=dt.timedelta(days=args.fresh_days))
        _write_out(args)
    except (ValueError, OSError) as exc:
        print(f"ppfs pki revocations: error: {exc}", file=sys.stderr)
        return 2
    _warn_if_dated_before(before, rl, "revocations")
    print(_list_line(rl, args.out or args.ca_dir / REVOCATIONS_FILE))
    return 0


def _pki_statements(args: argparse.Namespace) -> int:
    from ppfs.revocation import current_list, recorded

    try:
        rl = current_list(args.ca_dir, load_ca(args.ca_dir))
        records = recorded(args.ca_dir)
    except (ValueError, OSError) as exc:
        print(f"ppfs pki statements: error: {exc}", file=sys.stderr)
        return 2
    revoked = set(rl.revoked) if rl else set()
    for r in records:
        print(f"{'revoked ' if r.sha256 in revoked else 'in force'} {r}")
    if rl is not None:
        print(f"revocation list issued {rl.issued_at}, stale after {rl.next_update}")
    return 0


def _until(pem: bytes) -> str:
    return certificate_end(pem).strftime("%Y-%m-%d %H:%M UTC")


def _pki_fingerprint(args: argparse.Namespace) -> int:
    from cryptography import x509

    from ppfs.keycert import ca_fingerprint

    cert = x509.load_pem_x509_certificate((args.ca_dir / "ca.pem").read_bytes())
    print(ca_fingerprint(cert))
    return 0


def _pki_client(args: argparse.Namespace) -> int:
    try:
        check_client_name(args.name)
    except PartyRequestRefused as exc:
        print(f"ppfs pki client: error: {exc}", file=sys.stderr)
        return 2
    ca = load_ca(args.ca_dir)
    if args.csr is not None:
        try:
            cert = certify_client_request(ca, read_key_request(args.csr), args.name,
                                          dt.timedelta(days=args.valid_days))
        except (ValueError, OSError) as exc:
            print(f"ppfs pki client: error: {exc}", file=sys.stderr)
            return 2
        args.out.mkdir(parents=True, exist_ok=True)
    else:
        try:
            _, cert = issue_client_identity(ca, args.name, args.out / f"{args.name}.key",
                                            dt.timedelta(days=args.valid_days))
        except ValueError as exc:
            print(f"ppfs pki client: error: {exc}", file=sys.stderr)
            return 2
    replace_public_file(args.out / f"{args.name}.pem", cert)
    replace_public_file(args.out / "ca.pem", ca.cert_pem())
    print(f"{args.out / f'{args.name}.pem'} (valid until {_until(cert)})")
    return 0


def _pki_https(args: argparse.Namespace) -> int:
    ca = load_ca(args.ca_dir)
    try:
        cert = certify_https_key(ca, read_key_request(args.csr).public_key(), args.name,
                                 dt.timedelta(days=args.valid_days))
    except (ValueError, OSError) as exc:
        print(f"ppfs pki https: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    replace_public_file(args.out / "https.pem", cert)
    replace_public_file(args.out / "ca.pem", ca.cert_pem())
    print(f"{args.out / 'https.pem'} (valid until {_until(cert)})")
    return 0
