"""A checkpoint's config.json checked and normalized: every size read as a bounded integer (a
config is untrusted input), the sizes every consumer of an FTW model needs under one set of names,
and the dense tensors every family sizes by the config checked against it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .errors import SourceError

if TYPE_CHECKING:
    from .families import Family


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
# (Qwen4-Exp's streams' last mixer, in place of a final norm: beside a vision tower, and its text model alone)
_FINAL_STREAM_MIXERS = ("model.language_model.hyper_connection_mixer.hc_norm.weight", "model.hyper_connection_mixer.hc_norm.weight")
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
