"""Images, compose files and the containerised service end to end.

Three levels, each skipped with its reason when it cannot run here:

1. Static (always): the Dockerfiles (multi-stage, non-root USER, HEALTHCHECK, base image
   and MP-SPDZ source as build arguments) and `docker-compose config` of the 3PC file and
   the 4PC overlay (needs only the compose tool: docker-compose 1.29 and/or Compose v2).
2. Images (needs a Docker engine and the images ppfs-party:local / ppfs-gateway:local):
   they run as non-root and no layer holds a private key (docker save + scan).
3. End to end (opt-in, PPFS_DOCKER_TESTS=1): builds the images offline
   (deploy/offline-build/build-images.sh: no registry), then for the 3PC compose and the
   4PC overlay: make the secret folders, `up`, upload a data set, the owner's consent, run
   Step 2A + 2B to success (the selection checked against the plaintext oracle, the model
   zero outside it), stop one party container mid-job (the job fails naming that party
   within 60 s), start it again, and run a new job to success. The 3PC gateway serves
   HTTP, the 4PC one HTTPS (a certificate from the deployment CA). With PPFS_DOCKER_TESTS=1
   the images are always rebuilt first (cached: about 1-2 min).
   Where MP-SPDZ is usable on the host the party image carries a copy of it and the flows
   run active-3pc / active-4pc on it; elsewhere (or with MPSPDZ_HOME=/nonexistent) the
   party image is MPyC only (MPSPDZ_SOURCE=none) and the same flows run passive-3pc /
   passive-4pc on MPyC, with smaller data sets (MPyC is ~100x slower on comparisons).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTY_IMAGE = os.environ.get("PPFS_PARTY_IMAGE", "ppfs-party:local")
GATEWAY_IMAGE = os.environ.get("PPFS_GATEWAY_IMAGE", "ppfs-gateway:local")
E2E = os.environ.get("PPFS_DOCKER_TESTS") == "1"
LOST_LIMIT = 60.0  # a stopped party must fail the job within this many seconds

pytestmark = pytest.mark.docker


def _run(argv: list[str], timeout: float = 120, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {proc.returncode}\n{proc.stderr[-3000:]}")
    return proc


def _compose_tools() -> list[list[str]]:
    tools = []
    if shutil.which("docker-compose"):
        tools.append(["docker-compose"])
    if shutil.which("docker") and subprocess.run(
        ["docker", "compose", "version"], capture_output=True, check=False
    ).returncode == 0:
        tools.append(["docker", "compose"])
    return tools


def _engine_reason() -> str | None:
    if not shutil.which("docker"):
        return "no docker command on this machine"
    try:
        proc = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer"
    if proc.returncode != 0:
        return "no Docker engine is running (docker info failed)"
    return None


# ---- 1. static -------------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", ["services/party/Dockerfile",
                                        "services/dealer-gateway/Dockerfile"])
def test_dockerfile_house_style(dockerfile: str) -> None:
    text = (ROOT / dockerfile).read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    assert "ARG BASE_IMAGE=python:3.11-slim" in lines
    assert all(f.startswith("FROM ${BASE_IMAGE}") for f in froms)
    users = [ln for ln in lines if ln.startswith("USER ")]
    assert users, "no USER"
    assert users[-1] not in ("USER root", "USER 0", "USER 0:0")
    assert any(ln.startswith("HEALTHCHECK ") for ln in lines)
    # nothing key-like is ever copied in
    for ln in lines:
        if ln.startswith(("COPY", "ADD")):
            assert not re.search(r"secret|\.key\b|\.pem\b|/keys", ln, re.I), ln
    if "party" in dockerfile:
        assert "ARG MPSPDZ_SOURCE=tarball" in lines
        assert any(ln.startswith("ARG MPSPDZ_SHA256=") for ln in lines)
        assert "mp-spdz-${MPSPDZ_VERSION}.tar.xz" in text and "ARG MPSPDZ_VERSION=0.4.2" in text


def test_dockerignore_keeps_keys_and_state_out() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    for pattern in (".git", ".venv", ".ppfs", "**/*.key", "**/*.pem", "secrets"):
        assert pattern in ignored, pattern


def test_mpspdz_installer_refuses_an_unpinned_hash(tmp_path: Path) -> None:
    env = {**os.environ, "MPSPDZ_SOURCE": "tarball", "MPSPDZ_VERSION": "0.4.2",
           "MPSPDZ_URL": "http://127.0.0.1:9/never-fetched",
           "MPSPDZ_SHA256": "UNVERIFIED-fill-in-the-sha256-of-the-release-tarball"}
    proc = subprocess.run(
        ["python3", str(ROOT / "deploy" / "docker" / "install_mpspdz.py")],
        capture_output=True, text=True, env=env, timeout=30, check=False,
    )
    assert proc.returncode == 1
    assert "MPSPDZ_SHA256 is not a SHA-256" in proc.stderr


def _fake_release(tmp_path: Path) -> tuple[Path, str]:
    """A tarball with the release's layout (mp-spdz-0.4.2/bin/Linux-amd64/..., compile.py)."""
    import hashlib

    top = tmp_path / "mp-spdz-0.4.2"
    for rel in ("bin/Linux-amd64/replicated-ring-party.x", "bin/Linux-amd64/sy-rep-ring-party.x",
                "bin/Linux-amd64/rep4-ring-party.x", "bin/Linux-adx/rep4-ring-party.x",
                "compile.py", "Compiler/__init__.py", "Compiler/types.py", "FHE/big.cpp"):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(rel)
    archive = tmp_path / "mp-spdz-0.4.2.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(top, arcname="mp-spdz-0.4.2")
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


