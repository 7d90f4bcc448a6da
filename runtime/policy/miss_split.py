"""How one MoE layer's cache misses are served: copied over PCIe and computed on the GPU, or computed
on the CPU straight from the host bank (DESIGN.md §5). Pure functions of a measured `MissCost`; the
one policy behind both the trace simulator (cache_policy.py) and the GPU executor's "auto" mode
(gpu/executor.py, through gpu/split.py, which turns a BandwidthProfile into a MissCost).

With q of a layer's m misses copied, each side's per-expert work overlaps the other's:

    pcie_work(q)     = q * (expert_bytes / p + copy_overhead_s)
    cpu_work(m - q)  = (m - q) * expert_bytes / c
    fixed            = pcie_overhead_s if q > 0,  cpu_overhead_s if m - q > 0

p and c are the rates while both sides run (they share host DRAM); a side whose partner has no work
runs at its `*_alone` rate where one was measured. How the fixed costs compose is the `fixed_costs`
choice, after what the fixed costs are:

    "overlap" (the simulator's, and the executor's device-timed profile): each fixed cost runs
              beside the other side,
              finish_s(q) = max(pcie fixed + pcie_work, cpu fixed + cpu_work)
    "serial"  fixed costs that are host work one thread does one after the other (planning,
              launches, the hand-off to the CPU worker), as profiles timed with the launches in
              them measure it,
              finish_s(q) = pcie fixed + cpu fixed + max(pcie_work, cpu_work)

Without fixed costs, equal finish times give the paper's fraction q*/m = p / (p + c). That ratio alone
is what made the reference system's hybrid mode slower than plain offload: for the few misses of one
decode step the CPU's fixed cost (waking the threads, syncing) dominates. `choose_pcie_misses` starts
from the crossing point with the fixed costs included and picks the integer split with the smallest
cost, all-PCIe and all-CPU included, so it is never slower than either fixed policy for the step.

A step is not the whole story: a miss computed on the CPU is not cached, so it misses again when the
next token wants it (38% next-token reuse). Replaying the real traces, a split that only minimised
each step re-missed its CPU-served experts and ended slower than plain offload once the cache was
large. So each CPU-served miss is also charged `fill_value_s`, the expected cost of that later miss:
the cache's recent hit rate (the chance a cached copy is used again before eviction) times the least a
lone miss costs (`fill_value_seconds`). 0 (the default) minimises the step alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FIXED_COSTS = ("overlap", "serial")


@dataclass(frozen=True)
class MissCost:
    """Measured rates of the two miss paths on one machine: bytes per second while both run, and
    (0: the same) with the other side idle; fixed costs in seconds, composed as `fixed_costs` says."""

    pcie_bytes_per_s: float  # pinned host -> GPU copy rate, p
    cpu_bytes_per_s: float  # expert bytes the CPU kernels get through per second, c
    cpu_overhead_s: float = 0.0  # fixed cost of a layer call that computes anything on the CPU
    copy_overhead_s: float = 0.0  # fixed cost of one expert copy (launch, event)
    pcie_overhead_s: float = 0.0  # fixed cost of a layer call that copies anything
    pcie_alone_bytes_per_s: float = 0.0  # p with the CPU side idle (0: p)
    cpu_alone_bytes_per_s: float = 0.0  # c with the PCIe side idle (0: c)
    fixed_costs: str = "overlap"  # "overlap" or "serial": see the module docstring

    def __post_init__(self) -> None:
        if self.pcie_bytes_per_s <= 0 or self.cpu_bytes_per_s <= 0:
            raise ValueError(f"rates must be positive: p={self.pcie_bytes_per_s}, c={self.cpu_bytes_per_s}")
        if self.pcie_alone_bytes_per_s < 0 or self.cpu_alone_bytes_per_s < 0:
            raise ValueError(f"alone rates must be >= 0 (0: not measured): {self.pcie_alone_bytes_per_s}, "
                             f"{self.cpu_alone_bytes_per_s}")
        if min(self.cpu_overhead_s, self.copy_overhead_s, self.pcie_overhead_s) < 0:
            raise ValueError(f"overheads must be >= 0: {self.cpu_overhead_s}, {self.copy_overhead_s}, "
                             f"{self.pcie_overhead_s}")
        if self.fixed_costs not in FIXED_COSTS:
            raise ValueError(f"fixed_costs is one of {', '.join(FIXED_COSTS)}, not {self.fixed_costs!r}")


def closed_form_fraction(cost: MissCost) -> float:
    """q*/m = p / (p + c): the share of misses to copy when the fixed costs are ignored."""
    return cost.pcie_bytes_per_s / (cost.pcie_bytes_per_s + cost.cpu_bytes_per_s)


def pcie_seconds(num_pcie: int, expert_bytes: int, cost: MissCost, *, alone: bool = False) -> float:
    """The PCIe side's time for `num_pcie` copies, its fixed cost included (0 copies: 0)."""
    if num_pcie <= 0:
        return 0.0
    rate = cost.pcie_alone_bytes_per_s if alone and cost.pcie_alone_bytes_per_s else cost.pcie_bytes_per_s
    return num_pcie * (expert_bytes / rate + cost.copy_overhead_s) + cost.pcie_overhead_s


