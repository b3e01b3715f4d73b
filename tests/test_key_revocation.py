"""A stolen party key is revoked before its statement ends.

A key statement signed with ``revocation_list`` (``ppfs pki sign --revocable``) is
trusted only with a fresh revocation list of the same CA that does not name it
(ppfs.keycert). The gateway relays the list and is the adversary here: withholding it,
serving a stale one, one of another CA or a tampered one gets every party whose
statement asks for it refused, naming the party, before anything is sealed; a list that
names a party's statement gets that party refused by an owner's upload and by a
recipient's result fetch. An old list replayed from before the revocation is refused
once stale; while still fresh it is taken by a client that never saw the newer list:
the window is the list's freshness (``--fresh-days``, 7 days by default). A client that
saw it refuses the old one as a replay (tests/test_revocation_replay.py). A statement
without the flag is trusted as before, and the CA's commands round-trip: sign
(recorded), revoke, re-issue, list.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey
from ppfs_cli.main import main
from service_fakes import FakeCluster, Stack, horizontal_setup, make_stack, wait_final
from test_trust import EvilGateway, run, write_csv

from ppfs.engines.base import PARTY_NAMES
from ppfs.keycert import (
    PURPOSE,
    KeyStatement,
    TrustAnchor,
    UntrustedPartyKey,
    certify_party_keys,
    issue_revocations,
    revocations_file_bytes,
    statement_sha256,
    verify_party_keys,
)
from ppfs.pki import CertificateAuthority, save_ca
from ppfs.revocation import REVOCATIONS_FILE, record_statement
from ppfs.synthetic import make_table

NOW = dt.datetime.now(dt.UTC)
DAY = dt.timedelta(days=1)


def pki(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["pki", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def revocable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Stack]:
    """Three parties whose statements ask for the revocation list, their CA kept in
    ``ca/`` with every statement on record, and a gateway serving the list from
    ``gateway-revocations.json``."""
    cluster = FakeCluster(3, tmp_path)
    ca_dir = tmp_path / "ca"
    save_ca(cluster.ca, ca_dir)
    for p in cluster.parties:
        p.statement = certify_party_keys(
            cluster.ca.key, cluster.ca.cert, p.index, PARTY_NAMES[p.index],
            bytes(p.box.public_key), bytes(p.signing.verify_key), revocation_list=True)
        record_statement(ca_dir, p.statement[0])
    served = tmp_path / "gateway-revocations.json"
    rc, _, err = pki(capsys, "revocations", "--ca-dir", str(ca_dir), "--out", str(served))
    assert rc == 0, err
    s = make_stack(tmp_path, cluster=cluster, revocation_list=str(served))
    yield s
    s.close()


def _serve_list(change: Callable[[dict[str, Any]], None]) -> Callable[[str, str, Any], Any]:
    def rewrite(method: str, path: str, body: Any) -> Any:
        if path == "/v1/deployment":
            body = copy.deepcopy(body)
            change(body)
        return body

    return rewrite


def _as_served(signed: tuple[bytes, bytes]) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d["revocation_list"] = base64.b64encode(signed[0]).decode()
        d["revocation_list_signature"] = base64.b64encode(signed[1]).decode()

    return change


def _withheld(d: dict[str, Any]) -> None:
    d.pop("revocation_list")
    d.pop("revocation_list_signature")


def _tampered(d: dict[str, Any]) -> None:
    sig = bytearray(base64.b64decode(d["revocation_list_signature"]))
    sig[-1] ^= 1
    d["revocation_list_signature"] = base64.b64encode(bytes(sig)).decode()


def _upload(capsys: pytest.CaptureFixture[str], s: Stack, url: str,
            tmp_path: Path) -> tuple[int, str, str]:
    t = make_table(12, 3, seed=2)
    write_csv(tmp_path / "a.csv", t)
    return run(capsys, s, url, "owner-a", "upload", str(tmp_path / "a.csv"),
               "--dataset", "d", "--label", "label")


def test_statements_asking_for_the_list_are_trusted_with_a_fresh_one(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = revocable
    rc, out, err = _upload(capsys, s, s.gateway.url, tmp_path)
    assert rc == 0, err
    rc, out, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0, err
    assert re.search(r"revocation list issued \S+Z, stale after \S+Z \(0 key statements "
                     r"revoked\)", out), out
    assert "stale on" not in err


def _stale(s: Stack) -> tuple[bytes, bytes]:
    ca = s.cluster.ca
    return issue_revocations(ca.key, ca.cert, set(), now=NOW - 8 * DAY)


def _other_ca(s: Stack) -> tuple[bytes, bytes]:
    rogue = CertificateAuthority.create("rogue CA")
    return issue_revocations(rogue.key, rogue.cert, set())


def _for_another_ca(s: Stack) -> tuple[bytes, bytes]:
    """Signed by the deployment CA, but a list naming another CA (its fingerprint)."""
    ca = s.cluster.ca
    blob, _ = issue_revocations(ca.key, ca.cert, set())
    d = json.loads(blob)
    d["ca"] = "0" * 64
    blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return blob, ca.key.sign(blob, ec.ECDSA(hashes.SHA256()))


@pytest.mark.parametrize(("how", "message"), [
    ("withheld", "revocation list, and the gateway relayed none"),
    ("stale", "fresh revocation list, and the revocation list the gateway relayed went "
              "stale on"),
    ("other-ca", "the one the gateway relayed is not signed by the deployment CA"),
    ("for-another-ca", "the one the gateway relayed names another deployment CA"),
    ("tampered", "the one the gateway relayed is not signed by the deployment CA"),
], ids=["withheld", "stale", "other-ca", "for-another-ca", "tampered"])
def test_a_gateway_withholding_or_forging_the_list_is_refused_before_sealing(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str,
    message: str,
) -> None:
    s = revocable
    change = {"withheld": _withheld, "tampered": _tampered}.get(how) or _as_served(
        {"stale": _stale, "other-ca": _other_ca, "for-another-ca": _for_another_ca}[how](s))
    evil = EvilGateway(s.gateway.url, _serve_list(change))
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1, err
        assert "party 0 (Alice): its key statement is trusted only with" in err, err
        assert message in err, err
        rc, _, err = run(capsys, s, evil.url, "analyst-1", "jobs", "submit", "--dataset",
                         "x", "--label", "label", "--k", "1")
        assert rc == 1 and "party 0 (Alice)" in err and message in err, err
        assert evil.posts() == []  # nothing created, sealed or submitted through it
    finally:
        evil.stop()


def _revoke_bob(s: Stack, capsys: pytest.CaptureFixture[str]) -> str:
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(s.root / "ca"), "--party", "bob",
                       "--out", str(s.root / "gateway-revocations.json"))
    assert rc == 0, err
    bob = statement_sha256(s.cluster.parties[1].statement[0])  # type: ignore[index]
    assert f"revoked {bob} Bob (index 1)" in out, out
    assert "1 key statement revoked" in out
    return bob


def test_a_revoked_party_is_refused_by_upload_and_result_fetch(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = revocable
    _, ids, _ = horizontal_setup(s, m=40, p=4, seed=5)
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2, engine="mpyc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    _revoke_bob(s, capsys)  # installed on the gateway: read again as the file changed
    revoked = "party 1 (Bob): its keys were revoked by the deployment CA"
    rc, out, err = _upload(capsys, s, s.gateway.url, tmp_path)
    assert rc == 1 and revoked in err, err
    assert "d" not in [d["name"] for d in s.client("admin").list_datasets()]
    rc, out, err = run(capsys, s, s.gateway.url, "analyst-1", "result", "fetch", job["id"],
                       "--json")
    assert rc == 1 and revoked in err, (out, err)
    assert "selected" not in out
    with pytest.raises(UntrustedPartyKey, match=re.escape(revoked)):
        s.client("owner-a").deployment()


def test_a_list_from_before_the_revocation_is_taken_only_while_fresh(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gateway replays the list it served before Bob was revoked to a client that
    never saw the newer list: still fresh, it is taken (the window a revocation leaves
    is the list's freshness); once past its next_update it is refused as stale."""
    s = revocable
    before = (s.root / "gateway-revocations.json").read_bytes()
    d = json.loads(before)
    old = (base64.b64decode(d["revocation_list"]), base64.b64decode(d["signature"]))
    _revoke_bob(s, capsys)
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(old)))
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 0, err  # within the freshness: the replay is not detectable
    finally:
        evil.stop()
    ca = s.cluster.ca
    old_and_stale = issue_revocations(ca.key, ca.cert, set(), freshness=7 * DAY,
                                      now=NOW - 7 * DAY - dt.timedelta(minutes=6))
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(old_and_stale)))
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1 and "party 0 (Alice)" in err and "went stale on" in err, err
        assert evil.posts() == []
    finally:
        evil.stop()


