"""GGML block quants dequantized by torch ops where the bytes lie (runtime/experts/ggml_blocks.py):
bit-exact against gguf-py, and a tiny Q4_K_M GGUF decoding on the hybrid runtime (its experts
read from cache slots and streamed banks as stored) to the tokens of its f32 twin."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from ftw.format import BLOCK_DTYPES
from runtime.experts.ggml_blocks import DEVICE_BLOCK_DTYPES, dequantize_blocks
from runtime.experts.synthetic import quantize_kquant


def _same_bits(ours: np.ndarray, ref: np.ndarray) -> bool:
    """Equal float32 bit patterns, NaNs (of any payload) in the same places."""
    nan = np.isnan(ref)
    return bool(np.array_equal(nan, np.isnan(ours)) and np.array_equal(ours[~nan].view(np.uint32),
                                                                       ref[~nan].view(np.uint32)))


@pytest.mark.parametrize("dtype", sorted(DEVICE_BLOCK_DTYPES))
def test_every_byte_pattern_dequantizes_as_gguf_py_does(dtype: str) -> None:
    """Random bytes (every scale, every nibble; infinite and NaN fp16 scales among them) give
    gguf-py's float32 values bit for bit, in [n, R, C] for n weights of [R, C]."""
    block, size = BLOCK_DTYPES[dtype]
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(5, 3 * 2 * size), dtype=np.uint8)  # 5 weights of [3, 2 blocks]
    with np.errstate(invalid="ignore", over="ignore"):  # inf x 0 in gguf-py: NaN, as ours
        ref = dequantize(raw.reshape(15, -1), GGMLQuantizationType[dtype.upper()]).reshape(5, 3, 2 * block)
    ours = dequantize_blocks(torch.from_numpy(raw), dtype, (3, 2 * block))
    assert ours.dtype == torch.float32 and ours.shape == (5, 3, 2 * block)
    assert _same_bits(ours.numpy(), ref)


@pytest.mark.parametrize("dtype", sorted(DEVICE_BLOCK_DTYPES))
def test_quantized_weights_dequantize_as_gguf_py_does(dtype: str) -> None:
    """Weights as the quantizers write them (gguf-py's, the K-quant writer of the tests)."""
    w = np.random.default_rng(8).standard_normal((4, 512)).astype(np.float32)
    if dtype in ("q2_k", "q3_k"):
        pytest.skip(f"no {dtype} quantizer here (gguf-py has none; the random-bytes test covers it)")
    raw = quantize_kquant(w, dtype) if dtype.endswith("_k") else quantize(w, GGMLQuantizationType[dtype.upper()])
    ref = dequantize(raw, GGMLQuantizationType[dtype.upper()])
    ours = dequantize_blocks(torch.from_numpy(np.ascontiguousarray(raw)).reshape(1, -1), dtype, (4, 512))[0]
    assert _same_bits(ours.numpy(), ref)
    assert np.abs(ref - w).max() < 0.5  # (and they are the weights, roughly)


def test_bytes_that_do_not_hold_the_weights_are_refused() -> None:
    raw = torch.zeros(2, 144, dtype=torch.uint8)
    assert dequantize_blocks(raw, "q4_k", (1, 256)).shape == (2, 1, 256)
    with pytest.raises(ValueError, match=r"q4_k \[2, 256\]: expected uint8 \[n, 288\]"):
        dequantize_blocks(raw, "q4_k", (2, 256))
    with pytest.raises(ValueError, match="expected uint8"):
        dequantize_blocks(raw.view(torch.int8), "q4_k", (1, 256))
    with pytest.raises(ValueError, match="tq1_0 has no device dequantizer"):
        dequantize_blocks(torch.zeros(1, 54, dtype=torch.uint8), "tq1_0", (1, 256))


def test_a_tiny_q4_k_m_gguf_on_the_hybrid_runtime_decodes_as_its_f32_twin() -> None:
    """The hybrid runtime on CPU tensors (CI's stand-in for the GPU: the same torch ops), plain
    offload, its cache 5 slots for 8 experts: every expert is read from a slot or a streamed
    bank as Q4_K/Q6_K blocks and dequantized there, exactly, so 24 greedy tokens equal those of
    the same weights dequantized to F32 (no activation rounding, unlike the CPU kernel's Q8_K)."""
    from runtime.engine import Session
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.text.sampling import SamplingParams
    from runtime.text.tokenizer import Tokenizer
    from tests.test_kquant_kernel import pull_q4_k_m_and_its_f32_twin

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        store, names = pull_q4_k_m_and_its_f32_twin(Path(tmp))
        tokenizer = Tokenizer.from_model(open_model(store, names[0]))
        prompt = tokenizer.encode("abc abd bbc aab bca")
        hybrid = load(store, names[0], torch.float32, backend="gpu", device="cpu", mode="offload", cache_slots=5,
                      prefill_min_tokens=4)
        layout = hybrid.experts.banks[min(hybrid.experts.banks)].layout
        assert (layout.part("w13").dtype, layout.part("w2").dtype) == ("q4_k", "q6_k")
        greedy = SamplingParams(temperature=0, max_tokens=24)
        ours = Session(hybrid.model, tokenizer, 256).generate(prompt, greedy).tokens
        want = Session(load(store, names[1], torch.float32).model, tokenizer, 256).generate(prompt, greedy).tokens
        s = hybrid.experts.stats()
        hybrid.experts.close()
    assert len(ours) == 24 and ours == want
    assert s.prefill_calls and s.pcie_experts and s.hits  # streamed banks, fills and hits all read blocks
