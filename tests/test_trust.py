"""An untrusted gateway cannot read, steer or relabel anything.

- party keys: a gateway that hands out its own keys for a party is refused by the
  client before anything is sealed, naming the party (the keys are certified by the
  deployment CA, ppfs.keycert);
- consent: a job on a data set for a recipient its owner never consented to is
  refused by every party on its own, and audited there (ppfs.contract.check_consents);
- results: a duplicated, missing or foreign-signed part, a relabelled job record, another
  job's result, or a result for another request than the one submitted as the job, is
  refused by `ppfs result fetch` (ppfs.contract.ResultStatement).

The malicious gateway is a test double in front of the real one: a reverse proxy
that rewrites what it relays.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import csv
import dataclasses
import datetime as dt
import json
import os
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import uvicorn
from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, SealedBox
from nacl.signing import SigningKey
from party_harness import (
    Deployment,
    data_upload,
    describe_job,
    fetch_opened,
    identities,
    mask_upload,
    start_requests,
    upload_messages,
    watch_to_end,
)
from ppfs_cli.main import main
from ppfs_client.sdk import ApiError
from ppfs_party.server import start_party_server
from service_fakes import RealCluster, Stack, horizontal_setup, make_stack, wait_final
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ppfs import oracle
from ppfs.contract import (
    Consent,
    JobContract,
    JobRequest,
    Reveal,
    SignedConsent,
    service_shape,
)
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.fixedpoint import FixedPoint
from ppfs.keycert import (
    KeyStatement,
    TrustAnchor,
    UntrustedPartyKey,
    ca_fingerprint,
    certify_party_keys,
    verify_party_keys,
)
from ppfs.pki import CertificateAuthority
from ppfs.scoring import Scorer
from ppfs.step2a import Security, draw_mask_words, mirror, unmask_all
from ppfs.synthetic import make_table
from ppfs.upload import Manifest
from ppfs.v1 import party_pb2
from ppfs.v1.party_pb2_grpc import PartyServiceStub

Rewrite = Callable[[str, str, Any], Any]  # (method, path, JSON) -> JSON


class EvilGateway:
    """A reverse proxy to the real gateway that rewrites JSON answers (``rewrite``)
    and records every request it relays."""

    def __init__(self, upstream: str, rewrite: Rewrite) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.requests: list[tuple[str, str, bytes]] = []
        app = Starlette(routes=[Route("/{path:path}", self._relay,
                                      methods=["GET", "POST", "PUT", "DELETE"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive()
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    async def _relay(self, request: Request) -> Response:
        body = await request.body()
        path = request.url.path
        self.requests.append((request.method, path, body))
        async with httpx.AsyncClient(base_url=self.upstream, timeout=30) as http:
            resp = await http.request(
                request.method, path + (f"?{request.url.query}" if request.url.query else ""),
                content=body, headers={k: v for k, v in request.headers.items()
                                       if k.lower() in ("authorization", "content-type")})
        content = resp.content
        if resp.headers.get("content-type", "").startswith("application/json"):
            content = json.dumps(self.rewrite(request.method, path, resp.json())).encode()
        return Response(content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))

    def posts(self) -> list[str]:
        return [path for method, path, _ in self.requests if method == "POST"]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def run(capsys: pytest.CaptureFixture[str], s: Stack, url: str, subject: str,
        *argv: str, anchor: str | None = None) -> tuple[int, str, str]:
    env = {"PPFS_GATEWAY": url, "PPFS_TOKEN": s.token[subject],
           "PPFS_KEY": str(s.keys[subject].path),
           "PPFS_DEPLOYMENT_CA": anchor if anchor is not None else str(s.ca_pem)}
    os.environ.update(env)
    try:
        rc = main(list(argv))
    finally:
        for k in env:
            os.environ.pop(k, None)
    out, err = capsys.readouterr()
    return rc, out, err


def write_csv(path: Path, t: Any) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*t.columns, "label"])
        for i in range(t.m):
            w.writerow([*(repr(float(v)) for v in t.x[i]), t.y[i]])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = make_stack(tmp_path_factory.mktemp("trust"))
    yield s
    s.close()


# -- party keys ------------------------------------------------------------------------


def _rogue_keys(victim: int, rogue_ca: CertificateAuthority | None) -> tuple[Rewrite, PrivateKey]:
    """A gateway that substitutes its own box and signing keys for one party's, keeping
    the real statement (rogue_ca None) or certifying its keys with its own CA."""
    box, signing = PrivateKey.generate(), SigningKey.generate()

    def rewrite(method: str, path: str, body: Any) -> Any:
        if path != "/v1/deployment":
            return body
        body = copy.deepcopy(body)
        p = body["parties"][victim]
        p["box_public_key"] = base64.b64encode(bytes(box.public_key)).decode()
        p["signing_public_key"] = base64.b64encode(bytes(signing.verify_key)).decode()
        if rogue_ca is not None:
            st, sig = certify_party_keys(rogue_ca.key, rogue_ca.cert, victim, p["name"],
                                         bytes(box.public_key), bytes(signing.verify_key))
            p["key_statement"] = base64.b64encode(st).decode()
            p["key_statement_signature"] = base64.b64encode(sig).decode()
            body["deployment_ca_pem"] = rogue_ca.cert_pem().decode()
        return body

    return rewrite, box


@pytest.mark.parametrize("forge", ["keys-only", "own-ca", "own-ca-vs-fingerprint"])
def test_gateway_substituting_party_keys_is_refused_before_sealing(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], forge: str
) -> None:
    rogue_ca = None if forge == "keys-only" else CertificateAuthority.create("rogue CA")
    rewrite, rogue_box = _rogue_keys(1, rogue_ca)
    anchor = str(stack.ca_pem)
    named = "party 1 (Bob)"
    if forge == "own-ca-vs-fingerprint":  # the client holds only the fingerprint
        anchor = ca_fingerprint(TrustAnchor.parse(anchor).cert)  # type: ignore[arg-type]
        # the relayed CA certificate is the rogue's: the first party checked fails
        named = "party 0 (Alice): the deployment CA certificate the gateway relayed"
    evil = EvilGateway(stack.gateway.url, rewrite)
    try:
        t = make_table(12, 3, seed=2)
        write_csv(tmp_path / "a.csv", t)
        rc, _, err = run(capsys, stack, evil.url, "owner-a", "upload", str(tmp_path / "a.csv"),
                         "--dataset", "d", "--label", "label", anchor=anchor)
        assert rc == 1, err
        assert named in err, err
        rc, _, err = run(capsys, stack, evil.url, "analyst-1", "jobs", "submit", "--dataset",
                         "x", "--label", "label", "--k", "1", anchor=anchor)
        assert rc == 1 and named in err, err
        # nothing was created, uploaded or submitted through it, and nothing it received
        # opens with the keys it handed out
        assert evil.posts() == []
        for _, _, body in evil.requests:
            for blob in re.findall(rb"[A-Za-z0-9+/]{64,}={0,2}", body):
                with pytest.raises((CryptoError, ValueError)):
                    SealedBox(rogue_box).decrypt(base64.b64decode(blob))
    finally:
        evil.stop()


def _describe(change: Callable[[dict[str, Any]], None]) -> Rewrite:
    def rewrite(method: str, path: str, body: Any) -> Any:
        if path == "/v1/deployment":
            body = copy.deepcopy(body)
            change(body)
        return body

    return rewrite


@pytest.mark.parametrize(("change", "message"), [
    # every column would encode to a few levels: a selection that is not the data's
    (lambda d: d["fixed_point"].update(target_bits=1), "fixed-point encoding (16, 32, 1)"),
    # values past the range the secure comparisons are sized for
    (lambda d: d["fixed_point"].update(value_bits=40, target_bits=38),
     "fixed-point encoding (16, 40, 38)"),
    (lambda d: d.update(scheme="rep4"), "sharing scheme 'rep4' for 3 certified parties"),
    (lambda d: d.update(scheme="rep5"), "sharing scheme 'rep5' for 3 certified parties"),
    (lambda d: d.pop("fixed_point"), "description of the deployment is malformed"),
    (lambda d: d["parties"][0].update(box_public_key=None),
     "description of the deployment is malformed"),
], ids=["coarse", "wide", "scheme", "unknown-scheme", "no-encoding", "bad-key"])
def test_gateway_describing_another_encoding_is_refused_before_sealing(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    change: Callable[[dict[str, Any]], None], message: str,
) -> None:
    """The encoding and the sharing scheme are the client's own, not the gateway's to
    choose: a gateway describing others (or a description that does not parse) is
    refused, naming it, before anything is created, sealed or sent."""
    evil = EvilGateway(stack.gateway.url, _describe(change))
    try:
        t = make_table(12, 3, seed=2)
        write_csv(tmp_path / "a.csv", t)
        rc, _, err = run(capsys, stack, evil.url, "owner-a", "upload", str(tmp_path / "a.csv"),
                         "--dataset", "d", "--label", "label")
        # a message naming it (an exception escaping the command would fail the test here)
        assert rc == 1 and "ppfs: error: " in err and message in err, err
        assert evil.posts() == []
    finally:
        evil.stop()


def test_deployment_shows_the_answer_it_checked(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ppfs deployment` prints the one answer whose keys it checked: a gateway that
    answers honestly once and with a rogue key for Bob the next time gets its one
    honest answer shown, or its rogue one refused."""
    rogue = base64.b64encode(bytes(PrivateKey.generate().public_key)).decode()
    asked = 0

    def change(d: dict[str, Any]) -> None:
        nonlocal asked
        asked += 1
        if asked % 2 == 0:
            d["parties"][1]["box_public_key"] = rogue

    evil = EvilGateway(stack.gateway.url, _describe(change))
    try:
        honest = stack.client("owner-a").deployment().parties[1].box_public_key
        rc, out, err = run(capsys, stack, evil.url, "owner-a", "deployment", "--json")
        assert rc == 0, err
        assert json.loads(out)["parties"][1]["box_public_key"] == (
            base64.b64encode(honest).decode())
        rc, out, err = run(capsys, stack, evil.url, "owner-a", "deployment", "--json")
        assert rc == 1 and "party 1 (Bob)" in err and rogue not in out, (out, err)
    finally:
        evil.stop()


