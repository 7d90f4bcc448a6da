"""What a model needs, before it is placed: dense and expert bytes, the expert record size, and
the KV cache per token for its family. Built exactly from an FTW index, or estimated from a
checkpoint's config.json and safetensors headers before anything is downloaded (the same record
layout the FTW writer uses), or from a GGUF file's size alone. The planner (plan.py) places it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ftw.families import (
    FAMILIES,
    ExpertTensorName,
    family_for_config,
    hy_v4_indexer_types,
    kimi_linear_layer_types,
    kimi_linear_sizes,
    lara_mini_layer_types,
    nemotron_h_layer_types,
    nemotron_h_view,
    normalized_config,
    parse_expert_name,
)
from ftw.format import BLOCK_DTYPES, PART_ALIGNMENT, SWIGLU, ExpertActivation, Index, align_up

CAST_BYTES = {"auto": None, "bf16": 2, "f16": 2, "f32": 4, "fp8": None}  # Modelfile DTYPE -> bytes
FLOAT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
ELEMENT_BYTES = {**FLOAT_BYTES, "f8_e4m3": 1, "f8_e5m2": 1}  # of the dtypes a safetensors checkpoint holds
EMBEDDINGS = ("embed_tokens.weight", "transformer.wte.weight")  # name endings (DBRX's the second)
HEAD = "lm_head.weight"
EXPERT_PARTS = {("gate_proj", "weight"): "w13", ("up_proj", "weight"): "w13", ("gate_up_proj", "weight"): "w13",
                ("down_proj", "weight"): "w2", ("gate_proj", "weight_scale_inv"): "w1_scale",
                ("up_proj", "weight_scale_inv"): "w3_scale", ("down_proj", "weight_scale_inv"): "w2_scale",
                ("gate_up_proj", "bias"): "w13_bias", ("down_proj", "bias"): "w2_bias",  # (gpt-oss's)
                # gpt-oss's MXFP4 weights, dequantized at conversion (two values a byte); their scales go in
                ("gate_up_proj", "blocks"): "w13", ("down_proj", "blocks"): "w2"}
MXFP4_VALUES_PER_BYTE = 2


def converted_bytes(expert: ExpertTensorName | None, name: str, dtype: str, nbytes: int,
                    target_dtype: str) -> tuple[str, int]:
    """The FTW dtype and bytes a source tensor (`expert`: its parse_expert_name) becomes once
    converted to the Modelfile DTYPE `target_dtype`: floats cast (FP8 block scales kept),
    gpt-oss's MXFP4 `_blocks` kept as mxfp4 records (auto) or dequantized to the cast, their
    `_scales` gone into them."""
    cast = CAST_BYTES.get(target_dtype)
    if expert is not None and expert.what == "scales":
        return dtype, 0
    if expert is not None and expert.what == "blocks":  # (kept: 16 bytes of nibbles and the scale's byte a block)
        if target_dtype == "auto":
            return "mxfp4", nbytes + nbytes // 16
        return target_dtype if cast else "bf16", nbytes * MXFP4_VALUES_PER_BYTE * (cast or FLOAT_BYTES["bf16"])
    # DeepSeek-V4's FP4 experts (int8 nibble pairs, e8m0 scales): kept as mxfp4, the same bytes, or cast
    if cast and expert is not None and dtype == "i8" and expert.what == "weight":
        return target_dtype, nbytes * MXFP4_VALUES_PER_BYTE * cast
    if cast and expert is not None and dtype == "f8_e8m0":
        return dtype, 0
    if cast and dtype in FLOAT_BYTES and not name.endswith("_scale_inv"):
        return target_dtype, nbytes // FLOAT_BYTES[dtype] * cast
    return dtype, nbytes


def compute_bytes(dtype: str) -> int:
    """Bytes of an element in the dtype a model computes in: float32 models in float32, the
    rest in 16 bits (the runtime's default)."""
    return 4 if dtype == "f32" else 2


# Dense weights the loader keeps as their GGML blocks (runtime/layers/block_weight.py): the linear
# projections (only `linear` reads them; routers, embeddings and norms are read otherwise) of the
# quants both in-place readers take (the CPU kernel's dense_blocks, the GPU's block_gemv). The
# GPU reads Q8_0 rows 256 values at a time, so those are kept only where their columns are whole
# 256s, and counted widened where the columns are not known (a checkpoint's header: the count
# errs high, never low). A Q8_0 file's projections widened to bf16 took 1.9x their bytes of RAM
# or VRAM, and a CPU decode token read 1.7x what llama.cpp's did (0.67x its tok/s).
BLOCK_WEIGHT_DTYPES = ("q4_k", "q5_k", "q6_k", "q8_0")
WHOLE_SUPER_BLOCKS = {"q8_0": 256}  # columns a kept weight's rows must be a multiple of
BLOCK_WEIGHT_SUFFIXES = tuple(f"{name}.weight" for name in (
    "q_proj", "k_proj", "v_proj", "o_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "lm_head",
    "gate_proj", "up_proj", "down_proj",
    # Qwen3.5's and Qwen3-Next's Gated DeltaNet (layers/gated_deltanet.py, models/qwen3_next.py read them
    # only through `linear`)
    *(f"linear_attn.{p}" for p in ("in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b", "in_proj_qkvz", "in_proj_ba",
                                   "out_proj"))))


def keeps_blocks(name: str, dtype: str, cols: int | None = None) -> bool:
    """Whether the loader keeps dense tensor `name` (stored as `dtype`, rows of `cols` values where
    known) as its blocks."""
    whole = WHOLE_SUPER_BLOCKS.get(dtype)
    if whole is not None and (cols is None or cols % whole != 0):
        return False
    return dtype in BLOCK_WEIGHT_DTYPES and name.endswith(BLOCK_WEIGHT_SUFFIXES)


def held_dense_bytes(dtype: str, nbytes: int, numel: int, *, scaled: bool, compute: int, name: str = "",
                     cols: int | None = None) -> int:
    """Bytes one dense tensor `name` takes once loaded (runtime/loading/read_ftw.py): the block
    quants `keeps_blocks` as stored, other block quants and scaled FP8 dequantized to the compute
    dtype, 16-bit floats cast to it, float32 kept (the routers a family keeps in float32 are; the
    rest are cast: an upper bound), anything else as stored."""
    if keeps_blocks(name, dtype, cols) and not scaled:
        return nbytes
    if dtype in BLOCK_DTYPES or scaled or dtype in ("f16", "bf16"):
        return numel * compute
    return nbytes


def _held_dense_total(tensors: dict[str, tuple], compute: int) -> int:
    """`held_dense_bytes` over every dense tensor (name -> dtype, nbytes, numel[, cols: a 2-d
    tensor's row length, where known]): an FP8 weight's `_scale_inv` is folded into it, and not
    counted."""
    def scale_of(name: str) -> bool:
        return name.endswith("_scale_inv") and name[: -len("_scale_inv")] in tensors

    return sum(held_dense_bytes(dtype, nbytes, numel, compute=compute, name=name, cols=cols[0] if cols else None,
                                scaled=name.endswith(".weight") and name + "_scale_inv" in tensors)
               for name, (dtype, nbytes, numel, *cols) in tensors.items() if not scale_of(name))


def _held_embedding_bytes(tensors: dict[str, tuple], compute: int, *, tied: bool) -> int:
    """Held bytes of the token embedding table, which the GPU path keeps in host RAM (a lookup
    reads one row a token; llama.cpp keeps `token_embd` on the host too); 0 where the table is
    also the output head (tied, or no lm_head.weight: runtime/models/base.py), which decode
    multiplies by every token, so it stays on the GPU."""
    if tied or HEAD not in tensors:
        return 0
    return sum(held_dense_bytes(dtype, nbytes, numel, compute=compute, scaled=name + "_scale_inv" in tensors)
               for name, (dtype, nbytes, numel, *_) in tensors.items() if name.endswith(EMBEDDINGS))


def size(n: float) -> str:
    """Bytes for people: '59.0 GiB', '9.0 MiB', '512 B'."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


# -- KV cache per family ----------------------------------------------------------------------------

@dataclass(frozen=True)
class KVLayout:
    """KV bytes of one sequence: `bytes_per_token` per context token plus a fixed `state_bytes`."""

    kind: str  # "gqa" | "mla" | "hybrid" | "compressed" | "unknown"
    bytes_per_token: int
    state_bytes: int = 0  # recurrent state of linear-attention layers, whatever the length
    formula: str = ""  # how bytes_per_token was computed, for `ft fit`

    def bytes_for(self, tokens: int) -> int:
        return tokens * self.bytes_per_token + self.state_bytes

    def max_tokens(self, budget_bytes: int) -> int | None:
        """Tokens whose KV fits in `budget_bytes`; None when the size per token is unknown."""
        if self.bytes_per_token == 0:
            return None
        return max(0, (budget_bytes - self.state_bytes) // self.bytes_per_token)


UNKNOWN_KV = KVLayout("unknown", 0, 0, "unknown until the model's config is read")


def _gqa(c: dict[str, Any], b: int) -> KVLayout:
    layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    return KVLayout("gqa", 2 * layers * kv_heads * head_dim * b,
                    formula=f"GQA: 2 x {layers} layers x {kv_heads} KV heads x {head_dim} x {b} B")


def _zaya(c: dict[str, Any], b: int) -> KVLayout:
    """GQA's keys and values and, beside them, each token's q/k projections (its convolutions'
    inputs) and delayed values (ZAYA's CCA: runtime/layers/cca_attention.CCACache)."""
    gqa = _gqa(c, b)
    layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    rows = (heads + kv_heads) * head_dim + kv_heads * head_dim // 2
    return KVLayout("gqa", gqa.bytes_per_token + layers * rows * b,
                    formula=f"{gqa.formula} + {layers} layers x ({heads} + {kv_heads}) x {head_dim} q/k inputs "
                            f"+ {kv_heads} x {head_dim} / 2 delayed values x {b} B")


def _doge(c: dict[str, Any], b: int) -> KVLayout:
    """GQA's keys and values and one bias a key head beside each key (Doge's dynamic mask)."""
    gqa = _gqa(c, b)
    layers, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    return KVLayout("gqa", gqa.bytes_per_token + layers * kv_heads * b,
                    formula=f"{gqa.formula} + {layers} layers x {kv_heads} key biases x {b} B")


def _mla(c: dict[str, Any], b: int) -> KVLayout:
    """DeepSeek MLA caches one compressed latent + the RoPE key per layer; DSA (GLM-5) adds the
    indexer's keys on the layers that run their own indexer ("full"; "shared" ones reuse them)."""
    layers, rank, rope = int(c["num_hidden_layers"]), int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
    per_token, formula = layers * (rank + rope) * b, f"MLA: {layers} layers x ({rank} + {rope}) x {b} B"
    if c.get("index_head_dim"):
        kinds = c.get("indexer_types") or c.get("index_topk_pattern")
        if kinds:
            indexed = sum(k in ("full", "F") for k in kinds)
        else:  # transformers' GlmMoeDsaConfig schedule
            freq, offset = max(int(c.get("index_topk_freq") or 1), 1), int(c.get("index_skip_topk_offset", 2))
            indexed = sum(max(i - offset + 1, 0) % freq == 0 for i in range(layers))
        per_token += indexed * int(c["index_head_dim"]) * b
        formula += f" + indexer {indexed} layers x {c['index_head_dim']} x {b} B"
    return KVLayout("mla", per_token, formula=formula)


def _longcat_flash(c: dict[str, Any], b: int) -> KVLayout:
    """LongCat-Flash: MLA's latent + rope key on both attention sublayers of each of `num_layers` layers."""
    return _mla({**c, "num_hidden_layers": 2 * int(c.get("num_layers", 28))}, b)


def _hybrid(c: dict[str, Any], b: int) -> KVLayout:
    """Qwen3.5/3.6: only full-attention layers keep a KV cache; each Gated DeltaNet layer keeps a
    fixed recurrent state (f32, as the chunked kernels keep it) and a short-convolution window."""
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types") or [
        "full_attention" if (i + 1) % int(c.get("full_attention_interval") or 4) == 0 else "linear_attention"
        for i in range(layers)]
    full = sum(t == "full_attention" for t in types)
    linear = len(types) - full
    kv = _gqa({**c, "num_hidden_layers": full}, b)
    k_dim, v_dim = int(c["linear_key_head_dim"]), int(c["linear_value_head_dim"])
    k_heads, v_heads = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    recurrent = v_heads * k_dim * v_dim * 4
    conv = (int(c.get("linear_conv_kernel_dim") or 4) - 1) * (2 * k_heads * k_dim + v_heads * v_dim) * b
    return KVLayout("hybrid", kv.bytes_per_token, linear * (recurrent + conv),
                    f"{kv.formula.replace('GQA', f'{full} full-attention')}; + {linear} linear layers x "
                    f"{size(recurrent + conv)} state")


def _lara_mini(c: dict[str, Any], b: int) -> KVLayout:
    """Qwen3.5's hybrid (`_hybrid`) with its attention layers sliding or full: both keep every
    token's keys and values (the runtime's KV cache keeps the window's past too)."""
    types = lara_mini_layer_types(c)
    kv = _hybrid({**c, "layer_types": ["linear_attention" if t == "linear_attention" else "full_attention"
                                       for t in types]}, b)
    return KVLayout(kv.kind, kv.bytes_per_token, kv.state_bytes, kv.formula.replace("full-attention", "attention"))


def _qwen4_exp(c: dict[str, Any], b: int) -> KVLayout:
    """Qwen3.5's hybrid (`_hybrid`) whose attention layers ("indexed_attention", the release's
    "full_attention") also keep each token's raw QSA indexer key (indexer_head_dim wide)."""
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types") or [
        "linear_attention" if (i + 1) % int(c.get("full_attention_interval") or 4) else "full_attention"
        for i in range(layers)]
    types = ["linear_attention" if t == "linear_attention" else "full_attention" for t in types]
    kv = _hybrid({**c, "layer_types": types}, b)
    indexed, index_dim = sum(t == "full_attention" for t in types), int(c.get("indexer_head_dim") or 0)
    return KVLayout(kv.kind, kv.bytes_per_token + indexed * index_dim * b, kv.state_bytes,
                    f"{kv.formula}; + {indexed} layers x {index_dim} indexer key x {b} B")


