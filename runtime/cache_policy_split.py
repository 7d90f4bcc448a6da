"""How one MoE layer's cache misses are served: copied over PCIe and computed on the GPU, or computed
on the CPU straight from the host bank (DESIGN.md §5). Pure functions of a measured `MissCost`.

The two sides run at once, so a layer's misses are done when the slower side is:

    pcie_s(q)    = q * (expert_bytes / p + copy_overhead_s)           q misses copied
    cpu_s(m - q) = (m - q) * expert_bytes / c + cpu_overhead_s         only when m - q > 0
    finish_s(q)  = max(pcie_s(q), cpu_s(m - q))

Without fixed costs, equal finish times give the paper's fraction q*/m = p / (p + c). That ratio alone
is what made the reference system's hybrid mode slower than plain offload: for the few misses of one
decode step the CPU's fixed cost (waking the threads, syncing) dominates. `choose_pcie_misses` starts
from the crossing point with the fixed costs included and picks the integer split with the smallest
finish time, all-PCIe and all-CPU included, so it is never slower than either fixed policy for the step.

A step is not the whole story: a miss computed on the CPU is not cached, so it misses again when the
next token wants it (38% next-token reuse). Replaying the real traces, a split that only minimised
each step re-missed its CPU-served experts and ended slower than plain offload once the cache was
large. So each CPU-served miss is also charged `fill_value_s`, the expected cost of that later miss:
the cache's recent hit rate (the chance a cached copy is used again before eviction) times the least a
lone miss costs (`fill_value_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MissCost:
    """Measured rates of the two miss paths on one machine (measured while both run)."""

    pcie_bytes_per_s: float  # pinned host -> GPU copy rate, p
    cpu_bytes_per_s: float  # expert bytes the CPU kernels get through per second, c
    cpu_overhead_s: float = 0.0  # fixed cost of a step that computes anything on the CPU
    copy_overhead_s: float = 0.0  # fixed cost of one expert copy (launch, event)

    def __post_init__(self) -> None:
        if self.pcie_bytes_per_s <= 0 or self.cpu_bytes_per_s <= 0:
            raise ValueError(f"rates must be positive: p={self.pcie_bytes_per_s}, c={self.cpu_bytes_per_s}")
        if self.cpu_overhead_s < 0 or self.copy_overhead_s < 0:
            raise ValueError(f"overheads must be >= 0: {self.cpu_overhead_s}, {self.copy_overhead_s}")


def closed_form_fraction(cost: MissCost) -> float:
    """q*/m = p / (p + c): the share of misses to copy when the fixed costs are ignored."""
    return cost.pcie_bytes_per_s / (cost.pcie_bytes_per_s + cost.cpu_bytes_per_s)


def pcie_seconds(num_pcie: int, expert_bytes: int, cost: MissCost) -> float:
    return num_pcie * (expert_bytes / cost.pcie_bytes_per_s + cost.copy_overhead_s)


def cpu_seconds(num_cpu: int, expert_bytes: int, cost: MissCost) -> float:
    return num_cpu * expert_bytes / cost.cpu_bytes_per_s + cost.cpu_overhead_s if num_cpu > 0 else 0.0


def finish_seconds(num_pcie: int, num_misses: int, expert_bytes: int, cost: MissCost) -> float:
    """When the layer's misses are done with `num_pcie` of `num_misses` copied and the rest on the CPU."""
    if not 0 <= num_pcie <= num_misses:
        raise ValueError(f"num_pcie must be in [0, {num_misses}], not {num_pcie}")
    return max(pcie_seconds(num_pcie, expert_bytes, cost), cpu_seconds(num_misses - num_pcie, expert_bytes, cost))


def crossing_point(num_misses: int, expert_bytes: int, cost: MissCost) -> float:
    """The real q where both sides finish together, fixed costs included (clamped to [0, m]).

    q * a = (m - q) * b + o  with  a = B/p + copy_overhead_s,  b = B/c,  o = cpu_overhead_s;
    with no fixed costs this is m * p / (p + c)."""
    a = expert_bytes / cost.pcie_bytes_per_s + cost.copy_overhead_s
    b = expert_bytes / cost.cpu_bytes_per_s
    q = (num_misses * b + cost.cpu_overhead_s) / (a + b) if a + b > 0 else float(num_misses)
    return min(max(q, 0.0), float(num_misses))


def fill_value_seconds(hit_rate: float, expert_bytes: int, cost: MissCost) -> float:
    """Expected time a copy saves later: P(used again while cached) x the least a lone miss costs."""
    alone = min(pcie_seconds(1, expert_bytes, cost), cpu_seconds(1, expert_bytes, cost))
    return min(max(hit_rate, 0.0), 1.0) * alone


def choose_pcie_misses(num_misses: int, expert_bytes: int, cost: MissCost, fill_value_s: float = 0.0) -> int:
    """q*: how many of one layer's `num_misses` misses to copy over PCIe; the rest run on the CPU.

    Minimises finish_s(q) + (m - q) * fill_value_s. finish_s is the max of a rising and a falling
    function of q and the second term falls linearly, so the best integer is next to the crossing
    point, or all-PCIe (the CPU side may not pay for its fixed cost, or the fills are worth more).
    Ties go to more PCIe: copied experts stay in the cache for the next token."""
    if num_misses < 0:
        raise ValueError(f"num_misses must be >= 0, not {num_misses}")
    if num_misses == 0:
        return 0
    q = crossing_point(num_misses, expert_bytes, cost)
    candidates = {math.floor(q), math.ceil(q), num_misses}

    def total(n: int) -> tuple[float, int]:
        return finish_seconds(n, num_misses, expert_bytes, cost) + (num_misses - n) * fill_value_s, -n

    return min(candidates, key=total)


def naive_pcie_misses(num_misses: int, cost: MissCost) -> int:
    """round(m * p / (p + c)): the ratio that ignores the fixed costs. A baseline, not for use."""
    return round(num_misses * closed_form_fraction(cost))
