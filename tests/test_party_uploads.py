"""Upload verification on a party daemon (real gRPC, mutual TLS, port 0): what a
gateway could try with parts it relays is refused, and nothing becomes visible."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from nacl.signing import SigningKey
from party_harness import (
    Deployment,
    Owner,
    Scenario,
    SealedUpload,
    Stub,
    data_upload,
    describe_job,
    mask_upload,
    run_parties,
    start_requests,
    upload_messages,
)
from ppfs_party.server import PartyServer, start_party_server

from ppfs.sharing import Scheme, bundles_for_all
from ppfs.upload import pack_bundles, seal
from ppfs.v1 import party_pb2

COLS = ["a", "b", "c"]


def _raw(rows: int = 6, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(-1000, 1000, size=(rows, 3))


def _onehot(rows: int = 6) -> np.ndarray:
    return (np.arange(rows) % 2).reshape(rows, 1)


def _upload(owner: Owner, box: list[bytes], upload_id: str, dataset_id: str = "ds",
            seed: int = 0) -> SealedUpload:
    return data_upload(owner, box, _raw(seed=seed), COLS, [0, 0, 0], dataset_id=dataset_id,
                       upload_id=upload_id, onehot=_onehot(), label_column="y",
                       classes=("0", "1"))


def _run(tmp_path: Path, scenario: Scenario, **overrides: object) -> Deployment:
    return run_parties(tmp_path, scenario, ("owner-a", "owner-b"), **overrides)


async def _refused(stub: Stub, messages: object, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.PutUploadPart(messages)
    assert info.value.code() == code, info.value.details()
    assert text in (info.value.details() or "")


async def _invisible(stub: Stub, dataset_id: str = "ds") -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GetDataset(party_pb2.GetDatasetRequest(dataset_id=dataset_id))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def _audit(dep: Deployment, party: int) -> list[dict[str, object]]:
    path = dep.settings[party].state_dir / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_accepted_upload_is_visible_with_its_schema(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        a, b = dep.owners["owner-a"], dep.owners["owner-b"]
        for up in (_upload(a, box, "u1"), _upload(b, box, "u2", seed=1)):
            for i, stub in enumerate(stubs):
                resp = await stub.PutUploadPart(upload_messages(up, i))
                assert (resp.rows, resp.columns) == (6, 3)
        info = await stubs[2].GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds"))
        assert list(info.columns) == COLS and info.label_column == "y"
        assert (info.classes, info.rows, list(info.upload_ids)) == (2, 12, ["u1", "u2"])

    dep = _run(tmp_path, scenario)
    assert [e["event"] for e in _audit(dep, 0)] == ["upload.accepted"] * 2


def test_part_resealed_by_the_gateway_is_refused(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _upload(dep.owners["owner-a"], box, "u1")
        # the gateway shares its own values and seals them to Alice: valid box, wrong hash
        forged = bundles_for_all(_raw(seed=9), Scheme.REP3,
                                 dataset_id="ds", kind="data", frac_bits=16)[0]
        resealed = seal(pack_bundles([forged]), box[0])
        await _refused(stubs[0], upload_messages(up, 0, sealed=resealed),
                       grpc.StatusCode.INVALID_ARGUMENT, "hash mismatch")
        # ... or also re-signs a manifest with its own key: not a registered owner's
        gateway = Owner("owner-a", SigningKey.generate())
        fake = _upload(gateway, box, "u1")
        await _refused(stubs[0], upload_messages(fake, 0), grpc.StatusCode.PERMISSION_DENIED,
                       "not signed by its data owner")
        stranger = _upload(Owner("stranger", SigningKey.generate()), box, "u9")
        await _refused(stubs[0], upload_messages(stranger, 0),
                       grpc.StatusCode.PERMISSION_DENIED, "not registered")
        await _invisible(stubs[0])

    dep = _run(tmp_path, scenario)
    reasons = [e["reason"] for e in _audit(dep, 0) if e["event"] == "upload.rejected"]
    assert len(reasons) == 3 and "hash mismatch" in str(reasons[0])


def test_part_swapped_between_uploads_or_parties_is_refused(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        u1 = _upload(dep.owners["owner-a"], box, "u1", dataset_id="ds")
        u2 = _upload(dep.owners["owner-b"], box, "u2", dataset_id="ds2", seed=3)
        # u2's part for Alice under u1's manifest
        await _refused(stubs[0], upload_messages(u1, 0, sealed=u2.parts[0]),
                       grpc.StatusCode.INVALID_ARGUMENT, "hash mismatch")
        # Bob's part of u1 sent to Alice
        await _refused(stubs[0], upload_messages(u1, 1),
                       grpc.StatusCode.INVALID_ARGUMENT, "hash mismatch")
        # a header that claims another dataset than the signed manifest
        msgs = list(upload_messages(u1, 0))
        msgs[0].header.dataset_id = "ds2"
        await _refused(stubs[0], iter(msgs), grpc.StatusCode.INVALID_ARGUMENT,
                       "does not match the signed manifest")
        await _invisible(stubs[0], "ds")
        await _invisible(stubs[0], "ds2")

    _run(tmp_path, scenario)


def test_replayed_upload_is_refused(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _upload(dep.owners["owner-a"], box, "u1")
        await stubs[1].PutUploadPart(upload_messages(up, 1))
        await _refused(stubs[1], upload_messages(up, 1), grpc.StatusCode.ALREADY_EXISTS,
                       "replay")
        info = await stubs[1].GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds"))
        assert list(info.upload_ids) == ["u1"] and info.rows == 6

    _run(tmp_path, scenario)


def test_incomplete_oversized_and_malformed_streams(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _upload(dep.owners["owner-a"], box, "u1")
        msgs = list(upload_messages(up, 0))
        msgs[0].header.sealed_size += 10  # the stream ends early
        await _refused(stubs[0], iter(msgs), grpc.StatusCode.INVALID_ARGUMENT, "incomplete")
        big = list(upload_messages(up, 0))
        big[0].header.sealed_size = 1 << 20
        await _refused(stubs[0], iter(big), grpc.StatusCode.RESOURCE_EXHAUSTED, "limit")

        async def chunk_first() -> AsyncIterator[party_pb2.UploadPartChunk]:
            yield party_pb2.UploadPartChunk(chunk=b"x")

        await _refused(stubs[0], chunk_first(), grpc.StatusCode.INVALID_ARGUMENT, "header")
        await _invisible(stubs[0])
        # after all that, the genuine part is still accepted (nothing was half-stored)
        await stubs[0].PutUploadPart(upload_messages(up, 0))

    _run(tmp_path, scenario, max_upload_bytes=64 * 1024)


def test_uploads_survive_restart_and_leftovers_are_cleared(tmp_path: Path) -> None:
    async def first(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                    box: list[bytes]) -> None:
        up = _upload(dep.owners["owner-a"], box, "u1")
        for i, stub in enumerate(stubs):
            await stub.PutUploadPart(upload_messages(up, i))

    dep = _run(tmp_path / "d", first)
    state = dep.settings[0].state_dir
    # what a crash mid-upload leaves behind
    (state / "uploads" / ".tmp-crashed").mkdir()
    (state / "uploads" / ".tmp-crashed" / "data.shr").write_bytes(b"partial")

    async def second() -> None:
        srv = await start_party_server(dep.settings[0])
        try:
            async with dep.channel(0, srv.port) as ch:
                stub = Stub(ch)
                info = await stub.GetDataset(party_pb2.GetDatasetRequest(dataset_id="ds"))
                assert list(info.upload_ids) == ["u1"]
                up = _upload(dep.owners["owner-a"],
                             [i.box_public_key for i in [await stub.GetIdentity(
                                 party_pb2.GetIdentityRequest())]] * 3, "u1")
                await _refused(stub, upload_messages(up, 0), grpc.StatusCode.ALREADY_EXISTS,
                               "replay")
        finally:
            await srv.stop(0)

    asyncio.run(second())
    assert not (state / "uploads" / ".tmp-crashed").exists()


def test_job_refused_on_description_mismatch_and_bad_parameters(tmp_path: Path) -> None:
    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        never_sent = _upload(dep.owners["owner-a"], box, "u1")
        mask = mask_upload(dep.owners["owner-a"], box, np.zeros((1, 2), dtype=np.uint64),
                           dataset_id="m", upload_id="m1")
        desc = describe_job(
            "j1", [[never_sent]], mask=mask, k=1, security="passive-3pc", engine="mpyc",
            recipient_public_key=bytes(dep.owners["owner-a"].box.public_key),
            peers=dep.peer_addresses(),
        )
        req = start_requests(desc)
        req.job.k = 2  # the description changed after hashing
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs[0].StartJob(req)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "SHA-256" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:  # the pinned upload is not held
            await stubs[0].StartJob(start_requests(desc))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "Alice does not hold upload 'u1' of data set 'ds'" in (info.value.details() or "")
        desc.engine = "mp-spdz"  # not offered by these parties
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stubs[0].StartJob(start_requests(desc))
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    _run(tmp_path, scenario)


def test_bundle_cache_serves_unchanged_files_read_only_and_within_its_limit(
    tmp_path: Path,
) -> None:
    from ppfs_party.store import BundleCache

    rng = np.random.default_rng(3)  # test data, not a secret
    paths = []
    for n in range(3):
        b = bundles_for_all(rng.integers(0, 2**40, size=(50, 4), dtype=np.uint64),
                            Scheme.REP3, dataset_id=f"ds{n}", kind="data", frac_bits=0)[0]
        paths.append(tmp_path / f"{n}.shr")
        b.save(paths[-1])
    one = 2 * 50 * 4 * 8  # a party's two components of one bundle
    cache = BundleCache(2 * one)
    first = cache.load(paths[0])
    assert cache.load(paths[0]) is first  # served again, not read again
    with pytest.raises(ValueError, match="read-only"):
        next(iter(first.components.values()))[0, 0] = 1
    # a file that changed is read again
    other = bundles_for_all(np.ones((50, 4), dtype=np.uint64), Scheme.REP3,
                            dataset_id="ds0", kind="data", frac_bits=0)[0]
    other.save(paths[0])
    again = cache.load(paths[0])
    assert again is not first and again.components.keys() == other.components.keys()
    for j, c in other.components.items():
        np.testing.assert_array_equal(again.components[j], c)
    # at most two bundles fit: the least recently used one goes
    cache.load(paths[1])
    cache.load(paths[0])
    cache.load(paths[2])
    assert cache.load(paths[0]) is again
    assert cache.load(paths[2]) is cache.load(paths[2])
    assert cache._bytes == 2 * one and len(cache._entries) == 2
    assert BundleCache(one - 1).load(paths[1]).shape == (50, 4)  # too big: read, not kept


def test_bundle_cache_is_the_daemons_setting(tmp_path: Path) -> None:
    # `ppfs party serve --bundle-cache-mib N` sizes each daemon's own cache; 0 keeps none
    from nacl.public import PrivateKey
    from ppfs_cli.main import build_parser
    from ppfs_party.audit import AuditLog
    from ppfs_party.commands import _settings
    from ppfs_party.config import DEFAULT_BUNDLE_CACHE, PartySettings
    from ppfs_party.store import ShareStore, StoredUpload

    from ppfs.errors import ParameterError

    base = ["party", "serve", "--state-dir", str(tmp_path), "--index", "0"]
    parse = build_parser("party").parse_args
    assert _settings(parse(base)).bundle_cache_bytes == DEFAULT_BUNDLE_CACHE == 256 << 20
    assert _settings(parse([*base, "--bundle-cache-mib", "64"])).bundle_cache_bytes == 64 << 20
    assert _settings(parse([*base, "--bundle-cache-mib", "0"])).bundle_cache_bytes == 0
    with pytest.raises(ParameterError, match="bundle_cache_bytes"):
        PartySettings(state_dir=tmp_path, index=0, bundle_cache_bytes=-1)
    b = bundles_for_all(np.arange(12, dtype=np.uint64).reshape(3, 4), Scheme.REP3,
                        dataset_id="ds", kind="data", frac_bits=0)[0]
    (tmp_path / "u").mkdir()
    b.save(tmp_path / "u" / "data.shr")
    for limit, shared in ((1 << 20, True), (0, False)):
        store = ShareStore(tmp_path, 0, PrivateKey.generate(), AuditLog(tmp_path / "audit"),
                           1 << 20, limit)
        manifest: Any = None  # bundle() reads only the directory
        up = StoredUpload(manifest, frozenset({"data"}), tmp_path / "u", store._cache)
        assert (up.bundle("data") is up.bundle("data")) is shared
