"""Multi-head latent attention (DeepSeek-V2/V3, GLM-5), as transformers' `DeepseekV3Attention`.

Queries go through an optional low-rank bottleneck (q_a_proj -> RMSNorm -> q_b_proj); keys and
values are expanded per head (kv_b_proj) from one compressed latent per token, and every head
shares one roped key. Only the latent and the roped key are cached.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import ModelConfig
from ..loading.read_ftw import ModelWeights
from .attention import Start, causal_attention, store
from .linear import linear
from .norm import rms_norm
from .rope import RotaryEmbedding, apply_rotary, apply_rotary_interleaved, yarn_mscale

# transformers builds q_a_layernorm/kv_a_layernorm with RMSNorm's default eps, not config.rms_norm_eps
LATENT_NORM_EPS = 1e-6


def softmax_scale(qk_head_dim: int, rope: dict[str, Any]) -> float:
    """1/sqrt(d), times mscale(factor, mscale_all_dim)^2 for scaled (YaRN) rope, as transformers'
    `yarn_apply_mscale` (the cos/sin carry the mscale/mscale_all_dim ratio, see rope.py)."""
    scale = qk_head_dim ** (-0.5)
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        mscale = yarn_mscale(float(rope["factor"]), float(rope["mscale_all_dim"]))
        scale = scale * mscale * mscale
    return scale


class MLACache:
    """Per token: the normalized latent [kv_lora_rank] and the roped shared key [rope_dim].

    This is what transformers caches, and the memory-optimal form the fit planner assumes
    ((kv_lora_rank + qk_rope_head_dim) values per token and layer, not heads * (k + v) dims).
    Each step re-expands the cached latents through kv_b_proj, as transformers does; folding
    kv_b_proj into the query and output projections ("absorbed" MLA) would avoid that and is
    the decode form for the GPU runtime.
    """

    def __init__(self, max_tokens: int, kv_lora_rank: int, rope_dim: int, dtype: torch.dtype) -> None:
        self.latent = torch.zeros(max_tokens, kv_lora_rank, dtype=dtype)
        self.k_rot = torch.zeros(max_tokens, rope_dim, dtype=dtype)

    def append(self, start: Start, latent: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store positions [start, start + T); returns every latent and roped key up to there
        (a DevicePosition: its span, attention masking what follows it)."""
        return store(self.latent, start, latent), store(self.k_rot, start, k_rot)


def unrotated(x: torch.Tensor, cos: torch.Tensor | None, sin: torch.Tensor | None) -> torch.Tensor:
    """No position encoding: MLA's rope channels as they are (Kimi Linear's NoPE MLA)."""
    return x


class MLAttention:
    """MLA of one layer. `query`, `keys_values` and `output` are the steps; `__call__` runs them
    with plain causal attention (GLM's DSA runs them around a sparse token selection). `rope`
    None: the shared key channels are not rotated (Kimi Linear's MLA has no position encoding)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)

    def __init__(self, config: ModelConfig, weights: ModelWeights, prefix: str, rope: RotaryEmbedding | None,
                 dtype: torch.dtype, *, interleave: bool) -> None:
        self.heads = config.num_attention_heads
        self.nope_dim, self.rope_dim = int(config.get("qk_nope_head_dim")), int(config.get("qk_rope_head_dim"))
        self.v_dim, self.kv_lora_rank = int(config.get("v_head_dim")), int(config.get("kv_lora_rank"))
        self.load_query(config, weights, prefix)
        self.kv_a, self.kv_a_bias = weights.get(prefix + "kv_a_proj_with_mqa.weight"), weights.maybe(prefix + "kv_a_proj_with_mqa.bias")
        self.kv_a_norm, self.kv_b = weights.get(prefix + "kv_a_layernorm.weight"), weights.get(prefix + "kv_b_proj.weight")
        self.o, self.o_bias = weights.get(prefix + "o_proj.weight"), weights.maybe(prefix + "o_proj.bias")
        self.rope, self.dtype = rope, dtype
        self.rotate = unrotated if rope is None else apply_rotary_interleaved if interleave else apply_rotary
        self.scale = softmax_scale(self.nope_dim + self.rope_dim, config.rope_parameters)

    def load_query(self, config: ModelConfig, weights: ModelWeights, prefix: str) -> None:
        """The query's projections: q_proj, or the low-rank q_a_proj -> q_a_layernorm -> q_b_proj."""
        if config.get("q_lora_rank") is None:
            self.q_proj: torch.Tensor | None = weights.get(prefix + "q_proj.weight")
        else:
            self.q_proj = None
            self.q_a, self.q_a_bias = weights.get(prefix + "q_a_proj.weight"), weights.maybe(prefix + "q_a_proj.bias")
            self.q_a_norm, self.q_b = weights.get(prefix + "q_a_layernorm.weight"), weights.get(prefix + "q_b_proj.weight")

    def new_cache(self, max_tokens: int) -> MLACache:
        return MLACache(max_tokens, self.kv_lora_rank, self.rope_dim, self.dtype)

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(q [T, heads, nope + rope] with its rope part rotated, the normalized low-rank query
        [T, q_lora_rank] that GLM's indexer reads; None without q_lora_rank)."""
        if self.q_proj is not None:
            q, q_low = linear(x, self.q_proj), None
        else:
            q_low = rms_norm(linear(x, self.q_a, self.q_a_bias), self.q_a_norm, LATENT_NORM_EPS)
            q = linear(q_low, self.q_b)
        q_nope, q_rot = q.view(x.shape[0], self.heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        return torch.cat((q_nope, self.rotate(q_rot, cos, sin)), dim=-1), q_low

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: MLACache,
                    start: Start) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache this step's latents; k [L, heads, nope + rope] and v [L, heads, v_dim] of all L tokens."""
        latent, k_rot = linear(x, self.kv_a, self.kv_a_bias).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        latent = rms_norm(latent, self.kv_a_norm, LATENT_NORM_EPS)
        k_rot = self.rotate(k_rot[:, None, :], cos, sin)[:, 0]  # one key head shared by all heads
        latent, k_rot = cache.append(start, latent, k_rot)
        length = latent.shape[0]
        kv = linear(latent, self.kv_b).view(length, self.heads, self.nope_dim + self.v_dim)  # [L, heads, nope + v]
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        k = torch.cat((k_nope, k_rot[:, None, :].expand(length, self.heads, self.rope_dim)), dim=-1)
        return k, v

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        """attended [T, heads, v_dim] -> [T, H]."""
        return linear(attended.reshape(attended.shape[0], -1), self.o, self.o_bias)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: MLACache, start: Start) -> torch.Tensor:
        cos, sin = self.rope(positions, x.dtype) if self.rope is not None else (None, None)
        q, _ = self.query(x, cos, sin)
        k, v = self.keys_values(x, cos, sin, cache, start)
        return self.output(causal_attention(q, k, v, start, self.scale))


