"""Python SDK of the dealer-gateway, for data owners, analysts and model owners.

Everything secret happens here, on the client's machine: encoding (ppfs.fixedpoint),
secret sharing (ppfs.sharing), sealing each party's bundles to that party's box key
and signing the manifest (ppfs.upload), drawing mask words (ppfs.step2a) and, for
the recipient, opening and unmasking the result. The gateway only ever sees
sealed parts, signed manifests, signed consents and public schemas.

Nothing the gateway says is taken on trust where it matters: every party's box and
signing keys must be certified by the deployment CA the client holds out of band
(ppfs.keycert; :class:`GatewayClient` ``trust``), checked before anything is sealed;
a result is accepted only with exactly one part per party, each signed by that
party's certified key, all parties' signed statements alike, and it is decoded with
the columns, exponents and classes the parties signed (ppfs.contract.ResultStatement).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import functools
import hashlib
import json
import ssl
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import httpx
import numpy as np

from ppfs.contract import (
    Consent,
    JobRequest,
    ResultRejected,
    ResultStatement,
    Reveal,
    consent_securities,
    open_result,
    open_result_statement,
    service_shape,
    training_body,
    training_from_body,
)
from ppfs.engines.base import PARTY_NAMES
from ppfs.errors import ParameterError, PpfsError, ShareFormatError
from ppfs.fixedpoint import FixedPoint
from ppfs.holdings import Held, new_challenge, open_holdings
from ppfs.keycert import (
    NoTrustAnchor,
    RevocationList,
    TrustAnchor,
    UntrustedPartyKey,
    open_revocations,
    verify_party_keys,
)
from ppfs.sharing import Scheme, bundles_for_all
from ppfs.step2a import draw_mask_words, unmask_all
from ppfs.upload import (
    MAX_SUPERSEDED,
    SIGNED_AT_FORMAT,
    Manifest,
    Repair,
    pack_bundles,
    seal,
    sign_manifest,
)
from ppfs.withdrawal import (
    ReceiptRejected,
    Revocation,
    SignedRevocation,
    SignedWithdrawal,
    Withdrawal,
    open_receipt,
    open_revocation_receipt,
)
from ppfs_client.keys import ClientKeys
from ppfs_client.seen_lists import ReplayedRevocationList, check_and_remember
from ppfs_client.sent import (
    EarlierUpload,
    earlier_uploads,
    load_sent,
    repeat_refused,
    save_sent,
    table_digest,
)
from ppfs_client.sent import RepeatedUpload as RepeatedUpload  # an owner's refusal

MASK_COLUMNS = ("mask_w0", "mask_w1")
Progress = Callable[[int, int], None]  # (bytes sent, total)

# The most of one answer the client reads (a job list, a deployment, a result: far less);
# a gateway that sends more is refused after that many bytes, not read to the end.
MAX_ANSWER_BYTES = 64 << 20
# One line of the job event stream (one job as JSON: a few KiB).
MAX_EVENT_LINE = 1 << 20
# The gateway sends a keep-alive every 15 s on the event stream; silence this long is a
# gateway that stopped answering.
EVENT_SILENCE = 90.0


class RefusedAnswer(PpfsError):
    """An answer of the gateway's that the client refuses (it does not parse, or it says
    what the client knows otherwise); nothing is done with it."""


class UploadNotConfirmed(RefusedAnswer):
    """The gateway says an upload was added, but a party did not confirm, by its own
    signed statement, that it holds the upload committed."""


class ApiError(PpfsError):
    """The gateway answered with a problem (RFC 9457), or not at all (status 0)."""

    def __init__(self, status: int, title: str, detail: str,
                 job_created: bool | None = None) -> None:
        super().__init__(f"{title} ({status}): {detail}" if detail else f"{title} ({status})")
        self.status = status
        self.title = title
        self.detail = detail
        # False when the gateway's problem states that no job was created (a refused
        # submission); None when it does not say
        self.job_created = job_created


class DatasetNameTaken(ParameterError):
    """The owner already has a data set of this name at the gateway."""


class MissingField(RefusedAnswer, KeyError):
    """A field the gateway's answer lacks (a KeyError too, for code that expects one)."""

    def __str__(self) -> str:
        return Exception.__str__(self)


class Answer(dict[str, Any]):
    """A JSON object the gateway sent: a field it lacks is refused (MissingField naming
    the field), not a bare KeyError deep inside the client."""

    def __missing__(self, key: str) -> Any:
        raise MissingField(f"the gateway's answer lacks the field {str(key)[:40]!r}")


def parse_answer(body: bytes, what: str) -> Any:
    """The JSON the gateway sent (objects as :class:`Answer`); RefusedAnswer if it is not
    JSON."""
    try:
        return json.loads(body, object_hook=Answer)
    except (ValueError, RecursionError):
        raise RefusedAnswer(f"the gateway's answer to {what} is not JSON") from None


def _is_token(token: str) -> bool:
    return bool(token) and all("!" <= ch <= "~" for ch in token)


def _as_object(got: Any, what: str) -> dict[str, Any]:
    if not isinstance(got, dict):
        raise RefusedAnswer(f"the gateway's answer to {what} is not a JSON object")
    return got


