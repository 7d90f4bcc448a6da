"""Architecture families the converter knows: config normalization and tensor-name tables.

A family is data, not code: which config keys hold the MoE sizes, which layers are MoE, and
which tensor names to drop (vision towers, multi-token-prediction heads). Expert tensor names
are shared by all families and listed once in EXPERT_NAME_PATTERNS, one row per on-disk layout.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import SourceError, UnsupportedArchitectureError
from .format import SWIGLU, ExpertActivation

# One row per on-disk layout of routed-expert tensors. Groups: layer, expert (per-expert only),
# proj, and what ("weight" or "weight_scale_inv", the FP8 block scales).
EXPERT_NAME_PATTERNS: tuple[re.Pattern[str], ...] = (
    # per-expert, Qwen/DeepSeek/GLM names: model.layers.3.mlp.experts.17.gate_proj.weight
    re.compile(r"^model\.(?:language_model\.)?layers\.(?P<layer>[0-9]+)\.mlp\.experts\.(?P<expert>[0-9]+)\."
               r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<what>weight|weight_scale_inv)$"),
    # per-expert, Nemotron-H names (not gated: no gate_proj): model.layers.1.mixer.experts.5.up_proj.weight
    # (the release's backbone.layers..., renamed); fused as transformers holds them: model.layers.1.mixer.experts.up_proj
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.mixer\.experts\.(?P<expert>[0-9]+)\."
               r"(?P<proj>up_proj|down_proj)\.(?P<what>weight)$"),
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.mixer\.experts\.(?P<proj>up_proj|down_proj)$"),
    # per-expert, Jamba names: model.layers.1.feed_forward.experts.5.gate_proj.weight
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.feed_forward\.experts\.(?P<expert>[0-9]+)\."
               r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<what>weight|weight_scale_inv)$"),
    # per-expert, Mixtral names: model.layers.3.block_sparse_moe.experts.5.w1.weight (w1 gate, w3 up, w2 down)
    # (LFM2-MoE's: model.layers.3.feed_forward.experts.5.w1.weight; Kimi Linear's, its block_sparse_moe
    # renamed mlp: model.layers.3.mlp.experts.5.w1.weight)
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.(?:block_sparse_moe|feed_forward|mlp)\.experts\.(?P<expert>[0-9]+)\."
               r"(?P<proj>w1|w2|w3)\.(?P<what>weight|weight_scale_inv)$"),
    # fused, transformers>=5 / Qwen3.5 names: model.layers.3.mlp.experts.gate_up_proj [E, 2I, H]
    # (Granite's as transformers>=5 names them: model.layers.3.block_sparse_moe.experts.gate_up_proj; LFM2-MoE's
    # model.layers.3.feed_forward.experts.gate_up_proj, not under language_model.: Llama 4's there lie transposed)
    re.compile(r"^model\.(?:language_model\.)?layers\.(?P<layer>[0-9]+)\.(?:mlp|block_sparse_moe)\.experts\."
               r"(?P<proj>gate_up_proj|down_proj)(?:\.(?P<what>weight))?$"),
    # fused and not gated, Ergo's as transformers names them: model.layers.3.mlp.experts.up_proj [E, H, I] (x @ W)
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.mlp\.experts\.(?P<proj>up_proj)$"),
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.feed_forward\.experts\.(?P<proj>gate_up_proj|down_proj)$"),
    # fused, Gemma 4 names, the experts beside the layer's dense MLP: model.layers.3.experts.gate_up_proj [E, 2I, H]
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.experts\.(?P<proj>gate_up_proj|down_proj)$"),
    # fused, Granite names: model.layers.3.block_sparse_moe.input_linear.weight [E, 2I, H] (gate rows,
    # then up: transformers renames it gate_up_proj as it is), output_linear.weight [E, H, I] (down)
    # (JetMoE's MLP experts: model.layers.3.mlp.input_linear.weight, the same layout)
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.(?:block_sparse_moe|mlp)\."
               r"(?P<proj>input_linear|output_linear)\.(?P<what>weight)$"),
    # fused, Llama 4 names: language_model.model.layers.3.feed_forward.experts.gate_up_proj [E, H, 2I] (gate
    # columns, then up) and down_proj [E, I, H], both the transpose of transformers>=5's usual layout
    re.compile(r"^language_model\.model\.layers\.(?P<layer>[0-9]+)\.feed_forward\.experts\."
               r"(?P<proj>gate_up_proj|down_proj)$"),
    # fused and flat, DBRX names: transformer.blocks.3.ffn.experts.mlp.w1 [E * I, H] (gate), v1 (up)
    # and w2 (down, each expert's [I, H]: the transpose), all three the same shape (convert.py)
    re.compile(r"^transformer\.blocks\.(?P<layer>[0-9]+)\.ffn\.experts\.mlp\.(?P<proj>w1|v1|w2)$"),
    # fused, gpt-oss names beside gate_up_proj [E, H, 2I] and down_proj [E, I, H]: their biases
    # (model.layers.3.mlp.experts.gate_up_proj_bias [E, 2I], down_proj_bias [E, H]), and the released
    # MXFP4 weights, e2m1 nibbles and e8m0 exponents (gate_up_proj_blocks [E, 2I, H / 32, 16] and
    # gate_up_proj_scales [E, 2I, H / 32]; down_proj's [E, H, I / 32, ...]: ftw/mxfp4.py)
    re.compile(r"^model\.layers\.(?P<layer>[0-9]+)\.mlp\.experts\."
               r"(?P<proj>gate_up_proj|down_proj)_(?P<what>bias|blocks|scales)$"),
)
PROJ_ALIASES = {"v1": "up_proj", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "input_linear": "gate_up_proj",
                "output_linear": "down_proj"}
EXPERTS_MARKER = re.compile(r"\.experts\.")
# experts that are dense weights, not banks: shared experts; JetMoE's attention experts (each a
# query and an output projection, run inside attention: runtime/models/jetmoe.py); Ergo's per-expert
# output norms [E, H]
DENSE_EXPERTS = ("shared_expert", ".self_attention.experts.", ".experts.post_expert_norm.")
LAYER_NUMBER = re.compile(r"^model\.(?:language_model\.)?layers\.([0-9]+)\.")


@dataclass(frozen=True)
class ExpertTensorName:
    layer: int
    expert: int | None  # None for fused tensors holding every expert
    proj: str  # gate_proj | up_proj | down_proj | gate_up_proj
    what: str  # weight | weight_scale_inv (FP8 block scales) | bias | blocks | scales (MXFP4)


def index_in_name(text: str, name: str) -> int:
    """A layer, block or expert number as a tensor name writes it: ASCII digits, no leading zero.
    Any other spelling would let two names ("layers.1" and "layers.01", or a digit of another
    script) stand for one tensor, the last silently replacing the first."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise SourceError(f"tensor {name!r}: {text!r} is not a plain decimal index (ASCII digits, no leading "
                          "zero); the file was not written by a known converter")
    return int(text)


