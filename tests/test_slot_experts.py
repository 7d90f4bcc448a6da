"""Slot experts (runtime/gpu/kernels/slot_experts*.py): the Triton kernel against its torch twin,
and the twin against an independent computation from RecordViews + swiglu_experts.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors at tiny shapes
(tests/kernels.py). Tolerances, from the arithmetic in
slot_experts_ref.py: kernel vs twin and twin vs an fp32 RecordViews computation differ only in
fp32 summation order (rtol 1e-4, atol 1e-5 at outputs of size ~1); the twin vs the existing
gather + bmm path in bf16/f16 (which rounds its intermediates) within 2% of max|out|.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ftw.format import SWIGLU, ExpertActivation
from runtime.experts.synthetic import random_bank
from runtime.gpu.kernels.slot_experts_ref import slot_experts_ref
from runtime.gpu.records import PairPlan, RecordViews, experts_from_records, swiglu_experts
from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
TIGHT = {"rtol": 1e-4, "atol": 1e-5}  # fp32 summation order only


slot_experts = import_kernel("slot_experts", "slot_experts")
needs_triton = needs(slot_experts)


class Slots:
    """An expert cache's slot tensor: slot s holds expert `expert_of[s]`'s record (None: garbage).

    Slots are wider than a record (as when a cache is shared with larger banks), and the empty ones
    hold 0xFF bytes, NaN in bf16 and f16: a kernel that reads a slot it was not given shows it."""

    def __init__(self, dtype: str, hidden: int, inter: int, expert_of: list[int | None], *, num_experts: int = 8,
                 seed: int = 0, device: str = DEVICE, activation: ExpertActivation = SWIGLU) -> None:
        bank = random_bank(dtype, num_experts, hidden, inter, seed=seed, activation=activation)
        self.layout, self.hidden, self.inter, self.dtype = bank.layout, hidden, inter, DTYPES[dtype]
        self.bank = bank.data.pin_memory() if device == "cuda" else bank.data  # host rows, as the executor's banks
        self.slots = torch.full((len(expert_of), bank.layout.expert_stride + 4096), 0xFF, dtype=torch.uint8)
        for slot, expert in enumerate(expert_of):
            if expert is not None:
                self.slots[slot, : bank.layout.expert_stride] = bank.data[expert]
        self.slots = self.slots.to(device)
        parts = {p.name: p for p in bank.layout.parts}
        self.kwargs = {"w13_offset": parts["w13"].offset, "w2_offset": parts["w2"].offset, "hidden": hidden,
                       "inter": inter, "dtype": self.dtype}

    def run(self, fn, x: torch.Tensor, tokens: list[int], slots: list[int], weights: list[float],
            out: torch.Tensor) -> torch.Tensor:
        """out (a copy) after fn(...) with these pairs."""
        out = out.clone()
        fn(x, self.slots, torch.tensor(tokens, dtype=torch.int32, device=x.device),
           torch.tensor(slots, dtype=torch.int32, device=x.device),
           torch.tensor(weights, dtype=torch.float32, device=x.device), out=out, **self.kwargs)
        return out


def random_pairs(gen: torch.Generator, num_tokens: int, top_k: int, num_slots: int,
                 used_slots: list[int]) -> tuple[list[int], list[int], list[float]]:
    """T*K pairs over `used_slots` (duplicates across and within tokens), about a quarter skipped;
    skipped pairs carry an out-of-range token and a NaN weight, which must not matter."""
    tokens, slots, weights = [], [], []
    for t in range(num_tokens):
        for _ in range(top_k):
            skip = torch.rand(1, generator=gen).item() < 0.25
            tokens.append(num_tokens + 7 if skip else t)
            slots.append(-1 if skip else used_slots[int(torch.randint(len(used_slots), (1,), generator=gen))])
            weights.append(float("nan") if skip else torch.rand(1, generator=gen).item())
    return tokens, slots, weights


def independent(cache: Slots, x: torch.Tensor, tokens: list[int], slots: list[int], weights: list[float],
                out: torch.Tensor) -> torch.Tensor:
    """The same sum, pair by pair, from RecordViews + swiglu_experts in fp32."""
    views = RecordViews(cache.slots, cache.layout)
    out = out.clone()
    for t, s, w in zip(tokens, slots, weights, strict=True):
        if s >= 0:
            w13, w2 = views.weights(s, torch.float32)  # [1, 2I, H], [1, H, I]
            out[t] += w * swiglu_experts(x[t : t + 1].float(), w13, w2)[0, 0]
    return out


# --- the twin against independent computations (no triton needed)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_reference_matches_record_views(dtype: str, num_tokens: int) -> None:
    gen = torch.Generator().manual_seed(num_tokens)
    cache = Slots(dtype, 64, 32, [None, 3, 0, 5, 3, 7], device="cpu")  # slot 0 empty; expert 3 twice
    x = torch.randn(num_tokens, 64, generator=gen).to(cache.dtype)
    out = torch.randn(num_tokens, 64, generator=gen)  # accumulated into, not overwritten
    for top_k in (2, 3, 4):
        pairs = random_pairs(gen, num_tokens, top_k, 6, [1, 2, 3, 4, 5])
        got = cache.run(slot_experts_ref, x, *pairs, out)
        torch.testing.assert_close(got, independent(cache, x, *pairs, out), **TIGHT)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_reference_is_the_gather_bmm_path_up_to_its_rounding(dtype: str) -> None:
    """Routing as the executor sees it: a token's K experts, some cached (a slot), some not (-1)."""
    gen = torch.Generator().manual_seed(5)
    cache = Slots(dtype, 64, 32, [None, 3, 0, 5, 6, 7], device="cpu")
    row_of = torch.tensor([2, -1, -1, 1, -1, 3, 4, 5])  # expert -> slot
    num_tokens, top_k = 3, 4
    expert_ids = torch.stack([torch.randperm(8, generator=gen)[:top_k] for _ in range(num_tokens)])  # [T, K]
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=gen), dim=-1)
    x = torch.randn(num_tokens, 64, generator=gen).to(cache.dtype)
    out = torch.zeros(num_tokens, 64)
    plan = PairPlan.build(expert_ids, row_of, lambda t: t)
    want = out.clone()
    experts_from_records(x, weights, plan, RecordViews(cache.slots, cache.layout), cache.dtype, want)
    tokens = torch.arange(num_tokens).repeat_interleave(top_k).tolist()
    got = cache.run(slot_experts_ref, x, tokens, row_of[expert_ids].flatten().tolist(), weights.flatten().tolist(), out)
    assert (got - want).abs().max() <= 0.02 * want.abs().max()


