"""A client's key file: who it is and its private keys, kept on its own machine.

JSON, mode 0600::

    {"subject": "hospital-a", "signing_key": <Ed25519 seed, base64>,
     "box_key": <X25519 private key, base64>}

The signing key signs upload manifests (the parties know its public half); the box
key opens result parts sealed to this client as a job's recipient. Mask words drawn
for a job stay next to the key file, in ``<key file>.masks/<upload id>.npy``; the signed
request of each job submitted with it, in ``<key file>.jobs/<job id>.json``, so that a result
is opened only as the answer to the request submitted as that job.
"""

from __future__ import annotations

import base64
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.contract import SignedRequest
from ppfs.errors import ParameterError
from ppfs.pki import replace_private_file

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_private_file(path, data)


@dataclass(frozen=True)
class ClientKeys:
    subject: str
    signing: SigningKey
    box: PrivateKey
    path: Path | None = None

    @classmethod
    def generate(cls, subject: str) -> ClientKeys:
        return cls(subject, SigningKey.generate(), PrivateKey.generate())

    @property
    def verify_key(self) -> bytes:
        return bytes(self.signing.verify_key)

    @property
    def box_public_key(self) -> bytes:
        return bytes(self.box.public_key)

    def save(self, path: Path) -> ClientKeys:
        blob = json.dumps(
            {
                "subject": self.subject,
                "signing_key": base64.b64encode(bytes(self.signing)).decode(),
                "box_key": base64.b64encode(bytes(self.box)).decode(),
                "verify_key": base64.b64encode(self.verify_key).decode(),
                "box_public_key": base64.b64encode(self.box_public_key).decode(),
            },
            indent=2,
        ).encode()
        _write_private(path, blob)
        return ClientKeys(self.subject, self.signing, self.box, path)

    @classmethod
    def load(cls, path: Path) -> ClientKeys:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return cls(
                str(d["subject"]),
                SigningKey(base64.b64decode(d["signing_key"])),
                PrivateKey(base64.b64decode(d["box_key"])),
                path,
            )
        except FileNotFoundError:
            raise ParameterError(f"{path}: no such key file") from None
        except (OSError, ValueError, KeyError, TypeError):
            raise ParameterError(f"{path}: not a ppfs key file") from None

    def _mask_path(self, upload_id: str) -> Path:
        if self.path is None:
            raise ParameterError("mask words need a key file on disk to live next to")
        if not _ID.match(upload_id):
            raise ParameterError("not an upload id")
        return self.path.with_name(self.path.name + ".masks") / f"{upload_id}.npy"

    def save_mask_words(self, upload_id: str, words: np.ndarray) -> Path:
        path = self._mask_path(upload_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        buf = io.BytesIO()
        np.save(buf, np.asarray(words, dtype=np.int64), allow_pickle=False)
        replace_private_file(path, buf.getvalue())
        return path

    def _job_path(self, job_id: str) -> Path:
        if self.path is None:
            raise ParameterError("submitted requests need a key file on disk to live next to")
        if not _ID.match(job_id):
            raise ParameterError("not a job id")
        return self.path.with_name(self.path.name + ".jobs") / f"{job_id}.json"

    def save_job_request(self, job_id: str, request: SignedRequest) -> Path | None:
        """Keep the signed request submitted as ``job_id`` (None without a key file).
        ParameterError if ``job_id`` already holds another request: a job id answers one
        request only."""
        if self.path is None:
            return None
        path = self._job_path(job_id)
        kept = self.load_job_request(job_id)
        if kept is not None and kept.statement != request.statement:
            raise ParameterError(f"job {job_id} already answers another request of this key")
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(path, json.dumps({
            "statement": base64.b64encode(request.statement).decode(),
            "signature": base64.b64encode(request.signature).decode(),
        }).encode())
        return path

    def load_job_request(self, job_id: str) -> SignedRequest | None:
        """The signed request submitted as ``job_id`` with this key file; None if none was."""
        if self.path is None:
            return None
        path = self._job_path(job_id)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            return SignedRequest(base64.b64decode(d["statement"]),
                                 base64.b64decode(d["signature"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            raise ParameterError(f"{path}: not a kept job request") from None

    def load_mask_words(self, upload_id: str) -> np.ndarray:
        path = self._mask_path(upload_id)
        try:
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.int64)
        except FileNotFoundError:
            raise ParameterError(
                f"no mask words for upload {upload_id} next to {self.path}: "
                "only the recipient who uploaded the masks can open this result"
            ) from None
