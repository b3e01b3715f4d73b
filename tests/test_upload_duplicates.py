"""A data owner who sends the same rows twice, or makes a second data set of a name it
already has: refused on the owner's machine, before anything is created or sent.

The client keeps, with each upload's record (``<key file>.uploads/<upload id>.json``), a
keyed SHA-256 digest of the parsed table and the data set it went into. That digest is a
fingerprint of the owner's data: it never leaves the owner's machine."""

from __future__ import annotations

import base64
import csv
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ppfs_client.sdk import ApiError, DatasetNameTaken, RepeatedUpload
from ppfs_client.sent import table_digest
from service_fakes import Stack, owner_table
from service_fakes import run_cli as run

from ppfs.errors import ParameterError
from ppfs.synthetic import make_table
from ppfs.upload import Manifest


def write_csv(path: Path, t: Any, *, shuffle: int | None = None, fmt: str = "repr") -> Path:
    """``t`` as a CSV; ``shuffle``: its rows in another order; ``fmt``: how numbers are
    written ("repr", or "e" for scientific notation: the same values, other text)."""
    order = list(range(t.m))
    if shuffle is not None:
        random.Random(shuffle).shuffle(order)
    show = repr if fmt == "repr" else (lambda v: f"{v:.17e}")
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*t.columns, "label"])
        for i in order:
            w.writerow([*(show(float(v)) for v in t.x[i]), t.y[i]])
    return path


class Sent:
    """Every request the client's HTTP transport sends, body included."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, bytes]] = []

    def posts(self, fragment: str) -> list[str]:
        return [u for m, u, _ in self.requests if m == "POST" and fragment in u]

    def everything(self) -> bytes:
        out = bytearray()
        for method, url, body in self.requests:
            out += f"{method} {url}\n".encode() + body + b"\n"
        return bytes(out)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    got = Sent()
    original = httpx.HTTPTransport.handle_request

    def recording(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        body = request.read()  # a streamed upload body too (httpx then sends these bytes)
        headers = "".join(f"{k}: {v}\n" for k, v in request.headers.items())
        got.requests.append((request.method, str(request.url), headers.encode() + body))
        return original(self, request)

    monkeypatch.setattr(httpx.HTTPTransport, "handle_request", recording)
    yield got


def parts_received(s: Stack) -> int:
    return sum(len(p.received_headers) for p in s.cluster.parties)


def upload(capsys: Any, s: Stack, owner: str, csv_path: Path, *where: str) -> tuple[int, str, str]:
    return run(capsys, s, owner, "upload", str(csv_path), *where, "--label", "label")


def records(s: Stack, owner: str) -> dict[str, dict[str, Any]]:
    """Each kept upload's record with its digest record beside it, by upload id."""
    folder = Path(f"{s.keys[owner].path}.uploads")
    kept = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    for p in folder.glob("*.sent"):
        kept[p.stem] = {**kept[p.stem], **json.loads(p.read_text())}
    return kept


def first_upload(capsys: Any, s: Stack, tmp_path: Path, seed: int, name: str
                 ) -> tuple[Any, Path, str]:
    """A 12-row table (``seed``) sent by owner-a into a new data set ``name``: the table,
    its CSV and the data set's id."""
    t = make_table(12, 3, seed=seed)
    a = write_csv(tmp_path / "a.csv", t)
    rc, out, err = upload(capsys, s, "owner-a", a, "--dataset", name)
    assert rc == 0, err
    return t, a, out.strip()