def test_reference_rejects_bad_arguments() -> None:
    cache = Slots("bf16", 64, 32, [0, 1], device="cpu")
    x, out = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 64)
    pairs = ([0], [1], [1.0])
    with pytest.raises(TypeError):
        cache.run(slot_experts_ref, x, *pairs, out.double())
    with pytest.raises(ValueError):  # a part that runs past the slot
        cache.kwargs["w2_offset"] = cache.slots.shape[1] - 64
        cache.run(slot_experts_ref, x, *pairs, out)
    with pytest.raises(ValueError):  # an odd offset cannot be a bf16 element
        cache.kwargs["w2_offset"] = 3
        cache.run(slot_experts_ref, x, *pairs, out)
    with pytest.raises(TypeError):
        cache.kwargs["dtype"] = torch.float32
        cache.run(slot_experts_ref, x, *pairs, out)


# --- the kernel against the twin


@needs_triton
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_kernel_matches_reference(dtype: str, num_tokens: int) -> None:
    gen = torch.Generator().manual_seed(10 + num_tokens)
    cache = Slots(dtype, 64, 32, [None, 3, 0, 5, 3, 7])
    x = torch.randn(num_tokens, 64, generator=gen).to(cache.dtype).to(DEVICE)
    out = torch.randn(num_tokens, 64, generator=gen).to(DEVICE)
    for top_k in (2, 3, 4):
        pairs = random_pairs(gen, num_tokens, top_k, 6, [1, 2, 3, 4, 5])
        got = cache.run(slot_experts, x, *pairs, out)
        torch.testing.assert_close(got, cache.run(slot_experts_ref, x, *pairs, out), **TIGHT)


