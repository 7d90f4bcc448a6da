"""What each family's config says that the shared converter cannot read alike: which layers hold
experts, how a release's own config keys and tensor names map to transformers' (a config view, a
rename table), each layer's attention sizes, the experts' activation. The family table
(families.py) points at these; a family whose config needs nothing of its own has nothing here."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .config_checks import positive_float
from .errors import SourceError, UnsupportedArchitectureError
from .format import ExpertActivation

AttentionSizes = tuple[int, int, int, int]


def qwen3_moe_layers(c: dict[str, Any]) -> list[int]:
    step = int(c.get("decoder_sparse_step", 1) or 1)
    dense = set(c.get("mlp_only_layers") or [])
    return [i for i in range(c["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


def first_k_dense_layers(c: dict[str, Any]) -> list[int]:
    if isinstance(c.get("mlp_layer_types"), list):
        return [i for i, kind in enumerate(c["mlp_layer_types"]) if kind == "sparse"]
    k = int(c.get("first_k_dense_replace", 0) or 0)
    freq = int(c.get("moe_layer_freq", 1) or 1)
    return [i for i in range(k, c["num_hidden_layers"]) if (i - k) % freq == 0]


def all_layers(c: dict[str, Any]) -> list[int]:
    return list(range(c["num_hidden_layers"]))


def jetmoe_view(c: dict[str, Any]) -> dict[str, Any]:
    """JetMoE's query heads where config.json leaves them out: JetMoeConfig derives them, one per
    key head and routed attention expert (num_key_value_heads x num_experts_per_tok)."""
    if c.get("num_attention_heads") is not None:
        return {}
    kv_heads, top_k = c.get("num_key_value_heads", 16), c.get("num_experts_per_tok", 2)
    if not (isinstance(kv_heads, int) and isinstance(top_k, int)):
        raise SourceError(f"config.json of this jetmoe model: num_key_value_heads {kv_heads!r} and "
                          f"num_experts_per_tok {top_k!r} must be integers")
    return {"num_attention_heads": kv_heads * top_k}


def dbrx_view(c: dict[str, Any]) -> dict[str, Any]:
    """DBRX's config under the usual names: d_model, n_heads, n_layers and max_seq_len at the top,
    kv_n_heads and rope_theta in attn_config, the MoE sizes in ffn_config (those left out take
    DbrxAttentionConfig's and DbrxFFNConfig's defaults, as transformers fills them in). The rope
    base is attn_config's, where the released configs set it (transformers 5 reads only a
    top-level one: runtime/models/dbrx.py)."""
    attn, ffn = c.get("attn_config", {}), c.get("ffn_config", {})
    for key, sub in (("attn_config", attn), ("ffn_config", ffn)):
        if not isinstance(sub, dict):
            raise SourceError(f"config.json: {key} is {sub!r}, not an object; the checkpoint's config is damaged")
    missing = [key for key in ("n_layers", "d_model", "n_heads") if c.get(key) is None]
    if missing:
        raise SourceError(f"config.json of this dbrx model lacks {', '.join(map(repr, missing))}")
    view = {"num_hidden_layers": c.get("n_layers"), "hidden_size": c.get("d_model"), "num_attention_heads": c.get("n_heads"),
            "max_position_embeddings": c.get("max_seq_len"), "num_key_value_heads": attn.get("kv_n_heads", 1),
            "num_local_experts": ffn.get("moe_num_experts", 4), "num_experts_per_tok": ffn.get("moe_top_k", 1),
            "intermediate_size": ffn.get("ffn_hidden_size", 3584)}
    if attn.get("rope_theta") is not None:
        view["rope_parameters"] = {"rope_type": "default", "rope_theta": attn["rope_theta"]}
    return view


def ernie_moe_layers(c: dict[str, Any]) -> list[int]:
    """Every `moe_layer_interval`-th layer from `moe_layer_start_index` to `moe_layer_end_index`
    (-1: the last), as Ernie4_5_MoeConfig's defaults (1, -1, 1) fill them in."""
    n = c["num_hidden_layers"]
    start, end = int(c.get("moe_layer_start_index", 1)), int(c.get("moe_layer_end_index", -1))
    interval = int(c.get("moe_layer_interval", 1))
    if interval < 1:
        raise ValueError("moe_layer_interval below 1")  # (normalized_config names the config damaged)
    end = n - 1 if end == -1 else end
    return [i for i in range(n) if (i + 1) % interval == 0 and start <= i <= end]


