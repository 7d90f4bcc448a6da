"""The MoE geometry of the models `ft bench` emulates: a built-in table of real models' shapes (all
layers, the dense side for the fit planner), and `tiny` for CI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchShape:
    """The MoE geometry of one model, and its dense side for the planner (bf16 unless said)."""

    name: str
    num_layers: int
    first_moe_layer: int  # layers before it are dense (no routed experts)
    num_experts: int
    top_k: int
    hidden: int
    moe_inter: int
    dense_bytes: int  # everything but the routed experts, as the runtime holds it on the GPU
    attention: dict[str, Any] = field(default_factory=dict)  # config fields for the KV layout
    family: str = "qwen3_moe"
    dtype: str = "bf16"
    note: str = ""

    @property
    def moe_layers(self) -> list[int]:
        return list(range(self.first_moe_layer, self.num_layers))


def _params_qwen36() -> int:
    """Qwen3.6-35B-A3B's non-expert parameters (an estimate from its config; 248320 vocab, untied)."""
    embed = 2 * 248320 * 2048
    full = 10 * (16 * 256 * 2 * 2048 + 2 * 2 * 256 * 2048 + 2048 * 16 * 256)  # gated q, k, v, o
    linear = 30 * ((2 * 16 * 128 + 2 * 32 * 128) * 2048 + 2 * 32 * 2048 + 2048 * 32 * 128)  # qkvz, ba, out
    shared = 40 * (3 * 2048 * 512 + 256 * 2048)  # shared expert + router
    return embed + full + linear + shared


def _params_glm45_air() -> int:
    """GLM-4.5-Air's non-expert parameters (config: 151552 vocab untied, 96 q / 8 KV heads of 128,
    first layer dense with intermediate 10944, one shared expert of 1408 per MoE layer)."""
    embed = 2 * 151552 * 4096
    attention = 46 * (2 * 96 * 128 * 4096 + 2 * 8 * 128 * 4096)
    return embed + attention + 3 * 4096 * 10944 + 45 * (3 * 4096 * 1408 + 128 * 4096)


SHAPES: dict[str, BenchShape] = {
    "qwen3-30b-a3b": BenchShape(
        "qwen3-30b-a3b", 48, 0, 128, 8, 2048, 768, 3_082_186_752,  # dense: tests/test_plan.py, by hand
        {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
         "hidden_size": 2048}, note="Qwen3MoeConfig of Qwen/Qwen3-30B-A3B"),
    "qwen3.6-35b-a3b": BenchShape(
        "qwen3.6-35b-a3b", 40, 0, 256, 8, 2048, 512, 2 * _params_qwen36(),
        {"num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
         "hidden_size": 2048, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
         "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "full_attention_interval": 4},
        family="qwen3_5_moe", note="dense bytes estimated from the config (shared expert included)"),
    "glm-4.5-air": BenchShape(
        "glm-4.5-air", 46, 1, 128, 8, 4096, 1408, 2 * _params_glm45_air(),
        {"num_hidden_layers": 46, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
         "hidden_size": 4096}, family="glm4_moe",
        note="dense bytes estimated from the config (shared expert, dense layer 0 included)"),
    "tiny": BenchShape("tiny", 2, 0, 16, 4, 64, 32, 0, note="CI: no budget; the cache holds half the experts"),
}