@needs_triton
def test_kernel_ragged_shapes_and_strided_rows() -> None:
    """H and I that the blocks do not divide (masked tiles); x and out rows inside wider buffers."""
    gen = torch.Generator().manual_seed(3)
    cache = Slots("bf16", 96, 40, [2, None, 6, 1])
    x = torch.randn(3, 128, generator=gen).to(torch.bfloat16).to(DEVICE)[:, :96]  # row stride 128
    buffer = torch.randn(3, 160, generator=gen).to(DEVICE)
    pairs = [torch.tensor(v, dtype=d, device=DEVICE) for v, d in (
        ([2, 0, 1, 0, 2, 1], torch.int32), ([0, 2, 3, 0, -1, 2], torch.int32),
        ([0.5, 0.25, 1.0, 0.125, 0.0, 0.75], torch.float32))]
    results = []
    for fn in (slot_experts, slot_experts_ref):
        out = buffer.clone()
        fn(x, cache.slots, *pairs, out=out[:, 32:128], **cache.kwargs)  # row stride 160
        assert torch.equal(out[:, :32], buffer[:, :32]) and torch.equal(out[:, 128:], buffer[:, 128:])
        results.append(out)
    torch.testing.assert_close(*results, **TIGHT)


# (block_i, block_h, split_h, block_o, block_k, split_k): H and I split over programs, one tile each
# or several (an unrolled walk), whole and ragged spans; the last is the walk of one program per row block
TILINGS = [(8, 16, 4, 16, 8, 4), (16, 32, 3, 32, 16, 2), (8, 16, 1, 16, 8, 1), (16, 64, 2, 16, 32, 8)]


@needs_triton
@pytest.mark.parametrize("tiling", TILINGS, ids=lambda t: "-".join(map(str, t)))
@pytest.mark.parametrize("hidden, inter", [(96, 40), (64, 32)])
@pytest.mark.parametrize("early", [False, True], ids=["reads-after-wait", "early-reads"])
def test_kernel_split_spans_fill_and_zero(tiling: tuple[int, ...], hidden: int, inter: int, early: bool) -> None:
    """The gate pass's H and the down pass's I split over programs (partial sums added in the down
    pass), with PCIe fills in the launch and `out` cleared by it: the twin's output and slots. Both
    ways the down pass may read its first W2 tile: after its wait, or before it (a step graph's)."""
    block_i, block_h, split_h, block_o, block_k, split_k = tiling
    config = {"block_i": block_i, "block_h": block_h, "split_h": split_h, "block_o": block_o, "block_k": block_k,
              "split_k": split_k, "early_reads": early}
    gen = torch.Generator().manual_seed(hidden + inter)
    cache = Slots("bf16", hidden, inter, [3, None, 0, None, 5, 7])
    x = torch.randn(1, hidden, generator=gen).to(torch.bfloat16).to(DEVICE)
    pairs = [torch.tensor(v, dtype=d, device=DEVICE) for v, d in (
        ([0, 0, 0, 0, 0], torch.int32), ([0, 1, 3, 2, -1], torch.int32), ([0.5, 0.25, 1.0, 0.125, 9.0], torch.float32))]
    fills = torch.tensor([-1, 6, 2, -1, -1], dtype=torch.int32, device=DEVICE)
    results = []
    for fn, kwargs in ((slot_experts, config), (slot_experts_ref, {})):
        slot_tensor, out = cache.slots.clone(), torch.full((1, hidden), float("nan"), device=DEVICE)
        fn(x, slot_tensor, *pairs, out=out, fill_bank=cache.bank, pair_fill=fills, zero_out=True, **cache.kwargs,
           **kwargs)
        results.append((slot_tensor.cpu(), out))
    (kernel_slots, kernel_out), (ref_slots, ref_out) = results
    assert torch.equal(kernel_slots, ref_slots)
    torch.testing.assert_close(kernel_out, ref_out, **TIGHT)


