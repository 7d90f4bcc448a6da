"""Plain-torch twin of the route-plan kernel: the specification `route_plan` must match bit for bit.

One MoE layer's expert work for a decode step, planned against the global expert cache
(`ExpertCache`: `table` int32 [L*E] key -> slot or -1, `owner` int32 [S] slot -> key or -1,
`last_used` int64 [S]; key = layer * E + expert):

0. with `advance_clock`, `clock` is a device counter [1]: it is moved on by one and the new value
   is the clock below (a decode call's clock kept on the device: nothing for the host to write);
1. dedup the T*K routed ids, keeping first-occurrence order in row-major (t, k) order;
2. classify each unique expert: hit (table[key] >= 0) or miss;
3. hits: last_used[slot] = clock;
4. misses: the first n_pcie = min(misses, n_pcie_max) in unique order (n_pcie_max: a number,
   or a table [M] read at min(misses, M - 1): the split policy's count per miss count) get victim slots, the
   least recently used slots with last_used < clock that are not hit by this call, ties to the
   lowest slot index; the i-th such miss gets the i-th victim. Victims take the new key
   (owner/table; the old owner's table entry becomes -1) and last_used = clock. If fewer slots
   are eligible than n_pcie (say every slot holds an expert this step already used), only those
   are taken and the rest of the misses go to the CPU even though n_pcie_max allows more;
5. the remaining misses are marked for the CPU;
6. on a sample of calls (`rank_sampled(clock)`: one in 32, by a hash of the clock, so no
   layer is always or never sampled), each hit's rank in the LRU order is taken before step 3:
   the number of held slots (0 <= last_used < PINNED_TIME) used more recently than its slot. The
   plan counts the ranked hits and those in the oldest TAIL_FRACTION (a quarter) of the held slots
   (4 * newer >= 3 * held): where a cache's hits fall in its LRU order is what a fill is worth
   against the victim it displaces (policy/miss_split.py, `fill_worth`).

The cache must satisfy table[owner[s]] == s for every owned slot and owner[table[k]] == k for
every cached key on entry; both hold again on exit. `last_used` must lie in
[-2**40, 2**40) and S below 2**21 (the kernel packs (last_used, slot) into one int64);
free slots are those with owner -1 and any last_used below the clock (the cache starts them
at -1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...policy.miss_split import TAIL_FRACTION, rank_sampled

HIT, PCIE, CPU = 0, 1, 2  # status codes; also the indices of their counts in RoutePlan.counts
NUM_UNIQUE = 3  # index of the unique-expert count in RoutePlan.counts
RANKED, TAIL = 4, 5  # of the sampled hits (step 6): how many, and how many in the LRU order's oldest quarter
NUM_COUNTS = 6
PINNED_TIME = (1 << 40) - 1  # a pinned slot's recency on the device: never below the clock, never a victim
MAX_KERNEL_PAIRS = 256  # routed (token, k) pairs the Triton kernel takes in one call (it holds them all in registers)

SLOT_BITS = 21  # the kernel's packed key is last_used * 2**SLOT_BITS + slot
MAX_SLOTS = 1 << SLOT_BITS
MAX_ABS_LAST_USED = 1 << 40


@dataclass(frozen=True)
class RoutePlan:
    """Fixed-size plan for one layer; N = T*K. Rows past counts[NUM_UNIQUE] hold -1.

    unique_ids [N] int32: the distinct experts, first-occurrence order.
    status [N] int32: HIT, PCIE (fill a victim slot, compute on the GPU) or CPU.
    slot [N] int32: the cache slot of a hit or pcie fill; -1 for cpu.
    evicted [N] int32: for a pcie fill, the key its victim slot held (-1 if the slot was free);
        -1 otherwise.
    counts [NUM_COUNTS] int32: (hits, pcie, cpu, unique, ranked hits, tail hits), indexed by HIT,
        PCIE, CPU, NUM_UNIQUE, RANKED, TAIL.
    inverse [T, K] int32: row of unique_ids that expert_ids[t, k] maps to (for the combine).
    pair_slot [T*K] int32: the cache slot pair (t, k) is computed from (slot[inverse[t, k]]), -1
        where its expert runs on the CPU.
    pair_fill [T*K] int32: where pair (t, k)'s expert is a PCIe fill, the expert (its bank row),
        else -1: a decode kernel may fill the slot while it computes (slot_experts' fill_bank).
    """

    unique_ids: torch.Tensor
    status: torch.Tensor
    slot: torch.Tensor
    evicted: torch.Tensor
    counts: torch.Tensor
    inverse: torch.Tensor
    pair_slot: torch.Tensor
    pair_fill: torch.Tensor

    @staticmethod
    def empty(num_tokens: int, top_k: int, device: torch.device | str) -> RoutePlan:
        n = num_tokens * top_k
        i32 = {"dtype": torch.int32, "device": device}
        return RoutePlan(torch.empty(n, **i32), torch.empty(n, **i32), torch.empty(n, **i32),
                         torch.empty(n, **i32), torch.empty(NUM_COUNTS, **i32), torch.empty(num_tokens, top_k, **i32),
                         torch.empty(n, **i32), torch.empty(n, **i32))


def _as_int(x: int | torch.Tensor) -> int:
    return int(x.reshape(-1)[0]) if isinstance(x, torch.Tensor) else int(x)


def route_plan_ref(expert_ids: torch.Tensor, layer: int, num_experts: int, table: torch.Tensor,
                   owner: torch.Tensor, last_used: torch.Tensor, clock: int | torch.Tensor,
                   n_pcie_max: int | torch.Tensor, *, totals: torch.Tensor | None = None,
                   advance_clock: bool = False) -> RoutePlan:
    """Plan one layer (see the module docstring); updates table, owner and last_used in place, and
    adds the counts to `totals` (int64 [NUM_COUNTS]) when given. `advance_clock`: `clock` is a counter tensor
    moved on by one first (step 0).

    Host syncs freely: it is the specification, not the fast path.
    """
    num_tokens, top_k = expert_ids.shape
    n = num_tokens * top_k
    if advance_clock:
        if not isinstance(clock, torch.Tensor) or clock.numel() != 1:
            raise TypeError("route_plan: advance_clock needs the clock as a one-element tensor")
        clock.add_(1)
    clock = _as_int(clock)
    device = expert_ids.device

    ids = expert_ids.reshape(-1).tolist()
    unique: list[int] = []
    row_of: dict[int, int] = {}
    for e in ids:
        if e not in row_of:
            row_of[e] = len(unique)
            unique.append(e)
    inverse = [row_of[e] for e in ids]

    keys = [layer * num_experts + e for e in unique]
    slots = table[torch.tensor(keys, dtype=torch.long, device=table.device)].tolist() if keys else []
    hit_slots = [s for s in slots if s >= 0]
    misses = [u for u, s in enumerate(slots) if s < 0]
    if isinstance(n_pcie_max, torch.Tensor) and n_pcie_max.numel() > 1:
        n_pcie_max = n_pcie_max[min(len(misses), n_pcie_max.numel() - 1)]
    n_pcie_max = max(_as_int(n_pcie_max), 0)

    eligible = last_used < clock
    if hit_slots:
        eligible[torch.tensor(hit_slots, dtype=torch.long, device=eligible.device)] = False
    candidates = torch.nonzero(eligible).reshape(-1)  # ascending slot order
    order = torch.argsort(last_used[candidates], stable=True)  # ties keep the lowest slot first
    n_pcie = min(len(misses), n_pcie_max, candidates.numel())
    victims = candidates[order[:n_pcie]].tolist()

    ranked = tail = 0
    if hit_slots and rank_sampled(clock):
        held = (last_used >= 0) & (last_used < PINNED_TIME)
        hit_used = last_used[torch.tensor(hit_slots, dtype=torch.long, device=last_used.device)]
        newer = (held[None, :] & (last_used[None, :] > hit_used[:, None])).sum(dim=1)  # [hits]
        assert TAIL_FRACTION == 0.25  # the kernel's 4 * newer >= 3 * held
        ranked, tail = len(hit_slots), int((4 * newer >= 3 * held.sum()).sum())

    status = [HIT if s >= 0 else CPU for s in slots]
    evicted = [-1] * len(unique)
    if hit_slots:
        last_used[torch.tensor(hit_slots, dtype=torch.long, device=last_used.device)] = clock
    for u, v in zip(misses[:n_pcie], victims, strict=True):
        old = int(owner[v])
        if old >= 0:
            table[old] = -1
        owner[v] = keys[u]
        table[keys[u]] = v
        last_used[v] = clock
        status[u], slots[u], evicted[u] = PCIE, v, old

    pad = [-1] * (n - len(unique))
    counts = [status.count(HIT), status.count(PCIE), status.count(CPU), len(unique), ranked, tail]

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    if totals is not None:
        totals += torch.tensor(counts, dtype=totals.dtype, device=totals.device)

    return RoutePlan(
        unique_ids=i32(unique + pad),
        status=i32(status + pad),
        slot=i32([s if st != CPU else -1 for s, st in zip(slots, status, strict=True)] + pad),
        evicted=i32(evicted + pad),
        counts=i32(counts),
        inverse=i32(inverse).reshape(num_tokens, top_k),
        pair_slot=i32([slots[u] if status[u] != CPU else -1 for u in inverse]),
        pair_fill=i32([unique[u] if status[u] == PCIE else -1 for u in inverse]),
    )
