"""The compiled CPU expert kernel (csrc/moe_cpu.cpp, csrc/kquants.cpp for the GGML K-quants,
csrc/mxfp4.cpp for MXFP4's int8 products and csrc/rows.cpp for a decode step's RMSNorm and
rotation): built at first use, cached, called with ctypes.

Why not torch: its bf16 CPU matmul streams expert weights at a fraction of DRAM bandwidth, and
fp8 / GGML weights would need a dequantized copy per use. Why not a torch extension: the kernel
needs no torch headers, so plain `g++ -O3 -march=native` builds it in 3-5 s on two cores, with
no ninja and no Python headers (a trivial torch extension took 17 s there), and ctypes
releases the GIL during the call (the hybrid runtime runs the CPU misses beside the GPU work).
Its OpenMP threads are torch's own (libgomp.so.1 is loaded once per process). Without a
compiler, or without the .cpp in the installation, the executor falls back to torch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import subprocess
from pathlib import Path

import torch

from ftw.format import BLOCK_DTYPES, CLAMPED_KINDS

from .activation import describe
from .bank import HostExpertBank

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCE = CSRC / "moe_cpu.cpp"
SOURCES = (SOURCE, CSRC / "kquants.cpp", CSRC / "mxfp4.cpp", CSRC / "rows.cpp")  # compiled together into one library
# -ffp-contract=off: every product and sum rounded as written, never fused, so the dequantizers
# give the reference's values bit for bit (gguf-py's numpy rounds each operation).
NATIVE_FLAGS = ("-O3", "-march=native", "-std=c++17", "-fopenmp", "-shared", "-fPIC", "-ffp-contract=off")
# What a CPU without AVX-512 (AVX2 path) or without AVX2 (scalar path) would build: for tests.
AVX2_FLAGS = (*NATIVE_FLAGS, "-mno-avx512f")
NO_VNNI_FLAGS = (*NATIVE_FLAGS, "-mno-avx512vnni")  # AVX-512 without VNNI (Skylake-X): the K-quants' madd path
SCALAR_FLAGS = (*NATIVE_FLAGS, "-mno-avx512f", "-mno-avx2", "-mno-fma", "-mno-f16c", "-mno-avx")

# FTW dtype -> the kernel's dtype code (enum Dtype in moe_cpu.cpp)
DTYPE_CODES = {"f32": 0, "f16": 1, "bf16": 2, "f8_e4m3": 3, "f8_e5m2": 4, "q8_0": 5, "q4_k": 6, "q5_k": 7, "q6_k": 8,
               "mxfp4": 9}
# GGML K-quants (csrc/kquants.cpp): the kernel multiplies them with activations quantized to
# Q8_K (int8 per 256 values), as llama.cpp does, so their results are not the reference's to
# the last bits but within the activation rounding (tests/test_kquant_kernel.py bounds it).
KQUANT_DTYPES = ("q4_k", "q5_k", "q6_k")
# GGML MXFP4 (gpt-oss's and DeepSeek-V4's experts): either way. With `int8_activations`
# (csrc/mxfp4.cpp) against activations quantized to int8 per 32 values, as llama.cpp does
# (tests/test_mxfp4_kernel.py bounds the rounding); without, in fp32, the reference's products.
INT8_DTYPES = ("mxfp4",)
BLOCK_ROW_DTYPES = (*KQUANT_DTYPES, *INT8_DTYPES, "q8_0")  # what dense_blocks and dequant_rows take
# ExpertActivation.kind -> enum Activation in moe_cpu.cpp
ACTIVATION_CODES = {"swiglu": 0, "swiglu_clamped": 1, "swiglu_limited": 2, "geglu_tanh": 3, "relu2": 4, "silu": 5}
BIAS_DTYPES = ("f32", "f16", "bf16")
TORCH_NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
ROW_DTYPE_CODES = {torch.float32: DTYPE_CODES["f32"], torch.bfloat16: DTYPE_CODES["bf16"]}  # what ft_rms_norm and ft_rotary take
DENSE_MAX_TOKENS = 4  # tokens per pass over the weight (MAX_NT in moe_cpu.cpp)
FP8_DTYPES = ("f8_e4m3", "f8_e5m2")


class KernelBuildError(RuntimeError):
    """The CPU expert kernel could not be compiled or loaded."""


class UnsupportedBank(ValueError):
    """The kernel cannot run this bank's layout (the reference path will)."""


