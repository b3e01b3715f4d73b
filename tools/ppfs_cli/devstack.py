"""A local development stack: the party daemons and the gateway as processes on this
machine, with a fresh development PKI, client keys and bearer tokens in a state
directory (./.ppfs by default; reused when it exists).

Layout of the state directory (private files mode 0600)::

    ca/                 development CA (ca.key stays here); statements/ (every party key
                        statement it signed) and revocations.json (its revocation list,
                        which the gateway serves): `ppfs pki revoke --ca-dir STATE/ca`
    parties/p<i>-<name>/  each party's own state: keys, certificates, uploads, audit log
    gateway/            gateway.json, tls/ (client key and certificate), state/ (registry)
    keys/<subject>.key  the principals' key files (signing and result keys)
    tokens.json         bearer tokens per principal
    env/<subject>.env   PPFS_GATEWAY, PPFS_TOKEN, PPFS_KEY and PPFS_DEPLOYMENT_CA (the
                        development CA certificate: the clients' trust anchor) for `source`
    logs/               one log per process
    lock                held by the running ``ppfs up`` (ppfs.state_lock): a second one on
                        the same directory is refused; each party and the gateway also
                        lock their own state directory

``ppfs up`` supervises: a party that dies is reported (one line naming it) and started
again on the same ports, after 1, 2, 4, 8 then 16 s; a party that dies five times in a
row without staying up a minute is left stopped, and SIGHUP to ``ppfs up`` starts it
again. The gateway fails the job that was running, naming the party that died. Each
party gets MPC_PORTS consecutive MPC ports; each running job holds one of every party.
The MPC ports lie below the ephemeral port range (ppfs.durable.free_port_ranges): an
outgoing connection (an engine's, a relay's) can never take a port a party is about to
bind; so do the metrics ports and the parties' control ports (a daemon binding port 0
can never take one either, nor an outgoing connection a party about to be started again). A
caller (a benchmark) may choose each party's first MPC port and give each party extra
``ppfs party serve`` arguments (:class:`Stack`'s ``mpc_port_bases`` and
``party_args``), e.g. ``--mpc-dial`` to put relays between the parties.

The parties' key statements ask clients for the CA's revocation list (``ppfs pki sign
--revocable``; states made before keep theirs as they were signed): ``ppfs up`` issues
the list afresh at every start and again, while it runs, a day after the last issue (it
is fresh for 7 days), so that clients never find it stale.

Every daemon runs through the parent-death launcher (ppfs.engines.pdeathsig): when
``ppfs up`` dies, even by SIGKILL, its daemons die with it. SIGINT and SIGTERM are
handled from the start: while starting, they stop what was started.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from ppfs.durable import free_port_ranges
from ppfs.engines import pdeathsig
from ppfs.engines.base import PARTY_NAMES
from ppfs.errors import ParameterError, PpfsError
from ppfs.run_dirs import TEMP_PREFIX, make_run_dir, remove_left_behind
from ppfs.state_lock import StateDirInUse, StateDirLock, hold_state_dir

EXIT_FAILED = 1
EXIT_USAGE = 2

PRINCIPALS = (
    ("data_owner", "owner-a"),
    ("data_owner", "owner-b"),
    ("analyst", "analyst"),
    ("admin", "admin"),
)
START_TIMEOUT = 60.0
# MPC ports per party: the gateway gives each job the next one, so an engine still
# winding down from one job never meets the next job's engines
MPC_PORTS = 4
DEFAULT_CONCURRENT = 2  # jobs side by side (each holds one MPC port of every party)
RESTART_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0)
STABLE_SECONDS = 60.0  # a party up this long has its restart count reset
# the revocation list `ppfs up` serves is issued again once this little of its freshness
# (7 days) is left, checked at least this often (seconds)
REFRESH_WITHIN = dt.timedelta(days=6)
REFRESH_CHECK = 3600.0
REVOCATIONS_FILE = "revocations.json"  # in the state directory's ca/ (ppfs.revocation)


class StartInterrupted(PpfsError):
    """SIGINT or SIGTERM arrived while the stack was starting."""


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` at 0600 through a new file renamed over it: a crash leaves the old
    file or the new one, never a truncated one."""
    from ppfs.pki import replace_private_file

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    replace_private_file(path, text.encode())


def _read_tokens(path: Path) -> dict[str, str]:
    """subject -> token from ``tokens.json``; a damaged file or one without a principal's
    token is named (never quoted: it holds tokens)."""
    fix = "repair it, or delete it to have new tokens made"
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
        tokens = {str(e["subject"]): e["token"] for e in entries}
    except (ValueError, TypeError, KeyError) as exc:  # (JSON and UTF-8 errors are ValueErrors)
        raise ParameterError(f"{path} is damaged ({type(exc).__name__}: {exc}); {fix}") from None
    missing = [s for _, s in PRINCIPALS if not (isinstance(tokens.get(s), str) and tokens[s])]
    if missing:
        raise ParameterError(f"{path} has no token for {', '.join(missing)}; {fix}")
    return tokens