@pytest.mark.parametrize("good_hash", [True, False])
def test_mpspdz_installer_checks_the_release_hash(tmp_path: Path, good_hash: bool) -> None:
    archive, digest = _fake_release(tmp_path)
    dest = tmp_path / "staging" / "mp-spdz"
    env = {**os.environ, "MPSPDZ_SOURCE": "tarball", "MPSPDZ_VERSION": "0.4.2",
           "MPSPDZ_URL": archive.as_uri(), "MPSPDZ_DEST": str(dest),
           "MPSPDZ_SHA256": digest if good_hash else "0" * 64}
    proc = subprocess.run(
        ["python3", str(ROOT / "deploy" / "docker" / "install_mpspdz.py")],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )
    if good_hash:
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.name for p in dest.iterdir()) == [
            "Compiler", "compile.py", "rep4-ring-party.x", "replicated-ring-party.x",
            "sy-rep-ring-party.x"]
        assert (dest / "rep4-ring-party.x").read_text() == "bin/Linux-amd64/rep4-ring-party.x"
        assert os.access(dest / "sy-rep-ring-party.x", os.X_OK)
    else:
        assert proc.returncode == 1
        assert "SHA-256 mismatch" in proc.stderr and "Refusing" in proc.stderr
        assert not (dest / "compile.py").exists()


def _file_args(files: list[str]) -> list[str]:
    return [arg for f in files for arg in ("-f", f)]


def _config(tool: list[str], files: list[str], env: dict[str, str]) -> dict:
    yaml = pytest.importorskip("yaml")
    out = _run([*tool, *_file_args(files), "config"], env=env).stdout
    return yaml.safe_load(out)


COMPOSE_SETS = {
    "3pc": (["docker-compose.yml"], ["alice", "bob", "carol"], "active-3pc"),
    "4pc": (["docker-compose.yml", "compose.4pc.yml"], ["alice", "bob", "carol", "dave"],
            "active-4pc"),
}
# MPyC images (no MP-SPDZ in the party image) run the passive settings only
MPYC_SECURITY = {"3pc": "passive-3pc", "4pc": "passive-4pc"}


@pytest.mark.parametrize(("which", "engine"), [(w, e) for w in sorted(COMPOSE_SETS)
                                                for e in ("mp-spdz", "mpyc")])
