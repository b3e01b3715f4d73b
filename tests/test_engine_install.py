"""`ppfs engine install mp-spdz`: a release tarball is verified before it is unpacked,
unpacked safely into the user cache, and found by engine discovery from then on."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest
from ppfs_cli.main import main

from ppfs.engines import mpspdz_release, registry

VERSION = "0.4.2"
TOP = f"mp-spdz-{VERSION}"
BINARIES = ("replicated-ring-party.x", "sy-rep-ring-party.x", "rep4-ring-party.x")
REAL = Path("/opt/mp-spdz")


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No MPSPDZ_HOME, no /opt/mp-spdz: only what is installed into this cache counts."""
    monkeypatch.delenv("MPSPDZ_HOME", raising=False)
    monkeypatch.setattr(registry, "SYSTEM_MPSPDZ_HOME", tmp_path / "no-system-mp-spdz")
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "ppfs" / "mp-spdz"


def _tarball(path: Path, files: dict[str, bytes | Path], extra: Any = None) -> str:
    """A tar.xz with the release layout; returns its SHA-256."""
    with tarfile.open(path, "w:xz") as tar:
        for rel, content in files.items():
            name = f"{TOP}/{rel}"
            if isinstance(content, Path):
                tar.add(content, arcname=name)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755 if rel.endswith(".x") else 0o644
            tar.addfile(info, io.BytesIO(content))
        if extra:
            extra(tar)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fake_release(tmp_path: Path, extra: Any = None) -> tuple[Path, str]:
    files: dict[str, bytes | Path] = {
        "compile.py": b"print('compile')\n",
        "Compiler/__init__.py": b"",
        "README.md": b"MP-SPDZ\n",
    }
    for b in BINARIES:
        files[f"bin/Linux-amd64/{b}"] = b"#!/bin/sh\nexit 0\n"
    archive = tmp_path / f"mp-spdz-{VERSION}.tar.xz"
    return archive, _tarball(archive, files, extra)


def _install(capsys: Any, *args: str) -> tuple[int, str]:
    rc = main(["engine", "install", "mp-spdz", "--version", VERSION, *args])
    return rc, capsys.readouterr().err


def test_wrong_hash_refused_right_hash_installs_and_is_found(
    tmp_path: Path, isolated: Path, capsys: Any
) -> None:
    archive, digest = _fake_release(tmp_path)
    rc, err = _install(capsys, "--from", str(archive), "--sha256", "0" * 64)
    assert rc == 2 and "SHA-256 mismatch" in err and "Refusing" in err
    assert not (isolated / VERSION).exists()

    rc, err = _install(capsys, "--from", str(archive), "--sha256", digest)
    assert rc == 0, err
    home = isolated / VERSION
    assert (home / "compile.py").is_file() and (home / "README.md").is_file()
    binary = home / "bin" / "Linux-amd64" / "rep4-ring-party.x"
    assert os.access(binary, os.X_OK)
    assert registry.mpspdz_home() == home
    assert registry.default_engine_name("passive-3pc") == "mp-spdz"

    main(["engine", "status", "--json"])
    status = json.loads(capsys.readouterr().out)
    assert status["mp-spdz"]["usable"] and status["mp-spdz"]["home"] == str(home)
    assert status["default"] == "mp-spdz"
    assert "active-4pc" in status["mp-spdz"]["securities"]


def test_without_a_hash_install_refuses_and_says_how(
    tmp_path: Path, isolated: Path, capsys: Any
) -> None:
    assert VERSION not in mpspdz_release.PINNED_SHA256
    archive, _ = _fake_release(tmp_path)
    rc, err = _install(capsys, "--from", str(archive))
    assert rc == 2
    assert "no SHA-256 is pinned for MP-SPDZ 0.4.2" in err
    assert "--sha256" in err and "releases/tag/v0.4.2" in err and "sha256sum" in err
    assert not isolated.exists() or not any(isolated.iterdir())


def test_status_says_why_mp_spdz_is_not_usable(isolated: Path, capsys: Any) -> None:
    assert main(["engine", "status"]) == 0
    out = capsys.readouterr().out
    assert "mp-spdz: not usable" in out and "ppfs engine install mp-spdz" in out
    assert "mpyc: usable" in out and "default engine: mpyc" in out


def _traversal(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo(f"{TOP}/../../escaped")
    info.size = 1
    tar.addfile(info, io.BytesIO(b"x"))


def _link_out(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo(f"{TOP}/Compiler/passwd")
    info.type = tarfile.SYMTYPE
    info.linkname = "../../../etc/passwd"
    tar.addfile(info)


def _abs_link(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo(f"{TOP}/bin/x")
    info.type = tarfile.SYMTYPE
    info.linkname = "/etc"
    tar.addfile(info)


@pytest.mark.parametrize("extra, message", [
    (_traversal, "is outside mp-spdz-0.4.2/"),
    (_link_out, "leads out of the release"),
    (_abs_link, "leads out of the release"),
])
def test_unsafe_members_are_refused(
    tmp_path: Path, isolated: Path, capsys: Any, extra: Any, message: str
) -> None:
    archive, digest = _fake_release(tmp_path, extra)
    rc, err = _install(capsys, "--from", str(archive), "--sha256", digest)
    assert rc == 2 and message in err, err
    assert not (isolated / VERSION).exists()
    assert not (tmp_path / "escaped").exists() and not (isolated.parent / "escaped").exists()
    assert [p.name for p in isolated.iterdir()] == []  # no staging left behind


def test_select_runs_on_an_installed_release(
    tmp_path: Path, isolated: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release-layout tarball made from the real build: select then runs on MP-SPDZ."""
    if not all((REAL / f).exists() for f in ("compile.py", "Compiler", *BINARIES)):
        pytest.skip(f"no MP-SPDZ build at {REAL} (compile.py, Compiler/, {', '.join(BINARIES)})")
    import numpy as np

    from ppfs import oracle
    from ppfs.synthetic import make_table

    # compiled programs are keyed by the compiler's sources: reuse the usual cache
    monkeypatch.setenv("PPFS_MPSPDZ_CACHE", str(Path.home() / ".cache" / "ppfs" / "mpspdz"))
    compiler = tmp_path / "Compiler"
    shutil.copytree(REAL / "Compiler", compiler,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    files: dict[str, bytes | Path] = {"compile.py": REAL / "compile.py", "Compiler": compiler}
    for b in BINARIES:
        files[f"bin/Linux-amd64/{b}"] = REAL / b
    if (REAL / "libSPDZ.so").is_file():  # a local build links it; release binaries are static
        files["libSPDZ.so"] = REAL / "libSPDZ.so"
    archive = tmp_path / f"mp-spdz-{VERSION}.tar.xz"
    digest = _tarball(archive, files)
    rc, err = _install(capsys, "--from", str(archive), "--sha256", digest)
    assert rc == 0, err

    t = make_table(40, 5, seed=3)
    csv = tmp_path / "d.csv"
    with open(csv, "w") as fh:
        fh.write(",".join([*t.columns, "y"]) + "\n")
        for row, cls in zip(t.x, t.y, strict=True):
            fh.write(",".join([*(repr(float(v)) for v in row), str(int(cls))]) + "\n")
    rc = main(["select", str(csv), "--label", "y", "--k", "2", "--json"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    res = json.loads(captured.out)
    assert res["engine"] == "mp-spdz"
    assert f"found at {isolated / VERSION}" in captured.err
    want = oracle.ms_gini_top_k(t.x, t.y, t.n_classes, 2)
    assert res["selected"] == [t.columns[int(j)] for j in np.asarray(want)]
