"""BandwidthProfile: how fast this machine serves a cache miss over PCIe and on the CPU, as the
q* split reads it (split.py), and where it is kept: JSON under $FT_HOME/profiles/<machine-key>.json,
reloaded by `measure_bandwidth.load_or_measure`; one of an older PROFILE_VERSION is measured again.

Data only: the measurement runs the executor, which reads this module (measure_bandwidth.py).
"""

from __future__ import annotations

import json
import os
import platform
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..experts import HostExpertBank

# Bumped when what is measured changes (3: the device-planned decode path, calls queued back to back
# as decode queues them; 4: the CPU share selects its pairs in the kernel, a lower fixed cost; 5:
# batches timed on the device behind a head start, without the launching thread's time; 6: its
# executors uncaptured, see `measure`); a kept profile of another version is measured again.
PROFILE_VERSION = 6


@dataclass(frozen=True)
class BandwidthProfile:
    """Rates in GB/s of expert records while both sides run (they share host DRAM); fixed costs
    in ms per layer call that has any work. `*_alone_gbps`: each side with the other idle (0: the
    same as beside), which is what an all-PCIe or all-CPU layer gets."""

    pcie_gbps: float
    cpu_gbps: float
    cpu_fixed_ms: float
    pcie_fixed_ms: float
    pcie_alone_gbps: float = 0.0
    cpu_alone_gbps: float = 0.0
    machine: str = ""
    expert_bytes: int = 0  # the record size it was measured with
    cpu_threads: int = 0
    dtype: str = ""  # of the measured bank's weights
    measured_at: str = ""
    version: int = 0

    @property
    def beside_factor(self) -> float:
        """The share of its alone rate each side kept while both ran (measure_bandwidth's one factor
        on both; 1 where the alone rates were not measured)."""
        return self.pcie_gbps / self.pcie_alone_gbps if self.pcie_alone_gbps else 1.0

    def save(self, path: Path) -> None:
        """Crash-safe: temp file, fsync, rename."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(asdict(self), f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    @staticmethod
    def load(path: Path) -> BandwidthProfile:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = BandwidthProfile.__dataclass_fields__
        return BandwidthProfile(**{k: v for k, v in data.items() if k in fields})


def profiles_dir() -> Path:
    home = os.environ.get("FT_HOME")
    return (Path(home) if home else Path.home() / ".ft") / "profiles"


def machine_key(device: torch.device | str, *, cpu_threads: int, dtype: str, expert_bytes: int,
                pcie_repeat: int = 1) -> str:
    """Host, accelerator, CPU threads, weight dtype and expert size: what the two rates and their
    fixed costs depend on (small records stay in the CPU's caches; per-call costs weigh more on
    them), and an emulated slower link, kept apart from the real one."""
    device = torch.device(device)
    accel = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    raw = (f"{platform.node() or 'host'}-{accel}-{cpu_threads}t-{dtype}-{expert_bytes / 2**20:.1f}MiB"
           + (f"-pcie1of{pcie_repeat}" if pcie_repeat > 1 else ""))
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw)


def bank_dtype(bank: HostExpertBank) -> str:
    return "+".join(sorted({p.dtype for p in bank.layout.parts if not p.name.endswith("_scale")}))


