"""Decode-sized dense products on the CPU: torch's GEMV against the compiled kernel
(runtime/layers/linear.py), as raw GB/s per weight shape and as decode tok/s of a model with the
kernel's size floor (DENSE_KERNEL_MIN_BYTES) at several values, in interleaved rounds.

    python benchmarks/bench_dense.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

SHAPES = [(151936, 2048), (32000, 1024), (4096, 2048), (2048, 4096), (512, 2048)]  # Qwen3 LM heads and projections
FLOORS = {"torch only": 1 << 62, "1 MiB": 1 << 20, "256 KiB": 256 << 10, "64 KiB": 64 << 10}


def ms_per_call(fn, reps: int = 20) -> float:
    """Mean ms per call of `fn` over `reps` calls, after three untimed (also bench_attention's)."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=48)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from runtime.experts.cpu_kernels import native_kernel
    from runtime.layers import linear as linear_mod

    kernel = native_kernel()
    if kernel is None:
        sys.exit("no compiled kernel here (no C++ compiler): nothing to compare")
    print(f"{args.threads} threads; bf16 weights, 1 token (GB/s = weight bytes / time)")
    with torch.inference_mode():
        for rows, cols in SHAPES:
            w, x = torch.randn(rows, cols).bfloat16(), torch.randn(1, cols).bfloat16()
            t_torch = ms_per_call(lambda x=x, w=w: F.linear(x, w))
            t_kernel = ms_per_call(lambda x=x, w=w: kernel.dense(x, w, args.threads))
            gb = rows * cols * 2 / 1e6
            print(f"  {rows:>6} x {cols:<5} torch {t_torch:7.3f} ms {gb / t_torch:6.1f} GB/s | kernel {t_kernel:7.3f} ms "
                  f"{gb / t_kernel:6.1f} GB/s | {t_torch / t_kernel:.2f}x")

    import bench_decode

    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "hf"
        bench_decode.build(src, argparse.Namespace(hidden=1024, moe_inter=512, layers=6, experts=64, top_k=8,
                                                   dtype="bf16", embedding_scale=10.0))
        store = Store(Path(tmp) / "store")
        model = load(store, str(pull(str(src), store).name), torch.bfloat16).model
        prompt = torch.randint(0, 32000, (128,), generator=torch.Generator().manual_seed(0))

        def decode_tok_s() -> float:
            state = model.new_state(128 + args.steps + 1)
            logits = model.forward(prompt, state, last_only=True)
            start = time.perf_counter()
            for _ in range(args.steps):
                logits = model.forward(torch.tensor([int(logits[-1].argmax())]), state)
            return args.steps / (time.perf_counter() - start)

        runs: dict[str, list[float]] = {name: [] for name in FLOORS}
        for _ in range(args.rounds):
            for name, floor in FLOORS.items():
                linear_mod.DENSE_KERNEL_MIN_BYTES = floor
                runs[name].append(decode_tok_s())
    print("decode, bench_decode's model (hidden 1024, 6 layers, 64 experts of 512, top-8, bf16), 128-token prompt:")
    for name, values in runs.items():
        print(f"  kernel floor {name:>10}: {statistics.median(values):7.1f} tok/s (rounds {', '.join(f'{v:.1f}' for v in values)})")


if __name__ == "__main__":
    main()
