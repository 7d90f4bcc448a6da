"""The expert-fill Triton kernel (zero-copy PCIe fills planned on the device) against its torch twin.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py); with CUDA the bank is pinned, as
the runtime pins it, and the kernel reads it over PCIe.
"""

from __future__ import annotations

import pytest
import torch

from runtime.gpu.kernels import PCIE, route_plan_ref
from runtime.gpu.kernels.expert_fill_ref import expert_fill_ref
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

expert_fill = import_kernel("expert_fill", "expert_fill")
needs_triton = needs(expert_fill)


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


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@needs_triton
def test_cuda_real_shape_fills_from_a_pinned_bank() -> None:
    """Qwen3-30B records (9 MiB), 8 routed, 5 over PCIe into a 480-slot cache, read from a bank
    pinned the way the runtime pins it (cudaHostRegister)."""
    from ftw.reader import page_aligned_empty
    from runtime.gpu.host_memory import HostPinner

    stride, num_experts = 9_437_184, 16
    bank = page_aligned_empty(num_experts * stride).view(num_experts, stride)
    bank.copy_(torch.randint(0, 256, (num_experts, stride), dtype=torch.uint8))
    pinner = HostPinner()
    assert pinner.pin(bank)
    try:
        plan = plan_for([[3, 9, 1, 14, 7, 0, 12, 5]], num_experts, 480, n_pcie=5, cached={7: 100, 0: 200, 12: 300})
        slots = torch.zeros(480, stride, dtype=torch.uint8, device="cuda")
        expert_fill(plan, bank, slots)
        torch.cuda.synchronize()
        filled = [(u, s) for u, (st, s) in enumerate(zip(plan.status.tolist(), plan.slot.tolist(), strict=True)) if st == PCIE]
        assert len(filled) == 5
        for u, slot in filled:
            assert torch.equal(slots[slot].cpu(), bank[plan.unique_ids[u].item()])
    finally:
        pinner.close()
