"""FTW conversion and load throughput against a plain sequential read of the same bytes.

    python benchmarks/bench_ftw.py --layers 3 --dir /var/tmp/ftw-bench

Builds a synthetic checkpoint with Qwen3-30B-A3B's shapes (bf16, per-expert tensors as the
real one ships, sharded like the Hub's), then, each from a cold page cache when the kernel lets
us drop it (root), measures:

- plain read of the source files (64 MiB sequential reads) vs `convert_checkpoint`
  (goal: conversion >= 0.5 of the read);
- plain read of the FTW shards vs loading them through FTWReader into preallocated buffers,
  as the runtime loads its host banks (goal: load >= 0.8 of the read);
- the peak RSS of the conversion process (goal: a few hundred MB plus one layer's experts).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HIDDEN, INTER, EXPERTS, VOCAB = 2048, 768, 128, 151936
HEADS, KV_HEADS, HEAD_DIM = 32, 4, 128
SHARD_LIMIT = 2 << 30
CHUNK = 64 << 20


def layer_tensors(i: int) -> list[tuple[str, tuple[int, ...]]]:
    p = f"model.layers.{i}."
    out = [
        (p + "input_layernorm.weight", (HIDDEN,)),
        (p + "post_attention_layernorm.weight", (HIDDEN,)),
        (p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN)),
        (p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
        (p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN)),
        (p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM)),
        (p + "self_attn.q_norm.weight", (HEAD_DIM,)),
        (p + "self_attn.k_norm.weight", (HEAD_DIM,)),
        (p + "mlp.gate.weight", (EXPERTS, HIDDEN)),
    ]
    for e in range(EXPERTS):
        q = f"{p}mlp.experts.{e}."
        out += [(q + "gate_proj.weight", (INTER, HIDDEN)), (q + "up_proj.weight", (INTER, HIDDEN)),
                (q + "down_proj.weight", (HIDDEN, INTER))]
    return out


def build_checkpoint(out: Path, num_layers: int) -> int:
    """Write the synthetic checkpoint, streaming; returns its size in bytes."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(num_layers):
        tensors += layer_tensors(i)
    tensors += [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in tensors:
        nbytes = 2 * int(np.prod(shape))
        if size + nbytes > SHARD_LIMIT and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    noise = np.random.default_rng(0).integers(0, 256, CHUNK + 4096, dtype=np.uint8)
    noise[1::2] &= 0x3F  # bf16 high bytes of small finite numbers
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {}, 0
        for name, shape in shard:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)
        with open(out / fname, "wb") as f:
            f.write(len(raw).to_bytes(8, "little") + raw)
            written = 0
            while written < offset:
                n = min(CHUNK, offset - written)
                f.write(memoryview(noise)[written % 4096 : written % 4096 + n])
                written += n
        total += (out / fname).stat().st_size
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": HIDDEN,
              "intermediate_size": 6144, "moe_intermediate_size": INTER, "num_hidden_layers": num_layers,
              "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "num_experts": EXPERTS, "num_experts_per_tok": 8, "vocab_size": VOCAB, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "max_position_embeddings": 40960, "rope_theta": 1e6, "torch_dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(config))
    return total


def pair_ratios(baseline_s: list[float], measured_s: list[float]) -> dict[str, float]:
    """Throughput ratio measured/baseline of each adjacent pair (the disk drifts between pairs)."""
    ratios = sorted(b / m for b, m in zip(baseline_s, measured_s, strict=True))
    return {"median": round(statistics.median(ratios), 3), "min": round(ratios[0], 3), "max": round(ratios[-1], 3)}


