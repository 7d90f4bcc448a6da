"""The tensors an FTW model needs, checked against its normalized config before they are trusted.

One check for every way a model arrives: the safetensors and GGUF converters run it on the
source's tensors before they write anything, and the runtime on a stored index before it loads
one (runtime/loading/registered.py). A fuzz run found both paths let through models that then
crashed `ft run` with a traceback: a tensor gone, a matrix transposed, a norm of [96, 1], a bank
for layer 99.

What every family shares is known here, by the names families.py already lists: each layer
has tensors, there is an embedding table and a final norm, norms are vectors, routers
[experts, hidden], GQA projections sized by the heads, dense MLPs consistent, and expert banks
exactly the config's MoE layers with the parts the record layout implies. Which other tensors a
family reads only its runtime module knows: runtime/loading/family_tensors.py asks it (a build
over shape-only tensors) and is passed to the converters by `ft pull`.

Each function raises TensorProblem, which says what is wrong but not where or the fix: the
converter adds the source file and SourceError, the reader the index and CorruptIndexError.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import FTWError, SourceError
from .families import (
    _EMBEDDINGS,
    _FINAL_NORMS,
    _FINAL_STREAM_MIXERS,
    FAMILIES,
    LIMITS,
    AttentionSizes,
    check_dense_shape,
    family_for_config,
    normalized_config,
)

if TYPE_CHECKING:  # pragma: no cover
    from .format import Index

MAX_CONTEXT_LENGTH = LIMITS["max_position_embeddings"]  # (16M tokens; the longest any released model claims is 10M)
MAX_RANK = 4  # (conv1d weights [C, 1, K] and fused attention experts [E, R, H] are the highest)
LAYER_IN_NAME = re.compile(r"\.(?:layers|blocks)\.([0-9]+)\.")
Shape = tuple[int, ...]
COMPRESSOR_PREFIXES = (".compressor.", ".compressor.indexer.")


class TensorProblem(Exception):
    """What is wrong with a model's tensors or config, in words; the caller adds file and fix.
    `tensor`: the tensor it is about, where there is one (a converter names the file holding it)."""

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__(message)
        self.tensor = tensor


@dataclass(frozen=True)
class BankShape:
    """One MoE layer's expert bank as the check sees it: its expert count and part shapes."""

    num_experts: int
    parts: Mapping[str, Shape]
    quant: Mapping[str, Any] = field(default_factory=dict)
    gated: bool = True  # w13 gate rows then up rows (2I), else up rows alone (I: ExpertActivation.gated)


def check_config(config: Mapping[str, Any], source_config: Mapping[str, Any] | None = None) -> None:
    """The normalized config's sizes (docs/FTW.md "config"): whole numbers in range, MoE layers
    within the layers, a context from 1 to MAX_CONTEXT_LENGTH (0 only where the checkpoint's own
    config gives none, as the converter writes it)."""

    def size(key: str, low: int = 1, high: int | None = None) -> int:
        value = config.get(key)
        high = LIMITS.get(key, 1 << 30) if high is None else high
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise TensorProblem(f"config field {key} is {value!r}, not a whole number from {low} to {high}")
        return value

    num_layers = size("num_layers", high=LIMITS["num_hidden_layers"])
    heads = size("num_attention_heads")
    kv_heads = size("num_key_value_heads", high=heads)
    if heads % kv_heads:
        raise TensorProblem(f"config field num_key_value_heads is {kv_heads}, which does not divide the "
                            f"{heads} attention heads")
    for key in ("hidden_size", "vocab_size", "head_dim", "moe_intermediate_size"):
        size(key)
    num_experts = size("num_experts")
    size("num_experts_per_tok", high=num_experts)
    if "num_shared_experts" in config:
        size("num_shared_experts", low=0, high=1 << 10)
    moe_layers = config.get("moe_layers")
    if not isinstance(moe_layers, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in moe_layers) \
            or moe_layers != sorted(set(moe_layers)) or any(not 0 <= i < num_layers for i in moe_layers):
        raise TensorProblem(f"config field moe_layers is {str(moe_layers)[:80]}, not distinct layer numbers in "
                            f"order from 0 to {num_layers - 1} (num_layers {num_layers})")
    context = size("context_length", low=0, high=MAX_CONTEXT_LENGTH)
    stated = _stated_context(source_config or {})
    if context == 0 and stated:
        raise TensorProblem(f"config field context_length is 0, but the checkpoint's config gives {stated}")


