"""`ft fit` without the network: a shipped recipe's stored footprint.

Each shipped recipe keeps the part of its checkpoint's config.json that sizes it in
Modelfiles/footprints.json (same keys as config.json, so ft's own config normalizer reads it).
From that the sizes the FTW converter would produce are computed, tensor by tensor as the
checkpoint's headers would give them: an estimate (a family's small extras, such as biases or
norms some layers lack, may differ), said as such by `ft fit`. Used only where the Hub cannot be
reached; a pulled model is planned from its FTW index, a reachable Hub's from its headers, and
then the stored keys are checked against the real config.json (a warning names any that differ).
"""

from __future__ import annotations

import json
import logging
import math
import re
from importlib import resources
from typing import Any

from ftw.families import FAMILIES, family_for_config, normalized_config
from ftw.format import PART_ALIGNMENT, align_up
from runtime.planner.footprint import (
    ModelFootprint,
    _activation_bytes_per_token,
    _ffn_bytes_per_token,
    grouped_records,
    kv_dtype_bytes,
    kv_layout,
)

from .modelfile import Recipe

log = logging.getLogger(__name__)

FOOTPRINTS_FILE = "footprints.json"
FP8_BLOCK = 128  # FP8 checkpoints' weight_scale_inv: one f32 per 128 x 128 block
# llama.cpp's figures; mxfp4: gpt-oss's files (MXFP4 experts, 4.25 bits, most of the weights)
GGUF_BITS_PER_WEIGHT = {"q4_k_m": 4.85, "q4_k_s": 4.58, "q5_k_m": 5.69, "q6_k": 6.56, "q8_0": 8.5, "mxfp4": 4.25}
SOURCE = "recipe"  # ModelFootprint.source of these


class NoStoredFootprintError(LookupError):
    """A recipe with no stored footprint (ft fit needs the Hub for it); `reason` says why where the
    recipe stores none on purpose (listed under "unsized"), else is None."""

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


def _footprints() -> dict[str, Any]:
    doc = json.loads(resources.files("Modelfiles").joinpath(FOOTPRINTS_FILE).read_text(encoding="utf-8"))
    return doc if isinstance(doc, dict) else {}


def unsized_recipes() -> dict[str, str]:
    """The shipped recipes that store no footprint on purpose, each with why: no public source for
    their release's config.json sizes, so `ft fit` offline says the size is unknown, not a guess."""
    unsized = _footprints().get("unsized", {})
    return {str(k): str(v) for k, v in unsized.items()} if isinstance(unsized, dict) else {}


def stored_config(model: str, tag: str | None = None) -> dict[str, Any]:
    """The config.json subset stored for the shipped recipe `model`, with the keys stored for
    "model:tag" over it where a tag's checkpoint differs (DeepSeek-V4-Flash-Base's FP8 experts);
    NoStoredFootprintError if none (with the reason where the recipe is listed as unsized)."""
    models = _footprints().get("models", {})
    config = models.get(model)
    if not isinstance(config, dict):
        reason = unsized_recipes().get(model)
        raise NoStoredFootprintError(f"the recipe {model!r} stores no footprint in Modelfiles/{FOOTPRINTS_FILE}"
                                     + (f": {reason}" if reason else ""), reason)
    overlay = models.get(f"{model}:{tag}") if tag else None
    return {**config, **overlay} if isinstance(overlay, dict) else config


def stale_keys(recipe: Recipe, config: dict[str, Any]) -> list[str]:
    """Where the config.json subset stored for the shipped `recipe` disagrees with its checkpoint's
    real `config` (read when the Hub answers): one "key: stored X, config.json Y" each (nested keys
    dotted); empty where they agree, or where none is stored. Keys config.json lacks are not
    compared (a stored default)."""
    try:
        stored = stored_config(recipe.name, recipe.tag)
    except NoStoredFootprintError:
        return []
    return _differences(stored, config, "")


