"""Jobs per hour through the service with 1, 2 and 4 jobs side by side, at each RTT.

A local stack (``ppfs up``'s: three party daemons and the gateway as processes, mutual
TLS, loopback) runs a mix of CogLoad-shaped (632 x 120, k 12) and SPEED-shaped
(8378 x 122, k 67; ``--speed-scale`` shrinks its rows and k for a quick run) Step 2A
jobs on synthetic data (ppfs.synthetic.make_table), passive-3pc on MP-SPDZ. For each
concurrency the stack is started with ``--max-concurrent-jobs N`` on the same state
(data uploaded once, compiled programs cached by a warm-up job of each shape), the
whole mix is submitted at once, and jobs per hour = jobs / (first submission to last
final state). Every result is fetched and checked against the plaintext mirror.

Each RTT level (``--rtt-ms``) runs the whole concurrency list. 0 ms: the parties talk
directly on loopback. Above 0: every party dials every peer through a delaying relay
(bench/delayrelay.py, RelayProcess: one process of its own, real-time priority when
permitted; in C, bench/delayrelay.c, when the machine's C compiler builds it, as it
shares the cores with the stack: ``--relay python`` for the Python one) that holds
each chunk RTT/2 in each direction, one relay per ordered pair of parties, so each
connection crosses one relay and a round trip gains the RTT. The relays sit on each
peer's job port shifted by a fixed number (party i reaches party j at j's job port +
4(i+1); ``ppfs party serve --mpc-dial j=127.0.0.1:+N``), since an engine listens on
its port on every address; every MPC port lies below the ephemeral range, so no
outgoing connection can take one.

Per run it records the relays' measured one-way hold (mean per chunk, over the timed
jobs only) and the share of the machine's cores the stack got: CPU seconds of the
gateway, the parties and their (reaped) engine processes over the timed window, from
/proc, divided by wall time x cores; the relay process's own share beside it, and how
busy the machine's cores were with anything (other work included).
``--repeat N`` runs every level N times (interleaved): the fastest run is the row's
figure, every run's seconds are listed.

    .venv/bin/python bench/throughput.py [--concurrency 1,2,4] [--jobs 8]
        [--speed-scale 0.1] [--rtt-ms 0,1] [--repeat 1] [--write bench/results/throughput.md]

The report is written only from a completed run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_description
from delayrelay import IMPLEMENTATIONS, RelayProcess, report_totals
from ppfs_cli.devstack import MPC_PORTS, Stack, prepare
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient, OwnerTable

from ppfs.durable import free_port_ranges
from ppfs.fixedpoint import FixedPoint
from ppfs.keycert import TrustAnchor
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable

PARTIES = 3
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def shapes(speed_scale: float) -> list[tuple[str, int, int, int]]:
    m = max(40, round(8378 * speed_scale))
    k = max(4, min(67, round(67 * speed_scale)))
    return [("CogLoad", 632, 120, 12), (f"SPEED x{speed_scale:g}", m, 122, k)]


@dataclass
class Run:
    rtt_ms: float
    concurrent: int
    seconds: float
    jobs: int
    correct: bool
    stack_cpu: float  # CPU seconds of gateway, parties and engines in the timed window
    machine_busy: float  # share of all cores busy (anyone's work) in the timed window
    relay_cpu: float = 0.0
    hold_ms: float = 0.0  # relays' mean one-way hold per chunk in the timed window
    hold_max_ms: float = 0.0
    late_ms: float = 0.0  # the relay's wake-up lateness for due chunks, mean
    late_max_ms: float = 0.0
    by_role: dict[str, float] = field(default_factory=dict)  # CPU seconds per role


@dataclass
class RelayPlan:
    """Where each party listens and where the relays between them sit."""

    bases: list[int]
    relays: list[tuple[int, tuple[str, int]]] = field(default_factory=list)
    party_args: dict[int, list[str]] = field(default_factory=dict)

    @classmethod
    def make(cls, parties: int) -> RelayPlan:
        """Party j: its MPC ports at B_j .. B_j+3; the relay from party i in front of
        them at B_j + 4(i+1) .. (a block of 4(parties+1) ports per party)."""
        block = MPC_PORTS * (parties + 1)
        first = free_port_ranges(1, parties * block)[0]
        plan = cls([first + j * block for j in range(parties)])
        for i in range(parties):
            plan.party_args[i] = []
            for j in range(parties):
                if i == j:
                    continue
                shift = MPC_PORTS * (i + 1)
                plan.party_args[i] += ["--mpc-dial", f"{j}=127.0.0.1:+{shift}"]
                plan.relays += [(plan.bases[j] + shift + o, ("127.0.0.1", plan.bases[j] + o))
                                for o in range(MPC_PORTS)]
        return plan


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def own_and_child_cpu(pid: int) -> tuple[float, float]:
    """(CPU seconds of the process itself, of its children it has reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = [int(v) for v in stat.rsplit(")", 1)[1].split()[11:15]]
    return (fields[0] + fields[1]) / CLOCK_TICKS, (fields[2] + fields[3]) / CLOCK_TICKS


def cpu_by_role(procs: list[tuple[str, int]]) -> dict[str, float]:
    """CPU seconds so far: 'gateway', 'party daemons' (their own Python) and
    'engines' (the MPC processes the daemons started and reaped)."""
    out = {"gateway": 0.0, "party daemons": 0.0, "engines": 0.0}
    for name, pid in procs:
        own, children = own_and_child_cpu(pid)
        if name == "gateway":
            out["gateway"] += own + children
        else:
            out["party daemons"] += own
            out["engines"] += children
    return out


def run_level(root: Path, concurrent: int, data: dict[str, Any], mix: list[str],
              engine: str, rtt_ms: float, priority: list[str], relay_impl: str) -> Run:
    layout = prepare(root, PARTIES)
    relay: RelayProcess | None = None
    if rtt_ms > 0:
        plan = RelayPlan.make(PARTIES)
        relay = RelayProcess(plan.relays, rtt_ms / 2e3, implementation=relay_impl)
        priority.append(f"{relay.implementation}: {relay.priority}")
        stack = Stack(layout, mpc_port_bases=plan.bases, party_args=plan.party_args)
    else:
        stack = Stack(layout)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(stack.start(0, concurrent))
        trust = TrustAnchor.parse(str(layout.root / "ca" / "ca.pem"))
        keys = {s: ClientKeys.load(layout.key_file(s)) for s in ("owner-a", "analyst")}
        with GatewayClient(stack.url, layout.tokens["analyst"], trust=trust,
                           timeout=120) as analyst:
            owner = GatewayClient(stack.url, layout.tokens["owner-a"], trust=trust, timeout=600)
            admin = GatewayClient(stack.url, layout.tokens["admin"], trust=trust)
            for name, d in data.items():  # once per state directory
                if "id" in d:
                    continue
                t: LabelledTable = d["table"]
                ds = owner.create_dataset(f"bench-{name.split()[0].lower()}")["id"]
                owner.upload_table(keys["owner-a"], OwnerTable(
                    t.columns, t.x, t.label_column, t.classes, t.y), ds)
                admin.grant(ds, "analyst")
                owner.consent(keys["owner-a"], ds, "analyst", keys["analyst"].box_public_key)
                exps = np.asarray(owner.get_dataset(ds)["column_exponents"])
                d["id"], d["raw"] = ds, FixedPoint().encode(t.x, exps, t.columns)
                run_jobs(analyst, keys["analyst"], data, [name], engine)  # warm-up: compile
            procs = [(n, p.pid) for n, p in stack.procs]
            roles0, ticks0 = cpu_by_role(procs), cpu_ticks()
            relay0 = relay.reset() if relay else None  # the warm-up's traffic not counted
            seconds, done, (roles1, ticks1) = run_jobs(
                analyst, keys["analyst"], data, mix, engine,
                lambda: (cpu_by_role(procs), cpu_ticks()))
            by_role = {r: roles1[r] - roles0[r] for r in roles0}
            run = Run(rtt_ms, concurrent, seconds, len(done), all(d["correct"] for d in done),
                      sum(by_role.values()),
                      (ticks1[0] - ticks0[0]) / max(1, ticks1[1] - ticks0[1]), by_role=by_role)
            if relay is not None and relay0 is not None:
                relay1 = relay.stats()
                run.relay_cpu = relay1["cpu_seconds"] - relay0["cpu_seconds"]
                held = report_totals(relay1)
                run.hold_ms, run.hold_max_ms = held.hold_mean * 1e3, held.hold_max * 1e3
                run.late_ms, run.late_max_ms = relay1["late_mean_ms"], relay1["late_max_ms"]
            return run
    finally:
        loop.run_until_complete(stack.stop())
        loop.close()
        if relay is not None:
            relay.close()


def run_jobs(analyst: GatewayClient, key: ClientKeys, data: dict[str, Any], mix: list[str],
             engine: str, cpu: Callable[[], Any] = lambda: None
             ) -> tuple[float, list[dict[str, Any]], Any]:
    """Submit the mix at once; (seconds from the first submission until every job is
    final, the final jobs, ``cpu()`` then). Fetching and checking the results come
    after."""
    def submit(name: str) -> dict[str, Any]:
        d = data[name]
        return analyst.submit(key, [d["id"]], label="label", k=d["k"], engine=engine)

    start = time.monotonic()
    with ThreadPoolExecutor(len(mix)) as pool:  # all at once
        jobs = list(pool.map(submit, mix))
    finals = []
    for job in jobs:
        while (got := analyst.get_job(job["id"]))["state"] not in (
                "succeeded", "failed", "cancelled"):
            time.sleep(0.1)
        finals.append(got)
    seconds = time.monotonic() - start
    cpu_at_end = cpu()
    for name, got in zip(mix, finals, strict=True):
        if got["state"] != "succeeded":
            raise SystemExit(f"job {got['id']} ({name}) {got['state']}: {got['error']}")
        d = data[name]
        t = d["table"]
        res = analyst.fetch_result(key, got["id"])
        if "mirror" not in d:
            d["mirror"] = mirror(d["raw"], t.y, Step2AShape(t.m, t.p, t.n_classes, d["k"]))
        got["correct"] = res.indices.tolist() == d["mirror"].selected.tolist()
        got["name"] = name
        print(f"  job {got['id']} {name}: {got['state']}, selection "
              f"{'equals' if got['correct'] else 'DIFFERS FROM'} the mirror's", flush=True)
    return seconds, finals, cpu_at_end


HEADER = ("| RTT (ms) | concurrent | jobs | seconds (fastest; every run) | jobs/hour "
          "| speed-up vs 1 | relay one-way hold, mean / max (ms) "
          "| relay woke late, mean / max (ms) | stack CPU share "
          "| relay CPU share | machine busy | CPU s per job: gateway / party daemons / "
          "engines | all match mirror |")
SEP = "|---:|---:|---:|---|---:|---:|---|---|---:|---:|---:|---|---|"


def row(runs: list[Run], base: Run | None) -> str:
    best = min(runs, key=lambda r: r.seconds)
    cores = os.cpu_count() or 1
    per_hour = best.jobs / best.seconds * 3600
    speed = f"{base.seconds / best.seconds:.2f}x" if base is not None else "-"
    every = ", ".join(f"{r.seconds:.1f}" for r in runs)
    hold = (f"{best.hold_ms:.3f} / {best.hold_max_ms:.1f}" if best.rtt_ms > 0
            else "- (direct)")
    late = f"{best.late_ms:.3f} / {best.late_max_ms:.1f}" if best.rtt_ms > 0 else "-"
    relay = f"{best.relay_cpu / (best.seconds * cores):.0%}" if best.rtt_ms > 0 else "-"
    ok = all(r.correct for r in runs)
    per_job = " / ".join(f"{best.by_role.get(r, 0.0) / best.jobs:.2f}"
                         for r in ("gateway", "party daemons", "engines"))
    return (f"| {best.rtt_ms:g} | {best.concurrent} | {best.jobs} | {best.seconds:.1f} "
            f"({every}) | {per_hour:.0f} | {speed} | {hold} | {late} | "
            f"{best.stack_cpu / (best.seconds * cores):.0%} | {relay} | "
            f"{best.machine_busy:.0%} | {per_job} | {'yes' if ok else 'NO'} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--jobs", type=int, default=8, help="jobs in the mix, half of each shape")
    ap.add_argument("--speed-scale", type=float, default=1.0,
                    help="SPEED's rows and k times this (0.1 for a quick run)")
    ap.add_argument("--engine", default="mp-spdz", choices=["mp-spdz", "mpyc"])
    ap.add_argument("--rtt-ms", default="0",
                    help="round-trip times between the parties, comma-separated (0: direct "
                         "loopback; above 0: through relays, RTT/2 each way)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per level; the fastest counts")
    ap.add_argument("--relay", default="auto", choices=IMPLEMENTATIONS,
                    help="the delay relay's implementation: c (delayrelay.c, built with the "
                         "machine's C compiler), python, or auto (c when it builds)")
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    rtts = [float(v) for v in args.rtt_ms.split(",")]
    if max(levels) > MPC_PORTS or min(levels) < 1:
        raise SystemExit(f"1 to {MPC_PORTS} jobs side by side ({MPC_PORTS} ports a party)")
    if min(rtts) < 0 or args.repeat < 1:
        raise SystemExit("--rtt-ms must not be negative, --repeat at least 1")
    command = "bench/throughput.py " + shlex.join(sys.argv[1:])
    load_start = os.getloadavg()
    data: dict[str, Any] = {}
    for n, (name, m, p, k) in enumerate(shapes(args.speed_scale)):
        data[name] = {"table": make_table(m, p, seed=40 + n), "k": k}
    names = list(data)
    mix = [names[j % len(names)] for j in range(args.jobs)]
    rows: list[str] = []
    priority: list[str] = []
    print(HEADER)
    print(SEP)
    with tempfile.TemporaryDirectory(prefix="ppfs-throughput-") as tmp:
        for rtt in rtts:
            runs: dict[int, list[Run]] = {c: [] for c in levels}
            for _ in range(args.repeat):  # interleaved: load changes touch every level
                for level in levels:
                    r = run_level(Path(tmp), level, data, mix, args.engine, rtt, priority,
                                  args.relay)
                    print(f"  RTT {rtt:g} ms, {level} concurrent: {r.seconds:.1f} s", flush=True)
                    runs[level].append(r)
                    if not r.correct:
                        print("a result differs from the mirror", file=sys.stderr)
                        return 1
            base = min(runs[1], key=lambda r: r.seconds) if 1 in runs else None
            for level in levels:
                line = row(runs[level], base)
                print(line, flush=True)
                rows.append(line)
    load_end = os.getloadavg()
    if args.write:
        shape_text = ", ".join(f"{n} {data[n]['table'].m} x {data[n]['table'].p}, k "
                               f"{data[n]['k']}" for n in names)
        applied = ", ".join(sorted(set(priority))) or "no relays"
        args.write.write_text(
            "# Throughput: jobs side by side, at each round-trip time\n\n"
            f"Command: `{command}`. A mix of {args.jobs} Step 2A jobs ({shape_text}; "
            f"synthetic data), passive-3pc on {args.engine}, three parties and the gateway "
            "as local processes (mutual TLS), all submitted at once; time from the first "
            "submission to the last final state (results fetched and checked afterwards), "
            "compile excluded (a warm-up job per shape). Every result matched the "
            "plaintext mirror.\n\n"
            "RTT 0: the parties talk directly on loopback. RTT above 0: every party dials "
            "each peer through a delaying relay (bench/delayrelay.py), one per ordered pair "
            "of parties, all served by one relay process of their own that holds each chunk "
            f"RTT/2 in each direction (its implementation and priority: {applied}; the C one, "
            "bench/delayrelay.c, is the same program as the Python one with less CPU of its "
            "own, which matters as it shares the cores with the parties; the kernel's TCP "
            "for the relay's extra hop costs the same either way); "
            "'relay one-way hold': its "
            "measured hold per chunk over the timed jobs, mean / max; 'relay woke late': how "
            "long after a chunk's due time the relay got to it (its own share of the hold "
            "above RTT/2; the rest is chunks that waited for a receiver whose buffer was "
            "full); chunks sent before their peer listened are not in either. Stack CPU "
            "share: CPU seconds of "
            "the gateway, the parties and their engine processes over the timed window / "
            "(seconds x "
            f"{os.cpu_count()} cores); relay CPU share likewise for the relay process; "
            "machine busy: the share of all cores busy with anything (this run and any "
            "other work on the machine) over the same window, from /proc/stat. CPU "
            "seconds per job: the stack's CPU over the timed window split by role and "
            "divided by the jobs: the gateway, the party daemons' own Python, and the "
            "engine processes they started (counted as each exits). "
            f"Fastest of {args.repeat} run(s) per row, every run's seconds listed; "
            "speed-up: jobs/hour over the same RTT's 1-concurrent figure.\n\n"
            f"Machine: {machine_description()}. Load average (1 min) {load_start[0]:.2f} at "
            f"the start, {load_end[0]:.2f} at the end.\n\n"
            f"{HEADER}\n{SEP}\n" + "\n".join(rows) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
