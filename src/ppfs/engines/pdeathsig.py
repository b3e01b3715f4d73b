"""Exec a program that dies with its launcher: ``python -m ppfs.engines.pdeathsig PROG ARGS``.

Sets the Linux parent-death signal (SIGKILL) and replaces itself with PROG, so the
engine process is killed when the process that launched it dies, even by SIGKILL:
a killed party daemon leaves no engine behind, and its peers see the link drop.
Done in a separate process because a ``preexec_fn`` (Python code between fork and
exec) is unsafe in a process running gRPC's threads.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m ppfs.engines.pdeathsig PROGRAM [ARGS...]\n")
        return 2
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's own clean-up still applies
    if os.getppid() != parent:  # the launcher died before the signal was armed
        return 1
    os.execv(argv[0], argv)  # noqa: S606 -- an argv list, no shell: the point of this module
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
