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

FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "minimax_m2", "qwen3_5_moe", "qwen3_next", "mixtral", "deepseek_v2", "deepseek_v3", "glm4_moe", "glm_moe_dsa")


def build_model(family: str, seed: int = 0):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    if family == "qwen3_5_moe":
        from transformers.models.qwen3_5_moe import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

        return Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=QWEN3_5_TEXT, vision_config=QWEN3_5_VISION))
    config = QWEN3_NEXT if family == "qwen3_next" else FAMILY_CONFIGS[family]
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config))


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


def load_all(directory: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors
