"""The route-plan Triton kernel against its torch twin (runtime/gpu/kernels), bit for bit.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py). With
CUDA the same tiny cases run compiled on the GPU, and the `gpu` tests add the real decode
shapes, a CUDA-graph replay and a timing. Without triton the kernel tests skip and the
reference is still checked by hand.
"""

from __future__ import annotations

import random

import pytest
import torch

from runtime.gpu.kernels import CPU, HIT, NUM_UNIQUE, PCIE, PINNED_TIME, RoutePlan, route_plan_ref
from runtime.policy.miss_split import RANK_EVERY, rank_sampled
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

route_plan = import_kernel("route_plan", "route_plan")
needs_triton = needs(route_plan)
PLAN_FIELDS = ("unique_ids", "status", "slot", "evicted", "counts", "inverse", "pair_slot", "pair_fill")


class Cache:
    """The ExpertCache's tensors (table int32 [L*E], owner int32 [S], last_used int64 [S])."""

    def __init__(self, num_layers: int, num_experts: int, num_slots: int, device: str = DEVICE) -> None:
        self.num_experts = num_experts
        self.table = torch.full((num_layers * num_experts,), -1, dtype=torch.int32, device=device)
        self.owner = torch.full((num_slots,), -1, dtype=torch.int32, device=device)
        self.last_used = torch.full((num_slots,), -1, dtype=torch.int64, device=device)

    def put(self, slot: int, layer: int, expert: int, last_used: int) -> None:
        key = layer * self.num_experts + expert
        self.table[key] = slot
        self.owner[slot] = key
        self.last_used[slot] = last_used

    def clone(self) -> Cache:
        other = object.__new__(Cache)
        other.num_experts = self.num_experts
        other.table, other.owner, other.last_used = self.table.clone(), self.owner.clone(), self.last_used.clone()
        return other

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.table, self.owner, self.last_used

    def check_consistent(self) -> None:
        owner = self.owner.tolist()
        table = self.table.tolist()
        for slot, key in enumerate(owner):
            if key >= 0:
                assert table[key] == slot, f"slot {slot} owned by key {key}, but table[{key}] = {table[key]}"
        for key, slot in enumerate(table):
            if slot >= 0:
                assert owner[slot] == key, f"table[{key}] = {slot}, but owner[{slot}] = {owner[slot]}"


