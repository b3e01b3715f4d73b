"""A party's identity: its keys, made on first start in its own state directory.

Private keys (mode 0600) never leave ``<state>/keys``:

- ``box.key``      X25519 (PyNaCl): opens the sealed parts data owners upload
- ``signing.key``  Ed25519: signs this party's result parts
- ``control.key``  control-plane TLS (gRPC, mutual TLS with the gateway)
- ``mpc-<engine>.key``  engine TLS towards the other parties, one per engine
  (MP-SPDZ checks peers by the name ``P<i>``, MPyC by ``MPyC party <i>``)

For each TLS key the party writes a certificate request to ``<state>/csr``, and its
public box and signing keys (with its index and name) to ``<state>/csr/party-keys.json``.
The deployment CA signs them for the party the operator names (:func:`sign_party_requests`,
``ppfs pki sign --party``; the CA's own operations are in ppfs.pki) and writes
the certificates, the key statement (``certs/party-keys.json`` and ``.sig``,
ppfs.keycert) and its own certificate to ``<state>/certs``: only public material
crosses. Clients refuse a party's keys without a key statement from their trust anchor.

The CA trusts nothing in the state directory it signs: a request is signed only when
it is one a party makes (``control``, ``mpc-<engine>``) and asks for exactly that
party's name (its control name, ``P<i>``, ``MPyC party <i>``), and the key request only
for that party's index and name; anything else is refused before anything is signed.
Nothing there is read or written through a link: ``csr``, ``certs`` and every file
the CA reads or replaces must be a folder or a regular file, and each output is a
fresh file renamed into place.

The party, in turn, refuses to start on a state directory whose key request or
installed certificates name another party than the one it is started as
(:func:`refuse_another_partys_state`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.engines.base import PARTY_NAMES, Engine
from ppfs.engines.registry import ENGINE_NAMES, get_engine
from ppfs.keycert import KeyStatement
from ppfs.pki import (
    DEFAULT_GATEWAY_NAME,
    LEAF_VALIDITY,
    CertificateAuthority,
    PartyRequestRefused,
    certify_party_key_request,
    party_key_and_csr,
    read_regular_file,
    replace_public_file,
    single_common_name,
    write_cert,
    write_private_key,
)
from ppfs_party.errors import NotReadyError, WrongPartyStateError

CONTROL = "control"
KEY_REQUEST = "party-keys.json"


def _mpc(engine: str) -> str:
    return f"mpc-{engine}"


@dataclass(frozen=True)
class CertRequest:
    """One certificate a party asks for: what the CA signs for it, nothing more."""

    name: str  # control, mpc-mp-spdz, mpc-mpyc
    common_name: str  # control: the party's control name; MPC: the engine's P<i> / MPyC party <i>
    dns_san: bool


@dataclass(frozen=True)
class Certified:
    """What ``ppfs pki sign`` signed: one certificate, or the key statement."""

    party: str
    index: int
    request: str  # control, mpc-<engine>, party-keys
    subject: str  # the certificate's CN, or what the key statement certifies
    not_after: dt.datetime | None = None

    def __str__(self) -> str:
        until = (f", valid until {self.not_after:%Y-%m-%d %H:%M} UTC"
                 if self.not_after is not None else "")
        return f"signed {self.party} (index {self.index}): {self.request} {self.subject}{until}"


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
    """Load the party's keys, making whatever is missing (first start). A state
    directory that is another party's is refused before anything is written
    (:func:`refuse_another_partys_state`)."""
    refuse_another_partys_state(state_dir, index, control_name)
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
    _refuse_a_statement_of_other_keys(state_dir, box, signing)
    return PartyKeys(state_dir, box, signing)


def _refuse_a_statement_of_other_keys(state_dir: Path, box: PrivateKey,
                                      signing: SigningKey) -> None:
    """Refuse (:class:`WrongPartyStateError`) to serve a key statement that certifies other
    keys than this party's: clients would seal to a box key it cannot open (its keys were
    made anew, its state volume replaced, while the certificates stayed). Its key request
    for the keys it holds is in ``csr/`` by now, ready to be signed."""
    path = state_dir / "certs" / KEY_REQUEST
    try:
        d = json.loads(path.read_bytes())
        certified = (base64.b64decode(d["box_public_key"]),
                     base64.b64decode(d["signing_public_key"]))
    except FileNotFoundError:
        return
    except (ValueError, KeyError, TypeError):
        return  # left to what reads it
    if certified != (bytes(box.public_key), bytes(signing.verify_key)):
        raise WrongPartyStateError(
            f"{state_dir}: its key statement ({path.parent.name}/{path.name}) certifies other "
            "keys than those in keys/ (made anew, or another state's certificates): sign its "
            "key request in csr/ again (`ppfs pki sign`) and install the new certificates")


def refuse_another_partys_state(state_dir: Path, index: int, control_name: str) -> None:
    """Refuse (:class:`WrongPartyStateError`) to start party ``index`` on a state
    directory whose key request (``csr/party-keys.json``), key statement or installed
    certificates name another party (or another control name than ``control_name``):
    the daemon would serve that party's certificates and key statement under its own
    index, and rewrite the key request to claim itself with the other party's keys.
    Files that do not parse are left to what reads them (the key request is rewritten)."""
    started = f"{PARTY_NAMES[index]} (index {index})"
    for path, what in ((state_dir / "csr" / KEY_REQUEST, "key request"),
                       (state_dir / "certs" / KEY_REQUEST, "key statement")):
        try:
            d = json.loads(path.read_bytes())
            named = int(d["index"]), str(d["name"])
        except FileNotFoundError:
            continue
        except (ValueError, KeyError, TypeError):
            continue
        if named != (index, PARTY_NAMES[index]):
            raise WrongPartyStateError(
                f"{state_dir}: its {what} ({path.parent.name}/{path.name}) is for "
                f"{named[1][:40]!r} (index {named[0]}), not for {started}, the party "
                "this daemon was started as; nothing written")
    for name, req in party_requests(index, control_name).items():
        path = state_dir / "certs" / f"{name}.pem"
        if not path.is_file():
            continue
        try:
            cn = single_common_name(x509.load_pem_x509_certificate(path.read_bytes()).subject)
        except ValueError:
            raise WrongPartyStateError(f"{path}: not a certificate") from None
        if cn == req.common_name:
            continue
        owner = party_owning_name(cn) if cn is not None else None
        whose = (f", {PARTY_NAMES[owner]}'s (index {owner})"
                 if owner is not None and owner != index else "")
        hint = " (--tls-name)" if name == CONTROL else ""
        shown = repr(cn[:40]) if cn is not None else "another subject"
        raise WrongPartyStateError(
            f"{state_dir}: its {name} certificate (certs/{name}.pem) is for {shown}{whose}, "
            f"not {req.common_name!r}{hint}, the name of {started}, the party this daemon "
            "was started as; nothing written")


def party_requests(index: int, control_name: str | None = None) -> dict[str, CertRequest]:
    """The certificates party ``index`` may ask for, by request name: its control
    certificate (``control_name``, default its name in lower case) and one per engine
    with the name that engine checks peers by (``Engine.mpc_subject``)."""
    control = control_name or PARTY_NAMES[index].lower()
    out = {CONTROL: CertRequest(CONTROL, control, dns_san=True)}
    for engine in ENGINE_NAMES:
        cn, dns_san = get_engine(engine).mpc_subject(index)
        out[_mpc(engine)] = CertRequest(_mpc(engine), cn, dns_san)
    return out


def _folded(name: str) -> str:
    """A name as these checks compare names: case and runs of white space folded."""
    return " ".join(name.split()).casefold()


def party_owning_name(name: str) -> int | None:
    """The party one of whose request names (:func:`party_requests`: its default control
    name, ``P<j>``, ``MPyC party <j>``) is ``name``, case and white space folded; None
    when no party's is."""
    folded = _folded(name)
    for j in range(len(PARTY_NAMES)):
        if folded in {_folded(r.common_name) for r in party_requests(j).values()}:
            return j
    return None


