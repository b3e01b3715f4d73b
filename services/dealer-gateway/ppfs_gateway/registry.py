"""The gateway's registry of data sets, uploads, grants and jobs, in SQLite.

It holds public metadata only: names, owners, public schemas (column names, the
per-column power-of-two exponents, the label column and its class names, row
counts), SHA-256 digests of sealed parts and job states. Sealed parts are
forwarded to the parties and never stored here.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ppfs_gateway.errors import RegistryUnreadable, is_storage_failure, storage_error

# SQLite's result codes for a file that is not (or no longer) a whole database
_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})

FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  owner_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  schema_json TEXT,
  rows INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS uploads (
  id TEXT PRIMARY KEY,
  dataset_id TEXT NOT NULL REFERENCES datasets(id),
  owner_id TEXT NOT NULL,
  rows INTEGER NOT NULL,
  manifest_sha256 TEXT NOT NULL,
  created_at TEXT NOT NULL,
  -- the owner-signed creation time (ppfs.upload.Manifest.signed_at): a data set's
  -- uploads are stacked by it, then by id, as every party requires
  signed_at TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS upload_decisions (
  upload_id TEXT NOT NULL,
  dataset_id TEXT NOT NULL,
  party INTEGER NOT NULL,
  decision TEXT NOT NULL,
  done INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  updated_at TEXT NOT NULL,
  PRIMARY KEY (upload_id, party)
);
CREATE TABLE IF NOT EXISTS grants (
  dataset_id TEXT NOT NULL REFERENCES datasets(id),
  subject TEXT NOT NULL,
  PRIMARY KEY (dataset_id, subject)
);
CREATE TABLE IF NOT EXISTS consents (
  dataset_id TEXT NOT NULL REFERENCES datasets(id),
  owner_id TEXT NOT NULL,
  recipient TEXT NOT NULL,
  recipient_key TEXT NOT NULL,
  reveal TEXT NOT NULL,
  statement BLOB NOT NULL,
  signature BLOB NOT NULL,
  created_at TEXT NOT NULL,
  PRIMARY KEY (dataset_id, owner_id, recipient, recipient_key, reveal)
);
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY,
  submitter TEXT NOT NULL,
  state TEXT NOT NULL,
  request_json TEXT NOT NULL,
  description BLOB NOT NULL,
  description_sha256 TEXT NOT NULL,
  error TEXT NOT NULL DEFAULT '',
  created_at TEXT NOT NULL,
  updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS job_parties (
  job_id TEXT NOT NULL REFERENCES jobs(id),
  party INTEGER NOT NULL,
  state TEXT NOT NULL,
  phase TEXT NOT NULL DEFAULT '',
  progress REAL NOT NULL DEFAULT 0,
  error TEXT NOT NULL DEFAULT '',
  program_sha256 TEXT NOT NULL DEFAULT '',
  seconds REAL NOT NULL DEFAULT 0,
  bytes_sent INTEGER NOT NULL DEFAULT 0,
  failure TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (job_id, party)
);
"""


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class DatasetSchema:
    columns: tuple[str, ...]
    column_exponents: tuple[int, ...]
    label_column: str
    classes: tuple[str, ...]
    frac_bits: int
    scheme: str

    def to_json(self) -> str:
        return json.dumps(
            {
                "columns": list(self.columns),
                "column_exponents": list(self.column_exponents),
                "label_column": self.label_column,
                "classes": list(self.classes),
                "frac_bits": self.frac_bits,
                "scheme": self.scheme,
            }
        )

    @classmethod
    def from_json(cls, s: str) -> DatasetSchema:
        d = json.loads(s)
        return cls(
            tuple(d["columns"]),
            tuple(int(e) for e in d["column_exponents"]),
            d["label_column"],
            tuple(d["classes"]),
            int(d["frac_bits"]),
            d["scheme"],
        )


@dataclass(frozen=True)
class UploadDecision:
    """The gateway's decision on one upload at one party: ``staging`` while the parts are
    being sent, then ``commit`` (every party stored its part) or ``abort``; ``done`` once
    the party acknowledged it."""

    upload_id: str
    dataset_id: str
    party: int
    decision: str
    done: bool
    attempts: int
    error: str


@dataclass(frozen=True)
class DatasetRecord:
    id: str
    name: str
    owner_id: str
    kind: str  # "data" or "mask"
    schema: DatasetSchema | None
    rows: int
    created_at: str
    upload_ids: tuple[str, ...] = ()
    grants: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConsentRecord:
    dataset_id: str
    owner_id: str
    recipient: str
    recipient_key: str  # base64 X25519
    reveal: str
    statement: bytes
    signature: bytes


