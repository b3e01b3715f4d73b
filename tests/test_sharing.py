import numpy as np
import pytest

from ppfs.errors import ShareFormatError
from ppfs.sharing import (
    Scheme,
    ShareBundle,
    bundles_for_all,
    components_from_bundles,
    reconstruct,
    share,
)


def test_layouts():
    assert [Scheme.REP3.components_of(i) for i in range(3)] == [(0, 2), (0, 1), (1, 2)]
    assert [Scheme.REP4.components_of(i) for i in range(4)] == [
        (1, 2, 3),
        (0, 2, 3),
        (0, 1, 3),
        (0, 1, 2),
    ]
    for scheme in Scheme:
        for j in range(scheme.parties):
            assert len(scheme.holders_of(j)) >= 2  # every component held twice or more


@pytest.mark.parametrize("scheme", list(Scheme))
def test_share_reconstruct_edges(scheme):
    rng = np.random.default_rng(0)
    x = np.array([[0, 1, -1], [2**63 - 1, -(2**63), 12345]], dtype=np.int64)
    comps = share(x, scheme, rng)
    assert len(comps) == scheme.parties
    np.testing.assert_array_equal(reconstruct(comps), x)


def test_single_party_view_is_uniform_looking():
    # a party's components are independent of the secret: two secrets, same randomness
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    a = share(np.full((1, 4), 7, dtype=np.int64), Scheme.REP3, rng1)
    b = share(np.full((1, 4), -9, dtype=np.int64), Scheme.REP3, rng2)
    # party 1 holds (c0, c1): both drawn before the secret is used
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("scheme", list(Scheme))
def test_bundle_round_trip(scheme, tmp_path):
    rng = np.random.default_rng(3)
    x = rng.integers(-(2**40), 2**40, size=(7, 5))
    bundles = bundles_for_all(x, scheme, rng, dataset_id="ds1", kind="data", frac_bits=16)
    loaded = {}
    for b in bundles:
        path = tmp_path / f"{b.party}.shr"
        b.save(path)
        loaded[b.party] = ShareBundle.load(path)
        assert loaded[b.party].dataset_id == "ds1" and loaded[b.party].shape == (7, 5)
        assert tuple(sorted(loaded[b.party].components)) == scheme.components_of(b.party)
    np.testing.assert_array_equal(reconstruct(components_from_bundles(loaded)), x)


def test_bundle_rejects_tampering():
    rng = np.random.default_rng(4)
    b = bundles_for_all(
        np.ones((3, 3), dtype=np.int64), Scheme.REP3, rng, dataset_id="d", kind="data", frac_bits=16
    )[0]
    blob = bytearray(b.to_bytes())
    blob[-1] ^= 1
    with pytest.raises(ShareFormatError, match="checksum"):
        ShareBundle.from_bytes(bytes(blob))
    with pytest.raises(ShareFormatError, match="magic"):
        ShareBundle.from_bytes(b"not a bundle")
    with pytest.raises(ShareFormatError, match="length"):
        ShareBundle.from_bytes(b.to_bytes()[:-8])