@needs_triton
def test_router_weights_in_bf16_are_read_as_fp32() -> None:
    """The router's bf16 weights go in as they are (no conversion launch): the same sum as fp32."""
    gen = torch.Generator().manual_seed(4)
    cache = Slots("bf16", 64, 32, [0, 1, 2])
    x = torch.randn(2, 64, generator=gen).to(torch.bfloat16).to(DEVICE)
    weights = torch.tensor([0.5, 0.25, 1.0, 0.125], dtype=torch.bfloat16, device=DEVICE)  # exact in bf16
    token, slot = (torch.tensor(v, dtype=torch.int32, device=DEVICE) for v in ([0, 0, 1, 1], [2, 0, 1, -1]))
    results = []
    for fn, w in ((slot_experts, weights), (slot_experts_ref, weights), (slot_experts_ref, weights.float())):
        out = torch.zeros(2, 64, device=DEVICE)
        fn(x, cache.slots, token, slot, w, out=out, **cache.kwargs)
        results.append(out)
    torch.testing.assert_close(results[0], results[1], **TIGHT)
    assert torch.equal(results[1], results[2])


@needs_triton
def test_kernel_no_pairs_or_all_skipped_leave_out_alone() -> None:
    cache = Slots("f16", 64, 32, [None, None])  # every slot NaN
    x = torch.randn(2, 64).to(torch.float16).to(DEVICE)
    out = torch.randn(2, 64).to(DEVICE)
    assert torch.equal(cache.run(slot_experts, x, [], [], [], out), out)
    assert torch.equal(cache.run(slot_experts, x, [0, 1, 1], [-1, -1, -1], [1.0, 1.0, 1.0], out), out)


@needs_triton
@pytest.mark.parametrize("hidden, inter", [(64, 32), (96, 40)])  # whole and ragged tiles
def test_kernel_fills_the_pcie_pairs_slots_in_the_same_launch(hidden: int, inter: int) -> None:
    """Pairs with pair_fill >= 0 read their expert from the host bank and leave it in their slot:
    the output and the slots equal the twin's (fill, then compute) and an independent sum."""
    gen = torch.Generator().manual_seed(hidden)
    cache = Slots("bf16", hidden, inter, [3, None, 0, None, 5, 7])  # slots 1 and 3: NaN, filled by the call
    x = torch.randn(1, hidden, generator=gen).to(torch.bfloat16).to(DEVICE)
    out = torch.randn(1, hidden, generator=gen).to(DEVICE)
    tokens, slots, fills, weights = [0, 0, 0, 0, 0], [0, 1, 3, 2, -1], [-1, 6, 2, -1, -1], [0.5, 0.25, 1.0, 0.125, 9.0]

    def tensor(values, dtype):
        return torch.tensor(values, dtype=dtype, device=DEVICE)

    results = []
    for fn in (slot_experts, slot_experts_ref):
        slot_tensor, o = cache.slots.clone(), out.clone()
        fn(x, slot_tensor, tensor(tokens, torch.int32), tensor(slots, torch.int32), tensor(weights, torch.float32),
           out=o, fill_bank=cache.bank, pair_fill=tensor(fills, torch.int32), **cache.kwargs)
        results.append((slot_tensor.cpu(), o))
    (kernel_slots, kernel_out), (ref_slots, ref_out) = results
    parts = [slice(p.offset, p.offset + p.nbytes) for p in cache.layout.parts]  # (not the padding between)
    for slot, expert in ((1, 6), (3, 2)):
        for part in parts:
            assert torch.equal(kernel_slots[slot, part], cache.bank[expert, part].cpu()), slot
        assert torch.equal(kernel_slots[slot], ref_slots[slot]), slot
    for slot in (0, 2, 4, 5):  # the hits' slots are not written
        assert torch.equal(kernel_slots[slot], cache.slots[slot].cpu()), slot
    torch.testing.assert_close(kernel_out, ref_out, **TIGHT)
    filled = Slots("bf16", hidden, inter, [3, 6, 0, 2, 5, 7])
    torch.testing.assert_close(ref_out, independent(filled, x, tokens, slots, weights, out), **TIGHT)