@dataclass
class StackLayout:
    root: Path
    parties: int
    party_dirs: list[Path] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)  # subject -> token

    @property
    def tokens_file(self) -> Path:
        return self.root / "tokens.json"

    def key_file(self, subject: str) -> Path:
        return self.root / "keys" / f"{subject}.key"

    def env_file(self, subject: str) -> Path:
        return self.root / "env" / f"{subject}.env"


def check_party_count(root: Path, parties: int) -> None:
    """Refuse a state directory whose gateway was last started with another number of
    parties: its data sets are shared for that many (3: pairs; 4: all components but one),
    so with a party more or fewer every upload would be inconsistent and every job refused."""
    config = root / "gateway" / "gateway.json"
    try:
        recorded = json.loads(config.read_text(encoding="utf-8")).get("parties")
    except (OSError, ValueError, AttributeError):
        return  # none yet (or unreadable: the gateway names it when it starts)
    if not isinstance(recorded, list) or not recorded or len(recorded) == parties:
        return
    n = len(recorded)
    raise ParameterError(
        f"--state-dir {root} holds a {n}-party deployment ({', '.join(PARTY_NAMES[:n])}); "
        f"its data sets are shared for {n} parties: start it with --parties {n}, or pass "
        f"another --state-dir for {parties} parties")


def prepare(root: Path, parties: int, *, party_keys: bool = True,
            gateway_identity: bool = True, revocable: bool = False) -> StackLayout:
    """Make (or reuse) the CA, party states, gateway client identity, keys and tokens.

    ``party_keys=False``: each party's state holds only its registered owners, no key and
    no key statement (the parties make their keys where they run); ``gateway_identity=
    False``: the gateway's ``tls/`` holds only the CA certificate (it makes its key where
    it runs). Nothing is then certified that would be thrown away.

    ``revocable`` (``ppfs up``, ``ppfs demo``): the key statements of new party states ask
    clients for the CA's revocation list (``ppfs pki sign --revocable``), recorded in
    ``ca/statements`` (``ppfs pki revoke --ca-dir STATE/ca`` revokes them), and the list
    is issued afresh into ``ca/revocations.json``, which the gateway serves
    (:meth:`Stack.start`; :meth:`Stack.refresh_revocations` keeps it fresh while the stack
    runs). A state made before keeps its statements as they are (signed without it)."""
    from cryptography import x509
    from ppfs_client.keys import ClientKeys
    from ppfs_party.config import PartySettings
    from ppfs_party.keys import sign_party_requests
    from ppfs_party.state import open_state
    from ppfs_party.store import register_owner

    from ppfs.pki import (
        DEFAULT_GATEWAY_NAME,
        CertificateAuthority,
        has_gateway_usage,
        issue_client_identity,
        load_ca,
        save_ca,
    )
    from ppfs.revocation import reissue

    check_party_count(root, parties)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    layout = StackLayout(root, parties)
    ca_dir = root / "ca"
    if not (ca_dir / "ca.key").exists():
        save_ca(CertificateAuthority.create("ppfs development CA"), ca_dir)
    ca = load_ca(ca_dir)
    for i in range(parties):
        state = root / "parties" / f"p{i}-{PARTY_NAMES[i].lower()}"
        if not party_keys:
            state.mkdir(parents=True, exist_ok=True, mode=0o700)
        elif not (state / "certs" / "party-keys.json").exists():
            # (a state made before party keys were certified gets its key statement now)
            open_state(PartySettings(state_dir=state, index=i))
            sign_party_requests(ca, state, i, revocable=revocable,
                                record=partial(_record_statement, ca_dir, ca)
                                if revocable else None)
        layout.party_dirs.append(state)
    if revocable:
        try:
            reissue(ca_dir, ca)  # fresh from now; the gateway reads it again once changed
        except ValueError as exc:  # the list there is not this CA's
            raise ParameterError(f"{exc}: restore it, or remove it to issue a new one "
                                 "(revoking again what it revoked)") from None
    tls = root / "gateway" / "tls"
    # (a client certificate made before the parties checked for the gateway's usage is
    # replaced: the parties would refuse it)
    if not gateway_identity:
        tls.mkdir(parents=True, exist_ok=True)
        (tls / "ca.pem").write_bytes(ca.cert_pem())
    elif not (tls / "gateway.pem").exists() or not has_gateway_usage(
            x509.load_pem_x509_certificate((tls / "gateway.pem").read_bytes())):
        _, cert = issue_client_identity(ca, DEFAULT_GATEWAY_NAME, tls / "gateway.key")
        (tls / "gateway.pem").write_bytes(cert)
        (tls / "ca.pem").write_bytes(ca.cert_pem())
    for _, subject in PRINCIPALS:
        path = layout.key_file(subject)
        keys = ClientKeys.load(path) if path.exists() else ClientKeys.generate(subject).save(path)
        for state in layout.party_dirs:
            register_owner(state, subject, keys.verify_key)
    if not layout.tokens_file.exists():
        entries = [
            {"token": secrets.token_urlsafe(32), "role": role, "subject": subject}
            for role, subject in PRINCIPALS
        ]
        _write_private(layout.tokens_file, json.dumps(entries, indent=1))
    layout.tokens = _read_tokens(layout.tokens_file)
    return layout


