"""The Hugging Face config of a Gemma 4 GGUF file (`gemma4`), as llama.cpp's converter writes it
(conversion/gemma.py, Gemma4Model over Gemma3Model, at llama.cpp 0c1e570) and its graph runs it
(src/models/gemma4.cpp).

The converter writes the text config's keys, with Gemma 4's own:
- attention.sliding_window_pattern, one bool a layer from layer_types (llama.cpp requires it), and
  attention.sliding_window;
- attention.key_length/value_length the full layers' head (global_head_dim, or per_layer_config's),
  key_length_swa/value_length_swa the sliding layers' (head_dim); head_count_kv one a layer, the
  sliding layers' num_key_value_heads and the full layers' num_global_key_value_heads;
- rope.freq_base the full layers' base, rope.freq_base_swa the sliding layers' (llama.cpp's default
  10000, Gemma4TextConfig's too), rope.dimension_count the whole full head and dimension_count_swa
  the sliding head times its partial factor;
- the full layers' proportional RoPE as the rope_freqs tensor: factor 1 on the first
  partial_rotary_factor of the frequency pairs, 1e30 (turning nothing) on the rest, over the whole
  head at its spacing, which is transformers' proportional rope; read back into rope_parameters;
- final_logit_softcapping where set, expert_count, expert_used_count, expert_feed_forward_length,
  feed_forward_length, attention.shared_kv_layers and embedding_length_per_layer_input.
The values-from-keys layers (attention_k_eq_v) are those without attn_v: llama.cpp's graph then
takes the values from the key projection, as transformers does. Scores are unscaled on both sides
(llama.cpp's f_attention_scale 1), the value norm has no weight on both sides.

Refused, where llama.cpp would run the file otherwise than transformers can be configured to, or
where ft has no model for it: a layer without experts (a dense Gemma 4, or a mix), per-layer
embeddings, KV shared between layers, a double-wide MLP, a sliding last layer (transformers forces
it full), attn_v missing from a sliding layer or from only some full ones, full layers with KV heads
of their own but values of their own too (no Hugging Face key sizes them), a sliding head rotated in
part, any rope_freqs other than the proportional pattern, RoPE scaling keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import SourceError, UnsupportedArchitectureError
from .gguf_config import Meta, _common_config, _expert_layers, _expert_size

if TYPE_CHECKING:
    from .gguf_source import GGUFArchitecture

UNROTATED_FACTOR = 1e29  # Gemma4Model writes 1e30 for the pairs that do not turn; anything this large turns none


def _per_layer(meta: Meta, key: str, sliding: list[bool], default: Any = None) -> tuple[int, int]:
    """A key written one value a layer (or once): (the sliding layers' value, the full layers')."""
    where = f"{meta.model.path}: GGUF metadata {meta.arch}.{key}"
    value = meta.get(key, default)
    values = value if isinstance(value, list) else [value] * len(sliding)
    if len(values) < len(sliding) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise SourceError(f"{where} is neither one count nor one a layer ({value!r})")
    by_kind = [{v for v, s in zip(values, sliding, strict=False) if s == kind} for kind in (True, False)]
    if any(len(kind) > 1 for kind in by_kind):
        raise UnsupportedArchitectureError(f"{where} differs between layers of one kind ({value!r}); Gemma 4's "
                                           "sliding layers share one value and its full layers another")
    full = next(iter(by_kind[1]))
    return next(iter(by_kind[0]), full), full


def _proportional_fraction(meta: Meta, head_dim: int) -> float:
    """The full layers' partial_rotary_factor from rope_freqs (Gemma4Model.generate_extra_tensors)."""
    where = f"{meta.model.path}: a gemma4 GGUF"
    t = meta.model.tensors.get("rope_freqs.weight")
    if t is None:  # (llama.cpp will not load the file either: its first full layer requires the tensor)
        raise SourceError(f"{where} without rope_freqs.weight, the full layers' proportional RoPE; Gemma4Model "
                          "writes it, and llama.cpp loads no gemma4 file without it")
    if t.dtype != "f32" or t.shape != (head_dim // 2,):
        raise SourceError(f"{where}: rope_freqs.weight is {t.dtype} {list(t.shape)}; Gemma4Model writes "
                          f"{head_dim // 2} float32 factors, one a channel pair of the full layers' head")
    factors = meta.model.read_bytes(t).view("<f4").astype(np.float64)
    turning = int(np.sum(factors == 1.0))
    if not (np.all(factors[:turning] == 1.0) and np.all(factors[turning:] >= UNROTATED_FACTOR)):
        raise UnsupportedArchitectureError(
            f"{where} whose rope_freqs ({factors[:8].tolist()}...) is not the proportional pattern (1 on the first "
            "pairs, 1e30 on the rest) Gemma4Model writes; llama.cpp would scale those frequencies, transformers' "
            "proportional rope does not")
    return 2 * turning / head_dim


def _attention(meta: Meta, sliding: list[bool]) -> dict[str, Any]:
    """Head sizes, KV heads, RoPE and the values-from-keys layers, as transformers' keys."""
    where = f"{meta.model.path}: a gemma4 GGUF"
    full_dim, swa_dim = meta.int("attention.key_length"), meta.int("attention.key_length_swa")
    if (meta.int("attention.value_length", full_dim), meta.int("attention.value_length_swa", swa_dim)) != (full_dim, swa_dim):
        raise SourceError(f"{where} whose value heads differ from its key heads; llama.cpp refuses it too")
    if meta.int("rope.dimension_count", full_dim) != full_dim:
        raise UnsupportedArchitectureError(
            f"{where} rotating {meta.get('rope.dimension_count')} of the full layers' {full_dim} channels; "
            "Gemma4Model writes the whole head and leaves pairs still with rope_freqs (proportional RoPE)")
    swa_rot = meta.int("rope.dimension_count_swa", full_dim)
    if swa_rot != swa_dim:
        raise UnsupportedArchitectureError(
            f"{where} rotating {swa_rot} of the sliding layers' {swa_dim} channels; ft runs Gemma 4's sliding "
            "layers with the whole head rotating, as the released models do")
    swa_kv, full_kv = _per_layer(meta, "attention.head_count_kv", sliding)
    no_values = [f"blk.{i}.attn_v.weight" not in meta.model.tensors for i in range(len(sliding))]
    if any(v and s for v, s in zip(no_values, sliding, strict=True)):
        raise UnsupportedArchitectureError(f"{where} with a sliding layer without attn_v; transformers takes the "
                                           "values from the keys (attention_k_eq_v) on full layers only")
    full_no_values = {v for v, s in zip(no_values, sliding, strict=True) if not s}
    if len(full_no_values) > 1:
        raise UnsupportedArchitectureError(f"{where} with attn_v on some full layers but not others; "
                                           "attention_k_eq_v is one switch for every full layer")
    k_eq_v = full_no_values == {True}
    if not k_eq_v and full_kv != swa_kv:
        raise UnsupportedArchitectureError(
            f"{where} whose full layers have {full_kv} KV heads of their own (the sliding ones {swa_kv}) and values "
            "of their own; transformers gives full layers their own KV heads only where values are the keys'")
    return dict(
        head_dim=swa_dim, global_head_dim=full_dim, num_key_value_heads=swa_kv, attention_k_eq_v=k_eq_v,
        num_global_key_value_heads=full_kv if k_eq_v else None,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": meta.float("rope.freq_base_swa", 10000.0)},
            "full_attention": {"rope_type": "proportional", "rope_theta": meta.float("rope.freq_base", 10000.0),
                               "partial_rotary_factor": _proportional_fraction(meta, full_dim)},
        },
    )


