"""The deployment CA's records of the key statements it signs, and its revocation list.

``ppfs pki sign`` records every key statement it signs in ``CA_DIR/statements``
(``<SHA-256>.json``, the statement's bytes: public material). ``ppfs pki revoke``
names statements from there (all of a party's, or one by its SHA-256), adds them to
the CA's revocation list and signs it anew; ``ppfs pki revocations`` signs the same
list again with a fresh issue time (run from cron well within its freshness). The list
is ``CA_DIR/revocations.json`` (:func:`ppfs.keycert.revocations_file_bytes`): the
operator copies it to the gateway, which serves it to clients
(``revocation_list`` in its config). Clients check it for every statement that asks
for it (:func:`ppfs.keycert.verify_party_keys`).

A revoked party's keys are never certified again (:func:`refuse_revoked_keys`): the
party makes new keys and the operator signs those.

Every list is issued strictly after the one before it (:func:`issue`, a second later
if the clock says otherwise, within the clocks' tolerance): a client remembers the
newest list it accepted and refuses one issued before it, or another issued at the same
time, as a replay (``ppfs_client.seen_lists``); it takes no list issued after its own
clock, so a CA whose clock ran ahead leaves no client refusing its lists once the clock
is right.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ppfs.keycert import (
    CLOCK_SKEW,
    REVOCATION_FRESHNESS,
    KeyStatement,
    RevocationList,
    UntrustedPartyKey,
    issue_revocations,
    open_revocations,
    parse_revocations_file,
    revocations_file_bytes,
    statement_sha256,
)
from ppfs.pki import (
    CertificateAuthority,
    PartyRequestRefused,
    read_regular_file,
    replace_public_file,
)

STATEMENTS = "statements"
REVOCATIONS_FILE = "revocations.json"
# in the CA's directory, locked (flock) while the list in force is read and the next one
# written: `ppfs up` issuing it again and `ppfs pki revoke` at once must not drop the
# revocation (each would write a list signed from what it read)
LIST_LOCK = ".revocations.lock"


@contextlib.contextmanager
def list_lock(ca_dir: Path) -> Iterator[None]:
    """Hold the CA directory's list lock: one reading and writing of its revocation list
    (and recording of statements) at a time, across processes."""
    fd = os.open(ca_dir / LIST_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Recorded:
    """A key statement the CA signed, as recorded in its directory."""

    sha256: str
    statement: KeyStatement

    def __str__(self) -> str:
        st = self.statement
        flag = "" if st.revocation_list else " (does not ask for the revocation list)"
        return (f"{self.sha256} {st.name} (index {st.index}) valid {st.not_before} .. "
                f"{st.not_after}{flag}")


def record_statement(ca_dir: Path, statement: bytes) -> str:
    """Keep a statement the CA signs (before it is handed out); its SHA-256."""
    sha = statement_sha256(statement)
    folder = ca_dir / STATEMENTS
    folder.mkdir(parents=True, exist_ok=True)
    replace_public_file(folder / f"{sha}.json", statement)
    return sha


def recorded(ca_dir: Path) -> list[Recorded]:
    """Every key statement on record, oldest end first."""
    out = []
    for path in sorted((ca_dir / STATEMENTS).glob("*.json")):
        data = read_regular_file(path)
        sha = statement_sha256(data)
        if path.stem != sha:
            raise ValueError(f"{path}: its name is not the SHA-256 of what it holds")
        try:
            out.append(Recorded(sha, KeyStatement.from_bytes(data)))
        except UntrustedPartyKey:
            raise ValueError(f"{path}: not a key statement") from None
    return sorted(out, key=lambda r: (r.statement.not_after, r.sha256))


def current_list(ca_dir: Path, ca: CertificateAuthority) -> RevocationList | None:
    """The revocation list in ``ca_dir`` as the CA signed it (None before the first)."""
    path = ca_dir / REVOCATIONS_FILE
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return None
    from ppfs.keycert import ca_fingerprint

    try:
        return open_revocations(ca.cert, ca_fingerprint(ca.cert), *parse_revocations_file(data))
    except (ValueError, UntrustedPartyKey) as exc:
        raise ValueError(f"{path}: not this CA's revocation list ({exc})") from None


def issue(ca_dir: Path, ca: CertificateAuthority, revoked: set[str], *,
          freshness: dt.timedelta = REVOCATION_FRESHNESS,
          now: dt.datetime | None = None,
          previous: RevocationList | None = None) -> RevocationList:
    """Sign the list naming ``revoked`` and put it in ``ca_dir``: issued at ``now``, or
    a second after ``previous`` (the list in force) if that is not before ``now`` (two
    lists in one second, a clock set back). Clients refuse a list issued at or before
    one they accepted as a replay, so no two lists share an issue time. A ``previous``
    issued more than CLOCK_SKEW after ``now`` is not followed: no client took it (issued
    in the future, RevocationList.future_problem; the CA's clock ran ahead then), and
    every list dated after it would be refused as well until then."""
    start = now or dt.datetime.now(dt.UTC)
    if previous is not None and start.replace(microsecond=0) <= previous.issued \
            <= start + CLOCK_SKEW:
        start = previous.issued + dt.timedelta(seconds=1)
    signed = issue_revocations(ca.key, ca.cert, revoked, freshness=freshness, now=start)
    replace_public_file(ca_dir / REVOCATIONS_FILE, revocations_file_bytes(signed))
    return RevocationList.from_bytes(signed[0])


def reissue(ca_dir: Path, ca: CertificateAuthority, *,
            freshness: dt.timedelta = REVOCATION_FRESHNESS,
            now: dt.datetime | None = None) -> RevocationList:
    """The same revocations signed again, fresh from ``now`` (the first list: empty)."""
    with list_lock(ca_dir):
        rl = current_list(ca_dir, ca)
        return issue(ca_dir, ca, set(rl.revoked) if rl else set(), freshness=freshness,
                     now=now, previous=rl)


def revoke(ca_dir: Path, ca: CertificateAuthority, *, party: int | None = None,
           sha256: str | None = None, freshness: dt.timedelta = REVOCATION_FRESHNESS,
           now: dt.datetime | None = None) -> tuple[list[Recorded], RevocationList]:
    """Revoke every recorded statement of party ``party`` (its keys, and any earlier
    statement of the same or older keys that a gateway could still present), or the
    one whose SHA-256 is ``sha256``; sign the list anew. (what was newly revoked, the
    list). ValueError when nothing on record matches."""
    with list_lock(ca_dir):  # what it reads is what the list it writes follows
        records = recorded(ca_dir)
        if sha256 is not None:
            want = sha256.strip().lower().removeprefix("sha256:")
            chosen = [r for r in records if r.sha256 == want]
            if not chosen:
                raise ValueError(f"no key statement with SHA-256 {want[:64]} on record in "
                                 f"{ca_dir / STATEMENTS}; nothing revoked")
        elif party is not None:
            chosen = [r for r in records if r.statement.index == party]
            if not chosen:
                raise ValueError(f"no key statement of party index {party} on record in "
                                 f"{ca_dir / STATEMENTS} (`ppfs pki sign` records them); "
                                 "nothing revoked")
        else:
            raise ValueError("name a party or a statement's SHA-256 to revoke")
        rl = current_list(ca_dir, ca)
        before = set(rl.revoked) if rl else set()
        new = [r for r in chosen if r.sha256 not in before]
        return new, issue(ca_dir, ca, before | {r.sha256 for r in chosen},
                          freshness=freshness, now=now, previous=rl)


def refuse_revoked_keys(ca_dir: Path, ca: CertificateAuthority, statement: bytes) -> None:
    """PartyRequestRefused when ``statement`` certifies a box or signing key that a
    revoked statement certified (a stolen key stays revoked whatever is signed later),
    or does not ask for the revocation list while an earlier statement of the same
    party did (a renewal without ``--revocable`` would be a statement of its keys that
    no revocation reaches)."""
    st = KeyStatement.from_bytes(statement)
    records = recorded(ca_dir)
    if not st.revocation_list and any(
            r.statement.revocation_list and r.statement.index == st.index for r in records):
        raise PartyRequestRefused(
            f"{st.name} (index {st.index}) was certified with --revocable before: sign "
            "with --revocable again (a statement without it could not be revoked before "
            "it ends); nothing signed")
    rl = current_list(ca_dir, ca)
    if rl is None or not rl.revoked:
        return
    for r in records:
        if r.sha256 in rl.revoked and (
                r.statement.box_public_key == st.box_public_key
                or r.statement.signing_public_key == st.signing_public_key):
            raise PartyRequestRefused(
                f"{st.name} (index {st.index}) asks to certify keys the deployment CA "
                f"revoked (statement {r.sha256}): give the party new keys in a fresh "
                "state directory (`ppfs party init`) and sign that one; nothing signed")
