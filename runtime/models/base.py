"""The decoder skeleton every family shares: embed, blocks, final norm, head; one sequence.

A family supplies, per layer, a mixer (attention or a linear-attention variant) and an FFN
(dense MLP or MoE), and the per-layer decode state each needs. Nothing here knows a family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..layers.attention import DevicePosition, Start
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import forward_begins
from ..loading.read_ftw import ModelWeights


class ContextOverflowError(ValueError):
    """More tokens than the decode state was sized for."""


class Mixer(Protocol):
    """Token mixing of one layer (attention): x [T, H] at positions -> [T, H], updating `cache`.

    A mixer whose class sets `takes_device_position = True` also takes a DevicePosition as
    `start` (one token at a position held on the device), so a decode step through it can be
    captured once as a CUDA graph: it updates its cache in place and leaves host counters alone.
    Its cache is positional (entries past the length never read) or has `reset()`, which
    empties it in place, so a state can be emptied and reused (`DecoderModel.reset_state`);
    a cache that counts its own `length` has it set by `DecoderModel.set_length`. A mixer whose
    class sets `recurrent = True` keeps a state every token moves on, which cannot be rewound."""

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: Any, start: Start) -> torch.Tensor: ...

    def new_cache(self, max_tokens: int) -> Any: ...


FFN = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class DecodeState:
    """Everything one sequence carries between forward calls: per-layer caches and its length."""

    max_tokens: int
    caches: list[Any]
    length: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Block:
    input_norm: torch.Tensor
    mixer: Mixer
    post_norm: torch.Tensor
    ffn: FFN


class DecoderModel:
    """Pre-norm residual decoder: x += mixer(norm(x)); x += ffn(norm(x))."""

    def __init__(self, config: ModelConfig, weights: ModelWeights, blocks: list[Block], dtype: torch.dtype,
                 *, prefix: str = "model.", norm_offset: float = 0.0) -> None:
        self.config = config
        self.dtype = dtype
        self.blocks = blocks
        self.norm_offset = norm_offset
        self.embed = weights.get(prefix + "embed_tokens.weight")
        self.final_norm = weights.get(prefix + "norm.weight")
        head = weights.maybe("lm_head.weight")
        self.lm_head = self.embed if head is None or config.tie_word_embeddings else head
        self.eps = config.rms_norm_eps

    def new_state(self, max_tokens: int) -> DecodeState:
        return DecodeState(max_tokens, [b.mixer.new_cache(max_tokens) for b in self.blocks])

    @property
    def rewinds(self) -> bool:
        """Whether a step's token can be taken back by `set_length` alone: every mixer's cache is
        read by position (attention's keys and values), none is a recurrent state that every
        token moves on."""
        return not any(getattr(b.mixer, "recurrent", False) for b in self.blocks)

    @property
    def takes_device_position(self) -> bool:
        """Whether every layer's mixer takes a DevicePosition (`decode_at` works)."""
        return all(getattr(b.mixer, "takes_device_position", False) for b in self.blocks)

    @torch.inference_mode()  # the caches' tensors are inference tensors once a forward has run
    def reset_state(self, state: DecodeState) -> DecodeState:
        """A state for a new sequence: `state` itself, emptied in place where every mixer takes a
        DevicePosition (its buffers keep their addresses, so CUDA graphs captured over them stay
        valid; recurrent caches are zeroed); else a new one."""
        if not self.takes_device_position:
            return self.new_state(state.max_tokens)
        for cache in state.caches:
            reset = getattr(cache, "reset", None)
            if reset is not None:
                reset()
        state.extra.clear()
        self.set_length(state, 0)
        return state

    def set_length(self, state: DecodeState, length: int) -> None:
        """`state` holds `length` tokens: after steps at a DevicePosition (which move no host
        counter), and the caches that count their own tokens with it."""
        state.length = length
        for cache in state.caches:
            if hasattr(cache, "length"):
                cache.length = length

    def norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps, offset=self.norm_offset)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, state: DecodeState, last_only: bool = False) -> torch.Tensor:
        """Logits [T, V] (float32) for `input_ids` [T] following the `state.length` tokens before;
        `last_only`: [1, V], the last token's (what a prefill needs: [T, V] of a long prompt is
        gigabytes, and the largest matmul of the pass)."""
        t, start = input_ids.shape[0], state.length
        if start + t > state.max_tokens:
            raise ContextOverflowError(
                f"{start + t} tokens do not fit the context of {state.max_tokens}; shorten the prompt, "
                "clear the conversation, or raise num_ctx"
            )
        x = self._layers(F.embedding(input_ids, self.embed), torch.arange(start, start + t), state, start)
        state.length = start + t
        if last_only:
            x = x[-1:]
        return linear(self.norm(x, self.final_norm), self.lm_head).to(torch.float32)

    @torch.inference_mode()
    def decode_at(self, input_ids: torch.Tensor, position: DevicePosition, state: DecodeState) -> torch.Tensor:
        """Logits [1, V] (float32) of one token at `position`, held on the device: the same work
        as `forward` with nothing read from the host, so it can be captured as a CUDA graph
        (gpu/step_graphs.py). Needs `takes_device_position`; the caller then moves the state on
        (`set_length`)."""
        x = self._layers(F.embedding(input_ids, self.embed), position.index, state, position)
        return linear(self.norm(x, self.final_norm), self.lm_head).to(torch.float32)

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, state: DecodeState, start: Start) -> torch.Tensor:
        forward_begins()  # the layers share one pass's rope tables
        for block, cache in zip(self.blocks, state.caches, strict=True):
            x = x + block.mixer(self.norm(x, block.input_norm), positions, cache, start)
            x = x + block.ffn(self.norm(x, block.post_norm))
        return x
