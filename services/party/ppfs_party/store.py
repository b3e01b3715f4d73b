"""Durable share store: verified uploads of this party's share components.

An upload becomes visible only complete and verified. The sealed part is received
in memory (at most ``max_upload_bytes``, of the size its signed manifest implies, within
``upload_timeout`` plus a second per ``MIN_UPLOAD_RATE`` bytes; the header's word for
its size decides nothing), checked, and its manifest, signature and
share bundles are written to a temporary directory ``uploads/.tmp-*`` with every
file fsynced, renamed to ``uploads/<upload_id>`` and the parent fsynced. A crash at
any point leaves either nothing or the whole upload (temporary directories are
removed on start); a restart keeps every committed upload.

Checks on every part (:meth:`ShareStore.put`): the manifest is signed by a data
owner registered in ``owners.json``; the header agrees with the manifest; the
upload id was never seen before; the SHA-256 of the received sealed bytes equals
the manifest's entry for this party (so a part re-sealed by someone else, or
swapped in from another upload, is refused); the part opens with this party's box
key; every bundle's dataset, party, scheme and shape match the manifest.

All-or-nothing uploads: a part received *staged* is stored the same way under
``staged/<upload_id>`` and used by no job. :meth:`ShareStore.commit` moves it into
``uploads/`` once the gateway saw every party store its part; :meth:`ShareStore.abort`
deletes it and leaves a tombstone ``aborted/<upload_id>``, so the id (and a part that
arrives late) is refused from then on. Both are idempotent. Staged parts survive a
restart, waiting for the gateway's decision.

A staged part does not wait for ever: one older than ``staged_expiry`` (``ppfs party
serve --staged-expiry-hours``) is aborted by the party itself, as the gateway's abort
does (tombstone first, so a late commit or a late copy of the part is refused, the
commit's refusal saying that the part expired), logged and audited
(``upload.expired``), when the daemon starts and every few minutes while it runs
(:meth:`ShareStore.expire_staged`). Its age is counted from the party's own clock at
the time it stored the part, written with it (``received_at``, Unix seconds) and
renamed into ``staged/`` with the rest; nothing the gateway sends sets it. A directory's
modification time is not used: moving the temporary directory under ``staged/``
rewrites its parent entry, and a copy or a restore of the state resets it. A part
stored by a version that did not write ``received_at`` ages from its manifest file's
modification time (written once, when the part was stored).

An expired part was decided by no one: the gateway may have committed it at the other
parties while this one was cut off. So its id, unlike an aborted one, takes the same
part again with its owner's signed repair (ppfs.upload.Repair: this upload, manifest
and party, signed within the hour, or within the staged expiry where that is shorter;
``ppfs datasets repair`` signs it), staged anew and committed by the gateway; the
gateway alone cannot bring it back. The gateway's own
abort of it makes it an aborted id like any other, and an owner's withdrawal covers it
as before.

The tombstone decides, whatever the crash point: an abort writes it durably first, then
renames the staged directory to a dot-name (removed on start) and deletes it; a commit
refuses a tombstoned id; and on start a staged directory whose id is tombstoned is
deleted, a committed one is not used (it could only come from an older version that
lacked these checks). An abort whose tombstone write failed midway (the tombstone may
be on disk) refuses the id too, until a retried abort confirms the tombstone.

Damaged share files: when a job's inputs are read (before its engine starts; a job's
start does not read them, so that it is answered at once and no file is read twice), and
when asked to verify a data set (``ppfs datasets check``), every share file of the
uploads concerned is read and checked: present, of the length its header states, its
payload's SHA-256 the one its header states, and the header what the owner-signed
manifest says (data set, party, scheme, kind, shape, fractional bits). An upload with a
file that fails is set aside under ``damaged/`` (logged, audited), listed as damaged
and used by no job, and its id is free for the owner's repair (``ppfs datasets
repair``). A job is served a file from the bundle cache, unchanged since it was
loaded and checked, without reading it again; a verify reads every file from the disk
whatever the cache holds (bit rot leaves a file's size and times as they were), and an
upload it sets aside leaves the cache too.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nacl.public import PrivateKey

from ppfs.durable import fsync_dir, write_durable
from ppfs.engines.base import PARTY_NAMES
from ppfs.errors import ParameterError, ShareFormatError
from ppfs.sharing import Scheme, ShareBundle, check_bundle_file
from ppfs.upload import (
    REPAIR_FRESH,
    Manifest,
    UploadRejected,
    check_repair,
    open_sealed,
    sealed_size_range,
    unpack_bundles,
    verify_manifest,
)
from ppfs.withdrawal import SignedWithdrawal, Withdrawal
from ppfs_party.audit import AuditLog
from ppfs_party.config import DEFAULT_STAGED_EXPIRY, DEFAULT_UPLOAD_TIMEOUT, MIN_UPLOAD_RATE
from ppfs_party.errors import (
    CorruptStateError,
    DamagedUploadError,
    NotFoundError,
    StorageError,
    TombstonesFullError,
    UploadDecisionError,
    UploadReplayedError,
    UploadTimedOutError,
    UploadTooLargeError,
    UploadUnauthorizedError,
    storage_error,
)
from ppfs_party.kept import KeptStatements

log = logging.getLogger("ppfs.party")

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# ids remembered as aborted (uploads) or cancelled before they started (jobs) without
# this party having seen them: each a file read at every start, so a bound on the
# gateway's ability to fill the party's disk with them
MAX_TOMBSTONES = 10_000
KIND_SETS = ({"data"}, {"data", "labels"}, {"mask"})


def check_id(value: str, what: str) -> str:
    if not SAFE_ID.match(value):
        raise ParameterError(f"{what} must be 1-128 characters of letters, digits, '.', '_', '-'")
    return value


# a job's id names its record (``<id>.json``) and its directory (``<id>/``) side by side,
# so it holds no '.': job 'J.json' would work in job 'J''s record
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")


def check_job_id(value: str) -> str:
    if not JOB_ID.match(value):
        raise ParameterError("job id must be 1-128 characters of letters, digits, '_', '-'")
    return value


def load_owners(path: Path) -> dict[str, bytes]:
    """``owners.json``: {owner_id: Ed25519 public key, hex}. One that cannot be read
    raises :class:`CorruptStateError` naming it (never taken as "no owners", nor
    replaced by the next ``add-owner``)."""
    try:
        raw = json.loads(path.read_bytes())
        if not isinstance(raw, dict):
            raise ValueError("not an object")
        return {str(k): bytes.fromhex(str(v)) for k, v in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        reason = (os.strerror(exc.errno).lower() if isinstance(exc, OSError) and exc.errno
                  else "not a list of owners' keys: truncated or corrupted")
        raise CorruptStateError(
            f"{path} cannot be read ({reason}): restore it from a backup, or remove it and "
            "register every data owner again (ppfs party add-owner)") from None


def register_owner(state_dir: Path, owner_id: str, public_key: bytes) -> None:
    """Add (or replace) a registered data owner in ``owners.json``."""
    path = state_dir / "owners.json"
    owners = {k: v.hex() for k, v in load_owners(path).items()}
    owners[check_id(owner_id, "owner id")] = public_key.hex()
    write_durable(path, json.dumps(owners, indent=1, sort_keys=True).encode())


@dataclass(frozen=True)
class UploadHeader:
    dataset_id: str
    upload_id: str
    owner_id: str
    manifest: bytes
    manifest_signature: bytes
    sealed_size: int
    staged: bool = False
    # the owner's signed repair (ppfs.upload.Repair): needed only for a part this party
    # expired undecided
    repair: bytes = b""
    repair_signature: bytes = b""


# how a withdrawal's tombstone begins (an abort's holds only the data set id): on start, a
# directory of a withdrawn id left by a crash is deleted, not kept for the operator
WITHDRAWN = b"withdrawn "
# how the tombstone of a staged part the party aborted itself, undecided for too long,
# begins: a late commit is refused saying so
EXPIRED = b"expired "
# how the tombstone of an upload another one replaced (Manifest.supersedes) begins, with
# the id of the one that replaced it
SUPERSEDED = b"superseded by "


def expired_tombstone(m: Manifest) -> bytes:
    """The tombstone of a staged part this party expired: its data set and its owner,
    so that only that owner's upload into that data set can replace it for good."""
    return EXPIRED + m.dataset_id[:128].encode() + b"\n" + m.owner_id[:128].encode()