def test_the_same_file_twice_into_a_data_set_is_refused_before_anything_is_sent(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], sent: Sent
) -> None:
    t = make_table(16, 3, seed=11)
    a = write_csv(tmp_path / "a.csv", t)
    rc, out, err = upload(capsys, stack, "owner-a", a, "--dataset", "study")
    assert rc == 0, err
    ds = out.strip()
    (first,) = records(stack, "owner-a")
    before = parts_received(stack)
    sent.requests.clear()
    rc, out, err = upload(capsys, stack, "owner-a", a, "--into", ds)  # a re-run from history
    assert rc == 2 and out == "", err
    line = err.strip()
    assert line.startswith("ppfs: error: ") and "\n" not in line and "Traceback" not in err
    assert str(a) in line and ds in line and first in line and "--again" in line
    when = records(stack, "owner-a")[first]["sent_at"]
    assert when in line  # when the earlier upload was made
    # nothing was sent: no data set made, no upload, no part at any party, the data set
    # as it was (the gateway was only asked what the data set holds, and the parties,
    # through it, to confirm in their signed words that they hold the earlier upload:
    # a request carrying a fresh challenge and nothing else)
    (asked,) = sent.posts("")
    assert asked.endswith(f"/v1/datasets/{ds}/holdings") and parts_received(stack) == before
    (body,) = [b for m, u, b in sent.requests if u == asked]
    assert json.loads(body.split(b"\n")[-1]).keys() == {"challenge"}
    d = stack.client("owner-a").get_dataset(ds)
    assert d["rows"] == 16 and d["upload_ids"] == [first]
    assert list(records(stack, "owner-a")) == [first]  # no record of an upload not made

    # the same rows in another order, numbers written otherwise: the same rows, refused too
    b = write_csv(tmp_path / "b.csv", t, shuffle=5, fmt="e")
    assert b.read_bytes() != a.read_bytes()
    rc, _, err = upload(capsys, stack, "owner-a", b, "--into", ds)
    assert rc == 2 and first in err and "--again" in err, err
    assert sent.posts("/uploads") == [] and parts_received(stack) == before


