"""What network latency costs: Step 2A (and 2A + 2B) with a delay between every pair.

All parties run on this machine, but each one dials its peers through a delaying
relay (bench/delayrelay.py: a userspace TCP relay on loopback that holds every chunk
for half the round-trip time in each direction, in order, without throttling). Each
party gets its own peer address list (MP-SPDZ's HOSTS file: its own real port, a
relay for every peer), through the engine's ``peer_view`` option.

Per data-set shape (synthetic data) and security setting, runs: the direct loopback
figure, then through the relays at each RTT (default 0, 1 and 20 ms; 0 ms measures
what the relay itself adds). Reports the MPC time (launch to exit of the last party,
compile excluded), bytes and rounds per party, the relays' measured one-way hold,
and checks the estimate

    time(RTT) ~= time(relay, 0 ms) + rounds x RTT

by printing the fitted factor (time(RTT) - time(relay, 0 ms)) / (rounds x RTT), with
rounds = the largest per-party round count MP-SPDZ reports.

    .venv/bin/python bench/latency.py [--datasets CogLoad,LSVT] [--settings passive-3pc]
        [--rtt 0,1,20] [--programs 2A,2A+2B] [--write bench/results/latency.md]

The report is rewritten after each completed group of rows, so a run cut short keeps
what it measured. A failed run is a row saying so; its parties' logs are kept (the
path is printed).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PAPER, machine_description
from delayrelay import ProcessMesh, RelayMesh
from step2b import PARAMS, oracle_gap

from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.errors import EngineError
from ppfs.fixedpoint import FixedPoint
from ppfs.local import Selection, run_select
from ppfs.step2a import Security, Step2AShape, mirror
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable


@dataclass
class Measured:
    network: str  # "loopback" or "relay"
    rtt_ms: float
    seconds: float
    bytes_sent: int
    rounds: list[int]
    hold_ms: float  # relays' mean one-way hold per chunk (0 for loopback)
    ok: bool
    failed: str = ""


def _correct(sel: Selection, table: LabelledTable, k: int, train: TrainParams | None) -> bool:
    fp = FixedPoint()
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, Step2AShape(table.m, table.p, table.n_classes, k))
    if not np.array_equal(sel.indices, ref.selected):
        return False
    if train is None:
        return bool(np.array_equal(sel.reduced_raw, ref.reduced))
    gap, tol = oracle_gap(sel, table, k, train)
    return gap <= tol


# which relay carries the traffic: "process" (one epoll relay process for every pair,
# at real-time priority where permitted) or "thread" (asyncio relays in a thread here)
RELAY_KIND = ["process"]
IMPL_NAMES = {"c": "C (bench/delayrelay.c)", "python": "Python"}
RELAY_IMPL = ["auto"]  # the relay process's implementation asked for (RelayProcess)
RELAY_RAN: set[str] = set()  # and the ones that ran


def run_once(table: LabelledTable, k: int, sec: Security, rtt_ms: float | None,
             train: TrainParams | None) -> Measured:
    mesh: RelayMesh | ProcessMesh | None = None
    if rtt_ms is not None:
        mesh = (ProcessMesh(rtt_ms / 2000, RELAY_IMPL[0]) if RELAY_KIND[0] == "process"
                else RelayMesh(rtt_ms / 2000))
    tmp = tempfile.mkdtemp(prefix="ppfs-bench-")
    try:
        engine = MpSpdzEngine(mpspdz_home(), peer_view=mesh.view if mesh else None)
        try:
            sel = asyncio.run(run_select(table, k, sec, engine, Path(tmp), train=train,
                                         reveal_reduced=train is None))
        except EngineError as exc:
            print(f"run failed ({exc}); logs kept in {tmp}/mpspdz", file=sys.stderr)
            return Measured("relay" if mesh else "loopback", rtt_ms or 0.0, 0.0, 0, [], 0.0,
                            False, failed=str(exc))
        shutil.rmtree(tmp, ignore_errors=True)
        hold = mesh.totals().hold_mean * 1e3 if mesh else 0.0
    finally:
        if mesh:
            if isinstance(mesh, ProcessMesh) and mesh.proc is not None:
                RELAY_RAN.add(mesh.implementation)
            mesh.close()
    run = sel.run
    return Measured("relay" if mesh else "loopback", rtt_ms or 0.0, run.seconds,
                    run.bytes_sent, [p.rounds for p in run.parties], hold,
                    _correct(sel, table, k, train))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", default="passive-3pc")
    ap.add_argument("--datasets", default="CogLoad,LSVT")
    ap.add_argument("--rtt", default="0,1,20", help="round-trip times in ms")
    ap.add_argument("--programs", default="2A", help="2A and/or 2A+2B (Step 2B on top)")
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--relay", choices=["process", "thread"], default="process",
                    help="relays in a process of their own (default) or in a thread here")
    ap.add_argument("--relay-impl", choices=["auto", "c", "python"], default="auto",
                    help="the relay process's implementation: c (bench/delayrelay.c, built "
                         "with the machine's C compiler), python, or auto (c when it builds)")
    args = ap.parse_args()
    RELAY_KIND[0] = args.relay
    RELAY_IMPL[0] = args.relay_impl
    settings = [Security(s) for s in args.settings.split(",")]
    wanted = set(args.datasets.split(","))
    rtts = [float(v) for v in args.rtt.split(",")]
    header = ("| data set | program | setting | network | RTT (ms) | measured one-way hold (ms) "
              "| MPC time (s) | sent (MB) | rounds per party | added / (rounds x RTT) "
              "| added / (rounds x measured RTT) | estimate (s) | correct |")
    sep = "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    print(header)
    print(sep)
    rows = []
    load = os.getloadavg()
    for ds in PAPER:
        if ds.name not in wanted:
            continue
        table = make_table(ds.m, ds.p, seed=1)
        programs: list[tuple[str, TrainParams | None]] = []
        for prog in args.programs.split(","):
            programs.append(("2A", None) if prog == "2A" else ("2A + 2B", PARAMS[ds.name]))
        for sec in settings:
            for label, train in programs:
                base = run_once(table, ds.k, sec, None, train)
                results = [base]
                relay0: Measured | None = None
                for rtt in rtts:
                    r = run_once(table, ds.k, sec, rtt, train)
                    results.append(r)
                    if rtt == 0:
                        relay0 = r
                for r in results:
                    rounds = max(r.rounds) if r.rounds else 0
                    fit = fit_m = est = "-"
                    if r.network == "relay" and r.rtt_ms > 0 and rounds:
                        start = relay0.seconds if relay0 is not None else base.seconds
                        added = r.seconds - start
                        fit = f"{added / (rounds * r.rtt_ms / 1e3):.2f}"
                        if r.hold_ms > 0:
                            fit_m = f"{added / (rounds * 2 * r.hold_ms / 1e3):.2f}"
                        est = f"{base.seconds + rounds * r.rtt_ms / 1e3:.1f}"
                    if r.failed:
                        row = (f"| {ds.name} | {label} | {sec.value} | {r.network} | "
                               f"{r.rtt_ms:g} | failed: {r.failed} |||||||| NO |")
                        print(row, flush=True)
                        rows.append(row)
                        continue
                    row = (f"| {ds.name} | {label} | {sec.value} | {r.network} | "
                           f"{r.rtt_ms:g} | {r.hold_ms:.2f} | {r.seconds:.2f} | "
                           f"{r.bytes_sent / 1e6:.0f} | "
                           f"{' / '.join(f'{v:,}' for v in r.rounds)} | {fit} | {fit_m} | "
                           f"{est} | "
                           f"{'yes' if r.ok else 'NO'} |")
                    print(row, flush=True)
                    rows.append(row)
                if args.write:
                    write_report(args.write, header, sep, rows, load, args.relay)
    return 0


def write_report(path: Path, header: str, sep: str, rows: list[str],
                 load: tuple[float, float, float], relay: str = "process") -> None:
    text = [
        "# Latency benchmark: what a real network costs",
        "",
        f"Machine: {machine_description()}. Engine: mp-spdz. Measured "
        f"{time.strftime('%Y-%m-%d')}; the machine was shared with other "
        f"work and loaded (load average {load[0]:.1f} at the start), so compare figures "
        "within a row group only.",
        "",
        "Synthetic data of each paper data set's shape. 'loopback': the parties talk "
        "directly. 'relay': every party dials each peer through a userspace TCP relay "
        "(bench/delayrelay.py) that holds each chunk RTT/2 in each direction; 0 ms shows "
        "what the relay itself adds. "
        + (f"The relays run as one epoll process of their own (RelayProcess, in "
           f"{' and '.join(IMPL_NAMES[i] for i in sorted(RELAY_RAN)) or 'none ran'}). "
           if relay == "process" else "The relays run in a thread of the benchmark. ")
        + "Measured one-way hold: the relays' mean time between "
        "reading a chunk and forwarding it (the real one-way delay, above the nominal "
        "RTT/2 by asyncio's millisecond timer granularity and the load). MPC time: launch "
        "of the parties to the exit of the last one, compile excluded. Sent: all parties. "
        "Rounds: as MP-SPDZ reports them per party. 'added / (rounds x RTT)': the time "
        "the delay added over the relay at 0 ms, divided by the largest per-party round "
        "count times the RTT (1 = each round costs one full RTT); with measured RTT = twice "
        "the measured one-way hold. Estimate: loopback time + rounds x RTT. Correct: "
        "selection (and D' or the model) equal the plaintext mirror / oracle.",
        "",
        header,
        sep,
        *rows,
        "",
    ]
    path.write_text("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
