"""Synthetic MoE routing with the statistics of real traces, for benchmarks (DESIGN.md §9).

Random-weight models route unrealistically (next-token expert reuse 69-77% and a top-10% share of
85-89%, against 38% and 36% in real traces), which overstates cache hit rates about twofold. Scaling
the token embeddings moves reuse and skew together along one curve, so it cannot hit both, nor a
per-layer popularity. We therefore generate the routing itself and let the benchmark inject these
expert ids into its MoE layers in place of the random router's choice: every expert has the same
shape, so compute is unchanged and only the cache sees the difference, which is what is calibrated.
The injected layer may weight the chosen experts with its own router's softmax at these ids.

The generator, per MoE layer l and request ("context", `context_tokens` long):

    z         = N(0, 1) per expert, drawn once per context
    log u_l   = skew * log popularity_l + context_spread * z; only the `context_support` share of
                experts with the highest z can be routed to in this context
    token t   = each of token t-1's experts kept with probability `stickiness`, the rest drawn
                without replacement with probability proportional to u_l (Gumbel top-k)

`popularity` is long-run heat (from `shared/traces/mbolt_aggregates/heat.npz`, resampled to the
model's shape) or a Zipf law. `calibrate` solves for skew, context_support, context_spread and
stickiness so that the long-run top-10% share, the distinct experts a request uses, the top-10% share
inside one request and the next-token reuse meet `RoutingTargets`. The two per-request statistics
are what make a global LRU's miss curve come out as on the real trace: matching reuse and the
long-run share alone leaves a tail of experts used once per request, and LRU misses on it.
Defaults are measured on Qwen3-30B-A3B (see the constants). Report `routing_stats` of every run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

# Measured on shared/traces (2026-11-30; benchmarks/bench_traces.py prints them):
QWEN3_30B_REUSE = 0.380  # bigmoeonedge/qwen3-30b-a3b.npz, 128 decode tokens, top-6: 0.3795
QWEN3_30B_TOP_SHARE = 0.361  # mbolt_aggregates heat.npz, 75,773 decode tokens, top-8, mean over layers: 0.3613
QWEN3_30B_WINDOW_SHARE = 0.580  # the same 128 decode tokens of one request: 0.5796
QWEN3_30B_WINDOW_DISTINCT = 0.498  # ... of which each layer used 63.7 of its 128 experts
QWEN3_30B_WINDOW_TOKENS = 128


@dataclass(frozen=True)
class RoutingTargets:
    """What a calibrated router should show. `window_share` None: no per-request concentration."""

    reuse: float = QWEN3_30B_REUSE  # share of a token's experts the previous token (same layer) also used
    top_share: float = QWEN3_30B_TOP_SHARE  # activations taken by the top `fraction` of each layer's experts, long run
    window_share: float | None = QWEN3_30B_WINDOW_SHARE  # the same within one request of window_tokens
    window_distinct: float | None = QWEN3_30B_WINDOW_DISTINCT  # share of each layer's experts a request uses
    window_tokens: int = QWEN3_30B_WINDOW_TOKENS
    fraction: float = 0.10


@dataclass(frozen=True)
class RoutingStats:
    reuse: float
    top_share: float  # over the whole sequence
    window_share: float  # mean over windows of `window_tokens`
    window_distinct: float  # share of each layer's experts used in a window, mean over windows

    def __str__(self) -> str:
        return (f"reuse {100 * self.reuse:.1f}%, top-10% share {100 * self.top_share:.1f}% (per request "
                f"{100 * self.window_share:.1f}%, {100 * self.window_distinct:.1f}% of experts used)")


def reuse_rate(routing: np.ndarray) -> float:
    """Next-token expert reuse of `routing` int [..., T, L, K] (ids distinct within a row, -1 absent):
    over tokens t >= 1 and layers, |E(t) & E(t-1)| / |E(t)|. Leading dims are separate sequences."""
    now, before = routing[..., 1:, :, :, None], routing[..., :-1, :, None, :]
    present = routing[..., 1:, :, :] >= 0
    shared = ((now == before).any(-1) & present).sum()
    return float(shared / present.sum()) if present.any() else 0.0


def top_share(routing: np.ndarray, fraction: float = 0.10, *, num_experts: int | None = None,
              window: int | None = None) -> float:
    """Share of activations taken by each layer's top `fraction` of experts (round(fraction * N),
    at least 1), averaged over layers, of `routing` int [T, L, K]; with `window`, the mean over
    consecutive windows of that many tokens (a trailing partial window is dropped)."""
    tokens, layers, _ = routing.shape
    n = num_experts or int(routing.max()) + 1
    if window is not None and window < tokens:
        parts = [routing[i : i + window] for i in range(0, tokens - window + 1, window)]
        return float(np.mean([top_share(p, fraction, num_experts=n) for p in parts]))
    flat = routing.transpose(1, 0, 2).reshape(layers, -1)  # [L, T*K]
    counts = np.stack([np.bincount(row[row >= 0], minlength=n) for row in flat]).astype(np.float64)  # [L, N]
    top = max(1, round(fraction * n))
    totals = counts.sum(1)
    shares = np.sort(counts, 1)[:, ::-1][:, :top].sum(1)[totals > 0] / totals[totals > 0]
    return float(shares.mean()) if shares.size else 0.0


def distinct_share(routing: np.ndarray, num_experts: int, *, window: int | None = None) -> float:
    """Share of each layer's experts that `routing` int [T, L, K] uses at least once, mean over layers
    (and over consecutive windows of `window` tokens, a trailing partial one dropped)."""
    tokens, layers, _ = routing.shape
    if window is not None and window < tokens:
        return float(np.mean([distinct_share(routing[i : i + window], num_experts)
                              for i in range(0, tokens - window + 1, window)]))
    used = np.zeros((layers, num_experts), dtype=bool)
    rows = routing.transpose(1, 0, 2).reshape(layers, -1)  # [L, T*K]
    for layer, row in enumerate(rows):
        used[layer, row[row >= 0]] = True
    return float(used.mean())


def routing_stats(routing: np.ndarray, num_experts: int, window: int = QWEN3_30B_WINDOW_TOKENS,
                  fraction: float = 0.10) -> RoutingStats:
    """The statistics every synthetic run reports, for `routing` int [T, L, K]."""
    return RoutingStats(reuse_rate(routing), top_share(routing, fraction, num_experts=num_experts),
                        top_share(routing, fraction, num_experts=num_experts, window=window),
                        distinct_share(routing, num_experts, window=window))


# -- popularity ---------------------------------------------------------------------------------------

def popularity_from_heat(heat: np.ndarray, num_layers: int, num_experts: int, seed: int = 0) -> np.ndarray:
    """Per-layer expert weights [num_layers, num_experts] from a heat table [L', N'] (activation counts).

    Same shape: the heat itself (+1, so no expert is impossible). Otherwise each layer takes the
    nearest source layer's popularity-by-rank curve, resampled to `num_experts` ranks and given to a
    random permutation of ids (expert ids of a random-weight model mean nothing)."""
    heat = np.asarray(heat, dtype=np.float64) + 1.0
    if heat.shape == (num_layers, num_experts):
        return heat / heat.sum(1, keepdims=True)
    rng = np.random.default_rng(seed)
    src_layers, src_experts = heat.shape
    out = np.empty((num_layers, num_experts))
    for layer in range(num_layers):
        row = np.sort(heat[round(layer * (src_layers - 1) / max(num_layers - 1, 1))])[::-1]
        row = row / row.sum()
        ranks = (np.arange(num_experts) + 0.5) / num_experts * src_experts - 0.5
        out[layer] = rng.permutation(np.interp(ranks, np.arange(src_experts), row))
    return out / out.sum(1, keepdims=True)


def zipf_popularity(num_layers: int, num_experts: int, exponent: float = 1.0, seed: int = 0) -> np.ndarray:
    """Weight 1/rank^exponent, ranks permuted independently per layer."""
    rng = np.random.default_rng(seed)
    base = 1.0 / np.arange(1, num_experts + 1) ** exponent
    return np.stack([rng.permutation(base) / base.sum() for _ in range(num_layers)])


# -- the generator ----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SyntheticRouter:
    """Per-token top-k routing for `popularity.shape` = [L, N] (see the module docstring)."""

    popularity: np.ndarray  # [L, N], > 0
    top_k: int
    skew: float = 1.0
    context_spread: float = 0.0
    context_support: float = 1.0  # share of each layer's experts one context can route to
    stickiness: float = 0.0
    context_tokens: int = QWEN3_30B_WINDOW_TOKENS

    def __post_init__(self) -> None:
        if self.popularity.ndim != 2 or (self.popularity <= 0).any():
            raise ValueError("popularity must be [layers, experts] with every weight > 0")
        if not 0 < self.top_k <= self.popularity.shape[1]:
            raise ValueError(f"top_k {self.top_k} must be in [1, {self.popularity.shape[1]}]")
        if not 0 <= self.stickiness < 1 or self.context_spread < 0 or self.context_tokens < 1:
            raise ValueError("need 0 <= stickiness < 1, context_spread >= 0, context_tokens >= 1")
        if not 0 < self.context_support <= 1:
            raise ValueError(f"context_support must be in (0, 1], not {self.context_support}")

    @property
    def num_layers(self) -> int:
        return self.popularity.shape[0]

    @property
    def num_experts(self) -> int:
        return self.popularity.shape[1]

    def generate(self, num_tokens: int, seed: int = 0) -> np.ndarray:
        """int32 [num_tokens, L, top_k], each row in rank order; a new context every context_tokens."""
        blocks, have = [], 0
        for block in self._blocks(seed):
            blocks.append(block.reshape(-1, self.num_layers, self.top_k))
            have += len(blocks[-1])
            if have >= num_tokens:
                break
        return np.concatenate(blocks)[:num_tokens]

    def stream(self, seed: int = 0) -> Iterator[np.ndarray]:
        """One token's routing int32 [L, top_k] at a time, without end: inject it into the MoE layers.
        The same sequence as `generate(n, seed)`."""
        for block in self._blocks(seed):
            yield from block.reshape(-1, self.num_layers, self.top_k)

    def _blocks(self, seed: int, contexts_per_block: int = 8) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(seed)
        while True:
            yield self._simulate(_draw_noise(rng, contexts_per_block, self.context_tokens, *self.popularity.shape,
                                             self.top_k))

    def _simulate(self, noise: _Noise) -> np.ndarray:
        """int32 [contexts, context_tokens, L, K] from pre-drawn noise (calibration reuses the noise)."""
        log_u = self.skew * np.log(self.popularity)[None] + self.context_spread * noise.spread  # [C, L, N]
        eligible = max(self.top_k, round(self.context_support * self.num_experts))
        if eligible < self.num_experts:  # the context's lowest-z experts are out of reach
            cut = np.sort(noise.spread, axis=-1)[..., self.num_experts - eligible, None]  # [C, L, 1]
            log_u = np.where(noise.spread >= cut, log_u, -1e9)
        contexts, steps = noise.spread.shape[0], noise.gumbel.shape[0]
        out = np.empty((contexts, steps, self.num_layers, self.top_k), dtype=np.int32)
        prev = None
        for t in range(steps):
            keys = log_u + noise.gumbel[t]  # [C, L, N]
            if prev is not None:
                kept = np.take_along_axis(keys, prev, -1) + 1e9 * (noise.keep[t] < self.stickiness)
                np.put_along_axis(keys, prev, kept, -1)
            top = np.argpartition(-keys, self.top_k - 1, axis=-1)[..., : self.top_k]  # [C, L, K], unordered
            order = np.argsort(-np.take_along_axis(keys, top, -1), axis=-1)
            prev = np.take_along_axis(top, order, -1)
            out[:, t] = prev
        return out


@dataclass(frozen=True)
class _Noise:
    spread: np.ndarray  # [C, L, N] standard normal
    gumbel: np.ndarray  # [T, C, L, N]
    keep: np.ndarray  # [T, C, L, K] uniform


def _draw_noise(rng: np.random.Generator, contexts: int, steps: int, layers: int, experts: int, top_k: int) -> _Noise:
    return _Noise(rng.standard_normal((contexts, layers, experts)).astype(np.float32),
                  rng.gumbel(size=(steps, contexts, layers, experts)).astype(np.float32),
                  rng.random((steps, contexts, layers, top_k)).astype(np.float32))


# -- calibration --------------------------------------------------------------------------------------

def calibrate(popularity: np.ndarray, top_k: int, targets: RoutingTargets = RoutingTargets(), *, seed: int = 0,
              num_contexts: int = 32, max_layers: int = 8, rounds: int = 4,
              tolerance: float = 0.004) -> tuple[SyntheticRouter, RoutingStats]:
    """A router over `popularity` [L, N] whose statistics meet `targets`, and the statistics it
    reached on the calibration sample (`num_contexts` requests of `targets.window_tokens`, on at most
    `max_layers` evenly spaced layers; every layer gets the same parameters).

    Each parameter mainly moves one statistic (skew: long-run share, context_support: distinct
    experts per request, context_spread: share within a request, stickiness: reuse), so a few rounds
    of 1-D root finding on common random numbers converge. A target out of reach ends at the end of
    that parameter's range: check the returned stats."""
    layers = np.unique(np.linspace(0, popularity.shape[0] - 1, min(max_layers, popularity.shape[0])).round().astype(int))
    window = targets.window_tokens
    router = SyntheticRouter(np.asarray(popularity, dtype=np.float64), top_k, skew=1.0,
                             context_spread=0.5 if targets.window_share is not None else 0.0,
                             stickiness=0.2, context_tokens=window)
    sample = replace(router, popularity=router.popularity[layers])
    noise = _draw_noise(np.random.default_rng(seed), num_contexts, window, len(layers), router.num_experts, top_k)

    def stats(r: SyntheticRouter) -> RoutingStats:
        out = r._simulate(noise)  # [C, T, L, K]
        flat = out.reshape(-1, *out.shape[2:])  # [C*T, L, K]
        n = r.num_experts
        return RoutingStats(reuse_rate(out), top_share(flat, targets.fraction, num_experts=n),
                            top_share(flat, targets.fraction, num_experts=n, window=window),
                            distinct_share(flat, n, window=window))

    Goal = tuple[str, float, float, Callable[[RoutingStats], float], float]
    goals: list[Goal] = [("skew", 0.0, 6.0, lambda s: s.top_share, targets.top_share)]
    if targets.window_distinct is not None:
        goals.append(("context_support", top_k / router.num_experts, 1.0, lambda s: s.window_distinct,
                      targets.window_distinct))
    if targets.window_share is not None:
        goals.append(("context_spread", 0.0, 6.0, lambda s: s.window_share, targets.window_share))
    goals.append(("stickiness", 0.0, 0.95, lambda s: s.reuse, targets.reuse))
    reached = stats(sample)
    for _ in range(rounds):
        if all(abs(get(reached) - goal) <= tolerance for _, _, _, get, goal in goals):
            break
        for field, lo, hi, get, goal in goals:
            def error(x: float, base: SyntheticRouter = sample, field: str = field,
                      get: Callable[[RoutingStats], float] = get, goal: float = goal) -> float:
                return get(stats(replace(base, **{field: x}))) - goal

            sample = replace(sample, **{field: _solve(error, lo, hi, getattr(sample, field), tolerance)})
        reached = stats(sample)
    return replace(sample, popularity=router.popularity), reached


def _solve(f: Callable[[float], float], lo: float, hi: float, start: float, tolerance: float,
           max_evals: int = 10) -> float:
    """x in [lo, hi] with |f(x)| <= tolerance for an increasing f: bisection started at `start`."""
    x = min(max(start, lo), hi)
    for _ in range(max_evals):
        err = f(x)
        if abs(err) <= tolerance:
            return x
        lo, hi = (x, hi) if err < 0 else (lo, x)
        x = (lo + hi) / 2
    return x


def calibrated_router(num_layers: int, num_experts: int, top_k: int, *, heat: np.ndarray | None = None,
                      targets: RoutingTargets = RoutingTargets(), seed: int = 0) -> tuple[SyntheticRouter, RoutingStats]:
    """The usual entry point: popularity from `heat` (or Zipf when None), calibrated to `targets`."""
    popularity = (zipf_popularity(num_layers, num_experts, seed=seed) if heat is None
                  else popularity_from_heat(heat, num_layers, num_experts, seed=seed))
    return calibrate(popularity, top_k, targets, seed=seed)
