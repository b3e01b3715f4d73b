"""One process per state directory: an exclusive lock held for the process's life.

A second party daemon, gateway or ``ppfs up`` on a state directory in use would take the
first one's running jobs for interrupted, delete their files and overwrite its
configuration. :func:`hold_state_dir` takes ``flock(LOCK_EX | LOCK_NB)`` on
``<dir>/lock`` (mode 0600, holding the holder's pid) and keeps the file open. The
kernel releases the lock when the process ends, however it ends (SIGKILL included), so
a crash leaves no stale lock; the file descriptor is not inherited, so a child process
(an engine) never holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from ppfs.errors import PpfsError

LOCK_NAME = "lock"


class StateDirInUse(PpfsError):
    """Another process holds the state directory's lock."""

    def __init__(self, directory: Path, pid: int | None, message: str | None = None) -> None:
        holder = f" (pid {pid})" if pid else ""
        super().__init__(message or f"{directory} is in use by another process{holder}; "
                         "stop it or use another state directory")
        self.directory = directory
        self.pid = pid


class StateDirLock:
    """The held lock of one state directory; :meth:`release` (or process exit) frees it."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory = directory
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def _holder(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip() or "0") or None
    return None


def hold_state_dir(directory: Path) -> StateDirLock:
    """Lock ``directory`` (made 0700 if missing) for this process, or raise
    :class:`StateDirInUse` at once, naming it and its holder's pid."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        raise StateDirInUse(directory, pid) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return StateDirLock(directory, fd)
