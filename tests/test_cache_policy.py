"""Expert-cache policies on hand-made routing with known answers, the q* chooser, the trace loader,
and (when shared/traces/ is present) our replay against the trace repository's own."""

from __future__ import annotations

import csv
import itertools
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from runtime.policy.expert_cache import (
    GlobalLRU,
    PrefillPlacement,
    StaticLayerSplit,
    automatic,
    cpu_only_misses,
    naive_hybrid,
    offload_only,
    preload_steps,
    replay,
)
from runtime.policy.miss_split import (
    MissCost,
    choose_pcie_misses,
    closed_form_fraction,
    crossing_point,
    fill_value_seconds,
    finish_seconds,
    naive_pcie_misses,
)
from runtime.policy.reference import LFU, Belady
from runtime.policy.trace import RoutingTrace, Schedule, TraceError, load_trace

REPO = Path(__file__).resolve().parents[1]
TRACES = next((p for p in (REPO / "shared" / "traces", REPO.parent / "shared" / "traces") if p.is_dir()), None)
needs_traces = pytest.mark.skipif(TRACES is None, reason="shared/traces/ not checked out")


def make_trace(decode: list[list[list[int]]], prefill: list[list[list[int]]] = (), num_experts: int = 8,
               expert_bytes: int = 100) -> RoutingTrace:
    """decode[t][layer] = that token's expert ids (rows padded with -1 to one K)."""
    tokens = [*prefill, *decode]
    layers = len(tokens[0])
    k = max(len(ids) for token in tokens for ids in token)
    experts = np.full((len(tokens), layers, k), -1, dtype=np.int32)
    for t, token in enumerate(tokens):
        for layer, ids in enumerate(token):
            experts[t, layer, : len(ids)] = ids
    phase = np.array([0] * len(prefill) + [1] * len(decode), dtype=np.int8)
    return RoutingTrace("hand", experts, phase, num_experts, np.full(layers, expert_bytes, dtype=np.int64))


def feed(policy, steps):
    return [policy.access(layer, ids) for layer, ids in steps]


# -- global LRU -------------------------------------------------------------------------------------

def test_lru_evicts_least_recently_used_across_layers() -> None:
    lru = GlobalLRU(3)
    assert feed(lru, [(0, [1, 2]), (1, [1])]) == [(0, 2), (0, 1)]
    assert lru.lru_order() == [(0, 1), (0, 2), (1, 1)]
    assert lru.access(0, [1]) == (1, 0)  # refreshes (0, 1)
    assert lru.lru_order() == [(0, 2), (1, 1), (0, 1)]
    assert lru.access(2, [5]) == (0, 1)  # evicts (0, 2), the least recent, whatever its layer
    assert lru.lru_order() == [(1, 1), (0, 1), (2, 5)]
    assert (lru.reads, lru.hits, lru.misses, lru.pcie_fills, lru.cpu_misses) == (5, 1, 4, 4, 0)


def test_lru_never_evicts_what_the_current_step_needs() -> None:
    lru = GlobalLRU(2)
    feed(lru, [(0, [1]), (0, [2])])
    # (0, 1) is the LRU victim, but this step needs it: (0, 2) can't go either, so 3 is not cached
    assert lru.access(0, [1, 2, 3]) == (2, 1)
    assert lru.resident() == {(0, 1), (0, 2)}
    lru = GlobalLRU(2)
    assert lru.access(0, [4, 5, 6]) == (0, 3)  # more distinct experts than slots: the first two stay
    assert lru.resident() == {(0, 4), (0, 5)} and lru.pcie_fills == 3


def test_lru_dedups_and_ignores_absent_cells() -> None:
    lru = GlobalLRU(4)
    assert lru.access(0, [3, 3, -1, 2]) == (0, 2)
    assert lru.reads == 2 and lru.resident() == {(0, 3), (0, 2)}


def test_lru_zero_capacity_misses_everything() -> None:
    lru = GlobalLRU(0)
    assert feed(lru, [(0, [1]), (0, [1])]) == [(0, 1), (0, 1)]


