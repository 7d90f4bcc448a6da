"""Coding-agent sessions replayed against `ft serve` through the real `anthropic` client, as Claude
Code drives a server: a long system prompt and tool list, then turns that each append the agent's
tool call and its result to the history, short side requests with their own system prompt (a
title) between them, one turn whose history rewrites an earlier tool call, and further sessions
of the same agent (its system prompt and tools, another task) running at the same time.

The assistant turns in the history are the recorded ones (the replay's tool calls), not the
model's replies, so a turn's prompt shares with the session's state everything up to the reply it
generated last: what a server can serve from its cache. Every request streams; per request it
records the time to the first streamed token (TTFT), the decode rate after it, and the cache hit
the API reports (`cache_read_input_tokens`). A single short request first, alone, gives the
decode rate an agent's turns are compared with.

    python3 benchmarks/agent_replay.py --url http://127.0.0.1:11435 --model qwen3-30b-a3b \\
        --system-words 15000 --turns 30 --result-words 1000 --sessions 2 --out agent.json

Prints one line a request and the summary (TTFT median and worst over the main turns, the share of
prompt tokens served from cache, decode against the single request); `--out` gets all of it as
JSON. tests/test_agent_replay.py runs it on the tiny model (reuse and fairness, not speed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORDS = ("def return self import class module test assert value index buffer token layer cache path "
         "error config stream request server client kernel tensor shape batch expert route plan file "
         "line read write parse build check fix patch diff commit branch merge queue thread lock").split()

TOOLS = [
    {"name": "read_file", "description": "Read a file of the repository.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "bash", "description": "Run a shell command in the repository and return its output.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "edit_file", "description": "Replace a string in a file.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                      "new": {"type": "string"}},
                      "required": ["path", "old", "new"]}},
]
SIDE_SYSTEM = "Write a five-word title for this conversation. Answer with the title only."


@dataclass(frozen=True)
class Workload:
    """The shape of each replayed session (sizes in words of filler text; the server's tokenizer
    makes them tokens, reported per request)."""

    system_words: int = 15000  # the system prompt (with the tool list: Claude Code's ~20k tokens)
    turns: int = 30  # tool calls and results appended, one request each
    result_words: int = 1000  # a tool result's length
    side_every: int = 5  # a side request after every this many turns (0: none)
    edit_at: int = 12  # this turn's history rewrites the tool call of turn edit_at // 2 (0: none)
    max_tokens: int = 32  # generated a request
    seed: int = 0


@dataclass(frozen=True)
class Request:
    session: int
    turn: int
    kind: str  # "single" (the baseline), "main", "edit" (a main turn after the rewrite), "side"
    input_tokens: int  # prompt tokens not served from cache
    cached_tokens: int  # prompt tokens served from cache (cache_read_input_tokens)
    output_tokens: int
    ttft_s: float  # from sending to the first streamed token (to the end where none came)
    decode_tok_s: float | None  # output tokens after the first, over the time after it
    started_s: float  # since the replay began
    total_s: float


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _call(rng: random.Random, session: int, turn: int, path: str | None = None) -> dict:
    name = rng.choice([t["name"] for t in TOOLS])
    path = path or f"src/{rng.choice(WORDS)}_{turn}.py"
    inputs = {"read_file": {"path": path}, "bash": {"command": f"pytest -q tests/test_{rng.choice(WORDS)}.py"},
              "edit_file": {"path": path, "old": rng.choice(WORDS), "new": rng.choice(WORDS)}}[name]
    return {"type": "tool_use", "id": f"toolu_{session:02d}_{turn:03d}", "name": name, "input": inputs}


def _ask(client, model: str, system: str, messages: list, workload: Workload, tools: list | None, *,
         session: int, turn: int, kind: str, t0: float) -> Request:
    sent = time.perf_counter()
    first = None
    with client.messages.stream(model=model, max_tokens=workload.max_tokens, system=system, messages=messages,
                                tools=tools or [], extra_body={"temperature": 0}) as stream:
        for event in stream:
            if first is None and event.type == "content_block_delta":
                first = time.perf_counter()
        final = stream.get_final_message()
    end = time.perf_counter()
    usage, first = final.usage, first or end
    out = usage.output_tokens
    return Request(session=session, turn=turn, kind=kind, input_tokens=usage.input_tokens,
                   cached_tokens=usage.cache_read_input_tokens or 0, output_tokens=out, ttft_s=first - sent,
                   decode_tok_s=(out - 1) / (end - first) if out > 1 and end > first else None,
                   started_s=sent - t0, total_s=end - sent)


def run_session(client, model: str, workload: Workload, session: int, t0: float, records: list[Request],
                lock: threading.Lock) -> None:
    """One agent session: its turns in order, side requests between them; each request's record
    appended to `records` as it ends."""
    rng = random.Random(workload.seed * 1000 + session)
    system = "You are a coding agent. " + _text(random.Random(workload.seed), workload.system_words)  # (one agent's)
    history: list[dict] = [{"role": "user", "content": f"Task {session}: fix the failing test. " + _text(rng, 40)}]
    calls: list[dict] = []

    def keep(record: Request) -> None:
        with lock:
            records.append(record)

    for turn in range(workload.turns):
        kind = "main"
        if workload.edit_at and turn == workload.edit_at:  # the agent rewrites an earlier call it echoed
            at = 1 + 2 * (turn // 2)  # the assistant message of turn // 2
            rewritten = {**calls[turn // 2], "input": {**calls[turn // 2]["input"], "path": "src/rewritten.py"}}
            history[at] = {"role": "assistant", "content": [rewritten]}
            kind = "edit"
        keep(_ask(client, model, system, history, workload, TOOLS, session=session, turn=turn, kind=kind, t0=t0))
        call = _call(rng, session, turn)
        calls.append(call)
        history += [{"role": "assistant", "content": [call]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                                  "content": _text(rng, workload.result_words)}]}]
        if workload.side_every and (turn + 1) % workload.side_every == 0:
            title = [{"role": "user", "content": _text(rng, 30)}]
            keep(_ask(client, model, SIDE_SYSTEM, title, workload, None, session=session, turn=turn, kind="side",
                      t0=t0))


def replay(url: str, model: str, workload: Workload, sessions: int = 2, timeout_s: float = 600.0) -> dict:
    """The single-request baseline, then `sessions` sessions at once; the records and the summary."""
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=timeout_s)
    t0 = time.perf_counter()
    hello = [{"role": "user", "content": "Say something."}]
    # unrecorded: the server's first request loads the model and compiles and captures its first
    # steps (on the GPU host's first replay, 2026-12-07, the baseline measured that: 16.7 s to its
    # first token, then 41 tok/s against the sessions' 90)
    _ask(client, model, "", hello, workload, None, session=-1, turn=0, kind="warm-up", t0=t0)
    records = [_ask(client, model, "", hello, workload, None, session=-1, turn=0, kind="single", t0=t0)]
    lock = threading.Lock()
    failures: list[BaseException] = []

    def session_thread(index: int) -> None:
        try:
            run_session(client, model, workload, index, t0, records, lock)
        except BaseException as e:  # noqa: BLE001 - reported with the results, not lost in a thread
            failures.append(e)

    threads = [threading.Thread(target=session_thread, args=(i,)) for i in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} of {sessions} sessions failed: {failures[0]!r}") from failures[0]
    return {"workload": asdict(workload), "sessions": sessions, "requests": [asdict(r) for r in records],
            "summary": summarize(records)}


def summarize(records: list[Request]) -> dict:
    """TTFT over the main turns (median, worst, and the worst turn's), the prompt tokens served
    from cache over every request of the sessions, and their decode rate against the single
    request's."""
    turns = [r for r in records if r.kind in ("main", "edit")]
    agent = [r for r in records if r.kind != "single"]
    single = next((r for r in records if r.kind == "single"), None)
    prompt = sum(r.input_tokens + r.cached_tokens for r in agent)
    rates = [r.decode_tok_s for r in turns if r.decode_tok_s]
    worst = max(turns, key=lambda r: r.ttft_s, default=None)
    return {
        "requests": len(agent),
        "ttft_median_s": statistics.median(r.ttft_s for r in turns) if turns else None,
        "ttft_worst_s": worst.ttft_s if worst else None,
        "ttft_worst_turn": {"session": worst.session, "turn": worst.turn, "kind": worst.kind} if worst else None,
        "cached_share": sum(r.cached_tokens for r in agent) / prompt if prompt else 0.0,
        "largest_prompt_tokens": max((r.input_tokens + r.cached_tokens for r in agent), default=0),
        "decode_tok_s_median": statistics.median(rates) if rates else None,
        "single_decode_tok_s": single.decode_tok_s if single else None,
        "decode_vs_single": (statistics.median(rates) / single.decode_tok_s
                             if rates and single and single.decode_tok_s else None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:11435", help="where `ft serve` listens")
    parser.add_argument("--model", required=True)
    parser.add_argument("--sessions", type=int, default=2, help="agent sessions at once")
    for field, value in asdict(Workload()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workload = Workload(**{f: getattr(args, f) for f in asdict(Workload())})
    result = replay(args.url, args.model, workload, args.sessions)
    for r in sorted(result["requests"], key=lambda r: r["started_s"]):
        rate = f"{r['decode_tok_s']:.1f}" if r["decode_tok_s"] else "-"
        print(f"s{r['session']:>2} t{r['turn']:>3} {r['kind']:<6} prompt {r['input_tokens'] + r['cached_tokens']:>6} "
              f"cached {r['cached_tokens']:>6}  ttft {r['ttft_s']:7.2f} s  decode {rate} tok/s")
    print(json.dumps(result["summary"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