def _stated_context(source_config: Mapping[str, Any]) -> Any:
    text = source_config.get("text_config")
    c = text if isinstance(text, dict) else source_config
    return c.get("max_position_embeddings") or c.get("max_seq_len")


def check_dense(config: Mapping[str, Any], dense: Mapping[str, Shape],
                source_config: Mapping[str, Any] | None = None) -> None:
    """Every dense tensor's shape against the config, and the ones every family needs present
    (attention's per layer where the family sizes it so from its `source_config`: Family.attention_sizes)."""
    hidden, layers = config["hidden_size"], config["num_layers"]
    for name, shape in dense.items():
        if not 1 <= len(shape) <= MAX_RANK or any(d < 1 for d in shape):
            raise TensorProblem(f"tensor {name!r} has shape {list(shape)}: a weight has 1 to {MAX_RANK} "
                                "dimensions, none of them 0", tensor=name)
        per_expert = ".experts." in name and tuple(shape) == (config["num_experts"], hidden)  # (Ergo's, one an expert)
        if name.endswith(("norm.weight", "norm.bias")) and len(shape) != 1 and not per_expert:
            raise TensorProblem(f"tensor {name!r} has shape {list(shape)}; a norm's weight is a vector", tensor=name)
        try:
            check_dense_shape(name, shape, dict(config))
        except SourceError as e:
            raise TensorProblem(str(e).split("; ")[0], tensor=name) from None
        layer = _layer_of(name)
        if layer is not None and layer >= layers:
            raise TensorProblem(f"tensor {name!r} is in layer {layer}; the config has {layers} layers "
                                f"(0 to {layers - 1})", tensor=name)
    if not any(name in dense for name in _EMBEDDINGS if "lm_head" not in name):
        raise TensorProblem("the embedding table (model.embed_tokens.weight or its family's name) is missing")
    # (Qwen4-Exp's residual streams end in a gated mixer whose per-stream norm, [streams x hidden], is its final norm)
    if not any(name in dense for name in _FINAL_NORMS + _FINAL_STREAM_MIXERS):
        raise TensorProblem(f"the final norm ({_FINAL_NORMS[0]} or its family's name) is missing")
    present = {layer for name in dense if (layer := _layer_of(name)) is not None}
    if missing := sorted(set(range(layers)) - present):
        raise TensorProblem(f"layers {missing[:8]} have no dense tensors (no norms, no attention); "
                            f"the config has {layers} layers")
    _check_attention(config, dense, _attention_sizes(config, source_config))
    family = FAMILIES.get(str(config.get("family")))
    _check_mlps(hidden, dense, gated=family is None or family.gated_mlps)


def _layer_of(name: str) -> int | None:
    m = LAYER_IN_NAME.search(name)
    return int(m.group(1)) if m else None


def _want(name: str, shape: Shape, expected: Shape, why: str) -> None:
    if tuple(shape) != tuple(expected):
        raise TensorProblem(f"tensor {name!r} has shape {list(shape)}, not {list(expected)} ({why})", tensor=name)


def _attention_sizes(config: Mapping[str, Any], source_config: Mapping[str, Any] | None) -> list[AttentionSizes] | None:
    """Per layer (heads, key-value heads, q/k head_dim, v head_dim), where the family's attention
    differs by layer (Family.attention_sizes) and the source config is at hand; else None."""
    family = FAMILIES.get(str(config.get("family")))
    if family is None or family.attention_sizes is None or source_config is None:
        return None
    try:
        sizes = family.attention_sizes(family.text_config(dict(source_config)))
    except (TypeError, ValueError, KeyError, IndexError):
        raise TensorProblem(f"the attention sizes of this {family.name} model cannot be read from its config") from None
    if len(sizes) != config["num_layers"]:
        raise TensorProblem(f"its config sizes attention for {len(sizes)} layers, not {config['num_layers']}")
    return sizes


