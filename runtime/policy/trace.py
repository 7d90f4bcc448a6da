"""Routing traces for cache-policy replay: per token, per MoE layer, the router's top-k expert ids.

`load_trace` reads the `.npz` layout of `shared/traces/bigmoeonedge/` (see its README): `experts`
int [T, L, K] with -1 for cells the engine did not route (llama.cpp routes only the last prompt
token through the final layer), `phase` 0 = prefill / 1 = decode, `expert_bytes` [L] (one expert of
each layer, the cost of a miss) and a JSON `meta` with `n_expert`. `RoutingTrace.schedule` turns a
trace into the exact sequence of layer steps a policy is fed, which offline policies may look ahead in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

Step = tuple[int, tuple[int, ...]]  # (layer, the distinct experts it needs, in router rank order)
WARM_MODES = ("batch", "tokens", "none")


class TraceError(ValueError):
    """A routing trace file is missing, unreadable or not in the expected layout."""


@dataclass(frozen=True)
class Schedule:
    """What `replay` will feed a policy, in order. Online policies must not look at `decode`."""

    num_layers: int
    num_experts: int
    warm: tuple[Step, ...]  # the prefill, before counting starts
    decode: tuple[Step, ...]  # one step per (decode token, MoE layer), token-major
    prefill_counts: dict[tuple[int, int], int] = field(default_factory=dict)  # (layer, expert) -> prompt tokens


def _distinct(ids: np.ndarray) -> tuple[int, ...]:
    """Present ids (>= 0) once each, first occurrence first (router rank order)."""
    return tuple(dict.fromkeys(int(e) for e in ids.ravel() if e >= 0))


@dataclass(frozen=True)
class RoutingTrace:
    """One request's routing. `experts` int [T, L, K], -1 = absent; `phase` int [T]."""

    name: str
    experts: np.ndarray
    phase: np.ndarray
    num_experts: int
    expert_bytes: np.ndarray  # int64 [L]: bytes of one expert of each layer

    def __post_init__(self) -> None:
        if self.experts.ndim != 3 or self.phase.shape != self.experts.shape[:1]:
            raise TraceError(f"{self.name}: experts must be [T, L, K] and phase [T], got "
                             f"{self.experts.shape} and {self.phase.shape}")
        if self.expert_bytes.shape != (self.num_layers,):
            raise TraceError(f"{self.name}: expert_bytes must have one entry per layer ({self.num_layers}), "
                             f"got {self.expert_bytes.shape}")
        if self.experts.size and int(self.experts.max()) >= self.num_experts:
            raise TraceError(f"{self.name}: expert id {int(self.experts.max())} >= num_experts {self.num_experts}")

    @property
    def num_layers(self) -> int:
        return self.experts.shape[1]

    @property
    def top_k(self) -> int:
        return self.experts.shape[2]

    @property
    def prefill(self) -> np.ndarray:
        return self.experts[self.phase == 0]  # [prompt tokens, L, K]

    @property
    def decode(self) -> np.ndarray:
        return self.experts[self.phase == 1]  # [decode tokens, L, K]

    @property
    def num_decode_tokens(self) -> int:
        return int((self.phase == 1).sum())

    def decode_steps(self) -> Iterator[Step]:
        for token in self.decode:
            for layer in range(self.num_layers):
                yield layer, _distinct(token[layer])

    def schedule(self, warm: str = "batch") -> Schedule:
        """The steps a policy is fed. `warm`: how the prompt passes through the cache first:
        "batch" = one step per layer with the prompt's distinct experts (a batched prefill, as
        llama.cpp runs it and as the trace repository's own replay does), "tokens" = one step per
        prompt token and layer, "none" = a cold cache at the first decode token."""
        if warm not in WARM_MODES:
            raise ValueError(f"warm must be one of {WARM_MODES}, not {warm!r}")
        prefill = self.prefill
        counts: Counter[tuple[int, int]] = Counter()
        for layer in range(self.num_layers):
            ids = prefill[:, layer].ravel()
            counts.update((layer, int(e)) for e in ids[ids >= 0])
        steps: list[Step] = []
        if warm == "batch":
            steps = [(layer, _distinct(prefill[:, layer])) for layer in range(self.num_layers)]
        elif warm == "tokens":
            steps = [(layer, _distinct(token[layer])) for token in prefill for layer in range(self.num_layers)]
        return Schedule(self.num_layers, self.num_experts, tuple(s for s in steps if s[1]),
                        tuple(self.decode_steps()), dict(counts))

    def with_expert_bytes(self, expert_bytes: int | np.ndarray) -> RoutingTrace:
        """The same routing with other expert sizes (e.g. bf16 experts instead of the trace's Q4_K_M)."""
        sizes = np.broadcast_to(np.asarray(expert_bytes, dtype=np.int64), (self.num_layers,)).copy()
        return RoutingTrace(self.name, self.experts, self.phase, self.num_experts, sizes)


def load_trace(path: str | Path, name: str | None = None) -> RoutingTrace:
    """Read a `shared/traces/bigmoeonedge/*.npz` routing trace."""
    path = Path(path)
    try:
        z = np.load(path, allow_pickle=False)
        experts, phase, expert_bytes = z["experts"], z["phase"], z["expert_bytes"]
        meta = json.loads(str(z["meta"])) if "meta" in z.files else {}
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace; the real ones are in shared/traces/bigmoeonedge/") from None
    except KeyError as e:
        raise TraceError(f"{path}: not a routing trace, it lacks {e} (needs experts, phase, expert_bytes)") from None
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: unreadable ({e}); fetch it again") from None
    num_experts = int(meta.get("n_expert") or int(experts.max()) + 1)
    return RoutingTrace(name or path.stem, experts.astype(np.int32), phase.astype(np.int8), num_experts,
                        expert_bytes.astype(np.int64))
