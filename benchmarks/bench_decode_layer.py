"""Where a decode layer call's time goes: the host's enqueue, the device's work, and the wall.

At a 32 GiB budget decode reached 0.40 of the bandwidth roofline on the H200 (docs/benchmark-history.md).
This splits a decode step over `layers` layers of Qwen3-30B-A3B-sized experts (offload mode,
CUDA graphs on, one sync per step as decode has) into:

- wall: the step as decode runs it;
- host: the Python side alone, the step enqueued while a sleep kernel holds the device;
- device: the step's device time with every launch already queued (events after the sleep and
  at the end), so no gap waits for the host.

Scenarios: every expert read a cache hit; one of the 8 experts of every layer a PCIe miss (a
different expert each step, so the global LRU misses it), filled by the slot kernel's launch
(the default for one token) or by the fill kernel before it; each with a CUDA graph per layer
call, and the first two also with the whole step as one graph (step_graphs.py: the step's ids in
a buffer of fixed address, as a model's router leaves them). Then a cProfile of the all-hit
steps, both ways: the functions with the most own time per layer call, and a torch.profiler
table of the device kernels' time per layer call.

    PYTHONPATH=. python benchmarks/bench_decode_layer.py [layers] [steps]   # CUDA only
"""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch

from runtime.experts.synthetic import random_bank
from runtime.gpu import executor as executor_module
from runtime.gpu.executor import HybridExpertExecutor
from runtime.gpu.expert_cache import ExpertCache
from runtime.gpu.host_memory import HostPinner
from runtime.gpu.slot_compute import fills_in_launch

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 32, 8
SLEEP_CYCLES = 200_000_000  # ~0.1 s at the H200's clock: longer than any step's enqueue