def _short_conv(c: dict[str, Any], b: int) -> KVLayout:
    """LFM2-MoE: only its full-attention layers keep a KV cache; each "conv" layer keeps the last
    conv_L_cache - 1 inputs of its short convolution (hidden_size wide)."""
    types = c.get("layer_types") or []
    full, conv = sum(t == "full_attention" for t in types), sum(t == "conv" for t in types)
    kv = _gqa({**c, "num_hidden_layers": full}, b)
    state = (int(c.get("conv_L_cache") or 3) - 1) * int(c["hidden_size"]) * b
    return KVLayout("hybrid", kv.bytes_per_token, conv * state,
                    f"{kv.formula.replace('GQA', f'{full} full-attention')}; + {conv} conv layers x {size(state)} state")


def _mamba2_hybrid(c: dict[str, Any], b: int) -> KVLayout:
    """Granite 4.0 hybrid: only its attention layers keep a KV cache; each Mamba2 layer keeps its
    conv window (mamba_d_conv - 1 inputs, conv_dim wide) and an SSM state [heads, head_dim, d_state]
    in f32 (runtime/layers/mamba2.py; GraniteMoeHybridConfig's defaults where a key is left out)."""
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types") or c.get("layers_block_type") or ["mamba"] * layers
    full = sum(t in ("attention", "full_attention") for t in types)
    kv = _gqa({**c, "num_hidden_layers": full}, b)
    heads, groups, d_state = (int(c.get(k) or d) for k, d in (("mamba_n_heads", 128), ("mamba_n_groups", 1),
                                                               ("mamba_d_state", 256)))
    head_dim = c.get("mamba_d_head")  # (Mamba2Sizes: heads x head_dim, else expand x hidden)
    inner = heads * int(head_dim) if head_dim not in (None, "auto") else int(c.get("mamba_expand") or 2) * int(c["hidden_size"])
    state = (int(c.get("mamba_d_conv") or 4) - 1) * (inner + 2 * groups * d_state) * b + inner * d_state * 4
    return KVLayout("hybrid", kv.bytes_per_token, (len(types) - full) * state,
                    f"{kv.formula.replace('GQA', f'{full} attention')}; + {len(types) - full} Mamba2 layers x "
                    f"{size(state)} state")


