"""Install the MP-SPDZ files the party image needs into /staging/mp-spdz (image build step).

MPSPDZ_SOURCE selects where they come from:

- ``tarball``: the official release ``mp-spdz-<MPSPDZ_VERSION>.tar.xz`` from MPSPDZ_URL,
  checked against MPSPDZ_SHA256 (else the hash ppfs pins for the version) before
  anything is unpacked; its statically linked binaries from ``bin/<MPSPDZ_BIN_DIR>/``.
  Fetching, checking and safe unpacking are ppfs's own release installer
  (``src/ppfs/engines/mpspdz_release.py``, also behind ``ppfs engine install``).
- ``local``: an already-built MP-SPDZ copied into the build context (MPSPDZ_LOCAL_DIR,
  staged by deploy/offline-build/build-images.sh); nothing is built here.
- ``none``: no MP-SPDZ; the image runs the MPyC engine only.

Only the three party binaries, ``libSPDZ.so`` (local builds link it), ``compile.py`` and
``Compiler/`` are installed. Exits non-zero with one clear line on any problem.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

BINARIES = ("replicated-ring-party.x", "sy-rep-ring-party.x", "rep4-ring-party.x")
# fixed paths inside the build container (overridable for the project's tests)
DEST = Path(os.environ.get("MPSPDZ_DEST", "/staging/mp-spdz"))
LOCAL = Path(os.environ.get("MPSPDZ_LOCAL", "/tmp/mpspdz-local"))  # noqa: S108


def fail(message: str) -> None:
    print(f"install_mpspdz: error: {message}", file=sys.stderr)
    raise SystemExit(1)


def release_module() -> ModuleType:
    """ppfs's release installer (stdlib only): next to this file in the image build,
    src/ppfs/engines/ in a checkout."""
    here = Path(__file__).resolve().parent
    for cand in (here / "mpspdz_release.py",
                 here.parents[1] / "src" / "ppfs" / "engines" / "mpspdz_release.py"):
        if cand.is_file():
            spec = importlib.util.spec_from_file_location("mpspdz_release", cand)
            if spec is None or spec.loader is None:
                break
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    fail("mpspdz_release.py (ppfs's release installer) is missing next to this script")
    raise AssertionError  # unreachable


def from_tarball() -> None:
    release = release_module()
    version = os.environ["MPSPDZ_VERSION"]
    url = os.environ.get("MPSPDZ_URL") or None
    given = os.environ.get("MPSPDZ_SHA256", "").strip().lower()
    bin_dir = os.environ.get("MPSPDZ_BIN_DIR", "Linux-amd64")
    if given and not re.fullmatch(r"[0-9a-f]{64}", given):
        fail(
            f"MPSPDZ_SHA256 is not a SHA-256 (got {given!r}): pass --build-arg "
            f"MPSPDZ_SHA256=<hash of mp-spdz-{version}.tar.xz>, verified against the GitHub "
            "release, or build with MPSPDZ_SOURCE=local|none"
        )
    wanted = {f"bin/{bin_dir}/{b}": b for b in BINARIES}
    wanted["compile.py"] = "compile.py"

    def select(rel: str) -> str | None:
        if rel in wanted:
            return wanted[rel]
        return rel if rel == "Compiler" or rel.startswith("Compiler/") else None

    DEST.mkdir(parents=True, exist_ok=True)
    try:
        expected = release.expected_sha256(version, given or None)
        with tempfile.TemporaryDirectory(dir=DEST.parent) as tmp:
            print(f"install_mpspdz: fetching {url or 'the official release'}", file=sys.stderr)
            archive = release.fetch(url, version, Path(tmp))
            release.verify(archive, expected)
            found = release.extract(archive, version, DEST, select)
    except release.ReleaseError as exc:
        fail(f"{exc} (build arguments: MPSPDZ_SHA256, MPSPDZ_URL, MPSPDZ_VERSION)")
    for name in (*BINARIES, "compile.py"):
        if (DEST / name).is_file():
            (DEST / name).chmod(0o755)
    missing = {*BINARIES, "compile.py", "Compiler"} - {f.split("/")[0] for f in found}
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