def main() -> None:
    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 48
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    if not torch.cuda.is_available():
        sys.exit("bench_decode_layer.py times CUDA decode: no CUDA device here")
    dev = torch.device("cuda")
    banks = {layer: random_bank("bf16", EXPERTS, HIDDEN, INTER, layer=layer, seed=layer, num_distinct=4)
             for layer in range(layers)}
    pinner = HostPinner()
    pinner.pin_banks(banks)
    stride = next(iter(banks.values())).layout.expert_stride
    cache = ExpertCache(layers * (TOP_K + 2), stride, dev, num_layers=layers, num_experts=EXPERTS)
    ex = HybridExpertExecutor(banks, device=dev, cache=cache, mode="offload", compute_dtype=torch.bfloat16,
                              prefill_buffers=0)
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(layers, 1, HIDDEN, generator=gen).to(dev, torch.bfloat16)
    w = torch.full((1, TOP_K), 1.0 / TOP_K, dtype=torch.bfloat16, device=dev)
    hits = torch.arange(TOP_K, device=dev).view(1, TOP_K)
    misses = [hits.clone() for _ in range(EXPERTS - TOP_K)]
    for i, ids in enumerate(misses):
        ids[0, -1] = TOP_K + i  # experts 8..31 in turn: two spare slots a layer, so each is evicted before it returns

    ids_in = hits.clone()  # where a model's router leaves a step's ids: a buffer of fixed address
    mode = {"whole_step": False}

    def layer_calls() -> None:
        for layer in range(layers):
            ex(layer, xs[layer], ids_in, w)

    def step(n: int, with_miss: bool) -> None:  # n: a new expert each time for the misses
        ids_in.copy_(misses[n % len(misses)] if with_miss else hits)
        if mode["whole_step"]:
            ex.steps.run("bench", layer_calls)
        else:
            layer_calls()

    def queued_walls(with_miss: bool, count: int) -> list[float]:
        """Seconds per step, each step queued (StepGraphs.queue: its launches made, held on the
        device) while the one before runs, and started once the host has seen that one end (as a
        decode loop that needs each token on the host before the next step may start)."""
        def queue(n: int):
            ids = misses[n % len(misses)] if with_miss else hits
            return ex.steps.queue("bench", layer_calls, lambda: ids_in.copy_(ids), ex.steps.doorbell)

        walls, last, queued = [], None, queue(0)
        for n in range(count + 1):
            queued.start()
            done = torch.cuda.Event()
            done.record()
            if n < count:
                queued = queue(2 * (n + 1))
            done.synchronize()
            now = time.perf_counter()
            if last is not None:
                walls.append(now - last)
            last = now
        return walls

    print(f"{layers} layers of {EXPERTS} experts ({stride / 2**20:.1f} MiB each), top-{TOP_K}, offload, "
          f"CUDA graphs, median of {steps} steps")
    print(f"{'scenario':<24} {'wall ms':>8} {'host ms':>8} {'device ms':>10} {'us/layer: wall':>15} {'host':>6} "
          f"{'device':>7}  held")
    scenarios = (("all hits", False, True, False), ("1 PCIe miss per layer", True, True, False),
                 ("1 miss, fill launch first", True, False, False), ("all hits, step graph", False, True, True),
                 ("1 PCIe miss, step graph", True, True, True))
    for name, with_miss, in_launch, whole_step in scenarios:
        executor_module.fills_in_launch = fills_in_launch if in_launch else lambda layout, x: False
        mode["whole_step"] = whole_step
        ex.graphs.invalidate()  # recaptured with this choice
        ex.steps.invalidate()
        for n in range(6):  # first calls, captures, a warm cache
            step(n, with_miss)
        torch.cuda.synchronize()
        walls, hosts, devices, held = [], [], [], True
        for n in range(steps):
            t0 = time.perf_counter()
            step(2 * n, with_miss)
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(SLEEP_CYCLES)
            begin.record()
            t0 = time.perf_counter()
            step(2 * n + 1, with_miss)
            hosts.append(time.perf_counter() - t0)
            held &= not begin.query()  # the sleep outlasted the enqueue: no launch waited for the host
            end.record()
            torch.cuda.synchronize()
            devices.append(begin.elapsed_time(end) / 1e3)
        wall, host, device = (statistics.median(v) * 1e3 for v in (walls, hosts, devices))
        print(f"{name:<24} {wall:>8.3f} {host:>8.3f} {device:>10.3f} {1e3 * wall / layers:>15.1f} "
              f"{1e3 * host / layers:>6.1f} {1e3 * device / layers:>7.1f}  {held}")
        if whole_step and ex.steps.doorbell is not None:  # the next step queued before this one ends
            wall = statistics.median(queued_walls(with_miss, steps)) * 1e3
            print(f"{name + ', queued ahead':<24} {wall:>8.3f} {'':>8} {'':>10} {1e3 * wall / layers:>15.1f}")

    executor_module.fills_in_launch = fills_in_launch
    for whole_step in (False, True):
        mode["whole_step"] = whole_step
        ex.graphs.invalidate()
        ex.steps.invalidate()
        for n in range(4):
            step(n, False)
        torch.cuda.synchronize()
        calls = steps * layers
        prof = cProfile.Profile()
        prof.enable()
        for n in range(steps):
            step(n, False)
            torch.cuda.synchronize()
        prof.disable()
        what = "a graph per step" if whole_step else "a graph per call"
        print(f"\ncProfile, all hits, {what}: own time per layer call (us; the profiler's overhead included), "
              f"{calls} calls")
        stats = pstats.Stats(prof)
        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:22]  # type: ignore[attr-defined]
        for (file, line, func), (_, ncalls, tottime, cumtime, _) in rows:
            where = f"{file.rsplit('/', 2)[-1]}:{line}" if line else "~"
            print(f"  {1e6 * tottime / calls:>7.2f} own {1e6 * cumtime / calls:>8.2f} cum {ncalls / calls:>5.2f}x  "
                  f"{func} ({where})")
    mode["whole_step"] = False

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tprof:
        for n in range(8):
            step(n, True)
            torch.cuda.synchronize()
    print("\ntorch.profiler, 1 PCIe miss per layer: device time per layer call (us)")
    events = sorted(tprof.key_averages(), key=lambda e: getattr(e, "self_device_time_total", 0.0), reverse=True)
    for e in events[:14]:
        dev_us = getattr(e, "self_device_time_total", 0.0) / (8 * layers)
        if dev_us > 0:
            print(f"  {dev_us:>7.1f}  x{e.count / (8 * layers):.2f}  {e.key[:90]}")
    ex.close()
    pinner.close()


if __name__ == "__main__":
    main()