def parse_expert_name(name: str) -> ExpertTensorName | None:
    """Classify a routed-expert tensor name; None for every other tensor."""
    for pattern in EXPERT_NAME_PATTERNS:
        m = pattern.match(name)
        if m:
            expert = m.groupdict().get("expert")
            proj = m["proj"]
            return ExpertTensorName(
                layer=index_in_name(m["layer"], name),
                expert=index_in_name(expert, name) if expert is not None else None,
                proj=PROJ_ALIASES.get(proj, proj),
                what=m.groupdict().get("what") or "weight",
            )
    if EXPERTS_MARKER.search(name) and not any(marker in name for marker in DENSE_EXPERTS):
        raise SourceError(f"tensor {name!r} looks like a routed expert but matches no known layout")
    return None


# one layer's attention: (heads, key-value heads, q/k head_dim, v head_dim)
AttentionSizes = tuple[int, int, int, int]


@dataclass(frozen=True)
class Family:
    """How to read one architecture's config; everything else is shared."""

    name: str
    model_types: tuple[str, ...]
    num_experts_keys: tuple[str, ...]  # aliases, first present wins (transformers renames some on save)
    moe_layers: Callable[[dict[str, Any]], list[int]]
    text_config_key: str | None = None  # multimodal configs nest the text model's config
    drop_prefixes: tuple[str, ...] = ()  # tensors of parts ft does not run (vision, MTP heads)
    drop_layers_from_num_layers: bool = False  # DeepSeek/GLM ship MTP layers numbered >= num_layers
    num_shared_experts: Callable[[dict[str, Any]], int] = lambda c: 0
    intermediate_key: str = "moe_intermediate_size"
    top_k_keys: tuple[str, ...] = ("num_experts_per_tok",)  # aliases, first present wins (ERNIE's moe_k)
    per_layer_keys: tuple[str, ...] = ()  # sizes config.json may list once per layer (Hunyuan's moe_topk): all alike
    head_dim_key: str = "head_dim"  # (JetMoE's kv_channels; hidden_size / heads where absent)
    quant_methods: tuple[str, ...] = ("fp8",)  # quantization_config.quant_method values the converter reads
    # how fused expert tensors lie where the family's experts say so, not their shapes
    # (transformers' use_experts_implementation(is_concatenated=False, is_transposed=True) of
    # gpt-oss): gate and up alternate along gate_up_proj's 2I (even columns the gate), and both are
    # [E, in, out] (x @ W), also where in == out (gpt-oss-20b's down_proj is [E, 2880, 2880])
    fused_gate_up_interleaved: bool = False
    fused_experts_transposed: bool | None = None  # None: told by the shapes (convert.py)
    # the function between an expert's two projections, from the (text) config
    expert_activation: Callable[[dict[str, Any]], ExpertActivation] = lambda c: SWIGLU
    # the usual keys (num_hidden_layers, hidden_size, ...) for a config that names them its own way
    # (DBRX's d_model, n_layers, attn_config, ffn_config), laid over it
    config_view: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    # a checkpoint's tensor names made the ones the runtime reads, each (pattern, replacement) in
    # turn (`tensor_name`): DeepSeek-V4's release names its tensors its own way (_DEEPSEEK_V4_NAMES)
    renames: tuple[tuple[re.Pattern[str], str], ...] = ()
    # dense 2-D tensors (by the checkpoint's name) stored as the transpose of what the runtime reads,
    # transposed at conversion (Ergo's release keeps its router and shared expert as [in, out])
    transposed: tuple[re.Pattern[str], ...] = ()
    # per layer, from the text config, where attention is not sized alike on every layer (MiMo-V2-Flash's
    # sliding layers have twice the key-value heads, and values narrower than keys): the tensor check's sizes
    attention_sizes: Callable[[dict[str, Any]], list[AttentionSizes]] | None = None
    # multimodal model types that hold this family's text model under `text_config_key` among others
    # (`mistral3`: dense Mistral Small 3.x or Mistral Small 4's mistral4): the text config's model_type decides
    wrapper_model_types: tuple[str, ...] = ()
    # why a config of this model type has no routed experts, or None where it has them (Gemma 4's dense
    # and MoE models share gemma4_text): such a checkpoint is refused by name before any download
    dense_reason: Callable[[dict[str, Any]], str | None] = lambda c: None
    # its dense MLPs and shared experts have gate_proj beside up_proj and down_proj (Nemotron-H's do not)
    gated_mlps: bool = True

    def tensor_name(self, name: str) -> str:
        """`name` as the runtime reads it (transformers' name); every reader of a checkpoint's
        tensor names (the converter, the fit planner's footprint) asks this first."""
        for pattern, replacement in self.renames:
            name = pattern.sub(replacement, name)
        return name

    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        if self.text_config_key and isinstance(config.get(self.text_config_key), dict):
            return config[self.text_config_key]
        if self.config_view is not None:
            return {**config, **self.config_view(config)}
        return config

    def keeps(self, name: str, num_layers: int) -> bool:
        if name.startswith(self.drop_prefixes):
            return False
        if self.drop_layers_from_num_layers:
            m = LAYER_NUMBER.match(name)
            if m and index_in_name(m.group(1), name) >= num_layers:
                return False
        return True


