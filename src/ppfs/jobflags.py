"""Command-line flags a job shares between `ppfs select` and `ppfs jobs submit`.

One set of training flags (same names, same defaults, taken from
:class:`ppfs.step2b.TrainParams`) and one rule for the default engine, so the
embedded and the service command read the same.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ppfs.errors import ParameterError
from ppfs.step2b import TrainParams

# Engines from best to worst: MP-SPDZ is ~100x faster on comparisons than MPyC.
ENGINE_PREFERENCE = ("mp-spdz", "mpyc")
# The security settings each engine runs (states the engines' `supports` without
# importing them, for a client that only knows what a deployment offers).
ENGINE_SECURITIES = {
    "mp-spdz": ("passive-3pc", "active-3pc", "active-4pc"),
    "mpyc": ("passive-3pc", "passive-4pc"),
}
TRAINING_FLAGS = ("epochs", "learning_rate", "batch_size", "train_seed", "weight_bits")


def best_engine(offered: Iterable[Iterable[str]], security: str | None = None) -> str | None:
    """The best engine every party offers (one iterable of engine names per party)
    that runs ``security``; None when there is none."""
    sets = [set(o) for o in offered]
    for name in ENGINE_PREFERENCE:
        if all(name in s for s in sets) and (
            security is None or security in ENGINE_SECURITIES[name]
        ):
            return name
    return None


SCORER_HELP = (
    "how features are scored inside MPC: ms-gini (mean-split Gini, the default), "
    "pearson (squared Pearson correlation with the label; one-vs-rest summed over "
    "classes beyond two), chi2 (Pearson's chi-squared of the mean split against the label)"
)


def add_scorer_flag(p: argparse.ArgumentParser) -> None:
    from ppfs.scoring import SCORER_NAMES

    p.add_argument("--scorer", choices=SCORER_NAMES, default="ms-gini", help=SCORER_HELP)


def add_training_flags(p: argparse.ArgumentParser) -> None:
    d = TrainParams()
    tr = p.add_argument_group(
        "Step 2B",
        "train logistic regression inside MPC on the selected features; only the result's "
        "recipient receives the model (weights per column in original units, zero for the "
        "columns not selected, and the intercept). Any of these flags implies --train.",
    )
    tr.add_argument("--train", action="store_true", help="also train (Step 2B)")
    tr.add_argument("--epochs", type=int, default=None,
                    help=f"passes over the data (default {d.epochs})")
    tr.add_argument("--learning-rate", type=float, default=None, dest="learning_rate",
                    help=f"SGD learning rate (default {d.lr})")
    tr.add_argument("--lr", type=float, default=None, dest="learning_rate",
                    help=argparse.SUPPRESS)  # older spelling
    tr.add_argument("--batch-size", type=int, default=None, dest="batch_size",
                    help=f"mini-batch size (default {d.batch})")
    tr.add_argument("--batch", type=int, default=None, dest="batch_size",
                    help=argparse.SUPPRESS)  # older spelling
    tr.add_argument("--train-seed", type=int, default=None,
                    help=f"seed of the public batch order (default {d.seed})")
    tr.add_argument("--weight-bits", type=int, default=None,
                    help="stop with an error if a standardised weight reaches 2^BITS "
                         f"(1 to {d.weight_bits}, the default: where the fixed-point "
                         "products stay in range)")


def train_params_from_flags(args: argparse.Namespace) -> TrainParams | None:
    """TrainParams when --train or any training flag was given, else None."""
    given = [n for n in TRAINING_FLAGS if getattr(args, n, None) is not None]
    if not args.train and not given:
        return None
    d = TrainParams()

    def pick(name: str, default: float) -> float:
        v = getattr(args, name)
        return default if v is None else v

    try:
        return TrainParams(
            epochs=int(pick("epochs", d.epochs)),
            batch=int(pick("batch_size", d.batch)),
            lr=float(pick("learning_rate", d.lr)),
            seed=int(pick("train_seed", d.seed)),
            weight_bits=int(pick("weight_bits", d.weight_bits)),
        )
    except ValueError as exc:
        raise ParameterError(str(exc)) from None
