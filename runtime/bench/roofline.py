"""The bandwidth roofline of a decode step: the least time the measured rates allow for the bytes a
policy moved per token (PCIe, the CPU, device memory), as `ft bench` reports it."""

from __future__ import annotations

import math

from ..gpu import BandwidthProfile


def host_seconds(pcie_bytes: float, cpu_bytes: float, profile: BandwidthProfile) -> float:
    """The least time for PCIe to move `pcie_bytes` and the CPU to read `cpu_bytes`, where each
    side runs at its alone rate while the other idles and both at the lower rates measured while
    both run (a side without an alone rate: its rate while both run). Overlapping pays only while
    both have bytes left, so the best schedule runs both until the side that would finish first
    is done, or runs them one after the other."""
    p_both, c_both = profile.pcie_gbps * 1e9, profile.cpu_gbps * 1e9
    p_alone, c_alone = (profile.pcie_alone_gbps or profile.pcie_gbps) * 1e9, (profile.cpu_alone_gbps or profile.cpu_gbps) * 1e9
    one_after_other = pcie_bytes / p_alone + cpu_bytes / c_alone
    if pcie_bytes <= 0 or cpu_bytes <= 0:
        return one_after_other
    both = min(pcie_bytes / p_both, cpu_bytes / c_both)  # seconds with both running
    overlapped = both + (pcie_bytes - p_both * both) / p_alone + (cpu_bytes - c_both * both) / c_alone
    return min(one_after_other, overlapped)


def roofline(per_token: dict[str, float], profile: BandwidthProfile, hbm_gbps: float, serial: bool = False) -> float:
    """Tokens/s if every side ran at its measured rate and the device's reads overlapped the
    host's perfectly (`host_seconds` for PCIe and the CPU). `serial`: with the PCIe reads and the
    device-memory reads one after the other, as a decode step makes them when nothing is read
    ahead (a layer's misses are known only from its routing, which needs the layer before), the
    CPU still beside them."""
    pcie, cpu = per_token["pcie_bytes"], per_token["cpu_bytes"]
    hbm_s = per_token["hit_bytes"] / (hbm_gbps * 1e9)
    t = host_seconds(pcie, cpu, profile)
    if serial:
        t = max(t, host_seconds(pcie, 0.0, profile) + hbm_s)
    t = max(t, hbm_s)
    return 1 / t if t > 0 else math.inf