def random_cache(rng: random.Random, num_layers: int, num_experts: int, num_slots: int, clock: int,
                 occupancy: float) -> Cache:
    cache = Cache(num_layers, num_experts, num_slots)
    keys = rng.sample(range(num_layers * num_experts), min(num_slots, num_layers * num_experts))
    time_span = rng.choice([1, 3, clock + 1])  # small spans make many ties
    for slot in range(num_slots):
        if slot < len(keys) and rng.random() < occupancy:
            cache.put(slot, keys[slot] // num_experts, keys[slot] % num_experts, rng.randrange(time_span))
        else:
            cache.last_used[slot] = rng.choice([-1, 0, rng.randrange(clock + 1)])
    return cache


def plan_both(cache: Cache, expert_ids: torch.Tensor, layer: int, clock, n_pcie_max) -> tuple[RoutePlan, Cache]:
    """Run kernel and reference on copies of `cache`, assert identical plans and caches; return the kernel's."""
    ref_cache = cache.clone()
    ref = route_plan_ref(expert_ids, layer, cache.num_experts, *ref_cache.args(), clock, n_pcie_max)
    got = route_plan(expert_ids, layer, cache.num_experts, *cache.args(), clock, n_pcie_max)
    for field in PLAN_FIELDS:
        a, b = getattr(got, field), getattr(ref, field)
        assert a.dtype == b.dtype == torch.int32 and a.shape == b.shape, field
        assert torch.equal(a, b), f"{field}: kernel {a.tolist()} vs reference {b.tolist()}"
    for name in ("table", "owner", "last_used"):
        assert torch.equal(getattr(cache, name), getattr(ref_cache, name)), name
    cache.check_consistent()
    return got, cache


def ids(rows: list[list[int]], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype, device=DEVICE)


# --- the reference alone, by hand (runs without triton)


def test_reference_worked_example():
    cache = Cache(3, 8, 6, device="cpu")
    for slot, (layer, expert) in enumerate([(1, 0), (1, 1), (1, 2), (0, 3), (2, 1)]):
        cache.put(slot, layer, expert, slot + 1)  # slot 5 free, last_used -1
    plan = route_plan_ref(torch.tensor([[1, 2, 5, 1], [3, 2, 7, 0]]), 1, 8, *cache.args(), 10, 2)
    assert plan.unique_ids.tolist() == [1, 2, 5, 3, 7, 0, -1, -1]
    assert plan.status.tolist() == [HIT, HIT, PCIE, PCIE, CPU, HIT, -1, -1]
    # victims in LRU order: free slot 5 (last_used -1), then slot 3 (4); slot 4 (5) survives
    assert plan.slot.tolist() == [1, 2, 5, 3, -1, 0, -1, -1]
    assert plan.evicted.tolist() == [-1, -1, -1, 3, -1, -1, -1, -1]  # slot 3 held (layer 0, expert 3)
    assert plan.counts.tolist() == [3, 2, 1, 6, 0, 0]
    assert plan.inverse.tolist() == [[0, 1, 2, 0], [3, 1, 4, 5]]
    assert cache.last_used.tolist() == [10, 10, 10, 10, 5, 10]
    assert cache.table[3].item() == -1 and cache.table[8 + 5].item() == 5 and cache.table[8 + 3].item() == 3
    cache.check_consistent()


# --- kernel vs reference at tiny shapes (interpreted on CPU, compiled on a GPU)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_duplicates_across_tokens(dtype):
    cache = Cache(2, 8, 4)
    cache.put(0, 1, 2, 0)
    plan, _ = plan_both(cache, ids([[3, 1, 3, 2], [1, 5, 3, 2], [5, 5, 5, 5]], dtype), 1, 1, 8)
    assert plan.unique_ids.tolist() == [3, 1, 2, 5] + [-1] * 8
    assert plan.inverse.tolist() == [[0, 1, 0, 2], [1, 3, 0, 2], [3, 3, 3, 3]]
    assert plan.counts[NUM_UNIQUE].item() == 4 and plan.counts[HIT].item() == 1


@needs_triton
def test_all_hits():
    cache = Cache(2, 8, 10)
    for slot, expert in enumerate([4, 0, 7, 2]):
        cache.put(slot + 3, 1, expert, slot)
    before_owner, before_table = cache.owner.clone(), cache.table.clone()
    plan, cache = plan_both(cache, ids([[0, 2, 4, 7]]), 1, 34, 4)
    assert plan.status.tolist() == [HIT] * 4
    assert plan.slot.tolist() == [4, 6, 3, 5]
    # clock 34 ranks its hits: of the 4 held slots, slot 3 (last used at 0) has 3 newer, the oldest quarter
    assert plan.counts.tolist() == [4, 0, 0, 4, 4, 1]
    assert torch.equal(cache.owner, before_owner) and torch.equal(cache.table, before_table)
    assert cache.last_used.tolist() == [-1, -1, -1, 34, 34, 34, 34, -1, -1, -1]


@needs_triton
def test_all_misses_take_free_slots_lowest_first():
    cache = Cache(2, 8, 6)
    plan, cache = plan_both(cache, ids([[6, 1], [2, 6]]), 0, 1, 8)
    assert plan.status.tolist() == [PCIE, PCIE, PCIE, -1]
    assert plan.slot.tolist() == [0, 1, 2, -1]  # equal last_used: lowest slot first
    assert plan.evicted.tolist() == [-1, -1, -1, -1]
    assert cache.owner.tolist() == [6, 1, 2, -1, -1, -1]


@needs_triton
def test_a_cache_of_no_slots_sends_every_miss_to_the_cpu():
    """A budget with no room left gives a cache of no slots: no victim to take, every miss the CPU's."""
    plan, cache = plan_both(Cache(2, 8, 0), ids([[6, 1], [2, 6]]), 0, 1, 8)
    assert plan.status.tolist() == [CPU, CPU, CPU, -1]
    assert plan.slot.tolist() == [-1, -1, -1, -1] and plan.pair_slot.tolist() == [-1] * 4


@needs_triton
@pytest.mark.parametrize("n_pcie_max", [0, 1, 2, 3, 4, 100, -5])
def test_n_pcie_max(n_pcie_max):
    cache = Cache(1, 16, 8)
    for slot in range(8):  # full cache, LRU order 5, 3, 7, 1, ...
        cache.put(slot, 0, slot, [6, 4, 9, 2, 8, 0, 7, 3][slot])
    plan, cache = plan_both(cache, ids([[9, 0, 12, 10], [11, 12, 4, 9]]), 0, 10, n_pcie_max)
    n_pcie = min(max(n_pcie_max, 0), 4)
    assert plan.counts.tolist() == [2, n_pcie, 4 - n_pcie, 6, 0, 0]
    misses = [0, 2, 3, 4]  # rows of 9, 12, 10, 11: the first n_pcie go over PCIe
    assert [plan.status[u].item() for u in misses] == [PCIE] * n_pcie + [CPU] * (4 - n_pcie)
    assert [plan.slot[u].item() for u in misses[:n_pcie]] == [5, 3, 7, 1][:n_pcie]
    assert [plan.evicted[u].item() for u in misses[:n_pcie]] == [5, 3, 7, 1][:n_pcie]


@needs_triton
@pytest.mark.parametrize("table", [[0, 1, 1, 2, 4], [0, 0, 0], [3, 2, 1, 0, 0, 0, 0]])
def test_n_pcie_from_a_table_indexed_by_the_miss_count(table):
    """A device table gives the count per number of misses (read at min(misses, len - 1)):
    the executor's policy for every miss count, chosen without a host sync."""
    cache = Cache(1, 16, 8)
    for slot in range(8):
        cache.put(slot, 0, slot, [6, 4, 9, 2, 8, 0, 7, 3][slot])
    device_table = torch.tensor(table, dtype=torch.int32, device=DEVICE)
    plan, cache = plan_both(cache, ids([[9, 0, 12, 10], [11, 12, 4, 9]]), 0, 10, device_table)
    n_pcie = min(table[min(4, len(table) - 1)], 4)  # 4 misses
    assert plan.counts.tolist() == [2, n_pcie, 4 - n_pcie, 6, 0, 0]


@needs_triton
def test_sampled_calls_rank_their_hits_in_the_lru_order():
    """One call in RANK_EVERY (by a hash of the clock) counts its hits and those among the oldest
    quarter of the held slots, ranked before this call's updates: strictly newer slots count,
    ties do not, and free and pinned slots are not held."""
    assert [c for c in range(100) if rank_sampled(c)] == [0, 34, 68, 89]
    assert abs(sum(map(rank_sampled, range(1 << 16))) / (1 << 16) - 1 / RANK_EVERY) < 1e-3
    cache = Cache(2, 16, 12)
    for slot, last_used in enumerate([1, 1, 2, 3, 4, 4, 6, 7]):  # 8 held slots, experts 0-7 of layer 0
        cache.put(slot, 0, slot, last_used)
    cache.put(8, 1, 0, PINNED_TIME)  # pinned (a lent prefill buffer): never newer, never held
    cache.last_used[9] = -1  # free
    # hits on slots 0 and 1 (tied at 1: 6 newer each, 4 * 6 >= 3 * 8: the tail), 3 (4 newer) and 7 (none)
    plan, _ = plan_both(cache.clone(), ids([[0, 1, 3, 7]]), 0, 34, 4)
    assert plan.counts.tolist() == [4, 0, 0, 4, 4, 2]
    plan, _ = plan_both(cache.clone(), ids([[0, 1, 3, 7, 9]]), 0, 33, 4)  # not sampled; a miss takes slot 9
    assert plan.counts.tolist() == [4, 1, 0, 5, 0, 0]
    plan, _ = plan_both(cache.clone(), ids([[9, 10]]), 1, 34, 0)  # no hits: nothing ranked
    assert plan.counts.tolist() == [0, 0, 2, 2, 0, 0]


@needs_triton
def test_running_totals_add_up_every_plan():
    """`totals` (int64 [NUM_COUNTS]) gets each plan's counts added: the executor's stats
    and hit rate with no launch of their own."""
    cache, ref_cache = Cache(2, 8, 4), Cache(2, 8, 4)
    totals, ref_totals = (torch.tensor([5, 0, 1, 6, 2, 1], dtype=torch.int64, device=DEVICE) for _ in range(2))
    expected = [5, 0, 1, 6, 2, 1]
    for clock, (layer, rows, n_pcie) in enumerate([(0, [[1, 2, 3]], 2), (1, [[1, 4], [2, 1]], 8), (0, [[1, 2]], 0)]):
        got = route_plan(ids(rows), layer, 8, *cache.args(), clock + 1, n_pcie, totals=totals)
        ref = route_plan_ref(ids(rows), layer, 8, *ref_cache.args(), clock + 1, n_pcie, totals=ref_totals)
        assert torch.equal(got.counts, ref.counts)
        expected = [a + b for a, b in zip(expected, ref.counts.tolist(), strict=True)]
        assert totals.tolist() == ref_totals.tolist() == expected


@needs_triton
def test_full_cache_of_this_steps_hits_sends_misses_to_cpu():
    """Every slot holds an expert this step uses: no victim may be taken, whatever n_pcie_max says."""
    cache = Cache(2, 8, 3)
    for slot, expert in enumerate([1, 4, 6]):
        cache.put(slot, 1, expert, 0)
    plan, cache = plan_both(cache, ids([[1, 2, 4], [6, 3, 1]]), 1, 7, 8)
    assert plan.status.tolist()[:5] == [HIT, CPU, HIT, HIT, CPU]
    assert plan.counts.tolist() == [3, 0, 2, 5, 0, 0]
    # slots an earlier layer used in this step (last_used == clock) are just as protected
    cache2 = Cache(2, 8, 4)
    cache2.put(0, 0, 5, 7)
    cache2.put(1, 0, 6, 7)
    cache2.put(2, 1, 1, 3)
    cache2.put(3, 1, 2, 7)
    plan2, _ = plan_both(cache2, ids([[1, 3, 4, 5]]), 1, 7, 8)
    assert plan2.status.tolist() == [HIT, CPU, CPU, CPU]


@needs_triton
def test_victims_leave_this_steps_slots_alone_and_clock_is_monotone():
    """Layers of one step share a clock; over steps the LRU order follows the clock."""
    rng = random.Random(7)
    cache = Cache(4, 8, 10)
    previous = cache.last_used.clone()
    for clock in range(1, 25):
        for layer in range(4):
            expert_ids = ids([rng.sample(range(8), 2) for _ in range(rng.randint(1, 2))])
            before = cache.last_used.clone()
            plan, cache = plan_both(cache, expert_ids, layer, clock, rng.randint(0, 4))
            rows = list(zip(plan.slot.tolist(), plan.status.tolist(), strict=True))
            used = [s for s, st in rows if st in (HIT, PCIE)]
            assert all(before[s].item() < clock for s, st in rows if st == PCIE)
            assert all(cache.last_used[s].item() == clock for s in used)
            assert (cache.last_used <= clock).all()
        assert (cache.last_used >= previous).all()  # nothing ever goes back in time
        previous = cache.last_used.clone()


@needs_triton
def test_device_scalars_and_out_buffers():
    cache = Cache(2, 8, 5)
    cache.put(0, 0, 1, 2)
    cache.put(1, 0, 2, 1)
    ref_cache = cache.clone()
    ref = route_plan_ref(ids([[1, 3, 4, 2]]), 0, 8, *ref_cache.args(), 5, 2)
    out = RoutePlan.empty(1, 4, DEVICE)
    clock = torch.tensor([5], dtype=torch.int64, device=DEVICE)
    n_pcie_max = torch.tensor(2, dtype=torch.int32, device=DEVICE)
    got = route_plan(ids([[1, 3, 4, 2]]), 0, 8, *cache.args(), clock, n_pcie_max, out=out)
    assert got is out
    for field in PLAN_FIELDS:
        assert torch.equal(getattr(got, field), getattr(ref, field)), field
    assert torch.equal(cache.last_used, ref_cache.last_used) and torch.equal(cache.table, ref_cache.table)


@needs_triton
def test_a_clock_counter_is_moved_on_by_each_plan():
    """advance_clock: the plan adds one to the counter and plans with the new value, as the twin does."""
    rng = random.Random(11)
    cache = random_cache(rng, 2, 16, 12, clock=20, occupancy=0.7)
    ref_cache = cache.clone()
    counter = torch.tensor([20], dtype=torch.int64, device=DEVICE)
    ref_counter = counter.clone()
    for step in range(4):
        rows = [rng.sample(range(16), 4)]
        got = route_plan(ids(rows), step % 2, 16, *cache.args(), counter, 2, advance_clock=True)
        ref = route_plan_ref(ids(rows), step % 2, 16, *ref_cache.args(), ref_counter, 2, advance_clock=True)
        assert int(counter) == int(ref_counter) == 21 + step
        for field in PLAN_FIELDS:
            assert torch.equal(getattr(got, field), getattr(ref, field)), (step, field)
        assert torch.equal(cache.last_used, ref_cache.last_used)
        assert int(cache.last_used.max()) == 21 + step
    with pytest.raises(TypeError, match="advance_clock"):
        route_plan(ids([[0]]), 0, 16, *cache.args(), 5, 2, advance_clock=True)
    with pytest.raises(TypeError, match="advance_clock"):
        route_plan_ref(ids([[0]]), 0, 16, *ref_cache.args(), 5, 2, advance_clock=True)


@needs_triton
def test_rejects_bad_arguments():
    cache = Cache(1, 4, 2)
    with pytest.raises(TypeError):
        route_plan(ids([[0]]), 0, 4, cache.table.long(), cache.owner, cache.last_used, 1, 1)
    with pytest.raises(TypeError):
        route_plan(ids([[0]]).float(), 0, 4, *cache.args(), 1, 1)
    with pytest.raises(ValueError):
        route_plan(ids([[0]]), 1, 4, *cache.args(), 1, 1)  # the table holds one layer


@needs_triton
def test_random_against_reference():
    rng = random.Random(1234)
    for case in range(150):
        num_layers, num_experts = rng.randint(1, 4), rng.choice([2, 5, 8, 16, 64])
        num_slots = rng.choice([1, 2, 3, 7, 16, 33, 100])
        num_tokens, top_k = rng.randint(1, 4), rng.randint(1, min(num_experts, 8))
        clock = rng.randint(0, 20)
        cache = random_cache(rng, num_layers, num_experts, num_slots, clock, rng.choice([0.0, 0.5, 1.0]))
        if rng.random() < 0.2:  # repeats within a token too: the kernel must not care
            rows = [[rng.randrange(num_experts) for _ in range(top_k)] for _ in range(num_tokens)]
        else:
            rows = [rng.sample(range(num_experts), top_k) for _ in range(num_tokens)]
        n_pcie_max = rng.choice([0, 1, 3, num_tokens * top_k, 99])
        if rng.random() < 0.3:
            n_pcie_max = torch.tensor([n_pcie_max], device=DEVICE)
        if rng.random() < 0.3:
            clock = torch.tensor(clock, device=DEVICE)
        dtype = rng.choice([torch.int32, torch.int64])
        try:
            plan_both(cache, ids(rows, dtype), rng.randrange(num_layers), clock, n_pcie_max)
        except AssertionError as e:
            raise AssertionError(f"case {case}: {e}") from e


@needs_triton
def test_random_block_loop_against_reference(monkeypatch):
    """Slot counts that need several scan blocks (block_slots 16), with heavy last_used ties."""
    rng = random.Random(99)
    for _case in range(30):
        num_slots = rng.randint(17, 120)
        clock = rng.randint(1, 6)
        cache = random_cache(rng, 3, 32, num_slots, clock, rng.choice([0.5, 1.0]))
        rows = [rng.sample(range(32), 8) for _ in range(rng.randint(1, 4))]
        layer, n_pcie_max = rng.randrange(3), rng.choice([1, 8, 32])
        ref_cache = cache.clone()
        ref = route_plan_ref(ids(rows), layer, 32, *ref_cache.args(), clock, n_pcie_max)
        got = route_plan(ids(rows), layer, 32, *cache.args(), clock, n_pcie_max, block_slots=16)
        for field in PLAN_FIELDS:
            assert torch.equal(getattr(got, field), getattr(ref, field)), field
        assert torch.equal(cache.owner, ref_cache.owner) and torch.equal(cache.last_used, ref_cache.last_used)
        cache.check_consistent()


# --- real decode shapes on the GPU


def _warm_cache(rng: random.Random, num_layers: int, num_experts: int, num_slots: int) -> Cache:
    """Every slot holds an expert, unless there are more slots than experts (then the rest are free)."""
    cache = Cache(num_layers, num_experts, num_slots, device="cuda")
    keys = rng.sample(range(num_layers * num_experts), min(num_slots, num_layers * num_experts))
    table = torch.full((num_layers * num_experts,), -1, dtype=torch.int32)
    table[torch.tensor(keys)] = torch.arange(len(keys), dtype=torch.int32)
    cache.table.copy_(table)
    cache.owner[: len(keys)] = torch.tensor(keys, dtype=torch.int32)
    cache.last_used.copy_(torch.tensor([rng.randrange(50) for _ in range(num_slots)], dtype=torch.int64))
    return cache


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_layers,num_experts,num_tokens,num_slots",
                         [(48, 128, 1, 3000), (48, 128, 4, 3000), (61, 384, 4, 20000)])