def test_statements_without_the_flag_are_trusted_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Old statements keep their purpose and bytes; with no list served (or one that
    names nothing of theirs) they are trusted as before; a client that knows no list
    (one checking PURPOSE only) refuses a flagged statement rather than ignore it."""
    s = make_stack(tmp_path)
    try:
        rc, out, err = _upload(capsys, s, s.gateway.url, tmp_path)
        assert rc == 0, err
        rc, out, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
        assert rc == 0 and "revocation list" not in out + err, (out, err)
    finally:
        s.close()
    ca = CertificateAuthority.create("ca")
    box, sig = bytes(PrivateKey.generate().public_key), bytes(SigningKey.generate().verify_key)
    old, _ = certify_party_keys(ca.key, ca.cert, 0, "Alice", box, sig)
    new, _ = certify_party_keys(ca.key, ca.cert, 0, "Alice", box, sig, revocation_list=True)
    assert b"revocation_list" not in old and json.loads(old)["purpose"] == PURPOSE
    assert set(json.loads(new)) == set(json.loads(old)) | {"revocation_list"}
    assert json.loads(new)["purpose"] != PURPOSE  # refused by a client without this check


def test_revocation_checks() -> None:
    ca, other = CertificateAuthority.create("ca"), CertificateAuthority.create("other")
    anchor = TrustAnchor.from_pem(ca.cert_pem())
    box, sig = bytes(PrivateKey.generate().public_key), bytes(SigningKey.generate().verify_key)
    st, s = certify_party_keys(ca.key, ca.cert, 2, "Carol", box, sig, revocation_list=True)
    ok: dict[str, Any] = dict(index=2, name="Carol", box_public_key=box,
                              signing_public_key=sig, statement=st, signature=s)
    fresh = issue_revocations(ca.key, ca.cert, set())
    assert verify_party_keys(anchor, revocations=fresh, **ok).revocation_list
    who = "party 2 (Carol): its key statement is trusted only with"
    with pytest.raises(UntrustedPartyKey, match=re.escape(who)):
        verify_party_keys(anchor, **ok)  # the default: no list
    # a list stale by less than the clock skew allowance is taken, by more refused (at a
    # time taken now, within the statement's validity: the module's NOW is from before
    # the statement was signed when the whole suite runs)
    now = dt.datetime.now(dt.UTC)
    issued = now - 7 * DAY
    for late, taken in ((dt.timedelta(minutes=4), True), (dt.timedelta(minutes=6), False)):
        old = issue_revocations(ca.key, ca.cert, set(), now=issued - late)
        if taken:
            verify_party_keys(anchor, revocations=old, now=now, **ok)
        else:
            with pytest.raises(UntrustedPartyKey, match="went stale on"):
                verify_party_keys(anchor, revocations=old, now=now, **ok)
    named = issue_revocations(ca.key, ca.cert, {statement_sha256(st)})
    with pytest.raises(UntrustedPartyKey, match=r"Carol.*revoked by the deployment CA"):
        verify_party_keys(anchor, revocations=named, **ok)
    with pytest.raises(UntrustedPartyKey, match="not signed by the deployment CA"):
        verify_party_keys(anchor, revocations=issue_revocations(other.key, other.cert, set()),
                          **ok)
    # an unflagged statement of the same keys is not checked against any list
    st1, s1 = certify_party_keys(ca.key, ca.cert, 2, "Carol", box, sig)
    assert not verify_party_keys(anchor, **{**ok, "statement": st1, "signature": s1},
                                 revocations=named).revocation_list
    # a v1 statement carrying the flag (or a v2 one without it) is another purpose
    d = json.loads(st)
    d["purpose"] = PURPOSE
    forged = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    with pytest.raises(UntrustedPartyKey, match="another purpose"):
        verify_party_keys(anchor, revocations=fresh, **{
            **ok, "statement": forged,
            "signature": ca.key.sign(forged, ec.ECDSA(hashes.SHA256()))})
    assert KeyStatement.from_bytes(st).revocation_list


def test_pki_revoke_reissue_and_list_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_dir, state = tmp_path / "ca", tmp_path / "bob"
    assert pki(capsys, "init", "--ca-dir", str(ca_dir))[0] == 0
    assert main(["party", "init", "--state-dir", str(state), "--index", "1"]) == 0
    rc, out, err = pki(capsys, "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
                       "--party", "bob", "--revocable")
    assert rc == 0, err
    statement = (state / "certs" / "party-keys.json").read_bytes()
    sha = statement_sha256(statement)
    assert KeyStatement.from_bytes(statement).revocation_list
    assert (ca_dir / "statements" / f"{sha}.json").read_bytes() == statement
    rc, out, err = pki(capsys, "statements", "--ca-dir", str(ca_dir))
    assert rc == 0 and f"in force {sha} Bob (index 1)" in out, (out, err)
    # the first list, then Bob revoked (written also where the gateway reads it)
    rc, out, err = pki(capsys, "revocations", "--ca-dir", str(ca_dir), "--fresh-days", "2")
    assert rc == 0 and "0 key statements revoked" in out, err
    first = json.loads((ca_dir / REVOCATIONS_FILE).read_bytes())
    served = tmp_path / "gw.json"
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--party", "1",
                       "--out", str(served))
    assert rc == 0 and f"revoked {sha} Bob (index 1)" in out, (out, err)
    assert served.read_bytes() == (ca_dir / REVOCATIONS_FILE).read_bytes()
    rc, out, err = pki(capsys, "statements", "--ca-dir", str(ca_dir))
    assert f"revoked  {sha}" in out, out
    # re-issued: same revocations, a later issue time, the freshness asked for
    os.utime(served)
    rc, out, err = pki(capsys, "revocations", "--ca-dir", str(ca_dir), "--fresh-days", "3")
    assert rc == 0 and "1 key statement revoked" in out, err
    again = json.loads(base64.b64decode(json.loads(
        (ca_dir / REVOCATIONS_FILE).read_bytes())["revocation_list"]))
    assert again["revoked"] == [sha]
    assert again["issued_at"] >= json.loads(base64.b64decode(
        first["revocation_list"]))["issued_at"]
    stale = dt.datetime.strptime(again["next_update"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.UTC)
    issued = dt.datetime.strptime(again["issued_at"], "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=dt.UTC)
    assert stale - issued == 3 * DAY
    # revoking it again changes nothing; the same keys are never certified again
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--statement", sha)
    assert rc == 0 and "nothing newly revoked" in out, (out, err)
    rc, out, err = pki(capsys, "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
                       "--party", "bob", "--revocable")
    assert rc == 2 and "keys the deployment CA revoked" in err, err
    assert (state / "certs" / "party-keys.json").read_bytes() == statement
    # nor renewed without the flag: no revocation would reach that statement
    rc, out, err = pki(capsys, "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
                       "--party", "bob")
    assert rc == 2 and "was certified with --revocable before" in err, err
    assert (state / "certs" / "party-keys.json").read_bytes() == statement
    # nothing on record by that hash, or for that party: refused, nothing revoked
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--statement", "ab" * 32)
    assert rc == 2 and "no key statement with SHA-256" in err, err
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--party", "carol")
    assert rc == 2 and "no key statement of party index 2" in err, err


def test_revoking_a_statement_that_does_not_ask_for_the_list_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_dir, state = tmp_path / "ca", tmp_path / "carol"
    assert pki(capsys, "init", "--ca-dir", str(ca_dir))[0] == 0
    assert main(["party", "init", "--state-dir", str(state), "--index", "2"]) == 0
    assert pki(capsys, "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
               "--party", "carol")[0] == 0
    rc, _, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--party", "carol")
    assert rc == 0, err
    assert "does not ask for the revocation list: clients keep trusting it" in err, err


def test_the_gateway_warns_when_its_list_goes_stale_within_a_day(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = FakeCluster(3, tmp_path)
    served = tmp_path / "gateway-revocations.json"
    ca = cluster.ca
    served.write_bytes(revocations_file_bytes(issue_revocations(
        ca.key, ca.cert, set(), freshness=dt.timedelta(hours=20))))
    s = make_stack(tmp_path, cluster=cluster, revocation_list=str(served))
    try:
        got = s.client("admin")._call("GET", "/v1/deployment/status")
        assert any(f"{served}: its revocation list goes stale on" in w
                   and "`ppfs pki revocations`" in w for w in got["warnings"]), got
        rc, _, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
        assert rc == 0 and "revocation list goes stale on" in err, err
        # re-issued fresh for a week and installed: read again, no warning
        served.write_bytes(revocations_file_bytes(issue_revocations(
            ca.key, ca.cert, set(), freshness=7 * DAY)) + b" ")
        got = s.client("admin")._call("GET", "/v1/deployment/status")
        assert not any("revocation list" in w for w in got["warnings"]), got
    finally:
        s.close()


def test_the_gateway_keeps_its_list_when_the_new_file_is_not_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file replaced by something that is not a revocation list (cut short, another
    file) is logged and the list in force stays, on a change as on SIGHUP (reload)."""
    from ppfs_gateway.revocations import RevocationFile

    ca = CertificateAuthority.create("ca")
    path = tmp_path / "revocations.json"
    signed = issue_revocations(ca.key, ca.cert, {"ab" * 32})
    path.write_bytes(revocations_file_bytes(signed))
    served = RevocationFile(path)
    assert served.current() == signed
    path.write_bytes(revocations_file_bytes(signed)[:40])
    assert served.current() == signed
    assert "revocation list not (re)loaded" in caplog.text
    assert served.reload() is False and served.current() == signed
    newer = issue_revocations(ca.key, ca.cert, {"ab" * 32, "cd" * 32})
    path.write_bytes(revocations_file_bytes(newer))
    assert served.reload() is True and served.current() == newer
    assert RevocationFile(None).current() == (b"", b"")