def test_lru_byte_budget_counts_each_layers_expert_size() -> None:
    lru = GlobalLRU(250, sizes=[100, 50])
    feed(lru, [(0, [1]), (1, [1]), (1, [2]), (1, [3])])  # 100 + 3 x 50 = 250
    assert lru.resident() == {(0, 1), (1, 1), (1, 2), (1, 3)}
    lru.access(0, [2])  # 100 more: evicts (0, 1) [100] -> 250 again
    assert lru.resident() == {(1, 1), (1, 2), (1, 3), (0, 2)}
    lru.access(0, [3])  # evicts (1, 1) and (1, 2)
    assert lru.resident() == {(1, 3), (0, 2), (0, 3)}


def test_split_decides_what_is_copied_and_cpu_only_never_changes_the_cache() -> None:
    half = GlobalLRU(10, split=lambda layer, misses, hit_rate: misses // 2)
    assert half.access(0, [1, 2, 3, 4]) == (0, 4)
    assert half.resident() == {(0, 1), (0, 2)}  # the first in rank order are copied
    assert (half.pcie_fills, half.cpu_misses) == (2, 2)
    cpu = cpu_only_misses(10)
    cpu.warm(0, [1])  # the prompt fills as prefill would
    assert feed(cpu, [(0, [1, 2]), (0, [2])]) == [(1, 1), (0, 1)]
    assert cpu.resident() == {(0, 1)} and cpu.pcie_fills == 0 and cpu.cpu_misses == 2
    off = offload_only(10)
    assert feed(off, [(0, [1, 2]), (0, [2])]) == [(0, 2), (1, 0)]


def test_recent_hit_rate_follows_the_counted_steps() -> None:
    lru = GlobalLRU(10, split=lambda layer, misses, hit_rate: misses)
    lru.warm(0, [1])
    assert lru.recent_hit_rate == 0.0  # warm steps are not counted
    feed(lru, [(0, [1, 2]), (0, [1, 2])])
    assert lru.recent_hit_rate == pytest.approx((0.999 * 1 + 2) / (0.999 * 2 + 2))


# -- static split, prefill placement ----------------------------------------------------------------

def test_static_split_keeps_whole_layers_in_order() -> None:
    split = StaticLayerSplit(20, num_experts=8, num_layers=4)  # 2.5 layers of slots: 2 whole layers
    assert split.resident_layers == range(2)
    assert split.resident() == {(layer, e) for layer in (0, 1) for e in range(8)}
    assert feed(split, [(0, [1, 2]), (1, [7]), (2, [1, 2, 3]), (3, [0])]) == [(2, 0), (1, 0), (0, 3), (0, 1)]
    assert split.cpu_misses == 4 and split.pcie_fills == 0
    last = StaticLayerSplit(20, num_experts=8, num_layers=4, from_end=True)  # llama.cpp --n-cpu-moe 2
    assert last.resident_layers == range(2, 4)


def test_static_split_miss_rate_is_the_share_of_layers_left_out() -> None:
    rng = np.random.default_rng(0)
    routing = [[list(rng.choice(16, 3, replace=False)) for _ in range(6)] for _ in range(20)]
    trace = make_trace(routing, num_experts=16)
    assert replay(StaticLayerSplit(2 * 16 + 5, 16), trace).miss_rate == pytest.approx(1 - 2 / 6)


def test_prefill_placement_takes_the_hottest_prompt_pairs_and_never_changes() -> None:
    counts = {(0, 1): 5, (1, 3): 4, (0, 2): 4, (1, 0): 1}
    place = PrefillPlacement(3, counts, num_layers=2, num_experts=4)
    assert place.resident() == {(0, 1), (0, 2), (1, 3)}  # ties: lower layer first
    assert feed(place, [(0, [1, 0]), (1, [3, 0]), (0, [0])]) == [(1, 1), (1, 1), (0, 1)]
    assert place.resident() == {(0, 1), (0, 2), (1, 3)} and place.cpu_misses == 3
    # capacity beyond the prompt's pairs: unused ones, round-robin over layers, lowest id first
    wide = PrefillPlacement(6, counts, num_layers=2, num_experts=4)
    assert wide.resident() == set(counts) | {(0, 0), (1, 1)}


def test_prefill_placement_reads_prompt_counts_from_the_trace() -> None:
    trace = make_trace(decode=[[[2, 3]], [[2, 4]]], prefill=[[[1, 2]], [[2, -1]]])
    result = replay(PrefillPlacement(1), trace, preload=False)
    assert (result.hits, result.misses) == (2, 2)  # (0, 2) was used twice by the prompt


# -- references -------------------------------------------------------------------------------------

def test_lfu_evicts_the_least_used_then_the_least_recent() -> None:
    lfu = LFU(2)
    feed(lfu, [(0, [1]), (0, [1]), (0, [2]), (0, [3])])  # 3 evicts 2 (used once, 1 used twice)
    assert lfu.resident() == {(0, 1), (0, 3)}
    feed(lfu, [(0, [2])])  # 2 now has 2 uses, 3 has 1: 3 goes
    assert lfu.resident() == {(0, 1), (0, 2)}


def test_belady_evicts_the_farthest_next_use() -> None:
    # A B C A B D A B C with 2 slots on one layer: Belady misses A, B, C, D, C; only A and B are cached
    names = dict(A=0, B=1, C=2, D=3)
    steps = [(0, (names[c],)) for c in "ABCABDABC"]
    belady = Belady(2)
    belady.prepare(Schedule(1, 4, (), tuple(steps)))
    hits = [belady.access(layer, ids)[0] for layer, ids in steps]
    assert hits == [0, 0, 0, 1, 1, 0, 1, 1, 0]
    assert (belady.pcie_fills, belady.cpu_misses) == (2, 3)  # C and D are never worth a slot


def brute_force_min_misses(steps: list[tuple[int, tuple[int, ...]]], capacity: int) -> int:
    """Fewest misses over every choice: after a miss, cache it (evicting any pair not needed by the
    step) or not."""

    @cache
    def best(t: int, cache: frozenset) -> int:
        if t == len(steps):
            return 0
        layer, ids = steps[t]
        needed = {(layer, e) for e in ids}
        misses = [k for k in needed if k not in cache]
        states = {cache}
        for key in misses:
            nxt = set()
            for state in states:
                nxt.add(state)  # do not cache it
                if len(state) < capacity:
                    nxt.add(state | {key})
                else:
                    nxt.update(state - {v} | {key} for v in state if v not in needed)
            states = nxt
        return len(misses) + min(best(t + 1, s) for s in states)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(12))
