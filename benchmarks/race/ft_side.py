"""ft's side of the race, in its own process (its VRAM peak is its own): load a pulled model the
way `ft run` does (the fit planner at a VRAM budget and thread count, then the hybrid runtime),
and feed it what llama-bench feeds llama.cpp: uniformly random token ids, for prompts and for
decode (the sampler's choice replaced, so no repetition flatters the cache).

Two inputs:
- "random": random ids, routed by the model's own router (random weights: near-uniform routing,
  the worst case for a cache). These rows pair with llama.cpp's.
- "trace": the same runtime and model, every decode step's expert ids replaced by a real
  recorded trace's (../shared/traces/; its layers spread over the model's, its top-k as
  recorded, cycled past its length): the realistic case, for which llama.cpp has no equal view.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass
class FtRun:
    """What to measure in one load."""

    store: Path
    model: str
    device: str  # "gpu" | "cpu" (CI)
    vram_mib: int | None  # ft's budget (--vram-gib); None: the planner's own
    threads: int
    num_ctx: int
    prompt_lengths: list[int]
    decode_tokens: int
    decode_prompt: int  # the prompt each decode repetition starts after (llama-bench's tg: none, so 1)
    reps: int
    mode: str = "auto"
    trace: Path | None = None  # also decode with this trace's routing
    seed: int = 0


@dataclass
class Measured:
    kind: str  # "decode" | "prompt"
    input: str  # "random" | "trace"
    tokens: int
    tok_s: float
    samples: list[float]
    stats: dict[str, Any] = field(default_factory=dict)


class TraceRouting:
    """An expert executor whose one-token calls take their expert ids from a trace instead of the
    router: ids for the step at the model's device position (so captured step graphs replay the
    trace too, with no host work per step). Everything else passes through."""

    def __init__(self, inner: Any, table: torch.Tensor, layers: list[int], position: torch.Tensor) -> None:
        self.inner, self.table, self.position = inner, table, position  # table [len(layers), trace tokens, k]
        self.slot = {layer: i for i, layer in enumerate(layers)}  # a model layer's row of the table

    def __call__(self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        if ids.shape[0] != 1:
            return self.inner(layer, x, ids, weights)
        rows = self.table.shape[1]
        row = torch.remainder(self.position, rows)  # [1], on the device: the trace cycles
        traced = self.table[self.slot[layer]].index_select(0, row)  # [1, k]
        k = traced.shape[1]
        w = weights[:, :k] / weights[:, :k].sum(dim=-1, keepdim=True)
        return self.inner(layer, x, traced, w)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def trace_table(path: Path, moe_layers: list[int], num_experts: int, device: torch.device) -> torch.Tensor:
    """[len(moe_layers), tokens, k] int64: the trace's layers spread evenly over the model's."""
    data = np.load(path)
    experts = data["experts"].astype(np.int64)  # [tokens, trace layers, k]; -1 where the recording has no pick
    for t in range(experts.shape[0]):  # a missing pick: the previous token's in that place (or expert 0)
        missing = experts[t] < 0
        experts[t][missing] = experts[t - 1][missing] if t else 0
    if experts.max() >= num_experts:
        raise ValueError(f"{path.name} routes to expert {experts.max()}, the model has {num_experts}")
    picks = np.linspace(0, experts.shape[1] - 1, len(moe_layers)).round().astype(int)
    return torch.from_numpy(np.ascontiguousarray(experts[:, picks].transpose(1, 0, 2))).to(device)


def _random_ids(n: int, vocab: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=gen).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _decode(model: Any, state: Any, tokens: list[int]) -> float:
    """Decode `tokens` (each fed as if sampled), the way Session.generate does; seconds taken."""
    queue = getattr(model, "can_queue", False)
    start = time.perf_counter()
    if not queue:
        for token in tokens:
            model.forward(torch.tensor([token], dtype=torch.long), state)[-1].float().argmax()
        return time.perf_counter() - start
    pending = None
    for i, token in enumerate(tokens):
        step, pending = pending or model.queue_decode(state), None
        step.start(token, 1)  # a greedy sampler's one best logit, taken on the device
        if i + 1 < len(tokens):
            pending = model.queue_decode(state)
        step.logits()
    return time.perf_counter() - start


def measure(run: FtRun) -> tuple[list[Measured], dict[str, Any]]:
    """Load once, then: each prompt length `reps` times, decode `decode_tokens` after a
    `decode_prompt`-token prompt `reps` times with random ids, and with the trace's routing."""
    with torch.inference_mode():  # as ft run: the executor's counters are inference tensors
        return _measure(run)


