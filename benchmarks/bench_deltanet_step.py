"""One-token calls of a Gated DeltaNet layer (Qwen3.5/3.6's linear attention) on the CPU, side by
side in one process: the runtime's call, and its state update (the conv and the delta rule) two
ways: in place, as the runtime makes it (so a CUDA graph captured over the state stays valid),
and by rebinding the state to new tensors, the form before.

    python benchmarks/bench_deltanet_step.py [--threads 2] [--calls 200]

Shape: Qwen3.6-35B-A3B's linear attention (hidden 2048, 16 key and 32 value heads of 128, conv
kernel 4), bf16 weights, random; the state is 2 MiB of float32 per layer.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from runtime.config import ModelConfig
from runtime.layers.gated_deltanet import GatedDeltaNet, causal_conv1d, gated_delta_rule
from runtime.loading.read_ftw import ModelWeights

HIDDEN, K_HEADS, V_HEADS, HEAD_DIM, KERNEL = 2048, 16, 32, 128, 4


def layer() -> GatedDeltaNet:
    key, value = K_HEADS * HEAD_DIM, V_HEADS * HEAD_DIM
    conv_dim = 2 * key + value
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.02).to(torch.bfloat16)

    p = "layer."
    dense = {p + "in_proj_qkv.weight": rand(conv_dim, HIDDEN), p + "in_proj_z.weight": rand(value, HIDDEN),
             p + "in_proj_b.weight": rand(V_HEADS, HIDDEN), p + "in_proj_a.weight": rand(V_HEADS, HIDDEN),
             p + "conv1d.weight": rand(conv_dim, 1, KERNEL), p + "A_log": torch.zeros(V_HEADS),
             p + "dt_bias": torch.ones(V_HEADS), p + "norm.weight": torch.ones(HEAD_DIM, dtype=torch.bfloat16),
             p + "out_proj.weight": rand(HIDDEN, value)}
    source = {"linear_num_key_heads": K_HEADS, "linear_num_value_heads": V_HEADS, "linear_key_head_dim": HEAD_DIM,
              "linear_value_head_dim": HEAD_DIM, "rms_norm_eps": 1e-6}
    config = ModelConfig(family="qwen3_5_moe", num_layers=1, hidden_size=HIDDEN, vocab_size=1, num_attention_heads=1,
                         num_key_value_heads=1, head_dim=HEAD_DIM, num_experts=1, num_experts_per_tok=1,
                         moe_intermediate_size=1, moe_layers=(), context_length=4096, tie_word_embeddings=False,
                         source=source)
    return GatedDeltaNet(config, ModelWeights(config, dense, {}), p, torch.bfloat16)


def state_update(mixer: GatedDeltaNet, x: torch.Tensor, cache, in_place: bool) -> None:
    """The call's state update: the conv and the delta rule, in place or by rebinding."""
    qkv, _, b, a = mixer.project(x)
    qkv, conv = causal_conv1d(qkv, cache.conv, mixer.conv, mixer.conv_bias)
    if in_place:
        cache.conv.copy_(conv)
    else:
        cache.conv = conv
    q, k, v = qkv.split([mixer.key_size, mixer.key_size, mixer.value_size], dim=-1)
    q, k, v = q.reshape(1, K_HEADS, HEAD_DIM), k.reshape(1, K_HEADS, HEAD_DIM), v.reshape(1, V_HEADS, HEAD_DIM)
    g = -mixer.a_log.float().exp() * torch.nn.functional.softplus(a.float() + mixer.dt_bias)
    _, cache.recurrent = gated_delta_rule(q, k, v, g, b.sigmoid(), cache.recurrent, chunked=False, in_place=in_place)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mixer = layer()
    x = torch.randn(1, HIDDEN).to(torch.bfloat16)
    cache = mixer.new_cache(4096)
    times = {"the runtime's call": [], "state update in place": [], "state update by rebinding": []}
    with torch.inference_mode():
        for _ in range(args.calls):  # interleaved, so drift falls on all alike
            for name in times:
                start = time.perf_counter()
                if name == "the runtime's call":
                    mixer(x, torch.tensor([cache.length]), cache, cache.length)
                else:
                    state_update(mixer, x, cache, in_place=name.endswith("in place"))
                times[name].append(time.perf_counter() - start)
    print(f"Gated DeltaNet one-token call, Qwen3.6-35B-A3B shape, bf16, {args.threads} threads, median of {args.calls}:")
    for name, t in times.items():
        print(f"  {name:<32} {1e6 * statistics.median(t):8.1f} us")


if __name__ == "__main__":
    main()
