"""Architecture families the converter knows: config normalization and tensor-name tables.

A family is data, not code: which config keys hold the MoE sizes, which layers are MoE, and
which tensor names to drop (vision towers, multi-token-prediction heads). Expert tensor names
are shared by all families and listed once in EXPERT_NAME_PATTERNS, one row per on-disk layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import family_readers as readers
from .config_checks import (  # noqa: F401 - re-exported: callers check configs from here
    _EMBEDDINGS,
    _FINAL_NORMS,
    _FINAL_STREAM_MIXERS,
    LIMITS,
    check_dense_shape,
    config_int,
    normalized_config,
    one_per_layer,
    positive_float,
    weight_block_size,
)
from .errors import SourceError, UnsupportedArchitectureError
from .family_readers import (  # noqa: F401 - re-exported: the runtime's families read their configs from here
    AttentionSizes,
    bailing_hybrid_view,
    gemma4_attention,
    gemma4_layer_types,
    hy_v4_indexer_types,
    kimi_linear_layer_types,
    kimi_linear_sizes,
    kimi_linear_view,
    lara_mini_layer_types,
    longcat_flash_view,
    nemotron_h_layer_types,
    nemotron_h_view,
    sarvam_moe_view,
)
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


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3_moe", ("qwen3_moe",), ("num_experts", "num_local_experts"), readers.qwen3_moe_layers),
        Family(
            "qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text"), ("num_experts", "num_local_experts"), readers.all_layers,
            text_config_key="text_config", drop_prefixes=("model.visual.", "mtp."),
            num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family(
            "qwen2_moe", ("qwen2_moe",), ("num_experts", "num_local_experts"), readers.qwen3_moe_layers,
            num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family(
            "qwen3_next", ("qwen3_next",), ("num_experts", "num_local_experts"), readers.qwen3_moe_layers,
            drop_prefixes=("mtp.",), num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family(  # (Qwen3.5's text model beside a vision tower, its experts fused either way; one gated shared expert)
            "qwen4_exp", ("qwen4_exp", "qwen4_exp_text"), ("num_experts",), readers.all_layers,
            text_config_key="text_config", drop_prefixes=("model.visual.", "mtp."), num_shared_experts=lambda c: 1,
            expert_activation=readers.one_activation("qwen4_exp", "hidden_act", "silu", "swiglu"),
        ),
        Family("olmoe", ("olmoe",), ("num_experts", "num_local_experts"), readers.all_layers, intermediate_key="intermediate_size"),
        Family("minimax_m2", ("minimax_m2",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size", drop_layers_from_num_layers=True, drop_prefixes=("mtp.",)),
        Family("minimax", ("minimax",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size"),
        Family("mixtral", ("mixtral",), ("num_local_experts", "num_experts"), readers.all_layers, intermediate_key="intermediate_size"),
        Family("phimoe", ("phimoe",), ("num_local_experts", "num_experts"), readers.all_layers, intermediate_key="intermediate_size"),
        Family("dbrx", ("dbrx",), ("num_local_experts",), readers.all_layers, intermediate_key="intermediate_size",
               config_view=readers.dbrx_view),
        Family("flex_olmo", ("flex_olmo",), ("num_experts", "num_local_experts"), readers.all_layers,
               intermediate_key="intermediate_size"),
        Family("granitemoe", ("granitemoe",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size"),
        Family("granitemoeshared", ("granitemoeshared",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size",
               num_shared_experts=lambda c: 1 if c.get("shared_intermediate_size") else 0),
        Family("granitemoe_swa", ("granitemoe_swa",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size",
               num_shared_experts=lambda c: 1 if c.get("shared_intermediate_size") else 0),
        Family(  # (a shared MLP on every layer, whether or not config.json sizes it: GraniteMoeHybridConfig's default)
            "granitemoehybrid", ("granitemoehybrid",), ("num_local_experts", "num_experts"), readers.all_layers,
            intermediate_key="intermediate_size", num_shared_experts=lambda c: 1),
        Family(  # (attention or Mamba and the MoE or a dense MLP by period and offset: runtime/models/jamba.py)
            "jamba", ("jamba",), ("num_experts", "num_local_experts"), readers.jamba_moe_layers,
            intermediate_key="intermediate_size"),
        Family("jetmoe", ("jetmoe",), ("num_local_experts", "num_experts"), readers.all_layers,
               intermediate_key="intermediate_size", head_dim_key="kv_channels", config_view=readers.jetmoe_view),
        Family(  # (Kimi K2 is this model under its own model_type; K2.5 and K2.6 its text model: readers.KIMI_K25_NAMES)
            "deepseek_v3", ("deepseek_v3", "kimi_k2", "kimi_k25"), ("n_routed_experts", "num_local_experts"),
            readers.first_k_dense_layers, text_config_key="text_config", drop_layers_from_num_layers=True,
            drop_prefixes=("vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector."),
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0), renames=readers.KIMI_K25_NAMES,
        ),
        Family(
            "deepseek_v2", ("deepseek_v2",), ("n_routed_experts", "num_local_experts"), readers.first_k_dense_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(
            "glm4_moe", ("glm4_moe",), ("n_routed_experts", "num_local_experts"), readers.first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(  # (every layer MoE: transformers reads no first_k_dense_replace for Solar Open)
            "solar_open", ("solar_open",), ("n_routed_experts", "num_local_experts"), readers.all_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(
            "glm4_moe_lite", ("glm4_moe_lite",), ("n_routed_experts", "num_local_experts"), readers.glm4_moe_lite_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(
            "dots1", ("dots1",), ("n_routed_experts", "num_local_experts"), readers.first_k_dense_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(  # Llama4ForConditionalGeneration: the text model under language_model., the vision tower dropped
            "llama4", ("llama4",), ("num_local_experts",), readers.llama4_moe_layers, text_config_key="text_config",
            drop_prefixes=("vision_model.", "multi_modal_projector."), num_shared_experts=lambda c: 1,
            intermediate_key="intermediate_size",
        ),
        Family(
            "glm_moe_dsa", ("glm_moe_dsa",), ("n_routed_experts", "num_local_experts"), readers.first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(
            "deepseek_v32", ("deepseek_v32",), ("n_routed_experts", "num_local_experts"), readers.deepseek_v32_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
        ),
        Family(  # (every layer MoE; one shared expert whatever n_shared_experts, as transformers builds it)
            "deepseek_v4", ("deepseek_v4",), ("n_routed_experts", "num_local_experts"), readers.all_layers,
            drop_prefixes=("mtp.", "model.mtp."), drop_layers_from_num_layers=True, num_shared_experts=lambda c: 1,
            expert_activation=readers.deepseek_v4_activation, renames=readers.DEEPSEEK_V4_NAMES,
        ),
        Family(
            "ernie4_5_moe", ("ernie4_5_moe",), ("moe_num_experts", "num_experts"), readers.ernie_moe_layers,
            top_k_keys=("moe_k", "num_experts_per_tok"), drop_prefixes=("model.mtp_",),
            num_shared_experts=lambda c: int(c.get("moe_num_shared_experts", 2)),  # (Ernie4_5_MoeConfig's default)
        ),
        Family(  # (experts and the one shared MLP are `intermediate_size` wide, as transformers builds them)
            "hunyuan_v1_moe", ("hunyuan_v1_moe",), ("num_experts", "num_local_experts"), readers.all_layers,
            top_k_keys=("moe_topk", "num_experts_per_tok"), per_layer_keys=("moe_topk",),
            intermediate_key="intermediate_size", num_shared_experts=lambda c: 1,
        ),
        Family(
            "exaone_moe", ("exaone_moe",), ("num_experts", "num_local_experts"), readers.exaone_moe_layers,
            drop_prefixes=("mtp.",), num_shared_experts=lambda c: int(c.get("num_shared_experts", 1)),
        ),
        Family(  # (the head tied to the embeddings unless the config says otherwise: Lfm2MoeConfig's default)
            "lfm2_moe", ("lfm2_moe",), ("num_experts", "num_local_experts"), readers.lfm2_moe_layers,
        ),
        Family(  # (no shared experts: transformers builds none)
            "mimo_v2_flash", ("mimo_v2_flash",), ("n_routed_experts", "num_local_experts"), readers.glm4_moe_lite_layers,
            drop_prefixes=("model.mtp.", "mtp."), attention_sizes=readers.mimo_v2_flash_attention,
            # the release's name of the sliding layers' sinks (transformers' conversion_mapping renames it)
            renames=((re.compile(r"\.self_attn\.attention_sink_bias$"), ".self_attn.sinks"),),
        ),
        Family(  # (a shared MLP `shared_expert_intermediate_size` wide on every MoE layer)
            "laguna", ("laguna",), ("num_experts", "num_local_experts"), readers.glm4_moe_lite_layers,
            num_shared_experts=lambda c: 1, attention_sizes=readers.laguna_attention,
            # the release's names (transformers' conversion_mapping renames them)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.mlp\.experts\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
                (r"\.mlp\.shared_expert\.", ".mlp.shared_experts."))),
        ),
        Family(
            "kimi_linear", ("kimi_linear",), ("num_local_experts", "n_routed_experts", "num_experts"), readers.kimi_linear_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), attention_sizes=readers.kimi_linear_attention,
            config_view=readers.kimi_linear_view,
            # the release's names (transformers' conversion_mapping renames them; its q/k/v convs, which
            # transformers concatenates, the runtime reads apart: runtime/layers/kimi_delta_attention.py)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.self_attn\.(f_a_proj|f_b_proj)\.", r".self_attn.forget_gate.\1."),
                (r"\.self_attn\.(dt_bias|A_log)$", r".self_attn.forget_gate.\1"),
                (r"\.block_sparse_moe\.", ".mlp."))),
        ),
        Family(
            "bailing_hybrid", ("bailing_hybrid",), ("num_local_experts", "num_experts"), readers.bailing_hybrid_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), attention_sizes=readers.bailing_hybrid_attention,
            config_view=readers.bailing_hybrid_view, drop_layers_from_num_layers=True,
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
            readers.dense_then_moe_layers, drop_layers_from_num_layers=True, config_view=readers.sarvam_moe_view,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", c.get("num_shared_experts", 1)) or 0),
            renames=readers.SARVAM_NAMES,
        ),
        Family(
            "minicpm5_moe", ("minicpm5_moe",), ("n_routed_experts", "num_local_experts"), readers.dense_then_moe_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            # transformers' own name of the query-and-gate projection; the release's is q_proj
            renames=((re.compile(r"\.self_attn\.q_gate_proj\."), ".self_attn.q_proj."),),
        ),
        Family(  # (the releases keep the MoE output norm beside the layer's norms, transformers under mlp.)
            "axk1", ("axk1",), ("n_routed_experts", "num_local_experts"), readers.axk1_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            renames=((re.compile(r"^(model\.layers\.[0-9]+)\.post_mlp_layernorm\."), r"\1.mlp.post_mlp_layernorm."),),
        ),
        Family(  # (DeepSeek-V3.2's model, its MTP layers after num_hidden_layers dropped; the release's names as
            # transformers' conversion_mapping renames them: the query-and-gate projection, the gated norms' MLP)
            "axk2", ("axk2",), ("n_routed_experts", "num_local_experts"), readers.axk1_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.self_attn\.q_b_proj\.", ".self_attn.q_gate_proj."),
                (r"_layernorm\.W_down\.", "_layernorm.mlp.fc1."),
                (r"_layernorm\.W_up\.", "_layernorm.mlp.fc2."))),
        ),
        Family(  # (Mistral Small 4: a mistral3 checkpoint around it, its vision parts dropped)
            "mistral4", ("mistral4",), ("n_routed_experts", "num_local_experts"), readers.first_k_dense_layers,
            text_config_key="text_config", wrapper_model_types=("mistral3",), drop_prefixes=readers.LLAVA_VISION,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), renames=readers.LLAVA_TEXT_NAMES,
        ),
        Family(  # (its shared experts one MLP, num_shared_experts times moe_intermediate_size wide)
            "hy_v3", ("hy_v3",), ("num_experts", "num_local_experts"), readers.dense_then_moe_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("num_shared_experts", 1) or 0),
            # the release's names (transformers' conversion_mapping renames them)
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.mlp\.router\.gate\.weight$", ".mlp.gate.weight"),
                (r"\.mlp\.expert_bias$", ".mlp.e_score_correction_bias"),
                (r"\.mlp\.shared_mlp\.", ".mlp.shared_experts."))),
        ),
        Family(  # (MLA with DSA and sinks, hyper-connections; routed experts clamped as DeepSeek-V4's, the
            # shared ones one MLP n_shared_experts times moe_intermediate_size wide; the release's names renamed)
            "hy_v4", ("hy_v4",), ("n_routed_experts", "num_local_experts"), readers.glm4_moe_lite_layers,
            drop_prefixes=("model.mtp_layers.", "mtp."), num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0),
            expert_activation=readers.hy_v4_activation, renames=readers.HY_V4_NAMES,
        ),
        Family(  # (its sliding and full layers' KV alike: heads and head_dim shared)
            "mellum", ("mellum",), ("num_local_experts", "num_experts"), readers.sparse_unless_dense_layers,
            drop_prefixes=("mtp.", "model.mtp."),
        ),
        Family(  # (one ungated shared expert on every MoE layer; the release names the sinks softmax_offset)
            "flint", ("flint",), ("num_experts", "num_local_experts"), readers.flint_layers, num_shared_experts=lambda c: 1,
            renames=((re.compile(r"\.self_attn\.softmax_offset$"), ".self_attn.sinks"),),
        ),
        Family(  # (every layer MoE with shared experts; the release's names as transformers' conversion_mapping renames them)
            "kolibri1", ("kolibri1",), ("num_local_experts", "num_experts"), readers.all_layers, num_shared_experts=lambda c: 1,
            renames=tuple((re.compile(pattern), replacement) for pattern, replacement in (
                (r"\.moe\.router\.expert_bias$", ".mlp.gate.e_score_correction_bias"),
                (r"\.post_attn_norm\.", ".post_self_attn_layernorm."),
                (r"\.post_ffn_norm\.", ".post_mlp_layernorm."))),
        ),
        Family("beam", ("beam",), ("num_experts",), readers.beam_layers),  # (no shared experts; the experts as Qwen's)
        Family(  # (one-neuron silu experts from the MLP's two embeddings, renamed a non-gated bank; its MoE models only)
            "doge", ("doge",), ("num_experts",), readers.all_layers, config_view=readers.doge_view,
            expert_activation=readers.one_activation("doge", "hidden_act", "silu", "silu"),
            dense_reason=readers.doge_dense_reason, fused_experts_transposed=False, renames=readers.DOGE_NAMES,
        ),
        Family(  # (SwiGLU experts fused [E, 2I, H] as transformers saves them; the router's skip expert is no bank's)
            "zaya", ("zaya",), ("num_experts",), readers.all_layers,
            expert_activation=readers.one_activation("zaya", "hidden_act", "silu", "swiglu"),
        ),
        Family(  # (SwiGLU experts fused [E, 2I, H] either way, one ungated shared expert a layer; the release's fused
            # DeltaNet in_proj stays fused (the runtime splits its output), its out_norm renamed as conversion_mapping does)
            "lara_mini", ("lara_mini",), ("num_experts",), readers.all_layers, num_shared_experts=lambda c: 1,
            expert_activation=readers.one_activation("lara_mini", "hidden_act", "silu", "swiglu"),
            renames=((re.compile(r"\.linear_attn\.out_norm\."), ".linear_attn.norm."),),
        ),
        Family(  # (relu2 experts, not gated, fused [E, in, out] either way; the release's names renamed, its router
            # and shared expert transposed, as transformers' conversion_mapping does)
            "ergo", ("ergo",), ("num_experts",), readers.ergo_layers, num_shared_experts=lambda c: 1,
            expert_activation=lambda c: ExpertActivation("relu2"), gated_mlps=False, fused_experts_transposed=True,
            renames=readers.ERGO_NAMES, transposed=(re.compile(r"\.feed_forward\.(?:gate_kernel|shared_up_proj|shared_down_proj)$"),),
        ),
        Family(
            "afmoe", ("afmoe",), ("num_experts", "num_local_experts"), readers.after_dense_layers,
            num_shared_experts=lambda c: int(c.get("num_shared_experts", 2) or 0),
        ),
        Family(  # (experts `intermediate_size` wide, as transformers builds them, and the shared ones a multiple of it)
            "cohere2_moe", ("cohere2_moe",), ("num_experts", "num_local_experts"), readers.dense_prefix_layers,
            intermediate_key="intermediate_size", num_shared_experts=lambda c: int(c.get("num_shared_experts", 0) or 0),
        ),
        Family(  # (the release is a gemma4 checkpoint around it, its towers dropped; experts fused, beside the dense MLP)
            "gemma4_text", ("gemma4_text",), ("num_experts",), readers.all_layers, text_config_key="text_config",
            wrapper_model_types=("gemma4",), drop_prefixes=readers.GEMMA4_TOWERS, top_k_keys=("top_k_experts",),
            expert_activation=readers.one_activation("gemma4_text", "hidden_activation", "gelu_pytorch_tanh", "geglu_tanh"),
            attention_sizes=readers.gemma4_attention, dense_reason=readers.gemma4_dense_reason,
            renames=((re.compile(r"^model\.language_model\."), "model."),),
        ),
        Family(  # (two MLA sublayers and one MoE a layer; the router's rows count the zero experts too, which
            # have no weights: runtime/models/longcat_flash.py; the release's MTP layer dropped)
            "longcat_flash", ("longcat_flash",), ("n_routed_experts", "num_local_experts"), readers.all_layers,
            intermediate_key="expert_ffn_hidden_size", top_k_keys=("moe_topk", "num_experts_per_tok"),
            config_view=readers.longcat_flash_view, drop_prefixes=("mtp.", "model.mtp."),
        ),
        Family(  # (one mixer or FFN a layer; relu2 experts, not gated, and a relu2 shared MLP; the release's
            # names under backbone., transformers' own under model.; its MTP layers dropped)
            "nemotron_h", ("nemotron_h",), ("n_routed_experts", "num_local_experts"), readers.nemotron_h_moe_layers,
            num_shared_experts=lambda c: int(c.get("n_shared_experts", 1) or 0), config_view=readers.nemotron_h_view,
            expert_activation=readers.one_activation("nemotron_h", "mlp_hidden_act", "relu2", "relu2"),
            dense_reason=readers.nemotron_h_dense_reason, gated_mlps=False,
            drop_prefixes=("mtp.", "model.mtp.", "backbone.mtp."),
            renames=((re.compile(r"^backbone\."), "model."), (re.compile(r"^model\.embeddings\."), "model.embed_tokens."),
                     (re.compile(r"^model\.norm_f\."), "model.norm.")),
        ),
        Family(  # (the released checkpoints' experts are MXFP4: dequantized to bf16 at conversion, convert.py)
            "gpt_oss", ("gpt_oss",), ("num_local_experts", "num_experts"), readers.all_layers,
            intermediate_key="intermediate_size", quant_methods=("mxfp4",), fused_gate_up_interleaved=True,
            fused_experts_transposed=True, expert_activation=readers.gpt_oss_activation,
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
