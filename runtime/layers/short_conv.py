"""LFM2's gated short convolution: the mixer of its "conv" layers, with the per-sequence state
it carries between calls.

x [T, H] is projected to three [T, H] parts B, C and x' (`in_proj`); B * x' runs through a
depthwise causal convolution over the last `conv_L_cache` tokens (no activation); the output is
C times that, through `out_proj`. The state is the last K - 1 convolution inputs, which every
token moves on: a recurrent mixer (it cannot rewind), as transformers' Lfm2MoeShortConv computes
it (prefill from a zero state, decode one token at a time after it).
"""

from __future__ import annotations

import torch

from ..loading.read_ftw import ModelWeights
from .attention import Start
from .gated_deltanet import causal_conv1d
from .linear import linear
from .recurrent_state import RecurrentState


class ShortConv:
    """The mixer of a "conv" layer (`prefix`: its `conv.` module: in_proj, conv, out_proj)."""

    takes_device_position = True  # a decode call may be captured in a CUDA graph (base.Mixer)
    recurrent = True  # its state moves with every token and cannot be moved back (base.Mixer)
    chunks_prompt = True  # a long prompt may come in chunks, each continuing the state (base.Mixer)

    def __init__(self, weights: ModelWeights, prefix: str, dtype: torch.dtype) -> None:
        self.in_proj, self.in_bias = weights.get(prefix + "in_proj.weight"), weights.maybe(prefix + "in_proj.bias")
        self.out_proj, self.out_bias = weights.get(prefix + "out_proj.weight"), weights.maybe(prefix + "out_proj.bias")
        conv = weights.get(prefix + "conv.weight")  # [H, 1, K] as nn.Conv1d stores a depthwise kernel
        self.conv, self.conv_bias = conv.reshape(conv.shape[0], conv.shape[-1]), weights.maybe(prefix + "conv.bias")
        self.dtype = dtype

    def new_cache(self, max_tokens: int) -> RecurrentState:
        channels, width = self.conv.shape
        return RecurrentState(torch.zeros(channels, width - 1, dtype=self.dtype))  # the last K - 1 inputs [H, K - 1]

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: RecurrentState, start: Start) -> torch.Tensor:
        cache.seek(start)
        b, c, h = linear(x, self.in_proj, self.in_bias).chunk(3, dim=-1)  # each [T, H]
        conv, state = causal_conv1d(b * h, cache.value, self.conv, self.conv_bias, silu=False)
        cache.value.copy_(state)
        cache.advance(start, x.shape[0])
        return linear(c * conv, self.out_proj, self.out_bias)
