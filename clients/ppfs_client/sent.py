"""What an owner sent: each upload's signed manifest and sealed parts, kept next to the
key file in ``<key file>.uploads/<upload id>.json`` (mode 0600).

The parts are sealed to the parties (the owner cannot open them either), so keeping them
adds nothing to what the owner already holds; they let the owner give a party that lost
its part exactly the bytes the signed manifest names (``ppfs datasets repair``), without
re-sharing anything.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ppfs.errors import ParameterError
from ppfs_client.keys import ClientKeys, write_private

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def _path(keys: ClientKeys, upload_id: str) -> Path:
    if keys.path is None:
        raise ParameterError("sent uploads are kept next to a key file on disk")
    if not _ID.match(upload_id):
        raise ParameterError("not an upload id")
    return keys.path.with_name(keys.path.name + ".uploads") / f"{upload_id}.json"


def save_sent(keys: ClientKeys, dataset_id: str, body: dict[str, Any]) -> Path | None:
    """Keep an upload's body (manifest, signature, sealed parts); None without a key file."""
    if keys.path is None:
        return None
    path = _path(keys, str(body["upload_id"]))
    write_private(path, json.dumps({"dataset_id": dataset_id, **body}).encode())
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
