"""A turned gateway cannot replay the revocation list from before a revocation to a
client that saw the newer one.

The client keeps, next to its key file and per deployment CA, the newest revocation
list it accepted (ppfs_client.seen_lists): a list issued before it, or another one of
the same issue time, is refused as a replay before anything is sealed or any result
opened; a newer one replaces it. A client that has seen no list yet still takes an old
one while it is fresh (the limit: the window stays open for it). A record that does not
read is refused, naming it, never taken for none. The CA issues each list strictly after
the one before (ppfs.revocation.issue), so no two lists share an issue time.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
from pathlib import Path

import pytest
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient
from ppfs_client.seen_lists import (
    FOLDER_SUFFIX,
    ReplayedRevocationList,
    check_and_remember,
    record_path,
    remembered,
)
from service_fakes import Stack, horizontal_setup, make_stack, owner_table, wait_final
from test_key_revocation import (
    _as_served,
    _revoke_bob,
    _serve_list,
    _upload,
    pki,
    revocable,  # noqa: F401  (the fixture)
)
from test_trust import EvilGateway, run

from ppfs.keycert import RevocationList, TrustAnchor, ca_fingerprint, issue_revocations
from ppfs.pki import CertificateAuthority, save_ca
from ppfs.revocation import issue, reissue, revoke
from ppfs.synthetic import make_table

REPLAYED = "older than one this client already accepted"


def _served(s: Stack) -> tuple[bytes, bytes]:
    """The list the gateway serves now, (list, signature)."""
    d = json.loads((s.root / "gateway-revocations.json").read_bytes())
    return base64.b64decode(d["revocation_list"]), base64.b64decode(d["signature"])


def _issued(signed: tuple[bytes, bytes]) -> str:
    return str(json.loads(signed[0])["issued_at"])


def _record(s: Stack, subject: str) -> Path:
    key = s.keys[subject].path
    assert key is not None
    return record_path(key, ca_fingerprint(s.cluster.ca.cert))


def test_a_list_from_before_the_revocation_is_refused_once_a_newer_one_was_seen(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """Bob's key is stolen and revoked; the clients see the list naming him (refused:
    his keys are revoked, the list remembered all the same); the gateway then replays
    the list from before, still fresh, to present Bob's stolen keys: the owner's upload
    and the recipient's result fetch are refused as a replay, nothing sent."""
    s = revocable
    before = _served(s)
    _, ids, _ = horizontal_setup(s, m=40, p=4, seed=5)
    analyst = s.client("analyst-1")
    job = analyst.submit(s.keys["analyst-1"], ids, label="label", k=2, engine="mpyc")
    assert wait_final(analyst, job["id"])["state"] == "succeeded"
    _revoke_bob(s, capsys)
    after = _served(s)
    assert _issued(after) > _issued(before)
    revoked = "party 1 (Bob): its keys were revoked by the deployment CA"
    rc, _, err = _upload(capsys, s, s.gateway.url, tmp_path)
    assert rc == 1 and revoked in err, err
    rc, out, err = run(capsys, s, s.gateway.url, "analyst-1", "result", "fetch", job["id"],
                       "--json")
    assert rc == 1 and revoked in err, (out, err)
    for subject in ("owner-a", "analyst-1"):  # remembered although the deployment failed
        seen = remembered(s.keys[subject], ca_fingerprint(s.cluster.ca.cert))
        assert seen is not None and seen.issued_at == _issued(after), subject
        assert _record(s, subject).stat().st_mode & 0o777 == 0o600
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(before)))
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1, err
        assert (f"the gateway relayed a revocation list issued at {_issued(before)}, "
                f"{REPLAYED} (issued at {_issued(after)}, naming 1 key statement): an "
                "old list replayed") in err, err
        assert "refusing the deployment" in err
        rc, out, err = run(capsys, s, evil.url, "analyst-1", "result", "fetch", job["id"],
                           "--json")
        assert rc == 1 and REPLAYED in err, (out, err)
        assert "selected" not in out
        via_evil = GatewayClient(evil.url, s.token["analyst-1"], timeout=30,
                                 trust=TrustAnchor.parse(str(s.ca_pem)))
        with pytest.raises(ReplayedRevocationList, match=REPLAYED):
            via_evil.fetch_result(s.keys["analyst-1"], job["id"])
        with pytest.raises(ReplayedRevocationList, match=REPLAYED):
            via_evil.upload_table(s.keys["analyst-1"], owner_table(make_table(8, 2)), "x")
        assert evil.posts() == []  # nothing created, sealed or submitted through it
    finally:
        evil.stop()