def cpu_seconds(num_cpu: int, expert_bytes: int, cost: MissCost, *, alone: bool = False) -> float:
    """The CPU side's time for `num_cpu` experts, its fixed cost included (0 experts: 0)."""
    if num_cpu <= 0:
        return 0.0
    rate = cost.cpu_alone_bytes_per_s if alone and cost.cpu_alone_bytes_per_s else cost.cpu_bytes_per_s
    return num_cpu * expert_bytes / rate + cost.cpu_overhead_s


def finish_seconds(num_pcie: int, num_misses: int, expert_bytes: int, cost: MissCost) -> float:
    """When the layer's misses are done with `num_pcie` of `num_misses` copied and the rest on the CPU."""
    if not 0 <= num_pcie <= num_misses:
        raise ValueError(f"num_pcie must be in [0, {num_misses}], not {num_pcie}")
    num_cpu = num_misses - num_pcie
    alone = num_pcie == 0 or num_cpu == 0  # one side idle: it does not slow the other
    pcie = pcie_seconds(num_pcie, expert_bytes, cost, alone=alone)
    cpu = cpu_seconds(num_cpu, expert_bytes, cost, alone=alone)
    if cost.fixed_costs == "overlap":
        return max(pcie, cpu)
    fixed_pcie = cost.pcie_overhead_s if num_pcie else 0.0
    fixed_cpu = cost.cpu_overhead_s if num_cpu else 0.0
    return fixed_pcie + fixed_cpu + max(pcie - fixed_pcie, cpu - fixed_cpu)


def crossing_point(num_misses: int, expert_bytes: int, cost: MissCost) -> float:
    """The real q where both sides finish together, fixed costs included (clamped to [0, m]).

    q * a + o_p = (m - q) * b + o_c  with  a = B/p + copy_overhead_s,  b = B/c,  o_* the fixed costs
    that run beside the other side (both 0 with "serial"); with no fixed costs this is m * p / (p + c)."""
    a = expert_bytes / cost.pcie_bytes_per_s + cost.copy_overhead_s
    b = expert_bytes / cost.cpu_bytes_per_s
    beside = cost.cpu_overhead_s - cost.pcie_overhead_s if cost.fixed_costs == "overlap" else 0.0
    q = (num_misses * b + beside) / (a + b) if a + b > 0 else float(num_misses)
    return min(max(q, 0.0), float(num_misses))


def fill_value_seconds(hit_rate: float, expert_bytes: int, cost: MissCost) -> float:
    """Expected time a copy saves later: P(used again while cached) x the least a lone miss costs."""
    alone = min(finish_seconds(1, 1, expert_bytes, cost), finish_seconds(0, 1, expert_bytes, cost))
    return min(max(hit_rate, 0.0), 1.0) * alone


def choose_pcie_misses(num_misses: int, expert_bytes: int, cost: MissCost, fill_value_s: float = 0.0) -> int:
    """q*: how many of one layer's `num_misses` misses to copy over PCIe; the rest run on the CPU.

    Minimises finish_s(q) + (m - q) * fill_value_s. For 0 < q < m (both sides busy, fixed costs
    constant) finish_s is the max of a rising and a falling line in q and the second term falls
    linearly, so the best such integer is next to the crossing point or at q = m - 1; the ends
    q = 0 and q = m (one side idle: no fixed cost of the other, the alone rates) are checked
    apart. Ties go to more PCIe: copied experts stay in the cache for the next token."""
    if num_misses < 0:
        raise ValueError(f"num_misses must be >= 0, not {num_misses}")
    if num_misses == 0:
        return 0
    q = crossing_point(num_misses, expert_bytes, cost)
    inner = {min(max(n, 1), num_misses - 1) for n in (math.floor(q), math.ceil(q), num_misses - 1)}
    candidates = {0, num_misses} | (inner if num_misses > 1 else set())

    def total(n: int) -> tuple[float, int]:
        return finish_seconds(n, num_misses, expert_bytes, cost) + (num_misses - n) * fill_value_s, -n

    return min(candidates, key=total)


def naive_pcie_misses(num_misses: int, cost: MissCost) -> int:
    """round(m * p / (p + c)): the ratio that ignores the fixed costs. A baseline, not for use."""
    return round(num_misses * closed_form_fraction(cost))
