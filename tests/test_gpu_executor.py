"""The hybrid expert runtime's mechanism, on CPU tensors (device="cpu": synchronous copies, the
same code as on CUDA), against the CPU executor on the same weights and routing.

Tolerance: every path multiplies the same fp32 weights (fp8 dequantized exactly) and only sums
in another order (device part + CPU part), so results agree to a few fp32 ulps of the largest
output; asserted 1e-5 as in test_cpu_experts. Tests marked `gpu` need CUDA (pinned banks,
streams, overlap) and run on the GPU host: pytest -m gpu tests/test_gpu_executor.py
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from dataclasses import replace

import pytest
import torch

from runtime.experts.cpu_kernels import native_kernel
from runtime.experts.executor import CPUExpertExecutor
from runtime.experts.synthetic import random_bank
from runtime.gpu import (
    MODES,
    BandwidthProfile,
    CacheTooSmallError,
    ExpertCache,
    HybridExpertExecutor,
    UnsupportedOnDevice,
    build_hybrid,
    choose_pcie_count,
    load_or_measure,
    measure,
    q_star,
)
from runtime.gpu.auto_guard import PCIE_ONLY, AutoGuard
from runtime.gpu.prefill import BankStreamer, CachePrefill, StreamingPrefill
from runtime.gpu.split import SplitTables, layer_ms, miss_cost
from runtime.policy.expert_cache import automatic

E, H, INTER, K = 16, 80, 40, 4  # H, INTER off the SIMD width and the 128-wide FP8 block
LAYERS = (1, 2, 3)  # MoE layers need not start at 0
PROFILE = BandwidthProfile(pcie_gbps=50.0, cpu_gbps=30.0, cpu_fixed_ms=0.0, pcie_fixed_ms=0.0)


def make_banks(dtype: str = "f32", num_experts: int = E, layers=LAYERS, scales: bool = True):
    return {layer: random_bank(dtype, num_experts, H, INTER, layer=layer, seed=layer, fp8_scales=scales)
            for layer in layers}


def routing(num_tokens: int, gen: torch.Generator, num_experts: int = E, top_k: int = K):
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(num_tokens)])
    return ids, torch.rand(num_tokens, top_k, generator=gen)


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5) -> None:
    err = float((ours.float() - ref.float()).abs().max() / ref.float().abs().max())
    assert err <= rel, f"max error {err:.2e} of the largest output, allowed {rel:.0e}"


def hybrid(banks, mode: str, slots: int, **options) -> HybridExpertExecutor:
    options.setdefault("prefill_min_tokens", 8)
    return build_hybrid(banks, device="cpu", cache_slots=slots, mode=mode, profile=PROFILE, top_k=K,
                        compute_dtype=torch.float32, **options)


# -- every mode against the CPU executor ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f8_e4m3"])
@pytest.mark.parametrize("mode", MODES)
def test_modes_match_cpu_executor(mode: str, dtype: str) -> None:
    banks = make_banks(dtype)
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=20, auto_guard=False)  # "auto": the model's split on every call
    gen = torch.Generator().manual_seed(0)
    for num_tokens in (1, 1, 3, 12, 1, 2, 12, 1):  # decode, small batches, prefill (>= 8 tokens)
        for layer in LAYERS:
            x = torch.randn(num_tokens, H, generator=gen)
            ids, weights = routing(num_tokens, gen)
            ids[0, 1] = ids[0, 0]  # a duplicate within one token
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    s = ex.stats()
    assert s.calls and (s.prefill_calls if mode != "cpu" else not s.prefill_calls)
    assert (s.pcie_experts == 0) == (mode in ("cpu", "static", "prefill_placement"))
    assert (s.cpu_experts == 0) == (mode == "offload")
    ex.close()
    # closing gives the cache's memory back at once (not when the garbage collector finds the executor)
    assert ex.cache.num_slots == 0 and ex.cache.slots.numel() == 0


class CaughtUpStreamFlags:
    """StreamFlags for the CPU device, whose "stream" is the launching thread and always caught
    up: a write lands at once, a wait holds the launching thread until the worker sets the flag."""

    capturable = False

    def write(self, flag, value: int) -> None:
        flag.set(value)

    def wait(self, flag, value: int) -> None:
        assert flag.wait(value, 10.0), f"the flag never reached {value}"


@pytest.mark.parametrize("worker", ["native", "python"])
@pytest.mark.parametrize("mode", ["cpu", "auto", "static"])
def test_the_flag_hand_over_to_the_worker_computes_every_call(mode: str, worker: str) -> None:
    """The CUDA path's hand-over (inputs staged, `ready` written, the worker waits for it and
    clears it, sets `done`, the stream waits for it and resets it), one pair of flags for every
    call, run on the CPU with a stream that is always caught up: outputs as the CPU executor's.
    The native worker (a thread outside Python) where the kernel runs the call, or the Python one."""
    from runtime.gpu.cpu_share import CPUShare

    banks = make_banks("f32")
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=4 * K, split=lambda misses, nbytes: misses // 2, auto_guard=False)
    ex.cpu_share = CPUShare(ex.cpu_executor, ex.device, flags=CaughtUpStreamFlags(), native=worker == "native")
    gen = torch.Generator().manual_seed(6)
    for num_tokens in (1, 1, 2, 1, 3, 1):
        for layer in LAYERS:
            x = torch.randn(num_tokens, H, generator=gen)
            ids, weights = routing(num_tokens, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    assert ex.stats().cpu_experts > 0 and ex.stats().cpu_ms > 0
    assert (ex.cpu_share.ready.read(), ex.cpu_share.done.read()) == (0, 0)  # both reset after every call
    assert ex.cpu_share.native_worker_started == (worker == "native" and native_kernel() is not None)
    cpu_ms = ex.stats().cpu_ms
    ex.close()
    assert ex.stats().cpu_ms == cpu_ms  # the counters outlive the worker


class FailsOnce:
    """A CPU executor whose first call fails (a transient error: memory, an interrupted read)."""

    def __init__(self, reference: CPUExpertExecutor) -> None:
        self.reference, self.failed = reference, False

    def __call__(self, layer: int, x, ids, weights):
        if not self.failed:
            self.failed = True
            raise MemoryError("transient")
        return self.reference(layer, x, ids, weights)


@pytest.mark.parametrize("flags", [False, True])
def test_a_worker_failure_is_raised_once_and_the_calls_after_it_run(flags: bool) -> None:
    """A CPU share that fails raises "the CPU expert worker failed" on the launching thread once:
    at its own call without stream flags (the host waits for it), at the next call with them
    (the stream waited). The calls after it compute as before."""
    from runtime.gpu.cpu_share import CPUShare

    banks = make_banks("f32")
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, "cpu", slots=4 * K, cpu_executor=FailsOnce(reference))
    if flags:
        ex.cpu_share = CPUShare(ex.cpu_executor, ex.device, flags=CaughtUpStreamFlags(), native=False)
    gen = torch.Generator().manual_seed(6)
    calls = [(torch.randn(1, H, generator=gen), *routing(1, gen)) for _ in range(4)]
    outcomes = []
    for x, ids, weights in calls:
        try:
            out = ex(LAYERS[0], x, ids, weights)
        except RuntimeError as e:
            assert "CPU expert worker failed" in str(e) and isinstance(e.__cause__, MemoryError)
            outcomes.append("failed")
            continue
        outcomes.append("ran")
        if outcomes.count("failed"):  # a call after the failure: the right answer
            assert_close(out, reference(LAYERS[0], x, ids, weights))
    assert outcomes == (["ran", "failed", "ran", "ran"] if flags else ["failed", "ran", "ran", "ran"])
    ex.close()


class RecordedStreamFlags:
    """StreamFlags as a capture sees them: the writes and waits are recorded, not made."""

    capturable = True

    def __init__(self) -> None:
        self.ops: list[tuple[str, object, int]] = []

    def write(self, flag, value: int) -> None:
        self.ops.append(("write", flag, value))

    def wait(self, flag, value: int) -> None:
        self.ops.append(("wait", flag, value))


@pytest.mark.skipif(native_kernel() is None, reason="needs the compiled kernel library")
def test_a_step_whose_cpu_shares_would_go_to_both_workers_is_not_captured() -> None:
    """A replay hands all its CPU shares to the workers before it runs, and a job for one worker
    first waits for the other's, which wait for flags only the replay writes: a step that mixes
    them (a layer whose bank the native kernel cannot run) is refused, and runs layer by layer."""
    from runtime.gpu.cpu_share import CPUShare
    from runtime.gpu.step_graphs import StepNotCapturable

    banks = make_banks("f32")
    cpu = CPUExpertExecutor(banks, torch.float32)
    kernel_for = cpu._kernel_for
    cpu._kernel_for = lambda layer, ids: None if layer == LAYERS[-1] else kernel_for(layer, ids)
    ex = hybrid(banks, "cpu", slots=0, cpu_executor=cpu)
    gen = torch.Generator().manual_seed(6)
    for layer in LAYERS:  # an uncaptured step first: the counters exist
        ex(layer, torch.randn(1, H, generator=gen), *routing(1, gen))
    ex.cpu_share = CPUShare(cpu, ex.device, flags=RecordedStreamFlags())
    ex._step_state, ex._step_cpu = ex.cache.device_state(), True
    with ex.capturing_step() as capture, pytest.raises(StepNotCapturable, match="both the native worker"):
        for layer in LAYERS:
            ex(layer, torch.randn(1, H, generator=gen), *routing(1, gen))
    assert capture.native_jobs == {True, False} and capture.count == len(LAYERS) - 1


def test_a_split_table_is_never_copied_inside_a_capture() -> None:
    """A captured step reads "auto"'s split tables from copies of fixed address. A copy made
    inside the capture would be captured too, and every replay would rewrite the copy with that
    one table, however the hit rate moved. So a table whose copy is not current ends the capture
    (CaptureLater: the step runs layer by layer); the next begin_step brings the copy up to date,
    and the capture after it reads the copy as it is."""
    from runtime.gpu.cpu_share import CPUShare
    from runtime.gpu.step_graphs import CaptureLater

    banks = make_banks("f32")
    ex = hybrid(banks, "auto", slots=4 * K, split=lambda misses, nbytes: misses // 2, auto_guard=False)
    gen = torch.Generator().manual_seed(6)
    for layer in LAYERS:  # an uncaptured step: counters and tables made, no copy of fixed address
        ex(layer, torch.randn(1, H, generator=gen), *routing(1, gen))
    ex.cpu_share = CPUShare(ex.cpu_executor, ex.device, flags=RecordedStreamFlags())
    ex._step_state, ex._step_cpu = ex.cache.device_state(), True
    with ex.capturing_step(), pytest.raises(CaptureLater, match="split table changed"):
        ex(LAYERS[0], torch.randn(1, H, generator=gen), *routing(1, gen))
    assert ex.splits._fixed == {}  # nothing copied while capturing
    assert ex._step_tables_use_cpu()  # begin_step's part: the copies made, outside the capture
    (copy, source), = ex.splits._fixed.values()
    with ex.capturing_step() as capture:
        for layer in LAYERS:
            ex(layer, torch.randn(1, H, generator=gen), *routing(1, gen))
    (copy_after, source_after), = ex.splits._fixed.values()
    assert capture.count == len(LAYERS) and copy_after is copy and source_after is source


class LostWriteStreamFlags(CaughtUpStreamFlags):
    """A stream whose writes of `ready` never land."""

    def write(self, flag, value: int) -> None:
        if flag is not self.ready:
            flag.set(value)


@pytest.mark.skipif(native_kernel() is None, reason="needs the compiled kernel library")
def test_the_native_worker_that_never_gets_its_inputs_gives_up_and_says_so(monkeypatch) -> None:
    """A call whose `ready` never comes: the native worker waits WAIT_TIMEOUT_S, sets `done` (a
    stream waits for it) and the next call raises an error that says what happened."""
    from runtime.gpu import cpu_share as cpu_share_mod

    monkeypatch.setattr(cpu_share_mod, "WAIT_TIMEOUT_S", 0.05)
    banks = make_banks("f32")
    ex = hybrid(banks, "cpu", slots=4 * K, auto_guard=False)
    flags = LostWriteStreamFlags()
    ex.cpu_share = cpu_share_mod.CPUShare(ex.cpu_executor, ex.device, flags=flags)
    flags.ready = ex.cpu_share.ready
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(1, H, generator=gen)
    ids, weights = routing(1, gen)
    ex(LAYERS[0], x, ids, weights)  # the "stream" waits for `done`, which the worker sets on giving up
    assert ex.cpu_share.native_worker_started
    with pytest.raises(RuntimeError, match="CPU expert worker failed") as caught:
        ex(LAYERS[0], x, ids, weights)
    assert "did not hand over" in str(caught.value.__cause__)
    ex.close()
    with pytest.raises(RuntimeError, match="native worker is closed"):
        ex.cpu_share._native.push(None)


@pytest.mark.parametrize("mode", ["offload", "auto"])
def test_many_experts_per_call_run_in_chunks(mode: str, monkeypatch) -> None:
    """More distinct experts than one batched matmul takes (decode path with a few tokens, and
    prefill): padded chunks, here of 8 experts, gathered or read in place."""
    from runtime.gpu import records

    monkeypatch.setattr(records, "CHUNK_EXPERTS", 8)
    banks = make_banks(num_experts=40, layers=(1, 2))
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=30, prefill_min_tokens=16)
    gen = torch.Generator().manual_seed(2)
    for num_tokens in (6, 20, 6, 20):
        for layer in (1, 2):
            x = torch.randn(num_tokens, H, generator=gen)
            ids, weights = routing(num_tokens, gen, num_experts=40, top_k=K)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    assert ex.stats().prefill_calls == 4


def test_bf16_output_dtype() -> None:
    banks = make_banks("bf16")
    ex = hybrid(banks, "auto", slots=20)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1, H, generator=gen).bfloat16()
    ids, weights = routing(1, gen)
    out = ex(1, x, ids, weights.bfloat16())
    ref = CPUExpertExecutor(banks, torch.float32)(1, x.float(), ids, weights.bfloat16().float())
    assert out.dtype == torch.bfloat16
    assert_close(out, ref, rel=2**-7)


def test_block_quants_without_a_device_path_are_refused_on_the_device() -> None:
    """TQ1_0 (ternary) has no device dequantizer: the hybrid modes refuse it with the fix, mode
    cpu runs it."""
    banks = {1: random_bank("tq1_0", E, 256, 256, layer=1)}
    with pytest.raises(UnsupportedOnDevice, match=r"tq1_0.*GPU cannot read yet.*q4_k.*mode='cpu'.*Q4_K_M"):
        build_hybrid(banks, device="cpu", cache_slots=8, mode="offload", top_k=K)
    ex = build_hybrid(banks, device="cpu", cache_slots=8, mode="cpu", top_k=K, compute_dtype=torch.float32)
    x, (ids, weights) = torch.randn(1, 256), routing(1, torch.Generator().manual_seed(0))
    assert_close(ex(1, x, ids, weights), CPUExpertExecutor(banks, torch.float32)(1, x, ids, weights))


GGUF_H, GGUF_I = 256, 256  # K-quant rows are whole 256-value blocks


@pytest.mark.parametrize("quant", [("q8_0", None), ("q4_k", "q6_k"), ("q5_k", "q6_k"), ("q6_k", None),
                                   ("q4_0", "q8_0"), ("mxfp4", None)])
@pytest.mark.parametrize("mode", ["auto", "offload", "static", "prefill_placement"])
def test_gguf_experts_run_on_the_device_with_the_cpu_executors_outputs(mode: str, quant: tuple) -> None:
    """A GGUF model's experts (Q8_0, Q4_K_M's Q4_K gate/up with Q6_K down, Q5_K_M's, Q6_K, Q4_0
    with a Q8_0 down, gpt-oss's MXFP4) in every hybrid mode: cache slots and streamed banks hold the blocks as stored, dequantized as
    they are read (bit-exact with gguf-py: test_ggml_blocks.py); decode, small batches and
    prefill give the outputs of the reference executor, which dequantizes with gguf-py; it
    serves the CPU's share too (the CPU kernel quantizes activations to Q8_K as llama.cpp does,
    ~1% off: test_kquant_kernel.py holds it to its own tolerance)."""
    from runtime.experts.executor import ReferenceCPUExpertExecutor

    gate_up, down = quant
    banks = {layer: random_bank(gate_up, E, GGUF_H, GGUF_I, layer=layer, seed=layer, down_dtype=down)
             for layer in LAYERS}
    reference = ReferenceCPUExpertExecutor(banks, torch.float32)
    ex = build_hybrid(banks, device="cpu", cache_slots=20, mode=mode, profile=PROFILE, top_k=K,
                      compute_dtype=torch.float32, auto_guard=False, prefill_min_tokens=8, cpu_executor=reference)
    gen = torch.Generator().manual_seed(3)
    for num_tokens in (1, 1, 3, 12, 1):
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(num_tokens, GGUF_H, generator=gen), routing(num_tokens, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    s = ex.stats()
    assert s.prefill_calls and (s.pcie_experts == 0) == (mode in ("static", "prefill_placement"))
    ex.close()


@pytest.mark.parametrize("mode", ["auto", "cpu", "offload"])
def test_the_cpu_kernel_is_bound_at_build_where_the_cpu_may_get_experts(monkeypatch, mode: str) -> None:
    """The kernel's build (seconds, once a machine) and the banks' checks happen at load, not in
    the first decode step that sends a miss to the CPU (on the H200 such a step took 7.5 s)."""
    bound: list[int] = []
    bind = CPUExpertExecutor._bind
    monkeypatch.setattr(CPUExpertExecutor, "_bind", lambda self, layer: (bound.append(layer), bind(self, layer))[1])
    banks = make_banks("f32")
    ex = build_hybrid(banks, device="cpu", cache_slots=16, mode=mode, profile=PROFILE, top_k=K,
                      compute_dtype=torch.float32)
    assert bound == ([] if mode == "offload" else sorted(banks))
    gen = torch.Generator().manual_seed(2)
    ex(LAYERS[0], torch.randn(1, H, generator=gen), *routing(1, gen))
    assert len(bound) == len(set(bound))  # never bound again
    ex.close()


# -- the cache: global LRU, victims, resize -------------------------------------------------------------

def cache_of(num_slots: int, stride: int = 4096) -> ExpertCache:
    return ExpertCache(num_slots, stride, "cpu", num_layers=4, num_experts=8)


def record(value: int, stride: int = 4096) -> torch.Tensor:
    return torch.full((stride,), value, dtype=torch.uint8)


def test_victims_empty_first_then_least_recent_never_protected_or_pinned() -> None:
    cache = cache_of(4)
    assert cache.victims(2) == [0, 1]  # empty slots, by index
    cache.advance()
    cache.fill([cache.key(0, 0), cache.key(0, 1)], [0, 1], [record(1), record(2)])
    assert cache.victims(2) == [2, 3]
    cache.advance()
    cache.fill([cache.key(1, 5), cache.key(1, 6)], [2, 3], [record(3), record(4)])
    assert cache.victims(4) == [0, 1, 2, 3]  # oldest first, ties by slot
    cache.advance()
    cache.touch([0])
    assert cache.victims(3) == [1, 2, 3]
    assert cache.victims(2, protect=[cache.key(0, 1)]) == [2, 3]
    cache.pinned[2] = True
    assert cache.victims(2, protect=[cache.key(0, 1)]) == [3, 0]
    with pytest.raises(ValueError, match="2 victims asked, 1"):
        cache.victims(2, protect=[cache.key(0, 0), cache.key(0, 1)])
    assert cache.lookup([cache.key(0, 0), cache.key(1, 6), cache.key(2, 0)]) == [0, 3, -1]
    assert cache.device_state()[0].tolist()[cache.key(1, 5)] == 2
    assert torch.equal(cache.slots[3], record(4))


def test_global_lru_over_a_hand_made_sequence() -> None:
    """Two layers, 6 slots, offload: which entries stay and which slots are reused, step by step."""
    banks = make_banks("f32", num_experts=8, layers=(0, 1))
    ex = build_hybrid(banks, device="cpu", cache_slots=6, mode="offload", top_k=3, compute_dtype=torch.float32)
    cache = ex.cache

    def step(layer: int, experts: list[int]) -> None:
        x = torch.randn(1, H)
        ids, weights = torch.tensor([experts]), torch.rand(1, len(experts))
        assert_close(ex(layer, x, ids, weights), CPUExpertExecutor(banks, torch.float32)(layer, x, ids, weights))

    def held() -> dict[tuple[int, int], int]:  # (layer, expert) -> slot
        return {divmod(int(k), 8): s for s, k in enumerate(cache.owner.tolist()) if k >= 0}

    step(0, [0, 1, 2])  # clock 1: slots 0-2
    step(1, [0, 1, 2])  # clock 2: slots 3-5
    assert held() == {(0, 0): 0, (0, 1): 1, (0, 2): 2, (1, 0): 3, (1, 1): 4, (1, 2): 5}
    step(0, [2, 3, 4])  # clock 3: hit (0,2); misses take the two oldest slots, 0 and 1
    assert held() == {(0, 3): 0, (0, 4): 1, (0, 2): 2, (1, 0): 3, (1, 1): 4, (1, 2): 5}
    step(1, [5, 6, 7])  # clock 4: evicts layer 1's own, the oldest (clock 2): slots 3, 4, 5
    assert held() == {(0, 3): 0, (0, 4): 1, (0, 2): 2, (1, 5): 3, (1, 6): 4, (1, 7): 5}
    assert cache.last_used.tolist() == [3, 3, 3, 4, 4, 4]
    s = ex.stats()
    assert (s.calls, s.hits, s.misses, s.pcie_experts, s.cpu_experts) == (4, 1, 11, 11, 0)
    assert s.pcie_bytes == 11 * banks[0].layout.expert_stride


def test_decode_plans_keep_the_clock_on_the_device_in_step_with_the_host() -> None:
    """A decode plan moves the device clock itself (nothing written per captured replay); a move
    made on the host (prefill) reaches the device before the next plan; LRU order holds across."""
    banks = make_banks("f32", num_experts=8, layers=(0, 1))
    ex = build_hybrid(banks, device="cpu", cache_slots=6, mode="offload", top_k=3, compute_dtype=torch.float32)
    cache = ex.cache
    with pytest.raises(RuntimeError, match="device_state"):
        cache.tick()  # the device clock does not exist yet
    ex(0, torch.randn(1, H), torch.tensor([[0, 1, 2]]), torch.rand(1, 3))
    ex(1, torch.randn(1, H), torch.tensor([[0, 1, 2]]), torch.rand(1, 3))
    assert cache.clock == 2 and int(cache.device_state()[2].max()) == 2
    for _ in range(5):  # the host moves the clock without a plan (as prefill does)
        cache.advance()
    ex(0, torch.randn(1, H), torch.tensor([[3]]), torch.rand(1, 1))
    assert cache.clock == 8
    assert sorted(cache.last_used.tolist()) == [1, 1, 2, 2, 2, 8]  # the miss took the oldest slot, at 8


def test_the_current_layers_experts_are_never_evicted() -> None:
    """Five experts needed, four slots all holding them or older ones: only the one slot not
    needed now takes a miss; the other miss runs on the CPU."""
    banks = make_banks("f32", num_experts=8, layers=(0,))
    ex = build_hybrid(banks, device="cpu", cache_slots=4, mode="offload", top_k=4, compute_dtype=torch.float32)
    cache = ex.cache
    reference = CPUExpertExecutor(banks, torch.float32)
    for experts in ([0, 1, 2, 3], [0, 1, 2, 4, 5]):
        x, ids, weights = torch.randn(1, H), torch.tensor([experts]), torch.rand(1, len(experts))
        assert_close(ex(0, x, ids, weights), reference(0, x, ids, weights))
    assert sorted(int(k) for k in cache.owner) == [0, 1, 2, 4]  # expert 3's slot took expert 4
    s = ex.stats()
    assert (s.hits, s.misses, s.pcie_experts, s.cpu_experts) == (3, 6, 5, 1)
    assert s.cpu_bytes == banks[0].layout.expert_stride


def test_resize_keeps_the_most_recent_entries() -> None:
    cache = cache_of(5)
    for i in range(5):
        cache.advance()
        cache.fill([cache.key(0, i)], [i], [record(10 + i)])
    cache.advance()
    cache.touch([1])  # recency, newest first: 1, 4, 3, 2, 0
    cache.resize(3)
    assert cache.num_slots == 3
    assert [divmod(int(k), 8)[1] for k in cache.owner] == [1, 4, 3]
    assert [int(cache.slots[s, 0]) for s in range(3)] == [11, 14, 13]
    assert cache.last_used.tolist() == [6, 5, 4]
    assert cache.lookup([cache.key(0, e) for e in range(5)]) == [-1, 0, -1, 2, 1]
    assert cache.device_state()[0].tolist()[: 5] == [-1, 0, -1, 2, 1]
    cache.resize(6)  # growing keeps everything, the new slots are empty
    assert [int(k) for k in cache.owner] == [1, 4, 3, -1, -1, -1]
    assert cache.victims(3) == [3, 4, 5]
    cache.clear()
    assert cache.num_cached == 0 and cache.lookup([1]) == [-1]


def test_clear_keeps_the_tensors_graphs_hold_and_resize_makes_new_ones() -> None:
    """Captured decode graphs hold the addresses of the slots and the device state: clear empties
    them in place (graphs stay valid), a resize makes new ones and moves `generation` on."""
    cache = cache_of(4)
    cache.advance()
    cache.fill([cache.key(0, 1)], [0], [record(11)])
    state, slots, generation = cache.device_state(), cache.slots, cache.generation
    cache.clear()
    assert cache.generation == generation and cache.slots is slots
    after = cache.device_state()
    assert all(a is b for a, b in zip(after, state, strict=True))
    assert after[0].tolist()[1] == -1 and after[1].tolist() == [-1] * 4  # emptied in place
    cache.resize(4)
    assert cache.generation == generation + 1 and cache.slots is not slots
    assert all(a is not b for a, b in zip(cache.device_state(), state, strict=True))


def test_resize_refills_from_host_when_the_device_is_full(monkeypatch) -> None:
    cache = cache_of(4)
    for i in range(4):
        cache.advance()
        cache.fill([cache.key(0, i)], [i], [record(20 + i)])
    real_select = torch.index_select

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("no room for both")

    monkeypatch.setattr(torch, "index_select", out_of_memory)
    cache.resize(2, source=lambda key: record(20 + key))
    monkeypatch.setattr(torch, "index_select", real_select)
    assert [int(k) for k in cache.owner] == [3, 2]
    assert [int(cache.slots[s, -1]) for s in range(2)] == [23, 22]


def test_resize_with_no_room_frees_the_old_slots_first_and_leaves_an_empty_cache_if_even_that_fails(monkeypatch) -> None:
    """The host refill path: the old slots (and every view of them) are let go before the new
    size is allocated; where the device has no room for the new size alone, the error goes up
    and the cache is left consistent, empty, with no slots, and calls after it still compute."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, "offload", slots=20)
    gen = torch.Generator().manual_seed(3)
    for layer in LAYERS:
        ex(layer, torch.randn(1, H, generator=gen), *routing(1, gen))
    cache = ex.cache
    cache.views(banks[LAYERS[0]].layout)  # a view of the old slots, as a decode call leaves one
    old = weakref.ref(cache.slots.untyped_storage())
    real_empty = torch.empty
    alive_at_refill = []

    def out_of_memory(*args, **kwargs):
        del args, kwargs  # the traceback keeps this frame: it must not hold the slots (torch's own raise does not)
        raise torch.OutOfMemoryError("no room for both")

    def empty(*args, **kwargs):
        if args and args[0] == 16:
            alive_at_refill.append(old() is not None)
            if len(alive_at_refill) > 1:  # the refill's own allocation
                raise torch.OutOfMemoryError("no room for the new size either")
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "index_select", out_of_memory)
    monkeypatch.setattr(torch, "empty", empty)
    with pytest.raises(torch.OutOfMemoryError, match="new size either"):
        ex.resize(16)
    monkeypatch.undo()
    assert alive_at_refill == [True, False]  # held by the first try, free at the refill's
    assert cache.num_slots == 0 and len(cache.owner) == 0 and cache.num_cached == 0
    for layer in LAYERS:
        x, (ids, weights) = torch.randn(1, H, generator=gen), routing(1, gen)
        assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    ex.resize(16)  # room again: the cache grows back
    assert cache.num_slots == 16


