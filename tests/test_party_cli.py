"""`ppfs pki` and `ppfs party` commands: CA, keys and CSRs, signing, owners, serving."""

from __future__ import annotations

import asyncio
import json
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from nacl.signing import SigningKey
from ppfs_cli.main import main
from ppfs_party.config import PartySettings
from ppfs_party.server import start_party_server

from ppfs.v1 import party_pb2, party_pb2_grpc


def test_ca_csr_flow_then_serve(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ca, state, gw = tmp_path / "ca", tmp_path / "carol", tmp_path / "gateway"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 2  # never overwrite a CA
    capsys.readouterr()
    assert main(["party", "init", "--state-dir", str(state), "--index", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["party"] == "Carol" and len(bytes.fromhex(out["box_public_key"])) == 32
    for key in (state / "keys").iterdir():  # private keys: owner only
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not (state / "certs").exists()  # nothing signed yet
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state),
                 "--party", "carol"]) == 0
    assert (state / "certs" / "control.pem").is_file() and (state / "certs" / "ca.pem").is_file()
    assert not list((state / "certs").glob("*.key"))
    gw.mkdir()
    assert main(["pki", "client", "--ca-dir", str(ca), "--name", "gateway",
                 "--out", str(gw)]) == 0
    owner = SigningKey.generate()
    assert main(["party", "add-owner", "--state-dir", str(state), "--owner-id", "h1",
                 "--public-key", bytes(owner.verify_key).hex()]) == 0
    assert json.loads((state / "owners.json").read_text()) == {
        "h1": bytes(owner.verify_key).hex()}

    async def scenario() -> None:
        srv = await start_party_server(
            PartySettings(state_dir=state, index=2, engines=("mpyc",)))
        try:
            creds = grpc.ssl_channel_credentials(
                root_certificates=(gw / "ca.pem").read_bytes(),
                private_key=(gw / "gateway.key").read_bytes(),
                certificate_chain=(gw / "gateway.pem").read_bytes(),
            )
            async with grpc.aio.secure_channel(
                f"127.0.0.1:{srv.port}", creds,
                options=[("grpc.ssl_target_name_override", "carol")],
            ) as ch:
                ident = await party_pb2_grpc.PartyServiceStub(ch).GetIdentity(
                    party_pb2.GetIdentityRequest())
                assert ident.name == "Carol"
                assert ident.box_public_key.hex() == out["box_public_key"]
        finally:
            await srv.stop(0)

    asyncio.run(scenario())



