"""The Hugging Face config of further GGUF architectures (gguf_config.py grew past a sitting), one
builder per architecture, as gguf_config.py's are: each follows what llama.cpp's converter (named in
its docstring, at llama.cpp 0c1e570) writes and gives the config the family's runtime reads, with
llama.cpp's defaults where the file says nothing, and refuses files llama.cpp runs otherwise than the
family's transformers model does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import Meta, _common_config, _expert_size, _f32, _has
from .gguf_config_layered import SIGMOID, _no_rope_scaling

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture


def bailingmoe2_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """SarvamMoEModel.set_gguf_parameters (BailingMoeV2Model's, the base's): key_length from head_dim,
    rope.dimension_count the whole head (Sarvam's override; BailingMoeV2's Ling 2.0 writes part of it),
    feed_forward_length (the dense layers' width), expert_feed_forward_length, expert_shared_count and
    expert_shared_feed_forward_length, leading_dense_block_count (first_k_dense_replace; llama.cpp's
    default 0), expert_weights_scale and _norm (routed_scaling_factor, norm_topk_prob), the group keys,
    expert_gating_func from score_function (llama.cpp will not load a file without it), nextn blocks.
    llama.cpp's graph is GLM-4.5's with RoPE over the whole head, which is how transformers runs
    sarvam_moe; a file rotating part of each head is Ling 2.0, which no ft family runs."""
    where = f"{meta.model.path}: a bailingmoe2 GGUF"
    if meta.get("expert_gating_func") != SIGMOID:
        raise UnsupportedArchitectureError(f"{where} with expert_gating_func {meta.get('expert_gating_func')!r}; "
                                           "Sarvam routes by sigmoid (and llama.cpp loads no file without the key)")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    rotary = meta.int("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise UnsupportedArchitectureError(
            f"{where} rotating {rotary} of {head_dim} channels a head: Ling 2.0 (BailingMoeV2), which ft has no "
            "family for (transformers 5.25 has no model to match it against); Sarvam-30B rotates the whole head")
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    shared = meta.int("expert_shared_count")
    if meta.int("expert_shared_feed_forward_length", width * shared) != width * shared:
        raise SourceError(f"{where} whose shared experts are not {shared} x {width} wide, as Sarvam's are")
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=width,
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_shared_experts=shared,
        first_k_dense_replace=meta.int("leading_dense_block_count", 0),
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),  # llama.cpp's default where absent
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        attention_bias=_has(meta.model, "attn_qkv.bias"),
        use_qk_norm=True,  # llama.cpp's graph requires both norms
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta"), "partial_rotary_factor": 1.0},
    )
    return config


def _rope_factors(meta: Meta, name: str, count: int) -> list[float]:
    """One of Phi3MiniModel's LongRoPE factor tensors (written float32, one a rotated channel pair)."""
    t = meta.model.tensors[name]
    if t.dtype != "f32" or t.shape != (count,):
        raise SourceError(f"{meta.model.path}: {name} is {t.dtype} {list(t.shape)}; Phi3MiniModel writes {count} "
                          "float32 factors, one a rotated channel pair")
    return [_f32(v) for v in meta.model.read_bytes(t).view("<f4")]


def phimoe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """PhiMoeModel.set_gguf_parameters (Phi3MiniModel's): rope.scaling.original_context_length
    (original_max_position_embeddings), feed_forward_length (intermediate_size, the experts' width),
    the rms eps (rms_norm_eps, which Phi-3.5-MoE's LayerNorms use), rope.dimension_count,
    attention.sliding_window (0 for none), expert_count and expert_used_count; LongRoPE's long and
    short factors as the rope_factors_long/short tensors (generate_extra_tensors), with
    rope.scaling.attn_factor: sqrt(1 + ln(s) / ln(original)) for s = context / original, which
    becomes both mscales (the release's short_mscale/long_mscale are not in the file; llama.cpp scales
    by this one factor, which for Phi-3.5-MoE is 1.19 where its config says 1.243). Not in the file
    either, so PhimoeConfig's (and the release's) default: router_jitter_noise 0.01, sparsemixer's eps."""
    where = f"{meta.model.path}: a phimoe GGUF"
    config = _common_config(meta, arch)
    if config.pop("rope_scaling", None) is not None:
        raise UnsupportedArchitectureError(f"{where} with rope.scaling.type {meta.get('rope.scaling.type')!r}; "
                                           "Phi-3.5-MoE's long context is LongRoPE, as rope_factors_long/short")
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise UnsupportedArchitectureError(f"{where} rotating {meta.get('rope.dimension_count')} of {head_dim} "
                                           "channels a head; Phi-3.5-MoE rotates the whole head")
    if meta.int("expert_used_count") != 2:
        raise UnsupportedArchitectureError(f"{where} with expert_used_count {meta.get('expert_used_count')}; ft runs "
                                           "phimoe with transformers' sparsemixer, which chooses two experts")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.pop("rope_theta")}
    factors = [n for n in ("rope_factors_long.weight", "rope_factors_short.weight") if n in meta.model.tensors]
    if factors:
        if len(factors) != 2:
            raise SourceError(f"{where} with {factors[0]} alone; Phi3MiniModel writes both LongRoPE factor tensors")
        original = meta.int("rope.scaling.original_context_length")
        mscale = meta.float("rope.scaling.attn_factor", 1.0)
        rope.update(rope_type="longrope", original_max_position_embeddings=original, short_mscale=mscale,
                    long_mscale=mscale, long_factor=_rope_factors(meta, "rope_factors_long.weight", head_dim // 2),
                    short_factor=_rope_factors(meta, "rope_factors_short.weight", head_dim // 2))
        config["original_max_position_embeddings"] = original
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("feed_forward_length", _expert_size(meta.model)),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=2,
        sliding_window=meta.int("attention.sliding_window", 0) or None,
        attention_bias=_has(meta.model, "attn_q.bias"),
        lm_head_bias="output.bias" in meta.model.tensors,
        router_jitter_noise=0.01,
        rope_parameters=rope,
    )
    return config
