"""The Hugging Face config of GGUF architectures whose layers come in kinds (sliding-window and
global; convolution or Mamba, and attention), one builder per architecture, as gguf_config.py's
are: each follows what llama.cpp's converter (named in its docstring, at llama.cpp 0c1e570) writes
and gives the config the family's runtime reads, with llama.cpp's defaults where the file says
nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import (
    Meta,
    _common_config,
    _expert_layers,
    _expert_size,
    _has,
    granite_moe_config,
    require_gating,
)

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture


def _sliding_layers(meta: Meta, num_layers: int, every: int) -> list[bool]:
    """attention.sliding_window_pattern as llama.cpp's load_swa_pattern reads it: one bool a layer
    (what converters write from layer_types), else a period n (n - 1 sliding layers, then a full
    one; 0: all sliding), else `every`, the architecture's default period."""
    where = f"{meta.model.path}: GGUF metadata {meta.arch}.attention.sliding_window_pattern"
    pattern = meta.get("attention.sliding_window_pattern", every)
    if isinstance(pattern, list):
        if len(pattern) < num_layers or not all(isinstance(v, bool) for v in pattern):
            raise SourceError(f"{where} is not one bool for each of the {num_layers} layers ({pattern!r})")
        return list(pattern[:num_layers])
    if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
        raise SourceError(f"{where} is neither a period nor one bool a layer ({pattern!r})")
    return [pattern == 0 or i % pattern < pattern - 1 for i in range(num_layers)]


def _attention_layers(meta: Meta, num_layers: int, writer: str) -> list[bool]:
    """Which layers attend, from head_count_kv one a layer as hybrids' converters write it (0 on the
    layers without attention; `writer` says which converter, for the error)."""
    kv_heads = meta.get("attention.head_count_kv")
    if not isinstance(kv_heads, list) or len(kv_heads) < num_layers:
        raise SourceError(f"{meta.model.path}: GGUF metadata {meta.arch}.attention.head_count_kv is not one count a "
                          f"layer ({kv_heads!r}); {writer}")
    return [heads != 0 for heads in kv_heads[:num_layers]]


def _no_rope_scaling(meta: Meta, config: dict[str, Any]) -> None:
    if config.pop("rope_scaling", None) is not None or "rope_freqs.weight" in meta.model.tensors:
        raise UnsupportedArchitectureError(f"{meta.model.path}: a {meta.arch} GGUF with RoPE scaling; ft reads "
                                           f"{meta.arch} files with plain RoPE, as the released models have it")


def exaone_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """ExaoneMoEModel.set_gguf_parameters (with Exaone4Model's and the base's): key_length from
    head_dim, feed_forward_length (the dense layers' width), expert_feed_forward_length,
    expert_shared_count, expert_weights_scale and _norm (routed_scaling_factor, norm_topk_prob),
    leading_dense_block_count (first_k_dense_replace), the group keys, attention.sliding_window and
    sliding_window_pattern (one bool a layer from layer_types; llama.cpp's default: every fourth
    layer full), nextn_predict_layers (MTP blocks, counted in block_count). llama.cpp's graph, as
    transformers, rotates only the sliding layers (the global ones are NoPE), at rope.freq_base_swa
    where the file has one. Routing is sigmoid with the correction bias (exp_probs_b)."""
    require_gating(meta, f"{meta.model.path}: an exaone-moe GGUF", "K-EXAONE")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers = config["num_hidden_layers"]
    dense = meta.int("leading_dense_block_count", 0)
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    shared = meta.int("expert_shared_count", 1)
    if shared and meta.int("expert_shared_feed_forward_length", width * shared) != width * shared:
        raise SourceError(f"{meta.model.path}: an exaone-moe GGUF whose shared experts are not {shared} x {width} wide")
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=width,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        num_shared_experts=shared,
        first_k_dense_replace=dense,
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(layers)],
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),  # llama.cpp's default where absent
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        sliding_window=meta.int("attention.sliding_window"),
        layer_types=["sliding_attention" if s else "full_attention" for s in _sliding_layers(meta, layers, 4)],
        rope_parameters={"rope_type": "default", "rope_theta": meta.float("rope.freq_base_swa", config["rope_theta"])},
    )
    return config