def test_a_schema_too_coarse_for_the_table_is_refused(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An owner encoding with an existing data set's scales (--schema-from) takes them
    from the gateway: scales that would leave its table a few significant bits are
    refused, naming the column, before anything is sent."""
    t = make_table(40, 3, seed=4)
    write_csv(tmp_path / "a.csv", t)
    rc, out, err = run(capsys, stack, stack.gateway.url, "owner-a", "upload",
                       str(tmp_path / "a.csv"), "--dataset", "first", "--label", "label")
    assert rc == 0, err
    first = out.strip()

    def coarse(method: str, path: str, body: Any) -> Any:
        if path == f"/v1/datasets/{first}":
            body = copy.deepcopy(body)
            body["column_exponents"] = [e - 20 for e in body["column_exponents"]]
        return body

    evil = EvilGateway(stack.gateway.url, coarse)
    try:
        rc, _, err = run(capsys, stack, evil.url, "owner-a", "upload", str(tmp_path / "a.csv"),
                         "--dataset", "second", "--schema-from", first, "--label", "label")
        assert rc == 2, err
        assert f"column {t.columns[0]!r}: the schema's scale" in err and "3 significant" in err
        assert evil.posts() == []
    finally:
        evil.stop()
    # the honest schema is taken as it is
    rc, _, err = run(capsys, stack, stack.gateway.url, "owner-a", "upload",
                     str(tmp_path / "a.csv"), "--dataset", "second", "--schema-from", first,
                     "--label", "label")
    assert rc == 0, err


def test_without_a_trust_anchor_nothing_is_sealed(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = make_table(12, 3, seed=2)
    write_csv(tmp_path / "a.csv", t)
    rc, _, err = run(capsys, stack, stack.gateway.url, "owner-a", "upload",
                     str(tmp_path / "a.csv"), "--dataset", "d", "--label", "label", anchor="")
    assert rc == 2 and "--deployment-ca" in err and "ppfs pki fingerprint" in err, err


def test_key_statement_checks() -> None:
    ca, other = CertificateAuthority.create("ca"), CertificateAuthority.create("other")
    anchor = TrustAnchor.from_pem(ca.cert_pem())
    box, sig = bytes(PrivateKey.generate().public_key), bytes(SigningKey.generate().verify_key)
    st, s = certify_party_keys(ca.key, ca.cert, 2, "Carol", box, sig)
    ok = dict(index=2, name="Carol", box_public_key=box, signing_public_key=sig,
              statement=st, signature=s)
    assert verify_party_keys(anchor, **ok).index == 2  # type: ignore[arg-type]
    # the fingerprint alone works with the relayed certificate
    fp = TrustAnchor(anchor.sha256)
    assert verify_party_keys(fp, relayed_ca_pem=ca.cert_pem(), **ok)  # type: ignore[arg-type]
    bad: list[tuple[dict[str, Any], str]] = [
        ({"index": 1, "name": "Bob"}, "statement is for party 2 (Carol)"),
        ({"box_public_key": sig}, "not the keys the deployment CA certified"),
        ({"signature": s[:-1] + bytes([s[-1] ^ 1])}, "not signed by the deployment CA"),
        ({"statement": b""}, "no certificate"),
    ]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=400)
    for change, msg in bad:
        with pytest.raises(UntrustedPartyKey, match=re.escape(msg)):
            verify_party_keys(anchor, **{**ok, **change})  # type: ignore[arg-type]
    with pytest.raises(UntrustedPartyKey, match=r"valid .* not now"):
        verify_party_keys(anchor, now=later, **ok)  # type: ignore[arg-type]
    st2, s2 = certify_party_keys(other.key, other.cert, 2, "Carol", box, sig)
    with pytest.raises(UntrustedPartyKey, match="not signed by the deployment CA"):
        verify_party_keys(anchor, **{**ok, "statement": st2, "signature": s2})  # type: ignore[arg-type]
    with pytest.raises(UntrustedPartyKey, match="not the one whose fingerprint"):
        verify_party_keys(fp, relayed_ca_pem=other.cert_pem(),  # type: ignore[arg-type]
                          **{**ok, "statement": st2, "signature": s2})
    # a statement for another CA, signed by ours (a CA reused across deployments)
    d = json.loads(st)
    d["ca_sha256"] = "0" * 64
    st3 = KeyStatement(**d).to_bytes()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    s3 = ca.key.sign(st3, ec.ECDSA(hashes.SHA256()))
    with pytest.raises(UntrustedPartyKey, match="names another deployment CA"):
        verify_party_keys(anchor, **{**ok, "statement": st3, "signature": s3})  # type: ignore[arg-type]


# -- results ---------------------------------------------------------------------------


def _finished_job(stack: Stack) -> tuple[str, Any]:
    t, ids, _ = horizontal_setup(stack, m=40, p=6, seed=9)
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=2, engine="mpyc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    return job["id"], t


def _forge_parts(how: str) -> Rewrite:
    rogue = SigningKey.generate()

    def rewrite(method: str, path: str, body: Any) -> Any:
        body = copy.deepcopy(body)
        if path.endswith("/result"):
            parts = body["parts"]
            if how == "duplicate":  # Alice's part three times: every "party" agrees
                body["parts"] = [dict(parts[0])] * 3
            elif how == "duplicate-relabelled":  # ... even with the index rewritten
                body["parts"] = [parts[0], parts[1], {**parts[1], "party_index": 2}]
            elif how == "missing":
                body["parts"] = parts[:2]
            elif how == "foreign-signer":
                sealed = base64.b64decode(parts[2]["sealed"])
                sig = rogue.sign(body["job_id"].encode() + sealed).signature
                parts[2]["signature"] = base64.b64encode(sig).decode()
                st = base64.b64decode(parts[2]["statement"])
                parts[2]["statement_signature"] = base64.b64encode(
                    rogue.sign(st).signature).decode()
        elif how == "relabel" and re.fullmatch(r"/v1/jobs/[0-9a-f]+", path):
            body["columns"] = list(reversed(body["columns"]))
        return body

    return rewrite


@pytest.mark.parametrize(("how", "message"), [
    ("duplicate", "more than one part of Alice"),
    ("duplicate-relabelled", "Carol's part: a result part is not signed by its party"),
    ("missing", "lacks the part of Carol"),
    ("foreign-signer", "Carol's part: a result part is not signed by its party"),
    ("relabel", "job record differs from what every party signed in columns"),
])
def test_forged_results_are_refused(
    stack: Stack, capsys: pytest.CaptureFixture[str], how: str, message: str
) -> None:
    job_id, t = _finished_job(stack)
    rc, out, err = run(capsys, stack, stack.gateway.url, "analyst-1", "result", "fetch",
                       job_id, "--json")
    assert rc == 0, err  # the honest gateway's result opens, and is right
    want = oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 2)
    assert json.loads(out)["selected"] == [t.columns[j] for j in want]
    evil = EvilGateway(stack.gateway.url, _forge_parts(how))
    try:
        rc, out, err = run(capsys, stack, evil.url, "analyst-1", "result", "fetch", job_id)
        assert rc == 1, (out, err)
        assert message in err, err
        assert "selected" not in out
    finally:
        evil.stop()


class HoldingGateway(EvilGateway):
    """Holds back the first job submission it relays (answering 503: "try again"), then
    submits that one in place of the next and answers the next with its job."""

    def __init__(self, upstream: str) -> None:
        self.held: bytes | None = None
        super().__init__(upstream, lambda method, path, body: body)

    async def _relay(self, request: Request) -> Response:
        if request.method != "POST" or request.url.path != "/v1/jobs":
            return await super()._relay(request)
        body = await request.body()
        if self.held is None:
            self.held = body
            return Response(b'{"detail": "busy, try again"}', status_code=503,
                            media_type="application/json")
        async with httpx.AsyncClient(base_url=self.upstream, timeout=30) as http:
            resp = await http.post("/v1/jobs", content=self.held, headers={
                k: v for k, v in request.headers.items()
                if k.lower() in ("authorization", "content-type")})
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))


def test_a_result_opens_only_for_the_job_and_request_it_was_fetched_for(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recipient has two finished jobs, X (k 3 on two data sets) and Y (k 1 on one).
    A gateway that answers for X with Y's genuine record and parts, one that answers a
    new submission with Y's id (never running it), and one that runs a request it held
    back in place of the one submitted: each is refused, naming what differs, and
    nothing is opened; honestly fetched, X and Y open as themselves."""
    t, ids, _ = horizontal_setup(stack, m=40, p=6, seed=9)
    analyst, key = stack.client("analyst-1"), stack.keys["analyst-1"]
    y = analyst.submit(key, [ids[0]], label="label", k=1, engine="mpyc")["id"]
    x = analyst.submit(key, ids, label="label", k=3, engine="mpyc")["id"]
    for j in (x, y):
        assert wait_final(analyst, j)["state"] == "succeeded"
    want_x = [t.columns[j] for j in oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 3)]
    rc, out, err = run(capsys, stack, stack.gateway.url, "analyst-1", "result", "fetch", x,
                       "--json")
    assert rc == 0 and json.loads(out)["selected"] == want_x, err
    rc, out, err = run(capsys, stack, stack.gateway.url, "analyst-1", "result", "fetch", y,
                       "--json")
    assert rc == 0 and len(json.loads(out)["selected"]) == 1, err

    def swapped(method: str, path: str, body: Any) -> Any:
        if path in (f"/v1/jobs/{x}", f"/v1/jobs/{x}/result"):
            return analyst._call("GET", path.replace(x, y))  # Y's, genuine, for X
        if method == "POST" and path == "/v1/jobs":
            return analyst.get_job(y)  # "your new job is Y"
        return body

    evil = EvilGateway(stack.gateway.url, swapped)
    try:
        rc, out, err = run(capsys, stack, evil.url, "analyst-1", "result", "fetch", x)
        assert rc == 1 and "selected" not in out, (out, err)
        assert f"for job {x} with the record of another job" in err, err
        rc, out, err = run(capsys, stack, evil.url, "analyst-1", "jobs", "submit",
                           "--dataset", ids[0], "--label", "label", "--k", "2", "--engine", "mpyc")
        assert rc == 1, (out, err)
        assert "already answers another request of this key" in err, err
    finally:
        evil.stop()
    # Y still opens as Y: the refused answer did not overwrite what the key kept for it
    rc, out, err = run(capsys, stack, stack.gateway.url, "analyst-1", "result", "fetch", y)
    assert rc == 0, err

    holding = HoldingGateway(stack.gateway.url)
    try:
        first = run(capsys, stack, holding.url, "analyst-1", "jobs", "submit",
                    "--dataset", ids[0], "--label", "label", "--k", "1", "--engine", "mpyc")
        assert first[0] != 0 and holding.held is not None, first
        rc, out, err = run(capsys, stack, holding.url, "analyst-1", "jobs", "submit",
                           "--dataset", ids[0], "--dataset", ids[1], "--label", "label",
                           "--k", "3", "--engine", "mpyc", "--json")
        assert rc == 0, err
        z = json.loads(out)["id"]
        assert wait_final(analyst, z)["state"] == "succeeded"  # the held request, run
        rc, out, err = run(capsys, stack, stack.gateway.url, "analyst-1", "result", "fetch",
                           z)
        assert rc == 1 and "selected" not in out, (out, err)
        assert f"ran job {z} for another request than the one this key submitted" in err, err
    finally:
        holding.stop()