def interleaved(steps: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Run every step `reps` times from a cold page cache, rotating their order each repetition."""
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            drop_caches()
            times[name].append(steps[name]())
    return times


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def plain_copy(files: list[Path], out_dir: Path) -> float:
    """cp: read each file and write it back, fsynced; the floor for any converter on this disk."""
    out_dir.mkdir(parents=True, exist_ok=True)
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    start = time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f, open(out_dir / path.name, "wb", buffering=0) as g:
            while n := f.readinto(view):
                g.write(view[:n])
            os.fsync(g.fileno())
    elapsed = time.perf_counter() - start
    shutil.rmtree(out_dir)
    return elapsed


def plain_read(files: list[Path], direct: bool = False) -> tuple[int, float]:
    """dd of=/dev/null: 64 MiB sequential reads into one reused buffer (O_DIRECT: dd iflag=direct)."""
    region = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
    view = memoryview(region)
    total = 0
    start = time.perf_counter()
    for path in files:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        size = os.fstat(fd).st_size
        offset = 0
        while offset < size:
            n = os.preadv(fd, [view], offset)
            if n <= 0:
                break
            offset += n
        os.close(fd)
        total += offset
    elapsed = time.perf_counter() - start
    view.release()
    region.close()
    return total, elapsed


CONVERT_CHILD = """
import resource, sys, time
from ftw import convert_checkpoint
start = time.perf_counter()
convert_checkpoint(sys.argv[1], sys.argv[2])
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""
IMPORT_CHILD = "import resource, ftw; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)"


def ftw_load(directory: Path) -> tuple[int, float]:
    from ftw import ExpertBank, FTWReader
    from ftw.reader import page_aligned_empty

    reader = FTWReader.open(directory)
    index = reader.index
    # Preallocate first, as the runtime does (pinned banks are page-aligned), then time the reads only.
    dense = {t.name: page_aligned_empty(t.nbytes) for t in index.tensors}
    banks = {b.layer: page_aligned_empty(b.nbytes) for b in index.banks}
    for buf in [*dense.values(), *banks.values()]:
        buf.fill_(0)  # fault the pages in, as pinning would
    start = time.perf_counter()
    for item in reader.in_file_order():
        if isinstance(item, ExpertBank):
            reader.bank_bytes(item.layer, out=banks[item.layer])
        else:
            reader.read_into(item.shard, item.offset, memoryview(dense[item.name].numpy()))
    elapsed = time.perf_counter() - start
    reader.close()
    return sum(t.nbytes for t in index.tensors) + sum(b.nbytes for b in index.banks), elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=3, help="MoE layers (1.2 GB of experts each)")
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/ftw-bench"))
    ap.add_argument("--reps", type=int, default=6, help="alternating repetitions of each pair")
    ap.add_argument("--keep", action="store_true", help="keep the files afterwards")
    args = ap.parse_args()
    src, out = args.dir / "hf", args.dir / "ftw"
    shutil.rmtree(args.dir, ignore_errors=True)
    size = build_checkpoint(src, args.layers)
    sources = sorted(src.glob("*.safetensors"))
    cold = drop_caches()
    # The VM's disk drifts by 2x from minute to minute, and its host caches what was read last:
    # run the steps of a comparison in a rotating order, cold each time, and compare adjacent runs.
    peak_rss = 0

    def convert() -> float:
        nonlocal peak_rss
        shutil.rmtree(out, ignore_errors=True)
        drop_caches()
        proc = subprocess.run([sys.executable, "-c", CONVERT_CHILD, str(src), str(out)],
                              capture_output=True, text=True, check=True)
        seconds, rss = proc.stdout.split()
        peak_rss = max(peak_rss, int(rss))
        return float(seconds)

    conv = interleaved({"read": lambda: plain_read(sources)[1], "copy": lambda: plain_copy(sources, args.dir / "copy"),
                        "convert": convert}, args.reps)
    read_s, copy_s, convert_s = conv["read"], conv["copy"], conv["convert"]
    base_rss = int(subprocess.run([sys.executable, "-c", IMPORT_CHILD], capture_output=True, text=True, check=True).stdout)

    shards = sorted(out.glob("*.ftw"))
    shard_bytes = sum(p.stat().st_size for p in shards)
    loaded: list[int] = []

    def load() -> float:
        nbytes, seconds = ftw_load(out)
        loaded.append(nbytes)
        return seconds

    ld = interleaved({"read": lambda: plain_read(shards)[1], "direct": lambda: plain_read(shards, direct=True)[1],
                      "load": load}, args.reps)
    shard_read_s, shard_direct_s, load_s = ld["read"], ld["direct"], ld["load"]
    load_bytes = loaded[0]
    read_bytes = size
    med = statistics.median

    layer_expert_bytes = EXPERTS * 3 * INTER * HIDDEN * 2
    gbps = lambda n, s: n / s / 1e9  # noqa: E731
    result = {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cpus",
        "page_cache": "cold (dropped before each step)" if cold else "warm (could not drop caches)",
        "checkpoint": f"Qwen3-30B-A3B shapes, {args.layers} MoE layers, bf16, {size / 1e9:.2f} GB in {len(sources)} files",
        "reps": args.reps,
        "plain_read_source_gbps": round(gbps(read_bytes, med(read_s)), 3),
        "convert_gbps": round(gbps(size, med(convert_s)), 3),
        "convert_ratio": pair_ratios(read_s, convert_s),
        "plain_copy_gbps": round(gbps(size, med(copy_s)), 3),
        "convert_ratio_to_copy": pair_ratios(copy_s, convert_s),
        "plain_read_ftw_gbps": round(gbps(shard_bytes, med(shard_read_s)), 3),
        "load_gbps": round(gbps(load_bytes, med(load_s)), 3),
        "plain_read_ftw_direct_gbps": round(gbps(shard_bytes, med(shard_direct_s)), 3),
        "load_ratio": pair_ratios([t * load_bytes / shard_bytes for t in shard_read_s], load_s),
        "load_ratio_to_direct_read": pair_ratios([t * load_bytes / shard_bytes for t in shard_direct_s], load_s),
        "convert_peak_rss_mb": round(peak_rss / 1e6),
        "import_rss_mb": round(base_rss / 1e6),
        "one_layer_experts_mb": round(layer_expert_bytes / 1e6),
    }
    print(json.dumps(result, indent=1))
    if not args.keep:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
