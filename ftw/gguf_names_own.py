"""GGUF name tables of the architectures whose Hugging Face names differ throughout from the shared
rows in gguf_names.py: each one's whole table (or whole block table) under its own names."""

from __future__ import annotations

from .gguf_names import (
    AFMOE,
    BAILINGMOE2,
    DBRX,
    DEEPSEEK4,
    GEMMA4,
    JAMBA,
    KIMI_LINEAR,
    LFM2MOE,
    LLAMA4,
    NEMOTRON_H_MOE,
    QWEN35,
    Row,
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


# Qwen3.5 under its own prefixes (model.language_model., layers there too): the generic block rows apply
QWEN35_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.language_model.embed_tokens.weight", (QWEN35,)),
    Row("output_norm.weight", "model.language_model.norm.weight", (QWEN35,)),  # (1 + w): UNDONE
    Row("output.weight", "lm_head.weight", (QWEN35,)),
)


# AI21 Jamba's whole table under its own names: Mamba layers (mamba., JambaModel's changes UNDONE) or NoPE
# attention, the FFN normed by pre_ff_layernorm, the router and the dense layers' MLP under feed_forward.
JAMBA_GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.embed_tokens.weight", (JAMBA,)),
    Row("output_norm.weight", "model.final_layernorm.weight", (JAMBA,)),
    Row("output.weight", "lm_head.weight", (JAMBA,)),
)
JAMBA_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight", (JAMBA,)),  # the norm before either mixer
    Row("attn_q.weight", "self_attn.q_proj.weight", (JAMBA,)),  # not permuted (no RoPE to permute for)
    Row("attn_k.weight", "self_attn.k_proj.weight", (JAMBA,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", (JAMBA,)),
    Row("attn_output.weight", "self_attn.o_proj.weight", (JAMBA,)),
    Row("ssm_in.weight", "mamba.in_proj.weight", (JAMBA,)),  # scan input | gate [2I, H]
    Row("ssm_conv1d.weight", "mamba.conv1d.weight", (JAMBA,)),  # stored [I, K]: UNDONE
    Row("ssm_conv1d.bias", "mamba.conv1d.bias", (JAMBA,)),
    Row("ssm_x.weight", "mamba.x_proj.weight", (JAMBA,)),  # dt | B | C [R + 2N, I]
    Row("ssm_dt_norm.weight", "mamba.dt_layernorm.weight", (JAMBA,)),  # [R]
    Row("ssm_b_norm.weight", "mamba.b_layernorm.weight", (JAMBA,)),  # [N]
    Row("ssm_c_norm.weight", "mamba.c_layernorm.weight", (JAMBA,)),
    Row("ssm_dt.weight", "mamba.dt_proj.weight", (JAMBA,)),  # [I, R]
    Row("ssm_dt.bias", "mamba.dt_proj.bias", (JAMBA,)),
    Row("ssm_a", "mamba.A_log", (JAMBA,)),  # stored -exp(A_log) [I, N]: UNDONE
    Row("ssm_d", "mamba.D", (JAMBA,)),  # [I], as HF has it
    Row("ssm_out.weight", "mamba.out_proj.weight", (JAMBA,)),
    Row("ffn_norm.weight", "pre_ff_layernorm.weight", (JAMBA,)),
    Row("ffn_gate_inp.weight", "feed_forward.router.weight", (JAMBA,)),  # router [E, H]
    Row("ffn_gate.weight", "feed_forward.gate_proj.weight", (JAMBA,)),  # the dense layers' MLP
    Row("ffn_up.weight", "feed_forward.up_proj.weight", (JAMBA,)),
    Row("ffn_down.weight", "feed_forward.down_proj.weight", (JAMBA,)),
)


# Gemma 4's block table (Gemma4Model, as gguf-py's gemma4 rows name them): sandwich norms around attention
# and around each half of the FFN, ffn_norm the dense MLP's pre-norm (not the usual post-attention norm), the
# router's scale and the per-expert scale under the names the converter gives them (".scale" rows: nothing
# folded into the weights), layer_scalar as layer_output_scale [1]. No attn_v where the values are the keys'
# projection (attention_k_eq_v); the experts fused, gate_up_proj as ffn_gate_up_exps (gguf_names.EXPERT_ROWS)
GEMMA4_BLOCK_ROWS: tuple[Row, ...] = (
    Row("attn_norm.weight", "input_layernorm.weight", (GEMMA4,)),
    Row("attn_q.weight", "self_attn.q_proj.weight", (GEMMA4,)),
    Row("attn_k.weight", "self_attn.k_proj.weight", (GEMMA4,)),
    Row("attn_v.weight", "self_attn.v_proj.weight", (GEMMA4,)),  # absent on full layers with attention_k_eq_v
    Row("attn_output.weight", "self_attn.o_proj.weight", (GEMMA4,)),
    Row("attn_q_norm.weight", "self_attn.q_norm.weight", (GEMMA4,)),  # per head, before RoPE
    Row("attn_k_norm.weight", "self_attn.k_norm.weight", (GEMMA4,)),
    Row("post_attention_norm.weight", "post_attention_layernorm.weight", (GEMMA4,)),  # after attention
    Row("ffn_norm.weight", "pre_feedforward_layernorm.weight", (GEMMA4,)),  # before the dense MLP
    Row("ffn_gate.weight", "mlp.gate_proj.weight", (GEMMA4,)),  # the dense GeGLU MLP beside the experts
    Row("ffn_up.weight", "mlp.up_proj.weight", (GEMMA4,)),
    Row("ffn_down.weight", "mlp.down_proj.weight", (GEMMA4,)),
    Row("post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight", (GEMMA4,)),  # after the dense MLP
    Row("pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight", (GEMMA4,)),  # before the experts
    Row("post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight", (GEMMA4,)),  # after the experts
    Row("post_ffw_norm.weight", "post_feedforward_layernorm.weight", (GEMMA4,)),  # after their sum
    Row("ffn_gate_inp.weight", "router.proj.weight", (GEMMA4,)),  # router [E, H]
    Row("ffn_gate_inp.scale", "router.scale", (GEMMA4,)),  # the router input's scale [H]
    Row("ffn_down_exps.scale", "router.per_expert_scale", (GEMMA4,)),  # [E]: llama.cpp scales each expert's down
    Row("layer_output_scale.weight", "layer_scalar", (GEMMA4,)),  # [1]
)


# NVIDIA Nemotron-H MoE's block table: one mixer a layer under mixer. (the names after the family's
# renames, Family.renames: backbone. -> model.), normed by the layer's one norm; the globals are the shared rows
NEMOTRON_H_MOE_BLOCK_ROWS: tuple[Row, ...] = tuple(Row(g, h, (NEMOTRON_H_MOE,)) for g, h in (
    ("attn_norm.weight", "norm.weight"),  # the norm before any mixer
    ("ssm_in.weight", "mixer.in_proj.weight"),  # Mamba2: z | xBC | dt [2I + 2GN + heads, H]
    ("ssm_conv1d.weight", "mixer.conv1d.weight"),  # stored [C, K]: UNDONE
    ("ssm_conv1d.bias", "mixer.conv1d.bias"),
    ("ssm_dt.bias", "mixer.dt_bias"),  # [heads]
    ("ssm_a", "mixer.A_log"),  # stored -exp(A_log) as [heads, 1]: UNDONE
    ("ssm_d", "mixer.D"),  # stored [heads, 1]: UNDONE
    ("ssm_norm.weight", "mixer.norm.weight"),  # stored [G, I / G]: UNDONE
    ("ssm_out.weight", "mixer.out_proj.weight"),
    ("attn_q.weight", "mixer.q_proj.weight"),  # permuted by the converter (NoPE all the same): undone
    ("attn_k.weight", "mixer.k_proj.weight"),
    ("attn_v.weight", "mixer.v_proj.weight"),
    ("attn_output.weight", "mixer.o_proj.weight"),
    ("ffn_gate_inp.weight", "mixer.gate.weight"),  # router [E, H]
    ("exp_probs_b.bias", "mixer.gate.e_score_correction_bias"),  # sigmoid routing's correction bias [E]
    ("ffn_up_shexp.weight", "mixer.shared_experts.up_proj.weight"),  # relu2 shared MLP, not gated
    ("ffn_down_shexp.weight", "mixer.shared_experts.down_proj.weight"),
))


# Kimi Linear's block table (KimiLinearModel, conversion/kimi_linear.py, as gguf-py's kimi-linear rows name the
# release's tensors), under the names ft's kimi_linear family keeps (ftw/families.py renames: the forget gate's
# f_a/f_b, dt_bias and A_log under self_attn.forget_gate., block_sparse_moe as mlp). KDA layers: q/k/v/o and
# their short convolutions (stored [1, C, 1, K]: UNDONE), the beta and gate projections, A_log as -exp(A_log)
# (UNDONE), dt_bias renamed dt_proj.bias, the gated output norm. MLA layers: DeepSeek's (kv_b split: KV_B_SPLIT),
# no q_a when q_lora_rank is null (attn_q). The release's dense first layer is mlp.gate/up/down_proj.
KIMI_LINEAR_BLOCK_ROWS: tuple[Row, ...] = tuple(Row(g, h, (KIMI_LINEAR,)) for g, h in (
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("attn_q.weight", "self_attn.q_proj.weight"),  # KDA's, or MLA's without the low-rank query
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("ssm_conv1d_q.weight", "self_attn.q_conv1d.weight"),  # [C, 1, K], stored [1, C, 1, K]: UNDONE
    ("ssm_conv1d_k.weight", "self_attn.k_conv1d.weight"),
    ("ssm_conv1d_v.weight", "self_attn.v_conv1d.weight"),
    ("ssm_f_a.weight", "self_attn.forget_gate.f_a_proj.weight"),  # the forget gate's low rank [K, H]
    ("ssm_f_b.weight", "self_attn.forget_gate.f_b_proj.weight"),
    ("ssm_a", "self_attn.forget_gate.A_log"),  # [1, 1, heads, 1], stored -exp(A_log): UNDONE
    ("ssm_dt.bias", "self_attn.forget_gate.dt_bias"),  # (renamed dt_proj.bias by the converter)
    ("ssm_beta.weight", "self_attn.b_proj.weight"),  # [heads, H]
    ("ssm_g_a.weight", "self_attn.g_a_proj.weight"),  # the output gate's low rank
    ("ssm_g_b.weight", "self_attn.g_b_proj.weight"),
    ("ssm_norm.weight", "self_attn.o_norm.weight"),  # the gated output RMSNorm [head_dim]
    ("attn_q_a.weight", "self_attn.q_a_proj.weight"),  # MLA
    ("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"),
    ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
    ("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"),
    ("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"),
    ("attn_kv_b.weight", "self_attn.kv_b_proj.weight"),  # (files that keep it whole; the converter splits it)
    ("ffn_gate.weight", "mlp.gate_proj.weight"),  # the dense first layers' MLP
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),  # router [E, H]
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),  # [E]
    ("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    ("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"),
))


