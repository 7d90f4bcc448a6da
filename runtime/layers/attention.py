"""Causal attention over a preallocated KV cache (one sequence), shared by the GQA families."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..experts.cpu_kernels import TORCH_NAMES, native_kernel


@dataclass(frozen=True)
class DevicePosition:
    """The start of a one-token decode call given as a device tensor, not a Python int, so the
    call can be captured once in a CUDA graph and replayed at every position (step_graphs.py).

    `index` is an int64 [1] holding the position. Caches write the token's entries there in
    place; attention reads the first `span` cached positions (span > index) and masks those
    after `index`, so one graph serves every position below `span`."""

    index: torch.Tensor
    span: int


Start = int | DevicePosition


def store(cache: torch.Tensor, start: Start, new: torch.Tensor) -> torch.Tensor:
    """Write `new` [T, ...] into `cache` [max_tokens, ...] at positions from `start`; returns
    the cached positions attention reads: up to the end of `new`, or the span of a DevicePosition."""
    if isinstance(start, DevicePosition):
        cache.index_copy_(0, start.index, new)
        return cache[: start.span]
    end = start + new.shape[0]
    cache[start:end] = new
    return cache[:end]


class KVCache:
    """Keys and values of one attention layer: [max_tokens, kv_heads, head_dim] each."""

    def __init__(self, max_tokens: int, kv_heads: int, k_dim: int, v_dim: int, dtype: torch.dtype) -> None:
        self.k = torch.zeros(max_tokens, kv_heads, k_dim, dtype=dtype)
        self.v = torch.zeros(max_tokens, kv_heads, v_dim, dtype=dtype)

    def append(self, start: Start, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k/v for positions [start, start + T); returns all keys/values up to there (a
        DevicePosition: its span, the positions after it masked by `causal_attention`)."""
        return store(self.k, start, k), store(self.v, start, v)


# Cached positions from which CPU decode attention runs on the compiled kernel: all. torch's small-M
# bf16 matmuls read a long cache at 1-5 GB/s (docs/benchmark-history.md, decode attention), and a
# short one costs their ~6 ops' dispatch: 32 query heads over 1, 8, 32 and 63 positions took 58,
# 113, 112 and 170 us there, 22, 27, 37 and 56 on the kernel (2-core VM, 2026-12-07; a tg128 from a
# one-token prompt spent half its steps below the 64 positions this was).
DECODE_KERNEL_MIN_LENGTH = 1

