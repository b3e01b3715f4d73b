"""Pure logic, no server and no engine: the job contract's combination rules
(ppfs.contract.plan), the classification of a job's failure (failure_kind) and the
gateway's checks of an upload's manifest (ppfs_gateway.uploads.check_manifest) and
the order it lists a data set's uploads in (its registry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppfs.contract import (
    Combination,
    DatasetSchema,
    FailureKind,
    IncompatibleDatasets,
    failure_kind,
    plan,
)
from ppfs.errors import (
    EngineError,
    IntegrityError,
    ParameterError,
    PeerLostError,
    RangeAbortError,
    SessionMismatchError,
    ShareFormatError,
    StalledError,
    TimedOutError,
)

H, V = Combination.HORIZONTAL, Combination.VERTICAL


def schema(dataset_id: str, columns: tuple[str, ...] = ("a", "b"), *, label: str = "y",
           classes: tuple[str, ...] = ("no", "yes"), rows: int = 10, frac_bits: int = 16,
           exponents: tuple[int, ...] | None = None) -> DatasetSchema:
    return DatasetSchema(
        dataset_id=dataset_id, columns=columns,
        column_exponents=exponents if exponents is not None else (0,) * len(columns),
        label_column=label, classes=classes if label else (), frac_bits=frac_bits, rows=rows,
    )


# ---- plan(): horizontal -------------------------------------------------------------


def test_horizontal_appends_rows_of_one_schema():
    p = plan([schema("d1", rows=10), schema("d2", rows=7)], H, "y")
    assert (p.m, p.p, p.columns, p.classes, p.frac_bits) == (17, 2, ("a", "b"), ("no", "yes"), 16)
    assert p.labelled == (0, 1)
    assert p.column_exponents == (0, 0)


def test_one_data_set_is_horizontal_whatever_asked():
    for combination in (H, V):
        p = plan([schema("d1", rows=5, exponents=(1, 2))], combination, "y")
        assert (p.m, p.p, p.labelled, p.column_exponents) == (5, 2, (0,), (1, 2))


@pytest.mark.parametrize("other", [
    schema("d2", ("a", "c")),  # columns
    schema("d2", ("b", "a")),  # column order
    schema("d2", exponents=(0, 3)),  # exponents
    schema("d2", label="z"),  # label
    schema("d2", classes=("no", "maybe")),  # classes
])
def test_horizontal_needs_the_same_schema(other):
    with pytest.raises(IncompatibleDatasets, match="horizontal combination needs the same"):
        plan([schema("d1"), other], H, "y")


def test_horizontal_needs_the_asked_label():
    with pytest.raises(ParameterError, match="no label column 'z'"):
        plan([schema("d1"), schema("d2")], H, "z")


# ---- plan(): vertical ---------------------------------------------------------------


def test_vertical_joins_columns_and_takes_the_label_holder_classes():
    a = schema("d1", ("a", "b"), label="", exponents=(1, 2))
    b = schema("d2", ("c",), classes=("x", "y", "z"), exponents=(3,))
    p = plan([a, b], V, "y")
    assert (p.m, p.p, p.columns) == (10, 3, ("a", "b", "c"))
    assert p.column_exponents == (1, 2, 3)
    assert (p.classes, p.labelled) == (("x", "y", "z"), (1,))


def test_vertical_needs_the_same_rows():
    with pytest.raises(IncompatibleDatasets, match="same number of rows"):
        plan([schema("d1", ("a",), rows=10), schema("d2", ("b",), label="", rows=9)], V, "y")


def test_vertical_needs_distinct_columns():
    with pytest.raises(IncompatibleDatasets, match="distinct column names"):
        plan([schema("d1", ("a", "b")), schema("d2", ("b", "c"), label="")], V, "y")


@pytest.mark.parametrize("labels,asked", [
    (("y", "y"), "y"),  # two label holders
    (("", ""), "y"),  # none
    (("y", ""), "z"),  # the one there is not the one asked
])
def test_vertical_needs_exactly_one_label_holder(labels, asked):
    a, b = (schema(f"d{i}", (f"c{i}",), label=lab) for i, lab in enumerate(labels))
    with pytest.raises(ParameterError, match="exactly one data set must hold the label"):
        plan([a, b], V, asked)


# ---- plan(): errors common to both ----------------------------------------------------


@pytest.mark.parametrize("combination", [H, V])
def test_plan_refuses_bad_requests(combination):
    with pytest.raises(ParameterError, match="at least one data set"):
        plan([], combination, "y")
    with pytest.raises(ParameterError, match="named twice"):
        plan([schema("d1"), schema("d1")], combination, "y")
    with pytest.raises(IncompatibleDatasets, match="different fractional bits"):
        plan([schema("d1", ("a",)), schema("d2", ("b",), label="", frac_bits=20)],
             combination, "y")
    with pytest.raises(ParameterError, match="give the label column"):
        plan([schema("d1")], combination, "")


def test_incompatible_data_sets_are_a_parameter_error():
    assert issubclass(IncompatibleDatasets, ParameterError)


def test_combination_parse():
    assert Combination.parse("horizontal") is H and Combination.parse("vertical") is V
    with pytest.raises(ParameterError, match="'horizontal' or 'vertical'"):
        Combination.parse("diagonal")


# ---- failure_kind() -------------------------------------------------------------------


@pytest.mark.parametrize("exc,kind", [
    (IntegrityError("copies disagree"), FailureKind.INTEGRITY),
    (RangeAbortError("out of range"), FailureKind.OUT_OF_RANGE),
    (SessionMismatchError("other session"), FailureKind.SESSION),
    (PeerLostError("peer gone"), FailureKind.PEER_LOST),
    (TimedOutError("too slow"), FailureKind.TIMEOUT),
    (StalledError("no progress"), FailureKind.STALLED),
    (ParameterError("bad k"), FailureKind.REFUSED),
    (ShareFormatError("bad share"), FailureKind.REFUSED),
    (EngineError("crashed"), FailureKind.OWN),
    (OSError("disk full"), FailureKind.OWN),
    (RuntimeError("anything else"), FailureKind.OWN),
])
def test_failure_kind(exc, kind):
    assert failure_kind(exc) is kind


def test_symptoms_and_collective_kinds():
    symptoms = {k for k in FailureKind if k.symptom}
    assert symptoms == {FailureKind.PEER_LOST, FailureKind.SESSION, FailureKind.CANCELLED}
    assert {k for k in FailureKind if k.collective} == {
        FailureKind.OUT_OF_RANGE, FailureKind.INTEGRITY, FailureKind.STALLED}
    assert not symptoms & {k for k in FailureKind if k.collective}


# ---- the gateway's check_manifest() ---------------------------------------------------


def _gateway_upload(parties: int = 3, **changes):
    import hashlib
    from dataclasses import replace

    from ppfs_gateway.uploads import UploadPart

    from ppfs.upload import Manifest

    parts = tuple(f"sealed part {i}".encode() for i in range(parties))
    man = Manifest(
        dataset_id="ds1", upload_id="up1", owner_id="owner-a",
        scheme="rep3" if parties == 3 else "rep4", rows=4, columns=("a", "b"),
        column_exponents=(0, 1), label_column="y", classes=("no", "yes"), frac_bits=16,
        part_sha256=tuple(hashlib.sha256(p).hexdigest() for p in parts),
        created_at="2025-01-01T00:00:00Z",
    )
    man = replace(man, **changes)
    return man, UploadPart(manifest=man.to_bytes(), signature=b"", parts=parts,
                           upload_id="up1")


class _Registry:
    def __init__(self, existing: tuple[str, ...] = ()) -> None:
        self.existing = existing

    def upload_exists(self, upload_id: str) -> bool:
        return upload_id in self.existing


def _dataset(**changes):
    from dataclasses import replace

    from ppfs_gateway.registry import DatasetRecord

    ds = DatasetRecord(id="ds1", name="d", owner_id="owner-a", kind="data", schema=None,
                       rows=0, created_at="2025-01-01T00:00:00Z")
    return replace(ds, **changes)


def _owner(subject: str = "owner-a"):
    from ppfs_gateway.auth import Principal
    from ppfs_gateway.core.config import Role

    return Principal(Role.DATA_OWNER, subject)


def test_check_manifest_accepts_a_consistent_upload():
    from ppfs_gateway.uploads import check_manifest

    man, up = _gateway_upload()
    got, schema = check_manifest(_dataset(), up, _owner(), 3, _Registry())
    assert got == man
    assert (schema.columns, schema.label_column, schema.classes, schema.scheme) == (
        ("a", "b"), "y", ("no", "yes"), "rep3")
    # a data owner the data set was granted to uploads too
    _, up = _gateway_upload(owner_id="owner-b")
    check_manifest(_dataset(grants=("owner-b",)), up, _owner("owner-b"), 3, _Registry())


@pytest.mark.parametrize("changes,match", [
    ({"dataset_id": "ds2"}, "another data set or upload"),
    ({"owner_id": "owner-b"}, "another owner"),
    ({"scheme": "rep4"}, "shares with rep3"),
    ({"part_sha256": ("0" * 64,) * 3}, "does not match the manifest's digest"),
    ({"rows": 0}, "shape is inconsistent"),
    ({"column_exponents": (0,)}, "shape is inconsistent"),
    ({"columns": ("a", "a")}, "repeat or include the label"),
    ({"columns": ("a", "y")}, "repeat or include the label"),
    ({"classes": ("only",)}, "at least two classes"),
    ({"frac_bits": 41}, "fractional bits are out of range"),
    ({"created_at": "last Tuesday"}, "creation time is not an ISO 8601 time"),
    ({"created_at": "2025-01-01T00:00:00"}, "creation time names no time zone"),
])
def test_check_manifest_refuses_an_inconsistent_manifest(changes, match):
    from ppfs_gateway.errors import MalformedUpload
    from ppfs_gateway.uploads import check_manifest

    _, up = _gateway_upload(**changes)
    with pytest.raises(MalformedUpload, match=match):
        check_manifest(_dataset(), up, _owner(), 3, _Registry())


def test_manifest_order_key_is_the_signed_time_then_the_id():
    from dataclasses import replace

    man, _ = _gateway_upload()
    at = replace(man, created_at="2025-01-01T01:30:00+01:30")  # the same instant
    assert at.signed_at() == man.signed_at() == "2025-01-01T00:00:00.000000Z"
    later = replace(man, created_at="2025-01-01T00:00:00.000001Z", upload_id="up0")
    assert man.order_key() < later.order_key()  # time first, though its id sorts first
    assert replace(man, upload_id="up0").order_key() < man.order_key()  # then the id


def test_registry_lists_uploads_in_their_signed_order(tmp_path: Path):
    import sqlite3

    from ppfs_gateway.registry import DatasetSchema, Registry

    schema = DatasetSchema(("a",), (0,), "y", ("no", "yes"), 16, "rep3")
    reg = Registry(tmp_path / "registry.db")
    reg.create_dataset("ds", "d", "owner-a", "data")
    # committed in the other order than their owners signed them
    reg.commit_upload("ds", "u-b", "owner-a", schema, 3, "b" * 64, "2025-01-02T00:00:00.000000Z")
    reg.commit_upload("ds", "u-a", "owner-b", schema, 2, "a" * 64, "2025-01-01T00:00:00.000000Z")
    reg.commit_upload("ds", "u-0", "owner-b", schema, 1, "0" * 64, "2025-01-02T00:00:00.000000Z")
    assert [u for u, _, _ in reg.upload_pins("ds")] == ["u-a", "u-0", "u-b"]
    got = reg.get_dataset("ds")
    assert got is not None and got.upload_ids == ("u-a", "u-0", "u-b")
    reg.close()

    # a registry made before uploads recorded their signed time: unknown until learnt
    # from the parties (test_upload_all_or_nothing.py::test_upgraded_registry_learns_...)
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.executescript(
        "CREATE TABLE uploads (id TEXT PRIMARY KEY, dataset_id TEXT NOT NULL, owner_id TEXT"
        " NOT NULL, rows INTEGER NOT NULL, manifest_sha256 TEXT NOT NULL, created_at TEXT"
        " NOT NULL);"
        "INSERT INTO uploads VALUES ('u-2', 'ds', 'o', 1, 'x', '2025-01-02T00:00:00.000000Z');"
        "INSERT INTO uploads VALUES ('u-1', 'ds', 'o', 1, 'y', '2025-01-03T00:00:00.000000Z');"
    )
    db.commit()
    db.close()
    reg = Registry(old)
    assert reg.uploads_without_signed_time("ds") == {"u-1", "u-2"}
    reg.set_signed_at("u-2", "2025-01-03T00:00:00.000000Z")
    reg.set_signed_at("u-1", "2025-01-02T00:00:00.000000Z")
    reg.set_signed_at("u-1", "2025-01-04T00:00:00.000000Z")  # learnt once, kept
    assert reg.uploads_without_signed_time("ds") == set()
    assert [u for u, _, _ in reg.upload_pins("ds")] == ["u-1", "u-2"]
    reg.close()


def test_check_manifest_refuses_strangers_repeats_and_other_schemas():
    from ppfs_gateway.errors import Conflict, Forbidden, IncompatibleSchemas
    from ppfs_gateway.uploads import check_manifest

    _, up = _gateway_upload(owner_id="owner-b")
    with pytest.raises(Forbidden):
        check_manifest(_dataset(), up, _owner("owner-b"), 3, _Registry())
    _, up = _gateway_upload()
    with pytest.raises(Conflict, match="already exists"):
        check_manifest(_dataset(), up, _owner(), 3, _Registry(("up1",)))
    _, first = check_manifest(_dataset(), up, _owner(), 3, _Registry())
    _, other = _gateway_upload(columns=("a", "c"))
    with pytest.raises(IncompatibleSchemas):
        check_manifest(_dataset(schema=first, upload_ids=("up0",)), other, _owner(), 3,
                       _Registry())


def test_a_consent_limited_to_jobs_signs_its_limit_and_is_spent_last():
    import dataclasses
    import json

    from nacl.signing import SigningKey

    from ppfs.contract import (
        Consent,
        ConsentError,
        JobContract,
        PinnedDataset,
        PinnedUpload,
        Reveal,
        check_consents,
    )
    from ppfs.step2a import Security

    key, recipient = SigningKey.generate(), bytes(range(32))
    plain = Consent("owner-a", "ds", "analyst", recipient, Reveal.SELECTION,
                    created_at="2025-01-01T00:00:00Z")
    assert "max_jobs" not in json.loads(plain.to_bytes())  # earlier consents read as before
    once = dataclasses.replace(plain, max_jobs=1)
    assert json.loads(once.to_bytes())["max_jobs"] == 1
    assert Consent.from_bytes(once.to_bytes()) == once
    for bad in (-1, "2", True, 10**7):
        d = json.loads(plain.to_bytes()) | {"max_jobs": bad}
        with pytest.raises(ConsentError, match="malformed"):
            Consent.from_bytes(json.dumps(d).encode())

    job = JobContract(
        job_id="j", datasets=(PinnedDataset("ds", (PinnedUpload("u", "0" * 64, 30),)),),
        combination=Combination.HORIZONTAL, label_column="y", k=1,
        security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16,
        recipient="analyst", recipient_public_key=recipient, mask_upload_id="m", m=30, p=5,
        classes=2)
    signed = [dataclasses.replace(once, max_jobs=n).sign(key) for n in (1, 2)]

    def check(consents, used=None):
        return check_consents(dataclasses.replace(job, consents=tuple(consents)),
                              {"ds": ["owner-a"]}, {"owner-a": bytes(key.verify_key)},
                              "analyst", recipient, used)

    assert check(signed) == [min(s.digest for s in signed)]
    assert check(signed, {signed[0].digest: 1}) == [signed[1].digest]
    assert check([*signed, plain.sign(key)], {}) == []  # the unlimited one first
    with pytest.raises(ConsentError, match=r"allows 2 jobs, all used"):
        check(signed[1:], {signed[1].digest: 2})


def test_a_consent_asking_for_a_minimum_of_rows_signs_it_apart_and_counts_only_then():
    import base64
    import dataclasses
    import json

    from nacl.signing import SigningKey

    from ppfs.contract import (
        CONSENT_PURPOSE,
        CONSENT_PURPOSE_MIN_ROWS,
        MAX_CONSENT_ROWS,
        Combination,
        Consent,
        ConsentError,
        JobContract,
        PinnedDataset,
        PinnedUpload,
        Reveal,
        check_consents,
    )
    from ppfs.step2a import Security

    key, recipient = SigningKey.generate(), bytes(range(32))
    plain = Consent("owner-a", "ds", "analyst", recipient, Reveal.SELECTION,
                    created_at="2025-01-01T00:00:00Z", max_jobs=3)
    # without a minimum the statement is the one an earlier version signed, byte for byte
    v1 = (b'{"created_at":"2025-01-01T00:00:00Z","dataset_id":"ds","max_jobs":3,'
          b'"owner_id":"owner-a","purpose":"ppfs consent v1","recipient":"analyst",'
          b'"recipient_public_key":"' + base64.b64encode(recipient) + b'",'
          b'"reveal":"selection"}')
    assert plain.to_bytes() == v1 and CONSENT_PURPOSE == "ppfs consent v1"
    assert Consent.from_bytes(v1) == plain and plain.min_rows == 0
    # with one, under another purpose: a party that does not know the field refuses it
    floor = dataclasses.replace(plain, min_rows=100)
    d = json.loads(floor.to_bytes())
    assert (d["purpose"], d["min_rows"]) == (CONSENT_PURPOSE_MIN_ROWS, 100)
    assert CONSENT_PURPOSE_MIN_ROWS != CONSENT_PURPOSE
    assert Consent.from_bytes(floor.to_bytes()) == floor
    assert Consent.from_bytes(floor.sign(key).statement).min_rows == 100
    for bad in (-1, 1, MAX_CONSENT_ROWS + 1, True):
        with pytest.raises(ValueError):
            dataclasses.replace(plain, min_rows=bad).to_bytes()
    for bad in (0, 1, -5, "100", True, 100.0, None, MAX_CONSENT_ROWS + 1):
        with pytest.raises(ConsentError, match="malformed"):
            Consent.from_bytes(json.dumps(d | {"min_rows": bad}).encode())
    with pytest.raises(ConsentError, match="malformed"):  # v2 states its minimum
        Consent.from_bytes(json.dumps({k: v for k, v in d.items() if k != "min_rows"}
                                      ).encode())
    with pytest.raises(ConsentError, match="malformed"):  # v1 has none to state
        Consent.from_bytes(json.dumps(json.loads(v1) | {"min_rows": 100}).encode())

    def job_on(*rows: int) -> JobContract:
        return JobContract(
            job_id="j", datasets=(PinnedDataset("ds", tuple(
                PinnedUpload(f"u{i}", "0" * 64, n) for i, n in enumerate(rows))),),
            combination=Combination.HORIZONTAL, label_column="y", k=1,
            security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16,
            recipient="analyst", recipient_public_key=recipient, mask_upload_id="m",
            m=sum(rows), p=5, classes=2)

    def check(consents, rows, pinned=(30,), used=None):
        return check_consents(dataclasses.replace(job_on(*pinned), consents=tuple(consents)),
                              {"ds": ["owner-a"]}, {"owner-a": bytes(key.verify_key)},
                              "analyst", recipient, used, rows=rows)

    floor_signed = floor.sign(key)
    assert check([floor_signed], {"ds": 100}) == [floor_signed.digest]
    assert check([floor_signed], {"ds": 250}) == [floor_signed.digest]
    # the party's own count rules, not the rows the description states
    with pytest.raises(ConsentError, match=r"'owner-a' for data set 'ds' \(its consent asks "
                       r"for at least 100 rows; the job pins 30\)"):
        check([floor_signed], {"ds": 30}, pinned=(60, 60))
    with pytest.raises(ConsentError, match=r"at least 100 rows; the job pins 0"):
        check([floor_signed], None, pinned=(60, 60))  # no count given: none counts
    with pytest.raises(ConsentError, match=r"at least 100 rows; the job pins 99"):
        check([floor_signed], {"ds": 99})
    # beside it, a consent without a minimum serves; of two minimums, the one met
    assert check([floor_signed, plain.sign(key)], {"ds": 30}) == [plain.sign(key).digest]
    low = dataclasses.replace(floor, min_rows=20).sign(key)
    assert check([floor_signed, low], {"ds": 30}) == [low.digest]
    # of several not met, the smallest minimum is the one named
    with pytest.raises(ConsentError, match=r"at least 100 rows; the job pins 10"):
        check([dataclasses.replace(floor, min_rows=500).sign(key), floor_signed],
              {"ds": 10})
    # a spent consent beside one not met: the rows are what would help
    with pytest.raises(ConsentError, match=r"at least 100 rows; the job pins 10"):
        check([floor_signed, plain.sign(key)], {"ds": 10},
              used={plain.sign(key).digest: 3})
    # spent as well: more rows would not serve it, so its use is named
    with pytest.raises(ConsentError, match=r"allows 3 jobs, all used\)"):
        check([floor_signed], {"ds": 10}, used={floor_signed.digest: 3})


def test_a_consent_asking_for_a_minimum_of_own_rows_signs_it_apart_and_counts_only_its_owners():
    """Consent.min_own_rows: signed under a purpose of its own only when set (a consent
    without it is the statement signed before, byte for byte); counted from the rows of
    the uploads its owner signed, never another owner's."""
    import base64
    import dataclasses
    import json

    from nacl.signing import SigningKey

    from ppfs.contract import (
        CONSENT_PURPOSE,
        CONSENT_PURPOSE_MIN_OWN_ROWS,
        CONSENT_PURPOSE_MIN_ROWS,
        MAX_CONSENT_ROWS,
        Combination,
        Consent,
        ConsentError,
        JobContract,
        PinnedDataset,
        PinnedUpload,
        Reveal,
        check_consents,
    )
    from ppfs.step2a import Security

    key, other, recipient = SigningKey.generate(), SigningKey.generate(), bytes(range(32))
    plain = Consent("owner-a", "ds", "analyst", recipient, Reveal.SELECTION,
                    created_at="2025-01-01T00:00:00Z")
    # without the new minimum, the statements of before, byte for byte (v1 and v2)
    head = b'{"created_at":"2025-01-01T00:00:00Z","dataset_id":"ds",'
    tail = (b'"owner_id":"owner-a","purpose":"ppfs consent v%d","recipient":"analyst",'
            b'"recipient_public_key":"' + base64.b64encode(recipient) + b'",'
            b'"reveal":"selection"}')
    assert plain.to_bytes() == head + tail % 1
    assert dataclasses.replace(plain, min_rows=100).to_bytes() == (
        head + b'"min_rows":100,' + tail % 2)
    assert plain.min_own_rows == 0
    assert Consent.from_bytes(head + b'"min_rows":100,' + tail % 2).min_own_rows == 0
    # with it, under a purpose neither of those: a party that counts only the rows in all
    # refuses it as malformed rather than skip the minimum
    assert CONSENT_PURPOSE_MIN_OWN_ROWS not in (CONSENT_PURPOSE, CONSENT_PURPOSE_MIN_ROWS)
    own = dataclasses.replace(plain, min_own_rows=10)
    d = json.loads(own.to_bytes())
    assert (d["purpose"], d["min_own_rows"], "min_rows" in d) == (
        CONSENT_PURPOSE_MIN_OWN_ROWS, 10, False)
    assert Consent.from_bytes(own.to_bytes()) == own
    both = dataclasses.replace(plain, min_rows=100, min_own_rows=10)
    d2 = json.loads(both.to_bytes())
    assert (d2["purpose"], d2["min_rows"], d2["min_own_rows"]) == (
        CONSENT_PURPOSE_MIN_OWN_ROWS, 100, 10)
    assert Consent.from_bytes(both.sign(key).statement) == both
    for bad in (-1, 1, MAX_CONSENT_ROWS + 1, True, "10"):
        with pytest.raises(ValueError):
            dataclasses.replace(plain, min_own_rows=bad).to_bytes()
    malformed = [d | {"min_own_rows": bad}
                 for bad in (0, 1, -5, "10", True, 10.0, None, MAX_CONSENT_ROWS + 1)]
    malformed += [d2 | {"min_rows": bad} for bad in (0, 1, "100", None)]
    malformed += [
        {k: v for k, v in d.items() if k != "min_own_rows"},  # v3 states its minimum
        {k: v for k, v in d2.items() if k != "min_own_rows"},
        d | {"purpose": CONSENT_PURPOSE_MIN_ROWS, "min_rows": 100},  # v2 has no such field
        d | {"purpose": CONSENT_PURPOSE},  # nor has v1
        d | {"purpose": "ppfs consent v4"},
    ]
    for stated in malformed:
        with pytest.raises(ConsentError, match="malformed"):
            Consent.from_bytes(json.dumps(stated).encode())

    # owner-a's 5 rows and owner-b's 95 in data set ds: 100 in all
    job = JobContract(
        job_id="j", datasets=(PinnedDataset("ds", (PinnedUpload("u0", "0" * 64, 5),
                                                   PinnedUpload("u1", "0" * 64, 95))),),
        combination=Combination.HORIZONTAL, label_column="y", k=1,
        security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16, recipient="analyst",
        recipient_public_key=recipient, mask_upload_id="m", m=100, p=5, classes=2)
    b_consent = Consent("owner-b", "ds", "analyst", recipient, Reveal.SELECTION).sign(other)
    counted = {("owner-a", "ds"): 5, ("owner-b", "ds"): 95}

    def check(consents, own_rows, rows=None):
        return check_consents(
            dataclasses.replace(job, consents=(*consents, b_consent)),
            {"ds": ["owner-a", "owner-b"]},
            {"owner-a": bytes(key.verify_key), "owner-b": bytes(other.verify_key)},
            "analyst", recipient, rows={"ds": 100} if rows is None else rows,
            own_rows=own_rows)

    own_signed, both_signed = own.sign(key), both.sign(key)
    # the rows in all meet min_rows; owner-b's rows are not owner-a's
    with pytest.raises(ConsentError, match=r"'owner-a' for data set 'ds' \(its consent asks "
                       r"for at least 10 rows of the owner's own uploads; the job pins 5 of "
                       r"them\)$"):
        check([both_signed], counted)
    with pytest.raises(ConsentError, match=r"own uploads; the job pins 0 of them"):
        check([own_signed], {("owner-b", "ds"): 95})  # none counted for owner-a: none
    with pytest.raises(ConsentError, match=r"own uploads; the job pins 0 of them"):
        check([own_signed], None)
    with pytest.raises(ConsentError, match=r"own uploads; the job pins 0 of them"):
        check([own_signed], {("owner-a", "other"): 50})  # its rows of another data set
    # short of both: each minimum named
    with pytest.raises(ConsentError, match=r"\(its consent asks for at least 100 rows; the "
                       r"job pins 40\) \(its consent asks for at least 10 rows of the owner's "
                       r"own uploads; the job pins 5 of them\)"):
        check([both_signed], counted, rows={"ds": 40})
    # enough of its own rows: it serves, as does a consent without the minimum beside it
    assert check([own_signed], counted | {("owner-a", "ds"): 10}) == []
    assert check([both_signed], {("owner-a", "ds"): 30}) == []
    assert check([own_signed, plain.sign(key)], counted) == []
    # of two minimums, the one met; of two not met, the smaller named
    low = dataclasses.replace(plain, min_own_rows=4).sign(key)
    assert check([own_signed, low], counted) == []
    with pytest.raises(ConsentError, match=r"at least 10 rows of the owner's own uploads; "
                       r"the job pins 3 of them"):
        check([dataclasses.replace(plain, min_own_rows=50).sign(key), own_signed],
              {("owner-a", "ds"): 3})
    # a consent asking for rows in all only is counted as before
    assert check([dataclasses.replace(plain, min_rows=100).sign(key)], {}) == []


