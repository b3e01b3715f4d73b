"""What the deployments expose, and to whom, against docs/threat-model.md.

Without Docker, Terraform or Azure: the compose files parsed as YAML (networks, published
ports, container confinement), the Terraform module and its README (HTTPS only, host keys
pinned outside the gateway's VM, one administrator per party VM, nothing secret in
custom_data), and the pieces they run: the gateway's refusal of plain HTTP, the health
check's address, make-secrets for separate hosts, the party entrypoint's keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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


# ---- compose: who reaches which port ------------------------------------------------------


def _merge(base: Any, over: Any) -> Any:
    """A compose overlay over its base, as Compose merges mappings."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], over[k]) if k in base and k in over else
                over.get(k, base.get(k)) for k in {**base, **over}}
    return over


def _compose(which: str) -> dict[str, Any]:
    cfg = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    if which == "4pc":
        cfg = _merge(cfg, yaml.safe_load((ROOT / "compose.4pc.yml").read_text()))
    return cfg


PARTIES = {"3pc": ("alice", "bob", "carol"), "4pc": ("alice", "bob", "carol", "dave")}


def _flag(command: list[str], flag: str) -> str:
    assert command.count(flag) == 1, (flag, command)
    return command[command.index(flag) + 1]


@pytest.mark.parametrize("which", sorted(PARTIES))
def test_compose_networks_confine_each_port(which: str) -> None:
    cfg = _compose(which)
    services, networks = cfg["services"], cfg["networks"]
    parties = PARTIES[which]
    gateway = services["gateway"]
    # the gateway: its front network for its published port, and one control network per
    # party; never the parties' engine network
    assert set(gateway["networks"]) == {"front", *(f"{p}-control" for p in parties)}
    members: dict[str, set[str]] = {}
    for name, svc in services.items():
        for net in svc["networks"]:
            members.setdefault(net, set()).add(name)
    assert members["mpc"] == set(parties)  # engine links: between the parties only
    assert members["front"] == {"gateway"}
    for party in parties:
        svc = services[party]
        control = f"{party}-control"
        assert set(svc["networks"]) == {"mpc", control}
        assert members[control] == {party, "gateway"}  # no other party on it
        assert networks[control].get("internal") is True  # nothing on it leaves the host
        ctl_ip = svc["networks"][control]["ipv4_address"]
        mpc_ip = svc["networks"]["mpc"]["ipv4_address"]
        cmd = svc["command"]
        # gRPC and metrics on the control network's address alone: the gateway's side
        assert _flag(cmd, "--listen") == f"{ctl_ip}:50051"
        assert _flag(cmd, "--metrics-listen") == f"{ctl_ip}:9100"
        assert svc["environment"]["PPFS_GRPC_HOST"] == ctl_ip  # its health check follows
        # the engines on the parties' network (MPyC listens there only)
        assert _flag(cmd, "--mpc-host") == mpc_ip
        assert _flag(cmd, "--mpc-bind-host") == mpc_ip


@pytest.mark.parametrize("which", sorted(PARTIES))
def test_compose_publishes_only_the_gateway_and_mpc_ports_on_loopback(which: str) -> None:
    cfg = _compose(which)
    for name, svc in cfg["services"].items():
        ports = [str(p) for p in svc.get("ports", [])]
        if name == "gateway":
            assert ports == ["${PPFS_GATEWAY_BIND:-127.0.0.1}:${PPFS_GATEWAY_PORT:-8080}:8080"]
        else:
            index = PARTIES[which].index(name)
            lo, hi = 14000 + 4 * index, 14003 + 4 * index
            assert ports == [f"${{PPFS_MPC_BIND:-127.0.0.1}}:{lo}-{hi}:{lo}-{hi}"]
        assert "network_mode" not in svc and "pid" not in svc and "ipc" not in svc


@pytest.mark.parametrize("which", sorted(PARTIES))
def test_compose_containers_are_confined(which: str) -> None:
    cfg = _compose(which)
    for name, svc in cfg["services"].items():
        assert svc.get("read_only") is True, name
        assert svc.get("cap_drop") == ["ALL"] and "cap_add" not in svc, name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert not svc.get("privileged") and "user" not in svc, name  # the image's non-root
        assert svc.get("restart") == "unless-stopped", name
        assert svc["healthcheck"]["test"][0] == "CMD", name
        # state on a named volume of its own; its own secret folder, read at run time only
        assert svc["volumes"] == [f"{name}-state:/var/lib/ppfs/state"], name
        assert [s["source"] for s in svc["secrets"]] == [name], name
        # nothing secret in `docker inspect`: no token, key or password in the environment
        for var in svc.get("environment", {}):
            assert not any(w in var for w in ("TOKEN", "PASSWORD", "_KEY")), (name, var)


