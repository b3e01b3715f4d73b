"""How Step 2A's secure computation grows with the data size: passive 3PC, MP-SPDZ.

Synthetic tables (ppfs.synthetic.make_table) of m rows from 10^3 to 10^6 and p
columns from 10 to 2,000, one run per point, m*p up to 10^8: m at p = 10 and p = 100,
p at m = 10^3 and m = 10^4, and the corners 10^5 x 1,000, 5*10^4 x 2,000 and
10^6 x 100. Per point: MPC time (launch of the parties to the exit of the last one,
compile excluded and given apart), bytes sent by all parties, rounds per party, the
peak resident memory of each party process and of the data owner's side (encoding,
secret-sharing, writing the parties' inputs, unmasking: what `ppfs select` costs its
user), and whether the selection and D' equal the plaintext mirror. Then
least-squares fits of the growth: per fixed p against m*p, per fixed m against p^2
(the scores cost O(m*p), the ranks O(p^2)), and one model over all points.

    .venv/bin/python bench/scale.py [--points 1000x10,1e4x100] [--max-cells 1e8]
        [--k 10] [--engine mp-spdz] [--seed 1] [--dry-run] [--memory-limit GIB]
        [--no-memory-check] [--workdir DIR] [--write bench/results/scale.md]

Each point runs in a fresh process of this script: its peak memory is its own, and a
point that runs out of memory (or fails in any other way) is reported as FAILED with
its reason while the others go on; the exit code is 1 if any point failed or
differed from the mirror. Points run in increasing m*p; before each, its time and
memory are estimated (a model calibrated on this machine, refitted to the run's own
points once six are measured but never below the calibrated one) and a point whose
estimated memory exceeds what the machine has available (or --memory-limit) is not
started: FAILED, unless --no-memory-check. --dry-run lists the points and the
estimates only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_description

from ppfs.engines.registry import get_engine
from ppfs.local import run_select
from ppfs.step2a import Security, mirror
from ppfs.synthetic import make_table

SECURITY = Security.PASSIVE_3PC
MAX_ROWS = 1 << 20  # Step2AShape's bound: m < 2^20
MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Point:
    m: int
    p: int
    k: int = 10  # columns selected (at most p - 1)

    @property
    def cells(self) -> int:
        return self.m * self.p

    @property
    def label(self) -> str:
        return f"{self.m}x{self.p}"

    def with_k(self, wanted: int) -> Point:
        return Point(self.m, self.p, max(1, min(wanted, self.p - 1)))


def default_points() -> list[Point]:
    pts = {Point(m, p) for m in (10**3, 10**4, 10**5, 10**6) for p in (10, 100)}
    pts |= {Point(m, p) for m in (10**3, 10**4) for p in (10, 100, 500, 1000, 2000)}
    pts |= {Point(10**5, 1000), Point(5 * 10**4, 2000), Point(10**6, 100)}
    return sorted(pts, key=lambda pt: (pt.cells, pt.p))


def _count(text: str) -> int:
    value = float(text) if any(c in text for c in ".eE") else int(text)
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)


def parse_points(text: str) -> list[Point]:
    pts = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            m_text, p_text = item.lower().split("x")
            pt = Point(_count(m_text), _count(p_text))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"point {item!r}: write rows x columns, e.g. 1000x10 or 1e5x100") from None
        if not 2 <= pt.m < MAX_ROWS or pt.p < 2:
            raise argparse.ArgumentTypeError(
                f"point {item!r}: need 2 <= m < 2^20 = {MAX_ROWS:,} rows and p >= 2 columns")
        pts.append(pt)
    if not pts:
        raise argparse.ArgumentTypeError("no points given")
    return sorted(set(pts), key=lambda pt: (pt.cells, pt.p))


# ---------------------------------------------------------------- cost model


TERMS = ("m·p", "p²", "m·k")


def features(pt: Point) -> list[float]:
    """What the cost grows with: the split and the scores O(m*p), the ranks O(p^2),
    D' and its masked opening O(m*k)."""
    return [1.0, float(pt.cells), float(pt.p**2), float(pt.m * pt.k)]


@dataclass(frozen=True)
class Model:
    """y ~ c0 + c1 * m*p + c2 * p^2 + c3 * m*k."""

    coef: tuple[float, ...]  # one per features() entry

    def __call__(self, pt: Point) -> float:
        return max(0.0, float(np.dot(self.coef, features(pt))))


