"""Is this MP-SPDZ build's active 3PC actively secure? A forged-MAC check, run once per
party binary.

Active 3PC runs MP-SPDZ's SPDZ-wise replicated protocol over Z_2^k
(``sy-rep-ring-party.x``). Its integrity rests on one check: every product and every
value that enters carries a MAC (alpha times the value, shared), and before a value
is opened the parties verify, on a random combination t of everything computed so
far, that t = MAC - alpha * value is zero. Over Z_2^k that zero test is done on t's
bits (``zero_check`` in MP-SPDZ's ``Protocols/SpdzWiseRing.hpp``). In MP-SPDZ 0.4.2
as released, the test combines the opened bits with fresh zero shares instead of the
mask bits and so accepts any t: a party that adds an error to a product, or enters a
value whose MAC it forged, is not caught. ppfs therefore checks the build it is given:
:func:`check_spdzwise` runs ``mac_probe.mpc`` with three local parties whose shares of
a value carry a forged (zero) MAC, and refuses active 3PC unless the build stops the
run at the opening with a failed check. The verdict is kept per SHA-256 of the party
binary, so the probe (about a second) runs once per build.

The probe's shares are written straight into MP-SPDZ's memory file
(:func:`write_spdzwise_memory`), the same way Step 2A's active-3PC inputs enter; its
TLS keys come from a throwaway CA made for the probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import secrets
import shutil
import sys
import uuid
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

import numpy as np

from ppfs.durable import free_ports
from ppfs.engines import pdeathsig
from ppfs.errors import EngineError
from ppfs.pki import CertificateAuthority, hash_link, party_key_and_csr, subject_hash, write_cert

PROBE = "mac_probe"
ACCEPTED_MARKER = b"PPFS-FORGED-MAC-ACCEPTED"
# what MP-SPDZ prints when a check of the SPDZ-wise protocol fails: the replicated
# opening's hash comparison (CheckFor, also the MAC zero test's last step) and the
# generic MAC failure
MAC_FAILURES = (b"check hash mismatch", b"MacCheck Failure")
# MP-SPDZ's user memory starts here (Compiler/config.py USER_MEM): the programs
# assert that the arrays the memory file fills are the first ones allocated
USER_MEM = 8192
# sy-rep-ring's share type as MP-SPDZ names its memory file (Memory-<type>-P<i>)
SPDZWISE_MEMORY_TYPE = "SYMR"
# one SPDZ-wise share over Z_2^(64+40): the replicated value share (two components)
# and the replicated MAC share (two components), each 104 bits in 13 bytes
_COMPONENT_BYTES = 13
SHARE_BYTES = 4 * _COMPONENT_BYTES
PROBE_TIMEOUT = 120.0
SOUND, VOID = "sound", "void"


def party_env(home: Path) -> dict[str, str]:
    """The environment a party binary runs in: MP-SPDZ's own libraries (libSPDZ.so in
    its home) come first; a release or a copied build has no run path to them."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(home), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def failed_a_mac_check(stderr: bytes) -> bool:
    """True when an MP-SPDZ party's stderr says one of its integrity checks failed."""
    return any(needle in stderr for needle in MAC_FAILURES)


def memory_file(workdir: Path, party: int) -> Path:
    return workdir / "Player-Data" / f"Memory-{SPDZWISE_MEMORY_TYPE}-P{party}"


def write_spdzwise_memory(
    path: Path, size: int, pairs: Iterable[tuple[np.ndarray, np.ndarray]]
) -> None:
    """Write MP-SPDZ's memory file (``-m old``) for sy-rep-ring: ``size`` secret words
    from address :data:`USER_MEM`, given as (own, prev) component arrays in order.

    Party i's replicated share of a value is its two components (c_i, c_{i-1}); they
    go in as they are (each 64-bit component zero-extended to 104 bits) with a zero
    MAC share. The zero MAC is not a valid one: the program re-computes every MAC
    from the shares (one multiplication by alpha) before it uses them, and the
    SPDZ-wise check then verifies that multiplication like any other.

    The layout is the one MP-SPDZ writes (Processor/Memory.hpp): per memory, the
    numbers of secret and clear entries as text lines, then the entries; binary
    memory (none), arithmetic memory, integer memory (none), then ``M``.
    """
    written = 0
    with open(path, "wb") as fh:
        fh.write(b"0\n0\n")
        fh.write(f"{USER_MEM + size}\n0\n".encode())
        fh.write(bytes(SHARE_BYTES * USER_MEM))
        for own, prev in pairs:
            own = np.ascontiguousarray(own, dtype="<u8").reshape(-1)
            prev = np.ascontiguousarray(prev, dtype="<u8").reshape(-1)
            if own.shape != prev.shape:
                raise ValueError("a share's two components differ in length")
            step = 1 << 16
            for start in range(0, own.size, step):
                n = min(step, own.size - start)
                rec = np.zeros((n, SHARE_BYTES), dtype=np.uint8)
                rec[:, 0:8] = own[start:start + n].view(np.uint8).reshape(n, 8)
                rec[:, _COMPONENT_BYTES:_COMPONENT_BYTES + 8] = (
                    prev[start:start + n].view(np.uint8).reshape(n, 8))
                fh.write(rec.tobytes())
            written += own.size
        if written != size:
            raise ValueError(f"memory file: {written} shares given, {size} announced")
        fh.write(b"0\n0\nM")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