def expired_whose(tombstone: bytes) -> tuple[str, str | None]:
    """(data set, owner) of an expired part's tombstone; owner None in a tombstone
    written before it was recorded."""
    dataset, _, owner = tombstone.removeprefix(EXPIRED).decode("utf-8", "replace").partition(
        "\n")
    return dataset, owner or None


# the file in a staged part's directory that holds when this party stored it
RECEIVED_AT = "received_at"


class BundleCache:
    """Loaded upload bundles, kept for the next job on the same uploads.

    Every job reads each upload it pins in full, and reading and checksumming the same
    files again was most of a daemon's own work per job. Bounded by ``limit`` bytes,
    the least recently used out first; an entry serves only while its file is
    unchanged (inode, size, modification time). Its arrays are read-only, so that no
    job can alter what the next one gets."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[Path, tuple[tuple[int, int, int], ShareBundle, int]] = (
            OrderedDict())
        self._bytes = 0
        self._lock = threading.Lock()

    def holds(self, path: Path) -> bool:
        """Whether the file at ``path`` is cached as it is now (loaded and checked since
        it last changed): a job is served that checked copy."""
        try:
            st = os.stat(path)
        except OSError:
            return False
        with self._lock:
            hit = self._entries.get(path)
            return hit is not None and hit[0] == (st.st_ino, st.st_size, st.st_mtime_ns)

    def drop(self, path: Path) -> None:
        """Forget the copy of ``path``, if any (its upload was set aside)."""
        with self._lock:
            old = self._entries.pop(path, None)
            if old is not None:
                self._bytes -= old[2]

    def load(self, path: Path) -> ShareBundle:
        st = os.stat(path)
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._lock:
            hit = self._entries.get(path)
            if hit is not None and hit[0] == key:
                self._entries.move_to_end(path)
                return hit[1]
        bundle = ShareBundle.load(path)
        for component in bundle.components.values():
            component.flags.writeable = False
        size = sum(c.nbytes for c in bundle.components.values())
        with self._lock:
            old = self._entries.pop(path, None)
            if old is not None:
                self._bytes -= old[2]
            if size <= self.limit:
                self._entries[path] = (key, bundle, size)
                self._bytes += size
                while self._bytes > self.limit:
                    _, (_, _, freed) = self._entries.popitem(last=False)
                    self._bytes -= freed
        return bundle


@dataclass(frozen=True)
class StoredUpload:
    manifest: Manifest
    kinds: frozenset[str]
    directory: Path
    cache: BundleCache | None = field(default=None, compare=False, repr=False)
    party: int = field(default=0, compare=False)

    def bundle(self, kind: str) -> ShareBundle:
        """The upload's bundle of ``kind`` (through the store's cache, if any: then its
        arrays are read-only, shared with later jobs); DamagedUploadError, naming the
        upload, if its file is not whole (damaged since the job was accepted)."""
        path = self.directory / f"{kind}.shr"
        try:
            return ShareBundle.load(path) if self.cache is None else self.cache.load(path)
        except (ShareFormatError, OSError) as exc:
            raise damaged_error(self, kind, _reason(exc)) from None


def _reason(exc: Exception) -> str:
    """What is wrong with a share file, in a few words that hold nothing of its contents."""
    if isinstance(exc, FileNotFoundError):
        return "file gone"
    if isinstance(exc, OSError):
        return os.strerror(exc.errno).lower() if exc.errno else type(exc).__name__
    text = str(exc)
    return ("checksum mismatch" if "checksum" in text
            else "wrong length" if "length" in text else "unreadable header")


def damaged_error(stored: StoredUpload, kind: str, reason: str) -> DamagedUploadError:
    """Names the party, the file, the upload and its data set, and what to do, in the
    200 characters of a party's refusal the gateway passes on."""
    m = stored.manifest
    name = PARTY_NAMES[stored.party] if stored.party < len(PARTY_NAMES) else "this party"
    return DamagedUploadError(
        f"{name}'s {kind}.shr of upload {m.upload_id!r} (data set {m.dataset_id!r}) is "
        f"damaged ({reason}): set aside; its owner re-sends it (ppfs datasets repair)")


