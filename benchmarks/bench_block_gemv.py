"""Decode's GGML block GEMV on the GPU (runtime/gpu/kernels/block_gemv.py) at a Qwen3-30B-A3B
Q4_K_M model's shapes (and gpt-oss-20b's MXFP4 experts), against cuBLAS's bf16 GEMV of the same shape (the bandwidth a kernel
that reads every byte once can reach), side by side in one process:

- experts: one token's 8 routed experts read from cache slots (gate and up, Q4_K, [1536, 2048];
  down, Q6_K, [2048, 768]);
- dense: the attention's q projection (Q4_K, [4096, 2048]) and the output head (Q6_K,
  [151936, 2048]), one weight each.

Prints microseconds a call and GB/s of stored bytes for each kernel shape at each (rows a
program, super-blocks of a row side by side, warps) in `--tiles`, and bf16 cuBLAS's. The bytes are random (a speed test: the values
do not matter; tests/test_block_gemv.py holds the results to gguf-py's).

    python3 benchmarks/bench_block_gemv.py
    python3 benchmarks/bench_block_gemv.py --tiles 8x8x4,16x4x8,32x2x8 --reps 200
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from runtime.gpu.kernels.block_gemv import block_gemv  # noqa: E402
from runtime.gpu.kernels.ggml_dequant import KINDS, MXFP4_BLOCK_BYTES, SUPER_BLOCK_BYTES  # noqa: E402

# (name, kind, rows, cols, pairs): what one decode token of the Q4_K_M race file multiplies
SHAPES = [
    ("experts gate+up", "q4_k", 1536, 2048, 8),
    ("experts down", "q6_k", 2048, 768, 8),
    ("q_proj", "q4_k", 4096, 2048, 1),
    ("output head", "q6_k", 151936, 2048, 1),
    # gpt-oss-20b's MXFP4 experts (its GGUF's): one token's 4, [2 x 2880, 2880] and [2880, 2880]
    ("gpt-oss experts gate+up", "mxfp4", 5760, 2880, 4),
    ("gpt-oss experts down", "mxfp4", 2880, 2880, 4),
]


def _time_us(fn, reps: int) -> float:
    """Device microseconds a call: `reps` calls captured in one CUDA graph and replayed, as decode
    runs them (timed launch by launch, a Triton kernel of a few microseconds measures the ~20 us
    its Python launcher takes on the host instead)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return 1e3 * start.elapsed_time(end) / (3 * reps)


def _measure(name: str, kind: str, rows: int, cols: int, pairs: int, tiles: dict[str, dict], reps: int,
             gen: torch.Generator) -> dict:
    part = rows * cols // 32 * MXFP4_BLOCK_BYTES if kind == "mxfp4" else rows * cols // 256 * SUPER_BLOCK_BYTES[KINDS[kind]]
    slots = torch.randint(0, 256, (pairs, part), dtype=torch.uint8, device="cuda", generator=gen)
    inputs = torch.randn(1, cols, device="cuda", dtype=torch.bfloat16, generator=gen)
    index = torch.zeros(pairs, dtype=torch.int32, device="cuda")
    slot_of = torch.arange(pairs, dtype=torch.int32, device="cuda")
    dense = torch.randn(pairs, rows, cols, device="cuda", dtype=torch.bfloat16, generator=gen)
    bf16_us = _time_us(lambda: torch.matmul(dense, inputs[0]), reps)
    row = {"shape": name, "kind": kind, "rows": rows, "cols": cols, "pairs": pairs, "stored_mb": pairs * part / 1e6,
           "bf16_cublas_us": round(bf16_us, 1), "bf16_gbps": round(dense.numel() * 2 / bf16_us / 1e3, 1)}
    for tile, chosen in tiles.items():
        us = _time_us(lambda: block_gemv(inputs, index, slots, slot_of, part_offset=0, kind=kind,  # noqa: B023
                                         rows=rows, cols=cols, **chosen), reps)  # noqa: B023
        row[f"{tile}_us"] = round(us, 1)
        row[f"{tile}_gbps"] = round(pairs * part / us / 1e3, 1)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiles", default="default,8x4x4,8x8x4,16x4x4,16x8x8,32x2x8,32x4x8,8x1x2",
                        help="rows a program x super-blocks side by side x warps, comma-separated; `default`: "
                             "the kernel's own choice (MXFP4 reads 8 blocks a step whatever the middle figure)")
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_block_gemv times the CUDA kernel: run it on the GPU machine "
                         "(tests/test_block_gemv.py checks it on the CPU)")
    tiles = {t: {} if t == "default" else {"tile": tuple(map(int, t.split("x")))} for t in args.tiles.split(",")}
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows_out = []
    for shape in SHAPES:
        rows_out.append(_measure(*shape, tiles, args.reps, gen))
        print(json.dumps(rows_out[-1]), flush=True)
    print(f"device: {torch.cuda.get_device_name()}")
    if args.out is not None:
        args.out.write_text(json.dumps(rows_out, indent=1))


if __name__ == "__main__":
    main()