@dataclass
class PartyJobState:
    party: int
    state: str
    phase: str = ""
    progress: float = 0.0
    error: str = ""
    program_sha256: str = ""
    seconds: float = 0.0
    bytes_sent: int = 0
    failure: str = ""  # ppfs.contract.FailureKind value the party reported, if any


@dataclass
class JobRecord:
    id: str
    submitter: str
    state: str
    request: dict[str, Any]
    description: bytes
    description_sha256: str
    error: str
    created_at: str
    updated_at: str
    parties: list[PartyJobState] = field(default_factory=list)


class Registry:
    """Thread-safe access to the SQLite registry (one connection, one lock)."""

    def __init__(self, path: Path) -> None:
        """Open (or create) the registry at ``path``. One that SQLite cannot read, or whose
        integrity check fails, raises :class:`RegistryUnreadable` naming it: never
        replaced, never used in part."""
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            self._open()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            if is_storage_failure(exc):
                raise storage_error(exc, "opening its registry") from None
            code = getattr(exc, "sqlite_errorcode", None)  # None: the integrity check's
            if code is not None and code & 0xFF not in _DAMAGED:
                raise
            raise RegistryUnreadable(
                f"the registry {path} cannot be read ({exc}): restore it from a backup; "
                "the gateway does not start without it") from None
        except BaseException:
            self._db.close()
            raise

    def _open(self) -> None:
        problems = [r[0] for r in self._db.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError(f"integrity check: {'; '.join(problems[:3])[:200]}")
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(_SCHEMA)
        # registries made before job_parties had its failure column
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(job_parties)")}
        if "failure" not in cols:
            self._db.execute(
                "ALTER TABLE job_parties ADD COLUMN failure TEXT NOT NULL DEFAULT ''"
            )
        # registries made before uploads recorded their signed time: left empty, learnt
        # from the parties before a job uses them (UploadKeeper.learn_signed_times)
        cols = {r[1] for r in self._db.execute("PRAGMA table_info(uploads)")}
        if "signed_at" not in cols:
            self._db.execute("ALTER TABLE uploads ADD COLUMN signed_at TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction: all of it or, on any error (the COMMIT's too), none of it.
        A full disk or a failed write raises :class:`GatewayStorageError` naming it."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                    self._db.execute("COMMIT")
                except BaseException:
                    # SQLite may have rolled back already (a full disk): then this fails
                    if self._db.in_transaction:
                        with suppress(sqlite3.Error):
                            self._db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                if is_storage_failure(exc):
                    raise storage_error(exc, "recording the change") from None
                raise

    # -- data sets ---------------------------------------------------------------

    def create_dataset(self, dataset_id: str, name: str, owner_id: str, kind: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO datasets (id, name, owner_id, kind, created_at) VALUES (?,?,?,?,?)",
                (dataset_id, name, owner_id, kind, now()),
            )

    def get_dataset(self, dataset_id: str) -> DatasetRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM datasets WHERE id = ?", (dataset_id,)).fetchone()
            if row is None:
                return None
            return self._dataset(row)

    def list_datasets(self, kind: str = "data") -> list[DatasetRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM datasets WHERE kind = ? ORDER BY created_at, id", (kind,)
            ).fetchall()
            return [self._dataset(r) for r in rows]

    def _dataset(self, row: sqlite3.Row) -> DatasetRecord:
        uploads = self._db.execute(
            "SELECT id FROM uploads WHERE dataset_id = ? ORDER BY signed_at, id", (row["id"],)
        ).fetchall()
        grants = self._db.execute(
            "SELECT subject FROM grants WHERE dataset_id = ? ORDER BY subject", (row["id"],)
        ).fetchall()
        return DatasetRecord(
            id=row["id"],
            name=row["name"],
            owner_id=row["owner_id"],
            kind=row["kind"],
            schema=DatasetSchema.from_json(row["schema_json"]) if row["schema_json"] else None,
            rows=int(row["rows"]),
            created_at=row["created_at"],
            upload_ids=tuple(u["id"] for u in uploads),
            grants=tuple(g["subject"] for g in grants),
        )

    def upload_exists(self, upload_id: str) -> bool:
        """Committed, being sent, or aborted: an upload id is used once."""
        with self._lock:
            row = self._db.execute("SELECT 1 FROM uploads WHERE id = ?", (upload_id,)).fetchone()
            if row is None:
                row = self._db.execute(
                    "SELECT 1 FROM upload_decisions WHERE upload_id = ?", (upload_id,)
                ).fetchone()
            return row is not None

    # -- all-or-nothing uploads --------------------------------------------------

    def stage_upload(self, dataset_id: str, upload_id: str, parties: int) -> None:
        """Record that an upload's parts are being sent (aborted if the gateway stops)."""
        t = now()
        with self._tx() as db:
            for i in range(parties):
                db.execute(
                    "INSERT INTO upload_decisions (upload_id, dataset_id, party, decision,"
                    " updated_at) VALUES (?,?,?,?,?)",
                    (upload_id, dataset_id, i, "staging", t),
                )

    def commit_upload(
        self,
        dataset_id: str,
        upload_id: str,
        owner_id: str,
        schema: DatasetSchema,
        rows: int,
        manifest_sha256: str,
        signed_at: str,
    ) -> None:
        """Every party stored its part: the upload joins its data set (at its owner-signed
        time ``signed_at``) and every party is to commit it, in one transaction."""
        with self._tx() as db:
            db.execute(
                "INSERT INTO uploads (id, dataset_id, owner_id, rows, manifest_sha256,"
                " created_at, signed_at) VALUES (?,?,?,?,?,?,?)",
                (upload_id, dataset_id, owner_id, rows, manifest_sha256, now(), signed_at),
            )
            db.execute(
                "UPDATE datasets SET schema_json = ?, rows = rows + ? WHERE id = ?",
                (schema.to_json(), rows, dataset_id),
            )
            db.execute(
                "UPDATE upload_decisions SET decision = 'commit', updated_at = ?"
                " WHERE upload_id = ?",
                (now(), upload_id),
            )

    def abort_upload(self, upload_id: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE upload_decisions SET decision = 'abort', updated_at = ?"
                " WHERE upload_id = ? AND decision = 'staging'",
                (now(), upload_id),
            )

    def abort_interrupted(self) -> int:
        """After a restart: uploads whose parts were still being sent are aborted."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE upload_decisions SET decision = 'abort', updated_at = ?"
                " WHERE decision = 'staging'",
                (now(),),
            )
            return int(cur.rowcount)

    def decision_done(self, upload_id: str, party: int, error: str = "",
                      decision: str | None = None) -> None:
        """``error`` empty: acknowledged; else one more failed attempt. ``decision``:
        the one the party answered, acknowledged only if it is still the recorded one
        (not replaced meanwhile, see :meth:`drop_expired_upload`)."""
        with self._tx() as db:
            if error:
                db.execute(
                    "UPDATE upload_decisions SET attempts = attempts + 1, error = ?,"
                    " updated_at = ? WHERE upload_id = ? AND party = ?"
                    " AND (? IS NULL OR decision = ?)",
                    (error[:300], now(), upload_id, party, decision, decision),
                )
            else:
                db.execute(
                    "UPDATE upload_decisions SET done = 1, error = '', updated_at = ?"
                    " WHERE upload_id = ? AND party = ? AND (? IS NULL OR decision = ?)",
                    (now(), upload_id, party, decision, decision),
                )

    def drop_expired_upload(self, upload_id: str, refusals: dict[int, str]) -> bool:
        """Parties (``refusals``: party -> its refusal) refused to commit the upload, their
        staged part expired: unless a party acknowledged the commit already, the upload
        leaves its data set and its row count, and every party is to abort it instead
        (each refusal kept with its decision until the abort is acknowledged), in one
        transaction. Whether it was dropped (False: a party holds it committed)."""
        with self._tx() as db:
            if db.execute(
                "SELECT 1 FROM upload_decisions WHERE upload_id = ? AND decision = 'commit'"
                " AND done = 1", (upload_id,)
            ).fetchone() is not None:
                return False
            row = db.execute("SELECT dataset_id, rows FROM uploads WHERE id = ?",
                             (upload_id,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM uploads WHERE id = ?", (upload_id,))
                db.execute("UPDATE datasets SET rows = rows - ? WHERE id = ?",
                           (int(row[1]), row[0]))
            db.execute(
                "UPDATE upload_decisions SET decision = 'abort', done = 0, attempts = 0,"
                " error = '', updated_at = ? WHERE upload_id = ? AND decision = 'commit'",
                (now(), upload_id),
            )
            for party, refusal in refusals.items():
                db.execute(
                    "UPDATE upload_decisions SET error = ? WHERE upload_id = ? AND party = ?",
                    (refusal[:300], upload_id, party),
                )
            return True

    def decisions(
        self, *, pending: bool = False, upload_id: str | None = None,
        dataset_id: str | None = None,
    ) -> list[UploadDecision]:
        """Decisions (``pending``: commit or abort not yet acknowledged)."""
        where, args = [], []
        if pending:
            where.append("done = 0 AND decision != 'staging'")
        if upload_id is not None:
            where.append("upload_id = ?")
            args.append(upload_id)
        if dataset_id is not None:
            where.append("dataset_id = ?")
            args.append(dataset_id)
        sql = "SELECT * FROM upload_decisions"
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY updated_at, upload_id, party", args)
            return [
                UploadDecision(
                    r["upload_id"], r["dataset_id"], int(r["party"]), r["decision"],
                    bool(r["done"]), int(r["attempts"]), r["error"],
                )
                for r in rows.fetchall()
            ]

    def upload_owner(self, upload_id: str) -> tuple[str, str, str, int] | None:
        """(dataset id, owner id, manifest SHA-256, rows) of a committed upload."""
        with self._lock:
            row = self._db.execute(
                "SELECT dataset_id, owner_id, manifest_sha256, rows FROM uploads WHERE id = ?",
                (upload_id,),
            ).fetchone()
            return None if row is None else (row[0], row[1], row[2], int(row[3]))

    def find_upload(self, upload_id: str) -> tuple[str, str, int] | None:
        """(dataset id, owner id, rows) of an upload."""
        with self._lock:
            row = self._db.execute(
                "SELECT dataset_id, owner_id, rows FROM uploads WHERE id = ?", (upload_id,)
            ).fetchone()
            return None if row is None else (row[0], row[1], int(row[2]))

    def uploads_without_signed_time(self, dataset_id: str) -> set[str]:
        """Uploads recorded before the registry kept their owner-signed times."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM uploads WHERE dataset_id = ? AND signed_at = ''", (dataset_id,)
            ).fetchall()
            return {r[0] for r in rows}

    def set_signed_at(self, upload_id: str, signed_at: str) -> None:
        with self._tx() as db:
            db.execute("UPDATE uploads SET signed_at = ? WHERE id = ? AND signed_at = ''",
                       (signed_at, upload_id))

    def withdraw_uploads(self, dataset_id: str, owner_id: str, signed_at: str) -> list[str]:
        """An owner's withdrawal: its uploads of the data set signed at or before
        ``signed_at`` (or recorded without a signed time) leave the data set and its row
        count, and their decisions not yet acknowledged are dropped, in one transaction;
        their ids stay used (upload_decisions keeps them). The ids removed, in order."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT id, rows FROM uploads WHERE dataset_id = ? AND owner_id = ?"
                " AND (signed_at = '' OR signed_at <= ?) ORDER BY signed_at, id",
                (dataset_id, owner_id, signed_at),
            ).fetchall()
            for r in rows:
                db.execute("DELETE FROM uploads WHERE id = ?", (r[0],))
                # a commit not yet acknowledged is not sent any more: the withdrawal
                # covers the party's staged part as well
                db.execute(
                    "UPDATE upload_decisions SET done = 1, error = 'withdrawn by its owner',"
                    " updated_at = ? WHERE upload_id = ? AND done = 0", (now(), r[0]))
            db.execute("UPDATE datasets SET rows = rows - ? WHERE id = ?",
                       (sum(int(r[1]) for r in rows), dataset_id))
            return [r[0] for r in rows]

    def upload_pins(self, dataset_id: str) -> list[tuple[str, str, int]]:
        """(upload id, manifest SHA-256, rows) of every upload of a data set, in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, manifest_sha256, rows FROM uploads WHERE dataset_id = ?"
                " ORDER BY signed_at, id",
                (dataset_id,),
            ).fetchall()
            return [(r[0], r[1], int(r[2])) for r in rows]

    def count_jobs(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])

    def count_jobs_by_state(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def grant(self, dataset_id: str, subject: str) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO grants (dataset_id, subject) VALUES (?,?)",
                (dataset_id, subject),
            )

    def upload_owners(self, dataset_id: str) -> list[str]:
        """The owners of a data set's uploads."""
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT owner_id FROM uploads WHERE dataset_id = ? ORDER BY owner_id",
                (dataset_id,),
            ).fetchall()
            return [r[0] for r in rows]

    # -- consents (signed by the owners; the parties verify them) -----------------

    def add_consent(self, c: ConsentRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO consents (dataset_id, owner_id, recipient,"
                " recipient_key, reveal, statement, signature, created_at)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (c.dataset_id, c.owner_id, c.recipient, c.recipient_key, c.reveal,
                 c.statement, c.signature, now()),
            )

    def count_consents(self, dataset_id: str, owner_id: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM consents WHERE dataset_id = ? AND owner_id = ?",
                (dataset_id, owner_id),
            ).fetchone()
            return int(row[0])

    def consents(self, dataset_id: str) -> list[ConsentRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM consents WHERE dataset_id = ? ORDER BY created_at",
                (dataset_id,),
            ).fetchall()
            return [ConsentRecord(r["dataset_id"], r["owner_id"], r["recipient"],
                                  r["recipient_key"], r["reveal"], bytes(r["statement"]),
                                  bytes(r["signature"])) for r in rows]

    def remove_consent(self, c: ConsentRecord) -> None:
        """Forget a consent its owner revoked: it is relayed with no job any more."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM consents WHERE dataset_id = ? AND owner_id = ? AND recipient = ?"
                " AND recipient_key = ? AND reveal = ? AND statement = ?",
                (c.dataset_id, c.owner_id, c.recipient, c.recipient_key, c.reveal,
                 c.statement),
            )

    # -- jobs --------------------------------------------------------------------

    def create_job(
        self,
        job_id: str,
        submitter: str,
        request: dict[str, Any],
        description: bytes,
        description_sha256: str,
        parties: int,
    ) -> None:
        t = now()
        with self._tx() as db:
            db.execute(
                "INSERT INTO jobs (id, submitter, state, request_json, description,"
                " description_sha256, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?)",
                (
                    job_id,
                    submitter,
                    "queued",
                    json.dumps(request),
                    description,
                    description_sha256,
                    t,
                    t,
                ),
            )
            for i in range(parties):
                db.execute(
                    "INSERT INTO job_parties (job_id, party, state) VALUES (?,?,?)",
                    (job_id, i, "queued"),
                )

    def set_job_description(self, job_id: str, description: bytes, sha256: str) -> bool:
        """Pin a queued job's description anew (its MPC ports, when it starts)."""
        with self._tx() as db:
            cur = db.execute(
                "UPDATE jobs SET description = ?, description_sha256 = ?, updated_at = ?"
                " WHERE id = ? AND state = 'queued'",
                (description, sha256, now(), job_id),
            )
            return cur.rowcount == 1

    def set_job_state(self, job_id: str, state: str, error: str = "") -> bool:
        """Move a job to ``state``; a final state is never left. True when it changed."""
        with self._tx() as db:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row[0] in FINAL_STATES or row[0] == state:
                return False
            db.execute(
                "UPDATE jobs SET state = ?, error = ?, updated_at = ? WHERE id = ?",
                (state, error, now(), job_id),
            )
            return True

    def set_party_state(self, job_id: str, st: PartyJobState) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE job_parties SET state=?, phase=?, progress=?, error=?, program_sha256=?,"
                " seconds=?, bytes_sent=?, failure=? WHERE job_id=? AND party=?",
                (
                    st.state,
                    st.phase,
                    st.progress,
                    st.error,
                    st.program_sha256,
                    st.seconds,
                    st.bytes_sent,
                    st.failure,
                    job_id,
                    st.party,
                ),
            )
            db.execute("UPDATE jobs SET updated_at = ? WHERE id = ?", (now(), job_id))

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            return None if row is None else self._job(row)

    def list_jobs(self, submitter: str | None = None) -> list[JobRecord]:
        with self._lock:
            if submitter is None:
                rows = self._db.execute("SELECT * FROM jobs ORDER BY created_at, id").fetchall()
            else:
                rows = self._db.execute(
                    "SELECT * FROM jobs WHERE submitter = ? ORDER BY created_at, id", (submitter,)
                ).fetchall()
            return [self._job(r) for r in rows]

    def unfinished_jobs(self) -> list[JobRecord]:
        return [j for j in self.list_jobs() if j.state not in FINAL_STATES]

    def _job(self, row: sqlite3.Row) -> JobRecord:
        parties = self._db.execute(
            "SELECT * FROM job_parties WHERE job_id = ? ORDER BY party", (row["id"],)
        ).fetchall()
        return JobRecord(
            id=row["id"],
            submitter=row["submitter"],
            state=row["state"],
            request=json.loads(row["request_json"]),
            description=bytes(row["description"]),
            description_sha256=row["description_sha256"],
            error=row["error"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            parties=[
                PartyJobState(
                    party=int(p["party"]),
                    state=p["state"],
                    phase=p["phase"],
                    progress=float(p["progress"]),
                    error=p["error"],
                    program_sha256=p["program_sha256"],
                    seconds=float(p["seconds"]),
                    bytes_sent=int(p["bytes_sent"]),
                    failure=p["failure"],
                )
                for p in parties
            ],
        )
