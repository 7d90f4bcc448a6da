"""The fused softmax top-k router against the families' torch form (runtime/layers/mlp.py).

Under TRITON_INTERPRET=1 on CPU tensors without CUDA, compiled with it. The exponentials and
sums are not torch's to the last bit, so on logits without near-ties the experts are the same
and the weights agree to float32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from runtime.layers import mlp
from tests.kernels import DEVICE, import_kernel, needs

softmax_topk_fused = import_kernel("router_topk", "softmax_topk_fused")
needs_triton = needs(softmax_topk_fused)


def torch_form(logits: torch.Tensor, k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    saved, mlp._device_router = mlp._device_router, None
    try:
        return mlp.softmax_topk(logits, k, normalize)
    finally:
        mlp._device_router = saved


@needs_triton
@pytest.mark.parametrize(("tokens", "experts", "k", "normalize", "dtype"), [
    (1, 128, 8, True, torch.bfloat16),  # Qwen3-30B-A3B decode
    (4, 512, 10, True, torch.float32),  # Qwen3-Next / 3.5
    (3, 8, 2, False, torch.float16),  # Mixtral
    (2, 60, 4, True, torch.float32),  # not a power of two
])
def test_fused_router_picks_torchs_experts(tokens: int, experts: int, k: int, normalize: bool,
                                           dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(experts + k)
    logits = torch.randn(tokens, experts, generator=gen).to(dtype).to(DEVICE)
    ids, weights = softmax_topk_fused(logits, k, normalize)
    want_ids, want_weights = torch_form(logits, k, normalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32 and ids.shape == (tokens, k)
    assert torch.equal(ids, want_ids)  # best first, as torch's sorted top-k
    torch.testing.assert_close(weights, want_weights, rtol=1e-5, atol=1e-7)


@needs_triton
def test_fused_router_breaks_ties_to_the_lower_expert() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, 1.0, -1.0]], device=DEVICE)
    ids, weights = softmax_topk_fused(logits, 3, True)
    assert ids.tolist() == [[1, 3, 2]]
    torch.testing.assert_close(weights[0, 0], weights[0, 1])


def test_softmax_topk_hands_supported_calls_to_the_device_router() -> None:
    calls = []

    def kernel(logits, k, normalize):
        calls.append((tuple(logits.shape), k, normalize))
        return torch_form(logits, k, normalize)

    logits = torch.randn(2, 16)
    saved = mlp._device_router
    try:
        mlp.use_device_router(lambda logits, k: k == 4, kernel)
        mlp.softmax_topk(logits, 4, True)
        mlp.softmax_topk(logits, 2, True)
    finally:
        mlp._device_router = saved
    assert calls == [((2, 16), 4, True)]
