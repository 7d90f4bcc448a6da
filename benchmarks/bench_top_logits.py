"""Device time of taking a decode step's best logits (runtime/text/top_logits.py `take_top`), against a
two-stage top-k (the best of each 1,024-long piece, then the best of those), on a vocabulary-long
row. A Q4_K_M decode step of the race spent ~78 us of its ~2,500 in torch.topk's radix passes
(benchmarks/profile_decode.py, H100 host, ca2f3f4).

    python3 benchmarks/bench_top_logits.py [--vocab 151936] [--count 64]

GPU only; prints one JSON object: microseconds per call for each, and whether they agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runtime.text.top_logits import take_top  # noqa: E402

PIECE = 1024


def two_stage(row: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    pieces = -(-row.numel() // PIECE)
    padded = torch.nn.functional.pad(row.to(torch.float32), (0, pieces * PIECE - row.numel()), value=float("-inf"))
    values, local = torch.topk(padded.view(pieces, PIECE), count)
    ids = local + torch.arange(0, pieces * PIECE, PIECE, device=row.device)[:, None]
    best, at = torch.topk(values.flatten(), count)
    return best, ids.flatten()[at]


def _device_us(fn, reps: int = 200) -> float:
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return 1e3 * start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--count", type=int, default=64)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_top_logits.py needs a CUDA GPU")
    row = torch.randn(args.vocab, device="cuda")
    values, ids, _ = take_top(row, args.count)
    best, best_ids = two_stage(row, args.count)
    result = {"vocab": args.vocab, "count": args.count,
              "take_top_us": round(_device_us(lambda: take_top(row, args.count)), 1),
              "two_stage_us": round(_device_us(lambda: two_stage(row, args.count)), 1),
              "same": bool(torch.equal(values, best) and torch.equal(ids, best_ids)),
              "gpu": torch.cuda.get_device_name()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
