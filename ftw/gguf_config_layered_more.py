"""More of gguf_config_layered.py: the Hugging Face config of GGUF architectures whose layers come in
kinds (sliding-window and global attention, lightning and softmax attention), one builder per
architecture, each following what llama.cpp's converter (named in its docstring, at llama.cpp
0c1e570) writes and how its loader and graph read it, with llama.cpp's defaults where the file says
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import Meta, _common_config, _expert_layers, _expert_size, _has
from .gguf_config_layered import SIGMOID, _no_rope_scaling

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture

SOFTMAX = 1  # gguf-py ExpertGatingFuncType.SOFTMAX


def _sliding_dense_first(meta: Meta, num_layers: int) -> list[bool]:
    """attention.sliding_window_pattern as load_swa_pattern(ml, 4, dense_first=true) reads it: one bool
    a layer (what the converters write from layer_types), else a period n (a full layer, then n - 1
    sliding ones; 0: all sliding), 4 where absent."""
    where = f"{meta.model.path}: GGUF metadata {meta.arch}.attention.sliding_window_pattern"
    pattern = meta.get("attention.sliding_window_pattern", 4)
    if isinstance(pattern, list):
        if len(pattern) < num_layers or not all(isinstance(v, bool) for v in pattern):
            raise SourceError(f"{where} is not one bool for each of the {num_layers} layers ({pattern!r})")
        return list(pattern[:num_layers])
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
        raise SourceError(f"{where} is neither a period nor one bool a layer ({pattern!r})")
    return [pattern == 0 or i % pattern != 0 for i in range(num_layers)]


def cohere2moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Cohere2MoeModel.set_gguf_parameters (conversion/command_r.py, with the base's): feed_forward_length
    the dense prefix's width (prefix_dense_intermediate_size), expert_feed_forward_length (intermediate_size),
    logit_scale, attention.sliding_window and sliding_window_pattern (one bool a layer from layer_types),
    leading_dense_block_count (the dense lead of mlp_layer_types), expert_weights_norm (norm_topk_prob),
    expert_gating_func (the base's, from expert_selection_fn), expert_shared_count and
    expert_shared_feed_forward_length (num_shared_experts x intermediate_size; only "average" combination:
    the converter refuses "sum"), nextn_predict_layers (MTP blocks, counted in block_count; dropped),
    rope.dimension_count head_dim; biases dropped (the converter refuses nonzero ones), experts stacked.

    llama.cpp's loader and graph (src/models/cohere2moe.cpp) run it as transformers' Cohere2Moe: one norm
    feeding attention and the FFN side by side, an RMSNorm where layer_norm_rms_epsilon is written, else a
    LayerNorm; interleaved RoPE over the whole head (asserted) on the sliding layers and on the dense lead
    (prefix_dense_sliding_window_pattern 1, which the file cannot say otherwise), the other full layers NoPE,
    all at rope.freq_base; the routed sum plus the shared MLP, halved; the logits times logit_scale (0: none).
    Routing is sigmoid where expert_gating_func is absent (the loader's default), renormalized where
    expert_weights_norm; softmax over all experts, renormalized only where expert_weights_norm, which
    transformers' softmax (over the chosen logits) always is: softmax without it is refused, as is an
    expert_weights_scale other than 1 (Cohere2Moe has none) and RoPE scaling."""
    where = f"{meta.model.path}: a cohere2moe GGUF"
    gating = meta.get("expert_gating_func", SIGMOID)
    normalize = bool(meta.get("expert_weights_norm", False))
    if gating not in (SIGMOID, SOFTMAX):
        raise UnsupportedArchitectureError(f"{where} with expert_gating_func {gating!r}; Cohere2Moe routes by "
                                           "softmax or sigmoid")
    if gating == SOFTMAX and not normalize:
        raise UnsupportedArchitectureError(f"{where} with softmax routing without expert_weights_norm: llama.cpp "
                                           "weighs the chosen experts by their share of all, which transformers' "
                                           "Cohere2Moe (softmax over the chosen) cannot express")
    if meta.float("expert_weights_scale", 1.0) not in (0.0, 1.0):
        raise UnsupportedArchitectureError(f"{where} with expert_weights_scale {meta.get('expert_weights_scale')}; "
                                           "Cohere2Moe does not scale its routed experts")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    head_dim = meta.int("attention.key_length", config["hidden_size"] // heads)
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise SourceError(f"{where} rotating part of each head; llama.cpp asserts the whole")
    if (rms_eps := meta.float("attention.layer_norm_rms_epsilon")) is None and meta.get("attention.layer_norm_epsilon") is None:
        raise SourceError(f"{where} without a norm epsilon (attention.layer_norm_epsilon or _rms_epsilon); "
                          "llama.cpp's loader requires one")
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    shared = meta.int("expert_shared_count", 0)
    if shared and meta.int("expert_shared_feed_forward_length", width * shared) != width * shared:
        raise SourceError(f"{where} whose shared MLP is not {shared} experts of {width} wide")
    if shared and not _has(meta.model, "ffn_up_shexp.weight"):
        raise SourceError(f"{where} with expert_shared_count {shared} but no shared MLP (ffn_*_shexp)")
    dense = meta.int("leading_dense_block_count", 0)
    if {i for i in _expert_layers(meta.model) if i < layers} != set(range(dense, layers)):  # (MTP blocks after)
        raise SourceError(f"{where} whose experts are not on the layers after leading_dense_block_count ({dense})")
    sliding = _sliding_dense_first(meta, layers)
    logit_scale = meta.float("logit_scale")
    if logit_scale is None:
        raise SourceError(f"{where} without logit_scale; llama.cpp's loader requires it")
    config.update(
        head_dim=head_dim,
        rms_norm_eps=rms_eps,  # (None: LayerNorms, at layer_norm_eps)
        layer_norm_eps=meta.float("attention.layer_norm_epsilon", 1e-5),
        intermediate_size=width,
        prefix_dense_intermediate_size=meta.int("feed_forward_length") if dense else None,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        num_shared_experts=shared,
        shared_expert_combination_strategy="average",
        expert_selection_fn="softmax" if gating == SOFTMAX else "sigmoid",
        norm_topk_prob=normalize or gating == SOFTMAX,
        logit_scale=logit_scale or 1.0,  # (llama.cpp's graph leaves the logits unscaled at 0)
        sliding_window=meta.int("attention.sliding_window"),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(layers)],
        prefix_dense_sliding_window_pattern=1,
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta")},
        attention_bias=False,
    )
    return config