def _qwen3_moe_layers(c: dict[str, Any]) -> list[int]:
    step = int(c.get("decoder_sparse_step", 1) or 1)
    dense = set(c.get("mlp_only_layers") or [])
    return [i for i in range(c["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0]


def _first_k_dense_layers(c: dict[str, Any]) -> list[int]:
    if isinstance(c.get("mlp_layer_types"), list):
        return [i for i, kind in enumerate(c["mlp_layer_types"]) if kind == "sparse"]
    k = int(c.get("first_k_dense_replace", 0) or 0)
    freq = int(c.get("moe_layer_freq", 1) or 1)
    return [i for i in range(k, c["num_hidden_layers"]) if (i - k) % freq == 0]


def _all_layers(c: dict[str, Any]) -> list[int]:
    return list(range(c["num_hidden_layers"]))


def _dbrx_view(c: dict[str, Any]) -> dict[str, Any]:
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


def _ernie_moe_layers(c: dict[str, Any]) -> list[int]:
    """Every `moe_layer_interval`-th layer from `moe_layer_start_index` to `moe_layer_end_index`
    (-1: the last), as Ernie4_5_MoeConfig's defaults (1, -1, 1) fill them in."""
    n = c["num_hidden_layers"]
    start, end = int(c.get("moe_layer_start_index", 1)), int(c.get("moe_layer_end_index", -1))
    interval = int(c.get("moe_layer_interval", 1))
    if interval < 1:
        raise ValueError("moe_layer_interval below 1")  # (normalized_config names the config damaged)
    end = n - 1 if end == -1 else end
    return [i for i in range(n) if (i + 1) % interval == 0 and start <= i <= end]


def _jamba_moe_layers(c: dict[str, Any]) -> list[int]:
    """Every `expert_layer_period`-th layer from `expert_layer_offset` (JambaConfig's 2 and 1), none
    where there is one expert (JambaConfig.layers_num_experts: a dense MLP then)."""
    period = int(c.get("expert_layer_period", 2))
    offset = int(c.get("expert_layer_offset", 1))
    if period < 1:
        raise ValueError("expert_layer_period below 1")  # (normalized_config names the config damaged)
    if int(c.get("num_experts", 16)) <= 1:
        return []
    return [i for i in range(c["num_hidden_layers"]) if i % period == offset]


def _llama4_moe_layers(c: dict[str, Any]) -> list[int]:
    """`moe_layers`, else Llama4TextConfig's default: every `interleave_moe_layer_step`-th layer."""
    if isinstance(c.get("moe_layers"), list):
        return sorted({int(i) for i in c["moe_layers"]})
    step = int(c.get("interleave_moe_layer_step", 1) or 1)
    return list(range(step - 1, c["num_hidden_layers"], step))


def _glm4_moe_lite_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else Glm4MoeLiteConfig's default: the first layer dense, the rest MoE
    (transformers reads no first_k_dense_replace or moe_layer_freq for this family; MiMo-V2-Flash's
    and Laguna's defaults are the same)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": 1, "moe_layer_freq": 1})


def _deepseek_v32_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (DeepseekV32Config's
    default 3), the rest MoE (transformers reads no moe_layer_freq for this family)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 3), "moe_layer_freq": 1})


def _dense_prefix_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (default 0), the rest
    MoE, as Cohere2MoeConfig derives them (no moe_layer_freq)."""
    return _first_k_dense_layers({**c, "moe_layer_freq": 1})


def _after_dense_layers(c: dict[str, Any]) -> list[int]:
    """The layers from `num_dense_layers` on (AfmoeConfig's default 1): the first ones are dense."""
    return list(range(int(c.get("num_dense_layers", 1) or 0), c["num_hidden_layers"]))


def _lfm2_moe_layers(c: dict[str, Any]) -> list[int]:
    """The layers from `num_dense_layers` on (Lfm2MoeConfig's default 2)."""
    return _after_dense_layers({**c, "num_dense_layers": c.get("num_dense_layers", 2)})


def _mimo_v2_flash_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """MiMo-V2-Flash's sliding layers have twice the key-value heads of its full ones; values are
    `v_head_dim` wide (MiMoV2FlashConfig's 128), keys `head_dim` (192). The layer schedule as
    runtime/models/mimo_v2_flash.py reads it."""
    n, heads = int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    kv, head_dim, v_dim = int(c["num_key_value_heads"]), int(c.get("head_dim") or 192), int(c.get("v_head_dim") or 128)
    types = c.get("layer_types") or ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention"
                                     for i in range(n)]
    return [(heads, kv * (2 if kind == "sliding_attention" else 1), head_dim, v_dim) for kind in types]


def _laguna_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Laguna's query heads, layer by layer (`num_attention_heads_per_layer`); the key-value heads
    and head_dim are every layer's."""
    n, kv, head_dim = int(c["num_hidden_layers"]), int(c["num_key_value_heads"]), int(c.get("head_dim") or 128)
    heads = c.get("num_attention_heads_per_layer") or [c["num_attention_heads"]] * n
    return [(int(h), kv, head_dim, head_dim) for h in heads]


def _kimi_linear_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (KimiLinearConfig's
    default 1), the rest MoE (no moe_layer_freq)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


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


# KimiLinearConfig's and BailingHybridConfig's attribute_map: the usual key -> the name their
# config.json (the releases', and transformers' saves) writes
_LING_NAMES = {"max_position_embeddings": "model_max_length", "norm_topk_prob": "moe_renormalize",
               "n_group": "num_expert_group", "num_local_experts": "num_experts",
               "num_experts_per_tok": "num_experts_per_token", "n_shared_experts": "num_shared_experts"}


def kimi_linear_view(c: dict[str, Any]) -> dict[str, Any]:
    """Kimi Linear's config under the usual names (_LING_NAMES), where it writes its own."""
    return {key: c[name] for key, name in _LING_NAMES.items() if c.get(name) is not None and key not in c}


bailing_hybrid_view = kimi_linear_view  # (the same attribute_map, beside num_mtp_layers, which nothing reads)


def _bailing_hybrid_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (BailingHybridConfig's
    default 2), the rest MoE (no moe_layer_freq)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 2), "moe_layer_freq": 1})


def _bailing_hybrid_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Ling's KDA layers: `num_attention_heads` heads of `linear_head_dim` (transformers' saves),
    else of `head_dim` (the release's, BailingHybridConfig's 128); its MLA layers have no k_proj."""
    heads, head_dim = int(c["num_attention_heads"]), int(c.get("linear_head_dim") or c.get("head_dim") or 128)
    return [(heads, heads, head_dim, head_dim)] * int(c["num_hidden_layers"])


def _kimi_linear_attention(c: dict[str, Any]) -> list[AttentionSizes]:
    """Kimi Linear's KDA layers project q, k and v to their own heads (kimi_linear_sizes); its MLA
    layers have no k_proj to check."""
    heads, head_dim = kimi_linear_sizes(c)
    return [(heads, heads, head_dim, head_dim)] * int(c["num_hidden_layers"])


def _exaone_moe_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (ExaoneMoeConfig's
    default 1, not DeepSeek's 0), the rest MoE."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


def _dense_then_moe_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else the first `first_k_dense_replace` layers dense (default 1, as
    SarvamMoEConfig, Param2MoeConfig and MiniCPM5MoeConfig fill it in), the rest MoE (no moe_layer_freq)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": c.get("first_k_dense_replace", 1), "moe_layer_freq": 1})


def _sparse_unless_dense_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else every layer MoE (MellumConfig's default)."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": 0, "moe_layer_freq": 1})


def _flint_layers(c: dict[str, Any]) -> list[int]:
    """Qwen3-MoE's rule (`mlp_only_layers` dense, every `decoder_sparse_step`-th layer MoE), the
    dense layers FlintConfig's [0, 1] where the config names none."""
    only = c.get("mlp_only_layers")
    return _qwen3_moe_layers({**c, "mlp_only_layers": [0, 1] if only is None else only})


