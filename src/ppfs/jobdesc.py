"""The canonical hash of a job description: every party must start the same job.

The gateway sends each party the same :class:`ppfs.v1.party_pb2.JobDescription`
and its hash; a party recomputes the hash and refuses the job on a mismatch. The
hash is the SHA-256 of the message's deterministic protobuf encoding (fields in
number order, no unknown fields), so both sides only need this function.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from ppfs.step2a import Step2AShape
from ppfs.step2b import TrainParams
from ppfs.v1 import party_pb2


def description_sha256(job: party_pb2.JobDescription) -> str:
    return hashlib.sha256(job.SerializeToString(deterministic=True)).hexdigest()


def train_params(job: party_pb2.JobDescription) -> TrainParams | None:
    """Step 2B's hyperparameters from a description, or None for Step 2A only."""
    if not job.HasField("training"):
        return None
    t = job.training
    return TrainParams(epochs=t.epochs, batch=t.batch_size, lr=t.learning_rate, seed=t.seed)


def training_params(training: Mapping[str, Any] | None) -> TrainParams | None:
    """Step 2B's hyperparameters from a REST job body (``epochs``, ``batch_size``,
    ``learning_rate``, optional ``seed``); ParameterError when out of range."""
    if not training:
        return None
    return TrainParams(
        epochs=int(training["epochs"]),
        batch=int(training["batch_size"]),
        lr=float(training["learning_rate"]),
        seed=int(training.get("seed", 0)),
    )


def service_shape(
    m: int, p: int, n_classes: int, k: int, value_bits: int, train: TrainParams | None
) -> Step2AShape:
    """The public shape of a service job, the same on the gateway, the parties and the client.

    A service job never opens D': its rows are the data owners' data, and the
    recipient (an analyst) gets only the selected columns and, with training, the model.
    """
    return Step2AShape(m, p, n_classes, k, value_bits, reveal_reduced=False, train=train)
