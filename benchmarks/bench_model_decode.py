"""Decode of a whole Qwen3-MoE model on the GPU (attention, norms, router, routed experts, head),
with random weights at Qwen3-30B-A3B's shape and no download, four ways side by side in one
process on the same weights and prompt:

- eager: every op launched from Python, each expert call uncaptured (FT_CUDA_GRAPHS=0);
- layer graphs: each expert call replayed as its own CUDA graph, everything else eager;
- step graphs: each decode step replayed as one CUDA graph (gpu/step_graphs.py), launched once
  the host has the token before it;
- steps queued: the same, each step's graph launched while the step before runs and held on the
  device until the host has that token (DeviceModel.queue_decode, as `ft run` decodes).

`ft bench` times the expert path alone; this is what a user of `ft run` gets. Random routers
spread tokens nearly uniformly over the experts, so the default cache holds every expert
(`--slots` smaller makes misses). Every way picks its greedy token with `ft run`'s sampler
(runtime/text/sampling.py): from the best logits taken on the device (runtime/text/top_logits.py), or with
--whole-rows from the whole row moved to the host (as `ft run` did before runtime/text/top_logits.py).
Prints tok/s per way and how many greedy tokens each shares with the first way run (the slot
kernel sums experts with atomics, so bf16 runs may part after a while on random weights); for
steps queued also where the host's time went per step.

    python3 benchmarks/bench_model_decode.py [--layers 48] [--experts 32] [--slots N] [--tokens 64]
    python3 benchmarks/bench_model_decode.py --ways "steps queued,step graphs,steps queued"  # in this order
    python3 benchmarks/bench_model_decode.py --ways "step graphs" --profile-steps 4  # the device kernels of a step
"""

from __future__ import annotations

import argparse
import time

import torch

from runtime.experts.synthetic import random_bank
from runtime.gpu import build_hybrid
from runtime.gpu.device_model import DeviceModel
from runtime.gpu.host_memory import HostPinner
from runtime.loading.read_ftw import ModelWeights
from runtime.models import build_model
from runtime.models.synthetic import Qwen3MoeShape, qwen3_moe_config, random_dense
from runtime.text.sampling import Sampler, SamplingParams
from runtime.text.top_logits import TopLogits

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MOE_INTER, TOP_K, VOCAB = 2048, 32, 4, 128, 768, 8, 151936  # Qwen3-30B-A3B


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


WHOLE_ROWS = {"on": False}  # --whole-rows: the sampler reads every step's whole row on the host
GREEDY = SamplingParams(temperature=0)


def pick(sampler: Sampler, logits: torch.Tensor | TopLogits, history: list[int]) -> int:
    """The greedy token as `ft run`'s sampler picks it."""
    if WHOLE_ROWS["on"] and isinstance(logits, torch.Tensor):
        logits = logits.cpu()
    return sampler.sample(logits, history)


def decode(model: DeviceModel, prompt: list[int], tokens: int, ctx: int,
           forced: list[int] | None = None) -> tuple[list[int], float, list[torch.Tensor]]:
    """Greedy: the prompt, then `tokens` steps (the first 8 untimed: kernels, graphs); tok/s.
    `forced`: feed these tokens instead of the argmax (teacher forcing), keeping every step's logits."""
    state = model.new_state(ctx)
    logits = model.forward(torch.tensor(prompt), state, last_only=True)[-1]
    out: list[int] = []
    kept: list[torch.Tensor] = []
    sampler = Sampler(GREEDY)
    start = 0.0
    for step in range(tokens + 8):
        if step == 8:
            sync(model.device.type)
            start = time.perf_counter()
        out.append(pick(sampler, logits, out))  # the host needs the token: one sync per step, as in ft run
        if forced is not None:
            kept.append(logits.float().cpu())
        logits = model.forward(torch.tensor([out[-1] if forced is None else forced[step]]), state)[-1]
    sync(model.device.type)
    return out, tokens / (time.perf_counter() - start), kept


