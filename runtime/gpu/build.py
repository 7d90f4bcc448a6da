"""Putting the hybrid runtime together: cache size from a budget or a plan, the capacity check,
pinned banks, the executor; and a whole registered model on the device (`load_gpu`).

A cache below one token's experts (MoE layers x top-k slots) runs: it keeps too little for decode
to reuse, so "auto" streams through it (`serving_mode`): each layer's PCIe share of its misses is
filled into LRU victims and computed there while the CPU computes the rest, the split by measured
rates, and a long prompt's experts stream through it too. Only "offload", whose every miss would
cross PCIe at a few percent hits, is refused; below one layer's top-k slots auto runs as "cpu"."""

from __future__ import annotations

import logging
import os

import torch

from ..experts import CPUExpertExecutor, ExpertExecutor, HostExpertBank
from ..loading.read_ftw import ModelWeights, load_weights
from ..loading.registered import RegisteredModel
from ..models import build_model, keep_float32
from ..planner.footprint import keeps_blocks
from ..planner.plan import (
    PREFILL_BUFFERS,
    PREFILL_CHUNK_TOKENS,
    ModelFootprint,
    Plan,
    PlanOverrides,
    lent_prefill_buffers,
    plan,
    size,
)
from ..planner.resources import Machine
from ..policy.miss_split import DEFAULT_FILL_PRICING
from .bandwidth_profile import BandwidthProfile
from .device_model import DeviceModel, move_dense
from .elastic import VramGovernor, cuda_probe
from .executor import HybridExpertExecutor
from .expert_cache import ExpertCache
from .host_memory import HostPinner
from .measure_bandwidth import load_or_measure
from .prefill import StreamingPrefill

log = logging.getLogger(__name__)

class CacheTooSmallError(ValueError):
    """The expert cache cannot hold one token's experts, so a global LRU would thrash."""


def serving_mode(mode: str, num_slots: int, *, num_moe_layers: int, top_k: int) -> str:
    """The mode an executor of `num_slots` runs in. "auto" runs as asked down to one layer's top-k
    slots: below one token's experts (MoE layers x top-k) its global LRU keeps next to nothing
    for the next token, so the slots serve as staging, each layer's PCIe share of the misses
    streamed through LRU victims (never a slot the layer needs) beside the CPU's share, as many
    as the split's measured rates say (at ~0% hits no miss earns a later hit, so that is the
    plain rate split). Below top-k slots a layer's share cannot be staged: "auto" runs as "cpu"
    (every miss computed on the CPU, straight from the host bank, as llama.cpp's --n-cpu-moe
    does). The others run as asked."""
    if mode != "auto" or num_slots >= top_k:
        if mode == "auto" and num_slots < num_moe_layers * top_k:
            log.info("the expert cache holds %d slots, fewer than one token's experts (%d MoE layers x top-%d): "
                     "each layer's PCIe share of its misses streams through them beside the CPU's", num_slots,
                     num_moe_layers, top_k)
        return mode
    log.info("the expert cache holds %d slots, fewer than one layer's top-%d: mode auto computes every miss on "
             "the CPU", num_slots, top_k)
    return "cpu"


def floor_slots(mode: str, *, num_moe_layers: int, top_k: int) -> int:
    """The fewest slots an executor in `mode` runs well on, the elastic governor's floor: none for
    "cpu" (no cache used); one layer's top-k for "auto", which streams its misses through a smaller
    cache than one token's experts (`serving_mode`); one token's experts for the others, whose
    global LRU thrashes below it."""
    if mode == "cpu":
        return 0
    return top_k if mode == "auto" else num_moe_layers * top_k


def check_cache_capacity(num_slots: int, *, num_moe_layers: int, top_k: int, slot_bytes: int, mode: str,
                         force: bool = False) -> str | None:
    """Below num_moe_layers x top_k slots a global LRU evicts what the next layer needs and hits
    fall to ~0%: refused for "offload" (unless `force`; "auto" streams through it,
    `serving_mode`), a warning for the others but "cpu" and "auto". Returns the message when short."""
    need = num_moe_layers * top_k
    if num_slots >= need or mode in ("cpu", "auto"):  # auto streams through a smaller cache (serving_mode)
        return None
    message = (f"the expert cache holds {num_slots} slots ({size(num_slots * slot_bytes)}), fewer than one token's "
               f"experts: {num_moe_layers} MoE layers x top-{top_k} = {need} slots ({size(need * slot_bytes)}); a global "
               f"LRU below that evicts what the next layer needs and hits fall to ~0%")
    if mode == "offload" and not force:
        raise CacheTooSmallError(f"{message}. Give it {size((need - num_slots) * slot_bytes)} more VRAM (or a "
                                 f"smaller context), run mode 'auto' (misses split between PCIe and the CPU) or 'cpu' "
                                 f"(the CPU computes them), or force "
                                 f"mode {mode!r}")
    log.warning("%s", message)
    return message


