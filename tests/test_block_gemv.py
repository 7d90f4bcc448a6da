"""GGML block-quant rows times vectors, read in place from cache slots (runtime/gpu/kernels/block_gemv.py),
against ggml_blocks.dequantize_blocks (itself bit-exact with gguf-py) and a float32 matmul; and a
GGUF layout's decode experts through slot_compute's block path against the gather path.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py). The two
differ only in float32 summation order (and a fused multiply-add in d x q - dm)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from runtime.experts.ggml_blocks import dequantize_blocks
from runtime.experts.synthetic import quantize_kquant
from tests.kernels import DEVICE, gathered_pairs, import_kernel, needs

block_gemv = import_kernel("block_gemv", "block_gemv")
needs_triton = needs(block_gemv)


def _blocks(w: np.ndarray, kind: str) -> np.ndarray:
    if kind.endswith("_k"):
        return quantize_kquant(w, kind)
    return np.ascontiguousarray(quantize(w, GGMLQuantizationType[kind.upper()]))


@needs_triton
@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k", "q8_0"])
@pytest.mark.parametrize(("input_dtype", "cols", "tile"), [(torch.bfloat16, 512, None), (torch.float32, 768, None),
                                                           (torch.float32, 768, (16, 2, 4))])
def test_rows_times_inputs_as_the_dequantized_weights(kind: str, input_dtype: torch.dtype, cols: int, tile) -> None:
    """Three slots of one part each (at an offset, slots wider than the part), five pairs reading
    them in any order and one left to the CPU (slot -1: zeros), 40 rows (not a whole tile); rows of
    3 super-blocks read 4 (or 2, twice) side by side, the spare ones masked."""
    rows, offset = 40, 256
    rng = np.random.default_rng(3)
    parts = [_blocks(rng.standard_normal((rows, cols)).astype(np.float32), kind) for _ in range(3)]
    nbytes = parts[0].size
    slots = torch.full((3, offset + nbytes + 512), 0xFF, dtype=torch.uint8)  # NaN-ish bytes beside the parts
    for s, raw in enumerate(parts):
        slots[s, offset: offset + nbytes] = torch.from_numpy(raw.reshape(-1))
    inputs = torch.randn(3, cols, generator=torch.Generator().manual_seed(4)).to(input_dtype)
    slot_of = torch.tensor([2, -1, 0, 2, 1], dtype=torch.int32)
    index = torch.tensor([0, 1, 2, 1, 0], dtype=torch.int32)
    ours = block_gemv(inputs.to(DEVICE), index.to(DEVICE), slots.to(DEVICE), slot_of.to(DEVICE), part_offset=offset,
                      kind=kind, rows=rows, cols=cols, tile=tile).cpu()
    weights = dequantize_blocks(slots[:, offset: offset + nbytes], kind, (rows, cols))  # [3, rows, cols]
    for p, (s, i) in enumerate(zip(slot_of.tolist(), index.tolist(), strict=True)):
        if s < 0:
            assert torch.equal(ours[p], torch.zeros(rows))
            continue
        ref = weights[s] @ inputs[i].float()
        torch.testing.assert_close(ours[p], ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@needs_triton
def test_a_part_that_does_not_fit_the_slot_is_refused() -> None:
    slots = torch.zeros(2, 1000, dtype=torch.uint8, device=DEVICE)
    one = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    x = torch.zeros(1, 256, device=DEVICE)
    with pytest.raises(ValueError, match="does not fit a 1000-byte slot"):
        block_gemv(x, one, slots, one, part_offset=0, kind="q4_k", rows=8, cols=256)
    with pytest.raises(ValueError, match="multiple of 256"):
        block_gemv(torch.zeros(1, 100, device=DEVICE), one, slots, one, part_offset=0, kind="q4_k", rows=1, cols=100)
    with pytest.raises(ValueError, match="not q2_k"):
        block_gemv(x, one, slots, one, part_offset=0, kind="q2_k", rows=1, cols=256)
    with pytest.raises(ValueError, match="4-byte aligned"):  # Q4_K is read as int32 words
        block_gemv(x, one, slots, one, part_offset=2, kind="q4_k", rows=1, cols=256)


@needs_triton
@pytest.mark.parametrize("dtypes", [("q4_k", None, "q6_k"), ("q8_0", None, None), ("q4_k", "q5_k", "q6_k")])
def test_gguf_decode_experts_from_slots_as_the_gather_path(dtypes) -> None:
    """A Q4_K_M-style layout (w13 Q4_K, w2 Q6_K), Q8_0, and gate and up of two types stored apart
    (w1, w3): slot_compute's block path against the dequantize-and-matmul gather path, in float32."""
    from runtime.experts.synthetic import random_bank
    from runtime.gpu.records import RecordViews
    from runtime.gpu.slot_compute import block_parts, block_slot_experts

    gate, up, down = dtypes
    hidden, inter = 512, 256
    bank = random_bank(gate, 6, hidden, inter, seed=5, up_dtype=up, down_dtype=down)
    parts = block_parts(bank.layout, {"q4_k", "q5_k", "q6_k", "q8_0"})
    assert parts is not None and ("w1" in parts) == (up is not None)
    slots = torch.cat([bank.data[[4, 1, 3]], torch.full((3, 64), 0xFF, dtype=torch.uint8)], dim=1)  # wider slots
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, hidden, generator=gen)
    token = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32)
    slot = torch.tensor([2, -1, 0, 1, 2, -1], dtype=torch.int32)  # two pairs left to the CPU
    weight = torch.softmax(torch.randn(6, generator=gen), 0)
    out = torch.zeros(2, hidden, device=DEVICE)
    block_slot_experts(x.to(DEVICE), token.to(DEVICE), slot.to(DEVICE), weight.to(DEVICE), slots.to(DEVICE), parts,
                       torch.float32, out, block_gemv)
    ours = out.cpu()
    views = RecordViews(slots, bank.layout)
    ref = gathered_pairs(views, x, token, slot, weight)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