def _as_objects(got: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(got, list) or not all(isinstance(x, dict) for x in got):
        raise RefusedAnswer(f"the gateway's answer to {what} is not a list of JSON objects")
    return got


@dataclass(frozen=True)
class PartyInfo:
    index: int
    name: str
    box_public_key: bytes
    signing_public_key: bytes
    mpc_address: str
    engines: tuple[str, ...]
    # the end of its key statement, as checked against the trust anchor
    keys_valid_until: dt.datetime | None = None


@dataclass(frozen=True)
class Withdrawn:
    """What became of an owner's withdrawal: the parties whose signed receipt confirms
    it (with the uploads each deleted now), the parties not confirmed and why, and the
    uploads the gateway says it took out of its record."""

    dataset_id: str
    confirmed: tuple[tuple[str, tuple[str, ...]], ...]
    unconfirmed: tuple[tuple[str, str], ...]
    removed: tuple[str, ...]


@dataclass(frozen=True)
class Revoked:
    """What became of an owner's revocation of its consents to ``recipient``: the
    parties whose signed receipt confirms it (with how many of their unfinished jobs
    they stopped), the parties not confirmed and why, and the consents (SHA-256) the
    gateway says it took out of its record."""

    dataset_id: str
    recipient: str
    confirmed: tuple[tuple[str, int], ...]
    unconfirmed: tuple[tuple[str, str], ...]
    removed: tuple[str, ...]


@dataclass(frozen=True)
class Holdings:
    """What each party states, signed with its own key, that it holds of an owner's
    uploads of a data set (answering the owner's fresh challenge), and the parties whose
    statement did not come or did not check, with why."""

    dataset_id: str
    confirmed: tuple[tuple[str, tuple[Held, ...]], ...]
    unconfirmed: tuple[tuple[str, str], ...]

    @functools.cached_property
    def _by_id(self) -> tuple[dict[str, Held], ...]:
        # each party's statement by upload id (its first entry of an id), so that checking
        # every one of an owner's thousands of uploads reads each statement once
        return tuple({u.upload_id: u for u in reversed(held)} for _, held in self.confirmed)

    def missing(self, upload_id: str, manifest_sha256: str) -> list[tuple[str, str]]:
        """(party name, why) for every party not confirming that it holds the upload
        of this manifest committed."""
        out = list(self.unconfirmed)
        for (name, _), by_id in zip(self.confirmed, self._by_id, strict=True):
            h = by_id.get(upload_id)
            if h is None:
                out.append((name, f"its signed statement does not list upload {upload_id}"))
            elif h.manifest_sha256 != manifest_sha256:
                out.append((name, f"it holds another manifest under upload id {upload_id}"))
            elif h.status != "committed":
                out.append((name, f"it holds upload {upload_id} {h.status}, not committed"))
        return out


R = TypeVar("R")


def _receipts(
    dep: Deployment, got: dict[str, Any], check: Callable[[PartyInfo, bytes, bytes], R]
) -> tuple[list[tuple[str, R]], list[tuple[str, str]]]:
    """Each party's receipt in the gateway's answer, checked by ``check`` (which raises
    ReceiptRejected): (party name, what ``check`` returns) for those that hold, (party
    name, why) for the others, in party order."""
    answers: dict[int, dict[str, Any]] = {}
    listed = got.get("parties")
    # the gateway's words: anything but a list names no party's receipt
    for a in listed if isinstance(listed, list) else ():
        if isinstance(a, dict) and isinstance(a.get("index"), int):
            answers.setdefault(a["index"], a)
    confirmed, unconfirmed = [], []
    for party in dep.parties:
        a = answers.get(party.index, {})
        try:
            done = check(party, base64.b64decode(str(a.get("receipt", ""))),
                         base64.b64decode(str(a.get("receipt_signature", ""))))
        except (ReceiptRejected, binascii.Error, ValueError) as exc:
            said = str(a.get("error", ""))[:300]
            unconfirmed.append((party.name, (said if said and not a.get("receipt")
                                             else str(exc)) or "no answer"))
            continue
        confirmed.append((party.name, done))
    return confirmed, unconfirmed


def _removed(got: dict[str, Any]) -> tuple[str, ...]:
    removed = got.get("removed", [])
    return tuple(str(u) for u in removed) if isinstance(removed, list) else ()


@dataclass(frozen=True)
class Deployment:
    parties: tuple[PartyInfo, ...]
    scheme: Scheme
    securities: tuple[str, ...]
    fixed_point: FixedPoint
    # the deployment CA's revocation list the gateway relayed, when it is the CA's (checked
    # against the trust anchor; whether fresh enough is checked for each key statement
    # that asks for it)
    revocations: RevocationList | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any], trust: TrustAnchor) -> Deployment:
        """The deployment as the gateway describes it, every party's keys checked against
        the trust anchor (UntrustedPartyKey naming the first party that fails). The
        encoding and the sharing scheme are this client's own (the fixed-point parameters
        every party computes with, the scheme that the number of certified parties
        implies): a gateway describing others is refused, not followed (RefusedAnswer, as
        for a description that does not parse)."""
        try:
            return cls._from_json(d, trust)
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise RefusedAnswer("the gateway's description of the deployment is malformed") \
                from None

    @classmethod
    def _from_json(cls, d: dict[str, Any], trust: TrustAnchor) -> Deployment:
        fp = d["fixed_point"]
        parties = []
        relayed_ca = str(d.get("deployment_ca_pem", "")).encode()
        revocations = (base64.b64decode(str(d.get("revocation_list", ""))),
                       base64.b64decode(str(d.get("revocation_list_signature", ""))))
        for pos, p in enumerate(d["parties"]):
            info = PartyInfo(
                int(p["index"]),
                str(p["name"]),
                base64.b64decode(p["box_public_key"]),
                base64.b64decode(p["signing_public_key"]),
                p["mpc_address"],
                tuple(p["engines"]),
            )
            if info.index != pos or pos >= len(PARTY_NAMES) or info.name != PARTY_NAMES[pos]:
                raise UntrustedPartyKey(
                    f"the gateway lists party {info.index} ({info.name}) in place {pos}"
                )
            st = verify_party_keys(
                trust, index=info.index, name=info.name, box_public_key=info.box_public_key,
                signing_public_key=info.signing_public_key,
                statement=base64.b64decode(p.get("key_statement", "")),
                signature=base64.b64decode(p.get("key_statement_signature", "")),
                relayed_ca_pem=relayed_ca, revocations=revocations,
            )
            parties.append(replace(info, keys_valid_until=st.end))
        if len(parties) not in (3, 4):
            raise UntrustedPartyKey(f"the gateway lists {len(parties)} parties, not 3 or 4")
        scheme, own = Scheme.for_parties(len(parties)), FixedPoint()
        said = (fp["frac_bits"], fp["value_bits"], fp["target_bits"])
        if said != (own.frac_bits, own.value_bits, own.target_bits):
            raise RefusedAnswer(
                f"the gateway describes a fixed-point encoding {said} (fractional, value, "
                f"target bits) other than the one the parties compute with "
                f"{(own.frac_bits, own.value_bits, own.target_bits)}: nothing is encoded with it"
            )
        if d["scheme"] != scheme.value:
            raise RefusedAnswer(
                f"the gateway describes the sharing scheme {d['scheme']!r} for "
                f"{len(parties)} certified parties (that is {scheme.value!r})"
            )
        return cls(parties=tuple(parties), scheme=scheme,
                   securities=tuple(str(x) for x in d["securities"]), fixed_point=own,
                   revocations=relayed_list(d, trust))


def relayed_list(d: dict[str, Any], trust: TrustAnchor) -> RevocationList | None:
    """The revocation list in the gateway's description of the deployment if the
    deployment CA signed it (whether fresh or not); None otherwise (shown when it is the
    CA's; required, and checked, where a party's statement asks for it)."""
    try:
        relayed_ca = str(d.get("deployment_ca_pem", "")).encode()
        revocations = (base64.b64decode(str(d.get("revocation_list", ""))),
                       base64.b64decode(str(d.get("revocation_list_signature", ""))))
        if not revocations[0]:
            return None
        return open_revocations(trust.ca_certificate(relayed_ca), trust.sha256, *revocations)
    except (UntrustedPartyKey, ValueError, TypeError, AttributeError, binascii.Error):
        return None