def _differences(stored: dict[str, Any], real: dict[str, Any], prefix: str) -> list[str]:
    out: list[str] = []
    for key, value in stored.items():
        if key not in real:
            continue
        if isinstance(value, dict) and isinstance(real[key], dict):
            out += _differences(value, real[key], f"{prefix}{key}.")
        elif value != real[key]:
            out.append(f"{prefix}{key}: stored {value!r}, config.json {real[key]!r}")
    return out


def log_if_stale(recipe: Recipe, config: dict[str, Any]) -> None:
    """A warning where the stored footprint of `recipe` (a shipped one) no longer matches its
    checkpoint's config.json: `ft fit` offline would plan from wrong sizes."""
    stale = stale_keys(recipe, config)
    if stale:
        log.warning("%s: the footprint stored with the recipe (Modelfiles/%s) differs from the checkpoint's "
                    "config.json (%s): `ft fit` offline plans from the stored one; update its entry",
                    recipe.ref, FOOTPRINTS_FILE, "; ".join(stale[:4]) + (f"; {len(stale) - 4} more" if len(stale) > 4
                                                                           else ""))


def recipe_footprint(recipe: Recipe, *, name: str) -> ModelFootprint:
    """The footprint of `recipe` (a shipped one) from its stored config, as FTW would hold it."""
    config = stored_config(recipe.name, recipe.tag)
    family = family_for_config(config)
    c = normalized_config(family, config)
    text = family.text_config(config)
    weight = _weight_kind(recipe, config)
    compute = 4 if weight == "f32" else 2
    dtype = "f32" if weight == "f32" else "bf16"
    experts = len(c["moe_layers"])
    gated = family.expert_activation(text).gated  # (Nemotron-H's relu2 and Doge's silu experts hold no gate)
    stride = _expert_stride(c["hidden_size"], c["moe_intermediate_size"], weight, gated)
    dense = _dense_numel(family.name, c, text)
    embedding = 0 if c["tie_word_embeddings"] else c["vocab_size"] * c["hidden_size"] * compute
    context = recipe.context_length or c["context_length"]
    if recipe.source.scheme == "gguf":
        quant = _gguf_quant(recipe.source.path or "")
        if quant in GGUF_FILE_TYPES and gated:
            return _gguf_footprint(quant, family.name, c, text, dense, name=name, context=context)
        # (a type not tabled: only the file's size, every byte as host RAM; ft fit reads no header)
        bits = GGUF_BITS_PER_WEIGHT.get(quant, 8.5)
        numel = dense + experts * c["num_experts"] * 3 * c["hidden_size"] * c["moe_intermediate_size"]
        return ModelFootprint.from_sizes(expert_bytes=math.ceil(numel * bits / 8), name=name, context_length=context,
                                         family=family.name, dtype=dtype)
    return ModelFootprint(
        name=name, source=SOURCE, family=family.name, dtype=dtype, dense_bytes=dense * compute,
        expert_pool_bytes=stride * experts * c["num_experts"], expert_stride_bytes=stride, num_moe_layers=experts,
        num_experts=c["num_experts"], num_experts_per_tok=c["num_experts_per_tok"],
        kv=kv_layout(family.name, text, kv_dtype_bytes(dtype)), context_length=context,
        activation_bytes_per_token=_activation_bytes_per_token(c), embedding_bytes=embedding,
        ffn_bytes_per_token=_ffn_bytes_per_token(c, dtype, grouped_records(
            {"f8_e4m3" if weight == "fp8" else weight}, {family.expert_activation(text)}, False), family.name))


# The tensor types llama.cpp's llama-quantize gives a MoE model's weights for a file type
# (src/llama-quant.cpp at 0c1e570, llama_tensor_get_type): the experts' gate and up, their down,
# their down in the layers that get more bits (Q4_K_M and Q5_K_M: use_more_bits, about 3 in 8;
# Q4_K_S: the first eighth), and the other 2-D weights (the attention's value and output
# projections get more bits in some files: not counted). Unsloth's dynamic quants (UD-Q4_K_XL)
# read as their base type.
GGUF_FILE_TYPES = {
    "q4_k_m": ("q4_k", "q4_k", "q6_k", "q4_k"), "q4_k_s": ("q4_k", "q4_k", "q5_k", "q4_k"),
    "q5_k_m": ("q5_k", "q5_k", "q6_k", "q5_k"), "q5_k_s": ("q5_k", "q5_k", "q5_k", "q5_k"),
    "q6_k": ("q6_k", "q6_k", "q6_k", "q6_k"), "q8_0": ("q8_0", "q8_0", "q8_0", "q8_0"),
}
# bytes a block, values a block (ggml's block_q4_K ...)
GGML_BLOCKS = {"q4_k": (144, 256), "q5_k": (176, 256), "q6_k": (210, 256), "q8_0": (34, 32)}


