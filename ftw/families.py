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

from .errors import SourceError, UnsupportedArchitectureError

# One row per on-disk layout of routed-expert tensors. Groups: layer, expert (per-expert only),
# proj, and what ("weight" or "weight_scale_inv", the FP8 block scales).
EXPERT_NAME_PATTERNS: tuple[re.Pattern[str], ...] = (
    # per-expert, Qwen/DeepSeek/GLM names: model.layers.3.mlp.experts.17.gate_proj.weight
    re.compile(r"^model\.(?:language_model\.)?layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\."
               r"(?P<proj>gate_proj|up_proj|down_proj)\.(?P<what>weight|weight_scale_inv)$"),
    # per-expert, Mixtral names: model.layers.3.block_sparse_moe.experts.5.w1.weight (w1 gate, w3 up, w2 down)
    re.compile(r"^model\.layers\.(?P<layer>\d+)\.block_sparse_moe\.experts\.(?P<expert>\d+)\."
               r"(?P<proj>w1|w2|w3)\.(?P<what>weight|weight_scale_inv)$"),
    # fused, transformers>=5 / Qwen3.5 names: model.layers.3.mlp.experts.gate_up_proj [E, 2I, H]
    re.compile(r"^model\.(?:language_model\.)?layers\.(?P<layer>\d+)\.mlp\.experts\."
               r"(?P<proj>gate_up_proj|down_proj)(?:\.(?P<what>weight))?$"),
)
PROJ_ALIASES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
EXPERTS_MARKER = re.compile(r"\.experts\.")
LAYER_NUMBER = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.")


@dataclass(frozen=True)
class ExpertTensorName:
    layer: int
    expert: int | None  # None for fused tensors holding every expert
    proj: str  # gate_proj | up_proj | down_proj | gate_up_proj
    what: str  # weight | weight_scale_inv


def parse_expert_name(name: str) -> ExpertTensorName | None:
    """Classify a routed-expert tensor name; None for every other tensor."""
    for pattern in EXPERT_NAME_PATTERNS:
        m = pattern.match(name)
        if m:
            expert = m.groupdict().get("expert")
            proj = m["proj"]
            return ExpertTensorName(
                layer=int(m["layer"]),
                expert=int(expert) if expert is not None else None,
                proj=PROJ_ALIASES.get(proj, proj),
                what=m.groupdict().get("what") or "weight",
            )
    if EXPERTS_MARKER.search(name) and "shared_expert" not in name:
        raise SourceError(f"tensor {name!r} looks like a routed expert but matches no known layout")
    return None


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

    def text_config(self, config: dict[str, Any]) -> dict[str, Any]:
        if self.text_config_key and isinstance(config.get(self.text_config_key), dict):
            return config[self.text_config_key]
        return config

    def keeps(self, name: str, num_layers: int) -> bool:
        if name.startswith(self.drop_prefixes):
            return False
        if self.drop_layers_from_num_layers:
            m = LAYER_NUMBER.match(name)
            if m and int(m.group(1)) >= num_layers:
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


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("qwen3_moe", ("qwen3_moe",), ("num_experts", "num_local_experts"), _qwen3_moe_layers),
        Family(
            "qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text"), ("num_experts", "num_local_experts"), _all_layers,
            text_config_key="text_config", drop_prefixes=("model.visual.", "mtp."),
            num_shared_experts=lambda c: 1 if c.get("shared_expert_intermediate_size") else 0,
        ),
        Family("mixtral", ("mixtral",), ("num_local_experts", "num_experts"), _all_layers, intermediate_key="intermediate_size"),
        Family(
            "deepseek_v3", ("deepseek_v3",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
        Family(
            "glm_moe_dsa", ("glm_moe_dsa",), ("n_routed_experts", "num_local_experts"), _first_k_dense_layers,
            drop_layers_from_num_layers=True, num_shared_experts=lambda c: int(c.get("n_shared_experts") or 0),
        ),
    )
}


def family_for_config(config: dict[str, Any]) -> Family:
    """The family of a checkpoint's config.json; unknown ones are refused with the list."""
    model_type = config.get("model_type")
    for family in FAMILIES.values():
        if model_type in family.model_types:
            return family
    raise UnsupportedArchitectureError(
        f"architecture {model_type!r} ({', '.join(config.get('architectures') or []) or 'no architectures listed'}) "
        f"has no converter; supported families: {', '.join(sorted(FAMILIES))}"
    )


def normalized_config(family: Family, config: dict[str, Any]) -> dict[str, Any]:
    """The sizes every consumer of an FTW model needs, under one set of names (docs/FTW.md)."""
    c = family.text_config(config)

    def need(*keys: str) -> Any:
        for key in keys:
            if c.get(key) is not None:
                return c[key]
        raise SourceError(f"config.json of this {family.name} model lacks {' or '.join(map(repr, keys))}")

    num_layers = int(need("num_hidden_layers"))
    heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    return {
        "family": family.name,
        "model_type": config.get("model_type"),
        "num_layers": num_layers,
        "hidden_size": hidden,
        "vocab_size": int(need("vocab_size")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(c.get("num_key_value_heads") or heads),
        "head_dim": int(c.get("head_dim") or hidden // heads),
        "num_experts": int(need(*family.num_experts_keys)),
        "num_experts_per_tok": int(need("num_experts_per_tok")),
        "moe_intermediate_size": int(need(family.intermediate_key)),
        "num_shared_experts": family.num_shared_experts(c),
        "moe_layers": family.moe_layers({**c, "num_hidden_layers": num_layers}),
        "context_length": int(c.get("max_position_embeddings") or 0),
        "rope_theta": rope.get("rope_theta", c.get("rope_theta")) if isinstance(rope, dict) else c.get("rope_theta"),
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", c.get("tie_word_embeddings", False))),
    }
