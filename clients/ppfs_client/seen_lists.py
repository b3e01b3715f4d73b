"""The newest revocation list a key file's client accepted, per deployment CA.

A party key statement signed ``--revocable`` is trusted only with a fresh revocation
list of the deployment CA that does not name it (ppfs.keycert); the gateway relays the
list. A gateway could relay the list from before a revocation for as long as that list
is still fresh, so this client remembers the newest list it accepted of each CA, next
to the key file in ``<key file>.revocation-lists/<CA certificate SHA-256>.json`` (mode
0600: its issue time and the SHA-256 of the list), and refuses a list issued before it,
or another list issued at the same time (the CA never issues two: ppfs.revocation), as
a replay, before anything is sealed to a party or any result opened. A newer list
replaces the memory.

What is remembered is public (the CA signed it for every client); it is kept private
like everything else next to the key file. A client that has seen no list yet (a new
key file) takes any fresh one: the replay window is closed only for clients that saw
the newer list. A record that does not read is refused, naming the file, never taken
for no record: that would open the window again without a word.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ppfs.durable import fsync_dir
from ppfs.errors import ParameterError
from ppfs.keycert import RevocationList, UntrustedPartyKey
from ppfs.pki import read_regular_file
from ppfs_client.keys import ClientKeys, write_private

FOLDER_SUFFIX = ".revocation-lists"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TIME = "%Y-%m-%dT%H:%M:%SZ"


class ReplayedRevocationList(UntrustedPartyKey):
    """The gateway relayed a revocation list older than one this client accepted (or
    another one of the same issue time): an old list replayed."""


@dataclass(frozen=True)
class Remembered:
    """The newest revocation list of a deployment CA that this key file's client
    accepted."""

    ca_sha256: str
    issued_at: str  # UTC, as the list says
    list_sha256: str  # SHA-256 of the list (its canonical bytes, as the CA signed them)
    next_update: str
    revoked: int  # how many key statements it names

    @property
    def issued(self) -> dt.datetime:
        return dt.datetime.strptime(self.issued_at, _TIME).replace(tzinfo=dt.UTC)


def list_sha256(rl: RevocationList) -> str:
    """What a list is remembered by: SHA-256 of its canonical bytes (those the CA signs)."""
    return hashlib.sha256(rl.to_bytes()).hexdigest()


def record_path(key_path: Path, ca_sha256: str) -> Path:
    if not _HEX64.match(ca_sha256):
        raise ParameterError("not a deployment CA fingerprint")
    return key_path.with_name(key_path.name + FOLDER_SUFFIX) / f"{ca_sha256}.json"


def _damaged(path: Path, why: str) -> ParameterError:
    return ParameterError(
        f"{path}: the record of the newest revocation list this key file accepted is "
        f"damaged ({why}); it keeps the gateway from replaying an older list, so nothing "
        f"is sealed or opened without it. Restore it from a backup; or, once the "
        f"deployment's operator confirms that the list the gateway relays now is the "
        f"CA's newest (`ppfs pki revocations` prints its issue time), delete it: the next "
        f"list this client accepts is remembered anew")


def remembered(keys: ClientKeys, ca_sha256: str) -> Remembered | None:
    """The newest list of the CA ``ca_sha256`` this key file accepted; None if none yet
    (or no key file on disk). ParameterError naming the record if it does not read."""
    if keys.path is None:
        return None
    path = record_path(keys.path, ca_sha256)
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _damaged(path, f"not a regular file that reads: {exc.strerror}") from None
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _damaged(path, "not JSON") from None
    if not isinstance(d, dict):
        raise _damaged(path, "not a JSON object")
    try:
        got = Remembered(**{k: d[k] for k in Remembered.__dataclass_fields__})
        ok = (got.ca_sha256 == ca_sha256 and bool(_HEX64.match(got.list_sha256))
              and isinstance(got.next_update, str) and isinstance(got.revoked, int)
              and got.issued.tzinfo is not None)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise _damaged(path, "its CA, issue time or list hash is not what a record holds")
    return got


def _refusal(rl: RevocationList, seen: Remembered, path: Path) -> ReplayedRevocationList:
    if rl.issued < seen.issued:
        return ReplayedRevocationList(
            f"the gateway relayed a revocation list issued at {rl.issued_at}, older than "
            f"one this client already accepted (issued at {seen.issued_at}, naming "
            f"{seen.revoked} key statement{'s' * (seen.revoked != 1)}): an old list "
            f"replayed, which could hide a revocation made since; refusing the deployment "
            f"(nothing is sealed or opened). Tell the deployment's operator: the gateway "
            f"serves an outdated list, or is not to be trusted (remembered in {path})")
    return ReplayedRevocationList(
        f"the gateway relayed a revocation list issued at {rl.issued_at} that differs "
        f"from the one of that same issue time this client already accepted (the "
        f"deployment CA issues one list per issue time): one of them replayed or "
        f"altered; refusing the deployment (nothing is sealed or opened). Tell the "
        f"deployment's operator, who re-issues the list (`ppfs pki revocations`) "
        f"(remembered in {path})")


def check_and_remember(keys: ClientKeys, ca_sha256: str, rl: RevocationList,
                        now: dt.datetime | None = None) -> None:
    """Refuse ``rl`` (ReplayedRevocationList) if it was issued before the newest list
    of this CA the key file accepted, or at the same time with other contents;
    remember it if it is newer. Nothing is kept without a key file on disk.

    ``rl`` is a list the CA signed (checked against the trust anchor by the caller).
    One issued after this machine's clock (RevocationList.future_problem: the CA's
    clock ran ahead) is never remembered: no list the CA issues once its clock is right
    would be taken after it. Where a statement asks for the list, it is refused
    (ppfs.keycert.verify_party_keys)."""
    if keys.path is None:
        return
    if rl.future_problem(now or dt.datetime.now(dt.UTC)) is not None:
        return
    seen = remembered(keys, ca_sha256)
    path = record_path(keys.path, ca_sha256)
    sha = list_sha256(rl)
    if seen is not None:
        if rl.issued < seen.issued or (rl.issued == seen.issued
                                       and sha != seen.list_sha256):
            raise _refusal(rl, seen, path)
        if rl.issued == seen.issued:
            return  # the list remembered
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fsync_dir(path.parent.parent)  # the new folder's name outlives a crash
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # two clients of the same key file at once: the newer list stays
        fcntl.flock(fd, fcntl.LOCK_EX)
        seen = remembered(keys, ca_sha256)
        if seen is not None and rl.issued <= seen.issued:
            if rl.issued < seen.issued or sha != seen.list_sha256:
                raise _refusal(rl, seen, path)
            return
        write_private(path, json.dumps({
            "ca_sha256": ca_sha256, "issued_at": rl.issued_at, "list_sha256": sha,
            "next_update": rl.next_update, "revoked": len(rl.revoked)}).encode())
    finally:
        os.close(fd)
