"""CPU decode tokens/s: ft's runtime against transformers' `generate` on the same weights.

    python benchmarks/bench_decode.py --threads 2 --dtype bf16

Builds a mid-size random Qwen3-MoE with transformers (default: hidden 1024, 12 layers, 64
experts of 512, top-8, vocab 32k; ~1.3 B parameters, ~0.2 B active), saves it, converts it through
`ft pull` (local path), then in one process, same thread count, greedy-decodes the same prompt
with both and prints tokens/s side by side. Prefill is timed separately from decode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def build(path: Path, args: argparse.Namespace) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=32000, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
        moe_intermediate_size=args.moe_inter, num_hidden_layers=args.layers, num_attention_heads=16,
        num_key_value_heads=4, head_dim=args.hidden // 16, num_experts=args.experts, num_experts_per_tok=args.top_k,
        norm_topk_prob=True, max_position_embeddings=4096,
    )
    model = AutoModelForCausalLM.from_config(config).to(DTYPES[args.dtype])
    with torch.no_grad():  # routers that spread tokens over experts like a trained model would
        model.model.embed_tokens.weight.mul_(args.embedding_scale)
    model.save_pretrained(path)


def median_seconds(run, reps: int) -> float:
    """Median wall time of `reps` calls of `run`, after one untimed call (first-use costs)."""
    run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_ft(store_root: Path, src: Path, prompt: list[int], steps: int, dtype: torch.dtype,
            prefill_reps: int) -> dict[str, float]:
    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load

    store = Store(store_root)
    name = str(pull(str(src), store).name)
    loaded = load(store, name, dtype)
    ids = torch.tensor(prompt)
    prefill = median_seconds(lambda: loaded.model.forward(ids, loaded.model.new_state(len(prompt))), prefill_reps)
    state = loaded.model.new_state(len(prompt) + steps + 1)
    logits = loaded.model.forward(ids, state)[-1]
    start = time.perf_counter()
    for _ in range(steps):
        token = int(torch.argmax(logits))
        logits = loaded.model.forward(torch.tensor([token]), state)[-1]
    decode = time.perf_counter() - start
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": steps / decode}


def time_hf(src: Path, prompt: list[int], steps: int, dtype: torch.dtype, prefill_reps: int) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        prefill = median_seconds(lambda: model(ids), prefill_reps)
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False, pad_token_id=0)
        one = time.perf_counter() - start
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False, pad_token_id=0)
        total = time.perf_counter() - start
    return {"prefill_tok_s": len(prompt) / prefill, "decode_tok_s": steps / max(1e-9, total - one)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--moe-inter", type=int, default=512)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--embedding-scale", type=float, default=10.0)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prefill-reps", type=int, default=5, help="Timed prefills per side (median), after one untimed.")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    prompt = [int(x) for x in torch.randint(0, 32000, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0))]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        build(src, args)
        hf = time_hf(src, prompt, args.steps, dtype, args.prefill_reps)
        ft = time_ft(Path(tmp) / "store", src, prompt, args.steps, dtype, args.prefill_reps)
    print(json.dumps({
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cpus",
        "threads": args.threads, "dtype": args.dtype,
        "model": f"qwen3_moe hidden {args.hidden}, {args.layers} layers, {args.experts} experts of {args.moe_inter}, "
                 f"top-{args.top_k}, vocab 32000",
        "prompt_tokens": args.prompt_tokens, "decode_steps": args.steps,
        "transformers": {k: round(v, 2) for k, v in hf.items()},
        "ft": {k: round(v, 2) for k, v in ft.items()},
        "decode_ratio_ft_over_transformers": round(ft["decode_tok_s"] / hf["decode_tok_s"], 3),
        "prefill_ratio_ft_over_transformers": round(ft["prefill_tok_s"] / hf["prefill_tok_s"], 3),
    }, indent=1))


if __name__ == "__main__":
    main()
