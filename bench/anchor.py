"""The paper's protocols written literally (the performance reference), run beside ppfs.

The reference program lives outside this repository (``$PPFS_ANCHOR``, else
``shared/anchor`` in the nearest directory above the checkout that has one):
``paper_fs.mpc`` and its runner ``run_mpc.py``, which compiles the program into
the MP-SPDZ home (before it starts the clock) and runs all parties on this
machine. It is only run from there, never copied.

Input: ``rand`` (default) makes the data inside MPC (random values of the data
set's shape; the reference's author states the timing does not depend on it), so
no input file is written into the shared MP-SPDZ home, where another run might be
reading one; ``file`` uses whatever ``Player-Data/Input-P0-0`` holds there.

Figures, per run: ``engine_seconds`` = launch of the parties to the exit of the last
one (the reference's ``wall_s``; compiling is done before), ``bytes`` = MP-SPDZ's
"Global data sent" (all parties), ``rounds`` = party 0's round count (the reference
runs its parties without ``-v``, so only party 0 reports one).
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ppfs.engines.registry import mpspdz_home
from ppfs.step2a import Security

PROTO = {
    Security.PASSIVE_3PC: "rep3",
    Security.ACTIVE_3PC: "sy",
    Security.ACTIVE_4PC: "rep4",
}


def anchor_dir() -> Path:
    env = os.environ.get("PPFS_ANCHOR")
    if env:
        return Path(env)
    # ../shared/anchor beside the checkout (a worktree may sit one level deeper)
    repo = Path(__file__).resolve().parents[1]
    for base in repo.parents:
        if (base / "shared" / "anchor").is_dir():
            return base / "shared" / "anchor"
    return repo.parent / "shared" / "anchor"


def unavailable_reason() -> str | None:
    d = anchor_dir()
    if not (d / "run_mpc.py").is_file() or not (d / "paper_fs.mpc").is_file():
        return f"the paper's reference program is not at {d} (set PPFS_ANCHOR)"
    home = mpspdz_home()
    if not (home / "Player-Data" / "P3.pem").is_file():
        return f"{home}/Player-Data has no TLS keys for 4 parties (Scripts/setup-ssl.sh 4)"
    return None


@dataclass
class AnchorRun:
    engine_seconds: float
    bytes: int
    rounds: int  # party 0
    selected: list[int] | None


def _free_port_block(n: int) -> int:
    """A base port with n consecutive free ports above it (the reference uses -pn)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - n)  # not a secret: a port number
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports found")


def run_anchor(security: Security, m: int, p: int, k: int, *, data: str = "rand",
               timeout: int = 1800) -> AnchorRun:
    proto = PROTO[security]
    with tempfile.TemporaryDirectory(prefix="ppfs-anchor-") as logdir:
        cmd = [sys.executable, str(anchor_dir() / "run_mpc.py"), "--proto", proto,
               "--m", str(m), "--p", str(p), "--k", str(k), "--data", data,
               "--port", str(_free_port_block(security.parties)),
               "--timeout", str(timeout), "--logdir", logdir]
        env = {**os.environ, "MPSPDZ_HOME": str(mpspdz_home())}
        r = subprocess.run(cmd, capture_output=True, text=True, env=env,
                           timeout=timeout + 3600, check=False)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode or not lines:
        raise RuntimeError(f"the reference run failed (exit {r.returncode}): "
                           f"{(r.stdout + r.stderr)[-500:]}")
    res = json.loads(lines[-1])
    if res.get("timed_out") or any(rc != 0 for rc in res.get("rcs", [])):
        raise RuntimeError(f"the reference run failed: exit codes {res.get('rcs')}")
    return AnchorRun(
        engine_seconds=float(res["wall_s"]),
        bytes=int(float(res.get("global_MB") or 0) * 1e6),
        rounds=int(res.get("rounds") or 0),
        selected=res.get("selected"),
    )
