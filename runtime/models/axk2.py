"""SK Telecom A.X-K2 (axk2): DeepSeek-V3.2's model (MLA with DeepSeek Sparse Attention on every
layer: each runs its own indexer, its rotated channels turned as halves, and attends to the best
`index_topk` earlier tokens; glm_moe_dsa.py) with three changes, each a shared piece:

- the query (layers/mla.GatedQueryMLA): no q_b_proj; `q_gate_proj` reads the low-rank query normed
  and raw side by side and gives each head its query and an output gate, sigmoid(gate) times the
  attended values before o_proj (the indexer reads the normed low-rank query, as V3.2's);
- gated norms (layers/norm.GatedRMSNorm): `input_layernorm` on every layer and
  `post_attention_layernorm` on the MoE layers are RMSNorms times a low-rank sigmoid gate of
  their own output (`mlp.fc1`, `mlp.fc2`);
- routing: DeepSeek-V3's sigmoid scores + correction bias, renormalized and scaled, with no
  expert groups where `n_group` is unset (A.X-K2-Light); with groups, those dropped have their
  choice scores set to 0, not -inf, as transformers' AXK2TopkRouter does.

Dense SwiGLU MLPs where `mlp_layer_types` says "dense" (else AXK2Config's derivation from
first_k_dense_replace, moe_layer_freq), shared experts beside the routed ones. The release's names
(`q_b_proj` for q_gate_proj, the gates' `W_down`/`W_up`) are renamed at conversion (ftw/families.py).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig, UnsupportedFamilyError
from ..experts import ExpertExecutor
from ..layers.mla import GatedQueryMLA
from ..layers.norm import GatedRMSNorm
from ..loading.read_ftw import ModelWeights
from .base import FFN, Block, DecoderModel, Norm
from .deepseek_v3 import SigmoidMoE, rotary
from .glm_moe_dsa import DSAModel, DSAttention, Indexer
from .qwen3_moe import dense_mlp

# AXK2Config's defaults, for a config.json that leaves a key out (n_group unset: no groups)
DEFAULTS = dict(n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared_experts=1)

# transformers keeps these in float32 (_keep_in_fp32_modules[_strict]): routing must not see bf16-rounded values
KEEP_FLOAT32 = ("e_score_correction_bias", "mlp.gate.weight", "indexer.weights_proj.weight")


def build(config: ModelConfig, weights: ModelWeights, executor: ExpertExecutor, dtype: torch.dtype) -> DecoderModel:
    if config.get("q_lora_rank") is None or config.get("hidden_act", "silu") != "silu":
        raise UnsupportedFamilyError("axk2 needs q_lora_rank (its query gate and indexer read the low-rank query) "
                                     "and silu MLPs")
    eps, rope, blocks = config.rms_norm_eps, rotary(config), []

    def gated_norm(prefix: str) -> GatedRMSNorm:
        return GatedRMSNorm(weights.get(prefix + "norm.weight"), weights.get(prefix + "mlp.fc1.weight"),
                            weights.get(prefix + "mlp.fc2.weight"), eps)

    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        mla = GatedQueryMLA(config, weights, p + "self_attn.", rope, dtype, interleave=True)
        attention = DSAttention(mla, Indexer(config, weights, p + "self_attn.indexer.", interleave=False),
                                int(config.get("index_head_dim")))
        ffn: FFN
        post_norm: Norm
        if i in config.moe_layers:
            ffn = SigmoidMoE(config, weights, i, p + "mlp.", executor, DEFAULTS, dropped=0.0)
            post_norm = gated_norm(p + "post_attention_layernorm.")
        else:
            ffn, post_norm = dense_mlp(weights, p + "mlp."), weights.get(p + "post_attention_layernorm.weight")
        blocks.append(Block(gated_norm(p + "input_layernorm."), attention, post_norm, ffn))
    return DSAModel(config, weights, blocks, dtype)
