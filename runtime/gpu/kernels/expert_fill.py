"""Triton kernel that fills the expert cache's victim slots straight from pinned host memory.

The route plan (route_plan.py) chooses, on the device, which experts cross PCIe and into which
slots; the host never learns which ones, so it cannot issue the copies. This kernel does them:
the SMs read the host bank over PCIe (zero-copy: the bank is page-locked and mapped, so its
host address is valid on the device under unified addressing) and write the slots. A program
is one chunk of a record, for every plan row in turn: the fills of a decode call (a handful of
rows, most of them hits) cost one launch of stride / CHUNK programs, and a call with nothing to
fill costs those programs one look at the statuses.

Semantics: expert_fill_ref.py (the torch twin; it also serves off CUDA and for banks that are
not pinned, where it reads the plan on the host).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .route_plan_ref import PCIE, RoutePlan

CHUNK_WORDS = 4096  # int64 words per program: 32 KiB in flight per program


@triton.jit(do_not_specialize=["bank_addr", "stride_words", "slot_words", "n_rows"])
def _expert_fill_kernel(bank_addr, stride_words, unique_ptr, status_ptr, slot_ptr, slots_ptr, slot_words, n_rows,
                        CHUNK: tl.constexpr, PCIE_CODE: tl.constexpr):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < stride_words
    row = 0
    # while, not range: one compiled kernel for every plan size, and the interpreter's range()
    # over a runtime bound fails with numpy >= 2.4
    while row < n_rows:
        status = tl.load(status_ptr + row)
        if status == PCIE_CODE:
            expert = tl.load(unique_ptr + row).to(tl.int64)
            slot = tl.load(slot_ptr + row).to(tl.int64)
            src = (bank_addr + expert * stride_words * 8).to(tl.pointer_type(tl.int64))
            words = tl.load(src + offs, mask=mask)
            tl.store(slots_ptr + slot * slot_words + offs, words, mask=mask)
        row += 1


def expert_fill(plan: RoutePlan, bank: torch.Tensor, slots: torch.Tensor) -> None:
    """Copy bank row plan.unique_ids[u] into slots[plan.slot[u]] for every row u whose status is
    PCIE, on the current stream, with no host sync.

    bank: uint8 [E, stride] in page-locked, mapped host memory (HostPinner); slots: uint8
    [S, slot_bytes] on the device; stride and slot_bytes multiples of 8.
    """
    stride, slot_bytes = bank.shape[1], slots.shape[1]
    if stride % 8 or slot_bytes % 8 or stride > slot_bytes:
        raise ValueError(f"expert_fill: records of {stride} bytes into slots of {slot_bytes} (both multiples of 8)")
    if not bank.is_contiguous() or not slots.is_contiguous():
        raise ValueError("expert_fill: bank and slots must be contiguous")
    grid = (triton.cdiv(stride // 8, CHUNK_WORDS),)
    _expert_fill_kernel[grid](bank.data_ptr(), stride // 8, plan.unique_ids, plan.status, plan.slot,
                              slots.view(torch.int64), slot_bytes // 8, plan.status.numel(),
                              CHUNK=CHUNK_WORDS, PCIE_CODE=PCIE, num_warps=8)
