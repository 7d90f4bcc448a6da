"""Whole decode steps as one CUDA graph (runtime/gpu/step_graphs.py).

On the CPU (CI): a decode step at a DevicePosition (the position a device tensor, the KV cache
read over a span and masked past it) gives the logits of the plain decode for every family whose
attention takes one; a state is emptied in place where its caches are positional; the executor's
step hooks make a step's host part once. Marked `gpu`: the captured steps against per-layer
graphs and against the CPU backend, token for token, through resizes and a new conversation.
"""

from __future__ import annotations

import pytest
import torch

from runtime.gpu.device_model import DeviceModel, decode_span
from runtime.layers.attention import DevicePosition
from tests.checkpoints import FAMILIES
from tests.test_gpu_executor import LAYERS, PROFILE, assert_close, hybrid, make_banks, routing

CAPTURABLE = set(FAMILIES)  # every family's mixers take a DevicePosition
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
PROMPT = [3, 17, 92, 45, 8, 200, 31, 7]


@pytest.fixture(scope="module")
def loaded_families(tmp_path_factory):
    pytest.importorskip("transformers")
    from tests.checkpoints import save_checkpoint
    from tests.parity import convert_and_load

    root = tmp_path_factory.mktemp("step_graphs")
    return {family: convert_and_load(save_checkpoint(family, root / family / "hf", seed=2), root / family / "store")
            for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_decode_step_at_a_device_position_matches_plain_decode(loaded_families, monkeypatch, family: str) -> None:
    """Every family's step at a DevicePosition gives plain decode's logits, across a span change,
    updating every cache in place. (GLM's indexer selects every token here: its top-k picks among
    tied scores by position in the row, and a span's row is longer; the next test checks the
    selection itself.)"""
    model = loaded_families[family].model
    for block in model.blocks:
        if getattr(block.mixer, "indexer", None) is not None:
            monkeypatch.setattr(block.mixer.indexer, "topk", 1 << 20)
    assert model.takes_device_position == (family in CAPTURABLE)
    if family not in CAPTURABLE:
        return
    steps, max_tokens = 6, 300  # spans of 256, then all 300 positions
    plain, at = model.new_state(max_tokens), model.new_state(max_tokens)
    logits = model.forward(torch.tensor(PROMPT), plain)[-1]
    model.forward(torch.tensor(PROMPT), at)
    token, index = int(torch.argmax(logits)), torch.zeros(1, dtype=torch.long)
    buffers = _cache_buffers(at)
    for step in range(steps):
        if step == 3:  # jump past the first span: the next steps read all max_tokens positions
            model.set_length(plain, 260)
            model.set_length(at, 260)
        position = at.length
        index.fill_(position)
        ours = model.decode_at(torch.tensor([token]), DevicePosition(index, decode_span(position, max_tokens)), at)
        model.set_length(at, position + 1)
        ref = model.forward(torch.tensor([token]), plain)
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
        token = int(torch.argmax(ref[-1]))
    # a captured step replays writes to the addresses it saw: every cache is updated in place,
    # by steps at a DevicePosition and by plain forwards (a next turn's prompt) alike
    model.forward(torch.tensor([token, 5]), at)
    assert _cache_buffers(at) == buffers
    assert decode_span(0, max_tokens) == 256 and decode_span(256, max_tokens) == 300 and decode_span(300, 4096) == 512


def test_dsa_selection_over_a_span_is_a_top_k_of_the_visible_tokens(loaded_families) -> None:
    """GLM's indexer at a DevicePosition scores a span of keys with those after the position
    masked: it selects index_topk tokens, none past the position, with the same scores as the
    selection over exactly the visible keys (ties may trade places, as between any two lengths)."""
    model = loaded_families["glm_moe_dsa"].model
    indexer = next(b.mixer.indexer for b in model.blocks if getattr(b.mixer, "indexer", None) is not None)
    gen = torch.Generator().manual_seed(7)
    span, hidden = 64, model.config.hidden_size
    x = torch.randn(1, hidden, generator=gen)
    q_low = torch.randn(1, indexer.wq_b.shape[1], generator=gen)
    keys = torch.randn(span, indexer.head_dim, generator=gen)
    for position in (3, indexer.topk, 20, span - 1):
        cos, sin = model.blocks[0].mixer.mla.rope(torch.tensor([position]), torch.float32)
        visible = torch.arange(span)[None, :] <= position
        chosen = indexer.select(x, q_low, cos, sin, keys, visible)
        exact = indexer.select(x, q_low, cos, sin, keys[: position + 1], visible[:, : position + 1])
        assert not chosen[0, position + 1:].any()
        assert int(chosen.sum()) == int(exact.sum()) == min(indexer.topk, position + 1)
        scores = indexer.scores(x, q_low, cos, sin, keys)[0]
        torch.testing.assert_close(scores[chosen[0]].sort().values, scores[: position + 1][exact[0]].sort().values)


def _cache_buffers(state) -> list[tuple[str, int]]:
    """(name, address) of every tensor the state's caches hold (none for a layer without a mixer)."""
    return [(f"{i}.{name}", value.data_ptr()) for i, cache in enumerate(state.caches) if cache is not None
            for name, value in sorted(vars(cache).items()) if isinstance(value, torch.Tensor)]


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe", "glm_moe_dsa"])
def test_reset_state_empties_caches_in_place(loaded_families, family: str) -> None:
    """A new conversation keeps the state's buffers (their addresses are in the captured graphs):
    KV caches as they are, recurrent states zeroed. A one-token prompt at a DevicePosition after
    the reset starts from zeros."""
    model = loaded_families[family].model
    state = model.new_state(64)
    first = model.forward(torch.tensor(PROMPT), state)
    single = model.forward(torch.tensor(PROMPT[:1]), model.new_state(64))
    again = model.reset_state(state)
    assert again is state and again.length == 0
    torch.testing.assert_close(model.forward(torch.tensor(PROMPT), again), first)
    again = model.reset_state(again)
    index = torch.zeros(1, dtype=torch.long)
    torch.testing.assert_close(model.decode_at(torch.tensor(PROMPT[:1]), DevicePosition(index, 64), again), single)


def test_device_model_decodes_at_device_positions_where_steps_are_on(loaded_families) -> None:
    """DeviceModel's step path (here on the CPU, where no step is captured: each runs as it is)
    gives the plain model's greedy tokens, also after its state is reset for a new prompt."""
    loaded = loaded_families["qwen3_moe"]
    ex = hybrid(make_banks(), "offload", slots=20)
    ex.graphs = object()  # as on CUDA: the step path is taken (begin_step still answers None here)
    device_model = DeviceModel(loaded.model, "cpu", ex.steps)
    assert device_model.steps is ex.steps

    def greedy(model, state, steps=5) -> list[int]:
        logits, out = model.forward(torch.tensor(PROMPT), state, last_only=True)[-1], []
        for _ in range(steps):
            out.append(int(torch.argmax(logits)))
            logits = model.forward(torch.tensor([out[-1]]), state)[-1]
        return out

    ref = greedy(loaded.model, loaded.model.new_state(64))
    state = device_model.new_state(64)
    assert greedy(device_model, state) == ref
    assert greedy(device_model, device_model.reset_state(state)) == ref
    assert ex.steps.first_calls == 0  # begin_step refused every step: nothing warmed, nothing captured
    ex.graphs = None
    assert DeviceModel(loaded.model, "cpu", ex.steps).steps is None  # no CUDA graphs: plain forward


def test_move_dense_keeps_an_untied_embedding_table_on_the_host(loaded_families) -> None:
    """The GPU path's dense weights go to the device but for the token embeddings (a lookup reads
    a row a token); tied to the output head, which decode multiplies by every token, they go too."""
    from dataclasses import replace

    from runtime.gpu.device_model import move_dense
    from runtime.loading.read_ftw import ModelWeights

    weights, meta, name = loaded_families["qwen3_moe"].weights, torch.device("meta"), "model.embed_tokens.weight"
    moved = move_dense(weights, meta)
    assert moved.dense[name] is weights.dense[name]
    assert all(t.is_meta for n, t in moved.dense.items() if n != name) and "lm_head.weight" in moved.dense
    tied = ModelWeights(replace(weights.config, tie_word_embeddings=True), weights.dense, weights.banks)
    assert all(t.is_meta for t in move_dense(tied, meta).dense.values())
    assert all(t.is_meta for t in move_dense(weights, meta, host_embedding=False).dense.values())


@pytest.mark.parametrize("family", ["qwen3_moe", "qwen3_5_moe"])
def test_a_host_embedding_table_gives_the_device_tables_logits(loaded_families, family: str) -> None:
    """DeviceModel with the token embeddings in host memory (HostEmbedding, as on the GPU; here on
    the CPU device): a prompt's rows gathered in one copy, each decode step's row through the
    buffer the step reads, written by the host before a queued step starts: the logits of the
    model's own lookup (a prompt's exactly; steps at a DevicePosition within rounding)."""
    model = loaded_families[family].model
    ex = hybrid(make_banks(), "offload", slots=20)
    ex.graphs = object()  # as on CUDA: the step path is taken (begin_step answers None on the CPU)
    on_host = DeviceModel(model, "cpu", ex.steps, host_embedding=True)
    assert DeviceModel(model, "cpu", ex.steps).embedding is None  # on a CPU device the table is the device's
    assert on_host.embedding is not None and on_host.embedding.table is model.embed
    ref_state, state = model.new_state(64), on_host.new_state(64)
    ref = model.forward(torch.tensor(PROMPT), ref_state)
    assert torch.equal(on_host.forward(torch.tensor(PROMPT), state), ref)
    token = int(torch.argmax(ref[-1]))
    for step in range(6):
        want = model.forward(torch.tensor([token]), ref_state)[-1]
        if step % 2 and on_host.can_queue:  # queued before its token is known, then started
            queued = on_host.queue_decode(state)
            queued.start(token)
            got = queued.logits()
        else:
            got = on_host.forward(torch.tensor([token]), state)[-1]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert torch.equal(on_host.embedding.row[0], model.embed[token])  # the row the step read
        token = int(torch.argmax(want))
    assert on_host.can_queue == (family == "qwen3_moe") and state.length == ref_state.length


def test_a_step_run_through_step_graphs_makes_its_host_part_once() -> None:
    """begin_step makes the first call's host part (the guard's step timing, the elastic poll),
    and the step's first layer call does not make it again; off CUDA it answers None, and the
    step runs as it is, with the same outputs as plain calls."""
    banks = make_banks()
    ex, plain = hybrid(banks, "auto", slots=20), hybrid(banks, "auto", slots=20)
    polls = []
    ex.elastic = type("Governor", (), {"poll": lambda self, slots: polls.append(slots)})()
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        inputs = [(torch.randn(1, 80, generator=gen), *routing(1, gen)) for _ in LAYERS]
        outs = []

        def calls(inputs=inputs, outs=outs) -> None:
            outs.extend(ex(layer, x, ids, w) for layer, (x, ids, w) in zip(LAYERS, inputs, strict=True))

        ex.steps.run("test", calls)
        refs = [plain(layer, x, ids, w) for layer, (x, ids, w) in zip(LAYERS, inputs, strict=True)]
        for ours, ref in zip(outs, refs, strict=True):
            assert_close(ours, ref)
    assert ex.guard is not None and sum(ex.guard.steps.values()) == 4
    assert len(polls) == 4
    assert ex.steps.first_calls == ex.steps.replays == 0  # begin_step answered None: no CUDA graphs here
    assert ex.stats().calls == plain.stats().calls == 4 * len(LAYERS)


def test_a_captured_steps_calls_keep_the_cache_and_counters_in_step() -> None:
    """The executor's side of a capture, run eagerly on the CPU (no graph records it here): the
    calls inside `capturing_step` give the plain calls' outputs, leave the host clock for
    `end_step` to move, and a call with a CPU share but no capturable stream flags is refused."""
    from runtime.gpu.kernels.expert_fill_ref import expert_fill_ref
    from runtime.gpu.step_graphs import StepNotCapturable

    banks = make_banks()
    ex, plain = hybrid(banks, "offload", slots=20), hybrid(banks, "offload", slots=20)
    gen = torch.Generator().manual_seed(6)

    def inputs() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        return [(torch.randn(1, 80, generator=gen), *routing(1, gen)) for _ in LAYERS]

    first = inputs()  # an uncaptured step makes the counters the captured calls add to
    for layer, (x, ids, w) in zip(LAYERS, first, strict=True):
        assert_close(ex(layer, x, ids, w), plain(layer, x, ids, w))
    # as on CUDA (graphs on, banks read zero-copy: here the fill kernel's torch twin), so that
    # begin_step answers a key
    ex.graphs, ex._zero_copy, ex._expert_fill = object(), dict.fromkeys(LAYERS, True), expert_fill_ref
    for _ in range(3):
        step = inputs()
        assert ex.begin_step() == ("pcie", False, 1)
        clock = ex.cache.clock
        with ex.capturing_step() as capture:
            outs = [ex(layer, x, ids, w) for layer, (x, ids, w) in zip(LAYERS, step, strict=True)]
        assert capture.count == len(LAYERS) and not capture.host_work and ex.cache.clock == clock
        ex.end_step(capture.count)
        for out, (layer, (x, ids, w)) in zip(outs, zip(LAYERS, step, strict=True), strict=True):
            assert_close(out, plain(layer, x, ids, w))
    assert ex.cache.clock == plain.cache.clock
    a, b = ex.stats(), plain.stats()
    assert (a.hits, a.misses, a.pcie_experts, a.calls) == (b.hits, b.misses, b.pcie_experts, b.calls)

    cpu = hybrid(banks, "cpu", slots=20)
    x, ids, w = inputs()[0]
    cpu(LAYERS[0], x, ids, w)
    cpu.graphs, cpu._zero_copy = object(), dict.fromkeys(LAYERS, True)
    assert cpu.begin_step() is None  # off CUDA no stream flags: a CPU share cannot be captured
    cpu._step_state, cpu._step_cpu = cpu.cache.device_state(), True
    with pytest.raises(StepNotCapturable, match="no stream flags"), cpu.capturing_step():
        cpu(LAYERS[0], x, ids, w)


# -- on the GPU ---------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
def test_the_hit_rates_read_back_allocates_nothing_with_several_strides() -> None:
    """A block-quant model's counters come in several strides (its experts and its dense block
    weights). Their read-back runs after a queued replay, while the stream waits on the next
    step's doorbell: an allocation there can free cached blocks, and cudaFree waits for the
    device, which waits for this thread (the Q4_K_M race's stall at -ncmoe 8)."""
    from runtime.gpu.executor_stats import RecentHitRate
    from runtime.gpu.kernels import HIT, NUM_COUNTS, NUM_UNIQUE

    rate = RecentHitRate(torch.device("cuda"))
    totals = [torch.zeros(NUM_COUNTS, dtype=torch.int64, device="cuda") for _ in range(3)]
    for _ in range(3):  # three windows: the second and third fold in what the one before read back
        for t in totals:
            t[HIT] += 1
            t[NUM_UNIQUE] += 4
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_stats()["allocation.all.allocated"]
        rate.observe(None, totals, calls=RecentHitRate.WINDOW)
        assert torch.cuda.memory_stats()["allocation.all.allocated"] == allocated
        torch.cuda.synchronize()
    assert rate.value == pytest.approx(0.25)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("mode", "cpu_half"), [("offload", False), ("auto", False), ("auto", True), ("cpu", False)])