def _beam_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else BeamConfig's: the first three layers dense, the rest MoE."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": 3, "moe_layer_freq": 1})


def _ergo_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else ErgoConfig's: the first `num_dense_blocks` (default 1) layers dense."""
    return _first_k_dense_layers({**c, "first_k_dense_replace": int(c.get("num_dense_blocks", 1)), "moe_layer_freq": 1})


# Ergo's release names (its training framework's), as transformers' conversion_mapping renames them
_ERGO_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
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


def _axk1_layers(c: dict[str, Any]) -> list[int]:
    """`mlp_layer_types`, else AXK1Config's (and AXK2Config's) derivation from the older keys: MoE from
    `first_k_dense_replace` (default 1) on, on every `moe_layer_freq`-th layer counted from 0."""
    if isinstance(c.get("mlp_layer_types"), list):
        return [i for i, kind in enumerate(c["mlp_layer_types"]) if kind == "sparse"]
    k, freq = int(c.get("first_k_dense_replace", 1)), int(c.get("moe_layer_freq", 1))
    return [i for i in range(c["num_hidden_layers"]) if i >= k and i % freq == 0]


# SarvamMoEConfig's and Param2MoeConfig's attribute_map: the usual key -> the name their releases' config.json writes
_SARVAM_CONFIG_KEYS = {"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts",
                 "attention_bias": "use_qkv_bias"}


def sarvam_moe_view(c: dict[str, Any]) -> dict[str, Any]:
    """Sarvam's and Param2's config under the usual names (_SARVAM_CONFIG_KEYS), where it writes its own."""
    return {key: c[name] for key, name in _SARVAM_CONFIG_KEYS.items() if c.get(name) is not None and key not in c}


# Sarvam's and Param2's release names, as transformers' conversion_mapping (sarvam_moe, param2moe) renames
# them; the fused attention.query_key_value [q | k | v rows] keeps its name under self_attn (the runtime
# reads it apart: runtime/models/sarvam_moe.py). One row per rename, in order.
_SARVAM_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^model\.word_embeddings\.", "model.embed_tokens."),
    (r"\.attention\.", ".self_attn."),
    (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
    (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."),
    (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."),
    (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
))


def _gpt_oss_activation(c: dict[str, Any]) -> ExpertActivation:
    """GptOssExperts' clamped SwiGLU: `swiglu_alpha` and `swiglu_limit`, GptOssConfig's defaults
    (1.702, 7.0) where the config leaves them out (the released ones give only the limit)."""
    return ExpertActivation("swiglu_clamped", positive_float("swiglu_alpha", c.get("swiglu_alpha", 1.702)),
                            positive_float("swiglu_limit", c.get("swiglu_limit", 7.0)))


# DeepSeek-V4's names, as transformers' conversion_mapping.py (deepseek_v4) renames them and its FP8
# quantizer its `.scale`s; names already transformers' pass unchanged. One row per rename, in order.
_DEEPSEEK_V4_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
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
_KIMI_K25_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    # the release's (language_model.model.layers.0...); transformers' original-format save writes the
    # layers as `blocks` (its kimi_k25 conversion renames every "blocks" to "layers" on load)
    (r"^language_model\.model\.(?:layers|blocks)\.", "model.layers."),
    (r"^language_model\.model\.", "model."),
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^model\.language_model\.", "model."),  # (transformers' own layout)
))


# a llava-style multimodal checkpoint's text model (Mistral3ForConditionalGeneration's) under the text
# model's own names; the vision tower and projector are dropped. One row per rename.
_LLAVA_TEXT_NAMES = tuple((re.compile(pattern), replacement) for pattern, replacement in (
    (r"^language_model\.model\.", "model."),  # (the original format, as the releases and save_pretrained write it)
    (r"^language_model\.lm_head\.", "lm_head."),
    (r"^model\.language_model\.", "model."),  # (transformers' own layout, save_original_format=False)
))
_LLAVA_VISION = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


def _deepseek_v4_activation(c: dict[str, Any]) -> ExpertActivation:
    """DeepseekV4Experts' SwiGLU of gate and up clamped at `swiglu_limit` (DeepseekV4Config's 10)."""
    return ExpertActivation("swiglu_limited", limit=positive_float("swiglu_limit", c.get("swiglu_limit", 10.0)))


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


def _one_activation(family: str, key: str, name: str, kind: str) -> Callable[[dict[str, Any]], ExpertActivation]:
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


def _gemma4_dense_reason(c: dict[str, Any]) -> str | None:
    if c.get("enable_moe_block") and c.get("num_experts"):
        return None
    return ("its text config has no MoE block (enable_moe_block is off, num_experts unset): a dense Gemma 4 "
            "(E2B, E4B, 31B), not the 26B-A4B")


# Gemma 4's vision and audio towers and their embedders (Gemma4ForConditionalGeneration's), dropped
# Nemotron-H's layer kinds as NemotronHConfig names them (layers_block_type), from a release's
# hybrid_override_pattern (one character a layer) or the older names transformers remaps
_NEMOTRON_H_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_NEMOTRON_H_LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}