def jamba_moe_layers(c: dict[str, Any]) -> list[int]:
    """Every `expert_layer_period`-th layer from `expert_layer_offset` (JambaConfig's 2 and 1), none
    where there is one expert (JambaConfig.layers_num_experts: a dense MLP then)."""
    period = int(c.get("expert_layer_period", 2))
    offset = int(c.get("expert_layer_offset", 1))
    if period < 1:
        raise ValueError("expert_layer_period below 1")  # (normalized_config names the config damaged)
    if int(c.get("num_experts", 16)) <= 1:
        return []
    return [i for i in range(c["num_hidden_layers"]) if i % period == offset]


def llama4_moe_layers(c: dict[str, Any]) -> list[int]:
    """`moe_layers`, else Llama4TextConfig's default: every `interleave_moe_layer_step`-th layer."""
    if isinstance(c.get("moe_layers"), list):
        return sorted({int(i) for i in c["moe_layers"]})
    step = int(c.get("interleave_moe_layer_step", 1) or 1)
    return list(range(step - 1, c["num_hidden_layers"], step))


def glm4_moe_lite_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else Glm4MoeLiteConfig's default: the first layer dense, the rest MoE
    (transformers reads no first_k_dense_replace or moe_layer_freq for this family; MiMo-V2-Flash's
    and Laguna's defaults are the same)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": 1, "moe_layer_freq": 1})


def deepseek_v32_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (DeepseekV32Config's
    default 3), the rest MoE (transformers reads no moe_layer_freq for this family)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 3), "moe_layer_freq": 1})


def dense_prefix_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (default 0), the rest
    MoE, as Cohere2MoeConfig derives them (no moe_layer_freq)."""
    return first_k_dense_layers({**c, "moe_layer_freq": 1})


def after_dense_layers(c: dict[str, Any]) -> list[int]:
    """The layers from `num_dense_layers` on (AfmoeConfig's default 1): the first ones are dense."""
    return list(range(int(c.get("num_dense_layers", 1) or 0), c["num_hidden_layers"]))


def lfm2_moe_layers(c: dict[str, Any]) -> list[int]:
    """The layers from `num_dense_layers` on (Lfm2MoeConfig's default 2)."""
    return after_dense_layers({**c, "num_dense_layers": c.get("num_dense_layers", 2)})


def mimo_v2_flash_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """MiMo-V2-Flash's sliding layers have twice the key-value heads of its full ones; values are
    `v_head_dim` wide (MiMoV2FlashConfig's 128), keys `head_dim` (192). The layer schedule as
    runtime/models/mimo_v2_flash.py reads it."""
    n, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv, head_dim, v_dim = int(c["num_key_value_heads"]), int(c.get("head_dim") or 192), int(c.get("v_head_dim") or 128)
    types = c.get("layer_types") or ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention"
                                     for i in range(n)]
    return [(heads, kv * (2 if kind == "sliding_attention" else 1), head_dim, v_dim) for kind in types]


def laguna_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Laguna's query heads, layer by layer (`num_attention_heads_per_layer`); the key-value heads
    and head_dim are every layer's."""
    n, kv, head_dim = int(c["num_hidden_layers"]), int(c["num_key_value_heads"]), int(c.get("head_dim") or 128)
    heads = c.get("num_attention_heads_per_layer") or [c["num_attention_heads"]] * n
    return [(int(h), kv, head_dim, head_dim) for h in heads]


def kimi_linear_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (KimiLinearConfig's
    default 1), the rest MoE (no moe_layer_freq)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


def kimi_linear_sizes(c: dict[str, Any]) -> tuple[int, int]:
    """Kimi Linear's KDA (heads, head_dim): `linear_num_heads`/`linear_head_dim` (KimiLinearConfig's
    32 and 128), the release's `linear_attn_config` over them, as KimiLinearConfig reads them."""
    sub = c.get("linear_attn_config") or {}
    return int(sub.get("num_heads", c.get("linear_num_heads") or 32)), int(sub.get("head_dim", c.get("linear_head_dim") or 128))


