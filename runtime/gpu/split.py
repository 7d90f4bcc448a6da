"""The executor's side of the q* split: a measured BandwidthProfile as the one cost model's MissCost.

The policy itself (how many of a layer's misses cross PCIe, the rest running on the CPU) is
runtime/policy/miss_split.py, shared with the trace simulator. What is particular to the GPU
path is only how its profile reads: rates in GB/s while both sides run and each side alone (0:
not measured), and fixed costs in ms measured on the device through the executor (measure_bandwidth.py),
without the launching thread's time: the plan and fill's latency on the PCIe side, the hand-off
to the CPU worker and back on the other. The two run beside each other (the fills go on while
the worker computes), so they compose as the simulator's: `fixed_costs="overlap"`.

Until profile version 5 the fixed costs were timed with the host's launches in them, host work
done one side after the other, and composed "serial"; on the H200 that charged the CPU share
0.3-0.7 ms a call where its pipeline costs ~0.09 ms (docs/benchmark-history.md, fifth session). Where the
host's launches do bound a step (few misses, a large cache), auto's guard times whole steps and
falls back to plain offload.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from ..policy.miss_split import (
    DEFAULT_FILL_PRICING,
    FILL_PRICING,
    MissCost,
    choose_pcie_misses,
    closed_form_fraction,
    fill_value_seconds,
    finish_seconds,
)
from .executor_stats import RecentHitRate

Split = Callable[[int, int], int]  # (number of misses, bytes per expert) -> how many cross PCIe


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


class SplitTables:
    """How many of a decode call's misses the route plan may copy over PCIe, the rest going to
    the CPU: the executor's policy, asked once per call. "offload" copies all, the CPU-served
    modes none; "auto" gives `split` (default: the profile's cost model, each CPU-served miss
    charged the later miss it causes at the recent hit rate) as a device table indexed by the
    number of misses, so the choice is made on the device. A table is made once per (split,
    pairs, expert bytes, hit rate in 1/64 steps) and kept; CUDA graphs read a copy of fixed
    address per (expert bytes, table size) (`fixed`), refreshed when the table changes."""

    def __init__(self, mode: str, split: Split | None, profile: Rates | None, device: torch.device,
                 pricing: str = DEFAULT_FILL_PRICING) -> None:
        if pricing not in FILL_PRICING:
            raise ValueError(f"fill pricing is one of {', '.join(FILL_PRICING)}, not {pricing!r}")
        self.mode, self.device, self.pricing = mode, device, pricing
        self._cost = miss_cost(profile) if profile is not None else None
        self.split = split or (self._profile_split if mode == "auto" and self._cost is not None else None)
        self.hit_rate = RecentHitRate(device)  # observed by the executor, call by call
        self._tables: dict[tuple, tuple[torch.Tensor, bool]] = {}  # -> (table, sends any miss to the CPU)
        # (expert bytes, table size) -> (graphs' copy, its source)
        self._fixed: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def for_call(self, num_pairs: int, expert_bytes: int) -> tuple[int | torch.Tensor, bool]:
        """How many misses the plan may copy, and whether any miss may go to the CPU: a number
        for the fixed modes; for "auto" the device table by miss count."""
        if self.mode == "offload":
            return num_pairs, False
        if self.mode != "auto" or self.split is None:
            return 0, True
        worth = self.fill_price
        key = (self.split, num_pairs, expert_bytes, round(worth * 64) if self.device.type == "cuda" else worth)
        entry = self._tables.get(key)
        if entry is None:
            if len(self._tables) > 256:
                self._tables.clear()
            counts = [max(0, min(m, self.split(m, expert_bytes))) if m else 0 for m in range(num_pairs + 1)]
            uses_cpu = any(c < m for m, c in enumerate(counts))
            staged = torch.tensor(counts, dtype=torch.int32, device="cpu", pin_memory=self.device.type == "cuda")
            entry = self._tables[key] = (staged.to(self.device, non_blocking=True), uses_cpu)  # no host wait
        return entry

    def fixed(self, table: torch.Tensor, expert_bytes: int) -> torch.Tensor:
        """`table` (for experts of `expert_bytes`) where a CUDA graph can read it: one buffer of
        fixed address per expert size and table size, copied into when the table changes (the
        split or the hit rate moved), not once per call. (By size alone, a captured step over
        layers of two expert sizes would read one size's table for both.)"""
        key = (expert_bytes, table.numel())
        fixed, source = self._fixed.get(key, (None, None))
        if fixed is None:
            fixed = torch.empty_like(table)
        if source is not table:
            fixed.copy_(table)
            self._fixed[key] = (fixed, table)
        return fixed

    def fixed_if_current(self, table: torch.Tensor, expert_bytes: int) -> torch.Tensor | None:
        """The graphs' copy of `table` where it holds `table` now, else None (inside a capture:
        `fixed`'s copy would be captured too, and rewrite the copy with this table at every replay)."""
        fixed, source = self._fixed.get((expert_bytes, table.numel()), (None, None))
        return fixed if source is table else None

    @property
    def fill_price(self) -> float:
        """What a copy is worth to the split: the recent hit rate, or with pricing "worth" that less
        the victim's share."""
        return self.hit_rate.fill_worth if self.pricing == "worth" else self.hit_rate.value

    def _profile_split(self, num_misses: int, expert_bytes: int) -> int:
        """The "auto" count from the profile, CPU-served misses charged their expected re-miss."""
        assert self._cost is not None
        fill_value_s = fill_value_seconds(self.fill_price, expert_bytes, self._cost)
        return choose_pcie_misses(num_misses, expert_bytes, self._cost, fill_value_s)