def prefill_buffer_bytes(banks: dict[int, HostExpertBank], num_buffers: int) -> int:
    return num_buffers * max((b.layout.nbytes for b in banks.values()), default=0)


def bank_slots(banks: dict[int, HostExpertBank], slot_bytes: int) -> int:
    """Cache slots one prefill buffer takes (the largest bank's bytes, in whole slots)."""
    return -(-prefill_buffer_bytes(banks, 1) // slot_bytes)


def build_hybrid(weights: ModelWeights | dict[int, HostExpertBank], *, device: torch.device | str,
                 vram_budget_bytes: int | None = None, cache_slots: int | None = None, mode: str = "auto",
                 profile: BandwidthProfile | None = None, top_k: int | None = None,
                 compute_dtype: torch.dtype = torch.bfloat16, cpu_executor: ExpertExecutor | None = None,
                 cpu_threads: int | None = None, prefill_buffers: int = 2, force: bool = False,
                 pin: bool = True, **options) -> HybridExpertExecutor:
    """A HybridExpertExecutor over a model's banks or synthetic ones (`top_k` then required).

    The cache gets `cache_slots` slots, or what `vram_budget_bytes` holds (here the budget covers
    only the cache), never more than every expert and the slots it lends as `prefill_buffers`
    (ExpertCache.lend, where it keeps one token's experts beside them; a budget that cannot
    lend as many gets fewer, `lent_prefill_buffers`). On CUDA the banks are
    pinned in place first. "auto" without `profile` loads this machine's kept profile, or
    measures (and keeps) one. `options` go to HybridExpertExecutor (static_resident_layers,
    split, prefill_min_tokens)."""
    banks = weights.banks if isinstance(weights, ModelWeights) else weights
    if isinstance(weights, ModelWeights):
        top_k = top_k or weights.config.num_experts_per_tok
    if top_k is None:
        raise ValueError("top_k is needed with bare banks (the model's num_experts_per_tok)")
    if not banks:
        raise ValueError("the model has no expert banks: nothing for an expert cache to hold")
    device = torch.device(device)
    slot_bytes = max(b.layout.expert_stride for b in banks.values())
    per_buffer, min_slots = bank_slots(banks, slot_bytes), len(banks) * top_k
    if cache_slots is None:
        if vram_budget_bytes is None:
            raise ValueError("give cache_slots or vram_budget_bytes")
        cache_slots = max(0, vram_budget_bytes // slot_bytes)
        prefill_buffers = min(prefill_buffers, lent_prefill_buffers(cache_slots, per_buffer, min_slots))
    lent = prefill_buffers * per_buffer if mode != "cpu" else 0
    cache_slots = min(cache_slots, sum(b.num_experts for b in banks.values()) + lent)
    mode = serving_mode(mode, cache_slots, num_moe_layers=len(banks), top_k=top_k)
    check_cache_capacity(cache_slots, num_moe_layers=len(banks), top_k=top_k, slot_bytes=slot_bytes, mode=mode,
                         force=force)
    pinner = None
    if device.type == "cuda" and pin:
        pinner = HostPinner()
        pinner.pin_banks(banks)
    cpu_executor = cpu_executor or CPUExpertExecutor(banks, compute_dtype, threads=cpu_threads)
    if mode != "offload" and hasattr(cpu_executor, "prepare"):
        cpu_executor.prepare()  # the CPU kernel built now, not in the first step with a CPU share
    if mode == "auto" and profile is None and options.get("split") is None:
        # (measured in no more slots than the cache will have: a first load stays inside its budget)
        profile = load_or_measure(banks[min(banks)], cpu_executor, device, cpu_threads=cpu_threads,
                                  pcie_repeat=options.get("pcie_repeat", 1), max_slots=cache_slots)
    cache = ExpertCache(cache_slots, slot_bytes, device, num_layers=max(banks) + 1,
                        num_experts=max(b.num_experts for b in banks.values()))
    executor = HybridExpertExecutor(banks, device=device, cache=cache, mode=mode, cpu_executor=cpu_executor,
                                    compute_dtype=compute_dtype, profile=profile, prefill_buffers=prefill_buffers,
                                    prefill_lend_above=min_slots, **options)
    executor.pinner = pinner  # type: ignore[attr-defined]  # keeps the registration as long as the executor
    log.info("expert cache: %d slots x %s = %s on %s, mode %s", cache_slots, size(slot_bytes),
             size(cache_slots * slot_bytes), device, mode)
    return executor


def governor_for(executor: HybridExpertExecutor, footprint: ModelFootprint, fit: Plan | None,
                 vram_budget_bytes: int | None) -> VramGovernor:
    """The elastic-VRAM governor of a loaded model: the budget it was planned for (or, with slots
    given outright, what those slots take), free-memory checks on CUDA."""
    cache = executor.cache
    budget = fit.vram_budget_bytes if fit is not None else vram_budget_bytes
    if budget is None:
        budget = cache.num_slots * cache.slot_bytes
    min_slots = floor_slots(executor.mode, num_moe_layers=footprint.num_moe_layers,
                            top_k=footprint.num_experts_per_tok)
    probe = cuda_probe(executor.device) if executor.device.type == "cuda" else None
    # what the budget holds beside the cache: the plan's dense weights, KV and workspace (the
    # plan's cache may be capped at every expert, so the budget less the cache would count unused
    # budget as taken); the prefill buffers are slots the cache lends
    other = None
    if fit is not None:
        other = fit.dense_bytes + fit.kv_bytes + fit.workspace_bytes
    prefill = executor.prefill
    lent = bank_slots(executor.banks, cache.slot_bytes) * prefill.streamer.num_buffers \
        if isinstance(prefill, StreamingPrefill) else 0
    floor = "one layer's top-k experts" if executor.mode == "auto" else "one token's experts"
    return VramGovernor(slot_bytes=cache.slot_bytes, budget_bytes=budget, cache_slots=cache.num_slots,
                        min_slots=min_slots, other_bytes=other, max_slots=footprint.num_expert_records + lent,
                        probe=probe, floor_name=floor)


def load_gpu(registered: RegisteredModel, dtype: torch.dtype, *, device: torch.device | str = "cuda",
             fit: Plan | None = None, vram_budget_bytes: int | None = None, cache_slots: int | None = None,
             num_ctx: int | None = None, mode: str = "auto", prefill_buffers: int | None = None,
             force: bool = False, **options) -> tuple[ModelWeights, DeviceModel, HybridExpertExecutor]:
    """Dense weights on `device`, banks in pinned host memory, the expert cache in what is left.

    Slots and prefill buffers: the fit plan's (`fit`, or one made here for `vram_budget_bytes`
    and `num_ctx`), unless given (`cache_slots`: the buffers default to 2, double-buffered).
    FT_CUDA_GRAPHS=0 in the environment runs every decode call uncaptured (as vLLM's
    --enforce-eager: a way around a driver that mishandles graphs), unless `cuda_graphs` is given;
    FT_FILL_PRICING ("worth", the default, or "hit_rate": policy/miss_split.py) prices "auto"'s
    CPU-served misses, unless `fill_pricing` is given."""
    device = torch.device(device)
    options.setdefault("cuda_graphs", os.environ.get("FT_CUDA_GRAPHS", "1").strip().lower() not in ("0", "false", "no"))
    options.setdefault("fill_pricing", os.environ.get("FT_FILL_PRICING", DEFAULT_FILL_PRICING).strip().lower())
    with registered.open_ftw() as reader:
        weights = load_weights(reader, dtype, keep_float32=keep_float32(reader.index.family), keep_blocks=keeps_blocks)
        footprint = ModelFootprint.from_index(reader.index, name=registered.name.display,
                                              context_length=registered.context_length)
    if cache_slots is None:
        if fit is None:
            overrides = PlanOverrides(vram_budget_bytes=vram_budget_bytes, num_ctx=num_ctx, device="gpu", force=True)
            fit = plan(footprint, Machine.probe(), overrides)
        cache_slots = fit.cache_slots
        if prefill_buffers is None:
            prefill_buffers = fit.prefill_buffers
    if prefill_buffers is None:
        prefill_buffers = PREFILL_BUFFERS
    mode = serving_mode(mode, cache_slots, num_moe_layers=len(weights.banks), top_k=weights.config.num_experts_per_tok)
    if mode == "cpu":  # the CPU computes every expert: no cache to fill, no bank to stream
        prefill_buffers = 0
    buffers = prefill_buffer_bytes(weights.banks, prefill_buffers)
    log.info("expert cache: %d slots; %d prefill buffers (%s, lent by the cache while a prompt streams)",
             cache_slots, prefill_buffers, size(buffers))
    pinner = None
    if device.type == "cuda":
        pinner = HostPinner(fit.pinned_bytes if fit is not None else None)
        pinner.pin_banks(weights.banks)
    weights = move_dense(weights, device)
    executor = build_hybrid(weights, device=device, cache_slots=cache_slots, mode=mode, compute_dtype=dtype,
                            prefill_buffers=prefill_buffers, force=force, pin=False, **options)
    executor.pinner = pinner  # type: ignore[attr-defined]
    executor.elastic = governor_for(executor, footprint, fit, vram_budget_bytes)
    with torch.device(device):
        model = build_model(weights.config, weights, executor, dtype)
    chunk = fit.prefill_chunk_tokens if fit is not None else PREFILL_CHUNK_TOKENS  # (what the workspace holds)
    ffn_chunk = fit.ffn_chunk_tokens if fit is not None else None
    return weights, DeviceModel(model, device, executor.steps, prefill_chunk_tokens=chunk,
                                prefill_ffn_chunk_tokens=ffn_chunk), executor