def test_a_newer_list_replaces_the_one_remembered_and_is_shown(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    s = revocable
    first = _served(s)
    rc, out, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0, err
    assert re.search(rf"revocation list issued {_issued(first)}, stale after \S+Z \(0 key "
                     r"statements revoked\); the newest this key file accepted", out), out
    # re-issued (the same revocations, later) and installed: the newer list is taken
    rc, _, err = pki(capsys, "revocations", "--ca-dir", str(s.root / "ca"), "--out",
                     str(s.root / "gateway-revocations.json"))
    assert rc == 0, err
    second = _served(s)
    assert _issued(second) > _issued(first)
    rc, out, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0 and f"revocation list issued {_issued(second)}" in out, err
    seen = remembered(s.keys["owner-a"], ca_fingerprint(s.cluster.ca.cert))
    assert seen is not None and seen.issued_at == _issued(second)
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(first)))
    try:
        rc, out, err = run(capsys, s, evil.url, "owner-a", "deployment")
        assert rc == 1 and REPLAYED in err and _issued(first) in err, (out, err)
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1 and REPLAYED in err, err
        assert evil.posts() == []
    finally:
        evil.stop()


def test_another_list_of_the_same_issue_time_is_refused(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    s = revocable
    ca = s.cluster.ca
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    one = issue_revocations(ca.key, ca.cert, set(), now=at)
    other = issue_revocations(ca.key, ca.cert, {"ab" * 32}, now=at)
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(one)))
    try:
        rc, _, err = run(capsys, s, evil.url, "owner-a", "deployment")
        assert rc == 0, err
        rc, _, err = run(capsys, s, evil.url, "owner-a", "deployment")  # the same: taken
        assert rc == 0, err
    finally:
        evil.stop()
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(other)))
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1, err
        assert (f"the gateway relayed a revocation list issued at {_issued(one)} that "
                "differs from the one of that same issue time this client already "
                "accepted") in err, err
        assert evil.posts() == []
    finally:
        evil.stop()


def test_a_client_that_saw_no_newer_list_still_takes_the_old_one(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """The limit: the memory is the client's own. A client (key file) that never saw
    the list naming Bob takes the old list while it is fresh; one that saw it does not."""
    s = revocable
    before = _served(s)
    _revoke_bob(s, capsys)
    rc, _, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 1 and "revoked by the deployment CA" in err, err
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(before)))
    try:
        rc, _, err = run(capsys, s, evil.url, "owner-a", "deployment")
        assert rc == 1 and REPLAYED in err, err
        rc, out, err = run(capsys, s, evil.url, "owner-b", "deployment")
        assert rc == 0, err  # no memory yet: the replay is not detectable
        assert f"revocation list issued {_issued(before)}" in out
    finally:
        evil.stop()


