"""The expert-execution interface and the CPU executors (the miss path of the hybrid runtime)."""

from __future__ import annotations

import logging
import math
import threading
from typing import Protocol

import torch
import torch.nn.functional as F

from ftw.format import SWIGLU, ExpertActivation

from .activation import activate, split_rows
from .bank import HostExpertBank
from .cpu_kernels import ExpertKernel, Kernel, ShareJob, UnsupportedBank, native_kernel

log = logging.getLogger(__name__)
_REPORTED: set[str] = set()


class ExpertExecutor(Protocol):
    """Runs the routed experts of one MoE layer.

    `x` [T, H] are the tokens, `expert_ids` [T, K] int64 the experts each token was routed to,
    `weights` [T, K] their routing weights (already normalized/scaled as the family wants).
    Returns [T, H]: sum over k of weights[t, k] * expert_{ids[t, k]}(x[t]), in x's dtype.
    """

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor: ...


class ReferenceCPUExpertExecutor:
    """Experts computed on the CPU straight from the host banks with torch, one expert at a time.

    Tokens are grouped by expert, so prefill runs each expert once as a matrix product. Banks
    in the compute dtype are used in place (no copy); others are converted per use.
    """

    def __init__(self, banks: dict[int, HostExpertBank], dtype: torch.dtype) -> None:
        self.banks = banks
        self.dtype = dtype

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        flat_ids = expert_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        sorted_ids = flat_ids[order].tolist()
        token_of = order // expert_ids.shape[1]
        flat_weights = weights.reshape(-1)[order]
        start = 0
        while start < len(sorted_ids):
            expert = sorted_ids[start]
            end = start
            while end < len(sorted_ids) and sorted_ids[end] == expert:
                end += 1
            tokens = token_of[start:end]
            w13, w2 = self._expert_weights(layer, expert)
            bank = self.banks[layer]
            y = swiglu(x[tokens], w13, w2, bank.layout.activation, bank.biases(expert, w13.dtype))
            out.index_add_(0, tokens, y * flat_weights[start:end, None].to(y.dtype))
            start = end
        return out

    def _expert_weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.banks[layer].weights(expert, self.dtype)


# Rows per expert (tokens x top-k / experts) from which a bf16 bank runs faster as one GEMM per
# expert (torch, oneDNN's bf16 GEMM) than through the compiled kernel, whose time grows with every
# token. Measured on the 2-core VM, 64 experts of 1024 x 512, top-8: even at ~14 rows (110
# tokens); 1.4x faster at 32 rows, 2.9x at 256 (docs/benchmark-history.md, prefill by length). Not for f32:
# there torch's GEMM stayed slower than the kernel up to 1024 tokens (0.33-0.8x).
GROUPED_GEMM_MIN_ROWS = 16
# The same for banks the GEMMs need dequantized first, by the kernel's own dequantizer
# (ft_dequant_expert: q8_0 at ~9 G weights/s, fp8 and f16 at ~2). Same VM and shape, kernel time
# over dequantize + GEMM time: fp8 0.51 at 32 rows, 0.90 at 64, 1.44 at 128, 2.44 at 256; q8_0
# 0.78 at 16 rows, 1.46 at 32, 2.2-3.0 at 64-256. K-quants (int8 products against Q8_K
# activations in the kernel; dequantized at 2-4 G weights/s): q4_k 0.90 at 32 rows, 1.03 at 48,
# 1.12 at 64, 1.6 at 128; q5_k 0.96, 1.15, 1.23, 1.56; q4_k gate/up with a q6_k down as q4_k;
# q6_k 0.59 at 32, 0.83 at 64, 1.12 at 96, 1.25 at 128. Keyed by the gate's dtype.
DEQUANT_GEMM_MIN_ROWS = {"q8_0": 24, "q4_k": 48, "q5_k": 48, "q6_k": 96, "other": 80}


