"""A dense weight kept as the GGML blocks its GGUF file stores (a Q4_K_M file's attention
projections and output head: Q4_K and Q6_K; a Q8_0 file's, rows of whole 256s), multiplied in
place by `linear`, never widened to 16 bits in memory.

Widened at load, the dense weights of a Qwen3-30B-A3B-shaped Q4_K_M file take 2.9x their stored
bytes of VRAM (16 layers: 1.2 GiB, against llama.cpp's 1.45 GiB for its whole process), and that
VRAM is the expert cache's. Kept as blocks:
- a decode step's product reads the blocks in place: on the GPU the expert cache's block GEMV
  (runtime/gpu/kernels/block_gemv.py, handed in through `use_device_gemv`: this module imports
  nothing of the GPU runtime), on the CPU the expert kernel's integer products (`dense_blocks`,
  activations rounded to Q8_K as llama.cpp does);
- a prompt's product dequantizes DEQUANT_CHUNK_BYTES of rows at a time into the activations'
  dtype and multiplies them (the values the load-time copy held, so prompts compute as before);
  on the CPU the kernel library dequantizes them, on the prompt's threads (torch's elementwise
  form took ~8% of a Qwen3-30B-shaped Q4_K_M prompt there).
Which tensors: the planner's `keeps_blocks` (runtime/planner/footprint.py, which counts them as
stored), handed to the loader (runtime/loading/read_ftw.py, where BlockWeight is); everything
else is dequantized at load as before.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..loading.read_ftw import BlockWeight

# float32 bytes of rows dequantized at once for a prompt's product: the dequantization holds ~3x
# that at its peak (ggml_blocks' temporaries), ~50 MB here, inside the fit plan's GPU reserve
DEQUANT_CHUNK_BYTES = 16 << 20
DEVICE_GEMV_MAX_TOKENS = 4  # a GEMV re-reads the weight for each token: more tokens dequantize instead


# (x [T, C], weight) -> [T, rows], float32 or x's dtype (summed in float32 either way; x's dtype
# saves a cast kernel a projection): set by the GPU runtime when a model runs on the GPU
_device_gemv: Callable[[torch.Tensor, BlockWeight], torch.Tensor] | None = None


def use_device_gemv(gemv: Callable[[torch.Tensor, BlockWeight], torch.Tensor]) -> None:
    """From now on, a product of up to DEVICE_GEMV_MAX_TOKENS tokens with a BlockWeight on a CUDA
    device is `gemv(x, weight)`."""
    global _device_gemv
    _device_gemv = gemv


def block_linear(x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None,
                 cpu_gemv: Callable[[torch.Tensor, BlockWeight], torch.Tensor | None],
                 cpu_values: Callable[[BlockWeight, int, int, torch.dtype], torch.Tensor | None] | None = None,
                 ) -> torch.Tensor:
    """x [..., cols] @ weight^T (+ bias) in x's dtype. `cpu_gemv`: the CPU's in-place product of
    x [T, cols], float32, or None where it has none (no kernel, too many tokens). `cpu_values`:
    the CPU's dequantization of rows [start, stop) into a dtype (the values `weight.values` gives),
    or None where it has none; a CPU prompt's product multiplies those."""
    rows, cols = weight.shape
    if x.shape[-1] != cols:
        raise ValueError(f"a [{rows}, {cols}] weight cannot multiply inputs of {x.shape[-1]} values")
    flat = x.reshape(-1, cols)
    out = None
    if x.is_cuda and _device_gemv is not None and flat.shape[0] <= DEVICE_GEMV_MAX_TOKENS:
        out = _device_gemv(flat, weight)
    elif x.device.type == "cpu":
        out = cpu_gemv(flat, weight)
    if out is None:
        out = torch.empty(flat.shape[0], rows, dtype=x.dtype, device=x.device)
        step = max(1, DEQUANT_CHUNK_BYTES // (4 * cols))
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            values = cpu_values(weight, start, stop, x.dtype) if cpu_values is not None and not x.is_cuda else None
            out[:, start:stop] = flat @ (weight.values(start, stop, x.dtype) if values is None else values).T
    else:
        out = out.to(x.dtype)  # (no copy where the GEMV wrote x's dtype)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], rows)