def _nemotron_h(c: dict[str, Any], b: int) -> KVLayout:
    """Nemotron-H: its attention layers' KV and its Mamba2 layers' state, as Granite 4.0 hybrid's
    (`_mamba2_hybrid`) from its config under Granite's names (ftw.families.nemotron_h_view); its MoE
    and MLP layers keep nothing."""
    types = nemotron_h_layer_types(c)
    kinds = ["attention" if t == "full_attention" else "mamba" for t in types if t in ("full_attention", "linear_attention")]
    view = nemotron_h_view(c)
    return _mamba2_hybrid({**c, **view, "num_hidden_layers": len(kinds), "layer_types": kinds,
                           "mamba_expand": None}, b)


def _mamba_hybrid(c: dict[str, Any], b: int) -> KVLayout:
    """Jamba: only its attention layers (one every attn_layer_period from attn_layer_offset) keep a
    KV cache; each Mamba layer keeps its conv window (mamba_d_conv - 1 inputs, I = mamba_expand x
    hidden wide) and an SSM state [I, d_state] in f32 (runtime/layers/mamba.py; JambaConfig's defaults)."""
    layers = int(c["num_hidden_layers"])
    period, offset = (int(d if c.get(k) is None else c[k]) for k, d in (("attn_layer_period", 8), ("attn_layer_offset", 4)))
    full = sum(i % period == offset for i in range(layers))
    kv = _gqa({**c, "num_hidden_layers": full}, b)
    inner, d_state = int(c.get("mamba_expand") or 2) * int(c["hidden_size"]), int(c.get("mamba_d_state") or 16)
    state = (int(c.get("mamba_d_conv") or 4) - 1) * inner * b + inner * d_state * 4
    return KVLayout("hybrid", kv.bytes_per_token, (layers - full) * state,
                    f"{kv.formula.replace('GQA', f'{full} attention')}; + {layers - full} Mamba layers x {size(state)} state")


