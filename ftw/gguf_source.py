"""GGUF architectures ft converts: tensor-name tables and the Hugging Face config rebuilt from metadata.

GGUF renames every tensor (llama.cpp's names, gguf-py's `tensor_mapping.py`); FTW keeps Hugging
Face names, so each GGUF name maps back through the tables below, one commented row per name.
What llama.cpp changes besides names, and how we undo it:

- llama (Mixtral), granitemoe: `convert_hf_to_gguf.py` permutes the rows of `attn_q`/`attn_k` within each head
  (`LlamaModel.permute`) for its interleaved RoPE. That is a row permutation, and every GGML row
  is quantized on its own, so `hf_rows_of_llama_qk` undoes it on the stored bytes, quantized or not.
- qwen3moe, qwen2moe, olmoe, glm4moe, dots1, deepseek2: no permutation (their converters do not
  permute: llama.cpp runs the first five with NeoX RoPE, as HF does; DeepSeek's RoPE already rotates
  adjacent pairs, HF `rope_interleave`).
- deepseek2: newer files split MLA's `kv_b_proj` into `attn_k_b` (transposed per head) and
  `attn_v_b`; the converter rebuilds `kv_b_proj` from them (see gguf_convert.py).
- Routed experts are stored fused per layer, `ffn_{gate,up,down}_exps` [E, rows, cols].
- granitemoe: the converter splits Granite's fused `input_linear` by rows into gate and up; the
  experts' halves become the FTW record's w13 as they are, the shared MLP's are joined back
  (CONCAT_ROWS). A granitemoe file with shared experts is a granitemoeshared model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import SourceError, UnsupportedArchitectureError
from .families import config_int, index_in_name
from .gguf_file import GGUFModel

LAYER_PREFIX_GGUF = "blk.{layer}."
LAYER_PREFIX_HF = "model.layers.{layer}."
QWEN3, LLAMA, DEEPSEEK2 = "qwen3moe", "llama", "deepseek2"
QWEN2, OLMOE, GLM4, DOTS1, GRANITE = "qwen2moe", "olmoe", "glm4moe", "dots1", "granitemoe"
QK_NORMED = (QWEN3, OLMOE, GLM4, DOTS1)  # per head (Qwen3, GLM, dots) or over the whole projection (OLMoE)
GATE_ROUTED = (QWEN3, QWEN2, OLMOE, DEEPSEEK2, GLM4, DOTS1)  # router at mlp.gate (Mixtral's elsewhere)
WITH_DENSE_LAYERS = (QWEN3, QWEN2, DEEPSEEK2, GLM4, DOTS1)  # dense MLPs beside MoE layers
DEEPSEEK_MOE = (DEEPSEEK2, GLM4, DOTS1)  # DeepSeek-V3's sigmoid MoE: correction bias, shared_experts


@dataclass(frozen=True)
class Row:
    """One tensor name in both conventions."""

    gguf: str  # after "blk.N." for block rows; the whole name for global rows
    hf: str  # after "model.layers.N." for block rows; the whole name for global rows
    archs: tuple[str, ...] = ()  # GGUF architectures the row applies to; () = all


GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.embed_tokens.weight"),  # input embeddings [V, H]
    Row("output_norm.weight", "model.norm.weight"),  # final RMSNorm
    Row("output.weight", "lm_head.weight"),  # LM head; absent when tied to the embeddings
)

BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight"),  # RMSNorm before attention
    Row("attn_q.weight", "self_attn.q_proj.weight"),  # llama: rows un-permuted, see module doc
    Row("attn_q.bias", "self_attn.q_proj.bias"),  # (models with attention bias)
    Row("attn_k.weight", "self_attn.k_proj.weight"),  # llama: rows un-permuted
    Row("attn_k.bias", "self_attn.k_proj.bias"),
    Row("attn_v.weight", "self_attn.v_proj.weight"),
    Row("attn_v.bias", "self_attn.v_proj.bias"),
    Row("attn_output.weight", "self_attn.o_proj.weight"),
    Row("attn_output.bias", "self_attn.o_proj.bias"),  # (dots1 with attention_bias)
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", QK_NORMED),  # QK RMSNorm
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", QK_NORMED),
    Row("attn_q_a.weight", "self_attn.q_a_proj.weight", (DEEPSEEK2,)),  # MLA query down-projection
    Row("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", (DEEPSEEK2,)),
    Row("attn_q_b.weight", "self_attn.q_b_proj.weight", (DEEPSEEK2,)),  # MLA query up-projection
    Row("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", (DEEPSEEK2,)),  # latent KV + RoPE key
    Row("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", (DEEPSEEK2,)),
    Row("attn_kv_b.weight", "self_attn.kv_b_proj.weight", (DEEPSEEK2,)),  # older files; newer: KV_B_SPLIT
    Row("ffn_norm.weight", "post_attention_layernorm.weight"),  # RMSNorm before the MLP / MoE
    Row("post_attention_norm.weight", "post_attention_layernorm.weight", (GLM4,)),  # glm4moe's name for it
    Row("ffn_gate_inp.weight", "mlp.gate.weight", GATE_ROUTED),  # router [E, H]
    Row("ffn_gate_inp.weight", "block_sparse_moe.gate.weight", (LLAMA,)),  # Mixtral's router
    Row("ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight", (GRANITE,)),  # Granite's
    Row("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", DEEPSEEK_MOE),  # noaux_tc routing bias [E]
    Row("ffn_gate.weight", "mlp.gate_proj.weight", WITH_DENSE_LAYERS),  # dense layers' MLP
    Row("ffn_up.weight", "mlp.up_proj.weight", WITH_DENSE_LAYERS),
    Row("ffn_down.weight", "mlp.down_proj.weight", WITH_DENSE_LAYERS),
    Row("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", DEEPSEEK_MOE),  # shared experts
    Row("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", DEEPSEEK_MOE),
    Row("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", DEEPSEEK_MOE),
    Row("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", (QWEN2,)),  # Qwen2-MoE's one shared expert
    Row("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", (QWEN2,)),
    Row("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", (QWEN2,)),
    Row("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", (QWEN2,)),  # its sigmoid gate [1, H]: ROW_VECTORS
    Row("ffn_down_shexp.weight", "shared_mlp.output_linear.weight", (GRANITE,)),  # granitemoeshared's shared MLP
)


@dataclass(frozen=True)
class Concat:
    """One Hugging Face tensor that llama.cpp's converter split by rows into several GGUF tensors."""

    parts: tuple[str, ...]  # after "blk.N.", in the HF tensor's row order
    hf: str  # after "model.layers.N."
    archs: tuple[str, ...]


