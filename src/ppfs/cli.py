"""The core's own commands: ``ppfs select`` and ``ppfs demo`` (the embedded default, all
parties as local processes) and ``ppfs engine``. The ``ppfs`` command itself (under
tools/) adds these to the daemons', the client's and the development stack's commands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ppfs.engines.base import Engine, ProgressNote
from ppfs.engines.mpspdz_release import (
    DEFAULT_VERSION,
    ReleaseError,
    install_root,
    installed_homes,
)
from ppfs.engines.mpspdz_release import install as install_release
from ppfs.engines.registry import (
    ENGINE_NAMES,
    default_engine_name,
    engine_unavailable_reason,
    get_engine,
    mpspdz_candidates,
    mpspdz_home,
)
from ppfs.engines.stall import DEFAULT_STALL_SECONDS
from ppfs.errors import (
    EngineError,
    EngineUnavailableError,
    InputDataError,
    ParameterError,
    PpfsError,
    RangeAbortError,
)
from ppfs.fixedpoint import FixedPoint
from ppfs.jobflags import add_scorer_flag, add_training_flags, train_params_from_flags
from ppfs.local import Selection, run_select
from ppfs.run_dirs import make_run_dir, remove_left_behind
from ppfs.scoring import Scorer
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.table import LabelledTable, read_csv

EXIT_USAGE = 2
EXIT_FAILED = 1
MAX_LIMIT_SECONDS = 30 * 86_400.0  # --timeout and --stall-timeout: a month at most


def add_commands(sub: Any) -> None:
    """Add ``select``, ``demo`` and ``engine`` to the ``ppfs`` subparsers; each sets
    ``func``: func(args) -> exit code."""
    sel = sub.add_parser(
        "select",
        help="private MS-GINI feature selection (Step 2A) of a CSV on local parties",
        description="Encode and secret-share DATA.csv as a data owner would, run Step 2A on "
        "local MPC parties, and reveal to you only the selected column names (best first) "
        "and, with --out, the reduced data set D'.",
    )
    sel.add_argument("data", type=Path, metavar="DATA.csv")
    _job_args(sel)
    sel.set_defaults(func=_select_file)

    demo = sub.add_parser(
        "demo",
        help="generate a synthetic data set and run 'ppfs select' on it",
        description="Generate a synthetic labelled data set, select its best features privately "
        "and compare with a plaintext run on the same data.",
    )
    demo.add_argument("--rows", type=int, default=300)
    demo.add_argument("--cols", type=int, default=20)
    demo.add_argument("--classes", type=int, default=2)
    demo.add_argument("--seed", type=int, default=7)
    _job_args(demo, need_label=False, default_k=5)
    demo.set_defaults(func=_demo)

    eng = sub.add_parser("engine", help="install MP-SPDZ; say which engines are usable")
    esub = eng.add_subparsers(dest="engine_command", required=True)
    ins = esub.add_parser(
        "install",
        help="download, verify and unpack an official MP-SPDZ release for ppfs",
        description="Fetch the official release tarball mp-spdz-VERSION.tar.xz (or take "
        "--from URL|FILE), check its SHA-256 (--sha256, or the hash pinned in ppfs for that "
        "version) before unpacking anything, and unpack it into "
        f"{install_root()}/VERSION, where ppfs then finds it.",
    )
    ins.add_argument("engine", choices=["mp-spdz"])
    ins.add_argument("--version", default=DEFAULT_VERSION, help=f"default {DEFAULT_VERSION}")
    ins.add_argument("--from", dest="source", metavar="URL|FILE", default=None,
                     help="a local copy or another URL of the release tarball")
    ins.add_argument("--sha256", metavar="HEX", default=None,
                     help="the tarball's SHA-256, as verified from the release page")
    ins.set_defaults(func=_engine_install)
    st = esub.add_parser("status", help="which engines are usable here, and why not")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.set_defaults(func=_engine_status)


def _job_args(
    p: argparse.ArgumentParser, need_label: bool = True, default_k: int | None = None
) -> None:
    if need_label:
        p.add_argument("--label", required=True, metavar="COLUMN", help="the label column")
    p.add_argument(
        "--k",
        type=int,
        required=default_k is None,
        default=default_k,
        help="number of features to keep (1 <= k < p)",
    )
    p.add_argument(
        "--security",
        choices=[s.value for s in Security],
        default="passive-3pc",
        help="passive-3pc (replicated), active-3pc (SPDZ-wise replicated), "
        "active-4pc (Rep4); passive-4pc on MPyC only",
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_NAMES,
        default=None,
        help="default: the best engine usable here, mp-spdz when found ($MPSPDZ_HOME, else "
        "/opt/mp-spdz, else installed by `ppfs engine install mp-spdz`), else mpyc",
    )
    p.add_argument("--frac-bits", type=int, default=16, help="fixed-point fractional bits f")
    add_scorer_flag(p)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="REDUCED.csv",
        help="write D' (the selected columns, best first) and the label column",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    add_training_flags(p)
    p.add_argument("--no-reduced", action="store_true",
                    help="keep D' inside MPC: reveal only the selection and the model")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the parties' working directories here (they hold shares and keys: "
        "made readable by you alone)",
    )
    p.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="stop the secure run after SECONDS (default: the engine's, 4 h on mp-spdz, "
        "from the data's shape on mpyc)",
    )
    p.add_argument(
        "--stall-timeout", type=float, default=None, metavar="SECONDS",
        help="stop the secure run once no party has computed or printed for SECONDS: a "
        f"party froze (default {DEFAULT_STALL_SECONDS:g}; 0: never)",
    )


def _select_file(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    table = read_csv(args.data, args.label)
    return _select(args, table, source=str(args.data), read_seconds=time.perf_counter() - t0)


def _engine_install(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(f"ppfs: {msg}", file=sys.stderr)

    try:
        home = install_release(args.version, args.source, args.sha256, log=log)
    except ReleaseError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"ppfs: MP-SPDZ {args.version} installed in {home}", file=sys.stderr)
    if mpspdz_home() != home:
        print(f"ppfs: note: {mpspdz_home()} comes first in engine discovery "
              "(MPSPDZ_HOME, then /opt/mp-spdz, then installed releases)", file=sys.stderr)
    return _engine_status(argparse.Namespace(json=False))


def _engine_status(args: argparse.Namespace) -> int:
    report: dict[str, Any] = {}
    for name in ENGINE_NAMES:
        reason = engine_unavailable_reason(name)
        entry: dict[str, Any] = {"usable": reason is None}
        if reason is None:
            eng = get_engine(name)
            entry["securities"] = [s.value for s in Security if eng.supports(s)]
        else:
            entry["reason"] = reason
        if name == "mp-spdz":
            entry["home"] = str(mpspdz_home())
            entry["looked_in"] = [f"{h} ({why})" for h, why in mpspdz_candidates()]
            if not installed_homes() and "MPSPDZ_HOME" not in os.environ:
                entry["looked_in"].append(f"{install_root()}/<version> (none installed)")
        report[name] = entry
    report["default"] = default_engine_name()
    if args.json:
        print(json.dumps(report))
        return 0
    for name in ENGINE_NAMES:
        e = report[name]
        if e["usable"]:
            where = f" at {e['home']}" if "home" in e else ""
            print(f"{name}: usable{where}: {', '.join(e['securities'])}")
        else:
            print(f"{name}: not usable: {e['reason']}")
            if name == "mp-spdz":
                print("  looked in: " + "; ".join(e["looked_in"]))
                print("  install it with: ppfs engine install mp-spdz --sha256 <hash>")
    print(f"default engine: {report['default']}")
    return 0


def _resolve_engine(name: str | None, security: Security) -> Engine:
    chosen = name or default_engine_name(security.value)
    engine = get_engine(chosen)
    reason = engine.unavailable_reason()
    if reason is not None:
        hint = "; see ppfs engine status" if chosen == "mp-spdz" else ""
        raise EngineUnavailableError(f"engine {chosen} is not usable: {reason}{hint}")
    if not engine.supports(security):
        raise EngineUnavailableError(f"engine {chosen} does not support {security.value}")
    where = f" (found at {mpspdz_home()})" if chosen == "mp-spdz" else ""
    why = ""
    if chosen != "mp-spdz":
        why = (" because MP-SPDZ was not found (ppfs engine status)"
               if engine_unavailable_reason("mp-spdz") else
               f" because MP-SPDZ does not run {security.value}")
    how = "" if name else ", the default here" + why
    print(f"ppfs: engine {chosen}{where}{how}", file=sys.stderr)
    return engine


def _select(args: argparse.Namespace, table: LabelledTable, source: str = "input",
            read_seconds: float | None = None) -> int:
    security = Security(args.security)
    fp = FixedPoint(frac_bits=args.frac_bits)
    try:  # a value no scale can encode is bad input: refuse it before anything starts
        fp.choose_exponents(table.x, table.columns)
    except InputDataError as exc:
        raise InputDataError(f"{source}: {exc}") from None
    train = _train_params(args)
    reveal_reduced = not args.no_reduced
    # validates k, the shape and the training parameters
    scorer = Scorer(args.scorer)
    if not 1 <= args.k < table.p:
        raise ParameterError(
            f"{source}: --k {args.k}: k must be 1 .. {table.p - 1} (the file has p = "
            f"{table.p} feature columns besides the label {table.label_column!r})")
    Step2AShape(table.m, table.p, table.n_classes, args.k, fp.value_bits,
                reveal_reduced=reveal_reduced, train=train, scorer=scorer)
    if args.out is not None and not reveal_reduced:
        raise ParameterError("--out needs D', which --no-reduced keeps inside MPC")
    limits = _run_limits(args)
    engine = _resolve_engine(args.engine, security)
    for name, value in limits.items():
        setattr(engine, name, value)
    # made now: an --out that cannot be written is refused before the secure run, not after
    out_tmp = _claim_out(args.out) if args.out is not None else None
    try:
        return _select_run(args, table, security, engine, fp, train, reveal_reduced, scorer,
                           read_seconds, out_tmp)
    finally:
        if out_tmp is not None:
            out_tmp.unlink(missing_ok=True)


def _run_limits(args: argparse.Namespace) -> dict[str, float | None]:
    """The engine attributes --timeout and --stall-timeout set (those given), checked."""
    limits: dict[str, float | None] = {}
    if args.timeout is not None:
        if not 0 < args.timeout <= MAX_LIMIT_SECONDS:
            raise ParameterError(f"--timeout {args.timeout:g}: give 0 < SECONDS <= "
                                 f"{MAX_LIMIT_SECONDS:g}")
        limits["timeout"] = args.timeout
    if args.stall_timeout is not None:
        if not 0 <= args.stall_timeout <= MAX_LIMIT_SECONDS:
            raise ParameterError(f"--stall-timeout {args.stall_timeout:g}: give 0 <= SECONDS "
                                 f"<= {MAX_LIMIT_SECONDS:g} (0: never)")
        limits["stall_seconds"] = args.stall_timeout or None
    return limits


def _claim_out(path: Path) -> Path:
    """A fresh, empty file beside ``path`` that D' is written to and then renamed over
    ``path``; :class:`ParameterError` naming ``--out`` when it cannot be made."""
    if path.is_dir():
        raise ParameterError(f"--out: {path} is a directory; name the file to write D' to")
    if not path.parent.exists():
        raise ParameterError(f"--out: directory {path.parent} does not exist")
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ParameterError(
            f"--out: cannot write a file in {path.parent}: {exc.strerror or exc}") from None
    os.close(fd)
    return Path(name)


def _make_workdir(path: Path) -> None:
    """The parties' shares, masks and keys: for this user alone, a kept --workdir too."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.chmod(0o700)
    except OSError as exc:
        raise ParameterError(
            f"--workdir: cannot use {path} as a directory: {exc.strerror or exc}") from None