def _check_attention(config: Mapping[str, Any], dense: Mapping[str, Shape],
                     per_layer: list[AttentionSizes] | None = None) -> None:
    """GQA projections (a prefix with k_proj and v_proj; MLA has neither) and per-head q/k norms,
    sized by the config, or by `per_layer` (heads, kv heads, q/k and v head dims) where given."""
    hidden = config["hidden_size"]
    for name, shape in dense.items():
        if not name.endswith(".self_attn.k_proj.weight"):
            continue
        layer = _layer_of(name)
        heads, kv, head_dim, v_dim = (per_layer[layer] if per_layer is not None and layer is not None else
                                      (config["num_attention_heads"], config["num_key_value_heads"],
                                       config["head_dim"], config["head_dim"]))
        sizes = f"hidden_size {hidden}, {heads} heads, {kv} key-value heads of head_dim {head_dim}" + (
            f" (values {v_dim})" if v_dim != head_dim else "")
        prefix = name.removesuffix("k_proj.weight")
        _want(name, shape, (kv * head_dim, hidden), sizes)
        for proj, expected in (("v_proj", (kv * v_dim, hidden)), ("o_proj", (hidden, heads * v_dim))):
            if prefix + proj + ".weight" in dense:
                _want(prefix + proj + ".weight", dense[prefix + proj + ".weight"], expected, sizes)
        q = dense.get(prefix + "q_proj.weight")
        if q is not None and (len(q) != 2 or q[1] != hidden or q[0] not in (heads * head_dim, 2 * heads * head_dim)):
            raise TensorProblem(f"tensor {prefix + 'q_proj.weight'!r} has shape {list(q)}, not "
                                f"[{heads * head_dim}, {hidden}] ({sizes})", tensor=prefix + "q_proj.weight")
    heads, kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    spans: dict[str, str] = {}  # q/k norm -> "per head" or "whole projection" (OLMoE's): one for all
    for name, shape in dense.items():
        if name.endswith(".o_proj.weight") and len(shape) == 2 and shape[0] != hidden:
            raise TensorProblem(f"tensor {name!r} has shape {list(shape)}; its rows are the hidden_size, {hidden}",
                                tensor=name)
        for suffix, count in ((".self_attn.q_norm.weight", heads), (".self_attn.k_norm.weight", kv)):
            if not name.endswith(suffix):
                continue
            layer = _layer_of(name)
            dim = per_layer[layer][2] if per_layer is not None and layer is not None else head_dim  # (Gemma 4's full layers)
            if shape[0] not in (dim, count * dim):
                raise TensorProblem(f"tensor {name!r} has shape {list(shape)}, not [{dim}] (head_dim) or "
                                    f"[{count * dim}] ({count} heads of it)", tensor=name)
            if count > 1:
                spans[name] = "per head" if shape[0] == dim else "whole projection"
    if len(set(spans.values())) > 1:
        head = next(n for n, s in spans.items() if s == "per head")
        whole = next(n for n, s in spans.items() if s != "per head")
        raise TensorProblem(f"tensor {whole!r} has shape {list(dense[whole])} (a whole projection's) and "
                            f"{head!r} {list(dense[head])} (one head's); a model's q/k norms are all one or the other")


