"""What an owner sent: each upload's signed manifest and sealed parts, kept next to the
key file in ``<key file>.uploads/<upload id>.json`` (mode 0600).

The parts are sealed to the parties (the owner cannot open them either), so keeping them
adds nothing to what the owner already holds; they let the owner give a party that lost
its part exactly the bytes the signed manifest names (``ppfs datasets repair``), without
re-sharing anything.

Each record holds the data set the upload went into. Beside it, ``<upload id>.sent``
(mode 0600, a few hundred bytes, so that checking a new upload reads no sealed part) holds
the data set, when it was sent and a digest of the table it carried
(:func:`table_digest`), so that the same rows are not sent into the same data set twice by
mistake (:func:`earlier_uploads`; of such an earlier upload the gateway is asked only, by
its id, whether it was added). That digest is a fingerprint of the owner's data and stays
on this machine: it is never part of anything sent.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ppfs.errors import ParameterError
from ppfs_client.keys import ClientKeys, write_private

if TYPE_CHECKING:
    from ppfs_client.sdk import OwnerTable

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
SENT_AT_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
SENT_SUFFIX = ".sent"  # <upload id>.sent: the data set, time and digest of an upload


class RepeatedUpload(ParameterError):
    """The same rows were already sent into this data set with this key file."""


def _path(keys: ClientKeys, upload_id: str) -> Path:
    if keys.path is None:
        raise ParameterError("sent uploads are kept next to a key file on disk")
    if not _ID.match(upload_id):
        raise ParameterError("not an upload id")
    return _folder(keys.path) / f"{upload_id}.json"


def _folder(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".uploads")


def table_digest(keys: ClientKeys, table: OwnerTable) -> str:
    """A digest of the parsed table: its columns, its rows (feature values and label) and
    its label column and classes, as canonical bytes, so that the same CSV read again
    gives the same digest, and so does any CSV that parses to the same rows in another
    order or written otherwise (``1.5`` or ``1.50e0``; ``-0`` or ``0``; numeric labels by
    value, as ppfs.table reads them): sent again, their rows would be counted twice all
    the same. A table with its columns in another order is another table (into a data
    set it would not fit that data set's schema).

    HMAC-SHA256 keyed from this key file's signing key: whoever reads the record without
    the key file cannot test guesses of the data against it."""
    x = np.ascontiguousarray(np.asarray(table.x, dtype=np.float64) + 0.0)  # -0.0 -> 0.0
    m, p = (x.shape[0], x.shape[1]) if x.ndim == 2 else (0, 0)
    rows = x.astype(">f8").view(np.uint8).reshape(m, 8 * p)
    classes = sorted(str(c) for c in table.classes)
    if table.label_column and table.y is not None:
        rank = {c: i for i, c in enumerate(classes)}
        labels = np.array([rank[str(table.classes[int(v)])] for v in table.y], dtype=">u4")
        rows = np.concatenate([rows, labels.view(np.uint8).reshape(m, 4)], axis=1)
    width = rows.shape[1]
    ordered = (np.sort(np.ascontiguousarray(rows).view(np.dtype((np.void, width))).ravel())
               if m and width else rows)
    head = json.dumps(
        {"columns": [str(c) for c in table.columns], "label_column": str(table.label_column),
         "classes": classes, "rows": m},
        ensure_ascii=False, separators=(",", ":"), sort_keys=True,
    ).encode()
    key = hashlib.sha256(b"ppfs table digest v1\0" + bytes(keys.signing)).digest()
    mac = hmac.new(key, b"ppfs table v1\0", hashlib.sha256)
    mac.update(struct.pack(">Q", len(head)) + head)
    mac.update(np.ascontiguousarray(ordered).tobytes())
    return mac.hexdigest()


def save_sent(
    keys: ClientKeys, dataset_id: str, body: dict[str, Any], *, table_sha256: str = ""
) -> Path | None:
    """Keep an upload's body (manifest, signature, sealed parts), with the data set, the
    time and the table's digest; None without a key file."""
    if keys.path is None:
        return None
    path = _path(keys, str(body["upload_id"]))
    write_private(path, json.dumps({"dataset_id": dataset_id, **body}).encode())
    if table_sha256:
        write_private(path.with_suffix(SENT_SUFFIX), json.dumps({
            "dataset_id": dataset_id, "table_sha256": table_sha256,
            "sent_at": dt.datetime.now(dt.UTC).strftime(SENT_AT_FORMAT)}).encode())
    return path


def load_sent(keys: ClientKeys, upload_id: str) -> dict[str, Any]:
    path = _path(keys, upload_id)
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise ParameterError(
            f"upload {upload_id} was not sent with the key file {keys.path} "
            f"(nothing kept in {path.parent})"
        ) from None


@dataclass(frozen=True)
class EarlierUpload:
    upload_id: str
    sent_at: str
    path: Path


def _damaged(path: Path, why: str) -> ParameterError:
    return ParameterError(
        f"{path}: the digest record of a sent upload is damaged ({why}); it is read to keep "
        f"the same rows from being sent twice. Restore it from a backup, or delete it (the "
        f"upload's own record stays, for `ppfs datasets repair`; only this check no longer "
        f"covers it)")


def earlier_uploads(keys: ClientKeys, dataset_id: str, digest: str) -> list[EarlierUpload]:
    """The uploads this key file kept a record of that sent the same table (``digest``)
    into ``dataset_id``, oldest first. Uploads without a digest (kept by older clients)
    are passed over; a digest record that does not parse is named (ParameterError)."""
    if keys.path is None:
        return []
    folder = _folder(keys.path)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob(f"*{SENT_SUFFIX}")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise _damaged(path, "not UTF-8 text") from None
        except ValueError:
            raise _damaged(path, "not JSON") from None
        if not isinstance(record, dict):
            raise _damaged(path, "not a JSON object")
        got, sent_at = record.get("table_sha256"), record.get("sent_at")
        if not (isinstance(got, str) and _HEX64.match(got) and isinstance(sent_at, str)
                and isinstance(record.get("dataset_id"), str)):
            raise _damaged(path, "its data set, digest or time is not what a record holds")
        if record["dataset_id"] == dataset_id and hmac.compare_digest(got, digest):
            found.append(EarlierUpload(path.stem, sent_at, path))
    return sorted(found, key=lambda e: (e.sent_at, e.upload_id))


def repeat_refused(
    earlier: EarlierUpload, dataset_id: str, state: str, *, source: str = ""
) -> RepeatedUpload:
    """The refusal of the same rows sent again into ``dataset_id``; ``state``: what
    became of the earlier upload."""
    return RepeatedUpload(
        f"{source + ': ' if source else ''}these rows (the same columns, values and labels) "
        f"were already sent into data set {dataset_id} as upload {earlier.upload_id} at "
        f"{earlier.sent_at} ({state}); sent again, every row would count twice in the "
        f"feature scores and the model. If the rows really should be added twice, pass "
        f"--again (again=True in the SDK)")
