"""Certificates and key statements end, and are renewed without losing anything.

What the deployment CA signs ends (`--valid-days`); each party refuses to start once
anything it presents has ended, naming the file and the command that renews it, reports
what ends soon, and picks a renewal (`ppfs pki sign` again) up while it runs, refusing
a renewed certificate that does not hold together. The gateway does the same for its own
certificates, and its deployment status shows every party's end.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from party_harness import Deployment
from ppfs_party.keys import sign_party_requests
from ppfs_party.lifetimes import CertificateExpiredError
from ppfs_party.server import start_party_server
from service_fakes import RealCluster, make_stack, owner_table, run_cli, wait_until

from ppfs.keycert import KeyStatement, TrustAnchor, UntrustedPartyKey, verify_party_keys
from ppfs.pki import (
    CertificateAuthority,
    certificate_end,
    certify_party_key_request,
    issue_client_identity,
    load_ca,
    party_key_and_csr,
    replace_public_file,
    save_ca,
    write_cert,
)
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2, party_pb2_grpc

DAY = dt.timedelta(days=1)


def _ppfs(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppfs_cli", *argv], capture_output=True,
                          text=True, timeout=120)


def _presented_certificate(dep: Deployment, index: int, port: int) -> x509.Certificate:
    """The control-plane certificate the party shows a new connection (the gateway's
    client identity offered, as the party requires)."""
    gw = dep.root / "gateway"
    ctx = ssl.create_default_context(cadata=dep.ca.cert_pem().decode())
    ctx.load_cert_chain(gw / "gateway.pem", gw / "gateway.key")
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=dep.settings[index].control_name) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _spki(cert: x509.Certificate) -> bytes:
    return cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)


def _deployment(tmp_path: Path) -> Deployment:
    dep = Deployment.create(tmp_path, parties=3, engines=("mpyc",))
    gw = tmp_path / "gateway"
    (gw / "gateway.pem").write_bytes(dep.client_cert)
    return dep


def test_the_ca_and_what_it_signs_end_as_the_operator_says(tmp_path: Path) -> None:
    ca_dir, state = tmp_path / "ca", tmp_path / "alice"
    r = _ppfs("pki", "init", "--ca-dir", str(ca_dir), "--valid-days", "30")
    assert r.returncode == 0, r.stderr
    ca = load_ca(ca_dir)
    assert ca.cert.not_valid_after_utc - dt.datetime.now(dt.UTC) < 30 * DAY + dt.timedelta(
        minutes=1)
    assert _ppfs("party", "init", "--state-dir", str(state), "--index", "0").returncode == 0
    # a year asked for, but nothing outlives the CA
    r = _ppfs("pki", "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state), "--party",
              "alice", "--valid-days", "365")
    assert r.returncode == 0, r.stderr
    assert "valid until" in r.stdout
    for name in ("control", "mpc-mpyc"):
        end = certificate_end((state / "certs" / f"{name}.pem").read_bytes())
        assert end <= ca.cert.not_valid_after_utc
    statement = KeyStatement.from_bytes((state / "certs" / "party-keys.json").read_bytes())
    assert statement.end <= ca.cert.not_valid_after_utc
    # the default is ten years for the CA, one for what it signs
    r = _ppfs("pki", "init", "--ca-dir", str(tmp_path / "ca10"))
    assert r.returncode == 0, r.stderr
    ten = load_ca(tmp_path / "ca10").cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    assert 3649 * DAY < ten <= 3650 * DAY
    # a validity that is no number of days is refused, naming it
    for bad in ("0", "-3", "1.5", "forever"):
        r = _ppfs("pki", "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
                  "--party", "alice", "--valid-days", bad)
        assert r.returncode == 2 and "--valid-days" in r.stderr and bad in r.stderr


def test_an_ended_ca_signs_nothing(tmp_path: Path) -> None:
    ca = CertificateAuthority.create(validity=dt.timedelta(seconds=1))
    save_ca(ca, tmp_path / "ca")
    state = tmp_path / "bob"
    assert _ppfs("party", "init", "--state-dir", str(state), "--index", "1").returncode == 0
    time.sleep(1.5)
    r = _ppfs("pki", "sign", "--ca-dir", str(tmp_path / "ca"), "--state-dir", str(state),
              "--party", "bob")
    assert r.returncode == 2
    assert "the deployment CA expired on" in r.stderr and "new trust anchor" in r.stderr
    assert not (state / "certs" / "control.pem").exists()


def test_a_party_refuses_to_start_once_a_certificate_ended_and_starts_once_renewed(
    tmp_path: Path,
) -> None:
    ca_dir, state = tmp_path / "ca", tmp_path / "carol"
    save_ca(CertificateAuthority.create(), ca_dir)
    assert _ppfs("party", "init", "--state-dir", str(state), "--index", "2").returncode == 0
    sign_party_requests(load_ca(ca_dir), state, 2, validity=dt.timedelta(seconds=1))
    time.sleep(1.5)
    serve = ["party", "serve", "--state-dir", str(state), "--index", "2", "--listen",
             "127.0.0.1:0", "--engine", "mpyc", "--port-file", str(tmp_path / "port")]
    r = _ppfs(*serve)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "control.pem: its control-plane certificate expired on" in lines[0]
    assert f"ppfs pki sign --ca-dir CA --state-dir {state} --party Carol" in lines[0]
    assert not (tmp_path / "port").exists()
    # renewed from the same requests: the keys stay, the party starts
    box_before = (state / "keys" / "box.key").read_bytes()
    r = _ppfs("pki", "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state), "--party",
              "carol")
    assert r.returncode == 0, r.stderr
    assert (state / "keys" / "box.key").read_bytes() == box_before
    proc = subprocess.Popen([sys.executable, "-m", "ppfs_cli", *serve],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "port").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(20)


def test_a_running_party_takes_a_renewal_and_refuses_a_forged_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    asyncio.run(_renewal_while_running(tmp_path, caplog))


async def _renewal_while_running(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dep = _deployment(tmp_path)
    alice = dep.settings[0]
    # ten days left: reported at start, in the log and the metrics
    sign_party_requests(dep.ca, alice.state_dir, 0, validity=10 * DAY)
    caplog.set_level(logging.INFO, logger="ppfs.party")
    server = await start_party_server(alice)
    try:
        assert "control-plane certificate expires on" in caplog.text
        assert "(in 9 days)" in caplog.text or "(in 10 days)" in caplog.text
        gauge = server.state.metrics.registry.get_sample_value(
            "ppfs_party_certificate_expiry_timestamp_seconds", {"certificate": "control"})
        first = await asyncio.to_thread(_presented_certificate, dep, 0, server.port)
        assert gauge == pytest.approx(first.not_valid_after_utc.timestamp())
        assert first.not_valid_after_utc - dt.datetime.now(dt.UTC) <= 10 * DAY

        # the operator renews: the next connection sees the new certificate, the key
        # statement served is the new one, no restart
        caplog.clear()
        sign_party_requests(dep.ca, alice.state_dir, 0)
        renewed = await asyncio.to_thread(_presented_certificate, dep, 0, server.port)
        assert renewed.not_valid_after_utc - dt.datetime.now(dt.UTC) > 300 * DAY
        assert "a renewed control-plane certificate is in use" in caplog.text
        async with dep.channel(0, server.port) as ch:
            ident = await party_pb2_grpc.PartyServiceStub(ch).GetIdentity(
                party_pb2.GetIdentityRequest(), timeout=10)
        st = verify_party_keys(
            TrustAnchor.from_pem(dep.ca.cert_pem()), index=0, name="Alice",
            box_public_key=ident.box_public_key, signing_public_key=ident.signing_public_key,
            statement=ident.key_statement, signature=ident.key_statement_signature)
        assert st.end - dt.datetime.now(dt.UTC) > 300 * DAY

        # a "renewal" signed by another CA (someone with write access to certs/ but not
        # the deployment CA's key) is not taken: the certificate in use stays
        caplog.clear()
        rogue = CertificateAuthority.create("rogue CA")
        sign_party_requests(rogue, alice.state_dir, 0)
        kept = await asyncio.to_thread(_presented_certificate, dep, 0, server.port)
        assert kept == renewed
        assert "is not taken" in caplog.text and "another CA" in caplog.text
        # and a certificate for another key neither
        caplog.clear()
        sign_party_requests(dep.ca, alice.state_dir, 0)  # the genuine one back
        await asyncio.to_thread(_presented_certificate, dep, 0, server.port)
        other = dep.ca.issue(party_key_and_csr(tmp_path / "other.key", "alice"))
        write_cert(alice.state_dir / "certs" / "control.pem", other)
        still = await asyncio.to_thread(_presented_certificate, dep, 0, server.port)
        assert _spki(still) != _spki(other)
        assert "certifies another key" in caplog.text
    finally:
        await server.stop(0)


def test_a_party_with_an_ended_key_statement_does_not_start(tmp_path: Path) -> None:
    dep = _deployment(tmp_path)
    bob = dep.settings[1]
    sign_party_requests(dep.ca, bob.state_dir, 1)
    # only the statement ends (its own validity); the certificates are fresh
    blob, sig = certify_party_key_request(dep.ca, bob.state_dir / "csr" / "party-keys.json", 1,
                                          dt.timedelta(seconds=1))
    replace_public_file(bob.state_dir / "certs" / "party-keys.sig", sig)
    replace_public_file(bob.state_dir / "certs" / "party-keys.json", blob)
    # a statement states its end to the second, and a client reads it as valid through
    # that whole second: two seconds on, it has ended for the party and the client alike
    time.sleep(2.1)
    with pytest.raises(CertificateExpiredError, match=r"party-keys\.json: its key statement "
                                                      r"expired on .*ppfs pki sign"):
        asyncio.run(start_party_server(bob))
    # and a client told about it names the renewal
    box = PrivateKey((bob.state_dir / "keys" / "box.key").read_bytes())
    signing = SigningKey((bob.state_dir / "keys" / "signing.key").read_bytes())
    with pytest.raises(UntrustedPartyKey, match=r"not now: .*renews it .*ppfs pki sign"):
        verify_party_keys(TrustAnchor.from_pem(dep.ca.cert_pem()), index=1, name="Bob",
                          box_public_key=bytes(box.public_key),
                          signing_public_key=bytes(signing.verify_key),
                          statement=blob, signature=sig)


def test_the_deployment_status_shows_every_end_and_warns_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = RealCluster(3, tmp_path, ("mpyc",))
    # Bob's certificates end in 5 days; the gateway's client identity in 3
    sign_party_requests(cluster.dep.ca, cluster.dep.settings[1].state_dir, 1,
                        validity=5 * DAY)
    key, cert = issue_client_identity(cluster.dep.ca, "gateway",
                                      tmp_path / "gw-short" / "gateway.key", validity=3 * DAY)
    (cluster.tls_dir / "gateway.pem").write_bytes(cert)
    (cluster.tls_dir / "gateway.key").write_bytes(key)
    stack = make_stack(tmp_path, cluster=cluster)
    try:
        r = httpx.get(stack.gateway.url + "/v1/deployment/status",
                      headers={"Authorization": f"Bearer {stack.token['admin']}"}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        parties = {p["name"]: p for p in body["parties"]}
        assert body["healthy"] is True  # ending soon is a warning, not a fault
        now = dt.datetime.now(dt.UTC)
        bob_end = dt.datetime.fromisoformat(parties["Bob"]["certificates_end"])
        assert dt.timedelta(days=4) < bob_end - now <= 5 * DAY
        assert any("expires on" in w and "ppfs pki sign" in w
                   for w in parties["Bob"]["warnings"])
        assert parties["Alice"]["warnings"] == [] and parties["Carol"]["warnings"] == []
        alice_end = dt.datetime.fromisoformat(parties["Alice"]["certificates_end"])
        assert alice_end - now > 300 * DAY
        assert len(body["warnings"]) == 1
        assert "client identity certificate expires on" in body["warnings"][0]
        assert "ppfs pki client" in body["warnings"][0]

        # a client sees each party's checked end, and a warning for Bob's
        rc, out, err = run_cli(capsys, stack, "analyst-1", "deployment")
        assert rc == 0, err
        until = {line.split()[1]: line.rsplit(" ", 1)[-1] for line in out.splitlines()
                 if "keys certified until" in line}
        assert until["Bob"] == f"{bob_end:%Y-%m-%d}"
        assert until["Alice"] == f"{alice_end:%Y-%m-%d}"
        (warning,) = err.strip().splitlines()
        assert warning.startswith("ppfs: warning: Bob's key certificate ends on")
        assert "ppfs pki sign" in warning
    finally:
        stack.close()


def test_a_gateway_whose_certificate_ended_does_not_start(tmp_path: Path) -> None:
    from ppfs_gateway.commands import check_keys
    from ppfs_gateway.core.config import Settings

    ca = CertificateAuthority.create()
    _, cert = issue_client_identity(ca, "gateway", tmp_path / "gw" / "gateway.key",
                                      validity=dt.timedelta(seconds=1))
    (tmp_path / "gw" / "gateway.pem").write_bytes(cert)
    (tmp_path / "gw" / "ca.pem").write_bytes(ca.cert_pem())
    settings = Settings.model_validate({
        "state_dir": str(tmp_path / "state"),
        "parties": [{"address": f"127.0.0.1:{50000 + i}", "tls_server_name": n}
                    for i, n in enumerate(("alice", "bob", "carol"))],
        "tls": {"ca_cert": str(tmp_path / "gw" / "ca.pem"),
                "client_cert": str(tmp_path / "gw" / "gateway.pem"),
                "client_key": str(tmp_path / "gw" / "gateway.key")},
        "tokens": [{"token": "t" * 32, "role": "admin", "subject": "admin"}],
    })
    assert check_keys(settings, make_keys=False) is None
    time.sleep(1.5)
    problem = check_keys(settings, make_keys=False)
    assert problem is not None
    assert "gateway.pem: the certificate expired on" in problem and "ppfs pki client" in problem


def test_a_renewal_reaches_clients_through_the_gateway_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ppfs_gateway.parties

    monkeypatch.setattr(ppfs_gateway.parties, "IDENTITY_REFRESH_SECONDS", 0.2)
    cluster = RealCluster(3, tmp_path, ("mpyc",))
    bob = cluster.dep.settings[1].state_dir
    sign_party_requests(cluster.dep.ca, bob, 1, validity=5 * DAY)
    stack = make_stack(tmp_path, cluster=cluster)
    try:
        client = stack.client("owner-a")

        def bobs_end() -> dt.datetime | None:
            return client.deployment().parties[1].keys_valid_until

        short = bobs_end()
        assert short is not None and short - dt.datetime.now(dt.UTC) <= 5 * DAY
        sign_party_requests(cluster.dep.ca, bob, 1)  # the operator renews Bob
        wait_until(lambda: (bobs_end() or short) - short > 300 * DAY, timeout=20)
        # and an upload seals to Bob's keys, checked against the renewed statement
        ds = client.create_dataset("study")["id"]
        client.upload_table(stack.keys["owner-a"], owner_table(make_table(8, 2, seed=1)), ds)
        assert client.check_dataset(ds)["consistent"]
    finally:
        stack.close()