def test_compose_config(which: str, engine: str, tmp_path: Path) -> None:
    tools = _compose_tools()
    if not tools:
        pytest.skip("neither docker-compose nor `docker compose` is installed")
    files, parties, security = COMPOSE_SETS[which]
    if engine == "mpyc":
        security = MPYC_SECURITY[which]
    for name in [*parties, "gateway"]:
        (tmp_path / name).mkdir()
    env = {**os.environ, "PPFS_SECURITY": security, "PPFS_SECRETS_DIR": str(tmp_path)}
    for tool in tools:
        cfg = _config(tool, files, env)
        services = cfg["services"]
        assert set(services) == {"gateway", *parties}
        gw = services["gateway"]
        deps = gw["depends_on"]
        assert {p: deps[p]["condition"] for p in parties} == dict.fromkeys(
            parties, "service_healthy")
        assert gw["environment"]["PPFS_SECURITY"] == security
        for i, name in enumerate(parties):
            svc = services[name]
            assert svc["healthcheck"]["test"][0] == "CMD"
            # the party's MPC port range published 1:1, nothing else published by a party
            base = 14000 + 4 * i
            pairs = set()
            for p in svc["ports"]:
                if isinstance(p, dict):
                    pairs.add((int(p["published"]), int(p["target"])))
                    assert p.get("host_ip") == "127.0.0.1", p  # not every interface
                else:
                    assert str(p).startswith("127.0.0.1:"), p  # not every interface
                    host, _, target = str(p).removesuffix("/tcp").rpartition(":")
                    hs = [int(x) for x in host.split(":")[-1].split("-")]
                    ts = [int(x) for x in target.split("-")]
                    hs, ts = list(range(hs[0], hs[-1] + 1)), list(range(ts[0], ts[-1] + 1))
                    pairs |= set(zip(hs, ts, strict=True))
            assert pairs == {(q, q) for q in range(base, base + 4)}, pairs
            cmd = svc["command"]
            assert cmd[cmd.index("--mpc-port") + 1] == str(base)
            assert cmd[cmd.index("--mpc-port-count") + 1] == "4"
            assert cmd[cmd.index("--index") + 1] == str(i)
            # its own secret folder only, and a named volume for its share store
            assert [s["source"] for s in svc["secrets"]] == [name]
            assert cfg["secrets"][name]["file"] == str(tmp_path / name)
            vols = [v if isinstance(v, str) else f"{v['source']}:{v['target']}"
                    for v in svc["volumes"]]
            assert any(v.startswith(f"{name}-state:/var/lib/ppfs/state") for v in vols), vols
            assert svc["environment"]["PPFS_SECURITY"] == security
            assert svc.get("read_only") is True
        assert {f"{p}-state" for p in parties} <= set(cfg["volumes"])


def test_compose_requires_security_and_secrets() -> None:
    tools = _compose_tools()
    if not tools:
        pytest.skip("neither docker-compose nor `docker compose` is installed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PPFS_SECURITY", "PPFS_SECRETS_DIR")}
    for tool in tools:
        proc = _run([*tool, "-f", "docker-compose.yml", "config"], env=env, check=False)
        assert proc.returncode != 0
        assert "PPFS_SECURITY" in proc.stderr or "PPFS_SECRETS_DIR" in proc.stderr


# ---- 2. images ---------------------------------------------------------------------------


def _image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                          check=False).returncode == 0


@pytest.fixture(scope="session")
def images() -> tuple[str, str]:
    reason = _engine_reason()
    if reason:
        pytest.skip(reason)
    if E2E:
        from ppfs.engines.registry import engine_unavailable_reason, mpspdz_home

        # copy MP-SPDZ into the party image when it is usable here, else MPyC only
        why = engine_unavailable_reason("mp-spdz")
        source = "local" if why is None else "none"
        env = {**os.environ, "MPSPDZ_SOURCE": source, "MPSPDZ_HOME": str(mpspdz_home())}
        t0 = time.monotonic()
        _run([str(ROOT / "deploy" / "offline-build" / "build-images.sh")], timeout=3600,
             env=env)
        print(f"\n[test_containers] offline image build (MPSPDZ_SOURCE={source}"
              f"{'' if why is None else f': {why}'}): {time.monotonic() - t0:.0f} s")
    missing = [r for r in (PARTY_IMAGE, GATEWAY_IMAGE) if not _image_exists(r)]
    if missing:
        pytest.skip(f"images {missing} not built: run deploy/offline-build/build-images.sh "
                    "or set PPFS_DOCKER_TESTS=1")
    return PARTY_IMAGE, GATEWAY_IMAGE