def kimi_linear_layer_types(c: dict[str, Any]) -> list[str]:
    """`layer_types`; else the release's `linear_attn_config` (full_attn_layers and kda_layers,
    numbered from 1); else KimiLinearConfig's: full attention on every 4th layer from layer 4,
    KDA ("linear_attention") elsewhere. ValueError for a schedule it cannot read."""
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types")
    sub = c.get("linear_attn_config") or {}
    if types is None and "full_attn_layers" in sub and "kda_layers" in sub:
        types = [None] * n
        for layer in sub["full_attn_layers"]:
            types[int(layer) - 1] = "full_attention"
        for layer in sub["kda_layers"]:
            types[int(layer) - 1] = "linear_attention"
    if types is None:
        types = ["full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - {"full_attention", "linear_attention"}:
        raise ValueError(f"unsupported kimi_linear layer_types {str(types)[:80]} for {n} layers")
    return list(types)


# LaraMiniConfig's layer schedule where config.json names none (the release's, period 5)
LARA_MINI_PATTERN = ("linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention")


def lara_mini_layer_types(c: dict[str, Any]) -> list[str]:
    """`layer_types`, else LaraMiniConfig's: LARA_MINI_PATTERN repeated. ValueError for a schedule
    of other kinds or another length."""
    n = int(c["num_hidden_layers"])
    types = c.get("layer_types") or [LARA_MINI_PATTERN[i % len(LARA_MINI_PATTERN)] for i in range(n)]
    if not isinstance(types, list) or len(types) != n or set(types) - set(LARA_MINI_PATTERN):
        raise ValueError(f"unsupported lara_mini layer_types {str(types)[:80]} for {n} layers")
    return list(types)


# KimiLinearConfig's and BailingHybridConfig's attribute_map: the usual key -> the name their
# config.json (the releases', and transformers' saves) writes
LING_NAMES = {"max_position_embeddings": "model_max_length", "norm_topk_prob": "moe_renormalize",
               "n_group": "num_expert_group", "num_local_experts": "num_experts",
               "num_experts_per_tok": "num_experts_per_token", "n_shared_experts": "num_shared_experts"}


def kimi_linear_view(c: dict[str, Any]) -> dict[str, Any]:
    """Kimi Linear's config under the usual names (LING_NAMES), where it writes its own."""
    return {key: c[name] for key, name in LING_NAMES.items() if c.get(name) is not None and key not in c}


bailing_hybrid_view = kimi_linear_view  # (the same attribute_map, beside num_mtp_layers, which nothing reads)


def bailing_hybrid_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (BailingHybridConfig's
    default 2), the rest MoE (no moe_layer_freq)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 2), "moe_layer_freq": 1})


def bailing_hybrid_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Ling's KDA layers: `num_attention_heads` heads of `linear_head_dim` (transformers' saves),
    else of `head_dim` (the release's, BailingHybridConfig's 128); its MLA layers have no k_proj."""
    heads, head_dim = int(c["num_attention_heads"]), int(c.get("linear_head_dim") or c.get("head_dim") or 128)
    return [(heads, heads, head_dim, head_dim)] * int(c["num_hidden_layers"])


def kimi_linear_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Kimi Linear's KDA layers project q, k and v to their own heads (kimi_linear_sizes); its MLA
    layers have no k_proj to check."""
    heads, head_dim = kimi_linear_sizes(c)
    return [(heads, heads, head_dim, head_dim)] * int(c["num_hidden_layers"])