# -- consent, enforced by every party ---------------------------------------------------


def test_job_without_the_owners_consent_is_refused_by_every_party(tmp_path: Path) -> None:
    """A principal the gateway lets through (owner-b, granted owner-a's data set by an
    admin) starts a job on it for itself; owner-a consented only to analyst-1. Every
    party refuses and audits it; nothing runs. A job asking for more than the consent
    covers (the model) is refused too; the job the consent names runs."""
    s = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",)))
    try:
        t = make_table(12, 3, seed=6)
        a, admin = s.client("owner-a"), s.client("admin")
        from service_fakes import owner_table

        ds = a.create_dataset("a")
        a.upload_table(s.keys["owner-a"], owner_table(t), ds["id"])
        admin.grant(ds["id"], "analyst-1")
        admin.grant(ds["id"], "owner-b")
        a.consent(s.keys["owner-a"], ds["id"], "analyst-1", s.keys["analyst-1"].box_public_key)
        b = s.client("owner-b")
        job = b.submit(s.keys["owner-b"], [ds["id"]], label="label", k=1, engine="mpyc")
        done = wait_final(b, job["id"], timeout=60)
        assert done["state"] == "failed" and "could not start" in done["error"], done
        assert "no consent" in done["error"] and "'owner-a'" in done["error"], done["error"]
        # the analyst's consent does not cover the model either
        analyst = s.client("analyst-1")
        training = {"epochs": 1, "batch_size": 4, "learning_rate": 0.5}
        job2 = analyst.submit(s.keys["analyst-1"], [ds["id"]], label="label", k=1,
                              engine="mpyc", training=training)
        done2 = wait_final(analyst, job2["id"], timeout=60)
        assert done2["state"] == "failed" and "no consent to reveal the selection and model" \
            in done2["error"], done2["error"]
        for settings in s.cluster.dep.settings:
            audit = [json.loads(x) for x in
                     (settings.state_dir / "audit.log").read_text().splitlines()]
            refused = {e["job_id"]: e for e in audit if e["event"] == "job.refused"}
            assert refused[job["id"]]["failure"] == "refused"
            assert refused[job["id"]]["recipient"] == "owner-b"
            assert "no consent" in refused[job2["id"]]["reason"]
            assert not any(e["event"] == "job.accepted" for e in audit)
            # at most the gateway's cancel is remembered (a tombstone): nothing ran
            rec = settings.state_dir / "jobs" / f"{job['id']}.json"
            if rec.exists():
                got = json.loads(rec.read_text())
                assert got["state"] == "cancelled" and not got["description_hex"], got
        # with the consent it names, the analyst's job runs and is right
        job3 = analyst.submit(s.keys["analyst-1"], [ds["id"]], label="label", k=1,
                              engine="mpyc")
        assert wait_final(analyst, job3["id"], timeout=240)["state"] == "succeeded"
        got = analyst.fetch_result(s.keys["analyst-1"], job3["id"])
        assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 1).tolist()
    finally:
        s.close()


