"""The split's fill value, estimated several ways, replayed over the Qwen3-30B-A3B trace or over
uniformly random routing (what llama-bench's random ids give), CPU only.

"automatic" (runtime/policy/expert_cache.py, what the GPU executor runs) charges each CPU-served
miss the later miss it causes at the recent hit rate; "automatic, worth" (FT_FILL_PRICING=worth)
at what a copy is worth: the hit rate less the share of it the evicted victim would have had
(`fill_worth`, from the hits' sampled LRU ranks). Beside them: the measured share of filled
entries hit before their eviction (decayed per eviction), no value at all, and plain offload, at the slots the fit planner
gives 8 GiB and 32 GiB and one size between (trace), or the race's -ncmoe 12 and 8 caches
(uniform: 16 layers of 128 experts, top-8, 512 prompt tokens and 256 decoded). Prints the decode
miss rate, the modelled time spent on misses per token (`finish_seconds` per layer step) and the
CPU's share of the misses.

    python benchmarks/bench_fill_value.py [--routing uniform] [--pcie-gbps 48.7 --cpu-gbps 59.4 ...]

The defaults are the profile `ft bench` measured on the H200 host at 8 GiB / 6 threads
(docs/benchmark-history.md, fourteenth session).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.bench.moe import TRACE_DIR  # noqa: E402
from runtime.policy.expert_cache import GlobalLRU, Key, automatic, offload_only, replay  # noqa: E402
from runtime.policy.miss_split import MissCost, choose_pcie_misses, fill_value_seconds  # noqa: E402
from runtime.policy.trace import RoutingTrace, load_trace  # noqa: E402

EXPERT_BYTES = 3 * 2048 * 768 * 2  # Qwen3-30B-A3B, bf16
EVICTION_DECAY = 0.99  # the reuse share looks back ~100 evictions


class FilledReuseLRU(GlobalLRU):
    """Global LRU + q*, each CPU-served miss charged at the share of filled entries hit again
    before eviction (the recent hit rate until the first eviction)."""

    def __init__(self, capacity_slots: int, cost: MissCost, expert_bytes: int) -> None:
        super().__init__(capacity_slots, split=self._split, name="auto, filled reuse")
        self.cost, self.expert_bytes = cost, expert_bytes
        self._hit_since_fill: dict[Key, bool] = {}
        self._evicted_reused = self._evicted = 0.0

    @property
    def filled_reuse(self) -> float | None:
        return self._evicted_reused / self._evicted if self._evicted else None

    def _split(self, layer: int, misses: int, hit_rate: float) -> int:
        reuse = self.filled_reuse
        value = fill_value_seconds(hit_rate if reuse is None else reuse, self.expert_bytes, self.cost)
        return choose_pcie_misses(misses, self.expert_bytes, self.cost, fill_value_s=value)

    def _step(self, layer: int, ids: list[int], warm: bool) -> tuple[int, int, int]:
        for e in ids:
            if (layer, e) in self._hit_since_fill:
                self._hit_since_fill[layer, e] = True
        return super()._step(layer, ids, warm)

    def _insert(self, key: Key, needed: set[Key]) -> None:
        before = set(self._slots)
        super()._insert(key, needed)
        for victim in before - set(self._slots):
            self._evicted_reused = EVICTION_DECAY * self._evicted_reused + self._hit_since_fill.pop(victim, False)
            self._evicted = EVICTION_DECAY * self._evicted + 1
        if key in self._slots:
            self._hit_since_fill[key] = False


def uniform_trace(layers: int = 16, experts: int = 128, top_k: int = 8, prompt: int = 512, decode: int = 256,
                  seed: int = 0) -> RoutingTrace:
    """Every token's experts drawn uniformly, as random ids route a model without skew."""
    rng = np.random.default_rng(seed)
    ids = np.argsort(rng.random((prompt + decode, layers, experts)), axis=2)[:, :, :top_k].astype(np.int32)
    phase = np.array([0] * prompt + [1] * decode, dtype=np.int8)
    return RoutingTrace("uniform", ids, phase, experts, np.full(layers, EXPERT_BYTES, dtype=np.int64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--routing", choices=("trace", "uniform"), default="trace")
    parser.add_argument("--pcie-gbps", type=float, default=48.7)
    parser.add_argument("--cpu-gbps", type=float, default=59.4)
    parser.add_argument("--pcie-fixed-ms", type=float, default=0.016)
    parser.add_argument("--cpu-fixed-ms", type=float, default=0.134)
    parser.add_argument("--slots", help="cache sizes in experts (default: trace 478,1200,3208 for 8 GiB, between "
                                        "and 32 GiB; uniform 531,1042 for the race's -ncmoe 12 and 8)")
    args = parser.parse_args()
    cost = MissCost(pcie_bytes_per_s=args.pcie_gbps * 1e9, cpu_bytes_per_s=args.cpu_gbps * 1e9,
                    pcie_overhead_s=args.pcie_fixed_ms * 1e-3, cpu_overhead_s=args.cpu_fixed_ms * 1e-3)
    trace = load_trace(TRACE_DIR / "qwen3-30b-a3b.npz") if args.routing == "trace" else uniform_trace()
    slots_arg = args.slots or ("478,1200,3208" if args.routing == "trace" else "531,1042")
    sizes = [EXPERT_BYTES] * trace.num_layers
    print(f"routing {trace.name}: {trace.num_layers} layers, top-{trace.top_k}; PCIe {args.pcie_gbps} GB/s, CPU "
          f"{args.cpu_gbps} GB/s, fixed {args.pcie_fixed_ms}/{args.cpu_fixed_ms} ms")
    print(f"{'slots':>6}  {'policy':<22} {'miss rate':>9} {'miss ms/token':>14} {'CPU share':>9}  worth / hit rate")
    for slots in (int(s) for s in slots_arg.split(",")):
        no_value = GlobalLRU(slots, name="auto, no value",
                             split=lambda layer, misses, worth: choose_pcie_misses(misses, EXPERT_BYTES, cost))
        for policy in (offload_only(slots), automatic(slots, cost, sizes), automatic(slots, cost, sizes, "worth"),
                       FilledReuseLRU(slots, cost, EXPERT_BYTES), no_value):
            result = replay(policy, trace, cost=cost)
            if isinstance(policy, FilledReuseLRU) and policy.filled_reuse is not None:
                worth = f"{policy.filled_reuse:.2f} / {policy.recent_hit_rate:.2f}"
            else:
                worth = f"{policy.fill_worth:.2f} / {policy.recent_hit_rate:.2f}" if policy.rank_hits else ""
            print(f"{slots:>6}  {policy.name:<22} {result.miss_rate:>9.3f} {result.miss_ms_per_token:>14.2f} "
                  f"{result.cpu_misses / max(result.misses, 1):>9.2f}  {worth}")


if __name__ == "__main__":
    main()
