"""``ppfs party serve --mpc-dial``: where a party dials its peers' engines.

The option's parsing and validation (pure), the dial list a job gets (the peer's job
port shifted, its own entry never touched), the MPyC engine's use of it, and a job
through real party daemons whose MPC traffic crosses delaying relays (one relay
process, one relay per ordered pair of parties, on the peers' job ports shifted):
the result equals the plaintext mirror and every engine connection went through a
relay, each chunk held at least the delay.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from party_harness import Deployment
from ppfs_cli.main import build_parser
from ppfs_party.commands import _settings
from ppfs_party.config import MpcDial, PartySettings
from test_party_flow import run_scenario

from ppfs.durable import free_port_ranges
from ppfs.engines.base import PartyRunSpec, PartyTls
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import ParameterError
from ppfs.step2a import Security, Step2AShape
from ppfs.synthetic import make_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from delayrelay import RelayProcess

_reason = MpSpdzEngine(mpspdz_home()).unavailable_reason()
needs_mpspdz = pytest.mark.skipif(_reason is not None, reason=f"MP-SPDZ not available: {_reason}")

DELAY = 0.002  # one-way, seconds


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize(("text", "expected"), [
    ("1=127.0.0.1:+8", MpcDial(1, "127.0.0.1", shift=8)),
    ("Carol=relay.internal:-3", MpcDial(2, "relay.internal", shift=-3)),
    ("dave=10.0.0.4:15000", MpcDial(3, "10.0.0.4", port=15000)),
    (" alice = [::1]:+4 ", MpcDial(0, "::1", shift=4)),
])
def test_parse(text: str, expected: MpcDial) -> None:
    assert MpcDial.parse(text) == expected


@pytest.mark.parametrize(("text", "message"), [
    ("Eve=127.0.0.1:+4", "unknown party 'Eve'"),
    ("4=127.0.0.1:+4", "unknown party '4'"),
    ("-1=127.0.0.1:+4", "unknown party"),
    ("Bob127.0.0.1:+4", "expected PARTY=HOST:PORT"),
    ("Bob=127.0.0.1", "expected PARTY=HOST:PORT"),
    ("Bob=:+4", "expected PARTY=HOST:PORT"),
    ("Bob=127.0.0.1:0", "port must be 1..65535"),
    ("Bob=127.0.0.1:65536", "port must be 1..65535"),
    ("Bob=127.0.0.1:http", "port must be 1..65535"),
    ("Bob=127.0.0.1:+", "shift must be +N or -N"),
    ("Bob=127.0.0.1:+4x", "shift must be +N or -N"),
    ("Bob=127.0.0.1:+70000", "leaves the ports 1..65535"),
])
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(ParameterError, match=re.escape(message)):
        MpcDial.parse(text)


def test_settings_refuse_own_index_duplicates_and_fixed_ports_with_rotation(
        tmp_path: Path) -> None:
    bob = MpcDial.parse("Bob=127.0.0.1:+8")
    with pytest.raises(ParameterError, match="names this party itself"):
        PartySettings(state_dir=tmp_path, index=1, mpc_dial=(bob,))
    with pytest.raises(ParameterError, match="names Bob twice"):
        PartySettings(state_dir=tmp_path, index=0,
                      mpc_dial=(bob, MpcDial.parse("1=127.0.0.1:+4")))
    fixed = MpcDial.parse("Bob=127.0.0.1:15000")
    with pytest.raises(ParameterError, match="fixed port needs --mpc-port-count 1"):
        PartySettings(state_dir=tmp_path, index=0, mpc_port_count=4, mpc_dial=(fixed,))
    PartySettings(state_dir=tmp_path, index=0, mpc_port_count=1, mpc_dial=(fixed,))


def test_dial_follows_the_job_port_and_keeps_the_own_entry(tmp_path: Path) -> None:
    s = PartySettings(state_dir=tmp_path, index=1, mpc_port_base=20000, mpc_port_count=4,
                      mpc_dial=(MpcDial.parse("0=127.0.0.2:+8"),
                                MpcDial.parse("Dave=127.0.0.3:-2")))
    peers = (("10.0.0.1", 21002), ("10.0.0.2", 20002), ("10.0.0.3", 22002))
    # Dave takes no part in a 3-party job: his entry is not used; Carol's is as listed
    assert s.dial_for(peers) == (("127.0.0.2", 21010), peers[1], peers[2])
    four = (*peers, ("10.0.0.4", 23003))
    assert s.dial_for(four) == (("127.0.0.2", 21010), four[1], four[2], ("127.0.0.3", 23001))
    assert PartySettings(state_dir=tmp_path, index=1).dial_for(peers) is None
    with pytest.raises(ParameterError, match=re.escape("shifted by -2 is 0, outside 1..65535")):
        s.dial_for((*peers, ("10.0.0.4", 2)))
    # a shift past 65535 likewise
    up = PartySettings(state_dir=tmp_path, index=1, mpc_dial=(MpcDial.parse("0=h:+10"),))
    with pytest.raises(ParameterError, match=re.escape("outside 1..65535")):
        up.dial_for((("h", 65530), ("h", 1000), ("h", 1001)))


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["party", "serve", "--state-dir", str(tmp_path), "--index", "0",
            "--mpc-port-count", "4"]
    args = build_parser("party").parse_args(
        [*base, "--mpc-dial", "Bob=127.0.0.1:+8", "--mpc-dial", "2=127.0.0.1:+12"])
    assert _settings(args).mpc_dial == (MpcDial(1, "127.0.0.1", shift=8),
                                        MpcDial(2, "127.0.0.1", shift=12))
    assert _settings(build_parser("party").parse_args(base)).mpc_dial == ()
    # refused before anything starts, with the reason, exit code 2
    for bad, message in (("Alice=127.0.0.1:+4", "names this party itself"),
                         ("Zed=127.0.0.1:+4", "unknown party"),
                         ("Bob=127.0.0.1:15000", "fixed port needs --mpc-port-count 1")):
        args = build_parser("party").parse_args([*base, "--mpc-dial", bad])
        assert args.func(args) == 2
        err = capsys.readouterr().err
        assert "ppfs party serve: error:" in err and message in err


# ------------------------------------------------------------------ MPyC engine


def test_mpyc_worker_dials_the_dial_addresses(tmp_path: Path) -> None:
    peers = (("127.0.0.1", 5000), ("127.0.0.1", 5001), ("127.0.0.1", 5002))
    for f in ("k", "c", "ca"):
        (tmp_path / f).write_text("")
    tls = PartyTls(tmp_path / "k", tmp_path / "c", tmp_path / "ca")
    engine = MpycEngine()
    dial = (("127.0.0.1", 6000), ("127.0.0.1", 5001), ("127.0.0.2", 6002))
    spec = PartyRunSpec(Security.PASSIVE_3PC, Step2AShape(8, 3, 2, 1), 1, tmp_path,
                        tmp_path / "w", peers, tls, dial=dial)
    engine._prepare_party(spec, 60.0)
    job = json.loads((tmp_path / "w" / "job.json").read_text())
    assert [tuple(a) for a in job["addresses"]] == list(dial)
    # its own entry is where it listens: a dial list that moves it is refused
    moved = replace(spec, workdir=tmp_path / "x",
                    dial=(peers[0], ("127.0.0.1", 6001), peers[2]))
    with pytest.raises(ParameterError, match="own address"):
        engine._prepare_party(moved, 60.0)
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------ through relays


def _relayed_deployment(tmp_path: Path, parties: int, engines: tuple[str, ...],
                        count: int = 2, **overrides: object
                        ) -> tuple[Deployment, list[tuple[int, tuple[str, int]]], list[int]]:
    """Parties with ``count`` MPC ports each, dialling every peer through a relay at the
    peer's job port + count * (own index + 1); returns the relays (listen port,
    target) and each party's first MPC port."""
    dep = Deployment.create(tmp_path, parties, engines=engines, **overrides)
    block = count * (parties + 1)
    first = free_port_ranges(1, parties * block)[0]
    bases = [first + j * block for j in range(parties)]
    relays = []
    for i, s in enumerate(dep.settings):
        dial = tuple(MpcDial(j, "127.0.0.1", shift=count * (i + 1))
                     for j in range(parties) if j != i)
        dep.settings[i] = replace(s, mpc_port_base=bases[i], mpc_port_count=count,
                                  mpc_dial=dial)
        relays += [(bases[j] + count * (i + 1) + o, ("127.0.0.1", bases[j] + o))
                   for j in range(parties) if j != i for o in range(count)]
    return dep, relays, bases


