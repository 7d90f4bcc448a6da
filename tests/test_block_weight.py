"""A GGUF model's K-quant projections kept as their blocks (runtime/layers/block_weight.py) and
multiplied in place by `linear`.

Oracles: the weights dequantized by ggml_blocks.dequantize_blocks (bit-exact with gguf-py):
- a prompt's product (and any float32 model's) dequantizes chunks of rows into the activations'
  dtype and multiplies them, so it is F.linear with the whole dequantized weight in that dtype,
  to the summation order of the two matmuls (chunk boundaries included);
- a 16-bit decode product on the CPU is the expert kernel's `dense_blocks` (activations rounded
  to Q8_K; tests/test_kquant_kernel.py bounds that rounding) exactly;
- on the GPU the cache's block GEMV reads the weight as one slot's record (under
  TRITON_INTERPRET=1 on CPU tensors without CUDA): float32 products of the exact weights, so
  within float32 summation order of the dequantized matmul.
And the loader keeps what the planner counts as stored, and a model decodes with it as with the
weights widened at load.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from runtime.experts.cpu_kernels import native_kernel
from runtime.experts.ggml_blocks import dequantize_blocks
from runtime.experts.synthetic import quantize_kquant
from runtime.layers import block_weight
from runtime.layers.linear import linear
from runtime.loading.read_ftw import BlockWeight
from runtime.planner.footprint import keeps_blocks
from tests.kernels import DEVICE, import_kernel, needs

dense_block_gemv = import_kernel("block_gemv", "dense_block_gemv")
needs_kernel = pytest.mark.skipif(native_kernel() is None, reason="no C++ compiler here")


def _weight(kind: str, rows: int, cols: int, seed: int = 0) -> BlockWeight:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * cols**-0.5
    return BlockWeight(torch.from_numpy(quantize_kquant(w, kind)), kind, (rows, cols))


def _dequantized(weight: BlockWeight) -> torch.Tensor:
    return dequantize_blocks(weight.data, weight.dtype_name, (weight.shape[1],))


@pytest.mark.parametrize("kind", ["q4_k", "q5_k", "q6_k"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_prompts_product_is_f_linear_with_the_dequantized_weight(monkeypatch, kind: str, dtype: torch.dtype) -> None:
    """Rows dequantized a few at a time (37 rows in chunks of 8: a last partial chunk), with and
    without a bias, for inputs of more than two dimensions too."""
    monkeypatch.setattr(block_weight, "DEQUANT_CHUNK_BYTES", 8 * 4 * 512)
    weight, gen = _weight(kind, 37, 512), torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, 512, generator=gen).to(dtype)
    bias = torch.randn(37, generator=gen).to(dtype)
    full = _dequantized(weight).to(dtype)
    for b in (None, bias):
        ours = linear(x, weight, b)
        assert ours.dtype == dtype and ours.shape == (2, 6, 37)
        ref = F.linear(x, full, b)  # (to the summation order of the matmuls; 16 bits: and a bias added after)
        ulps = 1e-5 if dtype == torch.float32 else 2 * 2**-8
        torch.testing.assert_close(ours, ref, rtol=ulps, atol=ulps * ref.abs().max().item())


@needs_kernel
@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
@pytest.mark.parametrize("tokens", [1, 4])
def test_a_16_bit_decode_product_on_the_cpu_reads_the_blocks_in_place(kind: str, tokens: int) -> None:
    """The kernel's integer products, exactly; they are the exact product's to the Q8_K rounding
    of the activations (a few tenths of a percent of the output's scale here)."""
    weight, gen = _weight(kind, 300, 1024, seed=2), torch.Generator().manual_seed(3)
    x = torch.randn(tokens, 1024, generator=gen).to(torch.bfloat16)
    ours = linear(x, weight)
    kernel = native_kernel().dense_blocks(x, weight.data, kind, torch.get_num_threads())  # type: ignore[union-attr]
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, kernel.to(torch.bfloat16))
    exact = x.float() @ _dequantized(weight).T
    assert (kernel - exact).abs().max() < 0.02 * exact.abs().max()
    assert not torch.equal(kernel, exact)  # (the rounding is there: the in-place path ran)