def decode_queued(model: DeviceModel, prompt: list[int], tokens: int, ctx: int) -> tuple[list[int], float, list]:
    """`decode` as Session.generate runs it on the GPU: each step queued (its graph launched, held
    on the device) while the step before runs, and started once the host has its token. (No
    device sync while a step is held: it would wait for the step, which waits for the host.)
    Prints the host's mean time per timed step in each part of the loop."""
    state = model.new_state(ctx)
    logits = model.forward(torch.tensor(prompt), state, last_only=True)[-1]
    out: list[int] = []
    start, pending = 0.0, None
    parts = dict.fromkeys(("sample", "start", "queue", "wait for logits"), 0.0)
    sampler = Sampler(GREEDY)
    try:
        for step in range(tokens + 8):
            t0 = time.perf_counter()
            out.append(pick(sampler, logits, out))
            t1 = time.perf_counter()
            current, pending = pending or model.queue_decode(state), None
            current.start(out[-1], None if WHOLE_ROWS["on"] else sampler.candidates_needed(out))
            t2 = time.perf_counter()
            if step + 1 < tokens + 8:
                pending = model.queue_decode(state)  # the next step's launches, while this one runs
            t3 = time.perf_counter()
            logits = current.logits()
            t4 = time.perf_counter()
            if step == 7:  # the first 8 untimed; the device is done with step 7 here
                start = time.perf_counter()
            elif step > 7:
                for name, d in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    parts[name] += d
    finally:
        if pending is not None:
            pending.cancel()
    sync(model.device.type)
    tok_s = tokens / (time.perf_counter() - start)
    print("steps queued, the host's ms a step: " + ", ".join(f"{k} {v / tokens * 1e3:.3f}" for k, v in parts.items()))
    return out, tok_s, []