def _per_layer_gqa(family: str) -> Callable[[dict[str, Any], int], KVLayout]:
    """GQA sized layer by layer by the family's `attention_sizes` (MiMo-V2-Flash: keys and values of
    their own widths, twice the key-value heads on its sliding layers, which keep every token as
    the runtime's KV cache does)."""
    return lambda c, b: _gqa_of_sizes(FAMILIES[family].attention_sizes(c), b)  # type: ignore[misc]


def _gqa_of_sizes(sizes: list[tuple[int, int, int, int]], b: int) -> KVLayout:
    per_token = sum(kv * (k_dim + v_dim) for _, kv, k_dim, v_dim in sizes) * b
    kinds = sorted({(kv, k_dim, v_dim) for _, kv, k_dim, v_dim in sizes})
    layers = " + ".join(f"{sum((s[1], s[2], s[3]) == kind for s in sizes)} layers x {kind[0]} KV heads x "
                        f"({kind[1]} + {kind[2]})" for kind in kinds)
    return KVLayout("gqa", per_token, formula=f"GQA: {layers} x {b} B")


def _lightning(c: dict[str, Any], b: int) -> KVLayout:
    """MiniMax-Text-01: only its full-attention layers keep a KV cache; each lightning-attention
    layer keeps a decayed key-value sum [head_dim, head_dim] a head."""
    layers = int(c["num_hidden_layers"])
    types = c.get("layer_types") or ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(layers)]
    full, linear = sum(t == "full_attention" for t in types), sum(t == "linear_attention" for t in types)
    kv = _gqa({**c, "num_hidden_layers": full}, b)
    heads = int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    state = heads * head_dim * head_dim * b
    return KVLayout("hybrid", kv.bytes_per_token, linear * state,
                    f"{kv.formula.replace('GQA', f'{full} full-attention')}; + {linear} linear layers x {size(state)} state")


