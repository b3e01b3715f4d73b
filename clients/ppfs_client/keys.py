"""A client's key file: who it is and its private keys, kept on its own machine.

JSON, mode 0600::

    {"subject": "hospital-a", "signing_key": <Ed25519 seed, base64>,
     "box_key": <X25519 private key, base64>}

The signing key signs upload manifests (the parties know its public half); the box
key opens result parts sealed to this client as a job's recipient. Mask words drawn
for a job stay next to the key file, in ``<key file>.masks/<upload id>.npy``.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.errors import ParameterError


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)


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
        return self.path.with_name(self.path.name + ".masks") / f"{upload_id}.npy"

    def save_mask_words(self, upload_id: str, words: np.ndarray) -> Path:
        path = self._mask_path(upload_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, np.asarray(words, dtype=np.int64), allow_pickle=False)
        return path

    def load_mask_words(self, upload_id: str) -> np.ndarray:
        path = self._mask_path(upload_id)
        try:
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.int64)
        except FileNotFoundError:
            raise ParameterError(
                f"no mask words for upload {upload_id} next to {self.path}: "
                "only the recipient who uploaded the masks can open this result"
            ) from None
