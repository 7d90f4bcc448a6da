"""A family's DecoderModel run on the GPU, unchanged: dense weights and decode state on the device.

Families create small tensors as they go (positions, masks, decode state) with torch's factory
functions and no device; inside `torch.device(device)` those land on the device. Building the
model, making its state and each forward run in that context, so no family knows about devices.
The price is torch's device-mode hook on every op (a few microseconds per op on the host), paid
in prefill and in decode steps that run uncaptured.

On the GPU the families' RMSNorm runs as one fused kernel (kernels/rms_norm.py, handed to
runtime.layers.norm when a DeviceModel is made): a Qwen3-MoE layer's four norms were 32 of its
~83 kernels a step, and the whole-model decode graph went from ~4000 to ~2600 kernels.

A one-token forward of a model whose mixers take a DevicePosition runs as one CUDA graph per
step (step_graphs.py, through the executor): the token and its position go into two device
buffers, and attention reads a span of the KV cache, the next power of two above the position
(at least SPAN_MIN), masked past it. One graph per span serves every position under it.

The token embedding table stays in host memory (`move_dense`), as llama.cpp keeps `token_embd`:
a lookup reads one row a token, so it costs no speed, and it frees its VRAM (622 MB for Qwen3's
151936 x 2048 in bf16) for the expert cache. A prompt's rows are gathered on the host and copied
in one transfer; a decode step's row is written by the host into a pinned buffer of fixed
address, which the step (a held graph's feed included) copies to the device buffer it reads.
Where the table is also the output head (tied embeddings) it stays on the GPU, which decode
multiplies by every token, and lookups read it there.

`queue_decode` queues a step before its token is known (Session.generate does, for the token
after the one it is about to start): the replay is launched while the step before runs, held on
the device until `start(token)` writes the token into pinned memory and rings, and its logits
come back into pinned memory. The device then waits for the host's sampling only, not for its
launches (0.18 ms a step on the H200: docs/benchmark-history.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..layers import attention, block_weight, mlp, rope
from ..layers.attention import DevicePosition
from ..layers.norm import use_device_kernel
from ..loading.read_ftw import ModelWeights
from ..models import DecoderModel, DecodeState
from ..planner.footprint import EMBEDDINGS, HEAD
from ..planner.plan import PREFILL_CHUNK_TOKENS
from ..text.top_logits import TopLogits, candidates_to_take, take_top
from .step_graphs import QueuedStep, StepGraphs

SPAN_MIN = 256  # the shortest KV span a captured step attends over


def move_dense(weights: ModelWeights, device: torch.device, host_embedding: bool = True) -> ModelWeights:
    """The same weights with every dense tensor on `device` (experts stay in host banks), but for
    the token embedding table with `host_embedding`, where it is not also the output head."""
    tied = weights.config.tie_word_embeddings or weights.maybe(HEAD) is None  # as DecoderModel ties them
    kept = host_embedding and not tied
    return ModelWeights(weights.config, {name: t if kept and name.endswith(EMBEDDINGS) else t.to(device)
                                         for name, t in weights.dense.items()}, weights.banks)


class HostEmbedding:
    """The token embedding table [V, H] in host memory, its rows copied to `device` as they are
    looked up: a prompt's in one transfer (`rows`), a decode step's through `row_host`, a pinned
    buffer of fixed address the host writes (`write`) and the step copies into `row` (`feed`)."""

    def __init__(self, table: torch.Tensor, device: torch.device) -> None:
        self.table, self.device = table, device
        self._pinned = device.type == "cuda"
        self.row_host = torch.zeros(1, table.shape[1], dtype=table.dtype, device="cpu", pin_memory=self._pinned)
        self.row = torch.zeros(1, table.shape[1], dtype=table.dtype, device=device)  # what a step reads

    def rows(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T, H] on the device: gathered on the host (into pinned memory for more than one row,
        whose copy overlaps), then one copy. `input_ids` [T] on the host."""
        ids = input_ids.to("cpu", torch.long)
        if not self._pinned or ids.numel() == 1:
            return self.table.index_select(0, ids).to(self.device, non_blocking=True)  # (pageable: copied at once)
        staging = torch.empty((ids.numel(), self.table.shape[1]), dtype=self.table.dtype, device="cpu",
                              pin_memory=True)  # (device: forwards run with the GPU as torch's default)
        torch.index_select(self.table, 0, ids, out=staging)
        return staging.to(self.device, non_blocking=True)  # (torch's pinned pool keeps it until the copy ran)

    def write(self, token: int) -> None:
        """The host's part of a queued step: its token's row into the pinned buffer."""
        self.row_host.copy_(self.table[token : token + 1])

    def feed(self) -> None:
        """Queued on the stream before a step: the row the host wrote, into the buffer the step reads."""
        self.row.copy_(self.row_host, non_blocking=True)


def decode_span(position: int, max_tokens: int) -> int:
    """The KV positions a captured step at `position` attends over (masked past it)."""
    return min(max_tokens, max(SPAN_MIN, 1 << position.bit_length()))


