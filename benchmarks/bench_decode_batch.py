"""What batching the decode of several streams could be worth (issue 23: concurrent agent
requests): a decode step of T tokens against T steps of one, on a pulled model loaded the way `ft
run` loads it (CPU or GPU).

A step of T tokens reads the dense weights (attention projections, router, LM head) once for all
of them and each token's experts, so its cost over one token's is what T streams decoded together
would pay for T tokens. The T tokens here are one sequence's (T positions of one cache): the
weights read are a batch of T streams', the attention is not (a stream's own cache would be read
per stream, as one token's is), which at short contexts is a small part of a step. Random ids, as
llama-bench feeds: each token routes on its own, the realistic worst case for shared experts.

Prints, per T, the step's median ms, its cost in one-token steps, and the tokens a second T
batched streams would get over one stream's.

With --streams N, what the server's batching gets (runtime/server/batching.py): N generations,
each in its own session on its own thread as `ft serve` runs them on the CPU, greedy from random
prompts, their passes through the server's model wrapper (scheduler.CancellableModel) with the
batcher and without it (turns, one pass at a time), every pass on the wrapper's one thread as the
server runs them, and without it too (each generation's passes on its own thread, as before), in
alternating rounds; prints the tokens a second of all N together each way.

    python benchmarks/bench_decode_batch.py --store /tmp/race/ft --model local/qwen3-30b-a3b-8l-q4_k_m \\
        --device cpu --threads 2
    python benchmarks/bench_decode_batch.py --store /tmp/race/ft --model local/qwen3-30b-a3b-8l-q4_k_m \\
        --device cpu --threads 2 --streams 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.race.ft_side import _random_ids, _sync  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="the registry (FT_HOME) holding the model")
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vram-gib", type=float, help="ft's VRAM budget on the GPU (the planner's own where left out)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", default="1,2,3,4", help="tokens a step, comma-separated (1 is the baseline)")
    ap.add_argument("--steps", type=int, default=24, help="steps a way a round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--context", type=int, default=128, help="prompt tokens before each way's steps")
    ap.add_argument("--streams", type=int, default=0, help="generations at once through the server's batching")
    args = ap.parse_args()
    if args.streams:
        streams(args)
        return
    sizes = sorted({1, *(int(b) for b in args.batch.split(","))})

    from ftpull.run import load_for_chat
    from registry import Store

    times: dict[int, list[float]] = {}
    with torch.inference_mode():
        loaded, chat, _ = load_for_chat(Store(args.store), args.model, dtype=None,
                                        num_ctx=args.context + args.steps * max(sizes) + 1, overrides={},
                                        threads=args.threads, device=args.device, vram_gib=args.vram_gib)
        session, gen = chat.session, torch.Generator().manual_seed(0)
        model, vocab = session.model, loaded.config.vocab_size
        device = torch.device(getattr(model, "device", "cpu"))
        for _ in range(args.rounds):
            for size in sizes:
                session.reset()
                model.forward(torch.tensor(_random_ids(args.context, vocab, gen)), session.state, last_only=True)
                _sync(device)
                start = time.perf_counter()
                for _ in range(args.steps):
                    model.forward(torch.tensor(_random_ids(size, vocab, gen)), session.state).argmax(-1).tolist()
                _sync(device)
                times.setdefault(size, []).append((time.perf_counter() - start) / args.steps * 1e3)
    one = statistics.median(times[1])
    print(f"{args.model} on {args.device}, {args.threads} threads, {args.rounds} rounds of {args.steps} steps, "
          f"after {args.context} prompt tokens")
    for size in sizes:
        ms = statistics.median(times[size])
        print(f"  {size} a step: {ms:7.2f} ms, {ms / one:.2f}x one token's step, "
              f"{size * one / ms:.2f}x the tokens a second of one stream")


def _generate(session, prompt: list[int], params, made: list[int], i: int) -> None:
    made[i] = len(session.generate(prompt, params).tokens)


def streams(args: argparse.Namespace) -> None:
    """--streams: N threaded generations with and without the server's batcher, alternating rounds."""
    import threading

    from ftpull.run import load_for_chat
    from registry import Store
    from runtime.engine import Session
    from runtime.server.batching import DecodeBatcher, pass_thread
    from runtime.server.scheduler import CancellableModel
    from runtime.text.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=args.steps)
    rates: dict[str, list[float]] = {}
    batched: list[float] = []  # the share of decoded tokens whose step ran in a batch
    with torch.inference_mode():
        loaded, chat, _ = load_for_chat(Store(args.store), args.model, dtype=None, num_ctx=args.context + args.steps + 8,
                                        overrides={}, threads=args.threads, device=args.device, vram_gib=args.vram_gib)
        gen = torch.Generator().manual_seed(0)
        for _ in range(args.rounds):
            for way, batcher, one_thread in (("batched", DecodeBatcher(), True), ("turns", None, True),
                                             ("turns, own threads", None, False)):
                model = CancellableModel(loaded.model, batcher=batcher, passes=pass_thread() if one_thread else None)
                sessions = [Session(model, chat.session.tokenizer, args.context + args.steps + 8)  # type: ignore[arg-type]
                            for _ in range(args.streams)]
                prompts = [_random_ids(args.context, loaded.config.vocab_size, gen) for _ in sessions]
                made = [0] * len(sessions)
                threads = [threading.Thread(target=_generate, args=(sessions[i], prompts[i], greedy, made, i))
                           for i in range(len(sessions))]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                rates.setdefault(way, []).append(sum(made) / (time.perf_counter() - start))
                model.close()
                if batcher is not None:
                    batched.append(batcher.batched_steps / max(1, sum(made)))
    print(f"{args.model} on {args.device}, {args.threads} threads, {args.streams} generations of {args.steps} tokens "
          f"after {args.context}-token prompts, {args.rounds} rounds (prompts included in the time)")
    for way, r in rates.items():
        print(f"  {way:20s} {statistics.median(r):7.1f} tok/s together (rounds: {', '.join(f'{x:.1f}' for x in r)})")
    print(f"  batched / turns: {statistics.median(rates['batched']) / statistics.median(rates['turns']):.2f}x, "
          f"turns / turns on the generations' own threads (before 2026-12-08): "
          f"{statistics.median(rates['turns']) / statistics.median(rates['turns, own threads']):.2f}x; "
          f"steps run in batches: {statistics.median(batched):.0%} of the tokens")


if __name__ == "__main__":
    main()
