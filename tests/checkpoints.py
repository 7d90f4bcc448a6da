"""Tiny Hugging Face checkpoints of every supported family, made with `transformers`.

`save_pretrained` writes the tensor names real checkpoints use; `save_original_format=False`
writes transformers' fused expert layout instead; `to_fp8` rewrites a checkpoint the way
DeepSeek/Qwen FP8 releases ship (e4m3 weights + 128x128 `weight_scale_inv` block scales).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SMALL = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_experts_per_tok=2)

FAMILY_CONFIGS: dict[str, dict] = {
    "qwen3_moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, num_experts=4, mlp_only_layers=[1],
    ),
    "qwen2_moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        num_experts=4, shared_expert_intermediate_size=48, mlp_only_layers=[1], norm_topk_prob=False,
    ),
    "olmoe": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, num_experts=4,
                  clip_qkv=0.5),
    "minimax_m2": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, head_dim=16,
                       num_local_experts=4, rotary_dim=8),
    "mixtral": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, num_local_experts=4),
    # LayerNorms, attention and head biases (drawn at random: RANDOMIZED), LongRoPE with factors
    # and scales of its own (the parity run stays within the original 48 positions: test_parity
    # has a run past them), a sliding window as long as the context (the released layout), and a
    # sparsemixer eps wide enough that some experts stay in each softmax and some are masked
    "phimoe": dict(
        SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, num_local_experts=4,
        attention_bias=True, lm_head_bias=True, max_position_embeddings=64, sliding_window=64,
        router_jitter_noise=0.3, initializer_range=0.1,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=48,
                             short_factor=[1.0, 1.2, 1.5, 1.1, 2.0, 1.3, 3.0, 1.7],
                             long_factor=[1.5, 2.5, 4.0, 6.0, 9.0, 13.0, 20.0, 31.0], short_mscale=1.1,
                             long_mscale=1.25),
    ),
    # DBRX's own names; a clip that cuts a fifth of Wqkv's outputs (wider weights, so attention
    # matters); experts as wide as the model (a flat w2 [E * I, H] is then the same shape either way
    # round: only the layout tells); the rope base where both transformers (top level) and the
    # released model (attn_config) read it (test_parity pins a released config, which sets only
    # attn_config's); LayerNorm weights random (RANDOMIZED)
    "dbrx": dict(
        vocab_size=256, d_model=64, n_heads=4, n_layers=2, max_seq_len=128, initializer_range=0.1,
        attn_config=dict(kv_n_heads=2, clip_qkv=1.0, rope_theta=5000.0),
        ffn_config=dict(ffn_hidden_size=64, moe_num_experts=4, moe_top_k=2),
        rope_parameters=dict(rope_type="default", rope_theta=5000.0),
    ),
    # OLMo 2's post-norms (their weights random: RANDOMIZED) around OLMoE's whole-projection q/k
    # norms; pad and eos ids inside the tiny vocabulary (FlexOlmoConfig's are 100277 and 100257)
    "flex_olmo": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, num_experts=4,
                      pad_token_id=1, eos_token_id=2),
    # Granite's multipliers as the released 3.x models set them (none 1; an attention scale other than
    # 1/sqrt(head_dim)) and its tied head; granitemoeshared's shared MLP wider than an expert; wider
    # weights, so that attention scores are not ~0 and a wrong scale moves the logits
    "granitemoe": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, num_local_experts=4,
                       embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
                       logits_scaling=6.0, tie_word_embeddings=True, initializer_range=0.1),
    "granitemoeshared": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2,
                             num_local_experts=4, shared_intermediate_size=48, embedding_multiplier=12.0,
                             attention_multiplier=0.0625, residual_multiplier=0.5, logits_scaling=4.0,
                             initializer_range=0.1),
    # GraniteSWA's attention under Granite's multipliers: a 3-token window on two layers, sinks on all (drawn at
    # random: RANDOMIZED), a rope base of its own on one layer and NoPE on a sliding and a full one; a shared MLP;
    # experts narrower than half the model, so that no fused tensor is square
    "granitemoe_swa": dict(SMALL, num_hidden_layers=4, intermediate_size=24, num_key_value_heads=2,
                           num_local_experts=4, shared_intermediate_size=48, embedding_multiplier=12.0,
                           attention_multiplier=0.0625, residual_multiplier=0.5, logits_scaling=4.0,
                           initializer_range=0.1, sliding_window=3,
                           layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                           layer_rope_theta=[10000.0, 0, 500.0, 0]),
    # Granite 4.0's hybrid: Mamba2 layers 0, 2 and 3 (8 heads of 16 in 2 groups, a state of 16, a conv of 4,
    # chunks of 8, so the 12-token prompt spans two) and a NoPE attention layer 1, as released
    # (position_embedding_type "nope"); Granite's multipliers; norms, D and dt_bias random (RANDOMIZED)
    "granitemoehybrid": dict(SMALL, num_hidden_layers=4, intermediate_size=24, num_key_value_heads=2,
                             num_local_experts=4, shared_intermediate_size=48, embedding_multiplier=12.0,
                             attention_multiplier=0.0625, residual_multiplier=0.5, logits_scaling=4.0,
                             initializer_range=0.1, position_embedding_type="nope",
                             layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_n_groups=2,
                             mamba_d_state=16, mamba_d_head=16, mamba_d_conv=4, mamba_chunk_size=8),
    # Jamba: NoPE attention on layers 1 and 4 (period 3, offset 1), Mamba on 0, 2 and 3 (I = 128, a state
    # of 8, a conv of 4, dt rank "auto": 4), the MoE on layers 1 and 3 (period 2, offset 1) and a dense
    # MLP on the others; norms, D and the conv and dt biases random (RANDOMIZED)
    "jamba": dict(SMALL, num_hidden_layers=5, intermediate_size=32, num_key_value_heads=2, num_experts=4,
                  attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                  mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, initializer_range=0.1),
    # Nemotron-H: Mamba2 layers 0 and 5 (8 heads of 8 in 2 groups, a state of 16, a conv of 4, chunks of 8, so
    # the 12-token prompt spans two), a NoPE attention layer 2, MoE layers 1, 3 and 6 (8 relu2 experts in 2
    # groups, one kept, top-2, a routing scale, a shared MLP wider than an expert) and a dense MLP layer 4;
    # norms, D, dt_bias and the correction bias random (RANDOMIZED)
    "nemotron_h": dict(SMALL, hybrid_override_pattern="ME*E-ME", num_key_value_heads=2, head_dim=16,
                       intermediate_size=48, n_routed_experts=8, moe_intermediate_size=32,
                       moe_shared_expert_intermediate_size=40, n_group=2, topk_group=1, routed_scaling_factor=1.5,
                       mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, conv_kernel=4,
                       chunk_size=8, initializer_range=0.1),
    # JetMoE's attention experts over kv heads of kv_channels (24, not hidden_size / heads; C = 48);
    # an rms_norm_eps only its final norm reads (transformers' layer norms keep 1e-6)
    "jetmoe": dict(SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, kv_channels=24,
                   num_local_experts=4, rms_norm_eps=1e-2, initializer_range=0.1),
    "deepseek_v3": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    ),
    "deepseek_v2": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=2, first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, topk_method="greedy", routed_scaling_factor=1.5,
    ),
    "glm4_moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        routed_scaling_factor=2.5, attention_bias=True, use_qk_norm=True, num_nextn_predict_layers=0,
    ),
    "glm_moe_dsa": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, index_topk=8, index_head_dim=16,
        index_n_heads=2, n_group=1, topk_group=1,
    ),
    # every layer indexed (6 of up to 44 tokens a query: most attend to a selection), two leading dense
    # layers, two groups of four experts keeping one; 16 indexer heads and wide weights, so that few
    # tokens score exactly 0 after the relu and tie (tests/test_parity_deepseek.py, "ties")
    "deepseek_v32": dict(
        SMALL, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=2, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, index_topk=6, index_head_dim=16,
        index_n_heads=16, n_group=2, topk_group=1, initializer_range=0.15,
    ),
    # Qwen3's attention with DeepSeek-V3's MoE: a leading dense layer, two groups keeping one,
    # renormalized and scaled top-k weights, two shared experts, attention biases
    "dots1": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, n_routed_experts=8, n_shared_experts=2, first_k_dense_replace=1, n_group=2, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, attention_bias=True,
    ),
    # Llama's attention (biases on q, k and v) with GLM-4.5's MoE on every layer: two groups keeping one,
    # renormalized and scaled top-k weights, two shared experts (one MLP twice moe_intermediate_size wide)
    "solar_open": dict(
        SMALL, num_hidden_layers=2, moe_intermediate_size=32, num_key_value_heads=2, head_dim=16,
        n_routed_experts=8, n_shared_experts=2, n_group=2, topk_group=1, routed_scaling_factor=2.5,
        attention_bias=True,
    ),
    # GLM-4.5's model with RoPE over the whole head: a leading dense layer, two expert groups keeping
    # one, biases on q/k/v (the release fuses them, and their biases, into query_key_value) and q/k norms
    "sarvam_moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
        attention_bias=True, use_qk_norm=True, initializer_range=0.1,
    ),
    # DeepSeek-V3's MoE (two groups of four experts keeping one, scaled weights, a shared expert) after a dense
    # layer, under gated GQA attention; wider weights, so that a wrong gate moves the logits
    "minicpm5_moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, initializer_range=0.1,
    ),
    # DeepSeek-V3's model (MLA with the low-rank query; two groups of four experts keeping one, a shared
    # expert) with the MoE output RMSNormed (its weight random: RANDOMIZED); dense layers 0 and 2 between
    # MoE ones (mlp_layer_types); wider weights, so that a missing norm or a wrong rotation moves the logits
    "axk1": dict(
        SMALL, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=32, kv_lora_rank=16,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, mlp_layer_types=["dense", "sparse", "dense", "sparse"],
        initializer_range=0.1, bos_token_id=1, eos_token_id=2,
    ),
    # Qwen3's attention (q/k norms, random: RANDOMIZED) with a dense first layer, then sigmoid routing with a
    # correction bias (random) over eight experts, renormalized and scaled, and two shared experts as one MLP
    "hy_v3": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, num_experts=8, num_shared_experts=2, router_scaling_factor=1.7, initializer_range=0.1,
    ),
    # GLM-5's sparse MLA (6 of up to 44 tokens a query; 16 indexer heads and wide weights so few scores tie at 0)
    # with its selection shared by layers 1 and 3, a sink per head (RANDOMIZED), the output gated; the indexer's
    # rope channels last; 3 residual streams around every sublayer (their scales and biases random), post times
    # 1.5; a dense first layer, then 8 experts in 2 groups (the better kept), top 2 by sigmoid + a random
    # correction bias, renormalized, times 2.0, their gate and up clamped at 1.0 (a fair part of them), beside a
    # shared expert; rms_norm_eps 0.01 (the indexer's k_norm's too; the latent norms keep 1e-6)
    "hy_v4": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
        n_group=2, topk_group=1, routed_scaling_factor=2.0, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, index_topk=6, index_head_dim=16, index_n_heads=16,
        indexer_types=["full", "shared", "full", "shared"], hc_mult=3, hc_magnitude=1.5, swiglu_limit=1.0,
        rms_norm_eps=0.01, initializer_range=0.15, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # Qwen3-MoE's block in sliding layers 0 and 2 (a window of 5 positions) and full layer 1, each kind rotating
    # at its own base (transformers' Mellum rotates whole heads: a partial_rotary_factor crashes it); a dense
    # first layer; q/k norms random
    "mellum": dict(
        SMALL, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, num_experts=8, sliding_window=5, initializer_range=0.1,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], mlp_layer_types=["dense", "sparse", "sparse"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}},
    ),
    # two MLA sublayers, two dense MLPs and a shortcut MoE a layer: 8 real experts and 4 zero (identity) ones
    # chosen among them top-3 by softmax with a random correction bias, scaled 2.0 (not renormalized); both
    # latent scales (hidden / rank 2 and 4) and random norms
    "longcat_flash": dict(
        vocab_size=256, hidden_size=64, num_attention_heads=4, num_layers=2, ffn_hidden_size=96,
        expert_ffn_hidden_size=32, n_routed_experts=8, zero_expert_num=4, moe_topk=3, q_lora_rank=32,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, head_dim=8,
        routed_scaling_factor=2.0, initializer_range=0.1, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    ),
    # Qwen3-MoE's attention with a sink per head (random, around 1: RANDOMIZED) on every layer: sliding layers 0
    # and 2 rotate (base 1000) within a 5-token window, full layers 1 and 3 are NoPE; a dense first layer, then
    # sigmoid routing (8 experts, top 2, renormalized) beside an ungated shared expert 48 wide; norms random
    "flint": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_key_value_heads=2, head_dim=16, num_experts=8, sliding_window=5, mlp_only_layers=[0], initializer_range=0.1,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    ),
    # GQA with q/k norms in sliding layers 0 and 2 (rope at base 1000 within a 5-token window) and a full NoPE
    # layer 1, sandwich norms; every layer a MoE of 8 experts, top 2 by logit + a random correction bias
    # (RANDOMIZED), weighed by their sigmoid, renormalized, beside shared experts 48 wide; norms random
    "kolibri1": dict(
        SMALL, num_hidden_layers=3, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_key_value_heads=2,
        head_dim=16, num_experts=8, sliding_window=5, norm_topk_prob=True, initializer_range=0.1,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    ),
    # DeepSeek-V3.2's model (every layer indexed, 6 of up to 44 tokens a query; 16 indexer heads and wide weights so
    # few scores tie at 0) with the query gating the output and gated norms (random weights: RANDOMIZED); a dense
    # first layer, then 8 experts top 2 without groups (A.X-K2-Light's routing), a shared expert
    "axk2": dict(
        SMALL, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16, index_topk=6, index_head_dim=16, index_n_heads=16, gated_norm_rank=8,
        mlp_layer_types=["dense", "sparse", "sparse"], initializer_range=0.15, bos_token_id=1, eos_token_id=2,
    ),
    # GQA with q/k norms: sliding layers 0 and 2 rotate (base 1000) within a 5-token window, full layers 1 and 3
    # NoPE with the log-length query scale; outputs gated with a bias a head (around 1: RANDOMIZED); sandwich
    # norms (random) around a depth-scaled residual; a dense first layer, then 8 experts in 4 groups (the best 2
    # kept), top 2 by sigmoid + a random correction bias, renormalized, the sum times 2.5; logits soft-capped at 30
    "beam": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2, head_dim=16,
        num_experts=8, n_group=4, topk_group=2, sliding_window=5, initializer_range=0.1, rms_norm_eps=0.01,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0}, "full_attention": None},
    ),
    # fused QKV with q/k norms: sliding layers 0 and 2 rotate (interleaved pairs, base 1000) within a 5-token
    # window, full layers 1 and 3 NoPE with their scores times 1.5; sandwich norms and residual gates (random);
    # a dense relu2 first layer, then 8 relu2 experts top 2 by sigmoid + a random correction bias, each route's
    # output RMSNormed with its expert's (random) weight, and a shared expert 48 wide, normed; rms_norm_eps 0.01
    "ergo": dict(
        SMALL, num_hidden_layers=4, num_key_value_heads=2, first_dense_intermediate_size=96, moe_intermediate_size=32,
        shared_intermediate_size=48, num_experts=8, num_dense_blocks=1, sliding_window=5, global_attention_every_n_layers=2,
        global_attention_scale=1.5, initializer_range=0.1, rms_norm_eps=0.01,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    ),
    # Doge's CDMoE: 64 one-neuron experts chosen by product keys (8 x 8, top 4) beside a SwiGLU MLP 96 wide, on
    # every layer; a dynamic mask keeping each query's 6 keys of largest bias (so the 12-token prompt and the
    # steps after it drop keys), A random (transformers' zeros make every bias 1), residual scales and norms random
    "doge": dict(
        SMALL, num_hidden_layers=3, intermediate_size=96, num_key_value_heads=2, is_moe=True, num_experts=64,
        num_experts_per_tok=4, keep_window_size=6, initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    ),
    # ZAYA's CCA on every layer: convolutions of 2 and 3 taps (a token reads the 3 before it), 4 query heads over 2
    # key heads, values half of the token before, biases on every projection; full layers 0 and 2 (rope base 1000
    # on half of each head), sliding layer 1 within 5 tokens (base 100 on a quarter); a router state 24 wide
    # passed layer to layer, 4 experts + the skip one, top 1; residual scales and biases, the embeddings' scale and
    # bias, qk_norm.temp (transformers' zeros would zero the keys), balancing biases and norms random; a head bias
    # beside the tied head
    "zaya": dict(
        SMALL, num_hidden_layers=3, moe_intermediate_size=32, num_key_value_heads=2, head_dim=16, num_experts=4,
        num_experts_per_tok=1, router_hidden_size=24, cca_time0=2, cca_time1=3, attention_bias=True, lm_head_bias=True,
        layer_types=["hybrid", "hybrid_sliding", "hybrid"], sliding_window=5, initializer_range=0.1,
        rope_parameters={"hybrid": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
                         "hybrid_sliding": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.25}},
    ),
    # Qwen3.5's Gated DeltaNet (2 key heads of 8, each serving 2 value heads of 12: the release's fused in_proj is
    # q, k 16 rows, v, z 48, b, a 4; a 3-tap conv) on layers 0 and 2, sliding attention rotating (base 1000) within a 5-token
    # window on 1 and 4, full NoPE attention on 3 (LaraMiniConfig's period-5 schedule); softmax routing (8 experts,
    # top 2, renormalized) in float32 beside an ungated shared expert 48 wide; plain norms random, dt_bias random
    "lara_mini": dict(
        SMALL, num_hidden_layers=5, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_key_value_heads=2,
        head_dim=16, num_experts=8, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=12, linear_conv_kernel_dim=3, sliding_window=5, initializer_range=0.1, eos_token_id=2,
        layer_types=["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    ),
    # the same model under Param2's model_type, its head tied to the embeddings (Param2MoeConfig's default)
    "param2moe": dict(
        SMALL, num_hidden_layers=3, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, n_routed_experts=4, n_shared_experts=2, first_k_dense_replace=1, initializer_range=0.1,
    ),
    # MLA with the low-rank query, GLM's MoE from `mlp_layer_types` (dense layers between MoE ones),
    # two expert groups keeping one; wider weights so a wrong rotation or scale moves the logits
    "glm4_moe_lite": dict(
        SMALL, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=4,
        n_routed_experts=8, n_shared_experts=1, n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, mlp_layer_types=["dense", "sparse", "dense", "sparse"],
        initializer_range=0.1,
    ),
    # dense layers 0, 2 and 4 (before moe_layer_start_index, off moe_layer_interval, after
    # moe_layer_end_index); two shared experts, one SwiGLU twice moe_intermediate_size wide
    "ernie4_5_moe": dict(
        SMALL, num_hidden_layers=5, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        moe_num_experts=4, moe_num_shared_experts=2, moe_layer_start_index=1, moe_layer_end_index=3,
        moe_layer_interval=2,
    ),
    # NTK-alpha RoPE ("dynamic" with a fixed alpha, as the release has it); q/k norms after RoPE
    "hunyuan_v1_moe": dict(
        SMALL, num_hidden_layers=2, intermediate_size=32, num_key_value_heads=2, head_dim=16, num_experts=4,
        rope_parameters={"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0},
    ),
    # local layers 0-2 (RoPE, a window of 5 positions: the 12-token prompt and the decoded tokens slide
    # past it), layer 3 global (NoPE), as "LLLG" has it; layer 0 dense; two groups of four experts, one kept
    "exaone_moe": dict(
        SMALL, num_hidden_layers=4, intermediate_size=128, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, num_experts=8, num_shared_experts=1, n_group=2, topk_group=1, sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    ),
    # full layers 0 and 3, sliding layers 1 and 2 (a window of 5 positions, twice the key-value heads, sinks
    # drawn at random: RANDOMIZED), keys 24 wide (a third of them rotated, each layer kind at its own base)
    # and values 16; a dense first layer; two groups of four experts keeping one, a correction bias;
    # a value scale of its own; attention biases
    "mimo_v2_flash": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=1,
        head_dim=24, v_head_dim=16, n_routed_experts=8, n_group=2, topk_group=1, routed_scaling_factor=1.5,
        sliding_window=5, attention_value_scale=0.6, attention_bias=True, initializer_range=0.1,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.334},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0,
                                               "partial_rotary_factor": 0.334}},
    ),
    # layers of 4, 2 and 8 query heads; sliding layer 1 (a window of 5 positions, whole heads rotated at its own
    # base) and full layers 0 and 2 (half of each head rotated); per-head softplus gates; a dense first layer,
    # soft-capped router logits, a routed scale, a shared MLP; q/k norms and the correction bias random
    "laguna": dict(
        SMALL, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        num_key_value_heads=2, head_dim=16, num_experts=8, num_attention_heads_per_layer=[4, 2, 8], sliding_window=5,
        layer_types=["full_attention", "sliding_attention", "full_attention"], moe_routed_scaling_factor=2.0,
        moe_router_logit_softcapping=1.5, initializer_range=0.1,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.5},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 1.0}},
    ),
    # full layers 0 and 2, lightning layers 1 and 3 (blocks of 5 tokens: the 12-token prompt spans three, and
    # the layers' decays differ); residual factors of their own; norms random (RANDOMIZED)
    "minimax": dict(
        SMALL, num_hidden_layers=4, intermediate_size=32, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        block_size=5, full_attn_alpha_factor=1.5, full_attn_beta_factor=0.5, linear_attn_alpha_factor=0.8,
        linear_attn_beta_factor=1.2, mlp_alpha_factor=1.1, mlp_beta_factor=0.9, initializer_range=0.1,
    ),
    # KDA layers 0, 2 and 3 (four heads of 16), a NoPE MLA layer 1 with the low-rank query; a dense first
    # layer, then two groups of four experts keeping one, a shared expert; norms (the KDA output norm's too)
    # and the correction bias random (RANDOMIZED)
    "kimi_linear": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4,
        num_local_experts=8, n_group=2, topk_group=1, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=32,
        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, linear_head_dim=16, linear_num_heads=4,
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    # KDA layers 0, 1, 3 and 4 (four heads of 16, the bounded forget gate), head-gated MLA layers 2 and 5
    # (layer_group_size 3; rope on 8 channels); a dense first layer, then two groups of four experts keeping
    # one, a shared expert; norms and the correction bias random (RANDOMIZED)
    "bailing_hybrid": dict(
        SMALL, num_hidden_layers=6, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=4,
        num_local_experts=8, n_group=2, topk_group=1, n_shared_experts=1, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=16, head_dim=16, layer_group_size=3, first_k_dense_replace=1,
        rope_theta=10000.0, initializer_range=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    ),
    # conv layers 0, 1 and 3 (a kernel of 3), attention layer 2; a dense first layer; the expert bias random
    # (RANDOMIZED); norms with an eps of their own (norm_eps); the head tied to the embeddings, as released
    "lfm2_moe": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2,
        num_experts=8, num_dense_layers=1, routed_scaling_factor=2.0, norm_eps=1e-3, initializer_range=0.1,
        layer_types=["conv", "conv", "full_attention", "conv"],
    ),
    # a dense first layer; sliding layers 0-2 (a window of 5 positions) and global NoPE layer 3, as
    # global_attn_every_n_layers 4 has it; norms and the expert bias random (RANDOMIZED: transformers inits
    # the router to 0); muP's embedding scale; two shared experts; a route scale of its own
    "afmoe": dict(
        SMALL, num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, num_key_value_heads=2,
        head_dim=16, num_experts=8, num_shared_experts=2, num_dense_layers=1, sliding_window=5,
        global_attn_every_n_layers=4, route_scale=2.5, mup_enabled=True, initializer_range=0.1,
    ),
    # a dense prefix layer (rotating full attention: prefix_dense_sliding_window_pattern 1), then sliding
    # layers (a window of 5 positions: the prompt and the decoded tokens slide past it) and a global NoPE
    # one; LayerNorms (weights random: RANDOMIZED); two shared experts averaged with the routed ones; a
    # logit scale that is no power of two; wide weights so attention is far from uniform
    "cohere2_moe": dict(
        SMALL, num_hidden_layers=4, intermediate_size=32, prefix_dense_intermediate_size=96, num_key_value_heads=2,
        head_dim=16, num_experts=4, num_shared_experts=2, first_k_dense_replace=1, sliding_window=5,
        sliding_window_pattern=3, logit_scale=0.3, initializer_range=0.1, tie_word_embeddings=True, bos_token_id=1,
        eos_token_id=2,
    ),
    # sliding layers 0 and 2 (a window of 5 positions), layer 1 full; experts as wide as the model (a
    # square down_proj [E, I, H], as gpt-oss-20b's: only the family tells its orientation; MXFP4's
    # blocks of 32 fit both); a SwiGLU limit and alpha of its own, wide weights, so that some gate and
    # up values are clamped and others not; YaRN with its ramp inside the head (truncate off, as released)
    "gpt_oss": dict(
        SMALL, num_hidden_layers=3, intermediate_size=64, num_key_value_heads=2, head_dim=16, num_local_experts=4,
        sliding_window=5, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        swiglu_limit=1.5, swiglu_alpha=1.3, initializer_range=0.1, max_position_embeddings=256,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, beta_fast=8.0, beta_slow=1.0,
                             truncate=False, original_max_position_embeddings=64),
    ),
}
QWEN3_5_TEXT = dict(
    SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
)
QWEN3_NEXT = dict(
    SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
    linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4, intermediate_size=64, norm_topk_prob=False,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
)
QWEN3_5_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
# Qwen4-Exp's text model beside a vision tower: Qwen3.5's hybrid (DeltaNet layers 0 and 2, attention layers 1 and 3,
# the MoE with a gated shared expert on each) with 3 residual streams joined by gated hyper-connections (a rank-24
# mixer); each attention layer's QSA indexer (4 heads, one key a token) keeps 4 blocks of 2 tokens beside the
# incomplete one, so from position 9 on (the 12-token prompt and the 32 decoded tokens) queries drop tokens;
# a sigmoid DeltaNet output gate (not hidden_act's silu); RoPE on half of each head (not Qwen3.5's quarter);
# weights wide enough (0.1) that the stream gates are far from 1/2, the norms random (RANDOMIZED)
QWEN4_EXP_TEXT = dict(
    SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, num_experts=4, hc_count=3, hc_lowrank=24, output_gate_type="sigmoid",
    indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=2,
    initializer_range=0.1, rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
)
# Llama 4's text model: RoPE layers 0-2 attend within chunks of 8 positions (the 12-token prompt and
# 32 decoded tokens cross five boundaries), layer 3 is NoPE with a query temperature that moves every 4
# positions; MoE on layers 1 and 3 (interleaved with dense ones), top-1 as released; Llama 3 rope
# scaling with frequencies in all three bands; experts 48 wide, so their [E, H, 2I] layout is unambiguous
LLAMA4_TEXT = dict(
    SMALL, num_hidden_layers=4, num_key_value_heads=2, head_dim=16, intermediate_size=48, intermediate_size_mlp=96,
    num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8, floor_scale=4,
    attn_scale=0.5, initializer_range=0.1,
    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                         original_max_position_embeddings=64),
)
# Mistral Small 4's text model (mistral4) in the release's class, a mistral3 checkpoint beside a Pixtral
# tower: DeepSeek-V3's layers (dense layer 0, then the MoE with 8 experts in 4 groups, 2 kept) with a
# softmax router, a routing scale of 1.5, and YaRN whose original 16 positions the 12-token prompt and
# 32 decoded tokens cross twice, stepping the query temperature (beta 0.5) at 16 and 32; mscale apart
# from mscale_all_dim, so both the cos/sin factor and the softmax scale move; the head untied
MISTRAL4_TEXT = dict(
    SMALL, num_hidden_layers=3, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
    n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2, routed_scaling_factor=1.5, q_lora_rank=24,
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=12, num_key_value_heads=4,
    max_position_embeddings=64, initializer_range=0.1,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
                         max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0, mscale=0.8, mscale_all_dim=1.0,
                         llama_4_scaling_beta=0.5, partial_rotary_factor=0.5),
)
MISTRAL4_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       image_size=28, patch_size=14, head_dim=16)
# Gemma 4's MoE text model (the 26B-A4B's layout) in the release's class, a gemma4 checkpoint beside a
# vision tower: sliding layers 0 and 2 (a 5-token window, 16-wide heads, 2 KV heads, the whole head
# rotating at base 1000) and full layers 1 and 3 (32-wide heads, 1 KV head whose values are its keys'
# projection, proportional rope turning a quarter of it at base 50000); the dense MLP beside 8 experts
# (2 chosen); the logits capped at 1.5, where they are wide enough to bend; norms, router scales and
# layer scalars random (RANDOMIZED)
GEMMA4_TEXT = dict(
    SMALL, num_hidden_layers=4, intermediate_size=96, num_key_value_heads=2, head_dim=16, global_head_dim=32,
    num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=5, final_logit_softcapping=1.5,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 50000.0}},
    hidden_size_per_layer_input=0, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
    max_position_embeddings=64, initializer_range=0.1,
)
GEMMA4_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=2, head_dim=16, patch_size=4, position_embedding_size=64, pooling_kernel_size=2)
LLAMA4_VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vision_output_dim=32,
                     image_size=28, patch_size=14, projector_input_dim=32, projector_output_dim=32)
# parameters transformers initializes to constants, drawn at random (norm weights around 1, biases and
# AFMoE's router, initialized to zeros, around 0) in a family's tiny model: the parts of its names to match
RANDOMIZED: dict[str, tuple[str, ...]] = {
    "phimoe": ("layernorm.", "model.norm.", "_proj.bias", "lm_head.bias"),
    "dbrx": ("norm_1.", "norm_2.", "norm_f."),
    "flex_olmo": ("layernorm.", "q_norm.", "k_norm.", "model.norm."),
    "ernie4_5_moe": ("e_score_correction_bias",),  # (around 1: only the 0.2 spread moves the choice)
    # unit q/k norm weights commute with RoPE's rotation: random ones show which comes first
    "hunyuan_v1_moe": ("layernorm.",),
    "exaone_moe": ("e_score_correction_bias", "q_norm.", "k_norm."),
    "llama4": ("layernorm.", "language_model.model.norm."),
    "dots1": ("norm.weight", "_proj.bias"),  # (q/k norms before RoPE; attention biases)
    "deepseek_v32": ("indexer.k_norm.", "e_score_correction_bias"),
    "cohere2_moe": ("layernorm.", "model.norm."),
    "lfm2_moe": ("_norm.", "_layernorm.", "expert_bias"),
    "minimax": ("layernorm.", "model.norm.", "self_attn.norm."),
    "kimi_linear": ("layernorm.", "model.norm.", "o_norm.", "e_score_correction_bias"),
    "bailing_hybrid": ("layernorm.", "model.norm.", "o_norm.", "e_score_correction_bias"),
    "laguna": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "e_score_correction_bias"),
    "mimo_v2_flash": ("layernorm.", "model.norm.", "_proj.bias", "sinks", "e_score_correction_bias"),
    "afmoe": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "expert_bias", "router.gate."),
    "solar_open": ("layernorm.", "model.norm.", "_proj.bias", "e_score_correction_bias"),
    "granitemoe_swa": ("layernorm.", "model.norm.", "sinks"),
    "granitemoehybrid": ("layernorm.", "model.norm.", "mamba.norm.", "mamba.D", "mamba.dt_bias"),
    "minicpm5_moe": ("layernorm.", "model.norm.", "e_score_correction_bias"),
    "jamba": ("layernorm.", "mamba.D", "conv1d.bias", "dt_proj.bias"),
    "nemotron_h": ("norm.", "norm_f.", "mixer.D", "mixer.dt_bias", "e_score_correction_bias"),
    "axk1": ("layernorm.", "model.norm.", "e_score_correction_bias"),
    "mellum": ("layernorm.", "model.norm.", "q_norm.", "k_norm."),
    "longcat_flash": ("layernorm.", "model.norm.", "e_score_correction_bias"),
    "mistral4": ("layernorm.", "language_model.norm."),
    "gemma4_text": ("layernorm", "language_model.norm.", "q_norm.", "k_norm.", "router.scale", "per_expert_scale",
                    "layer_scalar"),
    "hy_v3": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "e_score_correction_bias"),
    "flint": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "sinks"),
    "hy_v4": ("layernorm.", "model.norm.", "indexer.k_norm.", "e_score_correction_bias", "sinks", "_hc.scale", "_hc.base",
              "hc_head.hc_scale", "hc_head.hc_base"),
    "doge": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "self_attn.A", "_residual"),
    "qwen4_exp": ("hc_norm.", "q_norm.", "k_norm.", "q_layernorm.", "k_layernorm.", "linear_attn.norm."),
    "kolibri1": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "e_score_correction_bias"),
    "zaya": ("layernorm.", "model.norm.", "router_mlp.norm.", "qk_norm.temp", "residual_scale.", "input_hidden_states_",
             "balancing_biases", "router_states_scale", "lm_head.bias"),
    "lara_mini": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "linear_attn.norm.", "dt_bias"),
    "beam": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "gate_bias", "e_score_correction_bias"),
    "ergo": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "residual_gate.", "post_expert_norm.",
             "shared_experts.norm.", "e_score_correction_bias"),
    "axk2": ("layernorm.norm.", "layernorm.weight", "model.norm.", "indexer.k_norm.", "e_score_correction_bias"),
    "sarvam_moe": ("layernorm.", "model.norm.", "_proj.bias", "q_norm.", "k_norm.", "e_score_correction_bias"),
    "param2moe": ("layernorm.", "model.norm.", "q_norm.", "k_norm.", "e_score_correction_bias"),
    # attention and expert biases (around 0), norms, sinks (around 1)
    "gpt_oss": ("layernorm.", "model.norm.", "_proj.bias", "_proj_bias", "sinks"),
}

FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "minimax_m2", "qwen3_5_moe", "qwen3_next", "mixtral", "granitemoe", "granitemoeshared", "jetmoe", "deepseek_v2", "deepseek_v3", "glm4_moe", "glm_moe_dsa",
            "glm4_moe_lite", "llama4", "dots1", "ernie4_5_moe", "phimoe", "dbrx", "flex_olmo", "hunyuan_v1_moe", "exaone_moe",
            "gpt_oss", "solar_open", "deepseek_v32", "cohere2_moe", "afmoe", "lfm2_moe", "mimo_v2_flash", "laguna", "minimax", "kimi_linear", "bailing_hybrid",
            "sarvam_moe", "granitemoe_swa", "minicpm5_moe", "granitemoehybrid", "axk1", "jamba", "hy_v3", "mellum", "mistral4", "gemma4_text",
            "nemotron_h", "longcat_flash", "flint", "kolibri1", "axk2", "beam", "ergo",
            "doge", "hy_v4", "zaya", "qwen4_exp", "lara_mini")


def build_model(family: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if family == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        return Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=QWEN3_5_TEXT, vision_config=QWEN3_5_VISION))
    if family == "qwen4_exp":  # (the text model beside a vision tower, as Qwen3.5's)
        from transformers.models.qwen4_exp import Qwen4ExpConfig, Qwen4ExpForConditionalGeneration

        model = Qwen4ExpForConditionalGeneration(Qwen4ExpConfig(text_config=QWEN4_EXP_TEXT,
                                                                vision_config=QWEN3_5_VISION))
    elif family == "llama4":  # (the released checkpoints' class: the text model beside a vision tower)
        from transformers import Llama4Config, Llama4ForConditionalGeneration

        model = Llama4ForConditionalGeneration(Llama4Config(text_config=LLAMA4_TEXT, vision_config=LLAMA4_VISION))
    elif family == "mistral4":  # (the release's class: a mistral3 checkpoint, the text model beside Pixtral)
        from transformers import Mistral3Config, Mistral3ForConditionalGeneration

        model = Mistral3ForConditionalGeneration(Mistral3Config(
            text_config={**MISTRAL4_TEXT, "model_type": "mistral4"}, vision_config=MISTRAL4_VISION,
            tie_word_embeddings=False))
    elif family == "gemma4_text":  # (the release's class: a gemma4 checkpoint, the text model beside its vision tower)
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration

        model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=GEMMA4_TEXT, vision_config=GEMMA4_VISION))
    else:
        config = QWEN3_NEXT if family == "qwen3_next" else FAMILY_CONFIGS[family]
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config))
    with torch.no_grad():  # (transformers' constants, LayerNorm's 1 and 0 and biases' 0, would hide a missing one)
        # (buffers too: the correction biases of EXAONE, Solar Open, DeepSeek-V3.2 and LFM2-MoE are buffers)
        for name, p in [*model.named_parameters(), *model.named_buffers()]:
            if any(part in name for part in RANDOMIZED.get(family, ())):
                p.normal_(0.0 if name.endswith((".bias", "_proj_bias", "router.gate.weight")) else 1.0, 0.2)
    return model


def save_checkpoint(family: str, out: Path, *, fused: bool = False, max_shard_size: str | None = None, seed: int = 0) -> Path:
    """A tiny random checkpoint of `family` in `out`, as `save_pretrained` writes it."""
    model = build_model(family, seed)
    kwargs = {"save_original_format": False} if fused else {}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out, **kwargs)
    return out


def _quantize_block_fp8(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    nr, nc = math.ceil(rows / block), math.ceil(cols / block)
    padded = torch.zeros(nr * block, nc * block, dtype=torch.float32)
    padded[:rows, :cols] = w.float()
    blocks = padded.view(nr, block, nc, block)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12)
    scale_inv = amax / torch.finfo(torch.float8_e4m3fn).max  # dequant: w = q * scale_inv
    q = (blocks / scale_inv[:, None, :, None]).to(torch.float8_e4m3fn).view(nr * block, nc * block)[:rows, :cols]
    return q.contiguous(), scale_inv.contiguous()


def to_fp8(src: Path, out: Path) -> Path:
    """Rewrite a per-expert checkpoint as a DeepSeek-style FP8 block-scaled one."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(file))
    quantized = {}
    for name, t in tensors.items():
        is_linear = name.endswith("proj.weight") or name.endswith("proj_with_mqa.weight")
        if is_linear and t.dim() == 2 and "indexer" not in name:
            q, s = _quantize_block_fp8(t)
            quantized[name] = q
            quantized[name[: -len("weight")] + "weight_scale_inv"] = s
        else:
            quantized[name] = t
    save_file(quantized, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [128, 128]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # nibble i; 8 + i is its negative


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [..., rows, cols] (cols a multiple of 32) -> (blocks uint8 [..., rows, cols / 32, 16],
    scales uint8 [..., rows, cols / 32]) as gpt-oss ships its experts: the inverse of transformers'
    `convert_moe_packed_tensors` (32 values a block, the even one of a pair in the low nibble, the
    block's power of two biased by 127), each value the nearest e2m1 step of its block's scale,
    which puts the block's largest at most at 6."""
    blocks = w.float().reshape(*w.shape[:-1], -1, 32)
    exponent = torch.ceil(torch.log2(blocks.abs().amax(-1, keepdim=True).clamp(min=2.0 ** -120) / 6.0))
    scaled = blocks / torch.exp2(exponent)
    nibble = (scaled.abs()[..., None] - E2M1_MAGNITUDES).abs().argmin(-1) + 8 * (scaled < 0)
    packed = (nibble[..., 0::2] | (nibble[..., 1::2] << 4)).to(torch.uint8)
    return packed, (exponent[..., 0] + 127).to(torch.uint8)


def to_mxfp4(src: Path, out: Path) -> Path:
    """Rewrite a gpt-oss checkpoint as the released ones ship: experts as MXFP4 `_blocks` and
    `_scales` of each projection's [out, in] rows (gate_up_proj [E, H, 2I] and down_proj [E, I, H]
    are stored transposed, x @ W), their biases and every other tensor as they were."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in load_all(src).items():
        if name.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")):
            tensors[name + "_blocks"], tensors[name + "_scales"] = quantize_mxfp4(t.transpose(1, 2))
        else:
            tensors[name] = t
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def load_all(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors
