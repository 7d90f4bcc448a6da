"""What the fit planner takes and gives (plan.py is the planner): the user's overrides, the plan
made once and never mutated, and the problems that keep a model off a machine, with the numbers
and the way out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .footprint import size

PREFILL_CHUNK_TOKENS = 512  # activations are sized for this many prompt tokens computed at once


@dataclass(frozen=True)
class PlanOverrides:
    """What the user asked for; None means "decide"."""

    vram_budget_bytes: int | None = None  # a cap on the VRAM ft uses (benchmarks fix 8 or 32 GiB); 0: CPU only
    ram_budget_bytes: int | None = None  # a cap on host RAM
    num_ctx: int | None = None  # the user's: planned exactly or refused (FitError), never lowered to fit
    default_num_ctx: int | None = None  # a recipe's or a default (None: DEFAULT_NUM_CTX): lowered to fit
    num_threads: int | None = None
    max_pinned_bytes: int | None = None
    device: str = "auto"  # "gpu" refuses what "auto" only warns about (or moves to the CPU)
    force: bool = False  # return the plan even when it cannot run (its `problems` say why)


@dataclass(frozen=True)
class Problem:
    """One reason the model cannot run as planned, with the numbers and the way out."""

    resource: str  # "RAM" | "VRAM" | "expert cache"
    needed: int
    available: int
    unit: str  # "bytes" | "slots"
    detail: str  # what the need is made of
    have: str  # what there is, in words: "the machine has 32.0 GiB"
    fix: str

    def __str__(self) -> str:
        needed = size(self.needed) if self.unit == "bytes" else f"{self.needed} {self.unit}"
        return f"{self.resource}: needs {needed} ({self.detail}), {self.have}; {self.fix}"


class FitError(Exception):
    """The model does not fit this machine; the message has the numbers and the way out."""

    def __init__(self, message: str, problems: tuple[Problem, ...] = (), plan: Plan | None = None) -> None:
        super().__init__(message)
        self.problems = problems
        self.plan = plan  # what would be done with force=True


@dataclass(frozen=True)
class Plan:
    """Where everything lives and how big it is. Made by `plan`, never mutated."""

    model: str
    source: str  # the footprint's: "ftw" sizes are exact, the others estimates
    device: str  # "gpu" | "cpu"
    device_reason: str  # why the CPU, when it is ("" on the GPU)
    gpu_name: str | None
    ram_budget_bytes: int
    ram_needed_bytes: int
    vram_budget_bytes: int
    expert_pool_bytes: int  # in host RAM, always
    pinned_bytes: int  # of the expert pool
    dense_bytes: int  # on the GPU, or in RAM on the CPU path
    embedding_bytes: int  # the token embedding table, in host RAM beside dense_bytes on the GPU path (0 on the CPU's)
    workspace_bytes: int  # activations (+ GPU reserve on the GPU path)
    kv_bytes: int
    kv_bytes_per_token: int
    kv_formula: str
    context_length: int  # planned: min(model, num_ctx, what fits)
    model_context_length: int
    max_kv_tokens: int | None  # the most context the KV budget allows (None: KV size unknown)
    slot_bytes: int
    cache_slots: int  # where every expert fits, also the slots lent as prefill buffers
    prefill_buffers: int  # bank-sized buffers a long prompt streams each layer's experts through
    prefill_buffer_bytes: int  # all of them: cache slots, lent while a prompt streams (not beside the cache)
    min_cache_slots: int
    num_expert_records: int
    num_threads: int
    num_physical_cores: int
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS  # prompt tokens computed at once on the GPU (or fewer: plan.py)
    # prompt tokens a MoE layer's FFN takes at once: the chunk, or more where its experts' grouped
    # launches leave the chunk's workspace room for them (plan.py: each FFN call streams the layer's
    # experts through the cache once)
    ffn_chunk_tokens: int = PREFILL_CHUNK_TOKENS
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def cache_bytes(self) -> int:
        return self.cache_slots * self.slot_bytes

    @property
    def cache_fraction(self) -> float:
        return min(self.cache_slots, self.num_expert_records) / self.num_expert_records if self.num_expert_records else 0.0

    @property
    def vram_needed_bytes(self) -> int:
        if self.device != "gpu":
            return 0
        return self.dense_bytes + self.workspace_bytes + self.kv_bytes + self.cache_bytes

    def describe(self) -> list[tuple[str, str]]:
        """(label, value) rows for a terminal table."""
        on_gpu = self.device == "gpu"
        where = "on the GPU" if on_gpu else "in RAM"
        if not on_gpu:
            pinned = "" if self.num_expert_records == 0 else f" ({self.num_expert_records} records)"
        elif self.pinned_bytes >= self.expert_pool_bytes:
            pinned = ", all pinned"
        else:
            pinned = f", {size(self.pinned_bytes)} pinned"
        if not on_gpu:
            cache = "none: the CPU computes every expert"
        elif not self.slot_bytes:
            cache = "unknown until the model is pulled"
        else:
            cache = (f"{self.cache_slots} slots x {size(self.slot_bytes)} = {size(self.cache_bytes)}, "
                     f"{100 * self.cache_fraction:.1f}% of {self.num_expert_records} experts")
            if self.cache_slots > self.num_expert_records:
                cache += f" and {self.cache_slots - self.num_expert_records} slots to lend to a prompt's banks"
            if self.cache_slots < self.min_cache_slots:
                cache += f", under one token's {self.min_cache_slots}: misses stream through it or run on the CPU"
        context = f"{self.context_length} tokens (model {self.model_context_length or '?'}"
        if self.max_kv_tokens is not None and self.context_length < self.max_kv_tokens < self.model_context_length:
            context += f", up to {self.max_kv_tokens} fit"  # how far --num-ctx can go
        cores = f"{self.num_physical_cores} physical cores" + (", 1 feeds the GPU" if on_gpu else "")
        rows = [
            ("device", f"GPU, VRAM budget {size(self.vram_budget_bytes)}" if on_gpu else f"CPU only: {self.device_reason}"),
            ("experts", f"{size(self.expert_pool_bytes)} in RAM{pinned}"),
            ("dense weights", f"{size(self.dense_bytes)} {where}" + (
                f", token embeddings {size(self.embedding_bytes)} in RAM" if self.embedding_bytes else "")),
            ("KV cache", f"{size(self.kv_bytes)} {where}, {self._per_token()}"),
            ("workspace", f"{size(self.workspace_bytes)} {where}" + (
                f", prompts in chunks of {self.prefill_chunk_tokens} tokens" + (
                    f" ({self.ffn_chunk_tokens} through the experts)"
                    if self.ffn_chunk_tokens > self.prefill_chunk_tokens else "") if on_gpu else "")),
            *([("prefill buffers", self._prefill())] if on_gpu and self.slot_bytes else []),
            ("expert cache", cache),
            ("context", context + ")"),
            ("threads", f"{self.num_threads} ({cores})"),
            ("RAM", f"{size(self.ram_needed_bytes)} of {size(self.ram_budget_bytes)}"),
        ]
        if on_gpu:
            rows.append(("VRAM", f"{size(self.vram_needed_bytes)} of {size(self.vram_budget_bytes)}"))
        return rows

    def _prefill(self) -> str:
        if not self.prefill_buffers and self.cache_slots < self.min_cache_slots:
            return "none: the CPU computes a long prompt's experts"
        if not self.prefill_buffers:
            return "none: a long prompt's experts stream through the cache itself"
        kind = "double-buffered" if self.prefill_buffers == 2 else "single-buffered"
        return (f"{self.prefill_buffers} x {size(self.prefill_buffer_bytes // self.prefill_buffers)}, {kind}, "
                "lent by the expert cache while a prompt streams")

    def _per_token(self) -> str:
        return f"{size(self.kv_bytes_per_token)}/token" if self.kv_bytes_per_token else "size per token unknown"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["problems"] = [{**asdict(p), "message": str(p)} for p in self.problems]
        out.update(fits=self.fits, cache_bytes=self.cache_bytes, cache_fraction=self.cache_fraction,
                   vram_needed_bytes=self.vram_needed_bytes)
        return out