def _use_fused_kernels() -> None:
    """The families' RMSNorm, rotary embeddings and softmax top-k router in one launch each on
    the GPU (kernels/rms_norm.py, rotary.py, router_topk.py), a captured decode step's attention
    in two (kernels/decode_attention.py), and a GGUF model's K-quant projections read in place in
    decode (kernels/block_gemv.py), where triton is."""
    try:
        from .kernels.block_gemv import dense_block_gemv
        from .kernels.decode_attention import decode_attention
        from .kernels.decode_attention import supports as decode_supports
        from .kernels.rms_norm import rms_norm_fused, supports
        from .kernels.rotary import apply_rotary_fused
        from .kernels.rotary import supports as rotary_supports
        from .kernels.router_topk import softmax_topk_fused
        from .kernels.router_topk import supports as router_supports
    except ImportError:  # pragma: no cover - depends on the install
        return
    use_device_kernel(supports, rms_norm_fused)
    attention.use_device_decode(decode_supports, decode_attention)
    rope.use_device_kernel(rotary_supports, apply_rotary_fused)
    mlp.use_device_router(router_supports, softmax_topk_fused)
    block_weight.use_device_gemv(lambda x, w: dense_block_gemv(x, w.data, kind=w.dtype_name, rows=w.shape[0],
                                                               cols=w.shape[1], out_dtype=x.dtype))


class DeviceModel:
    """`model` with its state and every forward on `device`; logits come back on the device
    (the sampler moves the one row it needs). `steps`: the executor's StepGraphs, to run decode
    steps as CUDA graphs (None: every forward eager). `host_embedding`: look tokens up in the
    model's embedding table on the host (HostEmbedding); None: where `move_dense` left it there
    (True runs that path on a CPU device too, as the tests do). A longer prompt than
    `prefill_chunk_tokens` runs each layer in chunks of at most that many tokens (what the fit
    plan's workspace is sized for: DecoderModel.prefill_chunk_tokens; None: all at once), a MoE
    layer's FFN in chunks of `prefill_ffn_chunk_tokens` (None: the same; Plan.ffn_chunk_tokens)."""

    def __init__(self, model: DecoderModel, device: torch.device | str, steps: StepGraphs | None = None,
                 host_embedding: bool | None = None, prefill_chunk_tokens: int | None = PREFILL_CHUNK_TOKENS,
                 prefill_ffn_chunk_tokens: int | None = None) -> None:
        self.model = model
        model.prefill_chunk_tokens = prefill_chunk_tokens
        model.prefill_ffn_chunk_tokens = prefill_ffn_chunk_tokens
        self.device = torch.device(device)
        if host_embedding is None:
            host_embedding = model.embed.device.type == "cpu" and self.device.type != "cpu"
        self.embedding = HostEmbedding(model.embed, self.device) if host_embedding else None
        self.steps = steps if steps is not None and steps.enabled and model.takes_device_position else None
        if self.device.type == "cuda":
            _use_fused_kernels()
        self._token = torch.zeros(1, dtype=torch.long, device=self.device)
        self._position = torch.zeros(1, dtype=torch.long, device=self.device)
        self._graph_state: DecodeState | None = None  # the state the step graphs were captured over
        # queued steps: the token the host writes before releasing a step, and the logits it reads back
        pinned = self.device.type == "cuda"
        self._token_host = torch.zeros(1, dtype=torch.long, device="cpu", pin_memory=pinned)
        self._host_buffers: dict[tuple, torch.Tensor] = {}  # the queued steps' logits (or best logits) on the host

    def new_state(self, max_tokens: int) -> DecodeState:
        with torch.device(self.device):
            return self.model.new_state(max_tokens)

    def reset_state(self, state: DecodeState) -> DecodeState:
        with torch.device(self.device):
            return self.model.reset_state(state)

    def forward(self, input_ids: torch.Tensor, state: DecodeState, last_only: bool = False) -> torch.Tensor:
        # inference mode around the step's host part too (begin_step, end_step): the tensors it
        # creates and updates in place must all be inference tensors, as the model's are
        with torch.device(self.device), torch.inference_mode():
            if self.steps is not None and input_ids.numel() == 1 and state.length < state.max_tokens:
                return self._decode_step(input_ids, state)
            if self.embedding is not None:
                return self.model.forward(input_ids, state, last_only, embeds=self.embedding.rows(input_ids))
            return self.model.forward(input_ids.to(self.device), state, last_only)

    def _decode_step(self, input_ids: torch.Tensor, state: DecodeState) -> torch.Tensor:
        position, key, step = self._step_at(state)
        self._token.copy_(input_ids.reshape(1), non_blocking=True)
        if self.embedding is not None:  # (from a pageable row: copied before the call returns)
            row = self.embedding.table.index_select(0, input_ids.reshape(1).long())
            self.embedding.row.copy_(row, non_blocking=True)
        self._position.fill_(position)
        logits = self.steps.run(key, step)
        self.model.set_length(state, position + 1)
        return logits.clone()  # the graph's own buffer is rewritten by the next step

    def _step_at(self, state: DecodeState) -> tuple[int, tuple[str, int], Callable[[], torch.Tensor]]:
        """(the position, the step graphs' key, the step) of a decode step at the state's length."""
        assert self.steps is not None
        if state is not self._graph_state:  # the graphs write the old state's KV buffers
            self.steps.invalidate()
            self._graph_state = state
        position = state.length
        where = DevicePosition(self._position, decode_span(position, state.max_tokens))
        embeds = self.embedding.row if self.embedding is not None else None
        return position, ("decode", where.span), lambda: self.model.decode_at(self._token, where, state, embeds)

    @property
    def can_queue(self) -> bool:
        """Whether decode steps can be queued ahead (`queue_decode`): they run as step graphs, and
        a step queued but not wanted (the one after the last token) can be taken back, which a
        recurrent layer's state cannot (it runs all the same: a held replay must be released)."""
        return self.steps is not None and self.model.rewinds

    def queue_decode(self, state: DecodeState) -> QueuedDecode:
        """The decode step at the state's next position, queued before its token is known: its
        launches are made now, while the step before still runs, and held on the device until
        `QueuedDecode.start(token)` (StepGraphs.queue); the state counts the token from now on
        (a cancelled step takes it back). Needs `can_queue` and a state with room for one more."""
        assert self.steps is not None and state.length < state.max_tokens
        with torch.device(self.device), torch.inference_mode():
            position, key, step = self._step_at(state)

            def feed() -> None:  # queued behind the hold: reads the token (and row) the host writes before the ring
                self._token.copy_(self._token_host, non_blocking=True)
                if self.embedding is not None:
                    self.embedding.feed()
                self._position.fill_(position)

            queued = self.steps.queue(key, step, feed, self.steps.doorbell)
            self.model.set_length(state, position + 1)
        return QueuedDecode(self, queued, state, position)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


