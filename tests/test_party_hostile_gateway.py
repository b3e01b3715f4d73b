"""A turned gateway at a party's PartyService, with the gateway's genuine mTLS identity:
garbage and extremes in what it relays are refused early by the party itself, naming
the problem, with nothing stored and nothing held (real gRPC, port 0, MPyC, tiny tables).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path

import grpc
import numpy as np
import pytest
from party_harness import (
    Deployment,
    EngineWrapper,
    SealedUpload,
    Stub,
    data_upload,
    describe_job,
    mask_upload,
    run_parties,
    upload_messages,
)
from ppfs_gateway.parties import LOST_STATUS
from ppfs_party import state as party_state
from ppfs_party.server import PartyServer

from ppfs.contract import Consent, Reveal, description_sha256, service_shape
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.fixedpoint import FixedPoint
from ppfs.step2a import Security, Step2AShape
from ppfs.v1 import party_pb2

ROWS, COLS = 6, ("a", "b", "c")


def _data(dep: Deployment, box: list[bytes], upload_id: str = "u1") -> SealedUpload:
    raw = np.random.default_rng(0).integers(-1000, 1000, size=(ROWS, len(COLS)))
    return data_upload(dep.owners["owner-a"], box, raw, COLS, [0] * len(COLS),
                       dataset_id="ds", upload_id=upload_id,
                       onehot=(np.arange(ROWS) % 2).reshape(ROWS, 1), label_column="y",
                       classes=("0", "1"))


def _mask(dep: Deployment, box: list[bytes], upload_id: str = "m1", k: int = 1
          ) -> SealedUpload:
    outputs = service_shape(ROWS, len(COLS), 2, k, FixedPoint().value_bits, None).outputs
    return mask_upload(dep.owners["owner-a"], box, np.zeros((outputs, 2), dtype=np.uint64),
                       dataset_id="m", upload_id=upload_id)




def _audit(dep: Deployment, party: int) -> list[dict[str, object]]:
    path = dep.settings[party].state_dir / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines()]


async def _start(stub: Stub, desc: party_pb2.JobDescription, timeout: float = 30.0
                 ) -> party_pb2.StartJobResponse:
    # the hostile gateway hashes what it sends: only the party's own checks stand
    return await stub.StartJob(party_pb2.StartJobRequest(
        job=desc, description_sha256=description_sha256(desc)), timeout=timeout)


async def _start_refused(stub: Stub, desc: party_pb2.JobDescription, text: str,
                         timeout: float = 30.0) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _start(stub, desc, timeout)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert text in (info.value.details() or ""), info.value.details()
    with pytest.raises(grpc.aio.AioRpcError) as gone:  # nothing kept of it
        await stub.GetJob(party_pb2.GetJobRequest(job_id=desc.job_id))
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


async def _refused_stream(stub: Stub, messages: AsyncIterator[party_pb2.UploadPartChunk]
                          ) -> grpc.aio.AioRpcError:
    """Write ``messages`` as a hostile gateway would, until the party ends the call (or
    10 s pass); the party's status. Written one by one rather than from an iterator,
    which the client library may still be writing from when the party has answered."""
    call = stub.PutUploadPart(timeout=10)

    async def write() -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            async for msg in messages:
                await call.write(msg)
            await call.done_writing()

    writer = asyncio.create_task(write())
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    return info.value


async def _stored_at_alice(stub: Stub, *uploads: SealedUpload) -> None:
    for up in uploads:
        await stub.PutUploadPart(upload_messages(up, 0))


async def _job_held_at_alice(dep: Deployment, stubs: list[Stub], box: list[bytes]
                             ) -> party_pb2.JobDescription:
    """A genuine job ("j", k 1, passive 3PC on MPyC) whose data and mask uploads Alice
    holds."""
    up, mask = _data(dep, box), _mask(dep, box)
    await _stored_at_alice(stubs[0], up, mask)
    return describe_job("j", [[up]], mask=mask, k=1, security="passive-3pc", engine="mpyc",
                        peers=dep.peer_addresses(),
                        recipient_public_key=bytes(dep.owners["owner-a"].box.public_key))


def _changed(desc: party_pb2.JobDescription, job_id: str,
             change: Callable[[party_pb2.JobDescription], None]) -> party_pb2.JobDescription:
    out = party_pb2.JobDescription()
    out.CopyFrom(desc)
    out.job_id = job_id
    change(out)
    return out


def test_garbage_in_a_job_description_is_refused_naming_it(tmp_path: Path) -> None:
    """Values a protobuf parses but no job has: an enum number past the known ones,
    fractional bits beyond any encoding, a port in non-ASCII digits, peer hosts that
    would end a line of MP-SPDZ's HOSTS file (and so move this party's own line off its
    port range) or an argument. Each is refused as INVALID_ARGUMENT naming it, never an
    internal error; the job is not kept and its mask is not spent."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        desc = await _job_held_at_alice(dep, stubs, box)
        own = dep.settings[0].mpc_port_base
        cases: list[tuple[Callable[[party_pb2.JobDescription], None], str]] = [
            (lambda d: setattr(d, "combination", 99), "unknown combination 99"),
            (lambda d: setattr(d, "frac_bits", 1000), "fractional bits must be in [0, 40]"),
            (lambda d: d.peer_mpc_addresses.__setitem__(1, "127.0.0.1:\u00b2"),
             "peer MPC addresses must be host:port"),
            # Alice's own line would become "x", then "127.0.0.1:5000:<own port>"
            (lambda d: d.peer_mpc_addresses.__setitem__(0, f"x\n127.0.0.1:5000:{own}"),
             "peer MPC addresses must be host:port"),
            (lambda d: d.peer_mpc_addresses.__setitem__(1, "127.0.0.1\x00:14001"),
             "peer MPC addresses must be host:port"),
            (lambda d: d.peer_mpc_addresses.__setitem__(2, "fe80::1%\nx:14002"),
             "peer MPC addresses must be host:port"),
        ]
        for n, (change, text) in enumerate(cases):
            await _start_refused(stubs[0], _changed(desc, f"bad{n}", change), text)
        # the genuine job still starts: the refusals spent nothing
        started = await _start(stubs[0], _changed(desc, "good", lambda d: None))
        assert started.job_id == "good"
        await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="good"))

    dep = run_parties(tmp_path, scenario)
    refused = [e for e in _audit(dep, 0) if e["event"] == "job.refused"]
    assert len(refused) == 6 and all(e["failure"] == "refused" for e in refused)