def _kda_hybrid(c: dict[str, Any], b: int, types: list[str], heads: int, head_dim: int, kernel: int) -> KVLayout:
    """Kimi Delta Attention beside MLA (Kimi Linear, Ling's hybrid): the MLA layers cache the latent
    and the shared key; each KDA layer keeps a recurrent state [head_dim, head_dim] a head (f32, as
    the chunked form keeps it) and its q/k/v convolution window."""
    full, linear = sum(t == "full_attention" for t in types), sum(t == "linear_attention" for t in types)
    mla = _mla({**c, "num_hidden_layers": full}, b)
    state = heads * head_dim * head_dim * 4 + (kernel - 1) * 3 * heads * head_dim * b
    return KVLayout("hybrid", mla.bytes_per_token, linear * state,
                    f"{mla.formula.replace('MLA', f'{full} MLA')}; + {linear} KDA layers x {size(state)} state")


def _kimi_linear(c: dict[str, Any], b: int) -> KVLayout:
    heads, head_dim = kimi_linear_sizes(c)
    kernel = int((c.get("linear_attn_config") or {}).get("short_conv_kernel_size", c.get("linear_conv_kernel_dim") or 4))
    return _kda_hybrid(c, b, kimi_linear_layer_types(c), heads, head_dim, kernel)


def _bailing_hybrid(c: dict[str, Any], b: int) -> KVLayout:
    every = int(c.get("layer_group_size") or 6)
    types = c.get("layer_types") or ["full_attention" if (i + 1) % every == 0 else "linear_attention"
                                     for i in range(int(c["num_hidden_layers"]))]
    heads, _, head_dim, _ = FAMILIES["bailing_hybrid"].attention_sizes(c)[0]  # type: ignore[misc]
    kernel = int(c.get("linear_conv_kernel_dim") or c.get("short_conv_kernel_size") or 4)
    return _kda_hybrid(c, b, types, heads, head_dim, kernel)


def _compressed(c: dict[str, Any], b: int) -> KVLayout:
    """DeepSeek-V4 (layers/compressed_attention.py): per token, the compressed entries of its CSA
    layers (head_dim + the indexer's index_head_dim, one a `rate` tokens) and HCA layers
    (head_dim, one a `rate`); fixed, every layer's window of the last sliding_window - 1 keys and the
    compressors' open windows (kv and gate, twice as wide where they overlap). The schedule as
    runtime/models/deepseek_v4.py reads it (layer_types, the release's compress_ratios, or the default)."""
    layers, d = int(c["num_hidden_layers"]), int(c.get("head_dim") or 512)
    index_d, window = int(c.get("index_head_dim") or 128), int(c.get("sliding_window") or 128)
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, **(c.get("compress_rates") or {})}
    rates["compressed_sparse_attention"] = int(c.get("compress_rate_csa") or rates["compressed_sparse_attention"])
    rates["heavily_compressed_attention"] = int(c.get("compress_rate_hca") or rates["heavily_compressed_attention"])
    by_ratio = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}
    types = c.get("layer_types") or [by_ratio.get(r, "sliding_attention") for r in c.get("compress_ratios") or []] or [
        "heavily_compressed_attention" if i < 2 or i % 2 == 0 else "compressed_sparse_attention" for i in range(layers)]
    csa = sum(t == "compressed_sparse_attention" for t in types[:layers])
    hca = sum(t == "heavily_compressed_attention" for t in types[:layers])
    r_csa, r_hca = rates["compressed_sparse_attention"], rates["heavily_compressed_attention"]
    per_token = math.ceil(csa * (d + index_d) * b / r_csa + hca * d * b / r_hca)
    state = layers * (window - 1) * d * b + csa * (r_csa - 1) * 4 * (d + index_d) * b + hca * (r_hca - 1) * 2 * d * b
    return KVLayout("compressed", per_token, state,
                    f"compressed: {csa} CSA layers x ({d} + {index_d}) / {r_csa} + {hca} HCA layers x {d} / {r_hca}, "
                    f"x {b} B; + {layers} windows of {window - 1} keys and the open compressor windows")


