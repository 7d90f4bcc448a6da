"""What a decode layer call's CPU share costs when it has nothing to do: the hand-off alone.

At 32 GiB almost every expert read hits the cache, yet "auto"'s model arm (a CPU share on every
call) took 2-2.7x a PCIe-only step on the H200 (ft bench's guard line). This times decode steps
over `layers` layers of Qwen3-30B-A3B-sized experts, every expert resident (all hits), CUDA
graphs on, one sync per step as decode has:

- offload: no CPU share;
- share/native, share/python: a CPU share on every call (the split sends every miss to the
  CPU; there are none), handed to the native worker thread or to the Python one;
- share/native, 1 CPU expert: one of the 8 experts of each call a miss, computed on the CPU.

Per step: wall time (ms) and device time (ms, between events at the step's ends), medians over
`steps` steps after warm-up.

    PYTHONPATH=. python benchmarks/bench_handoff.py [layers] [threads] [steps]   # CUDA only
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from runtime.experts import CPUExpertExecutor
from runtime.experts.synthetic import random_bank
from runtime.gpu.cpu_share import CPUShare
from runtime.gpu.executor import HybridExpertExecutor
from runtime.gpu.expert_cache import ExpertCache
from runtime.gpu.host_memory import HostPinner

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 32, 8


def main() -> None:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 48
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # off CUDA: a dry run of the script
    banks = {layer: random_bank("bf16", EXPERTS, HIDDEN, INTER, layer=layer, seed=layer, num_distinct=4)
             for layer in range(layers)}
    pinner = HostPinner()
    if dev.type == "cuda":
        pinner.pin_banks(banks)
    cpu = CPUExpertExecutor(banks, torch.bfloat16, threads=threads)
    stride = next(iter(banks.values())).layout.expert_stride
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, HIDDEN, generator=gen).to(dev, torch.bfloat16)
    w = torch.full((1, TOP_K), 1.0 / TOP_K, dtype=torch.bfloat16, device=dev)
    resident = torch.arange(TOP_K, device=dev).view(1, TOP_K)  # experts 0-7 of every layer: all hits once warm
    with_miss = resident.clone()
    with_miss[0, -1] = TOP_K  # expert 8: a miss, for the CPU

    def build(mode: str, native: bool) -> HybridExpertExecutor:
        cache = ExpertCache(layers * (TOP_K + 2), stride, dev, num_layers=layers, num_experts=EXPERTS)
        # experts 0-7 of every layer into the cache (the measured "auto" sends every miss to the CPU)
        warm = HybridExpertExecutor(banks, device=dev, cache=cache, mode="offload", cpu_executor=cpu,
                                    compute_dtype=torch.bfloat16, prefill_buffers=0, cuda_graphs=False)
        step(warm, resident)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ex = HybridExpertExecutor(banks, device=dev, cache=cache, mode=mode, cpu_executor=cpu,
                                  compute_dtype=torch.bfloat16, prefill_buffers=0, split=lambda m, b: 0,
                                  auto_guard=False)
        if mode == "auto":
            ex.cpu_share.close()
            ex.cpu_share = CPUShare(cpu, dev, native=native)
        return ex

    def step(ex: HybridExpertExecutor, ids: torch.Tensor) -> None:
        for layer in range(layers):
            ex(layer, x, ids, w)

    rows = []
    for name, mode, native, miss in (("offload", "offload", True, False), ("share/native", "auto", True, False),
                                     ("share/python", "auto", False, False),
                                     ("share/native, 1 CPU expert", "auto", True, True)):
        ex = build(mode, native)
        for _ in range(4):  # first calls, captures
            step(ex, resident)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        walls, device = [], []
        for _ in range(steps):
            events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if dev.type == "cuda" else None
            t0 = time.perf_counter()
            if events:
                events[0].record()
            step(ex, with_miss if miss else resident)
            if events:
                events[1].record()
                torch.cuda.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
            device.append(events[0].elapsed_time(events[1]) if events else 0.0)
        stats = ex.stats()
        rows.append((name, statistics.median(walls), statistics.median(device), stats.cpu_experts,
                     ex.graphs.replays if ex.graphs else 0, ex.cpu_share.native_worker_started))
        ex.close()
    print(f"{layers} layers of {EXPERTS} experts ({stride / 2**20:.1f} MiB each), top-{TOP_K}, {threads} threads, "
          f"median of {steps} steps")
    print(f"{'':<28} {'wall ms/step':>12} {'device ms/step':>15} {'us/layer (wall)':>16} {'CPU experts':>12} "
          f"{'replays':>8} {'native':>7}")
    for name, wall, dev_ms, cpu_n, replays, native in rows:
        print(f"{name:<28} {wall:>12.3f} {dev_ms:>15.3f} {1e3 * wall / layers:>16.1f} {cpu_n:>12} {replays:>8} "
              f"{native!s:>7}")
    pinner.close()


if __name__ == "__main__":
    main()
