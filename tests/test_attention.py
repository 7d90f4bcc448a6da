"""causal_attention against the plain softmax formula: a prompt from position 0, a prompt after a
cached prefix (queries in chunks), and one decode token; and prefill logits of the last token only."""

from __future__ import annotations

import pytest
import torch

from runtime.layers import attention
from runtime.layers.attention import causal_attention


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, Hq, D]
    scores = torch.einsum("thd,lhd->htl", q.double(), k.double()) * scale
    visible = torch.arange(k.shape[0])[None, :] <= torch.arange(start, start + q.shape[0])[:, None]
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return torch.einsum("htl,lhd->thd", probs, v.double())


@pytest.mark.parametrize(("start", "new", "chunked"), [(0, 37, False), (23, 41, False), (23, 41, True), (60, 1, False)])
def test_causal_attention_matches_the_formula(monkeypatch, start: int, new: int, chunked: bool) -> None:
    if chunked:  # a few queries per masked call, as a long prompt after a long prefix would get
        monkeypatch.setattr(attention, "MASKED_SCORES_PER_CALL", 8 * 5 * (start + new))
    gen = torch.Generator().manual_seed(start + new)
    q = torch.randn(new, 8, 16, generator=gen)
    k, v = torch.randn(start + new, 2, 16, generator=gen), torch.randn(start + new, 2, 16, generator=gen)
    ours = causal_attention(q, k, v, start, 0.25)
    assert ours.shape == (new, 8, 16)
    torch.testing.assert_close(ours.double(), reference(q, k, v, start, 0.25), atol=1e-5, rtol=1e-5)


def test_prefill_logits_of_the_last_token_only(tmp_path) -> None:
    """forward(last_only=True): the last row of the full logits, without the [T, V] matrix."""
    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load

    store = Store(tmp_path)
    pull("tiny", store)
    model = load(store, "tiny").model
    prompt = torch.arange(3, 40)
    full = model.forward(prompt, model.new_state(64))
    last = model.forward(prompt, model.new_state(64), last_only=True)
    assert last.shape == (1, full.shape[1])
    torch.testing.assert_close(last, full[-1:])


@pytest.mark.skipif(__import__("runtime.experts.cpu_kernels", fromlist=["native_kernel"]).native_kernel() is None,
                    reason="no C++ compiler here")
@pytest.mark.parametrize(("length", "kv_heads", "group", "dim", "v_dim", "dtype"),
                         [(1, 4, 8, 128, 128, torch.bfloat16), (7, 2, 4, 80, 80, torch.float32),
                          (64, 2, 4, 80, 80, torch.float32), (300, 4, 8, 128, 128, torch.bfloat16),
                          (257, 1, 16, 192, 128, torch.bfloat16), (513, 4, 2, 64, 64, torch.float16)])
def test_cpu_decode_attention_on_the_kernel_matches_the_formula(length, kv_heads, group, dim, v_dim, dtype) -> None:
    """From DECODE_KERNEL_MIN_LENGTH cached positions: one pass over a cache slice (strided, as
    KVCache.append returns it), GQA groups, a value width other than the key's (MLA)."""
    assert length >= attention.DECODE_KERNEL_MIN_LENGTH
    gen = torch.Generator().manual_seed(length)
    cache_k = torch.randn(length + 40, kv_heads, dim, generator=gen).to(dtype)
    cache_v = torch.randn(length + 40, kv_heads, v_dim, generator=gen).to(dtype)
    k, v = cache_k[:length], cache_v[:length]
    q = torch.randn(1, kv_heads * group, dim, generator=gen).to(dtype)
    ours = causal_attention(q, k, v, length - 1, 0.1)
    assert ours.shape == (1, kv_heads * group, v_dim) and ours.dtype == dtype
    want = reference(q.float(), k.float(), v.float(), length - 1, 0.1)
    ulp = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(ours.double(), want, atol=ulp * want.abs().max().item(), rtol=0)
