"""Per-party secret folders for docker-compose.yml / compose.4pc.yml (and the Azure VMs).

Run it through deploy/compose/make-secrets.sh, which runs it INSIDE the party image so
that each party's keys match the engines that image offers. It writes, under --out:

    ca/                   the deployment CA (ca.key: keep it offline; mounted nowhere)
    alice/ bob/ carol/ (dave/)   one party's keys/, certs/ and owners.json: mounted as that
                          party's compose secret only (a Key Vault secret on Azure)
    gateway/              gateway.json, tokens.json and tls/ (its client identity)
    clients/              principals' key files and env files (owner-a, owner-b,
                          analyst, admin): for the people using the service

Every key here is generated on the machine that runs this: a deployment on ONE host
(compose), whose administrator holds every party's keys, for development and
demonstration. Parties on machines of their own (Azure, separate organisations) make
their keys themselves: with --no-party-keys a party's folder holds only its registered
data owners (owners.json); each party makes its keys at its first start, and only its key
request (public) leaves it to be signed (`ppfs pki sign`, deploy/terraform-azure/README.md).
Likewise the gateway on a machine of its own (--no-gateway-keys): its folder holds its
configuration, tokens and the CA certificate; it makes its client-identity and HTTPS keys
at its first start (`ppfs gateway serve --make-keys`) and its certificate requests leave it
to be signed (`ppfs pki client --csr`, `ppfs pki https --csr`). The example principals'
keys are made here (real data owners make their own with `ppfs keys create`). Nothing here is ever
copied into an image. An --out that already holds a deployment CA is refused: a new CA
would orphan every key it certified.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

from ppfs.engines.base import PARTY_NAMES

SERVICE_UID = 10001  # the images' non-root user


def _copy_private(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), uid, gid)
    os.lchown(path, uid, gid)


def _https_identity(ca_dir: Path, names: list[str], out: Path) -> None:
    """The gateway's HTTPS key (generated here, in the gateway's folder) and a certificate
    from the deployment CA for ``names`` (DNS names or IP addresses)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from ppfs.pki import certify_https_key, load_ca, replace_private_file, replace_public_file

    key = ec.generate_private_key(ec.SECP256R1())
    out.mkdir(parents=True, exist_ok=True)
    replace_private_file(out / "https.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    replace_public_file(out / "https.pem",
                        certify_https_key(load_ca(ca_dir), key.public_key(), names))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parties", type=int, choices=(3, 4), default=3)
    ap.add_argument("--gateway-url", default=None,
                    help="where clients reach the gateway, written to clients/*.env (default "
                    "http(s)://127.0.0.1:8080)")
    ap.add_argument("--https-name", action="append", default=None, metavar="NAME_OR_IP",
                    help="serve HTTPS with a certificate from the deployment CA for these "
                    "names (repeatable, e.g. localhost, 127.0.0.1, the public IP)")
    ap.add_argument("--party-host", action="append", default=None, metavar="HOST",
                    help="control-plane host of each party in order (default: the compose "
                    "service names alice, bob, ...)")
    ap.add_argument("--grpc-port", type=int, default=50051)
    ap.add_argument("--security", default=None,
                    help="default security setting written to clients/*.env as PPFS_SECURITY "
                    "(default: passive-3pc with 3 parties, active-4pc with 4)")
    ap.add_argument("--host-out", type=Path, default=None,
                    help="where --out is on the host (for the paths in clients/*.env)")
    ap.add_argument("--owner-uid", type=int, default=os.getuid(),
                    help="owner of ca/ and clients/ (the operator)")
    ap.add_argument("--no-party-keys", action="store_true",
                    help="parties on machines of their own: each party's folder holds only "
                    "owners.json; every party makes its own keys at its first start (every "
                    "folder is then the operator's, to upload)")
    ap.add_argument("--no-gateway-keys", action="store_true",
                    help="the gateway on a machine of its own: its folder holds no private "
                    "key; `ppfs gateway serve --make-keys` makes them in its state "
                    "directory at its first start and writes their certificate requests "
                    "(sign them with `ppfs pki client --csr` and `ppfs pki https --csr`)")
    args = ap.parse_args()
    if (args.out / "ca" / "ca.key").exists():
        ap.error(f"{args.out} already holds a deployment CA (ca/ca.key): a new one would "
                 "orphan every key it certified; use another --out")

    from ppfs_cli.devstack import PRINCIPALS, prepare

    # mounted as they are (compose): the images' user owns them; uploaded by the operator
    # (--no-party-keys, machines of their own): the operator does, and each VM hands its
    # folder to the images' user when it fetches it
    service_uid = args.owner_uid if args.no_party_keys else SERVICE_UID

    work = args.out / ".work"
    # CA, party states, gateway identity, keys, tokens; with --no-party-keys and
    # --no-gateway-keys no key is made for a party or the gateway here, not even one to
    # throw away: the CA certifies only the keys that will be used
    layout = prepare(work, args.parties, party_keys=not args.no_party_keys,
                     gateway_identity=not args.no_gateway_keys)
    names = [n.lower() for n in PARTY_NAMES[: args.parties]]
    hosts = args.party_host or names
    if len(hosts) != args.parties:
        ap.error(f"give --party-host once per party ({args.parties})")

    for name, state in zip(names, layout.party_dirs, strict=True):
        dst = args.out / name
        for part in (("owners.json",) if args.no_party_keys
                     else ("keys", "certs", "owners.json")):
            if (state / part).exists():
                _copy_private(state / part, dst / part)
        _chown_tree(dst, service_uid, service_uid)

    gw = args.out / "gateway"
    gateway_state = "/var/lib/ppfs/state"
    if args.no_gateway_keys:
        # its keys are made where it runs, in its state volume; the certificates the
        # operator signs from their requests join this folder's tls/ afterwards
        _copy_private(work / "gateway" / "tls" / "ca.pem", gw / "tls" / "ca.pem")
        client_key = f"{gateway_state}/keys/gateway.key"
    else:
        _copy_private(work / "gateway" / "tls", gw / "tls")
        client_key = "tls/gateway.key"
    _copy_private(layout.tokens_file, gw / "tokens.json")
    config = {
        "state_dir": gateway_state,
        "parties": [
            {"address": f"{h}:{args.grpc_port}", "tls_server_name": n}
            for h, n in zip(hosts, names, strict=True)
        ],
        "tls": {"ca_cert": "tls/ca.pem", "client_cert": "tls/gateway.pem",
                "client_key": client_key},
        "tokens_file": "tokens.json",
        "host": "0.0.0.0",  # noqa: S104 - inside the gateway container
        "port": 8080,
    }
    if args.https_name and args.no_gateway_keys:
        config["https_cert"] = "tls/https.pem"
        config["https_key"] = f"{gateway_state}/keys/https.key"
    elif args.https_name:
        _https_identity(work / "ca", args.https_name, gw / "tls")
        config["https_cert"] = "tls/https.pem"
        config["https_key"] = "tls/https.key"
    (gw / "gateway.json").write_text(json.dumps(config, indent=1) + "\n")
    _chown_tree(gw, service_uid, service_uid)

    _copy_private(work / "ca", args.out / "ca")
    clients = args.out / "clients"
    security = args.security or ("passive-3pc" if args.parties == 3 else "active-4pc")
    host_out = args.host_out or args.out.resolve()
    url = args.gateway_url or ("https" if args.https_name else "http") + "://127.0.0.1:8080"
    from cryptography import x509

    from ppfs.keycert import ca_fingerprint

    # the clients' trust anchor: the deployment CA's fingerprint, which certifies the
    # parties' keys (clients refuse party keys it did not certify)
    anchor = ca_fingerprint(x509.load_pem_x509_certificate((work / "ca" / "ca.pem").read_bytes()))
    for _, subject in PRINCIPALS:
        _copy_private(layout.key_file(subject), clients / f"{subject}.key")
        ca_line = f"export PPFS_CA={host_out / 'ca' / 'ca.pem'}\n" if args.https_name else ""
        env = (
            ca_line +
            f"export PPFS_GATEWAY={url}\n"
            f"export PPFS_SECURITY={security}\n"
            f"export PPFS_TOKEN={layout.tokens[subject]}\n"
            f"export PPFS_KEY={host_out / 'clients' / subject}.key\n"
            f"export PPFS_DEPLOYMENT_CA={anchor}\n"
        )
        path = clients / f"{subject}.env"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(env)
    for d in (args.out / "ca", clients):
        _chown_tree(d, args.owner_uid, args.owner_uid)
    shutil.rmtree(work)
    print(f"secrets for {', '.join(names)} and the gateway in {args.host_out or args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
