"""The Hugging Face config a GGUF file implies, one builder per architecture.

Every builder follows what llama.cpp's `convert_hf_to_gguf.py` writes for the architecture (named in
its docstring) and normalizes it to the Hugging Face config the family's runtime reads, with the
values llama.cpp's graph assumes where the file says nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SourceError, UnsupportedArchitectureError
from .families import config_int, index_in_name
from .gguf_file import GGUFModel
from .gguf_names import EXPERT_ROWS

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture

# How a file's router scores its experts (expert_gating_func): gguf-py's ExpertGatingFuncType, and
# llama-hparams.h's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, which gguf-py does not name
SOFTMAX, SIGMOID, SQRT_SOFTPLUS = 1, 2, 4
GATING_NAMES = {SOFTMAX: "softmax", SIGMOID: "sigmoid", SQRT_SOFTPLUS: "sqrtsoftplus"}


def require_gating(meta: Meta, where: str, family: str, wanted: int = SIGMOID, *, required: bool = False,
                   why: str = "") -> None:
    """Refuse, naming both, a file whose expert_gating_func is not `wanted`, the one routing `family`
    has. A file without the key reads as `wanted` (its converter writes none for it), unless
    `required` (llama.cpp's loader loads no file without it). `why`: said after, where there is more."""
    gating = meta.get("expert_gating_func", None if required else wanted)
    if gating != wanted:
        said = "no key" if gating is None else GATING_NAMES.get(gating, "unknown to llama.cpp")
        raise UnsupportedArchitectureError(f"{where} with expert_gating_func {gating!r} ({said}); {family} routes by "
                                           f"{GATING_NAMES[wanted]} ({wanted}){why}")


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


def _kv_heads(meta: Meta, heads: int) -> int:
    """attention.head_count_kv: one number, or one a layer where layers without attention (LFM2's
    convolutions) have 0 and the attention layers one value."""
    value = meta.get("attention.head_count_kv", heads)
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        attending = set(value) - {0}
        if len(attending) == 1:
            return attending.pop()
    return meta.int("attention.head_count_kv", heads)


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
        "num_key_value_heads": _kv_heads(meta, heads),
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
    if down is None:  # the old per-expert Mixtral layout: blk.N.ffn_down.E.weight [H, I]
        down = next((t for n, t in model.tensors.items() if n.startswith("blk.") and n.endswith(".ffn_down.0.weight")), None)
        return down.shape[-1] if down is not None and len(down.shape) == 2 else None
    return down.shape[-1] if len(down.shape) == 3 else None


def qwen3_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
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


def mixtral_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
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


GLM4_7_LITE_VOCAB = 154880  # llama.cpp's test for a GLM-4.7-Flash file without expert_gating_func


def deepseek2_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """DeepseekV2Model.set_gguf_parameters, which writes DeepSeek-V2, V2.5, V3 and R1 alike;
    expert_gating_func tells them apart: sigmoid (2) is V3's noaux_tc routing (deepseek_v3), softmax
    (1, or no key: the files before it, which llama.cpp reads as softmax) V2's (deepseek_v2: greedy
    top-k, or group-limited where expert_group_count says so). As llama.cpp's loader does, a file
    without the key that is GLM-4.7-Flash (47 or 48 blocks, 154880 tokens: Glm4MoeLiteModel writes
    deepseek2 files) is sigmoid-routed.

    A sigmoid-routed file that is GLM-4.7-Flash by that shape or by its vocabulary (Glm4MoeLiteModel's
    _set_vocab_glm: pre-tokenizer "glm4", which no DeepSeek converter writes) is read as glm4_moe_lite:
    llama.cpp runs it with the same deepseek2 graph, and ft's glm4_moe_lite is DeepSeek-V3's model
    (runtime/models/glm4_moe_lite.py), its MoE layers said by mlp_layer_types (the leading dense ones)."""
    gating = meta.get("expert_gating_func")
    embed = meta.model.tensors.get("token_embd.weight")
    vocab = len(meta.values.get("tokenizer.ggml.tokens") or []) or (embed.shape[0] if embed is not None else 0)
    glm_lite = meta.get("block_count") in (47, 48) and vocab == GLM4_7_LITE_VOCAB
    if gating is None:
        gating = SIGMOID if glm_lite else SOFTMAX
    if gating not in (SOFTMAX, SIGMOID):
        raise UnsupportedArchitectureError(f"{meta.model.path}: a deepseek2 GGUF with expert_gating_func {gating!r}; "
                                           "ft converts softmax (DeepSeek-V2) and sigmoid (DeepSeek-V3) routing")
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
    if gating == 1:
        grouped = config["n_group"] > 1
        config.update(model_type="deepseek_v2", architectures=["DeepseekV2ForCausalLM"], scoring_func="softmax",
                      topk_method="group_limited_greedy" if grouped else "greedy")
    elif meta.arch == "deepseek2" and (glm_lite or meta.values.get("tokenizer.ggml.pre") == "glm4"):  # (not glm-dsa's)
        layers, dense = config["num_hidden_layers"], min(config["first_k_dense_replace"], config["num_hidden_layers"])
        config.update(model_type="glm4_moe_lite", architectures=["Glm4MoeLiteForCausalLM"],
                      mlp_layer_types=["dense"] * dense + ["sparse"] * (layers - dense))
        config.pop("head_dim")  # (Glm4MoeLiteConfig saves none: the HF path's config.json has no head_dim)
    return config


def _has(model: GGUFModel, block_tensor: str) -> bool:
    """Whether any block holds `block_tensor` (e.g. "attn_q.bias")."""
    return any(n.startswith("blk.") and n.split(".", 2)[2] == block_tensor for n in model.tensors)


def _rows_of(model: GGUFModel, block_tensor: str) -> int | None:
    """The HF row count (GGUF's last dimension reversed: shape[0]) of the first block's `block_tensor`."""
    t = next((t for n, t in model.tensors.items() if n.startswith("blk.") and n.split(".", 2)[2] == block_tensor), None)
    return t.shape[0] if t is not None and len(t.shape) == 2 else None


def qwen2_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
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


def olmoe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
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


def sigmoid_moe_keys(meta: Meta, width: int, shared: int) -> dict[str, Any]:
    """The DeepSeek-V3-style MoE fields of a config from llama.cpp's keys: the dense width, the
    experts' `width`, their counts, `shared` shared experts, the dense first layers, the routed
    weights' scale and renormalization (llama.cpp's defaults where absent) and the group keys."""
    return dict(
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=width,
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=shared,
        first_k_dense_replace=meta.int("leading_dense_block_count", 0),
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
    )


def _sigmoid_moe(meta: Meta, config: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3-style MoE keys (glm4moe, dots1) as llama.cpp writes them: expert_count (the routed
    ones), expert_shared_count, leading_dense_block_count, expert_weights_scale/_norm, and the
    group keys the base converter writes from n_group/topk_group (1 where absent: one group)."""
    # no key where the converter leaves it to the base class, which writes it only for
    # scoring_func "sigmoid" (dots1's release says "noaux_tc")
    require_gating(meta, f"{meta.model.path}: a {meta.arch} GGUF", "its Hugging Face family")
    shared = meta.int("expert_shared_count", 1 if _has(meta.model, "ffn_up_shexp.weight") else 0)
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        **sigmoid_moe_keys(meta, width, shared),
        attention_bias=_has(meta.model, "attn_q.bias"),
    )
    return config


def glm4_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Glm4MoeModel.set_gguf_parameters: _sigmoid_moe's keys, rope.dimension_count (head_dim times
    partial_rotary_factor) and nextn_predict_layers (the MTP layers, counted in block_count). A file
    whose vocabulary is Solar Open's is read as solar_open (solar_open_config)."""
    if meta.values.get("tokenizer.ggml.pre") == SOLAR_OPEN_PRE:
        return solar_open_config(meta, arch)
    config = _sigmoid_moe(meta, _common_config(meta, arch))
    rotary = meta.int("rope.dimension_count", config["head_dim"] // 2)
    config.update(
        partial_rotary_factor=rotary / config["head_dim"],
        use_qk_norm=_has(meta.model, "attn_q_norm.weight"),
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
    )
    return config



SOLAR_OPEN_PRE = "solar-open"  # SolarOpenModel.set_vocab's pre-tokenizer (llama-vocab.cpp's SOLAR_OPEN); no other converter writes it


def solar_open_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """SolarOpenModel (conversion/glm.py: Glm4MoeModel's keys and tensors under glm4moe, its own vocabulary)
    read back into transformers' SolarOpenConfig: the base keys, key_length (head_dim), expert_count
    (n_routed_experts), expert_feed_forward_length, expert_shared_count, the group keys (n_group, topk_group),
    expert_weights_scale and _norm, sigmoid gating; feed_forward_length (the release's unused
    intermediate_size) ignored, as SolarOpenConfig has none.

    llama.cpp's glm4moe loader and graph run it as transformers' Solar Open does: Llama's attention with
    the q/k/v biases the file has and NeoX RoPE over rope.dimension_count channels, the post-attention
    norm, then sigmoid + bias group-limited routing plus the shared MLP on every layer. What they would run
    otherwise is refused by name: a rotation over part of each head (the converter's default where
    config.json names no partial_rotary_factor: half; Solar rotates the whole, its release says 1.0),
    dense leading layers and q/k norms (SolarOpenConfig builds neither), another gating function, and
    YaRN attention or extrapolation factors (the release has neither)."""
    where = f"{meta.model.path}: a Solar Open GGUF (glm4moe with the solar-open pre-tokenizer)"
    require_gating(meta, where, "Solar Open")
    config = _common_config(meta, arch)
    layers = config["num_hidden_layers"]
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    if (rotary := meta.int("rope.dimension_count", head_dim // 2)) != head_dim:
        raise UnsupportedArchitectureError(
            f"{where} rotating {rotary} of each head's {head_dim} channels; transformers' Solar Open rotates the "
            "whole head (SolarOpenModel writes half where config.json names no partial_rotary_factor: reconvert "
            "with the release's partial_rotary_factor 1.0)")
    if meta.int("leading_dense_block_count", 0) or {i for i in _expert_layers(meta.model) if i < layers} != set(range(layers)):
        raise UnsupportedArchitectureError(f"{where} with dense layers; Solar Open has experts on every layer")
    if _has(meta.model, "attn_q_norm.weight") or _has(meta.model, "attn_k_norm.weight"):
        raise UnsupportedArchitectureError(f"{where} with q/k norms; Solar Open's attention has none")
    for key in ("rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor"):
        if meta.get(key) is not None:
            raise UnsupportedArchitectureError(f"{where} with {meta.arch}.{key}; ft reads Solar Open's YaRN by its "
                                               "factor, original context and betas only")
    rope = {"rope_type": "default", "rope_theta": config.pop("rope_theta"), "partial_rotary_factor": 1.0}
    if (scaling := config.pop("rope_scaling", None)) is not None:  # (linear or YaRN: the base converter's)
        rope |= {k: v for k, v in scaling.items() if k not in ("type", "mscale", "mscale_all_dim")}
    config.update(
        model_type="solar_open",
        architectures=["SolarOpenForCausalLM"],
        head_dim=head_dim,
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=meta.int("expert_shared_count"),  # (the loader requires it)
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        rope_parameters=rope,
        attention_bias=_has(meta.model, "attn_q.bias"),
    )
    return config

def dots1_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Dots1Model.set_gguf_parameters (Qwen2MoeModel's keys and _sigmoid_moe's); llama.cpp's dots1
    graph has no sliding window."""
    config = _sigmoid_moe(meta, _common_config(meta, arch))
    config.update(sliding_window=None, scoring_func="noaux_tc")
    return config


def granite_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
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


def ernie4_5_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Ernie4_5MoeModel.set_gguf_parameters: expert_count and expert_used_count from moe_num_experts
    and moe_k, leading_dense_block_count (moe_layer_start_index), interleave_moe_layer_step
    (moe_layer_interval), expert_feed_forward_length, expert_shared_count; feed_forward_length is
    the dense layers' width. moe_layer_end_index is not written: the last layer with experts.
    moe_norm_min is not written either: Ernie4_5_MoeConfig's 1e-12."""
    config = _common_config(meta, arch)
    moe = _expert_layers(meta.model)
    config.update(
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        moe_num_experts=meta.int("expert_count"),
        moe_k=meta.int("expert_used_count"),
        moe_num_shared_experts=meta.int("expert_shared_count", 0),
        moe_layer_start_index=meta.int("leading_dense_block_count", moe[0] if moe else 0),
        moe_layer_end_index=moe[-1] if moe else -1,
        moe_layer_interval=meta.int("interleave_moe_layer_step", 1),
        moe_norm_min=1e-12,
        use_bias=_has(meta.model, "attn_q.bias"),
    )
    if meta.get("attention.key_length") is not None:
        config["head_dim"] = meta.int("attention.key_length")
    return config


def minimax_m2_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """MiniMaxM2Model.set_gguf_parameters: the base keys (key_length from head_dim, expert_count from
    num_local_experts, expert_gating_func from scoring_func), expert_feed_forward_length (its
    intermediate_size, the experts' width) and rope.dimension_count (rotary_dim). Routing is
    sigmoid with the correction bias, the top-k weights always renormalized (llama.cpp's graph and
    transformers' alike)."""
    require_gating(meta, f"{meta.model.path}: a minimax-m2 GGUF", "MiniMax-M2")
    config = _common_config(meta, arch)
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    width_key = next((k for k in ("expert_feed_forward_length", "feed_forward_length") if meta.get(k) is not None), None)
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int(width_key) if width_key else meta.int("feed_forward_length", _expert_size(meta.model)),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        rotary_dim=meta.int("rope.dimension_count", head_dim),
        use_qk_norm=_has(meta.model, "attn_q_norm.weight"),
        scoring_func="sigmoid",
        use_routing_bias=_has(meta.model, "exp_probs_b.bias"),
    )
    return config


def hunyuan_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """HunYuanMoEModel.set_gguf_parameters: the base keys (head_count, key_length from head_dim, ...),
    expert_feed_forward_length (the experts' width, moe_intermediate_size's one value),
    expert_shared_feed_forward_length (the shared MLP's, intermediate_size), expert_used_count
    (moe_topk's one value), expert_shared_count; rope.freq_base with the NTK alpha already in it.
    Routing is a softmax top-k, renormalized (llama.cpp's graph and transformers' alike)."""
    config = _common_config(meta, arch)
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    shared = meta.int("expert_shared_feed_forward_length", width)
    if shared != width:
        raise UnsupportedArchitectureError(f"{meta.model.path}: a hunyuan-moe GGUF whose shared MLP ({shared}) and "
                                           f"experts ({width}) differ in width; ft reads Hunyuan's one intermediate_size")
    if meta.int("expert_shared_count", 1) != 1:
        raise UnsupportedArchitectureError(f"{meta.model.path}: a hunyuan-moe GGUF with {meta.get('expert_shared_count')} "
                                           "shared MLPs; Hunyuan has one")
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=width,
        num_experts=meta.int("expert_count"),
        moe_topk=meta.int("expert_used_count"),
        rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"]},
        attention_bias=_has(meta.model, "attn_q.bias"),
        use_qk_norm=True,
    )
    return config


def _deltanet_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Qwen3NextModel's keys (with Qwen2MoeModel's and the base's), which Qwen3.5's file shares: the
    DeltaNet's sizes as ssm.* (conv_kernel, state_size the key head dim, group_count the key heads,
    time_step_rank the value heads, inner_size all value heads' width), full_attention_interval
    (every n-th layer full attention), rope.dimension_count (the rotated channels of a head). MTP
    blocks (nextn) are left out."""
    config = _common_config(meta, arch)
    where = f"{meta.model.path}: GGUF metadata"
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    value_heads = config_int("ssm.time_step_rank", meta.int("ssm.time_step_rank"), where=where)
    inner = config_int("ssm.inner_size", meta.int("ssm.inner_size"), where=where)
    if inner % value_heads:
        raise SourceError(f"{where} ssm.inner_size {inner} is no whole number of {value_heads} value heads")
    interval = config_int("full_attention_interval", meta.int("full_attention_interval", 4), where=where)
    rotated = config_int("rope.dimension_count", meta.int("rope.dimension_count", head_dim // 4), high=head_dim,
                         where=where)
    layers = config["num_hidden_layers"]
    config.update(
        head_dim=head_dim,
        linear_conv_kernel_dim=meta.int("ssm.conv_kernel"),
        linear_key_head_dim=meta.int("ssm.state_size"),
        linear_num_key_heads=meta.int("ssm.group_count"),
        linear_num_value_heads=value_heads,
        linear_value_head_dim=inner // value_heads,
        layer_types=["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)],
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        shared_expert_intermediate_size=meta.int("expert_shared_feed_forward_length", 0) or None,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        rope_parameters={"rope_type": "default", "rope_theta": config["rope_theta"],
                         "partial_rotary_factor": rotated / head_dim},
        attention_bias=False,
    )
    return config


def qwen35moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Qwen3_5MoeTextModel: Qwen3-Next's keys (_deltanet_config) and rope.dimension_sections (M-RoPE,
    equal positions for text). Its value heads come in llama.cpp's tiled order
    (_LinearAttentionVReorderBase), which the runtime reads as such."""
    config = _deltanet_config(meta, arch)
    sections = meta.get("rope.dimension_sections")
    if isinstance(sections, list) and all(isinstance(v, int) for v in sections):
        config["rope_parameters"].update(mrope_section=[v for v in sections if v][:3], mrope_interleaved=True)
    config["linear_value_head_order"] = "tiled"
    return config


def qwen3next_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Qwen3NextModel (_deltanet_config): value heads grouped by key head, as transformers has them;
    the top-k weights always renormalized (llama.cpp's graph, the release's norm_topk_prob); dense
    MLP layers where a layer has no experts (Qwen3-MoE's mlp_only_layers)."""
    config = _deltanet_config(meta, arch)
    moe = set(_expert_layers(meta.model))
    config.update(norm_topk_prob=True, decoder_sparse_step=1,
                  mlp_only_layers=[i for i in range(config["num_hidden_layers"]) if i not in moe])
    if meta.get("feed_forward_length") is not None:
        config["intermediate_size"] = meta.int("feed_forward_length")
    return config


# What llama.cpp's gpt-oss graph computes and no GGUF key says: the clamped SwiGLU's alpha and limit
# (ggml_swiglu_oai(..., 1.702, 7.0), the released GptOssConfig's swiglu_limit 7.0) and YaRN without
# truncation (the release's rope_scaling truncate false)
GPT_OSS_SWIGLU_ALPHA, GPT_OSS_SWIGLU_LIMIT = 1.702, 7.0


def gpt_oss_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """GptOssModel.set_gguf_parameters: the base keys (feed_forward_length and expert_feed_forward_length
    both the experts' width, key_length from head_dim, YaRN's factor, original context and betas),
    attention.sliding_window. Sliding and full layers alternate, sliding first (llama.cpp's
    swa pattern 2, GptOssConfig's layer_types); every layer is a MoE."""
    config = _common_config(meta, arch)
    layers = config["num_hidden_layers"]
    width_key = next((k for k in ("expert_feed_forward_length", "feed_forward_length") if meta.get(k) is not None), None)
    rope = config.pop("rope_scaling", None)
    if rope is not None:
        rope = {**rope, "truncate": False}
        rope.pop("type", None)
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=meta.int(width_key) if width_key else _expert_size(meta.model),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        sliding_window=meta.int("attention.sliding_window"),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        attention_bias=True,
        swiglu_limit=GPT_OSS_SWIGLU_LIMIT,
        swiglu_alpha=GPT_OSS_SWIGLU_ALPHA,
        rope_scaling=rope,
    )
    return config


def dbrx_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """DbrxModel.set_gguf_parameters, in DBRX's own config layout: context_length (max_seq_len),
    feed_forward_length (ffn_config.ffn_hidden_size, the experts' width), head_count_kv
    (attn_config.kv_n_heads), rope.freq_base and attention.clamp_kqv (attn_config's rope_theta and
    clip_qkv), expert_count and expert_used_count (moe_num_experts, moe_top_k). llama.cpp's dbrx graph
    renormalizes the top-k weights to sum 1: the released moe_normalize_expert_weights, 1."""
    common = _common_config(meta, arch)
    if "rope_scaling" in common:
        raise SourceError(f"{meta.model.path}: a dbrx GGUF with RoPE scaling; DBRX has none")
    width_key = next((k for k in ("expert_feed_forward_length", "feed_forward_length") if meta.get(k) is not None), None)
    config = {k: common[k] for k in ("architectures", "model_type", "vocab_size", "tie_word_embeddings", "bos_token_id",
                                     "eos_token_id")}
    config.update(
        d_model=common["hidden_size"],
        n_heads=common["num_attention_heads"],
        n_layers=common["num_hidden_layers"],
        max_seq_len=common["max_position_embeddings"],
        attn_config={"kv_n_heads": common["num_key_value_heads"], "clip_qkv": meta.float("attention.clamp_kqv"),
                     "rope_theta": common["rope_theta"]},
        ffn_config={"ffn_hidden_size": meta.int(width_key) if width_key else meta.int("feed_forward_length", _expert_size(meta.model)),
                    "moe_num_experts": meta.int("expert_count"), "moe_top_k": meta.int("expert_used_count"),
                    "moe_normalize_expert_weights": 1.0, "ffn_act_fn": {"name": "silu"}},
    )
    return config