def test_a_description_as_large_as_a_message_is_refused_at_once(tmp_path: Path) -> None:
    """Pins of one held upload repeated 30,000 times, 30,000 uploads the party never
    saw, or 200,000 such data sets: within gRPC's message limit. The party counts them
    against what it holds before reading any further and refuses at once (the pins'
    check used to take time quadratic in their number, in the event loop: seconds,
    then minutes, during which the party answered nothing)."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        desc = await _job_held_at_alice(dep, stubs, box)

        def repeat_pin(d: party_pb2.JobDescription) -> None:
            d.datasets[0].uploads.extend([d.datasets[0].uploads[0]] * 29_999)

        def distinct_pins(d: party_pb2.JobDescription) -> None:
            for i in range(30_000):
                d.datasets[0].uploads.add(upload_id=f"x{i}", rows=ROWS)

        def many_datasets(d: party_pb2.JobDescription) -> None:
            for i in range(200_000):
                ds = d.datasets.add(dataset_id=f"d{i}")
                ds.uploads.add(upload_id="x", rows=ROWS)
                d.dataset_ids.append(ds.dataset_id)

        for job_id, change, text in (
            ("pins", repeat_pin, "the job pins upload 'u1' of data set 'ds' more than once"),
            ("distinct", distinct_pins, "the job pins more uploads than the 2 Alice holds"),
            ("sets", many_datasets, "the job names 200001 data sets; Alice holds 2"),
        ):
            big = _changed(desc, job_id, change)
            assert big.ByteSize() > 300_000
            t0 = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _start(stubs[0], big)
            assert time.monotonic() - t0 < 2.0, f"{job_id}: {time.monotonic() - t0:.1f} s"
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert text in (info.value.details() or ""), info.value.details()
        # the genuine job is untouched by them
        assert (await _start(stubs[0], _changed(desc, "good", lambda d: None))).job_id == "good"
        await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="good"))

    run_parties(tmp_path, scenario)


def test_a_part_larger_than_its_manifest_says_is_refused_unread(tmp_path: Path) -> None:
    """A genuine manifest with a header announcing 64 MiB for a part of a few kB, then
    64 MiB of garbage: the party used to take it all in memory (up to its limit, 1 GiB
    by default, for any part) before the hash told it apart. The manifest's rows and
    columns fix the part's size; the header is refused before a chunk is read, nothing is
    stored, and the genuine part is accepted afterwards."""
    claimed, chunk = 64 << 20, b"\0" * (1 << 20)

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _data(dep, box)
        sent = 0

        async def hostile() -> AsyncIterator[party_pb2.UploadPartChunk]:
            nonlocal sent
            header = next(iter(upload_messages(up, 0)))
            header.header.sealed_size = claimed
            yield header
            while sent < claimed:
                sent += len(chunk)
                yield party_pb2.UploadPartChunk(chunk=chunk)

        refusal = await _refused_stream(stubs[0], hostile())
        assert sent < claimed // 4, f"{sent >> 20} MiB were taken"
        # the party's refusal names the size; the writer may lose it: gRPC's client gives
        # its own status when a write is cut off by the party's answer (LOST_STATUS)
        if (refusal.code(), refusal.details()) != (grpc.StatusCode.INTERNAL, LOST_STATUS):
            assert refusal.code() == grpc.StatusCode.INVALID_ARGUMENT, refusal.details()
            assert f"announces {claimed} sealed bytes" in (refusal.details() or "")
        rejected = _audit(dep, 0)[-1]
        assert rejected["event"] == "upload.rejected", rejected
        assert f"announces {claimed} sealed bytes" in str(rejected["reason"]), rejected
        listing = await stubs[0].ListUploads(party_pb2.ListUploadsRequest(dataset_id="ds"))
        assert not listing.uploads
        await stubs[0].PutUploadPart(upload_messages(up, 0))  # nothing was half-kept

    dep = run_parties(tmp_path, scenario)
    assert [e["event"] for e in _audit(dep, 0)] == ["upload.rejected", "upload.accepted"]


def test_an_upload_stream_that_never_ends_is_refused_in_the_partys_time(
    tmp_path: Path,
) -> None:
    """No header at all, half a genuine part and then silence, or empty chunks for
    ever: the party's stream used to wait as long as the gateway kept the call open,
    holding the bytes and the upload id (the genuine part was refused meanwhile as a
    replay). The party gives a header ``upload_timeout`` and a part its own time
    (``upload_timeout`` plus one second per 256 KiB), then refuses the stream naming
    the time; nothing is kept and the id is free again."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _data(dep, box)
        messages = list(upload_messages(up, 0))
        half = messages[1].chunk[: len(messages[1].chunk) // 2]

        async def stalls() -> AsyncIterator[party_pb2.UploadPartChunk]:
            yield messages[0]
            yield party_pb2.UploadPartChunk(chunk=half)
            await asyncio.Event().wait()  # the gateway keeps the call open, sends nothing
            yield messages[1]  # not reached

        async def drips() -> AsyncIterator[party_pb2.UploadPartChunk]:
            yield messages[0]
            while True:
                yield party_pb2.UploadPartChunk(chunk=b"")
                await asyncio.sleep(0.01)

        async def silent() -> AsyncIterator[party_pb2.UploadPartChunk]:
            await asyncio.Event().wait()  # not even a header
            yield messages[0]  # not reached

        t0 = time.monotonic()
        refusal = await _refused_stream(stubs[0], silent())
        assert refusal.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no upload header arrived within 0.5 s" in (refusal.details() or "")
        assert time.monotonic() - t0 < 3.0
        for stream, got in ((stalls, len(half)), (drips, 0)):
            t0 = time.monotonic()
            refusal = await _refused_stream(stubs[0], stream())
            assert refusal.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "the sealed part did not arrive within 1 s" in (refusal.details() or "")
            assert f"({got} of {len(up.parts[0])} bytes)" in (refusal.details() or "")
            assert time.monotonic() - t0 < 3.0
        await stubs[0].PutUploadPart(upload_messages(up, 0))  # the id was let go

    dep = run_parties(tmp_path, scenario, upload_timeout=0.5)
    # the stream without a header never named an upload: nothing to audit of it
    assert [e["event"] for e in _audit(dep, 0)] == ["upload.rejected"] * 2 + ["upload.accepted"]


class _CountingEngine(EngineWrapper):
    """MPyC whose compile takes a while and counts how many run at once."""

    def __init__(self, inner: MpycEngine) -> None:
        super().__init__(inner)
        self.running = self.most = self.compiles = 0

    async def prepare(self, shape: Step2AShape, security: Security) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.3)
            self.compiles += 1
            return str(await self.inner.prepare(shape, security))
        finally:
            self.running -= 1


