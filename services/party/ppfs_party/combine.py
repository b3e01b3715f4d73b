"""A job's inputs from stored uploads: purely local operations on own share components.

Additive shares combine element-wise, so joining the components of several uploads
gives valid shares of the joined matrix without any interaction:

- uploads of one dataset (several owners' rows under one schema) are stacked by rows;
- across the job's datasets, HORIZONTAL stacks rows (same columns, every part
  labelled) and VERTICAL joins columns (same rows in the same order, exactly one
  dataset carries the label).

The order is the job's dataset order, then upload id: the same on every party.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppfs.errors import ParameterError
from ppfs.fixedpoint import FixedPoint
from ppfs.jobdesc import service_shape
from ppfs.sharing import Scheme, ShareBundle
from ppfs.step2a import Security, Step2AShape
from ppfs.step2b import TrainParams
from ppfs.upload import Manifest
from ppfs_party.store import ShareStore, StoredUpload

Components = dict[int, np.ndarray]


@dataclass
class _Part:
    data: Components
    labels: Components | None
    columns: tuple[str, ...]
    exponents: tuple[int, ...]
    rows: int
    manifest: Manifest  # of the first upload (schema)


@dataclass(frozen=True)
class JobInputs:
    shape: Step2AShape
    columns: tuple[str, ...]
    exponents: tuple[int, ...]


def _stack(parts: list[Components], axis: int) -> Components:
    return {j: np.concatenate([p[j] for p in parts], axis=axis) for j in parts[0]}


def _dataset_part(uploads: list[StoredUpload], scheme: Scheme) -> _Part:
    data, labels = [], []
    for u in uploads:
        if "data" not in u.kinds:
            raise ParameterError(f"upload {u.manifest.upload_id!r} holds no data")
        if u.manifest.scheme != scheme.value:
            raise ParameterError("a dataset was shared for another number of parties")
        data.append(u.bundle("data").components)
        if "labels" in u.kinds:
            labels.append(u.bundle("labels").components)
    if labels and len(labels) != len(data):
        raise ParameterError("some of a dataset's uploads carry the label and some do not")
    m = uploads[0].manifest
    return _Part(
        data=_stack(data, 0), labels=_stack(labels, 0) if labels else None,
        columns=m.columns, exponents=m.column_exponents,
        rows=sum(u.manifest.rows for u in uploads), manifest=m,
    )


def assemble(
    store: ShareStore, *, job_id: str, dataset_ids: list[str], horizontal: bool,
    label_column: str, mask_upload_id: str, k: int, security: Security, frac_bits: int,
    party: int, out_dir: Path, train: TrainParams | None = None,
) -> JobInputs:
    """Write this party's data.shr, labels.shr and mask.shr for the job to ``out_dir``."""
    scheme = security.scheme
    if not dataset_ids:
        raise ParameterError("the job names no dataset")
    parts = [_dataset_part(store.dataset_uploads(d), scheme) for d in dataset_ids]
    if len(parts) == 1 or horizontal:
        first = parts[0]
        if any((p.columns, p.exponents) != (first.columns, first.exponents) for p in parts):
            raise ParameterError("horizontal combination needs the same columns and scales")
        if any(p.labels is None for p in parts):
            raise ParameterError("horizontal combination needs the label in every dataset")
        data = _stack([p.data for p in parts], 0)
        labels = _stack([p.labels for p in parts if p.labels is not None], 0)
        columns, exponents = first.columns, first.exponents
        labelled = parts
    else:
        if len({p.rows for p in parts}) != 1:
            raise ParameterError("vertical combination needs the same number of rows")
        columns = tuple(c for p in parts for c in p.columns)
        if len(set(columns)) != len(columns):
            raise ParameterError("vertical combination needs distinct column names")
        labelled = [p for p in parts if p.labels is not None]
        if len(labelled) != 1 or labelled[0].labels is None:
            raise ParameterError("vertical combination needs the label in exactly one dataset")
        data = _stack([p.data for p in parts], 1)
        labels = labelled[0].labels
        exponents = tuple(e for p in parts for e in p.exponents)
    schema = labelled[0].manifest
    if any(p.manifest.classes != schema.classes for p in labelled):
        raise ParameterError("the datasets' label classes differ")
    if label_column and schema.label_column != label_column:
        raise ParameterError(f"the label column is {schema.label_column!r}, not {label_column!r}")
    if any(p.manifest.frac_bits != frac_bits for p in parts):
        raise ParameterError("the job's fractional bits differ from the datasets'")

    m, p = next(iter(data.values())).shape
    fp = FixedPoint(frac_bits=frac_bits)
    shape = service_shape(int(m), int(p), len(schema.classes), k, fp.value_bits, train)
    mask_upload = store.upload(mask_upload_id)
    if mask_upload.kinds != frozenset({"mask"}):
        raise ParameterError("the mask upload holds no mask words")
    mask = mask_upload.bundle("mask")
    if mask.shape != (shape.outputs, 2) or mask.scheme is not scheme:
        raise ParameterError(
            f"the mask upload must hold {shape.outputs} mask words for {security.value}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for kind, comps, frac in (("data", data, frac_bits), ("labels", labels, 0),
                              ("mask", mask.components, 0)):
        ShareBundle(scheme, party, job_id, kind, next(iter(comps.values())).shape, frac,
                    dict(comps)).save(out_dir / f"{kind}.shr")
    return JobInputs(shape, columns, exponents)