def test_gpu_real_shapes(num_layers, num_experts, num_tokens, num_slots):
    top_k = 8
    rng = random.Random(num_tokens * 7 + num_slots)
    cache = _warm_cache(rng, num_layers, num_experts, num_slots)
    for clock in range(50, 56):  # whole steps: every layer against the reference
        for layer in range(num_layers):
            rows = [rng.sample(range(num_experts), top_k) for _ in range(num_tokens)]
            plan_both(cache, torch.tensor(rows, device="cuda"), layer, clock, rng.choice([0, 2, 8, 32]))

    # Timing: a CUDA graph of one step (every layer: draw new ids, advance the clock, plan), so
    # each call sees fresh misses and the GPU, not the launching host, is the bottleneck; the same
    # graph without route_plan is subtracted.
    expert_ids = torch.zeros(num_tokens, top_k, dtype=torch.int64, device="cuda")
    clock = torch.tensor([1000], dtype=torch.int64, device="cuda")
    n_pcie_max = torch.tensor([top_k], dtype=torch.int32, device="cuda")
    out = RoutePlan.empty(num_tokens, top_k, "cuda")
    route_plan(expert_ids, 0, num_experts, *cache.args(), clock, n_pcie_max, out=out)  # compile

    def step(with_plan: bool) -> None:
        for layer in range(num_layers):
            torch.randint(0, num_experts, (num_tokens, top_k), out=expert_ids)
            clock.add_(1)
            if with_plan:
                route_plan(expert_ids, layer, num_experts, *cache.args(), clock, n_pcie_max, out=out)

    replays, step_us = 20, {}
    for with_plan in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(with_plan)
        graph.replay()
        torch.cuda.synchronize()
        start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start_event.record()
        for _ in range(replays):
            graph.replay()
        end_event.record()
        torch.cuda.synchronize()
        step_us[with_plan] = start_event.elapsed_time(end_event) / replays * 1e3
    per_call_us = (step_us[True] - step_us[False]) / num_layers
    print(f"\nroute_plan T={num_tokens} K={top_k} S={num_slots}: {per_call_us:.1f} us per call in a CUDA graph "
          f"(n_pcie_max={top_k}, uniform random ids)")
    cache.check_consistent()


