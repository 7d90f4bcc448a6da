"""runtime.layers.linear: decode-sized products of large CPU weights on the compiled kernel,
against F.linear; everything else is F.linear itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from runtime.experts.cpu_kernels import native_kernel
from runtime.layers import linear as linear_mod
from runtime.layers.linear import linear

needs_kernel = pytest.mark.skipif(native_kernel() is None, reason="no C++ compiler here")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
def test_decode_products_match_f_linear(monkeypatch, dtype: torch.dtype, tokens: int) -> None:
    monkeypatch.setattr(linear_mod, "DENSE_KERNEL_MIN_BYTES", 0)
    gen = torch.Generator().manual_seed(tokens)
    weight = (torch.randn(301, 200, generator=gen) / 200**0.5).to(dtype)  # odd rows, columns off the SIMD width
    bias = torch.randn(301, generator=gen).to(dtype)
    x = torch.randn(tokens, 200, generator=gen).to(dtype)
    exact = F.linear(x.double(), weight.double(), bias.double())
    for b in (None, bias):
        ours = linear(x, weight, b)
        assert ours.dtype == dtype and ours.shape == (tokens, 301)
        want = exact if b is not None else F.linear(x.double(), weight.double())
        # the kernel sums in fp32, then rounds once to x's dtype, as torch does
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
        torch.testing.assert_close(ours.double(), want, atol=tol * want.abs().max().item(), rtol=0)


def test_what_stays_on_f_linear(monkeypatch) -> None:
    """Small weights, more than four tokens, 3-D inputs and quantized or strided weights: F.linear."""
    calls = []
    kernel = native_kernel()
    if kernel is not None:
        real = kernel.dense
        monkeypatch.setattr(kernel, "dense", lambda *a: (calls.append(a[0].shape), real(*a))[1])
    weight = torch.randn(64, 32)
    for x in (torch.randn(1, 32), torch.randn(5, 32), torch.randn(2, 1, 32)):
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight))  # small: under the size floor
    monkeypatch.setattr(linear_mod, "DENSE_KERNEL_MIN_BYTES", 0)
    x5 = torch.randn(5, 32)
    torch.testing.assert_close(linear(x5, weight), F.linear(x5, weight))
    strided = torch.randn(64, 32).t()  # [32, 64], not contiguous
    x1 = torch.randn(1, 64)
    torch.testing.assert_close(linear(x1, strided), F.linear(x1, strided))
    assert calls == []
    # no token, or an input of the wrong width: F.linear's answer or its error (the kernel read past x)
    assert linear(torch.randn(0, 32), weight).shape == (0, 64)
    with pytest.raises(RuntimeError):
        linear(torch.randn(1, 16), weight)
    assert calls == []


@needs_kernel
def test_a_model_decodes_the_same_through_the_kernel(monkeypatch, tmp_path) -> None:
    """The tiny model (f32) greedy-decodes the same tokens with every projection on the kernel."""
    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load

    store = Store(tmp_path)
    pull("tiny", store)
    model = load(store, "tiny").model

    def greedy() -> list[int]:
        state = model.new_state(64)
        logits = model.forward(torch.arange(5, 20), state, last_only=True)
        tokens = []
        for _ in range(12):
            tokens.append(int(logits[-1].argmax()))
            logits = model.forward(torch.tensor([tokens[-1]]), state)
        return tokens

    plain = greedy()
    monkeypatch.setattr(linear_mod, "DENSE_KERNEL_MIN_BYTES", 0)
    calls = []
    kernel = native_kernel()
    real = kernel.dense
    monkeypatch.setattr(kernel, "dense", lambda *a: (calls.append(1), real(*a))[1])
    assert greedy() == plain
    assert calls  # the projections went through the kernel
