"""The party daemon's settings: built once in ``main()`` (or by a test) and passed down."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ppfs.engines.base import PARTY_NAMES
from ppfs.errors import ParameterError
from ppfs.pki import DEFAULT_GATEWAY_NAME

DEFAULT_MAX_UPLOAD = 1 << 30  # bytes of one sealed part
DEFAULT_BUNDLE_CACHE = 256 << 20  # a SPEED-sized upload's data is 16 MiB per party
# a part must arrive within this many seconds, plus one second per MIN_UPLOAD_RATE bytes
DEFAULT_UPLOAD_TIMEOUT = 60.0
MIN_UPLOAD_RATE = 256 << 10  # bytes per second: 1 GiB in 68 minutes
# upload streams open at once: the gateway sends each owner's part to every party in one
# stream, so this is how many owners may be uploading at one time
DEFAULT_MAX_OPEN_UPLOADS = 64
# a staged upload part the gateway has not decided within this many seconds of its
# arrival is aborted by the party itself: an undecided part holds the party's disk
DEFAULT_STAGED_EXPIRY = 24 * 3600.0
# a job that ended (succeeded, failed or cancelled) this many days ago is pruned: its
# directory (the engine's logs, the opened masked words of its result) is deleted and
# its record reduced to a tombstone (what refuses its replay). Its result can be fetched
# until then: a month leaves the recipient time for a late fetch, while the masked
# outputs and logs of a party that runs for years do not stay at rest for years.
DEFAULT_JOB_RETENTION_DAYS = 30.0
# `ppfs party serve`: what a stop (SIGTERM) gives the unfinished jobs to end, so that a
# planned restart fails none of the jobs a minute's wait would finish
DEFAULT_DRAIN_SECONDS = 60.0


@dataclass(frozen=True)
class MpcDial:
    """Where this party dials one peer's MPC engine instead of the address the job
    lists for it (``--mpc-dial PARTY=HOST:PORT`` or ``PARTY=HOST:+N`` / ``-N``).

    With ``shift`` the port follows the job: the peer's port for this job plus
    ``shift`` (a relay in front of a peer on the same machine cannot listen on the
    peer's own port number, since the engines listen on every address). A fixed
    ``port`` suits only a party with one MPC port (every job on the same ports)."""

    party: int
    host: str
    port: int | None = None
    shift: int | None = None

    @classmethod
    def parse(cls, text: str) -> MpcDial:
        """``PARTY=HOST:PORT`` or ``PARTY=HOST:+N`` / ``PARTY=HOST:-N``; PARTY is an
        index (0..3) or a name (Alice, Bob, Carol, Dave)."""
        usage = (f"--mpc-dial {text!r}: expected PARTY=HOST:PORT or PARTY=HOST:+N / -N "
                 "(PARTY an index 0..3 or a name Alice, Bob, Carol, Dave)")
        who, eq, where = text.partition("=")
        host, colon, port = where.strip().rpartition(":")
        who, host, port = who.strip(), host.strip().strip("[]"), port.strip()
        if not eq or not colon or not who or not host or not port:
            raise ParameterError(usage)
        names = [n.lower() for n in PARTY_NAMES]
        if who.isdigit() and int(who) < len(PARTY_NAMES):
            party = int(who)
        elif who.lower() in names:
            party = names.index(who.lower())
        else:
            raise ParameterError(f"--mpc-dial {text!r}: unknown party {who!r} (an index "
                                 f"0..{len(PARTY_NAMES) - 1} or one of "
                                 f"{', '.join(PARTY_NAMES)})")
        if port[0] in "+-":
            if not port[1:].isdigit() or len(port) > 7:
                raise ParameterError(f"--mpc-dial {text!r}: the shift must be +N or -N, "
                                     "N a number of ports")
            shift = int(port)
            if not -65535 < shift < 65535:
                raise ParameterError(f"--mpc-dial {text!r}: a shift of {shift} leaves the "
                                     "ports 1..65535")
            return cls(party, host, shift=shift)
        if not port.isdigit() or len(port) > 5 or not 0 < int(port) < 65536:
            raise ParameterError(f"--mpc-dial {text!r}: the port must be 1..65535 "
                                 "(or +N / -N: the peer's job port shifted by N)")
        return cls(party, host, port=int(port))

    def address(self, peer: tuple[str, int]) -> tuple[str, int]:
        """Where to dial the peer that listens at ``peer`` for this job."""
        if self.port is not None:
            return self.host, self.port
        port = peer[1] + (self.shift or 0)
        if not 0 < port < 65536:
            raise ParameterError(
                f"--mpc-dial for {PARTY_NAMES[self.party]}: its job port {peer[1]} shifted by "
                f"{self.shift:+d} is {port}, outside 1..65535"
            )
        return self.host, port

    def __str__(self) -> str:
        port = str(self.port) if self.port is not None else f"{self.shift:+d}"
        return f"{PARTY_NAMES[self.party]}={self.host}:{port}"


@dataclass(frozen=True)
class PartySettings:
    """Everything a party daemon needs; no secrets here, only where they live."""

    state_dir: Path  # keys, certificates, owners.json, uploads, jobs, audit log
    index: int  # 0..3: Alice, Bob, Carol, Dave
    listen: str = "127.0.0.1:0"  # control plane (gRPC, mutual TLS); port 0 in tests
    tls_name: str | None = None  # control-plane certificate name; default the party's name
    # PartyService calls are accepted only from the CA-issued gateway client identity
    # (ppfs.pki.GATEWAY_CONTROL_USAGE) with this CN (`ppfs pki client --name`)
    gateway_name: str = DEFAULT_GATEWAY_NAME
    mpc_host: str = "127.0.0.1"  # where peers reach this party's engine (GetIdentity)
    mpc_port_base: int = 14000  # this party's first engine port
    mpc_port_count: int = 1  # engine ports base..base+count-1; the gateway rotates jobs over them
    mpc_bind_host: str | None = None  # engine listens here only (None: every interface)
    engines: tuple[str, ...] = ("mp-spdz", "mpyc")  # offered when usable here
    mpspdz_home: Path | None = None  # default: $MPSPDZ_HOME, else /opt/mp-spdz
    mpspdz_cache: Path | None = None  # compiled programs; default <state>/cache/mpspdz
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    # a part's stream ends, refused, after this many seconds plus its size at
    # MIN_UPLOAD_RATE: one that stalls, or drips empty chunks, holds nothing for ever
    upload_timeout: float = DEFAULT_UPLOAD_TIMEOUT
    # loaded upload bundles kept in memory for the next job (0: none kept)
    bundle_cache_bytes: int = DEFAULT_BUNDLE_CACHE
    job_timeout: float | None = None  # engine time limit per run; None: engine default
    # stop a run once this party's engine neither computed nor printed for this many
    # seconds: a peer stopped answering (frozen), which would hold this party's job slot
    # until job_timeout. None: the engine's default (ppfs.engines.stall); 0: never
    stall_timeout: float | None = None
    stop_grace: float = 5.0  # seconds in-flight calls get on SIGTERM
    # on SIGTERM, seconds the unfinished jobs get to end before they are stopped (no new
    # job is taken meanwhile; a second SIGTERM stops at once); 0: stop them at once
    drain_seconds: float = 0.0
    port_file: Path | None = None  # write the bound control-plane port here (port 0)
    metrics_listen: str | None = None  # Prometheus /metrics, plain HTTP, internal; None: off
    max_concurrent_jobs: int = 1  # engine runs at once; later jobs wait queued for a slot
    # upload part streams open at once; one more is refused until one ends
    max_open_uploads: int = DEFAULT_MAX_OPEN_UPLOADS
    # seconds a staged part waits for the gateway's commit or abort; then it is aborted
    # here (a commit arriving later is refused)
    staged_expiry: float = DEFAULT_STAGED_EXPIRY
    # days after a job ended that its directory is deleted and its record pruned to a
    # tombstone (its result can no longer be fetched here)
    job_retention_days: float = DEFAULT_JOB_RETENTION_DAYS
    # where this party dials some peers' engines instead of the job's addresses (relays)
    mpc_dial: tuple[MpcDial, ...] = ()

    def __post_init__(self) -> None:
        # absolute once, when read: the engines run each party with its own working
        # directory as cwd, where a relative path (--state-dir alice) means another place
        object.__setattr__(self, "state_dir", Path(self.state_dir).absolute())
        if self.mpspdz_cache is not None:
            object.__setattr__(self, "mpspdz_cache", Path(self.mpspdz_cache).absolute())
        if not 0 <= self.index < len(PARTY_NAMES):
            raise ParameterError(f"party index must be 0..{len(PARTY_NAMES) - 1}")
        if not 1 <= self.mpc_port_count <= 1000 or self.mpc_port_base + self.mpc_port_count > 65536:
            raise ParameterError("mpc_port_count must be 1..1000 and the range end below 65536")
        if not 1 <= self.max_concurrent_jobs <= 64:
            raise ParameterError("max_concurrent_jobs must be 1..64")
        if self.max_upload_bytes < 1:
            raise ParameterError("max_upload_bytes must be positive")
        if not 1 <= self.max_open_uploads <= 10_000:
            raise ParameterError("max_open_uploads must be 1..10000")
        if not 0 < self.upload_timeout <= 86_400:
            raise ParameterError("upload_timeout must be more than 0 and at most a day")
        if not 0 < self.staged_expiry <= 366 * 86_400:
            raise ParameterError("staged_expiry (--staged-expiry-hours) must be more than 0 "
                                 "and at most a year")
        if not 1 / 24 <= self.job_retention_days <= 3660:  # NaN too
            raise ParameterError("job_retention_days (--job-retention-days) must be at least "
                                 "an hour (1/24) and at most ten years (3660)")
        if self.job_timeout is not None and not 0 < self.job_timeout <= 30 * 86_400:
            raise ParameterError("job_timeout (--job-timeout) must be more than 0 and at "
                                 "most 30 days, in seconds")
        if self.stall_timeout is not None and not 0 <= self.stall_timeout <= 86_400:
            raise ParameterError("stall_timeout (--stall-timeout) must be 0 .. 86400 "
                                 "seconds (0: never)")
        if not 0 <= self.drain_seconds <= 86_400:
            raise ParameterError("drain_seconds (--drain-seconds) must be 0 .. 86400")
        if self.bundle_cache_bytes < 0:
            raise ParameterError("bundle_cache_bytes must be 0 or more")
        if not self.gateway_name.strip():
            raise ParameterError("--gateway-name must not be empty")
        seen: set[int] = set()
        for d in self.mpc_dial:
            if d.party == self.index:
                raise ParameterError(
                    f"--mpc-dial {d}: names this party itself; it dials only its peers"
                )
            if d.party in seen:
                raise ParameterError(f"--mpc-dial names {PARTY_NAMES[d.party]} twice")
            seen.add(d.party)
            if d.port is not None and self.mpc_port_count != 1:
                raise ParameterError(
                    f"--mpc-dial {d}: a fixed port needs --mpc-port-count 1 (jobs rotate over "
                    f"{self.mpc_port_count} ports): give HOST:+N, the peer's job port "
                    "shifted by N"
                )

    @property
    def job_retention(self) -> float:
        """Seconds a job is kept whole after it ended (:attr:`job_retention_days`)."""
        return self.job_retention_days * 86_400

    @property
    def name(self) -> str:
        return PARTY_NAMES[self.index]

    @property
    def control_name(self) -> str:
        return self.tls_name or self.name.lower()

    def dial_for(self, peers: Sequence[tuple[str, int]]) -> tuple[tuple[str, int], ...] | None:
        """Where this party dials each party of a job whose parties listen at ``peers``
        (its own entry unchanged); None when no ``mpc_dial`` entry concerns the job.
        Raises ParameterError when a shifted port leaves 1..65535."""
        chosen = {d.party: d for d in self.mpc_dial if d.party < len(peers)}
        if not chosen:
            return None
        return tuple(chosen[j].address(addr) if j in chosen else addr
                     for j, addr in enumerate(peers))
