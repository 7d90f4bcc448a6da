"""AutoGuard: "auto" measures its split against plain offload on whole decode steps."""

from __future__ import annotations

import pytest

from runtime.gpu import auto_guard
from runtime.gpu.auto_guard import MODEL, PCIE_ONLY, AutoGuard


@pytest.fixture(autouse=True)
def no_warming(monkeypatch):
    """Every step timed from the start (the warming steps have a test of their own)."""
    monkeypatch.setattr(AutoGuard, "WARMING", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(guard: AutoGuard, clock: Clock, steps: int, step_s: dict[str, float], layers=(3, 4, 5)) -> list[str]:
    """`steps` decode steps over `layers`; a step under arm a takes step_s[a]; the arm of each step."""
    arms = []
    for _ in range(steps):
        arm = None
        for layer in layers:
            got = guard.on_decode_call(layer)
            arm = arm or got
            assert got == arm  # the arm changes only at a step boundary
        arms.append(arm)
        clock.now += step_s[arm]
    return arms


def run_queued_steps(guard: AutoGuard, clock: Clock, steps: int, step_s: dict[str, float]) -> list[str]:
    """As `ft run` queues them: step t+1 is begun right after step t is started, which is once
    the host has seen step t-1 end; the arm of each step."""
    arms = [guard.on_decode_call(3, queued=True)]
    for t in range(steps - 1):
        arms.append(guard.on_decode_call(3, queued=True))  # begun while step t runs
        clock.now += step_s[arms[t]]  # the host waits for step t's end
    return arms


@pytest.mark.parametrize("faster", [MODEL, PCIE_ONLY])
def test_the_guard_settles_on_the_faster_arm_and_revisits_the_other(monkeypatch, faster: str) -> None:
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3)
    slower = PCIE_ONLY if faster == MODEL else MODEL
    arms = run_steps(guard, clock, 400, {faster: 0.020, slower: 0.030})
    explore = 2 * AutoGuard.ROUNDS * AutoGuard.EXPLORE
    assert set(arms[:explore]) == {MODEL, PCIE_ONLY}  # both tried first
    after = arms[explore + 1:]
    assert after.count(faster) > 0.85 * len(after)  # then mostly the faster one
    assert slower in after  # and the slower one again now and then
    assert guard.best == faster


def test_an_interrupted_step_is_not_timed(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=0)
    guard.on_decode_call(0)
    clock.now += 100.0  # a prefill, or an idle server, between two steps
    guard.interrupt()
    guard.on_decode_call(0)
    clock.now += 0.01
    guard.on_decode_call(0)
    assert guard.times[PCIE_ONLY] == [pytest.approx(0.01)]


def test_the_steps_after_a_prompt_are_not_timed(monkeypatch) -> None:
    """The cache is still taking in the prompt's experts: the first arm would look slower than it
    is. After a restart or an interrupt, WARMING step times are dropped; the arm runs on."""
    monkeypatch.setattr(AutoGuard, "WARMING", 2)
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=0)
    for step_s in (0.05, 0.04, 0.01, 0.01):  # two slow warming steps, then two steady ones
        guard.on_decode_call(0)
        clock.now += step_s
    guard.on_decode_call(0)
    assert guard.times[PCIE_ONLY] == [pytest.approx(0.01)] * 2
    guard.interrupt()  # a new prompt
    for step_s in (0.07, 0.06, 0.02):
        guard.on_decode_call(0)
        clock.now += step_s
    guard.on_decode_call(0)
    assert guard.times[PCIE_ONLY] == [pytest.approx(0.01)] * 2 + [pytest.approx(0.02)]


def test_a_step_that_did_one_time_work_is_not_timed(monkeypatch) -> None:
    """A step that captured CUDA graphs is slow once; charging it to its arm would bias the choice."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=0)
    guard.on_decode_call(0)
    clock.now += 0.5  # this step captured graphs
    guard.on_decode_call(0, settled=False)
    clock.now += 0.01
    guard.on_decode_call(0)
    assert guard.times[PCIE_ONLY] == [pytest.approx(0.01)]


def test_a_model_arm_that_sends_nothing_to_the_cpu_is_left_after_one_block(monkeypatch) -> None:
    """The model's split sent no miss to the CPU: the arms made the same decisions, and the
    PCIe-only one replays CUDA graphs, so it is taken at once (timing would only cost steps), and
    the model arm is tried again ever more rarely."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    reads = []

    def cpu_experts() -> int:
        reads.append(clock.now)
        return 7  # never moves

    guard = AutoGuard(first_layer=3, cpu_experts=cpu_experts)
    arms = run_steps(guard, clock, 2000, {MODEL: 0.010, PCIE_ONLY: 0.010})  # equal times: no timing signal
    explore = AutoGuard.EXPLORE
    assert arms[: 2 * explore + 1] == [PCIE_ONLY] * explore + [MODEL] * explore + [PCIE_ONLY]
    assert guard.model_idle and guard.best == PCIE_ONLY
    trials = [i for i in range(1, len(arms)) if arms[i] == MODEL and arms[i - 1] == PCIE_ONLY]
    gaps = [b - a for a, b in zip(trials, trials[1:], strict=False)]
    # ever rarer: each wait twice the last (the gaps also hold a trial block)
    assert len(gaps) >= 2 and all(b >= 2 * a - 2 * AutoGuard.EXPLORE for a, b in zip(gaps, gaps[1:], strict=False))
    assert arms.count(MODEL) < 0.03 * len(arms)
    assert len(reads) <= 2 * (len(trials) + 1) + 1  # the count is read at a model block's start and end only