def test_a_consent_naming_security_settings_signs_them_apart_and_refuses_other_settings():
    """Consent.securities: signed under a purpose of its own only when set (a consent
    without it is the statement signed before, byte for byte, v1 to v3); a job in a
    setting the owner's consents do not allow is refused, naming the owner, the setting
    and the settings allowed; such a consent carried beside one that serves is one the
    job cannot rely on, not padding a party lets through."""
    import base64
    import dataclasses
    import json

    from nacl.signing import SigningKey

    from ppfs.contract import (
        CONSENT_PURPOSE,
        CONSENT_PURPOSE_MIN_OWN_ROWS,
        CONSENT_PURPOSE_MIN_ROWS,
        CONSENT_PURPOSE_SECURITIES,
        Combination,
        Consent,
        ConsentError,
        JobContract,
        PinnedDataset,
        PinnedUpload,
        Reveal,
        check_consents,
        consent_securities,
        unrelied_consent,
    )
    from ppfs.step2a import Security

    key, recipient = SigningKey.generate(), bytes(range(32))
    plain = Consent("owner-a", "ds", "analyst", recipient, Reveal.SELECTION,
                    created_at="2025-01-01T00:00:00Z")
    # without settings, the statements of before, byte for byte (v1, v2 and v3)
    head = b'{"created_at":"2025-01-01T00:00:00Z","dataset_id":"ds",'
    tail = (b'"owner_id":"owner-a","purpose":"ppfs consent v%d","recipient":"analyst",'
            b'"recipient_public_key":"' + base64.b64encode(recipient) + b'",'
            b'"reveal":"selection"}')
    assert plain.securities == frozenset()
    assert plain.to_bytes() == head + tail % 1
    assert dataclasses.replace(plain, min_rows=100).to_bytes() == (
        head + b'"min_rows":100,' + tail % 2)
    assert dataclasses.replace(plain, min_own_rows=10).to_bytes() == (
        head + b'"min_own_rows":10,' + tail % 3)
    for old in (tail % 1, b'"min_rows":100,' + tail % 2, b'"min_own_rows":10,' + tail % 3):
        assert Consent.from_bytes(head + old).securities == frozenset()
    # with them, under a purpose none of those: a party that does not read the settings
    # refuses it as malformed rather than run the job in a setting not allowed
    assert CONSENT_PURPOSE_SECURITIES not in (
        CONSENT_PURPOSE, CONSENT_PURPOSE_MIN_ROWS, CONSENT_PURPOSE_MIN_OWN_ROWS)
    active = consent_securities(["active-4pc", "active-3pc"])
    assert active == frozenset({Security.ACTIVE_3PC, Security.ACTIVE_4PC})
    only_active = dataclasses.replace(plain, securities=active)
    assert only_active.to_bytes() == (
        head + b'"owner_id":"owner-a","purpose":"ppfs consent v4","recipient":"analyst",'
        b'"recipient_public_key":"' + base64.b64encode(recipient) + b'",'
        b'"reveal":"selection","securities":["active-3pc","active-4pc"]}')
    assert Consent.from_bytes(only_active.sign(key).statement) == only_active
    floors = dataclasses.replace(only_active, min_rows=100, min_own_rows=10)
    d = json.loads(floors.to_bytes())
    assert (d["purpose"], d["min_rows"], d["min_own_rows"]) == (
        CONSENT_PURPOSE_SECURITIES, 100, 10)
    assert Consent.from_bytes(floors.to_bytes()) == floors
    assert [only_active.allows(s) for s in Security] == [s.active for s in Security]
    assert all(plain.allows(s) for s in Security)
    for bad_names in ([], ["passive-5pc"], ["active-3pc", "ACTIVE-4PC"]):
        with pytest.raises(ValueError, match="security setting"):
            consent_securities(bad_names)
    for bad in ({"active-3pc"}, ("active-3pc",), [Security.ACTIVE_3PC]):
        with pytest.raises(ValueError):
            dataclasses.replace(plain, securities=bad).to_bytes()
    v4 = json.loads(only_active.to_bytes())
    malformed = [v4 | {"securities": bad} for bad in (
        [], None, "active-3pc", ["active-3pc", "active-3pc"], ["active-5pc"], [3],
        {"active-3pc": 1}, ["active-3pc", None])]
    malformed += [
        {k: v for k, v in v4.items() if k != "securities"},  # v4 states its settings
        v4 | {"purpose": CONSENT_PURPOSE},  # v1 to v3 have no such field
        v4 | {"purpose": CONSENT_PURPOSE_MIN_ROWS, "min_rows": 100},
        v4 | {"purpose": CONSENT_PURPOSE_MIN_OWN_ROWS, "min_own_rows": 10},
        v4 | {"min_rows": 1}, v4 | {"min_own_rows": "10"},
        v4 | {"purpose": "ppfs consent v5"},
    ]
    for stated in malformed:
        with pytest.raises(ConsentError, match="malformed"):
            Consent.from_bytes(json.dumps(stated).encode())

    job = JobContract(
        job_id="j", datasets=(PinnedDataset("ds", (PinnedUpload("u0", "0" * 64, 10),)),),
        combination=Combination.HORIZONTAL, label_column="y", k=1,
        security=Security.PASSIVE_3PC, engine="mpyc", frac_bits=16, recipient="analyst",
        recipient_public_key=recipient, mask_upload_id="m", m=10, p=5, classes=2)

    def check(consents, security=Security.PASSIVE_3PC, used=None):
        j = dataclasses.replace(job, security=security, consents=tuple(consents))
        spent = check_consents(j, {"ds": ["owner-a"]}, {"owner-a": bytes(key.verify_key)},
                               "analyst", recipient, used, rows={"ds": 10},
                               own_rows={("owner-a", "ds"): 10})
        return spent, unrelied_consent(j, {"ds": ["owner-a"]})

    active_signed = only_active.sign(key)
    with pytest.raises(ConsentError, match=r"^no consent to reveal the selection to 'analyst' "
                       r"from owner 'owner-a' for data set 'ds' \(its consent does not allow "
                       r"the security setting passive-3pc; it allows active-3pc, "
                       r"active-4pc\)$"):
        check([active_signed])
    assert check([active_signed], Security.ACTIVE_3PC) == ([], None)
    assert check([active_signed], Security.ACTIVE_4PC) == ([], None)
    # of two consents naming other settings, each setting they allow is named
    p4 = dataclasses.replace(plain, securities=frozenset({Security.PASSIVE_4PC})).sign(key)
    with pytest.raises(ConsentError, match=r"allows active-3pc, active-4pc, passive-4pc\)$"):
        check([active_signed, p4])
    # a limited one allowing the setting, all used: its use is named
    limited = dataclasses.replace(only_active, max_jobs=1).sign(key)
    with pytest.raises(ConsentError, match=r"allows 1 job, all used\)$"):
        check([limited], Security.ACTIVE_3PC, used={limited.digest: 1})
    # beside one allowing the job's setting, all used: another setting would serve
    spent = dataclasses.replace(plain, max_jobs=1).sign(key)
    with pytest.raises(ConsentError, match=r"does not allow the security setting "
                       r"passive-3pc; it allows active-3pc, active-4pc\)$"):
        check([spent, active_signed], used={spent.digest: 1})
    # a consent allowing only other settings, carried beside one that serves: the job
    # relies on the one that serves, and the other is one it cannot rely on (a gateway
    # relays none such); the party refuses the job for carrying it
    plain_signed = plain.sign(key)
    assert check([plain_signed]) == ([], None)
    assert check([active_signed, plain_signed]) == ([], (
        "the job carries a consent of 'owner-a' for data set 'ds' to 'analyst' that it "
        "cannot rely on (it does not allow the security setting passive-3pc)"))
    # in a setting both allow, each could serve
    assert check([active_signed, plain_signed], Security.ACTIVE_3PC) == ([], None)
