"""Party errors, and the one place where domain errors become gRPC status codes.

Every message here is safe to send to a client: it names the problem, never a
share, a key or engine output. Anything not listed becomes INTERNAL with the
fixed message "Internal server error." (the details go to the party's log only).
"""

from __future__ import annotations

import errno
import os

import grpc

from ppfs.errors import (
    EngineError,
    EngineUnavailableError,
    InputDataError,
    IntegrityError,
    ParameterError,
    PpfsError,
    ShareFormatError,
)
from ppfs.upload import UploadRejected
from ppfs.withdrawal import WithdrawalError

INTERNAL_MESSAGE = "Internal server error."


class PartyError(PpfsError):
    """Base of the errors only the party daemon raises."""


class NotFoundError(PartyError):
    """No such dataset, upload or job on this party."""


class UploadReplayedError(UploadRejected):
    """This upload (or its manifest) was received before."""


class UploadUnauthorizedError(UploadRejected):
    """The manifest is not signed by a data owner registered with this party."""


class UploadTooLargeError(UploadRejected):
    """The sealed part exceeds this party's size limit."""


class UploadTimedOutError(UploadRejected):
    """The sealed part did not arrive within the party's time for its size."""


class TooManyOpenCallsError(PartyError):
    """A stream this party holds a bounded number of at once (upload parts, watchers of
    one job) would go past that number."""


class TombstonesFullError(PartyError):
    """An id this party never saw would be remembered (cancelled or aborted) beyond the
    number it keeps."""


class JobConflictError(PartyError):
    """The job id is taken, or the job is not in a state that allows the call."""


class ResultPrunedError(JobConflictError):
    """The job's result was deleted at this party once the job was older than its
    retention (``--job-retention-days``): it cannot be fetched any more."""


class UploadDecisionError(PartyError):
    """A commit of an aborted upload, or an abort of a committed one."""


class DamagedUploadError(PartyError):
    """A share file of a committed upload is not what this party stored (truncated,
    altered or gone: a disk fault). The upload is set aside and used by no job until its
    owner re-sends the part."""


class DescriptionMismatchError(ParameterError):
    """The job description's hash differs from the one the caller sent."""


class NotReadyError(PartyError):
    """The party's certificates have not been installed yet (``ppfs pki sign``)."""


class WrongPartyStateError(PartyError):
    """At start: the state directory's key request or installed certificates name
    another party than the one the daemon is started as."""


class CallerNotGatewayError(PartyError):
    """A PartyService call whose TLS client certificate is not the gateway's control
    identity (a party's own certificate, or another client identity)."""


class CorruptStateError(PartyError):
    """At start: a file of the party's state (a job record) cannot be read. The party
    refuses to start, naming it, rather than run without what it records."""


class PartyStoppingError(PartyError):
    """The party is stopping: it takes no new job while its unfinished ones end."""


class StorageError(PartyError):
    """This party could not write its own files (a write or sync failed): its fault,
    not a peer's, and nothing half-written is kept."""


class DiskFullError(StorageError):
    """This party's disk (or its quota) is full."""


_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
# what a failed write of the party's own files raises (any other OSError is not named so)
_WRITE_FAILED = _DISK_FULL | {errno.EIO, errno.EROFS}


def is_write_failure(exc: OSError) -> bool:
    """Whether ``exc`` is how a failed write of a file fails (full, I/O error, read-only)."""
    return exc.errno in _WRITE_FAILED


def storage_error(exc: OSError, doing: str = "") -> StorageError:
    """The error that names a failed write of this party's files while ``doing``: the
    system's reason (no space left, an I/O error) and never a path or file contents."""
    while_ = f" {doing}" if doing else ""
    if exc.errno in _DISK_FULL:
        return DiskFullError(f"this party's disk is full (no space left on device){while_}; "
                             "free space there and try again")
    reason = os.strerror(exc.errno).lower() if exc.errno else type(exc).__name__
    return StorageError(f"this party could not write its files ({reason}){while_}")


# Most specific first: the first class in an error's MRO found here decides.
_STATUS: dict[type[BaseException], grpc.StatusCode] = {
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    UploadReplayedError: grpc.StatusCode.ALREADY_EXISTS,
    UploadUnauthorizedError: grpc.StatusCode.PERMISSION_DENIED,
    WithdrawalError: grpc.StatusCode.PERMISSION_DENIED,
    CallerNotGatewayError: grpc.StatusCode.PERMISSION_DENIED,
    UploadTooLargeError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    UploadTimedOutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    TombstonesFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    TooManyOpenCallsError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    PartyStoppingError: grpc.StatusCode.FAILED_PRECONDITION,
    DiskFullError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    # a failed write is this party's own fault: INTERNAL, but with the message naming it
    StorageError: grpc.StatusCode.INTERNAL,
    JobConflictError: grpc.StatusCode.FAILED_PRECONDITION,
    UploadDecisionError: grpc.StatusCode.FAILED_PRECONDITION,
    DamagedUploadError: grpc.StatusCode.FAILED_PRECONDITION,
    NotReadyError: grpc.StatusCode.FAILED_PRECONDITION,
    EngineUnavailableError: grpc.StatusCode.FAILED_PRECONDITION,
    IntegrityError: grpc.StatusCode.DATA_LOSS,
    EngineError: grpc.StatusCode.ABORTED,
    UploadRejected: grpc.StatusCode.INVALID_ARGUMENT,
    ShareFormatError: grpc.StatusCode.INVALID_ARGUMENT,
    ParameterError: grpc.StatusCode.INVALID_ARGUMENT,
    InputDataError: grpc.StatusCode.INVALID_ARGUMENT,
}


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """(status code, safe message) for ``exc``; unexpected errors say nothing."""
    if isinstance(exc, OSError) and is_write_failure(exc):
        exc = storage_error(exc)  # a failed write no caller named: still say what failed
    for cls in type(exc).__mro__:
        code = _STATUS.get(cls)
        if code is not None:
            return code, str(exc)[:500]
    return grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE
