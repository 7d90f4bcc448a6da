"""Prefill on the hybrid GPU runtime against the fit plan's VRAM budget: does the cap hold at every
prompt length and mode?

A random Qwen3-MoE (default: Qwen3-30B-A3B's shape at 16 layers, bf16, as `ft run --device gpu
--vram-gib V` was measured with) is planned for each budget as `ft run` plans it
(runtime/planner/plan.py, from the footprint of its tensor table), then loaded as `load_gpu` loads
a model: the plan's cache slots and prefill buffers, dense weights on the device but the token
embeddings. Each prompt length is prefilled once untimed and once timed (Session's prefill: the
last token's logits), and the script prints tok/s, the peaks torch's allocator saw (allocated,
and reserved: what the process holds of the device, the CUDA context aside) and the plan's
budget and its own total; `over` marks a reserved peak above the budget.

On the CPU (no CUDA, or --device cpu) the same runs on a small shape: the forward's peak of live
bytes beyond what it found (weights, KV, cache: torch's profiler) against the activations the
plan's workspace holds for it (less GPU_RESERVE_BYTES, the CUDA side's); its tok/s mean little.

    python benchmarks/bench_prefill_vram.py                                  # CUDA: 8.3 and 10.2 GiB
    python benchmarks/bench_prefill_vram.py --vram-gib 8 --modes offload --lengths 512,4096,16384
    python benchmarks/bench_prefill_vram.py --device cpu                     # the small shape
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from runtime.gpu import build_hybrid
from runtime.gpu.device_model import DeviceModel, move_dense
from runtime.gpu.host_memory import HostPinner
from runtime.loading.read_ftw import ModelWeights
from runtime.models import build_model
from runtime.models.synthetic import Qwen3MoeShape, random_qwen3_moe
from runtime.planner.plan import GPU_RESERVE_BYTES, ModelFootprint, PlanOverrides, plan, size
from runtime.planner.resources import GPU, Machine

GiB = 1 << 30
SHAPES = {  # hidden, heads, kv heads, head dim, experts, moe intermediate, top-k, vocab, layers
    "qwen3-30b-a3b-16": (2048, 32, 4, 128, 128, 768, 8, 151936, 16),
    "small": (512, 8, 2, 64, 32, 256, 8, 8192, 4),
}


def hf_config(shape: tuple[int, ...], context: int) -> dict:
    hidden, heads, kv_heads, head_dim, experts, inter, top_k, vocab, layers = shape
    return {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": hidden,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": inter,
            "vocab_size": vocab, "max_position_embeddings": context, "decoder_sparse_step": 1, "mlp_only_layers": [],
            "tie_word_embeddings": False, "rope_theta": 1e6, "norm_topk_prob": True}


def tensor_table(shape: tuple[int, ...], itemsize: int, dtype: str) -> dict[str, tuple[str, int]]:
    """(dtype, bytes) of every tensor of the checkpoint this model would be: the footprint's input."""
    hidden, heads, kv_heads, head_dim, experts, inter, _, vocab, layers = shape
    t = {"model.embed_tokens.weight": (dtype, vocab * hidden * itemsize), "lm_head.weight": (dtype, vocab * hidden * itemsize),
         "model.norm.weight": (dtype, hidden * itemsize)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, n in (("self_attn.q_proj", heads * head_dim * hidden), ("self_attn.k_proj", kv_heads * head_dim * hidden),
                        ("self_attn.v_proj", kv_heads * head_dim * hidden), ("self_attn.o_proj", hidden * heads * head_dim),
                        ("self_attn.q_norm", head_dim), ("self_attn.k_norm", head_dim), ("input_layernorm", hidden),
                        ("post_attention_layernorm", hidden), ("mlp.gate", experts * hidden)):
            t[f"{p}{name}.weight"] = (dtype, n * itemsize)
        for e in range(experts):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                t[f"{p}mlp.experts.{e}.{proj}.weight"] = (dtype, inter * hidden * itemsize)
    return t


def random_model(shape: tuple[int, ...], dtype: str, context: int) -> ModelWeights:
    hidden, heads, kv_heads, head_dim, experts, inter, top_k, vocab, layers = shape
    return random_qwen3_moe(Qwen3MoeShape(hidden, heads, kv_heads, head_dim, experts, top_k, inter, vocab, layers),
                            dtype, context_length=context, num_distinct=4)


def cpu_peak(run) -> int:
    """Peak live bytes of `run()` on the CPU device beyond what it found (torch's profiler)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    live = peak = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                            if e.name() == "[memory]"):
        live += nbytes
        peak = max(peak, live)
    return peak


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def prefill(model: DeviceModel, state, ids: torch.Tensor) -> None:
    """Session's prefill (the last token's logits) on an emptied state, waited for."""
    model.forward(ids, model.reset_state(state), last_only=True)
    sync(model.device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=SHAPES, default=None, help="default: qwen3-30b-a3b-16 on CUDA, small on the CPU")
    ap.add_argument("--layers", type=int, default=None, help="(overrides the shape's)")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--vram-gib", default=None, help="budgets, comma separated (default: 8.3,10.2 on CUDA; 0.6,0.75 on the CPU)")
    ap.add_argument("--modes", default="offload,cpu", help="executor modes, comma separated (auto needs a profile)")
    ap.add_argument("--lengths", default=None, help="prompt tokens (default: 512,4096,16384 on CUDA; 512,4096 on the CPU)")
    ap.add_argument("--json", action="store_true", help="also print every row as JSON")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    shape = list(SHAPES[args.shape or ("qwen3-30b-a3b-16" if cuda else "small")])
    if args.layers:
        shape[-1] = args.layers
    shape = tuple(shape)
    lengths = [int(n) for n in (args.lengths or ("512,4096,16384" if cuda else "512,4096")).split(",")]
    budgets = [float(g) for g in (args.vram_gib or ("8.3,10.2" if cuda else "0.6,0.75")).split(",")]
    context = max(lengths) + 64
    itemsize = 2 if args.dtype == "bf16" else 4
    footprint = ModelFootprint.from_checkpoint(hf_config(shape, context), tensor_table(shape, itemsize, args.dtype),
                                               name="random-qwen3-moe")
    t0 = time.perf_counter()
    host = random_model(shape, args.dtype, context)
    weights = move_dense(host, device)
    pinner = HostPinner()  # the banks pinned once, as load_gpu pins them
    if cuda:
        pinner.pin_banks(weights.banks)
    compute = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    print(f"{name}, torch {torch.__version__}; random Qwen3-MoE {shape} {args.dtype}, built in "
          f"{time.perf_counter() - t0:.0f} s; plan workspace per chunk token "
          f"{footprint.activation_bytes_per_token} B", flush=True)
    gen = torch.Generator().manual_seed(1)
    rows = []
    for budget_gib in budgets:
        machine = Machine(ram_total_bytes=1 << 40, ram_available_bytes=1 << 40, num_physical_cores=16,
                          gpu=GPU(name, int(budget_gib * GiB), int(budget_gib * GiB)))
        fit = plan(footprint, machine, PlanOverrides(vram_budget_bytes=int(budget_gib * GiB), num_ctx=context,
                                                    device="gpu", force=True))
        for mode in args.modes.split(","):
            buffers = 0 if mode == "cpu" else fit.prefill_buffers
            model = state = run = None
            ex = build_hybrid(weights, device=device, cache_slots=fit.cache_slots, mode=mode, compute_dtype=compute,
                              prefill_buffers=buffers, force=True, pin=False, split=(lambda misses, nbytes: misses))
            try:
                with torch.device(device):
                    model = DeviceModel(build_model(weights.config, weights, ex, compute), device, ex.steps)
                state = model.new_state(fit.context_length)
                model.forward(torch.randint(0, shape[7], (64,), generator=gen), state, last_only=True)
                for tokens in lengths:
                    run = functools.partial(prefill, model, state, torch.randint(0, shape[7], (tokens,), generator=gen))
                    run()  # untimed: first-use costs at this length
                    start = time.perf_counter()
                    if cuda:
                        torch.cuda.reset_peak_memory_stats(device)  # (to what is held now: the peaks of this prefill)
                        held = torch.cuda.memory_allocated(device)
                        run()
                        peak_alloc = torch.cuda.max_memory_allocated(device)
                        peak = torch.cuda.max_memory_reserved(device)
                        transient = peak_alloc - held
                    else:  # the forward's own: what the plan's workspace is for
                        peak_alloc = peak = transient = cpu_peak(run)
                    seconds = time.perf_counter() - start
                    row = {"budget_gib": budget_gib, "mode": mode, "tokens": tokens, "tok_s": tokens / seconds,
                           "peak_allocated": peak_alloc, "peak": peak, "transient": transient,
                           "budget": fit.vram_budget_bytes,
                           "workspace": fit.workspace_bytes,
                           "planned": fit.vram_needed_bytes, "slots": fit.cache_slots, "buffers": buffers,
                           "context": fit.context_length}
                    rows.append(row)
                    cap = fit.vram_budget_bytes if cuda else fit.workspace_bytes - GPU_RESERVE_BYTES
                    against = "the budget" if cuda else "the planned activations"
                    print(f"{budget_gib:5.2f} GiB {mode:<8} {tokens:>6} tokens: {row['tok_s']:9.1f} tok/s  "
                          f"allocated {size(peak_alloc):>9} ({size(transient)} by the forward), "
                          f"{'reserved' if cuda else 'forward'} {size(peak):>9} "
                          f"of {against} {size(cap)} (plan {size(fit.vram_needed_bytes)}: {fit.cache_slots} slots, "
                          f"{buffers} buffers, ctx {fit.context_length})"
                          + (f"  over by {size(peak - cap)}" if peak > cap else ""), flush=True)
            finally:
                ex.close()
                model = state = run = None  # (before the next run's are made: its peaks are its own)
                if cuda:
                    torch.cuda.empty_cache()
    pinner.close()
    if args.json:
        print(json.dumps({"device": name, "shape": shape, "dtype": args.dtype, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
