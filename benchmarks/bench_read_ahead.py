"""Would reading experts ahead pay at 32 GiB? Read-ahead from routing ids, replayed over a real trace.

A 32 GiB decode step is bound by its misses' PCIe reads, which it cannot overlap with anything:
a layer's misses are known only from its routing (docs/benchmark-history.md). Reading the next layer's likely
misses ahead, during this layer's compute, would take them off the critical path, if the guess
is good: every wrong guess is a 9.4 MB read on the same link. This replays the trace's decode
through a global LRU of `--slots` slots (the fit planner's 3208 for Qwen3-30B at 32 GiB; the
prompt warms it as one batch per layer) and, before each layer of a decode token, reads ahead
`budget` experts of that layer that are not cached, the most likely first. The guess uses only
what a runtime would have then:

- the layer's long-run popularity (the heat aggregates of 75k decode tokens, shared/traces), and
- how often each expert followed the previous layer's experts of this token, counted over the
  tokens before (causal).

Read-ahead experts enter the cache as most recently used. Printed per budget: misses left on the
critical path, experts read ahead, PCIe experts per token in all, and two lower bounds on a step:
the link's (every PCIe byte at --link-gbps) and the critical path's (the misses left at
--miss-us each, plus --layer-us for every layer), from the H200 figures in docs/benchmark-history.md.

A predictor from hidden states (the next layer's router on this layer's input) cannot be
measured here: the traces record expert ids only.

    python benchmarks/bench_read_ahead.py [--trace T.npz] [--heat heat.npz] [--budgets 0,1,2,4]
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path

import numpy as np

from runtime.policy.trace import load_trace

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def replay(trace, heat: np.ndarray, slots: int, budget: int) -> tuple[float, float]:
    """(misses on the critical path, experts read ahead) per decode token."""
    cache: OrderedDict[tuple[int, int], None] = OrderedDict()

    def insert(key: tuple[int, int]) -> None:
        cache[key] = None
        cache.move_to_end(key)
        if len(cache) > slots:
            cache.popitem(last=False)

    for layer in range(trace.num_layers):  # the prompt, one batch per layer
        for e in np.unique(trace.prefill[:, layer]):
            if e >= 0:
                insert((layer, int(e)))
    num_layers, num_experts = trace.num_layers, trace.num_experts
    follows = np.zeros((num_layers, num_experts, num_experts))  # [l, a, b]: b at l + 1 after a at l
    prior = heat / heat.sum(axis=1, keepdims=True)
    stalls = read_ahead = 0
    for token in trace.decode:
        for layer in range(num_layers):
            ids = np.unique(token[layer][token[layer] >= 0])
            if budget:
                score = prior[layer].copy()
                if layer:
                    counts = follows[layer - 1, token[layer - 1][token[layer - 1] >= 0]].sum(axis=0)
                    score += counts / max(counts.sum(), 1.0)
                picked = 0
                for e in np.argsort(-score, kind="stable"):
                    if picked == budget:
                        break
                    if (layer, int(e)) not in cache:
                        insert((layer, int(e)))
                        picked += 1
                read_ahead += picked
            for e in ids:
                key = (layer, int(e))
                if key in cache:
                    cache.move_to_end(key)
                else:
                    stalls += 1
                    insert(key)
            if layer:
                before = token[layer - 1][token[layer - 1] >= 0]
                follows[layer - 1][np.ix_(before, ids)] += 1
    tokens = trace.num_decode_tokens
    return stalls / tokens, read_ahead / tokens


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, default=SHARED / "bigmoeonedge" / "qwen3-30b-a3b.npz")
    parser.add_argument("--heat", type=Path, default=SHARED / "mbolt_aggregates" / "heat.npz")
    parser.add_argument("--heat-key", default="qwen3_30b_a3b_heat")
    parser.add_argument("--slots", type=int, default=3208, help="global LRU slots (Qwen3-30B bf16 at 32 GiB)")
    parser.add_argument("--budgets", default="0,1,2,4", help="experts read ahead per layer, comma separated")
    parser.add_argument("--expert-mb", type=float, default=9.437, help="bytes of one expert (bf16 Qwen3-30B)")
    parser.add_argument("--link-gbps", type=float, default=49.0, help="PCIe rate (the H200 host's)")
    parser.add_argument("--miss-us", type=float, default=192.0, help="a miss on the critical path (H200)")
    parser.add_argument("--layer-us", type=float, default=24.0, help="a layer's work besides its misses (H200)")
    args = parser.parse_args(argv)
    trace = load_trace(args.trace)
    with np.load(args.heat, allow_pickle=False) as heat_file:
        heat = heat_file[args.heat_key].astype(np.float64)
    if heat.shape != (trace.num_layers, trace.num_experts):
        raise SystemExit(f"{args.heat}: {args.heat_key} is {heat.shape}, the trace has "
                         f"{trace.num_layers} layers of {trace.num_experts} experts")
    print(f"{trace.name}: {trace.num_decode_tokens} decode tokens, {trace.num_layers} layers x {trace.num_experts} "
          f"experts, top-{trace.top_k}; global LRU of {args.slots} slots")
    print(f"{'ahead/layer':>11} {'misses left/t':>14} {'read ahead/t':>13} {'PCIe experts/t':>15} "
          f"{'link bound ms':>14} {'critical ms':>12}")
    for budget in (int(b) for b in args.budgets.split(",")):
        stalls, ahead = replay(trace, heat, args.slots, budget)
        link_ms = (stalls + ahead) * args.expert_mb / args.link_gbps
        critical_ms = (stalls * args.miss_us + trace.num_layers * args.layer_us) / 1e3
        print(f"{budget:>11} {stalls:>14.2f} {ahead:>13.1f} {stalls + ahead:>15.1f} {link_ms:>14.2f} "
              f"{critical_ms:>12.2f}")


if __name__ == "__main__":
    main()