def test_relative_state_dir_is_fixed_where_the_daemon_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `ppfs party serve --state-dir alice` (and `ppfs up`'s default .ppfs): the engines
    # run each party with its job's directory as cwd, so the daemon's paths are made
    # absolute once, when its settings are read
    monkeypatch.chdir(tmp_path)
    here = Path.cwd()
    s = PartySettings(state_dir=Path("alice"), index=0, mpspdz_cache=Path("cache"))
    assert s.state_dir == here / "alice" and s.mpspdz_cache == here / "cache"
    monkeypatch.chdir("/")
    assert replace(s, index=1).state_dir == here / "alice"

def test_pki_sign_certifies_only_the_party_it_is_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Corrupted Carol rewrites her requests to claim Alice's index, name and
    certificate names (control, P0, MPyC party 0), or adds a request named "gateway":
    `ppfs pki sign --party carol` refuses each, naming the mismatch, and signs nothing.
    The operator must say whom it certifies; her honest requests are signed and the
    output says what for."""
    import shutil

    from cryptography.hazmat.primitives import serialization

    from ppfs.keycert import KeyStatement
    from ppfs.pki import party_key_and_csr

    ca, state = tmp_path / "ca", tmp_path / "carol"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    assert main(["party", "init", "--state-dir", str(state), "--index", "2"]) == 0
    pristine = tmp_path / "pristine-csr"
    shutil.copytree(state / "csr", pristine)
    keys = json.loads((pristine / "party-keys.json").read_text())
    capsys.readouterr()

    def as_alice(d: dict[str, object]) -> None:
        d.update(index=0, name="Alice")

    def csr(name: str, cn: str) -> None:
        req = party_key_and_csr(tmp_path / "evil" / f"{name}.key", cn)
        (state / "csr" / f"{name}.csr").write_bytes(req.public_bytes(serialization.Encoding.PEM))

    def key_request(change: Any) -> None:
        d = dict(keys)
        change(d)
        (state / "csr" / "party-keys.json").write_text(json.dumps(d))

    cases: dict[str, tuple[Any, list[str], str]] = {
        "key request for Alice": (lambda: key_request(as_alice), [],
                                  "for Alice (index 0), not for Carol (index 2)"),
        "key request named Alice": (lambda: key_request(lambda d: d.update(name="Alice")),
                                    [], "names 'Alice', not Carol (index 2)"),
        "control CN alice": (lambda: csr("control", "alice"), [], "asks for 'alice'"),
        "control CN gateway": (lambda: csr("control", "gateway"), [], "asks for 'gateway'"),
        "MP-SPDZ CN P0": (lambda: csr("mpc-mp-spdz", "P0"), [], "asks for 'P0'"),
        "MPyC CN party 0": (lambda: csr("mpc-mpyc", "MPyC party 0"), [],
                            "asks for 'MPyC party 0'"),
        "extra request": (lambda: csr("gateway", "gateway"), [], "not a request a party makes"),
        "signed as alice": (lambda: None, ["--party", "alice"], "asks for 'carol'"),
        "control name of Alice": (lambda: None, ["--tls-name", "alice"], "is Alice's (index 0)"),
        "control name gateway": (lambda: None, ["--tls-name", "gateway"], "the gateway's name"),
    }
    for name, (tamper, extra, expected) in cases.items():
        shutil.rmtree(state / "csr")
        shutil.copytree(pristine, state / "csr")
        tamper()
        argv = ["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state)]
        argv += extra if "--party" in extra else ["--party", "carol", *extra]
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        assert expected in err, (name, err)
        assert not (state / "certs").exists(), name  # nothing signed

    with pytest.raises(SystemExit):  # the operator must say whom it certifies
        main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state)])
    capsys.readouterr()
    shutil.rmtree(state / "csr")
    shutil.copytree(pristine, state / "csr")
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state),
                 "--party", "2"]) == 0
    out = capsys.readouterr().out
    assert "signed Carol (index 2): control CN=carol" in out
    assert "signed Carol (index 2): party-keys key statement" in out
    st = KeyStatement.from_bytes((state / "certs" / "party-keys.json").read_bytes())
    assert (st.index, st.name) == (2, "Carol")
    assert st.box_public_key == keys["box_public_key"]


def test_pki_sign_never_reads_or_writes_through_links(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Corrupted Bob hands the operator his state directory with links planted in it:
    a `certs/control.pem` pointing at the CA's key or at another file of the operator,
    `certs` or `csr` themselves links, a request read through a link, a folder where a
    certificate goes. `ppfs pki sign` refuses each, naming it, signs nothing and leaves
    every target as it was; signed honestly, every output is a regular file of its own,
    and a link found where one goes is replaced, never written through."""
    import os
    import shutil

    from ppfs.pki import load_ca, write_cert

    ca, state = tmp_path / "ca", tmp_path / "bob"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    assert main(["party", "init", "--state-dir", str(state), "--index", "1"]) == 0
    ca_key = (ca / "ca.key").read_bytes()
    victim = tmp_path / "operator" / "authorized_keys"
    victim.parent.mkdir()
    victim.write_text("the operator's file\n")
    pristine = tmp_path / "pristine-csr"
    shutil.copytree(state / "csr", pristine)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(state / "csr", elsewhere)
    capsys.readouterr()

    def plant(rel: str, target: Path) -> None:
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).symlink_to(target)

    def swap_csr_dir() -> None:
        shutil.rmtree(state / "csr")
        plant("csr", elsewhere)

    def swap_request(name: str) -> None:
        (state / "csr" / name).unlink()
        plant(f"csr/{name}", elsewhere / name)

    cases: dict[str, tuple[Any, str]] = {
        "certs/control.pem -> ca.key": (lambda: plant("certs/control.pem", ca / "ca.key"),
                                        "control.pem: a symbolic link"),
        "certs/mpc-mpyc.pem -> a file": (lambda: plant("certs/mpc-mpyc.pem", victim),
                                         "mpc-mpyc.pem: a symbolic link"),
        "certs/ca.pem -> ca.pem": (lambda: plant("certs/ca.pem", ca / "ca.pem"),
                                   "ca.pem: a symbolic link"),
        "key statement -> a file": (lambda: plant("certs/party-keys.sig", victim),
                                    "party-keys.sig: a symbolic link"),
        "certs -> the CA's folder": (lambda: plant("certs", ca), "certs: a symbolic link"),
        "certs a file": (lambda: (state / "certs").write_text("x"), "certs: not a folder"),
        "certs/control.pem a folder": (lambda: (state / "certs" / "control.pem").mkdir(
            parents=True), "control.pem: not a regular file"),
        "csr -> elsewhere": (swap_csr_dir, "csr: a symbolic link"),
        "csr/control.csr -> elsewhere": (lambda: swap_request("control.csr"),
                                         "control.csr: a symbolic link"),
        "key request -> elsewhere": (lambda: swap_request("party-keys.json"),
                                     "party-keys.json: a symbolic link"),
    }
    def fresh_requests() -> None:
        for sub in ("csr", "certs"):
            if (state / sub).is_symlink() or (state / sub).is_file():
                (state / sub).unlink()
            elif (state / sub).exists():
                shutil.rmtree(state / sub)
        shutil.copytree(pristine, state / "csr")

    for name, (tamper, expected) in cases.items():
        fresh_requests()
        tamper()
        assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state),
                     "--party", "bob"]) == 2, name
        err = capsys.readouterr().err
        assert expected in err and "nothing signed" in err, (name, err)
        assert (ca / "ca.key").read_bytes() == ca_key, name
        assert victim.read_text() == "the operator's file\n", name
        certs = state / "certs"
        if certs.is_dir() and not certs.is_symlink():  # nothing signed
            assert not [p for p in certs.iterdir() if p.is_file() and not p.is_symlink()], name
    assert sorted(p.name for p in ca.iterdir()) == ["ca.key", "ca.pem"]

    fresh_requests()
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state),
                 "--party", "bob"]) == 0
    for p in (state / "certs").iterdir():
        assert p.is_file() and not p.is_symlink(), p
        assert stat.S_IMODE(p.stat().st_mode) & 0o133 == 0, p  # at most 0644
    assert not list((state / "certs").glob(".*.tmp"))
    # a link that appears where an output goes is replaced, its target left alone
    link = tmp_path / "out" / "cert.pem"
    link.parent.mkdir()
    link.symlink_to(ca / "ca.key")
    write_cert(link, load_ca(ca).cert)
    assert not link.is_symlink() and link.read_bytes() == (ca / "ca.pem").read_bytes()
    assert (ca / "ca.key").read_bytes() == ca_key
    assert os.listdir(link.parent) == ["cert.pem"]


