"""Installing an official MP-SPDZ release tarball, ``mp-spdz-<V>.tar.xz``.

Used by ``ppfs engine install mp-spdz`` (into the user cache, where engine discovery
finds it) and by the party image's build step (``deploy/docker/install_mpspdz.py``).
Standard library only, so the image's build stage can use this file before ppfs is
installed.

Nothing is unpacked before the archive's SHA-256 matches the hash given by the user
or pinned here for the version. Unpacking is member by member: only regular files,
directories and links that stay inside the release's top directory
``mp-spdz-<V>/``; absolute paths, ``..``, devices and links leading out are refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path, PurePosixPath

DEFAULT_VERSION = "0.4.2"
RELEASE_URL = "https://github.com/data61/MP-SPDZ/releases/download/v{v}/mp-spdz-{v}.tar.xz"
RELEASE_PAGE = "https://github.com/data61/MP-SPDZ/releases/tag/v{v}"
# SHA-256 of mp-spdz-<V>.tar.xz per version, filled in once verified against the
# official release. None is known yet: an install then needs --sha256.
PINNED_SHA256: dict[str, str] = {}
PARTY_BINARIES = ("replicated-ring-party.x", "sy-rep-ring-party.x", "rep4-ring-party.x")
# Where a release keeps its statically linked binaries, best first for this CPU.
BIN_DIRS = ("Linux-adx", "Linux-amd64")
INSTALLED_MARK = ".ppfs-installed"
_CHUNK = 1 << 20


class ReleaseError(Exception):
    """A release could not be fetched, verified or installed; the message says why."""


def archive_name(version: str) -> str:
    return f"mp-spdz-{version}.tar.xz"


def install_root() -> Path:
    """Where ``ppfs engine install`` puts releases: ``$XDG_CACHE_HOME/ppfs/mp-spdz``,
    else ``~/.cache/ppfs/mp-spdz`` (one directory per version)."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ppfs" / "mp-spdz"


def installed_homes(root: Path | None = None) -> list[Path]:
    """Completely installed releases under ``root``, newest version first."""
    root = root or install_root()
    if not root.is_dir():
        return []
    homes = [d for d in root.iterdir() if (d / INSTALLED_MARK).is_file()]

    def key(d: Path) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", d.name))

    return sorted(homes, key=key, reverse=True)


def cpu_bin_dirs() -> tuple[str, ...]:
    """bin/ subdirectories this CPU runs: Linux-adx needs the ADX and BMI2 extensions."""
    try:
        flags = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        flags = ""
    fast = re.search(r"\badx\b", flags) and re.search(r"\bbmi2\b", flags)
    return BIN_DIRS if fast else BIN_DIRS[1:]


def expected_sha256(version: str, given: str | None) -> str:
    """The hash to check: the one given (64 hex digits), else the pinned one."""
    if given:
        h = given.strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", h):
            raise ReleaseError(f"--sha256 must be 64 hexadecimal digits, got {given[:80]!r}")
        return h
    pinned = PINNED_SHA256.get(version)
    if pinned:
        return pinned
    raise ReleaseError(
        f"no SHA-256 is pinned for MP-SPDZ {version} in this ppfs, and none was given. "
        f"Download {archive_name(version)} from {RELEASE_PAGE.format(v=version)}, compare "
        f"`sha256sum {archive_name(version)}` with the release page, then run: ppfs engine "
        f"install mp-spdz --version {version} --from {archive_name(version)} --sha256 <hash>"
    )


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch(source: str | None, version: str, into: Path) -> Path:
    """The release archive: a local file as is, else downloaded (the official URL by
    default, or an http(s)/file URL) into ``into``."""
    if source and "://" not in source:
        path = Path(source).expanduser()
        if not path.is_file():
            raise ReleaseError(f"{source}: no such file")
        return path
    # imported here, not at the top: `ppfs select` finds MP-SPDZ through this module and
    # downloads nothing
    import urllib.parse
    import urllib.request

    url = source or RELEASE_URL.format(v=version)
    scheme = urllib.parse.urlsplit(url).scheme
    if scheme not in ("https", "http", "file"):
        raise ReleaseError(f"{url}: only https, http and file URLs are fetched")
    target = into / archive_name(version)
    try:
        with urllib.request.urlopen(url, timeout=300) as resp, open(target, "wb") as out:  # noqa: S310
            shutil.copyfileobj(resp, out, _CHUNK)
    except OSError as exc:
        raise ReleaseError(f"cannot download {url}: {exc}") from None
    return target


def verify(archive: Path, expected: str) -> None:
    got = sha256_file(archive)
    if got != expected:
        raise ReleaseError(
            f"SHA-256 mismatch for {archive.name}: got {got}, expected {expected}. "
            "Refusing to install it."
        )