def test_views_read_a_slot_as_the_experts_parts() -> None:
    bank = make_banks("f8_e4m3", layers=(2,))[2]
    cache = ExpertCache(2, bank.layout.expert_stride, "cpu", num_layers=3, num_experts=E)
    cache.fill([cache.key(2, 5)], [1], [bank.record(5)])
    parts = cache.expert_parts(1, bank.layout)
    for p in bank.layout.parts:
        assert torch.equal(parts[p.name].view(torch.uint8), bank.raw_part(5, p.name).view(torch.uint8))


# -- the split -----------------------------------------------------------------------------------------

def test_split_is_q_star_without_fixed_costs() -> None:
    rates = BandwidthProfile(pcie_gbps=55.0, cpu_gbps=35.0, cpu_fixed_ms=0.0, pcie_fixed_ms=0.0)
    assert q_star(rates) == pytest.approx(55 / 90)
    for misses in (8, 40, 100):
        assert abs(choose_pcie_count(misses, 9_437_184, rates) - q_star(rates) * misses) <= 1


def test_split_fixed_costs_and_never_worse_than_a_fixed_policy() -> None:
    stride = 9_437_184
    cpu_costly = BandwidthProfile(pcie_gbps=55.0, cpu_gbps=35.0, cpu_fixed_ms=1.0, pcie_fixed_ms=0.02)
    assert choose_pcie_count(2, stride, cpu_costly) == 2  # few misses: the CPU's fixed cost is not worth it
    assert choose_pcie_count(64, stride, cpu_costly) < 64
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        p, c, fp, fc = (torch.rand(4, generator=gen) * torch.tensor([60, 60, 2, 2]) + 0.01).tolist()
        rates = BandwidthProfile(pcie_gbps=p, cpu_gbps=c, pcie_fixed_ms=fp, cpu_fixed_ms=fc)
        m = int(torch.randint(0, 40, (1,), generator=gen))
        n = choose_pcie_count(m, stride, rates)
        assert 0 <= n <= m
        assert layer_ms(rates, m, n, stride) <= min(layer_ms(rates, m, m, stride), layer_ms(rates, m, 0, stride))


