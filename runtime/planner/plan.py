"""The fit planner (DESIGN.md §6): where a model's bytes live on one machine, decided by one pure function.

    fp = ModelFootprint.from_index(index)                  # exact, from a pulled model's FTW index
       | ModelFootprint.from_checkpoint(config, tensors)   # before a download: config.json + header sizes
       | ModelFootprint.from_sizes(expert_bytes=gguf_size) # a GGUF file's size, nothing else known
    plan(fp, Machine.probe(), PlanOverrides(num_ctx=8192)) -> Plan, or FitError with the numbers

With a GPU (DESIGN.md §5) every expert lives in host RAM (pinned up to any cap), and so does the
token embedding table (a lookup reads one row a token) unless it is also the output head; the other
dense weights, the KV cache and an activation workspace go on the GPU, and all VRAM left is one
expert cache of fixed slots (one FTW expert record each) shared by every MoE layer. VRAM is claimed
in that order: dense + workspace, KV for the context, then the cache takes the rest; more cache is
bought with a smaller --num-ctx. A cache below one token's experts is still a plan: its misses are
split between PCIe, streamed through its slots, and the CPU (below one layer's top-k, all the
CPU's, as llama.cpp's --n-cpu-moe computes every expert there). Without a GPU, or
when the dense weights do not fit in VRAM, everything lives in RAM and runs on the CPU.

The context: a num_ctx the user gave (`PlanOverrides.num_ctx`) is planned exactly, or refused with
the numbers (above the model's own maximum it is lowered to it, with a warning); a recipe's or a
default one (`default_num_ctx`) is lowered to what fits beside one token's experts, with a note,
but not below MIN_CONTEXT_TOKENS while VRAM lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .footprint import (  # noqa: F401 - re-exported: callers plan from here
    CAST_BYTES,
    FLOAT_BYTES,
    UNKNOWN_KV,
    KVLayout,
    ModelFootprint,
    kv_dtype_bytes,
    kv_layout,
    size,
)
from .placement import PREFILL_CHUNK_TOKENS, FitError, Plan, PlanOverrides, Problem  # noqa: F401 - re-exported: callers plan from here
from .resources import Machine

RAM_RESERVE_BYTES = 2 << 30  # the OS, the runtime's own code, CPU-side activations of the GPU path
# cuBLAS/Triton workspaces, CUDA-graph pools, allocator slack. Measured on the H200 in the race of
# 2026-12-02 (BENCHMARKS.md): with 512 MiB planned, the whole process peaked 278 MiB under its
# budget plus CUDA context at both settings (6,713 of 6,370 + 621 MiB, 11,321 of 10,976 + 621),
# decode and 512-token prompts, step graphs captured; 320 keeps ~86 MiB of that margin.
GPU_RESERVE_BYTES = 320 << 20
# A prompt chunk is PREFILL_CHUNK_TOKENS (placement.py), or down to this many, halving, where the
# full chunk's activations would leave the expert cache without one layer's top-k (mode auto then
# sends every expert to the CPU, a prompt's too): at the smallest footprint the slots a smaller
# chunk frees stream the prompt's experts over PCIe
MIN_PREFILL_CHUNK_TOKENS = 128
PREFILL_BUFFERS = 2  # bank-sized buffers a prefill streams through (2: double-buffered), lent by the cache
DEFAULT_NUM_CTX = 32768  # when neither the user nor the recipe says; agents need long contexts
MIN_CONTEXT_TOKENS = 2048  # below this a chat template and one answer do not fit: refuse instead
FEEDER_THREADS = 1  # a core that launches GPU work and copies expert misses, kept off the CPU kernels
PAGEABLE_SLOWDOWN = 8  # pageable host->GPU copies run at about 1/8 of pinned speed (DESIGN.md §5)
DEVICES = ("auto", "gpu", "cpu")

# -- the planner ------------------------------------------------------------------------------------

@dataclass
class _Log:
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


NO_OVERRIDES = PlanOverrides()  # (frozen: one default serves every call)


def plan(footprint: ModelFootprint, machine: Machine, overrides: PlanOverrides = NO_OVERRIDES) -> Plan:
    """Decide where `footprint` lives on `machine`. Pure: no I/O, same inputs give the same plan.

    Raises FitError (carrying the numbers and the forced plan) when the model cannot run, unless
    `overrides.force`, which returns that plan with its `problems` filled in."""
    if overrides.device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, not {overrides.device!r}")
    log = _Log()
    target = _target_context(footprint, overrides, log)
    ram_budget = min(machine.ram_total_bytes, overrides.ram_budget_bytes or machine.ram_total_bytes)
    vram_budget = _vram_budget(machine, overrides, log)
    args = (footprint, machine, overrides, ram_budget, target, log)
    result = _gpu_plan(*args, vram_budget) if vram_budget is not None else None
    if result is None:
        result = _cpu_plan(*args, why=_cpu_reason(machine, overrides))
    if result.ram_needed_bytes <= ram_budget and result.ram_needed_bytes > machine.ram_available_bytes:
        log.warnings.append(f"other programs hold memory now: {size(machine.ram_available_bytes)} available, the plan "
                            f"needs {size(result.ram_needed_bytes)}; close some or the system will swap")
    if not footprint.layout_known:
        log.notes.append("only sizes are known before the download: every byte counts as host RAM; cache slots "
                         "and KV come from the FTW index after `ft pull`")
    final = replace(result, notes=tuple(log.notes), warnings=tuple(log.warnings), problems=tuple(log.problems))
    if final.problems and not overrides.force:
        lines = "\n  - ".join(map(str, final.problems))
        raise FitError(f"{footprint.name} does not fit this machine:\n  - {lines}\n(--force runs it anyway)",
                       final.problems, final)
    return final


def _target_context(fp: ModelFootprint, o: PlanOverrides, log: _Log) -> int:
    """The context to plan for: the user's num_ctx, else the recipe's or the default; never more
    than the model's own (lowered to it with a warning where the user asked for more)."""
    asked = o.num_ctx if o.num_ctx is not None else o.default_num_ctx or DEFAULT_NUM_CTX
    if not fp.context_length or asked <= fp.context_length:
        return asked
    if o.num_ctx is not None or o.default_num_ctx is not None:
        (log.warnings if o.num_ctx is not None else log.notes).append(
            f"num_ctx {asked} is above the model's context of {fp.context_length}: clamped to it")
    return fp.context_length