def test_a_list_is_remembered_where_no_statement_asks_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Statements without the flag do not need the list; one the CA signed is still
    remembered when relayed, shown by `ppfs deployment`, and an older one relayed later
    is refused as a replay all the same (the gateway that does so is not to be trusted)."""
    s = make_stack(tmp_path)
    try:
        ca = s.cluster.ca
        now = dt.datetime.now(dt.UTC)
        newer = issue_revocations(ca.key, ca.cert, set(), now=now)
        older = issue_revocations(ca.key, ca.cert, set(), now=now - dt.timedelta(hours=1))
        evil = EvilGateway(s.gateway.url, _serve_list(_as_served(newer)))
        try:
            rc, out, err = run(capsys, s, evil.url, "owner-a", "deployment")
            assert rc == 0, err
        finally:
            evil.stop()
        rc, out, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")  # serves none
        assert rc == 0, err
        assert (f"newest revocation list this key file accepted: issued {_issued(newer)} "
                "(one issued before it is refused as a replay)") in out, out
        evil = EvilGateway(s.gateway.url, _serve_list(_as_served(older)))
        try:
            rc, out, err = run(capsys, s, evil.url, "owner-a", "deployment")
            assert rc == 1 and REPLAYED in err, (out, err)
        finally:
            evil.stop()
    finally:
        s.close()


@pytest.mark.parametrize("damage", [b"{not json", b"[]", b'{"ca_sha256": "00"}', b""],
                         ids=["not-json", "not-object", "fields", "empty"])
def test_a_damaged_record_is_refused_naming_it(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
    damage: bytes,
) -> None:
    """Never taken for no record (that would reopen the window without a word)."""
    s = revocable
    rc, _, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0, err
    record = _record(s, "owner-a")
    assert record.is_file()
    record.write_bytes(damage)
    evil = EvilGateway(s.gateway.url, _serve_list(lambda d: None))  # relays as it is
    try:
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 2, err
        assert f"{record}: the record of the newest revocation list this key file " \
               "accepted is damaged" in err, err
        assert "Restore it from a backup" in err and "delete it" in err
        assert evil.posts() == []
        assert record.read_bytes() == damage  # left for the user to restore
    finally:
        evil.stop()


def test_records_are_kept_per_deployment_ca(tmp_path: Path) -> None:
    keys = ClientKeys.generate("owner").save(tmp_path / "owner.key")
    one, two = CertificateAuthority.create("one"), CertificateAuthority.create("two")
    now = dt.datetime.now(dt.UTC)

    def listed(ca: CertificateAuthority, at: dt.datetime) -> RevocationList:
        return RevocationList.from_bytes(issue_revocations(ca.key, ca.cert, set(), now=at)[0])

    fp1, fp2 = ca_fingerprint(one.cert), ca_fingerprint(two.cert)
    check_and_remember(keys, fp1, listed(one, now))
    # another deployment's list, older than the first one's: its own record
    check_and_remember(keys, fp2, listed(two, now - dt.timedelta(days=2)))
    with pytest.raises(ReplayedRevocationList, match=REPLAYED):
        check_and_remember(keys, fp1, listed(one, now - dt.timedelta(days=1)))
    check_and_remember(keys, fp2, listed(two, now - dt.timedelta(days=1)))  # newer: taken
    seen1, seen2 = remembered(keys, fp1), remembered(keys, fp2)
    assert seen1 is not None and seen2 is not None
    assert seen1.issued == now.replace(microsecond=0)
    assert seen2.issued == (now - dt.timedelta(days=1)).replace(microsecond=0)
    folder = tmp_path / f"owner.key{FOLDER_SUFFIX}"
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{fp1}.json", f"{fp2}.json"])
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in folder.iterdir())
    # one CA's record holds only that CA's list: moved over another's, it is refused
    os.replace(folder / f"{fp2}.json", folder / f"{fp1}.json")
    with pytest.raises(Exception, match="is damaged"):
        remembered(keys, fp1)
    # without a key file on disk nothing is kept
    check_and_remember(ClientKeys.generate("x"), fp1, listed(one, now - dt.timedelta(days=3)))


def test_the_ca_issues_each_list_after_the_one_before(tmp_path: Path) -> None:
    """Two lists in one second (a revocation right after a re-issue), or a CA clock set
    back: each list is still issued strictly after the one before it, so that clients
    never see two lists of one issue time."""
    ca_dir, ca = tmp_path / "ca", CertificateAuthority.create("ca")
    save_ca(ca, ca_dir)
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    first = issue(ca_dir, ca, set(), now=at)
    second = reissue(ca_dir, ca, now=at + dt.timedelta(microseconds=500))
    assert second.issued == first.issued + dt.timedelta(seconds=1)
    assert second.stale_after - second.issued == dt.timedelta(days=7)
    (ca_dir / "statements").mkdir()
    with pytest.raises(ValueError, match="no key statement"):
        revoke(ca_dir, ca, party=1, now=at - dt.timedelta(hours=1))
    # clock set back, within the clocks' tolerance (beyond it: the test after this one)
    third = reissue(ca_dir, ca, now=at - dt.timedelta(minutes=2))
    assert third.issued == second.issued + dt.timedelta(seconds=1)
    later = reissue(ca_dir, ca, now=at + dt.timedelta(minutes=1))  # the clock again
    assert later.issued == at + dt.timedelta(minutes=1)


def test_a_list_issued_in_the_future_poisons_no_client(
    revocable: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    """The CA's clock runs a year ahead for one `ppfs pki revocations`: the list it signs
    is the CA's, but dated a year on. A client takes none of it (refused where a
    statement asks for the list, never remembered), so once the CA's clock is right
    again its next list is taken; had the client remembered the list from the future,
    it would refuse every right list as a replay for a year."""
    s = revocable
    ca = s.cluster.ca
    rc, _, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0, err
    before = remembered(s.keys["owner-a"], ca_fingerprint(ca.cert))
    assert before is not None
    ahead = issue_revocations(ca.key, ca.cert, set(),
                              now=dt.datetime.now(dt.UTC) + dt.timedelta(days=365))
    evil = EvilGateway(s.gateway.url, _serve_list(_as_served(ahead)))
    try:
        rc, _, err = run(capsys, s, evil.url, "owner-a", "deployment")
        assert rc == 1, err
        assert f"was issued at {_issued(ahead)}, after this machine's clock" in err, err
        rc, _, err = _upload(capsys, s, evil.url, tmp_path)
        assert rc == 1 and "after this machine's clock" in err, err
        assert evil.posts() == []
    finally:
        evil.stop()
    assert remembered(s.keys["owner-a"], ca_fingerprint(ca.cert)) == before
    # re-issued with the clock right: taken, and remembered
    rc, _, err = pki(capsys, "revocations", "--ca-dir", str(s.root / "ca"), "--out",
                     str(s.root / "gateway-revocations.json"))
    assert rc == 0, err
    rc, _, err = run(capsys, s, s.gateway.url, "owner-a", "deployment")
    assert rc == 0, err
    seen = remembered(s.keys["owner-a"], ca_fingerprint(ca.cert))
    assert seen is not None and seen.issued_at == _issued(_served(s))


def test_a_list_from_the_future_is_not_remembered_where_none_is_asked_for(
        tmp_path: Path) -> None:
    keys = ClientKeys.generate("owner").save(tmp_path / "owner.key")
    ca = CertificateAuthority.create("ca")
    fp, now = ca_fingerprint(ca.cert), dt.datetime.now(dt.UTC)

    def listed(at: dt.datetime) -> RevocationList:
        return RevocationList.from_bytes(issue_revocations(ca.key, ca.cert, set(), now=at)[0])

    check_and_remember(keys, fp, listed(now + dt.timedelta(days=365)))
    assert remembered(keys, fp) is None
    check_and_remember(keys, fp, listed(now))  # a right one: taken
    seen = remembered(keys, fp)
    assert seen is not None and seen.issued == now.replace(microsecond=0)


def test_the_ca_dates_no_list_after_one_from_a_clock_that_ran_ahead(tmp_path: Path) -> None:
    """The CA's clock ran a year ahead for one list (no client took it: issued in the
    future); once it is right, the next list is issued now, not a second after that one
    (a year ahead again, and refused by every client until then)."""
    ca_dir, ca = tmp_path / "ca", CertificateAuthority.create("ca")
    save_ca(ca, ca_dir)
    at = dt.datetime.now(dt.UTC).replace(microsecond=0)
    issue(ca_dir, ca, set(), now=at + dt.timedelta(days=365))
    right = reissue(ca_dir, ca, now=at)
    assert right.issued == at
    assert right.stale_problem(at) is None
    # within the clocks' tolerance, a list is still issued after the one before
    again = reissue(ca_dir, ca, now=at - dt.timedelta(minutes=2))
    assert again.issued == at + dt.timedelta(seconds=1)


def test_a_revocation_made_while_the_list_is_issued_again_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ppfs up` issues the list again (the same revocations, fresh) while the operator
    revokes Bob (`ppfs pki revoke --ca-dir STATE/ca`): both read the list in force and
    write the list they sign; the one written last must not drop the revocation."""
    import threading

    from nacl.public import PrivateKey
    from nacl.signing import SigningKey

    import ppfs.revocation as revocation
    from ppfs.keycert import certify_party_keys, statement_sha256
    from ppfs.revocation import current_list, record_statement

    ca_dir, ca = tmp_path / "ca", CertificateAuthority.create("ca")
    save_ca(ca, ca_dir)
    statement, _ = certify_party_keys(
        ca.key, ca.cert, 1, "Bob", bytes(PrivateKey.generate().public_key),
        bytes(SigningKey.generate().verify_key), revocation_list=True)
    record_statement(ca_dir, statement)
    issue(ca_dir, ca, set())
    real = revocation.issue_revocations
    refresh_read, revoked = threading.Event(), threading.Event()

    def signing(*args: object, **kwargs: object) -> tuple[bytes, bytes]:
        if threading.current_thread().name == "refresh":  # it has read the list in force
            refresh_read.set()
            revoked.wait(3.0)  # the revocation meanwhile, unless it waits for this issue
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(revocation, "issue_revocations", signing)
    refresh = threading.Thread(target=reissue, args=(ca_dir, ca), name="refresh")
    refresh.start()
    assert refresh_read.wait(10.0)

    def revoking() -> None:
        revoke(ca_dir, ca, party=1)
        revoked.set()

    operator = threading.Thread(target=revoking)
    operator.start()
    refresh.join(20.0)
    operator.join(20.0)
    rl = current_list(ca_dir, ca)
    assert rl is not None and statement_sha256(statement) in rl.revoked