def test_jobs_started_at_once_compile_within_the_partys_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five jobs at once (each on masks of its own, as a gateway holding back
    submissions could start them), four of one program and one of another: each job
    used to compile for itself, all at once, beyond the party's one engine slot (an
    MP-SPDZ compile of a large shape takes minutes and gigabytes). One compile per
    program, at most ``max_concurrent_jobs`` at a time."""
    engines: list[_CountingEngine] = []

    def usable(settings: object) -> dict[str, object]:
        engines.append(_CountingEngine(MpycEngine()))
        return {"mpyc": engines[-1]}

    monkeypatch.setattr(party_state, "usable_engines", usable)

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        up = _data(dep, box)
        await _stored_at_alice(stubs[0], up)
        descs = []
        for n, k in enumerate((1, 1, 1, 1, 2)):
            mask = _mask(dep, box, f"m{n}", k=k)
            await _stored_at_alice(stubs[0], mask)
            descs.append(describe_job(
                f"j{n}", [[up]], mask=mask, k=k, security="passive-3pc", engine="mpyc",
                peers=dep.peer_addresses(),
                recipient_public_key=bytes(dep.owners["owner-a"].box.public_key)))
        for desc in descs:  # at once: each answered queued before any compile ends
            await _start(stubs[0], desc)
        alice = engines[-3]  # the servers' engines, made in party order
        deadline = time.monotonic() + 10
        while alice.compiles < 2 or alice.running:
            assert time.monotonic() < deadline, "the compiles did not end"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # a compile of its own for any job left would show now
        assert (alice.compiles, alice.most) == (2, 1)
        for desc in descs:
            await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id=desc.job_id))

    run_parties(tmp_path, scenario)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_a_description_padded_with_what_no_check_reads_is_refused(tmp_path: Path) -> None:
    """A job the party would accept, padded to megabytes with what none of its checks
    reads: a field the contract does not have, consents of an owner no party knows, one
    genuine consent relayed a thousand times. Each used to be accepted and kept in the
    job's record, 14 MB on disk and in memory for a record of 3 kB, written again at
    every change of the job; each is refused naming it, and nothing is kept."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        desc = await _job_held_at_alice(dep, stubs, box)
        junk = b"\0" * (4 << 20)
        unknown = party_pb2.JobDescription.FromString(
            desc.SerializeToString() + _varint(999 << 3 | 2) + _varint(len(junk)) + junk)
        unknown.job_id = "unknown"

        def strangers(d: party_pb2.JobDescription) -> None:
            c = Consent("stranger", "ds", "owner-a",
                        bytes(dep.owners["owner-a"].box.public_key), Reveal.SELECTION)
            d.consents.extend(party_pb2.OwnerConsent(statement=c.to_bytes(),
                                                     signature=i.to_bytes(64, "big"))
                              for i in range(10_000))

        def repeated(d: party_pb2.JobDescription) -> None:
            d.consents.extend([d.consents[0]] * 1_000)

        for padded, text in (
            (unknown, "fields the job contract does not state"),
            (_changed(desc, "strangers", strangers),
             "a consent of 'stranger', no data owner registered"),
            (_changed(desc, "repeated", repeated), "a consent more than once"),
        ):
            assert padded.ByteSize() > 200_000
            await _start_refused(stubs[0], padded, text)
        await _start(stubs[0], _changed(desc, "good", lambda d: None))
        await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="good"))

    dep = run_parties(tmp_path, scenario)
    records = sorted((dep.settings[0].state_dir / "jobs").glob("*.json"))
    assert [r.name for r in records] == ["good.json"]
    assert records[0].stat().st_size < 64 << 10


