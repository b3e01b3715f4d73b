"""A party's identity: its keys, made on first start in its own state directory.

Private keys (mode 0600) never leave ``<state>/keys``:

- ``box.key``      X25519 (PyNaCl): opens the sealed parts data owners upload
- ``signing.key``  Ed25519: signs this party's result parts
- ``control.key``  control-plane TLS (gRPC, mutual TLS with the gateway)
- ``mpc-<engine>.key``  engine TLS towards the other parties, one per engine
  (MP-SPDZ checks peers by the name ``P<i>``, MPyC by ``MPyC party <i>``)

For each TLS key the party writes a certificate request to ``<state>/csr``, and its
public box and signing keys (with its index and name) to ``<state>/csr/party-keys.json``.
The deployment CA signs them (:func:`sign_party_requests`, ``ppfs pki sign``; the CA's
own operations are in ppfs.pki) and writes
the certificates, the key statement (``certs/party-keys.json`` and ``.sig``,
ppfs.keycert) and its own certificate to ``<state>/certs``: only public material
crosses. Clients refuse a party's keys without a key statement from their trust anchor.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.engines.base import PARTY_NAMES, Engine
from ppfs.pki import (
    CertificateAuthority,
    certify_party_key_request,
    party_key_and_csr,
    write_cert,
    write_private_key,
)
from ppfs_party.errors import NotReadyError

CONTROL = "control"
KEY_REQUEST = "party-keys.json"


def _mpc(engine: str) -> str:
    return f"mpc-{engine}"


@dataclass(frozen=True)
class CertRequest:
    """What the CA needs to sign one of a party's requests."""

    name: str  # control, mpc-mp-spdz, mpc-mpyc
    dns_san: bool


@dataclass
class PartyKeys:
    state_dir: Path
    box: PrivateKey
    signing: SigningKey

    @property
    def keys_dir(self) -> Path:
        return self.state_dir / "keys"

    @property
    def certs_dir(self) -> Path:
        return self.state_dir / "certs"

    def key_path(self, name: str) -> Path:
        return self.keys_dir / f"{name}.key"

    def cert_path(self, name: str) -> Path:
        return self.certs_dir / f"{name}.pem"

    @property
    def ca_path(self) -> Path:
        return self.certs_dir / "ca.pem"

    def mpc_key(self, engine: str) -> Path:
        return self.key_path(_mpc(engine))

    def mpc_cert(self, engine: str) -> Path:
        return self.cert_path(_mpc(engine))

    def control_material(self) -> tuple[bytes, bytes, bytes]:
        """(key PEM, certificate PEM, CA PEM) of the control plane."""
        paths = (self.key_path(CONTROL), self.cert_path(CONTROL), self.ca_path)
        if not all(p.is_file() for p in paths):
            raise NotReadyError(
                "the control-plane certificate is not installed: run `ppfs pki sign`"
            )
        key, cert, ca = (p.read_bytes() for p in paths)
        return key, cert, ca

    def public_pem(self, name: str) -> bytes:
        p = self.cert_path(name)
        return p.read_bytes() if p.is_file() else b""

    def key_statement(self) -> tuple[bytes, bytes]:
        """(statement, CA signature) certifying this party's box and signing keys, or
        empty when the CA has not signed them yet."""
        st, sig = self.certs_dir / KEY_REQUEST, self.certs_dir / "party-keys.sig"
        if not (st.is_file() and sig.is_file()):
            return b"", b""
        return st.read_bytes(), sig.read_bytes()


def load_or_create(
    state_dir: Path, index: int, control_name: str, engines: dict[str, Engine]
) -> PartyKeys:
    """Load the party's keys, making whatever is missing (first start)."""
    keys = state_dir / "keys"
    csr_dir = state_dir / "csr"
    keys.mkdir(parents=True, exist_ok=True, mode=0o700)
    csr_dir.mkdir(parents=True, exist_ok=True)
    box_path, sign_path = keys / "box.key", keys / "signing.key"
    if not box_path.is_file():
        write_private_key(box_path, bytes(PrivateKey.generate()))
    if not sign_path.is_file():
        write_private_key(sign_path, bytes(SigningKey.generate()))
    box, signing = PrivateKey(box_path.read_bytes()), SigningKey(sign_path.read_bytes())
    (csr_dir / KEY_REQUEST).write_text(json.dumps({
        "index": index, "name": PARTY_NAMES[index],
        "box_public_key": base64.b64encode(bytes(box.public_key)).decode(),
        "signing_public_key": base64.b64encode(bytes(signing.verify_key)).decode(),
    }, indent=1))
    requests = {CONTROL: control_name}
    for name, engine in engines.items():
        requests[_mpc(name)] = engine.mpc_subject(index)[0]
    for name, cn in requests.items():
        if not (keys / f"{name}.key").is_file():
            csr = party_key_and_csr(keys / f"{name}.key", cn)
            (csr_dir / f"{name}.csr").write_bytes(csr.public_bytes(serialization.Encoding.PEM))
    return PartyKeys(state_dir, box, signing)


def pending_requests(state_dir: Path) -> list[CertRequest]:
    """The party's certificate requests (MPyC's without DNS SAN: see ppfs.pki)."""
    return [
        CertRequest(p.stem, dns_san=p.stem != _mpc("mpyc"))
        for p in sorted((state_dir / "csr").glob("*.csr"))
    ]


def sign_party_requests(ca: CertificateAuthority, state_dir: Path) -> list[str]:
    """The deployment CA's step on a party's state directory: sign every request the
    party wrote, install the certificates, its key statement and the CA certificate.
    Reads and writes public material only."""
    done = []
    for req in pending_requests(state_dir):
        csr = x509.load_pem_x509_csr((state_dir / "csr" / f"{req.name}.csr").read_bytes())
        write_cert(state_dir / "certs" / f"{req.name}.pem", ca.issue(csr, dns_san=req.dns_san))
        done.append(req.name)
    keys_req = state_dir / "csr" / KEY_REQUEST
    if keys_req.is_file():
        statement, signature = certify_party_key_request(ca, keys_req)
        (state_dir / "certs").mkdir(parents=True, exist_ok=True)
        (state_dir / "certs" / KEY_REQUEST).write_bytes(statement)
        (state_dir / "certs" / "party-keys.sig").write_bytes(signature)
        done.append("party-keys")
    write_cert(state_dir / "certs" / "ca.pem", ca.cert)
    return done


def fingerprint(public_key: bytes) -> str:
    """Short, stable name of a public key for the audit log."""
    h = hashes.Hash(hashes.SHA256())
    h.update(public_key)
    return h.finalize().hex()[:16]
