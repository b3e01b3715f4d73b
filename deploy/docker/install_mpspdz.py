"""Install the MP-SPDZ files the party image needs into /staging/mp-spdz (image build step).

MPSPDZ_SOURCE selects where they come from:

- ``tarball``: the official release ``mp-spdz-<MPSPDZ_VERSION>.tar.xz`` from MPSPDZ_URL,
  checked against MPSPDZ_SHA256 before anything is unpacked; its statically linked
  binaries from ``bin/<MPSPDZ_BIN_DIR>/``.
- ``local``: an already-built MP-SPDZ copied into the build context (MPSPDZ_LOCAL_DIR,
  staged by deploy/offline-build/build-images.sh); nothing is built here.
- ``none``: no MP-SPDZ; the image runs the MPyC engine only.

Only the three party binaries, ``libSPDZ.so`` (local builds link it), ``compile.py`` and
``Compiler/`` are installed. Exits non-zero with one clear line on any problem.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

BINARIES = ("replicated-ring-party.x", "sy-rep-ring-party.x", "rep4-ring-party.x")
# fixed paths inside the build container (overridable for the project's tests)
DEST = Path(os.environ.get("MPSPDZ_DEST", "/staging/mp-spdz"))
LOCAL = Path(os.environ.get("MPSPDZ_LOCAL", "/tmp/mpspdz-local"))  # noqa: S108


def fail(message: str) -> None:
    print(f"install_mpspdz: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def from_tarball() -> None:
    version = os.environ["MPSPDZ_VERSION"]
    url = os.environ["MPSPDZ_URL"]
    expected = os.environ.get("MPSPDZ_SHA256", "").strip().lower()
    bin_dir = os.environ.get("MPSPDZ_BIN_DIR", "Linux-amd64")
    if not re.fullmatch(r"[0-9a-f]{64}", expected):
        fail(
            f"MPSPDZ_SHA256 is not a SHA-256 (got {expected!r}): pass --build-arg "
            f"MPSPDZ_SHA256=<hash of mp-spdz-{version}.tar.xz>, verified against the GitHub "
            "release, or build with MPSPDZ_SOURCE=local|none"
        )
    archive = DEST.parent / "mp-spdz-download.tar.xz"
    print(f"install_mpspdz: downloading {url}", file=sys.stderr)
    with urllib.request.urlopen(url, timeout=300) as resp, open(archive, "wb") as out:  # noqa: S310
        shutil.copyfileobj(resp, out, 1 << 20)
    digest = hashlib.sha256()
    with open(archive, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        fail(
            f"SHA-256 mismatch for {url}: got {digest.hexdigest()}, pinned {expected}. "
            "Refusing to install it."
        )
    top = f"mp-spdz-{version}/"
    wanted = {f"{top}bin/{bin_dir}/{b}": b for b in BINARIES}
    wanted[f"{top}compile.py"] = "compile.py"
    DEST.mkdir(parents=True, exist_ok=True)
    found: set[str] = set()
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            rel = None
            if name in wanted and member.isfile():
                rel = wanted[name]
            elif name.startswith(f"{top}Compiler/") and (member.isfile() or member.isdir()):
                rel = name[len(top):]
            if rel is None:
                continue
            target = DEST / rel
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is None:
                continue
            with src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            target.chmod(0o755 if rel in BINARIES or rel == "compile.py" else 0o644)
            found.add(rel.split("/")[0])
    archive.unlink()
    missing = {*BINARIES, "compile.py", "Compiler"} - found
    if missing:
        fail(f"the tarball lacks {sorted(missing)} (layout changed? MPSPDZ_BIN_DIR={bin_dir})")


def from_local() -> None:
    missing = [f for f in (*BINARIES, "compile.py", "Compiler") if not (LOCAL / f).exists()]
    if missing:
        fail(
            f"MPSPDZ_SOURCE=local but {missing} are not in MPSPDZ_LOCAL_DIR; stage an "
            "already-built MP-SPDZ with deploy/offline-build/build-images.sh"
        )
    DEST.mkdir(parents=True, exist_ok=True)
    for name in (*BINARIES, "libSPDZ.so", "compile.py"):
        if (LOCAL / name).exists():
            shutil.copy2(LOCAL / name, DEST / name)
    shutil.copytree(
        LOCAL / "Compiler", DEST / "Compiler", ignore=shutil.ignore_patterns("__pycache__")
    )


def main() -> None:
    source = os.environ.get("MPSPDZ_SOURCE", "")
    DEST.mkdir(parents=True, exist_ok=True)
    if source == "tarball":
        from_tarball()
    elif source == "local":
        from_local()
    elif source == "none":
        (DEST / "NOT-INSTALLED").write_text("image built with MPSPDZ_SOURCE=none: MPyC only\n")
    else:
        fail(f"MPSPDZ_SOURCE must be tarball, local or none, not {source!r}")
    print(f"install_mpspdz: MPSPDZ_SOURCE={source} installed {sorted(os.listdir(DEST))}")


if __name__ == "__main__":
    main()