def nemotron_h_layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's kind (linear_attention: Mamba2, full_attention, moe, mlp): `layers_block_type`
    (transformers 5's saves) or `layer_types`, else the release's `hybrid_override_pattern`, else
    NemotronHConfig's default; ValueError for one ft cannot read."""
    types = c.get("layers_block_type") or c.get("layer_types")
    if types is None and isinstance(c.get("hybrid_override_pattern"), str):
        types = [_NEMOTRON_H_PATTERN.get(ch, ch) for ch in c["hybrid_override_pattern"]]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(types, list):
        raise ValueError(f"layers_block_type is {str(types)[:60]}, not a list")
    types = [_NEMOTRON_H_LEGACY.get(t, t) for t in types]
    unknown = sorted({str(t) for t in types} - set(_NEMOTRON_H_PATTERN.values()))
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


def _nemotron_h_moe_layers(c: dict[str, Any]) -> list[int]:
    return [i for i, kind in enumerate(nemotron_h_layer_types(c)) if kind == "moe"]


def _nemotron_h_dense_reason(c: dict[str, Any]) -> str | None:
    if "moe" in nemotron_h_layer_types(c):
        return None
    return "its layers have no MoE (no E in hybrid_override_pattern: a dense Nemotron-H)"


_GEMMA4_TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3_moe", ("qwen3_moe",), ("num_experts", "num_local_experts"), _qwen3_moe_layers),
        Family(
            "qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text"), ("num_experts", "num_local_experts"), _all_layers,
            text_config_key="text_config", drop_prefixes=("model.visual.", "mtp."),
            num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family(
            "qwen2_moe", ("qwen2_moe",), ("num_experts", "num_local_experts"), _qwen3_moe_layers,
            num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family(
            "qwen3_next", ("qwen3_next",), ("num_experts", "num_local_experts"), _qwen3_moe_layers,
            drop_prefixes=("mtp.",), num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family("olmoe", ("olmoe",), ("num_experts", "num_local_experts"), _all_layers, intermediate_key="intermediate_size"),
        Family("minimax_m2", ("minimax_m2",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size", drop_layers_from_num_layers=True, drop_prefixes=("mtp.",)),
        Family("minimax", ("minimax",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size"),
        Family("mixtral", ("mixtral",), ("num_local_experts", "num_experts"), _all_layers, intermediate_key="intermediate_size"),
        Family("phimoe", ("phimoe",), ("num_local_experts", "num_experts"), _all_layers, intermediate_key="intermediate_size"),
        Family("dbrx", ("dbrx",), ("num_local_experts",), _all_layers, intermediate_key="intermediate_size",
               config_view=_dbrx_view),
        Family("flex_olmo", ("flex_olmo",), ("num_experts", "num_local_experts"), _all_layers,
               intermediate_key="intermediate_size"),
        Family("granitemoe", ("granitemoe",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size"),
        Family("granitemoeshared", ("granitemoeshared",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size",
               num_shared_experts=lambda c: 1 if c.get("shared_intermediate_size") else 0),
        Family("granitemoe_swa", ("granitemoe_swa",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size",
               num_shared_experts=lambda c: 1 if c.get("shared_intermediate_size") else 0),
        Family(  # (a shared MLP on every layer, whether or not config.json sizes it: GraniteMoeHybridConfig's default)
            "granitemoehybrid", ("granitemoehybrid",), ("num_local_experts", "num_experts"), _all_layers,
            intermediate_key="intermediate_size", num_shared_experts=lambda c: 1),
        Family(  # (attention or Mamba and the MoE or a dense MLP by period and offset: runtime/models/jamba.py)
            "jamba", ("jamba",), ("num_experts", "num_local_experts"), _jamba_moe_layers,
            intermediate_key="intermediate_size"),
        Family("jetmoe", ("jetmoe",), ("num_local_experts", "num_experts"), _all_layers,
               intermediate_key="intermediate_size", head_dim_key="kv_channels"),
        Family(  # (Kimi K2 is this model under its own model_type; K2.5 and K2.6 its text model: _KIMI_K25_NAMES)
            "deepseek_v3", ("deepseek_v3", "kimi_k2", "kimi_k25"), ("n_routed_experts", "num_local_experts"),
            _first_k_dense_layers, text_config_key="text_config", drop_layers_from_num_layers=True,
            drop_prefixes=("vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector."),
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0), renames=_KIMI_K25_NAMES,
        ),
        Family(
            "deepseek_v2", ("deepseek_v2",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(
            "glm4_moe", ("glm4_moe",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(  # (every layer MoE: transformers reads no first_k_dense_replace for Solar Open)
            "solar_open", ("solar_open",), ("n_routed_experts", "num_local_experts"), _all_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(
            "glm4_moe_lite", ("glm4_moe_lite",), ("n_routed_experts", "num_local_experts"), _glm4_moe_lite_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(
            "dots1", ("dots1",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(  # Llama4ForConditionalGeneration: the text model under language_model., the vision tower dropped
            "llama4", ("llama4",), ("num_local_experts",), _llama4_moe_layers, text_config_key="text_config",
            drop_prefixes=("vision_model.", "multi_modal_projector."), num_shared_experts=lambda c: 1,
            intermediate_key="intermediate_size",
        ),
        Family(
            "glm_moe_dsa", ("glm_moe_dsa",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(
            "deepseek_v32", ("deepseek_v32",), ("n_routed_experts", "num_local_experts"), _deepseek_v32_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(  # (every layer MoE; one shared expert whatever n_shared_experts, as transformers builds it)
            "deepseek_v4", ("deepseek_v4",), ("n_routed_experts", "num_local_experts"), _all_layers,
            drop_prefixes=("mtp.", "model.mtp."), drop_layers_from_num_layers=True, num_shared_experts=lambda c: 1,
            expert_activation=_deepseek_v4_activation, renames=_DEEPSEEK_V4_NAMES,
        ),
        Family(
            "ernie4_5_moe", ("ernie4_5_moe",), ("moe_num_experts", "num_experts"), _ernie_moe_layers,
            top_k_keys=("moe_k", "num_experts_per_tok"), drop_prefixes=("model.mtp_",),
            num_shared_experts=lambda c: int(c.get("moe_num_shared_experts", 2)),  # (Ernie4_5_MoeConfig's default)
        ),
        Family(  # (experts and the one shared MLP are `intermediate_size` wide, as transformers builds them)
            "hunyuan_v1_moe", ("hunyuan_v1_moe",), ("num_experts", "num_local_experts"), _all_layers,
            top_k_keys=("moe_topk", "num_experts_per_tok"), per_layer_keys=("moe_topk",),
            intermediate_key="intermediate_size", num_shared_experts=lambda c: 1,
        ),
        Family(
            "exaone_moe", ("exaone_moe",), ("num_experts", "num_local_experts"), _exaone_moe_layers,
            drop_prefixes=("mtp.",), num_shared_experts=lambda c: int(c.get("num_shared_experts", 1)),
        ),
        Family(  # (the head tied to the embeddings unless the config says otherwise: Lfm2MoeConfig's default)
            "lfm2_moe", ("lfm2_moe",), ("num_experts", "num_local_experts"), _lfm2_moe_layers,
        ),
        Family(  # (no shared experts: transformers builds none)
            "mimo_v2_flash", ("mimo_v2_flash",), ("n_routed_experts", "num_local_experts"), _glm4_moe_lite_layers,
            drop_prefixes=("model.mtp.", "mtp."), attention_sizes=_mimo_v2_flash_attention,
            # the release's name of the sliding layers' sinks (transformers' conversion_mapping renames it)
            renames=((re.compile(r"\.self_attn\.attention_sink_bias$"), ".self_attn.sinks"),),
        ),
        Family(  # (a shared MLP `shared_expert_intermediate_size` wide on every MoE layer)
            "laguna", ("laguna",), ("num_experts", "num_local_experts"), _glm4_moe_lite_layers,
            num_shared_experts=lambda c: 1, attention_sizes=_laguna_attention,
            # the release's names (transformers' conversion_mapping renames them)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.mlp\.experts\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
                (r"\.mlp\.shared_expert\.", ".mlp.shared_experts."))),
        ),
        Family(
            "kimi_linear", ("kimi_linear",), ("num_local_experts", "n_routed_experts", "num_experts"), _kimi_linear_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), attention_sizes=_kimi_linear_attention,
            config_view=kimi_linear_view,
            # the release's names (transformers' conversion_mapping renames them; its q/k/v convs, which
            # transformers concatenates, the runtime reads apart: runtime/layers/kimi_delta_attention.py)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.self_attn\.(f_a_proj|f_b_proj)\.", r".self_attn.forget_gate.\1."),
                (r"\.self_attn\.(dt_bias|A_log)$", r".self_attn.forget_gate.\1"),
                (r"\.block_sparse_moe\.", ".mlp."))),
        ),
        Family(
            "bailing_hybrid", ("bailing_hybrid",), ("num_local_experts", "num_experts"), _bailing_hybrid_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), attention_sizes=_bailing_hybrid_attention,
            config_view=bailing_hybrid_view, drop_layers_from_num_layers=True,
            # the release's names (transformers' conversion_mapping renames them; its q/k/v convs, which
            # transformers concatenates, the runtime reads apart: runtime/layers/kimi_delta_attention.py)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"^model\.word_embeddings\.", "model.embed_tokens."),
                (r"\.attention\.", ".self_attn."),
                (r"\.self_attn\.f_proj\.", ".self_attn.forget_gate.f_proj."),
                (r"\.self_attn\.(dt_bias|A_log)$", r".self_attn.forget_gate.\1"),
                (r"\.self_attn\.dense\.", ".self_attn.o_proj."),
                (r"\.mlp\.gate\.expert_bias$", ".mlp.gate.e_score_correction_bias"))),
        ),
        Family(  # (Param2 is this model under its own model_type: the same code and names)
            "sarvam_moe", ("sarvam_moe", "param2moe"), ("n_routed_experts", "num_experts", "num_local_experts"),
            _dense_then_moe_layers, drop_layers_from_num_layers=True, config_view=sarvam_moe_view,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", c.get("num_shared_experts", 1)) or 0),
            renames=_SARVAM_NAMES,
        ),
        Family(
            "minicpm5_moe", ("minicpm5_moe",), ("n_routed_experts", "num_local_experts"), _dense_then_moe_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            # transformers' own name of the query-and-gate projection; the release's is q_proj
            renames=((re.compile(r"\.self_attn\.q_gate_proj\."), ".self_attn.q_proj."),),
        ),
        Family(  # (the releases keep the MoE output norm beside the layer's norms, transformers under mlp.)
            "axk1", ("axk1",), ("n_routed_experts", "num_local_experts"), _axk1_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            renames=((re.compile(r"^(model\.layers\.[0-9]+)\.post_mlp_layernorm\."), r"\1.mlp.post_mlp_layernorm."),),
        ),
        Family(  # (DeepSeek-V3.2's model, its MTP layers after num_hidden_layers dropped; the release's names as
            # transformers' conversion_mapping renames them: the query-and-gate projection, the gated norms' MLP)
            "axk2", ("axk2",), ("n_routed_experts", "num_local_experts"), _axk1_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.self_attn\.q_b_proj\.", ".self_attn.q_gate_proj."),
                (r"_layernorm\.W_down\.", "_layernorm.mlp.fc1."),
                (r"_layernorm\.W_up\.", "_layernorm.mlp.fc2."))),
        ),
        Family(  # (Mistral Small 4: a mistral3 checkpoint around it, its vision parts dropped)
            "mistral4", ("mistral4",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            text_config_key="text_config", wrapper_model_types=("mistral3",), drop_prefixes=_LLAVA_VISION,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), renames=_LLAVA_TEXT_NAMES,
        ),
        Family(  # (its shared experts one MLP, num_shared_experts times moe_intermediate_size wide)
            "hy_v3", ("hy_v3",), ("num_experts", "num_local_experts"), _dense_then_moe_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("num_shared_experts", 1) or 0),
            # the release's names (transformers' conversion_mapping renames them)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.mlp\.router\.gate\.weight$", ".mlp.gate.weight"),
                (r"\.mlp\.expert_bias$", ".mlp.e_score_correction_bias"),
                (r"\.mlp\.shared_mlp\.", ".mlp.shared_experts."))),
        ),
        Family(  # (its sliding and full layers' KV alike: heads and head_dim shared)
            "mellum", ("mellum",), ("num_local_experts", "num_experts"), _sparse_unless_dense_layers,
            drop_prefixes=("mtp.", "model.mtp."),
        ),
        Family(  # (one ungated shared expert on every MoE layer; the release names the sinks softmax_offset)
            "flint", ("flint",), ("num_experts", "num_local_experts"), _flint_layers, num_shared_experts=lambda c: 1,
            renames=((re.compile(r"\.self_attn\.softmax_offset$"), ".self_attn.sinks"),),
        ),
        Family(  # (every layer MoE with shared experts; the release's names as transformers' conversion_mapping renames them)
            "kolibri1", ("kolibri1",), ("num_local_experts", "num_experts"), _all_layers, num_shared_experts=lambda c: 1,
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
                (r"\.post_attn_norm\.", ".post_self_attn_layernorm."),
                (r"\.post_ffn_norm\.", ".post_mlp_layernorm."))),
        ),
        Family("beam", ("beam",), ("num_experts",), _beam_layers),  # (no shared experts; the experts as Qwen's)
        Family(  # (relu2 experts, not gated, fused [E, in, out] either way; the release's names renamed, its router
            # and shared expert transposed, as transformers' conversion_mapping does)
            "ergo", ("ergo",), ("num_experts",), _ergo_layers, num_shared_experts=lambda c: 1,
            expert_activation=lambda c: ExpertActivation("relu2"), gated_mlps=False, fused_experts_transposed=True,
            renames=_ERGO_NAMES, transposed=(re.compile(r"\.feed_forward\.(?:gate_kernel|shared_up_proj|shared_down_proj)$"),),
        ),
        Family(
            "afmoe", ("afmoe",), ("num_experts", "num_local_experts"), _after_dense_layers,
            num_shared_experts=lambda c: int(c.get("num_shared_experts", 2) or 0),
        ),
        Family(  # (experts `intermediate_size` wide, as transformers builds them, and the shared ones a multiple of it)
            "cohere2_moe", ("cohere2_moe",), ("num_experts", "num_local_experts"), _dense_prefix_layers,
            intermediate_key="intermediate_size", num_shared_experts=lambda c: int(c.get("num_shared_experts", 0) or 0),
        ),
        Family(  # (the release is a gemma4 checkpoint around it, its towers dropped; experts fused, beside the dense MLP)
            "gemma4_text", ("gemma4_text",), ("num_experts",), _all_layers, text_config_key="text_config",
            wrapper_model_types=("gemma4",), drop_prefixes=_GEMMA4_TOWERS, top_k_keys=("top_k_experts",),
            expert_activation=_one_activation("gemma4_text", "hidden_activation", "gelu_pytorch_tanh", "geglu_tanh"),
            attention_sizes=gemma4_attention, dense_reason=_gemma4_dense_reason,
            renames=((re.compile(r"^model\.language_model\."), "model."),),
        ),
        Family(  # (two MLA sublayers and one MoE a layer; the router's rows count the zero experts too, which
            # have no weights: runtime/models/longcat_flash.py; the release's MTP layer dropped)
            "longcat_flash", ("longcat_flash",), ("n_routed_experts", "num_local_experts"), _all_layers,
            intermediate_key="expert_ffn_hidden_size", top_k_keys=("moe_topk", "num_experts_per_tok"),
            config_view=longcat_flash_view, drop_prefixes=("mtp.", "model.mtp."),
        ),
        Family(  # (one mixer or FFN a layer; relu2 experts, not gated, and a relu2 shared MLP; the release's
            # names under backbone., transformers' own under model.; its MTP layers dropped)
            "nemotron_h", ("nemotron_h",), ("n_routed_experts", "num_local_experts"), _nemotron_h_moe_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), config_view=nemotron_h_view,
            expert_activation=_one_activation("nemotron_h", "mlp_hidden_act", "relu2", "relu2"),
            dense_reason=_nemotron_h_dense_reason, gated_mlps=False,
            drop_prefixes=("mtp.", "model.mtp.", "backbone.mtp."),
            renames=((re.compile(r"^backbone\."), "model."), (re.compile(r"^model\.embeddings\."), "model.embed_tokens."),
                     (re.compile(r"^model\.norm_f\."), "model.norm.")),
        ),
        Family(  # (the released checkpoints' experts are MXFP4: dequantized to bf16 at conversion, convert.py)
            "gpt_oss", ("gpt_oss",), ("num_local_experts", "num_experts"), _all_layers,
            intermediate_key="intermediate_size", quant_methods=("mxfp4",), fused_gate_up_interleaved=True,
            fused_experts_transposed=True, expert_activation=_gpt_oss_activation,
        ),
    )
}


def family_for_config(config: dict[str, Any]) -> Family:
    """The family of a checkpoint's config.json; unknown ones are refused with the list."""
    model_type = config.get("model_type")
    wrapping = [f for f in FAMILIES.values() if model_type in f.wrapper_model_types]
    if wrapping:
        return _with_experts(model_type, config, _family_of_text_model(model_type, config, wrapping))
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return _with_experts(model_type, config, family)
    listed = config.get("architectures")
    names = ", ".join(str(a) for a in listed) if isinstance(listed, list) else repr(listed) if listed else ""
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} ({names or 'no architectures listed'}) "
        f"has no converter; supported families: {', '.join(sorted(FAMILIES))}"
    )


def _with_experts(model_type: str, config: dict[str, Any], family: Family) -> Family:
    """`family`, where the config has routed experts; a dense model of a model type shared with a
    MoE one (gemma4_text) is refused by name."""
    reason = family.dense_reason(family.text_config(config))
    if reason is not None:
        raise UnsupportedArchitectureError(
            f"architecture {model_type!r} has no converter for this checkpoint: {reason}. ft runs "
            f"mixture-of-experts models (a dense model has no experts to offload); of {family.name} only its MoE "
            f"models; supported families: {', '.join(sorted(FAMILIES))}")
    return family


def _family_of_text_model(model_type: str, config: dict[str, Any], wrapping: list[Family]) -> Family:
    """The family of a multimodal checkpoint that may hold one of several text models (`mistral3`):
    its text config's model_type's; a dense one, or one ft does not run, is refused by name."""
    text = config.get(wrapping[0].text_config_key or "text_config")
    inner = text.get("model_type") if isinstance(text, dict) else None
    for family in wrapping:
        if inner in family.model_types:
            return family
    known = ", ".join(f"{model_type} around {t}" for f in wrapping for t in f.model_types)
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} with a {inner!r} text model has no converter: ft runs mixture-of-experts "
        f"models, and of {model_type!r} checkpoints only {known} (a dense text model such as Mistral Small 3.x's "
        f"'mistral' has no experts to offload); supported families: {', '.join(sorted(FAMILIES))}")


