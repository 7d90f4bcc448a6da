"""The CPU kernel's row ops (runtime/experts/csrc/rows.cpp) against the torch forms they replace on
the CPU. RMSNorm (runtime/layers/norm.torch_rms_norm): the same float32 steps, the sum of squares
in another order, so a bf16 result equals torch's but where a value sits on a rounding boundary,
and a float32 one is within the root's last bit. The rotation (layers/rope.apply_rotary's torch
form): bit for bit. Native and scalar builds."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from runtime.experts import cpu_kernels
from runtime.experts.cpu_kernels import NATIVE_FLAGS, SCALAR_FLAGS, Kernel, KernelBuildError
from runtime.layers import norm, rope


@pytest.fixture(scope="module")
def kernels() -> dict[str, Kernel]:
    try:
        with ThreadPoolExecutor(2) as pool:
            paths = dict(zip(("native", "scalar"), pool.map(cpu_kernels.build, (NATIVE_FLAGS, SCALAR_FLAGS)), strict=True))
    except KernelBuildError as e:
        pytest.skip(f"no C++ compiler here: {e}")
    return {name: Kernel(path) for name, path in paths.items()}


CASES = [  # (shape, dtype, offset, weighted): a decode row, a step's q heads, a prompt, a ragged width,
    # Qwen3.5's (1 + w), l2_norm's none
    ((1, 2048), torch.bfloat16, 0.0, True),
    ((1, 32, 128), torch.bfloat16, 0.0, True),
    ((300, 2048), torch.bfloat16, 0.0, True),  # (rows over threads)
    ((3, 100), torch.bfloat16, 0.0, True),
    ((2, 4, 256), torch.bfloat16, 1.0, True),
    ((5, 64), torch.bfloat16, 0.0, False),
    ((1, 2048), torch.float32, 0.0, True),
    ((7, 96), torch.float32, 1.0, True),
    ((4, 130), torch.float32, 0.0, False),
]


@pytest.mark.parametrize("variant", ["native", "scalar"])
@pytest.mark.parametrize(("shape", "dtype", "offset", "weighted"), CASES,
                         ids=[f"{list(c[0])}-{str(c[1])[6:]}-{c[2]}-{'w' if c[3] else 'none'}" for c in CASES])
def test_kernel_norm_is_the_torch_form(kernels, variant: str, shape: tuple[int, ...], dtype: torch.dtype,
                                       offset: float, weighted: bool) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = (torch.randn(shape[-1], generator=gen) * 0.2 + (0.0 if offset else 1.0)).to(dtype) if weighted else None
    got = kernels[variant].rms_norm(x, weight, 1e-6, offset, 2)
    want = norm.torch_rms_norm(x, weight, 1e-6, offset=offset)
    assert got.dtype == want.dtype and got.shape == want.shape
    if dtype == torch.bfloat16:
        assert (got != want).float().mean() < 1e-3  # a value on a rounding boundary, at most
        # ... normed one bf16 step off, times the weight rounded again: two steps at most
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=0)
    else:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)


def test_a_decode_row_is_torch_bit_for_bit(kernels) -> None:
    """One 2,048-value row (a decode step's hidden state): the sums match torch's, so every bit does."""
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        x, weight = torch.randn(1, 2048, generator=gen).to(dtype), torch.randn(2048, generator=gen).to(dtype)
        assert torch.equal(kernels["native"].rms_norm(x, weight, 1e-6, 0.0, 2), norm.torch_rms_norm(x, weight, 1e-6))


def test_rms_norm_takes_the_kernel_only_where_it_can() -> None:
    """norm.rms_norm and l2_norm run contiguous f32/bf16 CPU rows with a weight of their dtype on
    the kernel; f16, a strided view and a weight of another dtype stay on torch's form (and give it)."""
    if cpu_kernels.native_kernel() is None:
        pytest.skip("no CPU kernel here")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, generator=gen).to(torch.bfloat16)
    w = torch.randn(64, generator=gen).to(torch.bfloat16)
    assert norm._cpu_kernel_takes(x, w) and norm._cpu_kernel_takes(x, None)
    for other, weight in ((x.half(), w.half()), (x.t().contiguous().t(), w), (x, w.float()), (x[:, ::2], w[::2])):
        assert not norm._cpu_kernel_takes(other, weight)
        assert torch.equal(norm.rms_norm(other, weight, 1e-6), norm.torch_rms_norm(other, weight, 1e-6))
    torch.testing.assert_close(norm.rms_norm(x, w, 1e-6), norm.torch_rms_norm(x, w, 1e-6), rtol=2 ** -6, atol=0)
    torch.testing.assert_close(norm.l2_norm(x, 1e-6), norm.torch_rms_norm(x, None, 1e-6), rtol=2 ** -6, atol=0)


def torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary's torch form (rope.py), written out: the first R channels rotated, the rest kept."""
    rot = cos.shape[-1]
    cos, sin = cos[:, None, :], sin[:, None, :]
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rope.rotate_half(head) * sin, tail), dim=-1)


def tables(tokens: int, rot: int, dtype: torch.dtype, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    angles = torch.rand(tokens, rot // 2, generator=gen) * 50  # (each angle twice, as RotaryEmbedding's)
    both = torch.cat((angles, angles), dim=-1)
    return both.cos().to(dtype), both.sin().to(dtype)


ROTATIONS = [  # (tokens, heads, dim, rotated): a decode step's q heads, a partial rotation, a prompt over threads
    (1, 32, 128, 128), (3, 4, 128, 64), (300, 8, 64, 64), (2, 2, 96, 32)]


@pytest.mark.parametrize("variant", ["native", "scalar"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("shape", ROTATIONS, ids=[str(list(r)) for r in ROTATIONS])
def test_kernel_rotation_is_torch_bit_for_bit(kernels, variant: str, dtype: torch.dtype,
                                              shape: tuple[int, int, int, int]) -> None:
    tokens, heads, dim, rot = shape
    gen = torch.Generator().manual_seed(dim + rot)
    x = (torch.randn(tokens, heads, dim, generator=gen) * 4).to(dtype)
    cos, sin = tables(tokens, rot, dtype, gen)
    got = kernels[variant].rotary(x, cos, sin, 2)
    assert got.dtype == dtype and torch.equal(got, torch_rotary(x, cos, sin))


def test_apply_rotary_takes_the_kernel_only_where_it_can() -> None:
    """apply_rotary runs contiguous f32/bf16 heads with tables of their dtype on the kernel; f16,
    a strided view and tables of another dtype stay on torch's form (and give it)."""
    if cpu_kernels.native_kernel() is None:
        pytest.skip("no CPU kernel here")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 4, 64, generator=gen).to(torch.bfloat16)
    cos, sin = tables(2, 64, torch.bfloat16, gen)
    assert rope._cpu_kernel_takes(x, cos, sin)
    assert torch.equal(rope.apply_rotary(x, cos, sin), torch_rotary(x, cos, sin))
    for other, c, s in ((x.half(), cos.half(), sin.half()), (x.transpose(0, 1).contiguous().transpose(0, 1), cos, sin),
                        (x, cos.float(), sin.float())):
        assert not rope._cpu_kernel_takes(other, c, s)
        assert torch.equal(rope.apply_rotary(other, c, s), torch_rotary(other, c, s))