class ShareStore:
    def __init__(
        self, state_dir: Path, party: int, box_key: PrivateKey, audit: AuditLog,
        max_upload_bytes: int, bundle_cache_bytes: int = 0,
        upload_timeout: float = DEFAULT_UPLOAD_TIMEOUT,
        staged_expiry: float = DEFAULT_STAGED_EXPIRY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state_dir = state_dir
        self.party = party
        self._box_key = box_key
        self.audit = audit
        self.max_upload_bytes = max_upload_bytes
        self.upload_timeout = upload_timeout
        # seconds a staged part waits for the gateway's decision before it is aborted here
        self.staged_expiry = staged_expiry
        self._clock = clock  # wall time (a part's age outlives a restart); tests set it
        # loaded upload bundles kept for the next job (None: every job reads them)
        self._cache = BundleCache(bundle_cache_bytes) if bundle_cache_bytes > 0 else None
        self.uploads_dir = state_dir / "uploads"
        self.staged_dir = state_dir / "staged"
        self.aborted_dir = state_dir / "aborted"
        self._uploads: dict[str, StoredUpload] = {}
        self._staged: dict[str, StoredUpload] = {}
        # set aside because a share file of theirs is damaged, by upload id: listed as
        # damaged until the owner's repair commits the upload again
        self._damaged: dict[str, StoredUpload] = {}
        self._aborted: set[str] = set()  # durable tombstones
        # owners' withdrawals carried out here (ppfs.withdrawal), kept so that a part they
        # cover is refused also when it arrives later (kept back by a turned gateway)
        self._withdrawals = KeptStatements(
            state_dir / "withdrawn", Withdrawal.from_bytes, "owner's withdrawal",
            "a part it covers could be stored again")
        self._expired: set[str] = set()  # of those, the parts this party expired itself
        # aborts whose tombstone write failed midway: refused, as the tombstone may be on disk
        self._abort_unsure: set[str] = set()
        self._inflight: set[str] = set()
        self._lock = asyncio.Lock()

    # -------------------------------------------------------------- start-up
    def open(self) -> None:
        """Clear half-received parts, uncommitted and aborted directories; index the rest.

        Tombstones are read first: an upload whose id is tombstoned is never indexed
        (a staged one is deleted: an abort was cut short between its tombstone and the
        deletion; a committed one is left on disk for the operator but not used)."""
        self._withdrawals.open()
        self.aborted_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._aborted = set()
        self._expired = set()
        withdrawn: set[str] = set()
        for p in self.aborted_dir.iterdir():
            if p.name.startswith("."):  # a tombstone write cut short
                p.unlink(missing_ok=True)
            else:
                self._aborted.add(p.name)
                with contextlib.suppress(OSError):
                    head = p.read_bytes()[:len(WITHDRAWN)]
                    if head.startswith(WITHDRAWN):
                        withdrawn.add(p.name)
                    elif head.startswith(EXPIRED):
                        self._expired.add(p.name)
        self._abort_unsure = set()
        self.owners()  # a registry of owners that cannot be read stops the start here
        for where, index in ((self.uploads_dir, self._uploads), (self.staged_dir, self._staged)):
            where.mkdir(parents=True, exist_ok=True, mode=0o700)
            for d in where.iterdir():
                if d.name.startswith("."):
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                if where == self.staged_dir and d.name in self._aborted:
                    log.warning("[Party.store] upload=%s aborted: staged part deleted", d.name)
                    shutil.rmtree(d, ignore_errors=True)
                    continue
                try:
                    manifest = Manifest.from_bytes((d / "manifest.json").read_bytes())
                    kinds = frozenset(p.stem for p in d.glob("*.shr"))
                except (OSError, UploadRejected):
                    self._set_aside(d)
                    continue
                if {d.name, manifest.upload_id} & withdrawn:
                    # a withdrawal cut short between its tombstone and the deletion
                    log.warning("[Party.store] upload=%s withdrawn by its owner: deleted",
                                manifest.upload_id)
                    self._discard(d)
                    continue
                if {d.name, manifest.upload_id} & self._aborted:
                    log.error("[Party.store] upload=%s is aborted: directory %s/%s not used",
                              manifest.upload_id, where.name, d.name)
                    continue
                index[manifest.upload_id] = StoredUpload(manifest, kinds, d, self._cache,
                                                         self.party)
        for uid in set(self._staged) & set(self._uploads):  # a crash between the two renames
            shutil.rmtree(self._staged.pop(uid).directory, ignore_errors=True)
        self._damaged = {}
        damaged = self.state_dir / "damaged"
        for d in sorted(damaged.iterdir()) if damaged.is_dir() else ():
            if d.name.startswith(".aborted-"):  # a withdrawal's deletion cut short
                shutil.rmtree(d, ignore_errors=True)
                continue
            try:  # an upload set aside for a damaged share file: its manifest is whole
                manifest = Manifest.from_bytes((d / "manifest.json").read_bytes())
            except (OSError, UploadRejected):
                continue
            if manifest.upload_id in withdrawn:
                self._discard(d)
                continue
            if manifest.upload_id not in self._uploads | self._staged:
                self._damaged[manifest.upload_id] = StoredUpload(
                    manifest, frozenset(), d, None, self.party)

    def _move_aside(self, d: Path) -> Path | None:
        """Move an upload directory to ``damaged/`` (kept for the operator, its id free
        for the owner's repair); None if it could not be moved."""
        damaged = self.state_dir / "damaged"
        kept = damaged / f"{d.parent.name}-{d.name}-{uuid.uuid4().hex[:8]}"
        try:
            damaged.mkdir(exist_ok=True, mode=0o700)
            d.rename(kept)
            fsync_dir(damaged)
            fsync_dir(d.parent)
        except OSError:
            return None
        return kept

    def _set_aside(self, d: Path) -> None:
        """An upload directory whose manifest cannot be read (a disk fault): moved to
        ``damaged/`` for the operator, so that its id is free for the owner's repair
        (``ppfs datasets repair``; ``ppfs datasets check`` names it missing here)."""
        kept = self._move_aside(d)
        if kept is None:
            log.error("[Party.store] unreadable upload directory %s/%s not used",
                      d.parent.name, d.name)
            return
        log.error("[Party.store] unreadable upload directory %s/%s moved to %s: not used; "
                  "its owner restores it with `ppfs datasets repair`", d.parent.name, d.name,
                  kept)
        self.audit.record("upload.damaged", directory=f"{d.parent.name}/{d.name}"[:200],
                          kept=kept.name)

    def owners(self) -> dict[str, bytes]:
        return load_owners(self.state_dir / "owners.json")

    # -------------------------------------------------------------- damaged files
    async def set_aside_damaged(self, uploads: Iterable[StoredUpload], *,
                                from_disk: bool = False
                                ) -> list[tuple[StoredUpload, str, str]]:
        """The committed ``uploads`` with a damaged share file, each with the file's
        kind and what is wrong; each is set aside (no job uses it, listed damaged).
        ``from_disk``: read every file, also those the bundle cache holds unchanged (an
        operator's check of the disk); otherwise a cached file counts as checked."""
        found = []
        for u in {u.manifest.upload_id: u for u in uploads}.values():
            problem = await asyncio.to_thread(self._file_problem, u, from_disk)
            if problem is not None:
                found.append((u, *problem))
        for u, kind, reason in found:
            uid = u.manifest.upload_id
            async with self._lock:
                if self._uploads.get(uid) is not u:
                    continue  # set aside (or replaced) meanwhile
                del self._uploads[uid]
                if self._cache is not None:
                    for kind in u.kinds:
                        self._cache.drop(u.directory / f"{kind}.shr")
                kept = await asyncio.to_thread(self._move_aside, u.directory)
                self._damaged[uid] = StoredUpload(u.manifest, frozenset(),
                                                  kept or u.directory, None, self.party)
            log.error("[Party.store] upload=%s dataset=%s share file %s damaged (%s): %s; "
                      "its owner re-sends it with `ppfs datasets repair`", uid,
                      u.manifest.dataset_id, kind, reason,
                      f"moved to {kept}" if kept else "not used (it could not be moved)")
            self.audit.record("upload.damaged", dataset_id=u.manifest.dataset_id,
                              upload_id=uid, file=f"{kind}.shr", reason=reason,
                              kept=kept.name if kept else "")
        return found

    def _file_problem(self, u: StoredUpload, from_disk: bool = False
                      ) -> tuple[str, str] | None:
        """(kind, what is wrong) of the first share file of ``u`` that is not whole or
        not what the owner-signed manifest describes; None if all are. Unless
        ``from_disk``, a file the bundle cache holds unchanged is not read again: a job
        is served that checked copy."""
        m = u.manifest
        if "mask" in u.kinds or (not u.kinds & {"data", "labels"} and m.recipient_public_key):
            shapes = {"mask": (m.rows, 2)}
        else:
            shapes = {"data": (m.rows, len(m.columns))}
            if m.label_column:
                shapes["labels"] = (m.rows, len(m.classes) - 1)
        for kind, shape in shapes.items():
            path = u.directory / f"{kind}.shr"
            if not from_disk and self._cache is not None and self._cache.holds(path):
                continue
            try:
                head = check_bundle_file(path)
            except (ShareFormatError, OSError) as exc:
                return kind, _reason(exc)
            if ((head.dataset_id, head.party, head.scheme.value, head.kind, head.shape)
                    != (m.dataset_id, self.party, m.scheme, kind, shape)
                    or (kind == "data" and head.frac_bits != m.frac_bits)):
                return kind, "header differs from the manifest"
        return None

    # -------------------------------------------------------------- queries
    def upload(self, upload_id: str) -> StoredUpload:
        found = self._uploads.get(upload_id)
        if found is None:
            raise NotFoundError(f"upload {upload_id!r} is not stored on this party")
        return found

    def held_uploads(self, dataset_id: str) -> list[StoredUpload]:
        """Committed uploads of a dataset (possibly none), in upload-id order."""
        return sorted(
            (u for u in self._uploads.values() if u.manifest.dataset_id == dataset_id),
            key=lambda u: u.manifest.upload_id,
        )

    def counts(self) -> tuple[int, int]:
        """(data sets, uploads) committed here."""
        return len({u.manifest.dataset_id for u in self._uploads.values()}), len(self._uploads)

    def held_by_dataset(self, dataset_ids: Iterable[str]) -> dict[str, dict[str, StoredUpload]]:
        """The committed uploads, by upload id, of each of ``dataset_ids`` this party holds
        any of (a data set it holds none of is left out), in one pass over the store."""
        wanted = set(dataset_ids)
        found: dict[str, dict[str, StoredUpload]] = {}
        for u in self._uploads.values():
            if u.manifest.dataset_id in wanted:
                found.setdefault(u.manifest.dataset_id, {})[u.manifest.upload_id] = u
        return found

    def dataset_uploads(self, dataset_id: str) -> list[StoredUpload]:
        """Committed uploads of a dataset, in upload-id order (the same on every party)."""
        found = sorted(
            (u for u in self._uploads.values() if u.manifest.dataset_id == dataset_id),
            key=lambda u: u.manifest.upload_id,
        )
        if not found:
            raise NotFoundError(f"dataset {dataset_id!r} is not stored on this party")
        return found

    def status(self, upload_id: str) -> str:
        """committed, staged, aborted or absent."""
        if upload_id in self._uploads:
            return "committed"
        if upload_id in self._staged:
            return "staged"
        return "aborted" if self._refused(upload_id) else "absent"

    def listing(self, dataset_id: str) -> list[tuple[StoredUpload, str]]:
        """Every committed or staged upload of a dataset, in upload-id order."""
        found = [(u, "committed") for u in self._uploads.values()
                 if u.manifest.dataset_id == dataset_id]
        found += [(u, "staged") for u in self._staged.values()
                  if u.manifest.dataset_id == dataset_id]
        found += [(u, "damaged") for uid, u in self._damaged.items()
                  if u.manifest.dataset_id == dataset_id
                  and uid not in self._uploads and uid not in self._staged]
        return sorted(found, key=lambda t: t[0].manifest.upload_id)

    # -------------------------------------------------------------- decisions
    def _refused(self, upload_id: str) -> bool:
        """Aborted here (or an abort of it may have reached the disk)."""
        return upload_id in self._aborted or upload_id in self._abort_unsure

    async def commit(self, dataset_id: str, upload_id: str) -> str:
        """Make a staged upload part of its dataset (idempotent). An aborted id is
        refused, even if its staged part is still on disk."""
        async with self._lock:
            if upload_id in self._expired:
                raise UploadDecisionError(
                    f"upload {upload_id!r} was aborted on this party: its staged part "
                    f"expired (kept {self.staged_expiry / 3600:g} h without the gateway's "
                    "decision); it cannot be committed")
            if self._refused(upload_id):
                raise UploadDecisionError(
                    f"upload {upload_id!r} was aborted on this party; it cannot be committed")
            if upload_id in self._uploads:
                return "committed"
            stored = self._staged.get(upload_id)
            if stored is None or stored.manifest.dataset_id != dataset_id:
                raise NotFoundError(f"upload {upload_id!r} is not staged on this party")
            self._check_dataset(stored.manifest, stored.kinds)
            final = self.uploads_dir / upload_id
            await asyncio.to_thread(self._move, stored.directory, final)
            del self._staged[upload_id]
            self._uploads[upload_id] = StoredUpload(stored.manifest, stored.kinds, final,
                                                    self._cache, self.party)
            self._damaged.pop(upload_id, None)  # repaired
        self.audit.record("upload.committed", dataset_id=dataset_id, upload_id=upload_id)
        return "committed"

    async def abort(self, dataset_id: str, upload_id: str) -> str:
        """Delete a staged upload and refuse its id from now on (idempotent; an id not
        seen yet is remembered, so a part that arrives late is refused)."""
        check_id(upload_id, "upload id")
        async with self._lock:
            if upload_id in self._uploads:
                raise UploadDecisionError(
                    f"upload {upload_id!r} is committed on this party; it is not aborted")
            if (upload_id not in self._aborted and upload_id not in self._staged
                    and upload_id not in self._inflight
                    and len(self._aborted) >= MAX_TOMBSTONES):
                raise TombstonesFullError(
                    f"this party keeps at most {MAX_TOMBSTONES} aborted upload ids; an "
                    "abort of an upload it never received is refused")
            if upload_id in self._expired:
                # the gateway's decision now: aborted for good, as any abort (a repair
                # can no longer send it again)
                try:
                    await asyncio.to_thread(write_durable, self.aborted_dir / upload_id,
                                            dataset_id[:128].encode())
                except OSError as exc:
                    raise storage_error(exc, "recording the upload's abort") from None
                self._expired.discard(upload_id)
            stored = await self._abort_locked(upload_id, dataset_id[:128].encode())
        self.audit.record("upload.aborted", dataset_id=dataset_id[:128], upload_id=upload_id,
                          had_part=stored is not None)
        return "aborted"

    async def _abort_locked(self, upload_id: str, tombstone: bytes) -> StoredUpload | None:
        """Tombstone ``upload_id`` (unless it is already) with ``tombstone`` as its
        contents, then delete its staged part, if any; the part deleted. Holds
        ``self._lock``."""
        if upload_id not in self._aborted:
            # the tombstone first: from then on the id is refused, crash or not
            try:
                await asyncio.to_thread(write_durable, self.aborted_dir / upload_id, tombstone)
            except BaseException as exc:
                self._abort_unsure.add(upload_id)  # it may be on disk: refuse the id
                if isinstance(exc, OSError):
                    raise storage_error(exc, "recording the upload's abort") from None
                raise
            self._aborted.add(upload_id)
            if tombstone.startswith(EXPIRED):
                self._expired.add(upload_id)
            self._abort_unsure.discard(upload_id)
        stored = self._staged.pop(upload_id, None)
        if stored is not None:
            await asyncio.to_thread(self._discard, stored.directory)
        return stored

    # -------------------------------------------------------------- expiry
    def _expired_here(self, upload_id: str) -> bool:
        """Whether ``upload_id`` is refused only because this party expired its staged
        part itself, undecided: the gateway never aborted it, so it may have committed
        it at the other parties, and the owner's repair may send the part again."""
        return upload_id in self._expired and upload_id not in self._abort_unsure

    def _check_revival(self, header: UploadHeader, owner_key: bytes) -> None:
        """For a part whose id is refused here: pass only where this party expired it
        and its owner signed a fresh repair of it for this party; UploadReplayedError
        (an aborted id) or UploadRejected (the repair does not hold) otherwise."""
        if not self._expired_here(header.upload_id):
            raise UploadReplayedError("this upload was aborted (its id is refused)")
        if not header.staged:
            # staged, like any part the gateway sends: a crash between storing it and
            # lifting its tombstone then leaves a staged part, which the next start deletes
            raise UploadRejected(f"upload {header.upload_id!r} expired here undecided: a "
                                 "repaired part is sent staged, then committed")
        try:
            # never fresh for longer than a staged part lives here: a part brought back
            # and left to expire again needs a new repair
            fresh = min(REPAIR_FRESH, dt.timedelta(seconds=self.staged_expiry))
            check_repair(header.repair, header.repair_signature, owner_key, header.manifest,
                         self.party, dt.datetime.fromtimestamp(self._clock(), dt.UTC), fresh)
        except UploadRejected as exc:
            raise UploadRejected(
                f"upload {header.upload_id!r} expired here undecided, and {exc}: only its "
                "owner's repair (`ppfs datasets repair`) sends it again") from None

    def _lift_tombstone(self, upload_id: str) -> None:
        """Delete the tombstone of a part this party expired, as its owner's repair sends
        it again (the part is stored first; a crash between the two leaves the id
        refused, its staged part deleted on start, which a fresh repair sends again)."""
        (self.aborted_dir / upload_id).unlink(missing_ok=True)
        fsync_dir(self.aborted_dir)

    def received_at(self, stored: StoredUpload) -> float | None:
        """When this party stored the part (its own clock, Unix seconds): the time it
        wrote with the part, else (a part stored before it wrote one) its manifest
        file's modification time; None if neither can be read."""
        try:
            text = (stored.directory / RECEIVED_AT).read_text(encoding="ascii")
            at = float(text.strip())
            if math.isfinite(at):
                return at
        except (OSError, ValueError):
            pass
        try:
            return (stored.directory / "manifest.json").stat().st_mtime
        except OSError:
            return None

    async def expire_staged(self, now: float | None = None) -> list[str]:
        """Abort every staged part older than ``staged_expiry`` at ``now`` (default:
        the store's clock), as :meth:`abort` does; the ids aborted now. A part whose
        abort cannot be recorded (a full disk) stays staged, logged, for the next round."""
        now = self._clock() if now is None else now
        aged = []
        for uid, stored in list(self._staged.items()):
            at = await asyncio.to_thread(self.received_at, stored)
            if at is not None and now - at >= self.staged_expiry:
                aged.append((uid, stored, now - at))
        expired = []
        for uid, stored, age in aged:
            dataset_id = stored.manifest.dataset_id
            try:
                async with self._lock:
                    if self._staged.get(uid) is not stored:
                        continue  # decided meanwhile
                    await self._abort_locked(uid, expired_tombstone(stored.manifest))
            except StorageError as exc:
                log.error("[Party.store] upload=%s dataset=%s staged part expired but its "
                          "abort could not be recorded: %s; tried again later", uid,
                          dataset_id, exc)
                continue
            expired.append(uid)
            log.warning("[Party.store] upload=%s dataset=%s staged part expired: no commit "
                        "or abort from the gateway in %.1f h (limit %g h); aborted, a later "
                        "commit is refused", uid, dataset_id, age / 3600,
                        self.staged_expiry / 3600)
            try:
                self.audit.record("upload.expired", dataset_id=dataset_id, upload_id=uid,
                                  age_seconds=int(age), expiry_seconds=int(self.staged_expiry))
            except OSError as exc:  # a full disk: the part is aborted all the same
                log.error("[Party.store] upload=%s expiry not audited: %s", uid,
                          exc.strerror or type(exc).__name__)
        return expired

    async def withdraw(self, signed: SignedWithdrawal, w: Withdrawal) -> list[StoredUpload]:
        """Carry out an owner's verified withdrawal: kept first (durably), so that a part
        it covers is refused from then on, also one that arrives later; then every upload
        it covers is deleted: committed, staged or set aside as damaged. Each id is
        tombstoned first, so that from then on it is refused (a repair, or a
        copy of the sealed part the gateway kept, cannot bring it back), whatever the
        crash point; then it leaves the index and the bundle cache, and its directory is
        deleted. Returns the uploads deleted now (none when asked again)."""
        covers = w.covers
        async with self._lock:
            try:
                await asyncio.to_thread(self._withdrawals.keep, signed.digest,
                                        signed.statement, signed.signature, w)
            except OSError as exc:
                raise storage_error(exc, "keeping the withdrawal") from None
            doomed = self.covered_uploads(covers)
            for u in doomed:
                uid = u.manifest.upload_id
                if uid not in self._aborted:
                    try:
                        await asyncio.to_thread(
                            write_durable, self.aborted_dir / uid,
                            WITHDRAWN + u.manifest.dataset_id[:128].encode())
                    except BaseException as exc:
                        self._abort_unsure.add(uid)
                        if isinstance(exc, OSError):
                            raise storage_error(exc, "recording the withdrawal") from None
                        raise
                    self._aborted.add(uid)
                    self._abort_unsure.discard(uid)
                for where in (self._uploads, self._staged, self._damaged):
                    where.pop(uid, None)
                if self._cache is not None:
                    for kind in u.kinds:
                        self._cache.drop(u.directory / f"{kind}.shr")
            for u in doomed:
                await asyncio.to_thread(self._discard, u.directory)
        for u in doomed:
            self.audit.record("upload.withdrawn", dataset_id=u.manifest.dataset_id,
                              upload_id=u.manifest.upload_id, owner_id=u.manifest.owner_id)
        return doomed

    def covered_uploads(self, covers: Callable[[Manifest], bool]) -> list[StoredUpload]:
        """The uploads held here (committed, staged or damaged) ``covers`` selects."""
        return [u for where in (self._uploads, self._staged, self._damaged)
                for u in where.values() if covers(u.manifest)]

    def _discard(self, directory: Path) -> None:
        """Delete an aborted part: renamed to a dot-name first (cleared on start), so a
        deletion cut short never leaves a partial directory under the upload's id."""
        doomed = directory.with_name(f".aborted-{uuid.uuid4().hex}")
        try:
            directory.rename(doomed)
        except OSError:
            doomed = directory  # the tombstone still keeps it out on the next start
        shutil.rmtree(doomed, ignore_errors=True)

    def _move(self, src: Path, dst: Path) -> None:
        src.rename(dst)  # fails if the id exists: never overwrite
        fsync_dir(self.uploads_dir)
        fsync_dir(src.parent)

    # -------------------------------------------------------------- receive
    async def put(self, header: UploadHeader, chunks: AsyncIterator[bytes]) -> StoredUpload:
        try:
            stored = await self._put(header, chunks)
        except UploadRejected as exc:
            self.audit.record(
                "upload.rejected", dataset_id=header.dataset_id[:128],
                upload_id=header.upload_id[:128], owner_id=header.owner_id[:128],
                reason=str(exc),
            )
            raise
        m = stored.manifest
        self.audit.record(
            "upload.accepted", dataset_id=m.dataset_id, upload_id=m.upload_id,
            owner_id=m.owner_id, kinds=sorted(stored.kinds), rows=m.rows,
            columns=len(m.columns), scheme=m.scheme, manifest_sha256=m.digest(),
            staged=header.staged, **({"supersedes": list(m.supersedes)} if m.supersedes else {}),
        )
        return stored

    async def _put(self, header: UploadHeader, chunks: AsyncIterator[bytes]) -> StoredUpload:
        owner_key = self.owners().get(header.owner_id)
        if owner_key is None:
            raise UploadUnauthorizedError("the data owner is not registered with this party")
        try:
            manifest = verify_manifest(header.manifest, header.manifest_signature, owner_key)
        except UploadRejected as exc:
            raise UploadUnauthorizedError(str(exc)) from None
        if (manifest.dataset_id, manifest.upload_id, manifest.owner_id) != (
            header.dataset_id, header.upload_id, header.owner_id
        ):
            raise UploadRejected("the upload header does not match the signed manifest")
        if any(w.covers(manifest) for w in self._withdrawals):
            raise UploadRejected(f"upload {manifest.upload_id!r} was withdrawn by its owner "
                                 "before it arrived here")
        check_id(manifest.upload_id, "upload id")
        check_id(manifest.dataset_id, "dataset id")
        manifest.signed_at()  # its place among the data set's uploads
        try:
            scheme = Scheme(manifest.scheme)
        except ValueError:
            raise UploadRejected("the manifest names an unknown sharing scheme") from None
        if len(manifest.part_sha256) != scheme.parties or self.party >= scheme.parties:
            raise UploadRejected("the manifest does not list one part per party")
        if header.sealed_size > self.max_upload_bytes:
            raise UploadTooLargeError(
                f"the sealed part exceeds this party's limit of {self.max_upload_bytes} bytes"
            )
        # the size is the gateway's word; the manifest's rows and columns are the owner's
        low, high = sealed_size_range(manifest, len(scheme.components_of(self.party)))
        if not low <= header.sealed_size <= high:
            raise UploadRejected(
                f"the header announces {header.sealed_size} sealed bytes; the owner's manifest "
                f"makes this party's part {low} to {high} bytes"
            )
        async with self._lock:
            if self._refused(manifest.upload_id):
                self._check_revival(header, owner_key)
            if (manifest.upload_id in self._uploads or manifest.upload_id in self._staged
                    or manifest.upload_id in self._inflight):
                raise UploadReplayedError("this upload was received before (replay refused)")
            self._inflight.add(manifest.upload_id)
        try:
            sealed = await self._receive(header.sealed_size, chunks)
            if hashlib.sha256(sealed).hexdigest() != manifest.part_sha256[self.party]:
                raise UploadRejected(
                    "the sealed part does not match the owner's manifest (hash mismatch)"
                )
            bundles = await asyncio.to_thread(self._open, sealed, manifest, scheme)
            self._check_dataset(manifest, frozenset(bundles))
            async with self._lock:  # an abort or a withdrawal that came first wins
                uid = manifest.upload_id
                if any(w.covers(manifest) for w in self._withdrawals):
                    raise UploadRejected(f"upload {uid!r} was withdrawn by its owner "
                                         "while it arrived here")
                if self._refused(uid):
                    self._check_revival(header, owner_key)
                await self._supersede_locked(manifest)
                try:
                    stored = await asyncio.to_thread(self._commit, header, manifest, bundles)
                except OSError as exc:  # nothing of it kept (_commit clears its files)
                    raise storage_error(exc, "storing the upload part") from None
                if uid in self._expired:
                    # the part is on disk first, the tombstone lifted after: a failure or
                    # a crash in between leaves the id refused (a staged part under a
                    # tombstone is deleted on start), never free without a repair
                    try:
                        await asyncio.to_thread(self._lift_tombstone, uid)
                    except OSError as exc:
                        await asyncio.to_thread(self._discard, stored.directory)
                        raise storage_error(exc, "storing the upload part") from None
                    self._aborted.discard(uid)
                    self._expired.discard(uid)
                    log.info("[Party.store] upload=%s: its part, expired here "
                             "undecided, is sent again (the owner's repair)", uid)
                (self._staged if header.staged else self._uploads)[manifest.upload_id] = stored
            return stored
        finally:
            self._inflight.discard(manifest.upload_id)

    async def _supersede_locked(self, manifest: Manifest) -> None:
        """Refuse, from now on, the earlier uploads ``manifest`` replaces (the owner sent
        the same rows again, never told they were added), so that at most one of them is
        ever used; UploadRejected, and nothing refused, if this party holds one of them
        (committed, staged, arriving, or set aside as damaged): both would count the same
        rows. Holds ``self._lock``."""
        for sid in manifest.supersedes:
            if (sid in self._uploads or sid in self._staged or sid in self._inflight
                    or sid in self._damaged):
                raise UploadRejected(
                    f"upload {manifest.upload_id!r} replaces upload {sid!r}, which this party "
                    "holds: the same rows would count twice")
            if sid in self._expired:
                # expired here undecided, and awaiting its owner's repair perhaps: only
                # its owner's upload into its data set replaces it for good
                try:
                    dataset, owner = expired_whose(await asyncio.to_thread(
                        (self.aborted_dir / sid).read_bytes))
                except OSError as exc:
                    raise storage_error(exc, "reading the uploads it replaces") from None
                if dataset != manifest.dataset_id[:128] or owner not in (
                        None, manifest.owner_id[:128]):
                    raise UploadRejected(
                        f"upload {manifest.upload_id!r} replaces upload {sid!r}, which is not "
                        f"{manifest.owner_id!r}'s upload into data set "
                        f"{manifest.dataset_id!r}: an owner replaces only its own uploads")
        fresh = [sid for sid in manifest.supersedes if sid not in self._aborted]
        if fresh and len(self._aborted) + len(fresh) > MAX_TOMBSTONES:
            # each becomes a tombstone kept for ever, as an abort of a part never received
            raise UploadRejected(
                f"this party keeps at most {MAX_TOMBSTONES} aborted upload ids; upload "
                f"{manifest.upload_id!r} replaces {len(fresh)} more it never received")
        for sid in manifest.supersedes:
            tombstone = SUPERSEDED + manifest.upload_id.encode()
            if sid in self._expired:
                # expired here undecided: refused for good now (no repair brings it back)
                try:
                    await asyncio.to_thread(write_durable, self.aborted_dir / sid, tombstone)
                except OSError as exc:
                    raise storage_error(exc, "recording the uploads it replaces") from None
                self._expired.discard(sid)
            await self._abort_locked(sid, tombstone)

    async def _receive(self, size: int, chunks: AsyncIterator[bytes]) -> bytes:
        """The sealed bytes, within this party's time for a part of ``size`` bytes: a
        stream that stalls, or sends empty chunks for ever, is refused at that time (and
        its upload id is free again)."""
        seconds = self.upload_timeout + size / MIN_UPLOAD_RATE
        buf = bytearray()
        try:
            async with asyncio.timeout(seconds):
                async for chunk in chunks:
                    buf += chunk
                    if len(buf) > size:
                        raise UploadRejected("more sealed bytes arrived than the header "
                                             "announced")
        except TimeoutError:
            raise UploadTimedOutError(
                f"the sealed part did not arrive within {seconds:.0f} s ({len(buf)} of "
                f"{size} bytes)") from None
        if len(buf) != size:
            raise UploadRejected("the sealed part is incomplete")
        return bytes(buf)

    def _open(self, sealed: bytes, manifest: Manifest, scheme: Scheme) -> dict[str, ShareBundle]:
        try:
            bundles = unpack_bundles(open_sealed(sealed, self._box_key))
        except UploadRejected:
            raise
        except ShareFormatError as exc:
            raise UploadRejected(f"the sealed part holds no valid share bundles ({exc})") from None
        by_kind: dict[str, ShareBundle] = {}
        for b in bundles:
            if b.kind in by_kind:
                raise UploadRejected(f"the part holds two {b.kind} bundles")
            by_kind[b.kind] = b
        if set(by_kind) not in KIND_SETS:
            raise UploadRejected("the part must hold data (with or without labels) or a mask")
        if bool(manifest.label_column) != ("labels" in by_kind) and "mask" not in by_kind:
            raise UploadRejected("the manifest's label column and the label shares disagree")
        expected = {
            "data": (manifest.rows, len(manifest.columns)),
            "labels": (manifest.rows, len(manifest.classes) - 1),
            "mask": (manifest.rows, 2),
        }
        for kind, b in by_kind.items():
            if b.dataset_id != manifest.dataset_id or b.party != self.party:
                raise UploadRejected(f"the {kind} bundle belongs to another dataset or party")
            if b.scheme is not scheme:
                raise UploadRejected(f"the {kind} bundle uses another sharing scheme")
            if b.shape != expected[kind]:
                raise UploadRejected(f"the {kind} bundle's shape differs from the manifest")
        if "data" in by_kind:
            if len(manifest.column_exponents) != len(manifest.columns):
                raise UploadRejected("the manifest needs one exponent per column")
            if by_kind["data"].frac_bits != manifest.frac_bits:
                raise UploadRejected("the data bundle's fractional bits differ from the manifest")
        if "labels" in by_kind and len(manifest.classes) < 2:
            raise UploadRejected("the label needs at least two classes")
        return by_kind

    def _check_dataset(self, manifest: Manifest, kinds: frozenset[str]) -> None:
        """Uploads of one dataset (several owners' rows) share one schema."""
        for other in self._uploads.values():
            o = other.manifest
            if o.dataset_id != manifest.dataset_id:
                continue
            if ("mask" in kinds) != ("mask" in other.kinds) or (
                o.columns, o.column_exponents, o.label_column, o.classes, o.scheme, o.frac_bits
            ) != (
                manifest.columns, manifest.column_exponents, manifest.label_column,
                manifest.classes, manifest.scheme, manifest.frac_bits,
            ):
                raise UploadRejected("the upload's schema differs from its dataset's schema")

    def _commit(
        self, header: UploadHeader, manifest: Manifest, bundles: dict[str, ShareBundle]
    ) -> StoredUpload:
        tmp = self.uploads_dir / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir(mode=0o700)
        try:
            for name, data in (
                ("manifest.json", header.manifest),
                ("manifest.sig", header.manifest_signature),
                *((f"{kind}.shr", b.to_bytes()) for kind, b in bundles.items()),
                # when this party stored it: a staged part's age counts from here
                *(((RECEIVED_AT, f"{self._clock():.3f}\n".encode()),) if header.staged
                  else ()),
            ):
                # 0600 from the start: the part's share components, kept opened
                fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600)
                with open(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
            fsync_dir(tmp)
            where = self.staged_dir if header.staged else self.uploads_dir
            final = where / manifest.upload_id
            tmp.rename(final)  # fails if the id exists: never overwrite
            fsync_dir(self.uploads_dir)
            fsync_dir(where)
        except BaseException:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
            raise
        return StoredUpload(manifest, frozenset(bundles), final, self._cache, self.party)