@contextlib.asynccontextmanager
async def _serving(dep: Any) -> AsyncIterator[list[Any]]:
    """The deployment's party daemons served locally (on their state as it is) and the
    gateway's identity on them: their stubs."""
    servers = [await start_party_server(st) for st in dep.settings]
    channels = [dep.channel(i, srv.port) for i, srv in enumerate(servers)]
    try:
        yield [PartyServiceStub(c) for c in channels]
    finally:
        for c in channels:
            await c.close()
        for srv in servers:
            await srv.stop(0)


@contextlib.asynccontextmanager
async def _gateway_on_three_mpyc_parties(tmp_path: Path) -> AsyncIterator[tuple[Any, ...]]:
    """Three MPyC parties served locally and the gateway's identity on them: (deployment,
    stubs, the parties' box keys, owners owner-a, analyst and gateway-admin, owner-a's
    upload u1 of data set ds, not yet sent)."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    async with _serving(dep) as stubs:
        box = [(await st.GetIdentity(party_pb2.GetIdentityRequest())).box_public_key
               for st in stubs]
        t = make_table(12, 3, seed=4)
        fp = FixedPoint()
        exps = fp.choose_exponents(t.x, t.columns)
        owner, rec = dep.add_owner("owner-a"), dep.add_owner("analyst")
        gw = dep.add_owner("gateway-admin")  # a registered principal, not the owner
        data = data_upload(owner, box, fp.encode(t.x, exps, t.columns), t.columns, exps,
                           dataset_id="ds", upload_id="u1", onehot=t.one_hot(),
                           label_column=t.label_column, classes=t.classes)
        yield dep, stubs, box, owner, rec, gw, data


def test_turned_gateway_cannot_start_jobs_the_owner_did_not_consent_to(tmp_path: Path) -> None:
    """The gateway's own mutual-TLS identity, used directly on the parties (a turned
    gateway skips its own checks): no consent, a consent for another recipient key, a
    consent not signed by the owner, masks made for another key, a consent that has
    expired: each refused by every party with kind REFUSED in its audit log."""
    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 gw, data):
            masks = {
                who.owner_id: mask_upload(who, box, np.zeros((1, 2), dtype=np.uint64),
                                          dataset_id=f"m-{who.owner_id}",
                                          upload_id=f"m-{who.owner_id}")
                for who in (rec, gw)
            }
            other_key = mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                                    dataset_id="m-other", upload_id="m-other",
                                    recipient_public_key=bytes(gw.box.public_key))
            for up in (data, *masks.values(), other_key):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))

            def job(job_id: str, mask: Any, key: bytes, consents: Any) -> Any:
                return describe_job(job_id, [[data]], mask=mask, k=1, security="passive-3pc",
                                    engine="mpyc", recipient_public_key=key,
                                    peers=dep.peer_addresses(), consents=consents)

            ana = bytes(rec.box.public_key)
            to_analyst = Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION)
            cases = {
                # the gateway's own recipient, no consent at all
                "none": job("j-none", masks["gateway-admin"], bytes(gw.box.public_key), []),
                # the analyst's consent relayed for the gateway's own key
                "other-key": job("j-key", masks["gateway-admin"], bytes(gw.box.public_key),
                                 [to_analyst.sign(owner.key)]),
                # a consent that names the gateway, signed by the gateway
                "forged": job("j-forged", masks["gateway-admin"], bytes(gw.box.public_key),
                              [Consent("owner-a", "ds", "gateway-admin",
                                       bytes(gw.box.public_key),
                                       Reveal.SELECTION).sign(gw.key)]),
                # the analyst's consent, but masks that name another result key
                "mask-key": job("j-mask", other_key, ana, [to_analyst.sign(owner.key)]),
                # the owner's consent for the analyst, expired
                "expired": job("j-expired", masks["analyst"], ana, [dataclasses.replace(
                    to_analyst, expires_at="2020-01-01T00:00:00Z").sign(owner.key)]),
            }
            for name, desc in cases.items():
                for st in stubs:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await st.StartJob(start_requests(desc))
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
                    assert ("consent" in (info.value.details() or "")
                            or "mask upload" in (info.value.details() or "")), name
                    if name == "expired":
                        assert "its consent has expired" in (info.value.details() or "")
                    with pytest.raises(grpc.aio.AioRpcError):  # nothing runs
                        await st.GetJob(party_pb2.GetJobRequest(job_id=desc.job_id))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                refused = [e for e in audit if e["event"] == "job.refused"]
                assert sorted(e["job_id"] for e in refused) == sorted(
                    d.job_id for d in cases.values())
                assert all(e["failure"] == "refused" for e in refused)
                assert not any(e["event"] == "job.accepted" for e in audit)
            # the same job with the owner's consent for the analyst's key is accepted
            ok = job("j-ok", masks["analyst"], ana, [to_analyst.sign(owner.key)])
            for st in stubs:
                await st.StartJob(start_requests(ok))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j-ok"))

    asyncio.run(scenario())


def test_turned_gateway_cannot_change_what_the_recipient_asked_for(tmp_path: Path) -> None:
    """The gateway's own identity on the parties, with the owner's consent and the
    recipient's masks in order, but the job not as the recipient signed it: MP-SPDZ in
    active 3PC asked for, MPyC in passive 3PC sent (a downgrade); another k; another
    scorer; the request signed by the gateway's own key; no request at all. Each refused
    by every party, naming what differs; the job as asked is accepted."""
    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 gw, data):
            mask = mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                               dataset_id="m", upload_id="m1")
            for up in (data, mask):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))
            ana = bytes(rec.box.public_key)
            consent = [Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION).sign(owner.key)]

            def job(job_id: str, **kw: Any) -> Any:
                args: dict[str, Any] = {"k": 1, "security": "passive-3pc", "engine": "mpyc"}
                args.update(kw)
                return describe_job(job_id, [[data]], mask=mask, recipient_public_key=ana,
                                    peers=dep.peer_addresses(), consents=consent, **args)

            def asked(job_id: str, **kw: Any) -> Any:
                """The recipient's signed request for the job with ``kw``."""
                return JobContract.from_proto(job(job_id, **kw)).request

            same = JobContract.from_proto(job("j-gw"))
            unsigned = job("j-none")
            unsigned.ClearField("request")
            cases = {
                "j-down": (job("j-down", request=asked(
                    "j-down", security="active-3pc", engine="mp-spdz")), "engine, security"),
                "j-k": (job("j-k", request=asked("j-k", k=2)), "in: k"),
                "j-scorer": (job("j-scorer", scorer=Scorer.PEARSON,
                                 request=asked("j-scorer")), "in: scorer"),
                "j-gw": (job("j-gw", request=JobRequest.for_job(same).sign(gw.key)),
                         "not signed by its recipient"),
                "j-none": (unsigned, "carries no request"),
            }
            for name, (desc, says) in cases.items():
                for st in stubs:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await st.StartJob(start_requests(desc))
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name
                    assert says in (info.value.details() or ""), (name, info.value.details())
                    with pytest.raises(grpc.aio.AioRpcError):  # nothing runs
                        await st.GetJob(party_pb2.GetJobRequest(job_id=desc.job_id))
            ok = job("j-ok")
            for st in stubs:
                await st.StartJob(start_requests(ok))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j-ok"))

    asyncio.run(scenario())


