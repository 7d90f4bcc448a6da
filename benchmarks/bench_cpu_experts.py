"""CPU expert execution against the DRAM read ceiling, same threads, one run.

For each expert dtype: a random bank laid out as FTW stores it (Qwen3-30B-A3B experts by
default: H=2048, I=768, K=8 per token), grown to --bank-mib (2 GiB: several times any LLC, as
the 48 layers of the real model are), then decode steps that walk the bank, so every step's
weights come from DRAM. Printed side by side:

- DRAM read GB/s: one pass over a buffer >> LLC, by the kernel library's reader (same OpenMP
  threads as the kernel) and by torch's sum (same torch threads);
- the reference torch executor (runtime/experts/executor.py, ReferenceCPUExpertExecutor);
- the fast executor (CPUExpertExecutor: the compiled kernel of cpu_kernels.py, on every call);

as GB/s of expert weights streamed (bytes of every distinct expert record a step touches,
scales included, over the step's time), best and median over the repetitions. A dtype `a/b`
is a GGUF-style mixed expert: gate and up stored as a, down as b (Q4_K_M: q4_k/q6_k). A `+act`
suffix gives the experts gpt-oss's records: its clamped SwiGLU (alpha 1.702, limit 7) and bf16
w13/w2 biases (their bytes counted). mxfp4 takes the kernel's int8 products with 16-bit
activations (--compute-dtype bf16, the default) and its fp32 ones with f32.

    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --threads 16
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --tokens 1,4,256 --dtypes bf16
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --tokens 128,256,512 --dtypes q4_k/q6_k --gemm --no-reference
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --threads 1,2 --dtypes bf16,q8_0,q4_k,q6_k,q4_k/q6_k
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --build avx2 --dtypes q4_k  # another CPU's build
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --threads 1,2 --dtypes bf16,q4_k,mxfp4,mxfp4+act,bf16+act
    PYTHONPATH=. python benchmarks/bench_cpu_experts.py --hidden 2880 --inter 2880 --top-k 4 --dtypes mxfp4+act  # gpt-oss
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from ftw.format import SWIGLU, ExpertActivation
from runtime.experts import cpu_kernels
from runtime.experts.cpu_kernels import Kernel, native_kernel
from runtime.experts.executor import CPUExpertExecutor, ReferenceCPUExpertExecutor
from runtime.experts.synthetic import random_bank

COMPUTE_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
GPT_OSS_ACTIVATION = ExpertActivation("swiglu_clamped", alpha=1.702, limit=7.0)
BUILDS = {"native": cpu_kernels.NATIVE_FLAGS, "no-vnni": cpu_kernels.NO_VNNI_FLAGS, "avx2": cpu_kernels.AVX2_FLAGS,
          "scalar": cpu_kernels.SCALAR_FLAGS}


def timed(fn: Callable[[int], object], reps: int, warmup: int = 2) -> list[float]:
    """Seconds per call of fn(i), i = 0, 1, ..., one sample per call."""
    for i in range(warmup):
        fn(i)
    samples = []
    for i in range(warmup, warmup + reps):
        start = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - start)
    return samples


def timed_steps(executor, x: torch.Tensor, steps: list[torch.Tensor], weights: torch.Tensor, reps: int, *,
                budget_s: float, warmup: int = 2) -> list[float]:
    """Seconds per decode step, step i routed as steps[i]; stops early past `budget_s`."""
    deadline = time.perf_counter() + budget_s
    samples: list[float] = []
    for i in range(warmup + reps):
        start = time.perf_counter()
        executor(0, x, steps[i % len(steps)], weights)
        if i >= warmup:
            samples.append(time.perf_counter() - start)
        if samples and time.perf_counter() > deadline:
            break
    return samples


def gbps(nbytes: float, samples: list[float]) -> tuple[float, float]:
    """(best, median) GB/s."""
    return nbytes / min(samples) / 1e9, nbytes / statistics.median(samples) / 1e9


def dram_read(threads: int, mib: int, reps: int, kernel: Kernel | None) -> dict[str, tuple[float, float]]:
    buffer = torch.ones(mib << 20, dtype=torch.uint8)
    out = {"torch sum": gbps(buffer.numel(), timed(lambda i: buffer.view(torch.float32).sum(), reps))}
    if kernel is not None:
        out["kernel reader"] = gbps(buffer.numel(), timed(lambda i: kernel.read_bytes(buffer, threads), reps))
    return out


def expert_ids(step: int, num_tokens: int, top_k: int, num_experts: int) -> torch.Tensor:
    """Distinct experts per token, walking the bank so a step's experts were not used by the last ones."""
    first = step * num_tokens * top_k
    return (torch.arange(first, first + num_tokens * top_k) % num_experts).view(num_tokens, top_k)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default=str(torch.get_num_threads()),
                        help="CPU threads, comma separated (default: torch's)")
    parser.add_argument("--dtypes", default="bf16,f8_e4m3,q8_0",
                        help="expert dtypes (f32,f16,bf16,f8_e4m3,f8_e5m2,q8_0,q4_k,q5_k,q6_k,mxfp4; gate-up/down: "
                             "q4_k/q6_k; +act: gpt-oss's activation and biases)")
    parser.add_argument("--build", default="native", choices=sorted(BUILDS),
                        help="the kernel build: this CPU's (native), or what a CPU without VNNI, AVX-512 or AVX2 gets")
    parser.add_argument("--tokens", default="1", help="tokens per step, comma separated (decode: 1)")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--experts", type=int, default=128, help="experts per layer (Qwen3-30B-A3B: 128)")
    parser.add_argument("--bank-mib", type=int, default=2048,
                        help="grow the bank past --experts to this size, so steps stream from DRAM, not the LLC")
    parser.add_argument("--compute-dtype", default="bf16", choices=sorted(COMPUTE_DTYPES),
                        help="the model's dtype: activations, and the reference's compute dtype")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--ref-reps", type=int, default=8)
    parser.add_argument("--no-reference", action="store_true", help="skip the (slow) reference executor")
    parser.add_argument("--dram-mib", type=int, default=2048, help="DRAM read buffer (>> LLC)")
    parser.add_argument("--gemm", action="store_true",
                        help="also time every call as prefill's dequantize-then-GEMM path (one bf16 GEMM per expert, "
                             "the weights dequantized by the kernel), beside the kernel: where DEQUANT_GEMM_MIN_ROWS "
                             "should switch")
    parser.add_argument("--dispatch", action="store_true",
                        help="also time the runtime's choice (the kernel, or dequantize + one GEMM per expert for "
                             "prefill-sized calls): 'runtime ms' and its speedup over the kernel")
    args = parser.parse_args(argv)

    compute = COMPUTE_DTYPES[args.compute_dtype]
    kernel = native_kernel() if args.build == "native" else Kernel(cpu_kernels.build(BUILDS[args.build]))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; kernel: "
          f"{kernel.path.name + f' ({args.build}, {kernel.simd_width * 32}-bit SIMD)' if kernel else 'UNAVAILABLE'}")
    print(f"# experts H={args.hidden} I={args.inter}, K={args.top_k}, banks of >= {args.bank_mib} MiB, "
          f"activations {args.compute_dtype}; GB/s = distinct expert bytes per step / step time (best, median)")
    banks = {}
    for dtype in args.dtypes.split(","):
        stored, _, extra = dtype.partition("+")
        gate_up, _, down = stored.partition("/")
        options = dict(down_dtype=down or None, activation=GPT_OSS_ACTIVATION if extra == "act" else SWIGLU,
                       bias_dtype="bf16" if extra == "act" else None)
        record_bytes = random_bank(gate_up, 1, args.hidden, args.inter, **options).layout.expert_stride
        num_experts = max(args.experts, -(-(args.bank_mib << 20) // record_bytes))
        banks[dtype] = random_bank(gate_up, num_experts, args.hidden, args.inter, num_distinct=4, **options)
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        print(f"## {threads} thread(s)")
        for name, (best, median) in dram_read(threads, args.dram_mib, args.reps, kernel).items():
            print(f"DRAM read ({name}, {args.dram_mib} MiB): {best:6.1f} GB/s best, {median:6.1f} median")
        run_dtypes(args, banks, compute, kernel, threads)


def run_dtypes(args: argparse.Namespace, banks: dict, compute: torch.dtype, kernel: Kernel | None, threads: int) -> None:
    print(f"{'dtype':11} {'T':>4} {'MB/step':>8} | {'reference ms':>12} {'GB/s':>6} | {'fast ms':>8} {'GB/s':>6} "
          f"{'(median)':>8} | {'speedup':>7}")
    for dtype, bank in banks.items():
        num_experts = bank.num_experts
        record_bytes = sum(p.nbytes for p in bank.layout.parts)
        fast = CPUExpertExecutor({0: bank}, compute, threads=threads, kernel=kernel,
                                 grouped_gemm_min_rows=None)  # the kernel alone
        reference = ReferenceCPUExpertExecutor({0: bank}, compute)
        runtime = CPUExpertExecutor({0: bank}, compute, threads=threads, kernel=kernel)  # as the model runs it
        gemm = CPUExpertExecutor({0: bank}, compute, threads=threads, kernel=kernel, grouped_gemm_min_rows=0,
                                 dequant_gemm_min_rows={"other": 0})  # every call one GEMM per expert
        for num_tokens in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(num_tokens, args.hidden).to(compute)
            weights = torch.rand(num_tokens, args.top_k).to(compute)
            steps = [expert_ids(i, num_tokens, args.top_k, num_experts) for i in range(64)]
            step_bytes = record_bytes * min(num_tokens * args.top_k, num_experts)

            fast_s = timed_steps(fast, x, steps, weights, args.reps, budget_s=60)
            fast_best, fast_median = gbps(step_bytes, fast_s)
            ref_text, speedup = f"{'-':>12} {'-':>6}", "-"
            if not args.no_reference:
                ref_s = timed_steps(reference, x, steps, weights, args.ref_reps, budget_s=10, warmup=1)
                ref_text = f"{statistics.median(ref_s) * 1e3:12.2f} {gbps(step_bytes, ref_s)[1]:6.1f}"
                speedup = f"{statistics.median(ref_s) / statistics.median(fast_s):6.1f}x"
            runtime_text = ""
            if args.dispatch:
                run_s = timed_steps(runtime, x, steps, weights, args.ref_reps, budget_s=30, warmup=1)
                runtime_text = (f" | runtime {statistics.median(run_s) * 1e3:8.2f} ms, "
                                f"{statistics.median(fast_s) / statistics.median(run_s):4.2f}x the kernel")
            if args.gemm:
                gemm_s = timed_steps(gemm, x, steps, weights, args.reps, budget_s=60)
                rows = num_tokens * args.top_k / num_experts
                runtime_text += (f" | gemm {statistics.median(gemm_s) * 1e3:8.2f} ms ({rows:.0f} rows an expert), "
                                 f"{statistics.median(fast_s) / statistics.median(gemm_s):4.2f}x the kernel")
            fallback = "  (no kernel: the torch path)" if fast._layers.get(0) is None else ""
            print(f"{dtype:11} {num_tokens:4d} {step_bytes / 1e6:8.1f} | {ref_text} | {min(fast_s) * 1e3:8.2f} "
                  f"{fast_best:6.1f} {fast_median:8.1f} | {speedup:>7}{runtime_text}{fallback}")


if __name__ == "__main__":
    main()
