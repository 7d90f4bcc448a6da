"""The bandwidth-adaptive expert runtime: a device expert cache with one global LRU, misses split
between PCIe and the CPU by measured bandwidth, streamed prefill, elastic cache size.

Device-agnostic: on CUDA it uses a copy stream, events and pinned banks; on the CPU (CI) the
same code runs with synchronous copies, so the logic is tested without a GPU.
"""

from .bandwidth_profile import BandwidthProfile
from .build import CacheTooSmallError, build_hybrid, check_cache_capacity, load_gpu
from .device_model import DeviceModel
from .executor import MODES, ExpertStats, HybridExpertExecutor
from .expert_cache import ExpertCache
from .measure_bandwidth import load_or_measure, measure
from .records import UnsupportedOnDevice
from .split import choose_pcie_count, q_star

__all__ = [
    "MODES", "BandwidthProfile", "CacheTooSmallError", "DeviceModel", "ExpertCache", "ExpertStats",
    "HybridExpertExecutor", "UnsupportedOnDevice", "build_hybrid", "check_cache_capacity", "choose_pcie_count",
    "load_gpu", "load_or_measure", "measure", "q_star",
]
