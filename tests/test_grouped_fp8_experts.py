"""Block-scaled FP8 prefill experts in two grouped launches (runtime/gpu/kernels/grouped_fp8_experts*.py):
the Triton kernel, reached through the dispatch CUDA takes (records.grouped_call), against its torch
twin and against the padded runs of records.experts_from_records (whole experts widened with
records.dequantize_fp8, then batched matmuls); and which kernel the dispatch picks.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors at tiny shapes (tests/kernels.py).
What is asserted, and why (as tests/test_grouped_block_experts.py):
- kernel vs twin: both multiply the same weights (each tile widened in registers is bit-equal to
  dequantize_fp8 rounded to the compute dtype: test_fp8_weights_are_widened_in_place) and round the
  activation once; they differ only in fp32 summation order. Within 1e-4 of max|out|.
- kernel vs padded runs: those round gate|up, silu(g) * u and each expert's output to the compute
  dtype too; within 2% of max|out| in bf16, a quarter of that in f16.
"""

from __future__ import annotations

import functools

import pytest
import torch

from runtime.experts.synthetic import random_bank
from runtime.gpu.kernels.grouped_fp8_experts_ref import fp8_weight, grouped_fp8_experts_ref
from runtime.gpu.records import (
    RecordViews,
    dequantize_fp8,
    grouped_call,
    grouped_kind,
)
from tests.kernels import (
    DEVICE,
    assert_matches_twin_and_padded_runs,
    import_kernel,
    needs,
    plan_args,
    routed_chunk,
)

grouped_fp8_experts = import_kernel("grouped_fp8_experts", "grouped_fp8_experts")
needs_triton = needs(grouped_fp8_experts)


def _setup(kind: str, hidden: int, inter: int, num_tokens: int = 20, experts: int = 6, top_k: int = 2):
    """An FP8 bank (128 x 128 scale blocks) and a chunk routed over it (tests/kernels.routed_chunk)."""
    return routed_chunk(random_bank(kind, experts, hidden, inter, seed=7), num_tokens, top_k)


@needs_triton
@pytest.mark.parametrize("kind,hidden,inter,dtype", [("f8_e4m3", 256, 192, torch.bfloat16),
                                                     ("f8_e4m3", 192, 256, torch.float16),
                                                     ("f8_e5m2", 128, 128, torch.bfloat16)])
def test_the_kernel_matches_its_twin_and_the_padded_runs(kind: str, hidden: int, inter: int, dtype: torch.dtype) -> None:
    """Uneven counts (a hot expert over two M tiles, partial tiles), an expert with no pair in the
    plan's lists, a bank row no pair routes to, record rows wider than a record, and sizes that are
    not whole scale blocks (192: a last block of 64)."""
    chunk = _setup(kind, hidden, inter)
    assert_matches_twin_and_padded_runs(chunk, dtype, grouped_fp8_experts, grouped_fp8_experts_ref,
                                        chunk[1].fp8_block_parts())


