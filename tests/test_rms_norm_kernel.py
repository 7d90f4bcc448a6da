"""The fused RMSNorm kernel against the families' torch form (runtime/layers/norm.py).

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py), whose
float32 -> bfloat16 truncates: there the outputs agree within bf16's rounding. With CUDA
compiled, where nearly every 16-bit element must equal torch's bit for bit (the sum of squares
is added in another order, so a value on a rounding boundary may land on the other side; in
float32 the root's last bit shows in whole rows, within float32's tolerance).
"""

from __future__ import annotations

import pytest
import torch

from runtime.layers import norm
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

rms_norm_fused = import_kernel("rms_norm", "rms_norm_fused")
needs_triton = needs(rms_norm_fused)


def torch_form(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    return norm.torch_rms_norm(x, weight, eps, offset=offset)


CASES = [  # (shape, dtype, offset): a hidden row, a step's heads, a ragged width, float32, Qwen3.5's (1 + w)
    ((1, 2048), torch.bfloat16, 0.0),
    ((3, 32, 128), torch.bfloat16, 0.0),
    ((2, 1000), torch.float16, 0.0),
    ((5, 512), torch.float32, 0.0),
    ((2, 4, 256), torch.bfloat16, 1.0),
]


@needs_triton
@pytest.mark.parametrize(("shape", "dtype", "offset"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_fused_norm_matches_the_torch_form(shape: tuple[int, ...], dtype: torch.dtype, offset: float) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(dtype).to(DEVICE)
    weight = (torch.randn(shape[-1], generator=gen) * 0.2 + (0.0 if offset else 1.0)).to(dtype).to(DEVICE)
    got, want = rms_norm_fused(x, weight, 1e-6, offset), torch_form(x, weight, 1e-6, offset)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want)
    if HAS_CUDA and dtype != torch.float32:  # (float32 keeps the root's last bit: whole rows may differ by it)
        assert (got == want).float().mean() > 0.99


@needs_triton
def test_fused_norm_of_a_view_with_a_row_stride() -> None:
    """The first 128 columns of wider rows (a row stride, unit columns), and a transposed view
    (copied first), as torch normalizes them."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(4, 192, generator=gen).to(torch.bfloat16).to(DEVICE)
    weight = torch.rand(128, generator=gen).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(rms_norm_fused(wide[:, :128], weight, 1e-5), torch_form(wide[:, :128], weight, 1e-5))
    square = torch.randn(128, 128, generator=gen).to(torch.bfloat16).to(DEVICE)
    torch.testing.assert_close(rms_norm_fused(square.t(), weight, 1e-5), torch_form(square.t(), weight, 1e-5))


def test_rms_norm_hands_supported_calls_to_the_device_kernel() -> None:
    """`use_device_kernel`: the kernel computes the calls its `supports` takes; the torch form
    the rest (here a stand-in kernel, on the CPU)."""
    calls = []

    def kernel(x, weight, eps, offset):
        calls.append((tuple(x.shape), eps, offset))
        return torch_form(x, weight, eps, offset)

    x, weight = torch.randn(2, 8), torch.ones(8)
    saved = norm._device_kernel
    try:
        norm.use_device_kernel(lambda x, w, offset: x.shape[0] == 2, kernel)
        norm.rms_norm(x, weight, 1e-6, offset=1.0)
        norm.rms_norm(x[:1], weight, 1e-6)
    finally:
        norm._device_kernel = saved
    assert calls == [((2, 8), 1e-6, 1.0)]


@needs_triton
def test_supports_only_what_the_kernel_computes_as_torch_does() -> None:
    from runtime.gpu.kernels.rms_norm import supports

    x16, w16, w32 = torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8, dtype=torch.bfloat16), torch.ones(8)
    assert not supports(x16, w16, 0.0)  # on the CPU: the torch form
    if HAS_CUDA:
        x16, w16, w32 = x16.cuda(), w16.cuda(), w32.cuda()
        assert supports(x16, w16, 0.0) and supports(x16, w32, 1.0)
        assert not supports(x16, w32, 0.0)  # weight * h would promote to float32
        assert not supports(x16, w16[:4], 0.0) and not supports(x16.to(torch.int32), w16, 0.0)
