"""The dev stack's MPC ports: below the ephemeral range (an outgoing connection can never
take one a party is about to bind), or as the caller chose, with each party's extra
``ppfs party serve`` arguments (a benchmark's relays). Its metrics ports lie there too (a
daemon binding port 0 can never take one), and a port a daemon finds busy is reported as
it is: --port is named only when it was the gateway's."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest
from ppfs_cli.devstack import MPC_PORTS, Stack, StackLayout

from ppfs.durable import ephemeral_port_floor, free_port_ranges
from ppfs.errors import ParameterError, PpfsError


def test_port_ranges_lie_below_the_ephemeral_range_and_are_free() -> None:
    floor = ephemeral_port_floor()
    bases = free_port_ranges(4, 16)
    ports = [b + j for b in bases for j in range(16)]
    assert len(set(ports)) == len(ports)  # disjoint
    assert all(1024 <= p < floor for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


class _Started(Exception):
    """Stops Stack.start at the gateway: the parties' command lines are what counts."""


def _party_argvs(stack: Stack) -> list[list[str]]:
    argvs: list[list[str]] = []

    async def spawn(name: str, argv: list[str]) -> Any:
        if name == "gateway":
            raise _Started
        argvs.append(argv)
        return object()

    async def port(name: str, proc: Any, path: Path) -> int:
        return 40000 + len(argvs)

    stack._spawn = spawn  # type: ignore[method-assign]
    stack._port = port  # type: ignore[method-assign]
    with pytest.raises(_Started):
        asyncio.run(stack.start(0, 2))
    return argvs


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_default_mpc_ports_lie_below_the_ephemeral_range(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path, 3, party_dirs=[tmp_path / f"p{i}" for i in range(3)])
    (tmp_path / "gateway").mkdir()
    argvs = _party_argvs(Stack(layout))
    bases = [int(_value(a, "--mpc-port")) for a in argvs]
    assert all(b + MPC_PORTS <= ephemeral_port_floor() for b in bases)
    assert all(_value(a, "--mpc-port-count") == str(MPC_PORTS) for a in argvs)
    assert not any("--mpc-dial" in a for a in argvs)


def test_metrics_ports_lie_below_the_ephemeral_range(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path, 3, party_dirs=[tmp_path / f"p{i}" for i in range(3)])
    (tmp_path / "gateway").mkdir()
    stack = Stack(layout)
    argvs = _party_argvs(stack)
    mpc = {int(_value(a, "--mpc-port")) + j for a in argvs for j in range(MPC_PORTS)}
    ports = [int(url.split(":")[2].split("/")[0]) for url in stack.metrics.values()]
    assert len(ports) == 4 and len(set(ports)) == 4  # three parties and the gateway
    assert all(1024 <= p < ephemeral_port_floor() for p in ports)
    assert not set(ports) & mpc
    assert [int(_value(a, "--metrics-listen").rsplit(":", 1)[1]) for a in argvs] == ports[:3]


class _Exited:
    returncode = 1


def test_a_busy_port_is_reported_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    stack = Stack(StackLayout(tmp_path, 3))
    stack.gateway_port = 8080
    (tmp_path / "logs" / "carol.log").write_text(
        "Carol listening on port 38639\n"
        "ppfs party serve: error: [Errno 98] Address already in use\n")
    with pytest.raises(PpfsError) as exc:
        asyncio.run(stack._port("carol", _Exited(), tmp_path / "none"))  # type: ignore[arg-type]
    assert not isinstance(exc.value, ParameterError)  # not the operator's mistake
    assert "carol could not bind a port" in str(exc.value) and "Errno 98" in str(exc.value)
    assert "--port" not in str(exc.value)
    (tmp_path / "logs" / "gateway.log").write_text(
        "ERROR [Errno 98] error while attempting to bind on address ('127.0.0.1', 8080): "
        "address already in use\n")
    with pytest.raises(ParameterError, match="port 8080 is in use; pass --port"):
        asyncio.run(stack._port("gateway", _Exited(), tmp_path / "none"))  # type: ignore[arg-type]


def test_caller_chooses_mpc_ports_and_extra_party_arguments(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path, 3, party_dirs=[tmp_path / f"p{i}" for i in range(3)])
    (tmp_path / "gateway").mkdir()
    extra = {0: ["--mpc-dial", "1=127.0.0.1:+4"], 2: ["--mpc-dial", "Alice=127.0.0.1:+12"]}
    stack = Stack(layout, mpc_port_bases=[20000, 20016, 20032], party_args=extra)
    argvs = _party_argvs(stack)
    assert [_value(a, "--mpc-port") for a in argvs] == ["20000", "20016", "20032"]
    assert argvs[0][-2:] == extra[0] and argvs[2][-2:] == extra[2]
    assert "--mpc-dial" not in argvs[1]
    # kept for a restart: the party process's argv is the one it was started with
    assert [p.argv for p in stack.parties] == argvs


def test_stack_refuses_bad_ports_and_unknown_parties(tmp_path: Path) -> None:
    layout = StackLayout(tmp_path, 3)
    with pytest.raises(ParameterError, match="one first port per party"):
        Stack(layout, mpc_port_bases=[20000, 20016])
    with pytest.raises(ParameterError, match="one first port per party"):
        Stack(layout, mpc_port_bases=[20000, 20016, 65534])
    with pytest.raises(ParameterError, match="no party 3"):
        Stack(layout, party_args={3: ["--mpc-dial", "0=127.0.0.1:+4"]})


def test_control_ports_lie_below_the_ephemeral_range(tmp_path: Path) -> None:
    """A party started again binds the control port the gateway's config names: drawn
    below the ephemeral range, no outgoing connection can hold it meanwhile."""
    layout = StackLayout(tmp_path, 3, party_dirs=[tmp_path / f"p{i}" for i in range(3)])
    (tmp_path / "gateway").mkdir()
    stack = Stack(layout)
    argvs = _party_argvs(stack)
    control = [int(_value(a, "--listen").rsplit(":", 1)[1]) for a in argvs]
    assert all(_value(a, "--listen").startswith("127.0.0.1:") for a in argvs)
    assert all(1024 <= p < ephemeral_port_floor() for p in control)
    mpc = {int(_value(a, "--mpc-port")) + j for a in argvs for j in range(MPC_PORTS)}
    metrics = {int(url.split(":")[2].split("/")[0]) for url in stack.metrics.values()}
    assert len(set(control)) == 3 and not set(control) & (mpc | metrics)
