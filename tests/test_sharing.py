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


def _bundle(scheme=Scheme.REP3, shape=(5, 3)):
    x = np.random.default_rng(4).integers(-(2**40), 2**40, size=shape)  # test data
    return bundles_for_all(x, scheme, dataset_id="ds", kind="data", frac_bits=16)[1]


@pytest.mark.parametrize("scheme", list(Scheme))
@pytest.mark.parametrize("shape", [(5, 3), (0, 4)])
def test_save_streams_the_bytes_of_to_bytes_and_load_reads_them_back(scheme, shape, tmp_path):
    b = _bundle(scheme, shape)
    path = tmp_path / "b.shr"
    b.save(path)
    assert path.read_bytes() == b.to_bytes()
    loaded = ShareBundle.load(path)
    parsed = ShareBundle.from_bytes(b.to_bytes())
    for got in (loaded, parsed):
        assert (got.scheme, got.party, got.dataset_id, got.kind, got.shape, got.frac_bits) == (
            b.scheme, b.party, b.dataset_id, b.kind, b.shape, b.frac_bits)
        assert sorted(got.components) == sorted(b.components)
        for j, c in b.components.items():
            np.testing.assert_array_equal(got.components[j], c)
            assert got.components[j].dtype == np.uint64 and got.components[j].flags.writeable


def test_load_refuses_what_from_bytes_refuses(tmp_path):
    blob = _bundle().to_bytes()
    flipped = bytearray(blob)
    flipped[-1] ^= 1
    head_len = int.from_bytes(blob[8:12], "little")
    oversized = blob[:8] + (1 << 20).to_bytes(4, "little") + blob[12:]
    bad = {
        "magic": b"not a bundle",
        "empty": b"",
        "truncated header": blob[: 12 + head_len // 2],
        "oversized header": oversized,
        "short payload": blob[:-8],
        "long payload": blob + bytes(8),
        "checksum": bytes(flipped),
        "malformed header": blob[:12] + b"[" + blob[13:],
    }
    for what, data in bad.items():
        path = tmp_path / "bad.shr"
        path.write_bytes(data)
        with pytest.raises(ShareFormatError) as from_file:
            ShareBundle.load(path)
        with pytest.raises(ShareFormatError) as from_memory:
            ShareBundle.from_bytes(data)
        assert str(from_file.value) == str(from_memory.value), what


def test_random_words_fill_large_draws_chunk_by_chunk(monkeypatch):
    calls = []

    def counting(n):
        calls.append(n)
        start = sum(calls[:-1])
        return bytes((start + i) % 251 for i in range(n))

    monkeypatch.setattr(sharing.os, "urandom", counting)
    monkeypatch.setattr(sharing, "_URANDOM_CHUNK", 24)
    got = random_words((2, 5))  # 80 bytes: chunks of 24, 24, 24, 8
    assert calls == [24, 24, 24, 8]
    stream = bytes(i % 251 for i in range(80))
    assert got.tolist() == np.frombuffer(stream, dtype="<u8").reshape(2, 5).tolist()
    assert got.dtype == np.uint64 and got.flags.writeable