def test_a_consent_for_a_number_of_jobs_is_spent_at_every_party(tmp_path: Path) -> None:
    """A consent for two jobs, relayed again and again by a turned gateway (its own
    identity on the parties): every party accepts two jobs under it, refuses a third,
    and still refuses it after a restart (the uses are kept with the jobs that spent
    them). Beside a consent without a limit, the limited one is not spent."""
    limited: list[SignedConsent] = []

    def refused_everywhere(stubs: list[Any], desc: Any) -> Any:
        async def check() -> None:
            for st in stubs:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await st.StartJob(start_requests(desc))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert ("no consent to reveal the selection to 'analyst' from owner 'owner-a' "
                        "for data set 'ds' (its consent allows 2 jobs, all used)"
                        ) in (info.value.details() or ""), info.value.details()
        return check()

    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 _gw, data):
            ana = bytes(rec.box.public_key)
            masks = [mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                                 dataset_id="m", upload_id=f"m{i}") for i in range(5)]
            for up in (data, *masks):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))
            limited.append(Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION,
                                   max_jobs=2).sign(owner.key))

            def job(n: int, consents: list[SignedConsent]) -> Any:
                return describe_job(f"j{n}", [[data]], mask=masks[n], k=1,
                                    security="passive-3pc", engine="mpyc",
                                    recipient_public_key=ana, peers=dep.peer_addresses(),
                                    consents=consents)

            for n in (0, 1):
                for st in stubs:
                    await st.StartJob(start_requests(job(n, limited)))
                for st in stubs:
                    await st.CancelJob(party_pb2.CancelJobRequest(job_id=f"j{n}"))
            await refused_everywhere(stubs, job(2, limited))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                spent = [e["consents_spent"] for e in audit if e["event"] == "job.accepted"]
                assert spent == [[limited[0].digest]] * 2
        async with _serving(dep) as stubs:  # the parties again, on their state
            await refused_everywhere(stubs, job(3, limited))
            unlimited = Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION
                                ).sign(owner.key)
            for st in stubs:
                await st.StartJob(start_requests(job(4, [*limited, unlimited])))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j4"))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                j4 = [e for e in audit if e["event"] == "job.accepted" and e["job_id"] == "j4"]
                assert [e["consents_spent"] for e in j4] == [[]]

    asyncio.run(scenario())


def test_a_consent_for_a_minimum_of_rows_refuses_a_job_on_part_of_the_data_set(
    tmp_path: Path,
) -> None:
    """A consent asking for at least 12 rows of data set ds, and a turned gateway (its
    mutual-TLS identity on the parties) that aborted owner-a's second upload at every
    party after telling the owner it was added: a job on the 4 rows left is refused by
    every party on its own count of the rows, naming the consent's minimum, before
    anything runs; once the upload is held, the job on all 12 rows is accepted."""
    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 _gw, _data):
            t = make_table(12, 3, seed=4)
            fp = FixedPoint()
            exps = fp.choose_exponents(t.x, t.columns)
            raw, onehot = fp.encode(t.x, exps, t.columns), t.one_hot()
            parts = [data_upload(owner, box, raw[rows], t.columns, exps, dataset_id="ds",
                                 upload_id=f"u{n}", onehot=onehot[rows],
                                 label_column=t.label_column, classes=t.classes)
                     for n, rows in ((1, slice(0, 4)), (2, slice(4, 12)))]
            ana = bytes(rec.box.public_key)
            masks = [mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                                 dataset_id="m", upload_id=f"m{i}") for i in range(2)]
            for up in (parts[0], *masks):  # u2 never reaches a party
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))
            floor = Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION,
                            min_rows=12).sign(owner.key)

            def job(n: int, uploads: list[Any]) -> Any:
                return describe_job(f"j{n}", [uploads], mask=masks[n], k=1,
                                    security="passive-3pc", engine="mpyc",
                                    recipient_public_key=ana, peers=dep.peer_addresses(),
                                    consents=[floor])

            for st in stubs:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await st.StartJob(start_requests(job(0, parts[:1])))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert ("no consent to reveal the selection to 'analyst' from owner 'owner-a' "
                        "for data set 'ds' (its consent asks for at least 12 rows; the job "
                        "pins 4)") in (info.value.details() or ""), info.value.details()
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                assert not [e for e in audit if e["event"] == "job.accepted"]
            for i, st in enumerate(stubs):
                await st.PutUploadPart(upload_messages(parts[1], i))
            for st in stubs:
                await st.StartJob(start_requests(job(1, parts)))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))

    asyncio.run(scenario())


def test_a_consent_for_a_minimum_of_own_rows_refuses_a_job_padded_with_a_co_owners_rows(
    tmp_path: Path,
) -> None:
    """Two owners of data set ds: owner-a (10 rows, in uploads of 2 and 8) consents to
    jobs pinning at least 12 rows in all and at least 8 of its own; owner-b, working with
    a turned gateway (its mutual-TLS identity on the parties), uploads 14 rows. The
    gateway stages owner-a's upload of 8 rows at every party and aborts it there after
    telling the owner it was added: a job on owner-a's 2 rows beside owner-b's 14 pins 16
    rows, enough for the minimum in all, but every party refuses it on its own count of
    owner-a's rows, naming the consent, before anything runs. Once owner-a's rows are all
    held (sent again as a new upload), the job on all 24 rows is accepted and its
    selection is the plaintext oracle's."""
    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 _gw, _data):
            co_owner = dep.add_owner("owner-b")
            t = make_table(24, 3, seed=8)
            fp = FixedPoint()
            exps = fp.choose_exponents(t.x, t.columns)
            raw, onehot = fp.encode(t.x, exps, t.columns), t.one_hot()

            def part(who: Any, upload_id: str, rows: slice) -> Any:
                return data_upload(who, box, raw[rows], t.columns, exps, dataset_id="ds",
                                   upload_id=upload_id, onehot=onehot[rows],
                                   label_column=t.label_column, classes=t.classes)

            few, withheld = part(owner, "u-a1", slice(0, 2)), part(owner, "u-a2", slice(2, 10))
            padding = part(co_owner, "u-b", slice(10, 24))
            ana = bytes(rec.box.public_key)
            shape = service_shape(24, 3, t.n_classes, 1, fp.value_bits, None)
            words = draw_mask_words(shape.outputs)
            masks = [mask_upload(rec, box, w, dataset_id="m", upload_id=f"m{i}")
                     for i, w in enumerate((np.zeros((1, 2), dtype=np.uint64), words))]
            for up in (few, padding, *masks):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))
            for i, st in enumerate(stubs):  # staged everywhere, then aborted by the gateway
                messages = list(upload_messages(withheld, i))
                messages[0].header.staged = True
                await st.PutUploadPart(iter(messages))
            for st in stubs:
                await st.AbortUpload(party_pb2.UploadDecisionRequest(dataset_id="ds",
                                                                     upload_id="u-a2"))
            consents = [
                Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION, min_rows=12,
                        min_own_rows=8).sign(owner.key),
                Consent("owner-b", "ds", "analyst", ana, Reveal.SELECTION).sign(co_owner.key),
            ]

            def job(n: int, uploads: list[Any]) -> Any:
                signed = sorted(uploads, key=lambda u: Manifest.from_bytes(u.manifest)
                                .order_key())  # as every party requires them
                return describe_job(f"j{n}", [signed], mask=masks[n], k=1,
                                    security="passive-3pc", engine="mpyc",
                                    recipient_public_key=ana, peers=dep.peer_addresses(),
                                    consents=consents)

            padded = job(0, [few, padding])
            assert padded.m == 16  # at least 12 in all: the minimum in all alone would serve
            for st in stubs:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await st.StartJob(start_requests(padded))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert info.value.details() == (
                    "no consent to reveal the selection to 'analyst' from owner 'owner-a' "
                    "for data set 'ds' (its consent asks for at least 8 rows of the owner's "
                    "own uploads; the job pins 2 of them)"), info.value.details()
                with pytest.raises(grpc.aio.AioRpcError):  # nothing runs
                    await st.GetJob(party_pb2.GetJobRequest(job_id="j0"))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                assert not [e for e in audit if e["event"] == "job.accepted"]
                assert [e["job_id"] for e in audit if e["event"] == "job.refused"] == ["j0"]
            # owner-a sends its 8 rows again: the job on all of its rows runs
            again = part(owner, "u-a3", slice(2, 10))
            for i, st in enumerate(stubs):
                await st.PutUploadPart(upload_messages(again, i))
            whole = job(1, [few, again, padding])
            for st in stubs:
                await st.StartJob(start_requests(whole))
            finals = await asyncio.gather(*(watch_to_end(st, "j1") for st in stubs))
            assert [f.state for f in finals] == [party_pb2.JOB_STATE_SUCCEEDED] * 3, [
                f.error for f in finals]
            parts = await fetch_opened(stubs, await identities(stubs), "j1", rec.box)
            assert all(np.array_equal(p, parts[0]) for p in parts)
            # the rows in the order the parties stacked them (their owners' signed order)
            rows = {"u-a1": slice(0, 2), "u-a3": slice(2, 10), "u-b": slice(10, 24)}
            order = np.concatenate([np.arange(24)[rows[u.upload_id]]
                                    for u in whole.datasets[0].uploads])
            got = unmask_all(parts[0], words, shape).indices
            np.testing.assert_array_equal(got, mirror(raw[order], t.y[order], shape).selected)
            assert got.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 1).tolist()

    asyncio.run(scenario())