class GatedQueryMLA(MLAttention):
    """A.X-K2's MLA: no q_b_proj; `q_gate_proj` reads the low-rank query normed and raw side by side
    ([q_a_layernorm(q_a x) | q_a x], 2 x q_lora_rank) and gives each head its query (nope + rope)
    and a gate (v_head_dim); the attended values are multiplied by sigmoid(gate) (float32, cast
    back) before o_proj. `query` keeps the step's gate for `output`, which the same call runs
    after it (MLAttention's and DSA's order)."""

    gate: torch.Tensor | None = None  # the current step's, [T, heads, v_dim]

    def load_query(self, config: ModelConfig, weights: ModelWeights, prefix: str) -> None:
        self.q_proj = None
        self.q_a, self.q_a_bias = weights.get(prefix + "q_a_proj.weight"), weights.maybe(prefix + "q_a_proj.bias")
        self.q_a_norm = weights.get(prefix + "q_a_layernorm.weight")
        self.q_gate = weights.get(prefix + "q_gate_proj.weight")  # [heads x (nope + rope + v), 2 x q_lora_rank]

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        q_raw = linear(x, self.q_a, self.q_a_bias)
        q_low = rms_norm(q_raw, self.q_a_norm, LATENT_NORM_EPS)
        qg = linear(torch.cat((q_low, q_raw), dim=-1), self.q_gate).view(x.shape[0], self.heads, -1)
        q_nope, q_rot, self.gate = qg.split([self.nope_dim, self.rope_dim, self.v_dim], dim=-1)  # [T, heads, *]
        return torch.cat((q_nope, self.rotate(q_rot, cos, sin)), dim=-1), q_low

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        assert self.gate is not None, "output before query"
        gated = (attended * torch.sigmoid(self.gate.float())).to(attended.dtype)  # [T, heads, v_dim]
        self.gate = None
        return super().output(gated)


class OutputGatedMLA(MLAttention):
    """Tencent Hy4's MLA: the attended values multiplied by sigmoid(gate_proj x) per head (v_head_dim
    each, from the sublayer's input x, in x's dtype as transformers' HYV4Attention) before o_proj.
    `query` keeps the step's gate for `output`, as GatedQueryMLA does."""

    gate: torch.Tensor | None = None  # the current step's, [T, heads, v_dim]

    def load_query(self, config: ModelConfig, weights: ModelWeights, prefix: str) -> None:
        super().load_query(config, weights, prefix)
        self.gate_proj = weights.get(prefix + "gate_proj.weight")  # [heads x v_head_dim, H]

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.gate = linear(x, self.gate_proj).view(x.shape[0], self.heads, -1)
        return super().query(x, cos, sin)

    def output(self, attended: torch.Tensor) -> torch.Tensor:
        assert self.gate is not None, "output before query"
        gated = attended * torch.sigmoid(self.gate)
        self.gate = None
        return super().output(gated)
