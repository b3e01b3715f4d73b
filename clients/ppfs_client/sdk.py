"""Python SDK of the dealer-gateway, for data owners, analysts and model owners.

Everything secret happens here, on the client's machine: encoding (ppfs.fixedpoint),
secret sharing (ppfs.sharing), sealing each party's bundles to that party's box key
and signing the manifest (ppfs.upload), drawing mask words (ppfs.step2a) and, for
the recipient, opening and unmasking the result. The gateway only ever sees
sealed parts, signed manifests and public schemas.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import ssl
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from ppfs.contract import (
    Combination,
    DatasetSchema,
    open_result,
    plan,
    service_shape,
    training_from_body,
)
from ppfs.errors import PpfsError, ShareFormatError
from ppfs.fixedpoint import FixedPoint
from ppfs.sharing import Scheme, bundles_for_all
from ppfs.step2a import draw_mask_words, unmask_all
from ppfs.upload import Manifest, pack_bundles, seal, sign_manifest
from ppfs_client.keys import ClientKeys

MASK_COLUMNS = ("mask_w0", "mask_w1")
Progress = Callable[[int, int], None]  # (bytes sent, total)


class ApiError(PpfsError):
    """The gateway answered with a problem (RFC 9457)."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(f"{title} ({status}): {detail}" if detail else f"{title} ({status})")
        self.status = status
        self.title = title
        self.detail = detail


@dataclass(frozen=True)
class PartyInfo:
    index: int
    name: str
    box_public_key: bytes
    signing_public_key: bytes
    mpc_address: str
    engines: tuple[str, ...]


@dataclass(frozen=True)
class Deployment:
    parties: tuple[PartyInfo, ...]
    scheme: Scheme
    securities: tuple[str, ...]
    fixed_point: FixedPoint

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Deployment:
        fp = d["fixed_point"]
        return cls(
            parties=tuple(
                PartyInfo(
                    p["index"],
                    p["name"],
                    base64.b64decode(p["box_public_key"]),
                    base64.b64decode(p["signing_public_key"]),
                    p["mpc_address"],
                    tuple(p["engines"]),
                )
                for p in d["parties"]
            ),
            scheme=Scheme(d["scheme"]),
            securities=tuple(d["securities"]),
            fixed_point=FixedPoint(fp["frac_bits"], fp["value_bits"], fp["target_bits"]),
        )


@dataclass(frozen=True)
class OwnerTable:
    """One data owner's columns; the label (class indices) only if this owner holds it."""

    columns: tuple[str, ...]
    x: np.ndarray  # (m, p) float64
    label_column: str = ""
    classes: tuple[str, ...] = ()
    y: np.ndarray | None = None

    @property
    def m(self) -> int:
        return int(self.x.shape[0])

    def one_hot(self) -> np.ndarray:
        assert self.y is not None
        eye = np.eye(len(self.classes), dtype=np.int64)
        return eye[self.y][:, : len(self.classes) - 1]


@dataclass
class ResultSelection:
    """What the recipient learns: the selected columns, best first, and the model if trained.

    D' is never opened in service mode: its rows are the data owners' data.
    """

    job_id: str
    columns: list[str]
    indices: np.ndarray
    opened_words: int  # how many masked words the parties opened (k, plus the model)
    parties: int
    model: Any = None  # ppfs.step2b.Model when the job trained (Step 2B)


