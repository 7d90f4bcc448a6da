"""The expert-fill Triton kernel (zero-copy PCIe fills planned on the device) against its torch twin.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (see test_route_plan.py for
why the variable must be set before the kernel module loads); with CUDA the bank is pinned, as
the runtime pins it, and the kernel reads it over PCIe.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from runtime.gpu.kernels import PCIE, route_plan_ref
from runtime.gpu.kernels.expert_fill_ref import expert_fill_ref

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"


def _import_kernel():
    name = "runtime.gpu.kernels.expert_fill"
    if not HAS_CUDA:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        return (importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)).expert_fill
    except ImportError:
        return None


expert_fill = _import_kernel()
needs_triton = pytest.mark.skipif(expert_fill is None, reason="triton is not installed")


def plan_for(ids: list[list[int]], num_experts: int, num_slots: int, n_pcie: int, cached: dict[int, int]):
    table = torch.full((num_experts,), -1, dtype=torch.int32)
    owner = torch.full((num_slots,), -1, dtype=torch.int32)
    last_used = torch.full((num_slots,), -1, dtype=torch.int64)
    for expert, slot in cached.items():
        table[expert], owner[slot], last_used[slot] = slot, expert, 0
    plan = route_plan_ref(torch.tensor(ids), 0, num_experts, table, owner, last_used, 1, n_pcie)
    return type(plan)(**{k: getattr(plan, k).to(DEVICE) for k in plan.__dataclass_fields__})


@needs_triton
@pytest.mark.parametrize("stride", [4096, 3 * 4096 + 8, 40 * 1024])
def test_kernel_fills_exactly_the_pcie_rows(stride: int) -> None:
    num_experts, num_slots = 9, 6
    gen = torch.Generator().manual_seed(stride)
    bank = torch.randint(0, 256, (num_experts, stride), dtype=torch.uint8, generator=gen)
    if HAS_CUDA:
        bank = bank.pin_memory()
    plan = plan_for([[3, 5, 1], [5, 7, 2]], num_experts, num_slots, n_pcie=3, cached={7: 4})
    assert plan.status.tolist().count(PCIE) == 3  # 3, 5, 1 fill; 7 hits; 2 goes to the CPU
    slot_bytes = stride + 4096
    ours = torch.randint(0, 256, (num_slots, slot_bytes), dtype=torch.uint8, generator=gen).to(DEVICE)
    ref = ours.clone()
    expert_fill(plan, bank, ours)
    assert expert_fill_ref(plan, bank.to(DEVICE) if not HAS_CUDA else bank, ref) == 3
    assert torch.equal(ours.cpu(), ref.cpu())  # the filled rows, and every other byte untouched
    for u, slot in enumerate(plan.slot.tolist()):
        if plan.status[u].item() == PCIE:
            assert torch.equal(ours[slot, :stride].cpu(), bank[plan.unique_ids[u].item()].cpu())


@needs_triton
def test_kernel_refuses_records_larger_than_slots() -> None:
    plan = plan_for([[1]], 2, 2, n_pcie=1, cached={})
    with pytest.raises(ValueError, match="records of 8192 bytes into slots of 4096"):
        expert_fill(plan, torch.zeros(2, 8192, dtype=torch.uint8), torch.zeros(2, 4096, dtype=torch.uint8, device=DEVICE))
