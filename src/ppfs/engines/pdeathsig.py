"""Run a program that dies with its launcher:
``python -I -S .../pdeathsig.py [--peak-rss FILE] PROG ARGS`` (:func:`command`).

Sets the Linux parent-death signal (SIGKILL) and replaces itself with PROG, so the
engine process is killed when the process that launched it dies, even by SIGKILL:
a killed party daemon leaves no engine behind, and its peers see the link drop.
Done in a separate process because a ``preexec_fn`` (Python code between fork and
exec) is unsafe in a process running gRPC's threads.

With ``--peak-rss FILE`` it stays PROG's parent instead of becoming PROG: PROG runs
in a child that dies with it the same way, and when PROG ends, its peak resident
memory (``ru_maxrss`` of ``wait4``: the kernel's exact high-water mark) is written to
FILE in bytes, and this process ends as PROG did (its exit code, or killed by the
same signal).
"""

from __future__ import annotations

import ctypes
import os
import sys

# The launcher runs once per party and job: as a script it imports no more than it
# needs (pathlib, contextlib, signal and typing would double its start-up time).
PR_SET_PDEATHSIG = 1  # linux/prctl.h
SIGKILL = 9  # the signal number on Linux, the only system where prctl exists
USAGE = "usage: python -m ppfs.engines.pdeathsig [--peak-rss FILE] PROGRAM [ARGS...]\n"


def _die_with_parent() -> bool:
    """Arm SIGKILL for when the parent dies; False if it died before that."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own clean-up still applies
    return os.getppid() == parent


def _exec(argv: list[str]) -> None:
    os.execv(argv[0], argv)  # noqa: S606 -- an argv list, no shell: the point of this module


def main(argv: list[str]) -> int:
    peak_file: str | None = None
    if argv[:1] == ["--peak-rss"]:
        if len(argv) < 2:
            sys.stderr.write(USAGE)
            return 2
        peak_file, argv = argv[1], argv[2:]
    if not argv:
        sys.stderr.write(USAGE)
        return 2
    if not _die_with_parent():
        return 1
    if peak_file is None:
        _exec(argv)
        return 1  # not reached
    child = os.fork()
    if child == 0:  # PROG, dying with this process
        try:
            if _die_with_parent():
                _exec(argv)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(child, 0)
    with open(peak_file, "w") as fh:
        fh.write(f"{usage.ru_maxrss * 1024}\n")  # Linux reports KiB
    if os.WIFSIGNALED(status):
        import contextlib
        import signal

        sig = os.WTERMSIG(status)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's cannot be set
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # only if the signal did not end this process
    return os.waitstatus_to_exitcode(status)


def command() -> list[str]:
    """The launcher's argv prefix: this file run by the current interpreter in
    isolated mode without ``site`` (-I -S). It imports only the standard library, so
    it starts in about a quarter of the time ``-m`` takes through site-packages and
    the editable install's finder, once per party and job."""
    return [sys.executable, "-I", "-S", os.path.realpath(__file__)]


def read_peak_rss(path: os.PathLike[str] | str) -> int | None:
    """The figure ``--peak-rss`` wrote, or None if there is none (the launcher was
    killed before its program ended)."""
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
