"""Sampling parameters (Ollama's names and defaults) and the sampler that applies them.

The sampler follows llama.cpp's default chain, which Ollama's llama.cpp runner used: repetition
penalties over the last `repeat_last_n` tokens, then top-k, top-p, min-p, temperature, and a draw
from a seeded torch.Generator. Temperature 0 is greedy decoding (after the penalties): the
highest logit, ties to the lowest token id. Top-p and min-p see the untempered distribution.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from .errors import InvalidParameterError
from .top_logits import MAX_CANDIDATES, TopLogits, candidates_to_take, penalty_window, top_logits

MAX_SEED = 2**64 - 1


def _number(name: str, value: Any, allowed: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameterError(name, value, allowed)
    return float(value)


def _integer(name: str, value: Any, allowed: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON clients write 40.0 for 40
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(name, value, allowed)
    return value


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token, with Ollama's option names and defaults.

    max_tokens None (or -1 on input) means until the context is full. seed None (or a negative
    number on input, Ollama's -1) draws a fresh seed. presence_penalty and frequency_penalty are OpenAI's, applied as llama.cpp
    does with the repetition penalty.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        temperature = _number("temperature", self.temperature, "must be a number >= 0 (0 = greedy)")
        if temperature < 0:
            raise InvalidParameterError("temperature", self.temperature, "must be a number >= 0 (0 = greedy)")
        put("temperature", temperature)
        top_k = _integer("top_k", self.top_k, "must be an integer >= 0 (0 or -1 = no limit)")
        if top_k == -1:  # vLLM's and llama.cpp's "no limit"
            top_k = 0
        if top_k < 0:
            raise InvalidParameterError("top_k", self.top_k, "must be an integer >= 0 (0 or -1 = no limit)")
        put("top_k", top_k)
        top_p = _number("top_p", self.top_p, "must be a number in (0, 1] (1 = off)")
        if not 0 < top_p <= 1:
            raise InvalidParameterError("top_p", self.top_p, "must be a number in (0, 1] (1 = off)")
        put("top_p", top_p)
        min_p = _number("min_p", self.min_p, "must be a number in [0, 1] (0 = off)")
        if not 0 <= min_p <= 1:
            raise InvalidParameterError("min_p", self.min_p, "must be a number in [0, 1] (0 = off)")
        put("min_p", min_p)
        repeat_penalty = _number("repeat_penalty", self.repeat_penalty, "must be a number > 0 (1 = off)")
        if repeat_penalty <= 0:
            raise InvalidParameterError("repeat_penalty", self.repeat_penalty, "must be a number > 0 (1 = off)")
        put("repeat_penalty", repeat_penalty)
        allowed = "must be an integer >= -1 (0 = off, -1 = all of the history)"
        repeat_last_n = _integer("repeat_last_n", self.repeat_last_n, allowed)
        if repeat_last_n < -1:
            raise InvalidParameterError("repeat_last_n", self.repeat_last_n, allowed)
        put("repeat_last_n", repeat_last_n)
        for name in ("presence_penalty", "frequency_penalty"):
            value = _number(name, getattr(self, name), "must be a number in [-2, 2] (0 = off)")
            if not -2 <= value <= 2:
                raise InvalidParameterError(name, getattr(self, name), "must be a number in [-2, 2] (0 = off)")
            put(name, value)
        put("seed", self._checked_seed(self.seed))
        put("max_tokens", self._checked_max_tokens(self.max_tokens))
        put("stop", self._checked_stop(self.stop))

    @staticmethod
    def _checked_seed(seed: Any) -> int | None:
        allowed = f"must be an integer in [0, {MAX_SEED}], or negative/null for a random seed"
        if seed is None:
            return None
        seed = _integer("seed", seed, allowed)
        if not -(2**63) <= seed <= MAX_SEED:
            raise InvalidParameterError("seed", seed, allowed)
        return seed if seed >= 0 else None  # Ollama: -1 = random; the Modelfile allows any int64

    @staticmethod
    def _checked_max_tokens(max_tokens: Any) -> int | None:
        allowed = "must be an integer >= 1, or -1/null for no limit but the context"
        if max_tokens is None:
            return None
        max_tokens = _integer("max_tokens", max_tokens, allowed)
        if max_tokens == -1:
            return None
        if max_tokens < 1:
            raise InvalidParameterError("max_tokens", max_tokens, allowed)
        return max_tokens

    @staticmethod
    def _checked_stop(stop: Any) -> tuple[str, ...]:
        allowed = "must be a non-empty string or a list of them"
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise InvalidParameterError("stop", stop, allowed)
        return tuple(dict.fromkeys(stop))

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None, defaults: SamplingParams | None = None) -> SamplingParams:
        """Params from an Ollama `options` object or OpenAI request fields, over `defaults`.

        Ollama names (num_predict, top_k, repeat_penalty, ...) and OpenAI names (max_tokens,
        max_completion_tokens, presence_penalty, ...) are both accepted; null values keep the
        default; an unknown name raises InvalidParameterError listing the known ones. Ollama's
        num_predict -2 (fill the context) reads as no limit.
        """
        base = defaults or cls()
        changes: dict[str, Any] = {}
        given: dict[str, str] = {}
        for key, value in (options or {}).items():
            if value is None:
                continue
            name = OPTION_ALIASES.get(key, key)
            if name not in _FIELDS:
                known = ", ".join(sorted(set(_FIELDS) | set(OPTION_ALIASES)))
                raise InvalidParameterError(key, value, f"unknown sampling option; known: {known}")
            if key == "num_predict" and value == -2:
                value = None
            if name in changes and changes[name] != value:
                raise InvalidParameterError(key, value, f"conflicts with another value given for {name}")
            changes[name] = value
            given[name] = key
        try:
            return replace(base, **changes)
        except InvalidParameterError as e:  # name the option as the caller spelled it
            raise InvalidParameterError(given.get(e.name, e.name), e.value, e.allowed) from None


_FIELDS = tuple(f.name for f in fields(SamplingParams))
OPTION_ALIASES = {"num_predict": "max_tokens", "max_completion_tokens": "max_tokens", "repetition_penalty": "repeat_penalty"}


class Sampler:
    """Draws next tokens for one sequence under `params`; the same seed gives the same tokens."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator(device="cpu")
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self.seed = seed
        self.generator.manual_seed(seed)

    def candidates_needed(self, history: Sequence[int] | torch.Tensor = ()) -> int | None:
        """How many of a step's best logits decide its sample under these params after
        `history` (top_logits.py), or None where the whole row does: top_k 0 with a temperature,
        a penalty that can raise a logit, or a penalty window of too many distinct tokens."""
        p = self.params
        if p.temperature > 0 and p.top_k == 0:
            return None
        touched = 0
        if not _penalties_off(p):
            if p.repeat_penalty < 1 or p.frequency_penalty < 0 or p.presence_penalty < 0:
                return None
            touched = int(torch.unique(penalty_window(history, p.repeat_last_n, 2**62)).numel())
        needed = (1 if p.temperature == 0 else p.top_k) + touched
        return needed if needed <= MAX_CANDIDATES else None

    def sample(self, logits: torch.Tensor | TopLogits, history: Sequence[int] = ()) -> int:
        """The next token id from `logits` [V] (any float dtype/device), or from a step's best
        logits (TopLogits), penalising `history`. A row on a device other than the CPU is
        narrowed there to the best logits that decide the sample, where some do."""
        if isinstance(logits, torch.Tensor) and logits.dim() != 1:
            raise ValueError(f"sample takes logits of shape [vocab], got {tuple(logits.shape)}")
        if isinstance(logits, torch.Tensor) and logits.device.type == "cpu":
            return self._sample_row(logits, history)
        needed = self.candidates_needed(history)
        if isinstance(logits, torch.Tensor):
            count = candidates_to_take(needed, logits.numel())
            if count is None or count >= logits.numel():
                return self._sample_row(logits, history)
            logits = top_logits(logits, count)
        if logits.has_nan:
            raise ValueError("logits contain NaN")
        use = logits.deciding(needed) if needed is not None else None
        if use is None:  # a tie across every boundary, or params that need the whole row
            return self._sample_row(logits.full(), history)
        order = torch.argsort(logits.ids[:use])  # by token id, as in the whole row
        ids, values = logits.ids[:use][order], logits.values[:use][order].clone()
        apply_penalties(values, history, self.params, ids=ids)
        return int(ids[self._draw(values)])

    def _sample_row(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        logits = logits.detach().to(device="cpu", dtype=torch.float32).clone()
        if torch.isnan(logits).any():
            raise ValueError("logits contain NaN")
        apply_penalties(logits, history, self.params)
        return self._draw(logits)

    def _draw(self, logits: torch.Tensor) -> int:
        """The index into `logits` (penalised, float32, in token-id order) the chain picks."""
        p = self.params
        if p.temperature == 0:
            return int(torch.argmax(logits))  # the first maximum: ties go to the lowest id
        at, values = top_k_sorted(logits, p.top_k)  # [K], [K], best first
        values = top_p_filter(values, p.top_p)
        values = min_p_filter(values, p.min_p)
        # scaled from the best logit, in float64: a temperature near 0 or huge (both allowed) then
        # gives 0 and -inf, or small finite values, never inf - inf
        probs = torch.softmax((values.double() - values[0].double()) / p.temperature, dim=0)
        pick = torch.multinomial(probs, 1, generator=self.generator)
        return int(at[int(pick)])


def _penalties_off(params: SamplingParams) -> bool:
    """No penalty changes a logit: all neutral, or a window of no tokens."""
    return params.repeat_last_n == 0 or (
        params.repeat_penalty == 1 and params.frequency_penalty == 0 and params.presence_penalty == 0)


def apply_penalties(logits: torch.Tensor, history: Sequence[int], params: SamplingParams,
                    ids: torch.Tensor | None = None) -> None:
    """llama.cpp's penalties, in place, over the last `repeat_last_n` tokens of `history`: a seen
    token's logit is divided by repeat_penalty if positive, multiplied if not, then lowered by
    count * frequency_penalty + presence_penalty. `ids`: the token id of each entry of `logits`,
    ascending (None: entry i is token i)."""
    if _penalties_off(params) or len(history) == 0:
        return
    window = penalty_window(history, params.repeat_last_n, logits.numel() if ids is None else 2**62)
    if window.numel() == 0:
        return
    seen_ids, counts = torch.unique(window, return_counts=True)
    if ids is None:
        at = seen_ids
    else:  # the seen tokens among the entries
        at = torch.searchsorted(ids, seen_ids).clamp(max=ids.numel() - 1)
        present = ids[at] == seen_ids
        at, counts = at[present], counts[present]
    seen = logits[at]
    seen = torch.where(seen <= 0, seen * params.repeat_penalty, seen / params.repeat_penalty)
    logits[at] = seen - counts.to(torch.float32) * params.frequency_penalty - params.presence_penalty


def top_k_sorted(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, logits) of the k best tokens (all for k <= 0), best first, equal logits by lower id."""
    if 0 < k < logits.numel():
        kth = torch.topk(logits, k).values[-1]
        above = torch.nonzero(logits > kth).flatten()
        tied = torch.nonzero(logits == kth).flatten()[: k - above.numel()]  # topk's pick among ties is arbitrary
        ids = torch.cat([above, tied])
        values = logits[ids]
    else:
        values, ids = logits, torch.arange(logits.numel())
    order = torch.sort(values, descending=True, stable=True).indices
    return ids[order], values[order]


def top_p_filter(values: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the shortest best-first prefix whose probability reaches top_p (at least one token)."""
    if top_p >= 1 or values.numel() <= 1:
        return values
    cumulative = torch.cumsum(torch.softmax(values, dim=0), dim=0)
    keep = min(int((cumulative < top_p).sum()) + 1, values.numel())
    return values[:keep]


def min_p_filter(values: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep tokens whose probability is at least min_p times the best one's (sorted input)."""
    if min_p <= 0 or values.numel() <= 1:
        return values
    keep = int((values >= values[0] + math.log(min_p)).sum())
    return values[: max(keep, 1)]