def test_a_float32_model_gets_the_reference_products_in_decode() -> None:
    weight = _weight("q4_k", 40, 256, seed=4)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(5))
    assert torch.equal(linear(x, weight), F.linear(x, _dequantized(weight)))


@needs(dense_block_gemv)
@pytest.mark.parametrize("kind", ["q4_k", "q6_k"])
def test_the_devices_decode_product_reads_the_weight_as_one_slot(kind: str) -> None:
    weight, gen = _weight(kind, 40, 512, seed=6), torch.Generator().manual_seed(7)
    x = torch.randn(3, 512, generator=gen).to(torch.bfloat16)
    ours = dense_block_gemv(x.to(DEVICE), weight.data.to(DEVICE), kind=kind, rows=40, cols=512).cpu()
    ref = x.float() @ _dequantized(weight).T
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
    # in the activations' dtype: the same float32 sums, rounded once at the store (no cast kernel)
    rounded = dense_block_gemv(x.to(DEVICE), weight.data.to(DEVICE), kind=kind, rows=40, cols=512,
                               out_dtype=torch.bfloat16).cpu()
    assert rounded.dtype == torch.bfloat16
    if DEVICE == "cuda":  # round to nearest even, as torch's cast
        assert torch.equal(rounded, ours.to(torch.bfloat16))
    else:  # (Triton's interpreter truncates: within one bfloat16 step)
        torch.testing.assert_close(rounded.float(), ours, rtol=2 ** -7, atol=0)


def test_a_weight_of_other_columns_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"a \[40, 256\] weight cannot multiply inputs of 512 values"):
        linear(torch.zeros(1, 512), _weight("q4_k", 40, 256))


def test_which_tensors_stay_blocks() -> None:
    assert keeps_blocks("model.layers.3.self_attn.q_proj.weight", "q4_k")
    assert keeps_blocks("lm_head.weight", "q6_k")
    assert keeps_blocks("model.layers.0.mlp.shared_experts.down_proj.weight", "q5_k")
    # Q8_0 where the GPU's block GEMV can read its rows (whole 256s) and they are known
    assert keeps_blocks("model.layers.3.self_attn.q_proj.weight", "q8_0", 2048)
    assert not keeps_blocks("model.layers.3.self_attn.q_proj.weight", "q8_0", 2880)  # gpt-oss's hidden size
    assert not keeps_blocks("model.layers.3.self_attn.q_proj.weight", "q8_0")  # a header's: counted widened
    assert not keeps_blocks("model.embed_tokens.weight", "q4_k")  # looked up, not multiplied
    assert not keeps_blocks("model.layers.0.mlp.gate.weight", "q4_k")  # a router: its own kernel


