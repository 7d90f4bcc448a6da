"""The CPU expert kernel on GGML MXFP4 blocks (gpt-oss's and DeepSeek-V4's experts), read in
place on every build this CPU runs (AVX-512 with and without VNNI, AVX2, plain C++).

Oracles and tolerances, as tests/test_kquant_kernel.py's for the K-quants:
- dequantization: gguf-py's gguf.quants.dequantize, bit for bit (fp32), on random blocks with
  every e8m0 exponent (the two subnormal scales and 2^127, whose x12 overflows in both) and
  every code in both nibbles;
- the int8 products: each activation row is quantized per 32 values (d = 1 / (127 / amax), q =
  x x (127 / amax) rounded to nearest even), so the kernel computes w . x~ with x~ = d q; `q8_32`
  makes x~ so in numpy; integer sums are exact, only the fp32 scalings and lane sums round: w . x~
  to 1e-6 of sum |w| |x~| (observed <= 1.1e-7);
- experts on the int8 path (16-bit models): against the float reference, off by the activation
  rounding (x, and the activations h between the projections), a near-Gaussian error of the
  first-order standard deviation `rounding_sigma` (here through the bank's own activation and
  biases): |error| <= 6 sigma everywhere, RMS of error / sigma in [0.8, 1.25] (observed: the
  largest 4.2 sigma, RMS 0.95-1.02; the error ~1% of the output's RMS). Tried on mutants: the
  biases left out are 90-130 sigma off, one block's scale doubled 88; but one code's low bit
  flipped (one weight of one row) only 5.5, under the bound: single codes are the bit-exact
  dequantization's and the products' tests to catch. The fp32 path (float32 models) is the
  reference's to 1e-5: here and in tests/test_cpu_experts.py.
"""

from __future__ import annotations

import dataclasses

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from ftw.format import SWIGLU, ExpertActivation, ExpertPart
from runtime.experts.activation import activate
from runtime.experts.bank import HostExpertBank
from runtime.experts.cpu_kernels import (
    ExpertKernel,
    UnsupportedBank,
)
from runtime.experts.executor import CPUExpertExecutor, ReferenceCPUExpertExecutor
from runtime.experts.synthetic import random_bank
from tests import test_kquant_kernel

kernels = test_kquant_kernel.kernels  # the fixture: every build this CPU runs (the same builds)

NUM_EXPERTS, TOP_K = 16, 8
VARIANTS = ["native", "avx512", "avx2", "scalar"]


