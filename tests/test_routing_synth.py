"""The synthetic router: its statistics functions on hand-made routing, the generator's contract, and
calibration hitting its targets (on the real heat aggregates when shared/traces/ is present)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from runtime.bench.routing_synth import (
    QWEN3_30B_REUSE,
    QWEN3_30B_TOP_SHARE,
    QWEN3_30B_WINDOW_DISTINCT,
    QWEN3_30B_WINDOW_SHARE,
    RoutingTargets,
    SyntheticRouter,
    calibrate,
    calibrated_router,
    distinct_share,
    popularity_from_heat,
    reuse_rate,
    routing_stats,
    top_share,
    zipf_popularity,
)

REPO = Path(__file__).resolve().parents[1]
TRACES = next((p for p in (REPO / "shared" / "traces", REPO.parent / "shared" / "traces") if p.is_dir()), None)
needs_traces = pytest.mark.skipif(TRACES is None, reason="shared/traces/ not checked out")


# -- statistics -------------------------------------------------------------------------------------

def test_reuse_rate_on_hand_made_routing() -> None:
    routing = np.array([[[0, 1]], [[1, 2]], [[2, 1]], [[3, 4]]])  # [T=4, L=1, K=2]
    assert reuse_rate(routing) == pytest.approx((1 + 2 + 0) / 6)
    absent = np.array([[[0, 1]], [[1, -1]]])
    assert reuse_rate(absent) == pytest.approx(1.0)  # -1 is neither a token's expert nor a match
    batch = np.stack([routing, routing])  # leading dims are separate sequences
    assert reuse_rate(batch) == pytest.approx(reuse_rate(routing))


def test_top_share_on_hand_made_routing() -> None:
    # 10 experts, top 10% = 1 expert; layer 0: expert 0 takes 3 of 4 activations, layer 1: 2 of 4
    routing = np.array([[[0, 1], [5, 6]], [[0, 0], [5, 7]]])
    assert top_share(routing, 0.10, num_experts=10) == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert top_share(routing, 0.20, num_experts=10) == pytest.approx((4 / 4 + 3 / 4) / 2)
    windows = np.array([[[0]], [[0]], [[1]], [[2]]])
    assert top_share(windows, 0.10, num_experts=10, window=2) == pytest.approx((1 + 0.5) / 2)


def test_distinct_share() -> None:
    routing = np.array([[[0, 1]], [[1, 2]], [[3, -1]], [[3, 0]]])
    assert distinct_share(routing, 8) == pytest.approx(4 / 8)
    assert distinct_share(routing, 8, window=2) == pytest.approx((3 / 8 + 2 / 8) / 2)


# -- the generator ----------------------------------------------------------------------------------

def small_router(**kw) -> SyntheticRouter:
    return SyntheticRouter(zipf_popularity(3, 16, seed=1), top_k=4, **kw)


def test_generate_shape_ids_and_determinism() -> None:
    router = small_router(skew=1.0, context_spread=0.7, context_support=0.5, stickiness=0.3, context_tokens=10)
    routing = router.generate(25, seed=3)
    assert routing.shape == (25, 3, 4) and routing.dtype == np.int32
    assert routing.min() >= 0 and routing.max() < 16
    assert all(len(set(row)) == 4 for row in routing.reshape(-1, 4))  # distinct ids in each row
    assert np.array_equal(routing, router.generate(25, seed=3))
    assert not np.array_equal(routing, router.generate(25, seed=4))
    stream = router.stream(seed=3)
    assert np.array_equal(np.stack([next(stream) for _ in range(25)]), routing)
    # a context routes only to its `context_support` share of each layer's experts
    for ctx in routing[:20].reshape(2, 10, 3, 4):
        for layer in range(3):
            assert len(np.unique(ctx[:, layer])) <= 8


def test_stickiness_and_spread_move_their_statistics() -> None:
    base = small_router(context_tokens=64)
    loose, sticky = base.generate(640, seed=0), replace(base, stickiness=0.6).generate(640, seed=0)
    assert reuse_rate(sticky) > reuse_rate(loose) + 0.2
    spread = replace(base, context_spread=2.0).generate(640, seed=0)
    assert top_share(spread, num_experts=16, window=64) > top_share(loose, num_experts=16, window=64) + 0.05


def test_router_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        SyntheticRouter(np.ones((2, 4)), top_k=5)
    with pytest.raises(ValueError):
        SyntheticRouter(np.zeros((2, 4)), top_k=2)
    with pytest.raises(ValueError):
        small_router(stickiness=1.0)
    with pytest.raises(ValueError):
        small_router(context_support=0.0)


def test_popularity_from_heat() -> None:
    heat = np.array([[100, 10, 0, 1], [5, 5, 5, 5]])
    same = popularity_from_heat(heat, 2, 4)
    assert same.shape == (2, 4) and np.allclose(same.sum(1), 1) and (same > 0).all()
    assert np.allclose(same[0], (heat[0] + 1) / (heat[0] + 1).sum())
    resized = popularity_from_heat(heat, 5, 8, seed=0)
    assert resized.shape == (5, 8) and np.allclose(resized.sum(1), 1) and (resized > 0).all()
    assert resized[0].max() / resized[0].min() > 10 and resized[4].max() / resized[4].min() < 1.01


# -- calibration ------------------------------------------------------------------------------------

def check(stats, targets: RoutingTargets, tolerance: float) -> None:
    assert stats.reuse == pytest.approx(targets.reuse, abs=tolerance)
    assert stats.top_share == pytest.approx(targets.top_share, abs=tolerance)
    assert stats.window_share == pytest.approx(targets.window_share, abs=tolerance)
    assert stats.window_distinct == pytest.approx(targets.window_distinct, abs=tolerance)


def test_calibration_hits_the_default_targets_on_zipf_popularity() -> None:
    router, reached = calibrated_router(12, 128, 6, seed=0)
    targets = RoutingTargets()
    check(reached, targets, 0.01)
    fresh = router.generate(40 * router.context_tokens, seed=7)  # not the calibration sample
    check(routing_stats(fresh, 128, window=router.context_tokens), targets, 0.02)


def test_calibration_hits_other_targets() -> None:
    targets = RoutingTargets(reuse=0.5, top_share=0.45, window_share=None, window_distinct=None, window_tokens=64)
    router, reached = calibrate(zipf_popularity(4, 32, seed=2), 4, targets, seed=1)
    assert reached.reuse == pytest.approx(0.5, abs=0.01) and reached.top_share == pytest.approx(0.45, abs=0.01)
    assert router.context_spread == 0 and router.context_support == 1


@needs_traces
def test_defaults_are_the_measured_qwen3_statistics() -> None:
    z = np.load(TRACES / "bigmoeonedge" / "qwen3-30b-a3b.npz")
    decode = z["experts"][z["phase"] == 1].astype(np.int32)
    assert reuse_rate(decode) == pytest.approx(QWEN3_30B_REUSE, abs=0.001)
    assert top_share(decode, num_experts=128) == pytest.approx(QWEN3_30B_WINDOW_SHARE, abs=0.001)
    assert distinct_share(decode, 128) == pytest.approx(QWEN3_30B_WINDOW_DISTINCT, abs=0.001)
    heat = np.load(TRACES / "mbolt_aggregates" / "heat.npz")["qwen3_30b_a3b_heat"]
    shares = [np.sort(h)[::-1][:13].sum() / h.sum() for h in heat]  # top 13 of 128 experts, per layer
    assert np.mean(shares) == pytest.approx(QWEN3_30B_TOP_SHARE, abs=0.001)


@needs_traces
def test_calibrated_on_the_qwen3_heat_matches_the_trace() -> None:
    heat = np.load(TRACES / "mbolt_aggregates" / "heat.npz")["qwen3_30b_a3b_heat"]
    router, reached = calibrated_router(48, 128, 6, heat=heat)
    check(reached, RoutingTargets(), 0.01)
    fresh = router.generate(40 * router.context_tokens, seed=11)
    stats = routing_stats(fresh, 128, window=router.context_tokens)
    assert stats.reuse == pytest.approx(0.38, abs=0.02) and stats.top_share == pytest.approx(0.36, abs=0.02)
