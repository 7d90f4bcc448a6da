"""Block-scaled FP8 rows times vectors, read in place from cache slots (runtime/gpu/kernels/fp8_gemv.py),
against records.dequantize_fp8 and a float32 matmul; every byte pattern decoded as torch's FP8
types decode it; and FP8 decode experts through slot_compute's FP8 path against the gather path.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels import DEVICE, gathered_pairs, import_kernel, needs

fp8_gemv = import_kernel("fp8_gemv", "fp8_gemv")
needs_triton = needs(fp8_gemv)
TORCH_FP8 = {"f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}


@needs_triton
@pytest.mark.parametrize("kind", sorted(TORCH_FP8))
def test_every_byte_decodes_as_torch_does(kind: str) -> None:
    """Row r holds byte r in its first column and zeros after it (scales 1), times an input of
    ones: each output is one byte's value (NaN, and e5m2's infinities, as torch has them)."""
    part = torch.zeros(256, 128, dtype=torch.uint8)
    part[:, 0] = torch.arange(256, dtype=torch.uint8)
    slots = torch.cat([part.reshape(1, -1), torch.tensor([1.0, 1.0]).view(torch.uint8)[None]], dim=1)
    out = fp8_gemv(torch.ones(1, 128, device=DEVICE), torch.zeros(1, dtype=torch.int32, device=DEVICE),
                   slots.to(DEVICE), torch.zeros(1, dtype=torch.int32, device=DEVICE), part_offset=0,
                   scale_offset=256 * 128, kind=kind, rows=256, cols=128).cpu()[0]
    ref = torch.arange(256, dtype=torch.uint8).view(TORCH_FP8[kind]).float()
    finite = torch.isfinite(ref)
    assert torch.equal(out[finite], ref[finite])
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))


@needs_triton
@pytest.mark.parametrize("rows,cols", [(40, 256), (260, 200)])
def test_rows_times_inputs_as_the_dequantized_weights(rows: int, cols: int) -> None:
    """Scale blocks of 128 x 128 (rows and columns not whole blocks in the second), slots wider
    than the part, pairs in any order and one left to the CPU (zeros)."""
    from runtime.gpu.records import dequantize_fp8

    gen = torch.Generator().manual_seed(2)
    scale_shape = (-(-rows // 128), -(-cols // 128))
    w = (torch.randn(3, rows, cols, generator=gen) * 8).to(torch.float8_e4m3fn)
    scales = torch.rand(3, *scale_shape, generator=gen) + 0.5
    offset, scale_offset = 512, 512 + rows * cols + 64
    slots = torch.full((3, scale_offset + scales[0].numel() * 4 + 100), 0xFF, dtype=torch.uint8)
    slots[:, offset: offset + rows * cols] = w.view(torch.uint8).reshape(3, -1)
    slots[:, scale_offset: scale_offset + scales[0].numel() * 4] = scales.reshape(3, -1).view(torch.uint8)
    inputs = torch.randn(2, cols, generator=gen).to(torch.bfloat16)
    slot_of = torch.tensor([1, -1, 0, 2], dtype=torch.int32)
    index = torch.tensor([0, 1, 1, 0], dtype=torch.int32)
    ours = fp8_gemv(inputs.to(DEVICE), index.to(DEVICE), slots.to(DEVICE), slot_of.to(DEVICE), part_offset=offset,
                    scale_offset=scale_offset, kind="f8_e4m3", rows=rows, cols=cols).cpu()
    weights = dequantize_fp8(w, [scales], (128, 128))
    for p, (s, i) in enumerate(zip(slot_of.tolist(), index.tolist(), strict=True)):
        if s < 0:
            assert torch.equal(ours[p], torch.zeros(rows))
            continue
        ref = weights[s] @ inputs[i].float()
        torch.testing.assert_close(ours[p], ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@needs_triton
def test_parts_that_do_not_fit_are_refused() -> None:
    one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    slots = torch.zeros(1, 1000, dtype=torch.uint8, device=DEVICE)
    x = torch.zeros(1, 64, device=DEVICE)
    with pytest.raises(ValueError, match="do not fit a 1000-byte slot"):
        fp8_gemv(x, one, slots, one, part_offset=0, scale_offset=996, kind="f8_e4m3", rows=20, cols=64)
    with pytest.raises(ValueError, match="not bf16"):
        fp8_gemv(x, one, slots, one, part_offset=0, scale_offset=512, kind="bf16", rows=2, cols=64)


@needs_triton
@pytest.mark.parametrize("hidden,inter", [(256, 384), (200, 130)])
def test_fp8_decode_experts_from_slots_as_the_gather_path(hidden: int, inter: int) -> None:
    """An FP8 layout as FTW stores DeepSeek's (w13 and w2 e4m3, three scale parts; shapes that are
    not whole scale blocks in the second): slot_compute's FP8 path against the gather path, float32."""
    from runtime.experts.synthetic import random_bank
    from runtime.gpu.records import RecordViews
    from runtime.gpu.slot_compute import fp8_parts, fp8_slot_experts

    bank = random_bank("f8_e4m3", 5, hidden, inter, seed=3)
    parts = fp8_parts(bank.layout, {"f8_e4m3", "f8_e5m2"})
    assert parts is not None
    slots = torch.cat([bank.data[[2, 0, 4]], torch.full((3, 128), 0xFF, dtype=torch.uint8)], dim=1)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, hidden, generator=gen)
    token = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32)
    slot = torch.tensor([1, 2, -1, 0, 1, -1], dtype=torch.int32)
    weight = torch.softmax(torch.randn(6, generator=gen), 0)
    out = torch.zeros(2, hidden, device=DEVICE)
    views = RecordViews(slots, bank.layout)
    fp8_slot_experts(x.to(DEVICE), token.to(DEVICE), slot.to(DEVICE), weight.to(DEVICE), slots.to(DEVICE), parts,
                     views.block, torch.float32, out, fp8_gemv)
    ref = gathered_pairs(views, x, token, slot, weight)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    assert fp8_parts(random_bank("bf16", 2, 64, 32).layout, {"f8_e4m3"}) is None
