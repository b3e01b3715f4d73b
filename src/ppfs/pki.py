"""Per-deployment PKI for the MPC links between parties.

The deployment's CA signs one TLS certificate per party. Each party's private key
is generated in that party's own directory and never copied anywhere else; only
the certificate (public) is shared. The CA key stays with whoever set up the
deployment and signs nothing but party certificates and the gateway's client identity.

The deployment CA's own operations live here too: keeping it on disk
(:func:`save_ca`, :func:`load_ca`), issuing the gateway's control-plane client identity
(:func:`issue_client_identity`) and certifying a party's public box and signing keys
(:func:`certify_party_key_request`, for the party the operator names). They read and
write public material only, apart from the CA key itself.

Only :func:`certify_client_request` (and :func:`issue_client_identity`, which makes the
key and calls it) puts :data:`GATEWAY_CONTROL_USAGE` into a certificate; a party's
certificates, signed from its own requests, never carry it
(:meth:`CertificateAuthority.issue` takes nothing from a request but its subject and
key), so no party can present itself to another as the gateway.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ppfs.durable import write_replacing
from ppfs.engines.base import PARTY_NAMES

# How long what the deployment CA signs stays valid unless the operator says otherwise
# (`--valid-days`): the CA itself for ten years (its fingerprint is every client's
# trust anchor, so renewing it means handing every client a new one), each party's and
# the gateway's certificates and key statements for a year, never past the CA's own
# end (they are renewed from the same keys: `ppfs pki sign` again).
CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=365)
# A certificate this close to its end is reported (the party's and the gateway's logs
# and metrics, the deployment status): time to renew it.
RENEW_WITHIN = dt.timedelta(days=30)

# The extended key usage that marks the gateway's control-plane client identity: the
# parties accept PartyService calls only from a certificate that carries it (and names
# the gateway). An OID under 2.25 (ITU-T X.667: a UUID read as an integer), which needs
# no registration; drawn once for ppfs.
GATEWAY_CONTROL_USAGE = x509.ObjectIdentifier("2.25.175183320833884687588697138822764851126")
# The gateway's client identity's name unless the operator picks another
# (`ppfs pki client --name`, then `ppfs party serve --gateway-name` on every party).
DEFAULT_GATEWAY_NAME = "gateway"


def _day(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class Lifetime:
    """When one certificate or key statement that a party or the gateway presents
    ends, and what renews it."""

    what: str  # "control certificate", "key statement", ...
    path: Path
    not_after: dt.datetime
    renew: str  # the command that renews it

    def phrase(self, now: dt.datetime | None = None,
               within: dt.timedelta = RENEW_WITHIN) -> str | None:
        """"its WHAT expired on DAY" or "its WHAT expires on DAY (in N days)", or None
        when it ends later than ``within`` from now."""
        now = now or dt.datetime.now(dt.UTC)
        if self.not_after <= now:
            return f"its {self.what} expired on {_day(self.not_after)}"
        left = self.not_after - now
        if left > within:
            return None
        days = left.days
        when = "in less than a day" if days == 0 else f"in {days} day{'s' * (days > 1)}"
        return f"its {self.what} expires on {_day(self.not_after)} ({when})"

    def problem(self, now: dt.datetime | None = None,
                within: dt.timedelta = RENEW_WITHIN) -> str | None:
        """One line naming the file, when it has ended or ends within ``within``."""
        phrase = self.phrase(now, within)
        return None if phrase is None else f"{self.path}: {phrase}: {self.renew}"


def certificate_end(pem: bytes) -> dt.datetime:
    """The end of validity of the first certificate in ``pem`` (ValueError if none)."""
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


class PartyRequestRefused(ValueError):
    """A party's certificate or key request names something this signing is not for
    (another party's index, name or certificate names, the gateway, an unknown request)."""


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(
        cls, name: str = "ppfs deployment CA", *, validity: dt.timedelta = CA_VALIDITY,
    ) -> CertificateAuthority:
        if validity <= dt.timedelta(0):
            raise ValueError("a CA's validity must be positive")
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return cls(key, cert)

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def leaf_end(self, now: dt.datetime, validity: dt.timedelta) -> dt.datetime:
        """When something signed ``now`` for ``validity`` ends: never past the CA's end.
        A CA already expired signs nothing (ValueError naming its end)."""
        end = self.cert.not_valid_after_utc
        if end <= now:
            raise ValueError(
                f"the deployment CA expired on {_day(end)}: it signs nothing more; a new "
                "CA (`ppfs pki init`) is a new trust anchor for every client")
        if validity <= dt.timedelta(0):
            raise ValueError("a certificate's validity must be positive")
        return min(now + validity, end)

    def issue(
        self, csr: x509.CertificateSigningRequest, *, dns_san: bool = True,
        validity: dt.timedelta = LEAF_VALIDITY,
    ) -> x509.Certificate:
        """Sign a party certificate for ``csr``'s subject.

        ``dns_san=False`` leaves out the subject alternative name: MPyC matches peers
        by the CN ``MPyC party i``, which contains spaces and so cannot be a DNS name,
        and TLS host-name matching ignores the CN as soon as a SAN is present. No
        extended key usage: a party certificate never carries the gateway's
        (:func:`certify_client_request` issues that one). Valid for ``validity``,
        never past the CA's own end.
        """
        if not csr.is_signature_valid:
            raise ValueError("certificate request signature is invalid")
        now = dt.datetime.now(dt.UTC)
        cn = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
        builder = (
            x509.CertificateBuilder()
            .subject_name(csr.subject)
            .issuer_name(self.cert.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(self.leaf_end(now, validity))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        if dns_san:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(str(cn).replace(" ", "-"))]),
                critical=False,
            )
        return builder.sign(self.key, hashes.SHA256())


