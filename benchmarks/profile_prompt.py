"""Where a prompt's time goes: a pulled model loaded the way `ft run` loads it (the fit plan at
`--vram-gib`, the hybrid runtime in `--mode`), one unmeasured prompt, `--reps` timed ones, then
one under torch's profiler. Prints the prompt rate with and without the profiler, the executor's
prefill counters (layer calls, bytes streamed, experts read from the cache) and the device
kernels and host ops that took the most time per prompt, so a slow path (a kernel, a host wait,
a round of cache fills) has a name; on CUDA, one more prompt under torch's sync debug mode counts
the implicit host waits by the line of ft's code that made them (a prompt's path should make
none but its planned downloads). profile_decode.py is its decode twin.

For the race's files (benchmarks/vs_llamacpp.py pull), on the GPU machine, at the budget of
llama.cpp's -ncmoe 16 (its 1,451 MiB less ft's CUDA context, 621):

    python3 benchmarks/profile_prompt.py --store /tmp/race/ft --model local/qwen3-30b-a3b-16l-q4_k_m \\
        --vram-gib 0.8105 --threads 8 --tokens 512
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.profile_decode import _top, show  # noqa: E402
from benchmarks.race.ft_side import _random_ids, _sync  # noqa: E402


def _implicit_syncs(run) -> dict[str, int]:
    """`run()` under torch.cuda's sync debug mode: each implicit host wait counted by the innermost
    line of this repository's code below it (its own frames, not torch's or this script's)."""
    sites: Counter[str] = Counter()
    root = str(ROOT)

    def note(message, category, filename, lineno, file=None, line=None) -> None:
        frames = [f for f in traceback.extract_stack()[:-1]
                  if f.filename.startswith(root) and "benchmarks" not in f.filename]
        where = f"{Path(frames[-1].filename).relative_to(root)}:{frames[-1].lineno} {frames[-1].line}" if frames else filename
        sites[where] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return dict(sites.most_common())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", type=Path, required=True, help="the registry (FT_HOME) holding the model")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--vram-gib", type=float, help="ft's VRAM budget (the planner's own where left out)")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--tokens", type=int, default=512, help="the prompt's length (random ids)")
    parser.add_argument("--reps", type=int, default=3, help="timed prompts before the profiled one")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--trace", type=Path,
                        help="also write the profiled prompt's timeline here (Chrome trace, gzipped, with Python "
                             "stacks: where the host's time between the device's kernels goes; chrome://tracing "
                             "or ui.perfetto.dev); the host ops then count Python functions too, by their own time)")
    args = parser.parse_args()

    from ftpull.run import load_for_chat
    from registry import Store

    with torch.inference_mode():
        loaded, chat, load_s = load_for_chat(Store(args.store), args.model, dtype=None,
                                             num_ctx=max(1024, args.tokens + 64), overrides={}, threads=args.threads,
                                             device=args.device, vram_gib=args.vram_gib, mode=args.mode)
        session, gen = chat.session, torch.Generator().manual_seed(0)
        model, vocab, experts = session.model, loaded.config.vocab_size, loaded.experts
        device = torch.device(getattr(model, "device", "cpu"))

        def prompt() -> float:
            session.reset()
            ids = torch.tensor(_random_ids(args.tokens, vocab, gen))
            _sync(device)
            start = time.perf_counter()
            model.forward(ids, session.state, last_only=True)
            _sync(device)
            return time.perf_counter() - start

        prompt()  # unmeasured: kernels compile, the bandwidth profile loads
        if experts is not None:
            experts.reset_stats()
        seconds = [prompt() for _ in range(args.reps)]
        stats = experts.stats().as_dict() if experts is not None else {}
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities, with_stack=args.trace is not None) as prof:
            profiled_s = prompt()
        if args.trace is not None:
            _write_trace(prof, args.trace)
        syncs = _implicit_syncs(prompt) if device.type == "cuda" else {}
    events = prof.key_averages()
    report = {
        "model": args.model, "vram_gib": args.vram_gib, "threads": args.threads, "mode": args.mode,
        "tokens": args.tokens, "load_s": round(load_s, 1),
        "cache_slots": experts.cache.num_slots if experts is not None and hasattr(experts, "cache") else 0,
        "tok_s": [round(args.tokens / s, 1) for s in seconds],
        "tok_s_median": round(args.tokens / statistics.median(seconds), 1),
        "tok_s_profiled": round(args.tokens / profiled_s, 1),
        "expert_stats_per_prompt": {k: (v / args.reps if isinstance(v, (int, float)) else v) for k, v in stats.items()},
        "device_us": round(sum(e.self_device_time_total for e in events), 1),
        "implicit_syncs": syncs,
        "device_kernels": _top(events, "self_device_time_total", 1, args.top),
        "host_ops": _top(events, "self_cpu_time_total", 1, args.top),
    }
    show(report, "prompt", args.out)


def _write_trace(prof: torch.profiler.profile, path: Path) -> None:
    """The profile's Chrome trace, gzipped (a 512-token prompt's is tens of MB as text)."""
    raw = path.with_name(path.name + ".json.tmp")
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


if __name__ == "__main__":
    main()
