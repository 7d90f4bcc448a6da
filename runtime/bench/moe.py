"""The MoE expert-path benchmark behind `ft bench` (DESIGN.md §5 and §9).

For one shape (shapes.py: a built-in table of real models' MoE geometry, or `tiny` for CI):

- random expert banks for every MoE layer in host memory, in the FTW layout
  (runtime.experts.synthetic.random_bank), pinned on CUDA by the runtime's own HostPinner;
- the expert cache sized as the runtime sizes it: the fit planner's slots for the VRAM budget
  (budget - dense weights - workspace - KV for `num_ctx`), scaled by the share of MoE layers built
  when `layers` reduces the run. The prefill buffer a policy warms with is transient (released
  before decode) and not charged to the budget; the numbers are in the report;
- one routing sequence, generated once and fed identically to every policy: the calibrated
  synthetic router (runtime.bench.routing_synth), or a replay of the real Qwen3-30B-A3B trace
  (shared/traces/bigmoeonedge, 48 layers x 128 experts, top-6 as recorded: 28 prompt tokens,
  128 decode tokens);
- per policy (executor mode; the runs themselves are runs.py): the prompt through the executor's
  prefill path (warms the LRU modes, places prefill_placement's cache), then decode token by token: per MoE layer a random [1, H]
  activation and the injected ids/weights; the host waits for every step's end before the next
  may start (the next token depends on it in a real model). With step graphs the next step is
  queued meanwhile, held on the device until that wait is over, as `ft run` queues its steps
  (`queue_ahead`; --no-queue-ahead launches each step after the wait).

Only the routed-expert path is timed ("experts-only"): attention, dense layers and shared
experts are not run and not counted in tok/s or TTFT. The roofline per token is
1 / max(host, hit_bytes / hbm): `host` the least time in which PCIe and the CPU can move their
bytes (each side's rate alone, the lower pair while both run: roofline.py) at this machine's
ceilings (ceilings.py: pinned copies of expert records, a host memory read), hbm a measured
device-memory copy rate. The serial roofline adds the PCIe reads' time alone and the
device-memory time instead, the bound of a step that reads nothing ahead of its routing. The
runtime roofline takes the bandwidth profile's rates instead: what the runtime's own kernels
reach.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ftw.writer import plan_expert_parts

from ..experts import CPUExpertExecutor, HostExpertBank
from ..experts.synthetic import random_bank
from ..gpu import BandwidthProfile, CacheTooSmallError, build_hybrid, load_or_measure, measure
from ..gpu.host_memory import HostPinner
from ..planner.plan import ModelFootprint, PlanOverrides, kv_layout, plan
from ..planner.resources import GPU, Machine
from .ceilings import ceiling_profile, host_read_gbps, link_gbps
from .preflight import HOST_PROBE_BYTES, check_device, check_host_memory, check_paths
from .report import format_report, json_ready  # noqa: F401 - re-exported for the CLI
from .roofline import roofline
from .routing_synth import calibrated_router, routing_stats
from .runs import DecodeSteps, decode_run, prefill_run, profile_decode, sync, warm_up
from .shapes import SHAPES, BenchShape

POLICIES = ("auto", "offload", "cpu", "static", "prefill_placement")
_ROOT = Path(__file__).resolve().parents[2]
TRACE_DIR = next((d for d in (_ROOT / "shared" / "traces" / "bigmoeonedge", _ROOT.parent / "shared" / "traces" / "bigmoeonedge")
                  if d.is_dir()), _ROOT / "shared" / "traces" / "bigmoeonedge")
GiB = 1 << 30


@dataclass(frozen=True)
class BenchConfig:
    shape: str = "qwen3-30b-a3b"
    budget_gib: float = 8.0
    threads: int | None = None
    policies: tuple[str, ...] = POLICIES
    routing: str = "synthetic"  # "synthetic" | "trace"
    tokens: int = 128
    prompt_tokens: int = 128  # the warm prompt before decode (synthetic; the trace has its own)
    prefill: tuple[int, ...] = (1024, 4096, 16384)
    device: str = "cuda"
    layers: int | None = None  # build only this many MoE layers (a reduced run)
    host_banks: int | None = None  # distinct host banks, shared round-robin by the layers (full depth in less RAM)
    pcie_repeat: int = 1  # every PCIe copy made this many times: a link 1/N as fast (2: a laptop's x8 Gen5 link)
    num_ctx: int = 4096  # KV the planner reserves
    cache_slots: int | None = None  # overrides the planner
    profile: str | None = None  # a BandwidthProfile JSON; default: the kept one (CUDA) or a quick measurement
    profile_seconds: float = 0.4
    seed: int = 0
    trace: str | None = None  # the .npz; default shared/traces/bigmoeonedge/qwen3-30b-a3b.npz
    reps: int = 1  # rounds of decode runs, every policy once per round (median tok/s)
    profile_tokens: int = 0  # profile this many extra decode tokens per policy (torch.profiler: host ops, kernels)
    profile_dir: str | None = None  # where the Chrome traces go (default: no trace files, the tables only)
    cuda_graphs: bool = True  # decode calls replayed as CUDA graphs (--no-cuda-graphs: the uncaptured path)
    step_graphs: bool = True  # and whole steps as one graph each (--no-step-graphs: a graph per layer call)
    queue_ahead: bool = True  # each step queued while the one before runs, held until the host saw that one end


# -- setup ----------------------------------------------------------------------------------------------

def _stride(shape: BenchShape) -> int:
    parts = [("w13", shape.dtype, (2 * shape.moe_inter, shape.hidden)), ("w2", shape.dtype, (shape.hidden, shape.moe_inter))]
    return plan_expert_parts(parts)[1]


def cache_plan(shape: BenchShape, cfg: BenchConfig, top_k: int, built_layers: int) -> dict[str, Any]:
    """The cache's slots as the runtime sizes them (the fit planner), with the numbers behind them."""
    stride = _stride(shape)
    moe = len(shape.moe_layers)
    info: dict[str, Any] = {"slot_bytes": stride, "pool_bytes": built_layers * shape.num_experts * stride,
                            "min_slots": built_layers * top_k}
    if cfg.cache_slots is not None:
        return {**info, "cache_slots": cfg.cache_slots, "source": "--cache-slots"}
    if shape.name == "tiny":
        return {**info, "cache_slots": built_layers * shape.num_experts // 2, "source": "tiny: half the experts"}
    kv = kv_layout(shape.family, shape.attention, 2)
    act = 4 * (4 * shape.hidden + (shape.attention["num_attention_heads"] + 2 * shape.attention["num_key_value_heads"])
               * shape.attention["head_dim"] + shape.num_experts + 3 * top_k * shape.moe_inter)
    fp = ModelFootprint(name=shape.name, source="checkpoint", family=shape.family, dtype=shape.dtype,
                        dense_bytes=shape.dense_bytes, expert_pool_bytes=moe * shape.num_experts * stride,
                        expert_stride_bytes=stride, num_moe_layers=moe, num_experts=shape.num_experts,
                        num_experts_per_tok=top_k, kv=kv, context_length=max(cfg.num_ctx, 2048),
                        activation_bytes_per_token=act)
    budget = int(cfg.budget_gib * GiB)
    machine = Machine(ram_total_bytes=fp.expert_pool_bytes + 64 * GiB, ram_available_bytes=fp.expert_pool_bytes + 64 * GiB,
                      num_physical_cores=cfg.threads or 8, gpu=GPU("emulated budget", budget, budget))
    p = plan(fp, machine, PlanOverrides(vram_budget_bytes=budget, num_ctx=cfg.num_ctx, device="gpu", force=True))
    # the prefill buffers are slots the runtime's cache lends while a prompt streams (the
    # benchmark's prefill buffer is transient too, released before decode: see the module doc)
    planned = min(p.cache_slots, fp.num_expert_records)
    slots = planned * built_layers // moe  # a reduced run keeps the full model's share per layer
    return {**info, "cache_slots": slots, "planned_slots": planned, "source": "fit planner",
            "runtime_prefill_buffers": p.prefill_buffers, "runtime_cache_slots": p.cache_slots,
            "budget_bytes": budget, "dense_bytes": p.dense_bytes, "workspace_bytes": p.workspace_bytes,
            "kv_bytes": p.kv_bytes, "context": p.context_length, "cache_bytes": planned * stride,
            "problems": [str(x) for x in p.problems], "min_slots": built_layers * top_k,
            "full_min_slots": moe * top_k}


def make_banks(shape: BenchShape, layers: list[int], seed: int, distinct: int | None = None) -> dict[int, HostExpertBank]:
    """Random banks (a few distinct experts repeated: quick to build, every byte still read).

    `distinct`: build only that many banks in host memory and give layer i the memory of bank
    i mod `distinct`, so a model deeper than the host's RAM runs at full depth. Each layer is still
    its own bank to the cache ((layer, expert) keys), and every fill and CPU read still moves its
    bytes: a layer's bank (GiBs) is far larger than any CPU cache, so sharing saves RAM, not reads."""
    made: list[HostExpertBank] = []
    banks = {}
    for i, layer in enumerate(layers):
        if distinct is None or i < distinct:
            made.append(random_bank(shape.dtype, shape.num_experts, shape.hidden, shape.moe_inter, layer=layer,
                                    seed=seed + layer, num_distinct=4))
            banks[layer] = made[-1]
        else:
            base = made[i % distinct]
            banks[layer] = HostExpertBank(layer, replace(base.layout, layer=layer), base.data)
    return banks


def make_routing(shape: BenchShape, cfg: BenchConfig, num_layers: int) -> tuple[np.ndarray, np.ndarray, int, str]:
    """(prompt [P, L, K], decode [T, L, K], top_k, what it is); ids -1 = absent (trace prompts)."""
    if cfg.routing == "trace":
        from ..policy.trace import load_trace

        if shape.name != "qwen3-30b-a3b":
            raise ValueError("--routing trace replays the Qwen3-30B-A3B trace: only with --shape qwen3-30b-a3b")
        trace = load_trace(cfg.trace or TRACE_DIR / "qwen3-30b-a3b.npz")
        prompt, decode = trace.prefill[:, :num_layers], trace.decode[: cfg.tokens, :num_layers]
        what = (f"trace {trace.name}: {len(prompt)} prompt + {len(decode)} decode tokens of {trace.num_decode_tokens}, "
                f"top-{trace.top_k} as recorded")
        return prompt.astype(np.int64), decode.astype(np.int64), trace.top_k, what
    router, _ = calibrated_router(num_layers, shape.num_experts, shape.top_k, seed=cfg.seed)
    # one request, prompt included: the router's context (its window of eligible experts, the
    # statistics' unit) spans both; with its calibration window of 128 tokens a default 128-token
    # prompt and its decode were two requests, and the prompt warmed the cache for the wrong one
    router = replace(router, context_tokens=cfg.prompt_tokens + cfg.tokens)
    seq = router.generate(cfg.prompt_tokens + cfg.tokens, seed=cfg.seed).astype(np.int64)
    return seq[: cfg.prompt_tokens], seq[cfg.prompt_tokens:], shape.top_k, "calibrated synthetic router (Qwen3-30B targets)"


def memory_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Device memory rate: read + write bytes of a large copy / time (the hit path's ceiling)."""
    nbytes = nbytes if device.type == "cuda" else 64 << 20
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync(device)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * nbytes / min(times) / 1e9


def get_profile(cfg: BenchConfig, bank: HostExpertBank, cpu: CPUExpertExecutor, device: torch.device,
                threads: int) -> tuple[BandwidthProfile, str]:
    if cfg.profile:
        return BandwidthProfile.load(Path(cfg.profile)), f"loaded {cfg.profile}"
    if device.type == "cuda":
        return load_or_measure(bank, cpu, device, cpu_threads=threads, pcie_repeat=cfg.pcie_repeat), \
            "kept profile of this machine (or measured now)"
    return measure(bank, cpu, device, cpu_threads=threads, seconds=cfg.profile_seconds, pcie_repeat=cfg.pcie_repeat), \
        f"measured now ({cfg.profile_seconds} s per point), not kept"


def _long_routing(shape: BenchShape, num_layers: int, top_k: int, length: int, seed: int) -> np.ndarray:
    """Prefill routing: distinct uniform top-k per token and layer (a long prompt reaches nearly
    every expert; only the compute per expert depends on the exact ids)."""
    rng = np.random.default_rng(seed)
    keys = rng.random((length, num_layers, shape.num_experts), dtype=np.float32)
    return np.argpartition(keys, top_k - 1, axis=-1)[..., :top_k].astype(np.int64)


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    if cfg.shape not in SHAPES:
        raise ValueError(f"unknown shape {cfg.shape!r}: one of {', '.join(SHAPES)}")
    unknown = [p for p in cfg.policies if p not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}: choose from {', '.join(POLICIES)}")
    shape, device = SHAPES[cfg.shape], torch.device(cfg.device)
    check_device(device, cfg.budget_gib)  # before anything is built: refusals with the numbers (preflight.py)
    check_paths(cfg.profile, cfg.profile_dir)
    threads = cfg.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    layers = shape.moe_layers[: cfg.layers] if cfg.layers else shape.moe_layers
    t0 = time.perf_counter()
    prompt, decode, top_k, routing_what = make_routing(shape, cfg, len(layers))
    sizing = cache_plan(shape, cfg, top_k, len(layers))
    if cfg.host_banks is not None and cfg.host_banks < 1:
        raise ValueError(f"--host-banks must be at least 1, not {cfg.host_banks}")
    if cfg.pcie_repeat < 1:
        raise ValueError(f"--pcie-repeat must be at least 1, not {cfg.pcie_repeat}")
    sizing["host_banks"] = min(cfg.host_banks or len(layers), len(layers))
    sizing["host_bytes"] = sizing["host_banks"] * shape.num_experts * sizing["slot_bytes"]
    check_host_memory(sizing["host_bytes"], sizing["host_banks"], shape, device)
    banks = make_banks(shape, layers, cfg.seed, cfg.host_banks)
    pinner = None
    if device.type == "cuda":
        pinner = HostPinner()
        pinner.pin_banks(banks)
    setup_s = time.perf_counter() - t0
    cpu = CPUExpertExecutor(banks, torch.bfloat16, threads=threads)
    profile, profile_what = get_profile(cfg, banks[layers[0]], cpu, device, threads)
    hbm = memory_gbps(device)
    stride = sizing["slot_bytes"]
    link = link_gbps(device, stride, pcie_repeat=cfg.pcie_repeat)
    host_read = host_read_gbps(threads, HOST_PROBE_BYTES.get(device.type, HOST_PROBE_BYTES["cpu"]))
    ceilings = ceiling_profile(profile, link, host_read)
    stats = routing_stats(decode.astype(np.int32), shape.num_experts, window=min(128, len(decode))) \
        if len(decode) >= 2 else None
    report: dict[str, Any] = {
        "shape": {**asdict(shape), "moe_layers_built": len(layers), "top_k_used": top_k, "expert_bytes": stride},
        "machine": {"device": str(device), "accelerator": torch.cuda.get_device_name(device) if device.type == "cuda"
                    else "cpu", "threads": threads, "budget_gib": cfg.budget_gib},
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(cfg).items()},
        "cache": sizing, "routing": {"source": routing_what, "tokens": int(len(decode)), "prompt_tokens": int(len(prompt)),
                                     **(asdict(stats) if stats else {})},
        "profile": {**asdict(profile), "source": profile_what}, "hbm_gbps": hbm, "setup_s": setup_s,
        "ceilings": {"pcie_gbps": link, "host_read_gbps": host_read, "hbm_gbps": hbm},
        "scope": "experts-only: the routed-expert path; attention, dense layers and shared experts not run",
        "policies": {}, "prefill": [],
    }
    slots = sizing["cache_slots"]
    # rounds: every policy once per round, so drift over the run (clocks, host memory, the other
    # tenants of the machine) falls on all policies alike; each policy's median run is reported
    runs: dict[str, list[dict[str, Any]]] = {}
    # queued ahead as a GPU decode loop queues its steps (engine.py): step graphs only
    queue_ahead = cfg.queue_ahead and device.type == "cuda" and cfg.cuda_graphs and cfg.step_graphs

    def build(policy: str):
        return build_hybrid(banks, device=device, cache_slots=slots, mode=policy, profile=profile, top_k=top_k,
                            cpu_executor=cpu, cpu_threads=threads, prefill_buffers=1, pin=False, prefill_min_tokens=2,
                            cuda_graphs=cfg.cuda_graphs, step_graphs=cfg.step_graphs, pcie_repeat=cfg.pcie_repeat)

    def steps_of(ex) -> DecodeSteps:
        return DecodeSteps(ex, layers, top_k, shape.hidden, device, torch.Generator().manual_seed(cfg.seed))

    if device.type == "cuda":  # the process's first-use costs (Triton compiles, ...) on no policy's clock
        for policy in cfg.policies:
            with contextlib.suppress(CacheTooSmallError, ValueError):  # reported by the rounds
                ex = build(policy)
                try:
                    warm_up(steps_of(ex), decode, torch.Generator().manual_seed(cfg.seed))
                finally:
                    ex.close()
    for round_ in range(max(1, cfg.reps)):
        for policy in cfg.policies:
            if policy in report["policies"]:  # failed to build in an earlier round
                continue
            try:
                ex = build(policy)
            except (CacheTooSmallError, ValueError) as e:
                report["policies"][policy] = {"error": str(e)}
                continue
            last_round = round_ == max(1, cfg.reps) - 1
            steps = steps_of(ex)
            try:
                runs.setdefault(policy, []).append(decode_run(steps, prompt, decode, cfg.seed, queue_ahead))
                if last_round and cfg.profile_tokens:
                    trace = Path(cfg.profile_dir) / f"decode-{policy}.json" if cfg.profile_dir else None
                    profiled = profile_decode(steps, decode, cfg.profile_tokens, trace)
            finally:
                ex.close()
            if last_round:
                summary = _summary(runs[policy], stride, (profile, ceilings), hbm, list(ex.resident_layers), slots)
                if ex.graphs is not None:
                    summary["cuda_graphs"] = {"captures": ex.graphs.captures, "replays": ex.graphs.replays,
                                              "step_captures": ex.steps.captures, "step_replays": ex.steps.replays}
                if cfg.profile_tokens:
                    summary["host_profile"] = profiled
                report["policies"][policy] = summary
    if cfg.prefill:
        longest = max(cfg.prefill)
        long_ids = _long_routing(shape, len(layers), top_k, longest, cfg.seed)
        for length in cfg.prefill:
            for buffers in (0, 1, 2):  # 0: through the cache itself, as a plan with no room for a buffer runs
                try:
                    report["prefill"].append(prefill_run(banks, layers, length, buffers, slots, top_k, long_ids,
                                                         shape.hidden, device, threads, cfg.pcie_repeat))
                except (RuntimeError, ValueError) as e:  # out of memory on a small device
                    report["prefill"].append({"tokens": length, "buffers": buffers, "error": str(e)})
    _ttft_and_check(report)
    if pinner is not None:
        pinner.close()
    return report


def _summary(runs: list[dict[str, Any]], stride: int, profiles: tuple[BandwidthProfile, BandwidthProfile], hbm: float,
             resident: list[int], slots: int) -> dict[str, Any]:
    # the counters of the run whose time is reported (the median; the slower of the middle two),
    # so bytes, misses and tok/s come from one run (auto's guard chooses by timing: runs differ)
    median_run = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    s = median_run["stats"]
    lookups = s["hits"] + s["misses"]
    calls = s["calls"]
    return {"stats": s, "runs_s": [r["seconds"] for r in runs], "steps_ms": [r["steps_ms"] for r in runs],
            "host_queue_ms": [r["host_queue_ms"] for r in runs],
            "calls": calls, "lookups": lookups,
            "hit_rate": s["hit_rate"], "miss_rate": s["misses"] / lookups if lookups else 0.0,
            "resident_layers": resident, "cache_slots": slots, "_stride": stride,
            "_profiles": profiles, "_hbm": hbm, **({"guard": [r["guard"] for r in runs]} if "guard" in runs[0] else {})}


def _ttft_and_check(report: dict[str, Any]) -> None:
    """Per-token figures, roofline, TTFT estimate and the policy check (fills `report` in place)."""
    n_tokens = report["routing"]["tokens"]
    for r in report["policies"].values():
        if "error" in r:
            continue
        stride, (profile, ceilings), hbm = r.pop("_stride"), r.pop("_profiles"), r.pop("_hbm")
        s = r["stats"]
        seconds = sorted(r["runs_s"])[len(r["runs_s"]) // 2]  # the run whose counters `stats` are
        per = {"pcie_bytes": s["pcie_bytes"] / n_tokens, "cpu_bytes": s["cpu_bytes"] / n_tokens,
               "hit_bytes": s["hits"] * stride / n_tokens}
        r.update(tokens=n_tokens, decode_tok_s=n_tokens / seconds, ms_per_token=1e3 * seconds / n_tokens,
                 pcie_mb_per_token=per["pcie_bytes"] / 1e6, cpu_mb_per_token=per["cpu_bytes"] / 1e6,
                 hit_mb_per_token=per["hit_bytes"] / 1e6, misses_per_token=s["misses"] / n_tokens)
        # the roofline of the hardware's ceilings (ceilings.py); the runtime's, of the rates its
        # own kernels reach (the profile), is kept beside it: the gap between them is the kernels'
        for key, rates, serial in (("roofline", ceilings, False), ("serial_roofline", ceilings, True),
                                   ("runtime_roofline", profile, False)):
            roof = roofline(per, rates, hbm, serial=serial)
            r[f"{key}_tok_s"] = roof if math.isfinite(roof) else None
        r["fraction_of_roofline"] = r["decode_tok_s"] / r["roofline_tok_s"] if r["roofline_tok_s"] else None
        r["fraction_of_runtime_roofline"] = (r["decode_tok_s"] / r["runtime_roofline_tok_s"]
                                             if r["runtime_roofline_tok_s"] else None)
    ok = {p: r for p, r in report["policies"].items() if "error" not in r}
    for p in (x for x in report["prefill"] if x.get("buffers") == 2 and "error" not in x):
        ms = (ok["auto"]["ms_per_token"] if "auto" in ok else 0.0)
        p["ttft_s_estimate"] = p["seconds"] + ms / 1e3
    if "auto" in ok and len(ok) > 1 and report["machine"]["device"].startswith("cuda"):
        # (on --device cpu the "device" is the CPU itself: PCIe fills are memcpys, so no split is checked)
        auto = ok["auto"]["decode_tok_s"]
        best_p, best = max(((p, r["decode_tok_s"]) for p, r in ok.items() if p != "auto"), key=lambda kv: kv[1])
        noise = 0.05
        report["policy_check"] = {"auto_tok_s": auto, "best_fixed": best_p, "best_fixed_tok_s": best, "noise": noise,
                                  "ok": auto >= best * (1 - noise)}
