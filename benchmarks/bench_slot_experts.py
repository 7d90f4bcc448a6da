"""Decode experts read in place from cache slots (the Triton kernel) vs gather + bmm, on CUDA.

Qwen3-30B-A3B experts by default (H=2048, I=768, bf16: 9.4 MB records) in an expert cache of
480 slots (4.5 GB, far above L2), top-8 routing over random slots, T=1 and T=4 tokens. Each path
is captured in a CUDA graph over --routings different routings (so launches cost nothing and the
weights come from HBM), replayed, and timed with CUDA events. Printed per path: us per call and
effective GB/s = the distinct experts' weight bytes (w13 + w2) a call needs over its time; the
slot kernel reads an expert once per token using it, so at T > 1 it may read more than that.

- slot_experts: runtime/gpu/kernels/slot_experts.py, default blocks (and with --sweep, a grid of
  block sizes and warps);
- gather+bmm: records.experts_from_records with a PairPlan (the path decode uses today: index
  the used slots' weights into a copy, batched matmul, index_add).

    PYTHONPATH=. python benchmarks/bench_slot_experts.py
    PYTHONPATH=. python benchmarks/bench_slot_experts.py --tokens 1,4,16 --sweep
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable

import torch

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# (block_i, block_h, block_o, block_k, num_warps) tried by --sweep
SWEEP = [(bi, bh, bo, 256, w) for bi, bh, bo, w in itertools.product((8, 16, 32), (256, 512), (16, 32, 64), (4, 8))]


def graph_us(calls: list[Callable[[], None]], reps: int) -> float:
    """Microseconds per call: all `calls` captured in one CUDA graph, replayed `reps` times."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and warm the allocator outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * len(calls))


def bench_tokens(args: argparse.Namespace, num_tokens: int, slots: torch.Tensor, layout, gen: torch.Generator) -> None:
    """Time both paths at `num_tokens` tokens a call; print one line each (and the sweep's best five)."""
    from runtime.gpu.kernels.slot_experts import slot_experts
    from runtime.gpu.kernels.slot_experts_ref import slot_experts_ref
    from runtime.gpu.records import PairPlan, RecordViews, experts_from_records

    dtype = DTYPES[args.dtype]
    parts = {p.name: p for p in layout.parts}
    kwargs = {"w13_offset": parts["w13"].offset, "w2_offset": parts["w2"].offset, "hidden": args.hidden,
              "inter": args.inter, "dtype": dtype}
    views, row_of = RecordViews(slots, layout), torch.arange(args.slots)
    x = torch.randn(num_tokens, args.hidden, generator=gen).to(dtype).cuda()
    out = torch.zeros(num_tokens, args.hidden, device=slots.device)
    routings = []  # (slot ids [T, K] host, weights [T, K] device, pair tensors on the device, PairPlan)
    for _ in range(args.routings):
        ids = torch.stack([torch.randperm(args.slots, generator=gen)[: args.top_k] for _ in range(num_tokens)])
        weights = torch.softmax(torch.randn(num_tokens, args.top_k, generator=gen), -1).cuda()
        pairs = (torch.arange(num_tokens, dtype=torch.int32).repeat_interleave(args.top_k).cuda(),
                 ids.flatten().to(torch.int32).cuda(), weights.flatten().contiguous())
        routings.append((ids, weights, pairs, PairPlan.build(ids, row_of, lambda t: t.cuda())))
    distinct = sum(ids.unique().numel() for ids, *_ in routings) / len(routings)
    gbytes = distinct * (parts["w13"].nbytes + parts["w2"].nbytes) / 1e9

    def report(name: str, us: float) -> None:
        print(f"  T={num_tokens:<3d} {name:<44s} {us:8.1f} us  {gbytes / (us * 1e-6):7.0f} GB/s")

    def kernel_calls(**config) -> list[Callable[[], None]]:
        return [lambda pairs=pairs: slot_experts(x, slots, *pairs, out=out, **kwargs, **config)
                for _, _, pairs, _ in routings]

    check, want = out.clone(), out.clone()
    slot_experts(x, slots, *routings[0][2], out=check, **kwargs)
    slot_experts_ref(x, slots, *routings[0][2], out=want, **kwargs)
    print(f"  T={num_tokens}: {distinct:.1f} distinct experts a call ({gbytes * 1e3:.1f} MB); kernel vs reference "
          f"max |diff| {(check - want).abs().max().item():.2e} (max |out| {want.abs().max().item():.2f})")
    report("gather+bmm (experts_from_records)", graph_us(
        [lambda w=w, plan=plan: experts_from_records(x, w, plan, views, dtype, out) for _, w, _, plan in routings],
        args.reps))
    report("slot_experts (default blocks)", graph_us(kernel_calls(), args.reps))
    if args.sweep:
        timings = []
        for bi, bh, bo, bk, warps in SWEEP:
            config = {"block_i": bi, "block_h": bh, "block_o": bo, "block_k": bk, "num_warps": warps}
            timings.append((graph_us(kernel_calls(**config), max(1, args.reps // 4)), config))
        for us, config in sorted(timings, key=lambda t: t[0])[:5]:
            report("slot_experts " + " ".join(f"{k.removeprefix('block_')}={v}" for k, v in config.items()), us)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="1,4", help="tokens per call, comma separated")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--slots", type=int, default=480, help="cache slots (480 x 9.4 MB = 4.5 GB)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--routings", type=int, default=32, help="distinct routings per graph")
    parser.add_argument("--reps", type=int, default=20, help="graph replays timed")
    parser.add_argument("--sweep", action="store_true", help="also time a grid of kernel block sizes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_slot_experts: needs a CUDA GPU (the gather+bmm path and the Triton kernel run on the device); "
              "nothing to do here")
        return
    from runtime.experts.synthetic import random_bank

    bank = random_bank(args.dtype, 8, args.hidden, args.inter, seed=0)  # 8 records tiled over the slots
    slots = bank.data.cuda().repeat(-(-args.slots // 8), 1)[: args.slots]  # [S, stride]
    print(f"{torch.cuda.get_device_name()}: H={args.hidden} I={args.inter} {args.dtype}, {args.slots} slots "
          f"({slots.numel() / 2**30:.1f} GiB), top-{args.top_k}, {args.routings} routings per graph")
    gen = torch.Generator().manual_seed(0)
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        bench_tokens(args, num_tokens, slots, bank.layout, gen)


if __name__ == "__main__":
    main()