# a run's temporary directory, locked while it lasts; the next run (of `ppfs select` or
# `ppfs demo`) removes those whose run was killed (ppfs.run_dirs)
_temp_workdir = make_run_dir
_remove_left_behind = remove_left_behind


def _select_run(args: argparse.Namespace, table: LabelledTable, security: Security,
                engine: Engine, fp: FixedPoint, train: TrainParams | None, reveal_reduced: bool,
                scorer: Scorer, read_seconds: float | None, out_tmp: Path | None) -> int:
    keep = args.workdir is not None
    _remove_left_behind()
    with _terminating_signals_exit():
        lock: int | None = None
        if keep:
            workdir = args.workdir
        else:
            workdir, lock = _temp_workdir()
        # absolute: each engine party runs with its own directory as cwd
        workdir = workdir.absolute()
        _make_workdir(workdir)
        t0 = time.monotonic()
        try:
            tty = sys.stderr.isatty()
            with _ProgressDisplay(enabled=tty and not args.json,
                                  lines=not tty and not args.json) as show:
                selection = asyncio.run(
                    run_select(table, args.k, security, engine, workdir, fixed_point=fp,
                               progress=show, train=train, reveal_reduced=reveal_reduced,
                               scorer=scorer)
                )
        except (InputDataError, RangeAbortError) as exc:
            # data out of the range the encoding carries: refused by the owner's side
            # before sharing, or stopped by a range check inside MPC (one public bit)
            print(f"ppfs: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except EngineError as exc:
            who = f" (party {exc.party})" if exc.party else ""
            print(f"ppfs: error: secure run failed{who}: {exc}", file=sys.stderr)
            if not keep:  # the parties' logs go with the temporary directory below
                print("ppfs: the parties' working directories and logs are removed; "
                      "rerun with --workdir DIR to keep them", file=sys.stderr)
            return EXIT_FAILED
        except PpfsError as exc:
            print(f"ppfs: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
        finally:
            if not keep:
                shutil.rmtree(workdir, ignore_errors=True)
            if lock is not None:
                os.close(lock)
    seconds = time.monotonic() - t0
    if out_tmp is not None:
        try:
            _write_reduced(out_tmp, args.out, table, selection)
        except OSError as exc:
            print(f"ppfs: error: --out: cannot write {args.out}: {exc.strerror or exc}",
                  file=sys.stderr)
            return EXIT_FAILED
    _report(args, selection, seconds, table, read_seconds)
    return 0


@contextlib.contextmanager
def _terminating_signals_exit() -> Iterator[None]:
    """SIGTERM and SIGHUP raise SystemExit (exit code 128 + the signal) inside, as Ctrl-C
    raises KeyboardInterrupt, so that the run's cleanup runs: the engines stop their
    parties and the temporary directory, which holds every party's shares and keys, is
    removed. A second such signal is ignored while that cleanup runs; the previous
    handlers come back on the way out."""
    previous: dict[signal.Signals, Any] = {}

    def stop(signum: int, frame: object) -> None:
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _train_params(args: argparse.Namespace) -> TrainParams | None:
    train = train_params_from_flags(args)
    if train is None and args.no_reduced:
        raise ParameterError("--no-reduced needs --train")
    return train


def _report(args: argparse.Namespace, sel: Selection, seconds: float,
            table: LabelledTable, read_seconds: float | None = None) -> None:
    accuracy = sel.model.accuracy(table.x, table.y) if sel.model is not None else None
    if args.json:
        out: dict[str, Any] = {
            "selected": sel.columns,
            "k": sel.shape.k,
            "scorer": sel.shape.scorer.value,
            "security": sel.security.value,
            "engine": sel.run.engine,
            "parties": sel.security.parties,
            "m": sel.shape.m,
            "p": sel.shape.p,
            "classes": sel.shape.n_classes,
            "seconds": round(seconds, 3),
            "engine_seconds": round(sel.run.seconds, 3),
            "compile_seconds": round(sel.run.compile_seconds, 3),
            # where the rest of "seconds" (and the CSV read before it) went
            "phase_seconds": {
                **({"read": round(read_seconds, 3)} if read_seconds is not None else {}),
                "encode_share": round(sel.prepare_seconds, 3),
                "engine_setup": round(sel.run.setup_seconds, 3),
                "decode": round(sel.finish_seconds, 3),
            },
            "bytes_sent": sel.run.bytes_sent,
            "program_hash": sel.run.program_hash,
            "fixed_point": {
                "frac_bits": sel.fixed_point.frac_bits,
                "value_bits": sel.fixed_point.value_bits,
            },
        }
        if args.out is not None:
            out["out"] = str(args.out)
        out["reduced_revealed"] = sel.shape.reveal_reduced
        if sel.model is not None:
            # computed here, by the model's owner, in plaintext on its own data
            out["model"] = sel.model.to_json()
            out["train_accuracy"] = accuracy
        print(json.dumps(out))
        return
    print(f"selected {sel.shape.k} of {sel.shape.p} features by {sel.shape.scorer.value} "
          "(best first):")
    for rank, name in enumerate(sel.columns, start=1):
        print(f"  {rank:3d}. {name}")
    mb = sel.run.bytes_sent / 1e6
    print(
        f"{sel.security.value} on {sel.run.engine}, {sel.security.parties} parties: "
        f"{seconds:.1f} s, {mb:.1f} MB sent"
    )
    if args.out is not None:
        print(f"reduced data set written to {args.out}")
    if sel.model is not None and accuracy is not None:
        tp = sel.model.params
        print(f"logistic regression trained inside MPC ({tp.epochs} epochs, batch {tp.batch}, "
              f"lr {tp.lr}); training accuracy on your data: {100 * accuracy:.2f}%")
        for i, row in enumerate(sel.model.to_json()["models"]):
            terms = ", ".join(f"{name}: {w:.6g}" for name, w in row["weights"].items() if w)
            print(f"  model {i} ({row['target']}): intercept {row['intercept']:.6g}; {terms}")


def _write_reduced(tmp: Path, path: Path, table: LabelledTable, sel: Selection) -> None:
    """D' into ``tmp`` (made by :func:`_claim_out`), then renamed over ``path``."""
    with open(tmp, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([*sel.columns, table.label_column])
        for row, cls in zip(sel.reduced, table.y, strict=True):
            w.writerow([*(repr(float(v)) for v in row), table.classes[int(cls)]])
    tmp.replace(path)


def _demo(args: argparse.Namespace) -> int:
    from ppfs import oracle
    from ppfs.synthetic import make_table

    table = make_table(args.rows, args.cols, n_classes=args.classes, seed=args.seed)
    print(
        f"demo: synthetic data set, {table.m} rows x {table.p} features, "
        f"{table.n_classes} classes; keeping k={args.k}",
        file=sys.stderr,
    )
    rc = _select(args, table, source="demo data")
    if rc == 0 and not args.json:
        plain = oracle.ms_gini_top_k(table.x, table.y, table.n_classes, args.k)
        print(
            "plaintext MS-GINI on the same data selects: "
            + ", ".join(table.columns[int(j)] for j in plain)
        )
    return rc


class _ProgressDisplay:
    """Phase messages: on a terminal one live status line (rich); with ``lines`` (stderr
    piped or in a file) one line per new phase and, for the secure computation's own
    percentage, at most one line every :attr:`LINE_SECONDS`, so that a long run is never
    silent. The messages carry public phase names and counters only."""

    LINE_SECONDS = 10.0

    def __init__(self, enabled: bool, lines: bool = False) -> None:
        self.enabled = enabled
        self.lines = lines and not enabled
        self._status: Any = None
        self._t0 = time.monotonic()
        self._last_text: str | None = None
        self._last_at = 0.0

    def __enter__(self) -> _ProgressDisplay:
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status("starting")
            self._status.__enter__()
        return self

    def __call__(self, phase: str) -> None:
        now = time.monotonic()
        if isinstance(phase, ProgressNote):
            text = f"{phase} ({phase.fraction:.0%} of the secure computation)"
        else:
            text = str(phase)
        if self._status is not None:
            self._status.update(f"[{now - self._t0:6.1f}s] {text}")
        elif self.lines and text != self._last_text:
            note = isinstance(phase, ProgressNote)
            if note and self._last_at and now - self._last_at < self.LINE_SECONDS:
                return
            self._last_text, self._last_at = text, (now if note else 0.0)
            print(f"ppfs: [{now - self._t0:6.1f}s] {text}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