def _check_mlps(hidden: int, dense: Mapping[str, Shape], *, gated: bool = True) -> None:
    """Each dense SwiGLU MLP (dense layers, shared experts): gate and up [I, hidden], down [hidden, I];
    not `gated` (Family.gated_mlps: Nemotron-H's), up and down alone."""
    if not gated:
        for name in dense:
            if name.endswith(".up_proj.weight"):
                prefix, up = name.removesuffix("up_proj.weight"), dense[name]
                if len(up) != 2 or up[1] != hidden:
                    raise TensorProblem(f"tensor {name} has shape {list(up)}, not [*, {hidden}] (hidden_size)", tensor=name)
                _want(prefix + "down_proj.weight", dense.get(prefix + "down_proj.weight") or (), (hidden, up[0]),
                      "up_proj's, transposed")
        return
    prefixes = {name.removesuffix(p) for name in dense for p in ("gate_proj.weight", "up_proj.weight",
                                                                 "down_proj.weight") if name.endswith("." + p)}
    # (a KV compressor's gate_proj, beside its kv_proj, is no MLP's: DeepSeek-V4's self_attn.compressor.;
    # nor attention's output gate: AFMoE's self_attn.gate_proj; nor a router's own layer: ZAYA's mlp.gate.down_proj)
    prefixes = {p for p in prefixes if not p.endswith(COMPRESSOR_PREFIXES) and not p.endswith((".self_attn.", ".mlp.gate."))}
    for prefix in prefixes:
        shapes = {p: dense.get(f"{prefix}{p}_proj.weight") for p in ("gate", "up", "down")}
        if missing := [p for p, s in shapes.items() if s is None]:
            raise TensorProblem(f"the MLP {prefix!r} has no {', '.join(p + '_proj' for p in missing)}; it needs "
                                "gate_proj, up_proj and down_proj")
        gate = shapes["gate"]
        assert gate is not None
        if len(gate) != 2 or gate[1] != hidden:
            raise TensorProblem(f"tensor {prefix}gate_proj.weight has shape {list(gate)}, not [*, {hidden}] (hidden_size)",
                                tensor=prefix + "gate_proj.weight")
        _want(prefix + "up_proj.weight", shapes["up"] or (), gate, "as gate_proj")
        _want(prefix + "down_proj.weight", shapes["down"] or (), (hidden, gate[0]), "gate_proj's, transposed")


def expected_parts(config: Mapping[str, Any], bank: BankShape) -> dict[str, Shape]:
    """The part shapes an expert record of the config has: w13 (gate and up fused; the up rows
    alone where the bank is not gated) or w1 and w3 apart (GGUF's mixed types), w2; FP8 block
    scales beside them where the bank has them; the gate|up and down biases, both, where it has
    either (gpt-oss)."""
    inter, hidden = config["moe_intermediate_size"], config["hidden_size"]
    rows = 2 * inter if bank.gated else inter
    parts: dict[str, Shape] = {"w2": (hidden, inter)}
    parts.update({"w1": (inter, hidden), "w3": (inter, hidden)} if "w1" in bank.parts else {"w13": (rows, hidden)})
    if "w13_bias" in bank.parts or "w2_bias" in bank.parts:
        parts.update({"w13_bias": (rows,), "w2_bias": (hidden,)})
    block = bank.quant.get("fp8_block")
    if block is not None:
        if not isinstance(block, list) or len(block) != 2 or not all(isinstance(b, int) and b >= 1 for b in block):
            raise TensorProblem(f"an expert bank's fp8_block is {str(block)[:40]}, not two whole numbers")
        up = (math.ceil(inter / block[0]), math.ceil(hidden / block[1]))
        parts.update({"w1_scale": up, "w3_scale": up,
                      "w2_scale": (math.ceil(hidden / block[0]), math.ceil(inter / block[1]))})
    return parts


