"""A prompt chunk's experts on the GPU: the grouped-GEMM kernel (two launches a call) against the
padded runs of experts it replaced (records.experts_from_records without the kernel), side by side
in one process, on one bank resident in VRAM as a streamed prefill buffer holds it.

    python3 benchmarks/bench_grouped_experts.py [--tokens 512,2048] [--experts 128] [--reps 20] [--dtype f8_e4m3]

Default shape: Qwen3-30B-A3B's layer (hidden 2048, 128 experts of 768, top-8, bf16 records; `--dtype`
f8_e4m3 for the FP8 release's block-scaled records, q4_k for GGUF ones, with Q4_K_M's q6_k down, mxfp4
for gpt-oss's, with its biases and clamped SwiGLU). Each
figure is the median over `--reps` calls, synchronized, after a warm-up; the routing is uniformly
random (every expert gets about tokens x 8 / 128 pairs). Also checks the two agree (bf16 rounding).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ftw.format import ExpertActivation  # noqa: E402
from runtime.experts.synthetic import random_bank  # noqa: E402
from runtime.gpu import records  # noqa: E402
from runtime.gpu.records import PairPlan, RecordViews, experts_from_records  # noqa: E402


def timed(fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="512,2048")
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtype", default="bf16", help="the records: bf16, f8_e4m3, q4_k (Q4_K_M's mix), ...")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU (the kernel is the device path; the CPU runs the padded runs only)")
    down = "q6_k" if args.dtype == "q4_k" else None
    gpt_oss = {"activation": ExpertActivation("swiglu_clamped", 1.702, 7.0), "bias_dtype": "bf16"}  # (its experts)
    bank = random_bank(args.dtype, args.experts, args.hidden, args.inter, num_distinct=8, down_dtype=down,
                       **(gpt_oss if args.dtype == "mxfp4" else {}))
    rows = bank.data.cuda()
    views = RecordViews(rows, bank.layout)
    gen = torch.Generator().manual_seed(0)
    print(f"{args.dtype} records, grouped kernel: {records.grouped_kind(views, torch.bfloat16)}")
    print(f"{'tokens':>7} {'grouped ms':>11} {'padded ms':>10} {'speed-up':>9} {'max |diff| / max':>17}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        grouped, padded, diff = compare(tokens, views, gen, args)
        print(f"{tokens:>7} {grouped:>11.3f} {padded:>10.3f} {padded / grouped:>8.2f}x {diff:>17.2e}")


def compare(tokens: int, views: RecordViews, gen: torch.Generator, args: argparse.Namespace) -> tuple[float, float, float]:
    """(grouped ms, padded ms, max |difference| / max |output|) for one call of `tokens` random-routed tokens."""
    ids = torch.stack([torch.randperm(args.experts, generator=gen)[: args.top_k] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, args.top_k, generator=gen), -1).cuda()
    x = torch.randn(tokens, args.hidden, generator=gen).cuda().to(torch.bfloat16)
    plan = PairPlan.of_every_expert(ids.cuda(), ids)
    outs: dict[str, torch.Tensor] = {}

    def run(name: str) -> None:
        outs[name] = torch.zeros(tokens, args.hidden, device="cuda")
        experts_from_records(x, weights, plan, views, torch.bfloat16, outs[name])

    kernel = records._grouped_kernel
    grouped = timed(lambda: run("grouped"), args.reps)
    records._grouped_kernel = lambda *a: None  # the padded runs, as before the kernel
    try:
        padded = timed(lambda: run("padded"), args.reps)
    finally:
        records._grouped_kernel = kernel
    diff = (outs["grouped"] - outs["padded"]).abs().max().item() / outs["padded"].abs().max().item()
    return grouped, padded, diff


if __name__ == "__main__":
    main()
