"""`ppfs upload`, `ppfs datasets`, `ppfs masks`, `ppfs jobs`, `ppfs result`, `ppfs keys`:
the client side of the service, for data owners, analysts and model owners.

The gateway URL, the bearer token, the key file and the deployment's trust anchor
come from flags or from the environment (PPFS_GATEWAY, PPFS_TOKEN, PPFS_KEY,
PPFS_DEPLOYMENT_CA). Without a trust anchor (the deployment CA certificate, or its
SHA-256 fingerprint, from whoever runs the deployment) nothing is uploaded, no job
is submitted and no result is opened: the parties' keys could not be checked.
Exit codes: 0 done, 1 the job or the service failed, 2 bad input or a refused request.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppfs.contract import (
    MAX_CONSENT_JOBS,
    MAX_CONSENT_ROWS,
    MIN_CONSENT_ROWS,
    TIME_FORMAT,
    Reveal,
    consent_securities,
    utc_time,
)
from ppfs.errors import InputDataError, ParameterError, PpfsError
from ppfs.jobflags import (
    ENGINE_PREFERENCE,
    add_scorer_flag,
    add_training_flags,
    best_engine,
    train_params_from_flags,
)
from ppfs.keycert import ANCHOR_ENV, TrustAnchor
from ppfs.pki import RENEW_WITHIN
from ppfs.step2a import Security
from ppfs.table import read_csv, read_features
from ppfs_client.keys import ClientKeys
from ppfs_client.progress import (
    FINAL_STATES,
    JobProgressView,
    change_line,
    party_summary,
    signature,
)
from ppfs_client.sdk import ApiError, GatewayClient, OwnerTable, RefusedAnswer
from ppfs_client.seen_lists import list_sha256, remembered
from ppfs_client.sent import load_sent
from ppfs_client.terminal import inline, printable

EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_GATEWAY = "http://127.0.0.1:8080"


def add_commands(sub: Any) -> None:
    up = sub.add_parser(
        "upload",
        help="encode, secret-share, seal and upload a CSV to the service",
        description="Encode DATA.csv (fixed point, per-column scales from the data or from an "
        "existing data set's schema), secret-share it, seal each party's shares to that "
        "party, sign the manifest with your key and upload it through the gateway. Prints "
        "the data set id.",
    )
    up.add_argument("data", type=Path, metavar="DATA.csv")
    up.add_argument("--dataset", metavar="NAME", help="create a new data set with this name")
    up.add_argument("--into", metavar="DATASET_ID", help="add rows to an existing data set")
    up.add_argument("--label", metavar="COLUMN", help="the label column")
    up.add_argument(
        "--no-label", action="store_true", help="these columns carry no label (vertical split)"
    )
    up.add_argument(
        "--schema-from", metavar="DATASET_ID", help="encode with this data set's column scales"
    )
    up.add_argument(
        "--again", action="store_true",
        help="add these rows even though this key file already sent the same rows into the "
        "data set (--into): without it that upload is refused, since every row would count "
        "twice",
    )
    _conn_args(up)
    up.set_defaults(func=_upload)

    ds = sub.add_parser("datasets", help="list, show and grant data sets")
    dsub = ds.add_subparsers(dest="datasets_command", required=True)
    ls = dsub.add_parser("list", help="data sets you may see")
    ls.add_argument("--kind", choices=["data", "mask"], default="data")
    _conn_args(ls)
    ls.set_defaults(func=_datasets_list)
    show = dsub.add_parser("show", help="one data set's public schema")
    show.add_argument("dataset_id")
    _conn_args(show)
    show.set_defaults(func=_datasets_show)
    grant = dsub.add_parser("grant", help="(admin) let a principal use a data set")
    grant.add_argument("dataset_id")
    grant.add_argument("subject")
    _conn_args(grant)
    grant.set_defaults(func=_datasets_grant)
    check = dsub.add_parser(
        "check", help="what every party holds of a data set against the gateway's record"
    )
    check.add_argument("dataset_id")
    _conn_args(check)
    check.set_defaults(func=_datasets_check)
    repair = dsub.add_parser(
        "repair",
        help="(owner) re-send your original sealed part to every party that lost it",
    )
    repair.add_argument("dataset_id")
    _conn_args(repair)
    repair.set_defaults(func=_datasets_repair)
    holdings = dsub.add_parser(
        "holdings",
        help="(owner) what every party holds of your uploads of a data set, signed by it",
        description="Ask every party what it holds of your uploads of DATASET. A fresh "
        "random challenge goes to every party; each answers with a statement signed by "
        "its certified key, which this command checks, so the gateway can neither forge "
        "nor replay one. Checks every upload of yours the gateway records against them: "
        "each must be held committed, under the manifest recorded, by every party. "
        "Exit 0 only when every party answered and holds all of them.",
    )
    holdings.add_argument("dataset_id")
    _conn_args(holdings)
    holdings.set_defaults(func=_datasets_holdings)
    withdraw = dsub.add_parser(
        "withdraw",
        help="(owner) delete every upload you made into a data set from every party",
        description="Sign with your key a withdrawal of every upload you made into DATASET "
        "up to now. The gateway relays it; each party checks your signature itself, "
        "deletes those uploads, refuses their ids from then on, stops its jobs that use "
        "one, and answers with a receipt signed by its certified key, which this command "
        "checks. Exit 0 only when every party confirmed; safe to run again.",
    )
    withdraw.add_argument("dataset_id")
    _conn_args(withdraw)
    withdraw.set_defaults(func=_datasets_withdraw)
    revoke = dsub.add_parser(
        "revoke",
        help="(owner) revoke every consent you gave a recipient for a data set",
        description="Sign with your key a revocation of every consent you gave SUBJECT for "
        "DATASET up to now (also any the gateway does not list). The gateway relays it; "
        "each party checks your signature itself, keeps the revocation, runs no job on "
        "those consents from then on, stops its unfinished jobs that rely on one, and "
        "answers with a receipt signed by its certified key, which this command checks. "
        "A consent you sign afterwards counts again. Exit 0 only when every party "
        "confirmed; safe to run again.",
    )
    revoke.add_argument("dataset_id")
    revoke.add_argument("--recipient", required=True, metavar="SUBJECT",
                        help="the recipient whose consents are revoked")
    _conn_args(revoke)
    revoke.set_defaults(func=_datasets_revoke)
    consent = dsub.add_parser(
        "consent",
        help="(owner) let a recipient learn the selection (and model) of jobs on your data",
        description="Sign with your key, and store at the gateway, your consent that jobs on "
        "DATASET may reveal the selection (with --model: and the trained model) to the "
        "recipient SUBJECT holding the result key B64. Every party checks it against your "
        "registered key before it runs a job on your uploads; without it they refuse.",
    )
    consent.add_argument("dataset_id", metavar="DATASET")
    consent.add_argument("--recipient", required=True, metavar="SUBJECT")
    consent.add_argument(
        "--recipient-key", required=True, metavar="B64",
        help="the recipient's box (result) public key, base64 or hex, as `ppfs keys create` "
        "printed it; get it from the recipient, not from the gateway",
    )
    consent.add_argument("--model", action="store_true", help="also reveal the model (Step 2B)")
    consent.add_argument(
        "--expires", metavar="WHEN", type=_expiry, default=None,
        help="the consent ends then: a UTC time YYYY-MM-DDTHH:MM:SSZ, or a date YYYY-MM-DD "
        "(to the end of that day, UTC); every party refuses jobs that need it afterwards. "
        "Without it the consent does not expire (a signed consent cannot be withdrawn)",
    )
    consent.add_argument(
        "--max-jobs", metavar="N", type=_max_jobs, default=0,
        help="the consent serves at most N jobs: every party counts the jobs it accepts "
        "under it (a job it accepted counts, however it ends) and refuses more. Without it, "
        "any number of jobs",
    )
    consent.add_argument(
        "--min-rows", metavar="N", type=_min_rows, default=0,
        help="the consent serves only jobs that pin at least N rows of the data set in all "
        "(every party counts them from the signed manifests it holds), so that a gateway "
        "holding back other uploads cannot have the selection (and model) computed over a "
        "handful of rows. Parties of an earlier version refuse such a consent. Without it, "
        "any number of rows",
    )
    consent.add_argument(
        "--min-own-rows", metavar="N", type=_min_rows, default=0,
        help="the consent serves only jobs that pin at least N rows from your own uploads "
        "to the data set (every party counts them from the manifests you signed; other "
        "owners' rows do not count), so that a co-owner working with the gateway cannot "
        "pad --min-rows with rows it knows while your uploads are held back. Parties of an "
        "earlier version refuse such a consent. Without it, any number of your rows",
    )
    settings = consent.add_mutually_exclusive_group()
    settings.add_argument(
        "--security", metavar="SETTINGS", type=_securities, default=None,
        help="the consent serves only jobs run in one of these security settings, "
        "comma-separated (e.g. active-3pc,active-4pc); every party checks the setting of "
        "the job itself. In a passive setting a corrupted party can change the result "
        "undetected and make a job's abort depend on the data. Parties of an earlier "
        "version refuse such a consent. Without it, any setting the recipient asks for",
    )
    settings.add_argument(
        "--active-only", dest="security", action="store_const",
        const=tuple(s.value for s in Security if s.active),
        help="the same as --security " + ",".join(s.value for s in Security if s.active),
    )
    _conn_args(consent)
    consent.set_defaults(func=_datasets_consent)
    consents = dsub.add_parser(
        "consents", help="the consents stored for a data set",
        description="The owners' consents the gateway stores and relays with jobs on "
        "DATASET: owner, recipient, what may be revealed, until when and for how many jobs. "
        "This is the gateway's record; every party checks each consent itself.",
    )
    consents.add_argument("dataset_id", metavar="DATASET")
    _conn_args(consents)
    consents.set_defaults(func=_datasets_consents)

    masks = sub.add_parser("masks", help="output masks of a result recipient")
    msub = masks.add_subparsers(dest="masks_command", required=True)
    mc = msub.add_parser(
        "create",
        help="draw mask words, keep them next to your key file, upload them shared",
    )
    mc.add_argument("--count", type=int, required=True, help="number of outputs (k + m*k)")
    _conn_args(mc)
    mc.set_defaults(func=_masks_create)

    jobs = sub.add_parser("jobs", help="submit, watch and cancel jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    sj = jsub.add_parser("submit", help="submit Step 2A (and optionally Step 2B)")
    sj.add_argument(
        "--dataset", action="append", required=True, metavar="ID", help="repeat to combine"
    )
    sj.add_argument("--combination", choices=["horizontal", "vertical"], default="horizontal")
    sj.add_argument("--label", required=True, metavar="COLUMN")
    sj.add_argument("--k", type=int, required=True)
    sj.add_argument(
        "--security",
        choices=["passive-3pc", "active-3pc", "active-4pc", "passive-4pc"],
        default="passive-3pc",
        help="security setting (default passive-3pc); it must fit the deployment's parties: "
        "3 for passive-3pc and active-3pc, 4 (with Dave) for active-4pc and passive-4pc "
        "(MPyC only)",
    )
    sj.add_argument(
        "--engine",
        choices=list(ENGINE_PREFERENCE),
        default=None,
        help="default: the best engine every party offers for this security setting "
        "(mp-spdz, else mpyc), from the gateway's /v1/deployment",
    )
    sj.add_argument(
        "--mask-upload", metavar="UPLOAD_ID", help="masks made before (default: make them now)"
    )
    add_scorer_flag(sj)
    add_training_flags(sj)
    sj.add_argument("--watch", action="store_true", help="then watch it to the end")
    _conn_args(sj)
    sj.set_defaults(func=_jobs_submit)
    for name, helptext, fn in (
        ("show", "one job's state and per-party progress", _jobs_show),
        ("watch", "live per-party progress until the job ends", _jobs_watch),
        ("cancel", "cancel a job on every party", _jobs_cancel),
    ):
        c = jsub.add_parser(name, help=helptext)
        c.add_argument("job_id")
        _conn_args(c)
        c.set_defaults(func=fn)
    jl = jsub.add_parser("list", help="your jobs")
    _conn_args(jl)
    jl.set_defaults(func=_jobs_list)

    res = sub.add_parser("result", help="fetch and open a job's result (its recipient only)")
    rsub = res.add_subparsers(dest="result_command", required=True)
    rf = rsub.add_parser(
        "fetch",
        help="download every party's sealed part, check they agree, open and unmask them",
    )
    rf.add_argument("job_id")
    _conn_args(rf)
    rf.set_defaults(func=_result_fetch)

    keys = sub.add_parser("keys", help="your key file (signing and result keys)")
    ksub = keys.add_subparsers(dest="keys_command", required=True)
    kc = ksub.add_parser("create", help="make a key file; prints the public keys to register")
    kc.add_argument("--subject", required=True, help="your owner / analyst id")
    kc.add_argument("--out", type=Path, required=True)
    kc.set_defaults(func=_keys_create)
    ks = ksub.add_parser("show", help="your public keys (give the box key to owners' consents)")
    ks.add_argument("--key", type=Path, default=None, help="your key file (PPFS_KEY)")
    ks.set_defaults(func=_keys_show)

    dep = sub.add_parser("deployment", help="the parties, sharing scheme and encoding")
    _conn_args(dep)
    dep.set_defaults(func=_deployment)


def _conn_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gateway", default=None, help=f"gateway URL (PPFS_GATEWAY, {DEFAULT_GATEWAY})")
    p.add_argument("--token", default=None, help="bearer token (PPFS_TOKEN; prefer the env var)")
    p.add_argument("--key", type=Path, default=None, help="your key file (PPFS_KEY)")
    p.add_argument("--ca", type=Path, default=None, help="CA bundle for an HTTPS gateway (PPFS_CA)")
    p.add_argument(
        "--deployment-ca", default=None, metavar="FILE_OR_SHA256",
        help="the deployment CA certificate, or its SHA-256 fingerprint, that certifies the "
        "parties' keys (PPFS_DEPLOYMENT_CA; from the operator: `ppfs pki fingerprint`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _client(args: argparse.Namespace) -> GatewayClient:
    url = args.gateway or os.environ.get("PPFS_GATEWAY") or DEFAULT_GATEWAY
    token = args.token or os.environ.get("PPFS_TOKEN")
    if not token:
        raise ParameterError("no token: pass --token or set PPFS_TOKEN")
    if args.token:
        # a command line is readable by every user of the machine (ps, /proc/PID/cmdline);
        # the environment only by this user
        print("ppfs: warning: a token given with --token is visible to other users of this "
              "machine while ppfs runs (ps); set PPFS_TOKEN instead", file=sys.stderr)
    ca = args.ca or (Path(os.environ["PPFS_CA"]) if os.environ.get("PPFS_CA") else None)
    anchor = getattr(args, "deployment_ca", None) or os.environ.get(ANCHOR_ENV)
    trust = TrustAnchor.parse(anchor) if anchor else None  # refused where keys matter
    return GatewayClient(url, token, verify=str(ca) if ca else True, trust=trust)


def _keys(args: argparse.Namespace) -> ClientKeys:
    path = args.key or (Path(os.environ["PPFS_KEY"]) if os.environ.get("PPFS_KEY") else None)
    if path is None:
        raise ParameterError("no key file: pass --key or set PPFS_KEY")
    return ClientKeys.load(path)


def _err(msg: str) -> None:
    print(f"ppfs: error: {printable(msg)}", file=sys.stderr)


def _guard(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except ApiError as exc:  # its detail may relay a party's words: kept to one line
            _err(inline(str(exc)))
            return EXIT_USAGE if 400 <= exc.status < 500 else EXIT_FAILED
        except (InputDataError, ParameterError) as exc:
            _err(str(exc))
            return EXIT_USAGE
        except PpfsError as exc:
            _err(str(exc))
            return EXIT_FAILED
        except OSError as exc:  # a local file: the message names it
            _err(f"{exc.filename or ''}: {exc.strerror or type(exc).__name__}"
                 if exc.filename else str(exc))
            return EXIT_FAILED
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # what the commands print comes from the gateway's answers: one whose fields
            # are not of the types the client expects ends here, in one line, and the
            # command stops where it was (nothing it would keep from that answer is kept)
            _err(str(RefusedAnswer(
                f"the gateway's answer is not what the client expects ({type(exc).__name__})")))
            return EXIT_FAILED

    return run


def _out(args: argparse.Namespace, obj: Any, text: str) -> None:
    print(json.dumps(obj) if args.json else printable(text))


def read_unlabelled(path: Path) -> OwnerTable:
    """A CSV of numeric columns only (an owner without the label, vertical split)."""
    columns, x = read_features(path)
    return OwnerTable(columns, x)


@_guard
def _upload(args: argparse.Namespace) -> int:
    if bool(args.dataset) == bool(args.into):
        raise ParameterError("give either --dataset NAME (new) or --into DATASET_ID")
    if args.no_label == bool(args.label):
        raise ParameterError("give either --label COLUMN or --no-label")
    if args.no_label:
        table = read_unlabelled(args.data)
    else:
        t = read_csv(args.data, args.label)
        table = OwnerTable(t.columns, t.x, t.label_column, t.classes, t.y)
    keys = _keys(args)
    with _client(args) as client:
        exponents = None
        schema_src = args.schema_from or args.into
        if schema_src:
            schema = client.get_dataset(schema_src)
            if schema["columns"]:
                if tuple(schema["columns"]) != table.columns:
                    raise ParameterError(
                        f"{args.data}: columns differ from data set {schema_src}'s schema"
                    )
                exponents = schema["column_exponents"]
        dep = client.deployment(keys)
        try:  # a value the encoding cannot hold is refused before anything is created
            fp = dep.fixed_point
            exps = exponents if exponents is not None else fp.choose_exponents(
                table.x, table.columns)
            if exponents is not None:
                fp.check_scales(table.x, exps, table.columns)
            fp.encode(table.x, np.asarray(exps, dtype=np.int64), table.columns)
        except InputDataError as exc:
            raise InputDataError(f"{args.data}: {exc}") from None
        # a name this owner already has is refused before the data set is created
        dataset_id = args.into or client.new_dataset(keys, args.dataset)["id"]
        with _UploadBar(enabled=sys.stderr.isatty() and not args.json) as bar:
            # the same rows sent twice into the data set: refused before anything is sent
            ds = client.upload_table(keys, table, dataset_id, exponents=exponents,
                                     deployment=dep, progress=bar, again=args.again,
                                     source=str(args.data))
    _out(
        args,
        ds,
        ds["id"],
    )
    print(
        f"uploaded {table.m} rows x {len(table.columns)} columns to data set {inline(ds['id'])} "
        f"({ds['rows']} rows in total)",
        file=sys.stderr,
    )
    print("held committed by " + ", ".join(inline(str(n)) for n in ds["confirmed_by"])
          + ", each by its signed statement", file=sys.stderr)
    return 0


class _UploadBar:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> _UploadBar:
        if self.enabled:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._progress = Progress(
                "uploading", BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True
            )
            self._progress.__enter__()
            self._task = self._progress.add_task("upload", total=None)
        return self

    def __call__(self, sent: int, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=sent, total=total)

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)


def _describe_dataset(d: dict[str, Any]) -> str:
    label = (
        f", label {d['label_column']!r} ({len(d['classes'])} classes)" if d["label_column"] else ""
    )
    return (
        f"{inline(d['id'])}  {d['name']!r} owner {inline(d['owner_id'])}: "
        f"{inline(d['rows'])} rows x "
        f"{len(d['columns'])} columns{label}"
    )


@_guard
def _datasets_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        items = client.list_datasets(args.kind)
    _out(args, items, "\n".join(_describe_dataset(d) for d in items) or "(none)")
    return 0


@_guard
def _datasets_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        d = client.get_dataset(args.dataset_id)
    _out(args, d, _describe_dataset(d) + "\ncolumns: " + ", ".join(map(inline, d["columns"])))
    return 0


@_guard
def _datasets_grant(args: argparse.Namespace) -> int:
    with _client(args) as client:
        g = client.grant(args.dataset_id, args.subject)
    _out(args, g, f"granted {inline(g['dataset_id'])} to {inline(g['subject'])}")
    return 0


def _check_text(c: dict[str, Any]) -> str:
    silent = [inline(p["name"]) for p in c["parties"] if not p["reachable"]]
    if c["consistent"]:
        verdict = "every party holds exactly them"
    elif silent and all(p["consistent"] for p in c["parties"] if p["reachable"]):
        # nothing is known to be wrong: only that some party could not be asked
        verdict = (f"UNKNOWN: {', '.join(silent)} did not answer; every party that did "
                   "holds exactly them")
    else:
        verdict = ("INCONSISTENT (the owner of an upload a party lacks re-sends it: "
                   f"`ppfs datasets repair {inline(c['dataset_id'])}`)")
    lines = [f"data set {inline(c['dataset_id'])}: {len(c['recorded'])} uploads recorded, "
             f"{verdict}"]
    for p in c["parties"]:
        if not p["reachable"]:
            lines.append(f"  {inline(p['name'])}: unreachable ({inline(p['error'])})")
            continue
        held = sum(1 for h in p["held"] if h["status"] == "committed")
        lines.append(f"  {inline(p['name'])}: holds {held} of {len(c['recorded'])}"
                     + ("" if p["consistent"] else ": " + "; ".join(map(inline, p["problems"]))))
    return "\n".join(lines)


@_guard
def _datasets_check(args: argparse.Namespace) -> int:
    with _client(args) as client:
        c = client.check_dataset(args.dataset_id)
    _out(args, c, _check_text(c))
    return 0 if c["consistent"] else EXIT_FAILED


@_guard
def _datasets_repair(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        done = client.repair_dataset(keys, args.dataset_id)
        c = client.check_dataset(args.dataset_id)
    for upload_id, party in done:
        print(f"re-sent upload {inline(upload_id)} to {inline(party)}", file=sys.stderr)
    if not done:
        print("nothing of yours to repair", file=sys.stderr)
    _out(args, c, _check_text(c))
    return 0 if c["consistent"] else EXIT_FAILED


def _kept_manifest_sha256(keys: ClientKeys, upload_id: str) -> str:
    """SHA-256 of the manifest this key file signed for the upload, as `ppfs upload`
    kept it; "" if none is kept here (the gateway's record is then all there is)."""
    try:
        return hashlib.sha256(base64.b64decode(load_sent(keys, upload_id)["manifest"])
                              ).hexdigest()
    except (ParameterError, OSError, ValueError, KeyError, TypeError):
        return ""


@_guard
def _datasets_holdings(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        h = client.holdings(keys, args.dataset_id)
        recorded = {str(u["upload_id"]): _kept_manifest_sha256(keys, str(u["upload_id"]))
                    or str(u.get("manifest_sha256", ""))
                    for u in client.check_dataset(args.dataset_id)["recorded"]
                    if u["owner_id"] == keys.subject}
    # and every upload of yours a party's signed statement lists in its data set
    # (committed, or set aside as damaged), whatever the gateway's record says: one it
    # leaves out would hide a party that holds it only staged, or not at all, while the
    # others hold it committed (and refuse every job that leaves it out)
    listed: dict[str, str] = {}
    for _, held in h.confirmed:
        for u in held:
            if u.status != "staged":
                listed.setdefault(u.upload_id, u.manifest_sha256)
    unrecorded = sorted(set(listed) - set(recorded))
    # staged only, wherever listed: in no data set (a refused or cut-off upload whose
    # abort has not reached every party yet, or one the gateway never committed)
    undecided = sorted({u.upload_id for _, held in h.confirmed for u in held}
                       - set(listed) - set(recorded))
    expected = {**{u: _kept_manifest_sha256(keys, u) or listed[u] for u in unrecorded},
                **recorded}
    short = []  # (party, why) for every upload of yours recorded or listed by a party
    for upload_id, digest in sorted(expected.items()):
        short += [(n, why) for n, why in h.missing(upload_id, digest)
                  if (n, why) not in h.unconfirmed]
    for name, held in h.confirmed:
        kinds = {st: sum(u.status == st for u in held) for st in ("committed", "staged",
                                                                   "damaged")}
        said = ", ".join(f"{k} {st}" for st, k in kinds.items() if k) or "none of your uploads"
        print(f"{inline(name)}: holds {said} (its signed statement)", file=sys.stderr)
    for name, why in short:
        print(f"{inline(name)}: NOT holding: {inline(why)}", file=sys.stderr)
    for upload_id in unrecorded:
        print(f"upload {inline(upload_id)}: held by a party but not in the gateway's record",
              file=sys.stderr)
    for upload_id in undecided:
        print(f"upload {inline(upload_id)}: staged only, committed by no party and not in "
              "the gateway's record: no job uses it now", file=sys.stderr)
    _unconfirmed(h.unconfirmed, f"did not state what it holds of {h.dataset_id}",
                 f"ppfs datasets holdings {h.dataset_id}")
    _out(args, {"dataset_id": h.dataset_id,
                "confirmed": [{"party": n, "uploads": [
                    {"upload_id": u.upload_id, "manifest_sha256": u.manifest_sha256,
                     "rows": u.rows, "status": u.status} for u in held]}
                    for n, held in h.confirmed],
                "not_holding": [{"party": n, "reason": why} for n, why in short],
                "unrecorded": unrecorded, "staged_only": undecided,
                "unconfirmed": [{"party": n, "reason": why} for n, why in h.unconfirmed]},
         f"{len(recorded)} upload(s) of yours recorded in {h.dataset_id}"
         + (f", {len(unrecorded)} more held but not recorded" if unrecorded else "") + "; "
         f"{len(h.confirmed)} of {len(h.confirmed) + len(h.unconfirmed)} parties answered"
         + ("" if not short else f"; {len(short)} not held as recorded"))
    return EXIT_FAILED if h.unconfirmed or short else 0


@_guard
def _datasets_withdraw(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        w = client.withdraw(keys, args.dataset_id)
    for name, deleted in w.confirmed:
        now = f"deleted {len(deleted)} upload(s) now" if deleted else "nothing left to delete"
        print(f"{name}: confirmed by its signed receipt ({now})", file=sys.stderr)
    _unconfirmed(w.unconfirmed, f"may still hold your uploads of {w.dataset_id}",
                 f"ppfs datasets withdraw {w.dataset_id}")
    _out(args, {"dataset_id": w.dataset_id,
                "confirmed": [{"party": n, "deleted": list(d)} for n, d in w.confirmed],
                "unconfirmed": [{"party": n, "reason": r} for n, r in w.unconfirmed],
                "removed": list(w.removed)},
         f"withdrew your uploads of {w.dataset_id} at {len(w.confirmed)} of "
         f"{len(w.confirmed) + len(w.unconfirmed)} parties")
    return EXIT_FAILED if w.unconfirmed else 0


@_guard
def _datasets_revoke(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        r = client.revoke_consents(keys, args.dataset_id, args.recipient)
    for name, stopped in r.confirmed:
        did = f"stopped {stopped} job(s) relying on them" if stopped else "no job relied on them"
        print(f"{name}: confirmed by its signed receipt ({did})", file=sys.stderr)
    _unconfirmed(r.unconfirmed, f"may still run jobs for {r.recipient} on your consents",
                 f"ppfs datasets revoke {r.dataset_id} --recipient {r.recipient}")
    _out(args, {"dataset_id": r.dataset_id, "recipient": r.recipient,
                "confirmed": [{"party": n, "jobs_stopped": k} for n, k in r.confirmed],
                "unconfirmed": [{"party": n, "reason": why} for n, why in r.unconfirmed],
                "removed": list(r.removed)},
         f"revoked your consents to {r.recipient} on {r.dataset_id} at {len(r.confirmed)} of "
         f"{len(r.confirmed) + len(r.unconfirmed)} parties")
    return EXIT_FAILED if r.unconfirmed else 0


def _unconfirmed(unconfirmed: Sequence[tuple[str, str]], risk: str, again: str) -> None:
    """Name each party whose receipt did not confirm, and what to run once it answers."""
    for name, why in unconfirmed:  # why: the party's own words, relayed by the gateway
        print(f"{inline(name)}: NOT confirmed: {inline(why)}", file=sys.stderr)
    if unconfirmed:
        names = ", ".join(inline(n) for n, _ in unconfirmed)
        print(f"ppfs: {names} {risk}: run `{again}` again once reachable", file=sys.stderr)


def _public_key(text: str) -> bytes:
    text = text.strip()
    try:
        key = bytes.fromhex(text) if len(text) == 64 else base64.b64decode(text, validate=True)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ParameterError("--recipient-key must be a 32-byte X25519 public key (base64 or hex)")
    return key


@_guard
def _datasets_consents(args: argparse.Namespace) -> int:
    with _client(args) as client:
        got = client.list_consents(args.dataset_id)
    lines = [f"{len(got)} consent{'' if len(got) == 1 else 's'} for {args.dataset_id}"]
    for c in got:
        n = int(c.get("max_jobs", 0))
        lines.append(
            f"  {inline(c['owner_id'])} -> {inline(c['recipient'])} "
            f"(key {inline(c['recipient_public_key'][:12])}...): {inline(c['reveal'])}; "
            + (f"until {inline(c['expires_at'])}" if c.get("expires_at")
                                  else "no expiry")
            + "; " + (f"at most {n} job{'s' if n > 1 else ''}" if n else "any number of jobs")
            + "; " + _row_floors(c) + "; " + _settings(c))
    _out(args, got, "\n".join(lines))
    return 0


def _row_floors(c: dict[str, Any]) -> str:
    """A listed consent's minimums of rows, in all and of its owner's own uploads."""
    rows, own = int(c.get("min_rows", 0)), int(c.get("min_own_rows", 0))
    floors = ([f"at least {rows} rows"] if rows else []) + (
        [f"at least {own} rows of the owner's own uploads"] if own else [])
    return "; ".join(floors) or "no minimum of rows"


def _settings(c: dict[str, Any]) -> str:
    """The security settings a listed consent allows."""
    named = [inline(str(s)) for s in c.get("securities") or []]
    return f"only in {' or '.join(named)}" if named else "any security setting"


def _securities(text: str) -> tuple[str, ...]:
    """--security: security setting names, comma-separated, at least one."""
    try:
        chosen = consent_securities(n for n in text.split(",") if n.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return tuple(sorted(s.value for s in chosen))


def _max_jobs(text: str) -> int:
    """--max-jobs: a whole number of jobs, 1 to MAX_CONSENT_JOBS."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_CONSENT_JOBS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of jobs from 1 to {MAX_CONSENT_JOBS}")
    return int(text)


def _min_rows(text: str) -> int:
    """--min-rows: a whole number of rows, MIN_CONSENT_ROWS to MAX_CONSENT_ROWS."""
    if not text.isdigit() or not MIN_CONSENT_ROWS <= int(text) <= MAX_CONSENT_ROWS:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of rows from {MIN_CONSENT_ROWS} to "
            f"{MAX_CONSENT_ROWS}")
    return int(text)


def _expiry(text: str) -> str:
    """--expires: a UTC time (kept as given) or a date (to the end of that day, UTC)."""
    try:
        utc_time(text)
        return text
    except ValueError:
        pass
    try:
        day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is neither YYYY-MM-DD nor YYYY-MM-DDTHH:MM:SSZ") from None
    return (day + dt.timedelta(days=1)).strftime(TIME_FORMAT)


@_guard
def _datasets_consent(args: argparse.Namespace) -> int:
    keys = _keys(args)
    reveal = Reveal.MODEL if args.model else Reveal.SELECTION
    with _client(args) as client:
        c = client.consent(keys, args.dataset_id, args.recipient,
                           _public_key(args.recipient_key), reveal,
                           expires_at=args.expires or "", max_jobs=args.max_jobs,
                           min_rows=args.min_rows, min_own_rows=args.min_own_rows,
                           securities=args.security or ())
    until = f" until {inline(c['expires_at'])}" if c.get("expires_at") else ""
    n = int(c.get("max_jobs", 0))
    jobs = f"{n} job{'s' if n > 1 else ''}" if n else "jobs"
    rows, own = int(c.get("min_rows", 0)), int(c.get("min_own_rows", 0))
    floors = ([f"at least {rows} rows of it"] if rows else []) + (
        [f"at least {own} rows of {inline(c['owner_id'])}'s own uploads"] if own else [])
    least = f" pinning {' and '.join(floors)}" if floors else ""
    named = [inline(str(s)) for s in c.get("securities") or []]
    run = f" run in {' or '.join(named)}" if named else ""
    _out(args, c, f"{inline(c['owner_id'])} lets {inline(c['recipient'])} learn the "
         f"{inline(c['reveal'])} of {jobs}{run} on {inline(c['dataset_id'])}{least}{until}")
    return 0


@_guard
def _masks_create(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        upload_id = client.create_masks(keys, args.count)
    _out(args, {"mask_upload_id": upload_id}, upload_id)
    return 0


def _job_line(j: dict[str, Any]) -> str:
    parties = "  ".join(party_summary(p) for p in j["parties"])
    err = f"\n  error: {inline(j['error'])}" if j["error"] else ""
    return (
        f"{inline(j['id'])}  {inline(j['state'])}  k={inline(j['k'])} m={inline(j['m'])} "
        f"p={inline(j['p'])} {inline(j['security'])} {inline(j['engine'])}\n  {parties}{err}"
    )


@_guard
def _jobs_submit(args: argparse.Namespace) -> int:
    keys = _keys(args)
    train = train_params_from_flags(args)
    training = None
    if train is not None:
        training = {
            "epochs": train.epochs,
            "batch_size": train.batch,
            "learning_rate": train.lr,
            "seed": train.seed,
            "weight_bits": train.weight_bits,
        }
    pending = keys.pending_requests()
    if pending:
        print(f"ppfs: note: {len(pending)} earlier submission(s) with this key got no job id "
              f"back (the client stopped first, the gateway did not answer, or it answered "
              f"with an error that did not say whether it created a job); if one became a "
              f"job (`ppfs jobs list`), `ppfs result fetch JOB_ID` checks it against the "
              f"request kept in {pending[0].parent}", file=sys.stderr)
    with _client(args) as client:
        engine = args.engine or _default_engine(client, args.security)
        job = client.submit(
            keys,
            args.dataset,
            label=args.label,
            k=args.k,
            security=args.security,
            engine=engine,
            combination=args.combination,
            training=training,
            mask_upload_id=args.mask_upload,
            scorer=args.scorer,
        )
        if not args.watch:
            _out(args, job, job["id"])
            return 0
        print(f"job {inline(job['id'])} submitted ({args.security} on {inline(engine)})",
              file=sys.stderr)
        return _watch(client, job["id"], args.json)


def _default_engine(client: GatewayClient, security: str) -> str:
    """The best engine every party of the deployment offers that runs ``security``."""
    parties = client.deployment().parties
    engine = best_engine((p.engines for p in parties), security)
    if engine is None:
        offered = "; ".join(f"{p.name}: {', '.join(p.engines) or 'none'}" for p in parties)
        raise ParameterError(
            f"no engine that every party offers runs {security} (parties offer {offered})"
        )
    return engine


@_guard
def _jobs_show(args: argparse.Namespace) -> int:
    with _client(args) as client:
        j = client.get_job(args.job_id)
    _out(args, j, _job_line(j))
    return 0


@_guard
def _jobs_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        items = client.list_jobs()
    _out(args, items, "\n".join(_job_line(j) for j in items) or "(none)")
    return 0


@_guard
def _jobs_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        j = client.cancel_job(args.job_id)
    _out(args, j, _job_line(j))
    return 0


@_guard
def _jobs_watch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return _watch(client, args.job_id, args.json)


def _watch(client: GatewayClient, job_id: str, as_json: bool) -> int:
    """Live lines per party on a terminal, one line per change otherwise; then the
    final state on stdout and, when it succeeded, the command that fetches the result."""
    view = JobProgressView(as_json=as_json)
    last = view.follow(client.events(job_id))
    if last is None or last["state"] not in FINAL_STATES:
        last = client.get_job(job_id)
    if view.printed != signature(last):  # the final state, unless just printed
        print(json.dumps(last) if as_json else change_line(last))
    if last["state"] != "succeeded":
        _err(f"job {job_id} {inline(last['state'])}: "
             f"{inline(last['error']) or 'no reason given'}")
        return EXIT_FAILED
    nxt = f"next: ppfs result fetch {job_id}"
    print(nxt, file=sys.stderr if as_json else sys.stdout)
    return 0


@_guard
def _result_fetch(args: argparse.Namespace) -> int:
    keys = _keys(args)
    with _client(args) as client:
        sel = client.fetch_result(keys, args.job_id)
    obj: dict[str, Any] = {
        "job_id": sel.job_id,
        "selected": sel.columns,
        "indices": sel.indices.tolist(),
    }
    # names from the owners' signed manifests: each kept on its own rank's line
    names = [inline(c) for c in sel.columns]
    text = "selected (best first):\n" + "\n".join(
        f"  {r:3d}. {c}" for r, c in enumerate(names, start=1)
    )
    if sel.model is not None:
        obj["model"] = model = sel.model.to_json()
        # the selected columns' weights, best first: every other column weighs 0 (--json
        # gives the whole model)
        width = max(len(c) for c in names)
        text += (f"\nmodel (logistic regression, original units; {model['epochs']} epochs, "
                 f"batch {model['batch']}, lr {model['lr']}; the columns not selected "
                 f"weigh 0):")
        for row in model["models"]:
            text += f"\n  {inline(row['target'])}: intercept {row['intercept']:.6g}"
            text += "".join(f"\n    {shown:<{width}}  {row['weights'][c]:.6g}"
                            for c, shown in zip(sel.columns, names, strict=True))
    _out(args, obj, text)
    return 0


@_guard
def _keys_create(args: argparse.Namespace) -> int:
    if args.out.exists():
        _err(f"{args.out} exists; not overwriting a key file")
        return EXIT_USAGE
    keys = ClientKeys.generate(args.subject).save(args.out)
    print(
        json.dumps(
            {
                "subject": keys.subject,
                "signing_public_key_hex": keys.verify_key.hex(),
                "box_public_key_hex": keys.box_public_key.hex(),
                "box_public_key": base64.b64encode(keys.box_public_key).decode(),
                "key_file": str(args.out),
            }
        )
    )
    return 0


@_guard
def _keys_show(args: argparse.Namespace) -> int:
    keys = _keys(args)
    print(json.dumps({
        "subject": keys.subject,
        "signing_public_key_hex": keys.verify_key.hex(),
        "box_public_key": base64.b64encode(keys.box_public_key).decode(),
    }))
    return 0


@_guard
def _deployment(args: argparse.Namespace) -> int:
    # with a key file (--key, PPFS_KEY), the list relayed is checked against the newest
    # this key file accepted, and remembered if newer
    path = args.key or (Path(os.environ["PPFS_KEY"]) if os.environ.get("PPFS_KEY") else None)
    keys = ClientKeys.load(path) if path is not None else None
    with _client(args) as client:
        # one answer, every party's keys in it checked against the trust anchor
        dep, raw = client.deployment_answer(keys)
        # and what each party does now (stopping, not answering): shown, never trusted
        notes = [] if args.json else client.party_notes(len(dep.parties))
    lines = [
        f"{inline(p['index'])} {inline(p['name']):6} mpc {inline(p['mpc_address'])}  "
        f"engines {', '.join(map(inline, p['engines']))}"
        + (f"  keys certified until {info.keys_valid_until:%Y-%m-%d}"
           if info.keys_valid_until else "")
        for p, info in zip(raw["parties"], dep.parties, strict=True)
    ]
    lines = [f"{line}  {note}" if note else line
             for line, note in zip(lines, notes or [""] * len(lines), strict=True)]
    now = dt.datetime.now(dt.UTC)
    for info in dep.parties:  # a party whose keys end soon is refused once they have
        if info.keys_valid_until and info.keys_valid_until - now <= RENEW_WITHIN:
            days = (info.keys_valid_until - now).days
            print(f"ppfs: warning: {inline(info.name)}'s key certificate ends on "
                  f"{info.keys_valid_until:%Y-%m-%d %H:%M} UTC (in {days} day"
                  f"{'s' * (days != 1)}): uploads and results need it; ask the deployment's "
                  "operator to renew it (`ppfs pki sign`)", file=sys.stderr)
    lines.append(f"scheme {inline(raw['scheme'])}; security settings "
                 f"{', '.join(map(inline, raw['securities']))}")
    rl = dep.revocations
    if rl is not None:  # the CA's (checked against the trust anchor)
        lines.append(f"revocation list issued {rl.issued_at}, stale after {rl.next_update} "
                     f"({len(rl.revoked)} key statement{'s' * (len(rl.revoked) != 1)} "
                     "revoked)")
        if rl.stale_after - now <= dt.timedelta(days=1):
            print(f"ppfs: warning: the deployment CA's revocation list "
                  f"{'went' if rl.stale_after <= now else 'goes'} stale on "
                  f"{rl.stale_after:%Y-%m-%d %H:%M} UTC: parties whose key statements ask "
                  "for it are refused once it is stale; ask the deployment's operator to "
                  "re-issue it (`ppfs pki revocations`)", file=sys.stderr)
    # the newest list this key file accepted (one older than it was refused above)
    seen = (remembered(keys, client.trust.sha256)
            if keys is not None and client.trust is not None else None)
    if seen is not None and rl is not None and seen.list_sha256 == list_sha256(rl):
        lines[-1] += "; the newest this key file accepted"
    elif seen is not None:
        lines.append(f"newest revocation list this key file accepted: issued "
                     f"{seen.issued_at} (one issued before it is refused as a replay)")
    _out(args, raw, "\n".join(lines))
    return 0