def _vram_budget(machine: Machine, o: PlanOverrides, log: _Log) -> int | None:
    """VRAM ft may use; None plans for the CPU."""
    if machine.gpu is None:
        if o.vram_budget_bytes:
            log.notes.append("no GPU found: the VRAM budget is ignored")
        return 0 if o.device == "gpu" else None
    free = machine.gpu.vram_free_bytes
    if o.vram_budget_bytes is None:
        budget = free
    else:
        budget = min(o.vram_budget_bytes, free)
        if o.vram_budget_bytes > free:
            log.notes.append(f"VRAM budget {size(o.vram_budget_bytes)} asked, {size(free)} free: planning with {size(free)}")
    if o.device == "cpu" or (budget == 0 and o.device == "auto"):
        return None
    return budget


def _cpu_reason(machine: Machine, o: PlanOverrides) -> str:
    if o.device == "cpu":
        return "--device cpu"
    if machine.gpu is None:
        return "no GPU found"
    if o.vram_budget_bytes == 0:
        return "VRAM budget 0"
    return "the dense weights do not fit in VRAM"


def _threads(machine: Machine, o: PlanOverrides, on_gpu: bool, log: _Log) -> int:
    cores = max(1, machine.num_physical_cores)
    if o.num_threads is None:
        return max(1, cores - FEEDER_THREADS) if on_gpu else cores
    if o.num_threads > cores:
        log.warnings.append(f"{o.num_threads} threads on {cores} physical cores: hyper-threads share the "
                            "memory bandwidth expert kernels need, and usually slow them")
    return o.num_threads