@needs_triton
@pytest.mark.parametrize("kind", ["f8_e4m3", "f8_e5m2"])
def test_fp8_weights_are_widened_in_place(kind: str) -> None:
    """The kernel's weight tiles are dequantize_fp8's values rounded to bf16, bit for bit: the down
    kernel with activations the identity reads the part back (out[c, h] = W2[h, c], one product)."""
    from runtime.gpu.kernels import grouped_fp8_experts as module

    hidden, inter = 192, 256
    bank = random_bank(kind, 2, hidden, inter, seed=9)
    data = bank.data.to(DEVICE)
    parts = RecordViews(data, bank.layout).fp8_block_parts()
    act = torch.eye(inter, dtype=torch.bfloat16, device=DEVICE)  # pair c: column c
    out = torch.zeros(inter, hidden, dtype=torch.float32, device=DEVICE)
    plan = [torch.tensor([value], device=DEVICE) for value in (1, 0, inter)]  # record row 1, all pairs
    module._down_kernel[(1, inter // 64, hidden // 64)](
        act, act.stride(0), data, data.stride(0), *parts["down"], *plan, torch.arange(inter, device=DEVICE),
        torch.ones(inter, device=DEVICE), out, out.stride(0), HIDDEN=hidden, INTER=inter, KIND=module.KINDS[kind],
        BR=128, BC=128, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, UPCAST=DEVICE != "cuda", **module.LAUNCH)
    w2 = fp8_weight(data.cpu(), 1, parts["down"], (hidden, inter), kind, (128, 128))
    assert torch.equal(out.cpu(), w2.to(torch.bfloat16).float().T)
    views = RecordViews(bank.data, bank.layout)  # the same values as the padded runs widen them
    assert torch.equal(w2, views.weights(slice(1, 2), torch.float32)[1][0])


def test_fp8_weight_is_dequantize_fp8() -> None:
    bank = random_bank("f8_e4m3", 2, 256, 192, seed=3)
    views = RecordViews(bank.data, bank.layout)
    parts = views.fp8_block_parts()
    w13, w2 = views.weights(slice(0, 2), torch.float32)
    for row in range(2):
        gate = fp8_weight(bank.data, row, parts["gate"], (192, 256), "f8_e4m3", (128, 128))
        up = fp8_weight(bank.data, row, parts["up"], (192, 256), "f8_e4m3", (128, 128))
        assert torch.equal(torch.cat([gate, up]), w13[row])
        assert torch.equal(fp8_weight(bank.data, row, parts["down"], (256, 192), "f8_e4m3", (128, 128)), w2[row])
    raw = bank.data[0, parts["down"][0]: parts["down"][0] + 256 * 192].view(torch.float8_e4m3fn).view(1, 256, 192)
    scale = bank.data[0, parts["down"][1]: parts["down"][1] + 4 * 2 * 2].view(torch.float32).view(1, 2, 2)
    assert torch.equal(dequantize_fp8(raw, [scale], (128, 128))[0], w2[0])


def test_the_dispatch_picks_the_fp8_kernel_for_block_scaled_records() -> None:
    def kind_of(dtype: str = "f8_e4m3", compute: torch.dtype = torch.bfloat16, hidden: int = 256, inter: int = 256,
                **bank) -> str | None:
        made = random_bank(dtype, 2, hidden, inter, **bank)
        return grouped_kind(RecordViews(made.data, made.layout), compute)

    for kind in ("f8_e4m3", "f8_e5m2"):
        for compute in (torch.bfloat16, torch.float16):
            assert kind_of(kind, compute) == "grouped_fp8_experts"
    assert kind_of(compute=torch.float32) is None  # the compute dtype is bf16 or f16
    assert kind_of(fp8_scales=False) is None  # FP8 without block scales
    assert kind_of(hidden=288) is None and kind_of(inter=96) is None  # not whole 64-value tiles
    made = random_bank("f8_e4m3", 2, 256, 256)
    views = RecordViews(made.data, made.layout)
    if grouped_fp8_experts is not None:
        call = grouped_call(views, torch.bfloat16)
        assert isinstance(call, functools.partial) and call.func is grouped_fp8_experts
        assert call.keywords == views.fp8_block_parts()


def test_bad_arguments_are_refused_with_what_is_wrong() -> None:
    records, views, plan, x, weights = _setup("f8_e4m3", 256, 256, experts=4)
    args = {**views.fp8_block_parts(), **plan_args(plan, weights, torch.bfloat16, idle_row=3)}
    out = torch.zeros(20, 256, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="x is"):
        grouped_fp8_experts_ref(x, records, **args, out=out)
    with pytest.raises(ValueError, match="do not fit"):
        grouped_fp8_experts_ref(x.bfloat16(), records, **{**args, "down": (records.shape[1] - 10, 0)}, out=out)
    with pytest.raises(ValueError, match="not q8_0"):
        grouped_fp8_experts_ref(x.bfloat16(), records, **{**args, "kind": "q8_0"}, out=out)
    with pytest.raises(ValueError, match="whole 64-value tiles"):
        grouped_fp8_experts_ref(x.bfloat16(), records, **{**args, "inter": 200}, out=out)
    with pytest.raises(ValueError, match="out is fp32"):
        grouped_fp8_experts_ref(x.bfloat16(), records, **args, out=out.bfloat16())
