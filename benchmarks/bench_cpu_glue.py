"""What a CPU decode token costs outside the compiled kernel: Python and torch's small ops (norms,
rotations, routing, casts, views), the part of the CPU-only race against llama.cpp that is not
memory traffic (benchmarks/vs_llamacpp.py --device cpu: whole tokens).

A pulled model is loaded the way `ft run --device cpu` loads it and decodes random ids (as
llama-bench feeds) in interleaved rounds, each round every way once:
- "kernels": as `ft run` decodes;
- "no kernel time": the kernel's big calls (dense GEMV, routed experts, decode attention) made
  to return at once, their outputs left as allocated, so what remains is the glue a token
  (garbage values: only the time means anything);
- with --torch-row-ops, each of the two again with RMSNorm and the rotary embedding in torch's ops
  instead of the kernel's (runtime/layers/norm.py, rope.py: csrc/rows.cpp), to see what a glue
  change is worth on both.
Prints the median ms a token of each way, and the glue's share of a whole token.

    python benchmarks/bench_cpu_glue.py --store /tmp/race/ft --model local/qwen3-30b-a3b-8l-q4_k_m \\
        --threads 2 --torch-row-ops
"""

from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.race.ft_side import _decode, _random_ids  # noqa: E402

KERNEL_CALLS = ("_dense", "_forward", "_selected", "_attend")  # Kernel's ctypes functions that stream weights or the cache


@contextmanager
def no_kernel_time(kernel):
    """The kernel's weight-streaming calls return 0 (success) at once while inside."""
    saved = {name: getattr(kernel, name) for name in KERNEL_CALLS}
    for name in KERNEL_CALLS:
        setattr(kernel, name, lambda *args: 0)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(kernel, name, fn)


@contextmanager
def torch_row_ops(on: bool):
    """RMSNorm and the rotation in torch's ops (the kernel's declined) while inside, where `on`."""
    from runtime.layers import norm, rope

    saved = norm._cpu_kernel_takes, rope._cpu_kernel_takes
    if on:
        norm._cpu_kernel_takes = lambda x, weight: False
        rope._cpu_kernel_takes = lambda x, cos, sin: False
    try:
        yield
    finally:
        norm._cpu_kernel_takes, rope._cpu_kernel_takes = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="the registry (FT_HOME) holding the model")
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="decoded a way a round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--torch-row-ops", action="store_true", help="also each way with torch's RMSNorm and rotation")
    args = ap.parse_args()

    from ftpull.run import load_for_chat
    from registry import Store
    from runtime.experts.cpu_kernels import native_kernel

    kernel = native_kernel()
    if kernel is None:
        raise SystemExit("no CPU kernel here (a C++ compiler is needed): nothing to tell apart")
    ways = [(name, stub, torch_ops) for torch_ops in ((False, True) if args.torch_row_ops else (False,))
            for name, stub in (("kernels", False), ("no kernel time", True))]
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        loaded, chat, _ = load_for_chat(Store(args.store), args.model, dtype=None, num_ctx=1024, overrides={},
                                        threads=args.threads, device="cpu")
        session, gen = chat.session, torch.Generator().manual_seed(0)
        vocab = loaded.config.vocab_size
        for _ in range(args.rounds):
            for name, stub, torch_ops in ways:
                label = name + (", torch row ops" if torch_ops else "")
                session.reset()
                session.model.forward(torch.tensor(_random_ids(16, vocab, gen)), session.state, last_only=True)
                with torch_row_ops(torch_ops), (no_kernel_time(kernel) if stub else _nothing()):
                    seconds = _decode(session.model, session.state, _random_ids(args.tokens, vocab, gen))
                times.setdefault(label, []).append(seconds / args.tokens * 1e3)
    print(f"{args.model}, {args.threads} threads, {args.rounds} rounds of {args.tokens} tokens a way")
    for label, ms in times.items():
        print(f"  {label:32s} {statistics.median(ms):7.3f} ms/token (min {min(ms):.3f})")
    for suffix in (", torch row ops", "") if args.torch_row_ops else ("",):
        whole, glue = (statistics.median(times[w + suffix]) for w in ("kernels", "no kernel time"))
        print(f"  glue share{suffix or ''}: {glue / whole:.1%} of a token")


@contextmanager
def _nothing():
    yield


if __name__ == "__main__":
    main()
