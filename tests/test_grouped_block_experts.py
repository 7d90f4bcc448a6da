"""GGUF prefill experts in two grouped launches (runtime/gpu/kernels/grouped_block_experts*.py): the
Triton kernel, reached through the dispatch CUDA takes (records.grouped_call), against its torch
twin and against the padded runs of records.experts_from_records (whole experts dequantized with
ggml_blocks, bit-exact with gguf-py, then batched matmuls); and which kernel the dispatch picks.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors at tiny shapes (tests/kernels.py).
What is asserted, and why:
- kernel vs twin: both multiply the same weights (each tile dequantized in registers is bit-equal
  to dequantize_blocks rounded to the compute dtype: test_block_weights_are_rounded_in_place)
  and round the activation to the compute dtype once; they differ only in fp32 summation order,
  which may round an activation one unit in the last place the other way. Asserted within 1e-4
  of max|out|; observed 2e-7 to 1.3e-5.
- kernel vs padded runs: those round gate|up, silu(g) * u and each expert's output to the compute
  dtype too (torch's matmuls and elementwise ops in bf16/f16), each a half ulp (2^-9 relative in
  bf16, 2^-11 in f16); asserted within 2% of max|out| in bf16 as the float kernel's test does,
  a quarter of that in f16; observed 0.44-0.75% (bf16), 0.07% (f16).
"""

from __future__ import annotations

import functools

import pytest
import torch

from ftw.format import ExpertActivation
from runtime.experts.ggml_blocks import dequantize_blocks
from runtime.experts.synthetic import random_bank
from runtime.gpu.kernels.grouped_block_experts_ref import BLOCK_KINDS, grouped_block_experts_ref, part_bytes
from runtime.gpu.records import (
    RecordViews,
    _grouped_kernel,
    grouped_call,
    grouped_kind,
)
from tests.kernels import (
    DEVICE,
    assert_matches_twin_and_padded_runs,
    import_kernel,
    needs,
    plan_args,
    routed_chunk,
)

grouped_block_experts = import_kernel("grouped_block_experts", "grouped_block_experts")
needs_triton = needs(grouped_block_experts)

MIXES = {"q4_k_m": ("q4_k", None, "q6_k"), "q5_k_m": ("q5_k", None, "q6_k"), "q8_0": ("q8_0", None, None),
         "gate_up_apart": ("q4_k", "q5_k", "q6_k")}


def _setup(mix: str, hidden: int, inter: int, num_tokens: int = 20, experts: int = 6, top_k: int = 2):
    """A GGUF-style bank of `mix` and a chunk routed over it (tests/kernels.routed_chunk)."""
    gate, up, down = MIXES[mix]
    return routed_chunk(random_bank(gate, experts, hidden, inter, seed=7, up_dtype=up, down_dtype=down),
                        num_tokens, top_k)


@needs_triton
@pytest.mark.parametrize("mix,hidden,dtype", [("q4_k_m", 512, torch.bfloat16), ("q4_k_m", 256, torch.float16),
                                              ("q5_k_m", 256, torch.bfloat16), ("q8_0", 256, torch.bfloat16),
                                              ("gate_up_apart", 256, torch.bfloat16)])
def test_the_kernel_matches_its_twin_and_the_padded_runs(mix: str, hidden: int, dtype: torch.dtype) -> None:
    """Uneven counts (a hot expert over two M tiles, partial tiles), an expert with no pair in the
    plan's lists, a bank row no pair routes to, record rows wider than a record."""
    chunk = _setup(mix, hidden, 256)
    assert_matches_twin_and_padded_runs(chunk, dtype, grouped_block_experts, grouped_block_experts_ref,
                                        chunk[1].block_parts())


