"""Tokens/s through `ft serve` against in-process generation, and time to first token.

    python benchmarks/bench_server.py --model tiny --tokens 128 --reps 5

Same model, prompt and settings (greedy, fixed seed, num_predict) on both sides; the server runs
on loopback and is driven with the real `ollama` client,
streaming. In-process: runtime.engine.Session.generate on an identically planned model. The
model is warmed (loaded, one request) on both sides before timing; each side's prefix cache is
defeated by a per-repetition marker in the prompt so every request prefills its prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

import torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(port: int) -> subprocess.Popen:
    """`ft serve` in its own process (as users run it), so the client does not share its GIL."""
    env = {**os.environ, "FT_HOST": f"127.0.0.1:{port}"}
    proc = subprocess.Popen([sys.executable, "-m", "ftpull", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("ft serve did not start")


def through_api(port: int, model: str, prompt: str, tokens: int, threads: int | None = None) -> tuple[float, float, int]:
    """(seconds to first token, decode tokens/s measured by the client, tokens)."""
    import ollama

    client = ollama.Client(host=f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    first = last = None
    count = 0
    final = None
    for chunk in client.chat(model=model, messages=[{"role": "user", "content": prompt}], stream=True,
                             options={"temperature": 0, "seed": 0, "num_predict": tokens,
                                      **({"num_thread": threads} if threads else {})}):
        now = time.perf_counter()
        if chunk.message.content or chunk.message.thinking or chunk.message.tool_calls:
            first = first or now
            last = now
        if chunk.done:
            final = chunk
        count += 1
    assert final is not None and first is not None and last is not None
    eval_count = int(final.eval_count or 0)
    return first - start, (eval_count - 1) / max(1e-9, last - first), eval_count


def in_process(chat, prompt: str, tokens: int) -> tuple[float, float, int]:
    from runtime.text.sampling import SamplingParams

    marks: list[float] = []
    chat.session.reset()
    ids = chat.tokenizer.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    start = time.perf_counter()
    result = chat.session.generate(ids, SamplingParams(temperature=0, seed=0, max_tokens=tokens),
                                   lambda text: marks.append(time.perf_counter()))
    n = len(result.tokens)
    return marks[0] - start, (n - 1) / max(1e-9, marks[-1] - marks[0]), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--server-threads", type=int, default=None, help="num_thread for the server's model")
    ap.add_argument("--local-threads", type=int, default=None, help="threads for the in-process side (default: planned)")
    args = ap.parse_args()

    from ftpull.pull import pull
    from ftpull.run import load_for_chat
    from registry import Store

    store = Store.default()
    pull(args.model, store)
    port = free_port()
    server = serve(port)
    _, chat, _ = load_for_chat(store, args.model, dtype=None, num_ctx=None, overrides={}, threads=args.local_threads)
    threads = torch.get_num_threads()
    api, local = [], []
    through_api(port, args.model, "warm up", 8, args.server_threads)
    in_process(chat, "warm up", 8)
    for rep in range(args.reps):  # alternate the sides so drift hits both
        prompt = f"[{rep}] Write a short story about a lighthouse keeper."
        sides = [("api", lambda p=prompt: through_api(port, args.model, p, args.tokens, args.server_threads)),
                 ("local", lambda p=prompt: in_process(chat, p, args.tokens))]
        for name, run in sides if rep % 2 == 0 else sides[::-1]:
            (api if name == "api" else local).append(run())
    server.terminate()
    server.wait(timeout=30)
    med = statistics.median
    print(json.dumps({
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cpus", "torch_threads": threads,
        "model": args.model, "tokens": args.tokens, "reps": args.reps,
        "api_tok_s": round(med(r[1] for r in api), 2), "in_process_tok_s": round(med(r[1] for r in local), 2),
        "ratio_api_over_in_process": round(med(a[1] / b[1] for a, b in zip(api, local, strict=True)), 3),
        "api_ttft_ms": round(1000 * med(r[0] for r in api), 1),
        "in_process_ttft_ms": round(1000 * med(r[0] for r in local), 1),
        "tokens_generated": [r[2] for r in api],
    }, indent=1))


if __name__ == "__main__":
    main()
