"""A party's result part: the masked words it opened, sealed to the recipient.

The plaintext inside the sealed box is the opened (value + mask) words as
little-endian uint64, in the order the program opens them (for Step 2A: k selected
indices, then D' row by row). Every party opens the same words; the recipient
checks that they agree, then removes its masks. The party signs
``job_id || sealed`` with its Ed25519 key (``SealedResultPart.signature``), which
binds the part to the job.
"""

from __future__ import annotations

import numpy as np
from nacl.exceptions import BadSignatureError, CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey, VerifyKey

from ppfs.errors import ShareFormatError


def seal_result(
    job_id: str, words: np.ndarray, recipient: bytes, signer: SigningKey
) -> tuple[bytes, bytes]:
    """(sealed, signature) as a party puts them in SealedResultPart."""
    blob = np.ascontiguousarray(words, dtype="<u8").tobytes()
    sealed = SealedBox(PublicKey(recipient)).encrypt(blob)
    return sealed, signer.sign(job_id.encode() + sealed).signature


def open_result(
    job_id: str, sealed: bytes, signature: bytes, party_key: bytes, recipient: PrivateKey
) -> np.ndarray:
    """Check the party's signature over job_id || sealed, open with the recipient's key."""
    try:
        VerifyKey(party_key).verify(job_id.encode() + sealed, signature)
    except (BadSignatureError, ValueError):
        raise ShareFormatError("a result part is not signed by its party for this job") from None
    try:
        blob = SealedBox(recipient).decrypt(sealed)
    except CryptoError:
        raise ShareFormatError("a result part cannot be opened with this recipient key") from None
    if len(blob) % 8:
        raise ShareFormatError("a result part does not hold whole 64-bit words")
    return np.frombuffer(blob, dtype="<u8").astype(np.uint64)