KV_LAYOUTS = {"qwen3_moe": _gqa, "qwen2_moe": _gqa, "olmoe": _gqa, "minimax_m2": _gqa, "mixtral": _gqa, "ernie4_5_moe": _gqa, "hunyuan_v1_moe": _gqa, "exaone_moe": _gqa, "granitemoe": _gqa, "granitemoeshared": _gqa, "granitemoe_swa": _gqa, "granitemoehybrid": _mamba2_hybrid, "nemotron_h": _nemotron_h, "jamba": _mamba_hybrid, "qwen3_5_moe": _hybrid, "qwen3_next": _hybrid, "qwen4_exp": _qwen4_exp, "deepseek_v3": _mla,
              "deepseek_v2": _mla, "axk1": _mla, "mistral4": _mla, "longcat_flash": _longcat_flash, "glm_moe_dsa": _mla, "deepseek_v4": _compressed,
              "deepseek_v32": lambda c, b: _mla({**c, "indexer_types": ["full"] * int(c["num_hidden_layers"])}, b),
              "axk2": lambda c, b: _mla({**c, "indexer_types": ["full"] * int(c["num_hidden_layers"])}, b),
              "glm4_moe_lite": _mla,
              "hy_v4": lambda c, b: _mla({**c, "indexer_types": hy_v4_indexer_types(c)}, b),  # (HYV4Config's schedule)
              "jetmoe": lambda c, b: _gqa({**c, "head_dim": c.get("kv_channels")}, b),  # (its head size)
              "llama4": _gqa,  # (its chunked layers keep every token, as the runtime's KV cache does)
              "dots1": _gqa, "solar_open": _gqa, "sarvam_moe": _gqa, "minicpm5_moe": _gqa, "hy_v3": _gqa, "mellum": _gqa, "flint": _gqa, "kolibri1": _gqa,
              "beam": _gqa, "ergo": _gqa, "doge": _doge, "zaya": _zaya, "lara_mini": _lara_mini,
              "cohere2_moe": _gqa, "afmoe": _gqa, "laguna": _gqa, "lfm2_moe": _short_conv, "minimax": _lightning,
              "kimi_linear": _kimi_linear, "bailing_hybrid": _bailing_hybrid,
              "gemma4_text": _per_layer_gqa("gemma4_text"),  # (wider full layers; sliding ones keep every token)
              "mimo_v2_flash": _per_layer_gqa("mimo_v2_flash"),  # (its sliding-window layers keep every token, as the runtime's KV cache does)
              "phimoe": _gqa, "dbrx": _gqa, "flex_olmo": _gqa,
              "gpt_oss": _gqa}  # (its sliding-window layers keep every token, as the runtime's KV cache does)


def kv_layout(family: str, text_config: dict[str, Any], dtype_bytes: int) -> KVLayout:
    """The KV layout of `family` from its (text) config.json; GQA for families not listed."""
    return KV_LAYOUTS.get(family, _gqa)(text_config, dtype_bytes)


def kv_dtype_bytes(weight_dtype: str) -> int:
    """KV is kept in the compute dtype: f32 for f32 models, 16-bit for everything else (fp8 and block
    quants compute in bf16)."""
    return 4 if weight_dtype == "f32" else 2


