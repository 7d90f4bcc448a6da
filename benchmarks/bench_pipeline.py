"""The decode pipeline's cost per layer call, with and without the launching thread's time in it.

For each side of a miss (mode "cpu": all on the CPU; "offload": all over PCIe; "auto": half and
half), one layer of Qwen3-30B-A3B-sized experts (9.4 MB), 8 calls queued as decode queues them:

- plain: the batch timed between two device events, the host launching as it goes (what
  profile version 4 measured: an uncaptured call's ~0.3-0.5 ms of launches bound it);
- sleep: the device first spins 15 ms, so the whole batch is queued before it starts (what
  runtime/gpu/measure_bandwidth.py's `_HeadStart` does since version 5): the pipeline of device and CPU
  worker alone. "host" is the queueing time: below 15 ms, the launches were hidden;
- held batch: the stream held on a host flag while the batch is queued, with torch's sync
  debug mode on and a watchdog that dumps every thread's stack if the queueing waits on the
  device (it found Triton's first launch of a kernel specialization loading its module).

    PYTHONPATH=. python benchmarks/bench_pipeline.py [threads] [pcie_repeat]   # CUDA only
"""

from __future__ import annotations

import faulthandler
import statistics
import sys
import threading
import time
import traceback
import warnings

import torch

from runtime.experts import CPUExpertExecutor
from runtime.experts.synthetic import random_bank
from runtime.gpu.executor import HybridExpertExecutor
from runtime.gpu.expert_cache import ExpertCache
from runtime.gpu.host_memory import HostPinner
from runtime.gpu.host_signal import HostFlag, StreamFlags

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 6
repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 1
torch.set_num_threads(threads)
dev = torch.device("cuda")
bank = random_bank("bf16", 128, 2048, 768, num_distinct=8)
pinner = HostPinner()
pinner.pin_banks({0: bank})
cpu = CPUExpertExecutor({0: bank}, torch.bfloat16, threads=threads)
stride = bank.layout.expert_stride
half = 64
turn = {"pcie": 0, "cpu": 0}


def rotating(side, count):
    start = turn[side]
    turn[side] = (start + count) % half
    return [(half if side == "cpu" else 0) + (start + i) % half for i in range(count)]


def executor(mode, slots):
    cache = ExpertCache(slots, stride, dev, num_layers=1, num_experts=128)
    return HybridExpertExecutor({0: bank}, device=dev, cache=cache, mode=mode, cpu_executor=cpu,
                                compute_dtype=torch.bfloat16, prefill_buffers=0, split=lambda m, b: m // 2,
                                auto_guard=False, pcie_repeat=repeat, cuda_graphs=False)


x = torch.randn(1, 2048, dtype=torch.bfloat16, device=dev)
waiter = StreamFlags.load(dev)


def showwarning(message, category, filename, lineno, file=None, line=None):
    print(f"SYNC WARNING: {message}", flush=True)
    traceback.print_stack(limit=14)


warnings.showwarning = showwarning
warnings.simplefilter("always")


def ids_for(calls, pcie, cpu_n):
    experts = [rotating("pcie", pcie) + rotating("cpu", cpu_n) for _ in range(calls)]
    return torch.tensor(experts, device=dev).view(calls, 1, pcie + cpu_n)


def held_batch(ex, pcie, cpu_n, calls=8):
    ids = ids_for(calls, pcie, cpu_n)
    w = torch.full((1, pcie + cpu_n), 1.0 / (pcie + cpu_n), dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    flag = HostFlag()
    waiter.wait(flag, 1)
    fired = []

    def fire():
        fired.append(1)
        print("WATCHDOG: stacks while held", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        flag.set(1)

    t = threading.Timer(1.5, fire)
    t.start()
    torch.cuda.set_sync_debug_mode("warn")
    for i in range(calls):
        ex(0, x, ids[i], w)
    torch.cuda.set_sync_debug_mode(0)
    t.cancel()
    flag.set(1)
    torch.cuda.synchronize()
    return bool(fired)


def timed(ex, pcie, cpu_n, calls=8, sleep_ms=0.0):
    """(host enqueue ms, device ms per call from after the sleep, wall ms per call)."""
    ids = ids_for(calls, pcie, cpu_n)
    w = torch.full((1, pcie + cpu_n), 1.0 / (pcie + cpu_n), dtype=torch.bfloat16, device=dev)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    if sleep_ms:
        torch.cuda._sleep(int(sleep_ms * 1.98e6))
    e0.record()
    for i in range(calls):
        ex(0, x, ids[i], w)
    e1.record()
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    return host, e0.elapsed_time(e1) / calls, wall / calls


def median_of(ex, pc, sleep_ms=0.0, n=9):
    rows = [timed(ex, *pc, sleep_ms=sleep_ms) for _ in range(n)]
    return tuple(statistics.median(r[i] for r in rows) for i in range(3))


print(f"threads {threads}, pcie_repeat {repeat}, expert {stride / 1e6:.1f} MB", flush=True)
for mode, slots in (("cpu", 0), ("offload", 32), ("auto", 32)):
    ex = executor(mode, slots)
    with torch.inference_mode():
        for _ in range(3):
            timed(ex, 8 if mode != "cpu" else 0, 8 if mode != "offload" else 0, calls=8)
        for pc in ((0, 1), (0, 16)) if mode == "cpu" else ((1, 0), (16, 0)) if mode == "offload" else ((8, 8),):
            print(f"== {mode} pcie={pc[0]} cpu={pc[1]}: held batch", flush=True)
            stalled = held_batch(ex, *pc)
            print(f"   held batch stalled: {stalled}", flush=True)
            plain = median_of(ex, pc)
            slept = median_of(ex, pc, sleep_ms=15.0)
            print(f"   plain: host {plain[0]:.2f} ms, device/call {plain[1]:.3f}, wall/call {plain[2]:.3f}", flush=True)
            print(f"   sleep: host {slept[0]:.2f} ms, device/call {slept[1]:.3f}  (host < 15 ms: launches hidden)",
                  flush=True)
    ex.close()
pinner.close()
