"""A long prompt on the GPU path computes each layer in chunks of the fit plan's
PREFILL_CHUNK_TOKENS (runtime/models/base.py), so what its forward allocates beside the weights
and the KV cache is the workspace the plan holds for it (`activation_bytes_per_token` of one
chunk), whatever the prompt's length, and each layer's bank is still streamed once.

Run here on CPU tensors, as the GPU path runs in CI (`build_hybrid`, DeviceModel on "cpu"), with
torch's profiler counting live bytes. What grows with the prompt and the plan does not hold per
chunk: the residual stream (hidden x compute bytes a token, the layers' input) and the token ids
and positions; on the CPU also the causal mask of a later chunk over the cached keys (a bool and
a float [chunk, keys]; CUDA's FlashAttention takes the bias without one: layers/attention.py).
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from runtime.experts.executor import CPUExpertExecutor
from runtime.gpu import build_hybrid
from runtime.gpu.device_model import DeviceModel
from runtime.layers.attention import causal_attention
from runtime.loading.read_ftw import ModelWeights
from runtime.models import build_model
from runtime.models.base import chunk_bounds
from runtime.models.synthetic import Qwen3MoeShape, random_qwen3_moe
from runtime.planner.footprint import _activation_bytes_per_token
from runtime.planner.plan import PREFILL_CHUNK_TOKENS

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, INTER, LAYERS, VOCAB = 256, 4, 2, 64, 32, 8, 128, 2, 512
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
MASK_BYTES_PER_SCORE = 1 + 4  # the CPU's causal mask of a later chunk: bool, then float


def tiny_model(dtype: str) -> ModelWeights:
    """A random Qwen3-MoE with the shape of the big ones in miniature (GQA, q/k norms, top-8 of 32)."""
    return random_qwen3_moe(Qwen3MoeShape(HIDDEN, HEADS, KV_HEADS, HEAD_DIM, EXPERTS, TOP_K, INTER, VOCAB, LAYERS),
                            dtype, std=0.05)


def planned_bytes_per_token() -> int:
    """The fit plan's activation bytes per token for this shape (the normalized config's names)."""
    return _activation_bytes_per_token({"hidden_size": HIDDEN, "num_attention_heads": HEADS,
                                        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
                                        "num_experts": EXPERTS, "num_experts_per_tok": TOP_K,
                                        "moe_intermediate_size": INTER})


def gpu_path(weights: ModelWeights, dtype: str, chunk: int | None, *, mode: str = "offload", buffers: int = 2,
             slots: int = LAYERS * EXPERTS // 2, ffn_chunk: int | None = None):
    ex = build_hybrid(weights, device="cpu", cache_slots=slots, mode=mode, compute_dtype=DTYPES[dtype],
                      prefill_buffers=buffers, pin=False, force=True, split=lambda misses, nbytes: misses)
    return DeviceModel(build_model(weights.config, weights, ex, DTYPES[dtype]), "cpu", ex.steps,
                       prefill_chunk_tokens=chunk, prefill_ffn_chunk_tokens=ffn_chunk), ex


def prompt(tokens: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (tokens,), generator=torch.Generator().manual_seed(seed))


def peak_live_bytes(run) -> int:
    """The most bytes `run()` held allocated at once beyond what it found (torch's profiler:
    every allocation and free on the CPU device, in order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def prefill_peak(model: DeviceModel, tokens: int) -> int:
    state = model.new_state(tokens + 8)  # the KV cache: held before, as the plan holds it
    model.forward(prompt(64, seed=9), model.new_state(72), last_only=True)  # bank buffers, kernels: made once
    return peak_live_bytes(lambda: model.forward(prompt(tokens), state, last_only=True))


def prompt_bytes(tokens: int, dtype: str) -> int:
    """What the prompt itself holds through the pass: its residual stream, ids and positions."""
    return tokens * (HIDDEN * DTYPES[dtype].itemsize + 2 * 8)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_chunks_peak_per_token_is_what_the_plan_holds_for_it(dtype: str) -> None:
    """One chunk's prompt: the forward's peak beside the prompt's own bytes is within the planned
    activation bytes of that many tokens (and not far below: the formula describes it)."""
    weights = tiny_model(dtype)
    model, _ = gpu_path(weights, dtype, PREFILL_CHUNK_TOKENS)
    chunk = PREFILL_CHUNK_TOKENS
    held = prefill_peak(model, chunk) - prompt_bytes(chunk, dtype)
    planned = chunk * planned_bytes_per_token()
    assert held <= planned, f"{held / chunk:.0f} bytes a token held, {planned / chunk:.0f} planned"
    if dtype == "f32":  # counted at 4 bytes an element: a float32 model's chunk holds about that
        assert held >= planned / 2, f"{held / chunk:.0f} bytes a token held, {planned / chunk:.0f} planned"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_a_long_prompts_peak_stays_within_the_workspace_and_hardly_grows(dtype: str) -> None:
    """1024 and 4096 tokens: each within one chunk's planned workspace plus the prompt's own
    bytes (and on the CPU the later chunks' masks); from one to the other the peak grows by
    those alone. Computed all at once it grew with the prompt (asserted: what chunks are for)."""
    weights = tiny_model(dtype)
    model, _ = gpu_path(weights, dtype, PREFILL_CHUNK_TOKENS)
    workspace = PREFILL_CHUNK_TOKENS * planned_bytes_per_token()
    peaks = {tokens: prefill_peak(model, tokens) for tokens in (1024, 4096)}
    for tokens, peak in peaks.items():
        mask = PREFILL_CHUNK_TOKENS * tokens * MASK_BYTES_PER_SCORE
        assert peak <= workspace + prompt_bytes(tokens, dtype) + mask, f"{tokens} tokens: {peak / 2**20:.1f} MiB"
    grown = peaks[4096] - peaks[1024]
    allowed = prompt_bytes(3072, dtype) + PREFILL_CHUNK_TOKENS * 3072 * MASK_BYTES_PER_SCORE
    assert grown <= allowed + (256 << 10), f"grew {grown / 2**20:.1f} MiB, allowed {allowed / 2**20:.1f} MiB"
    whole, _ = gpu_path(weights, dtype, None)
    assert prefill_peak(whole, 4096) > 2 * peaks[4096]


def _run(model: DeviceModel, ids: torch.Tensor, steps: int = 3) -> list[torch.Tensor]:
    """The prompt's last logits, then `steps` greedy decode steps' (the cache the prefill left)."""
    state = model.new_state(ids.numel() + steps + 1)
    logits = [model.forward(ids, state, last_only=True)[-1]]
    for _ in range(steps):
        logits.append(model.forward(torch.tensor([int(logits[-1].argmax())]), state)[-1])
    return logits


@pytest.mark.parametrize("mode,buffers", [("offload", 2), ("offload", 1), ("offload", 0), ("prefill_placement", 2),
                                          ("cpu", 0)])
def test_a_chunked_prefill_equals_the_whole_one(mode: str, buffers: int) -> None:
    """1300 tokens in three chunks against one call: the same logits (float tolerance: the experts
    are batched differently), the same cache afterwards, each layer's bank streamed once, and
    the CPU backend's logits."""
    weights = tiny_model("f32")
    ids = prompt(1300)
    runs = {}
    for chunk in (PREFILL_CHUNK_TOKENS, None):
        model, ex = gpu_path(weights, "f32", chunk, mode=mode, buffers=buffers)
        logits = _run(model, ids, steps=0)
        runs[chunk] = logits, ex.stats(), sorted(int(k) for k in ex.cache.owner if k >= 0)
        logits += _run(model, ids[:700], steps=3)[1:]  # a second prompt: decode from the cache it left
        runs[chunk] = (logits, *runs[chunk][1:])
    (chunked, stats, cached), (whole, whole_stats, whole_cached) = runs[PREFILL_CHUNK_TOKENS], runs[None]
    assert len(chunk_bounds(1300, PREFILL_CHUNK_TOKENS)) == 3
    for ours, ref in zip(chunked, whole, strict=True):
        torch.testing.assert_close(ours, ref, atol=2e-5 * float(ref.abs().max()), rtol=0)
    assert cached == whole_cached
    assert stats.prefill_bytes == whole_stats.prefill_bytes  # (0 in the modes that stream nothing)
    if mode != "cpu":
        bank = weights.banks[0].layout.nbytes
        assert whole_stats.prefill_bytes <= LAYERS * bank and (buffers == 0 or whole_stats.prefill_bytes > 0)
    reference = build_model(weights.config, weights, CPUExpertExecutor(weights.banks, torch.float32), torch.float32)
    state = reference.new_state(1301)
    ref = reference.forward(ids, state, last_only=True)[-1]
    torch.testing.assert_close(chunked[0], ref, atol=2e-5 * float(ref.abs().max()), rtol=0)


def test_experts_in_larger_chunks_than_the_mixer_stream_the_cache_once_per_ffn_call() -> None:
    """The plan's smallest footprints: 256-token chunks so that the cache keeps a layer's top-k (9
    slots of 32 experts here: rounds of fills through the cache, CachePrefill), the MoE FFN in 512
    (Plan.ffn_chunk_tokens). A 512-token prompt then makes one FFN call a layer, not two, and
    streams each routed expert once, not once a chunk; the logits are the 256-token chunks' and
    the CPU backend's."""
    weights = tiny_model("f32")
    ids = prompt(512, seed=3)
    runs = {}
    for ffn_chunk in (None, 512):
        model, ex = gpu_path(weights, "f32", 256, buffers=0, slots=9, ffn_chunk=ffn_chunk)
        runs[ffn_chunk] = _run(model, ids, steps=2), ex.stats()
    (split, split_stats), (whole, whole_stats) = runs[None], runs[512]
    for ours, ref in zip(whole, split, strict=True):
        torch.testing.assert_close(ours, ref, atol=2e-5 * float(ref.abs().max()), rtol=0)
    assert (split_stats.prefill_calls, whole_stats.prefill_calls) == (2 * LAYERS, LAYERS)
    stride = weights.banks[0].layout.expert_stride
    assert whole_stats.prefill_bytes <= LAYERS * EXPERTS * stride < split_stats.prefill_bytes
    reference = build_model(weights.config, weights, CPUExpertExecutor(weights.banks, torch.float32), torch.float32)
    ref = reference.forward(ids, reference.new_state(513), last_only=True)[-1]
    torch.testing.assert_close(whole[0], ref, atol=2e-5 * float(ref.abs().max()), rtol=0)


def test_chunk_bounds_cover_the_prompt_at_multiples_of_the_chunk() -> None:
    assert chunk_bounds(512, 512) == [(0, 512)]
    assert chunk_bounds(513, 512) == [(0, 512), (512, 513)]
    assert chunk_bounds(1300, 512) == [(0, 512), (512, 1024), (1024, 1300)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_in_chunks_over_the_cache_is_the_whole_calls_bit_for_bit(dtype: torch.dtype) -> None:
    """On the CPU a later chunk's masked call over the cached keys (their heads shared, not
    repeated) gives exactly the whole causal call's rows, where chunks start at multiples of the
    CPU flash kernel's key blocks (512: PREFILL_CHUNK_TOKENS)."""
    gen = torch.Generator().manual_seed(3)
    tokens, heads, kv_heads, dim = 1300, 8, 2, 32
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    whole = causal_attention(q, k, v, 0, dim ** -0.5)
    bounds = chunk_bounds(tokens, PREFILL_CHUNK_TOKENS)
    parts = [causal_attention(q[s:e], k[:e], v[:e], s, dim ** -0.5) for s, e in bounds]
    assert len(parts) == 3 and torch.equal(torch.cat(parts), whole)


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.checkpoints import save_checkpoint
    from tests.parity import convert_and_load

    root = tmp_path_factory.mktemp("prefill_chunks")
    return {family: convert_and_load(save_checkpoint(family, root / family / "hf", seed=4), root / family / "store")
            for family in CHUNKED_FAMILIES}


# GQA attention (with q/k norms, without, gated), Gated DeltaNet, MLA and GLM-5's DSA (whose
# mixers take the whole prompt at once: they do not set chunks_prompt), shared experts, Granite's
# residual multiplier (added in place chunk by chunk), JetMoE's mixture of attention heads;
# Cohere's parallel block (its FFN reads the mixer's input), the recurrent mixers that continue
# their state chunk by chunk (MiniMax's lightning attention, LFM2's short convolution, Kimi Delta
# Attention, Granite 4.0's Mamba2, Jamba's Mamba), sliding windows with sinks (MiMo-V2-Flash; Granite SWA's, sinks on its
# full and NoPE layers too) and without (Mellum's), and Gemma 4's FFN reading the residual itself, the stream
# then scaled in place chunk by chunk (layer_scalar), and LongCat-Flash's shortcut MoE (a second stream kept
# chunk by chunk from one half-layer to the next), Flint's sinks on sliding rope layers and full NoPE ones,
# and Kolibri 1's sandwich-normed sliding and NoPE layers; A.X-K2's gated-query DSA (whole prompts, as GLM-5's)
# between gated norms; Beam's depth-scaled residual (the stream scaled and added to in place chunk by chunk), and
# Ergo's residual gates ([H] scales) around experts each route of which is normed; Doge's dynamic mask (a bias a
# cached key, each query's keys of largest bias kept) and product-key routing; Hy4's DSA with sinks (whole prompts)
# between hyper-connections (its streams joined in place chunk by chunk); Lara Mini's Gated DeltaNet (its fused
# in_proj) beside sliding rope and full NoPE layers; Qwen4-Exp's QSA indexers (blocks scored over the chunks' cached
# indexer keys) between gated hyper-connections
CHUNKED_FAMILIES = ("qwen3_moe", "mixtral", "qwen2_moe", "qwen3_5_moe", "qwen4_exp", "deepseek_v3", "glm_moe_dsa", "granitemoeshared",
                    "jetmoe", "cohere2_moe", "minimax", "lfm2_moe", "kimi_linear", "mimo_v2_flash", "granitemoe_swa",
                    "granitemoehybrid", "jamba", "mellum", "gemma4_text", "longcat_flash", "flint", "kolibri1", "axk2",
                    "beam", "ergo", "doge", "hy_v4", "zaya", "lara_mini")


@pytest.mark.parametrize("family", CHUNKED_FAMILIES)
def test_every_familys_prompt_in_chunks_gives_the_whole_prompts_logits(families, family: str) -> None:
    """A 45-token prompt in chunks of 16 (a model's chunk is any size) against all at once, then
    two more tokens on the state each left: every family's logits, to float tolerance."""
    model = families[family].model
    ids = torch.randint(0, model.config.vocab_size, (45,), generator=torch.Generator().manual_seed(5))
    runs = []
    for chunk in (16, None):
        model.prefill_chunk_tokens = chunk
        try:
            state = model.new_state(48)
            logits = [model.forward(ids, state)]
            for token in (7, 11):
                logits.append(model.forward(torch.tensor([token]), state))
        finally:
            model.prefill_chunk_tokens = None
        runs.append(logits)
    for ours, ref in zip(*runs, strict=True):
        torch.testing.assert_close(ours, ref, atol=1e-5 * float(ref.abs().max()), rtol=0)
