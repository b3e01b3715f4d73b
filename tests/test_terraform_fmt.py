"""deploy/terraform-azure is formatted as `terraform fmt` writes it (where Terraform runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[1] / "deploy" / "terraform-azure"


def test_terraform_fmt_check() -> None:
    terraform = shutil.which("terraform")
    if terraform is None:
        pytest.skip("terraform is not on PATH (the HCL is still checked by test_terraform.py)")
    proc = subprocess.run(
        [terraform, "fmt", "-check", "-recursive", "-diff", str(MODULE)],
        capture_output=True, text=True, timeout=120, check=False,
        # no user CLI configuration is needed for fmt; keep its absence from warning
        env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert proc.returncode == 0, (
        "terraform fmt would change these files (run terraform fmt -recursive "
        f"deploy/terraform-azure):\n{proc.stdout}{proc.stderr[-2000:]}"
    )
