"""Loading and validating a data owner's CSV table.

Every problem is reported as :class:`InputDataError` naming the column and row
(1-based data rows, the header is row 0), before anything is shared or started.
"""

from __future__ import annotations

import csv
import itertools
import math
import operator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppfs.errors import InputDataError, ParameterError


@dataclass(frozen=True)
class LabelledTable:
    """Numeric features plus a label column mapped to class indices 0..n-1."""

    columns: tuple[str, ...]
    x: np.ndarray  # (m, p) float64
    label_column: str
    classes: tuple[str, ...]
    y: np.ndarray  # (m,) int64 class index

    @property
    def m(self) -> int:
        return int(self.x.shape[0])

    @property
    def p(self) -> int:
        return int(self.x.shape[1])

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def one_hot(self) -> np.ndarray:
        """The paper's label-class matrix L: m x (n-1), the last class implicit."""
        eye = np.eye(self.n_classes, dtype=np.int64)
        return eye[self.y][:, : self.n_classes - 1]


def read_csv(path: Path, label: str) -> LabelledTable:
    """Read ``path`` with a header row; every column but ``label`` must be numeric."""
    header, body = _read_rows(path)
    return table_from_rows(header, body, label, source=str(path))


def read_features(path: Path) -> tuple[tuple[str, ...], np.ndarray]:
    """Read a CSV of numeric columns only (an owner without the label, vertical split)."""
    header, body = _read_rows(path)
    return tuple(header), _numeric(header, body, list(range(len(header))), str(path))


# Cells read as a missing value, in a feature and in the label alike.
MISSING = frozenset({"", "?", "NA", "N/A", "NaN", "nan", "null", "NULL", "None"})
# Separators other tools write; ppfs reads comma-separated files only.
_OTHER_SEPARATORS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def _read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """Header and data rows; refuses an unreadable, empty or ragged file."""
    if path.is_dir():
        raise InputDataError(f"{path}: is a directory, not a CSV file")
    try:
        # utf-8-sig: a byte-order mark (spreadsheet exports) is not part of the first name
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except FileNotFoundError:
        raise InputDataError(f"{path}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputDataError(f"{path}: not a readable CSV file ({exc})") from None
    except OSError as exc:
        raise InputDataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    rows = [r for r in rows if r and any(cell.strip() for cell in r)]
    if not rows:
        raise InputDataError(f"{path}: the file is empty")
    header = [h.strip() for h in rows[0]]
    if len(header) == 1:
        for sep, name in _OTHER_SEPARATORS.items():
            if sep in header[0]:
                raise InputDataError(
                    f"{path}: the header is one column {header[0][:40]!r}: the file looks "
                    f"{name}-separated; ppfs reads comma-separated CSV (save it with commas)"
                )
    body = rows[1:]
    if not body:
        raise InputDataError(f"{path}: the file has a header but no data rows")
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise InputDataError(f"{path}: column {dup!r} appears more than once in the header")
    for i, r in enumerate(body, start=1):
        if len(r) != len(header):
            raise InputDataError(
                f"{path}: row {i} has {len(r)} fields but the header has {len(header)}"
            )
    return header, body


def _numeric(header: list[str], body: list[list[str]], cols: list[int], source: str) -> np.ndarray:
    """The float matrix of columns ``cols``, naming the first missing or non-numeric cell."""
    x = _all_finite(body, cols)
    if x is not None:
        return x
    # some cell is missing, not a number or not finite (or padded with a space float()
    # does not skip): read cell by cell, which names the first bad one
    return _numeric_cells(header, body, cols, source)


def _all_finite(body: list[list[str]], cols: list[int]) -> np.ndarray | None:
    """The float matrix of columns ``cols`` when ``float`` reads every cell as written to
    a finite number, else None; one pass of ``float`` over all cells, no per-cell checks.

    Where it returns a matrix it is :func:`_numeric_cells`'s: ``float`` skips only
    whitespace that ``str.strip`` removes too (a cell padded otherwise fails here and is
    read there), and no missing-value marker reads as a finite number.
    """
    if not cols:
        return np.empty((len(body), 0), dtype=np.float64)
    if len(cols) == 1:
        cells = [r[cols[0]] for r in body]  # itemgetter of one index returns no tuple
    else:
        cells = list(itertools.chain.from_iterable(map(operator.itemgetter(*cols), body)))
    try:
        x = np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
    except ValueError:
        return None
    if not np.isfinite(x).all():
        return None
    return x.reshape(len(body), len(cols))


def _numeric_cells(
    header: list[str], body: list[list[str]], cols: list[int], source: str
) -> np.ndarray:
    """:func:`_numeric` cell by cell: stops at the first bad cell, naming it."""
    x = np.empty((len(body), len(cols)), dtype=np.float64)
    for i, r in enumerate(body, start=1):
        for t, j in enumerate(cols):
            cell = r[j].strip()
            if cell in MISSING:
                raise InputDataError(f"{source}: column {header[j]!r}, row {i}: missing value")
            try:
                v = float(cell)
            except ValueError:
                raise InputDataError(
                    f"{source}: column {header[j]!r}, row {i}: {cell[:20]!r} is not numeric"
                ) from None
            if not math.isfinite(v):
                raise InputDataError(
                    f"{source}: column {header[j]!r}, row {i}: {cell[:20]!r} is not a finite number"
                )
            x[i - 1, t] = v
    return x


def table_from_rows(
    header: list[str], body: list[list[str]], label: str, *, source: str = "input"
) -> LabelledTable:
    if label not in header:
        near = [h for h in header if h.casefold() == label.casefold()]
        hint = (
            f"; did you mean {near[0]!r}?"
            if near
            else "; the columns are " + ", ".join(repr(h) for h in header[:12])
            + (", ..." if len(header) > 12 else "")
        )
        raise ParameterError(f"{source}: label column {label!r} is not in the header{hint}")
    li = header.index(label)
    feat_idx = [j for j in range(len(header)) if j != li]
    if not feat_idx:
        raise InputDataError(f"{source}: there are no feature columns besides the label")
    x = _numeric(header, body, feat_idx, source)
    labels = [r[li].strip() for r in body]
    for i, v in enumerate(labels, start=1):
        if v in MISSING:
            raise InputDataError(f"{source}: label column {label!r}, row {i}: missing value")
    labels = _canonical_labels(labels)
    classes = _sorted_classes(labels)
    if len(classes) < 2:
        raise InputDataError(
            f"{source}: label column {label!r} has a single class ({classes[0]!r}); "
            "feature selection needs at least two"
        )
    index = {c: t for t, c in enumerate(classes)}
    y = np.array([index[v] for v in labels], dtype=np.int64)
    columns = tuple(header[j] for j in feat_idx)
    return LabelledTable(columns, x, label, tuple(classes), y)


def _canonical_labels(labels: list[str]) -> list[str]:
    """Numeric labels name their value, so ``1``, ``1.0`` and ``01`` are one class."""
    try:
        values = [float(v) for v in labels]
    except ValueError:
        return labels  # categorical labels are taken as written
    if not all(math.isfinite(v) for v in values):
        return labels
    return [str(int(v)) if v.is_integer() else repr(v) for v in values]


def _sorted_classes(labels: list[str]) -> list[str]:
    distinct = set(labels)
    try:
        return sorted(distinct, key=float)
    except ValueError:
        return sorted(distinct)