def _clamp_context(target: int, max_kv: int | None, floor: int, what: str, o: PlanOverrides, log: _Log) -> int:
    """The context: `target`, or (unless the user gave it) what the KV budget allows but at least
    `floor` (the caller checks that fits)."""
    if max_kv is None or max_kv >= target or o.num_ctx is not None:
        return target
    context = max(max_kv, floor)
    if context < target:
        log.notes.append(f"context {target} does not fit beside the rest of {what}: planned {context} tokens")
    return context


def _exact_context_problem(fp: ModelFootprint, context: int, left: int, vram_budget: int, dense: int,
                           workspace: int) -> Problem | None:
    """Where the user's context does not fit the VRAM beside the dense weights and the workspace
    (the expert cache may go down to 0 slots, its misses computed on the CPU): the numbers."""
    kv = fp.kv
    if not kv.bytes_per_token or kv.bytes_for(context) <= left:
        return None
    most, beside = kv.max_tokens(left), kv.max_tokens(left - fp.min_cache_slots * fp.expert_stride_bytes)
    detail = f"KV for num_ctx {context} tokens at {size(kv.bytes_per_token)}/token"
    have = (f"the VRAM budget of {size(vram_budget)} less dense weights {size(dense)} and workspace {size(workspace)} "
            f"leaves {size(max(left, 0))}, enough for at most {most} tokens with no expert cache slot (misses computed "
            f"on the CPU), {beside} beside one token's experts")
    fix = (f"a smaller num_ctx (at most {most}), a larger VRAM budget (--vram-gib, "
           f"{size(kv.bytes_for(context) - left)} more), or --device cpu")
    return Problem("VRAM", kv.bytes_for(context), max(left, 0), "bytes", detail, have, fix)


def _ram_problem(needed: int, budget: int, detail: str, o: PlanOverrides, most_context: int | None = None) -> Problem:
    """`most_context`: the most context that fits (the user's num_ctx does not, and the model does with less)."""
    have = f"{'the RAM budget is' if o.ram_budget_bytes is not None else 'the machine has'} {size(budget)}"
    if most_context is not None:
        return Problem("RAM", needed, budget, "bytes", detail, have + f", enough for at most {most_context} tokens",
                       f"a smaller num_ctx (at most {most_context}), more RAM, or a more quantized variant")
    return Problem("RAM", needed, budget, "bytes", detail, have,
                   "choose a smaller or more quantized variant (e.g. an :fp8 tag), a smaller --num-ctx, or more RAM")