# Scores a masked attention call may hold at once (heads x queries x keys): the query chunk is
# sized to it, so a long prompt over a cached prefix stays within ~512 MiB of float32 scores.
MASKED_SCORES_PER_CALL = 1 << 27


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: Start, scale: float) -> torch.Tensor:
    """q [T, Hq, D] at positions [start, start+T); k/v [L, Hkv, D] for positions [0, L). -> [T, Hq, Dv].
    With a DevicePosition (one token), keys after its index are masked.

    Inputs go to SDPA as 4-D [1, H, T, D]: its CPU flash kernel takes only 4-D, and 3-D falls to
    the math path, which keeps [H, T, L] scores (gigabytes for a long prompt) and runs ~4-6x
    slower. A prompt from position 0 is SDPA's own causal case. Queries after cached keys (a
    prompt after a cached prefix, or a later chunk of a long prompt: DecoderModel's
    prefill_chunk_tokens) see all of them and the causal part of their own block, a mask aligned
    at the bottom right, which SDPA's `is_causal` does not express (it aligns at the top left):
    - where CUDA's FlashAttention takes the call, it is given the keys as they are cached (query
      heads sharing a key head: no [Hq, L, D] copies of the whole prefix) and aligns its causal
      mask at the bottom right itself (`causal_lower_right`): nothing beside the output grows
      with the prefix;
    - elsewhere an explicit mask, in chunks of queries whose scores stay within
      MASKED_SCORES_PER_CALL where a backend keeps them (only the math one does); on the CPU the
      keys are read as cached too (its flash kernel takes shared key heads with a mask); CUDA's
      memory-efficient kernel does not, so there they are repeated per query head."""
    t, heads = q.shape[0], q.shape[1]
    kv_heads = k.shape[1]
    if isinstance(start, DevicePosition):
        return _decode_attention(q, k, v, scale, visible=start.index)
    if t == 1:
        return _decode_attention(q, k, v, scale)
    group = heads // kv_heads
    qh = q.transpose(0, 1)[None]  # [1, Hq, T, D]
    shared = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, Hkv, L, D]: the cache, read in place
    length = k.shape[0]
    if start == 0 and length == t:
        if _flash_takes_shared_heads(qh, *shared):
            return F.scaled_dot_product_attention(qh, *shared, is_causal=True, scale=scale,
                                                  enable_gqa=group > 1)[0].transpose(0, 1)
        kh = k.transpose(0, 1).repeat_interleave(group, dim=0)[None]  # [1, Hq, L, D], contiguous: the fast SDPA path
        vh = v.transpose(0, 1).repeat_interleave(group, dim=0)[None]
        return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale)[0].transpose(0, 1)
    if _flash_takes_shared_heads(qh, *shared, causal=False):  # (the bias below, not is_causal, aligns its mask)
        return F.scaled_dot_product_attention(qh, *shared, attn_mask=causal_lower_right(t, length), scale=scale,
                                              enable_gqa=group > 1)[0].transpose(0, 1)
    gqa = group > 1 and q.device.type == "cpu"
    if gqa:
        kh, vh = shared
    else:
        kh = k.transpose(0, 1).repeat_interleave(group, dim=0)[None]
        vh = v.transpose(0, 1).repeat_interleave(group, dim=0)[None]
    chunk = max(1, MASKED_SCORES_PER_CALL // (heads * length))
    keys = torch.arange(length)[None, :]
    parts = []
    for first in range(0, t, chunk):
        last = min(t, first + chunk)
        mask = keys <= torch.arange(start + first, start + last)[:, None]  # [C, L]
        parts.append(F.scaled_dot_product_attention(qh[:, :, first:last], kh, vh, attn_mask=mask, scale=scale,
                                                    enable_gqa=gqa)[0])
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    return out.transpose(0, 1)


def chunked_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: Start, scale: float,
                             chunk_size: int) -> torch.Tensor:
    """`causal_attention` within fixed chunks of `chunk_size` positions (Llama 4's local layers): a
    query at position p sees the keys from p - p % chunk_size to p. The queries are cut at chunk
    boundaries and each piece is plain causal attention over its own chunk's keys (k/v [L, Hkv, D]
    hold positions from 0, as the cache returns them), so nothing grows with the keys before the
    chunk. With a DevicePosition, the keys before its chunk are masked as well as those after it."""
    if isinstance(start, DevicePosition):
        return _decode_attention(q, k, v, scale, visible=start.index, chunk_size=chunk_size)
    end, first, parts = start + q.shape[0], start, []
    while first < end:
        chunk_start = first - first % chunk_size
        last = min(chunk_start + chunk_size, end)
        parts.append(causal_attention(q[first - start:last - start], k[chunk_start:last], v[chunk_start:last],
                                      first - chunk_start, scale))
        first = last
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def query_blocks(start: int, t: int, heads: int, window: int | None) -> list[tuple[int, int, int]]:
    """(first, last, first_key) of each block of a prompt's queries at positions [start, start + t)
    whose masked scores stay within MASKED_SCORES_PER_CALL: queries [first, last) over the keys
    [first_key, last) they can see (all before them, or within `window` positions: a block of at
    most `window` queries then reads at most 2 x window keys, whatever the prefix)."""
    end = start + t
    if window is None:
        block = max(1, MASKED_SCORES_PER_CALL // (heads * end))
    else:
        block = max(1, min(window, MASKED_SCORES_PER_CALL // (heads * 2 * window)))
    return [(first, min(first + block, end), 0 if window is None else max(0, first - window + 1))
            for first in range(start, end, block)]


def sliding_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: Start, scale: float,
                             window: int) -> torch.Tensor:
    """`causal_attention` within a sliding window of `window` positions (transformers'
    `sliding_window`, EXAONE's local layers): a query at position p sees the keys from
    p - window + 1 to p. k/v [L, Hkv, D] hold positions from 0, as the cache returns them; each
    block of queries reads only the keys its windows reach, under a banded mask, in blocks whose
    scores stay within MASKED_SCORES_PER_CALL, so nothing grows with the keys before them. With a
    DevicePosition, the keys before its window are masked as well as those after it."""
    if isinstance(start, DevicePosition):
        return _decode_attention(q, k, v, scale, visible=start.index, window=window)
    t, heads = q.shape[0], q.shape[1]
    end, group = start + t, heads // k.shape[1]
    if t == 1:
        first_key = max(0, start - window + 1)
        return _decode_attention(q, k[first_key:end], v[first_key:end], scale)
    parts = []
    for first, last, first_key in query_blocks(start, t, heads, window):
        keys = torch.arange(first_key, last, device=q.device)[None, :]
        queries = torch.arange(first, last, device=q.device)[:, None]
        mask = (keys <= queries) & (keys > queries - window)  # [C, K]
        qh = q[first - start:last - start].transpose(0, 1)[None]  # [1, Hq, C, D]
        kh = k[first_key:last].transpose(0, 1).repeat_interleave(group, dim=0)[None]  # [1, Hq, K, D]
        vh = v[first_key:last].transpose(0, 1).repeat_interleave(group, dim=0)[None]
        parts.append(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)[0].transpose(0, 1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


# (q, k, v, scale, visible, window=, chunk=) -> [1, Hq, Dv]: one launch-pair decode attention for a
# captured step's call on a GPU, with the `supports(q, k, v)` that says which calls it takes; set
# by the GPU runtime (runtime/gpu/kernels/decode_attention.py: this module imports nothing of it)
_device_decode: tuple[Callable[..., bool], Callable[..., torch.Tensor]] | None = None


def use_device_decode(supports: Callable[..., bool], kernel: Callable[..., torch.Tensor]) -> None:
    """From now on, a decode call masked by a device position (DevicePosition: a captured step)
    that `supports` takes is `kernel`'s, in two launches where torch's form makes about ten."""
    global _device_decode
    _device_decode = (supports, kernel)


def _flash_takes_shared_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> bool:
    """Whether CUDA's FlashAttention computes a call of q [1, Hq, T, D] over k/v [1, Hkv, L, D]
    as they are (query heads sharing key heads: `enable_gqa`), without falling back to a kernel
    that would repeat the keys or keep the scores (`causal`: SDPA's is_causal, which flash takes
    only where T == L; a lower-right causal bias is asked with False, as torch's CausalBias asks)."""
    if not q.is_cuda:
        return False
    try:
        from torch.backends.cuda import SDPAParams, can_use_flash_attention

        return bool(can_use_flash_attention(SDPAParams(q, k, v, None, 0.0, causal, k.shape[1] != q.shape[1])))
    except (ImportError, TypeError, RuntimeError):  # an older torch: no enable_gqa in SDPAParams
        return False


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                      visible: torch.Tensor | None = None, chunk_size: int | None = None,
                      window: int | None = None) -> torch.Tensor:
    """One query token over all cached keys, softmax in float32 (no mask needed; `visible`, an
    int64 [1] on the device: keys after that position are masked). On the CPU from
    DECODE_KERNEL_MIN_LENGTH positions, the compiled kernel reads the cache once at DRAM speed;
    otherwise grouped matmuls. A GPU's masked call: the device kernel, where one is set
    (`use_device_decode`) and takes it."""
    if visible is not None and _device_decode is not None and _device_decode[0](q, k, v):
        return _device_decode[1](q, k, v, scale, visible, window=window or 0, chunk=chunk_size or 0)
    if (visible is None and q.device.type == "cpu" and k.shape[0] >= DECODE_KERNEL_MIN_LENGTH and k.dtype == v.dtype
            and k.dtype in TORCH_NAMES and k.stride(-1) == 1 and v.stride(-1) == 1):
        kernel = native_kernel()
        if kernel is not None:
            out = kernel.decode_attention(q[0], k, v, scale, torch.get_num_threads())
            return out.to(v.dtype).unsqueeze(0)
    heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
    qg = q[0].view(kv_heads, heads // kv_heads, dim)  # [Hkv, G, D]
    scores = torch.matmul(qg, k.permute(1, 2, 0)).to(torch.float32) * scale  # [Hkv, G, L]
    if visible is not None:
        keys = torch.arange(k.shape[0], device=k.device)
        hidden = keys > visible
        if chunk_size is not None:  # (and those before the position's chunk: chunked_causal_attention)
            hidden |= keys < visible - visible % chunk_size
        if window is not None:  # (and those before the position's window: sliding_causal_attention)
            hidden |= keys <= visible - window
        scores = scores.masked_fill(hidden, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v.transpose(0, 1))  # [Hkv, G, Dv]
    return out.reshape(1, heads, v.shape[-1])
