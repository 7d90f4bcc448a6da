"""The timed runs of `ft bench` (moe.py), each on one executor: the untimed warm-up, decode
token by token (every step's time kept, and for "auto" where its guard spent them), a profiled
decode, and a streamed prefill."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..experts import HostExpertBank
from ..gpu import build_hybrid
from ..gpu.auto_guard import AutoGuard
from ..gpu.step_graphs import QueuedStep

WARMUP_STEPS = 2 * AutoGuard.EXPLORE  # untimed decode steps before each policy's run: a block of each arm
MAX_WARMUP_STEPS = 8 * AutoGuard.EXPLORE  # with CUDA graphs: until both arms' graphs are captured


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _weights(rng: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.softmax(torch.randn(shape, generator=rng), dim=-1)


def _prompt(executor, layers: list[int], prompt: np.ndarray, hidden: int, device: torch.device,
            gen: torch.Generator) -> None:
    """The prompt through the executor's prefill path, layer by layer (tokens with an absent id dropped)."""
    for i, layer in enumerate(layers):
        ids = prompt[:, i]
        ids = ids[(ids >= 0).all(axis=1)]
        if len(ids) < 2:
            continue
        x = torch.randn(len(ids), hidden, generator=gen).to(device, torch.bfloat16)
        w = _weights(gen, ids.shape).to(device, torch.bfloat16)
        executor(layer, x, torch.from_numpy(ids).to(device), w)
    sync(device)


class DecodeSteps:
    """The decode steps of one executor's runs, as a model makes them: each step's routed ids and
    weights land in buffers of fixed address (where a model's router writes them), then every
    layer's call on its own random activation; the whole step through the executor's StepGraphs
    (one CUDA graph where its calls can be captured: gpu/step_graphs.py)."""

    def __init__(self, executor, layers: list[int], top_k: int, hidden: int, device: torch.device,
                 gen: torch.Generator) -> None:
        self.executor, self.layers, self.device = executor, layers, device
        self.xs = torch.randn(len(layers), 1, hidden, generator=gen).to(device, torch.bfloat16)
        self.ids = torch.zeros(len(layers), top_k, dtype=torch.int64, device=device)
        self.weights = torch.zeros(len(layers), top_k, dtype=torch.bfloat16, device=device)

    def __call__(self, ids: torch.Tensor, weights: torch.Tensor) -> None:
        """One step: `ids` and `weights` [layers, top_k] on the device."""
        self.ids.copy_(ids)
        self.weights.copy_(weights)
        self.executor.steps.run("bench", self._calls)

    def queue(self, ids: torch.Tensor, weights: torch.Tensor) -> QueuedStep[None]:
        """One step queued while the one before may still run (StepGraphs.queue), held until
        started: as a decode loop queues the next step before it has the token that step needs."""
        def feed() -> None:
            self.ids.copy_(ids)
            self.weights.copy_(weights)

        steps = self.executor.steps
        return steps.queue("bench", self._calls, feed, steps.doorbell)

    def _calls(self) -> None:
        for i, layer in enumerate(self.layers):
            self.executor(layer, self.xs[i], self.ids[i: i + 1], self.weights[i: i + 1])


def warm_up(steps: DecodeSteps, decode: np.ndarray, gen: torch.Generator) -> None:
    """Untimed decode steps of the first tokens' routing: kernels, allocator, worker, CUDA graphs
    when on, so that neither the policy run first nor the one with more graphs carries one-time
    costs. WARMUP_STEPS of them, and with CUDA graphs, on until a whole step of each arm the
    guard ran (for "auto") did no one-time graph work (first calls, captures), at most
    MAX_WARMUP_STEPS."""
    executor = steps.executor
    count = MAX_WARMUP_STEPS if executor.graphs is not None else WARMUP_STEPS
    warm_ids = torch.from_numpy(decode[:count]).to(steps.device)
    warm_weights = _weights(gen, decode[:count].shape).to(steps.device, torch.bfloat16)
    settled: set[str] = set()
    for t in range(len(warm_ids)):
        work = executor.one_time_work
        steps(warm_ids[t], warm_weights[t])
        if executor.graphs is None:
            continue
        if executor.one_time_work == work:
            settled.add(executor.guard.arm if executor.guard is not None else "")
        arms = {"model", "pcie"} if executor.guard is not None else {""}
        if t + 1 >= WARMUP_STEPS and settled >= arms:
            break
    sync(steps.device)


def _queued_decode(steps: DecodeSteps, ids: torch.Tensor, weights: torch.Tensor,
                   arms: list[str]) -> tuple[list[float], list[float]]:
    """The decode steps, each queued while the one before runs and started once the host has
    seen that one end (an event, as a loop waits for its token): per step the seconds from the
    end of the one before to its own end, and the host's part (from that end to the start)."""
    executor = steps.executor
    steps_s, start_s = [], []
    last = time.perf_counter()
    queued = steps.queue(ids[0], weights[0])
    try:
        for t in range(len(ids)):
            started = time.perf_counter()
            queued.start()
            start_s.append(started - last)
            done = torch.cuda.Event()
            done.record()
            if executor.guard is not None:
                arms.append(executor.guard.arm)
            if t + 1 < len(ids):  # the next step's launches, made while this one runs
                queued = steps.queue(ids[t + 1], weights[t + 1])
            done.synchronize()
            now = time.perf_counter()
            steps_s.append(now - last)
            last = now
    finally:
        queued.cancel()  # (a step still held holds the stream; cancelling a started one does nothing)
    return steps_s, start_s


