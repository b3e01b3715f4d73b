"""Shared pieces of the benchmarks: the paper's data sets, shapes and Table 1 numbers."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

DATASETS = Path(
    os.environ.get("PPFS_DATASETS", Path(__file__).resolve().parents[2] / "shared" / "datasets")
)


@dataclass(frozen=True)
class PaperDataset:
    name: str
    m: int
    p: int
    k: int
    folds: int
    # Table 1 of the paper: LR accuracy (%) and Step 2A runtime (s) on 3-4 VMs, 32 cores each
    accuracy: dict[str, float]
    runtime: dict[str, float]

    @property
    def csv(self) -> Path:
        return DATASETS / self.name.lower() / f"{self.name.lower()}.csv"


PAPER = [
    PaperDataset("CogLoad", 632, 120, 12, 6,
                 {"RAW": 50.90, "MS-GINI": 52.50, "GI": 52.70, "PCC": 48.57, "MI": 51.59},
                 {"passive-3pc": 50, "active-3pc": 163, "active-4pc": 79}),
    PaperDataset("LSVT", 126, 310, 103, 10,
                 {"RAW": 80.09, "MS-GINI": 86.15, "GI": 82.74, "PCC": 78.89, "MI": 85.38},
                 {"passive-3pc": 60, "active-3pc": 254, "active-4pc": 89}),
    PaperDataset("SPEED", 8378, 122, 67, 10,
                 {"RAW": 95.24, "MS-GINI": 97.26, "GI": 95.56, "PCC": 95.89, "MI": 95.83},
                 {"passive-3pc": 949, "active-3pc": 3634, "active-4pc": 1435}),
]


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    rev = ""
    with contextlib.suppress(OSError):
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=False).stdout.strip()
    return (f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}, ppfs {rev or 'unknown revision'}; all parties "
            f"as local processes on this one machine (loopback network)")
