"""Gateway settings: one typed object, built in ``main()`` from a config file and
the environment, and passed down. Nothing here is read at import time.

The config file is JSON::

    {
      "state_dir": "/var/lib/ppfs-gateway",
      "parties": [{"address": "alice:7000", "tls_server_name": "Alice"}, ...],
      "tls": {"ca_cert": "ca.pem", "client_cert": "gw.pem", "client_key": "gw.key"},
      "tokens_file": "tokens.json",
      "https_cert": "https.pem", "https_key": "https.key",    (optional)
      "max_concurrent_jobs": 2,                               (optional, default 1)
      "stall_floor_seconds": 600,                             (optional, default 60)
      "revocation_list": "revocations.json"                   (optional)
    }

and the tokens file a list of ``{"token": ..., "role": ..., "subject": ...}``, each
optionally with ``"expires_at": "2027-01-31T00:00:00Z"`` (UTC; without it the token does
not expire). The gateway reads the tokens file again on SIGHUP. ``revocation_list`` is
the deployment CA's revocation list (``ppfs pki revocations``), served to clients with
the parties' identities; read again when it changes and on SIGHUP. Relative paths are taken
relative to the config file. Tokens are secrets: they are held as
:class:`pydantic.SecretStr` and never logged or echoed.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ppfs.errors import ParameterError

CONFIG_ENV = "PPFS_GATEWAY_CONFIG"
TOKENS_ENV = "PPFS_GATEWAY_TOKENS_FILE"
EXPIRES_AT_FORM = 'an ISO 8601 time with its zone, such as "2027-01-31T00:00:00Z"'
DEFAULT_STALL_FLOOR_SECONDS = 60.0
MAX_STALL_FLOOR_SECONDS = 86_400.0  # the longest --stall-timeout a party takes
STALL_FLOOR_FORM = (
    "stall_floor_seconds is the smallest --stall-timeout of any party, 0 .. 86400 "
    "seconds (0: no floor)"
)


class Role(enum.StrEnum):
    DATA_OWNER = "data_owner"
    ANALYST = "analyst"
    ADMIN = "admin"


class TokenEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    token: SecretStr = Field(min_length=16, description="bearer token (secret)")
    role: Role
    subject: str = Field(
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="owner id of a data owner, or the analyst's / admin's id",
    )
    # the token's end (UTC); None: it does not expire
    expires_at: dt.datetime | None = Field(
        default=None, description='ISO 8601 UTC time, e.g. "2027-01-31T00:00:00Z"'
    )

    @field_validator("expires_at", mode="before")
    @classmethod
    def _utc_time(cls, v: Any) -> Any:
        # a time written out, with its zone: not a bare number (seconds? milliseconds?)
        # nor a local time that means another instant on each host
        if v is None or isinstance(v, dt.datetime):
            parsed = v
        elif isinstance(v, str):
            try:
                parsed = dt.datetime.fromisoformat(v)
            except ValueError:
                raise ValueError(EXPIRES_AT_FORM) from None
        else:
            raise ValueError(EXPIRES_AT_FORM)
        if parsed is not None and parsed.utcoffset() is None:
            raise ValueError(EXPIRES_AT_FORM)
        try:
            return None if parsed is None else parsed.astimezone(dt.UTC)
        except OverflowError:  # a time its zone holds but UTC does not (year 1 or 9999)
            raise ValueError(EXPIRES_AT_FORM) from None


class PartyEndpoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = Field(min_length=3, description="host:port of the party's control plane")
    tls_server_name: str = Field(min_length=1, description="name in the party's certificate")


class TlsSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ca_cert: Path
    client_cert: Path
    client_key: Path


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    state_dir: Path
    parties: tuple[PartyEndpoint, ...]
    tls: TlsSettings
    tokens: tuple[TokenEntry, ...]
    # where the tokens were read from (None: from the config itself); read again on SIGHUP
    tokens_file: Path | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8443, ge=0, le=65535)
    max_upload_bytes: int = Field(default=256 << 20, ge=1024)
    party_lost_seconds: float = Field(default=60.0, gt=0)
    # the smallest stall limit (`ppfs party serve --stall-timeout`) any party of the
    # deployment uses; every party's is 0 (no stall watch) or at least this. A party
    # reporting a stall after less is taken to have waited this long, so a party that
    # stopped its own engine and claims a short stall is named all the same
    # (ppfs_gateway.jobs.refuted_stall). 0: no floor, a claimed stall is taken at its word
    stall_floor_seconds: float = DEFAULT_STALL_FLOOR_SECONDS
    # a call a party answers at once (its identity, what it holds, starting, cancelling
    # or reporting a job): a party silent for this long is named as not answering (frozen
    # or overloaded), so a submit fails within seconds instead of waiting on it
    party_rpc_seconds: float = Field(default=5.0, gt=0)
    # a call that moves a sealed result part, which may be large; also the cap of an
    # upload part's deadline, which is party_rpc_seconds plus a second per 256 KiB of the
    # part (ppfs_gateway.parties.upload_part_seconds)
    party_transfer_seconds: float = Field(default=120.0, gt=0)
    # jobs running side by side (started in submission order); capped by the smallest
    # party MPC port range, as each running job holds one port of every party
    max_concurrent_jobs: int = Field(default=1, ge=1, le=64)
    # HTTPS for the REST API (bearer tokens travel in every request): certificate and key
    # files; without them the gateway speaks plain HTTP (localhost or behind a TLS proxy)
    https_cert: Path | None = None
    https_key: Path | None = None
    # Prometheus metrics without authentication on a separate plain-HTTP listener
    # ("HOST:PORT", internal networks only); GET /metrics on the API needs an admin token
    metrics_listen: str | None = None
    # the deployment CA's revocation list (`ppfs pki revocations`), served with the
    # parties' identities; clients require it for key statements that ask for it
    revocation_list: Path | None = None

    @model_validator(mode="after")
    def _https_pair(self) -> Settings:
        if (self.https_cert is None) != (self.https_key is None):
            raise ValueError("give both https_cert and https_key, or neither")
        return self

    @field_validator("stall_floor_seconds")
    @classmethod
    def _stall_floor(cls, v: float) -> float:
        if not 0 <= v <= MAX_STALL_FLOOR_SECONDS:
            raise ValueError(STALL_FLOOR_FORM)
        return v

    @field_validator("parties")
    @classmethod
    def _three_or_four(cls, v: tuple[PartyEndpoint, ...]) -> tuple[PartyEndpoint, ...]:
        if len(v) not in (3, 4):
            raise ValueError(f"a deployment has 3 or 4 parties, not {len(v)}")
        return v

    @field_validator("tokens")
    @classmethod
    def _distinct(cls, v: tuple[TokenEntry, ...]) -> tuple[TokenEntry, ...]:
        problem = token_set_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @property
    def db_path(self) -> Path:
        return self.state_dir / "registry.sqlite3"


def token_set_problem(entries: tuple[TokenEntry, ...]) -> str | None:
    """What makes ``entries`` unusable as a whole, if anything (never a value)."""
    secrets = [t.token.get_secret_value() for t in entries]
    if len(set(secrets)) != len(secrets):
        return "two principals share a token"
    if not entries:
        return "configure at least one token"
    return None


def read_tokens_file(path: Path) -> tuple[TokenEntry, ...]:
    """The entries of a tokens file, checked as a whole, as at start and on a reload.

    ParameterError names the file, the entry (counted from 1) and its fields, never a
    value: a token could be among them."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        # (a JSON error names a line and column, not the text there)
        raise ParameterError(f"{path}: cannot read the tokens file ({exc})") from None
    if not isinstance(raw, list):
        raise ParameterError(f"{path}: the tokens file is not a JSON list of entries")
    entries = []
    for n, item in enumerate(raw, 1):
        try:
            entries.append(TokenEntry.model_validate(item))
        except ValidationError as exc:
            raise ParameterError(f"{path}: tokens file entry {n} of {len(raw)}: "
                                 f"{_fields_wrong(exc)}") from None
    problem = token_set_problem(tuple(entries))
    if problem is not None:
        raise ParameterError(f"{path}: {problem}")
    return tuple(entries)