def test_images_run_as_non_root(images: tuple[str, str]) -> None:
    for ref in images:
        user = _run(["docker", "image", "inspect", "-f", "{{.Config.User}}", ref]).stdout.strip()
        assert user and user.split(":")[0] not in ("root", "0"), (ref, user)
        uid = _run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "id", ref,
                    "-u"]).stdout.strip()
        assert uid != "0", ref
        health = _run(["docker", "image", "inspect", "-f", "{{json .Config.Healthcheck}}",
                       ref]).stdout
        assert "healthcheck.py" in health, ref


PEM_PRIVATE = re.compile(
    rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----\s*[A-Za-z0-9+/=\s]{64,}"
    rb"-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----"
)
KEY_PATH = re.compile(r"(^|/)(keys|secrets|certs)/[^/]+\.key$|(^|/)(box|signing|control|"
                      r"mpc-[a-z-]+|gateway|ca)\.key$")


# System libraries that embed the PUBLISHED test keys of their power-on self-tests
# (GnuTLS's FIPS self-test vectors): not key material of anyone's.
SELF_TEST_KEY_LIBRARIES = re.compile(r"(^|/)usr/lib/x86_64-linux-gnu/libgnutls\.so[.0-9]*$")


def _layer_findings(layer: tarfile.TarFile) -> list[str]:
    found = []
    for member in layer:
        if not member.isfile() or SELF_TEST_KEY_LIBRARIES.search(member.name):
            continue
        if KEY_PATH.search(member.name):
            found.append(f"{member.name} (key file name)")
            continue
        fh = layer.extractfile(member)
        if fh is None:
            continue
        with fh:
            data = fh.read()
        if b"PRIVATE KEY-----" in data and PEM_PRIVATE.search(data):
            found.append(f"{member.name} (PEM private key)")
    return found