def _measure(run: FtRun) -> tuple[list[Measured], dict[str, Any]]:
    from ftpull.run import load_for_chat
    from registry import Store

    gib = None if run.vram_mib is None else run.vram_mib / 1024
    loaded, chat, load_s = load_for_chat(Store(run.store), run.model, dtype=None, num_ctx=run.num_ctx, overrides={},
                                         threads=run.threads, device=run.device, vram_gib=gib, mode=run.mode)
    session = chat.session
    model, device = session.model, torch.device(getattr(session.model, "device", "cpu"))
    vocab = loaded.config.vocab_size
    gen = torch.Generator().manual_seed(run.seed)
    experts = loaded.experts
    out: list[Measured] = []

    def stats() -> dict[str, Any]:
        return experts.stats().as_dict() if experts is not None else {}

    def decode_stats(steps_before: dict[str, int]) -> dict[str, Any]:
        """The expert counts, plus what explains a decode rate: the auto guard's arms and the step
        graphs' replays, captures and first calls over the measured decodes."""
        out = stats()
        guard = getattr(experts, "guard", None)
        if guard is not None:
            out["guard"] = guard.summary()
        if steps_before:
            out["step_graphs"] = {k: v - steps_before[k] for k, v in step_counts().items()}
        return out

    def step_counts() -> dict[str, int]:
        steps = getattr(model, "steps", None)
        return steps.counters() if steps is not None else {}

    memory: dict[str, dict[str, int]] = {}  # per phase: where the process's VRAM went (CUDA)

    def note_memory(phase: str) -> None:
        if device.type != "cuda":
            return
        free, total = torch.cuda.mem_get_info(device)
        memory[phase] = {"used_mib": (total - free) >> 20, "reserved_mib": torch.cuda.memory_reserved(device) >> 20,
                         "max_reserved_mib": torch.cuda.max_memory_reserved(device) >> 20,
                         "max_allocated_mib": torch.cuda.max_memory_allocated(device) >> 20,
                         **_pools(device)}
        torch.cuda.reset_peak_memory_stats(device)

    note_memory("load")
    # a warm-up the measurements do not count, as llama-bench runs one: kernels compile, each
    # context span's step graph is captured, the bandwidth profile loads
    session.reset()
    model.forward(torch.tensor(_random_ids(min(64, run.num_ctx - 8), vocab, gen)), session.state, last_only=True)
    session.reset()
    model.forward(torch.tensor(_random_ids(run.decode_prompt, vocab, gen)), session.state, last_only=True)
    _decode(model, session.state, _random_ids(min(run.decode_tokens, run.num_ctx - run.decode_prompt - 1), vocab, gen))
    note_memory("warm-up")
    for length in run.prompt_lengths:
        if length >= run.num_ctx:
            continue
        samples = []
        for rep in range(-1, run.reps):  # -1: unmeasured, as llama-bench warms up every test (a new length's kernels)
            session.reset()
            ids = torch.tensor(_random_ids(length, vocab, gen))
            if experts is not None:
                experts.reset_stats()
            _sync(device)
            start = time.perf_counter()
            model.forward(ids, session.state, last_only=True)
            _sync(device)
            if rep >= 0:
                samples.append(length / (time.perf_counter() - start))
        out.append(Measured("prompt", "random", length, statistics.median(samples), samples, stats()))
        note_memory(f"prompt {length}")
    views = [("random", None)] if run.decode_tokens > 0 else []  # (a long prompts' run decodes nothing)
    if views and run.trace is not None and experts is not None and hasattr(model, "_position"):
        views.append(("trace", run.trace))
    for view, trace in views:
        wrapped = _route_by_trace(model, trace, loaded.config, device) if trace else None
        samples = []
        steps_before = step_counts()
        for _ in range(run.reps):
            session.reset()
            model.forward(torch.tensor(_random_ids(run.decode_prompt, vocab, gen)), session.state, last_only=True)
            if experts is not None:
                experts.reset_stats()
            seconds = _decode(model, session.state, _random_ids(run.decode_tokens, vocab, gen))
            samples.append(run.decode_tokens / seconds)
        out.append(Measured("decode", view, run.decode_tokens, statistics.median(samples), samples,
                            decode_stats(steps_before)))
        note_memory(f"decode {view}")
        if wrapped is not None:
            wrapped()
    info = {"load_s": round(load_s, 2), "context": session.context_length, "mode": run.mode,
            "cache_slots": experts.cache.num_slots if experts is not None else 0, "memory": memory}
    info.update(_split_info(experts, loaded.config.num_experts_per_tok))
    return out, info