class GatewayClient:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str = True,
    ) -> None:
        # a CA bundle path (an HTTPS gateway with a deployment certificate) or True/False
        tls: bool | ssl.SSLContext = (
            ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify
        )
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=tls,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _check(resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                p = resp.json()
                raise ApiError(resp.status_code, str(p.get("title", "")), str(p.get("detail", "")))
            except ValueError:
                raise ApiError(resp.status_code, resp.reason_phrase, "") from None
        return resp.json()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ApiError(0, "gateway unreachable", type(exc).__name__) from None
        return self._check(resp)

    # -- plain calls -----------------------------------------------------------------

    def deployment(self) -> Deployment:
        return Deployment.from_json(self._call("GET", "/v1/deployment"))

    def create_dataset(
        self, name: str, kind: str = "data", owner_id: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "kind": kind}
        if owner_id:
            body["owner_id"] = owner_id
        return dict(self._call("POST", "/v1/datasets", body))

    def list_datasets(self, kind: str = "data") -> list[dict[str, Any]]:
        return list(self._call("GET", f"/v1/datasets?kind={kind}"))

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/datasets/{dataset_id}"))

    def grant(self, dataset_id: str, subject: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/datasets/{dataset_id}/grants", {"subject": subject}))

    def post_upload(
        self, dataset_id: str, body: dict[str, Any], progress: Progress | None = None
    ) -> dict[str, Any]:
        blob = json.dumps(body).encode()
        total = len(blob)

        def chunks() -> Iterator[bytes]:
            step = 1 << 18
            for off in range(0, total, step):
                yield blob[off : off + step]
                if progress:
                    progress(min(off + step, total), total)

        try:
            resp = self._http.post(
                f"/v1/datasets/{dataset_id}/uploads",
                content=chunks(),
                headers={"Content-Type": "application/json", "Content-Length": str(total)},
            )
        except httpx.HTTPError as exc:
            raise ApiError(0, "gateway unreachable", type(exc).__name__) from None
        return dict(self._check(resp))

    def submit_job(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/jobs", body))

    def get_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/jobs/{job_id}"))

    def list_jobs(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/jobs"))

    def cancel_job(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("POST", f"/v1/jobs/{job_id}/cancel"))

    def result_parts(self, job_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/v1/jobs/{job_id}/result"))

    def events(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job as it changes (server-sent events), until it reaches a final state."""
        try:
            with self._http.stream("GET", f"/v1/jobs/{job_id}/events", timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    self._check(resp)
                event = ""
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "job":
                        yield json.loads(line[5:])
                    elif line.startswith("data:") and event == "end":
                        return
        except httpx.HTTPError as exc:
            raise ApiError(0, "gateway unreachable", type(exc).__name__) from None

    # -- what a data owner does ------------------------------------------------------

    def upload_table(
        self,
        keys: ClientKeys,
        table: OwnerTable,
        dataset_id: str,
        *,
        exponents: Sequence[int] | None = None,
        deployment: Deployment | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        dep = deployment or self.deployment()
        body = build_upload(keys, table, dataset_id, dep, exponents=exponents)
        return self.post_upload(dataset_id, body, progress)

    # -- what a result recipient does ------------------------------------------------

    def create_masks(
        self,
        keys: ClientKeys,
        count: int,
        *,
        deployment: Deployment | None = None,
    ) -> str:
        """Draw ``count`` mask words, keep them next to the key file, upload them shared.
        Returns the mask upload id a job names."""
        dep = deployment or self.deployment()
        words = draw_mask_words(count)
        holder = self.create_dataset(f"masks-{count}", kind="mask")
        mask_table = OwnerTable(MASK_COLUMNS, words.astype(np.float64))
        upload_id = uuid.uuid4().hex
        keys.save_mask_words(upload_id, words)
        body = build_upload(
            keys,
            mask_table,
            holder["id"],
            dep,
            raw=words,
            kind="mask",
            upload_id=upload_id,
        )
        self.post_upload(holder["id"], body)
        return upload_id

    def submit(
        self,
        keys: ClientKeys,
        dataset_ids: Sequence[str],
        *,
        label: str,
        k: int,
        security: str = "passive-3pc",
        engine: str = "mp-spdz",
        combination: str = "horizontal",
        training: dict[str, Any] | None = None,
        mask_upload_id: str | None = None,
        scorer: str = "ms-gini",
    ) -> dict[str, Any]:
        """Submit a job; without ``mask_upload_id`` draw and upload fresh masks first.

        ``scorer``: ms-gini, pearson or chi2 (:class:`ppfs.scoring.Scorer`)."""
        if mask_upload_id is None:
            sets = [self.get_dataset(d) for d in dataset_ids]
            planned = plan(
                [DatasetSchema(d["id"], tuple(d["columns"]), tuple(d["column_exponents"]),
                               d["label_column"], tuple(d["classes"]),
                               int(d.get("frac_bits") or 16), int(d["rows"])) for d in sets],
                Combination.parse(combination), label,
            )
            fp = FixedPoint(frac_bits=planned.frac_bits)
            shape = service_shape(planned.m, planned.p, len(planned.classes), k,
                                  fp.value_bits, training_from_body(training))
            count = shape.outputs  # the selection (and the model); D' stays inside MPC
            mask_upload_id = self.create_masks(keys, count)
        body: dict[str, Any] = {
            "dataset_ids": list(dataset_ids),
            "combination": combination,
            "label_column": label,
            "k": k,
            "security": security,
            "engine": engine,
            "recipient_public_key": base64.b64encode(keys.box_public_key).decode(),
            "mask_upload_id": mask_upload_id,
        }
        if scorer != "ms-gini":
            body["scorer"] = scorer
        if training is not None:
            body["training"] = training
        return self.submit_job(body)

    def fetch_result(
        self, keys: ClientKeys, job_id: str, deployment: Deployment | None = None
    ) -> ResultSelection:
        dep = deployment or self.deployment()
        job = self.get_job(job_id)
        got = self.result_parts(job_id)
        return open_selection(keys, job, got["parts"], dep)


def build_upload(
    keys: ClientKeys,
    table: OwnerTable,
    dataset_id: str,
    dep: Deployment,
    *,
    exponents: Sequence[int] | None = None,
    raw: np.ndarray | None = None,
    kind: str = "data",
    upload_id: str | None = None,
) -> dict[str, Any]:
    """Encode, share, pack, seal per party and sign: the body of one upload."""
    fp = dep.fixed_point
    if raw is None:
        exps = (
            np.asarray(exponents, dtype=np.int64)
            if exponents is not None
            else fp.choose_exponents(table.x, table.columns)
        )
        if len(exps) != len(table.columns):
            raise PpfsError("the schema's exponents do not match this table's columns")
        raw = fp.encode(table.x, exps, table.columns)
        frac = fp.frac_bits
    else:
        exps = np.zeros(len(table.columns), dtype=np.int64)
        frac = 0
    upload_id = upload_id or uuid.uuid4().hex
    per_party: list[list[Any]] = [[] for _ in dep.parties]
    matrices = [(kind, raw, frac)]
    if table.label_column:
        matrices.append(("labels", table.one_hot(), 0))
    for k, matrix, f in matrices:
        for i, b in enumerate(
            bundles_for_all(matrix, dep.scheme, dataset_id=dataset_id, kind=k, frac_bits=f)
        ):
            per_party[i].append(b)
    sealed = [
        seal(pack_bundles(bundles), p.box_public_key)
        for bundles, p in zip(per_party, dep.parties, strict=True)
    ]
    manifest = Manifest(
        dataset_id=dataset_id,
        upload_id=upload_id,
        owner_id=keys.subject,
        scheme=dep.scheme.value,
        rows=table.m,
        columns=tuple(table.columns),
        column_exponents=tuple(int(e) for e in exps),
        label_column=table.label_column,
        classes=tuple(table.classes),
        frac_bits=frac if kind == "data" else fp.frac_bits,
        part_sha256=tuple(hashlib.sha256(s).hexdigest() for s in sealed),
        created_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )
    blob = manifest.to_bytes()
    return {
        "upload_id": upload_id,
        "manifest": base64.b64encode(blob).decode(),
        "manifest_signature": base64.b64encode(sign_manifest(manifest, keys.signing)).decode(),
        "parts": [base64.b64encode(s).decode() for s in sealed],
    }


def open_selection(
    keys: ClientKeys, job: dict[str, Any], parts: Sequence[dict[str, Any]], dep: Deployment
) -> ResultSelection:
    """Verify, open and compare every party's part, then unmask (recipient side only)."""
    job_id = job["id"]
    if len(parts) != len(dep.parties):
        raise ShareFormatError(f"expected {len(dep.parties)} result parts, got {len(parts)}")
    opened: list[tuple[PartyInfo, np.ndarray]] = []
    for p in parts:
        party = dep.parties[int(p["party_index"])]
        words = open_result(
            job_id,
            base64.b64decode(p["sealed"]),
            base64.b64decode(p["signature"]),
            party.signing_public_key,
            keys.box,
        )
        opened.append((party, words))
    first, words = opened[0]
    for party, other in opened[1:]:
        if other.shape != words.shape or not np.array_equal(other, words):
            raise ShareFormatError(
                f"the parties' results disagree ({party.name} differs from {first.name}): "
                "do not trust this result"
            )
    mask_words = keys.load_mask_words(job["mask_upload_id"])
    if mask_words.shape[0] != words.size:
        raise ShareFormatError(f"expected {mask_words.shape[0]} opened words, got {words.size}")
    m, p, k, n_classes = job["m"], job["p"], job["k"], len(job["classes"])
    fp = FixedPoint(frac_bits=job["frac_bits"])
    exps = np.asarray(job["column_exponents"], dtype=np.int64)
    params = training_from_body(job.get("training"))
    shape = service_shape(m, p, n_classes, k, fp.value_bits, params)
    if words.size != shape.outputs:
        raise ShareFormatError(f"this job opens {shape.outputs} words, got {words.size}")
    out = unmask_all(words, mask_words, shape)
    idx = out.indices
    if np.any((idx < 0) | (idx >= p)) or len(set(idx.tolist())) != k:
        raise ShareFormatError("the opened selection is not a set of k distinct columns")
    model = None
    if params is not None:
        from ppfs.step2b import decode_model, split_model_words

        if out.model is None:
            raise ShareFormatError("the training job's result holds no model")
        alpha_full, beta = split_model_words(out.model, p, n_classes)
        model = decode_model(
            alpha_full, beta, exps, fp, params, tuple(job["columns"]), tuple(job["classes"])
        )
    return ResultSelection(
        job_id=job_id,
        columns=[job["columns"][int(j)] for j in idx],
        indices=idx,
        opened_words=int(words.size),  # D' is never opened in service mode
        parties=len(dep.parties),
        model=model,
    )
