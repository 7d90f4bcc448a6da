"""The CPU expert kernel on GGML K-quants (csrc/kquants.cpp): Q4_K, Q5_K and Q6_K read in place,
on every build this CPU runs (AVX-512 with and without VNNI, AVX2, plain C++).

Oracles and tolerances:
- dequantization: gguf-py's gguf.quants.dequantize, bit for bit (fp32), on random blocks;
- products: the kernel quantizes each activation row to Q8_K (per 256 values d = 1 / (127 /
  amax), q = x x (127 / amax) rounded to nearest even) and multiplies integers, so it computes
  w . x~ with x~ = d q. `q8k` below makes x~ the same way in numpy; the integer sums are exact and
  only the fp32 products of the two scales and the lane sums round, so the kernel gives w . x~ to
  1e-6 of sum |w| |x~| (observed <= 4e-8);
- experts: against the float reference (gguf-py's weights, fp32 activations). They differ by the
  activation rounding: every x_i (and, for a K-quant down, every SwiGLU output h_r) is off by a
  rounding error uniform in +-d/2 of its block's step d, independently (llama.cpp's
  test-quantize-fns bounds a Q8_K dot product's error per element; this model bounds each output
  element). To first order an output is off by a sum of those errors times coefficients the
  reference knows (`rounding_sigma`), a near-Gaussian error of standard deviation sigma. Asserted:
  |error| <= 6 sigma everywhere (the largest of ~10k elements is ~4 sigma) and the RMS of
  error / sigma in [0.8, 1.25] (observed 0.94-1.06). A wrong scale, a lost min or a misrouted row
  is off by many sigma.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from registry import Store
from runtime.experts import cpu_kernels
from runtime.experts.bank import HostExpertBank
from runtime.experts.cpu_kernels import (
    AVX2_FLAGS,
    KQUANT_DTYPES,
    NATIVE_FLAGS,
    NO_VNNI_FLAGS,
    SCALAR_FLAGS,
    ExpertKernel,
    Kernel,
    KernelBuildError,
)
from runtime.experts.executor import CPUExpertExecutor, ReferenceCPUExpertExecutor
from runtime.experts.synthetic import quantize_kquant, random_bank
from tests.test_cpu_experts import _cpu_flags

NUM_EXPERTS, TOP_K = 16, 8
F16_FIELDS = {"q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,)}  # byte offsets of the f16 scales in a block


@pytest.fixture(scope="module")
def kernels() -> dict[str, Kernel]:
    """Every build whose K-quant path this CPU can run: native, AVX-512 without VNNI, AVX2, scalar."""
    flags = _cpu_flags()
    variants = {"native": NATIVE_FLAGS, "scalar": SCALAR_FLAGS}
    if {"avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        variants["avx512"] = NO_VNNI_FLAGS
    if {"avx2", "fma", "f16c"} <= flags:
        variants["avx2"] = AVX2_FLAGS
    try:
        with ThreadPoolExecutor(2) as pool:
            paths = dict(zip(variants, pool.map(cpu_kernels.build, variants.values()), strict=True))
    except KernelBuildError as e:
        pytest.skip(f"no C++ compiler here: {e}")
    return {name: Kernel(path) for name, path in paths.items()}


def random_blocks(dtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks, uint8 [rows, row bytes]: any bytes, the f16 scales any finite value
    (negative, subnormal, up to 65504)."""
    block_size, type_size = gguf.constants.GGML_QUANT_SIZES[Q[dtype.upper()]]
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for at in F16_FIELDS[dtype]:
        bits = rng.integers(0, 1 << 16, size=len(blocks), dtype=np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF  # an inf or NaN exponent made finite
        blocks[:, at : at + 2] = bits.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def q8k(x: np.ndarray) -> np.ndarray:
    """x [..., n] as the kernel's Q8_K represents it (float64): the same fp32 operations."""
    b = x.astype(np.float32).reshape(*x.shape[:-1], -1, 256)
    amax = np.abs(b).max(-1, keepdims=True)
    iscale = np.float32(127) / np.where(amax > 0, amax, np.float32(1))
    d = np.where(amax > 0, np.float32(1) / iscale, np.float32(0))
    return (np.rint(b * iscale).astype(np.float64) * d).reshape(x.shape)


@pytest.mark.parametrize("variant", ["native", "avx512", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", KQUANT_DTYPES)
def test_dequantization_is_gguf_py_bit_for_bit(kernels, variant: str, dtype: str) -> None:
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    raw = random_blocks(dtype, 160, 512, np.random.default_rng(1))  # past the size that takes threads
    want = gguf.quants.dequantize(raw, Q[dtype.upper()])
    got = kernels[variant].dequant_rows(torch.from_numpy(raw), dtype).numpy()
    assert np.isfinite(want).all() and np.array_equal(got.view(np.uint32), want.view(np.uint32))
    threaded = kernels[variant].dequant_rows(torch.from_numpy(raw), dtype, threads=2).numpy()
    assert np.array_equal(threaded.view(np.uint32), want.view(np.uint32))
    # a CPU prompt's bf16 rows (block_weight.py): the values rounded as torch rounds them
    as_bf16 = kernels[variant].dequant_rows(torch.from_numpy(raw), dtype, torch.bfloat16, threads=2)
    assert torch.equal(as_bf16.view(torch.int16), torch.from_numpy(want).to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("variant", ["native", "avx2", "scalar"])
def test_bf16_dequantization_for_prefill_gemms(kernels, variant: str) -> None:
    """ft_dequant_expert (prefill's dequantize-then-GEMM path) gives bank.weights(e, bf16) bit for
    bit, gate, up and down of three types, and a w13 bank."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    for bank in (random_bank("q4_k", 3, 512, 256, seed=2, up_dtype="q5_k", down_dtype="q6_k"),
                 random_bank("q6_k", 3, 256, 512, seed=3, down_dtype="q4_k")):
        fast = ExpertKernel(kernels[variant], bank)
        for expert in range(3):
            want, got = bank.weights(expert, torch.bfloat16), fast.dequantized(expert, threads=2)
            assert all(torch.equal(w, g) for w, g in zip(want, got, strict=True))


@pytest.mark.parametrize("variant", ["native", "avx512", "avx2", "scalar"])
def test_q8_0_rows_dequantize_and_multiply_in_place(kernels, variant: str) -> None:
    """A GGUF file's Q8_0 projections, kept as blocks (planner/footprint.keeps_blocks): their rows
    dequantize to gguf-py's values bit for bit (a prompt's products; bf16 as torch rounds them),
    and a decode product of 1-4 tokens is the fp32 product with those values, rows over threads."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    rng = np.random.default_rng(9)
    raw = gguf.quants.quantize(rng.standard_normal((301, 512)).astype(np.float32), Q.Q8_0)
    want = gguf.quants.dequantize(raw, Q.Q8_0)
    kernel = kernels[variant]
    got = kernel.dequant_rows(torch.from_numpy(raw), "q8_0", threads=2).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    as_bf16 = kernel.dequant_rows(torch.from_numpy(raw), "q8_0", torch.bfloat16, threads=2)
    assert torch.equal(as_bf16.view(torch.int16), torch.from_numpy(want).to(torch.bfloat16).view(torch.int16))
    for num_tokens in (1, 2, 3, 4):
        x = rng.standard_normal((num_tokens, 512)).astype(np.float32)
        out = kernel.dense_blocks(torch.from_numpy(x), torch.from_numpy(raw), "q8_0", threads=2).numpy()
        exact = x.astype(np.float64) @ want.astype(np.float64).T
        assert np.all(np.abs(out - exact) <= 1e-5 * (np.abs(x) @ np.abs(want).T))


@pytest.mark.parametrize("variant", ["native", "avx512", "avx2", "scalar"])
@pytest.mark.parametrize("dtype", KQUANT_DTYPES)
def test_products_are_the_q8_k_model(kernels, variant: str, dtype: str) -> None:
    """W . x~ for 1-4 activation rows (x~: x as Q8_K), random blocks with realistic scales, rows of
    three super-blocks, an odd row count (the last row paired with itself)."""
    if variant not in kernels:
        pytest.skip(f"this CPU cannot run the {variant} build")
    rng = np.random.default_rng(5)
    raw = quantize_kquant(rng.standard_normal((37, 768)).astype(np.float32), dtype)
    w = gguf.quants.dequantize(raw, Q[dtype.upper()]).astype(np.float64)
    for num_tokens in (1, 2, 3, 4):
        x = rng.standard_normal((num_tokens, 768)).astype(np.float32)
        x[0, :256] *= 100  # blocks of very different scales in one row
        x[-1, 256:512] = 0  # an all-zero block: d = 0
        got = kernels[variant].dense_blocks(torch.from_numpy(x), torch.from_numpy(raw), dtype, threads=2).numpy()
        xq = q8k(x)
        assert np.all(np.abs(got - xq @ w.T) <= 1e-6 * (np.abs(xq) @ np.abs(w).T))


@pytest.mark.parametrize("dtype", KQUANT_DTYPES)
def test_products_split_over_threads_cover_every_row(kernels, dtype: str) -> None:
    """A matrix large enough for several threads, whose shares have odd and even row counts (each
    thread walks its share's two halves side by side): every row's product is the Q8_K model's."""
    rng = np.random.default_rng(6)
    raw = quantize_kquant(rng.standard_normal((1001, 512)).astype(np.float32), dtype)
    w = gguf.quants.dequantize(raw, Q[dtype.upper()]).astype(np.float64)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    for threads in (2, 3, 7):
        got = kernels["native"].dense_blocks(torch.from_numpy(x), torch.from_numpy(raw), dtype, threads=threads).numpy()
        xq = q8k(x)
        assert np.all(np.abs(got - xq @ w.T) <= 1e-6 * (np.abs(xq) @ np.abs(w).T)), threads


def rounding_sigma(bank: HostExpertBank, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """[T, H]: the standard deviation of each output's error from rounding the activations of the
    bank's K-quant matrices to Q8_K (first order, errors uniform in +-step/2, independent).

    Token t's output is sum_k w_k down_k(h_k) with h_k = silu(gate_k x) * up_k x. An error e in x
    moves it by sum_k w_k down_k J_k e (J_k = dh_k/dx: only through the K-quant ones of gate and
    up); an error f in h_k, by w_k down_k f. So var = sum_i (B_oi step_i)^2 / 12 + sum_k w_k^2
    sum_r (down_k,or step_kr)^2 / 12 with B = sum_k w_k down_k J_k."""
    layout = bank.layout
    gate_type, up_type = ((layout.part("w13").dtype,) * 2 if bank.has_part("w13")
                          else (layout.part("w1").dtype, layout.part("w3").dtype))
    gate_q, up_q = gate_type in KQUANT_DTYPES, up_type in KQUANT_DTYPES
    down_q = layout.part("w2").dtype in KQUANT_DTYPES
    experts = {e: bank.weights(e, torch.float32) for e in ids.unique().tolist()}
    var = torch.zeros_like(x)
    for t in range(x.shape[0]):
        jacobian_sum = torch.zeros(x.shape[1], x.shape[1])
        for k in range(ids.shape[1]):
            w13, w2 = experts[int(ids[t, k])]
            w1, w3 = w13.chunk(2)
            g, u = w1 @ x[t], w3 @ x[t]
            sig = torch.sigmoid(g)
            if gate_q or up_q:
                jacobian = (sig * (1 + g * (1 - sig)) * u)[:, None] * w1 * gate_q + (F.silu(g))[:, None] * w3 * up_q
                jacobian_sum += weights[t, k] * (w2 @ jacobian)
            if down_q:
                var[t] += weights[t, k] ** 2 * (w2**2 @ (q8k_step(F.silu(g) * u) ** 2 / 12))
        if gate_q or up_q:
            var[t] += jacobian_sum**2 @ (q8k_step(x[t]) ** 2 / 12)
    return var.sqrt()


def q8k_step(v: torch.Tensor) -> torch.Tensor:
    """Each element's Q8_K step: its 256-value block's amax / 127."""
    blocks = v.reshape(-1, 256)
    return (blocks.abs().amax(-1, keepdim=True) / 127).expand_as(blocks).reshape(v.shape)


def routing(num_tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(NUM_EXPERTS, generator=gen)[:TOP_K] for _ in range(num_tokens)])
    return ids, torch.rand(num_tokens, TOP_K, generator=gen)


# (gate, up, down): one type; Q4_K_M's Q4_K experts with a Q6_K down; gate and up apart (the
# tiny GGUF's layer 1); a K-quant down under float gate/up, and the other way round
EXPERT_TYPES = [("q4_k",) * 3, ("q5_k",) * 3, ("q6_k",) * 3, ("q4_k", "q4_k", "q6_k"), ("q4_k", "q5_k", "q8_0"),
                ("bf16", "bf16", "q6_k"), ("q6_k", "q6_k", "f16")]


@pytest.mark.parametrize("types", EXPERT_TYPES, ids=["/".join(t) for t in EXPERT_TYPES])
def test_expert_outputs_are_the_reference_within_activation_rounding(kernels, types: tuple[str, str, str]) -> None:
    """Decode (1 token), a few tokens, and a prefill (17 tokens: ~8 per expert, several passes of
    4), on every build; rows of two super-blocks (H = 512) and one (I = 256)."""
    gate, up, down = types
    bank = random_bank(gate, NUM_EXPERTS, 512, 256, seed=7, up_dtype=up, down_dtype=down)
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    for num_tokens in (1, 4, 17):
        x = torch.randn(num_tokens, 512, generator=torch.Generator().manual_seed(num_tokens))
        ids, weights = routing(num_tokens, seed=num_tokens)
        want = reference(0, x, ids, weights)
        sigma = rounding_sigma(bank, x, ids, weights)
        for name, kernel in kernels.items():
            fast = CPUExpertExecutor({0: bank}, torch.float32, threads=2, kernel=kernel, grouped_gemm_min_rows=None)
            ratio = (fast(0, x, ids, weights) - want).abs() / (sigma + 1e-6 * want.abs().max())
            assert fast._layers[0] is not None  # the kernel ran, not the fallback
            assert ratio.max() <= 6, f"{name}, {num_tokens} tokens: an error of {ratio.max():.1f} sigma"
            rms = ratio.pow(2).mean().sqrt()
            assert 0.8 <= rms <= 1.25, f"{name}, {num_tokens} tokens: RMS {rms:.2f} sigma"


@pytest.mark.parametrize("types", [("q4_k", "q4_k", "q6_k"), ("q5_k", "q6_k", "q5_k")], ids=["q4_k_m", "q5_k/q6_k"])
def test_a_prompts_wide_passes_give_each_tokens_decode_bits(kernels, types: tuple[str, str, str]) -> None:
    """A prompt's K-quant rows take up to 8 tokens a pass, each row alone (kquants.h MAX_NT), where
    decode takes up to 4 with two rows side by side: every token's arithmetic is the same, so a
    prompt whose experts get 1 to 21 tokens each (a remainder of every size) gives each token the
    bits its own one-token call gives, on every build."""
    gate, up, down = types
    bank = random_bank(gate, NUM_EXPERTS, 512, 256, seed=31, up_dtype=up, down_dtype=down)
    gen = torch.Generator().manual_seed(8)
    num_tokens = 21
    rows = []
    for t in range(num_tokens):  # expert 3 gets all 21 tokens, expert 5 13 or more, the others 4-18
        first = [3, 5] if t < 13 else [3]
        rest = [e for e in torch.randperm(NUM_EXPERTS, generator=gen).tolist() if e not in first]
        rows.append(first + rest[: TOP_K - len(first)])
    ids = torch.tensor(rows)
    weights = torch.rand(num_tokens, TOP_K, generator=gen)
    x = torch.randn(num_tokens, 512, generator=gen).bfloat16()
    for name, kernel in kernels.items():
        fast = CPUExpertExecutor({0: bank}, torch.bfloat16, threads=2, kernel=kernel, grouped_gemm_min_rows=None)
        whole = fast(0, x, ids, weights.bfloat16())
        alone = torch.cat([fast(0, x[t:t + 1], ids[t:t + 1], weights[t:t + 1].bfloat16()) for t in range(num_tokens)])
        assert torch.equal(whole.view(torch.int16), alone.view(torch.int16)), name


def test_threads_and_the_selected_pairs_entry_point(kernels) -> None:
    """Any thread count gives the same bits (activations are quantized once, in order); the hybrid
    runtime's selected-pairs entry equals the kernel run on the selected pairs alone."""
    from runtime.gpu.kernels import CPU, HIT

    bank = random_bank("q4_k", NUM_EXPERTS, 512, 256, seed=11, down_dtype="q6_k")
    x = torch.randn(24, 512)
    ids, weights = routing(24, seed=3)
    outs = [CPUExpertExecutor({0: bank}, torch.float32, threads=n, kernel=kernels["native"],
                              grouped_gemm_min_rows=None)(0, x, ids, weights) for n in (1, 2, 3)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])

    fast = ExpertKernel(kernels["native"], bank)
    unique, inverse = torch.unique(ids[:2], return_inverse=True)
    status = torch.tensor([(CPU, HIT)[i % 2] for i in range(len(unique))], dtype=torch.int32)
    out = torch.full((2, 512), float("nan"))
    fast.selected(x[:2].contiguous(), ids[:2].contiguous(), weights[:2].contiguous(), status, inverse.to(torch.int32),
                  CPU, out, threads=2)
    on_cpu = status[inverse] == CPU
    for t in range(2):
        alone = fast(x[t:t + 1], ids[t:t + 1, on_cpu[t]], weights[t:t + 1, on_cpu[t]], threads=2)[0]
        assert torch.equal(out[t], alone)


def test_long_prefills_on_kquant_banks_take_dequantized_gemms(kernels, monkeypatch) -> None:
    from runtime.experts import executor as executor_mod

    bank = random_bank("q4_k", NUM_EXPERTS, 256, 256, seed=13, down_dtype="q6_k")
    fast = CPUExpertExecutor({0: bank}, torch.bfloat16, kernel=kernels["native"])
    dequantized = []
    real = executor_mod.ExpertKernel.dequantized
    monkeypatch.setattr(executor_mod.ExpertKernel, "dequantized",
                        lambda self, e, t, out=None: (dequantized.append(e), real(self, e, t, out))[1])
    reference = ReferenceCPUExpertExecutor({0: bank}, torch.float32)
    rows = executor_mod.DEQUANT_GEMM_MIN_ROWS["q4_k"]
    for num_tokens in (rows * NUM_EXPERTS // TOP_K - 1, rows * NUM_EXPERTS // TOP_K):
        x = torch.randn(num_tokens, 256, generator=torch.Generator().manual_seed(num_tokens)).bfloat16()
        ids, weights = routing(num_tokens, seed=num_tokens)
        before = len(dequantized)
        out = fast(0, x, ids, weights.bfloat16()).float()
        want = reference(0, x.float(), ids, weights.bfloat16().float())
        assert (out - want).norm() <= 0.05 * want.norm()  # bf16 between the projections, or Q8_K activations
        assert (len(dequantized) > before) is (num_tokens * TOP_K >= rows * NUM_EXPERTS)


# ---- end to end: a tiny Q4_K_M GGUF decodes as its f32 twin ----

def tiny_q4_k_m_tensors(seed: int) -> dict[str, tuple[Q, np.ndarray]]:
    """tests/test_ftw_gguf.py's 2-layer Qwen3-MoE as a Q4_K_M file quantizes it: experts Q4_K gate
    and up with a Q6_K down, a Q6_K LM head, Q8_0 embeddings and attention; Gaussian weights of
    unit-gain scales (so every part moves the tokens)."""
    from tests.test_ftw_gguf import HEAD_DIM, HEADS, HIDDEN, INTER, LAYERS, VOCAB
    from tests.test_ftw_gguf import NUM_EXPERTS as E

    rng = np.random.default_rng(seed)

    def weight(qtype: Q, *shape: int, std: float | None = None) -> np.ndarray:
        w = (rng.standard_normal(shape) * (std or shape[-1] ** -0.5)).astype(np.float32)
        if qtype in (Q.Q4_K, Q.Q6_K):
            return quantize_kquant(w.reshape(-1, shape[-1]), qtype.name.lower()).reshape(*shape[:-1], -1)
        return w if qtype == Q.F32 else w.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(w, qtype)

    ones = {n: np.ones(n, dtype=np.float32) for n in (HIDDEN, HEAD_DIM)}
    t = {"token_embd.weight": (Q.Q8_0, weight(Q.Q8_0, VOCAB, HIDDEN, std=1.0)),
         "output_norm.weight": (Q.F32, ones[HIDDEN]), "output.weight": (Q.Q6_K, weight(Q.Q6_K, VOCAB, HIDDEN))}
    for layer in range(LAYERS):
        p = f"blk.{layer}."
        t |= {p + "attn_norm.weight": (Q.F32, ones[HIDDEN]), p + "ffn_norm.weight": (Q.F32, ones[HIDDEN]),
              p + "attn_q.weight": (Q.Q8_0, weight(Q.Q8_0, HEADS * HEAD_DIM, HIDDEN)),
              p + "attn_k.weight": (Q.Q8_0, weight(Q.Q8_0, 2 * HEAD_DIM, HIDDEN)),
              p + "attn_v.weight": (Q.Q8_0, weight(Q.Q8_0, 2 * HEAD_DIM, HIDDEN)),
              p + "attn_output.weight": (Q.F16, weight(Q.F16, HIDDEN, HEADS * HEAD_DIM)),
              p + "attn_q_norm.weight": (Q.F32, ones[HEAD_DIM]), p + "attn_k_norm.weight": (Q.F32, ones[HEAD_DIM]),
              p + "ffn_gate_inp.weight": (Q.F32, weight(Q.F32, E, HIDDEN)),
              p + "ffn_gate_exps.weight": (Q.Q4_K, weight(Q.Q4_K, E, INTER, HIDDEN)),
              p + "ffn_up_exps.weight": (Q.Q4_K, weight(Q.Q4_K, E, INTER, HIDDEN)),
              p + "ffn_down_exps.weight": (Q.Q6_K, weight(Q.Q6_K, E, HIDDEN, INTER))}
    return t


def as_f32(tensors: dict[str, tuple[Q, np.ndarray]]) -> dict[str, tuple[Q, np.ndarray]]:
    """The same model with every tensor dequantized by gguf-py and stored as F32."""
    return {name: (Q.F32, data.astype(np.float32) if qtype in (Q.F32, Q.F16) else gguf.quants.dequantize(data, qtype))
            for name, (qtype, data) in tensors.items()}


def pull_q4_k_m_and_its_f32_twin(tmp: Path, seed: int = 9) -> tuple[Store, list[str]]:
    """(the store, [the Q4_K_M model's name, its f32 twin's]): tiny_q4_k_m_tensors written as two
    GGUF files and pulled through ft."""
    from ftpull.pull import pull
    from tests.test_ftw_gguf import write_gguf

    tensors = tiny_q4_k_m_tensors(seed=seed)
    store = Store(tmp / "ft")
    names = [str(pull(str(write_gguf(tmp / f"Tiny-{tag}.gguf", t)), store).name)
             for tag, t in (("Q4_K_M", tensors), ("F32", as_f32(tensors)))]
    return store, names


def test_a_tiny_q4_k_m_gguf_decodes_as_its_f32_twin() -> None:
    """Pulled, loaded and run as `ft run --device cpu` would (f32 compute), 24 greedy tokens equal
    those of the same weights dequantized to F32 in a second GGUF (the kernel's f32 path, no
    activation rounding). With this seed the f32 model's smallest top-2 logit margin along its
    answer (0.063; logits of std 1) is 1.7x the largest logit difference the Q8_K activations make
    (0.037, typically 0.025), which the test checks too: equal tokens are expected, not lucky.
    Elsewhere a token can part where the f32 margin is smaller than that, or where the rounding
    tips the router of a later layer (as in llama.cpp, which rounds activations the same way)."""
    from runtime.engine import Session
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.text.sampling import SamplingParams
    from runtime.text.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        store, names = pull_q4_k_m_and_its_f32_twin(Path(tmp))
        tokenizer = Tokenizer.from_model(open_model(store, names[0]))
        prompt = tokenizer.encode("abc abd bbc aab")
        models = [load(store, name, torch.float32) for name in names]
        layout = models[0].weights.banks[0].layout
        assert (layout.part("w13").dtype, layout.part("w2").dtype) == ("q4_k", "q6_k")
        greedy = SamplingParams(temperature=0, max_tokens=24)
        answers = [Session(m.model, tokenizer, 256).generate(prompt, greedy).tokens for m in models]
        assert all(m.model.blocks[0].ffn.executor._layers[0] is not None for m in models)  # the kernel ran both
        sequence = torch.tensor(prompt + answers[1])
        quant, full = (m.model.forward(sequence, Session(m.model, tokenizer, 256).state)[len(prompt) - 1 : -1]
                       for m in models)
    top2 = full.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > (quant - full).abs().max(), "the f32 answer has a near tie: pick a seed"
    assert len(answers[1]) == 24 and answers[0] == answers[1]