@needs_triton
def test_block_weights_are_rounded_in_place() -> None:
    """The kernel's weight tiles are dequantize_blocks' values rounded to bf16, bit for bit (the
    interpreter's own fp32 -> bf16 conversion truncates: the kernel rounds by hand there). The
    down kernel with activations the identity reads the part back: out[c, h] = W2[h, c], a sum of
    one product."""
    from runtime.gpu.kernels import grouped_block_experts as module

    hidden = inter = 256
    for kind in BLOCK_KINDS:
        bank = random_bank(kind, 2, hidden, inter, seed=9)
        data = bank.data.to(DEVICE)
        down_at = RecordViews(data, bank.layout).block_parts()["down"][0]
        code = module.KINDS[kind]
        act = torch.eye(inter, dtype=torch.bfloat16, device=DEVICE)  # pair c: column c
        out = torch.zeros(inter, hidden, dtype=torch.float32, device=DEVICE)
        plan = [torch.tensor([value], device=DEVICE) for value in (1, 0, inter)]  # record row 1, all pairs
        module._down_kernel[(1, inter // 64, hidden // 64)](
            act, act.stride(0), data, data.stride(0), down_at, *plan, torch.arange(inter, device=DEVICE),
            torch.ones(inter, device=DEVICE), out, out.stride(0), HIDDEN=hidden, INTER=inter, DOWN_KIND=code,
            DOWN_SB=module.SUPER_BLOCK_BYTES[code], BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, UPCAST=DEVICE != "cuda",
            **module.LAUNCH)
        w2 = dequantize_blocks(data[1:, down_at: down_at + part_bytes(kind, hidden, inter)], kind, (hidden, inter))[0]
        assert torch.equal(out.cpu(), w2.to(torch.bfloat16).float().T.cpu()), kind


def test_the_dispatch_picks_the_block_kernel_for_gguf_records() -> None:
    """grouped_kind is what _grouped_kernel asks on CUDA (elsewhere the padded runs serve)."""
    def kind_of(dtype: str = "q4_k", compute: torch.dtype = torch.bfloat16, **bank) -> str | None:
        made = random_bank(dtype, 2, 256, 256, **bank)
        return grouped_kind(RecordViews(made.data, made.layout), compute)

    for gate, up, down in MIXES.values():
        for compute in (torch.bfloat16, torch.float16):
            assert kind_of(gate, compute, up_dtype=up, down_dtype=down) == "grouped_block_experts"
    assert kind_of("q4_k", torch.float32) is None  # the compute dtype is bf16 or f16
    assert kind_of("q4_0") is None  # a GGML type the kernel does not read
    assert kind_of("q4_k", up_dtype="bf16") is None  # float and block parts mixed
    assert kind_of("q4_k", activation=ExpertActivation("swiglu_limited", 1.0, 7.0)) is None  # only plain silu(gate) * up
    assert kind_of("q4_k", bias_dtype="bf16") is None
    assert kind_of("bf16") == "grouped_experts" and kind_of("f32") is None
    assert kind_of("f8_e4m3") == "grouped_fp8_experts"  # (tests/test_grouped_fp8_experts.py)
    made = random_bank("q4_k", 2, 256, 256, down_dtype="q6_k")
    views = RecordViews(made.data, made.layout)
    assert _grouped_kernel(torch.zeros(1, 256), views, torch.bfloat16) is None  # CPU tensors: the padded runs
    if grouped_block_experts is not None:
        call = grouped_call(views, torch.bfloat16)
        assert isinstance(call, functools.partial) and call.func is grouped_block_experts
        assert call.keywords == views.block_parts()


def test_block_parts_say_where_each_weight_is() -> None:
    made = random_bank("q4_k", 2, 512, 256, down_dtype="q6_k")
    w13_bytes = part_bytes("q4_k", 2 * 256, 512)
    assert RecordViews(made.data, made.layout).block_parts() == {
        "gate": (0, "q4_k"), "up": (w13_bytes // 2, "q4_k"), "down": (w13_bytes, "q6_k"), "hidden": 512, "inter": 256}
    apart = random_bank("q4_k", 2, 512, 256, up_dtype="q5_k", down_dtype="q6_k")
    parts = {p.name: p.offset for p in apart.layout.parts}
    assert RecordViews(apart.data, apart.layout).block_parts() == {
        "gate": (parts["w1"], "q4_k"), "up": (parts["w3"], "q5_k"), "down": (parts["w2"], "q6_k"), "hidden": 512,
        "inter": 256}


def test_bad_arguments_are_refused_with_what_is_wrong() -> None:
    records, views, plan, x, weights = _setup("q4_k_m", 256, 256, experts=4)
    args = {**views.block_parts(), **plan_args(plan, weights, torch.bfloat16, idle_row=3)}
    out = torch.zeros(20, 256, dtype=torch.float32, device=DEVICE)
    with pytest.raises(ValueError, match="x is"):
        grouped_block_experts_ref(x, records, **args, out=out)
    with pytest.raises(ValueError, match="does not fit"):
        grouped_block_experts_ref(x.bfloat16(), records, **{**args, "down": (records.shape[1] - 10, "q6_k")}, out=out)
    with pytest.raises(ValueError, match="not q2_k"):
        grouped_block_experts_ref(x.bfloat16(), records, **{**args, "gate": (0, "q2_k")}, out=out)
    with pytest.raises(ValueError, match="out is fp32"):
        grouped_block_experts_ref(x.bfloat16(), records, **args, out=out.bfloat16())


@needs_triton
def test_the_kernel_reads_the_types_the_shared_dequantizer_does() -> None:
    from runtime.gpu.kernels.ggml_dequant import KINDS

    assert set(KINDS) == set(BLOCK_KINDS)
