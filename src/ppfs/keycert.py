"""Party keys certified by the deployment's trust anchor.

A client seals data owners' shares to each party's X25519 box key and accepts a
result only when signed by each party's Ed25519 signing key. It gets those keys
from the gateway, which must not be able to substitute its own: each party's keys
are certified by the deployment CA (the same CA that issues the mutual-TLS
certificates, ``ppfs pki sign``) in a :class:`KeyStatement`, canonical JSON signed
with the CA key (ECDSA P-256, SHA-256). The statement names the CA (SHA-256 of its
certificate), the party's index and name, both keys and a validity window.

The client holds the trust anchor out of band (:class:`TrustAnchor`: the CA
certificate file, or its SHA-256 fingerprint) and checks every party's statement
(:func:`verify_party_keys`) before it seals anything or opens any result; a
statement that does not verify is refused naming the party.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ppfs.errors import ParameterError, PpfsError

PURPOSE = "ppfs party keys v1"
KEY_VALIDITY = dt.timedelta(days=365)
ANCHOR_ENV = "PPFS_DEPLOYMENT_CA"
_FINGERPRINT = re.compile(r"^(sha256:)?[0-9a-fA-F:]{64,95}$")


class UntrustedPartyKey(PpfsError):
    """A party's keys are not certified by the deployment's trust anchor."""


class NoTrustAnchor(ParameterError):
    """The client was given no trust anchor to check party keys with."""

    def __init__(self) -> None:
        super().__init__(
            "no deployment trust anchor: pass --deployment-ca (the deployment CA's "
            "certificate file, or its SHA-256 fingerprint) or set PPFS_DEPLOYMENT_CA; the "
            "operator who ran `ppfs pki init` prints it with `ppfs pki fingerprint`. "
            "Without it the gateway could hand out its own keys for the parties"
        )


def ca_fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the CA certificate's DER encoding, hex."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _utc(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class KeyStatement:
    purpose: str
    ca_sha256: str
    index: int
    name: str
    box_public_key: str  # base64
    signing_public_key: str  # base64
    not_before: str  # UTC, ISO 8601
    not_after: str

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> KeyStatement:
        try:
            d = json.loads(blob)
            return cls(**{k: d[k] for k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            raise UntrustedPartyKey("the key statement is malformed") from None

    @property
    def end(self) -> dt.datetime:
        """``not_after`` as a time (UntrustedPartyKey if it is not one)."""
        try:
            return dt.datetime.strptime(self.not_after, "%Y-%m-%dT%H:%M:%SZ").replace(
                tzinfo=dt.UTC)
        except (TypeError, ValueError):
            raise UntrustedPartyKey("the key statement's end of validity is malformed") from None

    @property
    def box_key(self) -> bytes:
        return base64.b64decode(self.box_public_key)

    @property
    def signing_key(self) -> bytes:
        return base64.b64decode(self.signing_public_key)


def certify_party_keys(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, index: int, name: str,
    box_public_key: bytes, signing_public_key: bytes, *, validity: dt.timedelta = KEY_VALIDITY,
    now: dt.datetime | None = None,
) -> tuple[bytes, bytes]:
    """The CA's step: (statement, ECDSA signature) over a party's public keys."""
    start = now or dt.datetime.now(dt.UTC)
    st = KeyStatement(
        purpose=PURPOSE, ca_sha256=ca_fingerprint(ca_cert), index=index, name=name,
        box_public_key=base64.b64encode(box_public_key).decode(),
        signing_public_key=base64.b64encode(signing_public_key).decode(),
        not_before=_utc(start - dt.timedelta(minutes=5)), not_after=_utc(start + validity),
    )
    blob = st.to_bytes()
    return blob, ca_key.sign(blob, ec.ECDSA(hashes.SHA256()))


@dataclass(frozen=True)
class TrustAnchor:
    """What the client trusts: the deployment CA certificate, or only its fingerprint
    (then the certificate relayed by the gateway is used once its SHA-256 matches)."""

    sha256: str
    cert: x509.Certificate | None = None

    @classmethod
    def parse(cls, text: str) -> TrustAnchor:
        """A path to the CA certificate (PEM) or its SHA-256 fingerprint (hex, colons
        and a ``sha256:`` prefix allowed)."""
        text = text.strip()
        if _FINGERPRINT.match(text) and not Path(text).is_file():
            hexed = text.removeprefix("sha256:").replace(":", "").lower()
            if len(hexed) == 64:
                return cls(hexed)
        try:
            pem = Path(text).read_bytes()
        except OSError:
            raise ParameterError(
                f"deployment CA {text!r}: neither a readable certificate file nor a "
                "SHA-256 fingerprint (64 hex digits)"
            ) from None
        return cls.from_pem(pem, text)

    @classmethod
    def from_pem(cls, pem: bytes, what: str = "the deployment CA") -> TrustAnchor:
        try:
            cert = x509.load_pem_x509_certificate(pem)
        except ValueError:
            raise ParameterError(f"{what}: not a PEM certificate") from None
        return cls(ca_fingerprint(cert), cert)

    def ca_certificate(self, relayed_pem: bytes) -> x509.Certificate:
        """The CA certificate to check signatures with: our own, or the relayed one if
        its fingerprint is ours."""
        if self.cert is not None:
            return self.cert
        try:
            cert = x509.load_pem_x509_certificate(relayed_pem)
        except ValueError:
            raise UntrustedPartyKey(
                "the gateway relayed no usable deployment CA certificate"
            ) from None
        if ca_fingerprint(cert) != self.sha256:
            raise UntrustedPartyKey(
                "the deployment CA certificate the gateway relayed is not the one whose "
                "fingerprint you trust"
            )
        return cert


def verify_party_keys(
    anchor: TrustAnchor, *, index: int, name: str, box_public_key: bytes,
    signing_public_key: bytes, statement: bytes, signature: bytes, relayed_ca_pem: bytes = b"",
    now: dt.datetime | None = None,
) -> KeyStatement:
    """Check one party's keys against the trust anchor; UntrustedPartyKey naming the
    party (and what failed) otherwise."""
    who = f"party {index} ({name})"
    if not statement:
        raise UntrustedPartyKey(f"{who}: its keys carry no certificate from the deployment CA")
    try:
        ca = anchor.ca_certificate(relayed_ca_pem)
    except UntrustedPartyKey as exc:
        raise UntrustedPartyKey(f"{who}: {exc}") from None
    pub = ca.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise UntrustedPartyKey("the deployment CA's key is not an EC key")
    try:
        pub.verify(signature, statement, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise UntrustedPartyKey(
            f"{who}: its key statement is not signed by the deployment CA"
        ) from None
    st = KeyStatement.from_bytes(statement)
    if st.purpose != PURPOSE:
        raise UntrustedPartyKey(f"{who}: the CA signed a statement for another purpose")
    if st.ca_sha256 != anchor.sha256:
        raise UntrustedPartyKey(f"{who}: its key statement names another deployment CA")
    if (st.index, st.name) != (index, name):
        raise UntrustedPartyKey(
            f"{who}: its key statement is for party {st.index} ({st.name})"
        )
    t = _utc(now or dt.datetime.now(dt.UTC))
    if not st.not_before <= t <= st.not_after:
        raise UntrustedPartyKey(
            f"{who}: its key certificate is valid {st.not_before} .. {st.not_after}, not "
            "now: the deployment's operator renews it (`ppfs pki sign` on that party's "
            "state directory)"
        )
    if (st.box_key, st.signing_key) != (box_public_key, signing_public_key):
        raise UntrustedPartyKey(
            f"{who}: the keys the gateway relayed are not the keys the deployment CA certified"
        )
    return st
