"""What llama.cpp's converters change in tensors besides their names, and how ft undoes it.

The names themselves map back through gguf_names.py's and gguf_names_own.py's tables. The
changes, architecture by architecture, and how gguf_convert undoes them from the tables here:

- llama (Mixtral), granitemoe: `convert_hf_to_gguf.py` permutes the rows of `attn_q`/`attn_k`
  within each head (`LlamaModel.permute`) for its interleaved RoPE. That is a row permutation, and
  every GGML row is quantized on its own, so `hf_rows_of_llama_qk` undoes it on the stored bytes,
  quantized or not.
- qwen3moe, qwen2moe, olmoe, glm4moe, dots1, minimax-m2, dbrx, deepseek2, ernie4_5-moe: no
  permutation (their converters do not permute: llama.cpp runs the first seven with NeoX RoPE, as
  HF does; DeepSeek's and ERNIE's RoPE already rotate adjacent pairs, HF `rope_interleave` and
  Ernie 4.5's own rotary).
- deepseek2: newer files split MLA's `kv_b_proj` into `attn_k_b` (transposed per head) and
  `attn_v_b`; the converter rebuilds `kv_b_proj` from them (see gguf_convert.py).
- mistral4 (Mistral Small 4, as Mistral4Model over DeepseekV2Model writes it): deepseek2's names and kv_b
  split; `language_model.` dropped, the vision tower not written, the experts already fused in the release
  (gate_up_proj as ffn_gate_up_exps, down_proj as ffn_down_exps, neither transposed).
- glm-dsa (GLM-5, as GlmMoeDsaModel over DeepseekV2Model writes it): deepseek2's names and kv_b split, the
  experts stacked per layer; DSA's indexer (wq_b, wk, k_norm, weights_proj) by name only (its rotated
  channels are interleaved pairs on both sides: LLAMA_ROPE_TYPE_NORM, transformers' GLM-5); the NextN
  block after the last layer dropped.
- mimo2 (MiMo-V2-Flash, as MimoV2Model writes it): nothing but names (NeoX RoPE on part of each head, as
  HF); attention_sink_bias as attn_sinks, the experts stacked per layer, the MTP blocks after the last layer
  dropped; head_count_kv one a layer and sliding_window_pattern read back as layer_types.
- Routed experts are stored fused per layer, `ffn_{gate,up,down}_exps` [E, rows, cols].
- dbrx: DbrxModel views each flat expert tensor [E * I, H] as [E, I, H] and transposes w2's to
  [E, H, I]: the usual ffn_*_exps, which give the FTW bank the HF checkpoint gives. DBRX keeps its
  own HF names (transformer.blocks.N., fused Wqkv), so only its own rows apply (DBRX_*_ROWS).
- granitemoe: the converter splits Granite's fused `input_linear` by rows into gate and up; the
  experts' halves become the FTW record's w13 as they are, the shared MLP's are joined back
  (CONCAT_ROWS). A granitemoe file with shared experts is a granitemoeshared model.
- gpt-oss: GptOssModel splits the HF experts' interleaved gate_up_proj (gate the even rows, up the
  odd ones, biases alike) into ffn_gate_exps and ffn_up_exps, transposes float experts to [E, out,
  in], and repacks MXFP4 ones into GGML's MXFP4 blocks (an e8m0 byte, then 16 bytes of nibbles,
  value j low and j + 16 high), which FTW keeps as they are (`mxfp4`); the sinks are `attn_sinks`.
- hunyuan-moe: HunYuanMoEModel folds the NTK alpha into rope.freq_base (base * alpha^(d / (d - 2)),
  which is what ft's "dynamic" rope computes from alpha), so the file's base is used as it is.
- exaone-moe (K-EXAONE): nothing but names (NeoX RoPE, as HF); its MTP blocks, counted in block_count,
  are dropped.
- lfm2moe (LFM2-MoE): LFM2MoeModel squeezes the short convolution's [C, 1, K] kernel to [C, K] (UNDONE)
  and writes head_count_kv one a layer, 0 on the convolution layers (which gguf_config reads as
  layer_types); its final norm is token_embd_norm.
- granitehybrid (Granite 4.0 hybrid, as GraniteHybridModel over Mamba2Model and GraniteMoeModel writes
  it): the attention layers as granitemoe's (q/k permuted: undone; Granite's MoE split and shared MLP
  joined back); the Mamba2 layers' A_log stored as -exp(A_log) and D, both unsqueezed to [heads, 1],
  the conv squeezed to [C, K], the gated norm [I] reshaped [G, I / G], dt_bias renamed (UNDONE; A_log
  comes back as log(exp(A_log)) in float32, equal to a rounding); head_count_kv one a layer, 0 on the
  Mamba2 layers (gguf_config_layered.py reads it as layer_types).
- jamba (AI21 Jamba, as JambaModel writes it): the Mamba layers' A_log stored as -exp(A_log) (its
  [I, N] shape kept) and the conv squeezed to [I, K] (UNDONE; D, the dt/B/C norms and dt_proj's bias
  as HF has them); head_count_kv one a layer, 0 on the Mamba layers, and the MoE layers those with
  ffn_*_exps (the others' MLP is ffn_gate/up/down): gguf_config_layered.py reads both back as Jamba's
  periods and offsets. The attention is NoPE on both sides, so nothing is permuted; the experts
  are stacked as usual.
- nemotron_h_moe (NVIDIA Nemotron-H MoE, as NemotronHModel over GraniteHybridModel writes it): the
  Mamba2 layers as granitehybrid's (UNDONE, the same four changes); q/k permuted as LlamaModel does
  (GraniteHybridModel's undo_permute; harmless to NoPE attention, undone); the experts stacked, up
  and down alone (relu2, not gated: the FTW record's w13 is ffn_up_exps); head_count_kv and
  feed_forward_length one a layer (Mamba2: both 0; attention: FFN 0; MoE: FFN the experts' width),
  which gguf_config_layered.py reads as layers_block_type.
- afmoe (Arcee Trinity): AfmoeModel derives from LlamaModel but bypasses its modify_tensors, so q/k
  are not permuted (NeoX RoPE, as HF); only names change.
- bailingmoe2 (Sarvam-30B, as SarvamMoEModel writes it): q/k/v stay fused (attn_qkv, the release's
  attention.query_key_value, read apart by the runtime) and are not permuted (NeoX RoPE, as HF); the
  converter makes each layer's expert bias zero-mean (t - t.mean()), which cannot be undone (the mean
  is gone) and changes nothing the model computes: the bias only ranks experts, and group and top-k
  choices are the same under one shift of every bias. Ling 2.0 files (BailingMoeV2Model, rotary over
  part of the head) are refused: no ft family runs them.
- phimoe (Phi-3.5-MoE, as PhiMoeModel over Phi3MiniModel writes it): nothing but names (no permutation:
  llama.cpp runs it with NeoX RoPE, as HF); the LayerNorms and the head keep their biases; LongRoPE's
  factors are the rope_factors_long/short tensors, read back into rope_scaling (gguf_config_more.py).
  llama.cpp itself runs these files otherwise than transformers: RMSNorm plus bias for the LayerNorms,
  softmax top-2 renormalized for sparsemixer, one attn_factor for both mscales. ft runs them as
  transformers' PhiMoE, so its greedy tokens can differ from llama.cpp's on the same file.
- llama4 (Llama 4 Scout/Maverick, text, as Llama4Model writes it): nothing permuted (undo_permute False:
  llama.cpp's llama4 rotates adjacent pairs, as transformers' complex RoPE does); the vision tower is not
  written and `language_model.` is dropped from the names, which LLAMA4_*_ROWS give back; the experts'
  fused gate_up_proj [E, H, 2I] is transposed and split into ffn_gate_exps then ffn_up_exps [E, I, H],
  down_proj transposed to ffn_down_exps [E, H, I]: the usual fused experts. Llama 3 RoPE scaling is only
  the rope_freqs tensor, read back into rope_parameters (gguf_config_more.py).
- qwen3next (Qwen3-Next): in_proj_qkvz is split into attn_qkv (q, k, v of all heads) and attn_gate
  (z) by newer converters, kept whole (ssm_in) by older ones; both read as they are (runtime/models/
  qwen3_next.py), in_proj_ba whole (ssm_ba); the value changes as Qwen3.5's (UNDONE).
- qwen35moe (Qwen3.5/3.6): Qwen3NextModel changes values (UNDONE: A_log, the conv's shape, the
  (1 + w) norms) and _LinearAttentionVReorderBase reorders the DeltaNet's value heads from grouped
  by key head to tiled; undoing that would permute out_proj's columns across quantized blocks, so
  the tiled order is kept and the config says so (`linear_value_head_order`).
- gemma4 (Gemma 4's text model, as Gemma4Model over Gemma3Model writes it): nothing but names (no
  norm shift: Gemma 4's RMSNorm multiplies by w; NeoX RoPE, as HF); router.scale and per_expert_scale
  kept as tensors (ffn_gate_inp.scale, ffn_down_exps.scale), not folded into weights; layer_scalar as
  layer_output_scale; the proportional RoPE only the rope_freqs tensor (gguf_config_gemma4.py).
- kimi-linear (Kimi Linear, as KimiLinearModel writes it): the KDA layers' A_log stored as -exp(A_log) (its
  [1, 1, heads, 1] kept) and the q/k/v short convolutions [C, 1, K] reshaped [1, C, 1, K] (UNDONE; A_log to a
  rounding, as jamba's), dt_bias renamed dt_proj.bias; the MLA layers' kv_b split as deepseek2's (rebuilt);
  the experts stacked per layer; nothing permuted (MLA is NoPE, KDA has no rope). head_count_kv one a layer,
  0 on the KDA layers, 1 on the MLA ones (the converter's MQA view): gguf_config_more.py reads layer_types.
- deepseek4 (DeepSeek-V4, as DeepseekV4Model writes it): nothing permuted (llama.cpp's deepseek4 rotates adjacent
  pairs, as the release does); the hash layers' tid2eid stored int32 (WIDENED back to the release's int64), their
  unused gate.bias dropped by the converter, the FP4 experts repacked into GGML MXFP4 blocks byte for byte (as
  ft's own FP4 conversion does: ftw/fp4.py), FP8 weights dequantized and requantized Q8_0 (kept so), the MTP
  blocks not written.
- HF [1, N] tensors that llama.cpp sizes [N] may be stored either way; they are read [1, N]
  (ROW_VECTORS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import SourceError
from .gguf_names import (
    DEEPSEEK4,
    DELTANET,
    ERNIE,
    GRANITES,
    JAMBA,
    KIMI_LINEAR,
    LFM2MOE,
    MAMBA2_HYBRIDS,
    QWEN_SHARED_EXPERT,
)


@dataclass(frozen=True)
class Concat:
    """One Hugging Face tensor that llama.cpp's converter split by rows into several GGUF tensors."""

    parts: tuple[str, ...]  # after "blk.N.", in the HF tensor's row order
    hf: str  # after "model.layers.N."
    archs: tuple[str, ...]


