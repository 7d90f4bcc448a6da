"""The decoder skeleton every family shares: embed, blocks, final norm, head; one sequence.

A family supplies, per layer, a mixer (attention or a linear-attention variant) and an FFN
(dense MLP or MoE), and the per-layer decode state each needs. Nothing here knows a family.

A model given `prefill_chunk_tokens` (the GPU path: runtime/gpu/device_model.py) computes a
longer prompt a layer at a time in chunks of at most that many tokens: each layer's mixer runs
chunk after chunk (each continuing the cache the chunks before it filled) where the mixer allows
it, then its FFN chunk after chunk, so what a layer allocates is one chunk's and only the
residual stream ([T, H], the layer's input) spans the prompt. The layer order is kept, so an
expert executor sees each MoE layer's chunks one after the other and streams its bank once
(`prompt_chunk` says which chunk a call is). A MoE layer's FFN may take larger chunks than its
mixer (`prefill_ffn_chunk_tokens`): where the fit plan halved the chunk so that the expert cache
keeps a layer's top-k, an executor that streams the experts through that cache does so once per
FFN call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ..config import (
    ContextOverflowError,  # noqa: F401 - raised here, re-exported by runtime.models
    ModelConfig,
)
from ..layers.attention import DevicePosition, Start
from ..layers.linear import linear
from ..layers.norm import rms_norm
from ..layers.rope import forward_begins
from ..loading.read_ftw import ModelWeights
from .state import DecodeState, StateCheckpoint
from .state_copy import ParkedPart, ParkedState, copy_state_prefix, park_parts, unpark_state


class Mixer(Protocol):
    """Token mixing of one layer (attention): x [T, H] at positions -> [T, H], updating `cache`.

    A mixer whose class sets `takes_device_position = True` also takes a DevicePosition as
    `start` (one token at a position held on the device), so a decode step through it can be
    captured once as a CUDA graph: it updates its cache in place and leaves host counters alone.
    Its cache is positional (entries past the length never read) or has `reset()`, which
    empties it in place, so a state can be emptied and reused (`DecoderModel.reset_state`);
    a cache that counts its own `length` has it set by `DecoderModel.set_length`. A mixer whose
    class sets `recurrent = True` keeps a state every token moves on, which cannot be rewound;
    where that cache has `checkpoint()` (a host copy) and `restore(copy)` (put back in place), a
    state can be taken back to a saved position all the same (DecoderModel.checkpoint). A
    mixer whose class sets `chunks_prompt = True` may be given a long prompt as consecutive
    calls of a few tokens each (DecoderModel.prefill_chunk_tokens), at little more cost than one
    call: its cache holds what a later chunk reads of the earlier ones (attention's keys and
    values; MLA, which re-expands its whole cached prefix each call, does not set it)."""

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: Any, start: Start) -> torch.Tensor: ...

    def new_cache(self, max_tokens: int) -> Any: ...


# x [T, H] -> [T, H], each token on its own (see PromptChunk). An FFN whose class sets
# `takes_tokens = True` is called as ffn(x, tokens), with the token ids [T] of x's rows (on the host
# or the device; DeepSeek-V4's hash routing chooses experts by them).
FFN = Callable[[torch.Tensor], torch.Tensor]


class Residual(Protocol):
    """How a sublayer joins a residual of several streams, x [T, n, H] (DeepSeek-V4's
    hyper-connections: layers/hyper_connection.py): `enter` gives the sublayer's input [T, H] and
    what `leave` needs, `leave` the streams after the sublayer's output [T, H]."""

    def enter(self, x: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    def leave(self, x: torch.Tensor, out: torch.Tensor, mixes: Any) -> torch.Tensor: ...


class Streams(Protocol):
    """A residual of several streams: the embeddings [T, H] spread into them, [T, n, H]
    (`expand`), and the last layer's gathered back for the final norm (`collapse`)."""

    def expand(self, x: torch.Tensor) -> torch.Tensor: ...

    def collapse(self, x: torch.Tensor) -> torch.Tensor: ...


@dataclass(frozen=True)
class PromptChunk:
    """Which chunk of a layer's tokens an FFN call computes, where DecoderModel computes a long
    prompt in chunks (`prompt_chunk`): the `index`-th of `count`, one after the other, with no
    other layer's call between them (the last may be short: it is still part of a long prompt).
    An expert executor keeps the layer's bank on the device from the first to the last, and
    makes its once-a-layer work (the cache's placement) at the last, over the whole prompt's
    routing."""

    index: int
    count: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


_chunk = threading.local()  # `value`: the PromptChunk of the FFN call under way on this thread


def prompt_chunk() -> PromptChunk | None:
    """The chunk of its layer's tokens the FFN call under way on this thread computes; None for
    a call of all of them (a short prompt, a decode step, a model without chunks)."""
    return getattr(_chunk, "value", None)


@contextmanager
def _computing_chunk(chunk: PromptChunk) -> Iterator[None]:
    _chunk.value = chunk
    try:
        yield
    finally:
        _chunk.value = None


def chunk_bounds(num_tokens: int, max_tokens: int) -> list[tuple[int, int]]:
    """[first, end) of the chunks of `max_tokens` (the last one what is left) covering
    `num_tokens`. Boundaries at multiples of the chunk keep attention bit for bit the whole
    call's on the CPU, whose flash kernel splits keys in blocks of 512 (PREFILL_CHUNK_TOKENS)."""
    return [(first, min(first + max_tokens, num_tokens)) for first in range(0, num_tokens, max_tokens)]


# how a sublayer's output joins the residual: x = x * residual + out * update, each a float or a [H]
# tensor (Beam's depth-scaled residual: sqrt((n - 1) / n) and 1 / sqrt(n) at the n-th join)
ResidualScale = tuple[float | torch.Tensor, float | torch.Tensor]

# biases [H] added before those scales: x = (x + residual_bias) * residual + (out + update_bias) * update
# (ZAYA's residual scaling); None: no bias on that side
ResidualBias = tuple[torch.Tensor | None, torch.Tensor | None]

# an RMSNorm's weight, or a norm of its own: a LayerNorm (Phi-3.5-MoE, DBRX), none (FlexOlmo's post-norm block)
Norm = torch.Tensor | Callable[[torch.Tensor], torch.Tensor]


class NoMixer:
    """The mixer of a block that has none (Nemotron-H's MoE and MLP layers are a norm and an FFN
    alone): DecoderModel skips it, and its cache is nothing."""

    takes_device_position = True
    chunks_prompt = True

    def __call__(self, x: torch.Tensor, positions: torch.Tensor, cache: Any, start: Start) -> torch.Tensor:
        raise AssertionError("a block without a mixer is not called")

    def new_cache(self, max_tokens: int) -> None:
        return None


NO_MIXER = NoMixer()


@dataclass
class Block:
    """One layer: x += mixer(input_norm(x)), then x += ffn(post_norm(x)). A layer with one of the
    two only (Nemotron-H's) has mixer NO_MIXER (input_norm unread) or ffn None (post_norm unread)."""

    input_norm: Norm
    mixer: Mixer
    post_norm: Norm
    ffn: FFN | None
    residuals: tuple[Residual, Residual] | None = None  # the mixer's and the FFN's, where x is several streams
    # the FFN reads the mixer's input (input_norm's) beside it, both added: x += mixer(h) + ffn(h)
    # (Cohere's parallel block; post_norm is not read)
    parallel: bool = False
    # the residual stream times this [1] after the block (Gemma 4's `layer_scalar`)
    output_scale: torch.Tensor | None = None
    # the mixer's and the FFN's (residual, update) scales, where the residual is scaled too
    # (x = x * residual + out * update; None: x += out); not read by a parallel block
    scales: tuple[ResidualScale, ResidualScale] | None = None
    # the mixer's and the FFN's (residual, update) biases, added before `scales` (read only with them)
    biases: tuple[ResidualBias, ResidualBias] | None = None


def _check_room(state: DecodeState, tokens: int) -> None:
    """ContextOverflowError, naming the fix, where `tokens` more do not fit `state`'s context."""
    if state.length + tokens > state.max_tokens:
        raise ContextOverflowError(
            f"{state.length + tokens} tokens do not fit the context of {state.max_tokens}; shorten the prompt, "
            "clear the conversation, or raise num_ctx"
        )


class DecoderModel:
    """Pre-norm residual decoder: x += mixer(norm(x)); x += ffn(norm(x)) (a parallel block:
    h = norm(x); x += mixer(h) + ffn(h)).

    Granite's multipliers (its config's names; 1 elsewhere): the embeddings are multiplied by
    `embedding_multiplier`, each mixer's and FFN's output by `residual_multiplier` before it is
    added, and the logits divided by `logits_scaling`. `final_logit_softcapping` (Gemma's): the
    logits squashed to (-cap, cap) as cap * tanh(logits / cap). A block with `scales` scales the
    residual too: x = x * residual + out * update (Beam's depth-scaled residual), in place of the
    multiplier; with `biases`, x = (x + residual_bias) * residual + (out + update_bias) * update.
    `embedding_bias` [H]: added to the embeddings before `embedding_multiplier` (a float, or a [H]
    scale: ZAYA's (x + bias) * scale).

    `streams` (DeepSeek-V4's hyper-connections): the residual is several streams, the embeddings
    expanded into them and collapsed before the final norm; each block's `residuals` say how its
    mixer and FFN read and join them (instead of x += sublayer(norm(x))).

    `prefill_chunk_tokens` (None: every call's tokens at once): a call of more tokens runs each
    layer in chunks of at most that many (see the module doc); set by the GPU path to the
    chunk its fit plan sizes the workspace for. `prefill_ffn_chunk_tokens` (None: the same): the
    chunks of a MoE layer's FFN, where the plan leaves them room for more."""

    prefill_chunk_tokens: int | None = None
    prefill_ffn_chunk_tokens: int | None = None

    def __init__(self, config: ModelConfig, weights: ModelWeights, blocks: list[Block], dtype: torch.dtype,
                 *, prefix: str = "model.", norm_offset: float = 0.0, embedding_multiplier: float | torch.Tensor = 1.0,
                 embedding_bias: torch.Tensor | None = None,
                 residual_multiplier: float = 1.0, logits_scaling: float = 1.0,
                 embed_name: str = "embed_tokens.weight", final_norm: Norm | None = None,
                 head_name: str = "lm_head.weight", streams: Streams | None = None,
                 final_logit_softcapping: float | None = None) -> None:
        self.config = config
        self.streams = streams
        self.dtype = dtype
        self.blocks = blocks
        self.norm_offset = norm_offset
        self.embedding_multiplier, self.residual_multiplier = embedding_multiplier, residual_multiplier
        self.embedding_bias = embedding_bias
        self.logits_scaling, self.softcap = logits_scaling, final_logit_softcapping
        self.embed = weights.get(prefix + embed_name)  # (DBRX's: transformer.wte.weight)
        self.final_norm = weights.get(prefix + "norm.weight") if final_norm is None else final_norm
        head = weights.maybe(head_name)  # (Llama 4's: language_model.lm_head.weight)
        self.lm_head = self.embed if head is None or config.tie_word_embeddings else head
        head_bias = head_name.removesuffix("weight") + "bias"  # (Phi-3.5-MoE's lm_head.bias)
        self.lm_head_bias = None if self.lm_head is self.embed else weights.maybe(head_bias)
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

    def checkpoint(self, state: DecodeState) -> StateCheckpoint | None:
        """`state` as it is now, to `restore` later: its recurrent caches copied to the host. None
        where one cannot be (a recurrent cache without `checkpoint`: DeepSeek-V4's compressed KV)."""
        saved = {}
        for index, (block, cache) in enumerate(zip(self.blocks, state.caches, strict=True)):
            if getattr(block.mixer, "recurrent", False):
                if not hasattr(cache, "checkpoint"):
                    return None
                saved[index] = cache.checkpoint()
        return StateCheckpoint(state.length, saved)

    def restore(self, state: DecodeState, saved: StateCheckpoint) -> None:
        """`state` taken back to `saved` (made by `checkpoint` of this state, at no more tokens than
        it holds since): the recurrent caches put back in place, the positional ones cut."""
        for index, copy in saved.caches.items():
            state.caches[index].restore(copy)
        self.set_length(state, saved.length)

    @torch.inference_mode()
    def copy_prefix(self, source: DecodeState, target: DecodeState, length: int,
                    saved: StateCheckpoint | None = None) -> bool:
        """`target` holding `source`'s first `length` tokens, copied (state_copy.py: the caches read
        by position up to `length`, a recurrent model's others from `saved`, `source`'s state
        saved at `length`): a conversation sharing a prompt prefix (a system prompt and tools)
        with another starts from its state. False, nothing copied, where it cannot be."""
        if not copy_state_prefix(self.rewinds, source, target, length, saved):
            return False
        self.set_length(target, length)
        return True

    @torch.inference_mode()
    def park_parts(self, state: DecodeState, spans: list[tuple[int, int]],
                   saved: StateCheckpoint | None = None) -> list[ParkedPart] | None:
        """The rows of `state`'s positions in each span [start, end) in host memory, a part each
        (prefix_blocks.py's blocks; `unpark` puts them back); a recurrent model's needs a `saved`
        state of it. None where they cannot be copied (state_copy.py)."""
        return park_parts(self.rewinds, state, spans, saved)

    @torch.inference_mode()
    def unpark(self, parked: ParkedState, state: DecodeState) -> bool:
        """`state` holding the tokens `parked` (`park_parts`' blocks, prefix_blocks.Found.state) holds."""
        if not unpark_state(parked, state):
            return False
        self.set_length(state, parked.length)
        return True

    def set_length(self, state: DecodeState, length: int) -> None:
        """`state` holds `length` tokens: after steps at a DevicePosition (which move no host
        counter), and the caches that count their own tokens with it."""
        state.length = length
        for cache in state.caches:
            if hasattr(cache, "length"):
                cache.length = length

    def norm(self, x: torch.Tensor, weight: Norm) -> torch.Tensor:
        if not isinstance(weight, torch.Tensor):
            return weight(x)
        return rms_norm(x, weight, self.eps, offset=self.norm_offset)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, state: DecodeState, last_only: bool = False,
                embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [T, V] (float32) for `input_ids` [T] following the `state.length` tokens before;
        `last_only`: [1, V], the last token's (what a prefill needs: [T, V] of a long prompt is
        gigabytes, and the largest matmul of the pass). `embeds` [T, H]: their embedding rows,
        where the caller looked them up (a table kept in host memory: gpu/device_model.py)."""
        t, start = input_ids.shape[0], state.length
        _check_room(state, t)
        x = self._embed(input_ids, embeds)
        x = self._layers(x, torch.arange(start, start + t), state, start, input_ids)
        state.length = start + t
        if last_only:
            x = x[-1:]
        return self._logits(x)

    @torch.inference_mode()
    def decode_batch(self, input_ids: torch.Tensor, states: list[DecodeState]) -> torch.Tensor:
        """Logits [B, V] (float32) of one token for each of B sequences, input_ids[b] following
        states[b]'s tokens: what B one-token `forward` calls give, in one pass whose norms, FFNs
        (the routed experts: each expert read once for the rows that chose it) and LM head take
        the B rows together, each mixer still run a row at a time on its own cache and position.
        Concurrent generations' decode steps (server/batching.py). ContextOverflowError, no state
        changed, where a sequence's context is full."""
        if len(states) != input_ids.shape[0] or len({id(s) for s in states}) != len(states):
            raise ValueError(f"decode_batch takes one token for each of {len(states)} distinct states, "
                             f"not {input_ids.shape[0]} tokens")
        for state in states:
            _check_room(state, 1)
        starts = [s.length for s in states]
        rows = [torch.tensor([start]) for start in starts]  # (each row's positions, one tensor a row for the pass)

        def mix(layer: int, h: torch.Tensor) -> torch.Tensor:
            mixer = self.blocks[layer].mixer
            return torch.cat([mixer(h[b:b + 1], rows[b], state.caches[layer], starts[b])
                              for b, state in enumerate(states)])

        x = self._embed(input_ids, None)
        forward_begins()
        x = self._blocks(x, mix, input_ids)
        for state, start in zip(states, starts, strict=True):
            state.length = start + 1
        return self._logits(x)

    @torch.inference_mode()
    def decode_at(self, input_ids: torch.Tensor, position: DevicePosition, state: DecodeState,
                  embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [1, V] (float32) of one token at `position`, held on the device: the same work
        as `forward` with nothing read from the host, so it can be captured as a CUDA graph
        (gpu/step_graphs.py). Needs `takes_device_position`; the caller then moves the state on
        (`set_length`). `embeds` [1, H]: the token's row in a device buffer the caller fills
        (then `input_ids` is not read)."""
        x = self._embed(input_ids, embeds)
        x = self._layers(x, position.index, state, position, input_ids)
        return self._logits(x)

    def _embed(self, input_ids: torch.Tensor, embeds: torch.Tensor | None) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed) if embeds is None else embeds
        if self.embedding_bias is not None:
            x = x + self.embedding_bias
        scale = self.embedding_multiplier
        return x if isinstance(scale, float | int) and scale == 1.0 else x * scale

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = linear(self.norm(x, self.final_norm), self.lm_head, self.lm_head_bias).to(torch.float32)
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits if self.logits_scaling == 1.0 else logits / self.logits_scaling

    def _layers(self, x: torch.Tensor, positions: torch.Tensor, state: DecodeState, start: Start,
                tokens: torch.Tensor) -> torch.Tensor:
        forward_begins()  # the layers share one pass's rope tables
        chunk = self.prefill_chunk_tokens
        if chunk is not None and isinstance(start, int) and x.shape[0] > chunk:
            ffn_chunk = max(chunk, self.prefill_ffn_chunk_tokens or chunk)
            return self._layers_in_chunks(x, positions, state, start, chunk_bounds(x.shape[0], chunk), tokens,
                                          chunk_bounds(x.shape[0], ffn_chunk))
        return self._blocks(x, lambda layer, h: self.blocks[layer].mixer(h, positions, state.caches[layer], start),
                            tokens)

    def _blocks(self, x: torch.Tensor, mix: Callable[[int, torch.Tensor], torch.Tensor],
                tokens: torch.Tensor) -> torch.Tensor:
        """x through every block, `mix(layer, h)` the layer's mixer of its normed input h (at the
        pass's positions and cache: `_layers`; each row at its own: `decode_batch`)."""
        if self.streams is not None:
            x = self.streams.expand(x)
        r = self.residual_multiplier  # (alpha 1 adds exactly as `+` does)
        for layer, block in enumerate(self.blocks):
            if block.residuals is not None:
                x = self._mixed_streams(block, x, lambda h, layer=layer: mix(layer, h))
                x = self._fed_streams(block, x, tokens)
                continue
            if block.parallel:  # (x + mixer + ffn, in that order, as transformers' Cohere adds them)
                h = self.norm(x, block.input_norm)
                x = x.add(mix(layer, h), alpha=r).add(self._ffn(block, h, tokens), alpha=r)
                continue
            if block.mixer is not NO_MIXER:
                x = self._join(x, mix(layer, self.norm(x, block.input_norm)), block, 0)
            if block.ffn is not None:
                x = self._join(x, self._ffn(block, self.norm(x, block.post_norm), tokens), block, 1)
            if block.output_scale is not None:
                x = x * block.output_scale
        return x if self.streams is None else self.streams.collapse(x)

    def _layers_in_chunks(self, x: torch.Tensor, positions: torch.Tensor, state: DecodeState, start: int,
                          bounds: list[tuple[int, int]], tokens: torch.Tensor,
                          moe_bounds: list[tuple[int, int]]) -> torch.Tensor:
        """`_layers` a chunk of tokens at a time within each layer (a MoE layer's FFN in
        `moe_bounds`), adding into x in place (the embeddings: this pass's own tensor): the same
        sums, each token's in the same order."""
        if self.streams is not None:
            x = self.streams.expand(x)
        moe_layers = set(self.config.moe_layers)
        for layer, (block, cache) in enumerate(zip(self.blocks, state.caches, strict=True)):
            # the whole prompt at once where the mixer's cache cannot be continued cheaply; none without a mixer
            spans = bounds if getattr(block.mixer, "chunks_prompt", False) else [(0, x.shape[0])]
            spans = [] if block.mixer is NO_MIXER else spans
            # a parallel block's FFN reads the mixer's input: normed once, before the mixer adds to x
            normed = self.norm(x, block.input_norm) if block.parallel else None
            for first, end in spans:
                h = x[first:end]
                # (the whole prompt's positions as they are: the layers' rope tables are reused by identity)
                at = positions if end - first == x.shape[0] else positions[first:end]
                if block.residuals is not None:
                    mixer, at_start = block.mixer, start + first
                    h.copy_(self._mixed_streams(block, h, lambda normed, mixer=mixer, at=at, cache=cache,
                                                at_start=at_start: mixer(normed, at, cache, at_start)))
                else:
                    mixed = self.norm(h, block.input_norm) if normed is None else normed[first:end]
                    self._join(h, block.mixer(mixed, at, cache, start + first), block, 0, in_place=True)
            ffn_spans = [] if block.ffn is None else moe_bounds if layer in moe_layers else bounds
            for index, (first, end) in enumerate(ffn_spans):
                h = x[first:end]
                with _computing_chunk(PromptChunk(index, len(ffn_spans))):
                    if block.residuals is not None:
                        h.copy_(self._fed_streams(block, h, tokens[first:end]))
                    else:
                        fed = self.norm(h, block.post_norm) if normed is None else normed[first:end]
                        self._join(h, self._ffn(block, fed, tokens[first:end]), block, 1, in_place=True)
                    if block.output_scale is not None:
                        h.mul_(block.output_scale)
        return x if self.streams is None else self.streams.collapse(x)

    def _join(self, x: torch.Tensor, out: torch.Tensor, block: Block, sublayer: int, *,
              in_place: bool = False) -> torch.Tensor:
        """x after sublayer `sublayer`'s (0 the mixer, 1 the FFN) output joins it: x + r * out (r
        the residual multiplier), or x * residual + out * update where the block scales both."""
        if block.scales is None:
            return x.add_(out, alpha=self.residual_multiplier) if in_place else x.add(out, alpha=self.residual_multiplier)
        residual, update = block.scales[sublayer]
        if block.biases is not None:
            residual_bias, update_bias = block.biases[sublayer]
            out = out if update_bias is None else out + update_bias
            if residual_bias is not None:
                x = x.add_(residual_bias) if in_place else x + residual_bias
                in_place = True  # (x is this call's own tensor now, or the caller's to change)
        return x.mul_(residual).add_(out * update) if in_place else x * residual + out * update

    @staticmethod
    def _ffn(block: Block, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        assert block.ffn is not None
        return block.ffn(h, tokens) if getattr(block.ffn, "takes_tokens", False) else block.ffn(h)  # type: ignore[call-arg]

    def _mixed_streams(self, block: Block, x: torch.Tensor, mixed: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """The streams x [T, n, H] after the block's mixer (`mixed(h)`: its output for its normed
        input h), joined by its residual."""
        assert block.residuals is not None
        residual = block.residuals[0]
        h, mixes = residual.enter(x)
        return residual.leave(x, mixed(self.norm(h, block.input_norm)), mixes)

    def _fed_streams(self, block: Block, x: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The streams x [T, n, H] after the block's FFN, joined by its residual."""
        assert block.residuals is not None
        residual = block.residuals[1]
        h, mixes = residual.enter(x)
        return residual.leave(x, self._ffn(block, self.norm(h, block.post_norm), tokens), mixes)