def q8_32(x: np.ndarray) -> np.ndarray:
    """x [..., n] as the kernel's int8 rows represent it (float64): the same fp32 operations."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    iscale = np.float32(127) / np.where(amax > 0, amax, np.float32(1))
    d = np.where(amax > 0, np.float32(1) / iscale, np.float32(0))
    return (np.rint(b * iscale).astype(np.float64) * d).reshape(x.shape)


def step_32(v: torch.Tensor) -> torch.Tensor:
    """Each element's rounding step s as the int8 rows round it, its error's variance s^2 / 12:
    the 32-value block's amax / 127; but 0 for the amax itself (q = +-127 exactly; a clamped
    activation's blocks can hold several), and sqrt(12) |v| for a value under half a step (it
    rounds to 0, off by -v: many of h's, whose blocks are heavy-tailed, so with uniform errors
    the RMS ratio fell to 0.83-0.96)."""
    blocks = v.reshape(*v.shape[:-1], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    step = (amax / 127).expand_as(blocks)
    step = torch.where(blocks.abs() < step / 2, blocks.abs() * 12**0.5, step)
    return torch.where(blocks.abs() == amax, 0, step).reshape(v.shape)


@pytest.mark.parametrize("variant", VARIANTS)
def test_dequantization_is_gguf_py_bit_for_bit(kernels, variant: str) -> None:
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(64, 512 // 32, 17), dtype=np.uint8)
    raw[:16, :, 0] = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every exponent
    codes = raw[..., 1:]
    assert all(set(np.unique(half)) == set(range(16)) for half in (codes & 0x0F, codes >> 4))  # every nibble, both places
    raw = raw.reshape(64, -1)
    with np.errstate(over="ignore"):  # 2^127 x 12 (both sides)
        want = gguf.quants.dequantize(raw, Q.MXFP4)
    got = kernels[variant].dequant_rows(torch.from_numpy(raw), "mxfp4").numpy()
    assert np.isinf(want).any() and not np.isnan(want).any()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    as_bf16 = kernels[variant].dequant_rows(torch.from_numpy(raw), "mxfp4", torch.bfloat16, threads=2)
    assert torch.equal(as_bf16.view(torch.int16), torch.from_numpy(want).to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("variant", VARIANTS)
def test_products_are_the_int8_model(kernels, variant: str) -> None:
    """W . x~ for 1-4 activation rows, rows of 11 blocks (an odd count: AVX-512's half step), an
    odd row count (the last row paired with itself)."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    rng = np.random.default_rng(5)
    raw = gguf.quants.quantize(rng.standard_normal((37, 352)).astype(np.float32), Q.MXFP4)
    w = gguf.quants.dequantize(raw, Q.MXFP4).astype(np.float64)
    for num_tokens in (1, 2, 3, 4):
        x = rng.standard_normal((num_tokens, 352)).astype(np.float32)
        x[0, :32] *= 100  # blocks of very different scales in one row
        x[-1, 64:96] = 0  # an all-zero block: d = 0
        got = kernels[variant].dense_blocks(torch.from_numpy(x), torch.from_numpy(raw), "mxfp4", threads=2).numpy()
        xq = q8_32(x)
        assert np.all(np.abs(got - xq @ w.T) <= 1e-6 * (np.abs(xq) @ np.abs(w).T))


def rounding_sigma(bank: HostExpertBank, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H]: the standard deviation of each output's error from rounding x and h to int8 per 32
    values (first order, errors uniform in +-step/2, independent), through the bank's activation
    and biases. Token t's output is sum_k w_k down_k(h_k) with h_k = act(gate_k x + b, up_k x + b):
    var = sum_i (B_oi step_i)^2 / 12 + sum_k w_k^2 sum_r (down_k,or step_kr)^2 / 12, B = sum_k
    w_k down_k J_k, J_k = dh_k/dx = diag(dh/dgate) gate_k + diag(dh/dup) up_k."""
    activation = bank.layout.activation
    var = torch.zeros_like(x)
    for t in range(x.shape[0]):
        jacobian_sum = torch.zeros(x.shape[1], x.shape[1])
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            w13, w2 = bank.weights(e, torch.float32)
            b13 = bank.biases(e, torch.float32)
            w1, w3 = w13.chunk(2)
            pre = w13 @ x[t] + (b13[0] if b13 else 0)
            g, u = (p.detach().requires_grad_() for p in pre.chunk(2))
            h = activate(activation, g, u)
            dg, du = torch.autograd.grad(h.sum(), (g, u))
            jacobian_sum += weights[t, k] * (w2 @ (dg[:, None] * w1 + du[:, None] * w3))
            var[t] += weights[t, k] ** 2 * (w2**2 @ (step_32(h.detach()) ** 2 / 12))
        var[t] += jacobian_sum**2 @ (step_32(x[t]) ** 2 / 12)
    return var.sqrt()


def routing(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=gen)[:TOP_K] for _ in range(num_tokens)])
    return ids, torch.rand(num_tokens, TOP_K, generator=gen)


GPT_OSS = ExpertActivation("swiglu_clamped", alpha=1.702, limit=7.0)
# (activation, bias dtype, x's scale): plain SwiGLU (DeepSeek-V4's FP4 experts but for the
# limit), with biases; gpt-oss's records (its activation, bf16 biases; x scaled so that ~8% of
# gate and up cross its limit of 7); a limit unit-scale experts cross often; DeepSeek-V4's
EXPERTS = [(SWIGLU, None, 1.0), (SWIGLU, "bf16", 1.0), (GPT_OSS, "bf16", 4.0),
           (ExpertActivation("swiglu_clamped", alpha=1.702, limit=0.7), "bf16", 1.0),
           (ExpertActivation("swiglu_limited", limit=0.5), None, 1.0)]
EXPERT_IDS = ["swiglu", "swiglu+bias", "gpt_oss", "swiglu_clamped-0.7+bias", "swiglu_limited"]


@pytest.mark.parametrize("activation, bias_dtype, x_scale", EXPERTS, ids=EXPERT_IDS)
def test_int8_expert_outputs_are_the_reference_within_activation_rounding(kernels, activation: ExpertActivation,
                                                                         bias_dtype: str | None,
                                                                         x_scale: float) -> None:
    """Decode (1 token), a few tokens, a prefill (17 tokens: several passes of 4), on every build;
    H = 320 (10 blocks) and I = 224 (7: an odd count)."""
    bank = random_bank("mxfp4", NUM_EXPERTS, 320, 224, seed=7, activation=activation, bias_dtype=bias_dtype)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    fast = {name: ExpertKernel(kernel, bank, int8_activations=True) for name, kernel in kernels.items()}
    for num_tokens in (1, 4, 17):
        x = x_scale * torch.randn(num_tokens, 320, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        want = reference(0, x, ids, weights)
        sigma = rounding_sigma(bank, x, ids, weights)
        for name, kernel in fast.items():
            ratio = (kernel(x, ids, weights, threads=2) - want).abs() / (sigma + 1e-6 * want.abs().max())
            assert ratio.max() <= 6, f"{name}, {num_tokens} tokens: an error of {ratio.max():.1f} sigma"
            rms = ratio.pow(2).mean().sqrt()
            assert 0.8 <= rms <= 1.25, f"{name}, {num_tokens} tokens: RMS {rms:.2f} sigma"
    if activation.limit is not None:  # the clamps were crossed (else plain SwiGLU again)
        w13, _ = bank.weights(0, torch.float32)
        b13 = bank.biases(0, torch.float32)
        pre = x @ w13.T + (b13[0] if b13 else 0)
        assert (pre.abs() > activation.limit).float().mean() > 0.05


def test_16_bit_models_take_the_int8_path_and_float32_ones_the_exact_one(kernels) -> None:
    """The executor's choice on gpt-oss's records: a bf16 or f16 model's output is the int8
    kernel's rounded once to its dtype, a float32 model's the reference's to 1e-5 (the fp32
    products: under 1% of the int8 path's error); any thread count gives the same bits
    (activations quantized once)."""
    bank = random_bank("mxfp4", NUM_EXPERTS, 320, 224, seed=11, activation=GPT_OSS, bias_dtype="bf16")
    x = 4 * torch.randn(6, 320, generator=torch.Generator().manual_seed(2))
    ids, weights = routing(6, seed=3)
    fast = ExpertKernel(kernels["native"], bank, int8_activations=True)
    want = ReferenceCPUExpertExecutor({0: bank}, torch.float32)(0, x, ids, weights)
    int8_error = (fast(x, ids, weights, threads=2) - want).abs().max()
    for dtype, int8 in ((torch.bfloat16, 1), (torch.float16, 1), (torch.float32, 0)):
        executor = CPUExpertExecutor({0: bank}, dtype, threads=2, kernel=kernels["native"], grouped_gemm_min_rows=None)
        executor.prepare()
        assert executor._layers[0] is not None and executor._layers[0].layout.mxfp4_int8 == int8
        xd = x.to(dtype)
        out = executor(0, xd, ids, weights.to(dtype))
        assert out.dtype == dtype
        if int8:
            assert torch.equal(out, fast(xd.float(), ids, weights.to(dtype).float(), threads=2).to(dtype))
        else:
            assert (out - want).abs().max() <= 1e-5 * want.abs().max() < 1e-2 * int8_error
    outs = [fast(x, ids, weights, threads=n) for n in (1, 2, 3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_long_prefills_take_dequantized_gemms_with_the_activation_and_biases(kernels, monkeypatch) -> None:
    """From DEQUANT_GEMM_MIN_ROWS rows per expert a bf16 model's prefill dequantizes the MXFP4
    experts (ft_dequant_expert) for torch's GEMMs, which then add the biases and compute gpt-oss's
    activation themselves: both sides of the switch are the float reference's to the int8 or bf16
    rounding (observed 1.0% and 0.5% of its norm; asserted 5%)."""
    from runtime.experts import executor as executor_mod

    bank = random_bank("mxfp4", NUM_EXPERTS, 320, 224, seed=13, activation=GPT_OSS, bias_dtype="bf16")
    fast = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    dequantized = []
    real = executor_mod.ExpertKernel.dequantized
    monkeypatch.setattr(executor_mod.ExpertKernel, "dequantized",
                        lambda self, e, t, out=None: (dequantized.append(e), real(self, e, t, out))[1])
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    rows = executor_mod.DEQUANT_GEMM_MIN_ROWS["other"]
    for num_tokens in (rows * NUM_EXPERTS // TOP_K - 1, rows * NUM_EXPERTS // TOP_K):
        x = (4 * torch.randn(num_tokens, 320, generator=torch.Generator().manual_seed(num_tokens))).bfloat16()
        ids, weights = routing(num_tokens, seed=num_tokens)
        before = len(dequantized)
        out = fast(0, x, ids, weights.bfloat16()).float()
        want = reference(0, x.float(), ids, weights.bfloat16().float())
        assert (out - want).norm() <= 0.05 * want.norm()
        assert (len(dequantized) > before) is (num_tokens * TOP_K >= rows * NUM_EXPERTS)


def _relabelled(bank: HostExpertBank, **parts: ExpertPart | None) -> HostExpertBank:
    """`bank` with some parts of its layout replaced (None: dropped), over the same bytes."""
    kept = tuple(parts.get(p.name, p) for p in bank.layout.parts)
    layout = dataclasses.replace(bank.layout, parts=tuple(p for p in kept if p is not None))
    return HostExpertBank(bank.layer, layout, bank.data)


def test_layouts_the_kernel_cannot_run_are_refused(kernels) -> None:
    """UnsupportedBank, never wrong numbers: biases the kernel would half apply or read in the
    wrong dtype, a clamped activation without its limit. The executor then takes the torch path
    (where that path can run the bank, its outputs are the reference's)."""
    bank = random_bank("mxfp4", NUM_EXPERTS, 320, 224, seed=17, activation=GPT_OSS, bias_dtype="bf16")
    b13, b2 = bank.layout.part("w13_bias"), bank.layout.part("w2_bias")
    refused = {
        "one of w13_bias and w2_bias": [_relabelled(bank, w2_bias=None), _relabelled(bank, w13_bias=None)],
        "expert biases are bf16 [448] and f16 [320]": [_relabelled(bank, w2_bias=dataclasses.replace(b2, dtype="f16"))],
        "expert biases are f32 [224] and f32 [160]": [  # a w13_bias of I values, not 2I
            _relabelled(bank, w13_bias=dataclasses.replace(b13, dtype="f32", shape=(224,)),
                        w2_bias=dataclasses.replace(b2, dtype="f32", shape=(160,)))],
        "no expert activation swiglu_clamped": [
            HostExpertBank(0, dataclasses.replace(bank.layout, activation=ExpertActivation("swiglu_clamped")), bank.data)],
        "no expert activation gelu": [
            HostExpertBank(0, dataclasses.replace(bank.layout, activation=ExpertActivation("gelu", limit=7.0)), bank.data)],
    }
    for reason, banks in refused.items():
        for wrong in banks:
            with pytest.raises(UnsupportedBank, match=reason.replace("[", r"\[").replace("]", r"\]")):
                ExpertKernel(kernels["native"], wrong)
            executor = CPUExpertExecutor({0: wrong}, torch.bfloat16, kernel=kernels["native"])
            executor.prepare()
            assert executor._layers[0] is None
    x = torch.randn(3, 320, generator=torch.Generator().manual_seed(4))
    ids, weights = routing(3, seed=4)
    mixed = refused["expert biases are bf16 [448] and f16 [320]"][0]
    fallback = CPUExpertExecutor({0: mixed}, torch.float32, kernel=kernels["native"])
    assert torch.equal(fallback(0, x, ids, weights), ReferenceCPUExpertExecutor({0: mixed}, torch.float32)(0, x, ids, weights))