def test_again_adds_the_same_rows_a_second_time(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, a, ds = first_upload(capsys, stack, tmp_path, 12, "twice")
    rc, out, err = upload(capsys, stack, "owner-a", a, "--into", ds, "--again")
    assert rc == 0, err
    assert out.strip() == ds and "24 rows in total" in err
    d = stack.client("owner-a").get_dataset(ds)
    assert d["rows"] == 24 and len(d["upload_ids"]) == 2
    for p in stack.cluster.parties:  # every party holds both uploads
        assert {*d["upload_ids"]} <= {*p.uploads}


def test_the_same_file_into_another_data_set_is_accepted(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = make_table(12, 3, seed=13)
    a = write_csv(tmp_path / "a.csv", t)
    t.x[2, 0] += 0.25  # b: a's rows but one value, so that a fits two's scales
    b = write_csv(tmp_path / "b.csv", t)
    rc, out, err = upload(capsys, stack, "owner-a", a, "--dataset", "one")
    assert rc == 0, err
    rc, out, err = upload(capsys, stack, "owner-a", b, "--dataset", "two")
    assert rc == 0, err
    two = out.strip()
    rc, _, err = upload(capsys, stack, "owner-a", a, "--into", two)  # a's rows, kept for one
    assert rc == 0, err
    assert stack.client("owner-a").get_dataset(two)["rows"] == 24


def test_a_different_file_into_the_same_data_set_is_accepted(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t, _, ds = first_upload(capsys, stack, tmp_path, 15, "growing")
    t.x[7, 1] += 0.5  # one value differs
    rc, _, err = upload(capsys, stack, "owner-a", write_csv(tmp_path / "b.csv", t), "--into", ds)
    assert rc == 0, err
    t.y[3] = 1 - t.y[3]  # one label differs
    rc, _, err = upload(capsys, stack, "owner-a", write_csv(tmp_path / "c.csv", t), "--into", ds)
    assert rc == 0, err
    assert stack.client("owner-a").get_dataset(ds)["rows"] == 36


def test_a_data_set_name_twice_is_refused_naming_the_one_there(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], sent: Sent
) -> None:
    a = write_csv(tmp_path / "a.csv", make_table(12, 3, seed=16))
    b = write_csv(tmp_path / "b.csv", make_table(12, 3, seed=17))
    rc, out, err = upload(capsys, stack, "owner-a", a, "--dataset", "cohort")
    assert rc == 0, err
    ds = out.strip()
    before = parts_received(stack)
    sent.requests.clear()
    rc, out, err = upload(capsys, stack, "owner-a", b, "--dataset", "cohort")
    assert rc == 2 and out == "", err
    assert ds in err and f"--into {ds}" in err and "another name" in err and "\n" not in err.strip()
    assert sent.posts("/v1/datasets") == [] and parts_received(stack) == before
    mine = [d for d in stack.client("owner-a").list_datasets() if d["name"] == "cohort"]
    assert [d["id"] for d in mine] == [ds]
    # the name is this owner's: another owner may have a data set of the same name
    rc, out, err = upload(capsys, stack, "owner-b", b, "--dataset", "cohort")
    assert rc == 0 and out.strip() != ds, err


def test_the_sdk_refuses_the_same_rows_and_a_taken_name(stack: Stack) -> None:
    t = make_table(12, 3, seed=18)
    keys, a = stack.keys["owner-a"], stack.client("owner-a")
    ds = a.new_dataset(keys, "sdk-study")["id"]
    a.upload_table(keys, owner_table(t), ds)
    before = parts_received(stack)
    with pytest.raises(RepeatedUpload) as info:
        a.upload_table(keys, owner_table(t), ds)
    assert isinstance(info.value, ParameterError) and ds in str(info.value)
    assert parts_received(stack) == before
    a.upload_table(keys, owner_table(t), ds, again=True)
    assert a.get_dataset(ds)["rows"] == 24
    with pytest.raises(DatasetNameTaken) as taken:
        a.new_dataset(keys, "sdk-study")
    assert isinstance(taken.value, ParameterError) and ds in str(taken.value)


def test_the_digest_is_never_sent(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], sent: Sent
) -> None:
    t, a, ds = first_upload(capsys, stack, tmp_path, 19, "private")
    (upload_id,) = stack.client("owner-a").get_dataset(ds)["upload_ids"]
    # a party loses its part: the repair re-sends it from the kept record
    del stack.cluster.parties[1].uploads[upload_id]
    rc, _, err = run(capsys, stack, "owner-a", "datasets", "repair", ds)
    assert rc == 0 and "re-sent upload" in err, err
    assert sent.posts("/uploads") and sent.posts("/repair")
    # the same file again: the gateway is asked what became of the earlier upload
    rc, _, err = upload(capsys, stack, "owner-a", a, "--into", ds)
    assert rc == 2 and upload_id in err, err
    assert any(u.endswith(f"/v1/datasets/{ds}/check") for m, u, _ in sent.requests)

    record = records(stack, "owner-a")[upload_id]
    digest = record["table_sha256"]
    assert record["dataset_id"] == ds and len(digest) == 64
    assert digest == table_digest(stack.keys["owner-a"], owner_table(t))
    raw = bytes.fromhex(digest)
    wire = sent.everything()
    # what the gateway could decode: the manifests (base64 in the bodies) and what each
    # party received
    for _, _, body in sent.requests:
        text = body.decode("utf-8", "replace")
        if '"manifest"' in text:
            payload = json.loads(text[text.index("{"):])
            wire += base64.b64decode(payload["manifest"])
    for p in stack.cluster.parties:
        for h in p.received_headers:
            wire += h.SerializeToString()
    for n in range(8, 65):  # no prefix of it, as hex in either case
        assert digest[:n].encode() not in wire.lower(), n
    for n in range(4, 33):  # nor as bytes
        assert raw[:n] not in wire
    assert base64.b64encode(raw)[:8] not in wire
    assert base64.urlsafe_b64encode(raw)[:8] not in wire


def test_a_damaged_record_is_named_and_an_old_one_ignored(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str], sent: Sent
) -> None:
    _, a, ds = first_upload(capsys, stack, tmp_path, 20, "kept")
    (upload_id,) = records(stack, "owner-a")
    path = Path(f"{stack.keys['owner-a'].path}.uploads") / f"{upload_id}.sent"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])  # cut short (a crash, a bad copy)
    sent.requests.clear()
    rc, out, err = upload(capsys, stack, "owner-a", a, "--into", ds)
    assert rc == 2 and out == "" and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ppfs: error: ") and str(path) in lines[0]
    assert sent.posts("") == []
    # an upload an older client kept (no digest record) is no error, and no refusal
    path.unlink()
    rc, _, err = upload(capsys, stack, "owner-a", a, "--into", ds)
    assert rc == 0, err
    assert stack.client("owner-a").get_dataset(ds)["rows"] == 24