def test_a_job_padded_with_genuine_consents_it_does_not_rely_on_is_refused(
        tmp_path: Path) -> None:
    """The consents a turned gateway holds are genuine: every one the registered owner
    ever gave, to other recipients, for other data sets. Relayed with a job they do not
    concern (15,000 of them, most of a gRPC message), each used to be verified, one
    signature after another in the party's event loop, and the job accepted with all of
    them kept in its record, some 10 MB on disk and in memory for every job until it is
    pruned. The party refuses a consent the job cannot rely on (another data set,
    recipient or key, what the job does not reveal), naming it, at once; nothing kept."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        desc = await _job_held_at_alice(dep, stubs, box)
        owner = dep.owners["owner-a"]
        key = bytes(owner.box.public_key)
        others = [Consent("owner-a", f"other{i}", f"analyst{i}", key, Reveal.SELECTION,
                          created_at="2026-01-01T00:00:00Z").sign(owner.key)
                  for i in range(15_000)]
        own = [Consent("owner-a", "ds", "owner-a", key, r,
                       created_at="2026-01-01T00:00:00Z") for r in Reveal]
        cases: list[tuple[str, list[object], str]] = [
            ("others", list(others), "a consent of 'owner-a' for data set 'other0' to "
             "'analyst0'"),
            ("one-other", [others[1]], "a consent of 'owner-a' for data set 'other1'"),
            # the job's data set and recipient, for another result key
            ("key", [dataclasses.replace(own[0], recipient_public_key=bytes(32)
                                         ).sign(owner.key)], "for another result key"),
        ]
        for job_id, extra, text in cases:

            def pad(d: party_pb2.JobDescription, extra: list[object] = extra) -> None:
                d.consents.extend(party_pb2.OwnerConsent(statement=c.statement,
                                                         signature=c.signature)
                                  for c in extra)  # type: ignore[attr-defined]

            padded = _changed(desc, job_id, pad)
            t0 = time.monotonic()
            await _start_refused(stubs[0], padded, text)
            assert time.monotonic() - t0 < 2.0, f"{job_id}: {time.monotonic() - t0:.1f} s"
        # a consent the job can rely on beside the one it does (for more than it reveals)
        # is one an honest gateway relays: still accepted
        both = _changed(desc, "both", lambda d: d.consents.add(
            statement=own[1].sign(owner.key).statement,
            signature=own[1].sign(owner.key).signature))
        assert (await _start(stubs[0], both)).job_id == "both"
        await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="both"))

    dep = run_parties(tmp_path, scenario)
    records = sorted((dep.settings[0].state_dir / "jobs").glob("*.json"))
    assert [r.name for r in records] == ["both.json"]
    assert records[0].stat().st_size < 64 << 10


async def _aiter(messages: Iterable[party_pb2.UploadPartChunk]
                 ) -> AsyncIterator[party_pb2.UploadPartChunk]:
    for msg in messages:
        yield msg


async def _until_code(attempt: Callable[[], Awaitable[grpc.StatusCode]],
                      code: grpc.StatusCode, seconds: float = 20.0) -> None:
    """Repeat ``attempt`` until it gives ``code`` (calls just opened may not have
    reached the party's handler yet)."""
    deadline = time.monotonic() + seconds
    while (got := await attempt()) != code:
        assert time.monotonic() < deadline, f"still {got.name}, not {code.name}"
        await asyncio.sleep(0.05)


def test_upload_streams_held_open_are_bounded(tmp_path: Path) -> None:
    """A turned gateway opens upload streams and sends nothing on them. Each ends within
    the party's time (--upload-timeout), but within that time it could open any number:
    beyond --max-open-uploads the party refuses one more, naming the limit, and admits
    again as soon as one has ended."""
    details: list[str] = []

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        async def one_more() -> grpc.StatusCode:
            # a chunk before any header: refused INVALID_ARGUMENT once admitted
            err = await _refused_stream(stubs[0], _aiter(
                [party_pb2.UploadPartChunk(chunk=b"x")]))
            details.append(err.details() or "")
            return err.code()

        await _until_code(one_more, grpc.StatusCode.INVALID_ARGUMENT)  # admitted: room
        held = [stubs[0].PutUploadPart() for _ in range(2)]
        try:
            await _until_code(one_more, grpc.StatusCode.RESOURCE_EXHAUSTED)
            held.pop().cancel()
            await _until_code(one_more, grpc.StatusCode.INVALID_ARGUMENT)
            # the party still answers everything else while streams are held
            await stubs[0].GetIdentity(party_pb2.GetIdentityRequest(), timeout=10)
        finally:
            for call in held:
                call.cancel()

    run_parties(tmp_path, scenario, max_open_uploads=2)
    assert any("2 upload parts open already" in d and "--max-open-uploads" in d
               for d in details), details


def test_watchers_of_one_job_are_bounded(tmp_path: Path) -> None:
    """A turned gateway opens WatchJob streams on a genuine job, which stay open for as
    long as the job runs: beyond a few per job the party refuses one more, naming the
    limit; polling still answers, and a watcher is admitted again when one has ended."""

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        from ppfs_party.servicer import WATCHERS_PER_JOB

        desc = await _job_held_at_alice(dep, stubs, box)
        await _start(stubs[0], desc)  # at Alice only: it waits for its peers
        watchers = []
        try:
            for _ in range(WATCHERS_PER_JOB):
                call = stubs[0].WatchJob(party_pb2.WatchJobRequest(job_id="j"))
                await asyncio.wait_for(anext(aiter(call)), 10)  # inside the handler
                watchers.append(call)
            extra = stubs[0].WatchJob(party_pb2.WatchJobRequest(job_id="j"))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(anext(aiter(extra)), 10)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert f"{WATCHERS_PER_JOB} watchers" in (info.value.details() or "")
            status = await stubs[0].GetJob(party_pb2.GetJobRequest(job_id="j"), timeout=10)
            assert status.job_id == "j"
            watchers.pop().cancel()

            async def again() -> grpc.StatusCode:
                call = stubs[0].WatchJob(party_pb2.WatchJobRequest(job_id="j"))
                try:
                    await asyncio.wait_for(anext(aiter(call)), 10)
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                watchers.append(call)
                return grpc.StatusCode.OK

            await _until_code(again, grpc.StatusCode.OK)
        finally:
            for call in watchers:
                call.cancel()
            await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="j"))

    run_parties(tmp_path, scenario)