def test_restart_explores_both_arms_again(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3, cpu_experts=lambda: 7)
    run_steps(guard, clock, 40, {MODEL: 0.010, PCIE_ONLY: 0.010})
    assert guard.model_idle and guard.arm == PCIE_ONLY
    guard.restart()
    assert not guard.model_idle and guard.times == {MODEL: [], PCIE_ONLY: []}
    arms = run_steps(guard, clock, 2 * AutoGuard.EXPLORE, {MODEL: 0.010, PCIE_ONLY: 0.010})
    assert arms == [PCIE_ONLY] * AutoGuard.EXPLORE + [MODEL] * AutoGuard.EXPLORE


def test_a_model_arm_that_uses_the_cpu_is_timed_as_before(monkeypatch) -> None:
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    served = iter(range(10**6))
    guard = AutoGuard(first_layer=3, cpu_experts=lambda: next(served))  # every read: more CPU work
    arms = run_steps(guard, clock, 400, {MODEL: 0.020, PCIE_ONLY: 0.030})
    assert not guard.model_idle and guard.best == MODEL
    explore = 2 * AutoGuard.ROUNDS * AutoGuard.EXPLORE
    assert set(arms[:explore]) == {MODEL, PCIE_ONLY}
    assert arms[explore + 1:].count(MODEL) > 0.85 * len(arms[explore + 1:])


def test_a_decisively_slower_arm_ends_the_exploring_after_one_block(monkeypatch) -> None:
    """Each trial step of the losing arm costs its gap: a model-arm step DECISIVE times the
    PCIe-only median ends its block at once and the exploring with it; a closer race gets both
    rounds of whole blocks."""
    explore = AutoGuard.EXPLORE
    for model_s, decisive in ((0.030, True), (0.012, False)):
        clock = Clock()
        monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
        guard = AutoGuard(first_layer=3)
        arms = run_steps(guard, clock, 8 * explore, {MODEL: model_s, PCIE_ONLY: 0.010})
        if decisive:  # one model step, then PCIe-only until the next trial
            assert arms == [PCIE_ONLY] * explore + [MODEL] + [PCIE_ONLY] * (7 * explore - 1)
        else:
            assert arms[:4 * explore] == ([PCIE_ONLY] * explore + [MODEL] * explore) * 2
        assert arms[-explore:] == [PCIE_ONLY] * explore and guard.best == PCIE_ONLY


def test_a_hopeless_trial_of_either_arm_is_cut_short(monkeypatch) -> None:
    """Once the model arm won, a re-trial of PCIe-only that is DECISIVE times slower ends after
    one step too."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3)
    arms = run_steps(guard, clock, 3 * AutoGuard.REVISIT, {MODEL: 0.010, PCIE_ONLY: 0.030})
    assert guard.best == MODEL
    runs, start = [], 0
    for i in range(1, len(arms) + 1):
        if i == len(arms) or arms[i] != arms[start]:
            runs.append((arms[start], i - start))
            start = i
    assert runs[0] == (PCIE_ONLY, AutoGuard.EXPLORE)  # the first block is whole: nothing to compare with yet
    assert all(n == 1 for arm, n in runs[1:] if arm == PCIE_ONLY)  # every later PCIe-only trial: one step
    assert sum(1 for arm, _ in runs if arm == PCIE_ONLY) >= 3


@pytest.mark.parametrize("faster", [MODEL, PCIE_ONLY])
def test_queued_steps_are_timed_under_the_arm_they_ran(monkeypatch, faster: str) -> None:
    """A queued step is begun while the one before it runs: the interval since the last begin is
    the step before that. Charged to the arm of the step begun last, every block's first time
    was the other arm's (on the H200 at 32 GiB a slow model step counted as PCIe-only's, so the
    race looked close and the model arm got a second block)."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3)
    slower = PCIE_ONLY if faster == MODEL else MODEL
    run_queued_steps(guard, clock, 400, {faster: 0.020, slower: 0.030})
    assert guard.best == faster
    assert max(guard.times[faster]) == pytest.approx(0.020) and min(guard.times[slower]) == pytest.approx(0.030)


def test_a_decisively_slower_queued_arm_ends_the_exploring_after_one_block(monkeypatch) -> None:
    """Queued, a trial step's time is known a step late: a decisively slower model arm runs two
    steps (the second was begun before the first was timed), once."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3)
    explore = AutoGuard.EXPLORE
    arms = run_queued_steps(guard, clock, 8 * explore, {MODEL: 0.0085, PCIE_ONLY: 0.002})
    assert arms.count(MODEL) == 2 and arms[arms.index(MODEL) + 1] == MODEL
    assert guard.best == PCIE_ONLY and arms[-explore:] == [PCIE_ONLY] * explore


def test_the_first_queued_interval_after_an_interrupt_is_not_timed(monkeypatch) -> None:
    """The first two queued begins after a prompt are apart by the host's start of the first
    step only: no step ran between them."""
    clock = Clock()
    monkeypatch.setattr(auto_guard.time, "perf_counter", clock)
    guard = AutoGuard(first_layer=3)
    guard.interrupt()
    monkeypatch.setattr(guard, "_untimed", 0)
    guard.on_decode_call(3, queued=True)
    clock.now += 0.0001
    guard.on_decode_call(3, queued=True)
    assert guard.times == {MODEL: [], PCIE_ONLY: []}
    clock.now += 0.002
    guard.on_decode_call(3, queued=True)
    assert guard.times[PCIE_ONLY] == [pytest.approx(0.002)]