def _ggml_row_bytes(kind: str, values: int) -> int:
    block_bytes, block_values = GGML_BLOCKS[kind]
    return math.ceil(values / block_values) * block_bytes


def gguf_expert_stride(hidden: int, inter: int, gate_up: str, down: str) -> int:
    """One expert record of a GGUF model as FTW keeps it: the blocks as stored, gate and up as one
    w13 part [2I rows of H] (two parts where their types differ), down [H rows of I]."""
    rows = [2 * inter] if gate_up else []
    parts = [r * _ggml_row_bytes(gate_up, hidden) for r in rows] + [hidden * _ggml_row_bytes(down, inter)]
    return align_up(sum(align_up(p, PART_ALIGNMENT) for p in parts))


def _more_bits(layer: int, layers: int, quant: str) -> bool:
    """llama.cpp's choice of the layers whose ffn_down gets more bits (use_more_bits, or Q4_K_S's
    first eighth)."""
    if quant == "q4_k_s":
        return layer < layers // 8
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _gguf_footprint(quant: str, family: str, c: dict[str, Any], text: dict[str, Any], dense_numel: int, *,
                    name: str, context: int) -> ModelFootprint:
    """A GGUF file type's footprint from the stored config: the experts' records as FTW keeps the
    blocks (GGUF_FILE_TYPES), the dense projections and head at the file type's bits (kept as
    blocks), the token embeddings dequantized to the 16-bit compute dtype (in host RAM on the GPU
    path), KV in that dtype; its dtype the embeddings' as stored, as FTW's index gives it."""
    gate_up, down, down_more, dense_kind = GGUF_FILE_TYPES[quant]
    hidden, inter, num_experts = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
    layers = c["num_layers"]
    strides = [gguf_expert_stride(hidden, inter, gate_up, down_more if _more_bits(i, layers, quant) else down)
               for i in c["moe_layers"]]
    block_bytes, block_values = GGML_BLOCKS[dense_kind]
    table = c["vocab_size"] * hidden  # the token embeddings' elements (also the head, where tied)
    embedding = 0 if c["tie_word_embeddings"] else table * 2
    dense = math.ceil((dense_numel - table) * block_bytes / block_values) + table * 2
    return ModelFootprint(
        name=name, source=SOURCE, family=family, dtype=dense_kind, dense_bytes=dense,
        expert_pool_bytes=sum(strides) * num_experts, expert_stride_bytes=max(strides, default=0),
        num_moe_layers=len(strides), num_experts=num_experts, num_experts_per_tok=c["num_experts_per_tok"],
        kv=kv_layout(family, text, kv_dtype_bytes("bf16")), context_length=context,
        activation_bytes_per_token=_activation_bytes_per_token(c), embedding_bytes=embedding,
        ffn_bytes_per_token=_ffn_bytes_per_token(c, "bf16", grouped_records(
            {gate_up, down, down_more}, {FAMILIES[family].expert_activation(text)}, False), family))


def _weight_kind(recipe: Recipe, config: dict[str, Any]) -> str:
    """What the experts are stored as: the recipe's DTYPE, or (auto) the checkpoint's own."""
    if recipe.dtype != "auto":
        return recipe.dtype
    quant = config.get("quantization_config") or {}
    if "fp4" in (config.get("expert_dtype"), quant.get("expert_dtype")):  # (DeepSeek-V4-Flash's: kept mxfp4, ftw/fp4.py)
        return "mxfp4"
    if quant.get("quant_method") == "mxfp4":  # (gpt-oss's: kept, ftw/convert.py)
        return "mxfp4"
    return "fp8" if quant.get("quant_method") == "fp8" else "f32" if config.get("torch_dtype") == "float32" else "bf16"


