"""VramGovernor: the expert cache's size follows the VRAM budget and the device's free memory."""

from __future__ import annotations

import pytest

from runtime.gpu.elastic import VramGovernor

MiB = 1 << 20
SLOT = 10 * MiB


class Device:
    """A fake device: `free` is what another program leaves us."""

    def __init__(self, free: int, total: int = 8192 * MiB) -> None:
        self.free, self.total = free, total

    def __call__(self) -> tuple[int, int]:
        return self.free, self.total


def governor(device: Device | None = None, **kw) -> VramGovernor:
    # budget 1000 MiB: 400 MiB of dense weights, KV and workspace + 60 slots of 10 MiB; floor 16 slots
    return VramGovernor(slot_bytes=SLOT, budget_bytes=1000 * MiB, cache_slots=60, min_slots=16, probe=device,
                        reserve_bytes=100 * MiB, check_every_s=0.0, **kw)


def test_a_new_budget_is_applied_once_at_the_next_safe_point() -> None:
    g = governor()
    assert g.poll(60) is None
    assert g.set_budget(1200 * MiB) == 80  # the other 400 MiB stay what they were
    assert g.poll(60) == 80
    assert g.poll(80) is None
    assert g.set_budget(600 * MiB) == 20
    assert g.poll(80) == 20
    assert g.events == ["expert cache 60 -> 80 slots (800.0 MiB)", "expert cache 80 -> 20 slots (200.0 MiB)"]


def test_a_budget_under_one_tokens_experts_is_refused_with_numbers() -> None:
    g = governor()
    with pytest.raises(ValueError, match=r"leaves 15 expert slots, fewer than one token's experts \(16 slots of "
                                         r"10.0 MiB\); give at least 560.0 MiB"):
        g.set_budget(550 * MiB)
    assert g.poll(60) is None  # nothing changed


def test_another_program_takes_memory_then_gives_it_back() -> None:
    device = Device(free=500 * MiB)
    g = governor(device)
    assert g.poll(60) is None  # room to spare, and already at the budget
    device.free = 40 * MiB  # another program took memory: 60 MiB under the reserve
    assert g.poll(60) == 54  # give back 6 slots
    device.free = 100 * MiB  # exactly the reserve: stay
    assert g.poll(54) is None
    device.free = 135 * MiB  # 35 MiB over the reserve: 3 slots back
    assert g.poll(54) == 57
    device.free = 900 * MiB  # all back: up to the budget, not beyond
    assert g.poll(57) == 60


def test_never_under_the_floor_and_says_why(caplog) -> None:
    device = Device(free=0)  # 100 MiB short: 10 slots to give back
    g = governor(device)
    assert g.poll(60) == 50
    assert g.poll(20) == 16  # 20 - 10 would be under one token's experts
    assert "stays at one token's experts (16 slots)" in caplog.text
    assert g.poll(16) is None


def test_free_memory_is_read_at_most_every_check_interval() -> None:
    now = [0.0]
    device = Device(free=500 * MiB)
    g = VramGovernor(slot_bytes=SLOT, budget_bytes=1000 * MiB, cache_slots=60, min_slots=16, probe=device,
                     reserve_bytes=100 * MiB, check_every_s=0.5, clock=lambda: now[0])
    assert g.poll(60) is None
    device.free = 0
    now[0] = 0.2
    assert g.poll(60) is None  # not checked yet
    now[0] = 0.6
    assert g.poll(60) == 50
