"""The fused rotary kernel against the families' torch form (runtime/layers/rope.apply_rotary).

Elementwise, so bit for bit where the interpreter rounds as the GPU does (float32, float16);
under TRITON_INTERPRET=1 float32 -> bfloat16 truncates, so there bf16 agrees within a unit in
the last place of the operands. With CUDA compiled, bit for bit in every dtype.
"""

from __future__ import annotations

import pytest
import torch

from runtime.layers import rope
from runtime.layers.rope import RotaryEmbedding
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

apply_rotary_fused = import_kernel("rotary", "apply_rotary_fused")
needs_triton = needs(apply_rotary_fused)


def torch_form(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    saved, rope._device_kernel = rope._device_kernel, None
    try:
        return rope.apply_rotary(x, cos, sin)
    finally:
        rope._device_kernel = saved


CASES = [  # (tokens, heads, head dim, rotary dim, dtype): Qwen3's heads, a prompt, partial rotary, others
    (1, 32, 128, 128, torch.bfloat16),
    (5, 4, 128, 128, torch.bfloat16),
    (3, 2, 256, 64, torch.bfloat16),
    (2, 3, 64, 64, torch.float16),
    (4, 2, 96, 32, torch.float32),
]


@needs_triton
@pytest.mark.parametrize(("tokens", "heads", "dim", "rot", "dtype"), CASES, ids=[str(c) for c in CASES])
def test_fused_rotary_matches_the_torch_form(tokens: int, heads: int, dim: int, rot: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(dim + rot)
    x = (torch.randn(tokens, heads, dim, generator=gen) * 2).to(dtype).to(DEVICE)
    emb = RotaryEmbedding(rot, {"rope_theta": 1e6}, 4096)
    cos, sin = emb(torch.arange(100, 100 + tokens), dtype)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    got, want = apply_rotary_fused(x, cos, sin), torch_form(x, cos, sin)
    assert got.dtype == want.dtype and got.shape == want.shape
    if HAS_CUDA or dtype != torch.bfloat16:
        assert torch.equal(got, want)
    else:  # truncated products: a unit in the last place of the operands (|x| < 16 here) apart
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.07)


@needs_triton
def test_fused_rotary_of_a_strided_view() -> None:
    """Heads split out of a wider projection (a token stride of the whole row), as a view."""
    gen = torch.Generator().manual_seed(5)
    qkv = torch.randn(3, 6, 64, generator=gen).to(DEVICE)
    k = qkv[:, 2:4]  # [T, 2, 64], token stride 6 * 64
    emb = RotaryEmbedding(64, {"rope_theta": 10000.0}, 128)
    cos, sin = (t.to(DEVICE) for t in emb(torch.arange(3), torch.float32))
    assert torch.equal(apply_rotary_fused(k, cos, sin), torch_form(k, cos, sin))


def test_apply_rotary_hands_supported_calls_to_the_device_kernel() -> None:
    calls = []

    def kernel(x, cos, sin):
        calls.append(tuple(x.shape))
        return torch_form(x, cos, sin)

    x = torch.randn(2, 3, 8)
    cos, sin = RotaryEmbedding(8, {"rope_theta": 10000.0}, 16)(torch.arange(2), torch.float32)
    saved = rope._device_kernel
    try:
        rope.use_device_kernel(lambda x, cos, sin: x.shape[1] == 3, kernel)
        rope.apply_rotary(x, cos, sin)
        rope.apply_rotary(x[:, :2], cos, sin)
    finally:
        rope._device_kernel = saved
    assert calls == [(2, 3, 8)]