def test_a_consent_for_a_minimum_of_own_rows_counts_the_rows_an_owner_joins_by_columns(
    tmp_path: Path,
) -> None:
    """A vertical join: owner-a's columns (data set ds, 12 rows) beside owner-b's
    labelled columns (data set ds-b, the same 12 rows). Each of owner-a's 12 rows is a
    row of the job: a consent asking for 12 of its own serves, one asking for 13 is
    refused by every party, naming the 12 pinned; owner-b's 12 rows are not owner-a's."""
    async def scenario() -> None:
        async with _gateway_on_three_mpyc_parties(tmp_path) as (dep, stubs, box, owner, rec,
                                                                 _gw, _data):
            co_owner = dep.add_owner("owner-b")
            t = make_table(12, 4, seed=9)
            fp = FixedPoint()
            exps = fp.choose_exponents(t.x, t.columns)
            raw = fp.encode(t.x, exps, t.columns)
            columns = data_upload(owner, box, raw[:, :2], t.columns[:2], exps[:2],
                                  dataset_id="ds", upload_id="u-a")
            labelled = data_upload(co_owner, box, raw[:, 2:], t.columns[2:], exps[2:],
                                   dataset_id="ds-b", upload_id="u-b", onehot=t.one_hot(),
                                   label_column=t.label_column, classes=t.classes)
            ana = bytes(rec.box.public_key)
            masks = [mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                                 dataset_id="m", upload_id=f"m{i}") for i in range(2)]
            for up in (columns, labelled, *masks):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))

            def job(n: int, own: int) -> Any:
                return describe_job(
                    f"j{n}", [[columns], [labelled]], mask=masks[n], k=1,
                    security="passive-3pc", engine="mpyc", combination="vertical",
                    recipient_public_key=ana, peers=dep.peer_addresses(), consents=[
                        Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION,
                                min_own_rows=own).sign(owner.key),
                        Consent("owner-b", "ds-b", "analyst", ana, Reveal.SELECTION,
                                min_own_rows=12).sign(co_owner.key)])

            for st in stubs:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await st.StartJob(start_requests(job(0, 13)))
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert ("from owner 'owner-a' for data set 'ds' (its consent asks for at "
                        "least 13 rows of the owner's own uploads; the job pins 12 of them)"
                        ) in (info.value.details() or ""), info.value.details()
            for st in stubs:
                await st.StartJob(start_requests(job(1, 12)))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))

    asyncio.run(scenario())


def test_consent_command_stores_a_signed_consent_every_job_carries(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4, seed=5)
    url = stack.gateway.url
    rc, out, _ = run(capsys, stack, url, "analyst-1", "keys", "show")
    box = json.loads(out)["box_public_key"]
    assert base64.b64decode(box) == stack.keys["analyst-1"].box_public_key
    # a consent that has expired already is refused by the gateway; a malformed date too
    rc, _, err = run(capsys, stack, url, "owner-a", "datasets", "consent", ids[0],
                     "--recipient", "analyst-1", "--recipient-key", box, "--expires", "2020-01-01")
    assert rc == 2 and "the consent expired at 2020-01-02T00:00:00Z" in err, err
    with pytest.raises(SystemExit):
        run(capsys, stack, url, "owner-a", "datasets", "consent", ids[0], "--recipient",
            "analyst-1", "--recipient-key", box, "--expires", "tomorrow")
    # an expired consent of owner-a stored first (as if it had expired since): the
    # gateway relays every consent that covers a job, so the valid one below still counts
    from ppfs_gateway.registry import ConsentRecord, Registry

    stale = Consent("owner-a", ids[0], "analyst-1", base64.b64decode(box), Reveal.MODEL,
                    expires_at="2020-01-01T00:00:00Z").sign(stack.keys["owner-a"].signing)
    Registry(stack.gateway.settings.db_path).add_consent(ConsentRecord(
        ids[0], "owner-a", "analyst-1", box, Reveal.MODEL.value, stale.statement,
        stale.signature))
    # owner-b's consent lasts to the end of 2999 (UTC), owner-a's does not expire
    for owner, ds, until in (("owner-a", ids[0], []), ("owner-b", ids[1], ["2999-12-31"])):
        rc, out, err = run(capsys, stack, url, owner, "datasets", "consent", ds,
                           "--recipient", "analyst-1", "--recipient-key", box,
                           *(["--expires", *until] if until else []))
        assert rc == 0 and f"{owner} lets analyst-1 learn the selection" in out, err
        assert ("until 3000-01-01T00:00:00Z" in out) == bool(until), out
    # owner-b may read data set A's schema, but holds no upload in it: no consent of its own
    rc, _, err = run(capsys, stack, url, "owner-b", "datasets", "consent", ids[0],
                     "--recipient", "analyst-1", "--recipient-key", box)
    assert rc == 2 and "only an owner of the data set's uploads" in err, err
    listed = stack.client("analyst-1").list_consents(ids[0])
    assert [(c["owner_id"], c["recipient"], c["reveal"], c["expires_at"]) for c in listed] == [
        ("owner-a", "analyst-1", "selection+model", "2020-01-01T00:00:00Z"),
        ("owner-a", "analyst-1", "selection", "")]
    analyst = stack.client("analyst-1")
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=1, engine="mpyc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    desc = stack.cluster.parties[0].jobs[job["id"]].desc
    assert desc.recipient == "analyst-1"
    got = {}
    for c in desc.consents:
        sc = SignedConsent(c.statement, c.signature)
        owner = sc.consent.owner_id
        if not sc.consent.expired():
            got[owner] = sc.verify(stack.keys[owner].verify_key).dataset_id
    assert got == {"owner-a": ids[0], "owner-b": ids[1]}
    assert len(desc.consents) == 3  # owner-a's expired one relayed too: the parties skip it

    # owner-b gives its consent anew, for one job: it replaces the stored one
    with pytest.raises(SystemExit):
        run(capsys, stack, url, "owner-b", "datasets", "consent", ids[1], "--recipient",
            "analyst-1", "--recipient-key", box, "--max-jobs", "0")
    rc, out, err = run(capsys, stack, url, "owner-b", "datasets", "consent", ids[1],
                       "--recipient", "analyst-1", "--recipient-key", box, "--max-jobs", "1")
    assert rc == 0 and "owner-b lets analyst-1 learn the selection of 1 job on" in out, err
    assert [c["max_jobs"] for c in analyst.list_consents(ids[1])] == [1]
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[1])
    assert rc == 0 and f"1 consent for {ids[1]}" in out, err
    assert out.count("owner-b -> analyst-1") == 1  # the consent for one job replaced it
    assert "selection; no expiry; at most 1 job" in out, out
    rc, out, _ = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[0])
    assert "selection+model; until 2020-01-01T00:00:00Z; any number of jobs" in out, out