class QueuedDecode:
    """A decode step DeviceModel.queue_decode queued: `start(token)` once the token is known, then
    `logits()`; or `cancel()` (the state no longer counts the token)."""

    def __init__(self, owner: DeviceModel, queued: QueuedStep[torch.Tensor], state: DecodeState, position: int) -> None:
        self._owner, self._queued, self._state, self._position = owner, queued, state, position
        self._done: torch.cuda.Event | None = None  # after the copies to the host (CUDA)
        self._device_logits: torch.Tensor | None = None
        self._top: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # pinned values, ids, has_nan
        self._row: torch.Tensor | None = None  # or the whole row, pinned
        self._started = False

    def start(self, token: int, needed: int | None = None) -> None:
        """Write the token where the step reads it and release the step (or run it now).
        `needed`: the sampler needs only that many of the best logits (Sampler.candidates_needed):
        they are taken on the device and only they come back (text/top_logits.py); None: the row."""
        owner = self._owner
        owner._token_host[0] = token
        if owner.embedding is not None:
            owner.embedding.write(token)
        cuda = owner.device.type == "cuda"
        with torch.device(owner.device), torch.inference_mode():
            logits = self._queued.start()[-1]
            self._device_logits = logits  # the graph's buffer: unchanged until the next step starts
            count = candidates_to_take(needed, logits.numel())
            if count is not None:
                self._top = tuple(_pinned_copy(owner._host_buffers, name, t, cuda)
                                  for name, t in zip(("values", "ids", "nan"), take_top(logits, count), strict=True))
            else:
                self._row = _pinned_copy(owner._host_buffers, "logits", logits, cuda)
            if cuda:
                self._done = torch.cuda.Event()
                self._done.record()
        self._started = True

    def logits(self) -> torch.Tensor | TopLogits:
        """The step's logits [V] on the host, or its best ones where `start` was given `needed`
        (valid until the next step's `start`)."""
        assert self._started, "start the step first"
        if self._done is not None:
            self._done.synchronize()
        if self._top is None:
            return self._row
        values, ids, has_nan = self._top
        return TopLogits(values, ids, self._device_logits.numel(), bool(has_nan), self._full_logits)

    def _full_logits(self) -> torch.Tensor:
        """The whole row on the host, read on a side stream: the model's stream may hold the next
        step already, behind a wait for the host (a copy queued there would wait for ever)."""
        logits = self._device_logits
        if self._done is None:
            return logits.to("cpu", torch.float32)
        side = torch.cuda.Stream(logits.device)
        side.wait_event(self._done)
        with torch.cuda.stream(side):
            return logits.to("cpu", torch.float32)

    def cancel(self) -> None:
        """Not wanted after all: released to run (a held replay must be), its results unread, and
        the token no longer counted by the state."""
        self._queued.cancel()
        self._owner.model.set_length(self._state, self._position)


def _pinned_copy(buffers: dict[tuple, torch.Tensor], name: str, src: torch.Tensor, pinned: bool) -> torch.Tensor:
    """`src` copied (queued) into the host buffer for `name` and its shape and dtype, made (pinned
    where `pinned`) the first time (the count of best logits changes as the penalty window fills:
    each size keeps its buffer)."""
    key = (name, tuple(src.shape), src.dtype)
    dst = buffers.get(key)
    if dst is None:
        dst = buffers[key] = torch.empty(src.shape, dtype=src.dtype, device="cpu", pin_memory=pinned)
    dst.copy_(src, non_blocking=pinned)
    return dst