def _gpu_plan(fp: ModelFootprint, machine: Machine, o: PlanOverrides, ram_budget: int, target: int, log: _Log,
              vram_budget: int) -> Plan | None:
    """Experts in RAM, the rest on the GPU. None when `auto` should fall back to the CPU."""
    kv, floor = fp.kv, min(target, MIN_CONTEXT_TOKENS)
    dense = fp.dense_bytes - fp.embedding_bytes  # the token embeddings stay in host RAM
    workspace = GPU_RESERVE_BYTES + PREFILL_CHUNK_TOKENS * fp.activation_bytes_per_token
    left = vram_budget - dense - workspace  # for KV and the cache
    # the GPU is tried where the KV of `floor` tokens fits beside the rest; the user's context where
    # anything does (below its KV, it is refused with the numbers: _exact_context_problem)
    least = floor if o.num_ctx is None else 0
    if left < kv.bytes_for(least):
        needed = dense + workspace + kv.bytes_for(floor)
        detail = (f"dense weights {size(dense)} + workspace {size(workspace)} + KV for {floor} tokens "
                  f"{size(kv.bytes_for(floor))}")
        if o.device == "auto":
            log.notes.append(f"VRAM: {detail} need {size(needed)}, the budget is {size(vram_budget)}: running on the CPU")
            return None
        have = f"the VRAM budget is {size(vram_budget)}" if machine.gpu else "no GPU was found"
        fix = "choose a quantized tag, a smaller --num-ctx, free VRAM, or --device cpu" if machine.gpu else \
            "run it on the CPU: --device cpu (or leave --device out)"
        log.problems.append(Problem("VRAM", needed, vram_budget, "bytes", detail, have, fix))
    min_cache = fp.min_cache_slots * fp.expert_stride_bytes
    max_kv = kv.max_tokens(left - min_cache)
    context = _clamp_context(target, max_kv, floor, "the GPU's contents", o, log)
    exact = _exact_context_problem(fp, context, left, vram_budget, dense, workspace) if o.num_ctx is not None else None
    if exact is not None and left >= kv.bytes_for(least):  # (else the dense weights alone are too many, said above)
        log.problems.append(exact)
    kv_bytes = kv.bytes_for(context)
    chunk = _prefill_chunk(fp, left - kv_bytes)  # (the context is settled: a smaller chunk buys slots only)
    workspace -= (PREFILL_CHUNK_TOKENS - chunk) * fp.activation_bytes_per_token
    left += (PREFILL_CHUNK_TOKENS - chunk) * fp.activation_bytes_per_token
    slots, buffers = 0, 0
    if fp.layout_known:
        buffers, slots = _prefill_buffers_and_slots(fp, left - kv_bytes, log)
        _check_cache(fp, slots, log)
    ram_needed = fp.expert_pool_bytes + fp.embedding_bytes + RAM_RESERVE_BYTES
    if ram_needed > ram_budget:
        embedding = f" + token embeddings {size(fp.embedding_bytes)}" if fp.embedding_bytes else ""
        log.problems.append(_ram_problem(ram_needed, ram_budget, f"experts {size(fp.expert_pool_bytes)}{embedding} + "
                                         f"{size(RAM_RESERVE_BYTES)} reserve", o))
    caps = [c for c in (machine.max_pinned_bytes, o.max_pinned_bytes) if c is not None]
    pinned = max(0, min([fp.expert_pool_bytes, ram_budget - RAM_RESERVE_BYTES - fp.embedding_bytes, *caps]))
    if pinned < fp.expert_pool_bytes:
        log.warnings.append(f"{size(pinned)} of the {size(fp.expert_pool_bytes)} expert pool can be pinned: cache "
                            f"fills from the other {size(fp.expert_pool_bytes - pinned)} run ~{PAGEABLE_SLOWDOWN}x slower")
    if fp.layout_known and slots >= fp.num_expert_records:
        log.notes.append(f"all {fp.num_expert_records} experts fit in VRAM: after warm-up nothing crosses PCIe")
    elif fp.layout_known and kv_bytes > slots * fp.expert_stride_bytes and context > floor:
        per_1k = 1024 * kv.bytes_per_token / fp.expert_stride_bytes
        log.notes.append(f"the KV cache ({size(kv_bytes)}) is larger than the expert cache: every 1024 tokens "
                         f"less of --num-ctx buys {per_1k:.1f} more expert slots")
    if chunk < PREFILL_CHUNK_TOKENS and fp.layout_known:
        ffn = _ffn_chunk(fp, chunk)
        through = f" (their experts {ffn} tokens at a time)" if ffn > chunk else ""
        log.notes.append(f"prompts run in chunks of {chunk} tokens{through}, not {PREFILL_CHUNK_TOKENS}: the smaller "
                         f"chunk's activations leave the expert cache {slots} slots, enough for a layer's "
                         f"top-{fp.num_experts_per_tok} (misses and long prompts' experts then stream over PCIe "
                         "beside the CPU)")
    return replace(_plan(fp, machine, o, "", ram_budget, ram_needed, vram_budget, pinned, workspace, context, max_kv,
                         slots, log, buffers), prefill_chunk_tokens=chunk, ffn_chunk_tokens=_ffn_chunk(fp, chunk))


