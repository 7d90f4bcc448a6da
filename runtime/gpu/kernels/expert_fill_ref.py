"""Plain-torch twin of the expert-fill kernel, and the fill used where the kernel cannot run.

For every row u of a RoutePlan with status PCIE: slots[slot[u], :stride] = bank[unique_ids[u]].
The plan is read on the host (a sync on CUDA), then each record is one copy; with a CUDA
device and a host bank the copies are asynchronous on the current stream (fast only when
the bank is pinned; a pageable bank is the slow fallback when pinning was refused).
"""

from __future__ import annotations

import torch

from .route_plan_ref import PCIE, RoutePlan


def expert_fill_ref(plan: RoutePlan, bank: torch.Tensor, slots: torch.Tensor) -> int:
    """Copy the PCIE rows' records into their slots; returns how many were copied."""
    status = plan.status.tolist()
    rows = [u for u, s in enumerate(status) if s == PCIE]
    if not rows:
        return 0
    experts, targets = plan.unique_ids.tolist(), plan.slot.tolist()
    stride = bank.shape[1]
    for u in rows:
        slots[targets[u], :stride].copy_(bank[experts[u]], non_blocking=True)
    return len(rows)