def test_pki_client_refuses_a_partys_certificate_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway's client identity under a party's engine name (`MPyC party 0`, `P0`)
    would pass the MPC peer checks as that party, and under its control name as its
    control plane: `ppfs pki client` refuses every party's certificate name, case and
    white space folded, and issues nothing; the gateway's own names are issued."""
    ca, out = tmp_path / "ca", tmp_path / "gw"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    capsys.readouterr()
    for name, owner in (("MPyC party 0", "Alice's (index 0)"), ("P0", "Alice's (index 0)"),
                        ("p2", "Carol's (index 2)"), ("  mpyc   PARTY 1 ", "Bob's (index 1)"),
                        ("alice", "Alice's (index 0)"), ("Dave", "Dave's (index 3)"),
                        ("MPYC PARTY 3", "Dave's (index 3)")):
        assert main(["pki", "client", "--ca-dir", str(ca), "--name", name,
                     "--out", str(out)]) == 2, name
        err = capsys.readouterr().err
        assert owner in err and "nothing issued" in err, (name, err)
        assert not out.exists(), name
    assert main(["pki", "client", "--ca-dir", str(ca), "--name", "", "--out", str(out)]) == 2
    assert "must not be empty" in capsys.readouterr().err
    for name in ("gateway", "gateway-2", "P10-relay"):
        assert main(["pki", "client", "--ca-dir", str(ca), "--name", name,
                     "--out", str(out)]) == 0, name
        assert (out / f"{name}.pem").is_file() and (out / f"{name}.key").is_file()