def _prefill_chunk(fp: ModelFootprint, room: int) -> int:
    """The prompt chunk (tokens computed at once): PREFILL_CHUNK_TOKENS, or where `room` (VRAM
    left for the cache beside a whole chunk's workspace) holds fewer slots than one layer's top-k,
    the largest halving of it, down to MIN_PREFILL_CHUNK_TOKENS, whose smaller workspace leaves
    that many (none does: PREFILL_CHUNK_TOKENS, the CPU computing every expert either way)."""
    if not fp.layout_known or not fp.expert_stride_bytes:
        return PREFILL_CHUNK_TOKENS

    def slots(tokens: int) -> int:
        return max(0, room + (PREFILL_CHUNK_TOKENS - tokens) * fp.activation_bytes_per_token) // fp.expert_stride_bytes

    chunk = PREFILL_CHUNK_TOKENS
    while slots(chunk) < fp.num_experts_per_tok and chunk > MIN_PREFILL_CHUNK_TOKENS:
        chunk //= 2
    return chunk if slots(chunk) >= fp.num_experts_per_tok else PREFILL_CHUNK_TOKENS


def _ffn_chunk(fp: ModelFootprint, chunk: int) -> int:
    """Prompt tokens a MoE layer's FFN takes at once: `chunk`, or where its experts compute in
    grouped launches (fp.ffn_bytes_per_token), the largest halving of PREFILL_CHUNK_TOKENS whose
    FFN fits the workspace `chunk` tokens of the whole layer were given. At the smallest budgets
    the chunk is halved for one token's slots (`_prefill_chunk`) and the prompt's experts then
    stream through those slots once an FFN call: 256-token calls stream a 512-token prompt's
    experts twice (the Q4_K_M race file at -ncmoe 16: 11.3 GB over PCIe for 5.6)."""
    if not fp.ffn_bytes_per_token or chunk >= PREFILL_CHUNK_TOKENS:
        return chunk
    tokens = PREFILL_CHUNK_TOKENS
    while tokens > chunk and tokens * fp.ffn_bytes_per_token > chunk * fp.activation_bytes_per_token:
        tokens //= 2
    return max(tokens, chunk)


