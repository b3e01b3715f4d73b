"""How long a party's certificates and key statement stay valid, and their renewal.

What the deployment CA signs for a party ends (``ppfs pki sign --valid-days``, a year by
default): its control-plane certificate, one MPC certificate per engine, the key
statement clients check its box and signing keys against, and the CA's own
certificate. The operator renews them from the same keys by running ``ppfs pki sign``
on the party's state directory again; nothing a data owner sealed to the party changes.

The party

- refuses to start once any of them has ended (:func:`refuse_expired`), one line naming
  the file and the command that renews it: the gateway's TLS, the other parties' engines
  and every client would refuse it anyway, each with a less telling error;
- reports each one that ends within :data:`ppfs.pki.RENEW_WITHIN` in its log, at start
  and every hour (:func:`watch_lifetimes`), and every end in its metrics;
- picks renewed certificates up without a restart: the control plane's TLS asks
  :class:`ControlCertificates` before each new connection's handshake, and the MPC
  certificates and the key statement are read anew for each job and each identity
  request. A renewed set that does not hold together (a certificate for another key
  or another party, not signed by the deployment CA, not PEM, already ended) is logged
  and the one in use kept.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from ppfs.keycert import KeyStatement, UntrustedPartyKey
from ppfs.pki import Lifetime, certificate_end, certificate_matches_key, single_common_name
from ppfs_party.errors import PartyError
from ppfs_party.keys import CONTROL, KEY_REQUEST, PartyKeys

if TYPE_CHECKING:
    from ppfs_party.config import PartySettings
    from ppfs_party.state import PartyState

log = logging.getLogger("ppfs.party")

# how often a running party looks at its certificates' ends
LIFETIME_CHECK_SECONDS = 3600.0


class CertificateExpiredError(PartyError):
    """A certificate or the key statement this party presents has ended."""


def _renew(settings: PartySettings) -> str:
    return (f"renew it at the deployment CA: `ppfs pki sign --ca-dir CA --state-dir "
            f"{settings.state_dir} --party {settings.name}` (the running party picks "
            "the new files up; nothing sealed to its keys changes)")


def party_lifetimes(keys: PartyKeys, settings: PartySettings,
                    engines: Iterable[str]) -> list[tuple[str, Lifetime]]:
    """(metric label, lifetime) of each certificate and statement installed: control,
    one per engine, the key statement and the CA certificate. One that is missing or
    does not parse has none here (what reads it names it)."""
    renew = _renew(settings)
    found: list[tuple[str, Lifetime]] = []
    wanted = [(CONTROL, "control-plane certificate", keys.cert_path(CONTROL))]
    wanted += [(f"mpc-{e}", f"{e} MPC certificate", keys.mpc_cert(e)) for e in engines]
    for label, what, path in wanted:
        try:
            found.append((label, Lifetime(what, path, certificate_end(path.read_bytes()),
                                          renew)))
        except (OSError, ValueError):
            continue
    statement = keys.certs_dir / KEY_REQUEST
    try:
        end = KeyStatement.from_bytes(statement.read_bytes()).end
        found.append(("key-statement", Lifetime("key statement", statement, end, renew)))
    except (OSError, UntrustedPartyKey):
        pass
    try:
        end = certificate_end(keys.ca_path.read_bytes())
        found.append(("ca", Lifetime(
            "deployment CA certificate", keys.ca_path, end,
            "the CA cannot be renewed in place: a new CA (`ppfs pki init`) is a new trust "
            "anchor for every client and a new `ppfs pki sign` for every party")))
    except (OSError, ValueError):
        pass
    return found


def refuse_expired(state: PartyState, now: dt.datetime | None = None) -> None:
    """At start: CertificateExpiredError naming the first that has ended; a warning in
    the log for each that ends soon."""
    now = now or dt.datetime.now(dt.UTC)
    found = party_lifetimes(state.keys, state.settings, state.engines)
    for _, life in found:
        if life.not_after <= now:
            raise CertificateExpiredError(life.problem(now) or "")
    _report(state, found, now)


def _report(state: PartyState, found: list[tuple[str, Lifetime]], now: dt.datetime) -> None:
    for label, life in found:
        state.metrics.certificate_end.labels(label).set(life.not_after.timestamp())
        problem = life.problem(now)
        if problem is None:
            continue
        level = logging.ERROR if life.not_after <= now else logging.WARNING
        log.log(level, "[Party.lifetimes] %s %s", state.settings.name, problem)


async def watch_lifetimes(state: PartyState) -> None:
    """Report the certificates' ends every hour, until cancelled."""
    while True:
        await asyncio.sleep(LIFETIME_CHECK_SECONDS)
        try:
            found = await asyncio.to_thread(party_lifetimes, state.keys, state.settings,
                                            state.engines)
            _report(state, found, dt.datetime.now(dt.UTC))
        except Exception:  # never let the check die; the next round tries again
            log.exception("[Party.lifetimes] the check of the certificates' ends failed")


