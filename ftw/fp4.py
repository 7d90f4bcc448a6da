"""DeepSeek-V4's FP4 experts (config `expert_dtype` "fp4"), kept FP4 as FTW's GGML `mxfp4` blocks.

The release stores each routed expert's weight [rows, cols] as int8 [rows, cols / 2], two e2m1
values a byte (the even element in the low nibble), and its `.scale` as e8m0 [rows, cols / 32],
one power of two (biased by 127) per 32 values of a row: MXFP4's numbers in another layout
(transformers' Fp8Dequantize._unpack_fp4 reads them so). GGML's `mxfp4` block holds the same 32
values as one exponent byte then 16 bytes, element j in the low nibble of byte j and element
j + 16 in its high nibble, worth e2m1 x 2 ** (e - 127) as well (gguf-py's MXFP4, whose table is
doubled and exponent halved). So `to_mxfp4_rows` only moves nibbles: nothing is rounded, the
experts keep their 4.25 bits a weight, and the runtime reads them as GGUF's mxfp4 experts.
"""

from __future__ import annotations

import numpy as np

from .mxfp4 import MXFP4_BLOCK, dequantize_mxfp4

PACKED_DTYPES = ("i8", "u8")  # how safetensors headers type the nibble pairs (I8 in the release)
SCALE_DTYPES = ("f8_e8m0", "u8")


def fp4_shapes(rows: int, cols: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (packed weight, scale) shapes of one [rows, cols] FP4 weight; ValueError if cols is no
    whole number of 32-value blocks."""
    if cols % MXFP4_BLOCK:
        raise ValueError(f"an FP4 weight's rows are whole blocks of {MXFP4_BLOCK} values, not {cols}")
    return (rows, cols // 2), (rows, cols // MXFP4_BLOCK)


def to_mxfp4_rows(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """packed uint8 [rows, cols / 2] and scales uint8 [rows, cols / 32] -> the weight's GGML mxfp4
    bytes, uint8 [rows, cols / 32 * 17] (row-major: what FTW stores for an mxfp4 [rows, cols])."""
    rows, groups = scales.shape
    pairs = packed.reshape(rows, groups, MXFP4_BLOCK // 2)
    codes = np.empty((rows, groups, MXFP4_BLOCK), dtype=np.uint8)
    codes[..., 0::2], codes[..., 1::2] = pairs & 0x0F, pairs >> 4
    half = MXFP4_BLOCK // 2
    out = np.empty((rows, groups, 1 + half), dtype=np.uint8)
    out[..., 0] = scales
    out[..., 1:] = codes[..., :half] | (codes[..., half:] << 4)
    return out.reshape(rows, -1)


def dequantize_fp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """packed uint8 [rows, cols / 2] and scales uint8 [rows, cols / 32] -> float32 [rows, cols] (exact)."""
    rows, groups = scales.shape
    return dequantize_mxfp4(packed.reshape(rows, groups, MXFP4_BLOCK // 2), scales)