# Calibrated on this machine (2 cores, 24 GiB, shared with other work) by least squares
# over runs of the points in bench/results/scale.md, rounded up; replaced by a fit to the
# run's own points once six are measured. Wall: MPC + compile (2 s + 3 us * p^2 +
# 0.3 us * m*k; single compiles of 10^6 x 100 and 5*10^4 x 2,000 took 4.8 and 14.9 s) +
# the owner's side, the table and the mirror (0.75 s + 1.7 us * m*p + 0.5 us * m*k).
# Party: the full grid up to m*p = 10^8 gave 66 MiB + 16.1 B * m*p + 146 B * p^2 +
# 50 B * m*k: the compiler's static memory is 16 bytes per entry (the data; the mean
# split's comparisons are folded into the counts a chunk of rows at a time), D' and its
# masks 48 bytes per entry of D'; the rest is MP-SPDZ's working memory.
CALIBRATED = {
    "wall": Model((3.0, 4.3e-6, 4.0e-6, 2.4e-6)),
    "mpc": Model((0.3, 2.6e-6, 1.0e-6, 1.6e-6)),
    "party_rss": Model((70 * MiB, 20.0, 150.0, 60.0)),
    "client_rss": Model((60 * MiB, 58.0, 0.0, 75.0)),
}
# What the owner's side keeps while the parties run: the table, its encoding, the masks.
CLIENT_HELD = Model((60 * MiB, 16.0, 0.0, 16.0))
# Disk for the run: three data bundles (two components each) and three input files.
DISK_PER_CELL = 3 * 16 + 3 * 8


def fit(points: list[Point], ys: list[float]) -> Model | None:
    """Least squares of :class:`Model` to the points; None if they cannot fix it."""
    if len(points) < 6:
        return None
    a = np.array([features(pt) for pt in points])
    if np.linalg.matrix_rank(a) < a.shape[1]:
        return None
    coef, *_ = np.linalg.lstsq(a, np.array(ys, dtype=float), rcond=None)
    return Model((float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3])))


def memory_needed(pt: Point, client: Model, party: Model) -> float:
    """Peak memory of the whole point: the owner's side before the parties start, or
    what it keeps plus three parties while they run, whichever is more."""
    return max(client(pt), CLIENT_HELD(pt) + SECURITY.parties * party(pt))


def mem_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---------------------------------------------------------------- one point (child process)


