import numpy as np
import pytest

from ppfs import sharing
from ppfs.errors import ShareFormatError
from ppfs.sharing import (
    Scheme,
    ShareBundle,
    bundles_for_all,
    components_from_bundles,
    random_words,
    reconstruct,
    share,
)
from ppfs.step2a import MASK_WORD_BITS, draw_mask_words


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
    x = np.array([[0, 1, -1], [2**63 - 1, -(2**63), 12345]], dtype=np.int64)
    comps = share(x, scheme)
    assert len(comps) == scheme.parties
    np.testing.assert_array_equal(reconstruct(comps), x)


def test_single_party_view_is_uniform_looking(monkeypatch):
    # a party's components are independent of the secret: two secrets, same randomness
    # (the OS CSPRNG replaced here by a repeatable source, for this comparison only)
    def repeatable(shape):
        return np.arange(1, 1 + int(np.prod(shape)), dtype=np.uint64).reshape(shape) * 7919

    monkeypatch.setattr(sharing, "random_words", repeatable)
    a = share(np.full((1, 4), 7, dtype=np.int64), Scheme.REP3)
    b = share(np.full((1, 4), -9, dtype=np.int64), Scheme.REP3)
    # party 1 holds (c0, c1): both drawn before the secret is used
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


@pytest.mark.parametrize("scheme", list(Scheme))
def test_bundle_round_trip(scheme, tmp_path):
    x = np.random.default_rng(3).integers(-(2**40), 2**40, size=(7, 5))  # test data
    bundles = bundles_for_all(x, scheme, dataset_id="ds1", kind="data", frac_bits=16)
    loaded = {}
    for b in bundles:
        path = tmp_path / f"{b.party}.shr"
        b.save(path)
        loaded[b.party] = ShareBundle.load(path)
        assert loaded[b.party].dataset_id == "ds1" and loaded[b.party].shape == (7, 5)
        assert tuple(sorted(loaded[b.party].components)) == scheme.components_of(b.party)
    np.testing.assert_array_equal(reconstruct(components_from_bundles(loaded)), x)


def test_bundle_rejects_tampering():
    b = bundles_for_all(
        np.ones((3, 3), dtype=np.int64), Scheme.REP3, dataset_id="d", kind="data", frac_bits=16
    )[0]
    blob = bytearray(b.to_bytes())
    blob[-1] ^= 1
    with pytest.raises(ShareFormatError, match="checksum"):
        ShareBundle.from_bytes(bytes(blob))
    with pytest.raises(ShareFormatError, match="magic"):
        ShareBundle.from_bytes(b"not a bundle")
    with pytest.raises(ShareFormatError, match="length"):
        ShareBundle.from_bytes(b.to_bytes()[:-8])


def test_random_words_come_from_the_os(monkeypatch):
    w = random_words((3, 5))
    assert w.dtype == np.uint64 and w.shape == (3, 5) and w.flags.writeable
    assert random_words(0).shape == (0,)
    # the bytes are os.urandom's, read as little-endian words
    monkeypatch.setattr(sharing.os, "urandom", lambda n: bytes(range(n)))
    got = random_words(2)
    assert got.tolist() == [int.from_bytes(bytes(range(8)), "little"),
                            int.from_bytes(bytes(range(8, 16)), "little")]


def test_mask_words_are_uniform_below_the_word_size():
    words = draw_mask_words(4096)
    assert words.shape == (4096, 2) and words.dtype == np.int64
    assert words.min() >= 0 and words.max() < 1 << MASK_WORD_BITS
    assert words.max() >= 1 << (MASK_WORD_BITS - 4)  # the top bits are used too
    assert len(np.unique(words)) == words.size