async def check_spdzwise(home: Path, binary: Path, cache_dir: Path) -> None:
    """Raise :class:`EngineError` unless ``binary`` (sy-rep-ring-party.x) rejects a
    forged MAC. The verdict is cached under ``cache_dir`` per SHA-256 of the binary;
    a probe that ends neither way raises without caching anything."""
    digest = await asyncio.to_thread(_digest, binary)
    verdict_file = cache_dir / "checks" / f"spdzwise-mac-{digest[:32]}"
    try:
        verdict = verdict_file.read_text().strip()
    except OSError:
        verdict = await _probe_once(home, binary, cache_dir, verdict_file)
    if verdict != SOUND:
        raise EngineError(
            f"MP-SPDZ's {binary.name} at {binary.parent} accepts a value whose MAC was "
            "forged: its SPDZ-wise check over Z_2^k (zero_check in "
            "Protocols/SpdzWiseRing.hpp) is void in this build, so active 3PC on it "
            "would not catch a server that alters a product or its share; ppfs refuses "
            "to run active-3pc on it (use a build whose check rejects a forged MAC, "
            "or active-4pc)"
        )


async def _probe_once(home: Path, binary: Path, cache_dir: Path, verdict_file: Path) -> str:
    """The verdict, probed by one caller at a time for the build: parties that share
    ``cache_dir`` (those of one machine, or of one process) and check at once wait for
    the first one's verdict instead of each running three more MP-SPDZ parties at the
    same time. The lock is the kernel's (flock), so none is left by a crash."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(cache_dir / f".{verdict_file.name}.lock",
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:  # polled: a waiter can be cancelled at any time
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.1)
        with contextlib.suppress(OSError):
            return verdict_file.read_text().strip()  # the verdict of the one before
        verdict = await _probe(home, binary, cache_dir)
        verdict_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = verdict_file.with_name(f".{verdict_file.name}.{uuid.uuid4().hex}")
        tmp.write_text(verdict + "\n")
        os.replace(tmp, verdict_file)
        return verdict
    finally:
        os.close(fd)  # and with it the lock


async def _probe(home: Path, binary: Path, cache_dir: Path) -> str:
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".probe-{uuid.uuid4().hex}"
    try:
        return await _run_probe(home, binary, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


async def _run_probe(home: Path, binary: Path, tmp: Path) -> str:
    src = tmp / "Programs" / "Source" / f"{PROBE}.mpc"
    src.parent.mkdir(parents=True)
    src.write_bytes(resources.files("ppfs.engines").joinpath("mpspdz_programs")
                    .joinpath(f"{PROBE}.mpc").read_bytes())
    rc, _, _ = await _run([sys.executable, str(home / "compile.py"), "-E", "sy-rep-ring",
                           str(src.relative_to(tmp))], tmp,
                          {**os.environ, "PYTHONHASHSEED": "0"})
    if rc != 0:
        raise EngineError(f"could not compile MP-SPDZ's forged-MAC check (exit {rc})")
    # a sharing of 3 by fresh components, each party's pair with a zero MAC share
    c0, c1 = secrets.randbits(64), secrets.randbits(64)
    comps = [c0, c1, (3 - c0 - c1) % (1 << 64)]
    ca = CertificateAuthority.create("ppfs MP-SPDZ check CA")
    ports = free_ports(3)
    dirs = []
    for i in range(3):
        d = tmp / f"P{i}"
        pdata = d / "Player-Data"
        pdata.mkdir(parents=True)
        csr = party_key_and_csr(pdata / f"P{i}.key", f"P{i}")
        write_cert(pdata / f"P{i}.pem", ca.issue(csr))
        write_cert(pdata / "ppfs-ca.pem", ca.cert)
        hash_link(pdata, "ppfs-ca.pem", subject_hash(ca.cert))
        (d / "Programs").symlink_to((tmp / "Programs").resolve(), target_is_directory=True)
        (d / "HOSTS").write_text("".join(f"127.0.0.1:{p}\n" for p in ports))
        own = np.array([comps[i]], dtype=np.uint64)
        prev = np.array([comps[(i - 1) % 3]], dtype=np.uint64)
        write_spdzwise_memory(memory_file(d, i), 1, [(own, prev)])
        dirs.append(d)
    runs = await asyncio.gather(*(
        _run([*pdeathsig.command(), "--peak-rss", str((d / "peak-rss").absolute()), str(binary),
              "-p", str(i), "--ip-file-name", "HOSTS", "-m", "old",
              "-o", "no_memory_output", PROBE], d, party_env(home))
        for i, d in enumerate(dirs)
    ))
    if all(rc == 0 for rc, _, _ in runs) and ACCEPTED_MARKER in runs[0][1]:
        return VOID
    if any(rc != 0 and failed_a_mac_check(err) for rc, _, err in runs):
        return SOUND
    codes = ", ".join(str(rc) for rc, _, _ in runs)
    hint = "; a party binary could not start" if any(rc == 127 for rc, _, _ in runs) else ""
    raise EngineError(
        f"could not check MP-SPDZ's {binary.name}: the forged-MAC check ended neither "
        f"way (exit codes {codes}{hint})"
    )


async def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PROBE_TIMEOUT)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        if isinstance(exc, TimeoutError):
            raise EngineError("MP-SPDZ's forged-MAC check timed out") from None
        raise
    return proc.returncode if proc.returncode is not None else -1, out, err
