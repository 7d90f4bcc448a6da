"""Random expert banks laid out exactly as FTW stores them: for kernel tests and benchmarks."""

from __future__ import annotations

import numpy as np
import torch

from ftw import ExpertBank
from ftw.format import SWIGLU, ExpertActivation
from ftw.writer import plan_expert_parts

from .bank import HostExpertBank

FP8_BLOCK = (128, 128)
TORCH_FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}


def random_bank(dtype: str, num_experts: int, hidden_size: int, inter_size: int, *, layer: int = 0, seed: int = 0,
                num_distinct: int | None = None, fp8_scales: bool = True, up_dtype: str | None = None,
                down_dtype: str | None = None, activation: ExpertActivation = SWIGLU,
                bias_dtype: str | None = None) -> HostExpertBank:
    """A bank of `num_experts` random SwiGLU experts stored as `dtype` (f32, f16, bf16, f8_e4m3 /
    f8_e5m2 with 128x128 `weight_scale_inv` block scales when `fp8_scales`, or a GGML block quant
    such as q8_0, q4_k or mxfp4). `num_distinct` experts are drawn and repeated, so a large bank is
    quick to make. A GGUF-style mixed expert: `down_dtype` for w2 (Q4_K_M's Q6_K down), `up_dtype`
    for up (stored as w1 and w3 apart, as ftw/gguf_convert.py does when gate and up differ).
    `activation`: the experts' (gpt-oss's swiglu_clamped, ...; one not gated, Nemotron-H's relu2,
    has w13 [I, H] of up rows alone); `bias_dtype`: records with `w13_bias` [2I] and `w2_bias` [H]
    in it, as gpt-oss's."""
    gen = torch.Generator().manual_seed(seed)
    rows = activation.w13_rows(inter_size)
    if not activation.gated and (up_dtype not in (None, dtype) or (dtype.startswith("f8") and fp8_scales)):
        raise ValueError("experts that are not gated have one w13 (up rows) and no FP8 block scales here")
    records = [_expert(dtype, hidden_size, inter_size, gen, fp8_scales, up_dtype or dtype, down_dtype or dtype, rows)
               for _ in range(min(num_experts, num_distinct or num_experts))]
    if bias_dtype is not None:
        for record in records:
            for name, size in (("w13_bias", rows), ("w2_bias", hidden_size)):
                record[name] = (bias_dtype, (size,), _bytes(torch.randn(size, generator=gen).to(TORCH_FLOATS[bias_dtype])))
    parts, stride = plan_expert_parts((name, part_dtype, shape) for name, (part_dtype, shape, _) in records[0].items())
    quant = {"fp8_block": list(FP8_BLOCK), "scale": "weight_scale_inv"} if "w1_scale" in records[0] else {}
    layout = ExpertBank(layer=layer, num_experts=num_experts, expert_stride=stride, shard="synthetic", offset=0,
                        parts=parts, quant=quant, activation=activation)
    data = torch.zeros(num_experts, stride, dtype=torch.uint8)
    for e in range(num_experts):
        record = records[e % len(records)]
        for p in parts:
            data[e, p.offset : p.offset + p.nbytes] = record[p.name][2]
    return HostExpertBank(layer, layout, data)


def _expert(dtype: str, hidden: int, inter: int, gen: torch.Generator, fp8_scales: bool, up_dtype: str,
            down_dtype: str, rows: int | None = None) -> dict[str, tuple[str, tuple[int, ...], torch.Tensor]]:
    """name -> (dtype, logical shape, stored bytes), in FTW's part order; w13 of `rows` (2I by default)."""
    w13 = torch.randn(rows or 2 * inter, hidden, generator=gen) / hidden**0.5  # [2I, H]: gate rows, then up rows
    w2 = torch.randn(hidden, inter, generator=gen) / inter**0.5  # [H, I]
    if (up_dtype, down_dtype) != (dtype, dtype):
        if any(d.startswith("f8") for d in (dtype, up_dtype, down_dtype)):
            raise ValueError("mixed experts are GGUF's: float and GGML block dtypes, not FP8")
        w1, w3 = w13.chunk(2)
        parts = (("w1", dtype, w1), ("w3", up_dtype, w3), ("w2", down_dtype, w2)) if up_dtype != dtype else \
            (("w13", dtype, w13), ("w2", down_dtype, w2))
        return {name: (d, tuple(w.shape), _ggml_bytes(w, d)) for name, d, w in parts}
    if dtype in TORCH_FLOATS and not (dtype.startswith("f8") and fp8_scales):
        return {"w13": (dtype, tuple(w13.shape), _bytes(w13.to(TORCH_FLOATS[dtype]))),
                "w2": (dtype, tuple(w2.shape), _bytes(w2.to(TORCH_FLOATS[dtype])))}
    if dtype in TORCH_FLOATS:
        (q1, s1), (q3, s3), (q2, s2) = (_fp8_blocks(w, TORCH_FLOATS[dtype]) for w in (*w13.chunk(2), w2))
        return {"w13": (dtype, tuple(w13.shape), _bytes(torch.cat([q1, q3]))), "w2": (dtype, tuple(w2.shape), _bytes(q2)),
                "w1_scale": ("f32", tuple(s1.shape), _bytes(s1)), "w3_scale": ("f32", tuple(s3.shape), _bytes(s3)),
                "w2_scale": ("f32", tuple(s2.shape), _bytes(s2))}
    return {name: (dtype, tuple(w.shape), _ggml_bytes(w, dtype)) for name, w in (("w13", w13), ("w2", w2))}