def test_split_uses_the_alone_rates_for_one_sided_layers() -> None:
    """DRAM contention slows both sides only when both run: alone, the CPU may win outright."""
    stride = 9_437_184
    contended = BandwidthProfile(pcie_gbps=48.0, cpu_gbps=5.0, cpu_fixed_ms=1.0, pcie_fixed_ms=1.0)
    assert choose_pcie_count(8, stride, contended) == 8
    alone = BandwidthProfile(pcie_gbps=48.0, cpu_gbps=5.0, cpu_fixed_ms=1.0, pcie_fixed_ms=1.0,
                             pcie_alone_gbps=50.0, cpu_alone_gbps=70.0)
    assert choose_pcie_count(8, stride, alone) == 0
    # both run: the contended rates, the fixed costs beside each other
    assert layer_ms(alone, 8, 4, stride) == pytest.approx(1.0 + 4 * stride / 5e6)


@pytest.mark.parametrize("pricing", ["hit_rate", "worth"])
def test_auto_split_is_the_simulators_automatic_policy(pricing: str) -> None:
    """Same routing, a cache that never evicts, the same cost: the executor's "auto" copies what
    the trace simulator's `automatic` policy copies, call by call, recent hit rate and the worth
    of a copy (its sampled LRU ranks) included."""
    banks = make_banks(layers=(0, 1))
    stride = banks[0].layout.expert_stride
    # fixed costs about a few experts' worth, so the split, and the fill value, matter
    profile = BandwidthProfile(pcie_gbps=stride / 1e6, cpu_gbps=stride / 1.5e6, pcie_fixed_ms=0.5,
                               cpu_fixed_ms=1.5, pcie_alone_gbps=stride / 0.9e6, cpu_alone_gbps=stride / 1.2e6)
    ex = build_hybrid(banks, device="cpu", cache_slots=2 * E, mode="auto", profile=profile, top_k=K,
                      compute_dtype=torch.float32, prefill_min_tokens=64, auto_guard=False, fill_pricing=pricing)
    cost = miss_cost(profile)
    sim = automatic(2 * E, cost, [stride, stride], pricing=pricing)
    gen = torch.Generator().manual_seed(5)
    counts = set()
    for num_tokens in (3, 1, 2, 4, 1, 1, 3, 2, 1, 1, 2, 1) * 3:  # 72 calls: clocks 34 and 68 rank their hits
        for layer in (0, 1):
            ids, weights = routing(num_tokens, gen)
            before = ex.stats()
            fills = sim.pcie_fills
            assert ex.recent_hit_rate == pytest.approx(sim.recent_hit_rate, abs=1e-12)
            assert ex.fill_worth == pytest.approx(sim.fill_worth, abs=1e-12)
            ex(layer, torch.randn(num_tokens, H, generator=gen), ids, weights)
            sim.access(layer, list(dict.fromkeys(ids.reshape(-1).tolist())))  # the route plan's order: first use
            after = ex.stats()
            assert after.pcie_experts - before.pcie_experts == sim.pcie_fills - fills
            counts.add((after.pcie_experts - before.pcie_experts, after.cpu_experts - before.cpu_experts))
    assert any(pcie and cpu for pcie, cpu in counts)  # a real split, not one fixed policy
    assert ex.stats().hits == sim.hits and ex.stats().misses == sim.misses
    assert 0 < ex.fill_worth == sim.fill_worth < sim.recent_hit_rate  # ranked hits, some in the oldest quarter


