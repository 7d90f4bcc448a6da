"""A loaded model as the server runs it: weights, tokenizer, the planned context, its sessions (so a
chat turn that extends the previous one only prefills the new tokens) and a worker thread per
session: on the CPU, where RAM holds several sessions, as many generations run at once, their
forward passes taking turns (scheduler.Turnstile) a decode step or a prompt slice each; on the
GPU one session whose state the generations take turns at (time_share.py: the one holding it
parks its conversation in host memory at a turn boundary while another waits), or, where the
model's state cannot be parked, one generation at a time.

Raw generated text goes through the family's incremental parser (`runtime.server.parsers`) into
text, reasoning and tool-call events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, cast

import torch

from runtime.engine import Session
from runtime.loading.registered import RegisteredModel
from runtime.loading.runnable import LoadedModel
from runtime.models import ContextOverflowError, DecoderModel
from runtime.planner.plan import RAM_RESERVE_BYTES, Plan
from runtime.text.tokenizer import Tokenizer

from . import models
from .batching import DecodeBatcher, pass_thread
from .parsers import make_parser, opens_reasoning, syntax_for
from .protocol import BadRequest, Done, Event, ServerError, ToolCallEvent
from .scheduler import DEFAULT_KEEP_ALIVE_S, CancellableModel, GenerationCancelled, Job
from .session_pool import SessionPool
from .time_share import TimeShare

log = logging.getLogger(__name__)


def compute_dtype(config: Mapping[str, Any]) -> torch.dtype:
    """f32 models compute in f32, everything else in bf16 (as `ft run` does)."""
    return torch.float32 if config.get("dtype") == "f32" else torch.bfloat16


def tensor_bytes(value: Any, depth: int = 4) -> int:
    """Bytes of the tensors held by `value` (a state, a cache, lists of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if depth == 0:
        return 0
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, depth - 1) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v, depth - 1) for v in value.values())
    if hasattr(value, "__dict__"):
        return sum(tensor_bytes(v, depth - 1) for v in vars(value).values())
    return 0


@dataclass(frozen=True)
class LoadedStatus:
    """One loaded model, as /api/ps and `ft ps` show it."""

    name: str
    digest: str
    family: str | None
    dtype: str | None
    parameters: int | None
    context_length: int
    ram_bytes: int  # weights + KV in host memory
    vram_bytes: int  # 0 on the CPU
    expert_cache_bytes: int  # 0 on the CPU
    kv_bytes: int
    device: str  # "cpu" | "gpu"
    processor: str  # Ollama's split: "100% CPU", "40%/60% CPU/GPU"
    num_threads: int
    expires_at: float | None  # seconds since the epoch; None: kept until unloaded
    active_requests: int
    sessions: int = 1  # conversations' states held now (session_pool.py)
    max_sessions: int = 1  # ... and the most the model keeps
    parked_blocks: int = 0  # blocks of conversations' states in host memory (a GPU model's second tier)
    parked_bytes: int = 0
    park_budget_bytes: int = 0
    park_hits: int = 0  # requests that took a prefix back from them
    park_hit_tokens: int = 0  # ... and the tokens they took back


MAX_SESSIONS = 4  # conversations a model on the CPU keeps at once, where RAM holds their KV
# prompt tokens a forward pass takes where generations run concurrently: a long prompt is fed in
# slices, each one turn, so another request's tokens come between them (on a CPU model of 3B
# active parameters, a slice is about a second)
PREFILL_SLICE_TOKENS = 512
# ... and where they take turns at one state (time_share.py: a GPU model's). Each forward pass of a
# prompt streams a MoE layer's experts once (models/base.py), so slices are larger there: a waiting
# request is paused behind at most one (about a second at the GPU's few thousand prompt tokens a
# second), and the banks are streamed once every 4k tokens (ft's prefill measured 1.40x
# llama.cpp's at 4k, BENCHMARKS.md), not once a prompt.
SHARED_PREFILL_SLICE_TOKENS = 4096
# generations that take turns at a time-shared state (more wait for a worker, as queued requests)
MAX_SHARED_GENERATIONS = 4


def park_bytes_for(plan: Plan) -> int:
    """Host memory a model on the GPU (one session, in VRAM) may park other conversations' states
    in (session_pool.py): half the RAM its plan leaves; none on the CPU, whose sessions live in RAM."""
    if plan.device == "cpu":
        return 0
    return max(0, plan.ram_budget_bytes - plan.ram_needed_bytes) // 2