def test_belady_is_optimal_on_small_random_cases(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = [(int(rng.integers(2)), tuple(int(e) for e in rng.choice(4, int(rng.integers(1, 3)), replace=False)))
             for _ in range(9)]
    for capacity in (2, 3, 4):
        belady = Belady(capacity)
        belady.prepare(Schedule(2, 4, (), tuple(steps)))
        feed(belady, steps)
        assert belady.misses == brute_force_min_misses(steps, capacity)
        lru, lfu = GlobalLRU(capacity), LFU(capacity)
        feed(lru, steps), feed(lfu, steps)
        assert belady.misses <= min(lru.misses, lfu.misses)


def test_belady_refuses_steps_out_of_its_schedule() -> None:
    belady = Belady(2)
    belady.prepare(Schedule(1, 4, (), ((0, (1,)),)))
    with pytest.raises(AssertionError):
        belady.access(0, [2])


# -- replay -----------------------------------------------------------------------------------------

def test_replay_counts_decode_only_and_the_bytes_that_move() -> None:
    trace = make_trace(decode=[[[1, 2], [1]], [[1, 3], [1]]], prefill=[[[1], [-1]]], expert_bytes=1000)
    result = replay(offload_only(10), trace, preload=False)  # prompt caches (0, 1); (1, 1) is absent there
    assert (result.num_tokens, result.reads, result.hits, result.misses) == (2, 6, 3, 3)
    assert (result.pcie_bytes, result.cpu_bytes) == (3000, 0)
    assert result.pcie_mb_per_token == pytest.approx(3000 / 2 / 1e6)
    cpu = replay(cpu_only_misses(10), trace, preload=False)
    assert (cpu.hits, cpu.cpu_bytes) == (2, 4000)


def test_preload_fills_the_cache_in_layer_order() -> None:
    assert preload_steps(5, 3, 2) == ((0, (0, 1)), (1, (0, 1)), (2, (0,)))
    assert preload_steps(99, 2, 2) == ((0, (0, 1)), (1, (0, 1)))
    trace = make_trace(decode=[[[0], [1]]], num_experts=2)
    assert replay(offload_only(4), trace).misses == 0
    assert replay(offload_only(4), trace, preload=False).misses == 2


def test_replay_models_miss_time_and_automatic_beats_the_fixed_policies() -> None:
    rng = np.random.default_rng(1)
    routing = [[list(rng.choice(32, 4, replace=False, p=np.r_[[0.06] * 10, [0.4 / 22] * 22]))
                for _ in range(4)] for _ in range(60)]
    trace = make_trace(routing, num_experts=32, expert_bytes=3_000_000)
    cost = MissCost(25e9, 40e9, 50e-6, 5e-6)
    times = {p.name: replay(p, trace, cost=cost).miss_seconds
             for p in (automatic(40, cost, trace.expert_bytes), offload_only(40), cpu_only_misses(40))}
    assert times["automatic"] <= min(times["offload-only"], times["cpu-misses"])
    assert replay(offload_only(40), trace).miss_seconds is None


# -- q* ---------------------------------------------------------------------------------------------

def test_closed_form_without_fixed_costs() -> None:
    cost = MissCost(pcie_bytes_per_s=25e9, cpu_bytes_per_s=75e9)
    assert closed_form_fraction(cost) == pytest.approx(0.25)
    assert crossing_point(8, 10**6, cost) == pytest.approx(2.0)
    assert choose_pcie_misses(8, 10**6, cost) == 2
    assert choose_pcie_misses(10, 10**6, MissCost(1e9, 1e9)) == 5
    assert choose_pcie_misses(0, 10**6, cost) == 0


def test_fixed_cpu_cost_falls_back_to_all_pcie() -> None:
    # one 3 MB miss: PCIe 120 us, CPU 75 us + 500 us fixed -> the CPU never pays for a few misses
    cost = MissCost(25e9, 40e9, cpu_overhead_s=500e-6)
    for m in (1, 2, 3):
        assert choose_pcie_misses(m, 3_000_000, cost) == m
    assert naive_pcie_misses(3, cost) == 1  # the ratio alone sends one to the CPU ...
    assert finish_seconds(1, 3, 3_000_000, cost) > finish_seconds(3, 3, 3_000_000, cost)  # ... and is slower
    many = choose_pcie_misses(40, 3_000_000, cost)
    assert 0 < many < 40  # with enough misses the CPU side pays again


def q_grid():
    for p, c, o_cpu, o_copy in itertools.product((8e9, 25e9, 60e9), (10e9, 40e9, 100e9), (0.0, 50e-6, 400e-6),
                                                 (0.0, 10e-6)):
        yield MissCost(p, c, o_cpu, o_copy)


@pytest.mark.parametrize("expert_bytes", [3_000_000, 9_437_184])
def test_chooser_is_the_best_integer_split(expert_bytes: int) -> None:
    for cost in q_grid():
        for m in range(0, 25):
            q = choose_pcie_misses(m, expert_bytes, cost)
            best = min(finish_seconds(n, m, expert_bytes, cost) for n in range(m + 1))
            assert finish_seconds(q, m, expert_bytes, cost) == pytest.approx(best, rel=1e-12, abs=1e-15)
            assert finish_seconds(q, m, expert_bytes, cost) <= finish_seconds(m, m, expert_bytes, cost) + 1e-15
            assert finish_seconds(q, m, expert_bytes, cost) <= finish_seconds(0, m, expert_bytes, cost) + 1e-15


def test_chooser_is_monotone() -> None:
    b = 3_000_000
    for cost in q_grid():
        qs = [choose_pcie_misses(m, b, cost) for m in range(30)]
        assert qs == sorted(qs)  # more misses never copy fewer
        times = [finish_seconds(q, m, b, cost) for m, q in enumerate(qs)]
        assert times == sorted(times)  # and never finish sooner
    for m in (1, 3, 8, 20):
        by_p = [choose_pcie_misses(m, b, MissCost(p, 40e9, 50e-6)) for p in (5e9, 10e9, 25e9, 50e9, 100e9)]
        by_c = [choose_pcie_misses(m, b, MissCost(25e9, c, 50e-6)) for c in (5e9, 10e9, 25e9, 50e9, 100e9)]
        by_o = [choose_pcie_misses(m, b, MissCost(25e9, 40e9, o)) for o in (0, 20e-6, 100e-6, 400e-6, 2e-3)]
        assert by_p == sorted(by_p) and by_c == sorted(by_c, reverse=True) and by_o == sorted(by_o)


def test_fill_value_moves_misses_to_pcie() -> None:
    cost, b = MissCost(25e9, 40e9, 50e-6, 5e-6), 3_059_712  # a Q4_K_M expert of Qwen3-30B-A3B
    assert choose_pcie_misses(1, b, cost) == 0  # alone the CPU wins by a microsecond (126.5 vs 127.4 us)
    assert choose_pcie_misses(1, b, cost, fill_value_s=fill_value_seconds(0.9, b, cost)) == 1
    assert fill_value_seconds(0.0, b, cost) == 0.0
    assert fill_value_seconds(1.0, b, cost) == pytest.approx(min(b / 25e9 + 5e-6, b / 40e9 + 50e-6))
    q = [choose_pcie_misses(12, b, cost, fill_value_s=fill_value_seconds(h, b, cost)) for h in (0, 0.3, 0.6, 0.9, 1)]
    assert q == sorted(q)


def test_fixed_costs_overlap_or_serial_and_alone_rates() -> None:
    overlap = MissCost(1e9, 1e9, cpu_overhead_s=1e-3, pcie_overhead_s=1e-3)
    serial = MissCost(1e9, 1e9, cpu_overhead_s=1e-3, pcie_overhead_s=1e-3, fixed_costs="serial")
    assert finish_seconds(1, 2, 10**6, overlap) == pytest.approx(2e-3)  # max(1 + 1, 1 + 1) ms
    assert finish_seconds(1, 2, 10**6, serial) == pytest.approx(3e-3)  # 1 + 1 + max(1, 1) ms
    assert finish_seconds(2, 2, 10**6, serial) == pytest.approx(3e-3)  # one side: its fixed cost only
    alone = MissCost(1e9, 1e9, cpu_alone_bytes_per_s=4e9)
    assert finish_seconds(0, 4, 10**6, alone) == pytest.approx(1e-3)  # the CPU alone, at its own rate
    assert finish_seconds(2, 4, 10**6, alone) == pytest.approx(2e-3)  # both run: the shared rates
    assert choose_pcie_misses(4, 10**6, alone) == 0
    with pytest.raises(ValueError):
        MissCost(1e9, 1e9, fixed_costs="parallel")


def test_miss_cost_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        MissCost(0, 1e9)
    with pytest.raises(ValueError):
        MissCost(1e9, 1e9, cpu_overhead_s=-1)
    with pytest.raises(ValueError):
        finish_seconds(3, 2, 100, MissCost(1e9, 1e9))


def test_naive_hybrid_uses_the_bare_ratio() -> None:
    cost = MissCost(25e9, 75e9, cpu_overhead_s=1.0)
    lru = naive_hybrid(10, cost)
    lru.access(0, [1, 2, 3, 4])
    assert lru.pcie_fills == 1 and lru.cpu_misses == 3


# -- traces -----------------------------------------------------------------------------------------

def write_npz(path: Path, experts: np.ndarray, phase: np.ndarray, **extra) -> Path:
    layers = experts.shape[1]
    np.savez(path, experts=experts.astype(np.int16), phase=phase.astype(np.int8),
             expert_bytes=np.full(layers, 3_000_000, dtype=np.int64), meta=json.dumps({"n_expert": 16}), **extra)
    return path


def test_loader_handles_absent_cells(tmp_path: Path) -> None:
    experts = np.array([[[1, 2], [-1, -1]], [[3, 1], [4, 5]], [[1, 6], [5, 7]]])  # prompt token 0 skips layer 1
    trace = load_trace(write_npz(tmp_path / "t.npz", experts, np.array([0, 1, 1])))
    assert (trace.num_layers, trace.top_k, trace.num_experts, trace.num_decode_tokens) == (2, 2, 16, 2)
    schedule = trace.schedule("batch")
    assert schedule.warm == ((0, (1, 2)),)  # layer 1 had no prompt routing: no step
    assert schedule.prefill_counts == {(0, 1): 1, (0, 2): 1}
    assert schedule.decode == ((0, (3, 1)), (1, (4, 5)), (0, (1, 6)), (1, (5, 7)))
    assert trace.schedule("none").warm == ()
    result = replay(GlobalLRU(100), trace, preload=False)
    assert (result.reads, result.hits) == (8, 3)


def test_loader_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such trace"):
        load_trace(tmp_path / "missing.npz")
    np.savez(tmp_path / "bad.npz", experts=np.zeros((1, 1, 1)))
    with pytest.raises(TraceError, match="bad.npz.*lacks"):
        load_trace(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(TraceError, match="junk.npz"):
        load_trace(tmp_path / "junk.npz")
    with pytest.raises(TraceError, match="expert id"):
        load_trace(write_npz(tmp_path / "ids.npz", np.array([[[20]]]), np.array([1])))


@needs_traces
def test_real_qwen_trace_layout() -> None:
    trace = load_trace(TRACES / "bigmoeonedge" / "qwen3-30b-a3b.npz")
    assert (trace.num_layers, trace.num_experts, trace.top_k) == (48, 128, 6)
    assert len(trace.prefill) == 28 and trace.num_decode_tokens == 128
    assert int((trace.experts < 0).sum()) == 27 * 6  # layer 47 of prompt tokens 0..26
    assert (trace.decode >= 0).all()


@needs_traces
@pytest.mark.parametrize("stem, name", [("qwen3-30b-a3b", "qwen"), ("gemma-4-26b-a4b", "gemma")])
def test_lru_matches_the_trace_repositorys_replay(stem: str, name: str) -> None:
    trace = load_trace(TRACES / "bigmoeonedge" / f"{stem}.npz")
    with open(TRACES / "bigmoeonedge" / f"replay_curve_{name}.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["policy"] == "lru"]
    for row in rows:
        budget = int(row["budget_mib"]) << 20
        ours = replay(GlobalLRU(budget, sizes=trace.expert_bytes), trace, preload=False)
        assert 100 * (1 - ours.miss_rate) == pytest.approx(float(row["hit_pct_decode"]), abs=0.1)


@needs_traces
def test_global_lru_beats_static_split_and_prefill_placement_on_the_traces() -> None:
    for stem in ("qwen3-30b-a3b", "gemma-4-26b-a4b"):
        trace = load_trace(TRACES / "bigmoeonedge" / f"{stem}.npz")
        for share in (0.05, 0.2, 0.4, 0.8):
            slots = round(share * trace.num_layers * trace.num_experts)
            lru = replay(offload_only(slots), trace).miss_rate
            assert lru < replay(StaticLayerSplit(slots, trace.num_experts), trace).miss_rate
            assert lru < replay(PrefillPlacement(slots), trace).miss_rate
            assert replay(Belady(slots), trace).miss_rate <= lru


def _uniform(layers: int, experts: int, top_k: int, prompt: int, decode: int, seed: int) -> RoutingTrace:
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((prompt + decode, layers, experts)), axis=2)[:, :, :top_k].astype(np.int32)
    phase = np.array([0] * prompt + [1] * decode, dtype=np.int8)
    return RoutingTrace("uniform", ids, phase, experts, np.full(layers, 9 << 20, dtype=np.int64))


def test_a_copy_is_worth_nothing_where_routing_is_flat() -> None:
    """Uniform routing: the victim a copy evicts is as likely to be wanted as the copy, so the hits'
    LRU ranks put a quarter of them in the oldest quarter, a copy's worth is near 0, and pricing by
    worth leaves more misses to the CPU than pricing by the hit rate, at no cost in misses."""
    trace = _uniform(4, 32, 4, 64, 192, seed=3)
    cost = MissCost(pcie_bytes_per_s=45e9, cpu_bytes_per_s=60e9, cpu_overhead_s=8e-5)
    by_rate, by_worth = (automatic(64, cost, [9 << 20] * 4, pricing=p) for p in ("hit_rate", "worth"))
    rate, worth = replay(by_rate, trace, cost=cost), replay(by_worth, trace, cost=cost)
    assert by_worth.fill_worth < 0.1 * by_worth.recent_hit_rate and by_rate.fill_worth < 0.1 * by_rate.recent_hit_rate
    assert by_rate.fill_price == by_rate.recent_hit_rate and by_worth.fill_price == by_worth.fill_worth
    assert worth.cpu_misses > rate.cpu_misses and abs(worth.miss_rate - rate.miss_rate) < 0.03
    assert worth.miss_seconds < rate.miss_seconds
    with pytest.raises(ValueError, match="pricing is one of hit_rate, worth"):
        automatic(64, cost, [9 << 20] * 4, pricing="lru")
