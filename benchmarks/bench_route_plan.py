"""The route-plan kernel as a decode step calls it, on CUDA: one call per MoE layer, the cache
clock on the device, the running sums accumulated, every call a hit (the common call at a 32 GiB
budget, where the victim scan is skipped; one call in 32 ranks its hits over every slot), captured in one CUDA graph as a step graph captures
it (with programmatic dependent launch where the card has it) and replayed; us per call.

Two policies' forms: "offload" (n_pcie_max a number: every miss over PCIe) and "auto" (a split
table on the device, read at the call's miss count).

    PYTHONPATH=. python benchmarks/bench_route_plan.py [--layers 48 --slots 3208 --top-k 6]
"""

from __future__ import annotations

import argparse

import torch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--slots", type=int, default=3208)
    parser.add_argument("--top-k", type=int, default=6)
    parser.add_argument("--steps", type=int, default=16, help="decode steps in the graph")
    parser.add_argument("--reps", type=int, default=20, help="graph replays timed")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_route_plan: needs a CUDA GPU; nothing to do here")
        return
    from runtime.gpu.kernels import NUM_COUNTS, RANKED, RoutePlan, dependent_launch
    from runtime.gpu.kernels.route_plan import route_plan

    device = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    # the first `top_k` experts of every layer cached: ids drawn from them always hit
    table = torch.full((args.layers * args.experts,), -1, dtype=torch.int32)
    owner = torch.full((args.slots,), -1, dtype=torch.int32)
    for layer in range(args.layers):
        for e in range(args.top_k):
            slot = layer * args.top_k + e
            table[layer * args.experts + e], owner[slot] = slot, layer * args.experts + e
    table, owner = table.to(device), owner.to(device)
    last_used = torch.full((args.slots,), -1, dtype=torch.int64, device=device)
    clock = torch.zeros(1, dtype=torch.int64, device=device)
    totals = torch.zeros(NUM_COUNTS, dtype=torch.int64, device=device)
    ids = torch.stack([torch.randperm(args.top_k, generator=gen) for _ in range(args.layers)]).to(device)  # [L, K]
    plans = [RoutePlan.empty(1, args.top_k, device) for _ in range(args.layers)]
    split_table = torch.arange(args.top_k + 1, dtype=torch.int32, device=device)  # all misses over PCIe
    print(f"{torch.cuda.get_device_name()}: {args.layers} layers x {args.experts} experts, {args.slots} slots, "
          f"top-{args.top_k}, every call a hit")
    for name, n_pcie in (("offload", args.top_k), ("auto", split_table)):
        def step(n_pcie=n_pcie) -> None:
            for layer in range(args.layers):
                route_plan(ids[layer: layer + 1], layer, args.experts, table, owner, last_used, clock, n_pcie,
                           out=plans[layer], totals=totals, advance_clock=True)

        with dependent_launch.for_step_graph():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                step()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.steps):
                    step()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.reps):
            graph.replay()
        end.record()
        end.synchronize()
        calls = args.reps * args.steps * args.layers
        hits, ranked = int(totals[0]), int(totals[RANKED])
        print(f"  {name:<8s} {start.elapsed_time(end) * 1e3 / calls:6.2f} us per call  (hits counted: {hits}, "
              f"ranked: {ranked}, one call in {hits / max(ranked, 1):.1f})")


if __name__ == "__main__":
    main()
