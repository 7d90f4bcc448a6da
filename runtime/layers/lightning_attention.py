"""Lightning attention: MiniMax-Text-01's linear attention with a fixed exponential decay per
head, and the state it carries between calls.

q, k and v (SiLU of one fused projection) attend as out_i = sum over j <= i of
exp(-s (i - j)) (q_i . k_j) v_j, s the head's slope (smaller for later layers). The state is each
head's decayed sum S = sum_j exp(-s (n - 1 - j)) k_j^T v_j [D, D] after the n tokens so far:
a recurrent mixer (it cannot rewind). A call computes in blocks of `block_size` tokens, as
transformers' MiniMaxLightningAttention does: within a block the decayed q k^T products, from
the blocks before it the decayed state; one token a call is the same with a block of one. The
output is RMS-normed over all heads, gated by sigmoid(output_gate x), through out_proj.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..loading.read_ftw import ModelWeights
from .attention import Start
from .linear import linear
from .norm import rms_norm
from .recurrent_state import RecurrentState

NORM_EPS = 1e-6  # the output norm is MiniMaxRMSNorm(heads * head_dim) at its default eps


def slopes(num_heads: int, layer: int, num_layers: int) -> torch.Tensor:
    """Each head's decay rate s [heads] on `layer` of `num_layers`, as MiniMax computes it."""
    base = 1 / (2 ** (8 / num_heads))
    rate = base ** (torch.arange(num_heads) + 1)
    return rate * (1 - layer / (num_layers - 1 + 1e-5) + 1e-5)


class LightningAttention:
    """The mixer of a "linear_attention" layer (`prefix`: its qkv_proj, output_gate, norm, out_proj)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, weights: ModelWeights, prefix: str, *, heads: int, head_dim: int, layer: int, num_layers: int,
                 block_size: int, dtype: torch.dtype) -> None:
        self.qkv, self.gate = weights.get(prefix + "qkv_proj.weight"), weights.get(prefix + "output_gate.weight")
        self.norm, self.out = weights.get(prefix + "norm.weight"), weights.get(prefix + "out_proj.weight")
        self.heads, self.head_dim, self.block_size, self.dtype = heads, head_dim, block_size, dtype
        self.slope = slopes(heads, layer, num_layers)[:, None, None].to(self.qkv.device)  # [h, 1, 1]

    def new_cache(self, max_tokens: int) -> RecurrentState:
        return RecurrentState(torch.zeros(self.heads, self.head_dim, self.head_dim, dtype=self.dtype))

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: RecurrentState, start: Start) -> torch.Tensor:
        cache.seek(start)
        t = x.shape[0]
        qkv = F.silu(linear(x, self.qkv)).view(t, self.heads, 3 * self.head_dim).transpose(0, 1)  # [h, T, 3D]
        q, k, v = qkv.split(self.head_dim, dim=-1)
        state, parts = cache.value, []
        slope = self.slope
        for first in range(0, t, self.block_size):
            n = min(self.block_size, t - first)
            qb, kb, vb = q[:, first:first + n], k[:, first:first + n], v[:, first:first + n]
            steps = torch.arange(n, device=x.device)
            query_decay = torch.exp(-slope * (steps + 1)[:, None]).to(x.dtype)  # [h, n, 1]
            key_decay = torch.exp(-slope * (n - 1 - steps)[:, None]).to(x.dtype)
            gap = slope * (steps[:, None] - steps[None, :])  # [h, n, n]
            diagonal = torch.exp(torch.where(gap >= 0, -gap, float("-inf"))).to(x.dtype)
            intra = torch.matmul(torch.matmul(qb, kb.transpose(-1, -2)) * diagonal, vb)
            parts.append(torch.matmul(qb * query_decay, state) + intra)
            state = state * torch.exp(-slope * n).to(x.dtype) + torch.matmul((kb * key_decay).transpose(-1, -2), vb)
        cache.value.copy_(state)
        cache.advance(start, t)
        out = torch.cat(parts, dim=1).transpose(0, 1).reshape(t, self.heads * self.head_dim)  # [T, h * D]
        out = torch.sigmoid(linear(x, self.gate)) * rms_norm(out, self.norm, NORM_EPS)
        return linear(out, self.out)