def test_a_flood_of_refusals_grows_the_audit_log_by_a_bounded_number_of_lines(
        tmp_path: Path) -> None:
    """Every refused start is a line of the audit log, synced: a turned gateway sending
    one refused job after another would grow it without bound. A burst of them is
    written, the rest counted: the next line of the event and a line at stop say how
    many were left out, so that the log still accounts for every one."""
    from ppfs_party.audit import REFUSAL_BURST

    floods = REFUSAL_BURST + 70

    async def scenario(dep: Deployment, servers: list[PartyServer], stubs: list[Stub],
                       box: list[bytes]) -> None:
        desc = await _job_held_at_alice(dep, stubs, box)
        for n in range(floods):
            await _start_refused(stubs[0], _changed(desc, f"bad{n}",
                                                    lambda d: setattr(d, "frac_bits", 1000)),
                                 "fractional bits")
        # an accepted job is always written
        await _start(stubs[0], _changed(desc, "good", lambda d: None))
        await stubs[0].CancelJob(party_pb2.CancelJobRequest(job_id="good"))

    dep = run_parties(tmp_path, scenario)
    audit = _audit(dep, 0)
    refused = [e for e in audit if e["event"] == "job.refused"]
    assert len(refused) <= REFUSAL_BURST + 2  # a line or two may refill while it runs
    assert [e["job_id"] for e in audit if e["event"] == "job.accepted"] == ["good"]
    left_out = [e for e in audit if e["event"] == "audit.left_out"]
    assert len(left_out) == 1 and audit[-1] is left_out[0]
    counted = left_out[0]["events"]["job.refused"]  # type: ignore[index]
    assert len(refused) + counted + sum(int(e.get("left_out", 0))  # type: ignore[call-overload]
                                        for e in refused) == floods


