"""What the deployments expose, and to whom, against docs/threat-model.md.

Static checks of the deployment files (no Docker, no Terraform, no Azure): the compose
files parsed as YAML, the Terraform module parsed with python-hcl2, plus the gateway's
refusal to serve bearer tokens over plain HTTP where it must not.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TERRAFORM = ROOT / "deploy" / "terraform-azure"


# ---- the gateway: no plain HTTP where HTTPS is required ---------------------------------


def _gateway_folder(root: Path, https: bool) -> Path:
    root.mkdir()
    config: dict[str, Any] = {
        "state_dir": str(root / "state"),
        "parties": [{"address": f"127.0.0.1:{5000 + i}", "tls_server_name": n}
                    for i, n in enumerate(("alice", "bob", "carol"))],
        "tls": {"ca_cert": "ca.pem", "client_cert": "gateway.pem",
                "client_key": "gateway.key"},
        "tokens": [{"token": "t" * 43, "role": "admin", "subject": "admin"}],
    }
    if https:
        config |= {"https_cert": "https.pem", "https_key": "https.key"}
    path = root / "gateway.json"
    path.write_text(json.dumps(config))
    return path


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppfs_cli", "gateway", "serve", *args,
                           "--port", "0"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, check=False)


def test_require_https_refuses_a_plain_http_gateway(tmp_path: Path) -> None:
    plain = _gateway_folder(tmp_path / "plain", https=False)
    r = _serve("--config", str(plain), "--require-https")
    assert r.returncode == 2, r.stderr
    assert "--require-https" in r.stderr and "https_cert" in r.stderr
    assert "t" * 43 not in r.stderr + r.stdout  # the token is never echoed
    assert not (tmp_path / "plain" / "state").exists()  # refused before anything is made
    # with a certificate named it goes on (here to the missing keys: nothing was made)
    https = _gateway_folder(tmp_path / "https", https=True)
    r = _serve("--config", str(https), "--require-https")
    assert r.returncode == 2 and "--require-https" not in r.stderr, r.stderr
    assert "no private key" in r.stderr


def test_azure_gateway_requires_https() -> None:
    compute = (TERRAFORM / "main.compute.tf").read_text()
    gateway = compute[compute.index("gateway_cloud_init"):]
    command = gateway[gateway.index("command = "):].splitlines()[0]
    assert "gateway serve" in command and "--require-https" in command, command