class _Mat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in (
        "offset", "row_bytes", "dtype", "rows", "cols", "scale_offset", "scale_stride", "block_rows", "block_cols")]


class _Layout(ctypes.Structure):
    _fields_ = [("gate", _Mat), ("up", _Mat), ("down", _Mat), ("record_stride", ctypes.c_int64),
                ("num_experts", ctypes.c_int64), ("activation", ctypes.c_int64), ("alpha", ctypes.c_double),
                ("limit", ctypes.c_double), ("gate_bias", ctypes.c_int64), ("up_bias", ctypes.c_int64),
                ("down_bias", ctypes.c_int64), ("bias_dtype", ctypes.c_int64), ("mxfp4_int8", ctypes.c_int64)]


class ShareJob(ctypes.Structure):
    """One decode call's CPU share for the native share worker (struct ShareJob in moe_cpu.cpp)."""

    _fields_ = [("bank", ctypes.c_void_p), ("layout", _Layout), ("num_tokens", ctypes.c_int64),
                ("top_k", ctypes.c_int64), ("ids", ctypes.c_void_p), ("ids_int32", ctypes.c_int64),
                ("status", ctypes.c_void_p), ("inverse", ctypes.c_void_p), ("code", ctypes.c_int32),
                ("weights", ctypes.c_void_p), ("w_dtype", ctypes.c_int64), ("x", ctypes.c_void_p),
                ("x_dtype", ctypes.c_int64), ("out", ctypes.c_void_p), ("num_threads", ctypes.c_int64),
                ("ready", ctypes.c_void_p), ("done", ctypes.c_void_p), ("timeout_us", ctypes.c_int64)]


def cache_dir() -> Path:
    """Where built kernels are kept: $FT_KERNEL_CACHE, else ~/.cache/ft/kernels."""
    if env := os.environ.get("FT_KERNEL_CACHE"):
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ft" / "kernels"


def build(flags: tuple[str, ...] = NATIVE_FLAGS, *, compiler: str | None = None, cache: Path | None = None) -> Path:
    """The kernel's shared library for `flags`, compiled once per (source, flags, compiler, CPU)."""
    cxx = compiler or os.environ.get("CXX") or "g++"
    missing = [p for p in SOURCES if not p.exists()]
    if missing:
        raise KernelBuildError(f"kernel source {missing[0]} is missing from this installation")
    source = b"\0".join(p.name.encode() + b"\0" + p.read_bytes() for p in sorted(CSRC.iterdir())
                         if p.suffix in (".cpp", ".h"))
    try:
        version = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"no C++ compiler {cxx!r} ({e}); set CXX to one") from e
    key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(), cxx.encode(), version.encode(),
                                     _cpu_flags().encode()])).hexdigest()[:16]
    out = (cache or cache_dir()) / f"moe_cpu-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    log.info("compiling the CPU expert kernel for this CPU (once; kept in %s)", out.parent)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run([cxx, *flags, "-o", str(tmp), *map(str, SOURCES)], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise KernelBuildError(f"{cxx} failed to build {SOURCE.name}:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)  # atomic: a concurrent build of the same key writes the same bytes
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"{cxx} could not build {SOURCE.name}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _cpu_flags() -> str:
    # -march=native code must not be reused on another CPU (a shared home directory)
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


