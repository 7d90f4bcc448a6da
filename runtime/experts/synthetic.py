"""Random expert banks laid out exactly as FTW stores them: for kernel tests and benchmarks."""

from __future__ import annotations

import numpy as np
import torch

from ftw import ExpertBank
from ftw.writer import plan_expert_parts

from .bank import HostExpertBank

FP8_BLOCK = (128, 128)
TORCH_FLOATS = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                "f8_e4m3": torch.float8_e4m3fn, "f8_e5m2": torch.float8_e5m2}


def random_bank(dtype: str, num_experts: int, hidden_size: int, inter_size: int, *, layer: int = 0, seed: int = 0,
                num_distinct: int | None = None, fp8_scales: bool = True) -> HostExpertBank:
    """A bank of `num_experts` random SwiGLU experts stored as `dtype` (f32, f16, bf16, f8_e4m3 /
    f8_e5m2 with 128x128 `weight_scale_inv` block scales when `fp8_scales`, or a GGML block quant
    such as q8_0). `num_distinct` experts are drawn and repeated, so a large bank is quick to make."""
    gen = torch.Generator().manual_seed(seed)
    records = [_expert(dtype, hidden_size, inter_size, gen, fp8_scales) for _ in range(min(num_experts, num_distinct or num_experts))]
    parts, stride = plan_expert_parts((name, part_dtype, shape) for name, (part_dtype, shape, _) in records[0].items())
    quant = {"fp8_block": list(FP8_BLOCK), "scale": "weight_scale_inv"} if "w1_scale" in records[0] else {}
    layout = ExpertBank(layer=layer, num_experts=num_experts, expert_stride=stride, shard="synthetic", offset=0,
                        parts=parts, quant=quant)
    data = torch.zeros(num_experts, stride, dtype=torch.uint8)
    for e in range(num_experts):
        record = records[e % len(records)]
        for p in parts:
            data[e, p.offset : p.offset + p.nbytes] = record[p.name][2]
    return HostExpertBank(layer, layout, data)


def _expert(dtype: str, hidden: int, inter: int, gen: torch.Generator,
            fp8_scales: bool) -> dict[str, tuple[str, tuple[int, ...], torch.Tensor]]:
    """name -> (dtype, logical shape, stored bytes), in FTW's part order."""
    w13 = torch.randn(2 * inter, hidden, generator=gen) / hidden**0.5  # [2I, H]: gate rows, then up rows
    w2 = torch.randn(hidden, inter, generator=gen) / inter**0.5  # [H, I]
    if dtype in TORCH_FLOATS and not (dtype.startswith("f8") and fp8_scales):
        return {"w13": (dtype, tuple(w13.shape), _bytes(w13.to(TORCH_FLOATS[dtype]))),
                "w2": (dtype, tuple(w2.shape), _bytes(w2.to(TORCH_FLOATS[dtype])))}
    if dtype in TORCH_FLOATS:
        (q1, s1), (q3, s3), (q2, s2) = (_fp8_blocks(w, TORCH_FLOATS[dtype]) for w in (*w13.chunk(2), w2))
        return {"w13": (dtype, tuple(w13.shape), _bytes(torch.cat([q1, q3]))), "w2": (dtype, tuple(w2.shape), _bytes(q2)),
                "w1_scale": ("f32", tuple(s1.shape), _bytes(s1)), "w3_scale": ("f32", tuple(s3.shape), _bytes(s3)),
                "w2_scale": ("f32", tuple(s2.shape), _bytes(s2))}
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[dtype.upper()]
    return {name: (dtype, tuple(w.shape), torch.from_numpy(quantize(w.numpy().astype(np.float32), qtype)).reshape(-1))
            for name, w in (("w13", w13), ("w2", w2))}


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