@needs_triton
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_zero_out_overwrites_out_with_the_sum(num_tokens: int) -> None:
    """zero_out: the launch clears `out` itself (NaN garbage before, strided rows), as the twin's
    zero then add; with no pairs, or all skipped, out is zeros."""
    gen = torch.Generator().manual_seed(20 + num_tokens)
    cache = Slots("bf16", 96, 40, [2, None, 6, 1])
    x = torch.randn(num_tokens, 96, generator=gen).to(torch.bfloat16).to(DEVICE)
    tokens, slots, weights = random_pairs(gen, num_tokens, 3, 4, [0, 2, 3])
    results = []
    for fn in (slot_experts, slot_experts_ref):
        buffer = torch.full((num_tokens, 160), float("nan"), device=DEVICE)
        out = buffer[:, 32:128]  # row stride 160
        fn(x, cache.slots, *(torch.tensor(v, dtype=d, device=DEVICE) for v, d in (
            (tokens, torch.int32), (slots, torch.int32), (weights, torch.float32))), out=out, zero_out=True,
           **cache.kwargs)
        assert buffer[:, :32].isnan().all() and buffer[:, 128:].isnan().all()  # nothing outside `out`
        results.append(out)
    assert not results[0].isnan().any()
    torch.testing.assert_close(*results, **TIGHT)
    for pairs in (([], [], []), ([0] * num_tokens, [-1] * num_tokens, [1.0] * num_tokens)):
        out = torch.full((num_tokens, 96), float("nan"), device=DEVICE)
        slot_experts(x, cache.slots, *(torch.tensor(v, dtype=d, device=DEVICE) for v, d in zip(
            pairs, (torch.int32, torch.int32, torch.float32), strict=True)), out=out, zero_out=True, **cache.kwargs)
        assert torch.equal(out, torch.zeros_like(out))


def test_fills_need_the_bank_and_the_pairs_experts_together() -> None:
    cache = Slots("bf16", 64, 32, [0, 1], device="cpu")
    x, out = torch.zeros(1, 64, dtype=torch.bfloat16), torch.zeros(1, 64)
    pair = [torch.tensor([v], dtype=d) for v, d in ((0, torch.int32), (1, torch.int32), (1.0, torch.float32))]
    with pytest.raises(ValueError, match="together"):
        slot_experts_ref(x, cache.slots, *pair, out=out, fill_bank=cache.bank, **cache.kwargs)
    with pytest.raises(ValueError, match="do not hold the parts"):
        slot_experts_ref(x, cache.slots, *pair, out=out, fill_bank=cache.bank[:, :64].contiguous(), pair_fill=pair[1],
                         **cache.kwargs)


# --- on the GPU host: Qwen3-30B-A3B experts