def _record_statement(ca_dir: Path, ca: Any, statement: bytes) -> None:
    """The CA's record of a key statement it signs (as ``ppfs pki sign`` keeps it)."""
    from ppfs.revocation import list_lock, record_statement, refuse_revoked_keys

    with list_lock(ca_dir):  # not while a revocation reads what is on record
        refuse_revoked_keys(ca_dir, ca, statement)
        record_statement(ca_dir, statement)


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse a busy gateway port up front, naming it (0: any free port, always fine)."""
    if not 0 <= port <= 65535:
        raise ParameterError(f"port {port}: a port is 0..65535 (0 for any free one)")
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as uvicorn binds: a port left in TIME_WAIT by an earlier run is not busy
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise ParameterError(
                f"port {port} is in use; pass --port (another port, or 0 for any free one)"
            ) from None


def _lock_root(root: Path) -> StateDirLock:
    try:
        return hold_state_dir(root)
    except StateDirInUse as exc:
        holder = f" (pid {exc.pid})" if exc.pid else ""
        raise StateDirInUse(root, exc.pid, f"{root} is in use by another process{holder}, "
                            "a running ppfs up perhaps; stop it or pass another --state-dir"
                            ) from None
    except OSError as exc:
        raise ParameterError(f"cannot use --state-dir {root}: {exc.strerror or exc}") from None


def claim_state_dir(root: Path, port: int) -> StateDirLock:
    """Lock the stack's state directory for this process's life, and check the gateway
    port. A directory in use is named before a busy port (most likely that run's)."""
    lock = _lock_root(root) if root.is_dir() else None
    try:
        check_port_free(port)
        return lock or _lock_root(root)  # (made only once the port is known free)
    except BaseException:
        if lock is not None:
            lock.release()
        raise


@dataclass
class PartyProcess:
    name: str  # display name: Alice, Bob, ...
    argv: list[str]
    port_file: Path
    proc: asyncio.subprocess.Process
    started: float = 0.0
    restarts: int = 0  # in a row, without staying up STABLE_SECONDS


class Stack:
    """The running processes of a local stack.

    ``mpc_port_bases``: each party's first MPC port (its MPC_PORTS ports follow; default:
    free ranges below the ephemeral range). ``party_args``: party index -> extra
    arguments for its ``ppfs party serve`` (kept for restarts). ``stop`` set (SIGINT,
    SIGTERM) while :meth:`start` runs: it raises StartInterrupted, starting nothing more."""

    def __init__(
        self,
        layout: StackLayout,
        *,
        mpc_port_bases: Sequence[int] | None = None,
        party_args: Mapping[int, Sequence[str]] | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        if mpc_port_bases is not None and (
            len(mpc_port_bases) != layout.parties
            or any(not 0 < b <= 65536 - MPC_PORTS for b in mpc_port_bases)
        ):
            raise ParameterError(f"mpc_port_bases: one first port per party ({layout.parties}), "
                                 f"each 1..{65536 - MPC_PORTS}")
        unknown = sorted(set(party_args or {}) - set(range(layout.parties)))
        if unknown:
            raise ParameterError(f"party_args: no party {unknown[0]} in a stack of "
                                 f"{layout.parties}")
        self.mpc_port_bases = list(mpc_port_bases) if mpc_port_bases is not None else None
        self.party_args = {i: list(a) for i, a in (party_args or {}).items()}
        self.layout = layout
        self.procs: list[tuple[str, asyncio.subprocess.Process]] = []
        self.parties: list[PartyProcess] = []
        self.url = ""
        self.metrics: dict[str, str] = {}  # process name -> its Prometheus /metrics URL
        self.stopping = stop or asyncio.Event()
        self.gateway_port = 0  # as asked for (0: any free port)

    async def _spawn(self, name: str, argv: list[str]) -> asyncio.subprocess.Process:
        logs = self.layout.root / "logs"
        logs.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(logs, 0o700)
        fd = os.open(logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # also a log left by an earlier version
        with os.fdopen(fd, "ab") as log:
            # through the parent-death launcher: it becomes the daemon (same pid) with
            # SIGKILL armed for when this process dies, however it dies
            proc = await asyncio.create_subprocess_exec(
                *pdeathsig.command(), *argv,
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            )
        self.procs.append((name, proc))
        return proc

    async def _port(self, name: str, proc: asyncio.subprocess.Process, path: Path) -> int:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.stopping.is_set():
                raise StartInterrupted(f"stopped while {name} was starting")
            if path.exists() and path.read_text().strip():
                return int(path.read_text())
            if proc.returncode is not None:
                log = self.layout.root / "logs" / (name + ".log")
                busy = ""
                with contextlib.suppress(OSError):
                    busy = next((ln.strip() for ln in reversed(
                        log.read_bytes()[-4000:].decode(errors="replace").splitlines())
                        if "address already in use" in ln.lower()), "")
                if busy:
                    # the gateway's own port is the operator's choice; any other is ours
                    if name == "gateway" and self.gateway_port and str(self.gateway_port) in busy:
                        raise ParameterError(f"gateway: port {self.gateway_port} is in use; "
                                             "pass --port (another port, or 0 for any free one)")
                    raise PpfsError(f"{name} could not bind a port: {busy[-200:]}; see {log}")
                raise PpfsError(
                    f"{name} exited with code {proc.returncode} while starting; "
                    f"see {self.layout.root / 'logs' / (name + '.log')}"
                )
            await asyncio.sleep(0.1)
        raise PpfsError(f"{name} did not start within {START_TIMEOUT:.0f} s")

    async def start(self, port: int, max_concurrent_jobs: int = DEFAULT_CONCURRENT) -> None:
        lay = self.layout
        self.gateway_port = port
        concurrent = str(max(1, min(max_concurrent_jobs, MPC_PORTS)))
        run = lay.root / "run"
        run.mkdir(exist_ok=True)
        try:
            mpc_ports = self.mpc_port_bases or free_port_ranges(lay.parties, MPC_PORTS)
        except OSError as exc:
            raise PpfsError(str(exc)) from None
        # metrics listeners (plain HTTP on loopback: one per party, one for the gateway)
        # and the parties' control listeners: none inside an MPC port range, all below the
        # ephemeral range, so that neither a daemon binding port 0 (the gateway) nor an
        # outgoing connection (an engine's, the gateway's) holds one when its owner binds
        # it, at the start or when a party is started again on the same port
        taken = {base + j for base in mpc_ports for j in range(MPC_PORTS)}
        try:
            drawn = free_port_ranges(2 * lay.parties + 1 + len(taken), 1)
        except OSError as exc:
            raise PpfsError(str(exc)) from None
        free = [p for p in drawn if p not in taken]
        metrics_ports = free[: lay.parties + 1]
        control_ports = free[lay.parties + 1: 2 * lay.parties + 1]
        party_ports = []
        for i, state in enumerate(lay.party_dirs):
            name = PARTY_NAMES[i].lower()
            pf = run / f"{name}.port"
            pf.unlink(missing_ok=True)
            argv = [
                sys.executable, "-m", "ppfs_party", "serve",
                "--state-dir", str(state), "--index", str(i),
                "--listen", f"127.0.0.1:{control_ports[i]}", "--port-file", str(pf),
                "--mpc-host", "127.0.0.1", "--mpc-port", str(mpc_ports[i]),
                "--mpc-port-count", str(MPC_PORTS), "--mpc-bind-host", "127.0.0.1",
                "--metrics-listen", f"127.0.0.1:{metrics_ports[i]}",
                "--max-concurrent-jobs", concurrent,
                # a development stack stops at once: its jobs are stopped with it
                "--drain-seconds", "0",
                *self.party_args.get(i, ()),
            ]  # fmt: skip
            self.metrics[name] = f"http://127.0.0.1:{metrics_ports[i]}/metrics"
            proc = await self._spawn(name, argv)
            control = await self._port(name, proc, pf)
            party_ports.append(control)  # a restart binds it again: the gateway's config names it
            self.parties.append(PartyProcess(PARTY_NAMES[i], argv, pf, proc, time.monotonic()))
        gw_dir = lay.root / "gateway"
        config = {
            "state_dir": "state",
            "parties": [
                {"address": f"127.0.0.1:{p}", "tls_server_name": PARTY_NAMES[i].lower()}
                for i, p in enumerate(party_ports)
            ],
            "tls": {
                "ca_cert": "tls/ca.pem",
                "client_cert": "tls/gateway.pem",
                "client_key": "tls/gateway.key",
            },
            "tokens_file": str(lay.tokens_file.resolve()),
            "host": "127.0.0.1",
            "port": port,
            "metrics_listen": f"127.0.0.1:{metrics_ports[-1]}",
            "max_concurrent_jobs": int(concurrent),
        }
        if (lay.root / "ca" / REVOCATIONS_FILE).is_file():  # issued by prepare(revocable)
            config["revocation_list"] = str((lay.root / "ca" / REVOCATIONS_FILE).resolve())
        self.metrics["gateway"] = f"http://127.0.0.1:{metrics_ports[-1]}/metrics"
        (gw_dir / "gateway.json").write_text(json.dumps(config, indent=1))
        pf = run / "gateway.port"
        pf.unlink(missing_ok=True)
        argv = [
            sys.executable, "-m", "ppfs_cli", "gateway", "serve",
            "--config", str(gw_dir / "gateway.json"), "--port-file", str(pf),
        ]  # fmt: skip
        proc = await self._spawn("gateway", argv)
        self.url = f"http://127.0.0.1:{await self._port('gateway', proc, pf)}"
        if self.stopping.is_set():
            raise StartInterrupted("stopped while the gateway was starting")
        async with httpx.AsyncClient() as http:
            resp = await http.get(
                self.url + "/v1/deployment",
                headers={"Authorization": f"Bearer {lay.tokens['admin']}"},
                timeout=30,
            )
            if resp.status_code != 200:
                raise PpfsError(f"the gateway cannot reach every party ({resp.status_code})")
        for _, subject in PRINCIPALS:
            _write_private(
                lay.env_file(subject),
                f"export PPFS_GATEWAY={self.url}\n"
                f"export PPFS_TOKEN={lay.tokens[subject]}\n"
                f"export PPFS_KEY={lay.key_file(subject).resolve()}\n"
                f"export PPFS_DEPLOYMENT_CA={(lay.root / 'ca' / 'ca.pem').resolve()}\n",
            )

    def refresh_revocations(self, now: dt.datetime | None = None) -> bool:
        """Issue the CA's revocation list again (the same revocations, fresh from now)
        once less than :data:`REFRESH_WITHIN` of its freshness is left, in the file the
        gateway serves (read again as it changes); whether it did. Clients refuse every
        party whose statement asks for the list once it is stale: a stack left running
        for weeks keeps serving one that is fresh."""
        from ppfs.pki import load_ca
        from ppfs.revocation import current_list, reissue

        ca_dir = self.layout.root / "ca"
        if not (ca_dir / REVOCATIONS_FILE).is_file():
            return False
        ca = load_ca(ca_dir)
        rl = current_list(ca_dir, ca)
        t = now or dt.datetime.now(dt.UTC)
        if rl is not None and rl.stale_after - t > REFRESH_WITHIN:
            return False
        reissue(ca_dir, ca, now=t)
        return True

    async def _refresh_reporting(self) -> None:
        """:meth:`refresh_revocations`, warning when it fails, however it fails: the
        supervision it runs in keeps every daemon of the stack alive."""
        try:
            await asyncio.to_thread(self.refresh_revocations)
        except Exception as exc:  # a CA key that does not load, say
            reason = str(exc) if isinstance(exc, (OSError, ValueError)) else (
                f"{type(exc).__name__}: {exc}")
            print(f"ppfs: warning: the revocation list was not issued again ({reason}); "
                  "clients refuse the parties once it is stale: `ppfs pki revocations "
                  f"--ca-dir {self.layout.root / 'ca'}`", file=sys.stderr, flush=True)

    async def restart_party(self, party: PartyProcess) -> None:
        """Start a party again on its ports (its job records say which job it lost)."""
        party.port_file.unlink(missing_ok=True)
        self.procs = [(n, p) for n, p in self.procs if p is not party.proc]
        party.proc = await self._spawn(party.name.lower(), party.argv)
        await self._port(party.name.lower(), party.proc, party.port_file)
        party.started = time.monotonic()

    async def supervise(self, stop: asyncio.Event, retry: asyncio.Event) -> int:
        """Until ``stop``: restart parties that die (bounded backoff); ``retry`` (SIGHUP)
        starts the parties left stopped. Returns 1 if the gateway died."""
        gateway = next(p for n, p in self.procs if n == "gateway")
        given_up: set[str] = set()
        while not stop.is_set():
            waiters = {asyncio.create_task(p.proc.wait()): p for p in self.parties
                       if p.name not in given_up}
            others = [asyncio.create_task(stop.wait()), asyncio.create_task(retry.wait()),
                      asyncio.create_task(gateway.wait())]
            await asyncio.wait([*waiters, *others], return_when=asyncio.FIRST_COMPLETED,
                               timeout=REFRESH_CHECK)
            await self._refresh_reporting()  # (woken at least every REFRESH_CHECK)
            for t in (*waiters, *others):
                t.cancel()
            if stop.is_set():
                return 0
            if gateway.returncode is not None:
                print(f"ppfs: error: the gateway exited with code {gateway.returncode}; "
                      "stopping the stack", file=sys.stderr, flush=True)
                return 1
            if retry.is_set():
                retry.clear()
                for p in self.parties:
                    if p.proc.returncode is not None:
                        given_up.discard(p.name)
                        p.restarts = 0
                        print(f"ppfs: restarting {p.name}", file=sys.stderr, flush=True)
                        await self._restart_reporting(p, given_up)
                continue
            for p in self.parties:
                if p.proc.returncode is None or p.name in given_up:
                    continue
                if time.monotonic() - p.started > STABLE_SECONDS:
                    p.restarts = 0
                if p.restarts >= len(RESTART_DELAYS):
                    given_up.add(p.name)
                    print(f"ppfs: {p.name} keeps dying (exit code {p.proc.returncode}); left "
                          f"stopped: send SIGHUP to ppfs up (pid {os.getpid()}) to restart it",
                          file=sys.stderr, flush=True)
                    continue
                delay = RESTART_DELAYS[p.restarts]
                p.restarts += 1
                print(f"ppfs: {p.name} died (exit code {p.proc.returncode}); restarting it in "
                      f"{delay:.0f} s (restart {p.restarts} of {len(RESTART_DELAYS)}); see "
                      f"{self.layout.root / 'logs' / (p.name.lower() + '.log')}",
                      file=sys.stderr, flush=True)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return 0
                await self._restart_reporting(p, given_up)
        return 0

    async def _restart_reporting(self, p: PartyProcess, given_up: set[str]) -> None:
        try:
            await self.restart_party(p)
        except PpfsError as exc:
            print(f"ppfs: {p.name} did not start again: {exc}", file=sys.stderr, flush=True)
            return
        print(f"ppfs: {p.name} is running again", file=sys.stderr, flush=True)

    async def stop(self) -> None:
        """The gateway first, then the parties: a gateway that saw the parties stop
        under a running job would record it as failed by whichever party reported first;
        stopped first, it finds at its next start that every party was stopped."""
        procs = list(reversed(self.procs))
        first = [p for name, p in procs if name == "gateway"]
        for group in (first, [p for name, p in procs if name != "gateway"]):
            for proc in group:
                if proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                try:
                    await asyncio.wait_for(proc.wait(), 15)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        self.procs.clear()


async def prepare_state_dir(root: Path, parties: int) -> StackLayout:
    """:func:`prepare`, naming the state directory when it cannot be used."""
    try:
        return await asyncio.to_thread(partial(prepare, root, parties, revocable=True))
    except OSError as exc:
        raise ParameterError(f"cannot use --state-dir {root}: {exc}") from None


async def run_stack(args: argparse.Namespace) -> int:
    # before anything starts: a SIGTERM while starting stops what was started (the
    # launcher covers SIGKILL)
    stop, retry = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, retry.set)
    lock = await asyncio.to_thread(claim_state_dir, args.state_dir, args.port)
    try:
        layout = await prepare_state_dir(args.state_dir, args.parties)
        return await _run_started(Stack(layout, stop=stop), args, stop, retry)
    except StartInterrupted:
        return 0
    finally:
        lock.release()


async def _run_started(stack: Stack, args: argparse.Namespace, stop: asyncio.Event,
                       retry: asyncio.Event) -> int:
    layout = stack.layout
    try:
        if stop.is_set():
            return 0
        await stack.start(args.port, args.max_concurrent_jobs)
        names = ", ".join(PARTY_NAMES[: args.parties])
        print(f"ppfs: {args.parties} parties ({names}) and the gateway are up")
        print(f"  gateway      {stack.url}   (OpenAPI: {stack.url}/openapi.json)")
        print(f"  console      {stack.url}/console/   (sign in with a token from the file below)")
        print("  metrics      " + ", ".join(f"{n} {u}" for n, u in stack.metrics.items()))
        print(f"  tokens       {layout.tokens_file}")
        print(
            f"  environment  source {layout.env_file('owner-a')}   (also owner-b, analyst, admin)"
        )
        print(f"  logs         {layout.root / 'logs'}")
        print("Ctrl-C stops everything.", flush=True)
        return await stack.supervise(stop, retry)
    finally:
        running = bool(stack.procs)
        if running:  # said, so that a Ctrl-C is seen to be taken
            print("ppfs: stopping the gateway, then the parties", file=sys.stderr, flush=True)
        await stack.stop()
        if running:
            print(f"ppfs: stopped; the state stays in {layout.root} (`ppfs up` starts it "
                  "again)", file=sys.stderr, flush=True)


# `ppfs demo-service`'s temporary state directory (ppfs.run_dirs: one a demo killed
# outright leaves is removed by the next demo or `ppfs select`)
DEMO_PREFIX = TEMP_PREFIX + "demo-"


async def run_demo(args: argparse.Namespace) -> int:
    from ppfs.engines.registry import default_engine_name

    engine = args.engine or default_engine_name()
    # SIGINT and SIGTERM stop the demo the same way: the stack stops, the flow's thread
    # ends (its next request fails) and the state directory, which holds the CA key, the
    # parties' keys and their shares, is removed; the exit code is 128 + the signal
    stop, stopped_by = asyncio.Event(), [signal.SIGINT]

    def on_signal(sig: signal.Signals) -> None:
        stopped_by[0] = sig
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    # what demos (and `ppfs select` runs) killed outright left: their keys and shares
    await asyncio.to_thread(remove_left_behind)
    tmp: Path | None = None
    run_lock: int | None = None
    root = args.state_dir
    if root is None:
        # held while the demo lasts: the next demo removes it only once this one is gone
        tmp, run_lock = await asyncio.to_thread(make_run_dir, DEMO_PREFIX)
        root = tmp
    lock: StateDirLock | None = None
    try:
        lock = await asyncio.to_thread(claim_state_dir, root,
                                       0 if args.state_dir is None else args.port)
        layout = await prepare_state_dir(root, args.parties)
        stack = Stack(layout, stop=stop)
        try:
            await stack.start(0 if args.state_dir is None else args.port,
                              args.max_concurrent_jobs)
            print(f"demo: stack up, gateway {stack.url}, engine {engine}", file=sys.stderr)
            flow = asyncio.ensure_future(
                asyncio.to_thread(_demo_flow, stack, layout, args, engine))
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({flow, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if flow.done():
                stopping.cancel()
                return flow.result()
            print("demo: stopping", file=sys.stderr, flush=True)
            await stack.stop()
            with contextlib.suppress(Exception):
                await flow
        except StartInterrupted:
            pass
        finally:
            await stack.stop()
        return 128 + int(stopped_by[0])
    finally:
        if lock is not None:
            lock.release()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if run_lock is not None:
            os.close(run_lock)


def _demo_flow(stack: Stack, layout: StackLayout, args: argparse.Namespace, engine: str) -> int:
    import numpy as np
    from ppfs_client.keys import ClientKeys
    from ppfs_client.progress import JobProgressView
    from ppfs_client.sdk import GatewayClient, OwnerTable

    from ppfs.contract import Reveal
    from ppfs.keycert import TrustAnchor
    from ppfs.oracle import ms_gini_top_k
    from ppfs.synthetic import make_table

    t = make_table(args.rows, args.cols, seed=args.seed)
    half = t.m // 2
    security = (
        "passive-3pc"
        if args.parties == 3
        else ("active-4pc" if engine == "mp-spdz" else "passive-4pc")
    )

    # the demo made its own CA: its certificate is the trust anchor every client holds
    trust = TrustAnchor.parse(str(layout.root / "ca" / "ca.pem"))

    def client(subject: str) -> GatewayClient:
        return GatewayClient(stack.url, layout.tokens[subject], trust=trust)

    def keys(subject: str) -> ClientKeys:
        return ClientKeys.load(layout.key_file(subject))

    def part(rows: slice) -> OwnerTable:
        return OwnerTable(t.columns, t.x[rows], t.label_column, t.classes, t.y[rows])

    with (
        client("owner-a") as a,
        client("owner-b") as b,
        client("admin") as admin,
        client("analyst") as analyst,
    ):
        ds_a = a.create_dataset("demo-hospital-a")
        held = a.upload_table(keys("owner-a"), part(slice(0, half)), ds_a["id"])
        print(f"demo: owner-a uploaded {half} rows as data set {ds_a['id']} (held committed "
              f"by {', '.join(held['confirmed_by'])}, each by its signed statement)",
              file=sys.stderr)
        admin.grant(ds_a["id"], "owner-b")
        exps = b.get_dataset(ds_a["id"])["column_exponents"]
        ds_b = b.create_dataset("demo-hospital-b")
        b.upload_table(keys("owner-b"), part(slice(half, t.m)), ds_b["id"], exponents=exps)
        print(f"demo: owner-b uploaded {t.m - half} rows as data set {ds_b['id']}", file=sys.stderr)
        for d in (ds_a, ds_b):
            admin.grant(d["id"], "analyst")
        epochs = getattr(args, "epochs", 0)
        training = (
            {"epochs": epochs, "batch_size": 32, "learning_rate": 0.5} if epochs > 0 else None
        )
        # each owner consents, with its own key, to what the analyst may learn; every
        # party checks these consents itself before it runs the job
        reveal = Reveal.MODEL if training else Reveal.SELECTION
        for owner, c, d in (("owner-a", a, ds_a), ("owner-b", b, ds_b)):
            c.consent(keys(owner), d["id"], "analyst", keys("analyst").box_public_key, reveal)
        job = analyst.submit(
            keys("analyst"), [ds_a["id"], ds_b["id"]], label=t.label_column, k=args.k,
            security=security, engine=engine, training=training,
        )  # fmt: skip
        steps = "Step 2A + 2B" if training else "Step 2A"
        print(f"demo: job {job['id']} submitted: {steps}, {security} on {engine}",
              file=sys.stderr)  # fmt: skip
        # one live line per party on a terminal; one line per change otherwise
        JobProgressView(plain=sys.stderr).follow(analyst.events(job["id"]))
        final = analyst.get_job(job["id"])
        if final["state"] != "succeeded":
            print(f"ppfs: error: job {final['state']}: {final['error']}", file=sys.stderr)
            return 1
        sel = analyst.fetch_result(keys("analyst"), job["id"])
    print(f"selected {args.k} of {t.p} features (best first):")
    for rank, name in enumerate(sel.columns, start=1):
        print(f"  {rank:3d}. {name}")
    plain = ms_gini_top_k(t.x, t.y, t.n_classes, args.k)
    print(
        "plaintext MS-GINI on the same data selects: " + ", ".join(t.columns[int(j)] for j in plain)
    )
    if sel.model is not None:
        weights = np.asarray(sel.model.weights)[0]
        intercept = float(np.asarray(sel.model.intercepts)[0])
        print("logistic regression trained inside MPC (original units, selected columns):")
        for name, j in zip(sel.columns, sel.indices, strict=True):
            print(f"  {name:>10}  {weights[int(j)]: .6g}")
        print(f"  {'intercept':>10}  {intercept: .6g}")
        scores = t.x @ weights + intercept
        acc = float(((scores > 0).astype(int) == t.y).mean())
        print(f"training accuracy on the synthetic data (the demo plays every role): "
              f"{100 * acc:.1f}%")  # fmt: skip
    return 0 if np.array_equal(sel.indices, plain) else 1


# `ppfs up` and `ppfs demo-service`:
#   ppfs up [--parties 3|4] [--state-dir .ppfs]      # a local development stack
#   ppfs demo-service [--parties 3|4]                # the main job, through the service


def add_commands(sub: Any) -> None:
    up = sub.add_parser(
        "up",
        help="start a local stack: parties and gateway, with a fresh development PKI",
        description="Start the party daemons and the gateway as local processes with a freshly "
        "generated development PKI, keys and bearer tokens under --state-dir (reused when it "
        "exists). Prints the gateway URL and where the tokens are; Ctrl-C stops everything.",
    )
    _stack_args(up)
    up.set_defaults(func=_up)

    demo = sub.add_parser(
        "demo-service",
        help="run the main job through the service: upload, Step 2A + 2B, fetch the result",
        description="Start a local stack, split a synthetic data set between two data owners, "
        "upload both halves, submit Step 2A and Step 2B (training) as the analyst, watch it, "
        "fetch and open the result (selection and model), and compare the selection with the "
        "plaintext MS-GINI choice.",
    )
    _stack_args(demo, default_dir=None)
    # (demo-service's alone: `ppfs up` runs no job; its parties offer every engine usable)
    demo.add_argument(
        "--engine",
        choices=["mp-spdz", "mpyc"],
        default=None,
        help="engine for the demo job (default: mp-spdz when found, else mpyc)",
    )
    demo.add_argument("--rows", type=int, default=200)
    demo.add_argument("--cols", type=int, default=12)
    demo.add_argument("--k", type=int, default=4)
    demo.add_argument("--seed", type=int, default=7)
    demo.add_argument("--epochs", type=int, default=5, help="Step 2B epochs (0: no training)")
    demo.set_defaults(func=_demo)



def _port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: 0..65535 (0: any free one)")
    return port


def _stack_args(p: argparse.ArgumentParser, default_dir: str | None = ".ppfs") -> None:
    p.add_argument("--parties", type=int, choices=(3, 4), default=3)
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path(default_dir) if default_dir else None,
        help="keys, certificates, tokens, registry, logs"
        + (" (default ./.ppfs)" if default_dir else " (default: a temporary directory)"),
    )
    p.add_argument("--port", type=_port_number, default=8080,
                   help="gateway port (0: any free port)")
    p.add_argument(
        "--max-concurrent-jobs",
        type=int,
        default=DEFAULT_CONCURRENT,
        metavar="N",
        help=f"jobs run side by side, 1..{MPC_PORTS} (default {DEFAULT_CONCURRENT}); "
        "given to the gateway and every party",
    )


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run a stack command; a parameter error exits 2, any other failure 1, naming it."""
    try:
        return asyncio.run(main)
    except ParameterError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PpfsError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 0


def _up(args: argparse.Namespace) -> int:
    return _run(run_stack(args))


def _demo(args: argparse.Namespace) -> int:
    return _run(run_demo(args))
