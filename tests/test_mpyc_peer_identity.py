"""A corrupted party dialling another party's MPyC port under someone else's number.

MPyC's listening side takes the dialler's party number from the first two bytes it
sends and records the connection as that party's link, replacing any before it; only
the dialling side checks the certificate's name. Every party holds a certificate from
the deployment's CA, so a corrupted Alice (party 0) could dial Bob (party 1) claiming
to be Carol (party 2), displace Bob's real link to Carol and receive the shares Bob
sends Carol: with MPyC's threshold 1, Alice would then hold two shares of everything
Bob inputs. These tests play that party against the real TLS listener and the real
connection handler ppfs runs (``mpyc_party.peer_checked_exchanger``), in a child
process of their own, since importing MPyC configures the importing process's logging.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ppfs import pki
from ppfs.engines import mpyc_party as mp

TESTS = Path(__file__).resolve().parent


class FakeRuntime:
    """What MPyC's connection handler uses of the runtime: party 1 of 3, listening."""

    def __init__(self) -> None:
        self.pid = 1
        self.options = SimpleNamespace(ssl=True, no_prss=True)
        self.parties = [SimpleNamespace(pid=i, protocol=None) for i in range(3)]
        self.parties[1].protocol = asyncio.get_running_loop().create_future()
        self.registered: list[int] = []

    def set_protocol(self, peer_pid: int, protocol: Any) -> None:
        self.registered.append(peer_pid)
        self.parties[peer_pid].protocol = protocol

    def unset_protocol(self, peer_pid: int) -> None:
        self.parties[peer_pid].protocol = None


def make_certs(d: Path) -> dict[str, tuple[Path, Path]]:
    """CA certificate and (cert, key) per MPyC name, as the deployment issues them."""
    ca = pki.CertificateAuthority.create()
    (d / "ca.pem").write_bytes(ca.cert_pem())
    out: dict[str, tuple[Path, Path]] = {"ca": (d / "ca.pem", d / "ca.pem")}
    for i in range(3):
        key = d / f"p{i}.key"
        cert = ca.issue(pki.party_key_and_csr(key, f"MPyC party {i}"), dns_san=False)
        pki.write_cert(d / f"p{i}.crt", cert)
        out[f"MPyC party {i}"] = (d / f"p{i}.crt", key)
    return out


async def _listen(rt: FakeRuntime, exchanger: type,
                  certs: dict[str, tuple[Path, Path]]) -> tuple[asyncio.Server, int]:
    """Party 1's listener, set up as MPyC sets it up with --ssl."""
    crt, key = certs["MPyC party 1"]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(crt, keyfile=key)
    ctx.load_verify_locations(cafile=certs["ca"][0])
    ctx.verify_mode = ssl.CERT_REQUIRED
    server = await asyncio.get_running_loop().create_server(
        lambda: exchanger(rt), host="127.0.0.1", port=0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


async def _dial(port: int, as_name: str, claim: int,
                certs: dict[str, tuple[Path, Path]]) -> tuple[bool, asyncio.StreamWriter]:
    """Dial party 1 with ``as_name``'s certificate, claim party ``claim`` and send one
    message; (whether the listener kept the connection open, the connection)."""
    crt, key = certs[as_name]
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.load_cert_chain(crt, keyfile=key)
    ctx.load_verify_locations(cafile=certs["ca"][0])
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ctx, server_hostname="MPyC party 1")
    writer.write(claim.to_bytes(2, "little") + (0).to_bytes(8, "little", signed=True)
                 + (0).to_bytes(4, "little"))
    await writer.drain()
    try:
        closed = await asyncio.wait_for(reader.read(1), timeout=0.5) == b""
    except TimeoutError:
        closed = False  # still open, nothing to read
    except (ConnectionError, ssl.SSLError):
        closed = True
    return not closed, writer


def _scenario(exchanger: type, steps: list[tuple[str, int]],
              certs: dict[str, tuple[Path, Path]]) -> tuple[list[bool], list[int]]:
    async def main() -> tuple[list[bool], list[int]]:
        rt = FakeRuntime()
        server, port = await _listen(rt, exchanger, certs)
        links = [await _dial(port, name, claim, certs) for name, claim in steps]
        registered = list(rt.registered)  # every link still open here
        for _, writer in links:
            writer.close()
        server.close()
        return [kept for kept, _ in links], registered

    return asyncio.run(main())


def child_main(workdir: str, which: str, steps_json: str) -> None:
    """In the child: MPyC imported as a party imports it, one scenario, JSON out."""
    import mpyc.asyncoro

    mp.import_mpyc_runtime()
    checked = mpyc.asyncoro.MessageExchanger
    handler = checked if which == "ppfs" else checked.__mro__[1]  # MPyC's own
    steps = [(str(n), int(c)) for n, c in json.loads(steps_json)]
    kept, registered = _scenario(handler, steps, make_certs(Path(workdir)))
    print(json.dumps({"checks": bool(getattr(handler, "checks_peers", False)),
                      "kept": kept, "registered": registered}))


def run_scenario(tmp_path: Path, which: str, steps: list[tuple[str, int]]) -> dict[str, Any]:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_mpyc_peer_identity as t; "
            "t.child_main(*sys.argv[2:])")
    proc = subprocess.run(
        [sys.executable, "-c", code, str(TESTS), str(tmp_path), which, json.dumps(steps)],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def test_unchecked_handler_registers_a_false_claim(tmp_path: Path) -> None:
    """The gap, in MPyC's own handler: Alice's certificate registered as Carol's link."""
    got = run_scenario(tmp_path, "mpyc", [("MPyC party 0", 2)])
    assert got == {"checks": False, "kept": [True], "registered": [2]}


def test_corrupted_party_cannot_dial_in_as_another(tmp_path: Path) -> None:
    # Alice's certificate claiming Carol, Carol's claiming Alice, Alice's claiming Bob
    # himself or a party that does not exist: each dropped, none registered
    got = run_scenario(tmp_path, "ppfs", [("MPyC party 0", 2), ("MPyC party 2", 0),
                                          ("MPyC party 0", 1), ("MPyC party 0", 7)])
    assert got == {"checks": True, "kept": [False] * 4, "registered": []}


def test_honest_party_is_registered_once(tmp_path: Path) -> None:
    # Alice as herself is taken; a second link claiming her is dropped, not swapped in
    got = run_scenario(tmp_path, "ppfs", [("MPyC party 0", 0), ("MPyC party 0", 0)])
    assert got == {"checks": True, "kept": [True, False], "registered": [0]}


def test_refusals_name_the_problem() -> None:
    rt = SimpleNamespace(pid=2, options=SimpleNamespace(ssl=True),
                         parties=[SimpleNamespace(protocol=None) for _ in range(3)])
    cert = {"subject": ((("commonName", "MPyC party 0"),),)}
    assert mp.refuse_peer(rt, 0, cert) is None
    assert "certificate for 'MPyC party 0'" in str(mp.refuse_peer(rt, 1, cert))
    assert "does not dial party 2" in str(mp.refuse_peer(rt, 2, cert))
    assert "no name" in str(mp.refuse_peer(rt, 0, None))
    rt.parties[0].protocol = object()
    assert "second connection" in str(mp.refuse_peer(rt, 0, cert))
