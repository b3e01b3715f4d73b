"""The gateway's errors, and their one mapping to RFC 9457 problem details.

Every gateway error derives from :class:`ppfs.errors.PpfsError` and carries an HTTP
status and a short title. Messages are safe to show: they name a dataset, a job,
a party or a parameter, never a share, a key, a token or engine output.
"""

from __future__ import annotations

import errno
import os
import sqlite3

from ppfs.errors import InputDataError, ParameterError, PpfsError, ShareFormatError


class GatewayError(PpfsError):
    status = 500
    title = "Internal server error"
    type_slug = "internal"


class Unauthenticated(GatewayError):
    status = 401
    title = "Missing or invalid bearer token"
    type_slug = "unauthenticated"


class TokenExpired(Unauthenticated):
    """A known token past its ``expires_at``: refused, saying so and when (never whose)."""

    title = "Bearer token expired"
    type_slug = "token-expired"


class Forbidden(GatewayError):
    status = 403
    title = "Not allowed for this role"
    type_slug = "forbidden"


class NotFound(GatewayError):
    status = 404
    title = "Not found"
    type_slug = "not-found"


class Conflict(GatewayError):
    status = 409
    title = "Conflict with the current state"
    type_slug = "conflict"


class PayloadTooLarge(GatewayError):
    status = 413
    title = "Upload too large"
    type_slug = "too-large"


class InvalidRequest(GatewayError):
    status = 422
    title = "Invalid request"
    type_slug = "invalid"


class MalformedUpload(InvalidRequest):
    title = "Malformed upload"
    type_slug = "malformed-upload"


class IncompatibleSchemas(InvalidRequest):
    title = "Incompatible data set schemas"
    type_slug = "incompatible-schemas"


class PartyUnavailable(GatewayError):
    status = 502
    title = "A computing party did not answer"
    type_slug = "party-unavailable"


class PartyRefusesConnections(PartyUnavailable):
    """Nothing listens at the party's address (its host answered, refusing the
    connection): the daemon is not running there, not a slow network or a frozen one."""


class PartyStopping(GatewayError):
    """A party was told to stop (its identity says so): it takes no new job until it is
    back. ``retry_after``: seconds until it has stopped at the latest (the Retry-After
    header); when it is back depends on its operator."""

    status = 503
    title = "A computing party is stopping"
    type_slug = "party-stopping"

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GatewayStorageError(GatewayError):
    """The gateway could not write its own state (registry or spooled body): its disk
    is full or a write failed. What the request would have changed is not kept."""

    status = 507
    title = "The gateway could not write its state"
    type_slug = "gateway-storage"


class RegistryUnreadable(GatewayError):
    """At start: the registry file is not a database SQLite can read (truncated,
    overwritten, corrupted). The gateway refuses to start rather than lose its records."""


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# SQLite's primary result codes for a full disk and a failed read or write of its files
_SQLITE_STORAGE = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR}


def storage_error(exc: OSError | sqlite3.Error, doing: str) -> GatewayStorageError:
    """The error naming a failed write of the gateway's own files while ``doing``: the
    system's reason only (never a path, a token or what was being written)."""
    if isinstance(exc, sqlite3.Error):
        full = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL
        reason = "a write of its registry failed"
    else:
        full = exc.errno in _DISK_FULL
        reason = os.strerror(exc.errno).lower() if exc.errno else type(exc).__name__
    if full:
        return GatewayStorageError(f"the gateway's disk is full (no space left on device) "
                                   f"{doing}; nothing of it was kept. Its operator frees "
                                   "space there; then try again")
    return GatewayStorageError(f"the gateway could not write its state ({reason}) {doing}; "
                               "nothing of it was kept")


def is_storage_failure(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed for want of disk space or a failed write (not a bug)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in _SQLITE_STORAGE


class PartyFailed(PartyUnavailable):
    """A party answered that it failed the call itself (its disk, say), naming why."""

    title = "A computing party failed"
    type_slug = "party-failed"


class PartyRejected(GatewayError):
    status = 422
    title = "A computing party refused the request"
    type_slug = "party-rejected"


def no_job_created(exc: Exception) -> None:
    """Mark ``exc``, raised by a job submission before the job was recorded: its problem
    details then state ``job_created: false`` (and the reason, as the problem type's
    slug), whatever its status: a 4xx, a party that did not answer or failed (502), the
    gateway's disk (507), an unexpected failure (500). Never said once the job's row is
    committed: that is when the job exists."""
    exc.job_created = False  # type: ignore[attr-defined]


def job_created(exc: Exception) -> bool | None:
    """False if ``exc`` was marked by :func:`no_job_created`; None (not said) otherwise."""
    return False if getattr(exc, "job_created", None) is False else None


def classify(exc: PpfsError) -> tuple[int, str, str]:
    """(status, title, type slug) for any domain error."""
    if isinstance(exc, GatewayError):
        return exc.status, exc.title, exc.type_slug
    if isinstance(exc, ParameterError):
        return 422, "Invalid parameter", "invalid-parameter"
    if isinstance(exc, InputDataError):
        return 422, "Invalid input data", "invalid-input"
    if isinstance(exc, ShareFormatError):
        return 422, "Malformed upload", "malformed-upload"
    return 500, "Internal server error", "internal"