def test_auto_uses_a_given_split() -> None:
    banks = make_banks()
    ex = hybrid(banks, "auto", slots=20, split=lambda misses, nbytes: 1, auto_guard=False)  # (its first arm: PCIe-only)
    x, (ids, weights) = torch.randn(1, H), routing(1, torch.Generator().manual_seed(0))
    ex(1, x, ids, weights)
    s = ex.stats()
    assert (s.misses, s.pcie_experts, s.cpu_experts) == (K, 1, K - 1)



def test_graphs_read_a_split_table_per_expert_size() -> None:
    """The fixed copies CUDA graphs read: one per (expert size, table size), refreshed only when
    the table changes; two expert sizes with tables of one length keep theirs apart."""
    splits = SplitTables("auto", lambda misses, nbytes: nbytes // 1000, None, torch.device("cpu"))
    small, _ = splits.for_call(K, 1000)
    large, _ = splits.for_call(K, 3000)
    assert small.numel() == large.numel() and not torch.equal(small, large)
    fixed_small, fixed_large = splits.fixed(small, 1000), splits.fixed(large, 3000)
    assert torch.equal(fixed_small, small) and torch.equal(fixed_large, large)
    assert splits.fixed(small, 1000) is fixed_small  # the same buffer, call after call


# -- capacity ------------------------------------------------------------------------------------------

def test_a_cache_below_one_tokens_experts_is_refused_with_numbers(caplog) -> None:
    """Only for plain offload, whose every miss would cross PCIe at ~0% hits; auto streams its
    misses through such a cache beside the CPU, and below one layer's top-k computes them all on
    the CPU (it runs as "cpu"), as llama.cpp's --n-cpu-moe does."""
    banks = make_banks()
    stride = banks[1].layout.expert_stride
    with pytest.raises(CacheTooSmallError, match=r"holds 11 slots .* 3 MoE layers x top-4 = 12 slots"):
        hybrid(banks, "offload", slots=11)
    auto = build_hybrid(banks, device="cpu", vram_budget_bytes=11 * stride, mode="auto", profile=PROFILE, top_k=K,
                        prefill_buffers=0)
    assert (auto.mode, auto.cache.num_slots) == ("auto", 11)
    assert auto.guard is not None and isinstance(auto.prefill, CachePrefill)  # a prompt streams through the slots
    auto = build_hybrid(banks, device="cpu", vram_budget_bytes=(K - 1) * stride, mode="auto", profile=PROFILE,
                        top_k=K, prefill_buffers=0)
    assert (auto.mode, auto.cache.num_slots, auto.guard, auto.prefill) == ("cpu", K - 1, None, None)
    assert hybrid(banks, "auto", slots=12).mode == "auto"  # one token's experts: auto as asked
    with caplog.at_level(logging.WARNING, logger="runtime.gpu.build"):
        hybrid(banks, "offload", slots=11, force=True)
        hybrid(banks, "prefill_placement", slots=11)
    assert caplog.text.count("3 MoE layers x top-4 = 12 slots") == 2
    hybrid(banks, "cpu", slots=0)  # the CPU mode never uses the cache

    # the prefill buffers are slots the cache lends while a prompt streams: a budget of two banks
    # of 16 experts and 12 slots is a cache of 44 that lends two; of one bank and 12, one
    ex = build_hybrid(banks, device="cpu", vram_budget_bytes=(2 * E + 12) * stride, mode="offload", top_k=K)
    assert ex.cache.num_slots == 2 * E + 12 and ex.prefill.streamer.num_buffers == 2
    ex = build_hybrid(banks, device="cpu", vram_budget_bytes=(E + 12) * stride, mode="offload", top_k=K)
    assert ex.cache.num_slots == E + 12 and ex.prefill.streamer.num_buffers == 1


@pytest.mark.parametrize("slots", [1, 5, 11])
@pytest.mark.parametrize("mode", ["auto", "cpu", "static", "prefill_placement", "offload"])
def test_a_cache_below_one_tokens_experts_runs_in_every_mode_with_the_cpu_executors_outputs(mode: str,
                                                                                           slots: int) -> None:
    """A few slots, fewer than one token's experts (3 MoE layers x top-4 = 12): auto streams
    misses through them from one layer's top-k up (below, it runs as "cpu"), the others run as
    asked (offload forced), decode and prefill calls alike, with the CPU executor's outputs;
    whatever a slot holds is computed from it."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    # (auto without its guard, whose trial of plain offload would hide the split)
    options = {"auto_guard": False} if mode == "auto" else {}
    ex = hybrid(banks, mode, slots=slots, force=mode == "offload", prefill_min_tokens=8, **options)
    streams = mode == "auto" and slots >= K
    assert ex.mode == ("cpu" if mode == "auto" and not streams else mode) and ex.cache.num_slots == slots
    gen = torch.Generator().manual_seed(6)
    for num_tokens in (1, 12, 1, 3, 1):
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(num_tokens, H, generator=gen), routing(num_tokens, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    s = ex.stats()
    if mode == "offload":
        assert s.pcie_experts > 0
    elif streams:  # the split: some misses over PCIe through the slots, the rest on the CPU
        assert s.pcie_experts > 0 and s.cpu_experts > 0 and s.prefill_calls > 0
    else:
        assert s.cpu_experts > 0 and s.pcie_experts == 0
    ex.close()


@pytest.mark.parametrize("mode", ["offload", "auto", "static", "prefill_placement"])
def test_a_cache_of_no_slots_sends_every_expert_to_the_cpu(mode: str) -> None:
    """No slots at all (allowed with a warning, or forced): every call, decode or prefill, is
    the CPU's, with the CPU executor's outputs."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=0, force=True)
    gen = torch.Generator().manual_seed(4)
    for num_tokens in (1, 12, 1, 2):
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(num_tokens, H, generator=gen), routing(num_tokens, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    assert ex.stats().hits == 0 and ex.stats().pcie_experts == 0


# -- static residency ----------------------------------------------------------------------------------

def test_static_mode_keeps_whole_layers_resident() -> None:
    banks = make_banks()
    ex = hybrid(banks, "static", slots=2 * E + 3)
    assert ex.resident_layers == (1, 2) and int(ex.cache.pinned.sum()) == 2 * E
    gen = torch.Generator().manual_seed(4)
    for layer in LAYERS:
        x = torch.randn(1, H, generator=gen)
        ids, weights = routing(1, gen)
        ex(layer, x, ids, weights)
    s = ex.stats()
    assert (s.hits, s.misses, s.pcie_experts, s.cpu_experts) == (2 * K, K, 0, K)
    ex.resize(E + 1)
    assert ex.resident_layers == (1,)
    with pytest.raises(ValueError, match="experts for"):
        hybrid(banks, "static", slots=20, static_resident_layers=[1, 2])


def test_static_layers_asked_for_that_a_shrink_no_longer_holds_give_way_to_those_that_fit(caplog) -> None:
    """Layers named at load that an elastic shrink leaves no room for: the first that fit stay
    resident (a warning names them), the calls go on with the CPU executor's outputs; grown
    back, every named layer is resident again."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, "static", slots=2 * E + 4, static_resident_layers=[1, 2])
    assert ex.resident_layers == (1, 2)
    with caplog.at_level(logging.WARNING, logger="runtime.gpu.executor"):
        ex.resize(E + 4)
    assert ex.resident_layers == (1,) and int(ex.cache.pinned.sum()) == E
    assert "no longer hold layers [1, 2]; layers [1] stay resident" in caplog.text
    gen = torch.Generator().manual_seed(8)
    for layer in LAYERS:
        x, (ids, weights) = torch.randn(1, H, generator=gen), routing(1, gen)
        assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    ex.resize(2 * E + 4)
    assert ex.resident_layers == (1, 2) and int(ex.cache.pinned.sum()) == 2 * E


# -- prefill -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("buffers", [1, 2])
def test_prefill_streams_banks_and_matches(buffers: int) -> None:
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, "offload", slots=20, prefill_buffers=buffers)
    gen = torch.Generator().manual_seed(5)
    for layer in LAYERS:  # decode first: some experts cached, so prefill skips them
        ids, weights = routing(1, gen)
        ex(layer, torch.randn(1, H, generator=gen), ids, weights)
    cached_before = ex.cache.num_cached
    for _ in range(2):
        for layer in LAYERS:
            x = torch.randn(16, H, generator=gen)
            ids, weights = routing(16, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
            last = {ex.cache.key(layer, int(e)) for e in ids[-1]}
            # the cache afterwards: the last prompt token's experts at least, the most recent entries
            slots = ex.cache.lookup(sorted(last))
            assert min(slots) >= 0 and all(int(ex.cache.last_used[s]) == ex.cache.clock for s in slots)
    s = ex.stats()
    stride = banks[1].layout.expert_stride
    assert s.prefill_calls == 6 and s.prefill_experts_skipped >= cached_before
    assert s.prefill_bytes == (6 * E - s.prefill_experts_skipped) * stride


@pytest.mark.parametrize("buffers", [1, 2])
def test_a_prefill_streams_through_slots_the_cache_lends_and_decode_gets_them_back(buffers: int) -> None:
    """Where the cache keeps one token's experts (3 layers x top-4 = 12) beside them, the prefill
    buffers are its last slots: emptied and kept from every victim while the prompt streams
    (no buffer of their own), with the CPU executor's outputs; at the first decode step they
    come back, empty, and decode fills them. A clear under a loan ends it; the next prompt
    borrows again."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    slots = buffers * E + 12 + 6
    ex = hybrid(banks, "offload", slots=slots, prefill_buffers=buffers)
    lent = range(slots - buffers * E, slots)
    gen = torch.Generator().manual_seed(11)

    def decode(steps: int) -> None:
        for _ in range(steps):
            for layer in LAYERS:
                x, (ids, weights) = torch.randn(1, H, generator=gen), routing(1, gen)
                assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))

    def prefill() -> None:
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(16, H, generator=gen), routing(16, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
            assert ex.cache.lent_slots == len(lent) and all(ex.cache.owner[s] == -1 for s in lent)
            assert ex.cache.pinned[list(lent)].all() and not ex.cache.pinned[: lent[0]].any()

    decode(10)
    assert any(ex.cache.owner[s] >= 0 for s in lent)  # decode had filled the slots to be lent
    prefill()
    streamer = ex.prefill.streamer
    assert streamer.lent and len(streamer.buffers) == buffers
    assert all(b.untyped_storage().data_ptr() == ex.cache.slots.untyped_storage().data_ptr() for b in streamer.buffers)
    decode(1)
    assert ex.cache.lent_slots == 0 and not ex.cache.pinned.any() and not streamer.buffers and not streamer.lent
    decode(10)
    assert any(ex.cache.owner[s] >= 0 for s in lent)  # decode has them back
    for layer in LAYERS[:1]:  # a clear in the middle of a prompt ends its loan
        ex(layer, torch.randn(16, H, generator=gen), *routing(16, gen))
    loan = ex.cache.lent_slots
    ex.clear()
    assert loan == len(lent) and ex.cache.lent_slots == 0 and not streamer.lent
    assert ex.cache.lend(slots + 1) is None
    prefill()  # borrowed anew
    assert streamer.lent and ex.cache.lend(1) is None  # one loan at a time
    decode(1)
    assert ex.stats().prefill_calls == 7


def test_a_cache_that_cannot_lend_its_last_slots_leaves_the_prefill_its_own_buffers() -> None:
    """Static residency pins whole layers' slots: where the last slots are pinned, or the cache
    would keep fewer than one token's experts, the buffers are allocated beside it, as asked."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    gen = torch.Generator().manual_seed(12)
    for mode, slots in (("static", 3 * E), ("offload", E + 11)):
        ex = hybrid(banks, mode, slots=slots, prefill_buffers=1)
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(16, H, generator=gen), routing(16, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
        streamer = ex.prefill.streamer
        assert ex.cache.lent_slots == 0 and not streamer.lent and len(streamer.buffers) == 1, mode
        assert streamer.buffers[0].untyped_storage().data_ptr() != ex.cache.slots.untyped_storage().data_ptr()


def test_prefill_leaves_the_prompts_recent_experts_cached_within_each_layers_share() -> None:
    """"lru" placement: after a prefill each layer holds its prompt's experts, the last tokens'
    first, up to its share of the cache (slots // layers, the last token's K at least): a short
    prompt's all of them, a long one's most recent, and no layer evicts another's."""
    banks = make_banks()  # 3 layers of E experts
    ex = hybrid(banks, "offload", slots=3 * 6)  # a share of 6 slots per layer
    gen = torch.Generator().manual_seed(8)
    for layer in LAYERS:
        ids = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(12)])  # 12 tokens: most experts
        ex(layer, torch.randn(12, H, generator=gen), ids, torch.rand(12, K, generator=gen))
        recent = list(dict.fromkeys(ids.flip(0).reshape(-1).tolist()))[:6]
        held = {divmod(int(k), E)[1] for k in ex.cache.owner if k >= 0 and divmod(int(k), E)[0] == layer}
        assert held == set(recent), f"layer {layer}"
    for layer in LAYERS:  # every layer kept its share: the later layers evicted nothing of the earlier ones
        assert sum(1 for k in ex.cache.owner if k >= 0 and divmod(int(k), E)[0] == layer) == 6
    repeated = hybrid(banks, "offload", slots=3 * 6)  # the last 10 tokens route alike: the share reaches back
    ids = torch.cat([torch.tensor([[4, 5, 6, 7], [8, 9, 10, 11]] * 5), torch.tensor([[0, 1, 2, 3]] * 10)])
    repeated(2, torch.randn(20, H, generator=gen), ids, torch.rand(20, K, generator=gen))
    assert {divmod(int(k), E)[1] for k in repeated.cache.owner if k >= 0} == {0, 1, 2, 3, 8, 9}
    short = hybrid(banks, "offload", slots=40)
    ids = torch.tensor([[0, 1, 2, 3], [2, 3, 4, 5]] * 4)  # 8 tokens, 6 distinct experts: all fit the share
    short(1, torch.randn(8, H, generator=gen), ids, torch.rand(8, K, generator=gen))
    assert {divmod(int(k), E)[1] for k in short.cache.owner if k >= 0} == set(range(6))