def test_captured_steps_match_per_layer_graphs(mode: str, cpu_half: bool) -> None:
    """The same routing through two executors, one replaying whole steps: equal outputs and
    equal cache statistics, step by step, also after a resize rebuilds the cache, and past the
    hit rate's first read-back (made during a replay that waits for the CPU worker). Steps whose
    calls carry a CPU share ("auto" sending half its misses there, "cpu") are captured too where
    the driver's stream flags can be: each replay first hands the worker the step's jobs."""
    from runtime.gpu import BandwidthProfile, build_hybrid
    from tests.test_gpu_executor import QWEN3, big_banks

    banks = big_banks(3, num_experts=16)
    split = (lambda m, b: m // 2) if cpu_half else (lambda m, b: m)
    options = dict(device="cuda", cache_slots=32, mode=mode, top_k=8, compute_dtype=torch.bfloat16,
                   profile=BandwidthProfile(55.0, 35.0, 0.2, 0.05), split=split, prefill_buffers=0,
                   auto_guard=False)  # (the guard's arms follow step times, which differ between the two)
    layered, whole = build_hybrid(banks, step_graphs=False, **options), build_hybrid(banks, **options)
    gen = torch.Generator().manual_seed(4)
    xs = torch.randn(len(banks), 1, QWEN3[0], generator=gen).to("cuda", torch.bfloat16)
    ids = torch.zeros(len(banks), 8, dtype=torch.int64, device="cuda")
    weights = torch.zeros(len(banks), 8, dtype=torch.bfloat16, device="cuda")
    outs = {}

    def step(ex) -> list[torch.Tensor]:
        return [ex(layer, xs[i], ids[i: i + 1], weights[i: i + 1]) for i, layer in enumerate(banks)]

    for t in range(24):  # 72 layer calls: past RecentHitRate.WINDOW, whose read-back must not wait for the device
        if t == 12:
            layered.resize(28)
            whole.resize(28)
        for i in range(len(banks)):
            r_ids, r_w = routing(1, gen, num_experts=16, top_k=8)
            ids[i], weights[i] = r_ids[0].cuda(), r_w[0].cuda().to(torch.bfloat16)
        outs["whole"] = [o.float().cpu() for o in whole.steps.run("test", lambda: step(whole))]
        outs["layered"] = [o.float().cpu() for o in layered.steps.run("test", lambda: step(layered))]
        for ours, ref in zip(outs["whole"], outs["layered"], strict=True):
            err = float((ours - ref).abs().max() / ref.abs().max())
            assert err <= 1e-2, f"step {t}: max error {err:.2e} of the largest output"
    uses_cpu = cpu_half or mode == "cpu"
    if not uses_cpu or whole.cpu_share.capturable:
        assert whole.steps.replays >= 6 and whole.steps.captures >= 2  # before and after the resize
    assert layered.steps.replays == 0
    a, b = layered.stats(), whole.stats()
    assert (a.hits, a.misses, a.pcie_experts, a.cpu_experts, a.calls) == \
        (b.hits, b.misses, b.pcie_experts, b.cpu_experts, b.calls)
    assert (b.cpu_experts > 0) == uses_cpu
    assert whole.cache.clock == layered.cache.clock
    whole.close()
    layered.close()
    assert not whole.steps._graphs


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("family", "mode"), [("qwen3_moe", "offload"), ("qwen3_moe", "auto"),
                                              ("qwen3_5_moe", "offload"), ("glm_moe_dsa", "offload"),
                                              ("gpt_oss", "offload"), ("gpt_oss", "auto")])
