import hashlib

import numpy as np
import pytest
from nacl.public import PrivateKey
from nacl.signing import SigningKey

from ppfs.sharing import Scheme, bundles_for_all
from ppfs.upload import (
    Manifest,
    UploadRejected,
    open_sealed,
    pack_bundles,
    seal,
    sign_manifest,
    unpack_bundles,
    verify_manifest,
)


def _upload(party_keys, owner, upload_id="u1"):
    bundles = bundles_for_all(
        np.arange(6).reshape(3, 2), Scheme.REP3, dataset_id="ds", kind="data", frac_bits=16
    )
    sealed = [
        seal(pack_bundles([b]), k.public_key.encode())
        for b, k in zip(bundles, party_keys, strict=False)
    ]
    man = Manifest(
        "ds",
        upload_id,
        "owner-a",
        "rep3",
        3,
        ("a", "b"),
        (0, 1),
        "",
        (),
        16,
        tuple(hashlib.sha256(s).hexdigest() for s in sealed),
        "2026-01-01T00:00:00Z",
    )
    return man, sign_manifest(man, owner), sealed


def test_round_trip_and_binding():
    keys = [PrivateKey.generate() for _ in range(3)]
    owner = SigningKey.generate()
    man, sig, sealed = _upload(keys, owner)
    got = verify_manifest(man.to_bytes(), sig, owner.verify_key.encode())
    assert got == man and got.digest() == man.digest()
    for i, s in enumerate(sealed):
        assert hashlib.sha256(s).hexdigest() == got.part_sha256[i]
        (b,) = unpack_bundles(open_sealed(s, keys[i]))
        assert b.party == i and b.dataset_id == "ds"


def test_rejections():
    keys = [PrivateKey.generate() for _ in range(3)]
    owner = SigningKey.generate()
    man, sig, sealed = _upload(keys, owner)
    with pytest.raises(UploadRejected, match="not signed"):
        verify_manifest(man.to_bytes(), sig, SigningKey.generate().verify_key.encode())
    with pytest.raises(UploadRejected, match="not signed"):
        verify_manifest(man.to_bytes().replace(b"u1", b"u2"), sig, owner.verify_key.encode())
    with pytest.raises(UploadRejected, match="cannot be opened"):
        open_sealed(sealed[0], keys[1])  # Bob cannot open Alice's part