def exaone_moe_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (ExaoneMoeConfig's
    default 1, not DeepSeek's 0), the rest MoE."""
    return first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


def dense_then_moe_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (default 1, as
    SarvamMoEConfig, Param2MoeConfig and MiniCPM5MoeConfig fill it in), the rest MoE (no moe_layer_freq)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


def sparse_unless_dense_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else every layer MoE (MellumConfig's default)."""
    return first_k_dense_layers({**c, "first_k_dense_replace": 0, "moe_layer_freq": 1})


def flint_layers(c: dict[str, Any]) -> list[int]:
    """Qwen3-MoE's rule (`mlp_only_layers` dense, every `decoder_sparse_step`-th layer MoE), the
    dense layers FlintConfig's [0, 1] where the config names none."""
    only = c.get("mlp_only_layers")
    return qwen3_moe_layers({**c, "mlp_only_layers": [0, 1] if only is None else only})


def beam_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else BeamConfig's: the first three layers dense, the rest MoE."""
    return first_k_dense_layers({**c, "first_k_dense_replace": 3, "moe_layer_freq": 1})


def ergo_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else ErgoConfig's: the first `num_dense_blocks` (default 1) layers dense."""
    return first_k_dense_layers({**c, "first_k_dense_replace": int(c.get("num_dense_blocks", 1)), "moe_layer_freq": 1})


# Ergo's release names (its training framework's), as transformers' conversion_mapping renames them
ERGO_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^tok_embeddings\.", "model.embed_tokens."), (r"^norm\.", "model.norm."), (r"^output\.", "lm_head."),
    (r"^layers\.", "model.layers."), (r"\.attention_norm\.", ".input_layernorm."),
    (r"\.post_attention_norm\.", ".post_attention_layernorm."), (r"\.ffn_norm\.", ".pre_feedforward_layernorm."),
    (r"\.post_ffn_norm\.", ".post_feedforward_layernorm."),
    (r"\.post_attention_residual\.scale$", ".attention_residual_gate.weight"),
    (r"\.post_ffn_residual\.scale$", ".feedforward_residual_gate.weight"),
    (r"\.attention\.wqkv\.", ".self_attn.qkv_proj."), (r"\.attention\.wo\.", ".self_attn.o_proj."),
    (r"\.attention\.(q|k)_norm\.", r".self_attn.\1_norm."),
    (r"\.feed_forward\.up\.", ".mlp.up_proj."), (r"\.feed_forward\.down\.", ".mlp.down_proj."),
    (r"\.feed_forward\.gate_kernel$", ".mlp.gate.linear.weight"),  # ([H, E]: transposed)
    (r"\.feed_forward\.router_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.feed_forward\.up_proj$", ".mlp.experts.up_proj"), (r"\.feed_forward\.down_proj$", ".mlp.experts.down_proj"),
    (r"\.feed_forward\.expert_output_norm\.scale$", ".mlp.experts.post_expert_norm.weight"),
    (r"\.feed_forward\.shared_up_proj$", ".mlp.shared_experts.up_proj.weight"),  # ([H, I]: transposed)
    (r"\.feed_forward\.shared_down_proj$", ".mlp.shared_experts.down_proj.weight"),  # ([I, H]: transposed)
    (r"\.feed_forward\.shared_expert_output_norm\.scale$", ".mlp.shared_experts.norm.weight")))