# the most any real model has, with room: a config beyond these is damaged or hostile (a layer
# count of 10**12 made the converter loop and allocate without end); the context's is also the
# most a stored index may give (ftw/check_tensors.py MAX_CONTEXT_LENGTH)
LIMITS = {"num_hidden_layers": 4096, "num_attention_heads": 4096, "num_key_value_heads": 4096, "hidden_size": 1 << 20,
          "vocab_size": 1 << 24, "head_dim": 1 << 16, "num_experts": 1 << 16, "num_experts_per_tok": 1 << 16,
          "moe_intermediate_size": 1 << 20, "max_position_embeddings": 1 << 24}


def config_int(key: str, value: Any, *, low: int = 1, high: int | None = None, where: str = "config.json") -> int:
    """A size from an untrusted config: a whole number in [low, high] (LIMITS by key), or SourceError
    naming the key ("2048.0" as JSON writes it is taken; true, "2048" and 1e309 are not)."""
    high = LIMITS.get(key, 1 << 30) if high is None else high
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SourceError(f"{where}: {key} is {value!r}, not a whole number from {low} to {high}; "
                          "the checkpoint's config is damaged")
    return value


def positive_float(key: str, value: Any, where: str = "config.json") -> float:
    """A rate or constant from an untrusted config: a finite number above 0, or SourceError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise SourceError(f"{where}: {key} is {value!r}, not a finite number above 0; the checkpoint's config is damaged")
    return float(value)


def weight_block_size(quant: Any) -> list[int]:
    """The FP8 block of a config's quantization_config: two whole numbers (default 128 x 128)."""
    block = quant.get("weight_block_size") if isinstance(quant, dict) else None
    if block is None:
        return [128, 128]
    if not isinstance(block, list) or len(block) != 2:
        raise SourceError(f"config.json: quantization_config.weight_block_size is {block!r}, not two numbers "
                          "[rows, columns]; the checkpoint's config is damaged")
    return [config_int("weight_block_size", b, high=1 << 16) for b in block]