def _pools(device: torch.device) -> dict[str, Any]:
    """Where torch's reserved VRAM sits now: MiB reserved and allocated in the default pool and in
    CUDA graphs' private pools (a graph's pool stays reserved while prompts run in the default
    one), and the largest live blocks (MiB), to tell dense weights, slots and workspaces apart."""
    pools: dict[str, list[int]] = {}
    blocks: list[int] = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", device.index or 0) != (device.index or 0):
            continue
        pool = "default" if tuple(segment.get("segment_pool_id", (0, 0))) == (0, 0) else "graphs"
        total = pools.setdefault(pool, [0, 0])
        total[0] += segment["total_size"]
        total[1] += segment["allocated_size"]
        blocks += [b["size"] for b in segment.get("blocks", []) if b.get("state") == "active_allocated"]
    return {"pools_mib": {k: [v[0] >> 20, v[1] >> 20] for k, v in pools.items()},
            "largest_blocks_mib": [round(b / 2 ** 20, 1) for b in sorted(blocks, reverse=True)[:12]],
            "live_blocks": len(blocks)}


def _split_info(experts: Any, top_k: int) -> dict[str, Any]:
    """What decides a decode call's split, for reading a rate: the mode the executor runs in, the
    measured profile it prices the split with, and its PCIe count for each number of misses of one
    token's layer (the split table at the worth of a copy the run ended at, beside its hit rate)."""
    if experts is None or not hasattr(experts, "splits"):
        return {}
    info: dict[str, Any] = {"serving_mode": experts.mode}
    profile = getattr(experts, "profile", None)
    if profile is not None:
        info["profile"] = {k: getattr(profile, k) for k in ("pcie_gbps", "cpu_gbps", "pcie_fixed_ms", "cpu_fixed_ms",
                                                             "pcie_alone_gbps", "cpu_alone_gbps", "cpu_threads")}
    split = experts.splits.split
    if split is not None:
        stride = max(b.layout.expert_stride for b in experts.banks.values())
        info["pcie_of_misses"] = [max(0, min(m, split(m, stride))) for m in range(top_k + 1)]
        info["hit_rate_priced"] = round(experts.splits.hit_rate.value, 3)
        info["fill_worth"] = round(experts.splits.hit_rate.fill_worth, 3)
        info["fill_pricing"] = experts.splits.pricing
    return info


def _route_by_trace(model: Any, trace: Path, config: Any, device: torch.device):
    """Swap every MoE block's executor for a TraceRouting one; returns the undo."""
    blocks = [b for b in model.model.blocks if hasattr(b.ffn, "executor")]
    layers = [b.ffn.layer for b in blocks]
    table = trace_table(trace, layers, config.num_experts, device)
    inner = blocks[0].ffn.executor
    routed = TraceRouting(inner, table, layers, model._position)
    for b in blocks:
        b.ffn.executor = routed
    if model.steps is not None:  # graphs captured over the router's ids
        model.steps.invalidate()

    def undo() -> None:
        for b in blocks:
            b.ffn.executor = inner
        if model.steps is not None:
            model.steps.invalidate()
    return undo


def routing_statistics(routes: np.ndarray, num_experts: int) -> tuple[float, float]:
    """(next-token reuse, top-10% share) of routes [tokens, layers, k] (ids < 0: none): the share of
    a token's experts its predecessor also used in that layer, and of all picks that a layer's
    most-picked tenth of its experts took, both averaged over layers (DESIGN.md §9)."""
    tokens, layers, k = routes.shape
    reuse = [len(set(routes[t, layer]) & set(routes[t - 1, layer]) - {-1}) / k
             for t in range(1, tokens) for layer in range(layers)]
    shares = []
    for layer in range(layers):
        picks = routes[:, layer].ravel()
        counts = np.sort(np.bincount(picks[picks >= 0], minlength=num_experts))[::-1]
        shares.append(counts[: max(1, num_experts // 10)].sum() / max(1, counts.sum()))
    return float(np.mean(reuse)), float(np.mean(shares))


def record_routing(model: Any, prompt: int, steps: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Routes [steps, MoE layers, k] of `steps` random-id decode steps after a random `prompt`, on
    an eager model (the CPU runtime): what the router picks for llama-bench's kind of input."""
    blocks = [b for b in model.blocks if hasattr(b.ffn, "executor")]
    picked: list[list[int]] = []

    def recording(inner: Any) -> Any:
        def call(layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            if ids.shape[0] == 1:
                picked.append(ids[0].tolist())
            return inner(layer, x, ids, weights)
        return call

    inner = [b.ffn.executor for b in blocks]
    for b in blocks:
        b.ffn.executor = recording(b.ffn.executor)
    gen = torch.Generator().manual_seed(seed)
    try:
        with torch.inference_mode():
            state = model.new_state(prompt + steps + 1)
            model.forward(torch.randint(0, vocab, (prompt,), generator=gen), state, last_only=True)
            for _ in range(steps):
                model.forward(torch.randint(0, vocab, (1,), generator=gen), state)
    finally:
        for b, executor in zip(blocks, inner, strict=True):
            b.ffn.executor = executor
    return np.array(picked).reshape(steps, len(blocks), -1)