def test_a_q4_k_m_gguf_loads_its_k_quant_projections_as_blocks_and_decodes_as_widened() -> None:
    """tests/test_kquant_kernel.py's tiny Q4_K_M file (a Q6_K LM head, Q8_0 attention): loaded in
    bf16, its head stays 6.56-bit blocks and its attention 8.5-bit ones (what the planner counts),
    and its logits over a prompt and 8 greedy decode steps are those of the same file with them
    widened at load, to the Q8_K rounding of the head's input in decode (prompts: the same values)."""
    from runtime.engine import Session
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.planner.footprint import held_dense_bytes
    from runtime.text.sampling import SamplingParams
    from runtime.text.tokenizer import Tokenizer
    from tests.test_kquant_kernel import pull_q4_k_m_and_its_f32_twin

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        store, names = pull_q4_k_m_and_its_f32_twin(Path(tmp))
        model_files = open_model(store, names[0])
        tokenizer = Tokenizer.from_model(model_files)
        kept = load(store, names[0], torch.bfloat16)
        head = kept.model.lm_head
        assert isinstance(head, BlockWeight) and head.dtype_name == "q6_k"
        with model_files.open_ftw() as reader:
            entry = next(t for t in reader.index.tensors if t.name == "lm_head.weight")
        assert head.nbytes == entry.nbytes and entry.nbytes * 2.4 < head.shape[0] * head.shape[1] * 2
        with pytest.MonkeyPatch.context() as mp:
            import runtime.loading.runnable as runnable

            mp.setattr(runnable, "keeps_blocks", lambda name, dtype, cols=None: False)
            widened = load(store, names[0], torch.bfloat16)
        assert isinstance(widened.model.lm_head, torch.Tensor)
        blocks = [t for t in kept.weights.dense.values() if isinstance(t, BlockWeight)]
        assert {t.dtype_name for t in blocks} == {"q6_k", "q8_0"}  # the head, and the Q8_0 attention
        held = [sum(t.nbytes if isinstance(t, BlockWeight) else t.numel() * t.element_size()
                    for t in m.weights.dense.values()) for m in (kept, widened)]
        assert held[1] - held[0] == sum(t.shape[0] * t.shape[1] * 2 - t.nbytes for t in blocks)
        assert held_dense_bytes(entry.dtype, entry.nbytes, head.shape[0] * head.shape[1], scaled=False, compute=2,
                                name=entry.name) == entry.nbytes  # the planner counts what the loader holds
        prompt = tokenizer.encode("abc abd bbc aab")
        greedy = SamplingParams(temperature=0, max_tokens=8)
        answer = Session(widened.model, tokenizer, 256).generate(prompt, greedy).tokens
        sequence = torch.tensor(prompt + answer)
        logits = [m.model.forward(sequence, Session(m.model, tokenizer, 256).state) for m in (kept, widened)]
        torch.testing.assert_close(logits[0], logits[1])  # all the tokens at once: the dequantized values
        steps = []
        for m in (kept, widened):
            session = Session(m.model, tokenizer, 256)
            m.model.forward(torch.tensor(prompt), session.state)
            steps.append(torch.stack([m.model.forward(torch.tensor([t]), session.state)[-1] for t in answer]))
    scale = steps[1].abs().max()
    assert (steps[0] - steps[1]).abs().max() < 0.05 * scale and not torch.equal(steps[0], steps[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_a_q4_k_m_gguf_decodes_with_its_head_in_place_as_widened() -> None:
    """The hybrid runtime on CUDA (float32, captured steps where they capture): the Q6_K head
    stays blocks on the device and decode reads it through the block GEMV; 16 greedy tokens
    equal those of the same file with the head widened at load (float32 products of the same
    weights either way)."""
    from runtime.engine import Session
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.text.sampling import SamplingParams
    from runtime.text.tokenizer import Tokenizer
    from tests.test_kquant_kernel import pull_q4_k_m_and_its_f32_twin

    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        store, names = pull_q4_k_m_and_its_f32_twin(Path(tmp))
        tokenizer = Tokenizer.from_model(open_model(store, names[0]))
        prompt = tokenizer.encode("abc abd bbc aab")
        greedy = SamplingParams(temperature=0, max_tokens=16)
        answers = []
        for widen in (False, True):
            with pytest.MonkeyPatch.context() as mp:
                import runtime.gpu.build as build

                if widen:
                    mp.setattr(build, "keeps_blocks", lambda name, dtype, cols=None: False)
                loaded = load(store, names[0], torch.float32, backend="gpu", device="cuda", mode="offload",
                              cache_slots=5)
            head = loaded.model.model.lm_head  # (a DeviceModel's DecoderModel)
            assert isinstance(head, BlockWeight) != widen and head.device.type == "cuda"
            answers.append(Session(loaded.model, tokenizer, 256).generate(prompt, greedy).tokens)
            loaded.experts.close()
    assert len(answers[0]) == 16 and answers[0] == answers[1]