def _fields_wrong(exc: ValidationError) -> str:
    """"invalid FIELD, ..." with what expires_at should look like (no value echoed)."""
    fields = sorted({".".join(str(p) for p in e["loc"]) or "the entry" for e in exc.errors()})
    hint = f" (expires_at is {EXPIRES_AT_FORM})" if "expires_at" in fields else ""
    return f"invalid {', '.join(fields)}{hint}"


def _resolve(base: Path, value: Any) -> Any:
    return str(base / value) if isinstance(value, str) and not Path(value).is_absolute() else value


def load_settings(
    path: Path | None = None, env: Mapping[str, str] | None = None, **overrides: Any
) -> Settings:
    """Read the config file (``path`` or ``$PPFS_GATEWAY_CONFIG``) and its tokens file."""
    env = os.environ if env is None else env
    where = path or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    if where is None:
        raise ParameterError(f"no gateway config: pass --config or set {CONFIG_ENV}")
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ParameterError(f"{where}: cannot read the gateway config ({exc})") from None
    base = where.parent
    raw["state_dir"] = _resolve(base, raw.get("state_dir", "."))
    for key in ("https_cert", "https_key", "revocation_list"):
        if raw.get(key):
            raw[key] = _resolve(base, raw[key])
    if isinstance(raw.get("tls"), dict):
        raw["tls"] = {k: _resolve(base, v) for k, v in raw["tls"].items()}
    tokens_file = raw.pop("tokens_file", None) or env.get(TOKENS_ENV)
    if tokens_file is not None and "tokens" not in raw:
        tf = Path(_resolve(base, tokens_file))
        raw["tokens"] = read_tokens_file(tf)
        raw["tokens_file"] = tf
    raw.update(overrides)
    try:
        return Settings.model_validate(raw)
    except ValidationError as exc:
        # the message names fields, never values (a token could be among them)
        fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors()})
        hint = f" ({STALL_FLOOR_FORM})" if "stall_floor_seconds" in fields else ""
        raise ParameterError(f"{where}: invalid gateway config in {', '.join(fields)}"
                             f"{hint}") from None