def _check_control_name(index: int, control_name: str) -> None:
    """A control name that is another party's or the gateway's (by its default name; the
    parties also require the CA's gateway usage, which no party certificate carries) is
    never certified."""
    folded = _folded(control_name)
    if not folded or folded == DEFAULT_GATEWAY_NAME:
        raise PartyRequestRefused(
            f"control name {control_name[:40]!r}: a party's control certificate cannot "
            "carry the gateway's name")
    j = party_owning_name(control_name)
    if j is not None and j != index:
        raise PartyRequestRefused(
            f"control name {control_name[:40]!r} is {PARTY_NAMES[j]}'s (index {j}); "
            f"{PARTY_NAMES[index]} cannot be certified under it")


def check_client_name(name: str) -> None:
    """The name of the gateway's client identity (``ppfs pki client --name``): never a
    party's request name, which the other parties' MPC peer checks would take for that
    party (case and white space folded, as :func:`_check_control_name` compares)."""
    if not name.strip():
        raise PartyRequestRefused("the client identity's name must not be empty")
    j = party_owning_name(name)
    if j is not None:
        raise PartyRequestRefused(
            f"client name {name[:40]!r} is {PARTY_NAMES[j]}'s (index {j}) certificate "
            f"name; the parties would take a certificate under it for {PARTY_NAMES[j]}; "
            "nothing issued")