def party_key_and_csr(key_path: Path, common_name: str) -> x509.CertificateSigningRequest:
    """Generate a party's private key at ``key_path`` (mode 0600) and return its CSR."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    key_path.parent.mkdir(parents=True, exist_ok=True)
    replace_private_file(key_path, pem)
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .sign(key, hashes.SHA256())
    )


def write_cert(path: Path, cert: x509.Certificate) -> None:
    """Write ``cert`` (PEM) at ``path`` without following a link there
    (:func:`replace_public_file`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_public_file(path, cert.public_bytes(serialization.Encoding.PEM))


def write_private_key(path: Path, data: bytes) -> None:
    """Write a new private key: mode 0600 from the start, never over an existing file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def replace_private_file(path: Path, data: bytes) -> None:
    """Write ``path`` (new, or over the old one) so that it is mode 0600 from its first
    byte: through a fresh, randomly named file created exclusively (never one that was
    there before, whatever its mode, nor a link), synced, then renamed over ``path``."""
    write_replacing(path, data, 0o600)


def replace_public_file(path: Path, data: bytes) -> None:
    """Write public material (a certificate, a key statement) at ``path`` as
    :func:`replace_private_file` does, mode 0644: a link found at ``path`` is replaced,
    never written through."""
    write_replacing(path, data, 0o644)


def read_regular_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file, never read through a link
    (OSError otherwise; a FIFO neither blocks nor is read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path}: not a regular file")
        return fh.read()


def save_ca(ca: CertificateAuthority, directory: Path) -> None:
    """Keep the deployment CA (its key 0600) where the operator ran ``ppfs pki init``."""
    pem = ca.key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private_key(directory / "ca.key", pem)
    write_cert(directory / "ca.pem", ca.cert)


def load_ca(directory: Path) -> CertificateAuthority:
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    return CertificateAuthority(key, cert)


def issue_client_identity(
    ca: CertificateAuthority, common_name: str, key_path: Path,
    validity: dt.timedelta = LEAF_VALIDITY,
) -> tuple[bytes, bytes]:
    """The gateway's control-plane client identity (or a test's): key made at
    ``key_path``, certificate signed by the CA with the client-authentication and
    :data:`GATEWAY_CONTROL_USAGE` key usages. Returns (key PEM, certificate PEM)."""
    csr = party_key_and_csr(key_path, common_name)
    return key_path.read_bytes(), certify_client_request(ca, csr, common_name, validity)


def read_key_request(path: Path) -> x509.CertificateSigningRequest:
    """A certificate request made where its key lives (the gateway's host), read without
    following a link; its signature must hold (the requester holds the key)."""
    try:
        csr = x509.load_pem_x509_csr(read_regular_file(path))
        valid = csr.is_signature_valid
    except ValueError:
        raise ValueError(f"{path}: not a PEM certificate request") from None
    if not valid:
        raise ValueError(f"{path}: the request's signature does not hold for its key; "
                         "nothing signed")
    if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
        raise ValueError(f"{path}: the request's key is not an EC key; nothing signed")
    return csr


def _certificate_for_key(
    ca: CertificateAuthority, public_key: ec.EllipticCurvePublicKey, common_name: str,
    usages: tuple[x509.ObjectIdentifier, ...], sans: list[x509.GeneralName],
    validity: dt.timedelta = LEAF_VALIDITY,
) -> x509.Certificate:
    """A leaf certificate for ``public_key`` under the name, usages and alternative
    names the CA chooses (nothing taken from a request but the key)."""
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(ca.leaf_end(now, validity))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca.key, hashes.SHA256())


def certify_client_request(
    ca: CertificateAuthority, csr: x509.CertificateSigningRequest, common_name: str,
    validity: dt.timedelta = LEAF_VALIDITY,
) -> bytes:
    """The gateway's control-plane client identity for a key it made itself
    (``ppfs gateway serve --make-keys``): the certificate names ``common_name``, the
    operator's choice (the request's own subject is ignored), and carries the
    client-authentication and :data:`GATEWAY_CONTROL_USAGE` key usages. PEM."""
    key = csr.public_key()
    if not csr.is_signature_valid or not isinstance(key, ec.EllipticCurvePublicKey):
        raise ValueError("the request's signature does not hold or its key is not EC")
    cert = _certificate_for_key(ca, key, common_name,
                                (ExtendedKeyUsageOID.CLIENT_AUTH, GATEWAY_CONTROL_USAGE),
                                [x509.DNSName(common_name.replace(" ", "-"))], validity)
    return cert.public_bytes(serialization.Encoding.PEM)


def certify_https_key(
    ca: CertificateAuthority, public_key: CertificatePublicKeyTypes, names: list[str],
    validity: dt.timedelta = LEAF_VALIDITY,
) -> bytes:
    """The gateway's HTTPS server certificate for ``public_key`` (an EC key) and
    ``names`` (DNS names or IP addresses, the first also its common name). PEM."""
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise ValueError("the HTTPS key is not an EC key; nothing signed")
    if not names:
        raise ValueError("give at least one name (DNS name or IP address) for HTTPS")
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = _certificate_for_key(ca, public_key, names[0],
                                (ExtendedKeyUsageOID.SERVER_AUTH,), sans, validity)
    return cert.public_bytes(serialization.Encoding.PEM)


def key_request(key_path: Path, common_name: str) -> bytes:
    """A certificate request (PEM) for the private key at ``key_path``: what leaves the
    host that keeps the key, to be signed by the CA."""
    key = serialization.load_pem_private_key(read_regular_file(key_path), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{key_path}: not an EC private key")
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .sign(key, hashes.SHA256())
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def certificate_matches_key(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether the certificate is for the private key."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    key = serialization.load_pem_private_key(key_pem, None)
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return bool(cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt))


def has_gateway_usage(cert: x509.Certificate) -> bool:
    """Whether the CA issued ``cert`` as the gateway's control-plane client identity."""
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return False
    return GATEWAY_CONTROL_USAGE in eku