@pytest.mark.parametrize("mode", ["offload", "prefill_placement"])
def test_the_first_decode_step_after_a_prefill_waits_for_its_cache_fills(mode: str, monkeypatch) -> None:
    """A prefill fills cache slots on the copy stream, and its last layers' fills are covered
    by no later bank's event: the first decode step makes the compute stream wait for the copy
    stream (no host wait), once; decode steps after it, and a prefill that filled nothing, do not."""
    banks = make_banks()
    ex = hybrid(banks, mode, slots=3 * 6)
    waits = []
    monkeypatch.setattr(ex.cache.streams, "wait_for_copies", lambda: waits.append(True))
    gen = torch.Generator().manual_seed(8)

    def step(tokens: int) -> None:
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(tokens, H, generator=gen), routing(tokens, gen)
            ex(layer, x, ids, weights)

    step(12)  # a prefill (prefill_min_tokens=8)
    assert ex.stats().prefill_calls == len(LAYERS) and not waits
    step(1)
    assert len(waits) == 1
    step(1)
    step(2)
    assert len(waits) == 1
    static = hybrid(banks, "static", slots=3 * 6)  # placement "none": a prefill fills nothing
    monkeypatch.setattr(static.cache.streams, "wait_for_copies", lambda: waits.append(True))
    for tokens in (12, 1):
        for layer in LAYERS:
            static(layer, torch.randn(tokens, H, generator=gen), *routing(tokens, gen))
    assert len(waits) == 1


@pytest.mark.parametrize("mode", ["offload", "auto"])
@pytest.mark.parametrize("slots", [3 * E, 2 * E, 12])
def test_a_prefill_with_no_buffer_streams_through_the_cache(mode: str, slots: int) -> None:
    """No prefill buffer (the plan left no room for one): a long prompt's experts are filled into
    the cache and computed from their slots, grouped by expert, in rounds where the cache holds
    fewer than a layer's experts; the outputs are the CPU executor's, and what fits of the
    prompt's experts stays cached for decode."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=slots, prefill_buffers=0)
    assert isinstance(ex.prefill, CachePrefill)
    gen = torch.Generator().manual_seed(9)
    for tokens in (24, 1, 2, 16, 1):
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(tokens, H, generator=gen), routing(tokens, gen)
            assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
            if tokens >= 8:  # a prefill call: its layer's experts are the most recent entries
                routed = torch.unique(ids).tolist()
                held = {divmod(int(k), E)[1] for k in ex.cache.owner if k >= 0 and divmod(int(k), E)[0] == layer}
                assert held <= set(routed) and len(held) == min(len(routed), slots)
    s = ex.stats()
    assert s.prefill_calls == 2 * len(LAYERS) and s.prefill_bytes > 0 and s.prefill_bytes % banks[1].layout.expert_stride == 0
    repeated = hybrid(banks, mode, slots=slots, prefill_buffers=0, pcie_repeat=2)  # a slower link: bytes counted once
    x, (ids, weights) = torch.randn(20, H, generator=gen), routing(20, gen)
    assert_close(repeated(1, x, ids, weights), reference(1, x, ids, weights))
    assert repeated.stats().prefill_bytes == len(torch.unique(ids)) * banks[1].layout.expert_stride


@pytest.mark.parametrize("mode", ["offload", "auto"])
@pytest.mark.parametrize("buffers", [0, 2])
def test_a_prefill_plans_on_the_host_whatever_the_default_device(mode: str, buffers: int) -> None:
    """Inside DeviceModel torch's default device is the GPU. A prefill's host plans (the rounds'
    row maps, their pair plans) name the host, or each round waits for the device several times
    (the Q4_K_M race file at -ncmoe 16, 9 slots: ~15 rounds a layer, pp512 at 0.2-0.5x
    llama.cpp). Here the default device is "meta": a tensor made on it by mistake fails."""
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=12, prefill_buffers=buffers)
    gen = torch.Generator().manual_seed(12)
    for tokens in (24, 1, 16):
        for layer in LAYERS:
            x, (ids, weights) = torch.randn(tokens, H, generator=gen), routing(tokens, gen)
            with torch.device("meta"):
                out = ex(layer, x, ids, weights)
            assert_close(out, reference(layer, x, ids, weights))
    assert ex.stats().prefill_calls == 2 * len(LAYERS)


@pytest.mark.parametrize("dtype", ["f32", "q4_k"])
def test_the_cpu_executor_computes_on_the_host_whatever_the_default_device(dtype: str) -> None:
    """The CPU kernel writes its output at a raw host address: made on torch's default device (the
    GPU inside DeviceModel), the kernel wrote to a device address (a segfault under "meta")."""
    banks = {1: random_bank(dtype, E, 256, 256, layer=1, seed=1)}
    gen = torch.Generator().manual_seed(13)
    x, (ids, weights) = torch.randn(5, 256, generator=gen), routing(5, gen)
    want = CPUExpertExecutor(banks, torch.float32)(1, x, ids, weights)
    with torch.device("meta"):
        got = CPUExpertExecutor(banks, torch.float32)(1, x, ids, weights)
    assert got.device.type == "cpu"
    assert_close(got, want)


@pytest.mark.parametrize("mode", ["static", "prefill_placement", "cpu"])
def test_the_modes_that_do_not_fill_the_cache_run_a_prefill_with_no_buffer_as_decode_calls(mode: str) -> None:
    banks = make_banks()
    reference = CPUExpertExecutor(banks, torch.float32)
    ex = hybrid(banks, mode, slots=2 * E + 4, prefill_buffers=0)
    assert ex.prefill is None
    gen = torch.Generator().manual_seed(10)
    for layer in LAYERS:
        x, (ids, weights) = torch.randn(24, H, generator=gen), routing(24, gen)
        assert_close(ex(layer, x, ids, weights), reference(layer, x, ids, weights))
    assert ex.stats().prefill_calls == 0


def test_prefill_placement_places_the_hottest_experts() -> None:
    banks = make_banks(layers=(1, 2))
    ex = hybrid(banks, "prefill_placement", slots=9)  # quotas: 5 slots for layer 1, 4 for layer 2
    gen = torch.Generator().manual_seed(6)
    for layer in (1, 2):
        ids = torch.stack([torch.randperm(6, generator=gen)[:K] for _ in range(20)])  # experts 0-5
        ids[:, 0] = 5 if layer == 1 else 3  # one expert in every token
        ex(layer, torch.randn(20, H, generator=gen), ids, torch.rand(20, K, generator=gen))
        counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()
        quota = 5 if layer == 1 else 4
        hottest = sorted(range(E), key=lambda e: (-counts[e], e))[:quota]
        held = sorted(divmod(int(k), E)[1] for k in ex.cache.owner if k >= 0 and divmod(int(k), E)[0] == layer)
        assert held == sorted(hottest)
    x = torch.randn(1, H)
    ex(1, x, torch.tensor([[5, 0, 1, 15]]), torch.rand(1, K))
    s = ex.stats()
    assert s.pcie_experts == 0 and s.cpu_experts >= 1  # decode never fills: expert 15 runs on the CPU


def test_prefill_placement_fills_a_quota_the_prompt_leaves_short() -> None:
    """A prompt that routes to fewer experts than a layer's share: the rest of the share is the
    layer's other experts, lowest id first (the whole bank was streamed anyway), no slot empty."""
    banks = make_banks(layers=(1, 2))
    ex = hybrid(banks, "prefill_placement", slots=20)  # quotas: 10 slots a layer
    gen = torch.Generator().manual_seed(6)
    for layer in (1, 2):
        ids = torch.stack([torch.randperm(6, generator=gen)[:K] + 8 for _ in range(20)])  # experts 8-13
        ex(layer, torch.randn(20, H, generator=gen), ids, torch.rand(20, K, generator=gen))
        held = sorted(divmod(int(k), E)[1] for k in ex.cache.owner if k >= 0 and divmod(int(k), E)[0] == layer)
        assert held == [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]
    assert ex.cache.num_cached == 20


