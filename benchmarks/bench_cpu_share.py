"""Where the CPU share of a decode layer call spends its fixed cost, layer by layer of the path.

The bandwidth profile (runtime/gpu/bandwidth_profile.py) fits each side's time per call as fixed + rate
x experts. This script fits the same line (1 and N distinct experts per call, one token, top-k
padded with the first expert at weight 0 as the CPU share pads) for ever more of the path, in
one run, so the step that adds the fixed cost shows:

1. kernel: CPUExpertExecutor called on the launching thread;
2. kernel on a worker: the same call handed to a one-thread pool and awaited;
3. share: CPUShare's worker function (the CPU-pair selection, the kernel, the flag);
4. executor: HybridExpertExecutor in mode "cpu", calls queued back to back as decode queues them
   (on CUDA: staging copies, the worker, the stream wait on the flag, the add), one sync per 8.

Experts walk a bank larger than the last-level cache, so every call reads DRAM.

    PYTHONPATH=. python benchmarks/bench_cpu_share.py --threads 6 --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from runtime.experts import CPUExpertExecutor
from runtime.experts.synthetic import random_bank
from runtime.gpu.cpu_share import CPUShare, Job, _Staging
from runtime.gpu.executor import HybridExpertExecutor
from runtime.gpu.expert_cache import ExpertCache
from runtime.gpu.host_memory import HostPinner
from runtime.gpu.kernels import CPU, HIT


def fit(one_ms: float, many_ms: float, many: int) -> tuple[float, float]:
    per = (many_ms - one_ms) / (many - 1)
    return one_ms - per, per


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--inter", type=int, default=768)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--many", type=int, default=8, help="the second point of the line (distinct experts per call)")
    ap.add_argument("--bank-experts", type=int, default=128, help="experts in the walked bank (128: 1.2 GB at Qwen3's)")
    ap.add_argument("--seconds", type=float, default=1.0, help="per point")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bank = random_bank("bf16", args.bank_experts, args.hidden, args.inter, num_distinct=8)
    pinner = HostPinner() if device.type == "cuda" else None
    if pinner is not None:
        pinner.pin_banks({0: bank})
    cpu = CPUExpertExecutor({0: bank}, torch.bfloat16, threads=args.threads)
    x_host = torch.randn(1, args.hidden, dtype=torch.bfloat16)
    k, turn = args.top_k, [0]

    def routed(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[1, k] ids, the first `count` distinct experts the CPU's (the rest: cache hits to the
        share and the executor, dropped for the bare kernel)."""
        start = turn[0]
        turn[0] = (start + k) % args.bank_experts
        ids = torch.tensor([[(start + i) % args.bank_experts for i in range(k)]])
        return ids, torch.full((1, k), 1.0 / k, dtype=torch.bfloat16)

    def per_call_ms(call, count: int) -> float:
        for _ in range(3):
            call(*routed(count), count)
        times, deadline = [], time.perf_counter() + args.seconds
        while time.perf_counter() < deadline or len(times) < 5:
            start = time.perf_counter()
            call(*routed(count), count)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    pool = ThreadPoolExecutor(1)
    share = CPUShare(cpu, torch.device("cpu"))

    def kernel(ids, w, count):
        cpu(0, x_host, ids[:, :count], w[:, :count])

    def kernel_on_worker(ids, w, count):
        pool.submit(cpu, 0, x_host, ids[:, :count], w[:, :count]).result()

    def share_worker(ids, w, count):
        status = torch.tensor([CPU] * count + [HIT] * (k - count), dtype=torch.int32)
        inverse = torch.arange(k, dtype=torch.int32)[None]
        staging = _Staging(x_host, ids, w, status, inverse, torch.empty(1, args.hidden))
        pool.submit(share._run, Job(0, staging)).result()

    cache = ExpertCache(2, bank.layout.expert_stride, device, num_layers=1, num_experts=bank.num_experts)
    ex = HybridExpertExecutor({0: bank}, device=device, cache=cache, mode="cpu", cpu_executor=cpu,
                              prefill_buffers=0)
    x_dev = x_host.to(device)

    def executor_queued(ids, w, count, calls: int = 8):
        ids, w = ids[:, :count].to(device), w[:, :count].to(device)
        for _ in range(calls):
            ex(0, x_dev, ids, w)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            ex.cpu_share.drain()

    mb = bank.layout.expert_stride / 1e6
    print(f"{device}, {args.threads} threads, experts of {args.hidden}x{args.inter} bf16 ({mb:.1f} MB), top-{k}; "
          f"line through 1 and {args.many} distinct experts per call")
    print(f"{'path':<22} {'1 expert ms':>12} {f'{args.many} experts ms':>14} {'fixed ms':>9} {'GB/s':>7}")
    for name, call, per in (("kernel", kernel, 1), ("kernel on a worker", kernel_on_worker, 1),
                            ("share (worker fn)", share_worker, 1), ("executor, queued x8", executor_queued, 8)):
        one, many = per_call_ms(call, 1) / per, per_call_ms(call, args.many) / per
        fixed, slope = fit(one, many, args.many)
        print(f"{name:<22} {one:12.3f} {many:14.3f} {fixed:9.3f} {mb / slope:7.1f}")
    ex.close()
    pool.shutdown()
    if pinner is not None:
        pinner.close()


if __name__ == "__main__":
    main()