def single_common_name(name: x509.Name) -> str | None:
    """The CN of a subject that is exactly one common name, else None."""
    attrs = list(name)
    if len(attrs) != 1 or attrs[0].oid != NameOID.COMMON_NAME:
        return None
    value = attrs[0].value
    return value if isinstance(value, str) else None


def certify_party_key_request(
    ca: CertificateAuthority, request_path: Path, expected_index: int,
    validity: dt.timedelta = LEAF_VALIDITY, revocable: bool = False,
) -> tuple[bytes, bytes]:
    """The CA's side of a party's key request (``party-keys.json``: index, name, public
    box and signing keys) for party ``expected_index``, the party the operator means to
    certify: check it and return (key statement, CA signature), valid for ``validity``
    and never beyond the CA certificate. A request naming another index or name is
    refused (:class:`PartyRequestRefused`). ``revocable``: clients trust the statement
    only with a fresh revocation list of the CA that does not name it
    (ppfs.revocation)."""
    # imported here: an embedded run (ppfs select) makes its per-run CA with this module
    # and certifies no party keys
    from ppfs.keycert import certify_party_keys

    try:
        d = json.loads(read_regular_file(request_path))
        index, name = int(d["index"]), str(d["name"])
        box, signing = (base64.b64decode(d[k]) for k in
                        ("box_public_key", "signing_public_key"))
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{request_path}: not a party key request") from None
    want = PARTY_NAMES[expected_index]
    if index != expected_index:
        who = f"{PARTY_NAMES[index]} " if 0 <= index < len(PARTY_NAMES) else ""
        raise PartyRequestRefused(
            f"{request_path}: the key request is for {who}(index {index}), not for {want} "
            f"(index {expected_index}), the party being signed for"
        )
    if name != want:
        raise PartyRequestRefused(
            f"{request_path}: the key request names {name[:40]!r}, not {want} "
            f"(index {expected_index}), the party being signed for"
        )
    if len(box) != 32 or len(signing) != 32:
        raise ValueError(f"{request_path}: inconsistent party key request")
    now = dt.datetime.now(dt.UTC)
    return certify_party_keys(
        ca.key, ca.cert, index, name, box, signing,
        validity=ca.leaf_end(now, validity) - now, now=now, revocation_list=revocable)


