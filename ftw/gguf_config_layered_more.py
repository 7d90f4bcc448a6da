"""More of gguf_config_layered.py: the Hugging Face config of GGUF architectures whose layers come in
kinds (sliding-window and global attention, lightning and softmax attention), one builder per
architecture, each following what llama.cpp's converter (named in its docstring, at llama.cpp
0c1e570) writes and how its loader and graph read it, with llama.cpp's defaults where the file says
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import (
    SIGMOID,
    SOFTMAX,
    Meta,
    _common_config,
    _expert_layers,
    _expert_size,
    _has,
    granite_moe_config,
    require_gating,
)
from .gguf_config_layered import _no_rope_scaling

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture


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


def laguna_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """LagunaModel.set_gguf_parameters (conversion/laguna.py, with the base's): head_count one a layer
    (num_attention_heads_per_layer, else num_attention_heads on each), attention.sliding_window (none where
    the config has none), expert_feed_forward_length, expert_shared_feed_forward_length (the one shared MLP's
    width), expert_weights_norm true, expert_weights_scale (moe_routed_scaling_factor), expert_gating_func
    sigmoid, leading_dense_block_count (the dense lead of mlp_layer_types), rope.freq_base and rope.dimension_count
    of the full layers (head_dim x partial_rotary_factor), rope.freq_base_swa and rope.dimension_count_swa of the
    sliding ones; g_proj as attn_gate, the experts stacked, nothing permuted (NeoX RoPE, as transformers).

    llama.cpp's loader and graph (src/models/laguna.cpp) run it as transformers' Laguna with three readings of
    their own, which ft follows: the layer kinds are not in the file (no sliding_window_pattern is written), so
    with a window they are load_swa_pattern's period 4, full first; the router's logits are not soft-capped
    (moe_router_logit_softcapping is not written); the gate is per head or per channel as attn_gate's rows say.
    YaRN (the base's keys) applies to the full layers only, the sliding ones at plain RoPE. Refused by name:
    another gating function, routed weights not renormalized (transformers' Laguna always renormalizes), layers
    whose gates differ in kind."""
    where = f"{meta.model.path}: a laguna GGUF"
    require_gating(meta, where, "Laguna")
    if not meta.get("expert_weights_norm", False):
        raise UnsupportedArchitectureError(f"{where} without expert_weights_norm: transformers' Laguna always "
                                           "renormalizes the chosen experts' weights")
    heads = meta.get("attention.head_count")
    blocks = meta.int("block_count")
    heads = heads if isinstance(heads, list) else [meta.int("attention.head_count")] * blocks
    if len(heads) < blocks or not all(isinstance(h, int) and h > 0 for h in heads):
        raise SourceError(f"{where} whose attention.head_count is not one count a layer ({heads!r})")
    uniform = Meta(meta.model, meta.arch)
    uniform.values = {**meta.values, f"{meta.arch}.attention.head_count": heads[0]}
    config = _common_config(uniform, arch)
    scaling = config.pop("rope_scaling", None)
    if "rope_freqs.weight" in meta.model.tensors:
        raise UnsupportedArchitectureError(f"{where} with a rope_freqs tensor; Laguna's RoPE is plain or YaRN")
    layers = config["num_hidden_layers"]
    head_dim = meta.int("attention.key_length", config["hidden_size"] // heads[0])
    gates = {_gate_kind(meta, i, heads[i], head_dim) for i in range(layers)}
    if len(gates) != 1:
        raise UnsupportedArchitectureError(f"{where} with per-head and per-channel output gates on different "
                                           "layers; transformers' Laguna has one `gating` for all")
    dense = meta.int("leading_dense_block_count", 0)
    if {i for i in _expert_layers(meta.model) if i < layers} != set(range(dense, layers)):
        raise SourceError(f"{where} whose experts are not on the layers after leading_dense_block_count ({dense})")
    window = meta.int("attention.sliding_window", 0)
    sliding = [window > 0 and i % 4 != 0 for i in range(layers)]  # (load_swa_pattern(ml, 4, dense_first))
    theta, rot = config.pop("rope_theta"), meta.int("rope.dimension_count", head_dim)
    full = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": rot / head_dim}
    if scaling is not None:
        if scaling["rope_type"] != "yarn":
            raise UnsupportedArchitectureError(f"{where} with {scaling['rope_type']} RoPE scaling; Laguna's is YaRN")
        full |= {k: v for k, v in scaling.items() if k not in ("type", "mscale", "mscale_all_dim")}
    rope = {"full_attention": full}
    if window:
        rot_swa = meta.int("rope.dimension_count_swa", rot)
        rope["sliding_attention"] = {"rope_type": "default", "rope_theta": meta.float("rope.freq_base_swa", theta),
                                     "partial_rotary_factor": rot_swa / head_dim}
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        shared_expert_intermediate_size=meta.int("expert_shared_feed_forward_length"),
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        moe_routed_scaling_factor=meta.float("expert_weights_scale", 0.0) or 1.0,  # (llama.cpp: 0 is none)
        moe_router_logit_softcapping=0.0,
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(layers)],
        sliding_window=window,  # (0: none, LagunaConfig wanting an int)
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        rope_parameters=rope,
        gating=gates.pop(),
        attention_bias=False,
    )
    if len(set(heads[:layers])) > 1:
        config["num_attention_heads_per_layer"] = list(heads[:layers])
    return config


def _gate_kind(meta: Meta, layer: int, heads: int, head_dim: int) -> bool | str:
    """Layer `layer`'s attention gate as laguna.cpp's loader tells it: one row a head (per head: `gating`
    True) or one a channel ("per-element"), from blk.N.attn_gate.weight's rows."""
    gate = meta.model.tensors.get(f"blk.{layer}.attn_gate.weight")
    rows = gate.shape[0] if gate is not None and len(gate.shape) == 2 else None
    if rows == heads:
        return True
    if rows == heads * head_dim:
        return "per-element"
    raise SourceError(f"{meta.model.path}: a laguna GGUF whose blk.{layer}.attn_gate.weight has {rows} rows; "
                      f"llama.cpp expects {heads} (per head) or {heads * head_dim} (per channel)")


def _minimax01_recurrent(meta: Meta, num_layers: int) -> list[bool]:
    """Which layers are lightning attention, as minimax-01.cpp's loader reads them: attention.recurrent_layers
    (one bool a layer, or one for all), else full_attention_interval n (8 where absent): linear attention
    where (i + 1) % n != 0. The converter writes neither, so released files take the interval 8."""
    where = f"{meta.model.path}: GGUF metadata {meta.arch}"
    recurrent = meta.get("attention.recurrent_layers")
    if isinstance(recurrent, bool):
        return [recurrent] * num_layers
    if recurrent is not None:
        if not isinstance(recurrent, list) or len(recurrent) < num_layers or not all(isinstance(v, bool) for v in recurrent):
            raise SourceError(f"{where}.attention.recurrent_layers is not one bool for each of the {num_layers} "
                              f"layers ({recurrent!r})")
        return list(recurrent[:num_layers])
    interval = meta.int("full_attention_interval", 8)
    if interval < 1:
        raise SourceError(f"{where}.full_attention_interval is {interval}; a full layer needs a period of 1 or more")
    return [(i + 1) % interval != 0 for i in range(num_layers)]


def minimax01_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """MiniMaxText01Model.set_gguf_parameters (conversion/minimax.py, with the base's): feed_forward_length the
    experts' width (intermediate_size), key_length from head_dim, expert_count (num_local_experts),
    residual_scale (the release's layernorm_*_alpha, which the converter asserts equal, its betas all 1),
    rope.dimension_count (rotary_dim), tokenizer.ggml.suppress_tokens; the experts stacked, nothing permuted.
    No layer kinds are written: minimax-01.cpp's loader takes full_attention_interval's default 8.

    llama.cpp's graph (src/models/minimax-01.cpp) runs it as transformers' MiniMax: the residual is each
    sublayer's normed input, times residual_scale, plus the sublayer's output; lightning layers (attn_qkv
    SiLU'd and split per head, decays 2^(-8/heads) per head times 1 - il/(n - 1) + 1e-5, attn_norm_2 over
    all heads, times sigmoid(attn_gate), attn_output) and GQA layers with NeoX RoPE on rope.dimension_count
    channels; the softmax top-k always renormalized, whatever expert_gating_func or expert_weights_norm say,
    and no expert_weights_scale (the loader reads none). Where llama.cpp and transformers differ by a rounding
    (its slope factor lacks transformers' 1e-5 in the denominator; attn_norm_2 takes the model's rms epsilon,
    transformers' that norm's default 1e-6) ft runs transformers'. The suppressed tokens (added tokens whose
    embeddings are zero) are a sampling rule of llama.cpp's common sampler, not of the model: ft, as
    transformers on the release, does not apply it. RoPE scaling and rotation over part of each head
    (transformers' MiniMax rotates the whole head) are refused by name."""
    where = f"{meta.model.path}: a minimax-01 GGUF"
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    if meta.get("attention.layer_norm_rms_epsilon") is None:
        raise SourceError(f"{where} without attention.layer_norm_rms_epsilon; llama.cpp's loader requires it")
    if (scale := meta.float("residual_scale")) is None:
        raise SourceError(f"{where} without residual_scale; llama.cpp's loader requires it")
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    head_dim = meta.int("attention.key_length", config["hidden_size"] // heads)
    if meta.int("attention.value_length", head_dim) != head_dim:
        raise SourceError(f"{where} whose value heads are not as wide as its key heads; llama.cpp asserts them equal")
    if (rot := meta.int("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedArchitectureError(f"{where} rotating {rot} of each head's {head_dim} channels; transformers' "
                                           "MiniMax (ft's minimax) rotates the whole head")
    if set(_expert_layers(meta.model)) != set(range(layers)):
        raise SourceError(f"{where} without routed experts on every layer; minimax-01.cpp requires them")
    recurrent = _minimax01_recurrent(meta, layers)
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("feed_forward_length", _expert_size(meta.model)),
        num_local_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        layer_types=["linear_attention" if r else "full_attention" for r in recurrent],
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta")},
        full_attn_alpha_factor=scale, linear_attn_alpha_factor=scale, mlp_alpha_factor=scale,
        full_attn_beta_factor=1.0, linear_attn_beta_factor=1.0, mlp_beta_factor=1.0,
        sliding_window=None,
    )
    return config


def _one_a_layer(meta: Meta, key: str, num_layers: int, default: bool | None) -> list[bool]:
    """An array key read as llama.cpp's get_arr reads one into a per-layer array: bools or integers
    (nonzero: true), layers past its end keeping the loader's default (None: the key is required)."""
    where = f"{meta.model.path}: GGUF metadata {meta.arch}.{key}"
    values = meta.get(key)
    if values is None and default is not None:
        return [default] * num_layers
    if not isinstance(values, list) or not all(isinstance(v, (bool, int)) for v in values):
        raise SourceError(f"{where} is not one bool a layer ({values!r}); llama.cpp's loader requires the array")
    if len(values) < num_layers and default is None:
        raise SourceError(f"{where} has {len(values)} entries for {num_layers} layers")
    return [bool(v) for v in values[:num_layers]] + [bool(default)] * (num_layers - len(values))


def granite_swa_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """GraniteMoeSWAModel.set_gguf_parameters (conversion/granite.py, over GraniteSWAModel's, GraniteModel's and
    LlamaModel's): Granite's multipliers and MoE keys as granitemoe's (granite_moe_config), head_dim dropped
    (hidden_size / heads), attention.sliding_window (128 where the config has none) and sliding_window_pattern
    (one bool a layer from layer_types), attention.rope_pattern (one a layer from the release's no_rope_layers,
    1 for RoPE, 0 for NoPE; none without it), expert_shared_feed_forward_length; q/k permuted (LlamaModel's),
    sinks as attn_sinks.weight, the experts' gate_up_proj kept fused (ffn_gate_up_exps) and the shared MLP's
    input_linear too (ffn_up_shexp, gate rows then up).

    llama.cpp's loader and graph (src/models/granite-swa.cpp) run it as transformers' GraniteMoeSWA: a sink
    logit a head on every layer, the sliding layers within attention.sliding_window positions, RoPE at the one
    rope.freq_base on the layers rope_pattern marks (every layer without one) and none on the others, the
    softmax top-k renormalized, the shared MLP (SwiGLU) added. transformers' per-layer bases (layer_rope_theta)
    are thus the one base or 0. Refused by name: a file without experts (GraniteSWA's dense model, which ft
    does not run), a deepstack_mapping (Granite 4 Vision's language model, fed by its projectors), RoPE scaling."""
    where = f"{meta.model.path}: a granite_swa GGUF"
    if not meta.get("expert_count"):
        raise UnsupportedArchitectureError(f"{where} without experts is GraniteSWA's dense model; ft runs "
                                           "granite_swa files of GraniteMoeSWA (granitemoe_swa)")
    if meta.get("deepstack_mapping") is not None:
        raise UnsupportedArchitectureError(f"{where} with a deepstack_mapping (Granite 4 Vision's language model, "
                                           "whose layers take its projectors' features); ft runs text models")
    for key in ("attention.layer_norm_rms_epsilon", "logit_scale"):
        if meta.get(key) is None:
            raise SourceError(f"{where} without {key}; llama.cpp's loader requires it")
    config = granite_moe_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers, head_dim = config["num_hidden_layers"], config["head_dim"]
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise SourceError(f"{where} rotating part of each head; granite-swa.cpp asserts the whole")
    shared = meta.int("expert_shared_feed_forward_length", 0)
    if not shared and _has(meta.model, "ffn_up_shexp.weight"):
        raise SourceError(f"{where} with a shared MLP (ffn_up_shexp) but no expert_shared_feed_forward_length")
    sliding = _one_a_layer(meta, "attention.sliding_window_pattern", layers, None)
    rope = _one_a_layer(meta, "attention.rope_pattern", layers, True)
    theta = config.pop("rope_theta")
    config.update(
        model_type=arch.model_type, architectures=[arch.hf_architecture],
        shared_intermediate_size=shared,
        sliding_window=meta.int("attention.sliding_window"),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        layer_rope_theta=[theta if r else 0 for r in rope],
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    return config
