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

A stolen party key can be revoked before its statement ends, for statements that ask
for it: a statement signed with ``revocation_list`` (purpose :data:`PURPOSE_REVOCABLE`;
``ppfs pki sign --revocable``) is trusted only together with a fresh
:class:`RevocationList` from the same CA that does not name it (SHA-256 of the
statement, :func:`statement_sha256`). The gateway relays the list; it cannot withhold
it (the statement requires it), forge it (the CA signs it) or replay an old one for
longer than its freshness (``next_update``, 7 days unless the operator says otherwise).
A statement without the flag keeps the purpose and bytes it always had, and is
trusted as before; a client that knows no revocation list refuses a flagged one (its
purpose is not :data:`PURPOSE`) rather than ignore what it asks.
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
# a statement that is trusted only with a fresh revocation list that does not name it
PURPOSE_REVOCABLE = "ppfs party keys v2"
REVOCATIONS_PURPOSE = "ppfs revocations v1"
# how long a revocation list is fresh unless the operator says otherwise
# (`ppfs pki revocations --fresh-days`): the longest a gateway can replay the list from
# before a revocation
REVOCATION_FRESHNESS = dt.timedelta(days=7)
# clocks differ: a list this far past its next_update is still taken
CLOCK_SKEW = dt.timedelta(minutes=5)
KEY_VALIDITY = dt.timedelta(days=365)
ANCHOR_ENV = "PPFS_DEPLOYMENT_CA"
SignedRevocations = tuple[bytes, bytes]  # (canonical revocation list, CA signature)
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
    # trusted only with a fresh revocation list from its CA that does not name it; the
    # field is in the statement only when set (a statement without it is the v1 bytes)
    revocation_list: bool = False

    def to_bytes(self) -> bytes:
        d = asdict(self)
        if not self.revocation_list:
            del d["revocation_list"]
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> KeyStatement:
        try:
            d = json.loads(blob)
            fields = {k: d[k] for k in cls.__dataclass_fields__ if k != "revocation_list"}
            flag = d.get("revocation_list", False)
            if not isinstance(flag, bool):
                raise TypeError("revocation_list")
            return cls(**fields, revocation_list=flag)
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
    now: dt.datetime | None = None, revocation_list: bool = False,
) -> tuple[bytes, bytes]:
    """The CA's step: (statement, ECDSA signature) over a party's public keys. With
    ``revocation_list`` clients trust it only with a fresh revocation list of this CA
    that does not name it."""
    start = now or dt.datetime.now(dt.UTC)
    st = KeyStatement(
        purpose=PURPOSE_REVOCABLE if revocation_list else PURPOSE,
        ca_sha256=ca_fingerprint(ca_cert), index=index, name=name,
        box_public_key=base64.b64encode(box_public_key).decode(),
        signing_public_key=base64.b64encode(signing_public_key).decode(),
        not_before=_utc(start - dt.timedelta(minutes=5)), not_after=_utc(start + validity),
        revocation_list=revocation_list,
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
    now: dt.datetime | None = None, revocations: SignedRevocations | None = (b"", b""),
) -> KeyStatement:
    """Check one party's keys against the trust anchor; UntrustedPartyKey naming the
    party (and what failed) otherwise.

    ``revocations`` is the revocation list (list, CA signature) relayed with the keys:
    a statement that requires one is refused when it is missing, not signed by the
    anchor's CA, stale, or names the statement. None only where no revocation is
    checked (the gateway's own look at what a party reports, never a client)."""
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
    if (st.purpose, st.revocation_list) not in ((PURPOSE, False), (PURPOSE_REVOCABLE, True)):
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
    if st.revocation_list and revocations is not None:
        try:
            rl = open_revocations(ca, anchor.sha256, *revocations)
        except UntrustedPartyKey as exc:
            raise UntrustedPartyKey(
                f"{who}: its key statement is trusted only with the deployment CA's "
                f"revocation list, and {exc}") from None
        stale = rl.stale_problem(now or dt.datetime.now(dt.UTC))
        if stale is not None:
            raise UntrustedPartyKey(
                f"{who}: its key statement is trusted only with a fresh revocation list, "
                f"and {stale}")
        if statement_sha256(statement) in rl.revoked:
            raise UntrustedPartyKey(
                f"{who}: its keys were revoked by the deployment CA (revocation list of "
                f"{rl.issued_at}): nothing is sealed to them, no result signed with them "
                "is opened")
    return st


def statement_sha256(statement: bytes) -> str:
    """What a revocation list names a key statement by: SHA-256 of its bytes, hex."""
    return hashlib.sha256(statement).hexdigest()


def _time(text: str, what: str) -> dt.datetime:
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except (TypeError, ValueError):
        raise UntrustedPartyKey(f"the revocation list's {what} is malformed") from None