def one_per_layer(key: str, values: list[Any], where: str = "config.json") -> Any:
    """The value of a size config.json lists once per layer (Hunyuan's moe_topk), where every layer
    has the same; SourceError where they differ (the runtime sizes all layers alike) or none is given."""
    if not values or any(v != values[0] for v in values):
        raise SourceError(f"{where}: {key} is {values!r}; ft runs models whose layers all have the same {key}")
    return values[0]


def normalized_config(family: Family, config: dict[str, Any]) -> dict[str, Any]:
    """The sizes every consumer of an FTW model needs, under one set of names (docs/FTW.md), each
    checked (`config_int`): a config is untrusted input."""
    c = family.text_config(config)
    c = {**c, **{key: one_per_layer(key, c[key]) for key in family.per_layer_keys if isinstance(c.get(key), list)}}

    def need(*keys: str, high: int | None = None) -> int:
        for key in keys:
            if c.get(key) is not None:
                return config_int(key, c[key], high=high)
        raise SourceError(f"config.json of this {family.name} model lacks {' or '.join(map(repr, keys))}")

    def optional(key: str, default: int, low: int = 1, high: int | None = None) -> int:
        return config_int(key, c[key], low=low, high=high) if c.get(key) is not None else default

    quant = c.get("quantization_config") or config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method is not None and method not in family.quant_methods:  # (before any download: fetch.py reads the config first)
        readable = " and ".join(f"quant_method {m}" for m in family.quant_methods)
        raise SourceError(f"config.json: the checkpoint is quantized with {method!r}; ft converts bf16, f16 and f32 "
                          f"{family.name} checkpoints and quantized ones of {readable}: pull the model's unquantized "
                          "or FP8 release, or a GGUF of it")
    num_layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    hidden = need("hidden_size")
    num_experts = need(*family.num_experts_keys)
    for key, low in (("decoder_sparse_step", 1), ("first_k_dense_replace", 0), ("moe_layer_freq", 1)):
        optional(key, 0, low=low, high=num_layers)  # checked only: the family's moe_layers reads them
    try:
        moe_layers = family.moe_layers({**c, "num_hidden_layers": num_layers})
        shared = config_int("number of shared experts", family.num_shared_experts(c), low=0, high=1 << 10)
    except (TypeError, ValueError, OverflowError):
        raise SourceError(f"config.json: the MoE layers or shared experts of this {family.name} model cannot be "
                          "read (mlp_only_layers, mlp_layer_types, n_shared_experts); the checkpoint's config is "
                          "damaged") from None
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    for key in ("rms_norm_eps", "rope_theta"):  # a NaN eps gave NaN logits; a negative base, garbage positions
        if c.get(key) is not None:
            positive_float(key, c[key])
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        positive_float("rope_theta", rope["rope_theta"])
    return {
        "family": family.name,
        "model_type": config.get("model_type"),
        "num_layers": num_layers,
        "hidden_size": hidden,
        "vocab_size": need("vocab_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": optional("num_key_value_heads", heads, high=heads),
        "head_dim": optional(family.head_dim_key, hidden // heads),
        "num_experts": num_experts,
        "num_experts_per_tok": need(*family.top_k_keys, high=num_experts),
        "moe_intermediate_size": need(family.intermediate_key),
        "num_shared_experts": config_int("n_shared_experts", shared, low=0, high=1 << 10),
        "moe_layers": moe_layers,
        "context_length": optional("max_position_embeddings", 0, low=0),
        "rope_theta": rope.get("rope_theta", c.get("rope_theta")) if isinstance(rope, dict) else c.get("rope_theta"),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))),
    }


