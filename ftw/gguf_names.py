"""GGUF tensor names and llama.cpp's changes to the tensors: the tables gguf_source and gguf_convert read.

GGUF renames every tensor (llama.cpp's names, gguf-py's `tensor_mapping.py`); FTW keeps Hugging
Face names, so each GGUF name maps back through the tables below, one commented row per name.
What llama.cpp changes besides names, and how we undo it:

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
  Mamba2 layers (gguf_config_more.py reads it as layer_types).
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
- HF [1, N] tensors that llama.cpp sizes [N] may be stored either way; they are read [1, N]
  (ROW_VECTORS).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import SourceError

LAYER_PREFIX_GGUF = "blk.{layer}."
LAYER_PREFIX_HF = "model.layers.{layer}."
QWEN3, LLAMA, DEEPSEEK2 = "qwen3moe", "llama", "deepseek2"
QWEN2, OLMOE, GLM4, DOTS1, GRANITE, ERNIE = "qwen2moe", "olmoe", "glm4moe", "dots1", "granitemoe", "ernie4_5-moe"
DBRX, MINIMAX_M2, GPT_OSS, QWEN35, QWEN3NEXT = "dbrx", "minimax-m2", "gpt-oss", "qwen35moe", "qwen3next"
HUNYUAN, EXAONE_MOE, LFM2MOE, AFMOE = "hunyuan-moe", "exaone-moe", "lfm2moe", "afmoe"
GRANITE_HYBRID = "granitehybrid"  # Granite 4.0 hybrid: Mamba2 + attention layers, granitemoeshared's MoE
GRANITES = (GRANITE, GRANITE_HYBRID)  # Granite's MoE names (router.layer, input_linear, shared_mlp)
BAILINGMOE2, PHIMOE, LLAMA4 = "bailingmoe2", "phimoe", "llama4"
DELTANET = (QWEN35, QWEN3NEXT)  # Gated DeltaNet hybrids (Qwen3.5/3.6, Qwen3-Next)
QK_NORMED = (QWEN3, OLMOE, GLM4, DOTS1, MINIMAX_M2, EXAONE_MOE, *DELTANET)  # per head (Qwen3, GLM, dots) or whole projection (OLMoE, MiniMax)
GATE_ROUTED = (QWEN3, QWEN2, OLMOE, DEEPSEEK2, GLM4, DOTS1, ERNIE, EXAONE_MOE, *DELTANET)  # router at mlp.gate (Mixtral's elsewhere)
QWEN_SHARED_EXPERT = (QWEN2, *DELTANET)  # one shared expert under mlp.shared_expert, its sigmoid gate beside it
WITH_DENSE_LAYERS = (QWEN3, QWEN2, DEEPSEEK2, GLM4, DOTS1, ERNIE, QWEN3NEXT, EXAONE_MOE)  # dense MLPs beside MoE layers
DEEPSEEK_MOE = (DEEPSEEK2, GLM4, DOTS1)  # DeepSeek-V3's sigmoid MoE: correction bias, shared_experts
SHARED_EXPERTS = (*DEEPSEEK_MOE, ERNIE, EXAONE_MOE)  # one dense SwiGLU under mlp.shared_experts


@dataclass(frozen=True)
class Row:
    """One tensor name in both conventions."""

    gguf: str  # after "blk.N." for block rows; the whole name for global rows
    hf: str  # after "model.layers.N." for block rows; the whole name for global rows
    archs: tuple[str, ...] = ()  # GGUF architectures the row applies to; () = all


GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.embed_tokens.weight"),  # input embeddings [V, H]
    Row("output_norm.weight", "model.norm.weight"),  # final RMSNorm
    Row("output.weight", "lm_head.weight"),  # LM head; absent when tied to the embeddings
    Row("output_norm.bias", "model.norm.bias", (PHIMOE,)),  # Phi-3.5-MoE's LayerNorms and head have biases
    Row("output.bias", "lm_head.bias", (PHIMOE,)),  # (lm_head_bias)
)

BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight"),  # RMSNorm before attention
    Row("attn_norm.bias", "input_layernorm.bias", (PHIMOE,)),  # Phi-3.5-MoE's LayerNorm
    Row("attn_q.weight", "self_attn.q_proj.weight"),  # llama: rows un-permuted, see module doc
    Row("attn_q.bias", "self_attn.q_proj.bias"),  # (models with attention bias)
    Row("attn_k.weight", "self_attn.k_proj.weight"),  # llama: rows un-permuted
    Row("attn_k.bias", "self_attn.k_proj.bias"),
    Row("attn_v.weight", "self_attn.v_proj.weight"),
    Row("attn_v.bias", "self_attn.v_proj.bias"),
    Row("attn_output.weight", "self_attn.o_proj.weight"),
    Row("attn_output.bias", "self_attn.o_proj.bias"),  # (dots1 with attention_bias)
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", QK_NORMED),  # QK RMSNorm
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", QK_NORMED),
    Row("attn_q_a.weight", "self_attn.q_a_proj.weight", (DEEPSEEK2,)),  # MLA query down-projection
    Row("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", (DEEPSEEK2,)),
    Row("attn_q_b.weight", "self_attn.q_b_proj.weight", (DEEPSEEK2,)),  # MLA query up-projection
    Row("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", (DEEPSEEK2,)),  # latent KV + RoPE key
    Row("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", (DEEPSEEK2,)),
    Row("attn_kv_b.weight", "self_attn.kv_b_proj.weight", (DEEPSEEK2,)),  # older files; newer: KV_B_SPLIT
    Row("ffn_norm.weight", "post_attention_layernorm.weight"),  # RMSNorm before the MLP / MoE
    Row("ffn_norm.bias", "post_attention_layernorm.bias", (PHIMOE,)),
    Row("post_attention_norm.weight", "post_attention_layernorm.weight", (GLM4, GPT_OSS, *DELTANET)),  # their name for it
    Row("attn_sinks.weight", "self_attn.sinks", (GPT_OSS,)),  # a learned sink logit per head [Hq]
    Row("ffn_gate_inp.weight", "mlp.gate.weight", GATE_ROUTED),  # router [E, H]
    Row("ffn_gate_inp.weight", "block_sparse_moe.gate.weight", (LLAMA, MINIMAX_M2, PHIMOE)),  # Mixtral's router
    Row("ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight", GRANITES),  # Granite's
    Row("ffn_gate_inp.weight", "mlp.router.weight", (GPT_OSS,)),  # gpt-oss's router, with a bias
    Row("ffn_gate_inp.weight", "mlp.gate.wg.weight", (HUNYUAN,)),  # Hunyuan's router
    Row("attn_q_norm.weight", "self_attn.query_layernorm.weight", (HUNYUAN,)),  # Hunyuan's q/k norms (after RoPE)
    Row("attn_k_norm.weight", "self_attn.key_layernorm.weight", (HUNYUAN,)),
    Row("ffn_gate_shexp.weight", "mlp.shared_mlp.gate_proj.weight", (HUNYUAN,)),  # Hunyuan's shared MLP
    Row("ffn_up_shexp.weight", "mlp.shared_mlp.up_proj.weight", (HUNYUAN,)),
    Row("ffn_down_shexp.weight", "mlp.shared_mlp.down_proj.weight", (HUNYUAN,)),
    Row("ffn_gate_inp.bias", "mlp.router.bias", (GPT_OSS,)),
    Row("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", DEEPSEEK_MOE),  # noaux_tc routing bias [E]
    Row("exp_probs_b.bias", "mlp.moe_statics.e_score_correction_bias", (ERNIE,)),  # ERNIE's [1, E]: ROW_VECTORS
    Row("exp_probs_b.bias", "block_sparse_moe.e_score_correction_bias", (MINIMAX_M2,)),  # MiniMax-M2's [E]
    Row("exp_probs_b.bias", "mlp.e_score_correction_bias", (EXAONE_MOE,)),  # K-EXAONE's, beside the router [E]
    Row("ffn_gate.weight", "mlp.gate_proj.weight", WITH_DENSE_LAYERS),  # dense layers' MLP
    Row("ffn_up.weight", "mlp.up_proj.weight", WITH_DENSE_LAYERS),
    Row("ffn_down.weight", "mlp.down_proj.weight", WITH_DENSE_LAYERS),
    Row("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", SHARED_EXPERTS),  # shared experts
    Row("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", SHARED_EXPERTS),
    Row("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", SHARED_EXPERTS),
    Row("ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight", QWEN_SHARED_EXPERT),  # Qwen2-MoE's, Qwen3.5's
    Row("ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight", QWEN_SHARED_EXPERT),
    Row("ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight", QWEN_SHARED_EXPERT),
    Row("ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", QWEN_SHARED_EXPERT),  # its gate [1, H]: ROW_VECTORS
    # the Gated DeltaNet layers (Qwen3.5's value heads in llama.cpp's tiled order: gguf_config.py)
    Row("attn_qkv.weight", "linear_attn.in_proj_qkv.weight", DELTANET),  # q | k | v, all heads of each
    Row("attn_gate.weight", "linear_attn.in_proj_z.weight", DELTANET),
    Row("ssm_alpha.weight", "linear_attn.in_proj_a.weight", (QWEN35,)),
    Row("ssm_beta.weight", "linear_attn.in_proj_b.weight", (QWEN35,)),
    Row("ssm_in.weight", "linear_attn.in_proj_qkvz.weight", (QWEN3NEXT,)),  # older Qwen3-Next files: HF's, grouped
    Row("ssm_ba.weight", "linear_attn.in_proj_ba.weight", (QWEN3NEXT,)),  # HF's, grouped per key head
    Row("ssm_a", "linear_attn.A_log", DELTANET),  # stored -exp(A_log): UNDONE
    Row("ssm_dt.bias", "linear_attn.dt_bias", DELTANET),
    Row("ssm_conv1d.weight", "linear_attn.conv1d.weight", DELTANET),  # stored [C, K]: UNDONE
    Row("ssm_norm.weight", "linear_attn.norm.weight", DELTANET),
    Row("ssm_out.weight", "linear_attn.out_proj.weight", DELTANET),
    Row("ffn_down_shexp.weight", "shared_mlp.output_linear.weight", GRANITES),  # granitemoeshared's shared MLP
    # Granite 4.0 hybrid's Mamba2 layers (Mamba2Model.modify_tensors: value and shape changes UNDONE)
    Row("ssm_in.weight", "mamba.in_proj.weight", (GRANITE_HYBRID,)),  # z | xBC | dt [2I + 2GN + heads, H]
    Row("ssm_conv1d.weight", "mamba.conv1d.weight", (GRANITE_HYBRID,)),  # stored [C, K]: UNDONE
    Row("ssm_conv1d.bias", "mamba.conv1d.bias", (GRANITE_HYBRID,)),  # [C]
    Row("ssm_dt.bias", "mamba.dt_bias", (GRANITE_HYBRID,)),  # [heads] (renamed dt_proj.bias on the way)
    Row("ssm_a", "mamba.A_log", (GRANITE_HYBRID,)),  # stored -exp(A_log) as [heads, 1]: UNDONE
    Row("ssm_d", "mamba.D", (GRANITE_HYBRID,)),  # stored [heads, 1]: UNDONE
    Row("ssm_norm.weight", "mamba.norm.weight", (GRANITE_HYBRID,)),  # stored [G, I / G]: UNDONE
    Row("ssm_out.weight", "mamba.out_proj.weight", (GRANITE_HYBRID,)),
)


# DBRX's whole table under its own names (after "transformer.blocks.N." for block rows): no generic row applies
DBRX_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "transformer.wte.weight", (DBRX,)),
    Row("output_norm.weight", "transformer.norm_f.weight", (DBRX,)),  # LayerNorm without bias
    Row("output.weight", "lm_head.weight", (DBRX,)),
)
DBRX_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "norm_attn_norm.norm_1.weight", (DBRX,)),  # LayerNorm before attention
    Row("attn_qkv.weight", "norm_attn_norm.attn.Wqkv.weight", (DBRX,)),  # fused q|k|v rows, as HF has them
    Row("attn_output.weight", "norm_attn_norm.attn.out_proj.weight", (DBRX,)),
    Row("attn_output_norm.weight", "norm_attn_norm.norm_2.weight", (DBRX,)),  # LayerNorm before the MoE
    Row("ffn_gate_inp.weight", "ffn.router.layer.weight", (DBRX,)),  # router [E, H]
)


# LFM2-MoE's whole table under its own names: gated short convolutions (the kernel stored [C, K]: UNDONE),
# attention with out_proj and q/k layernorms, under feed_forward the SwiGLU's w1 (gate), w3 (up), w2 (down),
# the router and its expert bias
LFM2MOE_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.embed_tokens.weight", (LFM2MOE,)),
    Row("token_embd_norm.weight", "model.embedding_norm.weight", (LFM2MOE,)),  # the final norm (sic)
    Row("output.weight", "lm_head.weight", (LFM2MOE,)),  # absent: tied, as released
)
LFM2MOE_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "operator_norm.weight", (LFM2MOE,)),  # the norm before either mixer
    Row("shortconv.in_proj.weight", "conv.in_proj.weight", (LFM2MOE,)),  # b | c | x [3H, H]
    Row("shortconv.conv.weight", "conv.conv.weight", (LFM2MOE,)),
    Row("shortconv.out_proj.weight", "conv.out_proj.weight", (LFM2MOE,)),
    Row("attn_q.weight", "self_attn.q_proj.weight", (LFM2MOE,)),
    Row("attn_k.weight", "self_attn.k_proj.weight", (LFM2MOE,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", (LFM2MOE,)),
    Row("attn_output.weight", "self_attn.out_proj.weight", (LFM2MOE,)),
    Row("attn_q_norm.weight", "self_attn.q_layernorm.weight", (LFM2MOE,)),  # before RoPE
    Row("attn_k_norm.weight", "self_attn.k_layernorm.weight", (LFM2MOE,)),
    Row("ffn_norm.weight", "ffn_norm.weight", (LFM2MOE,)),
    Row("ffn_gate.weight", "feed_forward.w1.weight", (LFM2MOE,)),  # the dense first layers' MLP
    Row("ffn_up.weight", "feed_forward.w3.weight", (LFM2MOE,)),
    Row("ffn_down.weight", "feed_forward.w2.weight", (LFM2MOE,)),
    Row("ffn_gate_inp.weight", "feed_forward.gate.weight", (LFM2MOE,)),  # router [E, H]
    Row("exp_probs_b.bias", "feed_forward.expert_bias", (LFM2MOE,)),  # [E]
)


# Arcee Trinity's (AFMoE) block table under its own names, where the generic rows would name its norms
# wrongly: each sublayer normed before and after, a sigmoid output gate, the router under mlp.router
AFMOE_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight", (AFMOE,)),
    Row("attn_q.weight", "self_attn.q_proj.weight", (AFMOE,)),
    Row("attn_k.weight", "self_attn.k_proj.weight", (AFMOE,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", (AFMOE,)),
    Row("attn_gate.weight", "self_attn.gate_proj.weight", (AFMOE,)),  # sigmoid gate on the heads' output
    Row("attn_output.weight", "self_attn.o_proj.weight", (AFMOE,)),
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", (AFMOE,)),  # before RoPE
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", (AFMOE,)),
    Row("post_attention_norm.weight", "post_attention_layernorm.weight", (AFMOE,)),  # after attention
    Row("ffn_norm.weight", "pre_mlp_layernorm.weight", (AFMOE,)),
    Row("post_ffw_norm.weight", "post_mlp_layernorm.weight", (AFMOE,)),
    Row("ffn_gate.weight", "mlp.gate_proj.weight", (AFMOE,)),  # the dense first layers' MLP
    Row("ffn_up.weight", "mlp.up_proj.weight", (AFMOE,)),
    Row("ffn_down.weight", "mlp.down_proj.weight", (AFMOE,)),
    Row("ffn_gate_inp.weight", "mlp.router.gate.weight", (AFMOE,)),  # router [E, H]
    Row("exp_probs_b.bias", "mlp.expert_bias", (AFMOE,)),  # [E]
    Row("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", (AFMOE,)),
    Row("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", (AFMOE,)),
    Row("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", (AFMOE,)),
)


# Sarvam-30B's (bailingmoe2) block table, under the names ft's sarvam_moe family keeps (ftw/families.py's
# renames of the release's): q/k/v fused as the release has them, GLM-4.5's MoE with shared experts
BAILINGMOE2_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight", (BAILINGMOE2,)),
    Row("attn_qkv.weight", "self_attn.query_key_value.weight", (BAILINGMOE2,)),  # q | k | v rows, not permuted
    Row("attn_qkv.bias", "self_attn.query_key_value.bias", (BAILINGMOE2,)),  # (use_qkv_bias; llama.cpp loads none)
    Row("attn_output.weight", "self_attn.o_proj.weight", (BAILINGMOE2,)),  # the release's attention.dense
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", (BAILINGMOE2,)),  # query_layernorm, before RoPE
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", (BAILINGMOE2,)),
    Row("ffn_norm.weight", "post_attention_layernorm.weight", (BAILINGMOE2,)),
    Row("ffn_gate.weight", "mlp.gate_proj.weight", (BAILINGMOE2,)),  # the dense first layers' MLP
    Row("ffn_up.weight", "mlp.up_proj.weight", (BAILINGMOE2,)),
    Row("ffn_down.weight", "mlp.down_proj.weight", (BAILINGMOE2,)),
    Row("ffn_gate_inp.weight", "mlp.gate.weight", (BAILINGMOE2,)),  # router [E, H]
    Row("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", (BAILINGMOE2,)),  # expert_bias, made zero-mean
    Row("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", (BAILINGMOE2,)),
    Row("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", (BAILINGMOE2,)),
    Row("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", (BAILINGMOE2,)),
)


# Llama 4's text model under the names the released Llama4ForConditionalGeneration gives it (language_model.,
# which Llama4Model drops), the layers under LLAMA4_LAYER_PREFIX_HF
LLAMA4_LAYER_PREFIX_HF = "language_model.model.layers.{layer}."
LLAMA4_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "language_model.model.embed_tokens.weight", (LLAMA4,)),
    Row("output_norm.weight", "language_model.model.norm.weight", (LLAMA4,)),
    Row("output.weight", "language_model.lm_head.weight", (LLAMA4,)),  # absent: tied (llama.cpp reuses token_embd)
)
LLAMA4_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight", (LLAMA4,)),
    Row("attn_q.weight", "self_attn.q_proj.weight", (LLAMA4,)),  # not permuted (adjacent-pair RoPE on both sides)
    Row("attn_q.bias", "self_attn.q_proj.bias", (LLAMA4,)),  # (attention_bias)
    Row("attn_k.weight", "self_attn.k_proj.weight", (LLAMA4,)),
    Row("attn_k.bias", "self_attn.k_proj.bias", (LLAMA4,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", (LLAMA4,)),
    Row("attn_v.bias", "self_attn.v_proj.bias", (LLAMA4,)),
    Row("attn_output.weight", "self_attn.o_proj.weight", (LLAMA4,)),
    Row("ffn_norm.weight", "post_attention_layernorm.weight", (LLAMA4,)),
    Row("ffn_gate.weight", "feed_forward.gate_proj.weight", (LLAMA4,)),  # the dense layers' MLP (intermediate_size_mlp)
    Row("ffn_up.weight", "feed_forward.up_proj.weight", (LLAMA4,)),
    Row("ffn_down.weight", "feed_forward.down_proj.weight", (LLAMA4,)),
    Row("ffn_gate_inp.weight", "feed_forward.router.weight", (LLAMA4,)),  # router [E, H]
    Row("ffn_gate_shexp.weight", "feed_forward.shared_expert.gate_proj.weight", (LLAMA4,)),  # the shared expert
    Row("ffn_up_shexp.weight", "feed_forward.shared_expert.up_proj.weight", (LLAMA4,)),
    Row("ffn_down_shexp.weight", "feed_forward.shared_expert.down_proj.weight", (LLAMA4,)),
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

# Qwen3.5 under its own prefixes (model.language_model., layers there too): the generic block rows apply
QWEN35_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.language_model.embed_tokens.weight", (QWEN35,)),
    Row("output_norm.weight", "model.language_model.norm.weight", (QWEN35,)),  # (1 + w): UNDONE
    Row("output.weight", "lm_head.weight", (QWEN35,)),
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


# Qwen3NextModel.modify_tensors (Qwen3.5's too): A_log stored as -exp(A_log); the depthwise conv
# squeezed from [C, 1, K]; every RMSNorm but the DeltaNet's output norm stored as 1 + w (the
# (1 + w) the model computes). Mamba2Model.modify_tensors (Granite 4.0 hybrid's): A_log as -exp(A_log)
# and D both unsqueezed to [heads, 1], the conv squeezed, the gated norm [I] reshaped [G, I / G].
# By GGUF name (after "blk.N." for block rows), one Undo per set of architectures.
UNDONE: dict[str, tuple[Undo, ...]] = {
    "ssm_a": (Undo(DELTANET, lambda a: np.log(-a)),
              Undo((GRANITE_HYBRID,), lambda a: np.log(-a), _flat)),  # Mamba2Model: also unsqueezed to [heads, 1]
    "ssm_conv1d.weight": (Undo((*DELTANET, GRANITE_HYBRID), lambda w: w, lambda shape: (shape[0], 1, *shape[1:])),),
    "ssm_d": (Undo((GRANITE_HYBRID,), lambda d: d, _flat),),  # Mamba2Model's [heads, 1]
    "ssm_norm.weight": (Undo((GRANITE_HYBRID,), lambda w: w, _flat),),  # Mamba2Model's [groups, I / groups]
    "shortconv.conv.weight": (Undo((LFM2MOE,), lambda w: w, lambda shape: (shape[0], 1, *shape[1:])),),  # LFM2MoeModel's squeeze
    **{name: (Undo(DELTANET, _minus_one),) for name in ("attn_norm.weight", "post_attention_norm.weight",
                                                         "attn_q_norm.weight", "attn_k_norm.weight", "output_norm.weight")},
}


def undo_for(gguf_name: str, arch: str) -> Undo | None:
    """How to change back the tensor `gguf_name` (after "blk.N.") of architecture `arch`, if it was changed."""
    return next((u for u in UNDONE.get(gguf_name, ()) if arch in u.archs), None)


# HF [1, N] matrices that llama.cpp sizes {N}: a converter may store them 1-D; read as [1, N]
ROW_VECTORS: dict[str, tuple[str, ...]] = {
    "ffn_gate_inp_shexp.weight": QWEN_SHARED_EXPERT,  # Qwen2-MoE's and Qwen3.5's shared_expert_gate [1, H]
    "exp_probs_b.bias": (ERNIE,),  # ERNIE's moe_statics.e_score_correction_bias [1, E]
}

# Routed experts, fused per layer (torch order). They become the layer's FTW expert bank.
EXPERT_ROWS: dict[str, str] = {
    "ffn_gate_exps.weight": "gate",  # [E, I, H]: gate_proj / Mixtral w1
    "ffn_up_exps.weight": "up",  # [E, I, H]: up_proj / Mixtral w3
    "ffn_down_exps.weight": "down",  # [E, H, I]: down_proj / Mixtral w2
    "ffn_gate_up_exps.weight": "gate_up",  # [E, 2I, H], gate rows then up rows (--fuse-gate-up-exps)
}

# The routed experts' biases (gpt-oss), fused per layer like their weights: [E, I] gate and up, [E, H]
# down. They become the FTW record's w13_bias (gate's, then up's) and w2_bias.
EXPERT_BIAS_ROWS: dict[str, str] = {
    "ffn_gate_exps.bias": "gate_bias",
    "ffn_up_exps.bias": "up_bias",
    "ffn_down_exps.bias": "down_bias",
}

# DeepSeek MLA's kv_b_proj as newer llama.cpp stores it, split per head; rebuilt into KV_B_HF.
KV_B_SPLIT: dict[str, str] = {
    "attn_k_b.weight": "k_b",  # [n_head, kv_lora_rank, qk_nope_head_dim]: the key half, transposed
    "attn_v_b.weight": "v_b",  # [n_head, v_head_dim, kv_lora_rank]: the value half
}
KV_B_HF = "self_attn.kv_b_proj.weight"

# Tensors llama.cpp adds that a Hugging Face model computes instead: dropped and counted.
# RoPE frequency factors, derived from rope_scaling; Phi-3.5-MoE's LongRoPE factors, read into it
DROPPED_GLOBAL = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
DROPPED_BLOCK = ("attn_rot_embd.weight",)  # old files' rotary tables


def hf_rows_of_llama_qk(num_rows: int, num_heads: int) -> np.ndarray:
    """Row indices that undo llama.cpp's `permute` of attn_q/attn_k: hf = gguf[indices].

    llama.cpp stores row `(h, i, j)` of `w.reshape(heads, 2, head_dim / 2)` at `(h, j, i)`."""
    if num_heads <= 0 or num_rows <= 0 or num_rows % (2 * num_heads):
        raise SourceError(f"cannot un-permute {num_rows} query/key rows over {num_heads} heads")
    gguf_from_hf = np.arange(num_rows).reshape(num_heads, 2, num_rows // num_heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(gguf_from_hf)