def profile_steps(model: DeviceModel, prompt: list[int], steps: int, ctx: int, layers: int) -> None:
    """`steps` more greedy steps (the plain loop) under torch.profiler: the device kernels by total
    time, with how many run per step and their time per step and per layer."""
    from torch.profiler import ProfilerActivity, profile

    if model.device.type != "cuda":
        print("profile: device kernels only on CUDA")
        return
    decode(model, prompt, 2, ctx)  # (captures what this state's span needs)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        decode(model, prompt, steps, ctx)
    kernels = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    runs = steps + 8 + 1  # decode's steps, its 8 untimed ones and the prompt's forward
    total_n = sum(e.count for e in kernels) / runs
    total_us = sum(e.self_device_time_total for e in kernels) / runs
    print(f"profile: {total_n:.0f} device kernels and copies a step (the prompt's counted as one step), "
          f"{total_us / 1e3:.2f} ms of device time a step, {total_us / layers:.1f} us a layer")
    print(f"  {'count/step':>10} {'us/step':>9} {'us/layer':>9}  kernel")
    for e in sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:30]:
        print(f"  {e.count / runs:10.1f} {e.self_device_time_total / runs:9.1f} "
              f"{e.self_device_time_total / runs / layers:9.2f}  {e.key[:110]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=32, help="experts per layer (Qwen3-30B has 128; fewer build faster)")
    ap.add_argument("--slots", type=int, default=None, help="cache slots (default: every expert)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--mode", default="offload", help="the executor's mode (auto: its profile is loaded or measured)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads of the CPU share")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--check", action="store_true",
                    help="also feed each way the eager run's tokens and compare every step's logits with eager's")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16",
                    help="weights and compute (f32: differences between the ways are rounding, not drift)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only checks the script (no graphs there)")
    ap.add_argument("--ways", default="", help="only these ways, comma separated (default: all)")
    ap.add_argument("--whole-rows", action="store_true",
                    help="the sampler reads each step's whole row of logits on the host (not the best ones taken on the device)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after the last way, profile this many more steps: the device kernels of a step")
    args = ap.parse_args()
    WHOLE_ROWS["on"] = args.whole_rows
    device = args.device
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)
    shape = Qwen3MoeShape(HIDDEN, HEADS, KV_HEADS, HEAD_DIM, args.experts, TOP_K, MOE_INTER, VOCAB, args.layers)
    config = qwen3_moe_config(shape, args.ctx)
    t0 = time.perf_counter()
    banks = {i: random_bank(args.dtype, args.experts, HIDDEN, MOE_INTER, layer=i, seed=i, num_distinct=4)
             for i in range(args.layers)}
    pinner = HostPinner()
    if device == "cuda":
        pinner.pin_banks(banks)
    weights = ModelWeights(config, random_dense(shape, dtype, gen, device=device, embed_std=0.02), banks)
    slots = args.slots or args.layers * args.experts
    print(f"Qwen3-30B-A3B shape, {args.dtype}, {args.mode}: {args.layers} layers x {args.experts} experts, top-{TOP_K}, {slots} cache slots, "
          f"ctx {args.ctx}; {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; built in {time.perf_counter() - t0:.0f} s")
    prompt = torch.randint(0, VOCAB, (16,), generator=gen).tolist()
    first: list[int] | None = None
    first_logits: list[torch.Tensor] = []
    uncaptured: list[torch.Tensor] = []
    ways = [("eager", False, False), ("layer graphs", True, False), ("step graphs", True, True),
            ("steps queued", True, True)]
    if args.ways:  # in the order given, repeats allowed
        by_name = {way[0]: way for way in ways}
        unknown = [name for name in args.ways.split(",") if name not in by_name]
        if unknown:
            ap.error(f"unknown ways {unknown}: choose from {', '.join(by_name)}")
        ways = [by_name[name] for name in args.ways.split(",")]
    if args.check:  # the step graphs' work run uncaptured: what capture changes, apart from the masked span
        ways.insert(2, ("steps eager", True, False))
    for index, (name, graphs, steps) in enumerate(ways):
        ex = build_hybrid(weights, device=device, cache_slots=slots, mode=args.mode, compute_dtype=dtype,
                          cpu_threads=args.threads,
                          prefill_buffers=0, pin=False, force=True, cuda_graphs=graphs, step_graphs=steps)
        try:
            with torch.device(device):
                model = DeviceModel(build_model(config, weights, ex, dtype), device, ex.steps)
            if name == "steps eager":
                model.steps = ex.steps  # decode_at at a DevicePosition, each step as it is (begin_step refuses)
            run = decode_queued if name == "steps queued" and model.can_queue else decode
            out, tok_s, _ = run(model, prompt, args.tokens, args.ctx)
            first = first or out
            same = next((i for i, (a, b) in enumerate(zip(out, first, strict=True)) if a != b), len(out))
            s = ex.stats()
            guard = f"   model arm {ex.guard.steps['model']} of {sum(ex.guard.steps.values())} steps" if ex.guard else ""
            print(f"{name:<13} {tok_s:8.2f} tok/s   greedy tokens shared with the first way: {same}/{len(out)}   "
                  f"hit rate {s.hit_rate:.3f}, CPU-served {s.cpu_experts}   step graphs: {ex.steps.captures} captured, "
                  f"{ex.steps.replays} replayed{guard}")
            if args.profile_steps and index == len(ways) - 1:
                profile_steps(model, prompt, args.profile_steps, args.ctx, args.layers)
            if args.check:  # the eager run's tokens fed back: how far each step's logits are from eager's
                _, _, kept = decode(model, prompt, args.tokens, args.ctx, forced=first)
                if not first_logits:
                    first_logits = kept
                    continue
                if name == "steps eager":
                    uncaptured = kept
                errors = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(kept, first_logits, strict=True)]
                agree = sum(int(a.argmax() == b.argmax()) for a, b in zip(kept, first_logits, strict=True))
                gaps = [float(b.topk(2).values[0] - b.topk(2).values[1]) for b in first_logits]
                print(f"{'':<13} teacher-forced on eager's tokens: logits max error {max(errors):.2e} of the largest "
                      f"(median {sorted(errors)[len(errors) // 2]:.2e}), argmax agrees {agree}/{len(errors)}; "
                      f"eager's own top-2 gap: median {sorted(gaps)[len(gaps) // 2]:.3f}, "
                      f"smallest {min(gaps):.4f}")
                if name == "step graphs":
                    errors = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(kept, uncaptured, strict=True)]
                    print(f"{'':<13} against the same steps uncaptured: logits max error {max(errors):.2e}")
        finally:
            ex.close()
    pinner.close()


if __name__ == "__main__":
    main()