def sessions_for(plan: Plan) -> int:
    """How many sessions a loaded model keeps: one on the GPU, whose KV the plan puts in VRAM for
    one context; on the CPU as many as the RAM the plan leaves holds (each a whole context's KV),
    up to MAX_SESSIONS."""
    if plan.device != "cpu" or plan.kv_bytes <= 0:
        return 1
    spare = plan.ram_budget_bytes - plan.ram_needed_bytes
    return 1 + max(0, min(MAX_SESSIONS - 1, spare // plan.kv_bytes))


class Runner:
    """A loaded model: weights, tokenizer, the planned context, its sessions (session_pool.py: a
    few conversations' states) and one worker thread."""

    def __init__(self, registered: RegisteredModel, loaded: LoadedModel, tokenizer: Tokenizer, fitted: Plan,
                 load_seconds: float) -> None:
        self.registered = registered
        self.key = str(registered.name)
        self.digest = models.digest_of(registered)
        self.family = str(registered.config.get("family") or loaded.config.family)
        self.loaded = loaded
        self.tokenizer = tokenizer
        self.plan = fitted
        self.asked_ctx = fitted.context_length  # the num_ctx its load planned for (set by the manager)
        self.load_seconds = load_seconds
        size, park_bytes = sessions_for(fitted), park_bytes_for(fitted)
        # one session (the GPU's): its decode steps queue ahead as ft run's do, and where it may park
        # conversations in host memory the generations take turns at its state (time_share.py)
        self.share = TimeShare() if size == 1 and park_bytes > 0 else None
        # several sessions (a CPU model's): their generations' decode steps run in batches (batching.py)
        batcher = DecodeBatcher() if size > 1 else None
        self.model = CancellableModel(loaded.model, queue_ahead=size == 1, share=self.share, batcher=batcher,
                                      passes=pass_thread() if size > 1 else None)
        slice_tokens = PREFILL_SLICE_TOKENS if size > 1 else SHARED_PREFILL_SLICE_TOKENS if self.share else None
        self.sessions = SessionPool(
            lambda context: Session(cast(DecoderModel, self.model), tokenizer, context, prefill_slice=slice_tokens),
            fitted.context_length, size, park_bytes)
        if self.share is not None:
            self.share.parking = self.sessions
        self.session: Session | None = None  # the session the latest generation started in (a diagnostic)
        # a generation a session at once (SessionPool hands each its own), or a few taking turns at one
        workers = MAX_SHARED_GENERATIONS if self.share is not None else size
        self.executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"ft-{registered.name.model}")
        self.weight_bytes = tensor_bytes(loaded.weights.dense, 2) + sum(
            b.data.numel() * b.data.element_size() for b in loaded.weights.banks.values())
        self.active = 0  # jobs submitted and not finished (loop thread only)
        self.keep_alive_s = DEFAULT_KEEP_ALIVE_S
        self.expires_at: float | None = None
        self.expiry: asyncio.TimerHandle | None = None  # the keep-alive timer (the server's loop)
        self.draining = False  # a load waits for its GPU: new requests queue for the load lock
        self.last_used = time.monotonic()

    @property
    def resident_bytes(self) -> int:
        """What the planner says this model holds in RAM, less the machine-wide reserve."""
        return (self.plan.ram_needed_bytes - RAM_RESERVE_BYTES + (self.sessions.size - 1) * self.plan.kv_bytes
                + self.sessions.parked_bytes)

    def close(self, cancel: bool = False) -> None:
        """Take no more jobs. A generation still running finishes for its client, or with `cancel`
        (the server shuts down) stops at its next token."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        if cancel:
            for job in self.model.jobs:
                job.cancel()

    def release(self) -> None:
        """Once no job runs: give back what the GPU runtime holds beyond Python's reach (the CPU
        worker thread, the page-locked registration of the expert banks), end the passes' thread,
        and drop the weights, so
        the caller's collection frees them (and their VRAM) now."""
        if self.model is not None:
            self.model.close()  # (its passes' thread)
        experts = self.loaded.experts if self.loaded is not None else None
        if experts is not None:
            experts.close()
            pinner = getattr(experts, "pinner", None)
            if pinner is not None:
                pinner.close()
        self.loaded = self.model = self.session = self.sessions = None  # type: ignore[assignment]

    def status(self, now: float) -> LoadedStatus:
        p, c, parked = self.plan, self.registered.config, self.sessions.parked
        kv = sum(tensor_bytes(s.state, 5) for s in self.sessions.sessions) or p.kv_bytes
        expires = None
        if self.keep_alive_s >= 0:
            expires = now + self.keep_alive_s if self.active else self.expires_at
        vram = p.vram_needed_bytes
        cache_bytes = p.cache_bytes
        experts = self.loaded.experts
        if experts is not None:  # the cache as it is now: elastic VRAM may have resized it since the plan
            cache_bytes = experts.cache.num_slots * experts.cache.slot_bytes
            vram += cache_bytes - p.cache_bytes
        ram = self.weight_bytes + (kv if p.device == "cpu" else 0)
        share = round(100 * vram / (ram + vram)) if vram else 0
        return LoadedStatus(
            name=self.registered.name.display, digest=self.digest, family=c.get("family"), dtype=c.get("dtype"),
            parameters=c.get("num_params_total"), context_length=self.plan.context_length, ram_bytes=ram,
            vram_bytes=vram, expert_cache_bytes=cache_bytes, kv_bytes=kv, device=p.device,
            processor="100% CPU" if not vram else f"{100 - share}%/{share}% CPU/GPU", num_threads=p.num_threads,
            expires_at=expires, active_requests=self.active, sessions=len(self.sessions.sessions),
            max_sessions=self.sessions.size, parked_blocks=len(parked), parked_bytes=parked.nbytes,
            park_budget_bytes=self.sessions.park_bytes, park_hits=parked.hits, park_hit_tokens=parked.hit_tokens)

    def run(self, job: Job) -> None:
        """On a worker thread: one generation in a session of its own, ending in Done, an error, or
        nothing (cancelled: nobody listens). Whatever fails, the request hears of it."""
        job.ticket.release()  # running now, no longer queued
        if job.cancelled.is_set():
            return
        self.model.running(job)  # (close(cancel=True) reaches a job waiting for a time-shared state too)
        try:
            # a time-shared state is held for the whole generation, but where it is handed over
            with self.share.holding(job) if self.share is not None else nullcontext():
                if job.cancelled.is_set():  # (gone while it waited for the state)
                    return
                session = self.session = self.sessions.choose(job.inputs["prompt"], job.inputs["num_ctx"])
                if self.share is not None:
                    self.share.attach(session)
                try:
                    done = self._generation(job, session)
                except GenerationCancelled:
                    session.tokens = session.tokens[: session.state.length]
                    return
                except ContextOverflowError as e:
                    job.emit(BadRequest(str(e)))
                    return
                except Exception as e:  # a bug or a broken model: report it, keep the server up
                    log.exception("generation on %s failed", self.registered.name.display)
                    session.reset()
                    job.emit(ServerError(f"generation failed: {type(e).__name__}: {e}"))
                    return
                finally:
                    self.sessions.give_back(session)
        finally:
            self.model.running(None)
        job.emit(done)

    def _generation(self, job: Job, session: Session) -> Done:
        inputs = job.inputs
        # the request's tool definitions type the parsed calls' arguments; a template that ends its
        # generation prompt with <think> makes the output start as reasoning
        rendered = inputs["prompt"][: len(inputs["prompt"]) - inputs.get("opening_tokens", 0)]  # before a forced call
        tail = self.tokenizer.decode(rendered[-8:])
        parser = make_parser(self.family, inputs["tools"] or False,
                             starts_in_reasoning=opens_reasoning(self.family, tail))
        saw_tool_call = False

        def emit(events: list[Event]) -> None:
            nonlocal saw_tool_call
            for event in events:
                saw_tool_call |= isinstance(event, ToolCallEvent)
                job.emit(event)

        if inputs.get("opening"):  # a forced tool call's opening ends the prompt: the reply continues it
            emit(parser.feed(inputs["opening"]))

        # a family whose output is parsed sees the special tokens it writes (its tags may be ones)
        result = session.generate(inputs["prompt"], inputs["params"], lambda text: emit(parser.feed(text)),
                                  keep_special_tokens=syntax_for(self.family) is not None,
                                  continues_text=inputs.get("continues_text", False))
        cut_off = result.stop_reason in ("length", "context")
        emit(parser.finish(truncated=cut_off))
        stop_reason, stop_sequence = result.stop_reason, None
        if stop_reason == "stop" and result.stop_string is not None:  # a stop string, not EOS: the one that cut
            stop_reason, stop_sequence = "stop_sequence", result.stop_string
        if saw_tool_call:  # complete calls only: one cut off came out as text (parser.finish)
            stop_reason = "tool_calls"
        s = result.stats
        opened = inputs.get("opening_tokens", 0)  # a forced call's opening: the reply's, though ft wrote it
        return Done(stop_reason=stop_reason, stop_sequence=stop_sequence,  # type: ignore[arg-type]
                    prompt_tokens=len(inputs["prompt"]) - opened, completion_tokens=s.eval_tokens + opened,
                    cached_tokens=min(s.cached_tokens, len(inputs["prompt"]) - opened),
                    load_seconds=inputs["load_seconds"], prompt_seconds=s.prompt_seconds,
                    eval_seconds=s.eval_seconds, total_seconds=time.perf_counter() - inputs["started"])
