"""The embedded default: a data owner, the parties and the result's recipient as
local processes on one machine.

:func:`prepare_inputs` does what a data owner's client does (encode, share, write
one directory per party) and what the recipient does before a run (draw mask
words and share them). :func:`run_select` then runs Step 2A on an engine and
unmasks the opened words on the recipient's side only.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppfs.engines.base import PARTY_NAMES, Engine, EngineRun, Progress, Step2AInputs
from ppfs.errors import EngineError, EngineUnavailableError
from ppfs.fixedpoint import FixedPoint
from ppfs.scoring import Scorer
from ppfs.sharing import bundles_for_all
from ppfs.step2a import Security, Step2AShape, draw_mask_words, unmask_all
from ppfs.step2b import (
    Model,
    TrainParams,
    decode_model,
    refuse_unstandardisable,
    split_model_words,
)
from ppfs.table import LabelledTable


@dataclass(frozen=True)
class PreparedInputs:
    inputs: Step2AInputs
    exponents: np.ndarray  # public per-column scale exponents (the schema)
    raw: np.ndarray  # encoded values; stays with the data owner
    mask_words: np.ndarray  # stays with the recipient


@dataclass
class Selection:
    """What the recipient learns: the selected columns, best first, D' (unless
    withheld: then m x 0 arrays) and, with training, the model (Step 2B)."""

    columns: list[str]
    indices: np.ndarray
    reduced: np.ndarray  # m x k floats, decoded with each selected column's scale
    reduced_raw: np.ndarray  # m x k encoded values
    run: EngineRun
    shape: Step2AShape
    security: Security
    fixed_point: FixedPoint
    model: Model | None = None
    model_words: np.ndarray | None = None  # the model's unmasked fixed-point words
    # outside the engine: encoding, sharing and writing every party's inputs (the owner's
    # side), and unmasking and decoding the opened words (the recipient's side)
    prepare_seconds: float = 0.0
    finish_seconds: float = 0.0


def prepare_inputs(
    table: LabelledTable,
    k: int,
    security: Security,
    root: Path,
    *,
    fixed_point: FixedPoint | None = None,
    train: TrainParams | None = None,
    reveal_reduced: bool = True,
    scorer: Scorer = Scorer.MS_GINI,
) -> PreparedInputs:
    fp = fixed_point or FixedPoint()
    shape = Step2AShape(table.m, table.p, table.n_classes, k, fp.value_bits,
                        reveal_reduced=reveal_reduced, train=train, scorer=scorer)
    exps = fp.choose_exponents(table.x, table.columns)
    raw = fp.encode(table.x, exps, table.columns)
    words = draw_mask_words(shape.outputs)
    dataset_id = uuid.uuid4().hex
    dirs = tuple(
        root / f"p{i}-{PARTY_NAMES[i].lower()}" / "inputs" for i in range(security.parties)
    )
    root.mkdir(parents=True, exist_ok=True)
    for d in dirs:  # the party's own folders: for the user that runs it alone
        d.parent.mkdir(mode=0o700, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
    for kind, matrix, frac in (
        ("data", raw, fp.frac_bits),
        ("labels", table.one_hot(), 0),
        ("mask", words, 0),
    ):
        bundles = bundles_for_all(
            matrix, security.scheme, dataset_id=dataset_id, kind=kind, frac_bits=frac
        )
        for i, b in enumerate(bundles):
            # not synced to disk: the engine reads them at once, and a crash ends the run
            # anyway
            b.save(dirs[i] / f"{kind}.shr", durable=False)
    return PreparedInputs(Step2AInputs(shape, security, dirs), exps, raw, words)


async def run_select(
    table: LabelledTable,
    k: int,
    security: Security,
    engine: Engine,
    workdir: Path,
    *,
    fixed_point: FixedPoint | None = None,
    progress: Progress | None = None,
    train: TrainParams | None = None,
    reveal_reduced: bool = True,
    refuse_out_of_range: bool = True,
    scorer: Scorer = Scorer.MS_GINI,
) -> Selection:
    """Step 2A (and Step 2B with ``train``) on local parties; unmask for the recipient.

    ``reveal_reduced=False`` keeps D' inside MPC (a training-only job). With training,
    a column the secure range check would stop on is refused here first, naming it
    (the owner sees its own data); ``refuse_out_of_range=False`` leaves it to the
    check inside MPC.
    """
    reason = engine.unavailable_reason()
    if reason is not None:
        raise EngineUnavailableError(f"engine {engine.name} is not usable: {reason}")
    if not engine.supports(security):
        raise EngineUnavailableError(f"engine {engine.name} does not support {security.value}")
    fp = fixed_point or FixedPoint()
    if train is not None and refuse_out_of_range:
        refuse_unstandardisable(
            fp.encode(table.x, fp.choose_exponents(table.x, table.columns), table.columns),
            table.columns, fp.value_bits, train,
        )
    if progress:
        progress("encoding and secret-sharing the data")
    t_prepare = time.perf_counter()
    prepared = prepare_inputs(table, k, security, workdir, fixed_point=fp,
                              train=train, reveal_reduced=reveal_reduced, scorer=scorer)
    prepare_seconds = time.perf_counter() - t_prepare
    # only the recipient's mask words and the public exponents are needed afterwards:
    # the encoded table is not kept beside the parties while they run
    inputs, mask_words, exponents = prepared.inputs, prepared.mask_words, prepared.exponents
    del prepared
    run = await engine.run_step2a(inputs, workdir, progress)
    t_finish = time.perf_counter()
    shape = inputs.shape
    out = unmask_all(run.opened, mask_words, shape)
    idx = out.indices
    if np.any((idx < 0) | (idx >= shape.p)) or len(set(idx.tolist())) != shape.k:
        raise EngineError("the opened selection is not a set of k distinct columns")
    if out.reduced is not None:
        reduced_raw = out.reduced
        reduced = fp.decode(reduced_raw, exponents[idx][None, :])
    else:
        reduced_raw = np.zeros((shape.m, 0), dtype=np.int64)
        reduced = np.zeros((shape.m, 0))
    model = None
    if train is not None and out.model is not None:
        alpha_full, beta = split_model_words(out.model, shape.p, shape.n_classes)
        model = decode_model(alpha_full, beta, exponents, fp, train,
                             table.columns, table.classes)
    return Selection(
        columns=[table.columns[int(j)] for j in idx],
        indices=idx,
        reduced=reduced,
        reduced_raw=reduced_raw,
        run=run,
        shape=shape,
        security=security,
        fixed_point=fp,
        model=model,
        model_words=out.model,
        prepare_seconds=prepare_seconds,
        finish_seconds=time.perf_counter() - t_finish,
    )
