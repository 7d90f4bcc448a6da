"""The split's fill value, estimated two ways, replayed over the Qwen3-30B-A3B trace (CPU only).

"auto" (runtime/policy/expert_cache.py `automatic`, what the GPU executor runs) charges each CPU-served
miss the later miss it causes at the cache's recent hit rate. That rate counts hits on every
cached entry; the entry a fill brings in is used again less often than that (docs/GPU_RUNTIME.md,
"Not done yet"). This replays the same split with the value priced instead at the measured
share of filled entries that were hit before their eviction (decayed per eviction, as the hit
rate is per step), beside no value at all and plain offload, at the slots the fit planner gives
8 GiB and 32 GiB and one size between. Prints the decode miss rate and the modelled time spent
on misses per token (`finish_seconds` per layer step).

    python benchmarks/bench_fill_value.py [--pcie-gbps 48.7 --cpu-gbps 59.4 --pcie-fixed-ms 0.016 --cpu-fixed-ms 0.134]

The defaults are the profile `ft bench` measured on the H200 host at 8 GiB / 6 threads
(docs/benchmark-history.md, fourteenth session).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.bench.moe import TRACE_DIR  # noqa: E402
from runtime.policy.expert_cache import GlobalLRU, Key, automatic, offload_only, replay  # noqa: E402
from runtime.policy.miss_split import MissCost, choose_pcie_misses, fill_value_seconds  # noqa: E402
from runtime.policy.trace import load_trace  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pcie-gbps", type=float, default=48.7)
    parser.add_argument("--cpu-gbps", type=float, default=59.4)
    parser.add_argument("--pcie-fixed-ms", type=float, default=0.016)
    parser.add_argument("--cpu-fixed-ms", type=float, default=0.134)
    parser.add_argument("--slots", default="478,1200,3208", help="cache sizes in experts (8 GiB, between, 32 GiB)")
    args = parser.parse_args()
    cost = MissCost(pcie_bytes_per_s=args.pcie_gbps * 1e9, cpu_bytes_per_s=args.cpu_gbps * 1e9,
                    pcie_overhead_s=args.pcie_fixed_ms * 1e-3, cpu_overhead_s=args.cpu_fixed_ms * 1e-3)
    trace = load_trace(TRACE_DIR / "qwen3-30b-a3b.npz")
    sizes = [EXPERT_BYTES] * trace.num_layers
    print(f"trace {trace.name}: {trace.num_layers} layers, top-{trace.top_k}; PCIe {args.pcie_gbps} GB/s, CPU "
          f"{args.cpu_gbps} GB/s, fixed {args.pcie_fixed_ms}/{args.cpu_fixed_ms} ms")
    print(f"{'slots':>6}  {'policy':<20} {'miss rate':>9} {'miss ms/token':>14}  filled reuse / hit rate")
    for slots in (int(s) for s in args.slots.split(",")):
        no_value = GlobalLRU(slots, name="auto, no value",
                             split=lambda layer, misses, hit_rate: choose_pcie_misses(misses, EXPERT_BYTES, cost))
        for policy in (offload_only(slots), automatic(slots, cost, sizes), FilledReuseLRU(slots, cost, EXPERT_BYTES),
                       no_value):
            result = replay(policy, trace, cost=cost)
            reuse = f"{policy.filled_reuse:.2f} / {policy.recent_hit_rate:.2f}" \
                if isinstance(policy, FilledReuseLRU) and policy.filled_reuse is not None else ""
            print(f"{slots:>6}  {policy.name:<20} {result.miss_rate:>9.3f} {result.miss_ms_per_token:>14.2f}  {reuse}")


if __name__ == "__main__":
    main()