def _expert_stride(hidden: int, inter: int, weight: str, gated: bool = True) -> int:
    """One expert record as the FTW writer lays it out: w13 (gate and up, or up alone where the
    experts are not `gated`), w2 (down), and with FP8 their block-scale parts, each part on 256
    bytes, the record on 4096."""
    rows = (2 if gated else 1) * inter  # w13's
    if weight == "fp8":
        scale = math.ceil(inter / FP8_BLOCK) * math.ceil(hidden / FP8_BLOCK) * 4
        parts = [rows * hidden, hidden * inter, *([scale] * (3 if gated else 2))]
    elif weight == "mxfp4":  # (17 bytes a 32 values)
        parts = [rows * hidden // 32 * 17, hidden * inter // 32 * 17]
    else:
        element = 4 if weight == "f32" else 2
        parts = [rows * hidden * element, hidden * inter * element]
    return align_up(sum(align_up(p, PART_ALIGNMENT) for p in parts))


def _dense_numel(family: str, c: dict[str, Any], text: dict[str, Any]) -> int:
    """Elements of every tensor but the routed experts: attention, norms, routers, shared experts,
    the dense layers' MLPs, embeddings and head."""
    hidden, layers, vocab = c["hidden_size"], c["num_layers"], c["vocab_size"]
    moe = set(c["moe_layers"])
    per_layer = [_attention_numel(family, c, text, i) + 2 * hidden for i in range(layers)]
    shared_size = int(text.get("shared_expert_intermediate_size") or c["moe_intermediate_size"] * c["num_shared_experts"])
    shared = 3 * hidden * shared_size + (hidden if text.get("shared_expert_intermediate_size") else 0) \
        if c["num_shared_experts"] else 0
    dense_mlp = 3 * hidden * int(text.get("intermediate_size") or 0)
    mlp = sum(c["num_experts"] * hidden + shared if i in moe else dense_mlp for i in range(layers))
    head = 0 if c["tie_word_embeddings"] else vocab * hidden
    return sum(per_layer) + mlp + vocab * hidden + head + hidden


def _attention_numel(family: str, c: dict[str, Any], text: dict[str, Any], layer: int) -> int:
    hidden, heads, kv_heads, head_dim = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    if family == "deepseek_v4":
        return _compressed_layer_numel(c, text, layer)
    if text.get("kv_lora_rank"):  # MLA (DeepSeek, Kimi, GLM-4.7-Flash, GLM-5)
        rank, rope, nope = int(text["kv_lora_rank"]), int(text["qk_rope_head_dim"]), int(text["qk_nope_head_dim"])
        v_dim, q_rank = int(text["v_head_dim"]), int(text.get("q_lora_rank") or 0)
        q = hidden * q_rank + q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        return q + hidden * (rank + rope) + rank + rank * heads * (nope + v_dim) + heads * v_dim * hidden
    if _is_linear_layer(text, layer):  # Gated DeltaNet (Qwen3-Next, Qwen3.5/3.6)
        k_heads, v_heads = int(text["linear_num_key_heads"]), int(text["linear_num_value_heads"])
        k_dim, v_dim = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
        conv = (2 * k_heads * k_dim + v_heads * v_dim) * int(text.get("linear_conv_kernel_dim") or 4)
        return hidden * (2 * k_heads * k_dim + 2 * v_heads * v_dim + 2 * v_heads) + conv + 2 * v_heads + v_dim \
            + v_heads * v_dim * hidden
    if family == "minimax" and _minimax_layer_type(text, layer) == "linear_attention":
        inner = heads * head_dim  # lightning attention: qkv_proj, output_gate and out_proj all heads wide, a norm
        return 5 * hidden * inner + inner
    sizes = FAMILIES[family].attention_sizes
    if sizes is not None:  # (attention sized layer by layer: MiMo-V2-Flash's, Laguna's)
        heads, kv_heads, head_dim, v_dim = sizes(text)[layer]
        return hidden * heads * head_dim + hidden * kv_heads * (head_dim + v_dim) + heads * v_dim * hidden
    gated = 2 if "linear_num_key_heads" in text else 1  # Qwen3-Next's full layers gate their output: q_proj twice
    numel = hidden * heads * head_dim * (gated + 1) + 2 * hidden * kv_heads * head_dim
    if family in ("qwen3_moe", "qwen3_next", "qwen3_5_moe"):
        numel += 2 * head_dim  # q_norm, k_norm
    if family == "qwen2_moe" or text.get("attention_bias"):
        numel += (heads + 2 * kv_heads) * head_dim
    return numel


def _compressed_layer_numel(c: dict[str, Any], text: dict[str, Any], layer: int) -> int:
    """DeepSeek-V4's attention (runtime/layers/compressed_attention.py) and its layer's extras: the
    low-rank query, the one key-value head, the grouped output, the sinks, a CSA layer's compressor
    and indexer or an HCA layer's compressor; the two hyper-connections; a hash layer's tid2eid."""
    hidden, heads, d = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    q_rank, o_rank, groups = int(text.get("q_lora_rank") or 1024), int(text.get("o_lora_rank") or 1024), \
        int(text.get("o_groups") or 8)
    numel = hidden * q_rank + q_rank + q_rank * heads * d + hidden * d + d + heads * d * o_rank + groups * o_rank * hidden
    numel += heads
    ratio = (text.get("compress_ratios") or [])[layer:layer + 1]
    kind = (text.get("layer_types") or [])[layer:layer + 1] or [{4: "compressed_sparse_attention",
                                                                  128: "heavily_compressed_attention"}.get(r, "") for r in ratio]
    rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128, **(text.get("compress_rates") or {})}
    if kind and kind[0] == "compressed_sparse_attention":
        index_d, index_heads = int(text.get("index_head_dim") or 128), int(text.get("index_n_heads") or 64)
        rate = int(text.get("compress_rate_csa") or rates[kind[0]])
        numel += 2 * hidden * 2 * d + rate * 2 * d + d  # its compressor: kv and gate of both series
        numel += 2 * hidden * 2 * index_d + rate * 2 * index_d + index_d + q_rank * index_heads * index_d \
            + hidden * index_heads  # the indexer's
    elif kind and kind[0] == "heavily_compressed_attention":
        rate = int(text.get("compress_rate_hca") or rates[kind[0]])
        numel += 2 * hidden * d + rate * d + d
    n = int(text.get("hc_mult") or 4)
    numel += 2 * ((2 + n) * n * n * hidden + (2 + n) * n + 3)
    kinds = text.get("mlp_layer_types") or ["hash_moe"] * int(text.get("num_hash_layers", 3))
    if kinds[layer:layer + 1] == ["hash_moe"]:
        numel += c["vocab_size"] * c["num_experts_per_tok"]
    return numel


def _minimax_layer_type(text: dict[str, Any], layer: int) -> str:
    """A MiniMax layer's kind as runtime/models/minimax.py reads it: `layer_types`, else alternating
    full and lightning ("linear_attention") layers, MiniMaxConfig's default."""
    types = text.get("layer_types")
    if isinstance(types, list) and layer < len(types):
        return str(types[layer])
    return "full_attention" if (layer + 1) % 2 else "linear_attention"


def _is_linear_layer(text: dict[str, Any], layer: int) -> bool:
    if "linear_num_key_heads" not in text:
        return False
    types = text.get("layer_types")
    if isinstance(types, list) and layer < len(types):
        return types[layer] == "linear_attention"
    return (layer + 1) % int(text.get("full_attention_interval") or 4) != 0


def _gguf_quant(path: str) -> str:
    m = re.search(r"(q\d_k_[sm]|q\d_k|q\d_0|mxfp4)", path.lower())
    return m.group(1) if m else ""

