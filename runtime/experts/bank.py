"""HostExpertBank: one MoE layer's experts in host memory, exactly as FTW lays them out."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ftw import ExpertBank
from ftw.reader import torch_dtype_of

from .dequant import dequantize


@dataclass(frozen=True)
class HostExpertBank:
    """`data` is uint8 [num_experts, expert_stride]: expert e is row e (one contiguous record)."""

    layer: int
    layout: ExpertBank
    data: torch.Tensor

    @property
    def num_experts(self) -> int:
        return self.layout.num_experts

    def record(self, expert: int) -> torch.Tensor:
        """The raw bytes of one expert: what a cache fill copies."""
        return self.data[expert]

    def raw_part(self, expert: int, name: str) -> torch.Tensor:
        """A part as stored: typed for float/fp8 dtypes, raw uint8 rows for block quants."""
        p = self.layout.part(name)
        raw = self.data[expert, p.offset : p.offset + p.nbytes]
        dtype = torch_dtype_of(p.dtype)
        if dtype == torch.uint8:
            return raw.view(*p.shape[:-1], -1)
        return raw.view(dtype).view(p.shape)

    def biases(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(w13_bias [2I], w2_bias [H]) of one expert in `dtype`, where the records have them (gpt-oss)."""
        if not self.has_part("w13_bias"):
            return None
        return self.raw_part(expert, "w13_bias").to(dtype), self.raw_part(expert, "w2_bias").to(dtype)

    def has_part(self, name: str) -> bool:
        return any(p.name == name for p in self.layout.parts)

    def stored_as(self, dtype: torch.dtype) -> bool:
        """Whether every weight is stored in `dtype`, unscaled: `weights` then returns views, no copy."""
        parts = [p for p in self.layout.parts if not p.name.endswith("_scale")]
        return len(parts) == len(self.layout.parts) and all(torch_dtype_of(p.dtype) == dtype for p in parts)

    def weights(self, expert: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H], w2 [H, I]) of one expert in `dtype`, dequantized if needed (reference path)."""
        if self.has_part("w13"):
            w13 = self._dequantized(expert, "w13", "w1_scale", "w3_scale", dtype)
        else:  # GGUF experts whose gate and up differ in type are stored as w1 and w3
            w13 = torch.cat([self._dequantized(expert, "w1", None, None, dtype),
                             self._dequantized(expert, "w3", None, None, dtype)])
        return w13, self._dequantized(expert, "w2", "w2_scale", None, dtype)

    def _dequantized(self, expert: int, name: str, scale: str | None, scale2: str | None, dtype: torch.dtype) -> torch.Tensor:
        p = self.layout.part(name)
        scales = None
        if scale is not None and self.has_part(scale):
            scales = [self.raw_part(expert, scale)] + ([self.raw_part(expert, scale2)] if scale2 else [])
        return dequantize(self.raw_part(expert, name), p.dtype, p.shape, dtype,
                          scales=scales, block=tuple(self.layout.quant.get("fp8_block", (128, 128))))