def axk1_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else AXK1Config's (and AXK2Config's) derivation from the older keys: MoE from
    `first_k_dense_replace` (default 1) on, on every `moe_layer_freq`-th layer counted from 0."""
    if isinstance(c.get("mlp_layer_types"), list):
        return [i for i, kind in enumerate(c["mlp_layer_types"]) if kind == "sparse"]
    k, freq = int(c.get("first_k_dense_replace", 1)), int(c.get("moe_layer_freq", 1))
    return [i for i in range(c["num_hidden_layers"]) if i >= k and i % freq == 0]


# SarvamMoEConfig's and Param2MoeConfig's attribute_map: the usual key -> the name their releases' config.json writes
SARVAM_CONFIG_KEYS = {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts",
                 "attention_bias": "use_qkv_bias"}


def sarvam_moe_view(c: dict[str, Any]) -> dict[str, Any]:
    """Sarvam's and Param2's config under the usual names (SARVAM_CONFIG_KEYS), where it writes its own."""
    return {key: c[name] for key, name in SARVAM_CONFIG_KEYS.items() if c.get(name) is not None and key not in c}


# Sarvam's and Param2's release names, as transformers' conversion_mapping (sarvam_moe, param2moe) renames
# them; the fused attention.query_key_value [q | k | v rows] keeps its name under self_attn (the runtime
# reads it apart: runtime/models/sarvam_moe.py). One row per rename, in order.
SARVAM_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.", ".self_attn."),
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."),
    (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
))


def gpt_oss_activation(c: dict[str, Any]) -> ExpertActivation:
    """GptOssExperts' clamped SwiGLU: `swiglu_alpha` and `swiglu_limit`, GptOssConfig's defaults
    (1.702, 7.0) where the config leaves them out (the released ones give only the limit)."""
    return ExpertActivation("swiglu_clamped", positive_float("swiglu_alpha", c.get("swiglu_alpha", 1.702)),
                            positive_float("swiglu_limit", c.get("swiglu_limit", 7.0)))


# DeepSeek-V4's names, as transformers' conversion_mapping.py (deepseek_v4) renames them and its FP8
# quantizer its `.scale`s; names already transformers' pass unchanged. One row per rename, in order.
DEEPSEEK_V4_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    # the release's FP8 and FP4 block scales (layers.0.attn.wq_a.scale), not the hyper-connections' scale
    (r"^(?!.*_hc\.scale$)(.+)\.scale$", r"\1.weight_scale_inv"),
    # the release's top level (no model. prefix), and transformers' own saves of it (model. but on the head)
    (r"^(?:model\.)?embed\.", "model.embed_tokens."),
    (r"^(?:model\.)?head\.", "lm_head."),
    (r"^norm\.", "model.norm."),
    (r"^(?:model\.)?hc_head_(fn|base|scale)$", r"model.hc_head.hc_\1"),
    (r"^layers\.", "model.layers."),
    # within a layer: its norms and hyper-connections (layers.0.hc_attn_fn -> model.layers.0.attn_hc.fn)
    (r"\.attn_norm\.", ".input_layernorm."),
    (r"\.ffn_norm\.", ".post_attention_layernorm."),
    (r"\.hc_(attn|ffn)_(fn|base|scale)$", r".\1_hc.\2"),
    (r"\.attn\.", ".self_attn."),
    (r"\.ffn\.", ".mlp."),
    # the indexer lives in the compressor (attn.indexer.compressor.wkv -> self_attn.compressor.indexer.kv_proj)
    (r"\.indexer\.compressor\.", ".compressor.indexer."),
    (r"\.indexer\.weights_proj\.", ".compressor.indexer.scorer.weights_proj."),
    (r"\.indexer\.wq_b\.", ".compressor.indexer.q_b_proj."),
    (r"\.attn_sink$", ".sinks"),
    (r"^(model\.layers\..*)\.norm\.", r"\1.kv_norm."),  # (attention's and compressors' kv norms)
    (r"\.ape$", ".position_bias"),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.wq_b\.", ".q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.gate\.bias$", ".gate.e_score_correction_bias"),
    # routed and shared experts: w1 the gate, w3 the up, w2 the down projection
    (r"\.(shared_experts|experts\.[0-9]+)\.w1\.", r".\1.gate_proj."),
    (r"\.(shared_experts|experts\.[0-9]+)\.w2\.", r".\1.down_proj."),
    (r"\.(shared_experts|experts\.[0-9]+)\.w3\.", r".\1.up_proj."),
))


# Kimi K2.5's and K2.6's text model (Kimi_K25ForConditionalGeneration: DeepSeek-V3 under `text_config`,
# beside a vision tower and projector, which are dropped) under DeepSeek-V3's names. One row per rename.
KIMI_K25_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    # the release's (language_model.model.layers.0...); transformers' original-format save writes the
    # layers as `blocks` (its kimi_k25 conversion renames every "blocks" to "layers" on load)
    (r"^language_model\.model\.(?:layers|blocks)\.", "model.layers."),
    (r"^language_model\.model\.", "model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^model\.language_model\.", "model."),  # (transformers' own layout)
))


# a llava-style multimodal checkpoint's text model (Mistral3ForConditionalGeneration's) under the text
# model's own names; the vision tower and projector are dropped. One row per rename.
LLAVA_TEXT_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^language_model\.model\.", "model."),  # (the original format, as the releases and save_pretrained write it)
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^model\.language_model\.", "model."),  # (transformers' own layout, save_original_format=False)
))
LLAVA_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def deepseek_v4_activation(c: dict[str, Any]) -> ExpertActivation:
    """DeepseekV4Experts' SwiGLU of gate and up clamped at `swiglu_limit` (DeepseekV4Config's 10)."""
    return ExpertActivation("swiglu_limited", limit=positive_float("swiglu_limit", c.get("swiglu_limit", 10.0)))


# Tencent Hy4's release names (transformers' conversion_mapping renames them): the hyper-connections under
# hc_pre., the attention's and MLPs' linear_gate (gate_proj; mlp.gate stays the router) and the sinks
HY_V4_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"\.hc_pre\.hc_", ".hc_"), (r"\.learnable_sink_param$", ".sinks"), (r"\.linear_gate\.", ".gate_proj."),
    (r"\.hc_attn_layer\.hc_(fn|base|scale)$", r".attn_hc.\1"), (r"\.hc_mlp_layer\.hc_(fn|base|scale)$", r".ffn_hc.\1"),
    (r"\.hc_head\.hc_head_(fn|base|scale)$", r".hc_head.hc_\1")))


def hy_v4_activation(c: dict[str, Any]) -> ExpertActivation:
    """HYV4Experts' SwiGLU clamped as DeepSeek-V4's at `swiglu_limit` (HYV4Config's 10). A limit at or
    below 0 is refused: HYV4Config says it turns the clamp off, HYV4Experts clamps at it all the same."""
    limit = c.get("swiglu_limit", 10.0)
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit <= 0:
        raise UnsupportedArchitectureError(
            f"hy_v4 with swiglu_limit {limit} is not supported: HYV4Config reads a limit at or below 0 as no clamp, "
            "while transformers' HYV4Experts clamps at it all the same, so there is no reference to match")
    return ExpertActivation("swiglu_limited", limit=positive_float("swiglu_limit", limit))


def hy_v4_indexer_types(c: dict[str, Any]) -> list[str]:
    """Hy4's DSA layers, "full" (its own indexer) or "shared" (the last full layer's selection):
    `indexer_types`, else HYV4Config's schedule (full on layer 0 and every fourth from layer 1)."""
    n = int(c["num_hidden_layers"])
    kinds = c.get("indexer_types")
    return list(kinds) if kinds is not None else ["full" if i == 0 or (i - 1) % 4 == 0 else "shared" for i in range(n)]


