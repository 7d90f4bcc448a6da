"""The Hugging Face config of DeepSeek's newer GGUF architectures (deepseek32, deepseek4) and of Tencent Hy4's
(hy_v4, DeepseekV2Model's MLA and MoE), each builder following what
llama.cpp's converter (named in its docstring, at llama.cpp 0c1e570) writes and how its loader and graph
read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import SQRT_SOFTPLUS, Meta, _common_config, _expert_size, deepseek2_config, require_gating
from .gguf_config_more import _no_yarn_factors

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture

DSV4_COMPRESS_RATIOS = (0, 4, 128)  # what llama.cpp's deepseek4 loader builds: sliding, CSA, HCA


def _uniform(meta: Meta, key: str, layers: int) -> float | None:
    """A per-layer float key (or one float) that must be one value on every layer: that value."""
    value = meta.get(key)
    values = value[:layers] if isinstance(value, list) else [value]
    if value is None:
        return None
    if len(set(values)) != 1:
        raise UnsupportedArchitectureError(f"{meta.model.path}: a deepseek4 GGUF with {meta.arch}.{key} {value!r}, "
                                           "differing by layer; DeepSeek-V4 has one swiglu_limit")
    return meta.float(key) if not isinstance(value, list) else float(values[0])


def deepseek32_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """DeepseekV32Model over DeepseekV2Model (conversion/deepseek.py:464): deepseek2's keys (deepseek2_config:
    MLA, the kv_b split, the dense lead, the experts, group-limited routing, the correction bias, the shared
    experts, the YaRN with its yarn_log_multiplier), nextn_predict_layers with the MTP blocks written after
    the last layer (dropped), and the DSA indexer's attention.indexer.head_count, key_length and top_k: an
    indexer on every layer. llama.cpp's deepseek32 graph runs MLA with interleaved RoPE, the indexer's rotated
    channels (its heads' first) as halves (LLAMA_ROPE_TYPE_NEOX) and its key LayerNorm at 1e-6, as
    transformers' DeepseekV32 does. Its loader requires expert_gating_func, which the converter writes from the
    release's scoring_func: anything but sigmoid is refused (DeepSeek-V3.2 routes by sigmoid)."""
    where = f"{meta.model.path}: a deepseek32 GGUF"
    require_gating(meta, where, "DeepSeek-V3.2", required=True, why=", and llama.cpp's loader requires the key")
    config = deepseek2_config(meta, arch)
    for key in ("scoring_func", "topk_method", "rope_interleave", "moe_layer_freq"):
        config.pop(key)
    index_dim = meta.int("attention.indexer.key_length")
    if index_dim < config["qk_rope_head_dim"]:
        raise SourceError(f"{where} whose indexer heads ({index_dim}) are narrower than the rope "
                          f"({config['qk_rope_head_dim']}); llama.cpp asserts them wider")
    config.update(model_type=arch.model_type, architectures=[arch.hf_architecture],
                  index_n_heads=meta.int("attention.indexer.head_count"), index_head_dim=index_dim,
                  index_topk=meta.int("attention.indexer.top_k"))
    return config


def deepseek4_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """DeepseekV4Model.set_gguf_parameters (conversion/deepseek.py:525, with TextModel's base keys), read back
    into the release's config (the keys DeepseekV4Config reads from it): key_length head_dim,
    rope.dimension_count qk_rope_head_dim, attention.q_lora_rank, output_lora_rank and output_group_count,
    sliding_window, compress_ratios (one a layer: 0 sliding, 4 CSA, 128 HCA) and compress_rope_freq_base,
    the indexer's head_count, key_length and top_k, hyper_connection.count, sinkhorn_iterations and epsilon,
    hash_layer_count, expert_feed_forward_length, expert_shared_count, expert_weights_scale
    (routed_scaling_factor), expert_weights_norm, expert_gating_func (sqrtsoftplus, from scoring_func),
    swiglu_clamp_exp and _shexp (swiglu_limit a layer), the base's rope.freq_base and YaRN keys (the release's
    flat rope_scaling, which llama.cpp's graph applies on the compressed layers only, its cos/sin unscaled:
    dsv4_rope_attn_factor, transformers' attention_factor 1). The main file holds no MTP block (the converter
    skips them without --mtp); an --mtp draft file (its blocks and the head only) is refused by name.

    What llama.cpp runs and DeepSeek-V4 cannot is refused by name: another gating function (the loader
    refuses it too), unrenormalized weights (transformers always renormalizes), a clamp that differs by layer
    or between routed and shared experts, more than one shared expert (transformers builds one), and
    compress ratios the loader does not build."""
    where = f"{meta.model.path}: a deepseek4 GGUF"
    if meta.int("nextn_predict_layers", 0) and "blk.0.attn_norm.weight" not in meta.model.tensors:
        raise UnsupportedArchitectureError(f"{where} holding only its MTP draft blocks (convert_hf_to_gguf --mtp); "
                                           "pull the model's main file")
    config = _common_config(meta, arch)
    layers = config["num_hidden_layers"]
    require_gating(meta, where, "DeepSeek-V4", SQRT_SOFTPLUS, required=True, why=", as llama.cpp's loader requires")
    if not meta.get("expert_weights_norm", False):
        raise UnsupportedArchitectureError(f"{where} without expert_weights_norm: llama.cpp would weigh the chosen "
                                           "experts unrenormalized, which DeepSeek-V4 (always renormalized) cannot")
    if (shared := meta.int("expert_shared_count")) != 1:
        raise UnsupportedArchitectureError(f"{where} with expert_shared_count {shared}; DeepSeek-V4 has one "
                                           "shared expert")
    limit = _uniform(meta, "swiglu_clamp_exp", layers)
    shared_limit = _uniform(meta, "swiglu_clamp_shexp", layers)
    if limit is None or limit <= 0 or shared_limit not in (None, limit):
        raise UnsupportedArchitectureError(f"{where} with swiglu_clamp_exp {meta.get('swiglu_clamp_exp')!r} and "
                                           f"swiglu_clamp_shexp {meta.get('swiglu_clamp_shexp')!r}; DeepSeek-V4 clamps "
                                           "routed and shared experts at one positive swiglu_limit")
    ratios = meta.get("attention.compress_ratios")
    if not isinstance(ratios, list) or len(ratios) < layers or not all(isinstance(r, int) for r in ratios):
        raise SourceError(f"{where} without attention.compress_ratios for each of its {layers} layers ({ratios!r})")
    if unknown := sorted({r for r in ratios[:layers] if r not in DSV4_COMPRESS_RATIOS}):
        raise UnsupportedArchitectureError(f"{where} with compress ratios {unknown}; llama.cpp's loader builds "
                                           f"{', '.join(map(str, DSV4_COMPRESS_RATIOS))} only")
    rope = config.pop("rope_scaling", None)
    if rope is not None and rope["type"] != "yarn":
        raise UnsupportedArchitectureError(f"{where} with {rope['type']} RoPE scaling; DeepSeek-V4 takes YaRN on "
                                           "its compressed layers only")
    head_dim = meta.int("attention.key_length")
    config.update(
        head_dim=head_dim,
        qk_rope_head_dim=meta.int("rope.dimension_count", head_dim),
        q_lora_rank=meta.int("attention.q_lora_rank"),
        o_lora_rank=meta.int("attention.output_lora_rank"),
        o_groups=meta.int("attention.output_group_count"),
        sliding_window=meta.int("attention.sliding_window"),
        compress_ratios=list(ratios[:layers]),
        compress_rope_theta=meta.float("attention.compress_rope_freq_base"),
        index_n_heads=meta.int("attention.indexer.head_count"),
        index_head_dim=meta.int("attention.indexer.key_length"),
        index_topk=meta.int("attention.indexer.top_k"),
        hc_mult=meta.int("hyper_connection.count"),
        hc_sinkhorn_iters=meta.int("hyper_connection.sinkhorn_iterations"),
        hc_eps=meta.float("hyper_connection.epsilon"),
        num_hash_layers=meta.int("hash_layer_count"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=shared,
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=True,
        scoring_func="sqrtsoftplus",
        swiglu_limit=limit,
    )
    if rope is not None:  # (the release's flat form: DeepseekV4Config makes it the compressed layers' YaRN)
        config["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_type"}
    return {k: v for k, v in config.items() if v is not None}


def hy_v4_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """HYV4Model over DeepseekV2Model (conversion/hy_v4.py:24): deepseek2's keys (deepseek2_config: MLA, the kv_b
    split, leading_dense_block_count from mlp_layer_types' leading dense run, read back into mlp_layer_types,
    the experts, group-limited routing where n_group and topk_group are not both 1, the correction bias, the
    shared experts), expert_gating_func always sigmoid, swiglu_clamp_exp one a layer (the routed experts'
    swiglu_limit; written only when positive), hyper_connection.count, epsilon and magnitude (hc_mult, hc_eps,
    hc_magnitude) and the DSA indexer's attention.indexer.head_count, key_length, top_k and types (one bool a
    layer, "full" where true: indexer_types). The MTP layers are not written. llama.cpp's hy-v4.cpp rotates
    adjacent pairs (MLA's and the indexer's last qk_rope_head_dim channels), norms the indexer's key at
    rms_norm_eps and scales the softmax by 1/sqrt(key length) alone, as transformers' HYV4 does without YaRN's
    mscale_all_dim.

    What llama.cpp runs and Hy4 cannot is refused by name: another gating function, no DSA indexer (llama.cpp's
    full attention; HYV4Attention always indexes), routed experts unclamped or clamped differently by layer, a
    clamp on the shared experts, and YaRN with a yarn_log_multiplier (which the loader ignores while
    transformers folds mscale_all_dim into the softmax) or with ext/attn factors."""
    where = f"{meta.model.path}: a hy_v4 GGUF"
    require_gating(meta, where, "Hy4", required=True, why=", which its converter always writes")
    config = deepseek2_config(meta, arch)
    for key in ("scoring_func", "topk_method", "rope_interleave", "moe_layer_freq", "num_nextn_predict_layers"):
        config.pop(key)
    layers = config["num_hidden_layers"]
    dense = min(config.pop("first_k_dense_replace"), layers)
    if not meta.int("attention.indexer.top_k", 0):
        raise UnsupportedArchitectureError(f"{where} without a DSA indexer (attention.indexer.top_k): llama.cpp "
                                           "attends to every token there, while transformers' Hy4 always indexes")
    types = meta.get("attention.indexer.types")
    if not isinstance(types, list) or len(types) != layers or not all(isinstance(t, (bool, int)) for t in types):
        raise SourceError(f"{where} whose attention.indexer.types is not one flag for each of its {layers} layers "
                          f"({types!r})")
    if not types[0]:
        raise UnsupportedArchitectureError(f"{where} whose first layer shares an indexer selection no layer made; "
                                           "llama.cpp's loader refuses it too")
    rope_dim, index_dim = config["qk_rope_head_dim"], meta.int("attention.indexer.key_length")
    if index_dim <= rope_dim:
        raise SourceError(f"{where} whose indexer heads ({index_dim}) are no wider than the rope ({rope_dim})")
    clamp = meta.get("swiglu_clamp_exp")
    limits = {float(v) for v in (clamp[:layers] if isinstance(clamp, list) else [clamp]) if v is not None}
    if len(limits) != 1 or min(limits) <= 0:
        raise UnsupportedArchitectureError(f"{where} with swiglu_clamp_exp {clamp!r}: Hy4 clamps every routed expert "
                                           "at one positive swiglu_limit (HYV4Experts clamps even at 0 or below)")
    shared = meta.get("swiglu_clamp_shexp")
    if any(float(v) > 0 for v in (shared if isinstance(shared, list) else [shared or 0.0])):
        raise UnsupportedArchitectureError(f"{where} with swiglu_clamp_shexp {shared!r}; Hy4 clamps its routed "
                                           "experts only")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    if (scaling := config.pop("rope_scaling", None)) is not None:
        if scaling["rope_type"] != "yarn" or "mscale_all_dim" in scaling:
            raise UnsupportedArchitectureError(
                f"{where} with rope.scaling.type {scaling['rope_type']!r} and yarn_log_multiplier "
                f"{meta.get('rope.scaling.yarn_log_multiplier')!r}: llama.cpp's hy_v4 reads no yarn_log_multiplier "
                "and scales its softmax by 1/sqrt(key length) alone, as transformers does only for YaRN without "
                "mscale_all_dim")
        _no_yarn_factors(meta, where)
        rope.update({k: v for k, v in scaling.items() if k != "type"})
    config.update(
        model_type=arch.model_type, architectures=[arch.hf_architecture],
        mlp_layer_types=["dense"] * dense + ["sparse"] * (layers - dense),
        index_n_heads=meta.int("attention.indexer.head_count"), index_head_dim=index_dim,
        index_topk=meta.int("attention.indexer.top_k"),
        indexer_types=["full" if t else "shared" for t in types],
        hc_mult=meta.int("hyper_connection.count"), hc_eps=meta.float("hyper_connection.epsilon"),
        hc_magnitude=meta.float("hyper_connection.magnitude"),
        swiglu_limit=limits.pop(),
        rope_parameters=rope,
    )
    return config