def test_party_refuses_to_start_on_another_partys_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Alice's state directory started as Bob (`--index 1`): the key request, the key
    statement and the certificates there name Alice, so the daemon refuses to start,
    naming both in one line (exit 2, as other start-up errors), and leaves the key
    request claiming Alice; likewise a control certificate for another name than
    `--tls-name`. Started as Alice, it starts."""
    import shutil
    import subprocess
    import sys

    from ppfs_party.errors import WrongPartyStateError
    from ppfs_party.state import open_state

    ca, alice = tmp_path / "ca", tmp_path / "alice"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    assert main(["party", "init", "--state-dir", str(alice), "--index", "0"]) == 0
    request = (alice / "csr" / "party-keys.json").read_bytes()
    capsys.readouterr()

    # only the key request (before signing): `party init` as Bob is refused
    assert main(["party", "init", "--state-dir", str(alice), "--index", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "key request" in err and "'Alice' (index 0)" in err and "Bob (index 1)" in err
    assert (alice / "csr" / "party-keys.json").read_bytes() == request

    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(alice),
                 "--party", "alice"]) == 0
    capsys.readouterr()
    port_file = tmp_path / "port"
    served = subprocess.run(
        [sys.executable, "-m", "ppfs_party", "serve", "--state-dir", str(alice),
         "--index", "1", "--listen", "127.0.0.1:0", "--engine", "mpyc",
         "--port-file", str(port_file)],
        capture_output=True, text=True, timeout=60)
    assert served.returncode == 2, served.stderr
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppfs party serve: error:"), served.stderr
    assert "'Alice' (index 0)" in lines[0] and "Bob (index 1)" in lines[0]
    assert not port_file.exists()
    assert (alice / "csr" / "party-keys.json").read_bytes() == request

    # the key request and statement gone: Alice's certificates still name her
    bare = tmp_path / "bare"
    shutil.copytree(alice, bare)
    (bare / "csr" / "party-keys.json").unlink()
    (bare / "certs" / "party-keys.json").unlink()
    with pytest.raises(WrongPartyStateError, match=r"'alice', Alice's \(index 0\).*Bob"):
        open_state(PartySettings(state_dir=bare, index=1, engines=("mpyc",)))
    assert not (bare / "csr" / "party-keys.json").exists()  # nothing written
    # the statement alone
    (bare / "certs" / "party-keys.json").write_bytes(
        (alice / "certs" / "party-keys.json").read_bytes())
    for f in ("control.pem", "mpc-mpyc.pem", "mpc-mp-spdz.pem"):
        (bare / "certs" / f).unlink(missing_ok=True)
    with pytest.raises(WrongPartyStateError, match=r"key statement.*'Alice' \(index 0\)"):
        open_state(PartySettings(state_dir=bare, index=1, engines=("mpyc",)))
    # Alice's own state under another control name than her certificate's
    with pytest.raises(WrongPartyStateError, match=r"'alice'.*not 'alice\.example' \(--tls"):
        open_state(PartySettings(state_dir=alice, index=0, tls_name="alice.example",
                                 engines=("mpyc",)))
    state = open_state(PartySettings(state_dir=alice, index=0, engines=("mpyc",)))
    assert state.settings.name == "Alice"
    assert (alice / "csr" / "party-keys.json").read_bytes() == request


def test_party_refuses_a_key_statement_of_other_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A party whose keys were made anew (its state volume replaced) while its old
    certificates stayed would serve a key statement certifying keys it does not hold:
    clients would seal to a box key it cannot open. It refuses to start in one line, its
    new key request ready in csr/; signed again, it starts."""
    import shutil

    from ppfs_party.errors import WrongPartyStateError
    from ppfs_party.state import open_state

    ca, bob = tmp_path / "ca", tmp_path / "bob"
    assert main(["pki", "init", "--ca-dir", str(ca)]) == 0
    assert main(["party", "init", "--state-dir", str(bob), "--index", "1"]) == 0
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(bob),
                 "--party", "bob"]) == 0
    shutil.rmtree(bob / "keys")  # the keys made anew at the next start; certs/ stay
    old_request = (bob / "csr" / "party-keys.json").read_bytes()
    capsys.readouterr()
    with pytest.raises(WrongPartyStateError, match="certifies other keys than those in keys/"):
        open_state(PartySettings(state_dir=bob, index=1))
    assert (bob / "csr" / "party-keys.json").read_bytes() != old_request  # the new keys'
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(bob),
                 "--party", "bob"]) == 0
    open_state(PartySettings(state_dir=bob, index=1))  # starts
