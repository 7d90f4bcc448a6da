"""The decode-attention kernel (runtime/gpu/kernels/decode_attention.py) against torch's form
(runtime/layers/attention.py `_decode_attention`) and float64 attention: one token over a cache
span whose later positions are masked, full, sliding-window and chunked, grouped heads.
Interpreted on the CPU (TRITON_INTERPRET=1, tests/conftest.py), compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from runtime.layers.attention import _decode_attention
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

decode_attention = import_kernel("decode_attention", "decode_attention")
supports = import_kernel("decode_attention", "supports")


def _exact(q, k, v, scale, position, window=0, chunk=0) -> torch.Tensor:
    """float64 attention of q [1, Hq, D] over the keys up to `position` (and from its window or chunk)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    first = 0
    if window:
        first = max(first, position - window + 1)
    if chunk:
        first = max(first, position - position % chunk)
    keys = k[first: position + 1].double().repeat_interleave(heads // kv_heads, dim=1)  # [L, Hq, D]
    values = v[first: position + 1].double().repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("hd,lhd->hl", q[0].double(), keys) * scale
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), values)[None]


def _case(span, heads, kv_heads, dim, dim_v, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, dim, generator=gen).to(dtype)
    k = torch.randn(span, kv_heads, dim, generator=gen).to(dtype)
    v = torch.randn(span, kv_heads, dim_v, generator=gen).to(dtype)
    return q, k, v


@needs(decode_attention)
@pytest.mark.parametrize(("span", "heads", "kv_heads", "dim", "position"), [
    (64, 8, 2, 32, 0),  # the first token: one key
    (64, 8, 2, 32, 63),  # every key of the span
    (200, 4, 4, 16, 130),  # no grouping, a span not a multiple of the splits
    (96, 12, 1, 64, 50),  # twelve query heads on one key head (padded to 16)
])
def test_float32_attention_is_exact_to_float32_sums(span, heads, kv_heads, dim, position) -> None:
    q, k, v = _case(span, heads, kv_heads, dim, dim, torch.float32)
    scale = dim ** -0.5
    visible = torch.tensor([position], dtype=torch.int64)
    ours = decode_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), scale, visible.to(DEVICE)).cpu()
    assert ours.shape == (1, heads, dim) and ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), _exact(q, k, v, scale, position), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours, _decode_attention(q, k, v, scale, visible=visible), rtol=1e-5, atol=1e-5)


@needs(decode_attention)
@pytest.mark.parametrize(("window", "chunk"), [(5, 0), (0, 16), (40, 0)])
def test_a_window_or_a_chunk_hides_the_keys_before_it(window, chunk) -> None:
    q, k, v = _case(128, 8, 2, 32, 32, torch.float32, seed=1)
    scale, position = 0.2, 70
    visible = torch.tensor([position], dtype=torch.int64)
    ours = decode_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), scale, visible.to(DEVICE), window=window,
                            chunk=chunk).cpu()
    torch.testing.assert_close(ours.double(), _exact(q, k, v, scale, position, window, chunk), rtol=1e-5, atol=1e-5)
    reference = _decode_attention(q, k, v, scale, visible=visible, window=window or None, chunk_size=chunk or None)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


@needs(decode_attention)
def test_bfloat16_attention_is_within_one_rounding_of_the_exact_one() -> None:
    """Values of a different width (MLA-like value heads) too; torch's form rounds the scores and
    probabilities to bf16 on the way, the kernel does not, so it is nearer the exact result."""
    q, k, v = _case(256, 16, 4, 64, 32, torch.bfloat16, seed=2)
    scale, position = 0.125, 200
    visible = torch.tensor([position], dtype=torch.int64)
    ours = decode_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), scale, visible.to(DEVICE)).cpu()
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, 16, 32)
    exact = _exact(q, k, v, scale, position)
    ours_error = (ours.double() - exact).abs().max().item()
    torch_error = (_decode_attention(q, k, v, scale, visible=visible).double() - exact).abs().max().item()
    assert ours_error <= 2 ** -8 * exact.abs().max().item() + 1e-3
    assert ours_error <= torch_error + 1e-3


@needs(supports)
def test_what_the_kernel_takes() -> None:
    q, k, v = _case(32, 8, 2, 32, 32, torch.float32)
    assert not supports(q, k, v)  # (a CPU call: torch's form, or the CPU kernel)
    if HAS_CUDA:
        q, k, v = q.cuda(), k.cuda(), v.cuda()
        assert supports(q, k, v)
        assert not supports(q.half(), k, v)  # mixed dtypes
        assert not supports(torch.zeros(1, 40, 32, device="cuda"), k, v)  # 20 query heads a key head
        assert not supports(torch.cat([q, q]), k, v)  # two tokens


@needs(decode_attention)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="counts compiled kernels: CUDA only")
def test_one_compilation_serves_every_span() -> None:
    """A captured step's span is a power of two of the conversation's length (decode_span): its
    splits and their keys are numbers, not constexprs, so a conversation that grows past 8k, 16k,
    32k tokens compiles nothing on the way (each compile stalled a turn by seconds)."""
    partial = import_kernel("decode_attention", "_partial_kernel")
    merge = import_kernel("decode_attention", "_merge_kernel")
    q, k, v = _case(40960, 8, 2, 64, 64, torch.bfloat16, seed=3)
    q, k, v = q.cuda(), k.cuda(), v.cuda()
    device = torch.cuda.current_device()

    def compiled() -> tuple[int, int]:  # the file's other tests compile their own dtypes and shapes
        return len(partial.device_caches[device][0]), len(merge.device_caches[device][0])

    counts = []
    for span in (256, 4096, 16384, 32768, 40960):
        position = span - 7
        visible = torch.tensor([position], dtype=torch.int64, device="cuda")
        out = decode_attention(q, k[:span], v[:span], 0.125, visible)
        exact = _exact(q.cpu(), k[:span].cpu(), v[:span].cpu(), 0.125, position)
        torch.testing.assert_close(out.double().cpu(), exact, rtol=2e-2, atol=2e-2)
        counts.append(compiled())
    assert all(c == counts[0] for c in counts), f"compiled kernels after each span: {counts}"