def test_consent_command_signs_a_minimum_of_rows_and_lists_it(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4, seed=6)
    url = stack.gateway.url
    box = base64.b64encode(stack.keys["analyst-1"].box_public_key).decode()
    consent = ("datasets", "consent", ids[0], "--recipient", "analyst-1",
               "--recipient-key", box)
    for bad in ("1", "0", "ten", "-5", "1000000001"):  # 2 rows at least, 10^9 at most
        with pytest.raises(SystemExit):
            run(capsys, stack, url, "owner-a", *consent, "--min-rows", bad)
    assert stack.client("analyst-1").list_consents(ids[0]) == []
    rc, out, err = run(capsys, stack, url, "owner-a", *consent, "--min-rows", "15",
                       "--max-jobs", "2")
    assert rc == 0, err
    assert f"owner-a lets analyst-1 learn the selection of 2 jobs on {ids[0]} pinning at " \
           "least 15 rows of it" in out, out
    listed = stack.client("analyst-1").list_consents(ids[0])
    assert [(c["owner_id"], c["max_jobs"], c["min_rows"]) for c in listed] == [
        ("owner-a", 2, 15)]
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[0])
    assert rc == 0 and "selection; no expiry; at most 2 jobs; at least 15 rows" in out, out
    rc, out, err = run(capsys, stack, url, "owner-b", "datasets", "consent", ids[1],
                       "--recipient", "analyst-1", "--recipient-key", box)
    assert rc == 0 and "pinning" not in out, out
    assert [c["min_rows"] for c in stack.client("analyst-1").list_consents(ids[1])] == [0]
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[1])
    assert rc == 0 and "any number of jobs; no minimum of rows" in out, out


def test_consent_command_signs_a_minimum_of_own_rows_and_lists_it(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4, seed=7)
    url = stack.gateway.url
    box = base64.b64encode(stack.keys["analyst-1"].box_public_key).decode()

    def consent(owner: str, ds: str, *more: str) -> tuple[int, str, str]:
        return run(capsys, stack, url, owner, "datasets", "consent", ds, "--recipient",
                   "analyst-1", "--recipient-key", box, *more)

    for bad in ("1", "0", "ten", "-5", "1000000001"):  # 2 rows at least, 10^9 at most
        with pytest.raises(SystemExit):
            consent("owner-a", ids[0], "--min-own-rows", bad)
    assert stack.client("analyst-1").list_consents(ids[0]) == []
    rc, out, err = consent("owner-a", ids[0], "--min-own-rows", "6")
    assert rc == 0, err
    assert f"owner-a lets analyst-1 learn the selection of jobs on {ids[0]} pinning at " \
           "least 6 rows of owner-a's own uploads" in out, out
    listed = stack.client("analyst-1").list_consents(ids[0])
    assert [(c["owner_id"], c["min_rows"], c["min_own_rows"]) for c in listed] == [
        ("owner-a", 0, 6)]
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[0])
    assert rc == 0 and "any number of jobs; at least 6 rows of the owner's own uploads" \
        in out, out
    # beside a minimum in all: both signed, both shown
    rc, out, err = consent("owner-b", ids[1], "--min-rows", "15", "--min-own-rows", "6")
    assert rc == 0 and "pinning at least 15 rows of it and at least 6 rows of owner-b's " \
        "own uploads" in out, out
    listed = stack.client("analyst-1").list_consents(ids[1])
    assert [(c["min_rows"], c["min_own_rows"]) for c in listed] == [(15, 6)]
    from ppfs_gateway.registry import Registry

    statement = Registry(stack.gateway.settings.db_path).consents(ids[1])[0].statement
    assert json.loads(statement)["purpose"] == "ppfs consent v3"
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[1])
    assert rc == 0 and "at least 15 rows; at least 6 rows of the owner's own uploads" \
        in out, out


_mpspdz_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()


def test_a_consent_for_active_settings_only_refuses_a_passive_job_at_every_party(
    tmp_path: Path,
) -> None:
    """owner-a trusts the parties to be an honest majority, not to follow the protocol:
    its consent allows active-3pc and active-4pc only. A corrupted analyst asks for
    passive-3pc (where one corrupted party could change the result undetected and make
    the job's abort depend on the data) and a turned gateway (its mutual-TLS identity on
    the parties) relays the job as asked: every party refuses it, naming the owner, the
    setting and the settings allowed, before anything runs; padded with another consent
    of the owner's that allows passive-3pc, it is refused all the same, the consent not
    allowing the setting named as one the job cannot rely on. The same job in
    active-3pc under the same consent is accepted."""
    async def scenario() -> None:
        dep = Deployment.create(tmp_path, 3, engines=("mpyc", "mp-spdz"))
        async with _serving(dep) as stubs:
            box = [(await st.GetIdentity(party_pb2.GetIdentityRequest())).box_public_key
                   for st in stubs]
            t = make_table(12, 3, seed=4)
            fp = FixedPoint()
            exps = fp.choose_exponents(t.x, t.columns)
            owner, rec = dep.add_owner("owner-a"), dep.add_owner("analyst")
            data = data_upload(owner, box, fp.encode(t.x, exps, t.columns), t.columns, exps,
                               dataset_id="ds", upload_id="u1", onehot=t.one_hot(),
                               label_column=t.label_column, classes=t.classes)
            masks = [mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                                 dataset_id="m", upload_id=f"m{i}") for i in range(4)]
            for up in (data, *masks):
                for i, st in enumerate(stubs):
                    await st.PutUploadPart(upload_messages(up, i))
            ana = bytes(rec.box.public_key)
            active_only = Consent("owner-a", "ds", "analyst", ana, Reveal.SELECTION,
                                  securities=frozenset({Security.ACTIVE_3PC,
                                                        Security.ACTIVE_4PC})
                                  ).sign(owner.key)
            # an earlier consent of the owner's for the model, any setting
            any_setting = Consent("owner-a", "ds", "analyst", ana, Reveal.MODEL
                                  ).sign(owner.key)

            def job(n: int, security: str, engine: str, consents: list[Any]) -> Any:
                return describe_job(f"j{n}", [[data]], mask=masks[n], k=1, security=security,
                                    engine=engine, recipient_public_key=ana,
                                    peers=dep.peer_addresses(), consents=consents)

            cases = [
                (job(0, "passive-3pc", "mpyc", [active_only]),
                 "no consent to reveal the selection to 'analyst' from owner 'owner-a' for "
                 "data set 'ds' (its consent does not allow the security setting "
                 "passive-3pc; it allows active-3pc, active-4pc)"),
                (job(1, "passive-3pc", "mpyc", [active_only, any_setting]),
                 "the job carries a consent of 'owner-a' for data set 'ds' to 'analyst' that "
                 "it cannot rely on (it does not allow the security setting passive-3pc)"),
            ]
            if _mpspdz_reason is None:  # the same downgrade on the engine of the active ones
                cases.append((job(2, "passive-3pc", "mp-spdz", [active_only]),
                              cases[0][1]))
            for desc, says in cases:
                for st in stubs:
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        await st.StartJob(start_requests(desc))
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert info.value.details() == says, info.value.details()
                    with pytest.raises(grpc.aio.AioRpcError):  # nothing runs
                        await st.GetJob(party_pb2.GetJobRequest(job_id=desc.job_id))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                assert not [e for e in audit if e["event"] == "job.accepted"]
                refused = [e for e in audit if e["event"] == "job.refused"]
                assert [e["job_id"] for e in refused] == [d.job_id for d, _ in cases]
                assert all(e["failure"] == "refused" for e in refused)
            if _mpspdz_reason is not None:
                pytest.skip(f"the active run needs MP-SPDZ: {_mpspdz_reason}")
            # active-3pc, as the owner allows: accepted by every party
            ok = job(3, "active-3pc", "mp-spdz", [active_only])
            for st in stubs:
                await st.StartJob(start_requests(ok))
            for st in stubs:
                await st.CancelJob(party_pb2.CancelJobRequest(job_id="j3"))
            for st_dir in (s.state_dir for s in dep.settings):
                audit = [json.loads(x) for x in (st_dir / "audit.log").read_text().splitlines()]
                assert [(e["job_id"], e["security"]) for e in audit
                        if e["event"] == "job.accepted"] == [("j3", "active-3pc")]

    asyncio.run(scenario())


