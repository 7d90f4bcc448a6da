"""Decode experts read in place from cache slots (the Triton kernel) vs gather + bmm, on CUDA.

Qwen3-30B-A3B experts by default (H=2048, I=768, bf16: 9.4 MB records) in an expert cache of
480 slots (4.5 GB, far above L2), top-8 routing over random slots, T=1 and T=4 tokens. Each path
is captured in a CUDA graph over --routings different routings (so launches cost nothing and the
weights come from HBM), replayed, and timed with CUDA events. Printed per path: us per call and
effective GB/s = the distinct experts' weight bytes (w13 + w2) a call needs over its time; the
slot kernel reads an expert once per token using it, so at T > 1 it may read more than that.

- slot_experts: runtime/gpu/kernels/slot_experts.py, default tiles; "as decode" as the executor
  calls it for one token (the pinned bank passed for in-launch fills, none taken; `out` cleared by
  the launch); "one PCIe miss" the same with one pair's expert read from the bank each call; "one
  tile walk" the tiling before the spans were split (each program walks all of H, then all of I);
  with --sweep, the gate pass's tilings and warps, then the down pass's, the best five of each;
- gather+bmm: records.experts_from_records with a PairPlan (the path decode uses today: index
  the used slots' weights into a copy, batched matmul, index_add).

    PYTHONPATH=. python benchmarks/bench_slot_experts.py
    PYTHONPATH=. python benchmarks/bench_slot_experts.py --tokens 1,4,16 --sweep
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Callable

import torch

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# --sweep: the gate pass's (block_i, block_h, split_h) with warps, then the down pass's (block_o, block_k,
# split_k) at the best gate tiling
GATE_SWEEP = list(itertools.product((8, 16, 32), ((256, 8), (512, 4), (1024, 2), (256, 4), (256, 1)), (4, 8)))
DOWN_SWEEP = [(32, 256, 4), (16, 256, 4), (64, 256, 4), (32, 128, 8), (64, 128, 8), (16, 256, 1), (32, 256, 1), (32, 512, 2)]
WALK = {"block_i": 16, "block_h": 256, "split_h": 1, "block_o": 32, "block_k": 256, "split_k": 1}


PDL = {"on": False}  # --pdl: capture as a step graph does, the kernels launched with PDL


def graph_us(calls: list[Callable[[], None]], reps: int) -> float:
    """Microseconds per call: all `calls` captured in one CUDA graph, replayed `reps` times."""
    from runtime.gpu.kernels import dependent_launch

    with dependent_launch.for_step_graph() if PDL["on"] else contextlib.nullcontext():
        return _graph_us(calls, reps)


def _graph_us(calls: list[Callable[[], None]], reps: int) -> float:
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


def bench_tokens(args: argparse.Namespace, num_tokens: int, slots: torch.Tensor, layout, bank: torch.Tensor,
                 gen: torch.Generator) -> None:
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

    def kernel_calls(fills: bool = False, miss: bool = False, **config) -> list[Callable[[], None]]:
        extra = {"fill_bank": bank, "zero_out": True} if fills else {}
        calls = []
        for _, _, pairs, _ in routings:
            pair_fill = torch.full_like(pairs[1], -1)
            if miss:
                pair_fill[0] = int(torch.randint(bank.shape[0], (1,), generator=gen))
            calls.append(lambda pairs=pairs, pair_fill=pair_fill: slot_experts(
                x, slots, *pairs, out=out, **kwargs, **config, **({"pair_fill": pair_fill} if fills else {}), **extra))
        return calls

    check, want = out.clone(), out.clone()
    slot_experts(x, slots, *routings[0][2], out=check, **kwargs)
    slot_experts_ref(x, slots, *routings[0][2], out=want, **kwargs)
    print(f"  T={num_tokens}: {distinct:.1f} distinct experts a call ({gbytes * 1e3:.1f} MB); kernel vs reference "
          f"max |diff| {(check - want).abs().max().item():.2e} (max |out| {want.abs().max().item():.2f})")
    report("gather+bmm (experts_from_records)", graph_us(
        [lambda w=w, plan=plan: experts_from_records(x, w, plan, views, dtype, out) for _, w, _, plan in routings],
        args.reps))
    report("slot_experts (default tiles)", graph_us(kernel_calls(), args.reps))
    report("slot_experts one tile walk (before)", graph_us(kernel_calls(**WALK), args.reps))
    if num_tokens == 1:
        report("slot_experts as decode", graph_us(kernel_calls(fills=True), args.reps))
        report("slot_experts one tile walk, as decode", graph_us(kernel_calls(fills=True, **WALK), args.reps))
        miss_us = graph_us(kernel_calls(fills=True, miss=True), args.reps)
        report("slot_experts as decode, one PCIe miss", miss_us)
        report("slot_experts one tile walk, one PCIe miss", graph_us(kernel_calls(fills=True, miss=True, **WALK),
                                                                     args.reps))
    if args.sweep:
        def sweep(configs: list[dict[str, int]]) -> dict[str, int]:
            timings = [(graph_us(kernel_calls(fills=num_tokens == 1, **c), max(1, args.reps // 4)), c) for c in configs]
            timings.sort(key=lambda t: t[0])
            for us, config in timings[:5]:
                report("  " + " ".join(f"{k.removeprefix('block_')}={v}" for k, v in config.items()), us)
            return timings[0][1]

        best = sweep([{"block_i": bi, "block_h": bh, "split_h": sh, "num_warps": w} for bi, (bh, sh), w in GATE_SWEEP])
        sweep([{**best, "block_o": bo, "block_k": bk, "split_k": sk} for bo, bk, sk in DOWN_SWEEP])


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
    parser.add_argument("--pdl", action="store_true", help="capture as a step graph: launches with PDL (sm_90+)")
    args = parser.parse_args(argv)
    PDL["on"] = args.pdl
    if not torch.cuda.is_available():
        print("bench_slot_experts: needs a CUDA GPU (the gather+bmm path and the Triton kernel run on the device); "
              "nothing to do here")
        return
    from runtime.experts.synthetic import random_bank

    bank = random_bank(args.dtype, 8, args.hidden, args.inter, seed=0)  # 8 records tiled over the slots
    slots = bank.data.cuda().repeat(-(-args.slots // 8), 1)[: args.slots]  # [S, stride]
    host = bank.data.repeat(16, 1).pin_memory()  # a pinned bank of 128 records: the in-launch fills' source
    print(f"{torch.cuda.get_device_name()}: H={args.hidden} I={args.inter} {args.dtype}, {args.slots} slots "
          f"({slots.numel() / 2**30:.1f} GiB), top-{args.top_k}, {args.routings} routings per graph")
    gen = torch.Generator().manual_seed(0)
    for num_tokens in (int(t) for t in args.tokens.split(",")):
        bench_tokens(args, num_tokens, slots, bank.layout, host, gen)


if __name__ == "__main__":
    main()
