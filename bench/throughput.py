"""Jobs per hour through the service with 1, 2 and 4 jobs side by side.

A local stack (``ppfs up``'s: three party daemons and the gateway as processes, mutual
TLS, loopback) runs a mix of CogLoad-shaped (632 x 120, k 12) and SPEED-shaped
(8378 x 122, k 67; ``--speed-scale`` shrinks its rows and k for a quick run) Step 2A
jobs on synthetic data (ppfs.synthetic.make_table), passive-3pc on MP-SPDZ. For each
concurrency the stack is started with ``--max-concurrent-jobs N`` on the same state
(data uploaded once, compiled programs cached by a warm-up job of each shape), the
whole mix is submitted at once, and jobs per hour = jobs / (first submission to last
final state). Every result is fetched and checked against the plaintext mirror.

    .venv/bin/python bench/throughput.py [--concurrency 1,2,4] [--jobs 8]
        [--speed-scale 0.1] [--write bench/results/throughput.md]

The report is written only from a completed run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_description
from ppfs_cli.devstack import MPC_PORTS, Stack, prepare
from ppfs_client.keys import ClientKeys
from ppfs_client.sdk import GatewayClient, OwnerTable

from ppfs.fixedpoint import FixedPoint
from ppfs.keycert import TrustAnchor
from ppfs.step2a import Step2AShape, mirror
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable


def shapes(speed_scale: float) -> list[tuple[str, int, int, int]]:
    m = max(40, round(8378 * speed_scale))
    k = max(4, min(67, round(67 * speed_scale)))
    return [("CogLoad", 632, 120, 12), (f"SPEED x{speed_scale:g}", m, 122, k)]


def run_level(root: Path, concurrent: int, data: dict[str, Any], mix: list[str],
              engine: str) -> tuple[float, list[dict[str, Any]]]:
    layout = prepare(root, 3)
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
            return run_jobs(analyst, keys["analyst"], data, mix, engine)
    finally:
        loop.run_until_complete(stack.stop())
        loop.close()


def run_jobs(analyst: GatewayClient, key: ClientKeys, data: dict[str, Any], mix: list[str],
             engine: str) -> tuple[float, list[dict[str, Any]]]:
    """Submit the mix at once; seconds from the first submission until every job is
    final (fetching and checking the results come after)."""
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
    return seconds, finals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--jobs", type=int, default=8, help="jobs in the mix, half of each shape")
    ap.add_argument("--speed-scale", type=float, default=1.0,
                    help="SPEED's rows and k times this (0.1 for a quick run)")
    ap.add_argument("--engine", default="mp-spdz", choices=["mp-spdz", "mpyc"])
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    if max(levels) > MPC_PORTS:
        raise SystemExit(f"at most {MPC_PORTS} jobs side by side ({MPC_PORTS} ports a party)")
    data: dict[str, Any] = {}
    for n, (name, m, p, k) in enumerate(shapes(args.speed_scale)):
        data[name] = {"table": make_table(m, p, seed=40 + n), "k": k}
    names = list(data)
    mix = [names[j % len(names)] for j in range(args.jobs)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ppfs-throughput-") as tmp:
        for level in levels:
            seconds, done = run_level(Path(tmp), level, data, mix, args.engine)
            ok = all(d["correct"] for d in done)
            per_hour = len(done) / seconds * 3600
            row = (f"| {level} | {len(done)} | {seconds:.1f} | {per_hour:.0f} | "
                   f"{'yes' if ok else 'NO'} |")
            print(row, flush=True)
            rows.append(row)
            if not ok:
                print("a result differs from the mirror", file=sys.stderr)
                return 1
    if args.write:
        shape_text = ", ".join(f"{n} {data[n]['table'].m} x {data[n]['table'].p}, k "
                               f"{data[n]['k']}" for n in names)
        args.write.write_text(
            "# Throughput: jobs side by side\n\n"
            f"`bench/throughput.py --concurrency {args.concurrency} --jobs {args.jobs} "
            f"--speed-scale {args.speed_scale:g} --engine {args.engine}`: a mix of "
            f"{args.jobs} Step 2A jobs ({shape_text}; synthetic data), passive-3pc, three "
            "parties and the gateway as local processes on loopback (mutual TLS), "
            "all submitted at once; time from the first submission to the last final "
            "state (results fetched and checked afterwards), compile excluded (a warm-up "
            "job per shape). Every result matched the plaintext mirror.\n\n"
            f"Machine: {machine_description()}. The machine was shared with other work "
            "during the run, so the figures are indicative only.\n\n"
            "| concurrent | jobs | seconds | jobs/hour | all match mirror |\n"
            "|---:|---:|---:|---:|---|\n" + "\n".join(rows) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
