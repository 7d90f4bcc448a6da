"""GGUF tensor names: the architectures ft reads and the table rows most of them share.

GGUF renames every tensor (llama.cpp's names, gguf-py's `tensor_mapping.py`); FTW keeps Hugging
Face names, so each GGUF name maps back through a table, one commented row per name. The rows
here are shared, each marked with the architectures it applies to; architectures whose Hugging
Face names differ throughout have whole tables of their own (gguf_names_own.py). What llama.cpp
changes besides names, and how ft undoes it, is gguf_undo.py.
"""

from __future__ import annotations

from dataclasses import dataclass

LAYER_PREFIX_GGUF = "blk.{layer}."
LAYER_PREFIX_HF = "model.layers.{layer}."
QWEN3, LLAMA, DEEPSEEK2 = "qwen3moe", "llama", "deepseek2"
QWEN2, OLMOE, GLM4, DOTS1, GRANITE, ERNIE = "qwen2moe", "olmoe", "glm4moe", "dots1", "granitemoe", "ernie4_5-moe"
DBRX, MINIMAX_M2, GPT_OSS, QWEN35, QWEN3NEXT = "dbrx", "minimax-m2", "gpt-oss", "qwen35moe", "qwen3next"
HUNYUAN, EXAONE_MOE, LFM2MOE, AFMOE = "hunyuan-moe", "exaone-moe", "lfm2moe", "afmoe"
GRANITE_HYBRID = "granitehybrid"  # Granite 4.0 hybrid: Mamba2 + attention layers, granitemoeshared's MoE
NEMOTRON_H_MOE = "nemotron_h_moe"  # NVIDIA Nemotron-H MoE: Mamba2, NoPE attention or relu2 MoE layers
DEEPSEEK4 = "deepseek4"  # DeepSeek-V4: compressed attention, hyper-connections, hash and scored routing (own table)
MAMBA2_HYBRIDS = (GRANITE_HYBRID, NEMOTRON_H_MOE)  # Mamba2Model's tensor changes (gguf_undo.UNDONE)
GRANITES = (GRANITE, GRANITE_HYBRID)  # Granite's MoE names (router.layer, input_linear, shared_mlp)
BAILINGMOE2, PHIMOE, LLAMA4 = "bailingmoe2", "phimoe", "llama4"
JAMBA = "jamba"  # AI21 Jamba: Mamba (v1) + attention layers, softmax MoE every other layer
MISTRAL4 = "mistral4"  # Mistral Small 4's text model: deepseek2's tensors, softmax routing without a bias
GEMMA4 = "gemma4"  # Gemma 4's text model (the 26B-A4B's MoE): sliding and full layers, a dense MLP beside the experts
MIMO2 = "mimo2"  # Xiaomi MiMo-V2-Flash: full and sliding GQA layers (sinks on the sliding ones), values narrower
GLM_DSA = "glm-dsa"  # GLM-5's: DeepSeek-V3's model with DeepSeek Sparse Attention's indexer on MLA
DEEPSEEK32 = "deepseek32"  # DeepSeek-V3.2: DeepSeek-V3's model with DSA's indexer on every layer
HY_V4 = "hy_v4"  # Tencent Hy4: DSA's MLA with sinks and a gated output, hyper-connections, DeepSeek-V3's MoE
KIMI_LINEAR = "kimi-linear"  # Moonshot's Kimi Linear: Kimi Delta Attention and NoPE MLA layers, DeepSeek-V3's MoE
MELLUM = "mellum"  # JetBrains Mellum 2: Qwen3-MoE's block in sliding and full layers, a RoPE base a kind
HY_V3 = "hy_v3"  # Tencent Hy3: Qwen3's attention, DeepSeek-V3's sigmoid MoE without groups, one shared MLP
LAGUNA = "laguna"  # Poolside Laguna: gated GQA (query heads by layer), sliding and full layers, DeepSeek-V3's routing
COHERE2MOE = "cohere2moe"  # Cohere's North / Command A MoE: Cohere 2's parallel block, sliding and NoPE full layers
GRANITE_SWA = "granite_swa"  # IBM Granite MoE SWA: granitemoeshared's block, sliding and full layers with sinks, NoPE by layer
MINIMAX01 = "minimax-01"  # MiniMax-Text-01: lightning-attention and GQA layers, Mixtral's MoE
MLA = (DEEPSEEK2, MISTRAL4, GLM_DSA, DEEPSEEK32, HY_V4)  # DeepSeek's multi-head latent attention (the kv_b split: gguf_undo.KV_B_SPLIT)
DELTANET = (QWEN35, QWEN3NEXT)  # Gated DeltaNet hybrids (Qwen3.5/3.6, Qwen3-Next)
QK_NORMED = (QWEN3, OLMOE, GLM4, DOTS1, MINIMAX_M2, EXAONE_MOE, *DELTANET, MELLUM, HY_V3, LAGUNA)  # per head (Qwen3, GLM, dots) or whole projection (OLMoE, MiniMax)
GATE_ROUTED = (QWEN3, QWEN2, OLMOE, *MLA, GLM4, DOTS1, ERNIE, EXAONE_MOE, *DELTANET, MIMO2, MELLUM, HY_V3, COHERE2MOE, LAGUNA)  # router at mlp.gate (Mixtral's elsewhere)
QWEN_SHARED_EXPERT = (QWEN2, *DELTANET)  # one shared expert under mlp.shared_expert, its sigmoid gate beside it
WITH_DENSE_LAYERS = (QWEN3, QWEN2, *MLA, GLM4, DOTS1, ERNIE, QWEN3NEXT, EXAONE_MOE, MIMO2, MELLUM, HY_V3, COHERE2MOE, LAGUNA)  # dense MLPs beside MoE layers
DEEPSEEK_MOE = (DEEPSEEK2, GLM4, DOTS1, GLM_DSA, DEEPSEEK32, HY_V4)  # DeepSeek-V3's sigmoid MoE: correction bias, shared_experts
DSA_INDEXED = (GLM_DSA, DEEPSEEK32, HY_V4)  # DeepSeek Sparse Attention's indexer beside MLA
SHARED_EXPERTS = (*DEEPSEEK_MOE, MISTRAL4, ERNIE, EXAONE_MOE, HY_V3, COHERE2MOE, LAGUNA)  # one dense SwiGLU under mlp.shared_experts



