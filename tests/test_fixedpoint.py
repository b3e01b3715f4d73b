import numpy as np
import pytest

from ppfs.errors import InputDataError
from ppfs.fixedpoint import FixedPoint

COLS = ("a", "b", "c")


def test_round_trip_across_magnitudes():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(50, 3)) * np.array([8e10, 1e-4, 3.0])
    fp = FixedPoint()
    e = fp.choose_exponents(x, COLS)
    raw = fp.encode(x, e, COLS)
    assert np.abs(raw).max() < fp.limit
    back = fp.decode(raw, e[None, :])
    # relative resolution: one unit is 2^-target_bits of the column maximum
    colmax = np.abs(x).max(axis=0)
    assert np.all(np.abs(back - x) <= colmax * 2.0**-fp.target_bits)


def test_exponent_puts_column_maximum_below_target():
    x = np.array([[8.1e10, 1e-4, 0.0], [-3.0, -2e-4, 0.0]])
    fp = FixedPoint()
    e = fp.choose_exponents(x, COLS)
    raw = fp.encode(x, e, COLS)
    top = np.abs(raw).max(axis=0)
    assert top[0] < 2**fp.target_bits and top[0] >= 2 ** (fp.target_bits - 1)
    assert top[1] < 2**fp.target_bits and top[1] >= 2 ** (fp.target_bits - 1)
    assert e[2] == 0 and top[2] == 0  # an all-zero column keeps the plain scale


@pytest.mark.parametrize(
    "bad, word", [(np.nan, "NaN"), (np.inf, "infinite"), (-np.inf, "infinite")]
)
def test_non_finite_refused_naming_column_and_row(bad, word):
    x = np.zeros((4, 3))
    x[2, 1] = bad
    with pytest.raises(InputDataError, match=rf"column 'b', row 3: .*{word}"):
        FixedPoint().choose_exponents(x, COLS)


def test_value_outside_schema_scale_refused():
    fp = FixedPoint()
    first = np.array([[1.0, 2.0, 3.0], [0.5, 0.1, 0.2]])
    e = fp.choose_exponents(first, COLS)
    second = first.copy()
    second[1, 2] = 3.0 * 2**20  # far beyond the headroom the schema's scale leaves
    with pytest.raises(InputDataError, match=r"column 'c', row 2: .*too large"):
        fp.encode(second, e, COLS)
    fp.encode(first * 100, e, COLS)  # within the 2^8 headroom


def test_magnitude_no_scale_fits():
    x = np.array([[1e300, 1.0, 1.0], [1.0, 1.0, 1.0]])
    with pytest.raises(InputDataError, match=r"column 'a', row 1: .*cannot be represented"):
        FixedPoint().choose_exponents(x, COLS)


def test_parameters_validated():
    with pytest.raises(ValueError):
        FixedPoint(frac_bits=-1)
    with pytest.raises(ValueError):
        FixedPoint(value_bits=32, target_bits=31)
