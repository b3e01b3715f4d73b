"""The party daemon's settings: built once in ``main()`` (or by a test) and passed down."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ppfs.engines.base import PARTY_NAMES
from ppfs.errors import ParameterError

DEFAULT_MAX_UPLOAD = 1 << 30  # bytes of one sealed part


@dataclass(frozen=True)
class PartySettings:
    """Everything a party daemon needs; no secrets here, only where they live."""

    state_dir: Path  # keys, certificates, owners.json, uploads, jobs, audit log
    index: int  # 0..3: Alice, Bob, Carol, Dave
    listen: str = "127.0.0.1:0"  # control plane (gRPC, mutual TLS); port 0 in tests
    tls_name: str | None = None  # control-plane certificate name; default the party's name
    mpc_host: str = "127.0.0.1"  # where peers reach this party's engine (GetIdentity)
    mpc_port_base: int = 14000  # this party's first engine port
    mpc_port_count: int = 1  # engine ports base..base+count-1; the gateway rotates jobs over them
    mpc_bind_host: str | None = None  # engine listens here only (None: every interface)
    engines: tuple[str, ...] = ("mp-spdz", "mpyc")  # offered when usable here
    mpspdz_home: Path | None = None  # default: $MPSPDZ_HOME, else /opt/mp-spdz
    mpspdz_cache: Path | None = None  # compiled programs; default <state>/cache/mpspdz
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD
    job_timeout: float | None = None  # engine time limit per run; None: engine default
    stop_grace: float = 5.0  # seconds in-flight calls get on SIGTERM
    port_file: Path | None = None  # write the bound control-plane port here (port 0)
    metrics_listen: str | None = None  # Prometheus /metrics, plain HTTP, internal; None: off
    max_concurrent_jobs: int = 1  # engine runs at once; later jobs wait queued for a slot

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(PARTY_NAMES):
            raise ParameterError(f"party index must be 0..{len(PARTY_NAMES) - 1}")
        if not 1 <= self.mpc_port_count <= 1000 or self.mpc_port_base + self.mpc_port_count > 65536:
            raise ParameterError("mpc_port_count must be 1..1000 and the range end below 65536")
        if not 1 <= self.max_concurrent_jobs <= 64:
            raise ParameterError("max_concurrent_jobs must be 1..64")
        if self.max_upload_bytes < 1:
            raise ParameterError("max_upload_bytes must be positive")

    @property
    def name(self) -> str:
        return PARTY_NAMES[self.index]

    @property
    def control_name(self) -> str:
        return self.tls_name or self.name.lower()
