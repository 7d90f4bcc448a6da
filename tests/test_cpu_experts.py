"""The compiled CPU expert kernel against the reference executor: every dtype, every SIMD path.

Tolerances: the kernel multiplies the same fp32 products as the reference (dequantized weight x
activation, exact for every stored dtype) and only sums them in another order, over H then I
terms, so fp32 results agree to a few ulps of the largest output (observed <= 2e-6 relative;
asserted 1e-5). With bf16 activations the kernel keeps fp32 between the projections and rounds
once at the end: it is the fp32 result rounded to bf16. MXFP4 banks here run in a float32 model,
so on the kernel's fp32 path (its int8 path: tests/test_mxfp4_kernel.py). The same holds for
gpt-oss's and DeepSeek-V4's clamped activations and for expert biases.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ftw.format import SWIGLU, ExpertActivation
from runtime.experts import cpu_kernels
from runtime.experts.cpu_kernels import AVX2_FLAGS, NATIVE_FLAGS, SCALAR_FLAGS, Kernel, KernelBuildError
from runtime.experts.executor import CPUExpertExecutor, ReferenceCPUExpertExecutor
from runtime.experts.synthetic import random_bank

# (dtype, FP8 block scales)
DTYPES = [("f32", False), ("f16", False), ("bf16", False), ("f8_e4m3", True), ("f8_e4m3", False),
          ("f8_e5m2", True), ("f8_e5m2", False), ("q8_0", False), ("mxfp4", False)]
DTYPE_IDS = [d + ("+scales" if s else "") for d, s in DTYPES]
NUM_EXPERTS, TOP_K = 16, 8


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return set()


@pytest.fixture(scope="session")
def kernels() -> dict[str, Kernel]:
    """The kernel built for this CPU, and the AVX2 and scalar builds other CPUs get, where they run here."""
    flags = _cpu_flags()
    variants = {"native": NATIVE_FLAGS, "scalar": SCALAR_FLAGS}
    if {"avx2", "fma", "f16c"} <= flags:
        variants["avx2"] = AVX2_FLAGS
    try:
        with ThreadPoolExecutor(len(variants)) as pool:  # one compile per core
            paths = dict(zip(variants, pool.map(cpu_kernels.build, variants.values()), strict=True))
    except KernelBuildError as e:
        pytest.skip(f"no C++ compiler here: {e}")
    return {name: Kernel(path) for name, path in paths.items()}


def routing(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random top-k ids with duplicates: across tokens (16 experts, 8 per token) and within token 0."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=gen)[:TOP_K] for _ in range(num_tokens)])
    ids[0, 1] = ids[0, 0]
    return ids, torch.rand(num_tokens, TOP_K, generator=gen)


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> None:
    err = float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert err <= rel, f"max error {err:.2e} of the largest output, allowed {rel:.0e}"


@pytest.mark.parametrize("variant", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("dtype, scales", DTYPES, ids=DTYPE_IDS)
def test_matches_reference_small(kernels, variant: str, dtype: str, scales: bool) -> None:
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    # sizes off the SIMD width and the 128-column FP8 block (tails, partial scale blocks); q8_0
    # and mxfp4 rows are whole 32-element blocks (an odd number of them: 3 and 5)
    hidden, inter = (96, 160) if dtype in ("q8_0", "mxfp4") else (80, 40)
    bank = random_bank(dtype, NUM_EXPERTS, hidden, inter, seed=3, fp8_scales=scales)
    fast = CPUExpertExecutor({0: bank}, torch.float32, threads=2, kernel=kernels[variant], grouped_gemm_min_rows=None)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 3, 64):
        x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        assert_close(fast(0, x, ids, weights), reference(0, x, ids, weights))
    assert fast._layers[0] is not None  # the kernel ran, not the fallback


@pytest.mark.parametrize("dtype, scales", DTYPES, ids=DTYPE_IDS)
def test_matches_reference_qwen3_shape(kernels, dtype: str, scales: bool) -> None:
    """Qwen3-30B-A3B experts (H=2048, I=768): full 128x128 FP8 blocks, decode and a small prefill."""
    bank = random_bank(dtype, NUM_EXPERTS, 2048, 768, seed=5, fp8_scales=scales, num_distinct=4)
    fast = CPUExpertExecutor({0: bank}, torch.float32, kernel=kernels["native"])
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 3):
        x = torch.randn(num_tokens, 2048, generator=torch.Generator().manual_seed(7))
        ids, weights = routing(num_tokens, seed=num_tokens)
        assert_close(fast(0, x, ids, weights), reference(0, x, ids, weights))


# gpt-oss's (its alpha; a limit the random experts' gate and up values cross), DeepSeek-V4's, Gemma 4's
# and Nemotron-H's (not gated: w13 the up rows alone), Doge's (not gated: silu)
ACTIVATIONS = [SWIGLU, ExpertActivation("swiglu_clamped", alpha=1.702, limit=0.7),
               ExpertActivation("swiglu_limited", limit=0.5), ExpertActivation("geglu_tanh"),
               ExpertActivation("relu2"), ExpertActivation("silu")]


@pytest.mark.parametrize("variant", ["native", "avx2", "scalar"])
@pytest.mark.parametrize("activation", ACTIVATIONS, ids=[a.kind for a in ACTIVATIONS])
@pytest.mark.parametrize("dtype, bias_dtype", [("bf16", None), ("bf16", "f32"), ("mxfp4", "bf16"), ("f32", "f16")])
def test_activations_and_biases_are_the_references(kernels, variant: str, activation: ExpertActivation, dtype: str,
                                                   bias_dtype: str | None) -> None:
    """The kernel computes the bank's activation between the projections, w13_bias added to gate
    and up before it and w2_bias to the output (gpt-oss's records: mxfp4 weights, bf16 biases)."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    bank = random_bank(dtype, NUM_EXPERTS, 96, 160, seed=7, activation=activation, bias_dtype=bias_dtype)
    fast = CPUExpertExecutor({0: bank}, torch.float32, threads=2, kernel=kernels[variant], grouped_gemm_min_rows=None)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 5):
        x = torch.randn(num_tokens, 96, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        assert_close(fast(0, x, ids, weights), reference(0, x, ids, weights))
    assert fast._layers[0] is not None
    if activation.limit is not None:  # the clamps were crossed (else this tests plain SwiGLU again)
        w13, _ = bank.weights(0, torch.float32)
        b13 = bank.biases(0, torch.float32)
        pre = x @ w13.T + (b13[0] if b13 else 0)
        assert (pre.abs() > activation.limit).float().mean() > 0.2


def test_weights_of_another_shape_than_the_ids_are_refused(kernels) -> None:
    """The kernel reads T x K weights: fewer would be read past (a guard after them showed up in out)."""
    bank = random_bank("f32", NUM_EXPERTS, 64, 32, seed=2)
    fast = CPUExpertExecutor({0: bank}, torch.float32, kernel=kernels["native"])
    ids, weights = routing(2, seed=3)
    with pytest.raises(ValueError, match=r"and weights \[2, 1\], expected"):
        fast(0, torch.randn(2, 64), ids, weights[:, :1])


def test_bf16_activations_round_once(kernels) -> None:
    bank = random_bank("bf16", NUM_EXPERTS, 256, 128, seed=11)
    fast = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    x = torch.randn(4, 256).bfloat16()
    ids, weights = routing(4, seed=2)
    out = fast(0, x, ids, weights.bfloat16())
    ref = ReferenceCPUExpertExecutor({0: bank}, torch.float32)(0, x.float(), ids, weights.bfloat16().float())
    assert out.dtype == torch.bfloat16
    # within half a bf16 ulp of the exact (fp32) result, plus the fp32 summation-order slack
    assert torch.all((out.float() - ref).abs() <= ref.abs() * 2**-8 + 1e-5 * ref.abs().max())


def test_threads_do_not_change_results(kernels) -> None:
    """Each output element is summed by one thread in a fixed order: bitwise the same for any thread count."""
    bank = random_bank("f8_e4m3", NUM_EXPERTS, 256, 128, seed=13)
    x = torch.randn(64, 256)
    ids, weights = routing(64, seed=4)
    outs = [CPUExpertExecutor({0: bank}, torch.float32, threads=n, kernel=kernels["native"])(0, x, ids, weights)
            for n in (1, 2, 3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_unsupported_dtype_runs_the_reference(kernels, caplog) -> None:
    bank = random_bank("q4_0", NUM_EXPERTS, 64, 32, seed=17)
    fast = CPUExpertExecutor({0: bank, 1: bank}, torch.float32, kernel=kernels["native"])
    x = torch.randn(3, 64)
    ids, weights = routing(3, seed=5)
    with caplog.at_level(logging.INFO, logger="runtime.experts.executor"):
        out = fast(0, x, ids, weights)
        fast(1, x, ids, weights)
    assert fast._layers[0] is None and fast._layers[1] is None
    assert caplog.text.count("no kernel for dtype q4_0") <= 1  # once per process, not per layer
    assert torch.equal(out, ReferenceCPUExpertExecutor({0: bank}, torch.float32)(0, x, ids, weights))


def test_expert_id_out_of_range(kernels) -> None:
    bank = random_bank("bf16", NUM_EXPERTS, 64, 32)
    fast = CPUExpertExecutor({0: bank}, torch.float32, kernel=kernels["native"])
    with pytest.raises(IndexError, match="out of range"):
        fast(0, torch.randn(1, 64), torch.tensor([[0, NUM_EXPERTS]]), torch.ones(1, 2))


def test_compile_failure_falls_back_to_torch(monkeypatch, tmp_path, caplog) -> None:
    """No compiler (or a broken one): one warning, then every layer runs on the reference path."""
    with pytest.raises(KernelBuildError):
        cpu_kernels.build(compiler=str(tmp_path / "no-such-c++"), cache=tmp_path)
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("FT_KERNEL_CACHE", str(tmp_path / "cache"))
    cpu_kernels.native_kernel.cache_clear()
    try:
        bank = random_bank("bf16", NUM_EXPERTS, 64, 32, seed=19)
        x = torch.randn(3, 64)
        ids, weights = routing(3, seed=6)
        with caplog.at_level(logging.WARNING, logger="runtime.experts.cpu_kernels"):
            executors = [CPUExpertExecutor({0: bank, 1: bank}, torch.float32) for _ in range(2)]
            outs = [ex(layer, x, ids, weights) for ex in executors for layer in (0, 1)]
        assert len([r for r in caplog.records if "kernel unavailable" in r.message]) == 1
        ref = ReferenceCPUExpertExecutor({0: bank}, torch.float32)(0, x, ids, weights)
        assert all(torch.equal(out, ref) for out in outs)
    finally:
        cpu_kernels.native_kernel.cache_clear()  # the next user builds (or finds) the real kernel


@pytest.mark.parametrize(("dtype", "grouped"), [("bf16", True), ("q8_0", False)])
def test_prefill_sized_calls_on_unquantized_banks_take_grouped_gemms(kernels, monkeypatch, dtype: str,
                                                                      grouped: bool) -> None:
    """From GROUPED_GEMM_MIN_ROWS rows per expert, a bank stored in the compute dtype runs one GEMM
    per expert (faster than the kernel there); decode calls, and quantized banks, stay on the kernel."""
    from runtime.experts import executor as executor_mod

    bank = random_bank(dtype, NUM_EXPERTS, 96, 64, seed=17)
    fast = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    grouped_calls = []
    real = executor_mod.ReferenceCPUExpertExecutor.__call__
    monkeypatch.setattr(executor_mod.ReferenceCPUExpertExecutor, "__call__",
                        lambda self, *a: (grouped_calls.append(a[1].shape[0]), real(self, *a))[1])
    prefill = executor_mod.GROUPED_GEMM_MIN_ROWS * NUM_EXPERTS // TOP_K  # tokens that make the threshold
    for num_tokens in (1, prefill - 1, prefill):
        x = torch.randn(num_tokens, 96, generator=torch.Generator().manual_seed(num_tokens)).bfloat16()
        ids, weights = routing(num_tokens, seed=num_tokens)
        out = fast(0, x, ids, weights.bfloat16())
        kernel_only = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"], grouped_gemm_min_rows=None)
        assert_close(out, kernel_only(0, x, ids, weights.bfloat16()), rel=2e-2)  # bf16 rounding between projections
    assert grouped_calls == ([prefill] if grouped else [])


@pytest.mark.parametrize("dtype, scales", [d for d in DTYPES if d[0] not in ("f32", "bf16")],
                         ids=[i for d, i in zip(DTYPES, DTYPE_IDS, strict=True) if d[0] not in ("f32", "bf16")])
def test_the_kernels_dequantizer_matches_the_reference_exactly(kernels, dtype: str, scales: bool) -> None:
    """ft_dequant_expert gives bank.weights(e, bf16) bit for bit (sizes off the SIMD width and the
    FP8 block; q8_0 rows are whole blocks)."""
    from runtime.experts.cpu_kernels import ExpertKernel

    hidden, inter = (96, 64) if dtype in ("q8_0", "mxfp4") else (200, 136)
    bank = random_bank(dtype, 4, hidden, inter, seed=19, fp8_scales=scales)
    fast = ExpertKernel(kernels["native"], bank)
    for expert in range(4):
        want, got = bank.weights(expert, torch.bfloat16), fast.dequantized(expert, threads=2)
        assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
    with pytest.raises(IndexError, match="out of range"):
        fast.dequantized(4, threads=1)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_k", "mxfp4", "f16"])
def test_experts_that_are_not_gated_dequantize_and_run(kernels, dtype: str) -> None:
    """Nemotron-H's relu2 experts, w13 the up rows alone [I, H]: the dequantizer gives those rows
    (not 2I), and the kernel, its decode and prefill sizes, computes relu(up)^2 before down."""
    from runtime.experts.cpu_kernels import ExpertKernel

    relu2 = ExpertActivation("relu2")
    hidden, inter = (256, 256) if dtype == "q4_k" else (96, 64)
    bank = random_bank(dtype, NUM_EXPERTS, hidden, inter, seed=29, activation=relu2)
    assert bank.layout.part("w13").shape == (inter, hidden)
    fast = ExpertKernel(kernels["native"], bank)
    for expert in range(3):
        want, got = bank.weights(expert, torch.bfloat16), fast.dequantized(expert, threads=2)
        assert want[0].shape == (inter, hidden) and all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
    executor = CPUExpertExecutor({0: bank}, torch.float32, threads=2, kernel=kernels["native"], grouped_gemm_min_rows=None)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 3, 40):
        x = torch.randn(num_tokens, hidden, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        # (Q4_K: the kernel rounds x and h to Q8_K, tests/test_kquant_kernel.py bounds that; the rest exact)
        assert_close(executor(0, x, ids, weights), reference(0, x, ids, weights), rel=3e-2 if dtype == "q4_k" else 1e-5)
    assert executor._layers[0] is not None


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_one_row_silu_experts_are_the_reference(kernels, dtype: str) -> None:
    """Doge's retrieval experts, one neuron each: w13 [1, H] (silu, not gated) and w2 [H, 1]; the kernel's
    decode and prefill sizes compute them as the reference does."""
    bank = random_bank(dtype, NUM_EXPERTS, 96, 1, seed=31, activation=ExpertActivation("silu"))
    assert bank.layout.part("w13").shape == (1, 96) and bank.layout.part("w2").shape == (96, 1)
    executor = CPUExpertExecutor({0: bank}, torch.float32, threads=2, kernel=kernels["native"], grouped_gemm_min_rows=None)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 3, 40):
        x = torch.randn(num_tokens, 96, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        assert_close(executor(0, x, ids, weights), reference(0, x, ids, weights), rel=1e-5)
    assert executor._layers[0] is not None


def test_long_prefills_on_quantized_banks_take_dequantized_gemms(kernels, monkeypatch) -> None:
    from runtime.experts import executor as executor_mod

    bank = random_bank("f8_e4m3", NUM_EXPERTS, 96, 64, seed=23)
    fast = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    kernel_only = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"], grouped_gemm_min_rows=None)
    dequantized = []
    real = executor_mod.ExpertKernel.dequantized
    monkeypatch.setattr(executor_mod.ExpertKernel, "dequantized",
                        lambda self, e, t, out=None: (dequantized.append(e), real(self, e, t, out))[1])
    rows = executor_mod.DEQUANT_GEMM_MIN_ROWS["other"]
    for num_tokens in (rows * NUM_EXPERTS // TOP_K - 1, rows * NUM_EXPERTS // TOP_K):
        x = torch.randn(num_tokens, 96, generator=torch.Generator().manual_seed(num_tokens)).bfloat16()
        ids, weights = routing(num_tokens, seed=num_tokens)
        before = len(dequantized)
        assert_close(fast(0, x, ids, weights.bfloat16()), kernel_only(0, x, ids, weights.bfloat16()), rel=2e-2)
        assert (len(dequantized) > before) is (num_tokens * TOP_K >= rows * NUM_EXPERTS)
    assert sorted(set(dequantized)) == list(range(NUM_EXPERTS))


def test_a_prefills_dequantized_experts_share_one_workspace(kernels) -> None:
    """Each expert of a grouped-GEMM call is dequantized into the same two tensors (fresh ones are
    fresh pages to fault in), each the values bank.weights gives."""
    bank = random_bank("q4_k", NUM_EXPERTS, 256, 256, seed=29, down_dtype="q6_k")
    executor = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    executor.prepare()
    first = executor._expert_weights(0, 0)
    addresses = tuple(t.data_ptr() for t in first)
    for expert in (1, 2):
        got = executor._expert_weights(0, expert)
        assert tuple(t.data_ptr() for t in got) == addresses
        want = bank.weights(expert, torch.bfloat16)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("variant", ["native", "avx2", "scalar"])
def test_dense_dequant_and_attention_entry_points_on_every_build(kernels, variant: str) -> None:
    """The kernel's other entry points (decode products, expert dequantization, decode attention)
    give the same answers on the AVX2 and scalar builds other CPUs get."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    from runtime.experts.cpu_kernels import ExpertKernel

    kernel = kernels[variant]
    gen = torch.Generator().manual_seed(29)
    weight = torch.randn(37, 70, generator=gen).bfloat16()  # odd sizes: SIMD tails
    x = torch.randn(3, 70, generator=gen)
    torch.testing.assert_close(kernel.dense(x, weight, 2), x @ weight.float().T, atol=1e-4, rtol=1e-4)

    bank = random_bank("f8_e4m3", 2, 200, 136, seed=31)
    assert all(torch.equal(a, b) for a, b in zip(bank.weights(1, torch.bfloat16),
                                                   ExpertKernel(kernel, bank).dequantized(1, threads=2), strict=True))

    k, v = torch.randn(150, 2, 40, generator=gen), torch.randn(150, 2, 24, generator=gen)
    q = torch.randn(6, 40, generator=gen)
    scores = torch.einsum("hd,lhd->hl", q, k.repeat_interleave(3, dim=1)) * 0.2
    want = torch.einsum("hl,lhd->hd", torch.softmax(scores, -1), v.repeat_interleave(3, dim=1))
    torch.testing.assert_close(kernel.decode_attention(q, k, v, 0.2, 2), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_the_selected_pairs_entry_point_matches_selecting_in_torch(kernels, ids_dtype, x_dtype) -> None:
    """The hybrid executor's CPU share: only the pairs the route plan marked CPU, selected by the
    kernel itself, equal the kernel run on those pairs alone (a token without any: zeros)."""
    from runtime.experts.cpu_kernels import ExpertKernel
    from runtime.gpu.kernels import CPU, HIT, PCIE

    bank = random_bank("bf16", NUM_EXPERTS, 96, 64, seed=37)
    fast = ExpertKernel(kernels["native"], bank)
    ids, weights = routing(3, seed=41)
    unique, inverse = torch.unique(ids, return_inverse=True)
    status = torch.tensor([(CPU, HIT, PCIE)[i % 3] for i in range(len(unique))], dtype=torch.int32)
    status[inverse[2]] = HIT  # token 2: nothing on the CPU
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(43)).to(x_dtype)
    w = weights.to(x_dtype)
    out = torch.full((3, 96), float("nan"))
    fast.selected(x, ids.to(ids_dtype), w, status, inverse.to(torch.int32), CPU, out, threads=2)

    on_cpu = status[inverse] == CPU
    assert on_cpu[:2].any() and not on_cpu[2].any()
    want = torch.zeros(3, 96)
    for t in range(3):
        if on_cpu[t].any():
            want[t] = fast(x[t:t + 1].float(), ids[t:t + 1, on_cpu[t]], w[t:t + 1, on_cpu[t]].float(), threads=2)[0]
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="contiguous host tensors"):
        fast.selected(x, ids, w, status.long(), inverse.to(torch.int32), CPU, out, threads=2)