@pytest.mark.parametrize("command", ["revocations", "revoke"])
def test_a_list_dated_before_the_one_it_replaces_is_named(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """The list in force was issued an hour after this machine's clock says now: the
    clock was set back (clients that took that list refuse the new one as a replay), or
    ran ahead when it was issued (no client took it). The operator is told which list
    is dated after which, and what to do, rather than finding out from the clients."""
    from nacl.public import PrivateKey
    from nacl.signing import SigningKey

    from ppfs.keycert import certify_party_keys
    from ppfs.revocation import record_statement

    ca_dir, ca = tmp_path / "ca", CertificateAuthority.create("ca")
    save_ca(ca, ca_dir)
    statement, _ = certify_party_keys(
        ca.key, ca.cert, 1, "Bob", bytes(PrivateKey.generate().public_key),
        bytes(SigningKey.generate().verify_key), revocation_list=True)
    record_statement(ca_dir, statement)
    ahead = issue(ca_dir, ca, set(), now=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    argv = ["--ca-dir", str(ca_dir)] + (["--party", "1"] if command == "revoke" else [])
    rc, _, err = pki(capsys, command, *argv)
    assert rc == 0, err
    assert (f"warning: the list it replaces was issued at {ahead.issued_at}, after this "
            "one") in err, err
    assert "set it right and issue the list again" in err
    rc, _, err = pki(capsys, command, *argv)  # the clocks agree again: nothing to say
    assert rc == 0 and "warning" not in err, err
