"""The checked-in generated code must be exactly what the pinned protoc makes of proto/."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_code_matches_proto(tmp_path):
    protos = sorted((ROOT / "proto" / "ppfs" / "v1").glob("*.proto"))
    assert protos
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", str(ROOT / "proto"),
         f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
         *map(str, protos)],
        check=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated, "protoc produced nothing"
    for rel in generated:
        checked_in = ROOT / "src" / rel
        assert checked_in.exists(), f"{rel} is not checked in: run proto/generate.sh"
        assert checked_in.read_bytes() == (tmp_path / rel).read_bytes(), (
            f"{rel} differs from proto/: run proto/generate.sh and commit the result"
        )
