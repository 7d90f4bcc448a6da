"""Where one decode token's time goes: a pulled model loaded the way `ft run` loads it (the fit
plan at `--vram-gib`, the hybrid runtime in `--mode`), a warm-up, then `--tokens` random ids
decoded under torch's profiler. Prints the decode rate with and without the profiler, and the
device kernels and host ops that took the most time per token, so a slow path (a kernel, a
launch storm, a host wait) has a name.

For the race's files (benchmarks/vs_llamacpp.py pull), on the GPU machine:

    FT_CUDA_GRAPHS=0 python3 benchmarks/profile_decode.py --store /tmp/race/ft \\
        --model local/qwen3-30b-a3b-16l-q4_k_m --vram-gib 12 --threads 8
    python3 benchmarks/profile_decode.py --store /tmp/race/ft --model local/qwen3-30b-a3b-16l-bf16 \\
        --vram-gib 12 --threads 8 --trace .traces/qwen3-30b-a3b.npz

With step graphs on (the default) the kernels of a replayed step are still listed where the
profiler can see into graphs (CUPTI's graph tracing); FT_CUDA_GRAPHS=0 names every launch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.race.ft_side import _decode, _random_ids, _route_by_trace  # noqa: E402


def _top(events, key: str, per: int, limit: int) -> list[dict]:
    rows = []
    for e in events:
        total_us = getattr(e, key, 0.0)
        if total_us <= 0:
            continue
        rows.append({"name": e.key[:90], "us_per_token": round(total_us / per, 1), "calls_per_token": e.count / per})
    rows.sort(key=lambda r: -r["us_per_token"])
    return rows[:limit]


def show(report: dict, per: str, out: Path | None) -> None:
    """Print `report` (its figures, then its device kernels and host ops, in us per `per`), and
    write it whole as JSON to `out` where given."""
    print(json.dumps({k: v for k, v in report.items() if k not in ("device_kernels", "host_ops")}, indent=1))
    for title, rows in (("device kernels", report["device_kernels"]), ("host ops", report["host_ops"])):
        print(f"\n{title}, us per {per} (calls per {per}):")
        for r in rows:
            print(f"  {r['us_per_token']:10.1f}  ({r['calls_per_token']:7.1f})  {r['name']}")
    if out is not None:
        out.write_text(json.dumps(report, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the registry (FT_HOME) holding the model")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--vram-gib", type=float, help="ft's VRAM budget (the planner's own where left out)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--tokens", type=int, default=64, help="decoded under the profiler")
    parser.add_argument("--warm-tokens", type=int, default=128, help="decoded first, unprofiled, timed")
    parser.add_argument("--trace", type=Path, help="route decode by this recorded trace (benchmarks/race/ft_side.py)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args()

    from ftpull.run import load_for_chat
    from registry import Store

    with torch.inference_mode():
        loaded, chat, load_s = load_for_chat(Store(args.store), args.model, dtype=None, num_ctx=1024, overrides={},
                                             threads=args.threads, device=args.device, vram_gib=args.vram_gib,
                                             mode=args.mode)
        session, gen = chat.session, torch.Generator().manual_seed(0)
        model, vocab = session.model, loaded.config.vocab_size
        if args.trace is not None:
            _route_by_trace(model, args.trace, loaded.config, torch.device(getattr(model, "device", "cpu")))
        session.reset()
        model.forward(torch.tensor(_random_ids(1, vocab, gen)), session.state, last_only=True)
        seconds = _decode(model, session.state, _random_ids(args.warm_tokens, vocab, gen))
        plain_rate = args.warm_tokens / seconds
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and args.device != "cpu":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            start = time.perf_counter()
            _decode(model, session.state, _random_ids(args.tokens, vocab, gen))
            profiled_s = time.perf_counter() - start
    events = prof.key_averages()
    experts = loaded.experts
    report = {
        "model": args.model, "vram_gib": args.vram_gib, "threads": args.threads, "mode": args.mode,
        "trace": str(args.trace) if args.trace else None, "load_s": round(load_s, 1),
        "cache_slots": experts.cache.num_slots if experts is not None and hasattr(experts, "cache") else 0,
        "tok_s": round(plain_rate, 1), "tok_s_profiled": round(args.tokens / profiled_s, 1),
        "expert_stats": experts.stats().as_dict() if experts is not None else {},
        "device_us_per_token": round(sum(e.self_device_time_total for e in events) / args.tokens, 1),
        "device_kernels": _top(events, "self_device_time_total", args.tokens, args.top),
        "host_ops": _top(events, "self_cpu_time_total", args.tokens, args.top),
    }
    show(report, "token", args.out)


if __name__ == "__main__":
    main()
