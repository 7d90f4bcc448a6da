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
what a copy is worth (`fill_worth`) times the least a lone miss costs (`fill_value_seconds`). 0 (the
default) minimises the step alone.

A copy's worth is not the hit rate alone. In a full cache it evicts the least recently used entry,
whose own later hits are lost: where routing is flat (uniformly random ids, as llama-bench feeds),
the victim is as likely to be wanted as the newcomer, a copy gains nothing, and charging the CPU
the hit rate sent 58% of the misses over PCIe whatever the CPU's speed (the race at 6 and 8 threads:
the same split, llama.cpp 47% faster at 8). With a cache of S entries and hit rate h(S), the
newcomer's chance of a hit before eviction is about h, and the victim's about S * h'(S): the hits
that one more slot at the old end of the LRU order would catch. The route plan samples where hits
fall in that order (route_plan_ref step 6), so S * h'(S) / h is the hit density of the oldest
TAIL_FRACTION against the mean: 1 for flat routing, near 0 where a few experts take most hits.
Worth = h * (1 - that ratio), clamped to [0, h].

Which price runs is a choice (`FILL_PRICING`); "worth" is the default (DEFAULT_FILL_PRICING) since
2026-12-07, "hit_rate" the way back (FT_FILL_PRICING=hit_rate). On the H100 at the race's Q4_K_M
-ncmoe 8 budget, the hit rate priced every CPU-served miss above a copy and auto sent 2% of the
misses to the CPU, whose kernel streams Q4_K_M faster than the link (BENCHMARKS.md). Replayed (benchmarks/bench_fill_value.py, the H200's 8-thread
profile), "worth" cut the modelled miss time by 6.6% on uniform routing at the race's -ncmoe 8
cache and added 0.5-3.8% on the real Qwen3-30B-A3B trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FIXED_COSTS = ("overlap", "serial")
FILL_PRICING = ("hit_rate", "worth")  # what a CPU-served miss is charged at: the hit rate, or `fill_worth`
DEFAULT_FILL_PRICING = "worth"
TAIL_FRACTION = 0.25  # the LRU order's oldest share whose hits are counted (route_plan_ref step 6)
RANK_EVERY = 32  # one layer call in this many ranks its hits (each costs the route plan ~15 us at 3208 slots)


def rank_sampled(clock: int) -> bool:
    """Whether the layer call at `clock` ranks its hits (the route plan and the simulator alike):
    the top bits of a 16-bit Fibonacci hash of the clock, one call in RANK_EVERY. (A period of the
    clock would sample the same layers every token.)"""
    return ((clock & 0xFFFF) * 40503 & 0xFFFF) >> 11 == 0


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


def fill_worth(hit_rate: float, ranked_hits: float = 0.0, tail_hits: float = 0.0) -> float:
    """What a copy into a full LRU cache is worth, in later hits: the hit rate less the victim's
    share of it (the module docstring). `ranked_hits` hits had their LRU rank sampled, `tail_hits`
    of them fell in the oldest TAIL_FRACTION; none ranked: the hit rate itself."""
    if ranked_hits <= 0:
        return min(max(hit_rate, 0.0), 1.0)
    displaced = tail_hits / ranked_hits / TAIL_FRACTION
    return min(max(hit_rate * (1.0 - displaced), 0.0), 1.0)


def fill_value_seconds(worth: float, expert_bytes: int, cost: MissCost) -> float:
    """Expected time a copy saves later: its `worth` (`fill_worth`: later hits, net of the victim's)
    x the least a lone miss costs."""
    alone = min(finish_seconds(1, 1, expert_bytes, cost), finish_seconds(0, 1, expert_bytes, cost))
    return min(max(worth, 0.0), 1.0) * alone


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