def _ggml_bytes(w: torch.Tensor, dtype: str) -> torch.Tensor:
    """`w` stored as `dtype` (a float dtype, or a GGML block quant), flat bytes."""
    if dtype in TORCH_FLOATS:
        return _bytes(w.to(TORCH_FLOATS[dtype]))
    if dtype in KQUANT_LEVELS:  # gguf-py has no K-quant quantizer
        return torch.from_numpy(quantize_kquant(w.numpy(), dtype)).reshape(-1)
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    return torch.from_numpy(quantize(w.numpy().astype(np.float32), GGMLQuantizationType[dtype.upper()])).reshape(-1)


KQUANT_LEVELS = {"q4_k": 15, "q5_k": 31, "q6_k": 63}


def quantize_kquant(w: np.ndarray, dtype: str) -> np.ndarray:
    """Rows of `w` (columns a multiple of 256) as GGML q4_k / q5_k / q6_k blocks, uint8 [rows, row
    bytes]: a plain round-to-nearest quantizer (per sub-block min and max, llama.cpp searches for
    better scales), valid input for any K-quant reader. gguf-py's dequantize is the oracle of the layout."""
    rows, cols = w.shape
    x = w.astype(np.float32).reshape(-1, 256)  # super-blocks
    if dtype == "q6_k":
        groups = x.reshape(-1, 16, 16)
        group_scale = np.abs(groups).max(-1) / 31  # q in -32..31
        d = (group_scale.max(-1) / 127).astype(np.float16)
        scales = np.clip(np.rint(_div(group_scale, d.astype(np.float32)[:, None])), 0, 127)
        q = np.clip(np.rint(_div(groups, (d.astype(np.float32)[:, None] * scales)[..., None])), -32, 31) + 32
        q = q.astype(np.uint8).reshape(-1, 2, 4, 32)  # [block, half, quarter, 32]
        low = q & 0xF
        ql = np.concatenate([low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1)
        qh = (q[:, :, 0] >> 4) | ((q[:, :, 1] >> 4) << 2) | ((q[:, :, 2] >> 4) << 4) | ((q[:, :, 3] >> 4) << 6)
        blocks = [ql.reshape(-1, 128), qh.reshape(-1, 64), scales.astype(np.int8).view(np.uint8),
                  d.view(np.uint8).reshape(-1, 2)]
    else:
        top = KQUANT_LEVELS[dtype]
        subs = x.reshape(-1, 8, 32)
        low = np.minimum(subs.min(-1), 0)
        sub_scale, sub_min = (subs.max(-1) - low) / top, -low
        d, dmin = (sub_scale.max(-1) / 63).astype(np.float16), (sub_min.max(-1) / 63).astype(np.float16)
        sc = np.clip(np.rint(_div(sub_scale, d.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
        mn = np.clip(np.rint(_div(sub_min, dmin.astype(np.float32)[:, None])), 0, 63).astype(np.uint8)
        step = d.astype(np.float32)[:, None] * sc
        offset = dmin.astype(np.float32)[:, None] * mn
        q = np.clip(np.rint(_div(subs + offset[..., None], step[..., None])), 0, top).astype(np.uint8)
        packed = np.concatenate([sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                                 (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)], axis=-1)
        qs = ((q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)).reshape(-1, 128)  # sub-blocks 2c, 2c + 1 share bytes
        blocks = [d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), packed]
        if dtype == "q5_k":
            fifth = (q >> 4) & 1  # [block, sub-block, 32]
            blocks.append(np.bitwise_or.reduce(fifth << np.arange(8, dtype=np.uint8)[None, :, None], axis=1))
        blocks.append(qs)
    return np.concatenate(blocks, axis=-1).astype(np.uint8).reshape(rows, -1)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, 0 where b is 0 (an all-zero block)."""
    return np.divide(a, b, out=np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=np.float32), where=b != 0)


def _fp8_blocks(w: torch.Tensor, fp8: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 weights and their float32 block scales (DeepSeek's weight_scale_inv: w ~ q * scale)."""
    rows, cols = w.shape
    br, bc = FP8_BLOCK
    nr, nc = -(-rows // br), -(-cols // bc)
    padded = torch.zeros(nr * br, nc * bc)
    padded[:rows, :cols] = w
    amax = padded.view(nr, br, nc, bc).abs().amax(dim=(1, 3)).clamp(min=1e-12)  # [nr, nc]
    scale = amax / torch.finfo(fp8).max
    q = (w / scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:rows, :cols]).to(fp8)
    return q, scale.float()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(-1)