def test_revocation_list_out_never_replaces_a_file_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--out`` is where the gateway reads the list; the CA directory beside it holds
    the CA key. A slip that names the CA key (or any file that is not a revocation list)
    is refused before anything is revoked or issued, the file untouched; a list there is
    replaced, a new path written."""
    ca_dir, state = tmp_path / "ca", tmp_path / "bob"
    assert pki(capsys, "init", "--ca-dir", str(ca_dir))[0] == 0
    assert main(["party", "init", "--state-dir", str(state), "--index", "1"]) == 0
    assert pki(capsys, "sign", "--ca-dir", str(ca_dir), "--state-dir", str(state),
               "--party", "bob", "--revocable")[0] == 0
    key = (ca_dir / "ca.key").read_bytes()
    for cmd in (["revocations"], ["revoke", "--party", "bob"]):
        rc, out, err = pki(capsys, *cmd, "--ca-dir", str(ca_dir),
                           "--out", str(ca_dir / "ca.key"))
        assert rc == 2 and "is not a revocation list" in err, (cmd, out, err)
        assert (ca_dir / "ca.key").read_bytes() == key
        assert not (ca_dir / REVOCATIONS_FILE).exists(), cmd  # nothing issued
    served = tmp_path / "gw" / "revocations.json"
    served.parent.mkdir()
    assert pki(capsys, "revocations", "--ca-dir", str(ca_dir), "--out", str(served))[0] == 0
    rc, out, err = pki(capsys, "revoke", "--ca-dir", str(ca_dir), "--party", "bob",
                       "--out", str(served))
    assert rc == 0 and served.read_bytes() == (ca_dir / REVOCATIONS_FILE).read_bytes(), err
