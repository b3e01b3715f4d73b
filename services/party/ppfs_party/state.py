"""Everything a running party holds: settings, identity, store, jobs, audit log.

Built by :func:`open_state` at server start (never at import); the servicer gets it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import ppfs
from ppfs.engines.base import Engine
from ppfs.engines.mpspdz import MpSpdzEngine
from ppfs.engines.mpyc_engine import MpycEngine
from ppfs.engines.registry import mpspdz_home
from ppfs.holdings import Held, HoldingsStatement, check_request
from ppfs.v1 import party_pb2
from ppfs.withdrawal import SignedWithdrawal, Withdrawal, WithdrawalError, WithdrawalReceipt
from ppfs_party.audit import AuditLog
from ppfs_party.config import PartySettings
from ppfs_party.jobs import JobRunner
from ppfs_party.keys import CONTROL, PartyKeys, load_or_create
from ppfs_party.metrics import PartyMetrics
from ppfs_party.store import ShareStore


@dataclass
class PartyState:
    settings: PartySettings
    keys: PartyKeys
    store: ShareStore
    jobs: JobRunner
    audit: AuditLog
    engines: dict[str, Engine]
    metrics: PartyMetrics = field(default_factory=PartyMetrics)

    def identity(self) -> party_pb2.PartyIdentity:
        s = self.settings
        mpc = b"".join(self.keys.public_pem(f"mpc-{name}") for name in self.engines)
        statement, signature = self.keys.key_statement()
        return party_pb2.PartyIdentity(
            index=s.index, name=s.name,
            box_public_key=bytes(self.keys.box.public_key),
            signing_public_key=bytes(self.keys.signing.verify_key),
            tls_certificate_pem=self.keys.public_pem(CONTROL),
            mpc_certificate_pem=mpc,
            engines=list(self.engines), mpc_host=s.mpc_host, mpc_port_base=s.mpc_port_base,
            mpc_port_count=s.mpc_port_count, key_statement=statement,
            key_statement_signature=signature, deployment_ca_pem=self.keys.public_pem("ca"),
            software_version=ppfs.__version__,
            engine_versions={n: engine_version(n, s) for n in self.engines},
            stopping=self.jobs.draining, stop_seconds_left=self.jobs.stop_seconds_left(),
        )

    async def withdraw(self, signed: SignedWithdrawal) -> tuple[bytes, bytes]:
        """Carry out an owner's withdrawal, checked here against the owner's key in this
        party's own registry: the jobs that use a covered upload stop, the uploads are
        deleted and their ids refused from then on. The receipt, signed with this party's
        key, and its signature; WithdrawalError for a withdrawal not carried out."""
        asked = Withdrawal.from_bytes(signed.statement)
        key = self.store.owners().get(asked.owner_id)
        if key is None:
            raise WithdrawalError(f"owner {asked.owner_id!r} is not registered at this party")
        w = signed.verify(key)
        covered = [u.manifest.upload_id for u in self.store.covered_uploads(w.covers)]
        stopped = await self.jobs.stop_using(
            covered, reason="an upload it uses was withdrawn by its owner")
        deleted = await self.store.withdraw(signed, w)
        # and those accepted while the first ones stopped, before the uploads were gone
        # (none can be accepted on them from now on)
        stopped += await self.jobs.stop_using(
            covered, reason="an upload it uses was withdrawn by its owner")
        self.audit.record("dataset.withdrawn", dataset_id=w.dataset_id, owner_id=w.owner_id,
                          uploads=len(deleted), jobs_stopped=len(stopped),
                          withdrawal_sha256=signed.digest)
        receipt = WithdrawalReceipt(
            withdrawal_sha256=signed.digest, party_index=self.settings.index,
            owner_id=w.owner_id, dataset_id=w.dataset_id,
            deleted=tuple(sorted(u.manifest.upload_id for u in deleted)),
            held=len(self.store.covered_uploads(w.covers)))
        return receipt.sign(self.keys.signing)

    def holdings(self, owner_id: str, dataset_id: str, challenge: bytes
                 ) -> tuple[bytes, bytes]:
        """What this party holds of ``owner_id``'s uploads of ``dataset_id``
        (committed, staged or set aside as damaged), answering the owner's challenge:
        the statement, signed with this party's key, and its signature."""
        check_request(owner_id, dataset_id, challenge)
        held = tuple(Held(u.manifest.upload_id, u.manifest.digest(), u.manifest.rows, status)
                     for u, status in self.store.listing(dataset_id)
                     if u.manifest.owner_id == owner_id)
        return HoldingsStatement(self.settings.index, owner_id, dataset_id, challenge.hex(),
                                 held).sign(self.keys.signing)

    def dataset_info(self, dataset_id: str) -> party_pb2.DatasetInfo:
        uploads = self.store.dataset_uploads(dataset_id)
        m = uploads[0].manifest
        return party_pb2.DatasetInfo(
            dataset_id=dataset_id, columns=list(m.columns),
            column_exponents=list(m.column_exponents), label_column=m.label_column,
            classes=len(m.classes), rows=sum(u.manifest.rows for u in uploads),
            upload_ids=[u.manifest.upload_id for u in uploads],
        )


def engine_version(name: str, settings: PartySettings) -> str:
    """The engine's release, as far as this machine tells ("" when unknown)."""
    if name == "mpyc":
        import mpyc

        return str(getattr(mpyc, "__version__", ""))
    if name == "mp-spdz":
        home = Path(settings.mpspdz_home or mpspdz_home())
        try:
            head = (home / "CHANGELOG.md").read_text(encoding="utf-8", errors="replace")[:4000]
        except OSError:
            return ""
        found = re.search(r"^## (\d+\.\d+(?:\.\d+)?)", head, re.MULTILINE)
        return found.group(1) if found else ""
    return ""


def usable_engines(settings: PartySettings) -> dict[str, Engine]:
    """The configured engines that work on this machine."""
    found: dict[str, Engine] = {}
    for name in settings.engines:
        engine: Engine
        if name == "mp-spdz":
            engine = MpSpdzEngine(
                settings.mpspdz_home or mpspdz_home(),
                cache_dir=settings.mpspdz_cache or settings.state_dir / "cache" / "mpspdz",
            )
        elif name == "mpyc":
            engine = MpycEngine()
        else:
            continue
        if engine.unavailable_reason() is None:
            found[name] = engine
    return found


def open_state(settings: PartySettings) -> PartyState:
    """Load (or on first start create) the party's keys, store and job records."""
    settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    # for the party's user alone even if it was there with open modes (restored by a
    # plain copy, made by hand): it holds share components, keys and job results
    settings.state_dir.chmod(0o700)
    engines = usable_engines(settings)
    keys = load_or_create(settings.state_dir, settings.index, settings.control_name, engines)
    audit = AuditLog(settings.state_dir / "audit.log")
    store = ShareStore(settings.state_dir, settings.index, keys.box, audit,
                       settings.max_upload_bytes, settings.bundle_cache_bytes,
                       settings.upload_timeout, settings.staged_expiry)
    store.open()
    metrics = PartyMetrics(settings.name)
    jobs = JobRunner(settings, keys, store, audit, engines)
    jobs.metrics = metrics
    jobs.open()
    metrics.watch(jobs)
    return PartyState(settings, keys, store, jobs, audit, engines, metrics)