def lfm2moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """LFM2MoeModel.set_gguf_parameters (with the base's): head_count_kv one a layer, 0 on the
    short-convolution layers (so layer_types), feed_forward_length (the dense layers' width),
    expert_feed_forward_length, leading_dense_block_count (num_dense_layers), shortconv.l_cache
    (conv_L_cache), the rms eps from norm_eps, expert_gating_func sigmoid. llama.cpp's lfm2moe graph
    always renormalizes the top-k weights and scales them by nothing (it reads no
    expert_weights_scale, and the converter writes none): Lfm2MoeConfig's defaults, norm_topk_prob
    true and routed_scaling_factor 1, which a file cannot say otherwise."""
    require_gating(meta, f"{meta.model.path}: an lfm2moe GGUF", "LFM2-MoE")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    attending = _attention_layers(meta, config["num_hidden_layers"], "LFM2MoeModel writes 0 for each convolution layer")
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    if meta.int("attention.key_length", head_dim) != head_dim:
        raise SourceError(f"{meta.model.path}: an lfm2moe GGUF with heads of {meta.get('attention.key_length')}, not "
                          f"hidden_size / head_count ({head_dim}) as LFM2 has them")
    config.update(
        norm_eps=config.pop("rms_norm_eps"),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        num_dense_layers=meta.int("leading_dense_block_count", 0),
        conv_L_cache=meta.int("shortconv.l_cache"),
        conv_bias=False,
        layer_types=["full_attention" if a else "conv" for a in attending],
        use_expert_bias=True,
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta")},
    )
    return config


AFMOE_PERIOD = 4  # llama.cpp's afmoe graph: every fourth layer NoPE (n_no_rope_layer_step, no key sets it)


def afmoe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """AfmoeModel.set_gguf_parameters (with LlamaModel's and the base's): key_length from head_dim,
    feed_forward_length (the dense layers' width), expert_feed_forward_length, expert_shared_count,
    leading_dense_block_count (num_dense_layers), expert_weights_norm and _scale (route_norm,
    route_scale), attention.sliding_window. llama.cpp's graph rotates all layers but every fourth
    (its n_no_rope_layer_step, which no key sets), windows the layers sliding_window_pattern says
    (default: the same every fourth full), scales the embeddings by sqrt(hidden_size) always, and
    routes by sigmoid + expert_bias. transformers' AfmoeForCausalLM is the same model only with
    global_attn_every_n_layers 4 (full layers are its NoPE ones), mup_enabled and the top-k weights
    renormalized, which is what released Trinity files say; other files are refused."""
    where = f"{meta.model.path}: an afmoe GGUF"
    require_gating(meta, where, "Trinity")
    if not meta.get("expert_weights_norm", False):
        raise UnsupportedArchitectureError(f"{where} without expert_weights_norm: llama.cpp would not renormalize "
                                           "the top-k weights, which transformers' AFMoE (and ft's) always does")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers = config["num_hidden_layers"]
    if meta.get("attention.sliding_window") is None:
        raise UnsupportedArchitectureError(f"{where} without attention.sliding_window; llama.cpp would run every "
                                           "layer unwindowed, rotating three of four, which no AFMoE config describes")
    sliding = _sliding_layers(meta, layers, AFMOE_PERIOD)
    if sliding != [i % AFMOE_PERIOD < AFMOE_PERIOD - 1 for i in range(layers)]:
        raise UnsupportedArchitectureError(f"{where} whose full layers are not every fourth; llama.cpp's graph leaves "
                                           "exactly every fourth layer unrotated, so its full layers must be those")
    config.update(
        head_dim=meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"]),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        num_shared_experts=meta.int("expert_shared_count"),
        num_dense_layers=meta.int("leading_dense_block_count", 0),
        route_scale=meta.float("expert_weights_scale", 1.0),
        sliding_window=meta.int("attention.sliding_window"),
        global_attn_every_n_layers=AFMOE_PERIOD,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        mup_enabled=True,
        attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": meta.float("rope.freq_base_swa", config["rope_theta"])},
    )
    return config