def _inside(rel: PurePosixPath) -> bool:
    return not rel.is_absolute() and ".." not in rel.parts


def extract(
    archive: Path, version: str, dest: Path, select: Callable[[str], str | None] | None = None
) -> set[str]:
    """Unpack the release's members into ``dest``; returns the paths written (relative).

    ``select(rel)`` maps a member's path below ``mp-spdz-<V>/`` to its path below
    ``dest``, or None to skip it (default: everything, same layout). Refuses any member
    outside the top directory and any link leading out of it.
    """
    import tarfile  # here, as urllib in fetch: only an install unpacks anything

    top = f"mp-spdz-{version}"
    written: set[str] = set()
    hardlinks: list[tuple[str, str]] = []
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./").rstrip("/")
                path = PurePosixPath(name)
                if name == top:
                    continue
                if not _inside(path) or not path.parts or path.parts[0] != top:
                    raise ReleaseError(f"{archive.name}: member {member.name!r} is outside {top}/")
                rel = PurePosixPath(*path.parts[1:]).as_posix()
                out_rel = select(rel) if select else rel
                if out_rel is None:
                    continue
                if not _inside(PurePosixPath(out_rel)):
                    raise ReleaseError(f"refusing to write {out_rel!r} outside {dest}")
                target = dest / out_rel
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if member.issym():
                    link = PurePosixPath(member.linkname)
                    resolved = PurePosixPath(os.path.normpath(PurePosixPath(rel).parent / link))
                    if link.is_absolute() or not _inside(resolved) or select is not None:
                        raise ReleaseError(
                            f"{archive.name}: link {member.name!r} -> {member.linkname!r} "
                            "leads out of the release"
                        )
                    target.symlink_to(link)
                    written.add(out_rel)
                    continue
                if member.islnk():
                    link = PurePosixPath(member.linkname.removeprefix("./"))
                    if not _inside(link) or not link.parts or link.parts[0] != top:
                        raise ReleaseError(
                            f"{archive.name}: hard link {member.name!r} -> {member.linkname!r} "
                            "leads out of the release"
                        )
                    src_rel = PurePosixPath(*link.parts[1:]).as_posix()
                    hardlinks.append((src_rel, out_rel))
                    continue
                if not member.isfile():
                    raise ReleaseError(
                        f"{archive.name}: member {member.name!r} is not a file, directory or link"
                    )
                src = tar.extractfile(member)
                if src is None:
                    continue
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
                target.chmod(0o755 if member.mode & 0o111 else 0o644)
                written.add(out_rel)
    except tarfile.TarError as exc:
        raise ReleaseError(f"{archive.name} is not a readable tar archive ({exc})") from None
    for src_rel, out_rel in hardlinks:
        mapped = select(src_rel) if select else src_rel
        if mapped is None or mapped not in written:
            raise ReleaseError(f"{archive.name}: hard link to {src_rel!r}, which is not unpacked")
        shutil.copy2(dest / mapped, dest / out_rel)
        written.add(out_rel)
    return written


def check_layout(home: Path) -> None:
    """compile.py, Compiler/ and at least one party binary, top level or under bin/."""
    missing = [n for n in ("compile.py", "Compiler") if not (home / n).exists()]
    binaries = [
        b for b in PARTY_BINARIES
        if (home / b).is_file() or any((home / "bin" / d / b).is_file() for d in BIN_DIRS)
    ]  # fmt: skip
    if missing or not binaries:
        what = missing + ([] if binaries else [f"bin/{BIN_DIRS[-1]}/<party binaries>"])
        raise ReleaseError(f"the release lacks {', '.join(what)} (not an MP-SPDZ release?)")


def install(
    version: str,
    source: str | None = None,
    sha256: str | None = None,
    root: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Fetch (or take) ``mp-spdz-<version>.tar.xz``, verify, unpack into ``root/<version>``
    (replacing an earlier install of that version only once the new one is complete)."""
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._-]*", version):
        raise ReleaseError(f"not a release version: {version!r}")
    expected = expected_sha256(version, sha256)
    root = root or install_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=root) as tmp:
        if log:
            log(f"fetching {source or RELEASE_URL.format(v=version)}")
        archive = fetch(source, version, Path(tmp))
        verify(archive, expected)
        if log:
            log(f"SHA-256 verified ({expected}); unpacking")
        staging = root / f".tmp-{uuid.uuid4().hex}"
        try:
            extract(archive, version, staging)
            check_layout(staging)
            (staging / INSTALLED_MARK).write_text(f"{archive_name(version)} sha256 {expected}\n")
            final = root / version
            old = root / f".old-{uuid.uuid4().hex}"
            if final.exists():
                final.rename(old)
            staging.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final