@pytest.mark.gpu
@needs_triton
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_graph_replay_with_new_clock_and_policy():
    """Captured once; clock and n_pcie_max changed between replays; each replay equals the reference."""
    num_layers, num_experts, num_slots, top_k = 48, 128, 3000, 8
    rng = random.Random(5)
    cache = _warm_cache(rng, num_layers, num_experts, num_slots)
    expert_ids = torch.zeros(1, top_k, dtype=torch.int64, device="cuda")
    clock = torch.tensor([100], dtype=torch.int64, device="cuda")
    n_pcie_max = torch.tensor([2], dtype=torch.int32, device="cuda")
    out = RoutePlan.empty(1, top_k, "cuda")
    layer = 7
    route_plan(expert_ids, layer, num_experts, *cache.clone().args(), clock, n_pcie_max, out=out)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        route_plan(expert_ids, layer, num_experts, *cache.args(), clock, n_pcie_max, out=out)
    for step in range(20):
        expert_ids.copy_(torch.tensor([rng.sample(range(num_experts), top_k)]))
        clock.fill_(101 + step)
        n_pcie_max.fill_(rng.choice([0, 1, 4, 8]))
        ref_cache = cache.clone()
        ref = route_plan_ref(expert_ids, layer, num_experts, *ref_cache.args(), clock, n_pcie_max)
        graph.replay()
        torch.cuda.synchronize()
        for field in PLAN_FIELDS:
            assert torch.equal(getattr(out, field), getattr(ref, field)), (step, field)
        for name in ("table", "owner", "last_used"):
            assert torch.equal(getattr(cache, name), getattr(ref_cache, name)), (step, name)
    cache.check_consistent()
