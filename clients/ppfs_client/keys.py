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
import hashlib
import io
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.contract import SignedRequest
from ppfs.durable import fsync_dir
from ppfs.errors import ParameterError
from ppfs.pki import replace_private_file

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def write_private(path: Path, data: bytes) -> None:
    """``data`` at ``path``, 0600, durably; folders made for it 0700, durably too. A write
    that fails (a full disk) leaves the old file, if any, and names ``path``."""
    try:
        _make_dirs(path.parent)
        replace_private_file(path, data)
    except OSError as exc:
        if exc.filename is None and exc.errno is not None:
            raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from None
        raise


def _make_dirs(folder: Path) -> None:
    if folder.is_dir():
        return
    _make_dirs(folder.parent)
    folder.mkdir(mode=0o700, exist_ok=True)
    fsync_dir(folder.parent)  # the new folder's name outlives a crash


def _request_json(request: SignedRequest) -> bytes:
    return json.dumps({
        "statement": base64.b64encode(request.statement).decode(),
        "signature": base64.b64encode(request.signature).decode(),
    }).encode()


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
        write_private(path, blob)
        return ClientKeys(self.subject, self.signing, self.box, path)

    @classmethod
    def load(cls, path: Path) -> ClientKeys:
        """The key file at ``path``; ParameterError naming it if it is missing, not a key
        file, or readable or writable by anyone but its owner (as ssh refuses such a key:
        whoever could read it could sign as this subject and open its results)."""
        try:
            with open(path, "rb") as fh:
                mode = os.fstat(fh.fileno()).st_mode
                if stat.S_ISREG(mode) and mode & 0o077:
                    raise ParameterError(
                        f"{path}: a key file others can read or write (mode "
                        f"{stat.S_IMODE(mode):04o}) is not used; if no one else has read it, "
                        f"make it private (chmod 600 {path}), otherwise make a new key")
                d = json.loads(fh.read(1 << 16).decode("utf-8"))
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
        buf = io.BytesIO()
        np.save(buf, np.asarray(words, dtype=np.int64), allow_pickle=False)
        write_private(path, buf.getvalue())
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
        write_private(path, _request_json(request))
        # the job id is kept: the request no longer waits for one
        self._pending_path(hashlib.sha256(request.statement).hexdigest()).unlink(
            missing_ok=True)
        return path

    def _pending_path(self, request_sha256: str, folder: str = "pending") -> Path:
        if self.path is None:
            raise ParameterError("submitted requests need a key file on disk to live next to")
        if not re.fullmatch(r"[0-9a-f]{64}", request_sha256):
            raise ParameterError("not a request hash")
        return self.path.with_name(self.path.name + ".jobs") / folder / \
            f"{request_sha256}.json"

    def keep_pending_request(self, request: SignedRequest) -> Path | None:
        """Keep a signed request before it is submitted (None without a key file): if the
        client stops before the gateway's answer (the job id) is kept, the result of the
        job it became still opens only as the answer to it (:meth:`adopt_pending_request`)."""
        if self.path is None:
            return None
        path = self._pending_path(hashlib.sha256(request.statement).hexdigest())
        write_private(path, _request_json(request))
        return path

    def drop_pending_request(self, request: SignedRequest) -> None:
        """The gateway refused the request: no job answers it. It is no longer pending,
        but kept as refused (:meth:`was_refused`): a gateway that said so and ran it all
        the same does not have its result opened."""
        if self.path is None:
            return
        sha = hashlib.sha256(request.statement).hexdigest()
        write_private(self._pending_path(sha, "refused"), _request_json(request))
        self._pending_path(sha).unlink(missing_ok=True)

    def was_refused(self, request_sha256: str) -> bool:
        """Whether the gateway refused the request of SHA-256 ``request_sha256`` when this
        key file submitted it (no job was created, it said)."""
        if self.path is None:
            return False
        return self._pending_path(request_sha256, "refused").is_file()

    def pending_requests(self) -> list[Path]:
        """Requests submitted with this key file whose job id was never kept."""
        if self.path is None:
            return []
        folder = self.path.with_name(self.path.name + ".jobs") / "pending"
        return sorted(folder.glob("*.json")) if folder.is_dir() else []

    def adopt_pending_request(self, job_id: str, request_sha256: str) -> SignedRequest | None:
        """The kept request of SHA-256 ``request_sha256``, whose submission got no kept
        answer, now kept as ``job_id``'s (the parties signed that ``job_id`` ran it);
        None if there is no such request."""
        if self.path is None:
            return None
        path = self._pending_path(request_sha256)
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            request = SignedRequest(base64.b64decode(d["statement"]),
                                    base64.b64decode(d["signature"]))
        except (FileNotFoundError, ParameterError):
            return None
        except (OSError, ValueError, KeyError, TypeError):
            raise ParameterError(f"{path}: not a kept job request") from None
        if hashlib.sha256(request.statement).hexdigest() != request_sha256:
            raise ParameterError(f"{path}: not the request its name says")
        self.save_job_request(job_id, request)
        return request

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
            words = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise ParameterError(
                f"no mask words for upload {upload_id} next to {self.path}: "
                "only the recipient who uploaded the masks can open this result"
            ) from None
        except (OSError, ValueError, EOFError):
            words = None
        if not isinstance(words, np.ndarray) or words.dtype != np.int64 \
                or words.ndim != 2 or words.shape[1] != 2:
            # this machine's own file, not the gateway's answer: say so
            raise ParameterError(
                f"{path}: not the mask words this client wrote (damaged?): the result of "
                f"mask upload {upload_id} cannot be unmasked without them")
        return words
