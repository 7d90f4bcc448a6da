"""MXFP4 weights as gpt-oss's Hugging Face checkpoints ship them, dequantized.

A weight [rows, cols] is two tensors: `*_blocks` uint8 [rows, cols / 32, 16], 32 e2m1 values a
block, two a byte (the even element in the low nibble), and `*_scales` uint8 [rows, cols / 32],
each block's e8m0 exponent (a power of two, biased by 127). The value is
E2M1_VALUES[nibble] * 2 ** (scale - 127): transformers' `integrations/mxfp4.py`
(`convert_moe_packed_tensors`), which loads these checkpoints on the CPU by dequantizing them so.
Every such value is exact in bfloat16 (two significant bits, an exponent within its range), so
the converter stores the experts as bf16 without rounding anything; keeping the MXFP4 bytes in
place (FTW has the GGML `mxfp4` block type, with other nibble order) is separate work.
"""

from __future__ import annotations

import numpy as np

from .errors import SourceError
from .safetensors_source import SourceTensor

MXFP4_BLOCK = 32  # values per e8m0 exponent
BLOCK_BYTES = MXFP4_BLOCK // 2
SCALE_BIAS = 127
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                       dtype=np.float32)


def mxfp4_shapes(rows: int, cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The (blocks, scales) shapes of one [rows, cols] weight; ValueError if cols is no whole
    number of blocks."""
    if cols % MXFP4_BLOCK:
        raise ValueError(f"an MXFP4 weight's rows are whole blocks of {MXFP4_BLOCK} values, not {cols}")
    return (rows, cols // MXFP4_BLOCK, BLOCK_BYTES), (rows, cols // MXFP4_BLOCK)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks uint8 [rows, G, 16] and scales uint8 [rows, G] -> float32 [rows, G * 32]."""
    rows, groups, width = blocks.shape
    if width != BLOCK_BYTES or scales.shape != (rows, groups):
        raise ValueError(f"MXFP4 blocks {list(blocks.shape)} and scales {list(scales.shape)} do not pair: "
                         f"expected [rows, G, {BLOCK_BYTES}] and [rows, G]")
    values = np.empty((rows, groups, MXFP4_BLOCK), dtype=np.float32)
    values[..., 0::2] = E2M1_VALUES[blocks & 0x0F]
    values[..., 1::2] = E2M1_VALUES[blocks >> 4]
    exponents = scales.astype(np.int32) - SCALE_BIAS
    return np.ldexp(values, exponents[..., None]).reshape(rows, groups * MXFP4_BLOCK)


def check_mxfp4_pair(blocks: SourceTensor, scales: SourceTensor, num_experts: int, expected: tuple[int, int],
                     layer: int) -> None:
    """SourceError unless `blocks` and `scales` are the uint8 MXFP4 of [num_experts, *expected] weights."""
    try:
        want = [(num_experts, *shape) for shape in mxfp4_shapes(*expected)]
    except ValueError as e:
        raise SourceError(f"layer {layer}: {blocks.name}: {e}") from None
    for t, shape in zip((blocks, scales), want, strict=True):
        if t.dtype != "u8" or tuple(t.shape) != shape:
            raise SourceError(f"layer {layer}: {t.name} is {t.dtype} {list(t.shape)}, expected u8 {list(shape)} "
                              f"(MXFP4 of [{num_experts}, {expected[0]}, {expected[1]}])")