def test_health_check_dials_the_address_the_party_listens_on(tmp_path: Path) -> None:
    """A party listening on one network's address only is healthy: the check dials
    $PPFS_GRPC_HOST, not loopback."""
    import os
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.2:0")
    server.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PPFS_")}
        env |= {"PPFS_HEALTH_ROLE": "party", "PPFS_GRPC_PORT": str(port)}
        check = [sys.executable, str(ROOT / "deploy" / "docker" / "healthcheck.py")]
        ok = subprocess.run(check, env={**env, "PPFS_GRPC_HOST": "127.0.0.2"},
                            capture_output=True, text=True, timeout=30, check=False)
        assert ok.returncode == 0 and ok.stdout.strip() == "SERVING", ok.stdout
        loopback = subprocess.run(check, env=env, capture_output=True, text=True,
                                  timeout=30, check=False)
        assert loopback.returncode == 1, loopback.stdout  # 127.0.0.1: nobody listens there
    finally:
        server.stop(0)


# ---- Azure: key requests fetched only over pinned SSH -------------------------------------


def test_azure_vms_show_their_host_keys_outside_the_gateway() -> None:
    """SSH to a party jumps through the gateway's VM, which is not trusted: the party's
    key request must come over a connection checked against host keys learnt elsewhere
    (the VM's serial console, through the Azure API), or the gateway could answer in the
    party's name with a key request for its own keys."""
    hcl2 = pytest.importorskip("hcl2")
    with open(TERRAFORM / "main.compute.tf", encoding="utf-8") as fh:
        resources = hcl2.load(fh)["resource"]
    vms = {name.strip('"'): body for block in resources for rtype, named in block.items()
           if rtype.strip('"') == "azurerm_linux_virtual_machine"
           for name, body in named.items()}
    assert set(vms) == {"party", "gateway"}
    for name, vm in vms.items():
        blocks = vm.get("boot_diagnostics") or []
        # one block, no storage account named: managed storage, on
        assert len(blocks) == 1 and "storage_account_uri" not in blocks[0], name
    cloud_init = yaml.safe_load((TERRAFORM / "templates" / "cloud-init.yaml.tftpl").read_text())
    assert cloud_init["ssh"]["emit_keys_to_console"] is True
    assert cloud_init["no_ssh_fingerprints"] is False


def test_azure_steps_fetch_requests_only_over_pinned_host_keys() -> None:
    readme = (TERRAFORM / "README.md").read_text()
    steps = readme[readme.index("```sh"):]
    steps = steps[:steps.index("\n```\n")]
    assert "az vm boot-diagnostics get-boot-log" in steps
    assert "PINNED=(-o StrictHostKeyChecking=yes -o UserKnownHostsFile=.ppfs/known_hosts)" in steps
    ssh_lines = [ln.strip() for ln in steps.splitlines()
                 if ln.strip().startswith("ssh ") or "=\"ssh " in ln]
    assert len(ssh_lines) >= 3, ssh_lines  # the jump, each party, the gateway
    for line in ssh_lines:
        assert "PINNED" in line and " -J " not in line, line


# ---- make-secrets for machines of their own: no party or gateway key made here ------------


def test_make_secrets_for_separate_hosts_makes_and_certifies_no_party_or_gateway_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --no-party-keys --no-gateway-keys the operator's machine makes no key for a
    party or the gateway, not even one thrown away afterwards: a CA-certified key
    statement for Alice's name with keys the operator's disk once held would let whoever
    recovers it pose as Alice to every client."""
    import runpy

    import ppfs_party.keys
    import ppfs_party.state

    import ppfs.pki

    def never(*_: Any, **__: Any) -> None:
        raise AssertionError("a party or gateway key made on the operator's machine")

    monkeypatch.setattr(ppfs_party.keys, "sign_party_requests", never)
    monkeypatch.setattr(ppfs_party.state, "open_state", never)
    monkeypatch.setattr(ppfs.pki, "issue_client_identity", never)
    out = tmp_path / "secrets"
    monkeypatch.setattr(sys, "argv", [
        "make_secrets.py", "--out", str(out), "--parties", "4", "--no-party-keys",
        "--no-gateway-keys", "--https-name", "gw.example",
        *(a for i in range(4) for a in ("--party-host", f"10.0.0.{i + 1}"))])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "deploy" / "compose" / "make_secrets.py"),
                       run_name="__main__")
    assert done.value.code == 0
    assert not (out / ".work").exists()
    for party in ("alice", "bob", "carol", "dave"):
        assert sorted(p.name for p in (out / party).iterdir()) == ["owners.json"]
    assert sorted(p.name for p in (out / "gateway" / "tls").iterdir()) == ["ca.pem"]
    # the private keys left are the CA's and the example principals', nothing else
    keyed = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and b"PRIVATE" in p.read_bytes())
    assert [k for k in keyed if not k.startswith("clients/")] == ["ca/ca.key"], keyed


def test_azure_party_vms_can_each_have_their_own_administrator() -> None:
    """Root on a party's VM reads that party's keys: one SSH key for every VM makes its
    holder every party. Each party VM takes its own administrator's key when given."""
    compute = (TERRAFORM / "main.compute.tf").read_text()
    party = compute[compute.index('resource "azurerm_linux_virtual_machine" "party"'):]
    party = party[:party.index("\n}\n")]
    assert ("public_key = lookup(var.party_admin_ssh_public_keys, each.key, "
            "var.admin_ssh_public_key)") in party
    assert "var.admin_ssh_public_key\n" not in party  # no unconditional shared key
    variables = (TERRAFORM / "variables.tf").read_text()
    assert 'variable "party_admin_ssh_public_keys"' in variables
    for example in ("three-party", "four-party"):
        main = (TERRAFORM / "examples" / example / "main.tf").read_text()
        assert "party_admin_ssh_public_keys = var.party_admin_ssh_public_keys" in main
    assert "party_admin_ssh_public_keys" in (TERRAFORM / "README.md").read_text()


