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
