"""`ppfs pki` and `ppfs party` commands: CA, keys and CSRs, signing, owners, serving."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path

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
    assert main(["pki", "sign", "--ca-dir", str(ca), "--state-dir", str(state)]) == 0
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