# DeepSeek-V4's whole table (DeepseekV4Model._map_dsv4_tensor_name, conversion/deepseek.py, with llama-arch.cpp's
# names), under the names ft's deepseek_v4 family keeps (transformers' conversion_mapping renames:
# family_readers.DEEPSEEK_V4_NAMES). The routed experts are the usual ffn_*_exps (MXFP4 as the release's FP4);
# the hash layers' tid2eid is stored int32 (widened back: gguf_undo.WIDENED); the indexer lives in the compressor.
DEEPSEEK4_GLOBAL_ROWS: tuple[Row, ...] = tuple(Row(g, h, (DEEPSEEK4,)) for g, h in (
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
    ("output_hc_fn.weight", "model.hc_head.hc_fn"),  # the head's hyper-connection [streams, streams x H]
    ("output_hc_base.weight", "model.hc_head.hc_base"),
    ("output_hc_scale.weight", "model.hc_head.hc_scale"),
))
DEEPSEEK4_BLOCK_ROWS: tuple[Row, ...] = tuple(Row(g, h, (DEEPSEEK4,)) for g, h in (
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
    ("hc_attn_fn.weight", "attn_hc.fn"),  # the hyper-connections around attention and the MoE
    ("hc_attn_base.weight", "attn_hc.base"),
    ("hc_attn_scale.weight", "attn_hc.scale"),
    ("hc_ffn_fn.weight", "ffn_hc.fn"),
    ("hc_ffn_base.weight", "ffn_hc.base"),
    ("hc_ffn_scale.weight", "ffn_hc.scale"),
    ("attn_sinks.weight", "self_attn.sinks"),  # attn_sink [heads]
    ("attn_q_a.weight", "self_attn.q_a_proj.weight"),  # wq_a: the low-rank query
    ("attn_q_a_norm.weight", "self_attn.q_a_norm.weight"),
    ("attn_q_b.weight", "self_attn.q_b_proj.weight"),
    ("attn_kv.weight", "self_attn.kv_proj.weight"),  # wkv: one shared key-value head
    ("attn_kv_a_norm.weight", "self_attn.kv_norm.weight"),
    ("attn_output_a.weight", "self_attn.o_a_proj.weight"),  # wo_a: the grouped low-rank output, 2-D as released
    ("attn_output_b.weight", "self_attn.o_b_proj.weight"),
    ("attn_compressor_kv.weight", "self_attn.compressor.kv_proj.weight"),  # CSA and HCA layers' compressor
    ("attn_compressor_gate.weight", "self_attn.compressor.gate_proj.weight"),
    ("attn_compressor_ape.weight", "self_attn.compressor.position_bias"),
    ("attn_compressor_norm.weight", "self_attn.compressor.kv_norm.weight"),
    ("indexer.attn_q_b.weight", "self_attn.compressor.indexer.q_b_proj.weight"),  # CSA layers' lightning indexer
    ("indexer.proj.weight", "self_attn.compressor.indexer.scorer.weights_proj.weight"),
    ("indexer_compressor_kv.weight", "self_attn.compressor.indexer.kv_proj.weight"),
    ("indexer_compressor_gate.weight", "self_attn.compressor.indexer.gate_proj.weight"),
    ("indexer_compressor_ape.weight", "self_attn.compressor.indexer.position_bias"),
    ("indexer_compressor_norm.weight", "self_attn.compressor.indexer.kv_norm.weight"),
    ("ffn_gate_inp.weight", "mlp.gate.weight"),  # router [E, H]
    ("exp_probs_b.bias", "mlp.gate.e_score_correction_bias"),  # the scored layers' bias [E]
    ("ffn_gate_tid2eid.weight", "mlp.gate.tid2eid"),  # the hash layers' table [vocab, k], int32: WIDENED
    ("ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"),
    ("ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"),
    ("ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"),
))