QWEN3 = (2048, 768)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@needs_triton
def test_gpu_qwen3_shape_and_cuda_graph_replay() -> None:
    """T=1, P=8 at H=2048, I=768 in bf16; then captured once, replayed with new pairs in place."""
    gen = torch.Generator().manual_seed(0)
    cache = Slots("bf16", *QWEN3, [0, 1, 2, 3, None, 4, 5, 6, 7, 2], num_experts=8)
    x = torch.randn(1, QWEN3[0], generator=gen).to(torch.bfloat16).cuda()
    out = torch.zeros(1, QWEN3[0], device="cuda")
    pairs = ([0] * 8, [0, 1, 2, 3, 5, 6, 7, -1], torch.softmax(torch.randn(8, generator=gen), 0).tolist())
    want = cache.run(slot_experts_ref, x, *pairs, out)
    torch.testing.assert_close(cache.run(slot_experts, x, *pairs, out), want, rtol=1e-4, atol=1e-4)

    tokens, slots = torch.zeros(8, dtype=torch.int32, device="cuda"), torch.full((8,), -1, dtype=torch.int32, device="cuda")
    weights = torch.zeros(8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm up (compile) outside the capture
        slot_experts(x, cache.slots, tokens, slots, weights, out=out, **cache.kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        slot_experts(x, cache.slots, tokens, slots, weights, out=out, **cache.kwargs)
    for new_slots in ([9, 8, 7, 6, 5, 3, 1, 0], [-1, 2, -1, 9, 1, -1, -1, 8]):
        slots.copy_(torch.tensor(new_slots, dtype=torch.int32))
        weights.copy_(torch.rand(8, generator=gen))
        out.zero_()
        graph.replay()
        want = cache.run(slot_experts_ref, x, [0] * 8, new_slots, weights.tolist(), torch.zeros_like(out))
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


# --- the experts' own forms: clamped activations and biases (gpt-oss, DeepSeek-V4), GeGLU (Gemma 4),
# relu2 (Nemotron-H: not gated, w13 the up rows alone), silu (Doge: not gated either)

FORMS = [("swiglu_limited", 1.0), ("swiglu_clamped", 1.702), ("geglu_tanh", 1.0), ("relu2", 1.0),
         ("silu", 1.0)]  # (no clamps but the first two)


def _form_case(cache: Slots, num_tokens: int, seed: int, device: str):
    """x, out, pairs, a limit that clamps about half the gate and up sums, and each pair's biases."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, cache.hidden, generator=gen).to(cache.dtype)
    views = RecordViews(cache.slots.cpu(), cache.layout)
    w13, _ = views.weights(slice(1, 6), torch.float32)
    limit = float((x.float() @ w13.reshape(-1, cache.hidden).T).abs().median())
    pairs = random_pairs(gen, num_tokens, 4, 6, [1, 2, 3, 4, 5])
    bias = torch.randn(len(pairs[0]), cache.layout.activation.w13_rows(cache.inter), generator=gen) * limit
    out = torch.randn(num_tokens, cache.hidden, generator=gen)
    return x.to(device), out.to(device), pairs, limit, bias.to(device)


@pytest.mark.parametrize("kind, alpha", FORMS)
def test_reference_computes_the_experts_own_form(kind: str, alpha: float) -> None:
    from runtime.experts.activation import activate, split_rows
    from runtime.gpu.kernels.slot_experts_ref import ACTIVATIONS

    cache = Slots("bf16", 64, 32, [None, 3, 0, 5, 3, 7], device="cpu", activation=ExpertActivation(kind))
    x, out, (tokens, slots, weights), limit, bias = _form_case(cache, 3, 1, "cpu")
    activation = ExpertActivation(kind, alpha, limit)
    got = out.clone()
    slot_experts_ref(x, cache.slots, torch.tensor(tokens, dtype=torch.int32), torch.tensor(slots, dtype=torch.int32),
                     torch.tensor(weights), out=got, **cache.kwargs, act=ACTIVATIONS[kind], alpha=alpha, limit=limit,
                     pair_bias=bias)
    views, want = RecordViews(cache.slots, cache.layout), out.clone()
    clamped = 0
    for p, (t, s, w) in enumerate(zip(tokens, slots, weights, strict=True)):
        if s >= 0:
            w13, w2 = views.weights(s, torch.float32)
            h = x[t].float() @ w13[0].T + bias[p]
            clamped += int((h.abs() > limit).sum())
            want[t] += w * (activate(activation, *split_rows(activation, h)) @ w2[0].T)
    torch.testing.assert_close(got, want, **TIGHT)
    assert clamped > 0  # the limit bites


@needs_triton
@pytest.mark.parametrize("kind, alpha", FORMS)
@pytest.mark.parametrize("hidden, inter", [(64, 32), (96, 40), (64, 1)])  # whole and ragged tiles; Doge's one row
def test_kernel_computes_the_experts_own_form(kind: str, alpha: float, hidden: int, inter: int) -> None:
    from runtime.gpu.kernels.slot_experts_ref import ACTIVATIONS

    cache = Slots("bf16", hidden, inter, [None, 3, 0, 5, 3, 7], activation=ExpertActivation(kind))
    x, out, pairs, limit, bias = _form_case(cache, 3, 2, DEVICE)
    form = {"act": ACTIVATIONS[kind], "alpha": alpha, "limit": limit}
    for pair_bias in (None, bias):
        got = cache.run(functools.partial(slot_experts, **form, pair_bias=pair_bias, block_k=16, split_k=2),
                        x, *pairs, out)
        want = cache.run(functools.partial(slot_experts_ref, **form, pair_bias=pair_bias), x, *pairs, out)
        torch.testing.assert_close(got, want, **TIGHT)


@needs_triton
@pytest.mark.parametrize("hidden, inter", [(64, 32), (96, 40)])
def test_kernel_fills_experts_that_are_not_gated(hidden: int, inter: int) -> None:
    """relu2 records (w13 [I, H]) filled in the launch: the slot ends holding the whole record (no
    gate rows read or written past it), the output the reference's."""
    from runtime.gpu.kernels.slot_experts_ref import ACTIVATIONS

    cache = Slots("bf16", hidden, inter, [None, 3, None, 5], activation=ExpertActivation("relu2"))
    x = torch.randn(1, hidden, generator=torch.Generator().manual_seed(3)).to(cache.dtype).to(DEVICE)
    tokens, slots, weights, fills = [0, 0, 0], [1, 2, 3], [0.5, 0.25, 1.0], [-1, 6, -1]
    tensor = functools.partial(torch.tensor, device=DEVICE)
    outs = []
    for fn in (slot_experts, slot_experts_ref):
        slot_tensor, o = cache.slots.clone(), torch.zeros(1, hidden, device=DEVICE)
        fn(x, slot_tensor, tensor(tokens, dtype=torch.int32), tensor(slots, dtype=torch.int32), tensor(weights),
           out=o, fill_bank=cache.bank.to(DEVICE), pair_fill=tensor(fills, dtype=torch.int32), **cache.kwargs,
           act=ACTIVATIONS["relu2"])
        filled, before = slot_tensor[2].cpu(), cache.slots[2].cpu().clone()
        for part in cache.layout.parts:  # the parts the bank's, every other byte as it was
            span = slice(part.offset, part.offset + part.nbytes)
            assert torch.equal(filled[span], cache.bank[6, span].cpu())
            before[span] = filled[span]
        assert torch.equal(filled, before)
        outs.append(o)
    torch.testing.assert_close(outs[0], outs[1], **TIGHT)


def test_biases_and_fills_do_not_go_together() -> None:
    cache = Slots("bf16", 64, 32, [3, 0], device="cpu")
    pair = (torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.ones(1))
    with pytest.raises(ValueError, match="fills go first"):
        slot_experts_ref(torch.zeros(1, 64, dtype=torch.bfloat16), cache.slots, *pair, out=torch.zeros(1, 64),
                         **cache.kwargs, fill_bank=cache.bank, pair_fill=torch.zeros(1, dtype=torch.int32),
                         pair_bias=torch.zeros(1, 64))
    with pytest.raises(ValueError, match="ACTIVATIONS code"):
        slot_experts_ref(torch.zeros(1, 64, dtype=torch.bfloat16), cache.slots, *pair, out=torch.zeros(1, 64),
                         **cache.kwargs, act=7)