def gemma4_config(meta: Meta, arch: GGUFArchitecture) -> dict[str, Any]:
    """Gemma4Model.set_gguf_parameters (Gemma3Model's, the base's), read back as a gemma4_text config."""
    where = f"{meta.model.path}: a gemma4 GGUF"
    pattern = meta.get("attention.sliding_window_pattern")
    if not isinstance(pattern, list) or not all(isinstance(v, bool) for v in pattern):
        raise SourceError(f"{where} without attention.sliding_window_pattern as one bool a layer ({pattern!r}); "
                          "Gemma4Model writes it from layer_types, and llama.cpp requires it")
    for key, what in (("embedding_length_per_layer_input", "per-layer embeddings (E2B, E4B)"),
                      ("attention.shared_kv_layers", "layers sharing another's KV (E2B, E4B)")):
        if meta.int(key, 0):
            raise UnsupportedArchitectureError(f"{where} with {what} ({meta.arch}.{key} {meta.get(key)}); ft runs "
                                               "Gemma 4's MoE model (26B-A4B), which has none")
    sliding = pattern[: meta.int("block_count")]
    if len(sliding) != meta.int("block_count"):
        raise SourceError(f"{where}: attention.sliding_window_pattern has {len(pattern)} entries for "
                          f"{meta.int('block_count')} layers")
    if sliding[-1]:
        raise UnsupportedArchitectureError(f"{where} whose last layer is sliding; transformers' Gemma 4 makes the "
                                           "last layer full attention whatever layer_types says, llama.cpp does not")
    if _expert_layers(meta.model) != list(range(len(sliding))):
        raise UnsupportedArchitectureError(
            f"{where} with routed experts in layers {_expert_layers(meta.model)} of {len(sliding)}: a dense Gemma 4 "
            "(E2B, E4B, 31B) or a mix; ft runs Gemma 4's MoE model (26B-A4B), experts in every layer")
    dense_width, _ = _per_layer(meta, "feed_forward_length", [False] * len(sliding))
    flat = Meta(meta.model, meta.arch)  # (_common_config reads one KV head count; Gemma 4's come in two kinds)
    flat.values = {**meta.values, f"{meta.arch}.attention.head_count_kv": _per_layer(meta, "attention.head_count_kv",
                                                                                      sliding)[0]}
    config = _common_config(flat, arch)
    if config.pop("rope_scaling", None) is not None:
        raise UnsupportedArchitectureError(f"{where} with rope.scaling.type {meta.get('rope.scaling.type')!r}; "
                                           "Gemma 4's RoPE is proportional (rope_freqs), not scaled")
    del config["hidden_act"], config["rope_theta"]
    softcap = meta.float("final_logit_softcapping")
    config.update(
        _attention(meta, sliding),
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        sliding_window=meta.int("attention.sliding_window"),
        intermediate_size=dense_width,
        enable_moe_block=True,
        num_experts=meta.int("expert_count"),
        top_k_experts=meta.int("expert_used_count"),
        num_experts_per_tok=meta.int("expert_used_count"),
        moe_intermediate_size=meta.int("expert_feed_forward_length", _expert_size(meta.model)),
        # (absent: llama.cpp caps nothing; Gemma4TextConfig's default would cap at 30)
        final_logit_softcapping=softcap or None,
        hidden_activation="gelu_pytorch_tanh",  # llama.cpp's LLM_FFN_GELU, the tanh form
        hidden_size_per_layer_input=0,
        num_kv_shared_layers=0,
        use_double_wide_mlp=False,
        attention_bias=False,
        use_bidirectional_attention=None,  # (llama.cpp's text is causal; vision tokens are not in the file)
        pad_token_id=meta.values.get("tokenizer.ggml.padding_token_id"),
    )
    return config