def check_banks(config: Mapping[str, Any], banks: Mapping[int, BankShape]) -> None:
    """The banks are the config's MoE layers, each of num_experts records with the parts it needs."""
    expected_layers = config["moe_layers"]
    if sorted(banks) != list(expected_layers):
        raise TensorProblem(f"the expert banks are for layers {sorted(banks)[:8]}, the config's moe_layers are "
                            f"{list(expected_layers)[:8]} (of {config['num_layers']} layers)")
    for layer, bank in sorted(banks.items()):
        if bank.num_experts != config["num_experts"]:
            raise TensorProblem(f"the expert bank of layer {layer} has {bank.num_experts} experts, the config "
                                f"{config['num_experts']}")
        expected = expected_parts(config, bank)
        if set(bank.parts) != set(expected):
            raise TensorProblem(f"the expert bank of layer {layer} has parts {sorted(bank.parts)}, the record "
                                f"layout needs {sorted(expected)}")
        for name, shape in bank.parts.items():
            _want(f"layer {layer} expert part {name}", shape, expected[name],
                  f"hidden_size {config['hidden_size']}, moe_intermediate_size {config['moe_intermediate_size']}")


# the sizes of the normalized config its source config fixes: a stored index whose two disagree
# was edited or damaged (a source num_hidden_layers of 2**31 had the planner ask for a PiB of RAM)
SOURCE_FIXED = ("num_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_layers", "context_length")


def check_source_agrees(family: str, config: Mapping[str, Any], source_config: dict[str, Any]) -> None:
    """The stored source config passes the checks a download's does (families.normalized_config),
    is of `family`, and fixes the sizes SOURCE_FIXED of `config` as they are."""
    try:
        source_family = family_for_config(source_config)
        normalized = normalized_config(source_family, source_config)
    except FTWError as e:
        raise TensorProblem(f"its source_config fails the checks of a download's ({str(e).split('; ')[0]})") from None
    if source_family.name != family:
        raise TensorProblem(f"its family is {family!r}, its source_config's model_type is of {source_family.name!r}")
    for key in SOURCE_FIXED:
        if normalized[key] != config.get(key):
            raise TensorProblem(f"config field {key} is {str(config.get(key))[:40]}, its source_config makes it "
                                f"{str(normalized[key])[:40]}")


def index_tensor_problems(index: Index) -> list[TensorProblem]:
    """Every check of a stored index that fails, the first problem of each (a load refuses the
    first, `ft verify` reports them all): its config, then, where the config holds (the others read their sizes from it),
    its source config's agreement, its dense tensors and its banks, each checked on its own."""
    try:
        check_config(index.config, index.source_config)
    except TensorProblem as e:
        return [e]
    dense = {t.name: t.shape for t in index.tensors if not t.name.endswith("_scale_inv")}
    banks = {b.layer: BankShape(b.num_experts, {p.name: p.shape for p in b.parts}, b.quant, b.activation.gated)
             for b in index.banks}
    checks: list[Callable[[], None]] = [
        lambda: check_source_agrees(index.family, index.config, index.source_config),
        lambda: check_dense(index.config, dense, index.source_config),
        lambda: check_banks(index.config, banks),
    ]
    problems = []
    for check in checks:
        try:
            check()
        except TensorProblem as e:
            problems.append(e)
    return problems


# what `ft pull` passes the converters as `family_check`: (family, normalized config, source
# config, dense shapes) -> None, TensorProblem naming a tensor the family's runtime reads and lacks
FamilyCheck = Callable[[str, Mapping[str, Any], Mapping[str, Any], Mapping[str, Shape]], None]


def check_source_tensors(where: str, family: str, config: Mapping[str, Any], source_config: Mapping[str, Any],
                         dense: Mapping[str, Shape], family_check: FamilyCheck | None,
                         file_of: Mapping[str, str] | None = None) -> None:
    """A converter's check of a source's dense tensors before it writes anything: SourceError
    naming the file (`file_of` the problem's tensor's, else `where`), the tensor and the fix."""
    try:
        check_dense(config, dense, source_config)
        if family_check is not None:
            family_check(family, config, source_config, dense)
    except TensorProblem as e:
        where = (file_of or {}).get(e.tensor or "", where)
        raise SourceError(f"{where}: {e}; the checkpoint is incomplete or damaged, or its config does not belong "
                          "to its weights: download it again from its source (nothing was converted)") from None