class Kernel:
    """The loaded library: `forward` for one layer's experts, `read_bytes` for the DRAM ceiling."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        self.path = path
        self._forward = lib.ft_moe_forward
        self._forward.restype = ctypes.c_int
        self._forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Layout), ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._selected = lib.ft_moe_forward_selected
        self._selected.restype = ctypes.c_int
        self._selected.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Layout), ctypes.c_int64, ctypes.c_int64,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_int64]
        self._read = lib.ft_read_bytes
        self._read.restype = ctypes.c_uint64
        self._read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self._dequant = lib.ft_dequant_expert
        self._dequant.restype = ctypes.c_int
        self._dequant.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Layout), ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_int64]
        self._attend = lib.ft_decode_attention
        self._attend.restype = ctypes.c_int
        self._attend.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
        self._dense = lib.ft_dense_forward
        self._dense.restype = ctypes.c_int
        self._dense.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        self._rms_norm = lib.ft_rms_norm
        self._rms_norm.restype = ctypes.c_int
        self._rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                   ctypes.c_float, ctypes.c_float, ctypes.c_void_p, ctypes.c_int64]
        self._rotary = lib.ft_rotary
        self._rotary.restype = ctypes.c_int
        self._rotary.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
        self._dequant_rows = lib.ft_dequant_rows
        self._dequant_rows.restype = ctypes.c_int
        self._dequant_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                       ctypes.c_int64, ctypes.c_int64]
        self._wait = lib.ft_wait_u32
        self._wait.restype = ctypes.c_int
        self._wait.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int64]
        self._share_open = lib.ft_share_open
        self._share_open.restype = ctypes.c_void_p
        self._share_open.argtypes = []
        self._share_push = lib.ft_share_push
        self._share_push.restype = ctypes.c_int
        self._share_push.argtypes = [ctypes.c_void_p, ctypes.POINTER(ShareJob)]
        self._share_drain = lib.ft_share_drain
        self._share_drain.restype = ctypes.c_int
        self._share_drain.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        self._share_error = lib.ft_share_error
        self._share_error.restype = ctypes.c_int
        self._share_error.argtypes = [ctypes.c_void_p]
        self._share_busy = lib.ft_share_busy_ns
        self._share_busy.restype = ctypes.c_int64
        self._share_busy.argtypes = [ctypes.c_void_p]
        self._share_close = lib.ft_share_close
        self._share_close.restype = None
        self._share_close.argtypes = [ctypes.c_void_p]
        self.simd_width = int(lib.ft_moe_simd_width())

    def decode_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                         threads: int) -> torch.Tensor:
        """softmax(q k^T x scale) v for one query token: q [Hq, D], k [L, Hkv, D], v [L, Hkv, Dv] (any
        position/head strides, unit stride within a head; f32/f16/bf16). -> [Hq, Dv] float32."""
        if k.dtype != v.dtype or k.dtype not in TORCH_NAMES or k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("decode attention takes f32/f16/bf16 keys and values of one dtype, unit stride in a head")
        length, kv_heads, dim = k.shape
        group = q.shape[0] // kv_heads
        qf = q.to(torch.float32).contiguous()
        out = torch.empty(q.shape[0], v.shape[-1], dtype=torch.float32, device="cpu")
        strides = (ctypes.c_int64 * 4)(k.stride(0), k.stride(1), v.stride(0), v.stride(1))  # no tensor per token
        rc = self._attend(k.data_ptr(), v.data_ptr(), DTYPE_CODES[TORCH_NAMES[k.dtype]], length, kv_heads, group, dim,
                          v.shape[-1], strides, qf.data_ptr(), scale, out.data_ptr(), threads)
        assert rc == 0, f"ft_decode_attention returned {rc}"
        return out

    def dense(self, x: torch.Tensor, weight: torch.Tensor, threads: int) -> torch.Tensor:
        """x [T, C] @ weight[R, C]^T in float32, T <= DENSE_MAX_TOKENS; weight f32/f16/bf16, contiguous."""
        x = x.to(torch.float32).contiguous()
        rows, cols = weight.shape
        out = torch.empty(x.shape[0], rows, dtype=torch.float32, device="cpu")
        rc = self._dense(weight.data_ptr(), DTYPE_CODES[TORCH_NAMES[weight.dtype]], rows, cols, x.shape[0],
                         x.data_ptr(), out.data_ptr(), threads)
        if rc != 0:
            raise ValueError(f"the dense kernel takes f32/f16/bf16 weights and 1-{DENSE_MAX_TOKENS} tokens, "
                             f"not {weight.dtype} and {x.shape[0]}")
        return out

    def dense_blocks(self, x: torch.Tensor, rows: torch.Tensor, dtype: str, threads: int) -> torch.Tensor:
        """x [T, C] @ W^T in float32 for K-quant, MXFP4 or Q8_0 rows (`rows`: uint8 [R, C / block
        size x block bytes], as stored), T <= DENSE_MAX_TOKENS, x quantized first (K-quants: to
        Q8_K; MXFP4: int8 per 32 values; Q8_0: not, its products fp32's): the expert kernel's
        products."""
        cols = _block_cols(rows, dtype)
        x = x.to(torch.float32).contiguous()
        rows = rows.contiguous()
        out = torch.empty(x.shape[0], rows.shape[0], dtype=torch.float32, device="cpu")
        if x.shape[1] != cols:
            raise ValueError(f"x has {x.shape[1]} columns, the {dtype} rows {cols}")
        rc = self._dense(rows.data_ptr(), DTYPE_CODES[dtype], rows.shape[0], cols, x.shape[0], x.data_ptr(),
                         out.data_ptr(), threads)
        if rc != 0:
            raise ValueError(f"dense_blocks takes {', '.join(BLOCK_ROW_DTYPES)} rows and 1-{DENSE_MAX_TOKENS} tokens, "
                             f"not {dtype} and {x.shape[0]}")
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float,
                 threads: int) -> torch.Tensor:
        """runtime/layers/norm.py's RMSNorm of x [..., C] in one call: times `weight` [C] (None: no
        weight), or times (offset + weight) in float32 where `offset` is not 0. x and weight
        contiguous, of one dtype, f32 or bf16: the caller checks (norm.py's `_cpu_kernel_takes`; a
        decode row's checks cost more than the norm). -> x's shape and dtype."""
        cols = x.shape[-1]
        out = torch.empty_like(x)
        rc = self._rms_norm(x.data_ptr(), ROW_DTYPE_CODES[x.dtype], x.numel() // cols if cols else 0, cols,
                            None if weight is None else weight.data_ptr(), eps, offset, out.data_ptr(), threads)
        if rc != 0:
            raise ValueError(f"the kernel's RMSNorm takes f32/bf16 rows, not {x.dtype}")
        return out

    def rotary(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, threads: int) -> torch.Tensor:
        """runtime/layers/rope.apply_rotary of x [T, heads, D] by cos/sin [T, R] (R <= D, even) in one
        call, bit for bit. x, cos and sin contiguous, of one dtype, f32 or bf16: the caller checks
        (rope.py's `_cpu_kernel_takes`). -> x's shape and dtype."""
        out = torch.empty_like(x)
        tokens, heads, dim = x.shape
        rc = self._rotary(x.data_ptr(), ROW_DTYPE_CODES[x.dtype], tokens, heads, dim, cos.data_ptr(), sin.data_ptr(),
                          cos.shape[-1], out.data_ptr(), threads)
        if rc != 0:
            raise ValueError(f"the kernel's rotation takes f32/bf16 heads, not {x.dtype}")
        return out

    def dequant_rows(self, rows: torch.Tensor, dtype: str, out_dtype: torch.dtype = torch.float32,
                     threads: int = 1) -> torch.Tensor:
        """K-quant, MXFP4 or Q8_0 rows (uint8 [R, row bytes], as stored) as [R, C] of `out_dtype`: float32,
        the values the kernel's products stand for, bit for bit gguf-py's dequantize; bfloat16,
        those rounded as torch's .to rounds them. The rows split over `threads`."""
        rows = rows.contiguous()
        cols = _block_cols(rows, dtype)
        if out_dtype not in ROW_DTYPE_CODES:
            raise ValueError(f"dequant_rows writes {', '.join(map(str, ROW_DTYPE_CODES))}, not {out_dtype}")
        out = torch.empty(rows.shape[0], cols, dtype=out_dtype, device="cpu")
        if self._dequant_rows(rows.data_ptr(), DTYPE_CODES[dtype], rows.shape[0], cols, out.data_ptr(),
                              ROW_DTYPE_CODES[out_dtype], threads) != 0:
            raise ValueError(f"dequant_rows takes {', '.join(BLOCK_ROW_DTYPES)} rows, not {dtype}")
        return out

    def wait_u32(self, address: int, value: int, timeout_s: float) -> bool:
        """Wait, without the GIL, until the uint32 at `address` equals `value`; False on timeout."""
        return self._wait(address, value, int(timeout_s * 1e6)) == 0

    def read_bytes(self, data: torch.Tensor, threads: int) -> int:
        """Read every byte of contiguous `data` once (a checksum, so nothing is optimized away)."""
        return int(self._read(data.data_ptr(), data.numel() * data.element_size(), threads))


def _block_cols(rows: torch.Tensor, dtype: str) -> int:
    """Values per row of block rows `rows` (uint8 [R, row bytes]) of `dtype`."""
    if dtype not in BLOCK_ROW_DTYPES:
        raise ValueError(f"not block rows the kernel reads: {dtype} (it reads {', '.join(BLOCK_ROW_DTYPES)})")
    block_size, block_bytes = BLOCK_DTYPES[dtype]
    return rows.shape[1] // block_bytes * block_size


@functools.cache
def native_kernel() -> Kernel | None:
    """The kernel built for this CPU, or None (logged once) when it cannot be built or loaded."""
    try:
        return Kernel(build())
    except (KernelBuildError, OSError) as e:
        log.warning("CPU expert kernel unavailable, experts run on the torch path: %s", e)
        return None


class ExpertKernel:
    """The kernel bound to one layer's bank (layout checked once). `int8_activations`: MXFP4
    matrices take the int8 products (INT8_DTYPES), else their fp32 ones."""

    def __init__(self, kernel: Kernel, bank: HostExpertBank, *, int8_activations: bool = True) -> None:
        self.kernel = kernel
        self.bank = bank  # keeps the bytes alive while the kernel holds their address
        self.layout = bank_layout(bank, int8_activations=int8_activations)
        self.hidden_size = self.layout.gate.cols

    def __call__(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, threads: int) -> torch.Tensor:
        """sum_k weights[t, k] * expert_{ids[t, k]}(x[t]) for x [T, H]; fp32 inside, x's dtype out."""
        num_tokens, top_k = expert_ids.shape
        if x.shape != (num_tokens, self.hidden_size) or weights.shape != expert_ids.shape:
            raise ValueError(f"x is {list(x.shape)} and weights {list(weights.shape)}, expected "
                             f"[{num_tokens}, {self.hidden_size}] and [{num_tokens}, {top_k}] (the kernel reads them whole)")
        # the kernel reads raw CPU addresses: inputs from another device come over first
        xf = x.to("cpu", torch.float32).contiguous()
        ids = expert_ids.to("cpu", torch.int64).contiguous()
        wf = weights.to("cpu", torch.float32).contiguous()
        out = torch.empty(num_tokens, self.hidden_size, dtype=torch.float32, device="cpu")  # (not the default device)
        rc = self.kernel._forward(self.bank.data.data_ptr(), ctypes.byref(self.layout), num_tokens, top_k,
                                  ids.data_ptr(), wf.data_ptr(), xf.data_ptr(), out.data_ptr(), threads)
        if rc == -1:
            raise IndexError(f"an expert id of layer {self.bank.layer} is out of range "
                             f"(the layer has {self.bank.num_experts} experts): {expert_ids.tolist()}")
        assert rc == 0, f"ft_moe_forward returned {rc}"
        return out.to(x.device, x.dtype)

    def selected(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, status: torch.Tensor,
                 inverse: torch.Tensor, code: int, out: torch.Tensor, threads: int) -> None:
        """out (fp32 [T, H]) = the sum over the pairs (t, k) with status[inverse[t, k]] == code only:
        the CPU share of a hybrid decode call, selected in the kernel (no torch op on the way).
        Host tensors, contiguous: x and weights f32/f16/bf16, ids int64/int32, status and inverse int32."""
        self._check_selected(x, expert_ids, weights, status, inverse, out)
        num_tokens, top_k = expert_ids.shape
        rc = self.kernel._selected(self.bank.data.data_ptr(), ctypes.byref(self.layout), num_tokens, top_k,
                                   expert_ids.data_ptr(), int(expert_ids.dtype == torch.int32), status.data_ptr(),
                                   inverse.data_ptr(), code, weights.data_ptr(), DTYPE_CODES[TORCH_NAMES[weights.dtype]],
                                   x.data_ptr(), DTYPE_CODES[TORCH_NAMES[x.dtype]], out.data_ptr(), threads)
        if rc == -1:
            raise IndexError(f"an expert id of layer {self.bank.layer} is out of range "
                             f"(the layer has {self.bank.num_experts} experts): {expert_ids.tolist()}")
        assert rc == 0, f"ft_moe_forward_selected returned {rc}"

    def _check_selected(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, status: torch.Tensor,
                        inverse: torch.Tensor, out: torch.Tensor) -> None:
        num_tokens, _ = expert_ids.shape
        if (x.shape != (num_tokens, self.hidden_size) or out.shape != x.shape or out.dtype != torch.float32
                or x.dtype not in TORCH_NAMES or weights.dtype not in TORCH_NAMES
                or expert_ids.dtype not in (torch.int64, torch.int32) or status.dtype != torch.int32
                or inverse.dtype != torch.int32 or inverse.shape != expert_ids.shape
                or weights.shape != expert_ids.shape
                or not all(t.is_contiguous() and t.device.type == "cpu"
                           for t in (x, expert_ids, weights, status, inverse, out))):
            raise ValueError("the selected-pairs kernel takes contiguous host tensors: x [T, H] and weights [T, K] "
                             "f32/f16/bf16, ids int64/int32 [T, K], status and inverse int32, out fp32 [T, H]")

    def share_job(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, status: torch.Tensor,
                  inverse: torch.Tensor, code: int, out: torch.Tensor, threads: int, ready: int, done: int,
                  timeout_s: float) -> ShareJob:
        """`selected`'s call as a job for the native share worker (ShareWorker), handed over by the
        flags at addresses `ready` and `done`. The tensors must outlive the job's run."""
        self._check_selected(x, expert_ids, weights, status, inverse, out)
        return ShareJob(self.bank.data.data_ptr(), self.layout, expert_ids.shape[0], expert_ids.shape[1],
                        expert_ids.data_ptr(), int(expert_ids.dtype == torch.int32), status.data_ptr(),
                        inverse.data_ptr(), code, weights.data_ptr(), DTYPE_CODES[TORCH_NAMES[weights.dtype]],
                        x.data_ptr(), DTYPE_CODES[TORCH_NAMES[x.dtype]], out.data_ptr(), threads, ready, done,
                        int(timeout_s * 1e6))

    def dequantized(self, expert: int, threads: int,
                    out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2I, H] ([I, H] where not gated), w2 [H, I]) of one expert in bf16:
        bank.weights(expert, torch.bfloat16), fast. `out`: the two tensors to write (the shapes of
        `dequantized_shapes`, bf16, contiguous), reused from expert to expert: fresh 9 MiB tensors
        are fresh pages, faulted in on every call."""
        if out is None:
            out = tuple(torch.empty(shape, dtype=torch.bfloat16, device="cpu") for shape in self.dequantized_shapes)
        w13, w2 = out
        if (tuple(w13.shape), tuple(w2.shape)) != self.dequantized_shapes or w13.dtype != torch.bfloat16 \
                or w2.dtype != torch.bfloat16 or not (w13.is_contiguous() and w2.is_contiguous()):
            raise ValueError(f"dequantized writes bf16 tensors of {self.dequantized_shapes}")
        rc = self.kernel._dequant(self.bank.data.data_ptr(), ctypes.byref(self.layout), expert, w13.data_ptr(),
                                  w2.data_ptr(), threads)
        if rc == -1:
            raise IndexError(f"expert {expert} of layer {self.bank.layer} is out of range ({self.bank.num_experts})")
        assert rc == 0, f"ft_dequant_expert returned {rc}"
        return w13, w2

    @property
    def dequantized_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """The shapes `dequantized` gives: w13's and w2's."""
        inter, hidden = self.layout.gate.rows, self.layout.gate.cols
        return (self.bank.layout.activation.w13_rows(inter), hidden), (hidden, inter)


def bank_layout(bank: HostExpertBank, *, int8_activations: bool = True) -> _Layout:
    """The kernel's view of `bank`; UnsupportedBank says why it cannot run it."""
    data = bank.data
    if data.device.type != "cpu" or data.dtype != torch.uint8 or data.dim() != 2 or data.stride(1) != 1:
        raise UnsupportedBank("bank bytes are not a CPU uint8 [experts, stride] tensor")
    activation = bank.layout.activation
    if activation.kind not in ACTIVATION_CODES or (activation.kind in CLAMPED_KINDS and activation.limit is None):
        raise UnsupportedBank(f"the kernel has no expert activation {describe(activation)}")
    block = tuple(bank.layout.quant.get("fp8_block", (128, 128)))
    if bank.has_part("w13"):
        w13 = bank.layout.part("w13")
        inter, hidden = w13.shape[0] // (2 if activation.gated else 1), w13.shape[1]
        row_bytes = w13.nbytes // w13.shape[0]
        up = _mat(bank, w13.offset + (inter * row_bytes if activation.gated else 0), w13.dtype, inter, hidden,
                  row_bytes, "w3_scale", block)
        # (not gated: the kernel reads no gate; it names up's rows, which size the call)
        gate = _mat(bank, w13.offset, w13.dtype, inter, hidden, row_bytes, "w1_scale", block) if activation.gated else up
    elif not activation.gated:
        raise UnsupportedBank(f"{describe(activation)} experts keep their up rows in w13")
    else:  # GGUF experts whose gate and up differ in dtype (the kernel pairs each one's rows apart)
        w1, w3 = bank.layout.part("w1"), bank.layout.part("w3")
        gate = _mat(bank, w1.offset, w1.dtype, *w1.shape, w1.nbytes // w1.shape[0], None, block)
        up = _mat(bank, w3.offset, w3.dtype, *w3.shape, w3.nbytes // w3.shape[0], None, block)
    w2 = bank.layout.part("w2")
    down = _mat(bank, w2.offset, w2.dtype, *w2.shape, w2.nbytes // w2.shape[0], "w2_scale", block)
    if (down.rows, down.cols) != (gate.cols, gate.rows):
        raise UnsupportedBank(f"w2 is {list(w2.shape)}, expected [{gate.cols}, {gate.rows}]")
    gate_bias, up_bias, down_bias, bias_dtype = _biases(bank, gate.rows, gate.cols, activation.gated)
    return _Layout(gate=gate, up=up, down=down, record_stride=data.stride(0), num_experts=data.shape[0],
                   activation=ACTIVATION_CODES[activation.kind], alpha=activation.alpha,
                   limit=activation.limit if activation.limit is not None else math.inf, gate_bias=gate_bias,
                   up_bias=up_bias, down_bias=down_bias, bias_dtype=bias_dtype, mxfp4_int8=int(int8_activations))


def _biases(bank: HostExpertBank, inter: int, hidden: int, gated: bool = True) -> tuple[int, int, int, int]:
    """(gate, up, down bias offsets in a record, their dtype code); -1 offsets without biases (and
    for the gate's where not `gated`: w13_bias is up's [I] then)."""
    if not bank.has_part("w13_bias") and not bank.has_part("w2_bias"):
        return -1, -1, -1, DTYPE_CODES["f32"]
    if not (bank.has_part("w13_bias") and bank.has_part("w2_bias")):
        raise UnsupportedBank("expert records with one of w13_bias and w2_bias need both")
    b13, b2 = bank.layout.part("w13_bias"), bank.layout.part("w2_bias")
    rows = 2 * inter if gated else inter
    if b13.dtype != b2.dtype or b13.dtype not in BIAS_DTYPES or list(b13.shape) != [rows] \
            or list(b2.shape) != [hidden]:
        raise UnsupportedBank(f"expert biases are {b13.dtype} {list(b13.shape)} and {b2.dtype} {list(b2.shape)}, "
                              f"expected one of {', '.join(BIAS_DTYPES)}, [{rows}] and [{hidden}]")
    if not gated:
        return -1, b13.offset, b2.offset, DTYPE_CODES[b13.dtype]
    half = b13.nbytes // 2  # gate's I values, then up's
    return b13.offset, b13.offset + half, b2.offset, DTYPE_CODES[b13.dtype]


def _mat(bank: HostExpertBank, offset: int, dtype: str, rows: int, cols: int, row_bytes: int,
         scale: str | None, block: tuple[int, ...]) -> _Mat:
    if dtype not in DTYPE_CODES:
        raise UnsupportedBank(f"no kernel for dtype {dtype}")
    if dtype in BLOCK_DTYPES and cols % BLOCK_DTYPES[dtype][0]:
        raise UnsupportedBank(f"{dtype} rows of {cols} values are not whole {BLOCK_DTYPES[dtype][0]}-value blocks")
    scale_offset, scale_stride = -1, 0
    # as in the reference (dequant.py): block scales apply to FP8 weights only
    if scale is not None and dtype in FP8_DTYPES and bank.has_part(scale):
        part = bank.layout.part(scale)
        expected = [math.ceil(rows / block[0]), math.ceil(cols / block[1])]
        if part.dtype != "f32" or list(part.shape) != expected:
            raise UnsupportedBank(f"{scale} is {part.dtype} {list(part.shape)}, expected f32 {expected}")
        scale_offset, scale_stride = part.offset, part.shape[1]
    return _Mat(offset=offset, row_bytes=row_bytes, dtype=DTYPE_CODES[dtype], rows=rows, cols=cols,
                scale_offset=scale_offset, scale_stride=scale_stride, block_rows=block[0], block_cols=block[1])


class ShareWorker:
    """The native CPU-share worker (struct ShareWorker in moe_cpu.cpp): a thread outside Python
    that runs queued ShareJobs in order, each after its `ready` flag, then sets its `done`; it
    never takes the GIL, so the GPU's wait for `done` does not wait for Python."""

    ERRORS = {-1: "an expert id is out of range", -2: "an input dtype is not supported",
              -3: "the device did not hand over the call's inputs in time"}

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self._handle = kernel._share_open()
        self._closed_busy_ms = 0.0

    def push(self, job: ShareJob) -> None:
        if not self._handle:
            raise RuntimeError("the CPU share's native worker is closed")
        self.kernel._share_push(self._handle, ctypes.byref(job))  # copied: the struct may go

    def drain(self, timeout_s: float) -> bool:
        """Wait for every pushed job; False on timeout."""
        return not self._handle or self.kernel._share_drain(self._handle, int(timeout_s * 1e6)) == 0

    def take_error(self) -> str | None:
        """The first failure since the last call, in words (None: none)."""
        code = self.kernel._share_error(self._handle) if self._handle else 0
        return None if code == 0 else self.ERRORS.get(code, f"error {code}")

    @property
    def busy_ms(self) -> float:
        if not self._handle:
            return self._closed_busy_ms
        return self.kernel._share_busy(self._handle) / 1e6

    def close(self) -> None:
        """Finish the queued jobs and stop the thread (idempotent)."""
        if self._handle:
            self._closed_busy_ms = self.busy_ms
            self.kernel._share_close(self._handle)
            self._handle = None
