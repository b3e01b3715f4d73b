"""The party daemon's Prometheus metrics, served by ``--metrics-listen HOST:PORT``
(default off) on a plain-HTTP listener meant for the internal network.

Jobs by state (now) and by final state and failure kind, the time each job spends in
each phase (queued, compiling, waiting for the engine, assembling inputs, engine run),
bytes the engine sent, uploads and their sizes, refused calls by method and status.
Labels are bounded sets; nothing here names a job, a data set or any value.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

import ppfs

if TYPE_CHECKING:
    from ppfs_party.jobs import JobRecord, JobRunner

DURATION_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
BYTES_BUCKETS = tuple(float(4**i) * 1024 for i in range(13))  # 1 KiB .. 16 GiB
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
FINAL = frozenset(STATES[2:])
# phases the job runner names itself; every engine progress message counts as "engine"
PHASES = ("queued", "compiling", "waiting for the engine", "assembling inputs")


def phase_category(phase: str) -> str:
    return phase if phase in PHASES else "engine"


class _PartyNow(Collector):
    def __init__(self, name: str) -> None:
        self.name = name
        self.runner: JobRunner | None = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "ppfs_party_info", "This party and its software version", labels=["party", "version"]
        )
        info.add_metric([self.name, ppfs.__version__], 1)
        yield info
        g = GaugeMetricFamily(
            "ppfs_party_jobs", "Jobs this party knows, by state", labels=["state"]
        )
        counts = dict.fromkeys(STATES, 0)
        if self.runner is not None:
            for rec in list(self.runner._records.values()):
                if rec.state in counts and not rec.tombstone:
                    counts[rec.state] += 1
        for state, n in counts.items():
            g.add_metric([state], n)
        yield g


class PartyMetrics:
    def __init__(self, name: str = "") -> None:
        r = self.registry = CollectorRegistry()
        self._now = _PartyNow(name)
        r.register(self._now)
        self.certificate_end = Gauge(
            "ppfs_party_certificate_expiry_timestamp_seconds",
            "When each certificate and the key statement this party presents ends "
            "(Unix time): control, mpc-<engine>, key-statement, ca",
            ["certificate"], registry=r,
        )  # fmt: skip
        self.jobs_finished = Counter(
            "ppfs_party_jobs_finished", "Jobs that reached a final state on this party",
            ["state", "failure_kind"], registry=r,
        )  # fmt: skip
        self.job_seconds = Histogram(
            "ppfs_party_job_duration_seconds", "StartJob to final state",
            ["state"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.phase_seconds = Histogram(
            "ppfs_party_job_phase_duration_seconds", "Time a job spent in each phase",
            ["phase"], buckets=DURATION_BUCKETS, registry=r,
        )  # fmt: skip
        self.job_bytes = Histogram(
            "ppfs_party_job_bytes_sent", "Bytes this party's engine sent for a succeeded job",
            buckets=BYTES_BUCKETS, registry=r,
        )  # fmt: skip
        self.uploads = Counter("ppfs_party_uploads", "Sealed upload parts stored", registry=r)
        self.upload_bytes = Histogram(
            "ppfs_party_upload_bytes", "Size of stored sealed upload parts",
            buckets=BYTES_BUCKETS, registry=r,
        )  # fmt: skip
        self.refusals = Counter(
            "ppfs_party_refusals", "Calls refused, by method and gRPC status",
            ["method", "code"], registry=r,
        )  # fmt: skip
        self._phase: dict[str, tuple[str, float]] = {}  # job -> (category, since)

    def watch(self, runner: JobRunner) -> None:
        self._now.runner = runner

    def job_changed(self, rec: JobRecord, old_state: str) -> None:
        """Called after every change of a job record (from the job runner)."""
        now = time.time()
        cat = phase_category(rec.phase)
        prev = self._phase.get(rec.job_id)
        if prev is None:
            prev = ("queued", _parse(rec.created_at) or now)
        if rec.state in FINAL:
            if old_state in FINAL:
                return
            self._phase.pop(rec.job_id, None)
            self.phase_seconds.labels(prev[0]).observe(max(0.0, now - prev[1]))
            self.jobs_finished.labels(rec.state, rec.failure or "").inc()
            start = _parse(rec.created_at) or now
            self.job_seconds.labels(rec.state).observe(max(0.0, now - start))
            if rec.state == "succeeded" and rec.bytes_sent:
                self.job_bytes.observe(rec.bytes_sent)
            return
        if cat != prev[0]:
            self.phase_seconds.labels(prev[0]).observe(max(0.0, now - prev[1]))
            prev = (cat, now)
        self._phase[rec.job_id] = prev

    def upload_stored(self, size: int) -> None:
        self.uploads.inc()
        self.upload_bytes.observe(size)

    def refused(self, method: str, code: str) -> None:
        self.refusals.labels(method, code).inc()


def _parse(ts: str) -> float:
    try:
        return dt.datetime.fromisoformat(ts).timestamp() if ts else 0.0
    except ValueError:
        return 0.0
