"""The gateway refreshes each party's identity on its own: a party's renewed identity is
picked up while another party is down, and the one that is down keeps its last good
identity (reported as such in /v1/deployment/status). A refreshed identity that fails a
check (its index, or a key statement the deployment CA did not sign, or not valid now)
never replaces the good one.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest
from nacl.public import PrivateKey
from service_fakes import FakeCluster, Stack, make_stack, wait_until

from ppfs.pki import CertificateAuthority

DAY = dt.timedelta(days=1)


@pytest.fixture
def short(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stack whose gateway refreshes identities every 0.2 s, every party's keys
    certified for 5 days."""
    import ppfs_gateway.parties

    monkeypatch.setattr(ppfs_gateway.parties, "IDENTITY_REFRESH_SECONDS", 0.2)
    cluster = FakeCluster(3, tmp_path)
    for p in cluster.parties:
        p.key_validity = 5 * DAY
    stack = make_stack(tmp_path, cluster=cluster)
    try:
        yield stack
    finally:
        stack.close()


def _status(stack: Stack) -> dict[str, Any]:
    r = httpx.get(stack.gateway.url + "/v1/deployment/status",
                  headers={"Authorization": f"Bearer {stack.token['admin']}"})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_renewal_is_picked_up_while_another_party_is_down(short: Stack) -> None:
    client = short.client("owner-a")
    first = client.deployment().parties
    short.loop.run(short.cluster.stop_party(2))  # Carol goes away
    short.cluster.parties[0].key_validity = 365 * DAY  # the operator renews Alice

    def alice_renewed() -> bool:
        end = client.deployment().parties[0].keys_valid_until
        return end is not None and end - dt.datetime.now(dt.UTC) > 300 * DAY

    wait_until(alice_renewed, timeout=20)
    carol = client.deployment().parties[2]  # still served, and verified by the client
    assert carol.box_public_key == first[2].box_public_key
    assert carol.keys_valid_until is not None
    assert carol.keys_valid_until - dt.datetime.now(dt.UTC) <= 5 * DAY
    status = {p["name"]: p for p in _status(short)["parties"]}
    assert not status["Carol"]["reachable"]
    assert "did not answer" in status["Carol"]["identity_problem"], status["Carol"]
    assert status["Carol"]["identity_age_seconds"] is not None
    assert status["Alice"]["identity_problem"] == "", status["Alice"]
    assert any("Carol" in w and "did not answer" in w for w in _status(short)["warnings"])


def test_a_refreshed_identity_that_fails_a_check_keeps_the_good_one(short: Stack) -> None:
    client = short.client("owner-a")
    first = client.deployment().parties
    alice, bob = short.cluster.parties[0], short.cluster.parties[1]
    # Bob now reports new keys certified by a CA that is not the deployment's
    bob.box = PrivateKey.generate()
    bob.key_ca = CertificateAuthority.create("another CA")
    alice.key_validity = 365 * DAY  # a renewal that passes, to see refreshes happen

    def alice_renewed() -> bool:
        end = client.deployment().parties[0].keys_valid_until
        return end is not None and end - dt.datetime.now(dt.UTC) > 300 * DAY

    wait_until(alice_renewed, timeout=20)
    wait_until(lambda: _status(short)["parties"][1]["identity_problem"], timeout=20)
    # the client still gets Bob's good identity (it would refuse the other one)
    assert client.deployment().parties[1].box_public_key == first[1].box_public_key
    problem = _status(short)["parties"][1]["identity_problem"]
    assert "not signed by the deployment CA" in problem, problem
    # certified by the deployment CA, but it says it is another party: kept out too
    bob.key_ca, bob.reported_index = None, 2
    wait_until(lambda: "reports index 2" in _status(short)["parties"][1]["identity_problem"],
               timeout=20)
    assert client.deployment().parties[1].box_public_key == first[1].box_public_key
    # right again: its new keys are served
    bob.reported_index = None
    wait_until(lambda: client.deployment().parties[1].box_public_key
               == bytes(bob.box.public_key), timeout=20)
    assert _status(short)["parties"][1]["identity_problem"] == ""


def _identity(ca: CertificateAuthority, index: int, name: str) -> Any:
    from nacl.signing import SigningKey

    from ppfs.keycert import certify_party_keys
    from ppfs.v1 import party_pb2 as pb

    box, signing = bytes(PrivateKey.generate().public_key), bytes(SigningKey.generate().verify_key)
    statement, signature = certify_party_keys(ca.key, ca.cert, index, name, box, signing)
    return pb.PartyIdentity(index=index, name=name, box_public_key=box,
                            signing_public_key=signing, key_statement=statement,
                            key_statement_signature=signature)


def test_a_party_first_seen_under_another_name_is_served_once_it_states_its_own() -> None:
    # party 1 is Bob, whatever it once said: an identity first fetched under another
    # name (a misconfigured party, since set right) must not keep its good one out
    from types import SimpleNamespace

    from ppfs_gateway.parties import Parties

    ca = CertificateAuthority.create("deployment CA")
    clients = [SimpleNamespace(index=i, name=n) for i, n in enumerate(("Alice", "Bob", "Carol"))]
    parties = Parties(clients, ca.cert_pem())  # type: ignore[arg-type]
    assert parties.observe(1, _identity(ca, 1, "Bobby")) == ""  # first sight, as a first fetch
    good = _identity(ca, 1, "Bob")
    assert parties.observe(1, good) == ""
    known = parties.known(1)
    assert known is not None and known.identity == good and known.problem == ""
    # and once Bob is served, an identity under another name never replaces it
    assert "Bobby" in parties.observe(1, _identity(ca, 1, "Bobby"))
    assert parties.known(1).identity == good  # type: ignore[union-attr]


def test_without_a_deployment_ca_to_check_with_no_refresh_is_taken() -> None:
    # a CA file the gateway cannot read certificates from checks nothing: a refresh is
    # then refused, never taken unchecked
    from types import SimpleNamespace

    from ppfs_gateway.parties import Parties

    ca, other = CertificateAuthority.create("deployment CA"), CertificateAuthority.create("x")
    clients = [SimpleNamespace(index=i, name=n) for i, n in enumerate(("Alice", "Bob", "Carol"))]
    for pem in (b"", b"not a certificate"):
        parties = Parties(clients, pem)  # type: ignore[arg-type]
        first = _identity(ca, 1, "Bob")
        assert parties.observe(1, first) == ""
        assert "deployment CA" in parties.observe(1, _identity(other, 1, "Bob"))
        assert parties.known(1).identity == first  # type: ignore[union-attr]