def test_a_retry_is_refused_only_if_the_earlier_upload_was_added_or_may_still_be(
    stack: Stack,
) -> None:
    """A retry after a failure is what an owner should do when the first upload never
    made it (the gateway refused it, or was cut off and aborted it): the client asks the
    gateway, by upload id, whether it is part of the data set or still held by a party."""
    t = make_table(12, 3, seed=21)
    keys, a = stack.keys["owner-a"], stack.client("owner-a")
    ds = a.new_dataset(keys, "retry")["id"]
    dep = a.deployment()
    stack.loop.run(stack.cluster.stop_party(2))
    with pytest.raises(ApiError) as info:  # the gateway answers: a party did not answer
        a.upload_table(keys, owner_table(t), ds, deployment=dep)
    assert info.value.status == 502, info.value
    stack.loop.run(stack.cluster.start_party(2))
    a.upload_table(keys, owner_table(t), ds)  # it was not added: no --again needed
    assert a.get_dataset(ds)["rows"] == 12
    # an upload that got no answer and never arrived: nothing to count twice
    u = owner_table(t)
    u.x[0, 0] += 0.25  # other rows, in the data set's scales
    cut = stack.client("owner-a")

    def lost(*args: Any, **kw: Any) -> Any:
        raise ApiError(0, "gateway unreachable", "ConnectError")

    cut.post_upload = lost  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        cut.upload_table(keys, u, ds)
    a.upload_table(keys, u, ds)
    assert a.get_dataset(ds)["rows"] == 24
    # an upload whose answer never came, though the gateway added it: refused
    v = owner_table(t)
    v.x[1, 1] += 0.25
    slow = stack.client("owner-a")
    post = slow.post_upload

    def unanswered(*args: Any, **kw: Any) -> Any:
        post(*args, **kw)  # the gateway takes it; its answer never arrives
        raise ApiError(0, "gateway too slow", "its answer took more than 30 s")

    slow.post_upload = unanswered  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        slow.upload_table(keys, v, ds)
    assert a.get_dataset(ds)["rows"] == 36
    with pytest.raises(RepeatedUpload) as again:
        a.upload_table(keys, v, ds)
    assert "part of the data set" in str(again.value)
    # one a party still holds, staged, waiting for the gateway's decision: refused too
    w = owner_table(t)
    w.x[2, 2] += 0.25
    held = stack.client("owner-a")

    def stalled(dataset_id: str, body: dict[str, Any], progress: Any = None) -> Any:
        man = Manifest.from_bytes(base64.b64decode(body["manifest"]))
        for p in stack.cluster.parties[:2]:  # Alice and Bob hold their parts, staged
            p.staged[man.upload_id] = (man, {})
        raise ApiError(0, "gateway too slow", "its answer took more than 30 s")

    held.post_upload = stalled  # type: ignore[method-assign]
    with pytest.raises(ApiError):
        held.upload_table(keys, w, ds)
    with pytest.raises(RepeatedUpload) as again:
        a.upload_table(keys, w, ds)
    assert "still holds its part" in str(again.value) and "datasets check" in str(again.value)


def test_the_check_reads_no_sealed_part(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An upload's own record holds its sealed parts (tens of MB for a large table); the
    check before each upload reads only the small digest records beside them, so that it
    costs the same however much this key file has sent."""
    _, a, ds = first_upload(capsys, stack, tmp_path, 22, "big")
    (upload_id,) = records(stack, "owner-a")
    folder = Path(f"{stack.keys['owner-a'].path}.uploads")
    (folder / f"{upload_id}.json").write_bytes(b"\xff not read")
    rc, _, err = upload(capsys, stack, "owner-a", a, "--into", ds)
    assert rc == 2 and f"were already sent into data set {ds} as upload {upload_id}" in err, err
