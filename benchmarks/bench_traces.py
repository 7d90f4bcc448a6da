"""Expert-cache policies replayed over real routing traces, side by side (DESIGN.md §5, §9).

    python benchmarks/bench_traces.py                      # traces from shared/traces/
    python benchmarks/bench_traces.py --traces DIR --synthetic-requests 6
    python benchmarks/bench_traces.py --profile REPORT.json   # the rates a GPU host measured

CPU only (plain Python/numpy simulators from runtime/policy/expert_cache.py). For the Qwen3-30B-A3B and
Gemma-4-26B-A4B traces (shared/traces/bigmoeonedge, one request each: ~28 prompt + 128 decode
tokens, top-6), and for synthetic requests from runtime/bench/routing_synth.py calibrated to them, it prints:

1. the measured routing statistics (next-token reuse, top-10% share, experts used per request),
   and the long-run top-10% share of the heat aggregates;
2. the miss rate of every policy at a sweep of cache capacities (5%..80% of all experts, and the
   slots the fit planner gives Qwen3-30B-A3B on 8 GiB and 32 GiB GPUs with bf16 and Q4_K_M experts),
   PCIe MB per token, and the modelled time spent serving misses per token;
3. a cross-check of our global LRU against the trace repository's own replay (replay_curve_*.csv);
4. how the prompt warms the global LRU from an empty cache: what decode then misses when
   the prefill leaves nothing, the last token's experts, all the prompt's, or (the GPU
   executor's, runtime/gpu/prefill.py) the prompt's experts within each layer's share.

Capacities are fixed slots. Every policy starts from the prompt passed through the cache as one
batch per layer (as llama.cpp prefills and as the trace repository replays); misses are counted
over the decode tokens only. The miss-time model (runtime/policy/miss_split.py) uses the rates
given on the command line: they are assumptions about a consumer PC, not measurements.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from runtime.bench.routing_synth import (
    RoutingTargets,
    SyntheticRouter,
    calibrate,
    distinct_share,
    popularity_from_heat,
    reuse_rate,
    top_share,
)
from runtime.planner.plan import KVLayout, ModelFootprint, PlanOverrides, plan
from runtime.planner.resources import GPU, Machine
from runtime.policy.expert_cache import (
    CachePolicy,
    GlobalLRU,
    PrefillPlacement,
    ReplayResult,
    StaticLayerSplit,
    automatic,
    cpu_only_misses,
    naive_hybrid,
    offload_only,
    per_step_split,
    replay,
)
from runtime.policy.miss_split import MissCost, closed_form_fraction
from runtime.policy.reference import LFU, Belady
from runtime.policy.trace import RoutingTrace, load_trace

GiB, MiB = 1 << 30, 1 << 20
TRACES = {"qwen3-30b-a3b": "qwen", "gemma-4-26b-a4b": "gemma"}  # npz stem -> replay_curve_<name>.csv
HEATS = {"Qwen3-30B-A3B": "qwen3_30b_a3b_heat", "Qwen3-Next-80B-A3B": "qwen3_next_80b_a3b_heat",
         "GLM-5.2": "glm52_heat"}
FRACTIONS = (0.05, 0.10, 0.20, 0.30, 0.40, 0.60, 0.80)
POLICIES = ("automatic", "offload-only", "cpu-misses", "static-split", "prefill-placement", "lfu", "belady")
TIMED = ("automatic", "offload-only", "per-step-split", "naive-hybrid", "cpu-misses", "static-split", "prefill-placement")

# Qwen3-30B-A3B as the fit planner sees it (tests/test_plan.py works these out from config.json).
QWEN3_30B_BF16_EXPERT = 3 * 768 * 2048 * 2  # gate+up+down, bf16: 9.4 MB, already 4096-aligned
QWEN3_30B_BF16_DENSE = 2 * 151936 * 2048 * 2 + 2048 * 2 + 48 * (2 * 4096 * 2048 + 2 * 512 * 2048 + 256 + 4096
                                                                + 128 * 2048) * 2
QWEN3_30B_EMBED_Q4_K_M = 151936 * 2048 // 256 * (144 + 210)  # token_embd Q4_K + output Q6_K (llama.cpp Q4_K_M)
QWEN3_30B_KV = KVLayout("gqa", 2 * 48 * 4 * 128 * 2)
QWEN3_30B_ACT = 4 * (4 * 2048 + (32 + 2 * 4) * 128 + 128 + 3 * 8 * 768)
NUM_CTX = 4096


def default_traces() -> Path:
    repo = Path(__file__).resolve().parents[1]
    for p in (repo / "shared" / "traces", repo.parent / "shared" / "traces"):
        if p.is_dir():
            return p
    return repo / "shared" / "traces"


# -- capacities ---------------------------------------------------------------------------------------

def planned_slots(expert_bytes: int, dense_bytes: int, vram_bytes: int) -> int:
    """Cache slots the fit planner leaves Qwen3-30B-A3B on a GPU of `vram_bytes`, context NUM_CTX."""
    fp = ModelFootprint(name="qwen3-30b-a3b", source="sizes", family="qwen3_moe", dtype="bf16",
                        dense_bytes=dense_bytes, expert_pool_bytes=48 * 128 * expert_bytes,
                        expert_stride_bytes=expert_bytes, num_moe_layers=48, num_experts=128, num_experts_per_tok=8,
                        kv=QWEN3_30B_KV, context_length=40960, activation_bytes_per_token=QWEN3_30B_ACT)
    machine = Machine(ram_total_bytes=128 * GiB, ram_available_bytes=120 * GiB, num_physical_cores=16,
                      gpu=GPU(f"{vram_bytes // GiB} GiB GPU", vram_bytes, vram_bytes))
    return plan(fp, machine, PlanOverrides(vram_budget_bytes=vram_bytes, num_ctx=NUM_CTX, force=True)).cache_slots


def capacities(trace: RoutingTrace, q4_dense_bytes: int | None) -> list[tuple[str, int, int | None]]:
    """(label, slots, bytes of one expert for the traffic figures: None = the trace's own). With
    `q4_dense_bytes` (Qwen3-30B-A3B's non-expert bytes in Q4_K_M), also the planner's slots."""
    total = trace.num_layers * trace.num_experts
    rows: list[tuple[str, int, int | None]] = [(f"{round(100 * f)}%", round(f * total), None) for f in FRACTIONS]
    if q4_dense_bytes is not None:
        q4_stride, q4_dense = int(trace.expert_bytes.max()), q4_dense_bytes
        for gib in (8, 32):
            rows.append((f"{gib}G bf16", planned_slots(QWEN3_30B_BF16_EXPERT, QWEN3_30B_BF16_DENSE, gib * GiB),
                         QWEN3_30B_BF16_EXPERT))
            rows.append((f"{gib}G Q4KM", planned_slots(q4_stride, q4_dense, gib * GiB), None))
    return rows


# -- replays ------------------------------------------------------------------------------------------

def make(name: str, slots: int, trace: RoutingTrace, cost: MissCost) -> CachePolicy:
    makers: dict[str, Callable[[], CachePolicy]] = {
        "automatic": lambda: automatic(slots, cost, trace.expert_bytes),
        "offload-only": lambda: offload_only(slots),
        "per-step-split": lambda: per_step_split(slots, cost, trace.expert_bytes),
        "naive-hybrid": lambda: naive_hybrid(slots, cost),
        "cpu-misses": lambda: cpu_only_misses(slots),
        "static-split": lambda: StaticLayerSplit(slots, trace.num_experts),
        "prefill-placement": lambda: PrefillPlacement(slots),
        "lfu": lambda: LFU(slots),
        "belady": lambda: Belady(slots),
    }
    return makers[name]()


def merged(results: list[ReplayResult]) -> ReplayResult:
    """Several requests' results as one (counts and bytes summed)."""
    first = results[0]
    sums = {f: sum(getattr(r, f) for r in results) for f in
            ("num_tokens", "reads", "hits", "misses", "pcie_fills", "cpu_misses", "pcie_bytes", "cpu_bytes")}
    seconds = None if first.miss_seconds is None else sum(r.miss_seconds or 0.0 for r in results)
    return replace(first, **sums, miss_seconds=seconds)


def run_policy(name: str, slots: int, traces: list[RoutingTrace], cost: MissCost) -> ReplayResult:
    return merged([replay(make(name, slots, t, cost), t, cost=cost) for t in traces])


def sweep(label: str, traces: list[RoutingTrace], cost: MissCost,
          q4_dense_bytes: int | None) -> dict[tuple[str, str], ReplayResult]:
    t0 = traces[0]
    caps = capacities(t0, q4_dense_bytes)
    results: dict[tuple[str, str], ReplayResult] = {}
    for cap, slots, expert_bytes in caps:
        runs = traces if expert_bytes is None else [t.with_expert_bytes(expert_bytes) for t in traces]
        for name in dict.fromkeys(POLICIES + TIMED):
            results[cap, name] = run_policy(name, slots, runs, cost)
    minimum = t0.num_layers * t0.top_k
    print(f"\n### {label}: miss rate of decode expert reads, % (capacity in slots; one token needs {minimum})\n")
    print("| capacity | slots | " + " | ".join(POLICIES) + " |")
    print("|---|---:|" + "---:|" * len(POLICIES))
    for cap, slots, _ in caps:
        flag = " (below one token)" if slots < minimum else ""
        cells = " | ".join(f"{100 * results[cap, p].miss_rate:.1f}" for p in POLICIES)
        print(f"| {cap}{flag} | {slots} | {cells} |")
    print(f"\n{label}: PCIe MB per token / CPU MB per token (expert bytes; bf16 rows use 9.4 MB experts)\n")
    print("| capacity | " + " | ".join(TIMED) + " |")
    print("|---|" + "---:|" * len(TIMED))
    for cap, _, _ in caps:
        cells = " | ".join(f"{results[cap, p].pcie_mb_per_token:.0f} / {results[cap, p].cpu_mb_per_token:.0f}"
                           for p in TIMED)
        print(f"| {cap} | {cells} |")
    print(f"\n{label}: modelled time serving misses, ms per token (p {cost.pcie_bytes_per_s / 1e9:g} GB/s, "
          f"c {cost.cpu_bytes_per_s / 1e9:g} GB/s, o_cpu {1e6 * cost.cpu_overhead_s:g} us, "
          f"o_copy {1e6 * cost.copy_overhead_s:g} us)\n")
    print("| capacity | " + " | ".join(TIMED) + " |")
    print("|---|" + "---:|" * len(TIMED))
    for cap, _, _ in caps:
        print(f"| {cap} | " + " | ".join(f"{results[cap, p].miss_ms_per_token:.2f}" for p in TIMED) + " |")
    verdict(label, caps, results)
    return results


def verdict(label: str, caps: list[tuple[str, int, int | None]], results: dict[tuple[str, str], ReplayResult]) -> None:
    lru = "offload-only"
    for other in ("static-split", "prefill-placement", "cpu-misses"):
        ties = [c for c, _, _ in caps if results[c, lru].misses == results[c, other].misses]
        losses = [c for c, _, _ in caps if results[c, lru].miss_rate > results[c, other].miss_rate]
        wins = len(caps) - len(ties) - len(losses)
        print(f"{label}: global LRU misses less than {other} at {wins}/{len(caps)} capacities"
              + (f"; as often at {', '.join(ties)}" if ties else "") + (f"; more at {', '.join(losses)}" if losses else ""))
    slow = [c for c, _, _ in caps if results[c, "automatic"].miss_seconds
            > 1.0001 * min(results[c, p].miss_seconds for p in ("offload-only", "cpu-misses"))]  # type: ignore[operator]
    print(f"{label}: automatic modelled no slower than the best of offload-only / cpu-misses at "
          f"{len(caps) - len(slow)}/{len(caps)} capacities" + (f"; slower at {', '.join(slow)}" if slow else ""))


# -- statistics and the cross-check ------------------------------------------------------------------

def trace_stats(trace: RoutingTrace, window: int) -> str:
    d = trace.decode
    return (f"{trace.name}: L={trace.num_layers} N={trace.num_experts} top-{trace.top_k}, "
            f"{len(trace.prefill)} prompt + {len(d)} decode tokens; decode: next-token reuse "
            f"{100 * reuse_rate(d):.1f}%, top-10% share {100 * top_share(d, num_experts=trace.num_experts):.1f}%, "
            f"experts used per layer {100 * distinct_share(d, trace.num_experts):.1f}%")


def cross_check(trace: RoutingTrace, csv_path: Path) -> None:
    ref: dict[tuple[int, str], float] = {}
    with open(csv_path) as f:
        for row in csv.DictReader(f):
            ref[int(row["budget_mib"]), row["policy"]] = float(row["hit_pct_decode"])
    budgets = sorted({b for b, _ in ref})
    slot = int(trace.expert_bytes.max())
    print(f"\n{trace.name} vs {csv_path.name}: decode hit rate %, theirs / ours (byte budget) / ours (fixed "
          f"{slot / MiB:.2f} MiB slots)\n")
    print("| budget MiB | LRU theirs | LRU ours, bytes | LRU ours, slots | LFU theirs / ours | Belady theirs / ours |")
    print("|---:|---:|---:|---:|---:|---:|")
    diffs = []
    mean = int(trace.expert_bytes.mean())
    for b in budgets:
        def hit_pct(policy: CachePolicy) -> float:
            return 100 * (1 - replay(policy, trace, preload=False).miss_rate)  # they start empty

        ours, slots = hit_pct(GlobalLRU(b * MiB, sizes=trace.expert_bytes)), hit_pct(GlobalLRU(b * MiB // slot))
        lfu, bel = hit_pct(LFU(b * MiB // mean)), hit_pct(Belady(b * MiB // mean))
        diffs.append(abs(ours - ref[b, "lru"]))
        print(f"| {b} | {ref[b, 'lru']:.2f} | {ours:.2f} | {slots:.2f} | {ref[b, 'lfu']:.1f} / {lfu:.1f} | "
              f"{ref[b, 'belady']:.1f} / {bel:.1f} |")
    print(f"\nLRU, byte budget: largest difference {max(diffs):.3f} points over {len(budgets)} budgets")


def synthetic(trace: RoutingTrace, heat: np.ndarray, requests: int, seed: int) -> tuple[list[RoutingTrace], SyntheticRouter]:
    """Requests shaped like `trace` (same prompt and decode lengths) from a router calibrated to it."""
    d = trace.decode
    targets = RoutingTargets(reuse=reuse_rate(d), top_share=RoutingTargets().top_share,
                             window_share=top_share(d, num_experts=trace.num_experts),
                             window_distinct=distinct_share(d, trace.num_experts), window_tokens=len(d))
    start = time.perf_counter()
    router, reached = calibrate(popularity_from_heat(heat, trace.num_layers, trace.num_experts, seed=seed),
                                trace.top_k, targets, seed=seed)
    print(f"\nsynthetic router for {trace.name} (calibrated in {time.perf_counter() - start:.1f} s): skew "
          f"{router.skew:.3f}, context_support {router.context_support:.3f}, context_spread "
          f"{router.context_spread:.3f}, stickiness {router.stickiness:.3f}\n  calibration sample: {reached}")
    long_run = router.generate(40 * router.context_tokens, seed=seed + 1)
    print(f"  40 requests of {router.context_tokens} tokens: reuse {100 * reuse_rate(long_run):.1f}%, long-run "
          f"top-10% share {100 * top_share(long_run, num_experts=trace.num_experts):.1f}%")
    tokens = len(trace.phase)
    router = replace(router, context_tokens=tokens)  # one request = one context, prompt included
    runs = [RoutingTrace(f"synthetic-{i}", router.generate(tokens, seed=seed + 100 + i), trace.phase,
                         trace.num_experts, trace.expert_bytes) for i in range(requests)]
    decode = np.concatenate([r.decode for r in runs])
    print(f"  the {requests} replayed requests ({len(trace.prefill)} + {len(d)} tokens each), decode: reuse "
          f"{100 * np.mean([reuse_rate(r.decode) for r in runs]):.1f}%, top-10% share per request "
          f"{100 * np.mean([top_share(r.decode, num_experts=trace.num_experts) for r in runs]):.1f}%, experts used "
          f"{100 * np.mean([distinct_share(r.decode, trace.num_experts) for r in runs]):.1f}%, all requests "
          f"together top-10% {100 * top_share(decode, num_experts=trace.num_experts):.1f}%")
    return runs, router


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=default_traces(), help="the shared/traces directory")
    ap.add_argument("--synthetic-requests", type=int, default=6, help="0: real traces only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pcie-gbps", type=float, default=25.0, help="assumed pinned H2D rate (PCIe 4.0 x16)")
    ap.add_argument("--cpu-gbps", type=float, default=40.0, help="assumed CPU expert-kernel rate (dual-channel DDR5)")
    ap.add_argument("--cpu-overhead-us", type=float, default=50.0, help="assumed fixed CPU cost per layer step")
    ap.add_argument("--copy-overhead-us", type=float, default=5.0, help="assumed fixed cost per expert copy")
    ap.add_argument("--profile", type=Path, help="a machine's measured rates instead of the assumed ones: a "
                    "BandwidthProfile JSON ($FT_HOME/profiles/) or an `ft bench --json` report")
    args = ap.parse_args(argv)
    cost = MissCost(args.pcie_gbps * 1e9, args.cpu_gbps * 1e9, args.cpu_overhead_us * 1e-6, args.copy_overhead_us * 1e-6)
    if args.profile is not None:
        cost = measured_cost(args.profile)
    start = time.perf_counter()
    print(f"# bench_traces on {platform.node()} ({platform.processor() or platform.machine()}), numpy {np.__version__}")
    print(f"q* closed form p/(p+c) = {closed_form_fraction(cost):.3f}")
    bme, heat = args.traces / "bigmoeonedge", np.load(args.traces / "mbolt_aggregates" / "heat.npz")
    traces = {stem: load_trace(bme / f"{stem}.npz") for stem in TRACES}
    # Qwen3-30B-A3B Q4_K_M non-expert bytes: the trace header's per-layer dense bytes + embeddings
    q4_dense = QWEN3_30B_EMBED_Q4_K_M + int(np.load(bme / "qwen3-30b-a3b.npz")["dense_bytes"].sum())
    print("\n## Measured routing statistics\n")
    for t in traces.values():
        print(trace_stats(t, len(t.decode)))
    for model, key in HEATS.items():
        h = heat[key]
        print(f"{model} heat ({h.shape[0]}x{h.shape[1]}, {int(h[0].sum()) // 1} activations per layer): long-run "
              f"top-10% share {100 * _heat_share(h):.1f}%")
    for stem, t in traces.items():
        print(f"\n## {t.name}")
        cross_check(t, bme / f"replay_curve_{TRACES[stem]}.csv")
        dense = q4_dense if stem == "qwen3-30b-a3b" else None
        sweep(f"{t.name} (real trace)", [t], cost, dense)
        prefill_warm(t, capacities(t, dense), cost)
        if args.synthetic_requests <= 0:
            continue
        runs, _ = synthetic(t, heat["qwen3_30b_a3b_heat"], args.synthetic_requests, args.seed)
        sweep(f"{t.name}-shaped synthetic ({len(runs)} requests)", runs, cost, dense)
    print(f"\nplanned slots assume context {NUM_CTX}; done in {time.perf_counter() - start:.0f} s")


def warm_steps(trace: RoutingTrace, how: str, slots: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The cache steps a prefill of the trace's prompt leaves, per layer: "none"; "last token";
    "all" (the prompt's distinct experts, as the sweeps above warm); "share" (the GPU executor's
    "lru" prefill, runtime/gpu/prefill.py: the prompt's experts, the last tokens' first, up to
    slots // layers per layer, the last token's at least)."""
    prompt, layers = trace.prefill, trace.num_layers
    steps = []
    for layer in range(layers):
        if how == "none":
            continue
        routed = prompt[:, layer]
        if how == "last token":
            experts = list(dict.fromkeys(routed[-1].tolist()))
        else:
            experts = list(dict.fromkeys(routed[::-1].reshape(-1).tolist()))  # recent first
            if how == "share":
                experts = experts[: max(routed.shape[1], slots // layers)]
        experts = [e for e in experts if e >= 0]
        steps.append((layer, tuple(reversed(experts))))  # the most recent inserted last
    return tuple(steps)


def prefill_warm(trace: RoutingTrace, caps: list[tuple[str, int, int | None]], cost: MissCost) -> None:
    """Decode misses from an empty cache after each way of warming it with the prompt."""
    hows = ("none", "last token", "all", "share")
    print(f"\n{trace.name}: decode miss rate %, offload-only / automatic, from an empty cache warmed by the "
          "prompt\n")
    print("| capacity | slots | " + " | ".join(hows) + " |")
    print("|---|---:|" + "---:|" * len(hows))
    for cap, slots, expert_bytes in caps:
        if slots >= trace.num_layers * trace.num_experts:
            continue
        t = trace.with_expert_bytes(expert_bytes) if expert_bytes else trace
        cells = []
        for how in hows:
            rates = []
            for policy in (offload_only(slots), automatic(slots, cost, t.expert_bytes.tolist())):
                schedule = replace(t.schedule("none"), warm=warm_steps(t, how, slots))
                policy.prepare(schedule)
                for layer, ids in schedule.warm:
                    policy.warm(layer, ids)
                policy.reset_counters()
                for layer, ids in schedule.decode:
                    policy.access(layer, ids)
                rates.append(100 * policy.misses / policy.reads)
            cells.append(f"{rates[0]:.1f} / {rates[1]:.1f}")
        print(f"| {cap} | {slots} | " + " | ".join(cells) + " |")


def measured_cost(path: Path) -> MissCost:
    """The GPU executor's cost model for a measured profile (runtime/gpu/split.py): its rates with
    both sides busy and alone, its fixed costs composed as the executor composes them."""
    from runtime.gpu.bandwidth_profile import BandwidthProfile
    from runtime.gpu.split import miss_cost

    data = json.loads(path.read_text(encoding="utf-8"))
    data = data.get("profile", data)  # an ft bench report holds the profile it ran with
    fields = BandwidthProfile.__dataclass_fields__
    profile = BandwidthProfile(**{k: v for k, v in data.items() if k in fields})
    print(f"profile {profile.machine or path.name}: PCIe {profile.pcie_gbps:.1f} GB/s (alone {profile.pcie_alone_gbps:.1f}), "
          f"CPU {profile.cpu_gbps:.1f} (alone {profile.cpu_alone_gbps:.1f}), fixed {profile.pcie_fixed_ms:.3f} / "
          f"{profile.cpu_fixed_ms:.3f} ms")
    return miss_cost(profile)


def _heat_share(h: np.ndarray, fraction: float = 0.10) -> float:
    top = max(1, round(fraction * h.shape[1]))
    s = np.sort(h.astype(np.float64), 1)[:, ::-1]
    return float((s[:, :top].sum(1) / s.sum(1)).mean())


if __name__ == "__main__":
    main()