def _stamp(paths: Iterable[Path]) -> tuple[tuple[int, int, int], ...] | None:
    try:
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, paths))
    except OSError:
        return None


class ControlCertificates:
    """The control plane's TLS material as installed in the state directory, offered to
    gRPC anew whenever ``ppfs pki sign`` replaced it (:func:`credentials`)."""

    def __init__(self, keys: PartyKeys, settings: PartySettings) -> None:
        self._keys = keys
        self._settings = settings
        self._paths = (keys.key_path(CONTROL), keys.cert_path(CONTROL), keys.ca_path)
        self._stamp = _stamp(self._paths)
        key, cert, ca = keys.control_material()
        self._ca_key = _public_key_der(ca)
        self._initial = grpc.ssl_server_certificate_configuration([(key, cert)],
                                                                  root_certificates=ca)

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch, require_client_authentication=True)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # gRPC calls this before every new connection's handshake, on its own thread:
        # a stat of three files unless they changed; it never raises
        try:
            stamp = _stamp(self._paths)
            if stamp is None or stamp == self._stamp:
                return None
            self._stamp = stamp
            return self._load()
        except Exception:
            log.exception("[Party.lifetimes] reading the renewed control certificate failed")
            return None

    def _load(self) -> grpc.ServerCertificateConfiguration | None:
        key, cert_pem, ca_pem = self._keys.control_material()
        problem = _control_problem(key, cert_pem, ca_pem, self._settings)
        if problem is None and _public_key_der(ca_pem) != self._ca_key:
            problem = "certs/ca.pem is another CA than the one this party started with: " \
                      "restart the party to change its deployment CA"
        if problem is not None:
            log.error("[Party.lifetimes] %s: the control-plane certificate installed in "
                      "%s is not taken (%s); the one in use stays", self._settings.name,
                      self._keys.certs_dir, problem)
            return None
        end = certificate_end(cert_pem)
        log.info("[Party.lifetimes] %s: a renewed control-plane certificate is in use, "
                 "valid until %s", self._settings.name, end.strftime("%Y-%m-%d %H:%M UTC"))
        return grpc.ssl_server_certificate_configuration([(key, cert_pem)],
                                                         root_certificates=ca_pem)


def _public_key_der(pem: bytes) -> bytes:
    try:
        return x509.load_pem_x509_certificate(pem).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    except ValueError:
        return b""


def _control_problem(key: bytes, cert_pem: bytes, ca_pem: bytes,
                     settings: PartySettings) -> str | None:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        if not certificate_matches_key(cert_pem, key):
            return "it certifies another key than keys/control.key"
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "it is not PEM, or not signed by the CA in certs/ca.pem"
    if single_common_name(cert.subject) != settings.control_name:
        return f"it does not name this party's control name {settings.control_name!r}"
    now = dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now < cert.not_valid_after_utc:
        return "it is not valid now"
    return None
