"""Prefill throughput and peak memory by prompt length: ft against transformers, and optionally
against another checkout of ft (`--baseline DIR`, e.g. a `git worktree` of an older commit), side
by side in one run.

A random Qwen3-MoE (as bench_decode.py builds it) is saved once and pulled into a temporary store;
each (side, length) then runs in its own process, so its peak RSS is its own: one untimed prefill,
then the median of `--reps` timed ones. ft's prefill is Session's (a fresh state, logits of the
last token); transformers' is `model(ids)` with its default attention.

    python benchmarks/bench_prefill.py --threads 2 --lengths 128,2048,8192
    git worktree add /tmp/ft-old <commit> && python benchmarks/bench_prefill.py --baseline /tmp/ft-old
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(side: str, length: int, reps: int, threads: int, src: Path, store: Path, name: str) -> dict[str, float]:
    """In this process: prefill `length` tokens `reps` times (after one untimed), median tok/s, peak RSS."""
    import torch

    torch.set_num_threads(threads)
    prompt = torch.randint(0, 32000, (length,), generator=torch.Generator().manual_seed(0))
    if side == "transformers":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).eval()

        def run() -> None:
            with torch.no_grad():
                model(prompt[None])
    else:
        from registry import Store
        from runtime.engine import GenerationStats, Session
        from runtime.loading.runnable import load

        loaded = load(Store(store), name, torch.bfloat16)

        def run() -> None:
            Session(loaded.model, None, length + 1)._prefill(prompt.tolist(), GenerationStats())  # type: ignore[arg-type]

    from bench_decode import median_seconds  # this script's folder leads sys.path

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = median_seconds(run, reps)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"tok_s": length / seconds, "prefill_peak_gib": (peak - before) / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lengths", default="128,2048,8192")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--baseline", type=Path, default=None, help="Another ft checkout to run beside this one.")
    ap.add_argument("--one", nargs=5, metavar=("SIDE", "LENGTH", "SRC", "STORE", "NAME"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        side, length, src, store, name = args.one
        print(json.dumps(measure(side, int(length), args.reps, args.threads, Path(src), Path(store), name)))
        return
    sides = {"ft": ROOT, "transformers": ROOT}
    if args.baseline:
        sides["ft baseline"] = args.baseline.resolve()
    results: dict[str, dict[int, dict[str, float]]] = {side: {} for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        src, store = Path(tmp) / "hf", Path(tmp) / "store"
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import bench_decode

        bench_decode.build(src, argparse.Namespace(hidden=1024, moe_inter=512, layers=args.layers, experts=64,
                                                   top_k=8, dtype="bf16", embedding_scale=10.0))
        from ftpull.pull import pull
        from registry import Store

        name = str(pull(str(src), Store(store)).name)
        for length in (int(n) for n in args.lengths.split(",")):
            for side, code in sides.items():
                reps = args.reps if length <= 2048 else 1
                done = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--threads", str(args.threads), "--reps", str(reps),
                     "--one", "transformers" if side == "transformers" else "ft", str(length), str(src), str(store), name],
                    env={**os.environ, "PYTHONPATH": str(code)}, cwd=code, capture_output=True, text=True, check=True)
                results[side][length] = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"{side:>13} {length:>6} tokens: {results[side][length]['tok_s']:8.1f} tok/s, "
                      f"peak +{results[side][length]['prefill_peak_gib']:.2f} GiB", flush=True)
    print(json.dumps({"threads": args.threads, "layers": args.layers, "results": results}, indent=1))


if __name__ == "__main__":
    main()