@dataclass(frozen=True)
class Row:
    """One tensor name in both conventions."""

    gguf: str  # after "blk.N." for block rows; the whole name for global rows
    hf: str  # after "model.layers.N." for block rows; the whole name for global rows
    archs: tuple[str, ...] = ()  # GGUF architectures the row applies to; () = all
    kind: str = ""  # the layer kind (the config's layer_types entry) it applies to, in place of the kindless row; "" = all


GLOBAL_ROWS: tuple[Row, ...] = (
    Row("token_embd.weight", "model.embed_tokens.weight"),  # input embeddings [V, H]
    Row("output_norm.weight", "model.norm.weight"),  # final RMSNorm
    Row("output.weight", "lm_head.weight"),  # LM head; absent when tied to the embeddings
    Row("output_norm.bias", "model.norm.bias", (PHIMOE,)),  # Phi-3.5-MoE's LayerNorms and head have biases
    Row("output.bias", "lm_head.bias", (PHIMOE,)),  # (lm_head_bias)
    Row("output_hc_fn.weight", "model.hc_head.hc_fn", (HY_V4,)),  # Hy4's head over the streams [streams, streams x H]
    Row("output_hc_base.weight", "model.hc_head.hc_base", (HY_V4,)),
    Row("output_hc_scale.weight", "model.hc_head.hc_scale", (HY_V4,)),  # [1]
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
    Row("attn_q_a.weight", "self_attn.q_a_proj.weight", MLA),  # MLA query down-projection
    Row("attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", MLA),
    Row("attn_q_b.weight", "self_attn.q_b_proj.weight", MLA),  # MLA query up-projection
    Row("attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", MLA),  # latent KV + RoPE key
    Row("attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", MLA),
    Row("attn_kv_b.weight", "self_attn.kv_b_proj.weight", MLA),  # older files; newer: KV_B_SPLIT
    Row("indexer.attn_q_b.weight", "self_attn.indexer.wq_b.weight", DSA_INDEXED),  # DSA's indexer: its queries
    Row("indexer.attn_k.weight", "self_attn.indexer.wk.weight", DSA_INDEXED),  # its one key head
    Row("indexer.k_norm.weight", "self_attn.indexer.k_norm.weight", DSA_INDEXED),  # the key's LayerNorm
    Row("indexer.k_norm.bias", "self_attn.indexer.k_norm.bias", DSA_INDEXED),
    Row("indexer.proj.weight", "self_attn.indexer.weights_proj.weight", DSA_INDEXED),  # per-head score weights
    Row("ffn_norm.weight", "post_attention_layernorm.weight"),  # RMSNorm before the MLP / MoE
    Row("ffn_norm.bias", "post_attention_layernorm.bias", (PHIMOE,)),
    Row("post_attention_norm.weight", "post_attention_layernorm.weight", (GLM4, GPT_OSS, *DELTANET)),  # their name for it
    Row("attn_gate.weight", "self_attn.g_proj.weight", (LAGUNA,)),  # Laguna's softplus output gate [heads or heads x D, H]
    Row("attn_sinks.weight", "self_attn.sinks", (GPT_OSS, MIMO2, GRANITE_SWA, HY_V4)),  # a learned sink logit per head [Hq]
    Row("attn_gate.weight", "self_attn.gate_proj.weight", (HY_V4,)),  # Hy4's sigmoid gate on the values [heads x v, H]
    # Hy4's hyper-connections around attention and the MLP: fn [2 x streams, streams x H], base [2 x streams], scale [2]
    Row("hc_attn_fn.weight", "attn_hc.fn", (HY_V4,)),
    Row("hc_attn_base.weight", "attn_hc.base", (HY_V4,)),
    Row("hc_attn_scale.weight", "attn_hc.scale", (HY_V4,)),
    Row("hc_ffn_fn.weight", "ffn_hc.fn", (HY_V4,)),
    Row("hc_ffn_base.weight", "ffn_hc.base", (HY_V4,)),
    Row("hc_ffn_scale.weight", "ffn_hc.scale", (HY_V4,)),
    Row("ffn_gate_inp.weight", "mlp.gate.weight", GATE_ROUTED),  # router [E, H]
    Row("ffn_gate_inp.weight", "block_sparse_moe.gate.weight", (LLAMA, MINIMAX_M2, PHIMOE, MINIMAX01)),  # Mixtral's router
    Row("ffn_gate_inp.weight", "block_sparse_moe.router.layer.weight", GRANITES),  # Granite's
    Row("ffn_gate_inp.weight", "block_sparse_moe.router.weight", (GRANITE_SWA,)),  # transformers' GraniteMoeSWA's
    Row("ffn_gate_inp.weight", "mlp.router.weight", (GPT_OSS,)),  # gpt-oss's router, with a bias
    Row("ffn_gate_inp.weight", "mlp.gate.wg.weight", (HUNYUAN,)),  # Hunyuan's router
    Row("attn_q_norm.weight", "self_attn.query_layernorm.weight", (HUNYUAN,)),  # Hunyuan's q/k norms (after RoPE)
    Row("attn_k_norm.weight", "self_attn.key_layernorm.weight", (HUNYUAN,)),
    Row("ffn_gate_shexp.weight", "mlp.shared_mlp.gate_proj.weight", (HUNYUAN,)),  # Hunyuan's shared MLP
    Row("ffn_up_shexp.weight", "mlp.shared_mlp.up_proj.weight", (HUNYUAN,)),
    Row("ffn_down_shexp.weight", "mlp.shared_mlp.down_proj.weight", (HUNYUAN,)),
    Row("ffn_gate_inp.bias", "mlp.router.bias", (GPT_OSS,)),
    Row("exp_probs_b.bias", "mlp.gate.e_score_correction_bias", (*DEEPSEEK_MOE, MIMO2, LAGUNA)),  # noaux_tc routing bias [E]
    Row("exp_probs_b.bias", "mlp.moe_statics.e_score_correction_bias", (ERNIE,)),  # ERNIE's [1, E]: ROW_VECTORS
    Row("exp_probs_b.bias", "block_sparse_moe.e_score_correction_bias", (MINIMAX_M2,)),  # MiniMax-M2's [E]
    Row("exp_probs_b.bias", "mlp.e_score_correction_bias", (EXAONE_MOE,)),  # K-EXAONE's, beside the router [E]
    Row("exp_probs_b", "mlp.e_score_correction_bias", (HY_V3,)),  # Hy3's expert_bias [E], no suffix (hy-v3.cpp)
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
    Row("ffn_down_shexp.weight", "shared_mlp.output_linear.weight", (*GRANITES, GRANITE_SWA)),  # granitemoeshared's shared MLP
    Row("ffn_up_shexp.weight", "shared_mlp.input_linear.weight", (GRANITE_SWA,)),  # gate | up, kept fused (granite-swa.cpp)
    # MiniMax-Text-01's lightning-attention layers (their full layers take the plain attn_q/k/v/output rows)
    Row("attn_qkv.weight", "self_attn.qkv_proj.weight", (MINIMAX01,)),  # q | k | v within each head [3 x heads x D, H]
    Row("attn_gate.weight", "self_attn.output_gate.weight", (MINIMAX01,)),  # the sigmoid output gate
    Row("attn_norm_2.weight", "self_attn.norm.weight", (MINIMAX01,)),  # the RMSNorm over all heads' output
    Row("attn_output.weight", "self_attn.out_proj.weight", (MINIMAX01,), kind="linear_attention"),
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

# Tensors llama.cpp adds that a Hugging Face model computes instead: dropped and counted.
# RoPE frequency factors, derived from rope_scaling; Phi-3.5-MoE's LongRoPE factors, read into it
DROPPED_GLOBAL = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# old files' rotary tables; DeepSeek-V4's routing bias for image tokens (exp_probs_b_vl, a vision release's)
DROPPED_BLOCK = ("attn_rot_embd.weight", "exp_probs_b_vl.bias")