_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class RevocationList:
    """The key statements the deployment CA has revoked (SHA-256 of each, sorted),
    as of ``issued_at``; stale after ``next_update``."""

    purpose: str
    ca: str  # SHA-256 of the CA certificate
    revoked: tuple[str, ...]
    issued_at: str  # UTC, ISO 8601
    next_update: str

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["revoked"] = sorted(self.revoked)
        return json.dumps(d, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> RevocationList:
        try:
            d = json.loads(blob)
            revoked = d["revoked"]
            if not isinstance(revoked, list) or not all(
                    isinstance(h, str) and _SHA256_HEX.match(h) for h in revoked):
                raise TypeError("revoked")
            fields = {k: d[k] for k in ("purpose", "ca", "issued_at", "next_update")}
            if not all(isinstance(v, str) for v in fields.values()):
                raise TypeError("fields")
            rl = cls(**fields, revoked=tuple(revoked))
        except (ValueError, KeyError, TypeError):
            raise UntrustedPartyKey("the revocation list is malformed") from None
        _time(rl.issued_at, "issue time")
        _time(rl.next_update, "next update")
        return rl

    @property
    def issued(self) -> dt.datetime:
        return _time(self.issued_at, "issue time")

    @property
    def stale_after(self) -> dt.datetime:
        return _time(self.next_update, "next update")

    def future_problem(self, now: dt.datetime) -> str | None:
        """Why the list cannot be taken at ``now`` although the CA signed it: issued more
        than :data:`CLOCK_SKEW` after ``now`` (the CA's clock ran ahead, or this one is
        behind), or None. A client that took it would remember an issue time no list
        reaches until then, and refuse every list the CA issues meanwhile as a replay."""
        if self.issued > now + CLOCK_SKEW:
            return (f"the revocation list the gateway relayed was issued at "
                    f"{self.issued_at}, after this machine's clock ({_utc(now)}): the "
                    "deployment CA's clock or this one is wrong; the deployment's operator "
                    "re-issues it with the right time (`ppfs pki revocations`)")
        return None

    def stale_problem(self, now: dt.datetime) -> str | None:
        """Why the list is not fresh at ``now`` (past ``next_update`` by more than
        :data:`CLOCK_SKEW`, or issued in the future: :meth:`future_problem`), or None."""
        future = self.future_problem(now)
        if future is not None:
            return future
        if now > self.stale_after + CLOCK_SKEW:
            return (f"the revocation list the gateway relayed went stale on "
                    f"{self.next_update} (issued {self.issued_at}): the deployment's "
                    "operator re-issues it (`ppfs pki revocations`) for the gateway")
        return None


def issue_revocations(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, revoked: set[str],
    *, freshness: dt.timedelta = REVOCATION_FRESHNESS, now: dt.datetime | None = None,
) -> SignedRevocations:
    """The CA's step: (revocation list, ECDSA signature) naming ``revoked`` (SHA-256 of
    key statements), fresh for ``freshness`` from ``now``."""
    if freshness <= dt.timedelta(0):
        raise ValueError("a revocation list's freshness must be positive")
    if not all(_SHA256_HEX.match(h) for h in revoked):
        raise ValueError("a revocation names a key statement by its SHA-256 (64 hex digits)")
    start = now or dt.datetime.now(dt.UTC)
    rl = RevocationList(REVOCATIONS_PURPOSE, ca_fingerprint(ca_cert), tuple(sorted(revoked)),
                        _utc(start), _utc(start + freshness))
    blob = rl.to_bytes()
    return blob, ca_key.sign(blob, ec.ECDSA(hashes.SHA256()))


def open_revocations(ca: x509.Certificate, ca_sha256: str, blob: bytes,
                     signature: bytes) -> RevocationList:
    """The revocation list if ``ca`` signed it for itself (UntrustedPartyKey saying what
    fails otherwise: none relayed, another CA's, malformed). Freshness is the caller's
    check (:meth:`RevocationList.stale_problem`)."""
    if not blob:
        raise UntrustedPartyKey("the gateway relayed none")
    pub = ca.public_key()
    if not isinstance(pub, ec.EllipticCurvePublicKey):
        raise UntrustedPartyKey("the deployment CA's key is not an EC key")
    try:
        pub.verify(signature, blob, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        raise UntrustedPartyKey("the one the gateway relayed is not signed by the "
                                "deployment CA") from None
    rl = RevocationList.from_bytes(blob)
    if rl.purpose != REVOCATIONS_PURPOSE:
        raise UntrustedPartyKey("the CA signed the one the gateway relayed for another "
                                "purpose")
    if rl.ca != ca_sha256:
        raise UntrustedPartyKey("the one the gateway relayed names another deployment CA")
    return rl


def revocations_file_bytes(signed: SignedRevocations) -> bytes:
    """The revocation list as one file (what ``ppfs pki revocations`` writes and the
    gateway serves): JSON with the list and its signature, base64. One file, replaced
    whole: never a list read beside another list's signature."""
    blob, sig = signed
    return json.dumps({"revocation_list": base64.b64encode(blob).decode(),
                       "signature": base64.b64encode(sig).decode()}, indent=1).encode() + b"\n"


def parse_revocations_file(data: bytes) -> SignedRevocations:
    """(list, signature) of a revocation list file (ValueError if it is not one; its
    signature is for the reader to check, :func:`open_revocations`)."""
    try:
        d = json.loads(data)
        blob = base64.b64decode(d["revocation_list"], validate=True)
        sig = base64.b64decode(d["signature"], validate=True)
    except (ValueError, KeyError, TypeError):
        raise ValueError("not a revocation list file (`ppfs pki revocations` writes one)") \
            from None
    try:
        RevocationList.from_bytes(blob)
    except UntrustedPartyKey as exc:
        raise ValueError(str(exc)) from None
    return blob, sig