def _prefill_buffers_and_slots(fp: ModelFootprint, room: int, log: _Log) -> tuple[int, int]:
    """(prefill buffers, cache slots) in `room` bytes of VRAM. The buffers (one bank each) are
    slots the cache lends while a long prompt streams (ExpertCache.lend), so all of the room is
    cache: `lent_prefill_buffers` says how many it can lend, and where every expert fits, the
    cache gets the buffers' slots beside them (a prompt then evicts nothing)."""
    stride = fp.expert_stride_bytes
    bank_slots = -(-fp.bank_bytes // stride)
    slots = max(0, room) // stride
    buffers = lent_prefill_buffers(slots, bank_slots, fp.min_cache_slots)
    slots = min(slots, fp.num_expert_records + buffers * bank_slots)
    if buffers < PREFILL_BUFFERS and slots >= fp.min_cache_slots:  # (below, the CPU computes long prompts too)
        held = "one prefill buffer, not two" if buffers == 1 else "no prefill buffer"
        how = "through it" if buffers == 1 else "through the expert cache itself"
        log.notes.append(f"{held} ({size(fp.bank_bytes)} each, lent by the expert cache during a prompt: more would "
                         f"leave it under one token's experts): a long prompt's experts stream {how}, without "
                         "overlap; more VRAM or a smaller --num-ctx buys a faster prefill")
    return buffers, slots


def lent_prefill_buffers(slots: int, bank_slots: int, min_cache_slots: int) -> int:
    """How many prefill buffers of `bank_slots` slots each a cache of `slots` lends while a long
    prompt streams: two (double-buffered) where it keeps at least one token's experts
    (`min_cache_slots`) beside them, else one, else none. Decode has every slot back: the
    buffers cost a prompt the experts cached where they were, not the cache its size."""
    for buffers in range(PREFILL_BUFFERS, 0, -1):
        if slots - buffers * bank_slots >= min_cache_slots:
            return buffers
    return 0


def _check_cache(fp: ModelFootprint, slots: int, log: _Log) -> None:
    """A cache below one token's experts is a plan, not a refusal: a global LRU that small keeps
    next to nothing for the next token, so mode auto streams each layer's PCIe share of its misses
    through it beside the CPU's share (runtime/gpu/build.py `serving_mode`; below one layer's
    top-k it computes them all on the CPU, as llama.cpp's --n-cpu-moe does), and a long prompt's
    experts stream through it; --mode offload refuses it."""
    if slots >= fp.min_cache_slots:
        return
    short = (fp.min_cache_slots - slots) * fp.expert_stride_bytes
    if slots >= fp.num_experts_per_tok:
        how = ("each layer's misses are split between PCIe, streamed through its slots, and the CPU, and long "
               "prompts' experts stream through it")
    else:
        how = "misses, and long prompts' experts, are computed on the CPU, as llama.cpp's --n-cpu-moe does"
    log.notes.append(f"the expert cache holds {slots} slots, fewer than one token's experts ({fp.num_moe_layers} MoE "
                     f"layers x top-{fp.num_experts_per_tok} = {fp.min_cache_slots} slots of "
                     f"{size(fp.expert_stride_bytes)}): {how}; {size(short)} more VRAM or a smaller --num-ctx gives "
                     "it one token's experts")


def _cpu_plan(fp: ModelFootprint, machine: Machine, o: PlanOverrides, ram_budget: int, target: int, log: _Log,
              why: str) -> Plan:
    """Dense weights, experts, KV and activations all in RAM."""
    kv, floor = fp.kv, min(target, MIN_CONTEXT_TOKENS)
    workspace = PREFILL_CHUNK_TOKENS * fp.activation_bytes_per_token
    fixed = fp.expert_pool_bytes + fp.dense_bytes + workspace + RAM_RESERVE_BYTES
    max_kv = kv.max_tokens(ram_budget - fixed)
    context = _clamp_context(target, max_kv, floor, "RAM", o, log)
    ram_needed = fixed + kv.bytes_for(context)
    if ram_needed > ram_budget:
        parts = [f"experts {size(fp.expert_pool_bytes)}", f"dense weights {size(fp.dense_bytes)}"]
        parts += [f"KV for {context} tokens {size(kv.bytes_for(context))}"] if kv.bytes_per_token else []
        parts += [f"activations {size(workspace)}"] if workspace else []
        detail = " + ".join([*parts, f"{size(RAM_RESERVE_BYTES)} reserve"]) + f"; {why}"
        fits_less = o.num_ctx is not None and max_kv is not None and max_kv > 0
        log.problems.append(_ram_problem(ram_needed, ram_budget, detail, o, max_kv if fits_less else None))
    return _plan(fp, machine, o, why, ram_budget, ram_needed, 0, 0, workspace, context, max_kv, 0, log)


def _plan(fp: ModelFootprint, machine: Machine, o: PlanOverrides, cpu_reason: str, ram_budget: int,
          ram_needed: int, vram_budget: int, pinned: int, workspace: int, context: int, max_kv: int | None,
          slots: int, log: _Log, prefill_buffers: int = 0) -> Plan:
    on_gpu = not cpu_reason
    embedding = fp.embedding_bytes if on_gpu else 0
    return Plan(
        model=fp.name, source=fp.source, device="gpu" if on_gpu else "cpu", device_reason=cpu_reason, gpu_name=machine.gpu.name if on_gpu and machine.gpu else None,
        ram_budget_bytes=ram_budget, ram_needed_bytes=ram_needed, vram_budget_bytes=vram_budget,
        expert_pool_bytes=fp.expert_pool_bytes, pinned_bytes=pinned, dense_bytes=fp.dense_bytes - embedding,
        embedding_bytes=embedding,
        workspace_bytes=workspace, kv_bytes=fp.kv.bytes_for(context), kv_bytes_per_token=fp.kv.bytes_per_token,
        kv_formula=fp.kv.formula, context_length=context, model_context_length=fp.context_length,
        max_kv_tokens=max_kv, slot_bytes=fp.expert_stride_bytes, cache_slots=slots,
        prefill_buffers=prefill_buffers, prefill_buffer_bytes=prefill_buffers * fp.bank_bytes,
        min_cache_slots=fp.min_cache_slots, num_expert_records=fp.num_expert_records,
        num_threads=_threads(machine, o, on_gpu, log), num_physical_cores=machine.num_physical_cores)