def gemma4_layer_types(c: dict[str, Any]) -> list[str]:
    """`layer_types`, else Gemma4TextConfig's 5:1 schedule (every 6th layer full); the last layer
    full whatever they say, as transformers forces it."""
    n = int(c["num_hidden_layers"])
    types = list(c.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
        raise ValueError(f"unsupported gemma4_text layer_types {str(types)[:80]} for {n} layers")
    return types[:-1] + ["full_attention"]


def gemma4_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Gemma 4's attention layer by layer: sliding layers `head_dim` wide with `num_key_value_heads`;
    full ones as `per_layer_config` says (transformers 5.25's save, keyed by layer), else
    `global_head_dim` wide (Gemma4TextConfig's 512) with `num_global_key_value_heads` where
    `attention_k_eq_v` (their values are their keys' projection), as Gemma4TextConfig derives them."""
    heads, kv = int(c["num_attention_heads"]), int(c.get("num_key_value_heads") or c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or 256)
    per_layer = c.get("per_layer_config")
    full: dict[str, Any] = {"head_dim": c.get("global_head_dim") or 512}
    if c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
        full["num_key_value_heads"] = c["num_global_key_value_heads"]
    sizes = []
    for i, kind in enumerate(gemma4_layer_types(c)):
        own = (per_layer.get(str(i)) or {}) if isinstance(per_layer, dict) else full if kind == "full_attention" else {}
        d = int(own.get("head_dim", head_dim))
        sizes.append((heads, int(own.get("num_key_value_heads", kv)), d, d))
    return sizes


def one_activation(family: str, key: str, name: str, kind: str) -> Callable[[dict[str, Any]], ExpertActivation]:
    """A family whose experts run one activation: the config's `key` (default `name`) must say
    `name`, and the bank's activation is `kind` (Gemma 4's gelu_pytorch_tanh: "geglu_tanh";
    Nemotron-H's non-gated relu2: "relu2")."""

    def read(c: dict[str, Any]) -> ExpertActivation:
        act = c.get(key, name)
        if act != name:
            raise UnsupportedArchitectureError(f"{family} with {key} {act!r} has no converter (ft runs its {name} "
                                               "experts)")
        return ExpertActivation(kind)

    return read


def gemma4_dense_reason(c: dict[str, Any]) -> str | None:
    if c.get("enable_moe_block") and c.get("num_experts"):
        return None
    return ("its text config has no MoE block (enable_moe_block is off, num_experts unset): a dense Gemma 4 "
            "(E2B, E4B, 31B), not the 26B-A4B")


# Gemma 4's vision and audio towers and their embedders (Gemma4ForConditionalGeneration's), dropped
# Nemotron-H's layer kinds as NemotronHConfig names them (layers_block_type), from a release's
# hybrid_override_pattern (one character a layer) or the older names transformers remaps
NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
NEMOTRON_H_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def nemotron_h_layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's kind (linear_attention: Mamba2, full_attention, moe, mlp): `layers_block_type`
    (transformers 5's saves) or `layer_types`, else the release's `hybrid_override_pattern`, else
    NemotronHConfig's default; ValueError for one ft cannot read."""
    types = c.get("layers_block_type") or c.get("layer_types")
    if types is None and isinstance(c.get("hybrid_override_pattern"), str):
        types = [NEMOTRON_H_PATTERN.get(ch, ch) for ch in c["hybrid_override_pattern"]]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(types, list):
        raise ValueError(f"layers_block_type is {str(types)[:60]}, not a list")
    types = [NEMOTRON_H_LEGACY.get(t, t) for t in types]
    unknown = sorted({str(t) for t in types} - set(NEMOTRON_H_PATTERN.values()))
    if unknown:
        raise ValueError(f"layer kinds {unknown} are not Nemotron-H's (M, E, *, - of hybrid_override_pattern)")
    return types


def nemotron_h_view(c: dict[str, Any]) -> dict[str, Any]:
    """Nemotron-H's config under the usual names: num_hidden_layers from the layer kinds (transformers
    5 saves none), and its Mamba2 sizes under Granite 4.0 hybrid's names, which layers/mamba2.py and
    the fit read (mamba_num_heads -> mamba_n_heads, ...; NemotronHConfig's defaults and the older
    mamba_* spellings it takes), rms_norm_eps from layer_norm_epsilon."""
    if c.get("moe_latent_size"):
        raise UnsupportedArchitectureError("nemotron_h with a latent MoE (moe_latent_size: Nemotron 3 Super) has no "
                                           "converter yet; ft runs Nemotron-H's MoE on the hidden size")

    def get(*keys: str, default: Any) -> Any:
        return next((c[k] for k in keys if c.get(k) is not None), default)

    return {"num_hidden_layers": len(nemotron_h_layer_types(c)),
            "mamba_n_heads": get("mamba_num_heads", default=128), "mamba_d_head": get("mamba_head_dim", default=64),
            "mamba_n_groups": get("n_groups", "mamba_n_groups", default=8),
            "mamba_d_state": get("ssm_state_size", default=128), "mamba_d_conv": get("conv_kernel", "mamba_d_conv", default=4),
            "mamba_chunk_size": get("chunk_size", "mamba_chunk_size", default=128),
            "time_step_limit": get("time_step_limit", "mamba_dt_limit", default=[0.0, float("inf")]),
            "rms_norm_eps": get("layer_norm_epsilon", default=1e-5)}


def longcat_flash_view(c: dict[str, Any]) -> dict[str, Any]:
    """LongCat-Flash's config under the usual names: num_hidden_layers its `num_layers` (each layer
    holds two attention sublayers and one MoE; transformers saves no num_hidden_layers). Zero
    experts other than the identity are refused."""
    kind = c.get("zero_expert_type", "identity")
    if kind != "identity":
        raise UnsupportedArchitectureError(f"longcat_flash with zero experts of type {kind!r} has no converter; "
                                           "ft runs identity zero experts (LongCat-Flash's)")
    return {"num_hidden_layers": c.get("num_layers", 28)}


def nemotron_h_moe_layers(c: dict[str, Any]) -> list[int]:
    return [i for i, kind in enumerate(nemotron_h_layer_types(c)) if kind == "moe"]


def doge_dense_reason(c: dict[str, Any]) -> str | None:
    return None if c.get("is_moe") else "is_moe is off: a dense Doge (its MLP has no experts)"


def doge_view(c: dict[str, Any]) -> dict[str, Any]:
    """Doge's retrieval experts are one neuron each (DogeCDMoE's down_embed and up_embed rows)."""
    return {"moe_intermediate_size": 1}


# Doge's experts as a bank of one-row experts, not gated: down_embed [E, H] is each expert's input row
# (w13, up_proj [E, 1, H]), up_embed [E, H] its output column (w2, down_proj [E, H, 1]), the same bytes
DOGE_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"\.mlp\.down_embed\.weight$", ".mlp.experts.up_proj"),
    (r"\.mlp\.up_embed\.weight$", ".mlp.experts.down_proj")))


def nemotron_h_dense_reason(c: dict[str, Any]) -> str | None:
    if "moe" in nemotron_h_layer_types(c):
        return None
    return "its layers have no MoE (no E in hybrid_override_pattern: a dense Nemotron-H)"


GEMMA4_TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")
