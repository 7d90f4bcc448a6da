"""How many of a layer's misses cross PCIe, the rest running on the CPU: the q* cost model.

Pure policy (no torch): tested without a device. With copy rate p and CPU expert rate c, equal
finish times give the fraction q* = p / (p + c). Per layer the split is a whole number of
experts and each side has a fixed cost when it has any work, which q* alone ignores: with few
misses the fixed CPU cost makes plain offload faster, which is what users of the reference
system saw. The fixed costs are measured end to end through the executor (profile.py) and are
mostly host work (planning, launches, the hand-off to the CPU worker and back), which one host
thread does one side after the other, so they add; the per-expert work of the two sides
overlaps. The count minimises that modelled layer time over every split 0..m, which includes
both fixed policies (all PCIe, all CPU): the choice is never modelled slower than them.

Open question, to settle with GPU measurements: runtime/cache_policy_split.py models the same
choice for the trace simulator with the CPU's fixed cost overlapping the copies and with a charge
for the later re-miss of a CPU-served expert (`fill_value_s`), which the trace replay showed
matters once the cache is large. One model should serve both; which one the hardware agrees
with is what `ft bench` on the GPU host has to show.
"""

from __future__ import annotations

from typing import Protocol


class Rates(Protocol):
    """What the cost model needs from a BandwidthProfile (rates while both sides run; `*_alone`
    with the other side idle, 0 when not measured)."""

    pcie_gbps: float
    cpu_gbps: float
    pcie_fixed_ms: float
    cpu_fixed_ms: float
    pcie_alone_gbps: float
    cpu_alone_gbps: float


def q_star(rates: Rates) -> float:
    """The PCIe fraction of the misses with equal finish times and no fixed costs."""
    total = rates.pcie_gbps + rates.cpu_gbps
    return rates.pcie_gbps / total if total > 0 else 1.0


def layer_ms(rates: Rates, num_misses: int, num_pcie: int, expert_bytes: int) -> float:
    """Fixed costs of the sides in use add up; their per-expert work overlaps (the slower counts)."""
    num_cpu = num_misses - num_pcie
    fixed = (rates.pcie_fixed_ms if num_pcie else 0.0) + (rates.cpu_fixed_ms if num_cpu else 0.0)
    both = num_pcie > 0 and num_cpu > 0  # sharing host DRAM: the rates measured beside each other
    pcie = rates.pcie_gbps if both or not rates.pcie_alone_gbps else rates.pcie_alone_gbps
    cpu = rates.cpu_gbps if both or not rates.cpu_alone_gbps else rates.cpu_alone_gbps
    return fixed + max(num_pcie * expert_bytes / (pcie * 1e6), num_cpu * expert_bytes / (cpu * 1e6))


def choose_pcie_count(num_misses: int, expert_bytes: int, rates: Rates) -> int:
    """The number of misses to copy over PCIe (the rest go to the CPU) minimising `layer_ms`;
    on ties the larger count, since copied experts stay cached for later steps."""
    best, best_ms = num_misses, layer_ms(rates, num_misses, num_misses, expert_bytes)
    for n in range(num_misses - 1, -1, -1):
        ms = layer_ms(rates, num_misses, n, expert_bytes)
        if ms < best_ms * (1 - 1e-9):
            best, best_ms = n, ms
    return best
