"""Attention with per-head sinks (runtime/layers/sink_attention.py) against the computation as
transformers' GptOss eager attention writes it: every score, the mask added, the sink column
concatenated, softmax, the sink dropped. Prompts from 0 and after a cached prefix, decode steps,
steps at a DevicePosition over a longer span, windows and none, in blocks small and whole."""

from __future__ import annotations

import pytest
import torch

from runtime.layers import sink_attention
from runtime.layers.attention import DevicePosition
from runtime.layers.sink_attention import sink_causal_attention

HEADS, KV_HEADS, DIM, LENGTH = 4, 2, 8, 40


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, sinks: torch.Tensor,
              window: int | None) -> torch.Tensor:
    group = HEADS // KV_HEADS
    keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [L, Hq, D]
    scores = torch.einsum("thd,lhd->htl", q, keys) * scale  # [Hq, T, L]
    query_pos = torch.arange(start, start + q.shape[0])[:, None]
    key_pos = torch.arange(k.shape[0])[None, :]
    visible = key_pos <= query_pos
    if window is not None:
        visible &= key_pos > query_pos - window
    scores = scores + torch.where(visible, 0.0, torch.finfo(torch.float32).min)
    combined = torch.cat([scores, sinks.reshape(-1, 1, 1).expand(-1, q.shape[0], 1)], dim=-1)
    probs = torch.softmax(combined - combined.max(dim=-1, keepdim=True).values, dim=-1)[..., :-1]
    return torch.einsum("htl,lhd->thd", probs, values)


@pytest.fixture
def qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(LENGTH, HEADS, DIM, generator=gen), torch.randn(LENGTH, KV_HEADS, DIM, generator=gen),
            torch.randn(LENGTH, KV_HEADS, DIM, generator=gen), torch.randn(HEADS, generator=gen) * 2)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("max_scores", [1 << 27, 64])  # whole, and blocks of one or a few queries
@pytest.mark.parametrize("start, tokens", [(0, LENGTH), (13, 20), (39, 1), (3, 1)])
def test_sink_attention_is_transformers_eager_attention(qkv, monkeypatch, window: int | None, max_scores: int,
                                                        start: int, tokens: int) -> None:
    monkeypatch.setattr(sink_attention, "MASKED_SCORES_PER_CALL", max_scores)
    q, k, v, sinks = qkv
    q, k, v = q[start:start + tokens], k[:start + tokens], v[:start + tokens]
    ours = sink_causal_attention(q, k, v, start, 0.3, sinks, window)
    torch.testing.assert_close(ours, reference(q, k, v, start, 0.3, sinks, window), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_a_step_at_a_device_position_masks_the_keys_past_it_and_before_its_window(qkv, window: int | None) -> None:
    q, k, v, sinks = qkv
    position = 21  # the span holds all LENGTH cached positions; those after 21 are stale
    ours = sink_causal_attention(q[position:position + 1], k, v, DevicePosition(torch.tensor([position]), LENGTH),
                                 0.3, sinks, window)
    want = reference(q[position:position + 1], k[:position + 1], v[:position + 1], position, 0.3, sinks, window)
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=1e-5)
