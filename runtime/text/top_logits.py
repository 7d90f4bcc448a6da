"""A step's highest logits, taken where the logits are, for a sampler that needs only those.

On the GPU a decode step's logits are a vocabulary-long row (152k floats for Qwen3). Moving the
row to the host and reading it there (the NaN check, the penalties, top-k or the argmax) took
0.67-0.85 ms a token on the H200 host, time the device waits for; the candidates below take
0.08-0.10 (docs/benchmark-history.md, eleventh session). Under the usual
settings the sample depends on a few of them only: with top-k (or greedy, k = 1) and penalties
that can only lower a logit (repeat_penalty >= 1, frequency and presence penalties >= 0), the k
best after the penalties are among the k + W best before them, W being the number of distinct
tokens the penalties touch: at most W of those are lowered, the other k keep logits above
every token outside. The host then gets those candidates and applies the same chain to them.

Ties: the full chain breaks ties by the lower token id, and `torch.topk`'s pick among equal
values at its boundary is arbitrary. So a few more than needed are taken, and the candidates
are used up to a boundary where the value drops strictly; where none does (a tie spans them
all), the whole row is read after all (`TopLogits.full`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

SPARE = 16  # candidates taken beyond those needed: room for a tie at the boundary
MAX_CANDIDATES = 4096  # beyond this many (a long penalty window), the whole row is read


@dataclass(frozen=True)
class TopLogits:
    """The highest logits of one step on the host, best first: `values` float32 [C] and their
    token `ids` int64 [C] (C <= vocab_size), whether the row held a NaN, and `full`, which
    returns the whole row on the host (float32 [vocab_size]) where the candidates do not decide."""

    values: torch.Tensor
    ids: torch.Tensor
    vocab_size: int
    has_nan: bool
    full: Callable[[], torch.Tensor]

    def deciding(self, needed: int) -> int | None:
        """How many of the candidates to use: the fewest, at least `needed`, whose last value is
        above the next one's (the set of the best that many is then the same however ties
        were ordered); all of them where they are the whole vocabulary; None where no
        boundary is strict (read `full`)."""
        count = self.values.numel()
        if count >= self.vocab_size:
            return count
        drops = torch.nonzero(self.values[needed - 1: count - 1] > self.values[needed:count]).flatten()
        return needed + int(drops[0]) if drops.numel() else None


def candidates_to_take(needed: int | None, vocab_size: int) -> int | None:
    """How many logits to take for `needed` (None: the whole row is needed)."""
    if needed is None:
        return None
    return min(vocab_size, -(-(needed + SPARE) // 64) * 64)  # whole blocks of 64: few distinct sizes


def take_top(logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, ids, has_nan) of the `count` best of a [V] row, on its device, queued: no sync."""
    values, ids = torch.topk(logits.to(torch.float32), min(count, logits.numel()))
    return values, ids, torch.isnan(logits).any().reshape(1)


def top_logits(logits: torch.Tensor, count: int) -> TopLogits:
    """The `count` best of a [V] row, taken on its device and moved to the host (one sync)."""
    values, ids, has_nan = (t.cpu() for t in take_top(logits, count))
    return TopLogits(values, ids, logits.numel(), bool(has_nan), lambda: logits.detach().to("cpu", torch.float32))


def penalty_window(history: Sequence[int] | torch.Tensor, last_n: int, vocab_size: int) -> torch.Tensor:
    """The ids the repetition penalties count: the last `last_n` of `history` (all of it for -1,
    none for 0) that are token ids of the vocabulary, int64."""
    if last_n == 0 or len(history) == 0:
        return torch.empty(0, dtype=torch.long)
    recent = history[-last_n:] if last_n > 0 else history
    if isinstance(recent, torch.Tensor):
        window = recent.detach().to(device="cpu", dtype=torch.long).flatten()
    else:
        window = torch.as_tensor(list(recent), dtype=torch.long)
    return window[(window >= 0) & (window < vocab_size)]