def test_refusal_lines_refill_and_carry_the_count_left_out(tmp_path: Path) -> None:
    """The audit log's own rule, on a clock the test moves: each refusal event has its
    own allowance, refilled over time; the first line written after some were left out
    says how many; accepted events are never left out."""
    from ppfs_party.audit import REFUSAL_BURST, REFUSAL_REFILL_SECONDS, AuditLog

    now = [1000.0]
    log = AuditLog(tmp_path / "audit.log", clock=lambda: now[0])
    for i in range(REFUSAL_BURST + 30):
        log.record("upload.rejected", upload_id=f"u{i}")
        log.record("job.accepted", job_id=f"j{i}")
    log.record("call.refused", method="StartJob")  # another event: its own allowance
    now[0] += 3 * REFUSAL_REFILL_SECONDS
    for i in range(5):
        log.record("upload.rejected", upload_id=f"late{i}")
    log.flush_left_out()
    log.flush_left_out()  # nothing more to say: no second line
    entries = log.entries()
    rejected = [e for e in entries if e["event"] == "upload.rejected"]
    assert len(rejected) == REFUSAL_BURST + 3
    assert [e.get("left_out") for e in rejected[REFUSAL_BURST:]] == [30, None, None]
    assert [e["upload_id"] for e in rejected[REFUSAL_BURST:]] == ["late0", "late1", "late2"]
    assert sum(e["event"] == "job.accepted" for e in entries) == REFUSAL_BURST + 30
    assert sum(e["event"] == "call.refused" for e in entries) == 1
    assert [e["events"] for e in entries if e["event"] == "audit.left_out"] == [
        {"upload.rejected": 2}]
