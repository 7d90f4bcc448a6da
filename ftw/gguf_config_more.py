"""The Hugging Face config of further GGUF architectures (gguf_config.py grew past a sitting), one
builder per architecture, as gguf_config.py's are: each follows what llama.cpp's converter (named in
its docstring, at llama.cpp 0c1e570) writes and gives the config the family's runtime reads, with
llama.cpp's defaults where the file says nothing, and refuses files llama.cpp runs otherwise than the
family's transformers model does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import (
    Meta,
    _common_config,
    _expert_layers,
    _expert_size,
    _f32,
    _has,
    deepseek2_config,
    require_gating,
    sigmoid_moe_keys,
)
from .gguf_config_layered import _no_rope_scaling

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
    require_gating(meta, where, "Sarvam", required=True, why=" (and llama.cpp loads no file without the key)")
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
        **sigmoid_moe_keys(meta, width, shared),
        attention_bias=_has(meta.model, "attn_qkv.bias"),
        use_qk_norm=True,  # llama.cpp's graph requires both norms
        num_nextn_predict_layers=meta.int("nextn_predict_layers", 0),
        rope_parameters={"rope_type": "default", "rope_theta": config.pop("rope_theta"), "partial_rotary_factor": 1.0},
    )
    return config


def _rope_factors(meta: Meta, name: str, count: int) -> list[float]:
    """A RoPE factor tensor (Phi3MiniModel's LongRoPE ones, LlamaModel's rope_freqs), written float32,
    one factor a rotated channel pair."""
    t = meta.model.tensors[name]
    if t.dtype != "f32" or t.shape != (count,):
        raise SourceError(f"{meta.model.path}: {name} is {t.dtype} {list(t.shape)}; llama.cpp's converters write "
                          f"{count} float32 factors, one a rotated channel pair")
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


# What llama.cpp's llama4 graph (src/models/llama4.cpp at 0c1e570) hard-codes, not read from the file:
# chunks of 8192 positions, NoPE on every fourth layer, the NoPE layers' query temperature
# log(floor((p + 1) / 8192) + 1) * 0.1 + 1, three chunked layers then one full (load_swa_pattern(ml, 4))
LLAMA4_CHUNK, LLAMA4_NOPE_STEP, LLAMA4_FLOOR_SCALE, LLAMA4_ATTN_SCALE = 8192, 4, 8192, 0.1
MAVERICK_EXPERTS = 128  # llama.cpp's LLM_TYPE_17B_128E, the one llama4 type without q/k norm


def llama3_rope_factors(theta: float, dim: int, rope: dict[str, Any]) -> np.ndarray:
    """LlamaModel.generate_extra_tensors' rope_freqs for Llama 3 scaling `rope`: per rotated channel
    pair, 1 under original / high_freq_factor, factor over original / low_freq_factor, smoothed between."""
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    original = rope["original_max_position_embeddings"]
    out = []
    for wavelen in 2 * math.pi / freqs:
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        elif high == low:
            out.append(math.nan)  # (the converter divides by zero there: no file to match)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out)


def llama3_rope_from_factors(factors: np.ndarray, theta: float, dim: int) -> dict[str, Any] | None:
    """Llama 3 scaling parameters whose rope_freqs are `factors` (to float32 precision), or None.

    The factors fix `factor` and the two wavelength bounds, original / low_freq_factor and original /
    high_freq_factor, but not the three numbers apart: low_freq_factor is taken as 1 (Llama 3.1 to 4
    all have it) and original as the first power of two that reproduces every factor (where no channel
    lies between the bounds, any original between the last kept and the first divided wavelength does:
    Llama 4 Scout's 8192 is the one power of two there). Which of those equivalent sets is chosen
    changes no frequency."""
    factor = _f32(factors.max())
    if factor <= 1.0:
        return None
    wavelens = 2 * math.pi * theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    between = [i for i, f in enumerate(factors) if not (math.isclose(f, 1.0, rel_tol=1e-6)
                                                        or math.isclose(f, factor, rel_tol=1e-6))]
    for original in (2 ** k for k in range(1, 31)):
        high = 1.0
        if between:  # 1 / f = (1 - s) / factor + s, s = (original / wavelen - 1) / (high - 1)
            i = between[0]
            smooth = (1 / float(factors[i]) - 1 / factor) / (1 - 1 / factor)
            if smooth <= 0:
                return None
            high = round(1 + (original / wavelens[i] - 1) / smooth, 4)
            if high <= 1.0:
                continue
        rope = {"factor": factor, "high_freq_factor": high, "low_freq_factor": 1.0,
                "original_max_position_embeddings": original}
        if np.allclose(llama3_rope_factors(theta, dim, rope), factors, rtol=2e-6, atol=0):
            return rope
    return None


def llama4_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Llama4Model.set_gguf_parameters (LlamaModel's and the base's), after its __init__ swaps
    intermediate_size_mlp into intermediate_size: feed_forward_length the dense layers' width,
    expert_feed_forward_length the experts' (and the shared expert's), interleave_moe_layer_step,
    rope.dimension_count and key_length the head, attention.sliding_window 0 only where every layer
    is full attention; Llama 3 scaling as the rope_freqs tensor alone (generate_extra_tensors).

    The config is the one llama.cpp's graph runs, whatever the checkpoint said: chunks of 8192, the
    temperature's 8192 and 0.1, NoPE every fourth layer, three chunked layers then one full, q/k L2
    norm unless there are 128 experts (Maverick's use_qk_norm false, Scout's true: llama.cpp tells
    them apart by the count). Refused: sliding_window 0 (llama.cpp's graph then makes only the last
    layer NoPE and scales its queries by temperature constants it never sets, which llama-graph.cpp
    asserts are set; transformers keeps NoPE on every fourth layer), another layer pattern, a separate RoPE base for
    the chunked layers, rope.scaling keys, rope_freqs that no Llama 3 scaling gives."""
    where = f"{meta.model.path}: a llama4 GGUF"
    config = _common_config(meta, arch)
    if config.pop("rope_scaling", None) is not None:
        raise UnsupportedArchitectureError(f"{where} with rope.scaling.type {meta.get('rope.scaling.type')!r}; "
                                           "Llama 4's scaling is Llama 3's, written as the rope_freqs tensor")
    if meta.get("attention.sliding_window") == 0:
        raise UnsupportedArchitectureError(
            f"{where} with attention.sliding_window 0 (every layer full attention): llama.cpp's graph then leaves only "
            "the last layer without RoPE and scales its queries by temperature constants it never sets (which "
            "llama-graph.cpp asserts), where transformers keeps NoPE on every fourth layer")
    pattern = meta.get("attention.sliding_window_pattern")
    chunked = [i % LLAMA4_NOPE_STEP < LLAMA4_NOPE_STEP - 1 for i in range(config["num_hidden_layers"])]
    if pattern is not None and pattern not in (LLAMA4_NOPE_STEP, chunked):  # (a period, or a bool a layer)
        raise UnsupportedArchitectureError(f"{where} with attention.sliding_window_pattern {pattern!r}; ft runs "
                                           "Llama 4's three chunked layers then one full, beside NoPE every fourth")
    theta = config.pop("rope_theta")
    if meta.float("rope.freq_base_swa", theta) != theta:
        raise UnsupportedArchitectureError(f"{where} with rope.freq_base_swa {meta.get('rope.freq_base_swa')}; "
                                           "Llama 4 rotates its chunked layers at the one base")
    head_dim = meta.int("attention.key_length", config["hidden_size"] // config["num_attention_heads"])
    if meta.int("rope.dimension_count", head_dim) != head_dim:
        raise UnsupportedArchitectureError(f"{where} rotating {meta.get('rope.dimension_count')} of {head_dim} "
                                           "channels a head; llama.cpp's llama4 rotates the whole head")
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if "rope_freqs.weight" in meta.model.tensors:
        factors = np.asarray(_rope_factors(meta, "rope_freqs.weight", head_dim // 2), dtype=np.float64)
        llama3 = llama3_rope_from_factors(factors, theta, head_dim)
        if llama3 is None and not np.all(factors == 1.0):
            raise UnsupportedArchitectureError(f"{where} whose rope_freqs no Llama 3 scaling gives; ft reads "
                                               "Llama 4's rope_freqs as Llama 3 scaling")
        if llama3 is not None:
            rope = {"rope_type": "llama3", "rope_theta": theta, **llama3}
    step = meta.int("interleave_moe_layer_step")
    if step < 1:
        raise UnsupportedArchitectureError(f"{where} with interleave_moe_layer_step {step}: no MoE layers")
    layers = config["num_hidden_layers"]
    experts = meta.int("expert_count")
    config.update(
        head_dim=head_dim,
        intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        intermediate_size_mlp=meta.int("feed_forward_length"),
        num_local_experts=experts,
        num_experts_per_tok=meta.int("expert_used_count"),
        interleave_moe_layer_step=step,
        moe_layers=[i for i in range(layers) if (i + 1) % step == 0],
        no_rope_layer_interval=LLAMA4_NOPE_STEP,
        no_rope_layers=[int((i + 1) % LLAMA4_NOPE_STEP != 0) for i in range(layers)],
        layer_types=["chunked_attention" if c else "full_attention" for c in chunked],
        attention_chunk_size=LLAMA4_CHUNK,
        attn_temperature_tuning=True,
        floor_scale=LLAMA4_FLOOR_SCALE,
        attn_scale=LLAMA4_ATTN_SCALE,
        use_qk_norm=experts != MAVERICK_EXPERTS,
        attention_bias=_has(meta.model, "attn_q.bias"),
        rope_parameters=rope,
    )
    return config


def mistral4_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Mistral3Model.Mistral4Model over DeepseekV2Model (conversion/mistral3.py): deepseek2's keys
    (deepseek2_config) for Mistral Small 4's text model, its experts already fused (gate_up_proj as
    ffn_gate_up_exps). llama.cpp runs the file with deepseek2's graph (src/models/deepseek2.cpp), so:

    - routing by softmax, the default where the file has no expert_gating_func (Mistral4Config has no
      scoring_func), over DeepSeek-V3's group-limited choice (groups by their top two), as transformers'
      Mistral4TopkRouter; a routing bias (exp_probs_b, which gguf-py's table allows) transformers' Mistral 4
      has not: refused, as is sigmoid gating;
    - YaRN with mscale taken as 1 (llama-context.cpp assumes it for every architecture but deepseek2; the
      converter writes only mscale_all_dim, as yarn_log_multiplier): llama.cpp's softmax scale and cos/sin
      factor are transformers' where mscale_all_dim is 1 too (the release's), and no transformers config
      gives them otherwise, so another mscale_all_dim, YaRN without it, and other scaling are refused;
    - the query temperature only where the file has attention.temperature_scale (llama.cpp applies it to
      the whole query, positions from 0, as transformers), stepping every attention.temperature_length
      positions, which must be rope's original context (transformers' one length for both). This
      converter writes neither key: its files run without the temperature, as llama.cpp runs them, which
      is transformers' model up to original_max_position_embeddings (8192 in the release) and not beyond."""
    where = f"{meta.model.path}: a {meta.arch} GGUF of Mistral 4"
    if _has(meta.model, "exp_probs_b.bias"):
        raise UnsupportedArchitectureError(f"{where} with a routing bias (exp_probs_b); Mistral 4's softmax router "
                                           "has none, and ft's mistral4 runs it without one")
    config = deepseek2_config(meta, arch)
    if config.pop("scoring_func") != "softmax":
        raise UnsupportedArchitectureError(f"{where} with expert_gating_func {meta.get('expert_gating_func')!r}; "
                                           "Mistral 4 routes by softmax")
    config.pop("topk_method")
    config.update(model_type="mistral4", architectures=["Mistral4ForCausalLM"], head_dim=config["qk_head_dim"])
    config["rope_parameters"] = _mistral4_rope(meta, where, config.pop("rope_scaling", None), config.pop("rope_theta"))
    return config


def deepseek2_or_mistral_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """A deepseek2 file: DeepSeek's (deepseek2_config), or, where it has a query temperature
    (attention.temperature_scale), Mistral's: MistralMoeModel (conversion/mistral.py) writes Mistral Small 4
    and Mistral Large 3 from Mistral's own format as deepseek2 with softmax gating, the temperature keys and
    a yarn_log_multiplier of 0.1, which llama.cpp's deepseek2 graph runs as mistral4_config reads them (a
    deepseek_v2 config would drop the temperature and score groups by their best expert, not their top two)."""
    if meta.get("attention.temperature_scale"):
        return mistral4_config(meta, arch)
    return deepseek2_config(meta, arch)


def _no_yarn_factors(meta: Meta, where: str) -> None:
    for key in ("rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor", "rope.scaling.attn_factor"):
        if meta.float(key, 1.0) != 1.0:
            raise UnsupportedArchitectureError(f"{where} with {key} {meta.get(key)}; transformers' YaRN has no "
                                               "such factor (or llama.cpp ignores it)")


def _mistral4_rope(meta: Meta, where: str, scaling: dict[str, Any] | None, theta: float) -> dict[str, Any]:
    """rope_parameters as llama.cpp's deepseek2 graph runs a mistral4 file (mistral4_config)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        if scaling["rope_type"] != "yarn" or scaling.get("mscale_all_dim") != 1.0:
            raise UnsupportedArchitectureError(
                f"{where} with rope.scaling.type {scaling['rope_type']!r} and yarn_log_multiplier "
                f"{meta.get('rope.scaling.yarn_log_multiplier')!r}: llama.cpp scales its attention as transformers "
                "does only for YaRN with mscale_all_dim 1 (a yarn_log_multiplier of 0.1), as Mistral Small 4 has")
        _no_yarn_factors(meta, where)
        rope.update({k: v for k, v in scaling.items() if k not in ("type", "mscale")}, mscale=1.0)
    beta = meta.float("attention.temperature_scale", 0.0)
    if beta:  # (llama.cpp applies it where it is not 0)
        length = meta.int("attention.temperature_length", 0)
        original = rope.setdefault("original_max_position_embeddings", length)
        if length != original or length < 1:
            raise UnsupportedArchitectureError(
                f"{where} whose query temperature steps every {length} positions (attention.temperature_length) "
                f"and whose YaRN original context is {original}; transformers' Mistral 4 steps by its original "
                "context, and llama.cpp refuses a temperature without a length")
        rope["llama_4_scaling_beta"] = beta
    return rope


# llama.cpp's glm-dsa (src/models/glm-dsa.cpp at 0c1e570) where the file has no attention.indexer.types:
# every layer full before GLM-5.2 (a context under 2^20), else GLM-5.2's schedule (full on layers 0 and 1,
# then every fourth from 2; shared past the 78 its table lists)
GLM_5_2_CONTEXT, GLM_5_2_INDEXER_TABLE = 1 << 20, [True, True] + [True, False, False, False] * 19


def glm_dsa_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """GlmMoeDsaModel over DeepseekV2Model (conversion/glm.py): deepseek2's keys (deepseek2_config: MLA,
    kv_b split, dense first layers, experts, the correction bias, shared experts, nextn blocks), the rope
    dimension qk_rope_head_dim, and the indexer's attention.indexer.head_count, key_length, top_k and
    types (one bool a layer, "full" where true, from the config's indexer_types). llama.cpp runs it as
    src/models/glm-dsa.cpp does:

    - routing by sigmoid, the default where the file has no expert_gating_func (glm-dsa's loader; the
      converter writes the key only from a scoring_func), with the correction bias; softmax is refused
      (transformers' GLM-5 routes by sigmoid);
    - no indexer types in the file: every layer full before GLM-5.2 (a context under 2^20), else
      GLM-5.2's schedule, as llama.cpp's loader fills them;
    - YaRN (_glm_dsa_rope) as glm-dsa's loader runs it: without the yarn_log_multiplier.

    The indexer's key LayerNorm: llama.cpp's graph normalizes with hparams.f_norm_eps, which glm-dsa's
    loader never sets (0), transformers with 1e-6; the file says neither, and ft keeps transformers'."""
    where = f"{meta.model.path}: a {meta.arch} GGUF of GLM-5"
    require_gating(meta, where, "GLM-5")
    config = deepseek2_config(meta, arch)
    for key in ("scoring_func", "topk_method", "rope_interleave"):
        config.pop(key)
    layers = config["num_hidden_layers"]
    types = meta.get("attention.indexer.types")
    if types is None:
        types = ([True] * layers if meta.int("context_length", 0) < GLM_5_2_CONTEXT
                 else [i < len(GLM_5_2_INDEXER_TABLE) and GLM_5_2_INDEXER_TABLE[i] for i in range(layers)])
    elif not isinstance(types, list) or len(types) != layers or not all(isinstance(t, (bool, int)) for t in types):
        raise SourceError(f"{where} whose attention.indexer.types is not one flag for each of its {layers} layers")
    if not types or not types[0]:
        raise UnsupportedArchitectureError(f"{where} whose first layer shares an indexer selection no layer made; "
                                           "llama.cpp asserts a full indexer layer before a shared one")
    rope_dim, index_dim = config["qk_rope_head_dim"], meta.int("attention.indexer.key_length")
    if index_dim < rope_dim:
        raise SourceError(f"{where} whose indexer heads ({index_dim}) are narrower than the rope ({rope_dim})")
    config.update(
        model_type=arch.model_type, architectures=[arch.hf_architecture],
        index_n_heads=meta.int("attention.indexer.head_count"), index_head_dim=index_dim,
        index_topk=meta.int("attention.indexer.top_k"),
        indexer_types=["full" if t else "shared" for t in types],
        rope_parameters=_glm_dsa_rope(meta, where, config.pop("rope_scaling", None), config.pop("rope_theta")),
    )
    return config


def _glm_dsa_rope(meta: Meta, where: str, scaling: dict[str, Any] | None, theta: float) -> dict[str, Any]:
    """rope_parameters as llama.cpp runs a glm-dsa file. Its loader reads no yarn_log_multiplier (deepseek2's
    and mistral4's do), so llama-context.cpp's YaRN factor is get_mscale(factor) = 1 + 0.1 ln(factor) = m for
    cos/sin (on MLA's and the indexer's rotated channels alike) and the graph's softmax scale m^2 / sqrt(d):
    transformers' YaRN with mscale_all_dim 1 and no mscale (its attention factor then get_mscale(factor)).
    A checkpoint with mscale_all_dim 1 (a yarn_log_multiplier of 0.1) and no mscale runs so in transformers;
    one with mscale 1 too would have cos/sin unscaled there, but the file does not say which (the converter
    writes only mscale_all_dim), and ft runs it as llama.cpp does. Another yarn_log_multiplier (a checkpoint
    that transformers runs with another softmax scale), other scaling and YaRN ext/attn factors are refused."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    if scaling is not None:
        log_mul = meta.float("rope.scaling.yarn_log_multiplier", 0.1)
        if scaling["rope_type"] != "yarn" or log_mul != 0.1:
            raise UnsupportedArchitectureError(
                f"{where} with rope.scaling.type {scaling['rope_type']!r} and yarn_log_multiplier {log_mul!r}: "
                "llama.cpp's glm-dsa scales its attention as transformers does only for YaRN with mscale_all_dim 1 "
                "(a yarn_log_multiplier of 0.1, or none)")
        _no_yarn_factors(meta, where)
        rope.update({k: v for k, v in scaling.items() if k not in ("type", "mscale")}, mscale_all_dim=1.0)
    return rope


def mimo2_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """MimoV2Model.set_gguf_parameters (conversion/mimo.py, from the release's config: hybrid_layer_pattern,
    swa_num_key_value_heads, rope_theta and swa_rope_theta, partial_rotary_factor, layernorm_epsilon) and the
    base's: head_count_kv one a layer (the sliding layers' swa count), attention.sliding_window and
    sliding_window_pattern (1 a sliding layer), key_length (head_dim) and value_length (v_head_dim),
    rope.freq_base and rope.freq_base_swa, rope.dimension_count (head_dim x partial_rotary_factor),
    attention.value_scale, the expert keys, nextn_predict_layers (the release's 3 MTP blocks, dropped).
    llama.cpp runs it as src/models/mimo2.cpp does, which is transformers' MiMo-V2-Flash when:

    - the sliding layers have twice the full layers' key-value heads (transformers derives them so);
    - routing is sigmoid with the correction bias, renormalized, not scaled: mimo2's graph hard-codes
      sigmoid and renormalization and its loader reads no expert_weights_scale (the release's
      routed_scaling_factor is null: 1), so a file with another gating or scale is refused;
    - the window is the file's: a query sees sliding_window positions, itself included, on both sides
      (transformers makes it the release's sliding_window_size + 1; the converter writes whichever
      sliding_window the config it read had);
    - no attention.value_scale: unscaled, as llama.cpp runs it (transformers' default would be 0.707).
    Sinks only on sliding layers (transformers has none on full ones), no RoPE scaling."""
    where = f"{meta.model.path}: a {meta.arch} GGUF of MiMo-V2-Flash"
    require_gating(meta, where, "llama.cpp's mimo2", why=" whatever the file says")
    if meta.float("expert_weights_scale", 1.0) != 1.0:
        raise UnsupportedArchitectureError(f"{where} with expert_weights_scale {meta.get('expert_weights_scale')}; "
                                           "llama.cpp's mimo2 does not scale the routed weights")
    layers = meta.int("block_count") - meta.int("nextn_predict_layers", 0)
    pattern, kv_heads = meta.get("attention.sliding_window_pattern"), meta.get("attention.head_count_kv")
    if not isinstance(pattern, list) or len(pattern) < layers or not isinstance(kv_heads, list) or len(kv_heads) < layers:
        raise SourceError(f"{where} without attention.sliding_window_pattern and head_count_kv one a layer")
    full_layers = Meta(meta.model, meta.arch)  # (the base config sized by the full layers' key-value heads)
    full_layers.values = {**meta.values, f"{meta.arch}.attention.head_count_kv": next(
        (k for k, p in zip(kv_heads, pattern, strict=False) if not p), kv_heads[0])}
    config = _common_config(full_layers, arch)
    _no_rope_scaling(meta, config)
    sliding = [bool(p) for p in pattern[:layers]]
    full_kv = {k for k, s in zip(kv_heads, sliding, strict=False) if not s}
    swa_kv = {k for k, s in zip(kv_heads, sliding, strict=False) if s}
    if len(full_kv) != 1 or (swa_kv and swa_kv != {2 * next(iter(full_kv))}):
        raise UnsupportedArchitectureError(f"{where} with key-value heads {kv_heads[:layers]} (full, sliding): "
                                           "transformers' MiMo-V2-Flash has twice the full layers' on sliding ones")
    for i in range(layers):
        if not sliding[i] and f"blk.{i}.attn_sinks.weight" in meta.model.tensors:
            raise UnsupportedArchitectureError(f"{where} with sinks on full layer {i}; transformers' MiMo-V2-Flash "
                                               "has them on sliding layers only")
    head_dim = meta.int("attention.key_length")
    rotated = meta.int("rope.dimension_count", head_dim)
    theta = config.pop("rope_theta")
    partial = rotated / head_dim  # (int(head_dim * partial) is rotated again)
    moe = set(_expert_layers(meta.model))
    config.update(
        num_key_value_heads=next(iter(full_kv)),
        head_dim=head_dim,
        v_head_dim=meta.int("attention.value_length"),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        sliding_window=meta.int("attention.sliding_window"),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial},
            "sliding_attention": {"rope_type": "default", "rope_theta": meta.float("rope.freq_base_swa", theta),
                                  "partial_rotary_factor": partial}},
        attention_value_scale=meta.float("attention.value_scale"),
        attention_bias=_has(meta.model, "attn_q.bias"),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        n_routed_experts=meta.int("expert_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        n_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        norm_topk_prob=True,
        routed_scaling_factor=1.0,
        mlp_layer_types=["sparse" if i in moe else "dense" for i in range(layers)],
    )
    return config


def kimi_linear_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """KimiLinearModel.set_gguf_parameters (conversion/kimi_linear.py, from the release's config: linear_attn_config,
    num_experts, num_experts_per_token, num_shared_experts, first_k_dense_replace, moe_router_activation_func,
    model_max_length) and the base's: head_count_kv one a layer (0 on the KDA layers, 1 on the MLA ones: the
    converter's MQA view), ssm.conv_kernel and kda.head_dim (linear_attn_config's short_conv_kernel_size and
    head_dim; KDA has head_count heads), q_lora_rank (absent when null) and kv_lora_rank, rope.dimension_count
    (qk_rope_head_dim), key_length_mla (nope + rope) and value_length_mla (v_head_dim), the expert keys, the
    dense first layers, expert_weights_scale. Read back in transformers' KimiLinearConfig names (layer_types,
    linear_num_heads, linear_head_dim, linear_conv_kernel_dim, mlp_layer_types, model_max_length, num_experts,
    num_experts_per_token, num_shared_experts, num_expert_group, moe_renormalize). llama.cpp runs it as
    src/models/kimi-linear.cpp does, which is transformers' Kimi Linear when:

    - routing is sigmoid with the correction bias (expert_gating_func, which llama.cpp's loader requires;
      softmax is refused), renormalized (the graph always renormalizes: the release's moe_renormalize) and
      scaled by expert_weights_scale (required: a file without it would have its routed experts zeroed);
    - the MLA layers have no rope (transformers' Kimi Linear is NoPE; no rope scaling is read).
    The converter writes expert_group_used_count from topk_group but no group count (the release names it
    num_expert_group): one group, as llama.cpp runs it and the release has it."""
    where = f"{meta.model.path}: a {meta.arch} GGUF of Kimi Linear"
    require_gating(meta, where, "Kimi Linear", required=True, why=" (llama.cpp's loader requires the key)")
    if meta.get("expert_weights_scale") is None:
        raise SourceError(f"{where} without expert_weights_scale; llama.cpp would scale the routed experts by 0")
    config = _common_config(meta, arch)
    _no_rope_scaling(meta, config)
    config.pop("rope_theta")
    layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
    kv_heads = meta.get("attention.head_count_kv")
    if not isinstance(kv_heads, list) or len(kv_heads) != layers or not all(isinstance(k, int) for k in kv_heads):
        raise SourceError(f"{where} without attention.head_count_kv one a layer (0 on the KDA layers)")
    rope = meta.int("rope.dimension_count")
    key_mla = meta.int("attention.key_length_mla")
    if key_mla <= rope:
        raise SourceError(f"{where} whose MLA keys ({key_mla}) are no wider than their rope part ({rope})")
    dense = meta.int("leading_dense_block_count", 0)
    moe = _expert_layers(meta.model)
    if moe != list(range(dense, layers)):
        raise SourceError(f"{where} with routed experts in layers {moe}; leading_dense_block_count says {dense} "
                          f"dense layers, then experts on each of the {layers}")
    q_lora = meta.get("attention.q_lora_rank")
    if (q_lora is None) == _has(meta.model, "attn_q_a.weight") and any(kv_heads):
        raise SourceError(f"{where} whose attention.q_lora_rank and attn_q_a tensors disagree")
    model_max_length = config.pop("max_position_embeddings")
    value_length = meta.get("attention.value_length")  # (the base's, from the release's head_dim)
    config.update(
        num_key_value_heads=heads,  # (MLA: every head its own key and value; the file's 1 is llama.cpp's MQA view)
        model_max_length=model_max_length,
        layer_types=["full_attention" if k else "linear_attention" for k in kv_heads],
        linear_num_heads=heads,
        linear_head_dim=meta.int("kda.head_dim"),
        linear_conv_kernel_dim=meta.int("ssm.conv_kernel"),
        kv_lora_rank=meta.int("attention.kv_lora_rank"),
        q_lora_rank=None if q_lora is None else meta.int("attention.q_lora_rank"),
        qk_rope_head_dim=rope,
        qk_nope_head_dim=key_mla - rope,
        qk_head_dim=key_mla,
        v_head_dim=meta.int("attention.value_length_mla"),
        intermediate_size=meta.int("feed_forward_length"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        num_experts=meta.int("expert_count"),
        num_experts_per_token=meta.int("expert_used_count"),
        num_shared_experts=meta.int("expert_shared_count", 0),
        num_expert_group=meta.int("expert_group_count", 1),
        topk_group=meta.int("expert_group_used_count", 1),
        moe_renormalize=True,
        routed_scaling_factor=meta.float("expert_weights_scale"),
        mlp_layer_types=["dense" if i < dense else "sparse" for i in range(layers)],
    )
    if isinstance(value_length, int):
        config["head_dim"] = value_length
    return config