def test_compose_example_keeps_a_plain_http_gateway_on_loopback() -> None:
    env = dict(line.split("=", 1) for line in (ROOT / "deploy" / "compose" / "example.env")
               .read_text().splitlines() if line and not line.startswith("#"))
    assert env["PPFS_GATEWAY_BIND"] == "127.0.0.1"
    assert env.get("PPFS_MPC_BIND", "127.0.0.1") == "127.0.0.1"


def test_nothing_secret_goes_into_custom_data_or_the_container_environment() -> None:
    """custom_data is in the Terraform state and readable by anyone who can read the VM;
    `-e` values are in `docker inspect`. Both carry names, addresses and flags only: every
    secret reaches a VM through its own Key Vault secret, at run time."""
    import re

    compute = (TERRAFORM / "main.compute.tf").read_text()
    calls = re.findall(r'templatefile\("\$\{path\.module\}/templates/cloud-init\.yaml\.tftpl", '
                       r"\{(.*?)\n\s*\}\)", compute, flags=re.S)
    assert len(calls) == 2, calls  # the parties' and the gateway's
    allowed = {"role", "name", "image", "secret_name", "key_vault_uri", "acr_login_server",
               "docker_args", "command"}
    for body in calls:
        keys = set(re.findall(r"^\s*([a-z_]+)\s*=", body, flags=re.M))
        assert keys == allowed, keys
        env = re.findall(r"-e ([A-Z_]+)=", body)
        assert set(env) <= {"PPFS_SECURITY", "PPFS_SECRETS_DIR"}, env
    template = (TERRAFORM / "templates" / "cloud-init.yaml.tftpl").read_text()
    assert set(re.findall(r"\$\{([a-z_]+)\}", template)) == allowed


def test_no_token_file_enters_an_image_build() -> None:
    """A secrets folder made inside the checkout (make-secrets.sh --out) holds bearer
    tokens in tokens.json and clients/*.env beside its keys: none of it is sent to an
    image build."""
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for pattern in ("**/*.key", "**/*.pem", "**/tokens.json", "**/*.env", "**/*.tgz"):
        assert pattern in ignored, pattern
    for dockerfile in ("services/party/Dockerfile", "services/dealer-gateway/Dockerfile"):
        copies = [ln for ln in (ROOT / dockerfile).read_text().splitlines()
                  if ln.startswith(("COPY", "ADD"))]
        assert not [ln for ln in copies if ".env" in ln or "token" in ln.lower()], copies


def test_party_keeps_the_keys_it_made_over_a_secret_that_brings_others(
    tmp_path: Path,
) -> None:
    """A party that made its keys in its state volume (Azure: only its key request left
    it) is never handed keys made elsewhere: a secret folder with keys/ (a compose-style
    folder uploaded by mistake, or keys someone else made) stops it, its own keys kept."""
    import os

    script = (ROOT / "deploy" / "docker" / "party-entrypoint.sh").read_text()
    entry = tmp_path / "entry.sh"
    entry.write_text(script.replace("exec /opt/ppfs/bin/ppfs ", "exec true "))
    secrets, state = tmp_path / "secrets", tmp_path / "state"
    (secrets / "keys").mkdir(parents=True)
    (secrets / "keys" / "box.key").write_text("made elsewhere")
    (secrets / "certs").mkdir()
    (state / "keys").mkdir(parents=True)
    (state / "keys" / "box.key").write_text("made by the party")
    r = subprocess.run(["sh", str(entry), "party", "serve"], capture_output=True, text=True,
                       timeout=30, check=False, env={
                           **os.environ, "PPFS_STATE_DIR": str(state),
                           "PPFS_SECRETS_DIR": str(secrets)})
    assert r.returncode == 2 and "refusing to replace them" in r.stderr, r.stderr
    assert not (state / "keys").is_symlink()
    assert (state / "keys" / "box.key").read_text() == "made by the party"
    # a state whose keys/ is the secret's own link (compose, every restart) starts as before
    (state / "keys" / "box.key").unlink()
    (state / "keys").rmdir()
    (state / "keys").symlink_to(secrets / "keys")
    r = subprocess.run(["sh", str(entry), "party", "serve"], capture_output=True, text=True,
                       timeout=30, check=False, env={
                           **os.environ, "PPFS_STATE_DIR": str(state),
                           "PPFS_SECRETS_DIR": str(secrets)})
    assert r.returncode == 0, r.stderr
    assert (state / "keys" / "box.key").read_text() == "made elsewhere"
