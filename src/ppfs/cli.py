"""ppfs command line: the embedded default (all parties as local processes)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import importlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppfs.engines.base import Engine
from ppfs.engines.registry import ENGINE_NAMES, default_engine_name, get_engine, mpspdz_home
from ppfs.errors import (
    EngineError,
    EngineUnavailableError,
    InputDataError,
    ParameterError,
    PpfsError,
    RangeAbortError,
)
from ppfs.fixedpoint import FixedPoint
from ppfs.local import Selection, run_select
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.table import LabelledTable, read_csv

EXIT_USAGE = 2
EXIT_FAILED = 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ppfs", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    sel = sub.add_parser(
        "select",
        help="private MS-GINI feature selection (Step 2A) of a CSV on local parties",
        description="Encode and secret-share DATA.csv as a data owner would, run Step 2A on "
        "local MPC parties, and reveal to you only the selected column names (best first) "
        "and, with --out, the reduced data set D'.",
    )
    sel.add_argument("data", type=Path, metavar="DATA.csv")
    _job_args(sel)

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

    for module in _COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        register = getattr(mod, "add_commands", None)
        if register is not None:
            register(sub)  # each sets `func` on its parsers: func(args) -> exit code
    return p


# Service commands live with their services and the client; each module offers
# add_commands(subparsers). Imported lazily so `ppfs select` needs none of them.
_COMMAND_MODULES = ("ppfs_client.commands", "ppfs_party.commands", "ppfs_gateway.commands")


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
        help="default: mp-spdz when found (MPSPDZ_HOME, else /opt/mp-spdz), else mpyc",
    )
    p.add_argument("--frac-bits", type=int, default=16, help="fixed-point fractional bits f")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="REDUCED.csv",
        help="write D' (the selected columns, best first) and the label column",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    tr = p.add_argument_group(
        "Step 2B", "train logistic regression inside MPC on the selected features; only you "
        "receive the model (weights per column in original units, zero for the columns not "
        "selected, and the intercept)")
    tr.add_argument("--train", action="store_true", help="also train (Step 2B)")
    tr.add_argument("--epochs", type=int, default=None,
                    help=f"passes over the data (default {TrainParams.epochs})")
    tr.add_argument("--lr", type=float, default=None,
                    help=f"learning rate (default {TrainParams.lr})")
    tr.add_argument("--batch", type=int, default=None,
                    help=f"mini-batch size (default {TrainParams.batch})")
    tr.add_argument("--train-seed", type=int, default=None,
                    help="seed of the public batch order (default 0)")
    tr.add_argument("--weight-bits", type=int, default=None,
                    help="stop with an error if a standardised weight reaches 2^BITS "
                         f"(1 to {TrainParams.weight_bits}, the default: where the "
                         "fixed-point products stay in range)")
    tr.add_argument("--no-reduced", action="store_true",
                    help="keep D' inside MPC: reveal only the selection and the model")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the parties' working directories here (they hold shares and keys)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if getattr(args, "func", None) is not None:
            return int(args.func(args))
        if args.command == "demo":
            return _demo(args)
        table = read_csv(args.data, args.label)
        return _select(args, table)
    except (InputDataError, ParameterError, EngineUnavailableError) as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _resolve_engine(name: str | None, security: Security) -> Engine:
    chosen = name or default_engine_name()
    engine = get_engine(chosen)
    reason = engine.unavailable_reason()
    if reason is not None:
        raise EngineUnavailableError(f"engine {chosen} is not usable: {reason}")
    if not engine.supports(security):
        raise EngineUnavailableError(f"engine {chosen} does not support {security.value}")
    where = f" (found at {mpspdz_home()})" if chosen == "mp-spdz" else ""
    how = (
        ""
        if name
        else ", the default here"
        + ("" if chosen == "mp-spdz" else " because MP-SPDZ was not found")
    )
    print(f"ppfs: engine {chosen}{where}{how}", file=sys.stderr)
    return engine


def _select(args: argparse.Namespace, table: LabelledTable) -> int:
    security = Security(args.security)
    fp = FixedPoint(frac_bits=args.frac_bits)
    train = _train_params(args)
    reveal_reduced = not args.no_reduced
    # validates k, the shape and the training parameters
    Step2AShape(table.m, table.p, table.n_classes, args.k, fp.value_bits,
                reveal_reduced=reveal_reduced, train=train)
    if args.out is not None and not reveal_reduced:
        raise ParameterError("--out needs D', which --no-reduced keeps inside MPC")
    engine = _resolve_engine(args.engine, security)
    if args.out is not None and not args.out.parent.exists():
        raise ParameterError(f"--out: directory {args.out.parent} does not exist")

    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ppfs-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        with _ProgressDisplay(enabled=sys.stderr.isatty() and not args.json) as show:
            selection = asyncio.run(
                run_select(table, args.k, security, engine, workdir, fixed_point=fp,
                           progress=show, train=train, reveal_reduced=reveal_reduced)
            )
    except (InputDataError, RangeAbortError) as exc:
        # data out of the range the encoding carries: refused by the owner's side
        # before sharing, or stopped by a range check inside MPC (one public bit)
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except EngineError as exc:
        who = f" (party {exc.party})" if exc.party else ""
        print(f"ppfs: error: secure run failed{who}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except PpfsError as exc:
        print(f"ppfs: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.monotonic() - t0
    if args.out is not None:
        _write_reduced(args.out, table, selection)
    _report(args, selection, seconds, table)
    return 0


def _train_params(args: argparse.Namespace) -> TrainParams | None:
    given = [n for n in ("epochs", "lr", "batch", "train_seed", "weight_bits")
             if getattr(args, n) is not None]
    if not args.train:
        if given or args.no_reduced:
            flag = "--" + given[0].replace("_", "-") if given else "--no-reduced"
            raise ParameterError(f"{flag} needs --train")
        return None
    d = TrainParams()
    return TrainParams(
        epochs=args.epochs if args.epochs is not None else d.epochs,
        batch=args.batch if args.batch is not None else d.batch,
        lr=args.lr if args.lr is not None else d.lr,
        seed=args.train_seed if args.train_seed is not None else d.seed,
        weight_bits=args.weight_bits if args.weight_bits is not None else d.weight_bits,
    )


def _report(args: argparse.Namespace, sel: Selection, seconds: float,
            table: LabelledTable) -> None:
    accuracy = sel.model.accuracy(table.x, table.y) if sel.model is not None else None
    if args.json:
        out: dict[str, Any] = {
            "selected": sel.columns,
            "k": sel.shape.k,
            "security": sel.security.value,
            "engine": sel.run.engine,
            "parties": sel.security.parties,
            "m": sel.shape.m,
            "p": sel.shape.p,
            "classes": sel.shape.n_classes,
            "seconds": round(seconds, 3),
            "engine_seconds": round(sel.run.seconds, 3),
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
    print(f"selected {sel.shape.k} of {sel.shape.p} features (best first):")
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


def _write_reduced(path: Path, table: LabelledTable, sel: Selection) -> None:
    tmp = path.with_name(path.name + ".tmp")
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
    rc = _select(args, table)
    if rc == 0 and not args.json:
        plain = oracle.ms_gini_top_k(table.x, table.y, table.n_classes, args.k)
        print(
            "plaintext MS-GINI on the same data selects: "
            + ", ".join(table.columns[int(j)] for j in plain)
        )
    return rc


class _ProgressDisplay:
    """Phase messages on a terminal (rich status line); silent otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._status: Any = None
        self._t0 = time.monotonic()

    def __enter__(self) -> _ProgressDisplay:
        if self.enabled:
            from rich.console import Console

            self._status = Console(stderr=True).status("starting")
            self._status.__enter__()
        return self

    def __call__(self, phase: str) -> None:
        if self._status is not None:
            self._status.update(f"[{time.monotonic() - self._t0:6.1f}s] {phase}")

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)


if __name__ == "__main__":
    sys.exit(main())
