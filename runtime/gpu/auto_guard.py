"""The end-to-end check behind "auto never loses to plain offload".

The cost model's split (policy/miss_split.py) is only as right as its profile: a CPU hand-off
costs latency the model may misjudge on a given machine and load. So "auto" runs two arms and
measures them where it matters, whole decode steps: "model" (the model's split, the CPU share
on) and "pcie" (every miss over PCIe, no CPU share). A step is the time between two decode
calls of the first MoE layer (one token: attention, sampling and the host's wait included, the
same for both arms). The arms alternate in blocks of EXPLORE steps, PCIe-only first (plain
offload's decisions: the arm a trial of the model must beat), until each has ROUNDS blocks (or
one each, where one arm is DECISIVE times slower), then the faster (by median step time) runs,
and the other is tried again for one block every REVISIT steps, so a change in load or hit
rate is noticed. The first WARMING steps after a prompt are not timed (the cache is still
taking in its experts). A trial step DECISIVE times the other arm's median ends its block at once:
each such step costs the whole gap (at 32 GiB on the H200 a model-arm step took 3x a PCIe-only
one, and three of them cost auto 5% of a 96-token run).

Where the model sends no miss to the CPU the two arms make the same decisions, and the PCIe-only
arm is at least as fast (a model-arm call that may hand work to the CPU pays the hand-off to the
worker and back even when its plan gives the CPU nothing, and replays a CUDA graph only where
the driver's stream flags can be captured). So when a trial block of the model arm ends having
sent nothing to the CPU (`cpu_experts`, a running count read when such a block starts and ends),
the guard takes the PCIe-only arm without timing, and waits twice as long before the next trial
(up to MAX_REVISIT): the hit rate may change.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

MODEL, PCIE_ONLY = "model", "pcie"


class AutoGuard:
    # Trials are short: a trial step of the losing arm can cost twice a step of the winner (where
    # the model arm's calls cannot replay CUDA graphs). 2 blocks of 3 steps per arm, then one block
    # per 128 steps: under 3% of steps in the slower arm once chosen (measured on the H200:
    # docs/benchmark-history.md, GPU decode). A model arm that sends nothing to the CPU is left after one
    # block, and tried ever more rarely.
    EXPLORE = 3  # steps per trial block
    ROUNDS = 2  # blocks per arm before the first choice
    REVISIT = 128  # steps between re-trials of the losing arm
    MAX_REVISIT = 1024  # the longest wait while the model arm keeps sending nothing to the CPU
    KEEP = 48  # step times kept per arm
    DECISIVE = 1.5  # after one block of each arm, a median this many times the other's ends the exploring
    # step times not counted after a restart or a prefill: the cache is still taking in the new
    # prompt's experts, so the arm that runs first would look slower than it is (on the H200 at
    # 32 GiB the first PCIe-only steps after a 28-token prompt took 3x the later ones, and with 2
    # dropped the exploring still took a second round)
    WARMING = 4

    def __init__(self, first_layer: int, cpu_experts: Callable[[], int] | None = None) -> None:
        """`cpu_experts`: the running count of misses served by the CPU (a device read, made at the
        start and end of each model-arm block); None: always compare times."""
        self.first_layer = first_layer
        self.cpu_experts = cpu_experts
        self.arm = PCIE_ONLY
        self.times: dict[str, list[float]] = {MODEL: [], PCIE_ONLY: []}
        self._blocks = {MODEL: 0, PCIE_ONLY: 0}
        self._step_start: float | None = None
        self._in_block = 0
        self._since_choice = 0
        self._revisit = self.REVISIT
        self._cpu_at_block_start: int | None = None
        self.model_idle = False  # the last model-arm block sent nothing to the CPU
        self.switches = 0
        self.steps = {MODEL: 0, PCIE_ONLY: 0}  # decode steps begun under each arm
        self._untimed = self.WARMING  # step times still to drop (the cache is warming)
        self._begun: list[str] = []  # the arms of the last two steps begun (since an interrupt)

    def restart(self) -> None:
        """Forget every step time and choice: explore both arms again, PCIe-only first."""
        self.__init__(self.first_layer, self.cpu_experts)

    def on_decode_call(self, layer: int, settled: bool = True, queued: bool = False) -> str:
        """Called at the start of every decode layer call; returns the arm for this call.
        `settled` (read at the first layer): False when the step that just ended did one-time
        work (a CUDA graph's first call or capture), so its time says nothing about its arm and
        is not counted. `queued`: this step is begun while the one before it still runs (`ft
        run` queues each step as the last one starts, once the one before that has ended), so
        the interval since the last step began is the time of the step before that one, which
        may have run under the other arm."""
        if layer != self.first_layer:
            return self.arm
        now = time.perf_counter()
        timed_arm = self._timed_arm(queued)
        if self._step_start is not None and settled and timed_arm is not None:
            if self._untimed > 0:
                self._untimed -= 1
            else:
                times = self.times[timed_arm]
                times.append(now - self._step_start)
                del times[: -self.KEEP]
                self._next_arm(timed_arm)
        self._step_start = now
        self.steps[self.arm] += 1
        self._begun = [*self._begun[-1:], self.arm]
        return self.arm

    def _timed_arm(self, queued: bool) -> str | None:
        """The arm of the step whose time the interval ending now is: the last step begun, or
        with `queued` the one before it (None: no such step since the last interrupt)."""
        back = 2 if queued else 1
        return self._begun[-back] if len(self._begun) >= back else None

    def interrupt(self) -> None:
        """A prefill or a pause between requests: the next interval is not a decode step, and
        the WARMING steps after it are not timed."""
        self._step_start = None
        self._untimed = self.WARMING
        self._begun = []

    @property
    def best(self) -> str:
        if self.model_idle:
            return PCIE_ONLY
        medians = {arm: statistics.median(t) for arm, t in self.times.items() if t}
        return min(medians, key=medians.get) if len(medians) == 2 else self.arm

    def summary(self) -> dict:
        """What the guard did: steps begun under each arm, the arm it would pick now, its
        switches, and each arm's median step time (ms) over the kept times."""
        return {"steps": dict(self.steps), "best": self.best, "switches": self.switches,
                "model_idle": self.model_idle,
                "median_ms": {arm: 1e3 * statistics.median(t) for arm, t in self.times.items() if t}}

    def _next_arm(self, timed_arm: str) -> None:
        """A step of `timed_arm` was timed: go on with the block of the current arm, or end it
        (EXPLORE steps, or a hopeless trial: only a time of the block's own arm can say so)."""
        self._in_block += 1
        if self._in_block < self.EXPLORE and not (timed_arm == self.arm and self._hopeless()):
            return
        self._in_block = 0
        self._blocks[self.arm] += 1
        if self.arm == MODEL:
            self._end_model_block()
        other = PCIE_ONLY if self.arm == MODEL else MODEL
        if not self.model_idle and min(self._blocks.values()) < self.ROUNDS and not self._decided_early():
            # still exploring: alternate blocks
            self._switch(other if self._blocks[other] < self.ROUNDS else self.arm)
            return
        self._since_choice += self.EXPLORE
        if self._since_choice >= self._revisit:  # one re-trial block of the arm that is behind
            self._since_choice = 0
            self._switch(PCIE_ONLY if self.best == MODEL else MODEL)
        else:
            self._switch(self.best)

    def _hopeless(self) -> bool:
        """The step just timed is DECISIVE times the other arm's median (over a whole block)."""
        other = self.times[MODEL if self.arm == PCIE_ONLY else PCIE_ONLY]
        return len(other) >= self.EXPLORE and self.times[self.arm][-1] >= self.DECISIVE * statistics.median(other)

    def _decided_early(self) -> bool:
        """After a block of each arm: one is DECISIVE times slower (a trial step of the losing arm
        costs that much; on the H200 a model-arm step at 32 GiB took 2.7x a PCIe-only one)."""
        if min(self._blocks.values()) < 1:
            return False
        medians = sorted(statistics.median(t) for t in self.times.values() if t)
        return len(medians) == 2 and medians[1] >= self.DECISIVE * medians[0]

    def _end_model_block(self) -> None:
        """A model-arm block ended: did it send anything to the CPU?"""
        if self.cpu_experts is None or self._cpu_at_block_start is None:
            return
        idle = self.cpu_experts() == self._cpu_at_block_start
        self._revisit = min(2 * self._revisit, self.MAX_REVISIT) if idle else self.REVISIT
        self.model_idle = idle

    def _switch(self, arm: str) -> None:
        if arm == MODEL and self.cpu_experts is not None:
            self._cpu_at_block_start = self.cpu_experts()
        if arm != self.arm:
            self.switches += 1
            self.arm = arm
