"""The gateway on a host of its own makes its keys there.

`ppfs gateway serve --make-keys` makes the private keys its config names (its control-plane
client key, its HTTPS key) and writes their certificate requests; the CA signs them
(`ppfs pki client --csr`, `ppfs pki https --csr`) without ever holding either key; the real
party daemons accept the identity. A request whose signature does not hold, one given
through a link, or a party's name is refused with nothing signed, and a gateway whose
certificate certifies another key refuses to start, naming it.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from party_harness import Deployment, spawn_party
from service_fakes import tokens

from ppfs.pki import GATEWAY_CONTROL_USAGE, has_gateway_usage, save_ca


def _ppfs(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppfs_cli", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def _gateway_config(root: Path, party_ports: list[int], ca_pem: bytes,
                    cfg: list[dict[str, str]]) -> Path:
    """A gateway folder as `make-secrets.sh --no-gateway-keys` leaves it: configuration,
    tokens and the CA certificate; the keys are to be made in its state directory."""
    (root / "tls").mkdir(parents=True)
    (root / "tls" / "ca.pem").write_bytes(ca_pem)
    state = root / "state"
    config = {
        "state_dir": str(state),
        "parties": [{"address": f"127.0.0.1:{p}", "tls_server_name": name}
                    for p, name in zip(party_ports, ("alice", "bob", "carol"), strict=True)],
        "tls": {"ca_cert": "tls/ca.pem", "client_cert": "tls/gateway.pem",
                "client_key": str(state / "keys" / "gateway.key")},
        "https_cert": "tls/https.pem",
        "https_key": str(state / "keys" / "https.key"),
        "tokens": cfg,
    }
    path = root / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def _serve(config: Path, port_file: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "ppfs_cli", "gateway", "serve", "--config", str(config),
             "--make-keys", "--port", "0", "--port-file", str(port_file)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def _private_keys_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file() and b"PRIVATE KEY" in p.read_bytes()]


def test_gateway_makes_its_keys_and_the_ca_certifies_them_without_holding_them(
    tmp_path: Path,
) -> None:
    dep = Deployment.create(tmp_path / "deployment")
    ca_dir = tmp_path / "ca"
    save_ca(dep.ca, ca_dir)
    cfg, by = tokens(("admin", "admin"))

    async def parties() -> tuple[list[asyncio.subprocess.Process], list[int]]:
        procs, ports = [], []
        for s in dep.settings:
            proc, port = await spawn_party(s, tmp_path / f"party{s.index}.log")
            procs.append(proc)
            ports.append(port)
        return procs, ports

    loop = asyncio.new_event_loop()
    procs, ports = loop.run_until_complete(parties())
    gw = tmp_path / "gateway"
    config = _gateway_config(gw, ports, dep.ca.cert_pem(), cfg)
    state = gw / "state"
    port_file, log = tmp_path / "gateway.port", tmp_path / "gateway.log"
    gateway: subprocess.Popen[bytes] | None = None
    try:
        # first start: keys made, requests written, and it says what to have signed
        first = _serve(config, port_file, log)
        assert first.wait(60) == 2
        said = log.read_text()
        assert "waiting for certificates" in said
        assert str(state / "csr" / "client.csr") in said
        assert str(state / "csr" / "https.csr") in said
        assert "PRIVATE KEY" not in said
        for key in ("gateway.key", "https.key"):
            mode = (state / "keys" / key).stat().st_mode
            assert stat.S_IMODE(mode) == 0o600
        keys_before = {k: (state / "keys" / k).read_bytes() for k in ("gateway.key", "https.key")}

        # the operator's side: signs the requests; no private key reaches its folders
        out = tmp_path / "signed"
        r = _ppfs("pki", "client", "--ca-dir", str(ca_dir), "--name", "gateway",
                  "--csr", str(state / "csr" / "client.csr"), "--out", str(out))
        assert r.returncode == 0, r.stderr
        r = _ppfs("pki", "https", "--ca-dir", str(ca_dir), "--name", "127.0.0.1",
                  "--name", "localhost", "--csr", str(state / "csr" / "https.csr"),
                  "--out", str(out))
        assert r.returncode == 0, r.stderr
        assert _private_keys_under(out) == []
        client_cert = x509.load_pem_x509_certificate((out / "gateway.pem").read_bytes())
        assert has_gateway_usage(client_cert)
        assert client_cert.subject.rfc4514_string() == "CN=gateway"
        for name in ("gateway.pem", "https.pem"):
            (gw / "tls" / name).write_bytes((out / name).read_bytes())
        assert _private_keys_under(gw / "tls") == []

        # second start: the same keys, now certified; every party accepts the identity
        gateway = _serve(config, port_file, log)
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert gateway.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.05)
        assert {k: (state / "keys" / k).read_bytes() for k in keys_before} == keys_before
        url = f"https://127.0.0.1:{int(port_file.read_text())}"
        trust = ssl.create_default_context(cafile=str(gw / "tls" / "ca.pem"))
        resp = httpx.get(url + "/v1/deployment", verify=trust,
                         headers={"Authorization": f"Bearer {by['admin']}"}, timeout=60)
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["parties"]) == 3
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        async def stop() -> None:
            for proc in procs:
                proc.terminate()
            await asyncio.gather(*(p.wait() for p in procs))

        loop.run_until_complete(stop())
        loop.close()


def _request(key: ec.EllipticCurvePrivateKey, cn: str) -> x509.CertificateSigningRequest:
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .sign(key, hashes.SHA256()))


def _pem(csr: x509.CertificateSigningRequest) -> bytes:
    return csr.public_bytes(serialization.Encoding.PEM)


def _forged_request() -> bytes:
    """A request naming one key, signed by another: its signature does not hold."""
    mine, theirs = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    der = _request(mine, "gateway").public_bytes(serialization.Encoding.DER)
    point = (serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    a, b = mine.public_key().public_bytes(*point), theirs.public_key().public_bytes(*point)
    assert der.count(a) == 1
    forged = x509.load_der_x509_csr(der.replace(a, b))
    assert not forged.is_signature_valid
    return _pem(forged)


@pytest.mark.parametrize("case", ["forged", "link", "party-name", "not-a-request"])
def test_ca_signs_a_gateway_request_only_when_it_holds(tmp_path: Path, case: str) -> None:
    ca_dir = tmp_path / "ca"
    assert _ppfs("pki", "init", "--ca-dir", str(ca_dir)).returncode == 0
    request, name = tmp_path / "client.csr", "gateway"
    genuine = _pem(_request(ec.generate_private_key(ec.SECP256R1()), "gateway"))
    if case == "forged":
        request.write_bytes(_forged_request())
    elif case == "link":
        (tmp_path / "elsewhere.csr").write_bytes(genuine)
        request.symlink_to(tmp_path / "elsewhere.csr")
    elif case == "party-name":
        request.write_bytes(genuine)
        name = "MPyC party 0"
    else:
        request.write_bytes(b"-----BEGIN CERTIFICATE REQUEST-----\nnonsense\n")
    out = tmp_path / "out"
    for command in (["client", "--name", name], ["https", "--name", "gw.example"]):
        if case == "party-name" and command[0] == "https":
            continue  # an HTTPS name is a host name: the MPC peer checks never see it
        r = _ppfs("pki", *command, "--ca-dir", str(ca_dir), "--csr", str(request),
                  "--out", str(out))
        assert r.returncode == 2, (case, command, r.stderr)
        assert "error" in r.stderr and "Traceback" not in r.stderr
        assert not any(out.glob("*.pem")), "nothing is signed"
    # the genuine request is signed, with the CA's name and usages, not the request's
    request.unlink()
    request.write_bytes(_pem(_request(ec.generate_private_key(ec.SECP256R1()), "alice")))
    r = _ppfs("pki", "client", "--ca-dir", str(ca_dir), "--csr", str(request), "--out", str(out))
    assert r.returncode == 0, r.stderr
    cert = x509.load_pem_x509_certificate((out / "gateway.pem").read_bytes())
    assert cert.subject.rfc4514_string() == "CN=gateway"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert GATEWAY_CONTROL_USAGE in eku


def test_gateway_refuses_a_certificate_for_another_key(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    assert _ppfs("pki", "init", "--ca-dir", str(ca_dir)).returncode == 0
    cfg, _ = tokens(("admin", "admin"))
    gw = tmp_path / "gateway"
    config = _gateway_config(gw, [1, 2, 3], (ca_dir / "ca.pem").read_bytes(), cfg)
    first = _serve(config, tmp_path / "port", tmp_path / "first.log")
    assert first.wait(60) == 2
    # certificates for keys made elsewhere (say, an old pair left in the folder)
    other = tmp_path / "other.csr"
    other.write_bytes(_pem(_request(ec.generate_private_key(ec.SECP256R1()), "gateway")))
    assert _ppfs("pki", "client", "--ca-dir", str(ca_dir), "--csr", str(other),
                 "--out", str(gw / "tls")).returncode == 0
    assert _ppfs("pki", "https", "--ca-dir", str(ca_dir), "--csr", str(other), "--name",
                 "127.0.0.1", "--out", str(gw / "tls")).returncode == 0
    second = _serve(config, tmp_path / "port", tmp_path / "second.log")
    assert second.wait(60) == 2
    said = (tmp_path / "second.log").read_text()
    assert f"{gw / 'tls' / 'gateway.pem'} certifies another key" in said
    assert "Traceback" not in said
    assert not os.path.exists(tmp_path / "port")


def test_make_secrets_leaves_the_gateways_keys_to_its_host(tmp_path: Path) -> None:
    """`make-secrets.sh --no-party-keys --no-gateway-keys` (machines of their own): the
    gateway's folder holds its configuration, tokens and the CA certificate, no private
    key; its config names keys in its own state directory (made there by --make-keys)."""
    out = tmp_path / "secrets"
    r = subprocess.run(
        [sys.executable, str(Path(__file__).parents[1] / "deploy" / "compose" / "make_secrets.py"),
         "--out", str(out), "--no-party-keys", "--no-gateway-keys", "--https-name",
         "gw.example", *(a for h in ("10.0.0.1", "10.0.0.2", "10.0.0.3")
                         for a in ("--party-host", h))],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _private_keys_under(out / "gateway") == []
    assert [p.name for p in (out / "gateway" / "tls").iterdir()] == ["ca.pem"]
    config = json.loads((out / "gateway" / "gateway.json").read_text())
    state = Path(config["state_dir"])
    assert Path(config["tls"]["client_key"]).parent == state / "keys"
    assert Path(config["https_key"]).parent == state / "keys"
    assert (config["tls"]["client_cert"], config["https_cert"]) == ("tls/gateway.pem",
                                                                     "tls/https.pem")
