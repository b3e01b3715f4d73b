"""Temporary directories of local runs (``ppfs select``, ``ppfs demo``) that a run
killed outright (SIGKILL, the machine's OOM killer) cannot remove itself.

Such a directory holds every party's shares, the recipient's mask shares and keys
(the demo's: its development CA's key and every party's). Each run makes its own
with :func:`make_run_dir` (``<tmp>/ppfs-*``, 0700) and holds an ``flock`` on the
:data:`RUN_LOCK` file inside it for its whole life; the kernel drops that lock however
the run ends. :func:`remove_left_behind`, called by the next run of either command,
removes this user's directories whose lock nobody holds. The lock is made and locked
under another name and only then renamed into place, so a run looking for leftovers
never finds a live run's lock unlocked, not even between its making and locking; a
directory without a lock (not a run's) stays.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

TEMP_PREFIX = "ppfs-"
# in each temporary directory of a run, locked (flock) by the run while it lasts: one
# that is unlocked was left by a run killed before it could remove it
RUN_LOCK = "run.lock"
# what `ppfs select` named its lock before the demo shared it: its leftovers count too
OLD_RUN_LOCKS = ("select.lock",)


def make_run_dir(prefix: str = TEMP_PREFIX) -> tuple[Path, int]:
    """A new temporary directory for a run (0700; ``prefix`` begins with
    :data:`TEMP_PREFIX`) and the descriptor holding its lock: the run keeps it open
    while it lasts, and the kernel drops the lock however the run ends."""
    if not prefix.startswith(TEMP_PREFIX):
        raise ValueError(f"a run's directory name begins with {TEMP_PREFIX!r}")
    path = Path(tempfile.mkdtemp(prefix=prefix))
    # locked under another name, then renamed into place: a run looking for what killed
    # runs left never finds this lock unlocked, not even between its making and locking
    fd = os.open(path / f".{RUN_LOCK}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(path / f".{RUN_LOCK}", path / RUN_LOCK)
    except BaseException:
        os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path, fd


def _open_lock(directory: Path) -> int | None:
    """A descriptor of the run lock in ``directory`` (None: it holds none)."""
    for name in (RUN_LOCK, *OLD_RUN_LOCKS):
        try:
            return os.open(directory / name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
    return None


def remove_left_behind() -> list[Path]:
    """Remove this user's temporary directories of runs killed before they could (they
    hold every party's shares, the recipient's mask shares and keys): those with an
    unlocked run lock. A run still going holds its lock; a directory without one is not
    a run's and stays. The directories removed."""
    removed = []
    for d in Path(tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*"):
        try:
            st = d.lstat()
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        fd = _open_lock(d)
        if fd is None:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a run still going
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed
