"""A job's inputs from stored uploads: purely local operations on own share components.

Additive shares combine element-wise, so joining the components of several uploads
gives valid shares of the joined matrix without any interaction:

- the uploads of one data set (several owners' rows under one schema) are stacked by
  rows, in the order the job pins them, which must be the order their owners signed
  (:meth:`ppfs.upload.Manifest.order_key`: creation time in the manifest, then upload
  id), so that whoever writes the job cannot put rows out of line;
- across the job's data sets, HORIZONTAL stacks rows (same columns, every part
  labelled) and VERTICAL joins columns (same rows in the same order, exactly one
  data set carries the label).

A job runs on exactly the uploads its description pins (:func:`pinned_uploads`):
every named upload must be held here with the named manifest SHA-256 and row count,
no other upload of a named data set may be held when the job is accepted, they must be
listed in their owners' signed order, and the plan of the held manifests
(:func:`ppfs.contract.plan`) must give the job's m, p and classes. An upload committed
to a named data set after the job was accepted is not in it: the job runs on what it
pinned, and another owner's upload does not stop it.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ppfs.contract import DatasetSchema, JobContract, Plan, plan
from ppfs.errors import ParameterError
from ppfs.sharing import Scheme, ShareBundle
from ppfs.step2a import Step2AShape
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
    bundles: list[ShareBundle]  # this party's data, labels and mask, for the engine


def _stack(parts: list[Components], axis: int) -> Components:
    if len(parts) == 1:  # one upload: its components as loaded, not copied
        return parts[0]
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


class PinnedInputsError(ParameterError):
    """The uploads this party holds differ from those the job pins."""


class _Problems(list[str]):
    """The differences found, as many as a message names (480 characters)."""

    def append(self, problem: str) -> None:
        if len(self) < 24:  # every problem names at least 20 characters
            super().append(problem)

    def __str__(self) -> str:
        return "; ".join(self)[:480]


def pinned_uploads(store: ShareStore, job: JobContract, party_name: str, *,
                   accepted: bool = False) -> list[list[StoredUpload]]:
    """The job's uploads as held here, per data set in the job's order; PinnedInputsError
    naming every difference between what the job pins and what this party holds (for a
    job ``accepted`` already, uploads committed since are no difference)."""
    return pinned_plan(store, job, party_name, accepted=accepted)[0]


def pinned_plan(store: ShareStore, job: JobContract, party_name: str, *,
                accepted: bool = False) -> tuple[list[list[StoredUpload]], Plan]:
    """:func:`pinned_uploads` and the plan (columns, exponents, classes) of the
    owner-signed manifests held here. Until the job is ``accepted``, an upload of a named
    data set that the job does not pin is a difference: the job must take the data set
    whole as it is then, so that no one running it leaves an owner's rows out."""
    # linear in the description and the store: a description the size of a gRPC message
    # (a million pins of one upload, or of as many data sets) is refused in a moment
    held_by = store.held_by_dataset(ds.dataset_id for ds in job.datasets)
    problems = _Problems()
    found: list[list[StoredUpload]] = []
    for ds in job.datasets:
        held = held_by.get(ds.dataset_id, {})
        named = {u.upload_id for u in ds.uploads}
        pins = collections.Counter(u.upload_id for u in ds.uploads)
        for twice in sorted(i for i, n in pins.items() if n > 1):
            # its rows would be stacked again: another owner's weight, another m
            problems.append(f"the job pins upload {twice!r} of data set {ds.dataset_id!r} "
                            "more than once")
        ups, seen = [], set()
        for pin in ds.uploads:
            if pin.upload_id in seen:  # named above, once
                continue
            seen.add(pin.upload_id)
            u = held.get(pin.upload_id)
            if u is None:
                problems.append(f"{party_name} does not hold upload {pin.upload_id!r} "
                                f"of data set {ds.dataset_id!r}")
            elif u.manifest.digest() != pin.manifest_sha256:
                problems.append(f"{party_name}'s upload {pin.upload_id!r} has another "
                                "manifest than the job names")
            elif u.manifest.rows != pin.rows:
                problems.append(f"{party_name}'s upload {pin.upload_id!r} has "
                                f"{u.manifest.rows} rows, the job says {pin.rows}")
            else:
                ups.append(u)
        for extra in sorted(set(held) - named) if not accepted else ():
            problems.append(f"{party_name} holds upload {extra!r} of data set "
                            f"{ds.dataset_id!r} not named by the job")
        found.append(ups)
    if problems:
        raise PinnedInputsError(str(problems))
    for ds, ups in zip(job.datasets, found, strict=True):
        listed = [u.manifest.upload_id for u in ups]
        signed = [u.manifest.upload_id for u in sorted(ups, key=lambda u: u.manifest.order_key())]
        if listed != signed:
            raise PinnedInputsError(
                (f"the job lists the uploads of data set {ds.dataset_id!r} out of the order "
                 "their owners signed; in that order they are "
                 + ", ".join(repr(u) for u in signed))[:480]
            )
    schemas = []
    for ds, ups in zip(job.datasets, found, strict=True):
        m = ups[0].manifest
        if any((u.manifest.columns, u.manifest.column_exponents, u.manifest.label_column,
                u.manifest.classes) != (m.columns, m.column_exponents, m.label_column,
                                        m.classes) for u in ups):
            raise PinnedInputsError(f"the uploads of data set {ds.dataset_id!r} differ in schema")
        schemas.append(DatasetSchema(ds.dataset_id, m.columns, m.column_exponents,
                                     m.label_column, m.classes, m.frac_bits,
                                     sum(u.manifest.rows for u in ups)))
    got = plan(schemas, job.combination, job.label_column)
    if (got.m, got.p, len(got.classes), got.frac_bits) != (job.m, job.p, job.classes,
                                                           job.frac_bits):
        raise PinnedInputsError(
            f"{party_name}'s uploads give m={got.m}, p={got.p}, {len(got.classes)} classes, "
            f"{got.frac_bits} fractional bits; the job says m={job.m}, p={job.p}, "
            f"{job.classes} classes, {job.frac_bits}"
        )
    return found, got


def assemble(store: ShareStore, job: JobContract, party: int, party_name: str) -> JobInputs:
    """This party's data, labels and mask bundles for the job, in memory: the engine
    takes them as they are (an engine that reads its inputs in another process writes
    them out itself, :meth:`ppfs.engines.base.PartyRunSpec.write_input_files`)."""
    security = job.security
    scheme = security.scheme
    parts = [_dataset_part(ups, scheme)
             for ups in pinned_uploads(store, job, party_name, accepted=True)]
    if len(parts) == 1 or job.combination.value == "horizontal":
        first = parts[0]
        if any(p.labels is None for p in parts):
            raise ParameterError("horizontal combination needs the label in every dataset")
        data = _stack([p.data for p in parts], 0)
        labels = _stack([p.labels for p in parts if p.labels is not None], 0)
        columns, exponents = first.columns, first.exponents
    else:
        labelled = [p for p in parts if p.labels is not None]
        if len(labelled) != 1 or labelled[0].labels is None:
            raise ParameterError("vertical combination needs the label in exactly one dataset")
        data = _stack([p.data for p in parts], 1)
        labels = labelled[0].labels
        columns = tuple(c for p in parts for c in p.columns)
        exponents = tuple(e for p in parts for e in p.exponents)
    shape = job.shape
    if next(iter(data.values())).shape != (shape.m, shape.p):
        raise ParameterError("the assembled data does not have the job's shape")
    mask_upload = store.upload(job.mask_upload_id)
    if mask_upload.kinds != frozenset({"mask"}):
        raise ParameterError("the mask upload holds no mask words")
    mask = mask_upload.bundle("mask")
    if mask.shape != (shape.outputs, 2) or mask.scheme is not scheme:
        raise ParameterError(
            f"the mask upload must hold {shape.outputs} mask words for {security.value}"
        )
    bundles = [
        ShareBundle(scheme, party, job.job_id, kind, next(iter(comps.values())).shape, frac,
                    dict(comps))
        for kind, comps, frac in (("data", data, job.frac_bits), ("labels", labels, 0),
                                  ("mask", mask.components, 0))
    ]
    return JobInputs(shape, columns, exponents, bundles)