def decode_run(steps: DecodeSteps, prompt: np.ndarray, decode: np.ndarray, seed: int,
               queue_ahead: bool = False) -> dict[str, Any]:
    executor, device = steps.executor, steps.device
    gen = torch.Generator().manual_seed(seed)
    warm_up(steps, decode, gen)
    # then a cold cache (graphs stay valid) and, for "auto", a guard that explores again: its
    # trials are timed
    executor.clear()
    if executor.guard is not None:
        executor.guard.restart()
    if executor.prefill is not None and len(prompt):
        _prompt(executor, steps.layers, prompt, steps.xs.shape[-1], device, gen)
        executor.prefill.release()  # the transient buffer goes back before decode
    executor.reset_stats()
    ids = torch.from_numpy(decode).to(device)  # [T, L, K] int64: the router's output lives on the device
    weights = _weights(gen, decode.shape).to(device, torch.bfloat16)
    sync(device)
    steps_s, queued_s, arms = [], [], []
    start = time.perf_counter()
    if queue_ahead:
        steps_s, queued_s = _queued_decode(steps, ids, weights, arms)
    else:
        for t in range(len(decode)):
            step_start = time.perf_counter()
            steps(ids[t], weights[t])
            queued_s.append(time.perf_counter() - step_start)  # the host's part: the device waits for its start
            sync(device)
            steps_s.append(time.perf_counter() - step_start)
            if executor.guard is not None:
                arms.append(executor.guard.arm)  # the arm chosen at this step's first layer
    seconds = time.perf_counter() - start
    run = {"seconds": seconds, "stats": executor.stats().as_dict(), "steps_ms": [1e3 * s for s in steps_s],
           "host_queue_ms": statistics.median(queued_s) * 1e3 if queued_s else 0.0}
    if executor.guard is not None:
        run["guard"] = {**executor.guard.summary(), **_time_by_arm(steps_s, arms)}
    return run


def _time_by_arm(steps_s: list[float], arms: list[str]) -> dict[str, Any]:
    """Where a guarded run's time went: each arm's total over its steps, and the slowest steps."""
    total: dict[str, float] = {}
    for s, arm in zip(steps_s, arms, strict=True):
        total[arm] = total.get(arm, 0.0) + 1e3 * s
    slowest = sorted(range(len(steps_s)), key=lambda i: steps_s[i], reverse=True)[:4]
    return {"total_ms": total, "slowest": [{"step": i, "arm": arms[i], "ms": 1e3 * steps_s[i]} for i in slowest]}


def profile_decode(steps: DecodeSteps, decode: np.ndarray, tokens: int, trace_path: Path | None) -> list[dict[str, Any]]:
    """`tokens` more decode tokens under torch.profiler (after a timed run: the cache is warm):
    the ops with the most host time, per layer call, and optionally a Chrome trace."""
    from torch.profiler import ProfilerActivity, profile

    device, layers = steps.device, steps.layers
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    gen = torch.Generator().manual_seed(1)
    ids = torch.from_numpy(decode[:tokens]).to(device)
    weights = _weights(gen, decode[:tokens].shape).to(device, torch.bfloat16)
    sync(device)
    with profile(activities=activities) as prof:
        for t in range(len(ids)):
            steps(ids[t], weights[t])
            sync(device)
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    calls = max(1, len(ids) * len(layers))
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
    return [{"op": e.key, "count_per_call": e.count / calls, "host_us_per_call": e.self_cpu_time_total / calls,
             "device_us_per_call": getattr(e, "self_device_time_total", 0.0) / calls} for e in rows]


def prefill_run(banks: dict[int, HostExpertBank], layers: list[int], length: int, buffers: int, slots: int,
                top_k: int, router_ids: np.ndarray, hidden: int, device: torch.device, threads: int,
                pcie_repeat: int = 1) -> dict[str, Any]:
    """`length` prompt tokens through every built MoE layer's streamed prefill (mode offload's
    placement: an LRU cache of `slots`, cold), `buffers` bank buffers (0: through the cache)."""
    ex = build_hybrid(banks, device=device, cache_slots=slots, mode="offload", top_k=top_k, cpu_threads=threads,
                      prefill_buffers=buffers, pin=False, force=True, prefill_min_tokens=2, pcie_repeat=pcie_repeat)
    try:
        gen = torch.Generator().manual_seed(length)
        x = torch.randn(length, hidden, generator=gen).to(device, torch.bfloat16)
        ids = torch.from_numpy(router_ids[:length]).to(device)
        w = _weights(gen, router_ids[:length].shape[:-1] + (top_k,)).to(device, torch.bfloat16)
        ex(layers[0], x, ids[:, 0], w[:, 0])  # warm-up (kernels, buffers)
        sync(device)
        ex.clear()
        ex.reset_stats()
        start = time.perf_counter()
        for i, layer in enumerate(layers):
            ex(layer, x, ids[:, i], w[:, i])
        sync(device)
        seconds = time.perf_counter() - start
        s = ex.stats()
        return {"tokens": length, "buffers": buffers, "seconds": seconds, "tok_s": length / seconds,
                "streamed_gb_s": s.prefill_bytes / seconds / 1e9, "streamed_bytes": s.prefill_bytes}
    finally:
        ex.close()