def granitehybrid_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """GraniteHybridModel.set_gguf_parameters (GraniteMoeModel's, then its own): Granite's multipliers
    and MoE keys as granitemoe's (granite_moe_config), head_count_kv one a layer, 0 on the Mamba2
    layers (so layer_types), ssm.conv_kernel (mamba_d_conv), ssm.state_size (mamba_d_state),
    ssm.group_count (mamba_n_groups), ssm.inner_size (mamba_expand x hidden_size) and
    ssm.time_step_rank (mamba_n_heads; mamba_d_head is inner / heads), rope.scaling.finetuned the
    switch between RoPE and none (the converter writes false for every GraniteMoeHybrid, whatever
    position_embedding_type said, and context_length 2^20 with it; llama.cpp's default is true).
    mamba_chunk_size is not written: GraniteMoeHybridConfig's 256 (the scan's chunks; the same
    sums). A file without experts or without the shared MLP is refused: ft's granitemoehybrid
    always builds both, as transformers' GraniteMoeHybrid does."""
    config = granite_moe_config(meta, arch)
    path = meta.model.path
    attending = _attention_layers(meta, config["num_hidden_layers"], "GraniteHybridModel writes 0 for each Mamba2 layer")
    if not config["num_local_experts"] or not config.get("shared_intermediate_size"):
        raise UnsupportedArchitectureError(
            f"{path}: a granitehybrid GGUF without routed experts or without a shared MLP (expert_count "
            f"{meta.get('expert_count')!r}, expert_shared_feed_forward_length {meta.get('expert_shared_feed_forward_length')!r});"
            " ft runs Granite 4.0 hybrids with both, as transformers' GraniteMoeHybrid builds them")
    hidden, inner, heads = config["hidden_size"], meta.int("ssm.inner_size"), meta.int("ssm.time_step_rank")
    if inner % hidden or inner % heads:
        raise SourceError(f"{path}: GGUF metadata {meta.arch}.ssm.inner_size {inner} is not a multiple of the hidden "
                          f"size ({hidden}) and of ssm.time_step_rank ({heads}) as Mamba2 layers have it")
    rope = meta.get("rope.scaling.finetuned", True)
    config.update(
        model_type="granitemoehybrid", architectures=[arch.hf_architecture],
        layer_types=["attention" if a else "mamba" for a in attending],
        position_embedding_type="rope" if rope else "nope",
        mamba_n_heads=heads, mamba_d_head=inner // heads, mamba_expand=inner // hidden,
        mamba_n_groups=meta.int("ssm.group_count"), mamba_d_state=meta.int("ssm.state_size"),
        mamba_d_conv=meta.int("ssm.conv_kernel"), mamba_chunk_size=256,
        mamba_conv_bias=_has(meta.model, "ssm_conv1d.bias"), mamba_proj_bias=False,
    )
    return config


def _period_and_offset(layers_on: list[int], num_layers: int) -> tuple[int, int] | None:
    """The (period, offset) that JambaConfig's `i % period == offset` turns into exactly `layers_on`,
    or None where none does. One layer alone takes a period that reaches no other; none at all, an
    offset past the last layer."""
    if not layers_on:
        return num_layers + 1, num_layers
    offset = layers_on[0]
    period = layers_on[1] - offset if len(layers_on) > 1 else max(offset + 1, num_layers - offset)
    if period <= offset or [i for i in range(num_layers) if i % period == offset] != layers_on:
        return None
    return period, offset


def jamba_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """JambaModel.set_gguf_parameters: head_count_kv one a layer, 0 on the Mamba layers (the
    converter's n_kv_vec from attn_layer_period and _offset, which the file does not carry: read back
    as the period and offset that lay out the same layers), feed_forward_length (the dense MLPs' and
    the experts' width), ssm.conv_kernel (mamba_d_conv), ssm.inner_size (mamba_expand x hidden_size),
    ssm.state_size (mamba_d_state), ssm.time_step_rank (mamba_dt_rank), expert_count and _used_count.
    The MoE layers are those holding experts (ffn_*_exps; JambaModel writes the others' MLP as
    ffn_gate/up/down), read back as expert_layer_period and _offset the same way. No RoPE (llama.cpp's
    jamba is NoPE, as Jamba is); mamba_conv_bias from ssm_conv1d.bias (llama.cpp requires it), and no
    projection biases (JambaModel's names have none, so a file with them is refused by the tables)."""
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    config.pop("rope_theta")
    path, layers = meta.model.path, config["num_hidden_layers"]
    attending = _attention_layers(meta, layers, "JambaModel writes 0 for each Mamba layer")
    experts = _expert_layers(meta.model)
    attention = _period_and_offset([i for i, a in enumerate(attending) if a], layers)
    moe = _period_and_offset(experts, layers)
    if attention is None or moe is None:
        raise UnsupportedArchitectureError(
            f"{path}: a jamba GGUF with attention on layers {[i for i, a in enumerate(attending) if a]} and experts "
            f"on {experts}; Jamba lays each out every period-th layer from an offset below the period")
    hidden, inner = config["hidden_size"], meta.int("ssm.inner_size")
    if inner % hidden:
        raise SourceError(f"{path}: GGUF metadata {meta.arch}.ssm.inner_size {inner} is not a multiple of the hidden "
                          f"size ({hidden}) as Jamba's mamba_expand makes it")
    config.update(
        intermediate_size=meta.int("feed_forward_length"),
        num_experts=meta.int("expert_count") if experts else 1,
        num_experts_per_tok=meta.int("expert_used_count"),
        attn_layer_period=attention[0], attn_layer_offset=attention[1],
        expert_layer_period=moe[0], expert_layer_offset=moe[1],
        mamba_d_state=meta.int("ssm.state_size"), mamba_d_conv=meta.int("ssm.conv_kernel"),
        mamba_expand=inner // hidden, mamba_dt_rank=meta.int("ssm.time_step_rank"),
        mamba_conv_bias=_has(meta.model, "ssm_conv1d.bias"), mamba_proj_bias=False,
    )
    return config


