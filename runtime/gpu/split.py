"""The executor's side of the q* split: a measured BandwidthProfile as the one cost model's MissCost.

The policy itself (how many of a layer's misses cross PCIe, the rest running on the CPU) is
runtime/cache_policy_split.py, shared with the trace simulator. What is particular to the GPU
path is only how its profile reads: rates in GB/s while both sides run and each side alone (0:
not measured), and fixed costs in ms measured on the device through the executor (profile.py),
without the launching thread's time: the plan and fill's latency on the PCIe side, the hand-off
to the CPU worker and back on the other. The two run beside each other (the fills go on while
the worker computes), so they compose as the simulator's: `fixed_costs="overlap"`.

Until profile version 5 the fixed costs were timed with the host's launches in them, host work
done one side after the other, and composed "serial"; on the H200 that charged the CPU share
0.3-0.7 ms a call where its pipeline costs ~0.09 ms (BENCHMARKS.md, fifth session). Where the
host's launches do bound a step (few misses, a large cache), auto's guard times whole steps and
falls back to plain offload.
"""

from __future__ import annotations

from typing import Protocol

from ..cache_policy_split import MissCost, choose_pcie_misses, closed_form_fraction, finish_seconds


class Rates(Protocol):
    """What the cost model needs from a BandwidthProfile (rates while both sides run; `*_alone`
    with the other side idle, 0 when not measured)."""

    pcie_gbps: float
    cpu_gbps: float
    pcie_fixed_ms: float
    cpu_fixed_ms: float
    pcie_alone_gbps: float
    cpu_alone_gbps: float


def miss_cost(rates: Rates, fixed_costs: str = "overlap") -> MissCost:
    """The profile in the policy's units (bytes per second, seconds)."""
    return MissCost(pcie_bytes_per_s=rates.pcie_gbps * 1e9, cpu_bytes_per_s=rates.cpu_gbps * 1e9,
                    cpu_overhead_s=rates.cpu_fixed_ms * 1e-3, pcie_overhead_s=rates.pcie_fixed_ms * 1e-3,
                    pcie_alone_bytes_per_s=rates.pcie_alone_gbps * 1e9, cpu_alone_bytes_per_s=rates.cpu_alone_gbps * 1e9,
                    fixed_costs=fixed_costs)


def q_star(rates: Rates) -> float:
    """The PCIe fraction of the misses with equal finish times and no fixed costs."""
    return closed_form_fraction(miss_cost(rates))


def layer_ms(rates: Rates, num_misses: int, num_pcie: int, expert_bytes: int) -> float:
    """The modelled time of a layer's misses with `num_pcie` of them copied (`finish_seconds`)."""
    return finish_seconds(num_pcie, num_misses, expert_bytes, miss_cost(rates)) * 1e3


def choose_pcie_count(num_misses: int, expert_bytes: int, rates: Rates, fill_value_s: float = 0.0) -> int:
    """The number of misses to copy over PCIe (the rest go to the CPU): `choose_pcie_misses`."""
    return choose_pcie_misses(num_misses, expert_bytes, miss_cost(rates), fill_value_s)