def _refuse_unless_regular(path: Path, what: str) -> None:
    """Refuse (before anything is signed) a ``path`` that is a link or, when it exists,
    anything but a ``what`` (a regular file, a folder): the state directory comes from
    the party, and a link there would have the CA read or write where the party chose."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    want = stat.S_ISDIR if what == "folder" else stat.S_ISREG
    if stat.S_ISLNK(mode) or not want(mode):
        kind = "a symbolic link" if stat.S_ISLNK(mode) else f"not a {what}"
        raise PartyRequestRefused(f"{path}: {kind}, where the CA reads or writes only "
                                  f"a {what}; nothing signed")


def _checked_requests(
    state_dir: Path, index: int, control_name: str | None
) -> list[tuple[CertRequest, x509.CertificateSigningRequest]]:
    """Every certificate request in ``state_dir/csr``, each checked to be one party
    ``index`` may make; the first that is not is refused, naming the mismatch."""
    allowed = party_requests(index, control_name)
    _check_control_name(index, allowed[CONTROL].common_name)
    who = f"{PARTY_NAMES[index]} (index {index})"
    checked = []
    for path in sorted((state_dir / "csr").glob("*.csr")):
        req = allowed.get(path.stem)
        if req is None:
            raise PartyRequestRefused(
                f"{path}: not a request a party makes (only "
                f"{', '.join(f'{n}.csr' for n in allowed)}); nothing signed")
        _refuse_unless_regular(path, "regular file")
        try:
            csr = x509.load_pem_x509_csr(read_regular_file(path))
        except ValueError:
            raise PartyRequestRefused(f"{path}: not a certificate request") from None
        if not csr.is_signature_valid:
            raise PartyRequestRefused(f"{path}: the request's signature is invalid")
        cn = single_common_name(csr.subject)
        if cn != req.common_name:
            asked = repr(cn[:40]) if cn is not None else "another subject"
            raise PartyRequestRefused(
                f"{path}: asks for {asked}; the {req.name} certificate of {who} is "
                f"{req.common_name!r}; nothing signed")
        checked.append((req, csr))
    return checked


def sign_party_requests(
    ca: CertificateAuthority, state_dir: Path, index: int, control_name: str | None = None,
    validity: dt.timedelta = LEAF_VALIDITY, *, revocable: bool = False,
    record: Callable[[bytes], None] | None = None,
) -> list[Certified]:
    """The deployment CA's step on a party's state directory, for party ``index`` (the
    party the operator means to certify, never what the directory claims): check every
    request the party wrote (:func:`party_requests`, the key request's index and name),
    then sign them and install the certificates, its key statement and the CA
    certificate. Refuses (PartyRequestRefused) before signing anything when a request
    belongs to another party or is not one a party makes. Reads and writes public
    material only. Signing again, from the same requests, renews them: the keys stay,
    the running party picks the new files up (ppfs_party.lifetimes).

    ``revocable``: the key statement asks clients for the CA's revocation list
    (ppfs.keycert). ``record`` is given the key statement once nothing is refused,
    before anything is written (the CA's record of it, ppfs.revocation; it may refuse
    it by raising)."""
    if not 0 <= index < len(PARTY_NAMES):
        raise PartyRequestRefused(f"party index must be 0..{len(PARTY_NAMES) - 1}")
    name = PARTY_NAMES[index]
    csr_dir, certs = state_dir / "csr", state_dir / "certs"
    _refuse_unless_regular(csr_dir, "folder")
    _refuse_unless_regular(certs, "folder")
    checked = _checked_requests(state_dir, index, control_name)
    keys_req = csr_dir / KEY_REQUEST
    _refuse_unless_regular(keys_req, "regular file")
    statement = None
    if keys_req.is_file():
        statement = certify_party_key_request(ca, keys_req, index, validity, revocable)
    outputs = [f"{req.name}.pem" for req, _ in checked]
    outputs += [KEY_REQUEST, "party-keys.sig", "ca.pem"]
    for out in outputs:
        _refuse_unless_regular(certs / out, "regular file")
    if statement is not None and record is not None:
        record(statement[0])  # after every refusal above, before anything is written
    # every output through a fresh file renamed over the old one: a link that appears
    # there is replaced, never written through
    done = []
    # the CA certificate first: a party reloading its control certificate checks it
    # against the CA installed beside it
    certs.mkdir(parents=True, exist_ok=True)
    write_cert(certs / "ca.pem", ca.cert)
    for req, csr in checked:
        cert = ca.issue(csr, dns_san=req.dns_san, validity=validity)
        write_cert(certs / f"{req.name}.pem", cert)
        done.append(Certified(name, index, req.name, f"CN={req.common_name}",
                              cert.not_valid_after_utc))
    if statement is not None:
        # the signature first: a reader between the two writes finds the old statement
        # under a signature that does not hold, and is refused, never a mix it accepts
        replace_public_file(certs / "party-keys.sig", statement[1])
        replace_public_file(certs / KEY_REQUEST, statement[0])
        done.append(Certified(name, index, "party-keys",
                              "key statement (box and signing keys)",
                              KeyStatement.from_bytes(statement[0]).end))
    return done


def fingerprint(public_key: bytes) -> str:
    """Short, stable name of a public key for the audit log."""
    h = hashes.Hash(hashes.SHA256())
    h.update(public_key)
    return h.finalize().hex()[:16]