def test_cuda_model_decodes_in_captured_steps_with_the_cpu_backends_tokens(tmp_path, monkeypatch, family: str,
                                                                           mode: str) -> None:
    """Greedy decode on the GPU in captured steps gives the CPU backend's tokens; a second
    prompt after a reset reuses the state's buffers, so its steps replay the same graphs.
    "auto" with a cache of one token's experts: steps with CPU shares and split tables;
    Qwen3.5: linear-attention layers, whose recurrent state the graph updates in place; GLM-5:
    MLA with DSA's index keys (every token selected: tied scores may trade places otherwise);
    gpt-oss: experts with biases and a clamped activation in the slot kernel, sinks and windows."""
    pytest.importorskip("transformers")
    from ftpull.pull import pull
    from registry import Store
    from runtime.loading.runnable import load
    from tests.checkpoints import save_checkpoint

    store = Store(tmp_path / "store")
    name = str(pull(str(save_checkpoint(family, tmp_path / "hf", seed=1)), store).name)
    reference = load(store, name, torch.float32).model
    split = dict(split=lambda m, b: m // 2, auto_guard=False) if mode == "auto" else {}  # half the misses to the CPU
    slots = {"qwen3_5_moe": 8, "gpt_oss": 6}.get(family, 4)  # one token's experts: 4 (or 2, 3) MoE layers x top-2
    loaded = load(store, name, torch.float32, backend="gpu", device="cuda", cache_slots=slots, mode=mode,
                  profile=PROFILE, prefill_min_tokens=8, **split)
    for model in (reference, loaded.model.model):
        for block in model.blocks:
            if getattr(block.mixer, "indexer", None) is not None:
                monkeypatch.setattr(block.mixer.indexer, "topk", 1 << 20)
    ref_state, state = reference.new_state(300), loaded.model.new_state(300)
    for prompt in (PROMPT, PROMPT[:5] + [99]):
        assert _greedy(loaded.model, state, prompt, 24) == _greedy(reference, ref_state, prompt, 24)
        ref_state, state = reference.reset_state(ref_state), loaded.model.reset_state(state)
    steps = loaded.experts.steps
    assert steps.replays >= 40 and (steps.captures == 1 or mode == "auto"), (steps.replays, steps.captures)
    if mode == "auto" and loaded.experts.cpu_share.capturable:
        assert loaded.experts.stats().cpu_experts > 0
    loaded.experts.close()


def _greedy(model, state, prompt: list[int], steps: int) -> list[int]:
    logits = model.forward(torch.tensor(prompt), state, last_only=True)[-1]
    out = []
    for _ in range(steps):
        out.append(int(torch.argmax(logits)))
        logits = model.forward(torch.tensor([out[-1]]), state)[-1]
    return out


def test_dependent_launch_only_for_step_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels launch with PDL only inside a step graph's scope (nested scopes too), on CUDA, where
    the card and FT_PDL allow it; never off CUDA."""
    from runtime.gpu.kernels import dependent_launch

    monkeypatch.setattr(dependent_launch, "_enabled_on", lambda index: True)  # an sm_90 card, FT_PDL unset
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert not dependent_launch.enabled(cuda)
    with dependent_launch.for_step_graph():
        assert dependent_launch.enabled(cuda) and not dependent_launch.enabled(cpu)
        with dependent_launch.for_step_graph():
            assert dependent_launch.enabled(cuda)
        assert dependent_launch.enabled(cuda)
    assert not dependent_launch.enabled(cuda)
    with pytest.raises(RuntimeError), dependent_launch.for_step_graph():
        raise RuntimeError("a capture that failed")
    assert not dependent_launch.enabled(cuda)
    monkeypatch.setattr(dependent_launch, "_enabled_on", lambda index: False)  # an sm_89 card, or FT_PDL=0
    with dependent_launch.for_step_graph():
        assert not dependent_launch.enabled(cuda)


def test_a_queued_step_runs_when_started_and_never_when_cancelled() -> None:
    """StepGraphs.queue where the step cannot be held (off CUDA begin_step answers None): the
    step's host part is made at once, its feed and calls only when started, in that order, and
    once; a cancelled one never runs and leaves no step begun behind it."""
    ex = hybrid(make_banks(), "offload", slots=20)
    events = []

    def feed() -> None:
        events.append("feed")

    def step() -> str:
        events.append("step")
        return "out"

    queued = ex.steps.queue("test", step, feed, ex.steps.doorbell)
    assert events == [] and ex._step_begun  # the host part is made, nothing run
    assert queued.start() == "out" and events == ["feed", "step"]
    with pytest.raises(RuntimeError, match="already"):
        queued.start()
    queued.cancel()  # after a start: nothing
    assert events == ["feed", "step"]
    cancelled = ex.steps.queue("test", step, feed, ex.steps.doorbell)
    cancelled.cancel()
    assert events == ["feed", "step"] and not ex._step_begun
    with pytest.raises(RuntimeError, match="already"):
        cancelled.start()
    ex.close()


def test_a_doorbell_holds_each_step_until_its_ring() -> None:
    """Each hold waits for a new, larger value (at least: a later ring also releases it), and a
    ring writes the value into the flag the stream polls."""
    from runtime.gpu.host_signal import Doorbell, HostFlag

    class Stream:  # what a CUDA stream would be asked to do (no stream memory operations off CUDA)
        waits: list[int] = []

        def wait_at_least(self, flag, value: int) -> None:
            self.waits.append(value)

    bell = Doorbell(Stream(), HostFlag(pinned=False))
    first, second = bell.hold(), bell.hold()
    assert (first, second) == (1, 2) and Stream.waits == [1, 2] and bell.flag.read() == 0
    bell.ring(first)
    assert bell.flag.read() == 1 and bell.holding
    with pytest.raises(RuntimeError, match="held"):  # what would wait for the device says so, not hangs
        bell.check_released("a capture")
    bell.ring(second)
    assert bell.flag.read() == 2 and not bell.holding
    bell.check_released("a capture")


def test_a_capture_put_off_again_and_again_is_tried_ever_more_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    """A key whose capture keeps being put off (CaptureLater) runs uncaptured each step, its
    capture tried at the next step, then after 2, 4, 8 ... steps (a try costs a partial
    capture): on the H200 a race model whose tries came every step decoded at 30 tok/s, not 220.
    Each try counts as one-time work (the guard does not time that step), and a capture that
    succeeds resets the gap."""
    from runtime.gpu.step_graphs import CaptureLater, StepGraphs

    class Cache:
        generation = 0

    class Executor:  # begin_step: a key every step (what a CUDA executor answers)
        device, graphs, step_graphs, cpu_share, cache = torch.device("cpu"), None, True, None, Cache()

        def begin_step(self, queued: bool = False) -> str:
            return "arm"

    steps = StepGraphs(Executor())  # type: ignore[arg-type]
    tries: list[int] = []
    succeed = {"now": False}

    def capture(step):
        tries.append(n)
        if not succeed["now"]:
            raise CaptureLater("a split table changed")
        return type("Captured", (), {"out": step(), "graph": None, "capture": None})()

    monkeypatch.setattr(steps, "_capture", capture)
    monkeypatch.setattr(steps, "_replay", lambda captured, held=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # invalidate's wait for replays
    ran = []
    for n in range(40):
        assert steps.run("decode", lambda n=n: ran.append(n) or n) == n
    assert ran == list(range(40))  # every step ran, uncaptured
    assert steps.first_calls == 1 and tries == [1, 2, 4, 8, 16, 32]  # gaps 1, 2, 4, 8, 16
    assert steps.counters()["put_off"] == 6 and steps.one_time_work == 7
    succeed["now"] = True
    for n in range(40, 100):
        steps.run("decode", lambda n=n: n)
    assert tries[-1] == 64 and steps.captures == 1  # the next try after 32 comes at 64, and holds
    steps.invalidate()
    succeed["now"], tries[:] = False, []
    for n in range(100, 104):
        steps.run("decode", lambda n=n: n)
    assert tries == [101, 102]  # a fresh key's gaps start again at one step


@pytest.mark.parametrize("error", ["not capturable", "runtime"])
def test_a_refused_capture_is_tried_again_only_where_it_may_not_fail_again(monkeypatch: pytest.MonkeyPatch,
                                                                            error: str) -> None:
    """StepNotCapturable (a call that needs the host) refuses the key for good; any other error
    (an op that synced this time) is tried again later, as a capture put off is."""
    from runtime.gpu.step_graphs import StepGraphs, StepNotCapturable

    class Executor:
        device, graphs, step_graphs, cpu_share = torch.device("cpu"), None, True, None
        cache = type("Cache", (), {"generation": 0})()

        def begin_step(self, queued: bool = False) -> str:
            return "arm"

    steps = StepGraphs(Executor())  # type: ignore[arg-type]
    tries: list[int] = []

    def capture(step):
        tries.append(len(tries))
        raise StepNotCapturable("needs the host") if error == "not capturable" else RuntimeError("an op synced")

    monkeypatch.setattr(steps, "_capture", capture)
    for n in range(20):
        assert steps.run("decode", lambda n=n: n) == n
    assert len(tries) == (1 if error == "not capturable" else 5) and steps.refused == len(tries)


@needs_cuda
@pytest.mark.gpu
def test_a_capture_that_failed_in_a_fresh_pool_leaves_later_captures_working() -> None:
    """A capture that fails before any graph was captured (put off: CaptureLater, raised inside
    the capture) must not poison the next: torch's allocator asserts `use_count > 0` on a
    capture into a pool whose only user gave it back. On the H200 that refused every capture
    of the race at -ncmoe 8 after one put-off, and the decode ran layer by layer at 31 tok/s."""
    import contextlib

    from runtime.gpu.step_graphs import CaptureLater, StepCapture, StepGraphs

    class Executor:
        device, graphs, step_graphs, cpu_share = torch.device("cuda"), object(), True, None
        cache = type("Cache", (), {"generation": 0})()

        def begin_step(self, queued: bool = False) -> str:
            return "arm"

        @contextlib.contextmanager
        def capturing_step(self):
            yield StepCapture()

        def end_step(self, count: int) -> None:
            pass

    steps = StepGraphs(Executor())  # type: ignore[arg-type]
    x = torch.arange(8, dtype=torch.float32, device="cuda")
    fail = {"now": True}

    def step() -> torch.Tensor:
        y = x * 2 + 1  # allocated from the capture's pool
        if torch.cuda.is_current_stream_capturing() and fail["now"]:
            fail["now"] = False
            raise CaptureLater("a split table changed")
        return y

    outs = [steps.run("decode", step).clone() for _ in range(6)]
    assert steps.put_off == 1 and steps.refused == 0 and steps.captures == 1 and steps.replays >= 1
    for out in outs:
        assert torch.equal(out, x * 2 + 1)


def test_a_pool_left_without_a_graph_is_not_captured_into_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Which pool a capture after a failed one uses: the same where captured graphs hold it
    (their references keep it alive), a new one where none does."""
    import contextlib

    from runtime.gpu import step_graphs as sg

    handles = iter(range(100))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(handles)))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, pool, capture_error_mode: contextlib.nullcontext())

    class Executor:
        device, graphs, step_graphs, cpu_share = torch.device("cpu"), None, True, None

        @contextlib.contextmanager
        def capturing_step(self):
            yield sg.StepCapture()

    steps = sg.StepGraphs(Executor())  # type: ignore[arg-type]

    def failing() -> None:
        raise sg.CaptureLater("a split table changed")

    with pytest.raises(sg.CaptureLater):
        steps._capture(failing)
    assert steps._pool is None  # no graph held pool (0, 0): the next capture takes another
    steps._graphs["arm"] = steps._capture(lambda: 1)
    assert steps._pool == (0, 1)
    with pytest.raises(sg.CaptureLater):
        steps._capture(failing)
    assert steps._pool == (0, 1)  # a captured graph holds it: later captures share it still
