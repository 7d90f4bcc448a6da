"""`ft bench` at tiny scale on the CPU: every policy on identical routing, sane numbers."""

from __future__ import annotations

import json

import pytest

from ftpull.cli import _run

POLICIES = ("auto", "offload", "cpu", "static", "prefill_placement")


@pytest.fixture(scope="module")
def report() -> dict:
    capture = pytest.MonkeyPatch()
    import io
    import sys
    out = io.StringIO()
    capture.setattr(sys, "stdout", out)
    try:
        _run(["bench", "--shape", "tiny", "--device", "cpu", "--tokens", "8", "--threads", "1", "--prompt-tokens", "16",
              "--prefill", "64", "--policies", ",".join(POLICIES), "--json"])
    finally:
        capture.undo()
    return json.loads(out.getvalue())


def test_every_policy_has_sane_numbers(report: dict) -> None:
    stride = report["shape"]["expert_bytes"]
    layers, tokens = report["shape"]["moe_layers_built"], report["routing"]["tokens"]
    assert set(report["policies"]) == set(POLICIES) and tokens == 8
    for policy, r in report["policies"].items():
        s = r["stats"]
        assert "error" not in r, policy
        assert 0 <= r["miss_rate"] <= 1 and 0 <= r["hit_rate"] <= 1
        assert abs(r["miss_rate"] + r["hit_rate"] - 1) < 1e-9
        assert s["calls"] == layers * tokens and r["decode_tok_s"] > 0
        assert s["pcie_experts"] + s["cpu_experts"] == s["misses"]
        assert s["pcie_bytes"] == s["pcie_experts"] * stride and s["cpu_bytes"] == s["cpu_experts"] * stride
        assert r["pcie_mb_per_token"] == pytest.approx(s["pcie_bytes"] / tokens / 1e6)
        assert r["cpu_mb_per_token"] == pytest.approx(s["cpu_bytes"] / tokens / 1e6)
        assert r["roofline_tok_s"] is None or r["roofline_tok_s"] > 0
        if r["roofline_tok_s"]:  # reading nothing ahead can only be slower
            assert 0 < r["serial_roofline_tok_s"] <= r["roofline_tok_s"]
            # the hardware's ceilings bound the runtime's own rates: its roofline is the higher
            assert r["runtime_roofline_tok_s"] <= r["roofline_tok_s"] * (1 + 1e-9)
            assert r["fraction_of_roofline"] <= r["fraction_of_runtime_roofline"] * (1 + 1e-9)
    p = report["policies"]
    assert p["offload"]["stats"]["cpu_experts"] == 0 and p["cpu"]["stats"]["pcie_experts"] == 0
    assert p["cpu"]["hit_rate"] == 0 and p["static"]["stats"]["pcie_experts"] == 0
    (guard,) = p["auto"]["guard"]  # one run: what auto's guard did over its decode steps
    assert sum(guard["steps"].values()) == tokens and guard["best"] in ("model", "pcie")
    assert "guard" not in p["offload"]
    assert all(len(run) == tokens and min(run) > 0 for r in p.values() for run in r["steps_ms"])  # each step's time
    # where the guarded run's time went, step by step: each arm's total, and the slowest steps
    assert set(guard["total_ms"]) <= {"model", "pcie"} and all(ms > 0 for ms in guard["total_ms"].values())
    assert len(guard["slowest"]) == min(4, tokens) and all(x["arm"] in guard["total_ms"] for x in guard["slowest"])
    assert [x["ms"] for x in guard["slowest"]] == sorted((x["ms"] for x in guard["slowest"]), reverse=True)