def test_the_gateway_relays_only_consents_allowing_the_jobs_setting_and_says_why_not(
    stack: Stack,
) -> None:
    """The gateway's own filter (a courtesy: every party checks the setting itself): a
    job in a setting an owner's consents do not allow is refused at submission, naming
    the owner, the data set and the settings allowed, before any mask is uploaded; a
    consent not allowing the job's setting is not relayed beside one that does (every
    party would refuse the job for carrying it)."""
    _, ids, _ = horizontal_setup(stack, m=20, p=4, seed=7)
    a, b, analyst = (stack.client(s) for s in ("owner-a", "owner-b", "analyst-1"))
    box = stack.keys["analyst-1"].box_public_key
    jobs_before = len(analyst.list_jobs())
    masks_before = [d["id"] for d in analyst.list_datasets("mask")]
    a.consent(stack.keys["owner-a"], ids[0], "analyst-1", box, securities=["active-3pc"])
    b.consent(stack.keys["owner-b"], ids[1], "analyst-1", box,
              securities="active-3pc,active-4pc")
    with pytest.raises(ApiError) as info:
        analyst.submit(stack.keys["analyst-1"], ids, label="label", k=1, engine="mpyc",
                       security="passive-3pc")
    assert info.value.status == 422  # at validation: before any mask is uploaded
    assert ("security: the consent of 'owner-a' for data set "
            f"{ids[0]!r} does not allow passive-3pc; it allows active-3pc (--security)"
            ) in info.value.detail, info.value.detail
    assert len(analyst.list_jobs()) == jobs_before  # no job, no masks
    assert [d["id"] for d in analyst.list_datasets("mask")] == masks_before

    def relayed(job_id: str) -> set[tuple[str, str, tuple[str, ...]]]:
        desc = stack.cluster.parties[0].jobs[job_id].desc
        return {(c.owner_id, c.reveal.value, tuple(sorted(s.value for s in c.securities)))
                for c in (SignedConsent(x.statement, x.signature).consent
                          for x in desc.consents)}

    # owner-a also consents to the model, in any setting: owner-b's consent is named now
    a.consent(stack.keys["owner-a"], ids[0], "analyst-1", box, Reveal.MODEL)
    with pytest.raises(ApiError) as info:
        analyst.submit(stack.keys["analyst-1"], ids, label="label", k=1, engine="mpyc",
                       security="passive-3pc")
    assert (f"the consent of 'owner-b' for data set {ids[1]!r} does not allow passive-3pc; "
            "it allows active-3pc, active-4pc") in info.value.detail, info.value.detail
    # active-3pc: every consent allows it, every one relayed
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=1,
                         engine="mp-spdz", security="active-3pc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    assert relayed(job["id"]) == {
        ("owner-a", "selection", ("active-3pc",)), ("owner-a", "selection+model", ()),
        ("owner-b", "selection", ("active-3pc", "active-4pc"))}
    # owner-b allows any setting for the model too: passive-3pc runs on the two consents
    # that allow it, the ones for active settings only left out
    b.consent(stack.keys["owner-b"], ids[1], "analyst-1", box, Reveal.MODEL)
    job = analyst.submit(stack.keys["analyst-1"], ids, label="label", k=1, engine="mpyc",
                         security="passive-3pc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    assert relayed(job["id"]) == {("owner-a", "selection+model", ()),
                                  ("owner-b", "selection+model", ())}


def test_consent_command_signs_security_settings_and_lists_them(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ids, _ = horizontal_setup(stack, m=20, p=4, seed=7)
    url = stack.gateway.url
    box = base64.b64encode(stack.keys["analyst-1"].box_public_key).decode()

    def consent(owner: str, ds: str, *more: str) -> tuple[int, str, str]:
        return run(capsys, stack, url, owner, "datasets", "consent", ds, "--recipient",
                   "analyst-1", "--recipient-key", box, *more)

    for bad in (["--security", "passive-5pc"], ["--security", ""], ["--security", ","],
                ["--security", "active-3pc", "--active-only"]):
        with pytest.raises(SystemExit):
            consent("owner-a", ids[0], *bad)
    assert stack.client("analyst-1").list_consents(ids[0]) == []
    rc, out, err = consent("owner-a", ids[0], "--security", "active-4pc, active-3pc",
                           "--min-rows", "10")
    assert rc == 0, err
    assert (f"owner-a lets analyst-1 learn the selection of jobs run in active-3pc or "
            f"active-4pc on {ids[0]} pinning at least 10 rows of it") in out, out
    listed = stack.client("analyst-1").list_consents(ids[0])
    assert [(c["owner_id"], c["min_rows"], c["securities"]) for c in listed] == [
        ("owner-a", 10, ["active-3pc", "active-4pc"])]
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[0])
    assert rc == 0 and "at least 10 rows; only in active-3pc or active-4pc" in out, out
    from ppfs_gateway.registry import Registry

    statement = Registry(stack.gateway.settings.db_path).consents(ids[0])[0].statement
    assert json.loads(statement)["purpose"] == "ppfs consent v4"
    assert SignedConsent(statement, b"").consent.securities == {Security.ACTIVE_3PC,
                                                                 Security.ACTIVE_4PC}
    # --active-only: the active settings; without either, any setting (a v1 statement)
    rc, out, err = consent("owner-b", ids[1], "--active-only", "--max-jobs", "2")
    assert rc == 0 and ("learn the selection of 2 jobs run in active-3pc or active-4pc "
                        f"on {ids[1]}") in out, out
    rc, out, err = consent("owner-b", ids[1], "--model")
    assert rc == 0 and "jobs run in" not in out, out
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[1])
    assert rc == 0, err
    assert "at most 2 jobs; no minimum of rows; only in active-3pc or active-4pc" in out, out
    assert "any number of jobs; no minimum of rows; any security setting" in out, out
    rc, out, err = run(capsys, stack, url, "analyst-1", "datasets", "consents", ids[1],
                       "--json")
    assert rc == 0, err
    assert sorted((c["reveal"], c["securities"]) for c in json.loads(out)) == [
        ("selection", ["active-3pc", "active-4pc"]), ("selection+model", [])]
    stored = Registry(stack.gateway.settings.db_path).consents(ids[1])
    assert sorted(json.loads(c.statement)["purpose"] for c in stored) == [
        "ppfs consent v1", "ppfs consent v4"]


def test_a_consent_for_one_job_serves_one_job_through_the_gateway(tmp_path: Path) -> None:
    """The owners' consents for one job each, on the party daemons themselves: the first
    job runs (its selection equal to the mirror), the second fails, every party naming
    the spent consent."""
    stack = make_stack(tmp_path, cluster=RealCluster(3, tmp_path, engines=("mpyc",)))
    try:
        t, ids, _ = horizontal_setup(stack, m=20, p=4, seed=5)
        analyst = stack.client("analyst-1")
        key = stack.keys["analyst-1"]
        for owner, ds in (("owner-a", ids[0]), ("owner-b", ids[1])):
            stack.client(owner).consent(stack.keys[owner], ds, "analyst-1",
                                        key.box_public_key, Reveal.SELECTION, max_jobs=1)
        once = analyst.submit(key, ids, label="label", k=1, engine="mpyc")
        assert wait_final(analyst, once["id"], timeout=120)["state"] == "succeeded"
        got = analyst.fetch_result(key, once["id"])
        assert got.indices.tolist() == oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 1).tolist()
        again = analyst.submit(key, ids, label="label", k=1, engine="mpyc")
        end = wait_final(analyst, again["id"], timeout=120)
        assert end["state"] == "failed" and end["failure_kind"] == "refused", end
        assert "its consent allows 1 job, all used" in end["error"], end
    finally:
        stack.close()