def _run_through_relays(tmp_path: Path, engine: str, **overrides: object) -> None:
    dep, relays, bases = _relayed_deployment(tmp_path, 3, (engine,), **overrides)
    peers = [f"127.0.0.1:{b + 1}" for b in bases]  # each party's second port
    table = make_table(30, 5, seed=4)
    with RelayProcess(relays, DELAY, priority=False) as relay:
        asyncio.run(run_scenario(dep, table, 2, Security.PASSIVE_3PC, engine, "horizontal",
                                 peers=peers))
        report = relay.stats()
    used = {int(p): st for p, st in report["relays"].items() if st["connections"]}
    # every engine connection crossed a relay, and only those of the job's ports
    assert used and all((port - bases[0]) % 2 == 1 for port in used)
    for port, st in used.items():
        for direction in ("to_target", "from_target"):
            d = st[direction]
            if d["chunks"]:
                assert d["hold_sum"] / d["chunks"] >= DELAY, port
    assert report["bytes"] > 1000 and report["hold_mean_ms"] >= DELAY * 1e3
    accepted = [json.loads(line) for line in
                (dep.settings[0].state_dir / "audit.log").read_text().splitlines()
                if '"job.accepted"' in line]
    assert accepted[0]["dial"] == ["Bob=127.0.0.1:+2", "Carol=127.0.0.1:+2"]


def test_mpyc_job_through_relays_matches_mirror(tmp_path: Path) -> None:
    _run_through_relays(tmp_path, "mpyc")


@needs_mpspdz
@pytest.mark.mpspdz
def test_mpspdz_job_through_relays_matches_mirror(tmp_path: Path) -> None:
    _run_through_relays(tmp_path, "mp-spdz", mpspdz_cache=tmp_path / "cache")