NEMOTRON_H_CHUNK_SIZE = 128  # NemotronHConfig's chunk_size, which the file does not carry


def nemotron_h_moe_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """NemotronHModel.set_gguf_parameters for MoE checkpoints (over GraniteHybridModel's): head_count_kv
    and feed_forward_length one a layer, which llama.cpp's nemotron_h_moe reads as the layer's kind
    (both 0: Mamba2; FFN 0: attention; else MoE), key_length (head_dim), the rms eps as
    attention.layer_norm_epsilon, the ssm keys (conv_kernel, state_size, group_count (n_groups),
    inner_size = mamba_num_heads x mamba_head_dim, time_step_rank = mamba_num_heads), expert_count,
    _used_count, _feed_forward_length, _shared_feed_forward_length, _shared_count, _weights_norm,
    _weights_scale and _group_count (n_group), rope.scaling.finetuned false (NoPE) with context_length
    2^20. Routing is sigmoid with the correction bias (the graph's, whatever the file says). The
    converter writes no expert_group_used_count: llama.cpp refuses a file with groups and without it,
    and so does ft. A dense MLP layer (hybrid_override_pattern's -) is written with both counts 0, as
    a Mamba2 layer would be; llama.cpp cannot load it, and ft refuses it. chunk_size is not in the
    file: NemotronHConfig's 128 (the scan's chunks; the same sums)."""
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    path, layers = meta.model.path, config["num_hidden_layers"]
    attending = _attention_layers(meta, layers, "NemotronHModel writes 0 for each Mamba2 and MoE layer")
    widths = meta.get("feed_forward_length")
    if not isinstance(widths, list) or len(widths) < layers:
        raise SourceError(f"{path}: GGUF metadata {meta.arch}.feed_forward_length is not one width a layer "
                          f"({widths!r}); NemotronHModel writes 0 for each Mamba2 and attention layer")
    if _has(meta.model, "ffn_up.weight"):
        raise UnsupportedArchitectureError(
            f"{path}: a nemotron_h_moe GGUF with dense MLP layers (ffn_up); NemotronHModel writes them as "
            "Mamba2 layers (feed_forward_length 0), which llama.cpp cannot load, and so ft refuses them")
    groups = meta.int("expert_group_count", 1)
    if groups > 1 and meta.get("expert_group_used_count") is None:
        raise UnsupportedArchitectureError(
            f"{path}: a nemotron_h_moe GGUF with {groups} expert groups and no expert_group_used_count "
            "(NemotronHModel does not write topk_group); llama.cpp refuses to load it, as ft does")
    kinds = ["moe" if width else "full_attention" if a else "linear_attention"
             for a, width in zip(attending, widths[:layers], strict=True)]
    hidden, inner, heads = config["hidden_size"], meta.int("ssm.inner_size"), meta.int("ssm.time_step_rank")
    if inner % heads:
        raise SourceError(f"{path}: GGUF metadata {meta.arch}.ssm.inner_size {inner} is not a multiple of "
                          f"ssm.time_step_rank ({heads}) as Mamba2 layers have it")
    config.pop("rope_theta")
    config.pop("hidden_act")
    eps = config.pop("rms_norm_eps")
    config.update(
        layers_block_type=kinds,
        head_dim=meta.int("attention.key_length", hidden // config["num_attention_heads"]),
        layer_norm_epsilon=meta.float("attention.layer_norm_rms_epsilon",
                                      meta.float("attention.layer_norm_epsilon", eps)),
        mlp_hidden_act="relu2", mamba_hidden_act="silu",
        mamba_num_heads=heads, mamba_head_dim=inner // heads, n_groups=meta.int("ssm.group_count"),
        ssm_state_size=meta.int("ssm.state_size"), conv_kernel=meta.int("ssm.conv_kernel"),
        chunk_size=NEMOTRON_H_CHUNK_SIZE, use_conv_bias=_has(meta.model, "ssm_conv1d.bias"),
        mamba_proj_bias=False, use_bias=False, attention_bias=False, mlp_bias=False,
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        moe_shared_expert_intermediate_size=meta.int("expert_shared_feed_forward_length"),
        n_shared_experts=meta.int("expert_shared_count", 1),
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),  # llama.cpp's default where absent
        routed_scaling_factor=meta.float("expert_weights_scale", 1.0),
        n_group=groups, topk_group=meta.int("expert_group_used_count", 1),
    )
    return config