def test_streamer_refreshes_a_skipped_expert_evicted_after_prefetch() -> None:
    banks = make_banks()
    cache = ExpertCache(4, banks[1].layout.expert_stride, "cpu", num_layers=4, num_experts=E)
    cache.fill([cache.key(2, 7)], [0], [banks[2].record(7)])
    streamer = BankStreamer(banks, cache, num_buffers=2)
    streamer.prefetch_after(streamer.take(1))  # prefetches layer 2, reading expert 7 from slot 0
    assert streamer.pending_skips() == [cache.key(2, 7)]
    cache.evict([cache.key(2, 7)])
    cache.fill([cache.key(3, 0)], [0], [banks[3].record(0)])
    loaded = streamer.take(2)
    assert loaded.skipped == {} and torch.equal(loaded.rows[7], banks[2].data[7])
    assert torch.equal(loaded.rows, banks[2].data)


# -- a whole model on the "gpu" backend (device="cpu"): families unchanged ------------------------------

PROMPT = [3, 17, 92, 45, 8, 200, 31, 7, 64, 128, 5, 11]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory) -> tuple[object, str]:
    pytest.importorskip("transformers")
    from ftpull.pull import pull
    from registry import Store
    from tests.checkpoints import save_checkpoint

    root = tmp_path_factory.mktemp("gpu_backend")
    src = save_checkpoint("qwen3_moe", root / "hf", seed=1)  # 2 MoE layers x 4 experts, top-2
    store = Store(root / "store")
    return store, str(pull(str(src), store).name)


def greedy(loaded, steps: int, between=None) -> tuple[list[int], list[torch.Tensor]]:
    state = loaded.model.new_state(len(PROMPT) + steps + 1)
    logits = loaded.model.forward(torch.tensor(PROMPT), state)[-1]
    tokens, all_logits = [], [logits]
    for i in range(steps):
        if between is not None:
            between(i)
        tokens.append(int(torch.argmax(logits)))
        logits = loaded.model.forward(torch.tensor([tokens[-1]]), state)[-1]
        all_logits.append(logits)
    return tokens, all_logits


def test_gpu_backend_matches_cpu_backend_and_survives_resizes(tiny_store) -> None:
    from runtime.loading.runnable import load

    store, name = tiny_store
    reference = load(store, name, torch.float32)
    ref_tokens, ref_logits = greedy(reference, 16)
    options = dict(backend="gpu", device="cpu", mode="offload", prefill_min_tokens=8)
    steady = load(store, name, torch.float32, cache_slots=6, **options)
    tokens, logits = greedy(steady, 16)
    assert tokens == ref_tokens
    for ours, ref in zip(logits, ref_logits, strict=True):
        assert_close(ours, ref)
    assert steady.experts is not None and steady.experts.stats().prefill_calls == 2

    elastic = load(store, name, torch.float32, cache_slots=6, **options)
    sizes = {3: 4, 7: 8, 11: 5}  # shrink to one token's experts, grow to all 8, shrink again

    def resize(step: int) -> None:
        if step in sizes:
            elastic.experts.resize(sizes[step])
            assert elastic.experts.cache.num_slots == sizes[step]

    assert greedy(elastic, 16, resize)[0] == tokens
    assert elastic.experts.stats().hits > 0


def test_a_load_holds_the_slots_and_prefill_buffers_its_plan_says(tiny_store) -> None:
    """The fit plan's prefill buffers are slots the cache lends: where VRAM is tight they give
    way to one token's experts in the cache (one buffer, then none), and the load follows the
    plan, answering as the CPU backend does, long prompts through lent buffers or none."""
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.planner.plan import GPU_RESERVE_BYTES, ModelFootprint, PlanOverrides, plan
    from runtime.planner.resources import GPU, Machine

    store, name = tiny_store
    with open_model(store, name).open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name=name)
    machine = Machine(ram_total_bytes=64 << 30, ram_available_bytes=64 << 30, num_physical_cores=4,
                      gpu=GPU("emulated", 80 << 30, 80 << 30))
    plans = {}
    for budget in range(GPU_RESERVE_BYTES, 1 << 30, footprint.expert_stride_bytes):
        p = plan(footprint, machine, PlanOverrides(vram_budget_bytes=budget, num_ctx=64, device="gpu", force=True))
        if p.fits and p.cache_slots >= footprint.min_cache_slots:  # (below, the CPU computes every expert)
            plans.setdefault(p.prefill_buffers, p)
    assert set(plans) == {0, 1, 2}
    assert plans[0].cache_slots >= footprint.min_cache_slots and plans[1].cache_slots >= footprint.min_cache_slots
    ref_tokens, _ = greedy(load(store, name, torch.float32), 12)
    for buffers, fit in plans.items():
        loaded = load(store, name, torch.float32, backend="gpu", device="cpu", mode="offload", fit=fit,
                      prefill_min_tokens=8)
        assert loaded.experts.cache.num_slots == fit.cache_slots
        prefill = loaded.experts.prefill
        assert (prefill.streamer.num_buffers if isinstance(prefill, StreamingPrefill) else 0) == buffers
        assert isinstance(prefill, StreamingPrefill if buffers else CachePrefill)
        assert greedy(loaded, 12)[0] == ref_tokens
        loaded.experts.close()


def test_a_plan_below_one_tokens_experts_loads_and_answers_as_the_cpu_backend(tiny_store) -> None:
    """Where the VRAM left after dense weights, workspace and KV holds fewer slots than one token's
    experts (down to none), the plan is still a GPU run: from one layer's top-k slots mode auto
    streams misses through them beside the CPU (its elastic floor that top-k), below it loads as
    "cpu" (no profile measured, no elastic floor); either answers as the CPU backend does."""
    from runtime.loading.registered import open_model
    from runtime.loading.runnable import load
    from runtime.planner.plan import PREFILL_CHUNK_TOKENS, ModelFootprint, PlanOverrides, plan
    from runtime.planner.resources import GPU, Machine

    store, name = tiny_store
    with open_model(store, name).open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name=name)
    machine = Machine(ram_total_bytes=64 << 30, ram_available_bytes=64 << 30, num_physical_cores=4,
                      gpu=GPU("emulated", 80 << 30, 80 << 30))
    big = plan(footprint, machine, PlanOverrides(vram_budget_bytes=1 << 30, num_ctx=64, device="gpu"))
    ref_tokens, ref_logits = greedy(load(store, name, torch.float32), 12)
    for slots in (0, footprint.min_cache_slots - 1):
        budget = big.dense_bytes + big.workspace_bytes + big.kv_bytes + slots * footprint.expert_stride_bytes
        fit = plan(footprint, machine, PlanOverrides(vram_budget_bytes=budget, num_ctx=64, device="gpu"))
        if slots == 0:  # (this tiny model's smaller prompt chunk frees a layer's top-k: tests/test_plan.py; a
            # model whose experts are large against its activations plans none, as given here)
            assert fit.prefill_chunk_tokens < PREFILL_CHUNK_TOKENS and fit.cache_slots >= footprint.num_experts_per_tok
            fit = replace(fit, cache_slots=0, prefill_buffers=0, prefill_buffer_bytes=0,
                          prefill_chunk_tokens=PREFILL_CHUNK_TOKENS)
        else:
            assert any(f"holds {slots} slots, fewer than one token's experts" in n for n in fit.notes)
        assert fit.fits and fit.device == "gpu" and fit.cache_slots == slots and fit.prefill_buffers == 0
        loaded = load(store, name, torch.float32, backend="gpu", device="cpu", mode="auto", fit=fit,
                      prefill_min_tokens=8)
        assert loaded.experts.cache.num_slots == slots
        if slots >= footprint.num_experts_per_tok:
            assert loaded.experts.mode == "auto" and loaded.experts.elastic.min_slots == footprint.num_experts_per_tok
        else:
            assert loaded.experts.mode == "cpu"
            assert loaded.experts.profile is None and loaded.experts.elastic.min_slots == 0
        tokens, logits = greedy(loaded, 12)
        assert tokens == ref_tokens
        for ours, ref in zip(logits, ref_logits, strict=True):
            assert_close(ours, ref)
        loaded.experts.close()


def test_gpu_backend_refuses_a_cache_below_one_token(tiny_store) -> None:
    from runtime.loading.runnable import load

    store, name = tiny_store
    with pytest.raises(CacheTooSmallError, match="2 MoE layers x top-2 = 4 slots"):
        load(store, name, torch.float32, backend="gpu", device="cpu", cache_slots=3, mode="offload")
    with pytest.raises(ValueError, match="backend is one of"):
        load(store, name, torch.float32, backend="tpu")


@pytest.mark.parametrize("env,graphs", [(None, True), ("0", False), ("false", False), ("1", True)])
def test_ft_cuda_graphs_0_loads_a_model_whose_decode_runs_uncaptured(tiny_store, monkeypatch, env, graphs) -> None:
    """FT_CUDA_GRAPHS=0 (as vLLM's --enforce-eager) reaches the executor ft run and ft serve build."""
    from runtime.gpu import build as build_mod
    from runtime.loading.runnable import load

    seen = {}
    real = build_mod.build_hybrid
    monkeypatch.setattr(build_mod, "build_hybrid", lambda *a, **k: (seen.update(k), real(*a, **k))[1])
    if env is None:
        monkeypatch.delenv("FT_CUDA_GRAPHS", raising=False)
    else:
        monkeypatch.setenv("FT_CUDA_GRAPHS", env)
    store, name = tiny_store
    loaded = load(store, name, torch.float32, backend="gpu", device="cpu", cache_slots=6, mode="offload")
    assert seen["cuda_graphs"] is graphs
    loaded.experts.close()


# -- the bandwidth profile -----------------------------------------------------------------------------

def test_a_profile_measures_in_no_more_slots_than_the_cache_will_have(monkeypatch) -> None:
    """A first load measures its profile before its cache exists: one executor's slots at a time,
    at most the cache's (at llama.cpp's smallest footprint three executors of 32 slots had taken
    the process 100 MiB past its VRAM budget on the H200)."""
    import runtime.gpu.measure_bandwidth as mb

    alive, sizes = [], []

    class Counted(mb.ExpertCache):
        def __init__(self, num_slots, *args, **kwargs) -> None:
            super().__init__(num_slots, *args, **kwargs)
            sizes.append(num_slots)
            alive.append(self)

        def release(self) -> None:
            alive.remove(self)
            super().release()

    monkeypatch.setattr(mb, "ExpertCache", Counted)
    bank = random_bank("f32", 16, 256, 128, layer=0)
    executor = CPUExpertExecutor({0: bank}, torch.float32, threads=1)
    profile = mb.measure(bank, executor, "cpu", num_experts=8, seconds=0.02, cpu_threads=1, max_slots=3)
    assert profile.pcie_gbps > 0 and max(sizes) == 3 and not alive