# -- what a model needs -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFootprint:
    """A model's sizes as the runtime will hold them. Zero geometry fields mean "not known yet"."""

    name: str
    source: str  # "ftw" (exact) | "checkpoint" (config + safetensors headers) | "sizes" (file size only)
    family: str
    dtype: str  # of the token embeddings: f32 models compute (and keep KV) in f32, the rest in 16 bits
    dense_bytes: int  # every tensor that is not a routed expert
    expert_pool_bytes: int  # all routed experts, FTW records included padding
    expert_stride_bytes: int  # one expert record = one cache slot (the largest bank's stride)
    num_moe_layers: int
    num_experts: int  # routed experts per MoE layer
    num_experts_per_tok: int
    kv: KVLayout = UNKNOWN_KV
    context_length: int = 0  # the model's (or recipe's) maximum
    activation_bytes_per_token: int = 0
    embedding_bytes: int = 0  # of dense_bytes, the token embedding table the GPU path keeps in host RAM
    ffn_bytes_per_token: int = 0  # a MoE layer's FFN alone, where its experts compute in grouped launches (else 0)

    @property
    def layout_known(self) -> bool:
        return self.expert_stride_bytes > 0 and self.num_moe_layers > 0 and self.num_experts_per_tok > 0

    @property
    def num_expert_records(self) -> int:
        return self.num_moe_layers * self.num_experts

    @property
    def bank_bytes(self) -> int:
        """One MoE layer's experts (the largest bank's size bound): what a prefill buffer holds."""
        return self.num_experts * self.expert_stride_bytes

    @property
    def min_cache_slots(self) -> int:
        """One token's experts: below this a global LRU evicts what the next layer needs."""
        return self.num_moe_layers * self.num_experts_per_tok

    @staticmethod
    def from_index(index: Index, *, name: str = "", context_length: int | None = None) -> ModelFootprint:
        """Exact sizes from a converted model's FTW index."""
        c = index.config
        family = FAMILIES.get(index.family)
        text = family.text_config(index.source_config) if family else index.source_config
        embed = [t.dtype for t in index.tensors if t.name.endswith(EMBEDDINGS)]
        dtype = embed[0] if embed else str(c.get("dtype") or "bf16")
        held = {t.name: (t.dtype, t.nbytes, math.prod(t.shape), *(t.shape[1:] if len(t.shape) == 2 else ()))
                for t in index.tensors}  # (a matrix's row length: whether its Q8_0 rows stay blocks)
        dense = _held_dense_total(held, compute_bytes(dtype))
        return ModelFootprint(
            name=name or index.family, source="ftw", family=index.family, dtype=dtype,
            dense_bytes=dense,
            expert_pool_bytes=sum(b.nbytes for b in index.banks),
            expert_stride_bytes=max((b.expert_stride for b in index.banks), default=0),
            num_moe_layers=len(index.banks), num_experts=max((b.num_experts for b in index.banks), default=0),
            num_experts_per_tok=int(c.get("num_experts_per_tok") or 0),
            kv=kv_layout(index.family, text, kv_dtype_bytes(dtype)),
            context_length=context_length or int(c.get("context_length") or 0),
            activation_bytes_per_token=_activation_bytes_per_token(c),
            embedding_bytes=_held_embedding_bytes(held, compute_bytes(dtype), tied=bool(c.get("tie_word_embeddings"))),
            ffn_bytes_per_token=_ffn_bytes_per_token(c, dtype, grouped_records(
                {p.dtype for b in index.banks for p in b.parts if p.name in EXPERT_WEIGHT_PARTS},
                {b.activation for b in index.banks}, any(p.name.endswith("_bias") for b in index.banks
                                                         for p in b.parts)), index.family))

    @staticmethod
    def from_checkpoint(config: dict[str, Any], tensors: dict[str, tuple[str, int]], *, target_dtype: str = "auto",
                        name: str = "", context_length: int | None = None) -> ModelFootprint:
        """Sizes after conversion, from config.json and (FTW dtype, nbytes) per safetensors tensor.

        Expert records are laid out as the FTW writer will (parts on 256 bytes, records on 4096),
        so slot sizes match the converted model's."""
        family = family_for_config(config)
        c = normalized_config(family, config)
        dense: dict[str, tuple[str, int]] = {}
        by_dtype, embed, expert_dtypes, biased = Counter(), None, set(), False
        parts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # layer -> part -> bytes of one expert
        for source_name, (dtype, nbytes) in tensors.items():
            tensor_name = family.tensor_name(source_name)  # (DeepSeek-V4's release names its own way)
            if not family.keeps(tensor_name, c["num_layers"]):
                continue
            expert = parse_expert_name(tensor_name)
            if expert is not None and expert.what == "scales":
                continue  # (MXFP4's: gone into the dequantized weights)
            dtype, nbytes = converted_bytes(expert, tensor_name, dtype, nbytes, target_dtype)
            by_dtype[dtype] += nbytes
            if expert is not None and expert.what in ("weight", "blocks"):
                expert_dtypes.add(dtype)
            biased |= expert is not None and expert.what == "bias"
            embed = dtype if tensor_name.endswith(EMBEDDINGS) else embed
            if expert is None:
                dense[tensor_name] = (dtype, nbytes)
            elif expert.expert is None:  # fused: [E, ...] holds every expert of the layer
                # (+=: DBRX's gate and up come apart, each half of w13)
                parts[expert.layer][EXPERT_PARTS[expert.proj, expert.what]] += nbytes // c["num_experts"]
            elif expert.expert == 0:
                parts[expert.layer][EXPERT_PARTS[expert.proj, expert.what]] += nbytes
        strides = [align_up(sum(align_up(n, PART_ALIGNMENT) for n in p.values())) for p in parts.values()]
        dtype = embed or (max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else "bf16")
        sized = {t: (d, n, n // ELEMENT_BYTES.get(d, 1)) for t, (d, n) in dense.items()}
        held = _held_dense_total(sized, compute_bytes(dtype))
        return ModelFootprint(
            name=name or family.name, source="checkpoint", family=family.name, dtype=dtype, dense_bytes=held,
            expert_pool_bytes=sum(strides) * c["num_experts"], expert_stride_bytes=max(strides, default=0),
            num_moe_layers=len(strides), num_experts=c["num_experts"], num_experts_per_tok=c["num_experts_per_tok"],
            kv=kv_layout(family.name, family.text_config(config), kv_dtype_bytes(dtype)),
            context_length=context_length or c["context_length"], activation_bytes_per_token=_activation_bytes_per_token(c),
            embedding_bytes=_held_embedding_bytes(sized, compute_bytes(dtype), tied=bool(c.get("tie_word_embeddings"))),
            ffn_bytes_per_token=_ffn_bytes_per_token(c, dtype, grouped_records(
                expert_dtypes, {family.expert_activation(family.text_config(config))}, biased), family.name))

    @staticmethod
    def from_sizes(*, expert_bytes: int, dense_bytes: int = 0, name: str = "model", context_length: int = 0,
                   family: str = "?", dtype: str = "?") -> ModelFootprint:
        """Only sizes known (a GGUF file before its header is read: pass its size as `expert_bytes`,
        so every byte counts as host-resident). No cache slots or KV can be planned from this."""
        return ModelFootprint(name=name, source="sizes", family=family, dtype=dtype, dense_bytes=dense_bytes,
                              expert_pool_bytes=expert_bytes, expert_stride_bytes=0, num_moe_layers=0, num_experts=0,
                              num_experts_per_tok=0, context_length=context_length)


def _activation_bytes_per_token(c: dict[str, Any]) -> int:
    """What one token of a prompt chunk holds at its layer's peak on the GPU path, counted at 4
    bytes an element (float32; a 16-bit model holds about half, its sums in float32 aside). The
    runtime computes a longer prompt a layer at a time in chunks of the plan's
    PREFILL_CHUNK_TOKENS (runtime/models/base.py), so the workspace is that many tokens' worth; a
    layer's phases run one after the other, so its peak is the larger of:
    - attention: the normed input and o_proj's output (2 x hidden); q (raw or normed, rotated, the
      output and its reshaped copy, rotary's temporaries: 5 x heads x head_dim); k and v with a
      normed and rotated k (3 x kv_heads x head_dim). Where a kernel needs the keys repeated per
      query head (the CPU's causal case, CUDA without FlashAttention) those are 2 of the 5;
    - the MoE FFN: the normed input, the float32 sum of the experts and its cast (3 x hidden);
      router logits and their float32 softmax (2 x experts); the routing, its pair plan and
      weights (16 x top-k); the routed experts' padded rows, max(top-k / 4, 1) a token
      (runtime/gpu/records.py, GROUP_PAIRS_PER_ROW), each an input, gate|up, activation and its
      SiLU, and output row (2 x hidden + 4 x moe_intermediate); shared experts beside them (their
      gate, up, product and output: 4 x their intermediate + hidden);
    and in both the pass's rotary tables (2 x head_dim).
    Not counted: the residual stream, hidden x compute bytes a prompt token for the whole
    prompt (4 KiB a token for Qwen3-30B-A3B, 4% of its KV); dense (non-MoE) layers' MLPs, whose
    intermediate size the normalized config does not carry; MLA's re-expanded keys and values,
    which its mixer makes for the whole prefix at once."""
    hidden, heads = int(c.get("hidden_size") or 0), int(c.get("num_attention_heads") or 0)
    head_dim = int(c.get("head_dim") or 0)
    q, kv = heads * head_dim, int(c.get("num_key_value_heads") or heads) * head_dim
    experts, top_k = int(c.get("num_experts") or 0), int(c.get("num_experts_per_tok") or 0)
    inter = int(c.get("moe_intermediate_size") or 0)
    shared = int(c.get("num_shared_experts") or 0) * inter
    rows = max(top_k / 4, 1.0) if top_k else 0.0
    attention = 2 * hidden + 5 * q + 3 * kv
    moe = 3 * hidden + 2 * experts + 16 * top_k + rows * (2 * hidden + 4 * inter) + (4 * shared + hidden if shared else 0)
    return 4 * int(max(attention, moe) + 2 * head_dim)


# Expert weight types whose prompt experts the GPU computes in two grouped launches, one
# activation row a routed pair (runtime/gpu/records.grouped_kind; tests/test_plan.py holds the
# two together): 16-bit records in the compute dtype, GGUF K-quants and Q8_0, block-scaled FP8,
# with plain SwiGLU experts and no biases; MXFP4 with its gated activations and biases. Others
# (float32 records, GeGLU, relu2, biases beside the others) go through padded runs of experts.
GROUPED_EXPERT_DTYPES = frozenset({"bf16", "f16", "q4_k", "q5_k", "q6_k", "q8_0", "f8_e4m3", "f8_e5m2", "mxfp4"})
MXFP4_GROUPED_ACTIVATIONS = frozenset({"swiglu", "swiglu_limited", "swiglu_clamped"})
EXPERT_WEIGHT_PARTS = ("w13", "w1", "w3", "w2")


def grouped_records(dtypes: set[str], activations: set[ExpertActivation], biased: bool) -> bool:
    """Whether experts of these weight types, activations and biases compute a prompt in grouped
    launches on the GPU (records.grouped_kind's rule, seen from the sizes the planner has)."""
    if not dtypes or not dtypes <= GROUPED_EXPERT_DTYPES:
        return False
    if dtypes == {"mxfp4"}:
        return {a.kind for a in activations} <= MXFP4_GROUPED_ACTIVATIONS
    return not biased and activations <= {SWIGLU}


# Families whose residual is several streams (hyper-connections: DeepSeek-V4's hc_mult, Hy4's,
# Qwen4-Exp's hc_count): an FFN call reads and writes [T, streams, H], which neither estimate
# counts, so their FFN keeps the chunk
MULTI_STREAM_FAMILIES = ("deepseek_v4", "hy_v4", "qwen4_exp")


def _ffn_bytes_per_token(c: dict[str, Any], dtype: str, grouped: bool, family: str = "") -> int:
    """What one token of a prompt holds in a MoE layer's FFN on the GPU path where its experts
    compute in grouped launches (16-bit compute and `grouped`: grouped_records; else 0:
    `_activation_bytes_per_token`'s MoE term, with its padded rows, holds). Counted
    at 4 bytes an element as there: the normed input, the float32 sum of the experts and its cast
    (3 x hidden), router logits and their softmax (2 x experts), the routing, its pair plan and
    weights (16 x top-k), shared experts as there; and the grouped kernels' activation row of
    each routed pair, in the compute dtype (top-k x moe_intermediate x 2 bytes). 0 for the
    MULTI_STREAM_FAMILIES too."""
    if compute_bytes(dtype) != 2 or not grouped or family in MULTI_STREAM_FAMILIES:
        return 0
    hidden, experts = int(c.get("hidden_size") or 0), int(c.get("num_experts") or 0)
    top_k, inter = int(c.get("num_experts_per_tok") or 0), int(c.get("moe_intermediate_size") or 0)
    shared = int(c.get("num_shared_experts") or 0) * inter
    elements = 3 * hidden + 2 * experts + 16 * top_k + (4 * shared + hidden if shared else 0)
    return 4 * elements + 2 * top_k * inter
