import numpy as np
import pytest

from ppfs.errors import InputDataError, ParameterError
from ppfs.table import read_csv, read_features


def write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_reads_and_maps_classes(tmp_path):
    t = read_csv(write(tmp_path, "a,b,y\n1,2,yes\n3,4.5,no\n-1e3,0,yes\n"), "y")
    assert t.columns == ("a", "b") and t.classes == ("no", "yes")
    np.testing.assert_array_equal(t.y, [1, 0, 1])
    np.testing.assert_array_equal(t.one_hot(), [[0], [1], [0]])


def test_numeric_classes_sorted_numerically(tmp_path):
    t = read_csv(write(tmp_path, "a,y\n1,10\n2,9\n3,2\n"), "y")
    assert t.classes == ("2", "9", "10")
    assert t.one_hot().shape == (3, 2)


@pytest.mark.parametrize(
    "text, label, err, pattern",
    [
        ("", "y", InputDataError, "empty"),
        ("a,y\n", "y", InputDataError, "no data rows"),
        ("a,b,y\n1,2,0\n1,2\n", "y", InputDataError, "row 2 has 2 fields"),
        ("a,b,y\n1,x,0\n2,3,1\n", "y", InputDataError, "column 'b', row 1: 'x' is not numeric"),
        ("a,b,y\n1,2,0\n,3,1\n", "y", InputDataError, "column 'a', row 2: missing value"),
        ("a,b,y\n1,2,0\n2,3,0\n", "y", InputDataError, "single class"),
        ("a,b,y\n1,2,0\n2,3,1\n", "label", ParameterError, "'label' is not in the header"),
        ("a,a,y\n1,2,0\n2,3,1\n", "y", InputDataError, "more than once"),
    ],
)
def test_bad_input_named(tmp_path, text, label, err, pattern):
    with pytest.raises(err, match=pattern):
        read_csv(write(tmp_path, text), label)


def test_missing_file(tmp_path):
    with pytest.raises(InputDataError, match="no such file"):
        read_csv(tmp_path / "nope.csv", "y")


def test_read_features_without_label(tmp_path):
    cols, x = read_features(write(tmp_path, "a,b\n1,2\n-3,4.5\n"))
    assert cols == ("a", "b")
    np.testing.assert_array_equal(x, [[1, 2], [-3, 4.5]])
    with pytest.raises(InputDataError, match="column 'b', row 2: 'x' is not numeric"):
        read_features(write(tmp_path, "a,b\n1,2\n3,x\n", name="bad.csv"))


# ---- the whole-table fast path reads what the cell-by-cell reading reads ----------------

# cells float() reads with or without str.strip(): spaces of every kind, underscores,
# signs, exponents, non-ASCII digits, negative zero, underflow, long digit strings
TRICKY_NUMBERS = [
    " 1.5 ", "\t2\t", "\xa03\xa0", "\u20034\u2003", "\x1c5\x1f", "1_000", "1e-3", "+5", "-0",
    "-0.0", ".5", "5.", "1E5", "\u0661\u0662", "\uff11\uff12", "1e-400",
    "0.1000000000000000055511151231257827", "123456789012345678901234567890",
]
# cells the cell-by-cell reading refuses, each with its message
TRICKY_BAD = [
    ("", "missing value"), (" NA ", "missing value"), ("nan", "missing value"),
    ("?", "missing value"), ("inf", "not a finite number"), ("-Infinity", "not a finite number"),
    ("1e400", "not a finite number"), ("0x10", "is not numeric"), ("1__0", "is not numeric"),
    ("1,5", "is not numeric"), ("x", "is not numeric"),
]


def _bits(x):
    return np.ascontiguousarray(x, dtype=np.float64).view(np.int64)


def test_fast_path_equals_cell_by_cell_reading():
    from ppfs.table import _all_finite, _numeric, _numeric_cells

    header = ["a", "y", "b"]
    body = [[c, "0", TRICKY_NUMBERS[-1 - i]] for i, c in enumerate(TRICKY_NUMBERS)]
    cells = _numeric_cells(header, body, [0, 2], "t")
    np.testing.assert_array_equal(_bits(_numeric(header, body, [0, 2], "t")), _bits(cells))
    fast = _all_finite(body, [0, 2])
    assert fast is None or np.array_equal(_bits(fast), _bits(cells))
    plain = [["1.25", "0", "-3e2"], ["7", "1", "0.5"]]
    fast = _all_finite(plain, [0, 2])  # ordinary numbers take the fast path
    assert fast is not None and fast.tolist() == [[1.25, -300.0], [7.0, 0.5]]
    assert _all_finite(plain, [2]).tolist() == [[-300.0], [0.5]]  # a single column
    assert _all_finite(plain, []).shape == (2, 0)


@pytest.mark.parametrize("cell, message", TRICKY_BAD)
def test_fast_path_names_the_same_first_bad_cell(tmp_path, cell, message):
    from ppfs.table import _numeric_cells

    body = [["1", "0", "2"], ["3", "1", f'"{cell}"' if "," in cell else cell], ["x", "0", "5"]]
    text = "a,y,b\n" + "\n".join(",".join(r) for r in body) + "\n"
    with pytest.raises(InputDataError) as got:
        read_csv(write(tmp_path, text), "y")
    assert message in str(got.value) and "column 'b', row 2" in str(got.value)
    rows = [[c.strip('"') for c in r] for r in body]
    with pytest.raises(InputDataError) as old:
        _numeric_cells(["a", "y", "b"], rows, [0, 2], str(tmp_path / "d.csv"))
    assert str(got.value) == str(old.value)


def test_fast_path_agrees_on_random_cells():
    """Random short strings over digits, signs, spaces and letters: wherever the fast path
    gives a value it is the cell-by-cell value, bit for bit; it refuses every cell the
    cell-by-cell reading refuses."""
    import random

    from ppfs.table import _all_finite, _numeric_cells

    alphabet = [*"0123456789.eE-+_ \tnaifNA?", "\xa0", "\x1c", "\u2003", "\u0661", "\uff11"]
    rng = random.Random(7)
    fast_used = 0
    for _ in range(20000):
        cell = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        fast = _all_finite([[cell]], [0])
        try:
            cells = _numeric_cells(["a"], [[cell]], [0], "t")
        except InputDataError:
            assert fast is None, repr(cell)
            continue
        if fast is not None:
            fast_used += 1
            assert _bits(fast).tolist() == _bits(cells).tolist(), repr(cell)
    assert fast_used > 1000