@needs_triton
def test_mxfp4_rows_of_blocks_that_are_no_whole_super_block() -> None:
    """gpt-oss's MXFP4 (rows of 32-value blocks: 2880 is 90 of them, no whole 256-value
    super-block): 11 blocks a row, so the kernel's last step of eight is masked, against gguf-py's
    blocks dequantized."""
    rows, cols, offset = 40, 352, 34
    rng = np.random.default_rng(7)
    parts = [_blocks(rng.standard_normal((rows, cols)).astype(np.float32), "mxfp4") for _ in range(2)]
    nbytes = parts[0].size
    assert nbytes == rows * cols // 32 * 17
    slots = torch.full((2, offset + nbytes + 40), 0xFF, dtype=torch.uint8)
    for s, raw in enumerate(parts):
        slots[s, offset: offset + nbytes] = torch.from_numpy(raw.reshape(-1))
    inputs = torch.randn(2, cols, generator=torch.Generator().manual_seed(8))
    slot_of, index = torch.tensor([1, 0, -1], dtype=torch.int32), torch.tensor([0, 1, 1], dtype=torch.int32)
    ours = block_gemv(inputs.to(DEVICE), index.to(DEVICE), slots.to(DEVICE), slot_of.to(DEVICE), part_offset=offset,
                      kind="mxfp4", rows=rows, cols=cols).cpu()
    weights = dequantize_blocks(slots[:, offset: offset + nbytes], "mxfp4", (rows, cols))
    for p, (s, i) in enumerate(zip(slot_of.tolist(), index.tolist(), strict=True)):
        if s < 0:
            assert torch.equal(ours[p], torch.zeros(rows))
            continue
        ref = weights[s] @ inputs[i]
        torch.testing.assert_close(ours[p], ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    with pytest.raises(ValueError, match="multiple of 32"):
        block_gemv(inputs[:, :100].contiguous().to(DEVICE), index.to(DEVICE), slots.to(DEVICE), slot_of.to(DEVICE),
                   part_offset=0, kind="mxfp4", rows=1, cols=100)


@needs_triton
def test_gpt_oss_style_mxfp4_experts_with_biases_from_slots_as_the_gather_path() -> None:
    """MXFP4 records with gate|up and down biases and the clamped SwiGLU (a gpt-oss GGUF's experts):
    the block path reads the weights in place and adds the biases, as the gather path computes them."""
    from ftw.format import ExpertActivation
    from runtime.experts.synthetic import random_bank
    from runtime.gpu.records import RecordViews
    from runtime.gpu.slot_compute import block_parts, block_slot_experts, pair_biases

    block_module = __import__("runtime.gpu.kernels.block_gemv", fromlist=["KINDS"])
    hidden, inter = 352, 96
    clamped = ExpertActivation("swiglu_clamped", 1.702, 7.0)
    bank = random_bank("mxfp4", 5, hidden, inter, seed=9, activation=clamped, bias_dtype="f32")
    parts = block_parts(bank.layout, block_module.KINDS, block_module.VALUES_PER_BLOCK)
    assert parts is not None and set(parts) == {"w13", "w2"}
    assert block_parts(bank.layout, block_module.KINDS) is None  # (352 values: no whole super-blocks)
    slots = bank.data[[3, 0, 4]].clone()
    gen = torch.Generator().manual_seed(10)
    x = torch.randn(2, hidden, generator=gen)
    token = torch.tensor([0, 0, 1, 1], dtype=torch.int32)
    slot = torch.tensor([2, 0, -1, 1], dtype=torch.int32)
    weight = torch.softmax(torch.randn(4, generator=gen), 0)
    out = torch.zeros(2, hidden, device=DEVICE)
    biases = pair_biases(slots.to(DEVICE), slot.to(DEVICE), bank.layout)
    block_slot_experts(x.to(DEVICE), token.to(DEVICE), slot.to(DEVICE), weight.to(DEVICE), slots.to(DEVICE), parts,
                       torch.float32, out, block_gemv, clamped, biases)
    ref = gathered_pairs(RecordViews(slots, bank.layout), x, token, slot, weight)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
