"""Benchmark of Step 2B: training runtime and communication beside Step 2A's.

For the shapes of the paper's data sets (synthetic data of each shape) and each
security setting, two secure runs of the same program family:

- Step 2A alone with D' withheld (only the selection is opened; such a job builds no D',
  which nothing would read);
- Step 2A + Step 2B in one program, training only (D' withheld, the selection and the
  model opened), whose progress lines time the building of D'.

Step 2A as the paper has it is the selection and D'; the training cost is the rest of the
second run (and, beside it, the second run's time over the first's). Each trained model is
checked against the plaintext fixed-point oracle (ppfs.step2b.mirror) within
ppfs.step2b.weight_tolerance. Party 0's rounds are reported for both (MP-SPDZ's count),
and, with MP-SPDZ, the paper's selection protocols written literally (bench/anchor.py)
run right after on the same shape, with the ratios literal selection / ppfs selection +
training.

``--repeat N`` runs each row's pair (Step 2A alone, then 2A + 2B) N times back to back,
one row per pair, and prints each setting's median training / Step 2A ratio below the
table: single runs of the active settings vary by a quarter from run to run on a shared
machine, and a ratio taken within a pair cancels most of that. The anchor runs once per
shape and setting, after the first pair.

    .venv/bin/python bench/step2b.py [--engine mp-spdz] [--settings passive-3pc,...]
        [--datasets CogLoad,LSVT,SPEED] [--no-anchor] [--repeat 1]
        [--write bench/results/step2b.md]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anchor
from common import PAPER, machine_description

from ppfs import step2b
from ppfs.engines.base import ProgressNote
from ppfs.engines.registry import default_engine_name, get_engine
from ppfs.fixedpoint import FixedPoint
from ppfs.local import Selection, run_select
from ppfs.step2a import Security
from ppfs.step2b import TrainParams
from ppfs.synthetic import make_table
from ppfs.table import LabelledTable

# The hyperparameters bench/accuracy.py uses for each data set (see its docstring).
PARAMS = {
    "CogLoad": TrainParams(epochs=20, batch=32, lr=0.5),
    "LSVT": TrainParams(epochs=20, batch=32, lr=0.5),
    "SPEED": TrainParams(epochs=2, batch=64, lr=0.5),
}


def oracle_gap(sel: Selection, table: LabelledTable, k: int, params: TrainParams) -> tuple[
        float, float]:
    """(largest |w_MPC - w_oracle| in standardised units, the tolerance)."""
    fp = FixedPoint()
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = step2b.mirror(raw[:, sel.indices], table.y, table.n_classes, fp.value_bits, params)
    assert sel.model_words is not None
    alpha_full, _ = step2b.split_model_words(sel.model_words, table.p, table.n_classes)
    c = step2b.constants(table.m, k, table.n_classes, fp.value_bits, params)
    w_mpc = alpha_full[sel.indices].astype(float) * 2.0**c.preshift \
        / ref.kappa.astype(float)[:, None]
    w_ref = ref.weights.astype(float) / 2**c.frac
    tol = step2b.weight_tolerance(ref, params)
    return float(np.abs(w_mpc - w_ref).max()), tol


# the program's progress stage that builds D' (ppfs.engines.mpspdz.STAGES["selection"])
BUILDING_D = "building D'"


def run(table: LabelledTable, k: int, sec: Security, engine: str,
        params: TrainParams | None) -> tuple[Selection, float]:
    """One secure run, D' withheld; (the selection, the seconds the program spent
    building D': from its first progress line of that stage to the next stage's, 0 when
    it built none)."""
    marks: list[tuple[float, str]] = []

    def progress(note: str) -> None:
        if isinstance(note, ProgressNote):
            stage = note.split(",")[0]
            if not marks or marks[-1][1] != stage:
                marks.append((time.monotonic(), stage))

    with tempfile.TemporaryDirectory(prefix="ppfs-bench-") as tmp:
        sel = asyncio.run(run_select(table, k, sec, get_engine(engine), Path(tmp),
                                     train=params, reveal_reduced=False, progress=progress))
    building = sum(b[0] - a[0] for a, b in itertools.pairwise(marks) if a[1] == BUILDING_D)
    return sel, building


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default=None)
    ap.add_argument("--settings", default="passive-3pc,active-4pc,active-3pc")
    ap.add_argument("--datasets", default="CogLoad,LSVT,SPEED")
    ap.add_argument("--write", type=Path, default=None)
    ap.add_argument("--repeat", type=int, default=1,
                    help="pairs (Step 2A alone, 2A + 2B) per data set and setting")
    ap.add_argument("--no-anchor", action="store_true",
                    help="do not run the paper's protocols written literally")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    engine = args.engine or default_engine_name()
    use_anchor = engine == "mp-spdz" and not args.no_anchor
    if use_anchor and (why := anchor.unavailable_reason()):
        print(f"not running the paper's protocols: {why}", file=sys.stderr)
        use_anchor = False
    load = os.getloadavg()
    settings = [Security(s) for s in args.settings.split(",")]
    wanted = set(args.datasets.split(","))
    header = ("| data set | m x p, k | epochs, batch, lr | SGD steps | setting | pair "
              "| training / Step 2A "
              "| selection (s) | D' (s) | Step 2A (s) | 2A + 2B (s) | training (s) "
              "| (2A + 2B - selection) / selection "
              "| selection (MB) | 2A + 2B (MB) "
              "| rounds P0: selection / 2A + 2B | compile 2A + 2B (s) "
              "| max weight gap / tolerance | literal selection: s / MB / rounds P0 "
              "| literal / (2A + 2B): time / bytes / rounds |")
    sep = "|---" * 20 + "|"
    print(header)
    print(sep)
    rows = []
    medians: list[str] = []
    for ds in PAPER:
        if ds.name not in wanted:
            continue
        table = make_table(ds.m, ds.p, seed=1)
        params = PARAMS[ds.name]
        c = step2b.constants(ds.m, ds.k, 2, 32, params)
        steps = params.epochs * len(c.batches())
        for sec in settings:
            ratios, extra = [], []
            for pair in range(1, args.repeat + 1):
                plain, _ = run(table, ds.k, sec, engine, None)
                trained, d_s = run(table, ds.k, sec, engine, params)
                gap, tol = oracle_gap(trained, table, ds.k, params)
                a_s, b_s = plain.run.seconds, trained.run.seconds
                a_mb, b_mb = plain.run.bytes_sent / 1e6, trained.run.bytes_sent / 1e6
                a_r, b_r = plain.run.parties[0].rounds, trained.run.parties[0].rounds
                # Step 2A as the paper has it: the selection and D' (a job that only
                # selects builds no D', which nothing would read; training builds it)
                s2a = a_s + d_s
                ratios.append((b_s - s2a) / s2a)
                extra.append((b_s - a_s) / a_s)
                lit = "- | - |"
                if use_anchor and pair == 1:
                    try:
                        lr = anchor.run_anchor(sec, ds.m, ds.p, ds.k)
                        lit = (f"{lr.engine_seconds:.2f} / {lr.bytes / 1e6:.0f} / {lr.rounds:,} | "
                               + (f"{lr.engine_seconds / b_s:.1f}x / "
                                  f"{lr.bytes / max(trained.run.bytes_sent, 1):.1f}x / "
                                  f"{lr.rounds / b_r:.1f}x |" if b_r else "- |"))
                    except Exception as exc:  # reported, not fatal
                        print(f"reference run failed: {exc}", file=sys.stderr)
                        lit = "failed | - |"
                row = (f"| {ds.name} | {ds.m} x {ds.p}, {ds.k} | {params.epochs}, "
                       f"{params.batch}, {params.lr} | {steps} | {sec.value} | {pair} | "
                       f"{ratios[-1]:.2f}x | {a_s:.2f} | {d_s:.2f} | {s2a:.2f} | {b_s:.2f} | "
                       f"{b_s - s2a:.2f} | {extra[-1]:.2f}x | {a_mb:.0f} | {b_mb:.0f} | "
                       f"{a_r:,} / {b_r:,} | "
                       f"{trained.run.compile_seconds:.1f} | {gap:.2e} / {tol:.2e} "
                       f"{'ok' if gap <= tol else 'OVER'} | {lit}")
                print(row, flush=True)
                rows.append(row)
            if args.repeat > 1:
                medians.append(
                    f"- {ds.name}, {sec.value}: training / Step 2A median "
                    f"{statistics.median(ratios):.2f}x over {len(ratios)} pairs "
                    f"({', '.join(f'{r:.2f}' for r in ratios)}); (2A + 2B - selection) / "
                    f"selection median {statistics.median(extra):.2f}x "
                    f"({', '.join(f'{r:.2f}' for r in extra)})")
    for line in medians:
        print(line)
    if args.write:
        text = [
            "# Step 2B benchmark: logistic regression inside MPC",
            "",
            f"Machine: {machine_description()}. Engine: {engine}.",
            "",
            "Synthetic data of each paper data set's shape (two classes). Selection: a job "
            "that only selects (as a service job: D' withheld, and so not built, as nothing "
            "would read it; step2a.md's runs build and open it). D': the seconds the 2A + 2B "
            "run spent building D' (its progress stage, to the next stage's first line). "
            "Step 2A, as the paper has it = selection + D'. 2A + 2B: one program that "
            "selects, builds D', standardises, trains and opens only the selection and the "
            "model. Training = 2A + 2B - Step 2A; the ratio after it charges D' to training "
            "too (what training adds to a job that only selects). Times "
            "are MPC times (launch to exit of the "
            "last party), MB the total sent by all parties. Compile: compiling the 2A + 2B "
            "program once per protocol and shape (cached afterwards; 0 when it was cached). "
            "The hyperparameters are those bench/accuracy.py uses per data set. Last column: "
            "largest difference between the secure weights and the plaintext fixed-point "
            "oracle's, in standardised units, against the tolerance of "
            "ppfs.step2b.weight_tolerance. Rounds: party 0's, as MP-SPDZ reports them.",
            "",
            "Literal selection: the paper's Protocols 1-3 (selection only; the paper has no "
            "secure training to compare with) written literally in MP-SPDZ "
            "(bench/anchor.py), run right after the ppfs runs of the same row on random data "
            "of the same shape made inside MPC; MPC time measured the same way, MB = all "
            "parties, rounds = party 0's. The ratios divide it by ppfs's selection + "
            "training, so above 1 means ppfs trains the model as well in less.",
            "",
            f"The machine was shared with other work while this ran (load average "
            f"{load[0]:.1f} at the start): compare figures within a row only.",
            "",
            header,
            sep,
            *rows,
            "",
            *([*medians, ""] if medians else []),
        ]
        args.write.write_text("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