CONCAT_ROWS: tuple[Concat, ...] = (
    # GraniteMoeModel.modify_tensors: shared_mlp.input_linear [2S, H] split into gate rows, then up
    Concat(("ffn_gate_shexp.weight", "ffn_up_shexp.weight"), "shared_mlp.input_linear.weight", GRANITES),
)


@dataclass(frozen=True)
class Undo:
    """A float tensor llama.cpp's converter changed in value, not only in name: `inverse` maps the
    file's values (float32) back to the Hugging Face tensor's, `hf_shape` its shape."""

    archs: tuple[str, ...]
    inverse: Callable[[np.ndarray], np.ndarray]
    hf_shape: Callable[[tuple[int, ...]], tuple[int, ...]] = lambda shape: shape


def _minus_one(w: np.ndarray) -> np.ndarray:
    return w - np.float32(1.0)


def _flat(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (math.prod(shape),)


def _kda_conv(shape: tuple[int, ...]) -> tuple[int, ...]:
    """KimiLinearModel's KDA conv [C, 1, K] stored [1, C, 1, K] (ggml ne [K, 1, C, 1]): back to [C, 1, K]."""
    if len(shape) < 2:
        raise SourceError(f"a KDA short convolution of shape {list(shape)}; expected [1, C, 1, K]")
    return (math.prod(shape[:-1]), 1, shape[-1])


# Qwen3NextModel.modify_tensors (Qwen3.5's too): A_log stored as -exp(A_log); the depthwise conv
# squeezed from [C, 1, K]; every RMSNorm but the DeltaNet's output norm stored as 1 + w (the
# (1 + w) the model computes). Mamba2Model.modify_tensors (Granite 4.0 hybrid's): A_log as -exp(A_log)
# and D both unsqueezed to [heads, 1], the conv squeezed, the gated norm [I] reshaped [G, I / G].
# JambaModel.modify_tensors: A_log as -exp(A_log) (its shape kept), the conv squeezed. KimiLinearModel's:
# A_log as -exp(A_log) (its [1, 1, heads, 1] kept), the q/k/v convs reshaped [1, C, 1, K]. NemotronHModel's
# (MoE files): Mamba2Model's, the same four.
# By GGUF name (after "blk.N." for block rows), one Undo per set of architectures.
UNDONE: dict[str, tuple[Undo, ...]] = {
    "ssm_a": (Undo((*DELTANET, JAMBA, KIMI_LINEAR), lambda a: np.log(-a)),
              Undo(MAMBA2_HYBRIDS, lambda a: np.log(-a), _flat)),  # Mamba2Model: also unsqueezed to [heads, 1]
    "ssm_conv1d.weight": (Undo((*DELTANET, *MAMBA2_HYBRIDS, JAMBA), lambda w: w, lambda shape: (shape[0], 1, *shape[1:])),),
    **{f"ssm_conv1d_{x}.weight": (Undo((KIMI_LINEAR,), lambda w: w, _kda_conv),) for x in "qkv"},
    "ssm_d": (Undo(MAMBA2_HYBRIDS, lambda d: d, _flat),),  # Mamba2Model's [heads, 1]
    "ssm_norm.weight": (Undo(MAMBA2_HYBRIDS, lambda w: w, _flat),),  # Mamba2Model's [groups, I / groups]
    "shortconv.conv.weight": (Undo((LFM2MOE,), lambda w: w, lambda shape: (shape[0], 1, *shape[1:])),),  # LFM2MoeModel's squeeze
    **{name: (Undo(DELTANET, _minus_one),) for name in ("attn_norm.weight", "post_attention_norm.weight",
                                                         "attn_q_norm.weight", "attn_k_norm.weight", "output_norm.weight")},
}


def undo_for(gguf_name: str, arch: str) -> Undo | None:
    """How to change back the tensor `gguf_name` (after "blk.N.") of architecture `arch`, if it was changed."""
    return next((u for u in UNDONE.get(gguf_name, ()) if arch in u.archs), None)


# integer tensors a converter narrowed, by GGUF name (after "blk.N."): the architectures, the HF dtype
WIDENED: dict[str, tuple[tuple[str, ...], str]] = {
    "ffn_gate_tid2eid.weight": ((DEEPSEEK4,), "i64"),  # DeepseekV4Model._write_hash_routing_tensors: int64 -> I32
}

# HF [1, N] matrices that llama.cpp sizes {N}: a converter may store them 1-D; read as [1, N]
ROW_VECTORS: dict[str, tuple[str, ...]] = {
    "ffn_gate_inp_shexp.weight": QWEN_SHARED_EXPERT,  # Qwen2-MoE's and Qwen3.5's shared_expert_gate [1, H]
    "exp_probs_b.bias": (ERNIE,),  # ERNIE's moe_statics.e_score_correction_bias [1, E]
}

# DeepSeek MLA's kv_b_proj as newer llama.cpp stores it, split per head; rebuilt into KV_B_HF.
KV_B_SPLIT: dict[str, str] = {
    "attn_k_b.weight": "k_b",  # [n_head, kv_lora_rank, qk_nope_head_dim]: the key half, transposed
    "attn_v_b.weight": "v_b",  # [n_head, v_head_dim, kv_lora_rank]: the value half
}
KV_B_HF = "self_attn.kv_b_proj.weight"


def hf_rows_of_llama_qk(num_rows: int, num_heads: int) -> np.ndarray:
    """Row indices that undo llama.cpp's `permute` of attn_q/attn_k: hf = gguf[indices].

    llama.cpp stores row `(h, i, j)` of `w.reshape(heads, 2, head_dim / 2)` at `(h, j, i)`."""
    if num_heads <= 0 or num_rows <= 0 or num_rows % (2 * num_heads):
        raise SourceError(f"cannot un-permute {num_rows} query/key rows over {num_heads} heads")
    gguf_from_hf = np.arange(num_rows).reshape(num_heads, 2, num_rows // num_heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(gguf_from_hf)