# ---------------------------------------------------------------- OpenSSL lookup names
def subject_hash(cert: x509.Certificate) -> str:
    """OpenSSL's X509_NAME_hash of the subject (what ``openssl rehash`` links by).

    SHA-1 over the canonical encoding of the name: each RDN as a DER SET of
    (OID, UTF8String) with the value lower-cased and its whitespace collapsed.
    """
    canon = b""
    for rdn in cert.subject.rdns:
        items = b""
        for attr in rdn:
            text = attr.value if isinstance(attr.value, str) else attr.value.decode()
            value = " ".join(text.split()).lower().encode()
            oid = _der_oid(attr.oid.dotted_string)
            items += _der(0x30, oid + _der(0x0C, value))
        canon += _der(0x31, items)
    digest = hashlib.sha1(canon, usedforsecurity=False).digest()
    return f"{int.from_bytes(digest[:4], 'little'):08x}"


def _der(tag: int, body: bytes) -> bytes:
    n = len(body)
    if n < 0x80:
        return bytes([tag, n]) + body
    size = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(size)]) + size + body


def _der_oid(dotted: str) -> bytes:
    parts = [int(v) for v in dotted.split(".")]
    body = bytes([40 * parts[0] + parts[1]])
    for v in parts[2:]:
        chunk = [v & 0x7F]
        v >>= 7
        while v:
            chunk.append(0x80 | (v & 0x7F))
            v >>= 7
        body += bytes(reversed(chunk))
    return _der(0x06, body)


def hash_link(directory: Path, fname: str, digest: str) -> None:
    """``<hash>.<n>`` -> fname, as ``openssl rehash`` names it (n counts collisions)."""
    n = 0
    while (directory / f"{digest}.{n}").is_symlink():
        n += 1
    (directory / f"{digest}.{n}").symlink_to(fname)
