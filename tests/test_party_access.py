"""A corrupted party cannot act as the gateway on another party's control plane.

Every party holds certificates from the deployment CA (its control and MPC
certificates), so mutual TLS alone would let Carol call Alice's PartyService. Alice
answers PartyService only to the gateway's client identity (the CA's gateway usage,
named as her --gateway-name says): Carol's own certificates, a CA certificate merely
*named* "gateway", and another client identity are each refused with PERMISSION_DENIED
on every method, before anything runs; the health service stays open to them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from party_harness import (
    CHANNEL_OPTIONS,
    Deployment,
    SealedUpload,
    data_upload,
    describe_job,
    mask_upload,
    start_requests,
    upload_messages,
)
from ppfs_party.control_access import caller_problem
from ppfs_party.server import SERVICE_NAME, start_party_server

from ppfs.fixedpoint import FixedPoint
from ppfs.pki import issue_client_identity, party_key_and_csr, write_cert
from ppfs.synthetic import make_table
from ppfs.v1 import party_pb2
from ppfs.v1.party_pb2_grpc import PartyServiceStub

METHODS = party_pb2.DESCRIPTOR.services_by_name["PartyService"].methods


def _staged(up: SealedUpload, party: int) -> Iterator[party_pb2.UploadPartChunk]:
    """The part as the gateway sends it in an all-or-nothing upload: staged."""
    for i, msg in enumerate(upload_messages(up, party)):
        if i == 0:
            msg.header.staged = True
        yield msg


def _channel(dep: Deployment, port: int, key: bytes, cert: bytes) -> grpc.aio.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=dep.ca.cert_pem(),
                                         private_key=key, certificate_chain=cert)
    options = [*CHANNEL_OPTIONS, ("grpc.ssl_target_name_override", "alice")]
    return grpc.aio.secure_channel(f"127.0.0.1:{port}", creds, options=options)


async def _every_method_refused(ch: grpc.aio.Channel, who: str) -> None:
    """Each PartyService method, called with an empty request: PERMISSION_DENIED, a
    message naming the gateway identity and no certificate or key material."""
    for m in METHODS:
        path = f"/{SERVICE_NAME}/{m.name}"
        req_cls = getattr(party_pb2, m.input_type.name)
        ser, de = req_cls.SerializeToString, (lambda b: b)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            if m.client_streaming:
                call: Any = ch.stream_unary(path, request_serializer=ser,
                                            response_deserializer=de)
                await call(iter([req_cls()]), timeout=10)
            elif m.server_streaming:
                async for _ in ch.unary_stream(path, request_serializer=ser,
                                               response_deserializer=de)(req_cls(), timeout=10):
                    pass
            else:
                await ch.unary_unary(path, request_serializer=ser,
                                     response_deserializer=de)(req_cls(), timeout=10)
        err = info.value
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED, (who, m.name, err)
        details = err.details() or ""
        assert "gateway" in details and "BEGIN" not in details, (who, m.name, details)


def test_a_party_cannot_act_as_the_gateway_on_another_party(tmp_path: Path) -> None:
    """Corrupted Carol (and a CA certificate merely named "gateway", and a client
    identity of another name) call Alice: start a job with a real consent and an
    unused mask upload she has seen, abort and commit another owner's staged upload,
    upload a part, cancel, read. Every PartyService method is refused
    (PERMISSION_DENIED) and audited; nothing changed; the same calls from the gateway
    succeed afterwards."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    carol_state = dep.settings[2].state_dir
    ident_dir = tmp_path / "adversary"
    named_gateway = party_key_and_csr(ident_dir / "named.key", "gateway")
    write_cert(ident_dir / "named.pem", dep.ca.issue(named_gateway))  # no gateway usage
    ops_key, ops_cert = issue_client_identity(dep.ca, "ops", ident_dir / "ops.key")
    adversaries = {
        "Carol's control certificate": ((carol_state / "keys" / "control.key").read_bytes(),
                                        (carol_state / "certs" / "control.pem").read_bytes()),
        "Carol's MPyC certificate": ((carol_state / "keys" / "mpc-mpyc.key").read_bytes(),
                                     (carol_state / "certs" / "mpc-mpyc.pem").read_bytes()),
        "a CA certificate named gateway": ((ident_dir / "named.key").read_bytes(),
                                           (ident_dir / "named.pem").read_bytes()),
        "a client identity named ops": (ops_key, ops_cert),
    }

    async def scenario() -> None:
        srv = await start_party_server(dep.settings[0])
        gw = dep.channel(0, srv.port)
        try:
            stub = PartyServiceStub(gw)
            ident = await stub.GetIdentity(party_pb2.GetIdentityRequest())
            box = [ident.box_public_key] * 3  # only Alice's part is sent
            t = make_table(12, 3, seed=4)
            fp = FixedPoint()
            exps = fp.choose_exponents(t.x, t.columns)
            owner, rec, other = (dep.add_owner(n) for n in ("owner-a", "analyst", "owner-b"))
            data = data_upload(owner, box, fp.encode(t.x, exps, t.columns), t.columns, exps,
                               dataset_id="ds", upload_id="u1", onehot=t.one_hot(),
                               label_column=t.label_column, classes=t.classes)
            mask = mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                               dataset_id="m", upload_id="m1")
            pending = data_upload(other, box, fp.encode(t.x, exps, t.columns), t.columns,
                                  exps, dataset_id="ds-b", upload_id="u2",
                                  onehot=t.one_hot(), label_column=t.label_column,
                                  classes=t.classes)
            for up in (data, mask):
                await stub.PutUploadPart(upload_messages(up, 0))
            await stub.PutUploadPart(_staged(pending, 0))
            desc = describe_job("j1", [[data]], mask=mask, k=1, security="passive-3pc",
                                engine="mpyc", recipient_public_key=bytes(rec.box.public_key),
                                peers=dep.peer_addresses())
            evil = mask_upload(rec, box, np.zeros((1, 2), dtype=np.uint64),
                               dataset_id="m", upload_id="m-evil")
            decision = party_pb2.UploadDecisionRequest(dataset_id="ds-b", upload_id="u2")

            for who, (key, cert) in adversaries.items():
                async with _channel(dep, srv.port, key, cert) as ch:
                    bad = PartyServiceStub(ch)
                    # the attacks themselves, with real requests
                    attacks = {
                        "StartJob": bad.StartJob(start_requests(desc)),
                        "AbortUpload": bad.AbortUpload(decision),
                        "CommitUpload": bad.CommitUpload(decision),
                        "PutUploadPart": bad.PutUploadPart(_staged(evil, 0)),
                        "CancelJob": bad.CancelJob(party_pb2.CancelJobRequest(job_id="j1")),
                        "ListUploads": bad.ListUploads(
                            party_pb2.ListUploadsRequest(dataset_id="ds-b")),
                    }
                    for name, call in attacks.items():
                        with pytest.raises(grpc.aio.AioRpcError) as info:
                            await call
                        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (
                            who, name)
                    await _every_method_refused(ch, who)
                    # health stays open to any certificate of the deployment
                    resp = await health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service=""))
                    assert resp.status == health_pb2.HealthCheckResponse.SERVING

            # nothing changed: u2 still staged, no m-evil, no job j1 (and no tombstone)
            held = await stub.ListUploads(party_pb2.ListUploadsRequest(dataset_id="ds-b"))
            assert [(u.upload_id, u.status) for u in held.uploads] == [
                ("u2", party_pb2.UPLOAD_STATUS_STAGED)]
            held = await stub.ListUploads(party_pb2.ListUploadsRequest(dataset_id="m"))
            assert [u.upload_id for u in held.uploads] == ["m1"]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.GetJob(party_pb2.GetJobRequest(job_id="j1"))
            assert info.value.code() == grpc.StatusCode.NOT_FOUND
            audit = [json.loads(x) for x in
                     (dep.settings[0].state_dir / "audit.log").read_text().splitlines()]
            refused = {e["method"] for e in audit if e["event"] == "call.refused"}
            assert refused == {m.name for m in METHODS}
            assert not any(e["event"] == "job.accepted" for e in audit)
            # the same requests from the gateway's identity are accepted
            started = await stub.StartJob(start_requests(desc))
            assert started.job_id == "j1"
            await stub.CancelJob(party_pb2.CancelJobRequest(job_id="j1"))
            done = await stub.CommitUpload(decision)
            assert done.status == party_pb2.UPLOAD_STATUS_COMMITTED
        finally:
            await gw.close()
            await srv.stop(0)

    asyncio.run(scenario())


def test_caller_check_names_the_problem(tmp_path: Path) -> None:
    """The pure check: no certificate, a party's certificate, another gateway name."""
    dep = Deployment.create(tmp_path, 3, engines=("mpyc",))
    carol = (dep.settings[2].state_dir / "certs" / "control.pem").read_bytes()
    assert caller_problem({}, "gateway") == "the call carries no client certificate"
    problem = caller_problem({"x509_pem_cert": [carol]}, "gateway")
    assert problem is not None and "'carol'" in problem and "not the gateway" in problem
    assert caller_problem({"x509_pem_cert": [dep.client_cert]}, "gateway") is None
    problem = caller_problem({"x509_pem_cert": [dep.client_cert]}, "gw-prod")
    assert problem is not None and "'gw-prod'" in problem