def mellum_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """MellumModel.set_gguf_parameters (conversion/mellum.py, with the base's): key_length from head_dim,
    rope.freq_base the full layers' base and rope.freq_base_swa the sliding ones' (rope_parameters keyed by
    layer type), expert_feed_forward_length, attention.sliding_window and sliding_window_pattern (one bool a
    layer from layer_types) where the config has a window. llama.cpp's graph (src/models/mellum.cpp) runs it
    as transformers' Mellum: q/k RMSNorms before NeoX RoPE over the whole head, each kind at its base (the
    sliding base the full one's where the file has none), sliding layers within the window (every layer full
    without one), a softmax top-k always renormalized. RoPE scaling is refused: llama.cpp applies it to the
    full layers only, which ft has not checked against transformers."""
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers, theta = config["num_hidden_layers"], config.pop("rope_theta")
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise SourceError(f"{meta.model.path}: a mellum GGUF rotating part of each head; llama.cpp asserts the whole")
    window = meta.get("attention.sliding_window")
    sliding = _sliding_layers(meta, layers, 4) if window else [False] * layers  # (llama.cpp: no window, no SWA)
    moe = set(_expert_layers(meta.model))
    config.update(
        head_dim=head_dim,
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        norm_topk_prob=True,  # (llama.cpp's graph renormalizes whatever the file says)
        sliding_window=meta.int("attention.sliding_window") if window else None,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        mlp_layer_types=["sparse" if i in moe else "dense" for i in range(layers)],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": theta},
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": meta.float("rope.freq_base_swa", theta)}},
        attention_bias=False,
    )
    if meta.get("feed_forward_length") is not None:
        config["intermediate_size"] = meta.int("feed_forward_length")
    return config


def hy_v3_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """HYV3Model.set_gguf_parameters (conversion/hunyuan.py, with the base's): key_length from head_dim,
    feed_forward_length (the dense layers' width), expert_feed_forward_length, expert_shared_feed_forward_length
    (num_shared_experts experts' width), expert_weights_norm (route_norm, True where absent) and _scale
    (router_scaling_factor), expert_gating_func sigmoid, nextn_predict_layers (MTP blocks, counted in
    block_count). llama.cpp's graph (src/models/hy-v3.cpp) runs it as transformers' Hy3: q/k RMSNorms before
    NeoX RoPE over the whole head, a dense MLP on layers without a router, elsewhere sigmoid scores chosen by
    score + expert_bias, renormalized where expert_weights_norm, times the scale, plus the shared MLP."""
    where = f"{meta.model.path}: a hy_v3 GGUF"
    require_gating(meta, where, "Hy3")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    layers = config["num_hidden_layers"]
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise SourceError(f"{where} rotating part of each head; llama.cpp asserts the whole")
    width = meta.int("expert_feed_forward_length", _expert_size(meta.model))
    shared_width = meta.int("expert_shared_feed_forward_length", width) if _has(meta.model, "ffn_up_shexp.weight") else 0
    if shared_width % width:
        raise SourceError(f"{where} whose shared MLP ({shared_width}) is no whole number of experts ({width}) wide")
    moe = set(_expert_layers(meta.model))
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=width,
        num_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        num_shared_experts=shared_width // width,
        norm_topk_prob=bool(meta.get("expert_weights_norm", False)),  # (llama.cpp's default where absent)
        router_scaling_factor=meta.float("expert_weights_scale", 1.0),
        mlp_layer_types=["sparse" if i in moe else "dense" for i in range(layers)],
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta")},
        attention_bias=False,
    )
    return config
