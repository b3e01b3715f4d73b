"""The canonical hash of a job description: every party must start the same job.

The gateway sends each party the same :class:`ppfs.v1.party_pb2.JobDescription`
and its hash; a party recomputes the hash and refuses the job on a mismatch. The
hash is the SHA-256 of the message's deterministic protobuf encoding (fields in
number order, no unknown fields), so both sides only need this function.
"""

from __future__ import annotations

import hashlib

from ppfs.v1 import party_pb2


def description_sha256(job: party_pb2.JobDescription) -> str:
    return hashlib.sha256(job.SerializeToString(deterministic=True)).hexdigest()