_NORMS = (".input_layernorm.weight", ".post_attention_layernorm.weight", ".norm_attn_norm.norm_1.weight",
          ".norm_attn_norm.norm_2.weight", ".operator_norm.weight", ".ffn_norm.weight",
          ".pre_ff_layernorm.weight")
_FINAL_NORMS = ("model.norm.weight", "model.language_model.norm.weight", "language_model.model.norm.weight",
                "transformer.norm_f.weight", "model.embedding_norm.weight", "model.final_layernorm.weight")
_ROUTERS = (".mlp.gate.weight", ".block_sparse_moe.gate.weight", ".block_sparse_moe.router.layer.weight",
            ".block_sparse_moe.router.weight", ".mlp.router.layer.weight", ".self_attention.experts.router.layer.weight",
            ".mlp.router.weight", ".mlp.gate.wg.weight",
            ".feed_forward.router.weight", ".ffn.router.layer.weight", ".mlp.router.gate.weight",
            ".feed_forward.gate.weight", ".router.proj.weight")
_EMBEDDINGS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "lm_head.weight",
               "language_model.model.embed_tokens.weight", "language_model.lm_head.weight", "transformer.wte.weight")


def check_dense_shape(name: str, shape: tuple[int, ...], config: dict[str, Any]) -> None:
    """The tensors every family sizes by the config, checked against it (`config` normalized):
    the layer norms [hidden], the router [experts, hidden], the embeddings and head [*, hidden].
    A norm of the wrong length was converted and failed only at `ft run`; a router with a row
    too few ran, one expert never chosen."""
    hidden = config["hidden_size"]
    expected: tuple[int, ...] | None = None
    if name.endswith(_NORMS) or name in _FINAL_NORMS:
        expected = (hidden,)
    elif name.endswith(_ROUTERS):
        expected = (config["num_experts"], hidden)
    elif name in _EMBEDDINGS and (len(shape) != 2 or shape[1] != hidden or shape[0] < 1):
        raise SourceError(f"tensor {name!r} has shape {list(shape)}, not [vocabulary, {hidden}] (hidden_size); "
                          "the weights do not belong to this config")
    if expected is not None and tuple(shape) != expected:
        raise SourceError(f"tensor {name!r} has shape {list(shape)}, not {list(expected)} as the config sizes it; "
                          "the weights do not belong to this config, or the file is damaged")
