"""VramGovernor: the expert cache's size follows the VRAM budget and the device's free memory."""

from __future__ import annotations

import pytest

from runtime.gpu.elastic import VramGovernor

MiB = 1 << 20
SLOT = 10 * MiB


class Device:
    """A fake device: `free` is what nobody holds, `held` what this process's allocator holds."""

    def __init__(self, free: int, held: int = 900 * MiB) -> None:
        self.free, self.held = free, held

    def __call__(self) -> tuple[int, int]:
        return self.free, self.held


def governor(device: Device | None = None, **kw) -> VramGovernor:
    # budget 1000 MiB: 400 MiB of dense weights, KV and workspace + 60 slots of 10 MiB; floor 16 slots
    return VramGovernor(slot_bytes=SLOT, budget_bytes=1000 * MiB, cache_slots=60, min_slots=16, probe=device,
                        check_every_s=0.0, **kw)


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
    with pytest.raises(ValueError, match="a positive size"):
        g.set_budget(-2 * MiB)
    assert g.poll(60) is None  # nothing changed


def test_another_program_takes_memory_then_gives_it_back() -> None:
    device = Device(free=2000 * MiB)
    g = governor(device)
    assert g.poll(60) is None  # room to spare, and already at the budget
    device.free = 40 * MiB  # another program took memory: 940 MiB left to us, 60 short of the budget
    assert g.poll(60) == 54
    device.free, device.held = 100 * MiB, 840 * MiB  # after the shrink the freed slots show as free...
    assert g.poll(54) is None  # ...and the target stays: it does not ratchet down
    device.free = 120 * MiB  # 20 MiB back: two slots
    assert g.poll(54) == 56
    device.free = 125 * MiB  # half a slot more: nothing to do
    assert g.poll(56) is None
    device.free = 5000 * MiB  # all back, and more: up to the budget, not beyond
    assert g.poll(56) == 60


def test_small_growth_waits_until_it_is_worth_a_rebuild() -> None:
    device = Device(free=0, held=400 * MiB + 300 * SLOT)
    g = VramGovernor(slot_bytes=SLOT, budget_bytes=400 * MiB + 400 * SLOT, cache_slots=400, min_slots=16,
                     probe=device, check_every_s=0.0)
    assert g.poll(400) == 300
    device.free = 5 * SLOT  # 5 slots back: under 300 // 32 = 9, not worth a rebuild
    assert g.poll(300) is None
    device.free = 12 * SLOT
    assert g.poll(300) == 312


def test_never_under_the_floor_and_says_why(caplog) -> None:
    device = Device(free=0, held=500 * MiB)  # room for 10 slots beside the 400 MiB of the rest
    g = governor(device)
    assert g.poll(60) == 16
    assert "the expert cache stays at 16 slots" in caplog.text
    assert g.poll(16) is None


def test_a_cache_loaded_under_the_floor_is_not_grown_when_memory_is_short(caplog) -> None:
    """The modes that do not fill the cache (and force) may load it under one token's experts:
    its budget holds what it holds, and with no memory free it stays, never grown to the floor."""
    device = Device(free=0, held=450 * MiB)  # the 400 MiB of the rest and 5 slots, nothing free
    g = VramGovernor(slot_bytes=SLOT, budget_bytes=450 * MiB, cache_slots=5, min_slots=16, other_bytes=400 * MiB,
                     probe=device, check_every_s=0.0)
    assert g.budget_slots == 5
    assert g.poll(5) is None
    assert "the expert cache stays at 5 slots" in caplog.text
    device.free = 100 * MiB  # memory back: the budget still holds 5
    assert g.poll(5) is None


def test_free_memory_is_read_at_most_every_check_interval() -> None:
    now = [0.0]
    device = Device(free=500 * MiB)
    g = VramGovernor(slot_bytes=SLOT, budget_bytes=1000 * MiB, cache_slots=60, min_slots=16, probe=device,
                     check_every_s=0.5, clock=lambda: now[0])
    assert g.poll(60) is None
    device.free = 0
    now[0] = 0.2
    assert g.poll(60) is None  # not checked yet
    now[0] = 0.6
    assert g.poll(60) == 50  # 900 MiB left to us: 50 slots beside the rest


def test_a_cache_holding_every_expert_leaves_the_rest_of_a_large_budget_alone(caplog) -> None:
    # a small model on a large GPU: the plan's cache holds all 16 experts and 400 MiB of the 100 GiB
    # budget go to dense weights, KV and workspace; the rest is unused, not taken by anything
    device = Device(free=100 * 1024 * MiB, held=600 * MiB)
    g = VramGovernor(slot_bytes=SLOT, budget_bytes=100 * 1024 * MiB, cache_slots=16, min_slots=4, probe=device,
                     check_every_s=0.0, other_bytes=400 * MiB, max_slots=16)
    assert g.budget_slots == 16
    assert g.poll(16) is None
    assert not caplog.records  # no warning that the budget is short
    assert g.set_budget(50 * 1024 * MiB) == 16  # more slots than experts would stay empty
    assert g.poll(16) is None
    device.free = 100 * MiB  # another program took almost everything: 700 MiB left to us
    assert g.poll(16) is None  # 30 slots fit: still every expert
    device.free = 0  # 600 MiB: 20 slots
    assert g.poll(16) is None
    device.held = 500 * MiB  # 10 slots fit
    assert g.poll(16) == 10