def test_static_residency_and_the_inputs_are_reported(report: dict) -> None:
    static = report["policies"]["static"]
    slots, experts = report["cache"]["cache_slots"], report["shape"]["num_experts"]
    assert static["resident_layers"] == list(range(slots // experts))  # tiny: 16 slots, 16 experts -> layer 0
    assert static["stats"]["hits"] > 0 and static["stats"]["misses"] > 0
    assert report["profile"]["pcie_gbps"] > 0 and report["profile"]["cpu_gbps"] > 0
    assert 0 <= report["routing"]["reuse"] <= 1 and 0 <= report["routing"]["top_share"] <= 1
    assert {(x["tokens"], x["buffers"]) for x in report["prefill"]} == {(64, 0), (64, 1), (64, 2)}
    streamed = {x["buffers"]: x["streamed_bytes"] for x in report["prefill"]}
    assert streamed[0] > 0 and streamed[1] == streamed[2]  # a cold cache: every routed expert crosses once
    assert all(x["tok_s"] > 0 for x in report["prefill"])
    assert "ttft_s_estimate" in next(x for x in report["prefill"] if x["buffers"] == 2)
    assert report["scope"].startswith("experts-only")  # (the policy check: only on CUDA, see below)


def test_the_trace_needs_the_qwen3_30b_shape(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        _run(["bench", "--shape", "tiny", "--device", "cpu", "--routing", "trace", "--json"])
    assert e.value.code == 1 and "qwen3-30b-a3b" in capsys.readouterr().err


def test_planner_sizes_the_cache_of_a_real_shape() -> None:
    from runtime.bench.moe import SHAPES, BenchConfig, cache_plan

    c = cache_plan(SHAPES["qwen3-30b-a3b"], BenchConfig(budget_gib=8, num_ctx=4096), 8, 48)
    assert c["slot_bytes"] == 9 << 20 and c["kv_bytes"] == 4096 * 96 * 1024
    left = c["budget_bytes"] - c["dense_bytes"] - c["workspace_bytes"] - c["kv_bytes"]
    assert c["cache_slots"] == left // c["slot_bytes"] >= c["min_slots"] == 384
    assert cache_plan(SHAPES["qwen3-30b-a3b"], BenchConfig(budget_gib=8), 8, 12)["cache_slots"] == c["cache_slots"] // 4


def test_profile_tokens_report_where_host_time_goes(tmp_path) -> None:
    """--profile-tokens: per policy, the ops with the most host time per layer call, and a Chrome trace."""
    from runtime.bench.moe import BenchConfig, format_report, run_bench

    report = run_bench(BenchConfig(shape="tiny", device="cpu", tokens=4, prompt_tokens=4, prefill=(),
                                   policies=("offload",), profile_tokens=2, profile_dir=str(tmp_path)))
    rows = report["policies"]["offload"]["host_profile"]
    assert rows and all(r["host_us_per_call"] >= 0 and r["count_per_call"] > 0 for r in rows)
    assert rows == sorted(rows, key=lambda r: r["host_us_per_call"], reverse=True)
    assert (tmp_path / "decode-offload.json").stat().st_size > 0
    assert "offload: host profile per layer call" in format_report(report)


def test_saved_json_reports_print_as_text(report: dict, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from runtime.bench.report import main

    path = tmp_path / "run.json"
    path.write_text(json.dumps(report))
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "policy" in out and "offload" in out and "prefill tokens" in out
    assert "auto's guard, per run: model arm" in out and "slowest steps: #" in out


def test_shared_host_banks_save_ram_but_not_cache_traffic() -> None:
    """--host-banks N: N banks in host memory shared round-robin by the layers; the cache still sees
    every layer's own (layer, expert) keys, so its hits, misses and bytes are the same."""
    from runtime.bench.moe import SHAPES, BenchConfig, format_report, make_banks, run_bench

    shape = SHAPES["tiny"]
    banks = make_banks(shape, list(shape.moe_layers), seed=0, distinct=1)
    first = banks[shape.moe_layers[0]]
    assert all(b.data.data_ptr() == first.data.data_ptr() for b in banks.values())
    assert all(b.layer == layer == b.layout.layer for layer, b in banks.items())

    cfg = dict(shape="tiny", device="cpu", tokens=6, prompt_tokens=8, prefill=(), policies=("offload", "cpu"), threads=1)
    own, shared = run_bench(BenchConfig(**cfg)), run_bench(BenchConfig(**cfg, host_banks=1))
    for policy in ("offload", "cpu"):
        a, b = own["policies"][policy]["stats"], shared["policies"][policy]["stats"]
        assert (a["hits"], a["misses"], a["pcie_bytes"], a["cpu_bytes"]) == (b["hits"], b["misses"], b["pcie_bytes"],
                                                                            b["cpu_bytes"])
    assert shared["cache"]["host_bytes"] * len(shape.moe_layers) == own["cache"]["host_bytes"]
    assert "banks shared by the" in format_report(shared)
    with pytest.raises(ValueError, match="--host-banks must be at least 1"):
        run_bench(BenchConfig(**cfg, host_banks=0))


def test_an_emulated_slower_link_is_reported() -> None:
    from runtime.bench.moe import BenchConfig, format_report, run_bench

    cfg = dict(shape="tiny", device="cpu", tokens=4, prompt_tokens=4, prefill=(), policies=("offload",), threads=1)
    report = run_bench(BenchConfig(**cfg, pcie_repeat=2))
    assert report["config"]["pcie_repeat"] == 2
    assert "link: emulated at 1/2 of this host's PCIe" in format_report(report)
    assert "link:" not in format_report(run_bench(BenchConfig(**cfg)))
    with pytest.raises(ValueError, match="--pcie-repeat must be at least 1"):
        run_bench(BenchConfig(**cfg, pcie_repeat=0))


class _GraphCounter:
    def __init__(self) -> None:
        self.one_time_work = 0


class _ArmRunner:
    """An executor stand-in for warm_up: CUDA graphs whose first two steps under each arm do
    one-time work (first calls, then captures), and a guard that switches arms every 4 steps."""

    def __init__(self, arms: tuple[str, ...]) -> None:
        self.graphs, self.calls = _GraphCounter(), []
        self.guard = type("Guard", (), {"arm": arms[0]})() if len(arms) > 1 else None
        self.arms, self.seen = arms, {}
        self.step = 0
        self.steps = self  # StepGraphs' `run`: the step as it is

    def run(self, key, step) -> None:
        step()

    @property
    def one_time_work(self) -> int:
        return self.graphs.one_time_work

    def __call__(self, layer: int, x, ids, weights) -> None:
        if layer == 0:
            arm = self.arms[(self.step // 4) % len(self.arms)]
            if self.guard is not None:
                self.guard.arm = arm
            self.seen[arm] = self.seen.get(arm, 0) + 1
            if self.seen[arm] <= 2:
                self.graphs.one_time_work += 1
            self.step += 1
        self.calls.append(layer)


@pytest.mark.parametrize("arms", [("pcie", "model"), ("offload",)])
def test_warm_up_runs_until_every_arms_graphs_are_captured(arms: tuple[str, ...]) -> None:
    """ft bench's untimed warm-up: at least WARMUP_STEPS, and with CUDA graphs on until a whole
    step of each arm did no one-time graph work, so no capture lands in a timed round."""
    import numpy as np
    import torch

    from runtime.bench.runs import MAX_WARMUP_STEPS, WARMUP_STEPS, DecodeSteps, warm_up

    layers = [0, 1]
    decode = np.zeros((MAX_WARMUP_STEPS + 4, len(layers), 2), dtype=np.int64)
    ex = _ArmRunner(arms)
    gen = torch.Generator().manual_seed(0)
    warm_up(DecodeSteps(ex, layers, 2, 8, torch.device("cpu"), gen), decode, gen)
    steps = len(ex.calls) // len(layers)
    # one arm: its third step settles, and WARMUP_STEPS still run; two arms: past WARMUP_STEPS,
    # to the second arm's third step (steps 4-7 are its block)
    assert steps == (7 if len(arms) == 2 else WARMUP_STEPS) and WARMUP_STEPS < 7
    assert all(n >= 3 for n in ex.seen.values())


def test_the_rooflines_overlap_pcie_and_device_memory_or_add_them() -> None:
    """The roofline takes the slowest side; the serial one adds PCIe and device memory (a step
    that reads nothing ahead), the CPU still beside them. PCIe and the CPU overlap at their
    rates while both run, then the one left goes at its rate alone."""
    from runtime.bench.roofline import roofline
    from runtime.gpu import BandwidthProfile

    profile = BandwidthProfile(pcie_gbps=40.0, cpu_gbps=20.0, cpu_fixed_ms=0.0, pcie_fixed_ms=0.0,
                               pcie_alone_gbps=50.0, cpu_alone_gbps=25.0)
    offload = {"pcie_bytes": 1e9, "cpu_bytes": 0.0, "hit_bytes": 4e9}  # 20 ms over PCIe alone, 1 ms of HBM
    assert roofline(offload, profile, 4000.0) == pytest.approx(1 / 0.020)
    assert roofline(offload, profile, 4000.0, serial=True) == pytest.approx(1 / 0.021)
    # both sides: 25 ms together moves PCIe's 1 GB and 0.5 GB of the CPU's, whose other 0.5 GB
    # takes 20 ms alone (one after the other: 20 + 40 ms)
    split = {"pcie_bytes": 1e9, "cpu_bytes": 1e9, "hit_bytes": 4e9}
    assert roofline(split, profile, 4000.0) == roofline(split, profile, 4000.0, serial=True) == pytest.approx(1 / 0.045)
    # a few CPU bytes do not slow the PCIe side down to its rate while both run: 0.01 GB of the
    # CPU's overlaps 0.5 ms of PCIe at 40 GB/s, the other 0.98 GB of PCIe goes at 50 GB/s
    trickle = {"pcie_bytes": 1e9, "cpu_bytes": 1e7, "hit_bytes": 4e9}
    assert roofline(trickle, profile, 4000.0) == pytest.approx(1 / (0.0005 + 0.98e9 / 50e9))
    # the CPU alone: its alone rate
    cpu_only = {"pcie_bytes": 0.0, "cpu_bytes": 1e9, "hit_bytes": 0.0}
    assert roofline(cpu_only, profile, 4000.0) == pytest.approx(25.0)


def test_the_roofline_takes_each_sides_rate_up_to_its_ceiling_never_down() -> None:
    """The profile holds what the runtime's kernels reach; the roofline's rates are raised to
    what the machine allows (a pinned copy, a host memory read), the profile's contention kept."""
    from runtime.bench.ceilings import ceiling_profile
    from runtime.gpu import BandwidthProfile

    profile = BandwidthProfile(40.0, 30.0, 0.1, 0.1, pcie_alone_gbps=48.0, cpu_alone_gbps=60.0)
    raised = ceiling_profile(profile, link=55.0, host_read=50.0)
    assert raised.pcie_alone_gbps == 55.0 and raised.pcie_gbps == pytest.approx(40.0 * 55.0 / 48.0)
    assert raised.cpu_alone_gbps == 60.0 and raised.cpu_gbps == 30.0  # the kernel beat the read: kept


def test_the_synthetic_prompt_and_its_decode_are_one_request() -> None:
    """The calibrated router draws a new context (its eligible experts) every `context_tokens`:
    a 128-token prompt and its decode were two requests, and half the decode's reads missed what
    the prompt had warmed (0.50 against 1.00 in one request)."""
    import numpy as np

    from runtime.bench.moe import SHAPES, BenchConfig, make_routing

    cfg = BenchConfig(shape="qwen3-30b-a3b", prompt_tokens=128, tokens=64, seed=1)
    prompt, decode, _, _ = make_routing(SHAPES[cfg.shape], cfg, 8)
    used = [set(np.unique(prompt[:, layer])) for layer in range(8)]
    reads = [(layer, int(e)) for t in range(len(decode)) for layer in range(8) for e in decode[t, layer]]
    assert sum(e in used[layer] for layer, e in reads) / len(reads) > 0.9


def test_rounds_report_the_median_run_and_its_own_counters() -> None:
    """With rounds, tok/s is the median run's (the slower of the middle two) and the counters are
    that run's: for auto, whose guard chooses by timing, runs differ, and the fraction of the
    roofline mixed one run's tok/s with another's bytes."""
    from runtime.bench.moe import BenchConfig, run_bench

    report = run_bench(BenchConfig(shape="tiny", device="cpu", tokens=6, prompt_tokens=8, prefill=(),
                                   policies=("offload",), threads=1, reps=2))
    r = report["policies"]["offload"]
    assert len(r["runs_s"]) == 2 and r["decode_tok_s"] == pytest.approx(6 / max(r["runs_s"]))


def test_without_a_gpu_the_default_run_is_refused_before_anything_is_built(capsys: pytest.CaptureFixture[str],
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`ft bench` with no arguments built 54 GiB of host banks before it looked for the GPU: on a
    24 GB machine without CUDA, a machine-wide out-of-memory kill after 1 min 52 s."""
    import torch

    from runtime.bench import moe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(moe, "make_banks", lambda *a, **k: pytest.fail("banks built"))
    with pytest.raises(SystemExit) as e:
        _run(["bench"])
    assert e.value.code == 1 and "--device cuda needs a CUDA GPU" in capsys.readouterr().err


def test_banks_larger_than_the_ram_are_refused_with_the_way_out(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.bench import moe
    from runtime.planner.resources import Machine

    small = Machine(ram_total_bytes=24 << 30, ram_available_bytes=22 << 30, num_physical_cores=2, gpu=None)
    monkeypatch.setattr(moe.Machine, "probe", staticmethod(lambda: small))
    monkeypatch.setattr(moe, "make_banks", lambda *a, **k: pytest.fail("banks built"))
    with pytest.raises(SystemExit) as e:
        _run(["bench", "--device", "cpu"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "host banks need 54.0 GiB (48 layers of 1.1 GiB), 22.0 GiB of RAM is available" in err
    assert "--host-banks 17" in err  # (22 GiB less the 2 GiB reserve) // 1.1 GiB


def test_the_policy_check_is_not_judged_on_the_cpu(report: dict) -> None:
    """On --device cpu auto's split is between two copies on one CPU: a FAIL there meant nothing,
    and a real FAIL (on CUDA) now ends the command with status 1."""
    from runtime.bench.report import format_report

    assert "policy_check" not in report
    assert "policy check: only with --device cuda" in format_report(report)


def test_a_budget_above_the_free_vram_is_refused_before_anything_is_built(capsys: pytest.CaptureFixture[str],
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the cache is sized from --budget-gib (8 by default): more than the GPU has free was
    found by an out-of-memory error after the banks were built and pinned."""
    import torch

    from runtime.bench import moe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 << 30, 8 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "RTX 4060 Laptop GPU")
    monkeypatch.setattr(moe, "make_banks", lambda *a, **k: pytest.fail("banks built"))
    with pytest.raises(SystemExit) as e:
        _run(["bench"])
    err = capsys.readouterr().err
    assert e.value.code == 1
    assert ("--budget-gib 8 needs 8.0 GiB of VRAM, RTX 4060 Laptop GPU has 5.0 GiB free of 8.0 GiB: "
            "pass --budget-gib 4.5 or less") in err


def test_files_it_reads_and_writes_are_checked_before_anything_is_built(tmp_path, capsys: pytest.CaptureFixture[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.bench import moe

    monkeypatch.setattr(moe, "make_banks", lambda *a, **k: pytest.fail("banks built"))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for args, said in ((["--profile-dir", str(blocked / "traces")], f"--profile-dir {blocked / 'traces'}: cannot write"),
                       (["--profile", str(tmp_path / "none.json")], "none.json: no such file")):
        with pytest.raises(SystemExit) as e:
            _run(["bench", "--shape", "tiny", "--device", "cpu", *args])
        assert e.value.code == 1 and said in capsys.readouterr().err


def test_a_failed_policy_check_ends_the_run_with_status_1(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`ft bench` printed `policy check: FAIL` and exited 0: scripts and CI took it for a pass."""
    from runtime.bench import moe

    report = {"policies": {}, "policy_check": {"ok": False, "auto": 10.0, "best": "offload", "best_tok_s": 20.0}}
    monkeypatch.setattr(moe, "run_bench", lambda cfg: report)
    with pytest.raises(SystemExit) as e:
        _run(["bench", "--json"])
    assert e.value.code == 1 and json.loads(capsys.readouterr().out)["policy_check"]["ok"] is False
    report["policy_check"]["ok"] = True
    _run(["bench", "--json"])  # (a passed one returns)
