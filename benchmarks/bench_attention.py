"""CPU decode attention by context length: torch's grouped matmuls against the compiled kernel
(runtime/layers/attention.py, ft_decode_attention), Qwen3-30B-A3B's heads (32 query, 4 kv, 128).

    python benchmarks/bench_attention.py --threads 2 --lengths 64,1024,8192,32768
"""

from __future__ import annotations

import argparse
import os

import torch
from bench_dense import ms_per_call  # this script's folder leads sys.path

from runtime.layers import attention


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lengths", default="64,1024,8192,32768")
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    h, g, d = args.kv_heads, args.group, args.head_dim
    print(f"{args.threads} threads; {h * g} query heads, {h} kv heads, head dim {d}, bf16 cache")
    for length in (int(n) for n in args.lengths.split(",")):
        k, v = torch.randn(length, h, d).bfloat16(), torch.randn(length, h, d).bfloat16()
        q = torch.randn(1, h * g, d).bfloat16()
        with torch.inference_mode():
            attention.DECODE_KERNEL_MIN_LENGTH = 1 << 62
            t_torch = ms_per_call(lambda k=k, v=v, q=q, n=length: attention.causal_attention(q, k, v, n - 1, 0.1), args.reps)
            attention.DECODE_KERNEL_MIN_LENGTH = 64
            t_kernel = ms_per_call(lambda k=k, v=v, q=q, n=length: attention.causal_attention(q, k, v, n - 1, 0.1), args.reps)
        mb = 2 * k.numel() * 2 / 1e6
        print(f"  {length:>6} positions ({mb:6.1f} MB): torch {t_torch:8.3f} ms {mb / t_torch:5.1f} GB/s | kernel "
              f"{t_kernel:8.3f} ms {mb / t_kernel:5.1f} GB/s | {t_torch / t_kernel:.1f}x")


if __name__ == "__main__":
    main()