CONCAT_ROWS: tuple[Concat, ...] = (
    # GraniteMoeModel.modify_tensors: shared_mlp.input_linear [2S, H] split into gate rows, then up
    Concat(("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), "shared_mlp.input_linear.weight", (GRANITE,)),
)

# HF [1, H] matrices that llama.cpp sizes {n_embd}: a converter may store them 1-D; read as [1, H]
ROW_VECTORS = ("ffn_gate_inp_shexp.weight",)

# Routed experts, fused per layer (torch order). They become the layer's FTW expert bank.
EXPERT_ROWS: dict[str, str] = {
    "ffn_gate_exps.weight": "gate",  # [E, I, H]: gate_proj / Mixtral w1
    "ffn_up_exps.weight": "up",  # [E, I, H]: up_proj / Mixtral w3
    "ffn_down_exps.weight": "down",  # [E, H, I]: down_proj / Mixtral w2
    "ffn_gate_up_exps.weight": "gate_up",  # [E, 2I, H], gate rows then up rows (--fuse-gate-up-exps)
}

# DeepSeek MLA's kv_b_proj as newer llama.cpp stores it, split per head; rebuilt into KV_B_HF.
KV_B_SPLIT: dict[str, str] = {
    "attn_k_b.weight": "k_b",  # [n_head, kv_lora_rank, qk_nope_head_dim]: the key half, transposed
    "attn_v_b.weight": "v_b",  # [n_head, v_head_dim, kv_lora_rank]: the value half
}
KV_B_HF = "self_attn.kv_b_proj.weight"

# Tensors llama.cpp adds that a Hugging Face model computes instead: dropped and counted.
DROPPED_GLOBAL = ("rope_freqs.weight",)  # RoPE frequency factors, derived from rope_scaling
DROPPED_BLOCK = ("attn_rot_embd.weight",)  # old files' rotary tables


def hf_rows_of_llama_qk(num_rows: int, num_heads: int) -> np.ndarray:
    """Row indices that undo llama.cpp's `permute` of attn_q/attn_k: hf = gguf[indices].

    llama.cpp stores row `(h, i, j)` of `w.reshape(heads, 2, head_dim / 2)` at `(h, j, i)`."""
    if num_heads <= 0 or num_rows <= 0 or num_rows % (2 * num_heads):
        raise SourceError(f"cannot un-permute {num_rows} query/key rows over {num_heads} heads")
    gguf_from_hf = np.arange(num_rows).reshape(num_heads, 2, num_rows // num_heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(gguf_from_hf)


def _f32(value: Any) -> float:
    """A float32 metadata value as the decimal it was written from (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


class Meta:
    """Typed access to `{arch}.*` metadata keys with errors that name the file and the key."""

    def __init__(self, model: GGUFModel, arch: str) -> None:
        self.model, self.arch, self.values = model, arch, model.metadata

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(f"{self.arch}.{key}", default)

    def int(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]  # a per-layer array that is uniform
        if not isinstance(value, int) or isinstance(value, bool):
            raise SourceError(f"{self.model.path}: GGUF metadata {self.arch}.{key} is missing or not one integer ({value!r})")
        return value

    def float(self, key: str, default: float | None = None) -> float | None:
        """A finite number (an rms eps of NaN or a RoPE base of "1e6x" would reach the model)."""
        value = self.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SourceError(f"{self.model.path}: GGUF metadata {self.arch}.{key} is not one finite number ({value!r})")
        return _f32(value)


def _common_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Keys every family shares. `num_hidden_layers` leaves out trailing MTP (nextn) blocks."""
    model, values = meta.model, meta.values
    embed = model.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise SourceError(f"{model.path}: no 2-D token_embd.weight; not a complete language model")
    where = f"{model.path}: GGUF metadata"  # sizes checked before anything is sized by them
    heads = config_int("num_attention_heads", meta.int("attention.head_count"), where=where)
    blocks = config_int("num_hidden_layers", meta.int("block_count"), where=where)
    config: dict[str, Any] = {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": config_int("hidden_size", meta.int("embedding_length"), where=where),
        "num_hidden_layers": blocks - config_int("nextn_predict_layers", meta.int("nextn_predict_layers", 0), low=0,
                                                 high=blocks - 1, where=where),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.int("attention.head_count_kv", heads),
        "max_position_embeddings": meta.int("context_length", 0),
        "rms_norm_eps": meta.float("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": meta.float("rope.freq_base", 10000.0),
        "vocab_size": embed.shape[0],
        "tie_word_embeddings": "output.weight" not in model.tensors,
        "hidden_act": "silu",
        "bos_token_id": values.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": values.get("tokenizer.ggml.eos_token_id"),
    }
    scaling = meta.get("rope.scaling.type")
    if scaling is not None and not isinstance(scaling, str):
        raise SourceError(f"{model.path}: GGUF metadata {meta.arch}.rope.scaling.type is not a string ({scaling!r})")
    if scaling in ("linear", "yarn"):
        rope: dict[str, Any] = {"type": scaling, "rope_type": scaling, "factor": meta.float("rope.scaling.factor", 1.0)}
        if meta.get("rope.scaling.original_context_length") is not None:
            rope["original_max_position_embeddings"] = config_int(
                "rope.scaling.original_context_length", meta.int("rope.scaling.original_context_length"), where=where)
        for key, hf_key in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if meta.get(f"rope.scaling.{key}") is not None:
                rope[hf_key] = meta.float(f"rope.scaling.{key}")
        if (log_mul := meta.float("rope.scaling.yarn_log_multiplier")) is not None:
            # llama.cpp writes 0.1 * mscale_all_dim; DeepSeek's configs set mscale equal to it
            rope["mscale"] = rope["mscale_all_dim"] = round(log_mul / 0.1, 6)
        config["rope_scaling"] = rope
    elif scaling not in (None, "none"):
        raise SourceError(f"{model.path}: RoPE scaling {scaling!r} is not supported for GGUF conversion")
    return config


def _expert_layers(model: GGUFModel) -> list[int]:
    layers = set()
    for name in model.tensors:
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "blk" and ".".join(parts[2:]) in EXPERT_ROWS:
            layers.add(index_in_name(parts[1], name))
    return sorted(layers)


def _expert_size(model: GGUFModel) -> int | None:
    """The experts' intermediate size as the tensors show it (for files that omit the key)."""
    down = next((t for n, t in model.tensors.items() if n.endswith(".ffn_down_exps.weight")), None)
    return down.shape[-1] if down is not None and len(down.shape) == 3 else None


def _qwen3_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    config = _common_config(meta, arch)
    moe = set(_expert_layers(meta.model))
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        # llama.cpp's qwen3moe graph always renormalizes the top-k weights
        norm_topk_prob=bool(meta.get("expert_weights_norm", True)),
        decoder_sparse_step=1,
        mlp_only_layers=[i for i in range(config["num_hidden_layers"]) if i not in moe],
        attention_bias="blk.0.attn_q.bias" in meta.model.tensors,
        use_sliding_window=False,
    )
    if meta.get("feed_forward_length") is not None:
        config["intermediate_size"] = meta.int("feed_forward_length")
    return config


def _mixtral_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    config = _common_config(meta, arch)
    if meta.int("expert_count", 0) < 2:
        raise UnsupportedArchitectureError(
            f"{meta.model.path}: a dense llama GGUF (no experts); ft converts only MoE llama-architecture models (Mixtral)"
        )
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        sliding_window=meta.get("attention.sliding_window"),
    )
    return config


def _deepseek_v3_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    if meta.get("expert_gating_func") != 2:  # gguf-py ExpertGatingFuncType.SIGMOID
        raise UnsupportedArchitectureError(
            f"{meta.model.path}: a deepseek2 GGUF with softmax routing (DeepSeek-V2 style); ft converts "
            "sigmoid-routed ones (DeepSeek-V3/R1 style) only"
        )
    config = _common_config(meta, arch)
    rope_dim = meta.int("rope.dimension_count")
    mla = meta.get("attention.key_length_mla") is not None  # newer files: MQA form, per-head sizes under *_mla
    key_length = meta.int("attention.key_length_mla" if mla else "attention.key_length")
    q_lora_rank = meta.int("attention.q_lora_rank", 0)
    config.update(
        num_key_value_heads=config["num_attention_heads"],  # MLA: every head has its own key and value
        head_dim=rope_dim,
        q_lora_rank=q_lora_rank or None,
        kv_lora_rank=meta.int("attention.kv_lora_rank"),
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=key_length - rope_dim,
        qk_head_dim=key_length,
        v_head_dim=meta.int("attention.value_length_mla" if mla else "attention.value_length"),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=meta.int("expert_shared_count", 0),
        first_k_dense_replace=meta.int("leading_dense_block_count", 0),
        moe_layer_freq=1,
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        scoring_func="sigmoid",
        topk_method="noaux_tc",
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
        rope_interleave=True,
        attention_bias=False,
    )
    return config


def _has(model: GGUFModel, block_tensor: str) -> bool:
    """Whether any block holds `block_tensor` (e.g. "attn_q.bias")."""
    return any(n.startswith("blk.") and n.split(".", 2)[2] == block_tensor for n in model.tensors)


def _rows_of(model: GGUFModel, block_tensor: str) -> int | None:
    """The HF row count (GGUF's last dimension reversed: shape[0]) of the first block's `block_tensor`."""
    t = next((t for n, t in model.tensors.items() if n.startswith("blk.") and n.split(".", 2)[2] == block_tensor), None)
    return t.shape[0] if t is not None and len(t.shape) == 2 else None


def _qwen2_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Qwen2MoeModel.set_gguf_parameters: the base keys, expert_feed_forward_length and
    expert_shared_feed_forward_length. llama.cpp's qwen2moe graph never renormalizes the top-k
    weights (Qwen2MoeConfig's norm_topk_prob False) and gates the shared expert by ffn_gate_inp_shexp."""
    config = _common_config(meta, arch)
    moe = set(_expert_layers(meta.model))
    shared = meta.int("expert_shared_feed_forward_length", _rows_of(meta.model, "ffn_up_shexp.weight") or 0)
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        shared_expert_intermediate_size=shared,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
        decoder_sparse_step=1,
        mlp_only_layers=[i for i in range(config["num_hidden_layers"]) if i not in moe],
        qkv_bias=_has(meta.model, "attn_q.bias"),
        use_sliding_window=False,
    )
    if meta.get("feed_forward_length") is not None:
        config["intermediate_size"] = meta.int("feed_forward_length")
    return config


def _olmoe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """OlmoeModel.set_gguf_parameters: the base keys (feed_forward_length is OLMoE's
    intermediate_size, the experts' width) and rms eps 1e-5. llama.cpp's olmoe graph does not
    renormalize the top-k weights (OlmoeConfig's norm_topk_prob False). Its converter writes no
    clip_qkv (the releases have none); attention.clamp_kqv, as OLMo's converter writes it, is read."""
    config = _common_config(meta, arch)
    width_key = next((k for k in ("expert_feed_forward_length", "feed_forward_length") if meta.get(k) is not None), None)
    width = meta.int(width_key) if width_key else meta.int("expert_feed_forward_length", _expert_size(meta.model))
    config.update(
        intermediate_size=width,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
        clip_qkv=meta.float("attention.clamp_kqv"),
        attention_bias=_has(meta.model, "attn_q.bias"),
    )
    if meta.get("attention.key_length") is not None:
        config["head_dim"] = meta.int("attention.key_length")
    return config


def _sigmoid_moe(meta: Meta, config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3-style MoE keys (glm4moe, dots1) as llama.cpp writes them: expert_count (the routed
    ones), expert_shared_count, leading_dense_block_count, expert_weights_scale/_norm, and the
    group keys the base converter writes from n_group/topk_group (1 where absent: one group)."""
    if meta.get("expert_gating_func", 2) != 2:  # gguf-py ExpertGatingFuncType.SIGMOID
        raise UnsupportedArchitectureError(f"{meta.model.path}: a {meta.arch} GGUF with softmax routing; "
                                           "its Hugging Face family routes by sigmoid")
    shared = meta.int("expert_shared_count", 1 if _has(meta.model, "ffn_up_shexp.weight") else 0)
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=shared,
        first_k_dense_replace=meta.int("leading_dense_block_count", 0),
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),  # llama.cpp's default where absent
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        attention_bias=_has(meta.model, "attn_q.bias"),
    )
    return config


def _glm4_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Glm4MoeModel.set_gguf_parameters: _sigmoid_moe's keys, rope.dimension_count (head_dim times
    partial_rotary_factor) and nextn_predict_layers (the MTP layers, counted in block_count)."""
    config = _sigmoid_moe(meta, _common_config(meta, arch))
    rotary = meta.int("rope.dimension_count", config["head_dim"] // 2)
    config.update(
        partial_rotary_factor=rotary / config["head_dim"],
        use_qk_norm=_has(meta.model, "attn_q_norm.weight"),
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
    )
    return config


def _dots1_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Dots1Model.set_gguf_parameters (Qwen2MoeModel's keys and _sigmoid_moe's); llama.cpp's dots1
    graph has no sliding window."""
    config = _sigmoid_moe(meta, _common_config(meta, arch))
    config.update(sliding_window=None, scoring_func="noaux_tc")
    return config


def _granite_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """GraniteMoeModel.set_gguf_parameters (GraniteModel's, LlamaModel's): the multipliers as
    attention.scale, embedding_scale, residual_scale and logit_scale (each written where truthy:
    GraniteMoeConfig's defaults are 1.0, so real files have all four), feed_forward_length the
    experts' width, expert_shared_feed_forward_length where a shared MLP is. Without
    attention.scale llama.cpp scales by 1/sqrt(head_dim); without the others it scales by nothing."""
    config = _common_config(meta, arch)
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    width_key = next((k for k in ("expert_feed_forward_length", "feed_forward_length") if meta.get(k) is not None), None)
    shared = meta.int("expert_shared_feed_forward_length", _rows_of(meta.model, "ffn_up_shexp.weight") or 0)
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int(width_key) if width_key else meta.int("feed_forward_length", _expert_size(meta.model)),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        attention_multiplier=meta.float("attention.scale", 1.0 / math.sqrt(head_dim)),
        embedding_multiplier=meta.float("embedding_scale", 1.0),
        residual_multiplier=meta.float("residual_scale", 1.0),
        logits_scaling=meta.float("logit_scale", 1.0),
        attention_bias=_has(meta.model, "attn_q.bias"),
    )
    if shared:
        config.update(model_type="granitemoeshared", architectures=["GraniteMoeSharedForCausalLM"],
                      shared_intermediate_size=shared)
    return config


@dataclass(frozen=True)
class GGUFArchitecture:
    """One `general.architecture` ft converts: its Hugging Face identity and how to rebuild its config."""

    name: str  # general.architecture
    model_type: str  # the Hugging Face model_type, which picks the FTW family
    hf_architecture: str
    build_config: Callable[[Meta, GGUFArchitecture], dict[str, Any]]
    permute_qk: bool = False  # llama.cpp permuted attn_q/attn_k rows; undone with hf_rows_of_llama_qk
    other_model_types: tuple[str, ...] = ()  # what build_config may make of a file instead (a variant)

    def hf_config(self, model: GGUFModel) -> dict[str, Any]:
        return self.build_config(Meta(model, self.name), self)

    def tensor_names(self, num_layers: int) -> dict[str, str]:
        """GGUF name -> Hugging Face name for every plain (non-expert) tensor of this architecture."""
        names = {r.gguf: r.hf for r in GLOBAL_ROWS if not r.archs or self.name in r.archs}
        rows = [r for r in BLOCK_ROWS if not r.archs or self.name in r.archs]
        for layer in range(num_layers):
            g, h = LAYER_PREFIX_GGUF.format(layer=layer), LAYER_PREFIX_HF.format(layer=layer)
            names.update({g + r.gguf: h + r.hf for r in rows})
        return names

    def concat_parts(self) -> dict[str, tuple[str, int]]:
        """GGUF block tensor name -> (the HF block tensor it is part of, its place in it)."""
        return {part: (c.hf, i) for c in CONCAT_ROWS if self.name in c.archs for i, part in enumerate(c.parts)}


ARCHITECTURES: dict[str, GGUFArchitecture] = {
    a.name: a
    for a in (
        GGUFArchitecture(QWEN3, "qwen3_moe", "Qwen3MoeForCausalLM", _qwen3_moe_config),
        GGUFArchitecture(LLAMA, "mixtral", "MixtralForCausalLM", _mixtral_config, permute_qk=True),
        GGUFArchitecture(DEEPSEEK2, "deepseek_v3", "DeepseekV3ForCausalLM", _deepseek_v3_config),
        GGUFArchitecture(QWEN2, "qwen2_moe", "Qwen2MoeForCausalLM", _qwen2_moe_config),
        GGUFArchitecture(OLMOE, "olmoe", "OlmoeForCausalLM", _olmoe_config),
        GGUFArchitecture(GLM4, "glm4_moe", "Glm4MoeForCausalLM", _glm4_moe_config),
        GGUFArchitecture(DOTS1, "dots1", "Dots1ForCausalLM", _dots1_config),
        GGUFArchitecture(GRANITE, "granitemoe", "GraniteMoeForCausalLM", _granite_moe_config, permute_qk=True,
                         other_model_types=("granitemoeshared",)),
    )
}


def architecture_for(model: GGUFModel) -> GGUFArchitecture:
    """The architecture of a GGUF model; unknown ones are refused with the supported list."""
    name = model.metadata.get("general.architecture")
    arch = ARCHITECTURES.get(name) if isinstance(name, str) else None
    if arch is None:
        raise UnsupportedArchitectureError(
            f"{model.path}: GGUF architecture {name!r} has no converter; supported GGUF architectures: "
            + ", ".join(f"{a.name} ({a.model_type})" for a in ARCHITECTURES.values())
        )
    return arch