def test_profile_measures_saves_and_reloads(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FT_HOME", str(tmp_path))
    bank = random_bank("f32", 8, 256, 128, layer=0)
    executor = CPUExpertExecutor({0: bank}, torch.float32, threads=1)
    profile = measure(bank, executor, "cpu", num_experts=4, seconds=0.05, cpu_threads=1)
    assert profile.pcie_gbps > 0 and profile.cpu_gbps > 0 and profile.expert_bytes == bank.layout.expert_stride
    assert profile.cpu_fixed_ms >= 0 and profile.pcie_fixed_ms >= 0 and profile.dtype == "f32"
    assert profile.pcie_alone_gbps > 0 and profile.cpu_alone_gbps > 0
    assert profile.pcie_gbps <= profile.pcie_alone_gbps and profile.cpu_gbps <= profile.cpu_alone_gbps  # beside <= alone
    first = load_or_measure(bank, executor, "cpu", cpu_threads=1, num_experts=4, seconds=0.05)
    saved = list((tmp_path / "profiles").glob("*.json"))
    assert len(saved) == 1 and "1t-f32" in saved[0].name
    monkeypatch.setattr("runtime.gpu.measure_bandwidth.measure", lambda *a, **k: pytest.fail("measured again"))
    assert load_or_measure(bank, executor, "cpu", cpu_threads=1) == first
    # a profile kept by an older runtime measured something else: it is measured again
    stale = json.loads(saved[0].read_text())
    saved[0].write_text(json.dumps({**stale, "version": 1}))
    monkeypatch.setattr("runtime.gpu.measure_bandwidth.measure", lambda *a, **k: replace(first, measured_at="again"))
    assert load_or_measure(bank, executor, "cpu", cpu_threads=1).measured_at == "again"
    # a model of another expert size on the same machine: its own profile
    bigger = random_bank("f32", 8, 512, 128, layer=0)
    monkeypatch.setattr("runtime.gpu.measure_bandwidth.measure", lambda *a, **k: replace(first, measured_at="bigger"))
    assert load_or_measure(bigger, executor, "cpu", cpu_threads=1).measured_at == "bigger"
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 2
    assert load_or_measure(bank, executor, "cpu", cpu_threads=1).measured_at == "again"  # the first still kept


# -- on the GPU host -----------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
QWEN3 = (2048, 768)  # Qwen3-30B-A3B experts: 9.4 MB records in bf16


def big_banks(num_layers: int, num_experts: int = 64):
    return {layer: random_bank("bf16", num_experts, *QWEN3, layer=layer, seed=layer, num_distinct=4)
            for layer in range(num_layers)}


@pytest.mark.gpu
@needs_cuda
def test_cuda_banks_are_pinned_and_fills_are_fast_and_asynchronous() -> None:
    from ftw.reader import page_aligned_empty
    from runtime.gpu.host_memory import HostPinner

    pinner, other = HostPinner(), HostPinner()
    buffer = page_aligned_empty(64 * 9_437_184)
    assert pinner.pin(buffer) and other.pin(buffer) and buffer.is_pinned()
    other.close()  # another executor over the same banks goes away: they stay pinned
    assert buffer.is_pinned()
    cache = ExpertCache(64, 9_437_184, "cuda", num_layers=1, num_experts=64)
    rows = buffer.view(64, -1)
    cache.fill(list(range(64)), list(range(64)), [rows[e] for e in range(64)])  # warm-up
    cache.clear()
    start = time.perf_counter()
    events = cache.fill(list(range(64)), list(range(64)), [rows[e] for e in range(64)])
    issued = time.perf_counter() - start
    assert not events[-1].query()  # the host did not wait for the copies
    cache.streams.synchronize()
    seconds = time.perf_counter() - start
    assert issued < seconds / 2
    assert 64 * 9_437_184 / seconds > 30e9, f"pinned fills at {64 * 9_437_184 / seconds / 1e9:.1f} GB/s"
    pinner.close()
    assert not buffer.is_pinned()


@pytest.mark.gpu
@needs_cuda
def test_a_refused_pin_leaves_no_cuda_error_for_the_next_kernel() -> None:
    """cudaHostRegister refused (here: a bank whose tail overlaps memory registered outside the
    pinner; one starting inside it would count as pinned already) leaves the bank pageable with a
    warning, and the CUDA runtime's last error is read away: torch's next kernel-launch check
    does not raise it as its own."""
    from ftw.reader import page_aligned_empty
    from runtime.gpu.host_memory import HostPinner

    mib = 1 << 20
    buffer = page_aligned_empty(2 * mib)
    outside = buffer[mib:]
    assert int(torch.cuda.cudart().cudaHostRegister(outside.data_ptr(), mib, 0)) == 0
    try:
        bank = buffer[: mib + mib // 2]
        assert not bank.is_pinned()
        pinner = HostPinner()
        assert not pinner.pin(bank) and pinner.pageable_bytes == bank.numel()
        x = torch.ones(1024, device="cuda")
        assert float((x * 2).sum()) == 2048.0  # a launch and its check
    finally:
        torch.cuda.cudart().cudaHostUnregister(outside.data_ptr())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("buffers", [2, 0])
@pytest.mark.parametrize("mode", MODES)
def test_cuda_modes_match_cpu_executor(mode: str, buffers: int) -> None:
    """Every mode on the device, a prefill streamed through two bank buffers or, with none,
    through the cache itself (the LRU modes)."""
    banks = big_banks(3, num_experts=16)
    ex = build_hybrid(banks, device="cuda", cache_slots=24, mode=mode, top_k=8, compute_dtype=torch.float32,
                      profile=BandwidthProfile(55.0, 35.0, 0.2, 0.05), prefill_min_tokens=64,
                      prefill_buffers=buffers)
    reference = CPUExpertExecutor(banks, torch.float32)
    gen = torch.Generator().manual_seed(0)
    for num_tokens in (1, 1, 4, 128, 1):
        for layer in banks:
            x = torch.randn(num_tokens, QWEN3[0], generator=gen)
            ids, weights = routing(num_tokens, gen, num_experts=16, top_k=8)
            out = ex(layer, x.cuda(), ids.cuda(), weights.cuda())
            assert out.device.type == "cuda"
            assert_close(out.cpu(), reference(layer, x, ids, weights), rel=1e-4)  # TF32-free fp32 matmuls
    ex.close()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.xfail(reason="not held in every run: on the H200 host one call took 3.50 ms against 3.77 ms for "
                          "the two alone with the Python worker (the CPU kernel and the PCIe fills share host "
                          "DRAM); it passed with the native worker (sixth session). Non-strict until it holds "
                          "run after run (docs/benchmark-history.md, GPU decode)", strict=False)
def test_cuda_cpu_share_overlaps_the_device_share() -> None:
    """8 misses over PCIe and 8 on the CPU in one call take clearly less than the two calls that
    do each alone: the CPU kernel runs beside the copies."""
    banks = big_banks(1)
    ex = build_hybrid(banks, device="cuda", cache_slots=64, mode="auto", top_k=16, split=lambda m, b: m,
                      prefill_buffers=0)
    x = torch.randn(1, QWEN3[0], device="cuda", dtype=torch.bfloat16)

    def run(first: int, count: int, pcie: int) -> float:
        ex.cache.clear()
        ex.split = lambda m, b: pcie
        ids = torch.arange(first, first + count, device="cuda").view(1, count)
        w = torch.rand(1, count, device="cuda", dtype=torch.bfloat16)
        start = time.perf_counter()
        ex(0, x, ids, w).cpu()
        return (time.perf_counter() - start) * 1e3

    def best(count: int, pcie: int) -> float:
        return min(run(16 * (i % 4), count, pcie) for i in range(8))

    best(16, 8)  # warm-up (the CPU kernel builds on first use)
    alone = best(8, 8) + best(8, 0)
    both = best(16, 8)
    ex.close()  # (not left to the garbage collector, which may reach it during another test's capture)
    assert both < 0.85 * alone, f"PCIe + CPU in one call {both:.2f} ms, each alone {alone:.2f} ms in total"


@pytest.mark.gpu
@needs_cuda
def test_cuda_double_buffered_prefill_beats_single() -> None:
    banks = big_banks(6)
    times = {}
    for buffers in (1, 2):
        ex = build_hybrid(banks, device="cuda", cache_slots=48, mode="offload", top_k=8, prefill_buffers=buffers)
        x = torch.randn(2048, QWEN3[0], device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, 64, (2048, 8), device="cuda")
        w = torch.rand(2048, 8, device="cuda", dtype=torch.bfloat16)
        best = float("inf")
        for _ in range(3):
            ex.cache.clear()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for layer in banks:
                ex(layer, x, ids, w)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        times[buffers] = best
        ex.close()
    assert times[2] < times[1], times


@pytest.mark.gpu
@needs_cuda
def test_cuda_backend_greedy_matches_cpu_backend(tiny_store) -> None:
    from runtime.loading.runnable import load

    store, name = tiny_store
    ref_tokens, _ = greedy(load(store, name, torch.float32), 16)
    loaded = load(store, name, torch.float32, backend="gpu", device="cuda", cache_slots=5, mode="auto",
                  profile=PROFILE, prefill_min_tokens=8)
    assert greedy(loaded, 16)[0] == ref_tokens
    assert loaded.experts is not None and loaded.experts.pinner.pinned_bytes > 0
    loaded.experts.close()



def test_elastic_vram_follows_free_memory_and_new_budgets_with_the_same_output(tiny_store) -> None:
    """The governor load_gpu attaches resizes the cache at step boundaries (another program takes
    VRAM and gives it back; the user sets a new budget); no weight is reloaded and greedy output
    stays the reference's."""
    from runtime.loading.runnable import load

    store, name = tiny_store
    reference = greedy(load(store, name, torch.float32), 16)[0]
    loaded = load(store, name, torch.float32, cache_slots=6, backend="gpu", device="cpu", mode="offload",
                  prefill_min_tokens=8)
    executor = loaded.experts
    governor = executor.elastic
    slot = executor.cache.slot_bytes
    assert governor is not None and governor.budget_slots == 6 and governor.min_slots == 4  # 2 layers x top-2
    total, others = 16 * slot, {"bytes": 4 * slot}  # a device of 16 slots; other programs hold 4

    def probe() -> tuple[int, int]:
        held = executor.cache.num_slots * slot  # (the tiny model's other VRAM is ~0 here)
        return total - others["bytes"] - held, held

    governor.probe, governor.check_every_s = probe, 0.0
    banks_before = {layer: bank.data.data_ptr() for layer, bank in loaded.weights.banks.items()}
    sizes = []

    def between(step: int) -> None:
        if step == 4:
            others["bytes"] = 11 * slot  # another program took memory: 5 slots left to us
        if step == 8:
            others["bytes"] = 4 * slot  # it gave it back
        if step == 11:
            governor.set_budget(governor.other_bytes + 8 * slot)
        sizes.append(executor.cache.num_slots)

    assert greedy(loaded, 16, between)[0] == reference
    assert sizes[:5] == [6] * 5 and sizes[5:9] == [5] * 4 and sizes[9:12] == [6] * 3 and sizes[12:] == [8] * 4
    assert {layer: bank.data.data_ptr() for layer, bank in loaded.weights.banks.items()} == banks_before
    assert any("6 -> 5" in e for e in governor.events)


def test_set_vram_in_ft_run_resizes_before_the_next_token(tiny_store) -> None:
    from ftpull.run import Chat, handle_command
    from runtime.loading.runnable import load

    store, name = tiny_store  # (a checkpoint without a tokenizer: the steps run on token ids)
    loaded = load(store, name, torch.float32, cache_slots=6, backend="gpu", device="cpu", mode="offload",
                  prefill_min_tokens=8)
    chat = Chat(None, None, {}, experts=loaded.experts)  # type: ignore[arg-type]
    said: list[str] = []
    slot = loaded.experts.cache.slot_bytes
    other = loaded.experts.elastic.other_bytes
    handle_command(chat, f"/set vram {(other + 8 * slot) / 2**30!r}", said.append)
    assert "the expert cache becomes 8 slots" in said[-1]
    assert loaded.experts.cache.num_slots == 6  # not before the next step
    greedy(loaded, 2)
    assert loaded.experts.cache.num_slots == 8
    handle_command(chat, f"/set vram {(other + 2 * slot) / 2**30!r}", said.append)
    assert said[-1].startswith("Error: a VRAM budget of") and "fewer than one token's experts (4 slots" in said[-1]
    handle_command(chat, "/set vram lots", said.append)
    assert said[-1] == "Error: /set vram takes a size in GiB, e.g. '/set vram 6', not 'lots'"
    for bad, words in (("inf", "a number of GiB, not inf"), ("nan", "a number of GiB, not nan"),
                       ("1e300", "at most 1048576 GiB")):
        assert handle_command(chat, f"/set vram {bad}", said.append)  # the chat goes on
        assert said[-1].startswith("Error: a VRAM budget") and words in said[-1], said[-1]
    cpu_chat = Chat(None, None, {})  # type: ignore[arg-type]
    handle_command(cpu_chat, "/set vram 6", said.append)
    assert said[-1] == "Error: /set vram needs a model running on the GPU (the CPU runtime uses no VRAM)"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("mode,cpu_half", [("offload", False), ("auto", False), ("auto", True), ("cpu", False),
                                           ("static", False)])
def test_cuda_graph_replays_match_uncaptured_calls_across_a_resize(mode: str, cpu_half: bool) -> None:
    """The same routing through two executors, one replaying CUDA graphs: the same outputs and
    identical cache statistics, call by call, also after a resize drops the captured graphs.
    Calls with a CPU share ("auto" sending half its misses there, "cpu", "static") are captured
    too where the driver's stream flags can be."""
    banks = big_banks(3, num_experts=16)
    split = (lambda m, b: m // 2) if cpu_half else (lambda m, b: m)
    options = dict(device="cuda", cache_slots=32, mode=mode, top_k=8, compute_dtype=torch.bfloat16,
                   profile=BandwidthProfile(55.0, 35.0, 0.2, 0.05), split=split, prefill_buffers=0,
                   auto_guard=False)  # (the guard's arms follow step times, which differ between the two)
    plain, graphed = build_hybrid(banks, cuda_graphs=False, **options), build_hybrid(banks, cuda_graphs=True, **options)
    gen = torch.Generator().manual_seed(3)
    for step in range(12):
        if step == 6:
            plain.resize(28)
            graphed.resize(28)
        for layer in banks:
            x = torch.randn(1, QWEN3[0], generator=gen).to("cuda", torch.bfloat16)
            ids, weights = routing(1, gen, num_experts=16, top_k=8)
            ids, weights = ids.cuda(), weights.cuda().to(torch.bfloat16)
            # (the slot kernel adds with atomics: equal up to the order of fp32 sums, then bf16 rounding)
            ours, ref = graphed(layer, x, ids, weights).float().cpu(), plain(layer, x, ids, weights).float().cpu()
            err = float((ours - ref).abs().max() / ref.abs().max())
            assert err <= 1e-2, f"step {step} layer {layer}: max error {err:.2e} of the largest output"
    uses_cpu = cpu_half or mode in ("cpu", "static")
    assert graphed.graphs is not None
    if not uses_cpu or graphed.cpu_share.capturable:
        assert graphed.graphs.replays > 0 and graphed.graphs.captures >= 2 * len(banks)
    a, b = plain.stats(), graphed.stats()
    assert (a.hits, a.misses, a.pcie_experts, a.cpu_experts) == (b.hits, b.misses, b.pcie_experts, b.cpu_experts)
    assert (b.cpu_experts > 0) == uses_cpu
    plain.close()
    graphed.close()
    # closed, it holds no graph: none is destroyed later by the garbage collector, perhaps during
    # another executor's capture (which that would invalidate)
    assert not graphed.graphs._graphs


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_captures_survive_closed_executors_left_to_the_collector(monkeypatch) -> None:
    """ft bench's and ft serve's pattern: executors with captured CPU shares built, run, closed,
    and left to the garbage collector (they hold reference cycles) while later executors capture,
    the collector made eager. No collection runs inside a capture (on the H200 one that freed a
    closed executor there aborted the process; before `close` freed the pinned staging, the next
    pinned allocation failed with "CUDA error: invalid argument"), and the captures go on."""
    import gc

    from runtime.gpu import executor as executor_mod

    banks = big_banks(2, num_experts=16)
    options = dict(device="cuda", cache_slots=24, mode="auto", top_k=8, compute_dtype=torch.bfloat16,
                   profile=BandwidthProfile(55.0, 35.0, 0.2, 0.05), split=lambda m, b: m // 2, prefill_buffers=0,
                   auto_guard=False)
    reference = CPUExpertExecutor(banks, torch.float32)
    real = executor_mod.HybridExpertExecutor._plan_fill_compute
    captured_calls = []

    def checked(self, *args, capturing: bool = False, **kwargs):
        if capturing:
            captured_calls.append(gc.isenabled())
        return real(self, *args, capturing=capturing, **kwargs)

    monkeypatch.setattr(executor_mod.HybridExpertExecutor, "_plan_fill_compute", checked)
    gen = torch.Generator().manual_seed(5)
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # every generation collected every few allocations
    try:
        for _ in range(3):
            ex = build_hybrid(banks, **options)
            for _ in range(4):
                for layer in banks:
                    x = torch.randn(1, QWEN3[0], generator=gen)
                    ids, weights = routing(1, gen, num_experts=16, top_k=8)
                    out = ex(layer, x.to("cuda", torch.bfloat16), ids.cuda(), weights.cuda().to(torch.bfloat16))
                    ref = reference(layer, x.bfloat16().float(), ids, weights.bfloat16().float())
                    err = float((out.float().cpu() - ref).abs().max() / ref.abs().max())
                    assert err <= 2e-2, f"max error {err:.2e} of the largest output"
            assert ex.cpu_share.capturable is False or ex.graphs.captures > 0
            ex.close()
            del ex  # garbage with reference cycles, for the collector
    finally:
        gc.set_threshold(*thresholds)
    assert captured_calls and not any(captured_calls), "the collector was on during a capture"
    assert gc.isenabled()
    torch.zeros(1, pin_memory=True)  # a pinned allocation after it all
    torch.cuda.synchronize()


@pytest.mark.parametrize("cpu_share", [False, True])
def test_the_guard_reads_whether_the_model_split_used_the_cpu(monkeypatch, cpu_share: bool) -> None:
    """"auto"'s guard asks the executor how many misses the CPU served: a split that sends none
    leaves the model arm after one block (the PCIe-only arm decides the same and can replay graphs).
    The guard starts with a block of PCIe-only, then tries the model. Step times here are the
    host's noise, so no time may end the exploring early (test_auto_guard.py covers that)."""
    monkeypatch.setattr(AutoGuard, "DECISIVE", float("inf"))
    banks = make_banks(layers=(0, 1))
    split = (lambda misses, nbytes: misses // 2) if cpu_share else (lambda misses, nbytes: misses)
    ex = hybrid(banks, "auto", slots=2 * K, split=split)
    assert ex.guard is not None
    gen = torch.Generator().manual_seed(9)
    for _ in range(2 * AutoGuard.EXPLORE + AutoGuard.WARMING + 2):
        for layer in (0, 1):
            ids, weights = routing(1, gen)
            ex(layer, torch.randn(1, H, generator=gen), ids, weights)
    assert ex.guard.model_idle is (not cpu_share)
    assert (ex.stats().cpu_experts > 0) is cpu_share
    assert ex.guard.steps["model"] >= 1
    assert ex.guard.arm == PCIE_ONLY  # after the model block: PCIe-only's second block, or its choice


def test_an_emulated_slower_link_copies_every_fill_again_and_changes_nothing_else(monkeypatch) -> None:
    """pcie_repeat=2 (benchmarks: a link half as fast): each PCIe fill and prefill stream is made
    twice; outputs and cache statistics are those of one copy."""
    from runtime.gpu import executor as executor_mod
    from runtime.gpu.bandwidth_profile import machine_key

    fills = []
    real_fill = executor_mod.expert_fill_ref
    monkeypatch.setattr(executor_mod, "expert_fill_ref", lambda *a: (fills.append(1), real_fill(*a))[1])
    banks = make_banks()
    one, two = hybrid(banks, "offload", slots=4 * K), hybrid(banks, "offload", slots=4 * K, pcie_repeat=2)
    gen = torch.Generator().manual_seed(4)
    for num_tokens in (1, 1, 2, 12, 1, 3):  # 12 tokens: a streamed prefill
        for layer in LAYERS:
            x = torch.randn(num_tokens, H, generator=gen)
            ids, weights = routing(num_tokens, gen)
            before = len(fills)
            a = one(layer, x, ids, weights)
            once = len(fills) - before
            b = two(layer, x, ids, weights)
            assert len(fills) - before == 3 * once  # one call's fills, then twice as many
            assert_close(b, a)
    s1, s2 = one.stats(), two.stats()
    assert (s1.hits, s1.misses, s1.pcie_bytes, s1.prefill_bytes) == (s2.hits, s2.misses, s2.pcie_bytes, s2.prefill_bytes)
    assert s1.prefill_bytes > 0 and two.prefill is not None and two.prefill.streamer.pcie_repeat == 2
    with pytest.raises(ValueError, match="pcie_repeat is a whole number of copies, at least 1"):
        hybrid(banks, "offload", slots=4 * K, pcie_repeat=0)
    assert machine_key("cpu", cpu_threads=2, dtype="bf16", expert_bytes=9 << 20, pcie_repeat=2).endswith("-pcie1of2")
    assert "pcie1of" not in machine_key("cpu", cpu_threads=2, dtype="bf16", expert_bytes=9 << 20)


def test_a_profile_measured_with_the_cpu_held_elsewhere_is_used_not_kept(tmp_path, monkeypatch, caplog) -> None:
    """A GPU measurement in which both sides kept under CONTENDED_FACTOR of their alone rates (0.11
    on an H100 race host, 0.92-1.0 on the others) is used for this load but not kept, with a
    warning: kept, it would set auto's split (every miss over PCIe) for every later load."""
    from runtime.gpu import measure_bandwidth
    from runtime.gpu.bandwidth_profile import PROFILE_VERSION, BandwidthProfile

    monkeypatch.setenv("FT_HOME", str(tmp_path))
    monkeypatch.setattr(measure_bandwidth, "machine_key", lambda *a, **k: "h100-8t-q4_k")
    bank = random_bank("f32", 8, 256, 128, layer=0)
    executor = CPUExpertExecutor({0: bank}, torch.float32, threads=1)
    contended = BandwidthProfile(pcie_gbps=5.4, cpu_gbps=2.6, cpu_fixed_ms=0.01, pcie_fixed_ms=0.04,
                                 pcie_alone_gbps=48.5, cpu_alone_gbps=22.9, version=PROFILE_VERSION)
    monkeypatch.setattr(measure_bandwidth, "measure", lambda *a, **k: contended)
    with caplog.at_level(logging.WARNING, logger="runtime.gpu.measure_bandwidth"):
        assert load_or_measure(bank, executor, "cuda", cpu_threads=8) == contended
    assert "kept 0.11 of its rate alone" in caplog.text and "Not kept" in caplog.text
    assert not list((tmp_path / "profiles").glob("*.json"))
    shared = replace(contended, pcie_gbps=45.0, cpu_gbps=21.2)  # (0.93: DRAM shared, nothing else)
    monkeypatch.setattr(measure_bandwidth, "measure", lambda *a, **k: shared)
    assert load_or_measure(bank, executor, "cuda", cpu_threads=8) == shared
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1