class CPUExpertExecutor(ReferenceCPUExpertExecutor):
    """Experts computed on the CPU straight from the host banks by the compiled kernel
    (cpu_kernels.py): every selected expert's weights streamed once, all threads at once.
    Prefill-sized calls with a bf16 compute dtype take the grouped-GEMM path of the reference
    instead: bf16 banks in place from GROUPED_GEMM_MIN_ROWS rows per expert, quantized ones
    dequantized by the kernel from DEQUANT_GEMM_MIN_ROWS.

    Layers the kernel cannot run (a dtype it lacks, no compiler) take the reference path; both
    give sum_k w * expert(x) in x's dtype. The kernel accumulates in fp32 whatever `dtype` is
    (the reference rounds to `dtype` between the two projections). Its K-quant matrices (q4_k,
    q5_k, q6_k) take their activations rounded to Q8_K, int8 per 256 values as in llama.cpp: an
    expert's output is then ~1-2% (RMS) off the reference's (tests/test_kquant_kernel.py bounds
    each element). MXFP4 matrices do the like in 16-bit models, int8 per 32 values as llama.cpp
    does for them (~1% RMS too, a few times the bf16 rounding; tests/test_mxfp4_kernel.py bounds
    it); a float32 model gets their fp32 products, the reference's, at about half the speed.
    `threads`: OpenMP threads per call, default torch's. `grouped_gemm_min_rows`: None keeps
    every call on the kernel.
    """

    def __init__(self, banks: dict[int, HostExpertBank], dtype: torch.dtype, *, threads: int | None = None,
                 kernel: Kernel | None = None, grouped_gemm_min_rows: int | None = GROUPED_GEMM_MIN_ROWS,
                 dequant_gemm_min_rows: dict[str, int] | None = None) -> None:
        super().__init__(banks, dtype)
        self.threads = threads
        self.grouped_gemm_min_rows = grouped_gemm_min_rows
        self.dequant_gemm_min_rows = dequant_gemm_min_rows or DEQUANT_GEMM_MIN_ROWS
        self._gemm_min_pairs: dict[int, float] = {}
        self._workspaces = threading.local()  # each thread's tensors for a dequantized expert (_workspace)
        self._kernel = kernel
        self._layers: dict[int, ExpertKernel | None] = {}

    def __call__(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        fast = self._kernel_for(layer, expert_ids)
        if fast is None:
            return super().__call__(layer, x, expert_ids, weights)
        return fast(x, expert_ids, weights, self.threads or torch.get_num_threads())

    def forward_selected(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                         status: torch.Tensor, inverse: torch.Tensor, code: int, out: torch.Tensor) -> bool:
        """out (fp32) = the sum over the pairs whose status[inverse] is `code` only, selected in the
        kernel (the hybrid executor's CPU share, runtime/gpu/cpu_share.py). False, out untouched,
        where the kernel does not run this call: the caller selects the pairs itself."""
        fast = self._kernel_for(layer, expert_ids)
        if fast is None:
            return False
        fast.selected(x, expert_ids, weights, status, inverse, code, out, self.threads or torch.get_num_threads())
        return True

    def selected_job(self, layer: int, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor,
                     status: torch.Tensor, inverse: torch.Tensor, code: int, out: torch.Tensor, ready: int, done: int,
                     timeout_s: float) -> ShareJob | None:
        """`forward_selected`'s call as a job for the native share worker, handed over by the flags
        at `ready` and `done` (cpu_kernels.ShareWorker); None where the kernel does not run it."""
        fast = self._kernel_for(layer, expert_ids)
        if fast is None:
            return None
        return fast.share_job(x, expert_ids, weights, status, inverse, code, out,
                              self.threads or torch.get_num_threads(), ready, done, timeout_s)

    def prepare(self) -> None:
        """Bind every layer's kernel now: the kernel's one build on this machine (seconds, then
        kept on disk) and the banks' layout checks happen at load, not in a decode step that
        first sends experts to the CPU."""
        for layer in self.banks:
            if layer not in self._layers:
                self._bind(layer)

    def _kernel_for(self, layer: int, expert_ids: torch.Tensor) -> ExpertKernel | None:
        """The kernel bound to `layer` where it runs this call; None: the reference path (a bank
        the kernel cannot run, or a call the grouped GEMMs serve better)."""
        fast = self._layers[layer] if layer in self._layers else self._bind(layer)
        return None if fast is None or self._grouped_gemm_pays(layer, expert_ids) else fast

    def _grouped_gemm_pays(self, layer: int, expert_ids: torch.Tensor) -> bool:
        min_pairs = self._gemm_min_pairs.get(layer)
        if min_pairs is None:
            min_pairs = self._gemm_min_pairs[layer] = self._min_pairs_for_gemm(self.banks[layer])
        return expert_ids.numel() >= min_pairs

    def _min_pairs_for_gemm(self, bank: HostExpertBank) -> float:
        """(token, expert) pairs per call from which one GEMM per expert beats the kernel (inf: never)."""
        stored = bank.layout.part("w2").dtype
        if self.grouped_gemm_min_rows is None or self.dtype != torch.bfloat16 or stored == "f32":
            return math.inf  # torch's f32 GEMM lost to the kernel (above)
        if bank.stored_as(torch.bfloat16):
            return self.grouped_gemm_min_rows * bank.num_experts
        # by gate's dtype: two thirds of the weights (a Q4_K_M bank's Q4_K gate and up, not its Q6_K down)
        gate = bank.layout.part("w13" if bank.has_part("w13") else "w1").dtype
        return self.dequant_gemm_min_rows.get(gate, self.dequant_gemm_min_rows["other"]) * bank.num_experts

    def _expert_weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        fast = self._layers.get(layer)
        if fast is not None and not self.banks[layer].stored_as(self.dtype) and self.dtype == torch.bfloat16:
            return fast.dequantized(expert, self.threads or torch.get_num_threads(), self._workspace(fast))
        return super()._expert_weights(layer, expert)

    def _workspace(self, fast: ExpertKernel) -> tuple[torch.Tensor, torch.Tensor]:
        """This thread's bf16 tensors for one dequantized expert, reused by every expert of a call
        (each is used up before the next is dequantized; held as long as the executor, ~9 MiB a
        thread for Qwen3-30B's experts): fresh tensors were fresh pages, faulted in for every
        expert of every call, with the scalar dequantizer ~a quarter of the grouped-GEMM path's
        time at 15-31 rows an expert (bench_cpu_experts.py --gemm, 2-core VM)."""
        shapes = fast.dequantized_shapes
        held = getattr(self._workspaces, "held", None)
        if held is None or tuple(tuple(t.shape) for t in held) != shapes:
            held = self._workspaces.held = tuple(torch.empty(shape, dtype=torch.bfloat16) for shape in shapes)
        return held

    def _bind(self, layer: int) -> ExpertKernel | None:
        kernel = self._kernel or native_kernel()
        fast = None
        if kernel is not None:
            try:
                fast = ExpertKernel(kernel, self.banks[layer], int8_activations=self.dtype != torch.float32)
            except UnsupportedBank as e:
                if str(e) not in _REPORTED:  # once per reason, not once per layer
                    _REPORTED.add(str(e))
                    log.info("experts of layer %d (and alike) run on the torch path: %s", layer, e)
        self._layers[layer] = fast
        return fast


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
           activation: ExpertActivation = SWIGLU,
           biases: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) with gate and up fused as w13 = [gate; up] (`activation`: the
    experts' own combine of gate and up, e.g. clamped, or up alone where not gated; `biases`:
    (w13_bias, w2_bias) added to each projection's output where the records have them, gpt-oss's)."""
    b13, b2 = biases if biases is not None else (None, None)
    gate, up = split_rows(activation, F.linear(x, w13, b13))
    return F.linear(activate(activation, gate, up), w2, b2)
