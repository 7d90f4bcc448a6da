"""Loading an FTW model into memory: dense weights as compute tensors, experts as host banks.

Reads go in file order, straight into their final buffers (page-aligned, so O_DIRECT applies;
the GPU runtime passes pinned memory instead). Expert banks stay in the FTW layout: the same
bytes the CPU executor reads and a GPU cache fill copies, never a second copy in another format.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ftw import ExpertBank, FTWReader, TensorEntry
from ftw.families import weight_block_size
from ftw.format import BLOCK_DTYPES, storage_shape
from ftw.reader import page_aligned_empty, torch_dtype_of

from ..config import ModelConfig
from ..experts.bank import HostExpertBank
from ..experts.dequant import dequantize
from ..experts.ggml_blocks import dequantize_blocks

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
Allocator = Callable[[int], torch.Tensor]  # nbytes -> contiguous uint8 tensor


class MissingWeightError(KeyError):
    """A family asked for a tensor the model does not have."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class BlockWeight:
    """A dense [rows, cols] weight kept as `dtype_name` GGML rows (`data` uint8 [rows, row bytes]),
    multiplied in place by runtime/layers/block_weight.py."""

    data: torch.Tensor
    dtype_name: str
    shape: tuple[int, int]

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def to(self, device: torch.device | str, non_blocking: bool = False) -> BlockWeight:
        return BlockWeight(self.data.to(device, non_blocking=non_blocking), self.dtype_name, self.shape)

    def values(self, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [start, stop) dequantized (gguf-py's values) in `dtype`: [stop - start, cols]."""
        return dequantize_blocks(self.data[start:stop], self.dtype_name, (self.shape[1],)).to(dtype)


@dataclass
class ModelWeights:
    config: ModelConfig
    dense: dict[str, torch.Tensor]
    banks: dict[int, HostExpertBank]

    def get(self, name: str) -> torch.Tensor:
        try:
            return self.dense[name]
        except KeyError:
            raise MissingWeightError(
                f"the model has no tensor {name!r}; its files do not match its family ({self.config.family})"
            ) from None

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.dense.get(name)


def load_weights(reader: FTWReader, dtype: torch.dtype, allocate: Allocator = page_aligned_empty,
                 keep_float32: tuple[str, ...] = (),
                 keep_blocks: Callable[[str, str, int], bool] | None = None) -> ModelWeights:
    """Read every tensor of `reader`'s model: floats cast to `dtype` (except names ending in one
    of `keep_float32`, which stay float32), quantized dense weights dequantized (FP8 with its
    `weight_scale_inv`) but for the 2-d ones `keep_blocks(name, dtype, cols)` keeps as BlockWeight
    (the planner's rule: runtime/planner/footprint.keeps_blocks), expert banks kept as stored."""
    index = reader.index
    raw: dict[str, torch.Tensor] = {}
    banks: dict[int, HostExpertBank] = {}
    for item in reader.in_file_order():
        if isinstance(item, ExpertBank):
            data = reader.bank_bytes(item.layer, out=allocate(item.nbytes))
            banks[item.layer] = HostExpertBank(item.layer, item, data)
        else:
            raw[item.name] = _read_dense(reader, item, allocate)
    dense = {}
    entries = {t.name: t for t in index.tensors}
    for name in list(raw):
        if name.endswith("_scale_inv"):
            continue  # folded into the weight it scales
        entry = entries[name]
        # each stored tensor is let go once converted: the peak is the loaded model's size, not
        # that and every stored tensor beside it (an FP8 model's dense weights took 1.5x)
        tensor = raw.pop(name)
        scale = raw.pop(name + "_scale_inv", None) if name.endswith(".weight") else None
        if (keep_blocks is not None and scale is None and len(entry.shape) == 2
                and keep_blocks(name, entry.dtype, entry.shape[1])):
            dense[name] = BlockWeight(tensor, entry.dtype, (entry.shape[0], entry.shape[1]))
        elif entry.dtype in BLOCK_DTYPES or scale is not None:
            block = tuple(weight_block_size(index.source_config.get("quantization_config")))
            dense[name] = dequantize(tensor, entry.dtype, entry.shape, dtype, scales=[scale] if scale is not None else None,
                                     block=block)  # type: ignore[arg-type]
        elif tensor.dtype in FLOAT_DTYPES and tensor.dtype != dtype:
            dense[name] = tensor.to(torch.float32 if name.endswith(keep_float32) else dtype)
        else:
            dense[name] = tensor
    return ModelWeights(ModelConfig.from_index(index), dense, banks)


def _read_dense(reader: FTWReader, entry: TensorEntry, allocate: Allocator) -> torch.Tensor:
    buffer = allocate(entry.nbytes)
    reader.read_into(entry.shard, entry.offset, memoryview(buffer.numpy()))
    dtype = torch_dtype_of(entry.dtype)
    shape = storage_shape(entry.dtype, entry.shape)
    return buffer.view(dtype).view(shape) if dtype != torch.uint8 else buffer.view(shape)