def _reset_peak_rss() -> bool:
    """Restart this process's high-water mark of resident memory (Linux: clear_refs 5,
    which ru_maxrss follows); False if not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measure(pt: Point, engine_name: str, seed: int, workdir: Path) -> dict[str, Any]:
    """Run one point in this process; every figure of its row."""
    t0 = time.perf_counter()
    table = make_table(pt.m, pt.p, seed=seed)
    table_s = time.perf_counter() - t0
    own_window = _reset_peak_rss()  # the owner's side from here, with the table resident
    t1 = time.perf_counter()
    sel = asyncio.run(run_select(table, pt.k, SECURITY, get_engine(engine_name), workdir))
    select_s = time.perf_counter() - t1
    client_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    t2 = time.perf_counter()
    fp = sel.fixed_point
    raw = fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns)
    ref = mirror(raw, table.y, sel.shape)
    same = bool(np.array_equal(sel.indices, ref.selected)
                and np.array_equal(sel.reduced_raw, ref.reduced))
    run = sel.run
    return {
        "mpc_seconds": run.seconds,
        "compile_seconds": run.compile_seconds,
        "select_seconds": select_s,
        "table_seconds": table_s,
        "mirror_seconds": time.perf_counter() - t2,
        "bytes_sent": run.bytes_sent,
        "rounds": [s.rounds for s in run.parties],
        "party_rss": [s.peak_rss_bytes for s in run.parties],
        "client_rss": client_peak,
        "client_rss_includes_table": not own_window,
        "mirror_ok": same,
    }


def child_main(args: argparse.Namespace) -> int:
    pt = parse_points(args.run_point)[0].with_k(args.k)
    try:
        out = measure(pt, args.engine, args.seed, args.workdir)
    except Exception as exc:  # the parent reports it as the point's reason
        out = {"error": f"{type(exc).__name__}: {exc}"}
    args.result_file.write_text(json.dumps(out))
    return 0 if "error" not in out else 1


# ---------------------------------------------------------------- the run (parent)


@dataclass
class Result:
    point: Point
    error: str | None = None
    wall_seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.figures.get("mirror_ok"))

    def get(self, key: str) -> Any:
        return self.figures[key]

    @property
    def party_peak(self) -> float:
        return float(max(v or 0 for v in self.figures["party_rss"]))


def run_point(pt: Point, args: argparse.Namespace) -> Result:
    """Run one point in a fresh process of this script. Its working directory (GBs of
    shares at the big points) is removed whatever happens to that process, and its
    parties die with it (ppfs.engines.pdeathsig)."""
    res = Result(pt)
    with tempfile.TemporaryDirectory(prefix="ppfs-scale-", dir=args.workdir) as tmp:
        result_file = Path(tmp) / "result.json"
        work = Path(tmp) / "run"
        work.mkdir()
        argv = [sys.executable, str(Path(__file__).resolve()), "--run-point", pt.label,
                "--k", str(pt.k), "--engine", args.engine, "--seed", str(args.seed),
                "--workdir", str(work), "--result-file", str(result_file)]
        env = {**os.environ, "PPFS_MPSPDZ_CACHE": str(args.compile_cache)}
        t0 = time.monotonic()
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, env=env, check=False)
        res.wall_seconds = time.monotonic() - t0
        data = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if "error" in data:
        res.error = str(data["error"])
    elif proc.returncode < 0:
        sig = signal.Signals(-proc.returncode).name
        res.error = f"the point's process was killed by {sig}" + (
            " (most likely by the out-of-memory killer)" if sig == "SIGKILL" else "")
    elif proc.returncode != 0 or not data:
        res.error = f"the point's process exited with code {proc.returncode} and no result"
    else:
        res.figures = data
    return res


def check_and_run(pt: Point, args: argparse.Namespace, est: Estimator) -> Result:
    """Run the point unless its estimated memory or disk exceeds what is free."""
    need = est.memory(pt)
    avail = mem_available() if args.memory_limit is None else int(args.memory_limit * GiB)
    disk = shutil.disk_usage(args.workdir or tempfile.gettempdir()).free
    print(f"-- {pt.label}, k {pt.k}: estimated {duration(est.models['wall'](pt))}, "
          f"memory about {need / GiB:.1f} GiB"
          + (f" of {avail / GiB:.1f} GiB available" if avail is not None else ""),
          file=sys.stderr, flush=True)
    if not args.no_memory_check and avail is not None and need > avail:
        return Result(pt, error=(
            f"estimated memory {need / GiB:.1f} GiB exceeds the {avail / GiB:.1f} GiB "
            f"{'available' if args.memory_limit is None else 'of --memory-limit'} "
            "(--no-memory-check runs it anyway)"))
    if DISK_PER_CELL * pt.cells > disk:
        return Result(pt, error=(
            f"needs about {DISK_PER_CELL * pt.cells / GiB:.1f} GiB of disk, "
            f"{disk / GiB:.1f} GiB free"))
    return run_point(pt, args)


def mib(v: float | None) -> str:
    return "-" if v is None else f"{v / MiB:,.0f}"


HEADER = ("| m | p | k | m·p | MPC time (s) | compile (s) | wall (s) | sent (MB) "
          "| rounds per party | peak RSS per party (MiB) | owner peak RSS (MiB) | = mirror |")
SEP = "|---" * 12 + "|"


def row(r: Result) -> str:
    pt = r.point
    head = f"| {pt.m:,} | {pt.p:,} | {pt.k} | {pt.cells:.0e} |"
    if r.error is not None:
        return head + f" FAILED: {r.error} |" + " - |" * 7
    f = r.figures
    rounds = " / ".join(f"{v:,}" for v in f["rounds"])
    rss = " / ".join(mib(v) for v in f["party_rss"])
    owner = mib(f["client_rss"]) + (" (with table)" if f["client_rss_includes_table"] else "")
    return (head + f" {f['mpc_seconds']:.2f} | {f['compile_seconds']:.2f} | "
            f"{r.wall_seconds:.1f} | {f['bytes_sent'] / 1e6:,.0f} | {rounds} | {rss} | "
            f"{owner} | {'yes' if f['mirror_ok'] else 'NO'} |")


class Estimator:
    """Time and memory per point: the calibrated model, refitted to measured points."""

    def __init__(self) -> None:
        self.models = dict(CALIBRATED)
        self.source = "model calibrated on this machine"

    def update(self, done: list[Result]) -> None:
        good = [r for r in done if r.error is None]
        pts = [r.point for r in good]
        fitted = {
            "wall": fit(pts, [r.wall_seconds for r in good]),
            "mpc": fit(pts, [r.get("mpc_seconds") for r in good]),
            "party_rss": fit(pts, [r.party_peak for r in good]),
            "client_rss": fit(pts, [float(r.get("client_rss") or 0) for r in good]),
        }
        if any(v is None for v in fitted.values()):
            return
        for key, model in fitted.items():
            assert model is not None
            # never below the calibrated model: a fit to a few small points on a shared
            # machine can be bent by the load (the big points must not be under-planned)
            self.models[key] = Model(tuple(
                max(c, d) for c, d in zip(model.coef, CALIBRATED[key].coef, strict=True)))
        self.source = (f"model fitted to the {len(good)} points measured so far, "
                       "at least the calibrated one")

    def memory(self, pt: Point) -> float:
        return memory_needed(pt, self.models["client_rss"], self.models["party_rss"])

    def plan(self, pts: list[Point]) -> str:
        lines = [f"{'point':>14} {'m·p':>8} {'est. wall':>10} {'est. MPC':>9} "
                 f"{'est. memory':>12}"]
        for pt in pts:
            lines.append(f"{pt.label:>14} {pt.cells:8.0e} {duration(self.models['wall'](pt)):>10}"
                         f" {duration(self.models['mpc'](pt)):>9}"
                         f" {self.memory(pt) / GiB:8.1f} GiB")
        total = sum(self.models["wall"](pt) for pt in pts)
        lines.append(f"estimated total: {duration(total)} for {len(pts)} point(s) "
                     f"({self.source})")
        return "\n".join(lines)

    def total(self, pts: list[Point]) -> float:
        return sum(self.models["wall"](pt) for pt in pts)


# ---------------------------------------------------------------- growth fits


def _loglog(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def _lstsq(rows: list[list[float]], ys: list[float]) -> tuple[list[float], float]:
    a = np.array(rows, dtype=float)
    y = np.array(ys, dtype=float)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / total if total > 0 else 1.0
    return [float(c) for c in coef], r2


# (unit of the constant, its scale, unit of the other coefficients, their scale)
UNITS = {"time": ("s", 1.0, "µs", 1e-6), "bytes": ("MB", 1e6, "B", 1.0),
         "memory": ("MiB", MiB, "B", 1.0)}


def _fmt_fit(coef: list[float], terms: list[str], kind: str, r2: float) -> str:
    """'0.51 s + 0.74 µs × m·p - 0.2 µs × p² (R² 0.990)'."""
    unit0, scale0, unit, scale = UNITS[kind]
    out = f"{coef[0] / scale0:.3g} {unit0}"
    for c, t in zip(coef[1:], terms, strict=True):
        out += f" {'-' if c < 0 else '+'} {abs(c) / scale:.3g} {unit} × {t}"
    return out + f" (R² {r2:.3f})"


def series(good: list[Result]) -> list[tuple[str, str, list[Result]]]:
    """Runs of three or more points along m at one p, and along p at one m."""
    out = []
    for p in sorted({r.point.p for r in good}):
        rs = sorted((r for r in good if r.point.p == p), key=lambda r: r.point.m)
        if len(rs) >= 3:
            out.append((f"p = {p:,}, m = {rs[0].point.m:,} .. {rs[-1].point.m:,}", "m·p", rs))
    for m in sorted({r.point.m for r in good}):
        rs = sorted((r for r in good if r.point.m == m), key=lambda r: r.point.p)
        if len(rs) >= 3:
            out.append((f"m = {m:,}, p = {rs[0].point.p:,} .. {rs[-1].point.p:,}", "p", rs))
    return out


def growth(results: list[Result]) -> list[str]:
    """The fits, as Markdown: per series, then one model over all points."""
    good = [r for r in results if r.error is None]
    lines = ["| series | points | MPC time ~ x^e | MPC time, least squares "
             "| sent ~ x^e | sent, least squares |", "|---" * 6 + "|"]
    found = series(good)
    for name, var, rs in found:
        t = [r.get("mpc_seconds") for r in rs]
        b = [float(r.get("bytes_sent")) for r in rs]
        if var == "m·p":  # fixed p: against m*p
            xs = [float(r.point.cells) for r in rs]
            rows, terms = [[1.0, x] for x in xs], ["m·p"]
        else:  # fixed m: against p^2, and m*p when there are points enough for both
            xs = [float(r.point.p) for r in rs]
            if len(rs) >= 4:
                rows = [[1.0, float(r.point.cells), float(r.point.p**2)] for r in rs]
                terms = ["m·p", "p²"]
            else:
                rows, terms = [[1.0, float(r.point.p**2)] for r in rs], ["p²"]
        tc, tr2 = _lstsq(rows, t)
        bc, br2 = _lstsq(rows, b)
        lines.append(
            f"| {name} | {len(rs)} | e = {_loglog(xs, t):.2f} (x = {var}) | "
            f"{_fmt_fit(tc, terms, 'time', tr2)} | "
            f"e = {_loglog(xs, b):.2f} | {_fmt_fit(bc, terms, 'bytes', br2)} |")
    if not found:
        lines.append("| (no series of three or more points) | | | | | |")
    pts = [r.point for r in good]
    if fit(pts, [r.get("mpc_seconds") for r in good]) is None:
        return lines
    rows = [features(pt) for pt in pts]
    tc, tr2 = _lstsq(rows, [r.get("mpc_seconds") for r in good])
    bc, br2 = _lstsq(rows, [float(r.get("bytes_sent")) for r in good])
    rc, rr2 = _lstsq(rows, [r.party_peak for r in good])
    terms = list(TERMS)
    return [*lines, "",
            f"All {len(good)} points, least squares on 1, {', '.join(TERMS)}:", "",
            f"- MPC time = {_fmt_fit(tc, terms, 'time', tr2)}",
            f"- sent = {_fmt_fit(bc, terms, 'bytes', br2)}",
            f"- peak RSS of the largest party = {_fmt_fit(rc, terms, 'memory', rr2)}"]


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=parse_points, default=None,
                    help="explicit points, rows x columns: 1000x10,1e4x100 (default: the grid)")
    ap.add_argument("--max-cells", type=float, default=1e8,
                    help="skip points with m*p above this (default 1e8)")
    ap.add_argument("--k", type=int, default=10,
                    help="columns to select, capped at p - 1 (default 10)")
    ap.add_argument("--engine", default="mp-spdz")
    ap.add_argument("--seed", type=int, default=1, help="make_table's seed (default 1)")
    ap.add_argument("--write", type=Path, default=None, help="Markdown results file")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the points with their estimated time and memory, run nothing")
    ap.add_argument("--memory-limit", type=float, default=None, metavar="GIB",
                    help="memory a point may use (default: what the machine has available "
                    "when the point starts)")
    ap.add_argument("--no-memory-check", action="store_true",
                    help="start points whose estimated memory exceeds the limit")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where the parties' files go (default: the system's temporary dir)")
    # how the benchmark runs each point: in a process of its own
    ap.add_argument("--run-point", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.k < 1:
        ap.error("--k must be at least 1")
    if args.run_point is not None:
        return child_main(args)

    chosen = [pt.with_k(args.k) for pt in (args.points or default_points())]
    points = [pt for pt in chosen if pt.cells <= args.max_cells]
    skipped = [pt for pt in chosen if pt.cells > args.max_cells]
    grid = [pt.with_k(args.k) for pt in default_points()]
    est = Estimator()
    print(f"Step 2A growth, {SECURITY.value} on {args.engine}: {len(points)} point(s)"
          + (f"; above --max-cells {args.max_cells:g}, not run: "
             f"{', '.join(pt.label for pt in skipped)}" if skipped else ""))
    print(est.plan(points))
    if points != grid:
        print(f"(the full default grid, {len(grid)} points up to m·p = 10^8: estimated "
              f"{duration(est.total(grid))})")
    if args.dry_run:
        return 0
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    reason = get_engine(args.engine).unavailable_reason()
    if reason is not None:
        print(f"engine {args.engine} is not usable: {reason}", file=sys.stderr)
        return 2
    load0 = os.getloadavg()[0]
    started = time.monotonic()
    print()
    print(HEADER)
    print(SEP, flush=True)
    done: list[Result] = []
    # a program cache of this run only: every shape's compile time is measured
    with tempfile.TemporaryDirectory(prefix="ppfs-scale-programs-") as cache:
        args.compile_cache = Path(cache)
        for pt in points:
            done.append(check_and_run(pt, args, est))
            print(row(done[-1]), flush=True)
            est.update(done)
    elapsed = time.monotonic() - started
    fits = growth(done)
    print()
    print("\n".join(fits))
    print()
    print(f"The full default grid, estimated ({est.source}): "
          f"{duration(est.total(grid))}")
    failed = [r for r in done if not r.ok]
    print(f"{len(done) - len(failed)} of {len(done)} point(s) ran and matched the mirror "
          f"in {duration(elapsed)}" + (
              f"; FAILED or different: {', '.join(r.point.label for r in failed)}"
              if failed else ""))
    if args.write:
        write_report(args.write, args, done, fits, grid, est, load0, elapsed)
    return 1 if failed else 0


def raw_figures(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {"m": r.point.m, "p": r.point.p, "k": r.point.k, "error": r.error,
                           "wall_seconds": r.wall_seconds, **r.figures}
    return {key: round(v, 3) if isinstance(v, float) else v for key, v in out.items()}


def write_report(path: Path, args: argparse.Namespace, done: list[Result], fits: list[str],
                 grid: list[Point], est: Estimator, load0: float, elapsed: float) -> None:
    text = [
        "# Step 2A: growth with the data size",
        "",
        f"Machine: {machine_description()}. Engine: {args.engine}, {SECURITY.value}. "
        f"Synthetic data (make_table, seed {args.seed}), k = min({args.k}, p - 1), one run "
        f"per point; {len(done)} point(s) in {duration(elapsed)}: "
        f"`bench/scale.py {' '.join(sys.argv[1:])}`.",
        "",
        "MPC time: from launching the parties until the last one exited (input, Step 2A, "
        "the masked opening). Compile: compiling the program for the shape (each shape "
        "once, in a program cache of this run only). Wall: the whole point in a process "
        "of its own (making the table, encoding, sharing, writing the inputs, compile, "
        "MPC, unmasking, the mirror check). Sent: bytes sent by all parties, rounds: per "
        "party, both as MP-SPDZ reports them. Peak RSS per party: each MP-SPDZ party "
        "process's high-water mark of resident memory (ru_maxrss, from wait4 when it "
        "ended). Owner peak RSS: the high-water mark of the data owner's side from after "
        "making the table to the end of `run_select` (the table resident; encoding, "
        "secret-sharing, writing the bundles and the parties' input files, waiting, "
        "unmasking): what `ppfs select` costs its user besides loading the table. "
        "'= mirror': selection and D' equal the plaintext fixed-point mirror.",
        "",
        f"The machine was shared with other work while this ran (load average {load0:.1f} "
        f"at the start, {os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores): "
        "timings vary with it by up to 2x, bytes, rounds and memory do not.",
        "",
        HEADER,
        SEP,
        *(row(r) for r in done),
        "",
        "## Growth",
        "",
        "Exponent e: slope of log(y) against log(x): x = m·p along a fixed p, x = p along "
        "a fixed m (e = 1 is linear growth, 2 quadratic). Least squares: along a fixed p "
        "against m·p; along a fixed m against m·p and p² (four or more points) or p². "
        "Over all points against m·p (the mean split, the class counts), p² (the ranks) "
        "and m·k (D' and its masked opening).",
        "",
        *fits,
        "",
        "## The full grid, estimated",
        "",
        f"Time and memory per point of the default grid ({est.source}; memory: the larger "
        "of the owner's side before the parties start and what it keeps plus three "
        "parties while they run):",
        "",
        "```",
        est.plan(grid),
        "```",
        "",
        "## Raw figures",
        "",
        "One JSON object per point (seconds, bytes):",
        "",
        "```json",
        *(json.dumps(raw_figures(r)) for r in done),
        "```",
        "",
    ]
    path.write_text("\n".join(text))


if __name__ == "__main__":
    sys.exit(main())