@dataclass(frozen=True)
class OwnerTable:
    """One data owner's columns; the label (class indices) only if this owner holds it."""

    columns: tuple[str, ...]
    x: np.ndarray  # (m, p) float64
    label_column: str = ""
    classes: tuple[str, ...] = ()
    y: np.ndarray | None = None

    @property
    def m(self) -> int:
        return int(self.x.shape[0])

    def one_hot(self) -> np.ndarray:
        assert self.y is not None
        eye = np.eye(len(self.classes), dtype=np.int64)
        return eye[self.y][:, : len(self.classes) - 1]


@dataclass
class ResultSelection:
    """What the recipient learns: the selected columns, best first, and the model if trained.

    D' is never opened in service mode: its rows are the data owners' data.
    """

    job_id: str
    columns: list[str]
    indices: np.ndarray
    opened_words: int  # how many masked words the parties opened (k, plus the model)
    parties: int
    model: Any = None  # ppfs.step2b.Model when the job trained (Step 2B)


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str = True,
        trust: TrustAnchor | None = None,
    ) -> None:
        # the deployment CA (or its fingerprint) every party's keys must be certified by;
        # without it nothing is sealed to a party and no result is opened
        self.trust = trust
        # a CA bundle path (an HTTPS gateway with a deployment certificate) or True/False
        try:
            tls: bool | ssl.SSLContext = (
                ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
            )
        except (OSError, ssl.SSLError):
            raise ParameterError(
                f"{verify}: not a readable CA bundle (PEM) for the gateway's HTTPS") from None
        if not _is_token(token):
            raise ParameterError(
                "the bearer token holds characters no token has (only printable ASCII, "
                "no spaces)")
        # the whole of one answer must arrive within ``timeout``: a gateway that drips
        # bytes cannot hold the client for longer than a silent one
        self._deadline = timeout
        self._max_answer = MAX_ANSWER_BYTES
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=tls,
            # a redirect is an answer like any other (refused): the token never follows
            # it to another place
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def _unreachable(self, exc: httpx.HTTPError) -> ApiError:
        """The gateway did not answer: say where it was looked for (scheme, host and port
        only: never a path, query or user part of the URL)."""
        url = self._http.base_url
        host = f"[{url.host}]" if ":" in url.host else url.host
        where = f"{url.scheme}://{host}" + (f":{url.port}" if url.port else "")
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
            # it was reached, then went away (stopped, killed, restarted) mid-request
            return ApiError(0, "gateway connection lost",
                            f"the gateway at {where} dropped the connection before it "
                            f"answered ({type(exc).__name__})")
        return ApiError(0, "gateway unreachable",
                        f"{type(exc).__name__} at {where} (PPFS_GATEWAY or --gateway)")

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, *, body: Any = None, content: Any = None,
              headers: dict[str, str] | None = None) -> tuple[httpx.Response, bytes]:
        """One request; its answer read whole, but never more than ``self._max_answer``
        bytes nor for longer than the timeout (ApiError status 0 or RefusedAnswer)."""
        what = f"{method} {path.split('?')[0]}"
        start = time.monotonic()
        try:
            request = self._http.build_request(method, path, json=body, content=content,
                                               headers=headers)
            resp = self._http.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        try:
            # an upload's body may take long to send; the answer itself must not
            deadline = (time.monotonic() if content is not None else start) + self._deadline
            declared = resp.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_answer:
                raise RefusedAnswer(
                    f"the gateway's answer to {what} is {int(declared)} bytes long, more than "
                    f"the {self._max_answer} this client reads")
            got = bytearray()
            for chunk in resp.iter_bytes():
                got += chunk
                if len(got) > self._max_answer:
                    raise RefusedAnswer(
                        f"the gateway's answer to {what} is longer than the "
                        f"{self._max_answer} bytes this client reads")
                if time.monotonic() > deadline:
                    raise ApiError(0, "gateway too slow",
                                   f"its answer to {what} took more than {self._deadline:g} s")
            return resp, bytes(got)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        finally:
            resp.close()

    @staticmethod
    def _check(resp: httpx.Response, body: bytes, what: str = "a request") -> Any:
        if 300 <= resp.status_code < 400:
            raise ApiError(resp.status_code, "the gateway redirected the request elsewhere",
                           "not followed")
        if resp.status_code >= 400 or resp.status_code < 200:
            try:
                p = json.loads(body)
            except (ValueError, RecursionError):
                p = None
            if not isinstance(p, dict):
                raise ApiError(resp.status_code, resp.reason_phrase or "error", "")
            raise ApiError(resp.status_code, str(p.get("title", ""))[:200],
                           str(p.get("detail", ""))[:2000],
                           job_created=False if p.get("job_created") is False else None)
        return parse_answer(body, what)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        resp, got = self._send(method, path, body=body)
        return self._check(resp, got, f"{method} {path.split('?')[0]}")

    # -- plain calls -----------------------------------------------------------------

    def deployment(self, keys: ClientKeys | None = None) -> Deployment:
        """The parties with keys verified against the trust anchor (NoTrustAnchor without
        one, UntrustedPartyKey naming a party whose keys do not verify). With ``keys``
        (a key file on disk), the CA's revocation list the gateway relayed is checked
        against the newest this key file accepted, and remembered if newer
        (:meth:`check_revocation_list`)."""
        return self.deployment_answer(keys)[0]

    def deployment_answer(
        self, keys: ClientKeys | None = None
    ) -> tuple[Deployment, dict[str, Any]]:
        """:meth:`deployment` and the one answer it was verified from."""
        if self.trust is None:
            raise NoTrustAnchor()
        raw = _as_object(self._call("GET", "/v1/deployment"), "GET /v1/deployment")
        try:
            dep = Deployment.from_json(raw, self.trust)
        except (UntrustedPartyKey, RefusedAnswer):
            # refused (a party's keys revoked by this very list, say): a newer list of the
            # CA is remembered all the same, so that an older one replayed later, which
            # does not name those keys, is refused too
            rl = relayed_list(raw, self.trust) if keys is not None else None
            if keys is not None and rl is not None:
                with contextlib.suppress(ReplayedRevocationList, ParameterError, OSError):
                    check_and_remember(keys, rl.ca, rl)
            raise
        if keys is not None:
            self.check_revocation_list(keys, dep)
        return dep, raw

    def check_revocation_list(self, keys: ClientKeys, dep: Deployment) -> Deployment:
        """``dep``, unless the revocation list it came with is older than the newest this
        key file accepted from the same CA, or another list of the same issue time:
        ReplayedRevocationList (before anything is sealed or opened). A newer list is
        remembered (ppfs_client.seen_lists); without a key file on disk nothing is."""
        if dep.revocations is not None:
            check_and_remember(keys, dep.revocations.ca, dep.revocations)
        return dep

    def _deployment_for(self, keys: ClientKeys, deployment: Deployment | None) -> Deployment:
        """``deployment`` (one the caller fetched), checked against this key file's
        newest revocation list; or, none given, the deployment fetched and checked."""
        if deployment is None:
            return self.deployment(keys)
        return self.check_revocation_list(keys, deployment)

    def party_notes(self, count: int) -> list[str]:
        """What each of ``count`` parties does now that a user should know, as the
        gateway's probe (GET /v1/deployment/status) says, in party order: "stopping"
        (told to stop, it takes no new job until it is back), "not answering", or "".
        For showing only (the gateway may say anything here; nothing is trusted on it,
        and no text of its answer is shown). [] when the gateway does not say."""
        try:
            got = self._call("GET", "/v1/deployment/status")
            parties = got["parties"]
            if not isinstance(parties, list) or len(parties) != count:
                return []
            notes = []
            for p in parties:
                if p.get("stopping") is True:
                    notes.append("stopping: it takes no new job until it is back")
                elif p.get("reachable") is False:
                    notes.append("not answering")
                else:
                    notes.append("")
            return notes
        except (ApiError, RefusedAnswer, KeyError, TypeError, AttributeError):
            return []

    def create_dataset(
        self, name: str, kind: str = "data", owner_id: str | None = None
    ) -> dict[str, Any]:
        """Create a data set as asked (:meth:`new_dataset` first checks the owner has
        none of that name)."""
        body: dict[str, Any] = {"name": name, "kind": kind}
        if owner_id:
            body["owner_id"] = owner_id
        return _as_object(self._call("POST", "/v1/datasets", body), "POST /v1/datasets")

    def list_datasets(self, kind: str = "data") -> list[dict[str, Any]]:
        return _as_objects(self._call("GET", f"/v1/datasets?kind={kind}"), "GET /v1/datasets")

    def new_dataset(self, keys: ClientKeys, name: str) -> dict[str, Any]:
        """Create a data set named ``name`` for this key's owner; DatasetNameTaken, before
        anything is created, if the owner already has one of that name (a second would
        split the owner's rows between two data sets nobody can tell apart)."""
        for d in self.list_datasets("data"):
            if d.get("owner_id") == keys.subject and d.get("name") == name:
                raise DatasetNameTaken(
                    f"{keys.subject} already has a data set named {name!r}: {d['id']}; to add "
                    f"rows to it, upload with --into {d['id']}; otherwise pick another name")
        return self.create_dataset(name)

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return _as_object(self._call("GET", f"/v1/datasets/{dataset_id}"), "a data set")

    def grant(self, dataset_id: str, subject: str) -> dict[str, Any]:
        return _as_object(self._call("POST", f"/v1/datasets/{dataset_id}/grants",
                                     {"subject": subject}), "a grant")

    def consent(
        self, keys: ClientKeys, dataset_id: str, recipient: str, recipient_key: bytes,
        reveal: Reveal = Reveal.SELECTION, expires_at: str = "", max_jobs: int = 0,
        min_rows: int = 0, min_own_rows: int = 0, securities: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Sign (with the owner's key) and store a consent: jobs on this data set may
        reveal ``reveal`` to ``recipient`` holding ``recipient_key`` (with ``expires_at``,
        UTC ``YYYY-MM-DDTHH:MM:SSZ``: until then; with ``max_jobs``: for that many jobs,
        counted by every party; with ``min_rows``: only for jobs that pin at least that
        many rows of the data set, counted by every party from the manifests it holds;
        with ``min_own_rows``: only for jobs that pin at least that many rows from the
        owner's own uploads, other owners' rows not counted; with ``securities``, security
        setting names such as ``("active-3pc", "active-4pc")``: only for jobs run in one
        of them; parties of an earlier version refuse such a consent). Every party checks
        it itself before it runs a job on the owner's uploads."""
        if isinstance(securities, str):  # "active-3pc,active-4pc", as on the command line
            securities = securities.split(",")
        try:
            signed = Consent(keys.subject, dataset_id, recipient, recipient_key, reveal,
                             expires_at=expires_at, max_jobs=max_jobs,
                             min_rows=min_rows, min_own_rows=min_own_rows,
                             securities=consent_securities(securities) if securities
                             else frozenset()).sign(keys.signing)
        except ValueError as exc:
            raise ParameterError(f"consent: {exc}") from None
        body = {"statement": base64.b64encode(signed.statement).decode(),
                "signature": base64.b64encode(signed.signature).decode()}
        return _as_object(self._call("POST", f"/v1/datasets/{dataset_id}/consents", body),
                          "a consent")

    def list_consents(self, dataset_id: str) -> list[dict[str, Any]]:
        return _as_objects(self._call("GET", f"/v1/datasets/{dataset_id}/consents"),
                           "the consents")

    def post_upload(
        self, dataset_id: str, body: dict[str, Any], progress: Progress | None = None
    ) -> dict[str, Any]:
        blob = json.dumps(body).encode()
        total = len(blob)

        def chunks() -> Iterator[bytes]:
            step = 1 << 18
            for off in range(0, total, step):
                yield blob[off : off + step]
                if progress:
                    progress(min(off + step, total), total)

        resp, got = self._send(
            "POST", f"/v1/datasets/{dataset_id}/uploads", content=chunks(),
            headers={"Content-Type": "application/json", "Content-Length": str(total)},
        )
        return _as_object(self._check(resp, got, "an upload"), "an upload")

    def submit_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return _as_object(self._call("POST", "/v1/jobs", body), "POST /v1/jobs")

    def get_job(self, job_id: str) -> dict[str, Any]:
        return _as_object(self._call("GET", f"/v1/jobs/{job_id}"), "a job")

    def list_jobs(self) -> list[dict[str, Any]]:
        return _as_objects(self._call("GET", "/v1/jobs"), "GET /v1/jobs")

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return _as_object(self._call("POST", f"/v1/jobs/{job_id}/cancel"), "a cancel")

    def result_parts(self, job_id: str) -> dict[str, Any]:
        return _as_object(self._call("GET", f"/v1/jobs/{job_id}/result"), "a result")

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job as it changes (server-sent events), until it reaches a final state."""
        # no end to the stream as a whole (a job runs as long as it runs), but the
        # gateway's keep-alives must come, and no line is read past MAX_EVENT_LINE
        timeout = httpx.Timeout(self._deadline, read=max(self._deadline, EVENT_SILENCE))
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=timeout) as resp:
                if not 200 <= resp.status_code < 300:
                    got = bytearray()
                    for chunk in resp.iter_bytes():
                        got += chunk
                        if len(got) > MAX_EVENT_LINE:
                            break
                    self._check(resp, bytes(got[:MAX_EVENT_LINE]), "the job's events")
                event = ""
                for line in _lines(resp.iter_bytes(), MAX_EVENT_LINE):
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "job":
                        yield _as_object(parse_answer(line[5:].encode(), "the job's events"),
                                         "the job's events")
                    elif line.startswith("data:") and event == "end":
                        return
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    # -- what a data owner does ------------------------------------------------------

    def upload_table(
        self,
        keys: ClientKeys,
        table: OwnerTable,
        dataset_id: str,
        *,
        exponents: Sequence[int] | None = None,
        deployment: Deployment | None = None,
        progress: Progress | None = None,
        again: bool = False,
        source: str = "",
        confirm: bool = True,
    ) -> dict[str, Any]:
        """Encode, share, seal and send ``table`` into ``dataset_id``. With ``confirm``
        (the default), every party must then state, signed with its own key and
        answering a fresh challenge, that it holds the upload committed
        (:meth:`holdings`): UploadNotConfirmed, naming the party, otherwise, since the
        gateway's word that it was added is not enough. RepeatedUpload,
        before anything is sent, if this key file already sent the same rows into that
        data set (:meth:`refuse_repeated_upload`; ``again=True``: send them once more all
        the same). ``source``: where the table was read from, for that message."""
        digest = table_digest(keys, table)  # kept on this machine only, never sent
        dep = self._deployment_for(keys, deployment)
        replaces = () if again else self.refuse_repeated_upload(
            keys, dataset_id, digest, source=source, deployment=dep if confirm else None)
        body = build_upload(keys, table, dataset_id, dep, exponents=exponents,
                            supersedes=replaces)
        # kept before it leaves: for `ppfs datasets repair`, and so that a retry of an
        # upload whose answer never came is checked against what became of it
        save_sent(keys, dataset_id, body, table_sha256=digest)
        try:
            added = self.post_upload(dataset_id, body, progress)
        except ApiError as exc:
            if exc.status != 0:
                raise
            upload_id = body["upload_id"]
            raise ApiError(0, exc.title, (
                f"{exc.detail}. Upload {upload_id} into data set {dataset_id} did not "
                "complete as far as this client saw: the gateway adds an upload only once "
                "every party stored its part, and aborts it at every party if it stops "
                "before that. Running the same upload again (--into "
                f"{dataset_id}) once the gateway answers is safe: the rows are sent again "
                f"only if upload {upload_id} was neither added nor is still held by a party"
            )) from None
        if confirm:
            upload_id = str(body["upload_id"])
            digest = hashlib.sha256(base64.b64decode(body["manifest"])).hexdigest()
            if missing := self.holdings(keys, dataset_id, dep).missing(upload_id, digest):
                raise UploadNotConfirmed(
                    f"the gateway says upload {upload_id} was added to data set "
                    f"{dataset_id}, but " + "; ".join(f"{n} did not confirm it holds it: "
                                                      f"{why}" for n, why in missing)
                    + f". `ppfs datasets holdings {dataset_id}` asks the parties again; "
                    f"`ppfs datasets repair {dataset_id}` re-sends a part a party lost")
            added["confirmed_by"] = [p.name for p in dep.parties]
        return added

    def refuse_repeated_upload(
        self, keys: ClientKeys, dataset_id: str, digest: str, *, source: str = "",
        deployment: Deployment | None = None,
    ) -> tuple[str, ...]:
        """RepeatedUpload if this key file already sent the table of ``digest``
        (:func:`ppfs_client.sent.table_digest`) into ``dataset_id`` and that upload was
        added, or may still be (a party holds its part). Only when a kept record matches
        is the gateway asked, and only for the data set's uploads by id: the digest never
        leaves this machine. An earlier upload that the gateway neither recorded nor any
        party holds was refused or cut off and aborted: its rows were never added. Those
        earlier uploads' ids (the most recent :data:`ppfs.upload.MAX_SUPERSEDED`), for the
        new upload to replace (:attr:`ppfs.upload.Manifest.supersedes`): the parties then
        enforce, whatever the gateway answered here, that at most one of them is used.
        With ``deployment``, an earlier upload the gateway records as added counts as
        added only once every party states, signed, that it holds it committed (as after
        an upload, :meth:`holdings`): UploadNotConfirmed, naming the party, otherwise (a
        retry of an upload whose answer never came would else take the gateway's word)."""
        earlier = earlier_uploads(keys, dataset_id, digest)
        if not earlier:
            return ()
        try:
            check = self.check_dataset(dataset_id)
            recorded = {str(u["upload_id"]) for u in check["recorded"]}
            held = {str(h["upload_id"]): str(p["name"])
                    for p in check["parties"] if p["reachable"] for h in p["held"]}
        except (ApiError, RefusedAnswer, KeyError, TypeError) as exc:
            raise repeat_refused(
                earlier[-1], dataset_id,
                f"whether it was added is not known: the data set's check failed: {exc}",
                source=source) from None
        for e in earlier:
            if e.upload_id in recorded:
                if deployment is not None:
                    self._confirm_earlier(keys, dataset_id, e, check, deployment)
                raise repeat_refused(e, dataset_id, "it is part of the data set",
                                     source=source)
        for e in earlier:
            if e.upload_id in held:
                raise repeat_refused(
                    e, dataset_id,
                    f"it is not part of the data set, but {held[e.upload_id]} still holds "
                    f"its part: it may yet be added or dropped; `ppfs datasets check "
                    f"{dataset_id}` shows when it is settled", source=source)
        return tuple(e.upload_id for e in earlier[-MAX_SUPERSEDED:])

    def _confirm_earlier(self, keys: ClientKeys, dataset_id: str, e: EarlierUpload,
                         check: dict[str, Any], deployment: Deployment) -> None:
        """UploadNotConfirmed unless every party states, signed, that it holds the
        earlier upload ``e`` committed, under the manifest this key file kept for it (or,
        none kept, the one the gateway records)."""
        try:
            manifest = hashlib.sha256(base64.b64decode(load_sent(keys, e.upload_id)[
                "manifest"])).hexdigest()
        except (ParameterError, OSError, ValueError, KeyError, TypeError):
            manifest = next((str(u.get("manifest_sha256", "")) for u in check["recorded"]
                             if str(u.get("upload_id")) == e.upload_id), "")
        missing = self.holdings(keys, dataset_id, deployment).missing(e.upload_id, manifest)
        if missing:
            raise UploadNotConfirmed(
                f"these rows were already sent into data set {dataset_id} as upload "
                f"{e.upload_id} at {e.sent_at}, and the gateway says it was added, but "
                + "; ".join(f"{n} did not confirm it holds it: {why}" for n, why in missing)
                + f". `ppfs datasets holdings {dataset_id}` asks the parties again; "
                f"`ppfs datasets repair {dataset_id}` re-sends a part a party lost; sent "
                "again (--again), the rows would count twice wherever the earlier upload "
                "is held")

    # -- all-or-nothing uploads: what every party holds, and repairs ------------------

    def check_dataset(self, dataset_id: str) -> dict[str, Any]:
        return _as_object(self._call("GET", f"/v1/datasets/{dataset_id}/check"), "a check")

    def repair_dataset(self, keys: ClientKeys, dataset_id: str) -> list[tuple[str, str]]:
        """Re-send this owner's original sealed part to every party that lost it;
        returns (upload id, party name) of each repair."""
        check = self.check_dataset(dataset_id)
        mine = {u["upload_id"] for u in check["recorded"] if u["owner_id"] == keys.subject}
        done = []
        for p in check["parties"]:
            for upload_id in p["missing"]:
                if upload_id not in mine:
                    continue
                sent = load_sent(keys, upload_id)
                # signed for this upload and party: a party that expired the part
                # stores it again only with it (the gateway cannot bring it back alone)
                repair, signature = Repair.now(base64.b64decode(sent["manifest"]),
                                               p["index"]).sign(keys.signing)
                self._call(
                    "POST",
                    f"/v1/datasets/{dataset_id}/uploads/{upload_id}/repair",
                    {
                        "party": p["index"],
                        "manifest": sent["manifest"],
                        "manifest_signature": sent["manifest_signature"],
                        "part": sent["parts"][p["index"]],
                        "repair": base64.b64encode(repair).decode(),
                        "repair_signature": base64.b64encode(signature).decode(),
                    },
                )
                done.append((upload_id, p["name"]))
        return done

    def holdings(self, keys: ClientKeys, dataset_id: str,
                 deployment: Deployment | None = None) -> Holdings:
        """What every party holds of this owner's uploads of the data set, each in its
        own words: a fresh random challenge goes to every party through the gateway, and
        each party's statement is checked against its certified key and the challenge
        (the gateway can neither forge one nor replay an old one)."""
        dep = self._deployment_for(keys, deployment)
        challenge = new_challenge()
        got = _as_object(self._call(
            "POST", f"/v1/datasets/{dataset_id}/holdings",
            {"challenge": base64.b64encode(challenge).decode()}), "a statement of holdings")
        confirmed, unconfirmed = _receipts(
            dep, got, lambda party, statement, sig: open_holdings(
                keys.subject, dataset_id, challenge, party.index, party.name,
                party.signing_public_key, statement, sig).uploads)
        return Holdings(dataset_id, tuple(confirmed), tuple(unconfirmed))

    def withdraw(self, keys: ClientKeys, dataset_id: str,
                 deployment: Deployment | None = None) -> Withdrawn:
        """Withdraw every upload this owner made into the data set up to now: signed
        with the owner's key, relayed by the gateway, carried out by each party, which
        checks the signature itself. Each party's receipt is checked against its
        certified key (the gateway cannot forge one): a party is confirmed only by its
        own signed receipt stating it holds none of those uploads. Asking again is safe
        (a party that confirmed deletes nothing more)."""
        dep = self._deployment_for(keys, deployment)
        signed = Withdrawal.now(keys.subject, dataset_id).sign(keys.signing)
        got = self._relay(f"/v1/datasets/{dataset_id}/withdraw", signed, "a withdrawal")
        confirmed, unconfirmed = _receipts(dep, got, lambda party, receipt, sig: open_receipt(
            signed, party.index, party.name, party.signing_public_key, receipt, sig).deleted)
        return Withdrawn(dataset_id, tuple(confirmed), tuple(unconfirmed), _removed(got))

    def revoke_consents(self, keys: ClientKeys, dataset_id: str, recipient: str,
                        deployment: Deployment | None = None) -> Revoked:
        """Revoke every consent this owner gave ``recipient`` for the data set up to now,
        those the gateway does not list included: signed with the owner's key, relayed
        by the gateway, kept by each party, which checks the signature itself and from
        then on runs no job on them. Each party is confirmed only by its own signed
        receipt, as for :meth:`withdraw`. Asking again is safe."""
        dep = self._deployment_for(keys, deployment)
        signed = Revocation.now(keys.subject, dataset_id, recipient).sign(keys.signing)
        got = self._relay(f"/v1/datasets/{dataset_id}/consents/revoke", signed,
                          "a revocation")
        confirmed, unconfirmed = _receipts(
            dep, got, lambda party, receipt, sig: open_revocation_receipt(
                signed, party.index, party.name, party.signing_public_key, receipt,
                sig).jobs_stopped)
        return Revoked(dataset_id, recipient, tuple(confirmed), tuple(unconfirmed),
                       _removed(got))

    def _relay(self, path: str, signed: SignedWithdrawal | SignedRevocation, what: str
               ) -> dict[str, Any]:
        return _as_object(self._call("POST", path, {
            "statement": base64.b64encode(signed.statement).decode(),
            "signature": base64.b64encode(signed.signature).decode()}), what)

    # -- what a result recipient does ------------------------------------------------

    def create_masks(
        self,
        keys: ClientKeys,
        count: int,
        *,
        deployment: Deployment | None = None,
    ) -> str:
        """Draw ``count`` mask words, keep them next to the key file, upload them shared.
        Returns the mask upload id a job names."""
        dep = self._deployment_for(keys, deployment)
        words = draw_mask_words(count)
        holder = self.create_dataset(f"masks-{count}", kind="mask")
        mask_table = OwnerTable(MASK_COLUMNS, words.astype(np.float64))
        upload_id = uuid.uuid4().hex
        keys.save_mask_words(upload_id, words)
        body = build_upload(
            keys,
            mask_table,
            holder["id"],
            dep,
            raw=words,
            kind="mask",
            upload_id=upload_id,
        )
        self.post_upload(holder["id"], body)
        return upload_id

    def submit(
        self,
        keys: ClientKeys,
        dataset_ids: Sequence[str],
        *,
        label: str,
        k: int,
        security: str = "passive-3pc",
        engine: str = "mp-spdz",
        combination: str = "horizontal",
        training: dict[str, Any] | None = None,
        mask_upload_id: str | None = None,
        scorer: str = "ms-gini",
    ) -> dict[str, Any]:
        """Submit a job; without ``mask_upload_id`` draw and upload fresh masks first. On
        data sets this key's subject owns, its consent to itself is given first.

        ``scorer``: ms-gini, pearson or chi2 (:class:`ppfs.scoring.Scorer`)."""
        # the parties' keys are checked before anything is signed, sealed or uploaded
        dep = self.deployment(keys) if mask_upload_id is None else None
        body: dict[str, Any] = {
            "dataset_ids": list(dataset_ids),
            "combination": combination,
            "label_column": label,
            "k": k,
            "security": security,
            "engine": engine,
            "recipient_public_key": base64.b64encode(keys.box_public_key).decode(),
        }
        if scorer != "ms-gini":
            body["scorer"] = scorer
        if training is not None:
            body["training"] = training
        count = 0
        if mask_upload_id is None:
            # every check first (nothing stored): a refused job leaves no consent or masks
            valid = self.validate_job(body)
            count = int(valid["outputs"])  # the selection (and the model); D' stays in MPC
        reveal = Reveal.MODEL if training is not None else Reveal.SELECTION
        for d in dataset_ids:
            if self.get_dataset(d)["owner_id"] == keys.subject:
                self.consent(keys, d, keys.subject, keys.box_public_key, reveal)
        if mask_upload_id is None:
            try:
                mask_upload_id = self.create_masks(keys, count, deployment=dep)
            except ApiError as exc:  # said as what it is: no upload of the analyst's own
                raise ApiError(exc.status, exc.title, "no job was submitted: uploading "
                               f"its output masks failed: {exc.detail}") from None
        body["mask_upload_id"] = mask_upload_id
        # what every party will check the job against: only what is asked here runs
        try:
            asked_training = training_body(training_from_body(training))
        except ParameterError:
            asked_training = training  # out of range: the gateway refuses the job, naming it
        req = JobRequest(
            recipient=keys.subject, recipient_public_key=keys.box_public_key,
            mask_upload_id=mask_upload_id, dataset_ids=tuple(dataset_ids),
            combination=combination, label_column=label, k=k, security=security,
            engine=engine, scorer=scorer, training=asked_training,
        ).sign(keys.signing)
        body["request"] = {"statement": base64.b64encode(req.statement).decode(),
                           "signature": base64.b64encode(req.signature).decode()}
        # kept before it leaves, so that whatever job it becomes opens only as its answer,
        # even if this process stops before the job id arrives
        keys.keep_pending_request(req)
        try:
            job = self.submit_job(body)
        except ApiError as exc:
            # refused (4xx), or a 5xx stating that no job was created (a party that did not
            # answer or failed, the gateway's disk): no job answers it. Taken on the
            # gateway's word, which gains a lying gateway nothing: the request is kept as
            # refused, and a result the parties signed as its answer is refused
            # (open_selection), as is that job passed off as another request's (its kept
            # request differs). A 5xx that does not say (a crash, a proxy's error page, a
            # time-out) may hide a job: the request stays pending.
            if 400 <= exc.status < 500 or exc.job_created is False:
                keys.drop_pending_request(req)
            raise
        # kept, so that this job's result opens only as the answer to this request
        try:
            keys.save_job_request(str(job.get("id", "")), req)
        except ParameterError as exc:
            raise ResultRejected(
                f"the gateway answered this request with an unusable job id ({exc}): "
                "it did not run this request as a job of its own"
            ) from None
        return job

    def validate_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return _as_object(self._call("POST", "/v1/jobs/validate", body),
                          "POST /v1/jobs/validate")

    def fetch_result(
        self, keys: ClientKeys, job_id: str, deployment: Deployment | None = None
    ) -> ResultSelection:
        dep = self._deployment_for(keys, deployment)
        job = self.get_job(job_id)
        if job.get("id") != job_id:
            raise ResultRejected(
                f"the gateway answered for job {job_id} with the record of another job: "
                "do not trust the gateway's answers"
            )
        got = self.result_parts(job_id)
        try:
            return open_selection(keys, job, got["parts"], dep)
        except (KeyError, TypeError, ValueError, AttributeError, binascii.Error):
            raise RefusedAnswer(f"the gateway's result of job {job_id} is malformed") from None


def _lines(chunks: Iterator[bytes], limit: int) -> Iterator[str]:
    """The lines of a byte stream, none longer than ``limit`` (RefusedAnswer)."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *whole, pending = pending.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        for line in whole:
            yield line.decode("utf-8", "replace")
        if len(pending) > limit:
            raise RefusedAnswer(f"the gateway sent an event line longer than {limit} bytes")
    if pending:
        yield pending.decode("utf-8", "replace")


def build_upload(
    keys: ClientKeys,
    table: OwnerTable,
    dataset_id: str,
    dep: Deployment,
    *,
    exponents: Sequence[int] | None = None,
    raw: np.ndarray | None = None,
    kind: str = "data",
    upload_id: str | None = None,
    supersedes: Sequence[str] = (),
) -> dict[str, Any]:
    """Encode, share, pack, seal per party and sign: the body of one upload
    (``supersedes``: the earlier uploads of the same rows it replaces)."""
    fp = dep.fixed_point
    if raw is None:
        exps = (
            np.asarray(exponents, dtype=np.int64)
            if exponents is not None
            else fp.choose_exponents(table.x, table.columns)
        )
        if len(exps) != len(table.columns):
            raise PpfsError("the schema's exponents do not match this table's columns")
        if exponents is not None:  # a schema's scales: not so coarse they erase this table
            fp.check_scales(table.x, exps, table.columns)
        raw = fp.encode(table.x, exps, table.columns)
        frac = fp.frac_bits
    else:
        exps = np.zeros(len(table.columns), dtype=np.int64)
        frac = 0
    upload_id = upload_id or uuid.uuid4().hex
    per_party: list[list[Any]] = [[] for _ in dep.parties]
    matrices = [(kind, raw, frac)]
    if table.label_column:
        matrices.append(("labels", table.one_hot(), 0))
    for k, matrix, f in matrices:
        for i, b in enumerate(
            bundles_for_all(matrix, dep.scheme, dataset_id=dataset_id, kind=k, frac_bits=f)
        ):
            per_party[i].append(b)
    sealed = [
        seal(pack_bundles(bundles), p.box_public_key)
        for bundles, p in zip(per_party, dep.parties, strict=True)
    ]
    manifest = Manifest(
        supersedes=tuple(supersedes),
        recipient_public_key=(base64.b64encode(keys.box_public_key).decode()
                              if kind == "mask" else ""),
        dataset_id=dataset_id,
        upload_id=upload_id,
        owner_id=keys.subject,
        scheme=dep.scheme.value,
        rows=table.m,
        columns=tuple(table.columns),
        column_exponents=tuple(int(e) for e in exps),
        label_column=table.label_column,
        classes=tuple(table.classes),
        frac_bits=frac if kind == "data" else fp.frac_bits,
        part_sha256=tuple(hashlib.sha256(s).hexdigest() for s in sealed),
        created_at=dt.datetime.now(dt.UTC).strftime(SIGNED_AT_FORMAT),
    )
    blob = manifest.to_bytes()
    return {
        "upload_id": upload_id,
        "manifest": base64.b64encode(blob).decode(),
        "manifest_signature": base64.b64encode(sign_manifest(manifest, keys.signing)).decode(),
        "parts": [base64.b64encode(s).decode() for s in sealed],
    }


def verified_statement(
    job_id: str, parts: Sequence[dict[str, Any]], dep: Deployment, keys: ClientKeys
) -> tuple[np.ndarray, ResultStatement]:
    """The opened words and the statement every party signed: exactly one part per
    party index, each signed by that party's certified key, all alike; ResultRejected
    naming the party otherwise."""
    n = len(dep.parties)
    try:
        indices = [int(p["party_index"]) for p in parts]
    except (KeyError, TypeError, ValueError):
        raise ResultRejected("a result part names no party") from None
    # counted once (the gateway decides how many parts there are), each repeat named
    # once: an answer of parts by the million is refused at once, in one short line
    counts = Counter(indices)
    repeated = sorted(i for i, c in counts.items() if c > 1)
    if repeated:
        raise ResultRejected(
            "the result holds more than one part of "
            + ", ".join(dep.parties[i].name if 0 <= i < n else f"party {i}"
                        for i in repeated[:n])
            + (" and of more" if len(repeated) > n else "")
            + ": do not trust this result"
        )
    missing = [dep.parties[i].name for i in range(n) if i not in counts]
    unknown = [i for i in indices if not 0 <= i < n]
    if missing or unknown:
        raise ResultRejected(
            "the result lacks the part of " + ", ".join(missing) if missing
            else f"the result holds a part of unknown party {unknown[0]}"
        )
    opened: list[tuple[PartyInfo, np.ndarray, ResultStatement]] = []
    for p in sorted(parts, key=lambda q: int(q["party_index"])):
        party = dep.parties[int(p["party_index"])]
        sealed = base64.b64decode(p["sealed"])
        try:
            words = open_result(job_id, sealed, base64.b64decode(p["signature"]),
                                party.signing_public_key, keys.box)
        except ShareFormatError as exc:
            raise ResultRejected(f"{party.name}'s part: {exc}") from None
        st = open_result_statement(
            job_id, party.index, sealed, base64.b64decode(p.get("statement", "")),
            base64.b64decode(p.get("statement_signature", "")), party.signing_public_key,
            party.name)
        opened.append((party, words, st))
    # every honest party opened the same words for this job and verified the same
    # manifests, so a party whose part differs from all the others' lied (or failed)
    _refuse_disagreement("result", [
        (party.name, (w.shape, w.tobytes())) for party, w, _ in opened])
    _refuse_disagreement("signed statement", [
        (party.name, json.dumps(s.decoding(), sort_keys=True)) for party, _, s in opened])
    _, words, st = opened[0]
    if base64.b64decode(st.recipient_public_key) != keys.box_public_key:
        raise ResultRejected("the parties sealed this result to another recipient key")
    return words, st


def _refuse_disagreement(what: str, told: Sequence[tuple[str, Any]]) -> None:
    """ResultRejected unless every party told the same; where all parties but one agree,
    the refusal names that one (at most one party is corrupted, and the gateway cannot
    sign for a party), otherwise it names no party as the one."""
    groups: dict[Any, list[str]] = {}
    for name, said in told:
        groups.setdefault(said, []).append(name)
    if len(groups) == 1:
        return
    alike = sorted(groups.values(), key=len)
    if len(alike) == 2 and len(alike[0]) == 1 and len(alike[1]) > 1:
        odd = alike[0][0]
        raise ResultRejected(
            f"the parties' {what}s disagree: {odd}'s differs from those of "
            f"{_and(alike[1])}, which agree ({odd} sent another {what} than the others): "
            "do not trust this result"
        )
    listed = ", ".join(
        f"{_and(names)} alike" if len(names) > 1 else f"{names[0]} alone"
        for names in groups.values())
    raise ResultRejected(
        f"the parties' {what}s disagree ({listed}): more than one party sent another "
        f"{what}: do not trust this result"
    )


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# what the recipient decodes with, as the gateway's job record and the parties' statement
# name it
_RECORD_FIELDS = ("m", "p", "k", "columns", "column_exponents", "classes", "frac_bits",
                  "mask_upload_id", "dataset_ids")


def open_selection(
    keys: ClientKeys, job: dict[str, Any], parts: Sequence[dict[str, Any]], dep: Deployment
) -> ResultSelection:
    """Verify, open and compare every party's part, then unmask (recipient side only).
    Decoded with what every party signed; the gateway's job record must agree with it."""
    job_id = job["id"]
    words, st = verified_statement(job_id, parts, dep, keys)
    asked = keys.load_job_request(job_id)
    if asked is None:  # submitted, but the client stopped before it kept the job id
        asked = keys.adopt_pending_request(job_id, st.request_sha256)
    if asked is None and keys.was_refused(st.request_sha256):
        raise ResultRejected(
            f"the gateway said no job was created for the request the parties ran as job "
            f"{job_id}: do not trust the gateway; submit again if you still want its answer"
        )
    if asked is not None and st.request_sha256 != hashlib.sha256(asked.statement).hexdigest():
        raise ResultRejected(
            f"the parties ran job {job_id} for another request than the one this key "
            "submitted as that job: do not trust this result as its answer"
        )
    signed = st.decoding()
    differ = [f for f in _RECORD_FIELDS if f in job and list(_listed(job[f])) != list(
        _listed(signed[f]))]
    if differ:
        raise ResultRejected(
            "the gateway's job record differs from what every party signed in "
            + ", ".join(differ) + ": do not trust the gateway's description of this job"
        )
    mask_words = keys.load_mask_words(st.mask_upload_id)
    if mask_words.shape[0] != words.size:
        raise ShareFormatError(f"expected {mask_words.shape[0]} opened words, got {words.size}")
    m, p, k, n_classes = st.m, st.p, st.k, len(st.classes)
    fp = FixedPoint(frac_bits=st.frac_bits)
    exps = np.asarray(st.column_exponents, dtype=np.int64)
    params = training_from_body(st.training)
    shape = service_shape(m, p, n_classes, k, fp.value_bits, params)
    if words.size != shape.outputs or st.outputs != shape.outputs:
        raise ShareFormatError(f"this job opens {shape.outputs} words, got {words.size}")
    out = unmask_all(words, mask_words, shape)
    idx = out.indices
    if np.any((idx < 0) | (idx >= p)) or len(set(idx.tolist())) != k:
        raise ShareFormatError("the opened selection is not a set of k distinct columns")
    model = None
    if params is not None:
        from ppfs.step2b import decode_model, split_model_words

        if out.model is None:
            raise ShareFormatError("the training job's result holds no model")
        alpha_full, beta = split_model_words(out.model, p, n_classes)
        model = decode_model(alpha_full, beta, exps, fp, params, st.columns, st.classes)
    return ResultSelection(
        job_id=job_id,
        columns=[st.columns[int(j)] for j in idx],
        indices=idx,
        opened_words=int(words.size),  # D' is never opened in service mode
        parties=len(dep.parties),
        model=model,
    )


def _listed(v: Any) -> Any:
    return v if isinstance(v, list | tuple) else [v]
