"""MXFP4 prefill experts (gpt-oss's) in two grouped launches with their biases and activation
(runtime/gpu/kernels/grouped_mxfp4_experts*.py): the Triton kernel, reached through the dispatch
CUDA takes (records.grouped_call), against its torch twin and against the padded runs of
records.experts_from_records (whole experts dequantized with ggml_blocks, bit-exact with gguf-py,
then batched matmuls with the biases and records.swiglu_experts' activation); and the dispatch.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors at tiny shapes (tests/kernels.py).
As tests/test_grouped_block_experts.py: kernel vs twin within 1e-4 of max|out| (fp32 summation
order), kernel vs padded runs within 2% in bf16 (those round gate|up, the biased sums, the
activation and each output to bf16 too), a quarter of that in f16.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ftw.format import ExpertActivation
from runtime.experts.ggml_blocks import dequantize_blocks
from runtime.experts.synthetic import random_bank
from runtime.gpu.kernels.grouped_mxfp4_experts_ref import grouped_mxfp4_experts_ref, mxfp4_bytes
from runtime.gpu.records import RecordViews, grouped_call, grouped_kind
from tests.kernels import (
    DEVICE,
    assert_matches_twin_and_padded_runs,
    import_kernel,
    needs,
    plan_args,
    routed_chunk,
)

grouped_mxfp4_experts = import_kernel("grouped_mxfp4_experts", "grouped_mxfp4_experts")
needs_triton = needs(grouped_mxfp4_experts)

GPT_OSS = ExpertActivation("swiglu_clamped", 1.702, 7.0)
ACTS = {"gpt_oss": GPT_OSS, "limited": ExpertActivation("swiglu_limited", 1.0, 7.0),
        "plain": ExpertActivation()}


def _bank(act: str, hidden: int, inter: int, bias: str | None, experts: int = 6):
    return random_bank("mxfp4", experts, hidden, inter, seed=7, activation=ACTS[act], bias_dtype=bias)


@needs_triton
@pytest.mark.parametrize("act,bias,hidden,inter,dtype", [("gpt_oss", "bf16", 96, 64, torch.bfloat16),
                                                         ("gpt_oss", "bf16", 128, 64, torch.float16),
                                                         ("limited", "f32", 64, 96, torch.bfloat16),
                                                         ("plain", None, 128, 128, torch.bfloat16)])
def test_the_kernel_matches_its_twin_and_the_padded_runs(act: str, bias: str | None, hidden: int, inter: int,
                                                         dtype: torch.dtype) -> None:
    """gpt-oss's clamped SwiGLU with bf16 biases (H not whole 64-value tiles: 32-value k steps),
    DeepSeek-V4's clamped form with f32 biases, plain SwiGLU without; uneven counts (a hot expert
    over two M tiles), an idle expert in the plan's lists, record rows wider than a record."""
    chunk = routed_chunk(_bank(act, hidden, inter, bias))
    assert_matches_twin_and_padded_runs(chunk, dtype, grouped_mxfp4_experts, grouped_mxfp4_experts_ref,
                                        chunk[1].mxfp4_block_parts())


@needs_triton
def test_mxfp4_weights_are_decoded_in_place() -> None:
    """The kernel's weight tiles are dequantize_blocks' MXFP4 values rounded to bf16, bit for bit:
    the down kernel with activations the identity and no bias reads the part back (out[c, h] =
    W2[h, c], one product), 32-value steps and 64-value ones."""
    from runtime.gpu.kernels import grouped_mxfp4_experts as module

    for hidden, inter, block_k in ((96, 64, 32), (128, 128, 64)):
        bank = random_bank("mxfp4", 2, hidden, inter, seed=9)
        data = bank.data.to(DEVICE)
        parts = RecordViews(data, bank.layout).mxfp4_block_parts()
        act = torch.eye(inter, dtype=torch.bfloat16, device=DEVICE)  # pair c: column c
        out = torch.zeros(inter, hidden, dtype=torch.float32, device=DEVICE)
        plan = [torch.tensor([value], device=DEVICE) for value in (1, 0, inter)]  # record row 1, all pairs
        module._down_kernel[(1, -(-inter // 64), -(-hidden // 64))](
            act, act.stride(0), data, data.stride(0), parts["w2_at"], 0, *plan, torch.arange(inter, device=DEVICE),
            torch.ones(inter, device=DEVICE), out, out.stride(0), HIDDEN=hidden, INTER=inter, BIAS=0, BLOCK_M=64,
            BLOCK_N=64, BLOCK_K=block_k, UPCAST=DEVICE != "cuda", **module.LAUNCH)
        w2 = dequantize_blocks(data[1:, parts["w2_at"]: parts["w2_at"] + mxfp4_bytes(hidden, inter)].cpu(), "mxfp4",
                               (hidden, inter))[0]
        assert torch.equal(out.cpu(), w2.to(torch.bfloat16).float().T), (hidden, inter)


def test_the_dispatch_picks_the_mxfp4_kernel_for_gpt_oss_records() -> None:
    def kind_of(act: str = "gpt_oss", bias: str | None = "bf16", hidden: int = 96, inter: int = 64,
                compute: torch.dtype = torch.bfloat16, dtype: str = "mxfp4") -> str | None:
        made = random_bank(dtype, 2, hidden, inter, activation=ACTS[act], bias_dtype=bias)
        return grouped_kind(RecordViews(made.data, made.layout), compute)

    for act in ACTS:
        for bias in (None, "bf16", "f32"):
            assert kind_of(act, bias) == "grouped_mxfp4_experts", (act, bias)
    assert kind_of(compute=torch.float32) is None  # the compute dtype is bf16 or f16
    assert kind_of(dtype="q8_0", hidden=256, inter=256, bias=None, act="plain") == "grouped_block_experts"
    assert kind_of(dtype="q8_0", hidden=256, inter=256, act="gpt_oss") is None  # biases beside a GGUF kernel's types
    made = random_bank("mxfp4", 2, 96, 64, activation=GPT_OSS, bias_dtype="bf16")
    views = RecordViews(made.data, made.layout)
    if grouped_mxfp4_experts is not None:
        call = grouped_call(views, torch.bfloat16)
        assert isinstance(call, functools.partial) and call.func is grouped_mxfp4_experts
        assert call.keywords == views.mxfp4_block_parts()


def test_bad_arguments_are_refused_with_what_is_wrong() -> None:
    records, views, plan, x, weights = routed_chunk(_bank("gpt_oss", 96, 64, "bf16", experts=4))
    args = {**views.mxfp4_block_parts(), **plan_args(plan, weights, torch.bfloat16, idle_row=3)}
    out = torch.zeros(20, 96, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="x is"):
        grouped_mxfp4_experts_ref(x, records, **args, out=out)
    with pytest.raises(ValueError, match="does not fit"):
        grouped_mxfp4_experts_ref(x.bfloat16(), records, **{**args, "w2_at": records.shape[1] - 10}, out=out)
    with pytest.raises(ValueError, match="not geglu_tanh"):
        grouped_mxfp4_experts_ref(x.bfloat16(), records, **{**args, "act": "geglu_tanh"}, out=out)
    with pytest.raises(ValueError, match="not q8_0"):
        grouped_mxfp4_experts_ref(x.bfloat16(), records, **{**args, "bias_kind": "q8_0"}, out=out)
    with pytest.raises(ValueError, match="out is fp32"):
        grouped_mxfp4_experts_ref(x.bfloat16(), records, **args, out=out.bfloat16())