def test_layer_scan_finds_keys(tmp_path: Path) -> None:
    """The scanner itself: a PEM key anywhere, or a key file by name, is found."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    layer_path = tmp_path / "layer.tar"
    with tarfile.open(layer_path, "w") as tar:
        for name, data in (("opt/app/config.txt", b"x = 1\n" + pem),
                           ("var/lib/ppfs/state/keys/box.key", b"\0" * 32),
                           # a PEM header alone, no key body (built so no key marker is in source)
                           ("opt/app/ok.txt", b"-----BEGIN " + b"PRIVATE KEY----- in a comment")):
            src = tmp_path / "f"
            src.write_bytes(data)
            tar.add(src, arcname=name)
    with tarfile.open(layer_path) as tar:
        found = _layer_findings(tar)
    assert found == ["opt/app/config.txt (PEM private key)",
                     "var/lib/ppfs/state/keys/box.key (key file name)"]


def test_no_private_key_in_any_image_layer(images: tuple[str, str], tmp_path: Path) -> None:
    """docker save each image and scan every file of every layer for a private key."""
    findings: list[str] = []
    for ref in images:
        archive = tmp_path / "image.tar"
        _run(["docker", "save", "-o", str(archive), ref], timeout=600)
        with tarfile.open(archive) as outer:
            for member in outer:
                if not member.isfile():
                    continue
                fh = outer.extractfile(member)
                if fh is None:
                    continue
                with fh:
                    try:
                        with tarfile.open(fileobj=fh, mode="r:*") as layer:
                            findings += [f"{ref}: {f}" for f in _layer_findings(layer)]
                    except tarfile.ReadError:
                        continue  # config JSON, manifest
        archive.unlink()
    assert not findings, "\n".join(findings)


# ---- 3. end to end -------------------------------------------------------------------------


def _compose(project: str, files: list[str], env: dict[str, str]) -> list[str]:
    tool = _compose_tools()[0]
    return [*tool, "-p", project, *_file_args(files)]


def _container(base: list[str], service: str, env: dict[str, str]) -> str:
    return _run([*base, "ps", "-q", service], env=env).stdout.strip()


def _wait_healthy(base: list[str], services: list[str], env: dict[str, str],
                  timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    pending = list(services)
    while pending and time.monotonic() < deadline:
        for s in list(pending):
            cid = _container(base, s, env)
            status = _run(["docker", "inspect", "-f", "{{.State.Health.Status}}", cid],
                          check=False).stdout.strip() if cid else ""
            if status == "healthy":
                pending.remove(s)
        time.sleep(1)
    assert not pending, f"not healthy within {timeout} s: {pending}"


class _Service:
    """The analyst, data owner and admin of a running compose deployment."""

    def __init__(self, secrets: Path, url: str, engine: str, ca: Path | None = None) -> None:
        self.secrets = secrets
        self.url = url
        self.engine = engine
        self.verify: bool | str = str(ca) if ca else True
        tokens = json.loads((secrets / "gateway" / "tokens.json").read_text())
        self.tokens = {e["subject"]: e["token"] for e in tokens}

    def client(self, subject: str):
        from ppfs_client.sdk import GatewayClient

        from ppfs.keycert import TrustAnchor

        # the clients' trust anchor, as make_secrets wrote it to clients/<subject>.env
        env = (self.secrets / "clients" / f"{subject}.env").read_text()
        anchor = next(line.split("=", 1)[1] for line in env.splitlines()
                      if line.startswith("export PPFS_DEPLOYMENT_CA="))
        return GatewayClient(self.url, self.tokens[subject], verify=self.verify,
                             trust=TrustAnchor.parse(anchor))

    def keys(self, subject: str):
        from ppfs_client.keys import ClientKeys

        return ClientKeys.load(self.secrets / "clients" / f"{subject}.key")

    def upload(self, rows: int, cols: int, seed: int):
        from ppfs_client.sdk import OwnerTable

        from ppfs.synthetic import make_table

        t = make_table(rows, cols, seed=seed)
        with self.client("owner-a") as owner, self.client("admin") as admin:
            ds = owner.create_dataset(f"compose-test-{seed}")
            owner.upload_table(self.keys("owner-a"),
                               OwnerTable(t.columns, t.x, t.label_column, t.classes, t.y),
                               ds["id"])
            admin.grant(ds["id"], "analyst")
        return t, ds["id"]

    def submit(self, table, dataset_id: str, k: int, security: str,
               training: dict | None = None) -> str:
        from ppfs.contract import Reveal

        with self.client("owner-a") as owner:  # the owner's consent, checked by every party
            owner.consent(self.keys("owner-a"), dataset_id, "analyst",
                          self.keys("analyst").box_public_key,
                          Reveal.MODEL if training else Reveal.SELECTION)
        with self.client("analyst") as analyst:
            job = analyst.submit(self.keys("analyst"), [dataset_id], label=table.label_column,
                                 k=k, security=security, engine=self.engine, training=training)
        return str(job["id"])

    def job(self, job_id: str) -> dict:
        with self.client("analyst") as analyst:
            return analyst.get_job(job_id)

    def wait(self, job_id: str, timeout: float, until: tuple[str, ...] = (
            "succeeded", "failed", "cancelled")) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            j = self.job(job_id)
            if j["state"] in until:
                return j
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not {until} within {timeout} s: {self.job(job_id)}")

    def run_to_success(self, table, dataset_id: str, k: int, security: str,
                       training: dict | None = None) -> None:
        from ppfs import oracle

        job_id = self.submit(table, dataset_id, k, security, training)
        final = self.wait(job_id, 600)
        assert final["state"] == "succeeded", final
        with self.client("analyst") as analyst:
            sel = analyst.fetch_result(self.keys("analyst"), job_id)
        plain = oracle.ms_gini_top_k(table.x, table.y, table.n_classes, k)
        assert [int(i) for i in sel.indices] == [int(i) for i in plain]
        if training is not None:  # Step 2B: the model, zero outside the selection
            assert sel.model is not None
            weights = np.asarray(sel.model.weights)
            unselected = [j for j in range(table.p) if j not in set(plain.tolist())]
            assert np.all(weights[:, unselected] == 0)


def _image_engine(party_image: str) -> str:
    """The engine the compose flow runs: MP-SPDZ when the party image carries it."""
    source = _run(["docker", "image", "inspect", "-f",
                   '{{index .Config.Labels "org.ppfs.mpspdz-source"}}', party_image]).stdout
    return "mpyc" if source.strip() == "none" else "mp-spdz"


@dataclass(frozen=True)
class FlowShapes:
    """The data sets of one engine's flow: a small job run to success, and a long one
    (many small SGD steps) that is still running when a party container is stopped."""

    small: tuple[int, int, int]  # rows, columns, k
    training: dict
    big: tuple[int, int, int]
    long_training: dict


SHAPES = {
    "mp-spdz": FlowShapes((120, 8, 3), {"epochs": 2, "batch_size": 16, "learning_rate": 0.5},
                          (3000, 40, 5), {"epochs": 30, "batch_size": 8, "learning_rate": 0.5}),
    # MPyC is ~100x slower on comparisons: tiny shapes, still a job that outlasts the stop
    "mpyc": FlowShapes((24, 6, 2), {"epochs": 1, "batch_size": 8, "learning_rate": 0.5},
                       (100, 10, 2), {"epochs": 20, "batch_size": 4, "learning_rate": 0.5}),
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def deployment(request: pytest.FixtureRequest, images: tuple[str, str],
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    if not E2E:
        pytest.skip("end-to-end container flow is opt-in: set PPFS_DOCKER_TESTS=1")
    which = request.param
    files, parties, security = COMPOSE_SETS[which]
    engine = _image_engine(images[0])
    if engine == "mpyc":
        security = MPYC_SECURITY[which]
    secrets = tmp_path_factory.mktemp(f"secrets-{which}")
    port = _free_port()
    # the 4PC deployment serves HTTPS (certificate from the deployment CA), the 3PC one HTTP
    https = which == "4pc"
    url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
    tls_args = ["--https-name", "127.0.0.1", "--https-name", "localhost"] if https else []
    _run([str(ROOT / "deploy" / "compose" / "make-secrets.sh"), "--out", str(secrets),
          "--parties", str(len(parties)), "--gateway-url", url, *tls_args])
    env = {**os.environ, "PPFS_SECURITY": security, "PPFS_SECRETS_DIR": str(secrets),
           "PPFS_GATEWAY_PORT": str(port), "PPFS_PARTY_IMAGE": images[0],
           "PPFS_GATEWAY_IMAGE": images[1]}
    project = f"ppfstest{which}{os.getpid()}"
    base = _compose(project, files, env)
    try:
        t0 = time.monotonic()
        _run([*base, "up", "-d", "--no-build"], env=env, timeout=300)
        _wait_healthy(base, ["gateway", *parties], env)
        print(f"\n[test_containers] {which} ({engine}, {security}) up and healthy in "
              f"{time.monotonic() - t0:.0f} s")
        ca = secrets / "ca" / "ca.pem" if https else None
        yield which, base, env, parties, security, _Service(secrets, url, engine, ca)
    finally:
        logs = _run([*base, "logs", "--no-color", "--tail", "20"], env=env, check=False)
        print(logs.stdout[-6000:])  # shown by pytest only when the test fails
        _run([*base, "down", "-v", "--remove-orphans"], env=env, check=False, timeout=300)
        # the secret folders belong to the images' uid: remove them through a container
        _run(["docker", "run", "--rm", "--user", "0:0", "--network", "none",
              "-v", f"{secrets}:/s", "--entrypoint", "sh", images[0], "-c", "rm -rf /s/*"],
             check=False)


@pytest.mark.parametrize("deployment", ["3pc", "4pc"], indirect=True)
def test_compose_end_to_end(deployment: tuple) -> None:
    which, base, env, parties, security, svc = deployment
    shapes = SHAPES[svc.engine]
    t_start = time.monotonic()

    # upload, a Step 2A + 2B job to success (the selection checked against the plaintext
    # oracle, the model zero outside it)
    rows, cols, k = shapes.small
    small, small_id = svc.upload(rows, cols, seed=11)
    svc.run_to_success(small, small_id, k, security, training=shapes.training)
    t_small = time.monotonic() - t_start

    # a job long enough to be stopped mid-way; stop the last party's container
    victim = parties[-1] if which == "4pc" else "bob"
    victim_name = victim.capitalize()
    rows, cols, big_k = shapes.big
    big, big_id = svc.upload(rows, cols, seed=12)
    # many small SGD steps keep this job running long enough to stop a party mid-way
    job_id = svc.submit(big, big_id, big_k, security, training=shapes.long_training)
    svc.wait(job_id, 300, until=("running", "succeeded", "failed"))
    time.sleep(2)
    assert svc.job(job_id)["state"] == "running", "the job ended before a party was stopped"
    t_stop = time.monotonic()
    # stopped at once: a first SIGTERM would let its job end (the drain), a second stops
    # it now, failing the job it runs and telling the gateway so; then the container stops
    _run([*base, "kill", "-s", "SIGTERM", victim], env=env, timeout=60)
    time.sleep(0.5)
    _run([*base, "kill", "-s", "SIGTERM", victim], env=env, timeout=60)
    _run([*base, "stop", "-t", "5", victim], env=env, timeout=60)
    final = svc.wait(job_id, LOST_LIMIT + 10)
    took = time.monotonic() - t_stop
    assert final["state"] == "failed", final
    assert took <= LOST_LIMIT, f"failed only after {took:.0f} s"
    assert victim_name in final["error"], (
        f"the error should name {victim_name}, the stopped party: {final['error']!r}")

    # start it again: a new job succeeds
    _run([*base, "start", victim], env=env, timeout=60)
    _wait_healthy(base, [victim], env)
    t_again = time.monotonic()
    svc.run_to_success(small, small_id, k, security)
    print(f"\n[test_containers] {which} ({svc.engine}) flow in "
          f"{time.monotonic() - t_start:.0f} s: first job {t_small:.0f} s, failed "
          f"{took:.0f} s after the stop, job after the restart {time.monotonic() - t_again:.0f} s")


@pytest.mark.parametrize("made_here", [True, False], ids=["keys-in-secret", "own-keys"])
def test_party_entrypoint_links_what_the_secret_holds(tmp_path: Path, made_here: bool) -> None:
    """The party image's entrypoint links the secret folder's certs/ (and keys/ where they
    were made for the party on one host) into the state volume and takes owners.json; a
    party that made its own keys in the volume keeps them: only certs/ arrive."""
    script = (ROOT / "deploy" / "docker" / "party-entrypoint.sh").read_text()
    assert script.count("exec /opt/ppfs/bin/ppfs ") == 1
    entry = tmp_path / "entry.sh"
    entry.write_text(script.replace("exec /opt/ppfs/bin/ppfs ", "exec true "))
    secrets, state = tmp_path / "secrets", tmp_path / "state"
    (secrets / "certs").mkdir(parents=True)
    (secrets / "certs" / "control.pem").write_text("cert")
    (secrets / "owners.json").write_text("{}")
    if made_here:
        (secrets / "keys").mkdir()
        (secrets / "keys" / "box.key").write_text("from the secret")
    else:
        (state / "keys").mkdir(parents=True)
        (state / "keys" / "box.key").write_text("made by the party")
    subprocess.run(["sh", str(entry), "party", "serve"], check=True, timeout=30, env={
        **os.environ, "PPFS_STATE_DIR": str(state), "PPFS_SECRETS_DIR": str(secrets)})
    assert (state / "certs").resolve() == (secrets / "certs").resolve()
    assert (state / "owners.json").read_text() == "{}"
    assert (state / "keys").is_symlink() is made_here
    assert (state / "keys" / "box.key").read_text() == (
        "from the secret" if made_here else "made by the party")
