"""The bandwidth profile mode auto splits misses by (runtime/gpu/measure_bandwidth.py), measured
afresh at several CPU thread counts, with its raw points: ms a layer call for 1 and n misses over
PCIe alone, on the CPU alone, and n + n at once. The split trusts the last of these: in the race
of 2026-12-07 (H100 host, Q4_K_M experts, 9 slots) both sides at once ran at 0.11 of their rates
alone, so auto sent every miss over PCIe, where the CPU alone streamed 22.9 GB/s.

Also the machine's CPU facts that bear on it: the cores this process may use, the cgroup's CPU
quota, the CPU model (a quota below the threads the runtime starts throttles them all).

    PYTHONPATH=. python benchmarks/bench_profile.py --threads 4,8 --dtypes q4_k/q6_k,bf16 --slots 9,16
    PYTHONPATH=. python benchmarks/bench_profile.py --threads 8 --torch-threads 8,1   # torch's own team's share
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import platform
from pathlib import Path

import torch

from runtime.experts import CPUExpertExecutor
from runtime.experts.synthetic import random_bank
from runtime.gpu.host_memory import HostPinner
from runtime.gpu.measure_bandwidth import measure


def cpu_facts() -> dict[str, str]:
    """What limits this process's CPU threads: its affinity, the cgroup quota, the model."""
    facts = {"affinity": str(len(os.sched_getaffinity(0))), "os.cpu_count": str(os.cpu_count()),
             "cpu": platform.processor() or platform.machine()}
    for quota in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        if Path(quota).exists():
            facts[quota] = Path(quota).read_text().strip()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        if names:
            facts["model"] = f"{names[0]} x {len(names)}"
    return facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="8", help="CPU threads, comma separated")
    parser.add_argument("--dtypes", default="q4_k/q6_k", help="expert dtypes (a/b: gate and up a, down b)")
    parser.add_argument("--slots", default="9,16", help="the cache's slots (at most n misses a side)")
    parser.add_argument("--seconds", type=float, default=0.4, help="per measured point")
    parser.add_argument("--torch-threads", default="",
                        help="torch's own intra-op threads, comma separated (each measured; default: as started): "
                             "the launching thread's team, beside the CPU kernel's")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("runtime.gpu.measure_bandwidth").setLevel(logging.DEBUG)
    for key, value in cpu_facts().items():
        print(f"{key}: {value}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # off CUDA: a dry run
    for spec in args.dtypes.split(","):
        dtype, _, down = spec.partition("/")
        bank = random_bank(dtype, 128, 2048, 768, layer=0, seed=0, num_distinct=8, down_dtype=down or None)
        if device.type == "cuda":
            HostPinner().pin_banks({0: bank})
        for threads, slots, torch_threads in itertools.product(
                [int(t) for t in args.threads.split(",")], [int(s) for s in args.slots.split(",")],
                [int(t) for t in args.torch_threads.split(",")] if args.torch_threads else [torch.get_num_threads()]):
            torch.set_num_threads(torch_threads)
            cpu = CPUExpertExecutor({0: bank}, torch.bfloat16, threads=threads)
            p = measure(bank, cpu, device, cpu_threads=threads, max_slots=slots, seconds=args.seconds)
            print(f"{spec} {threads} threads (torch {torch_threads}), {slots} slots: "
                  f"PCIe {p.pcie_alone_gbps:.1f} GB/s alone, {p.pcie_gbps:.1f} beside, +{p.pcie_fixed_ms:.3f} ms; "
                  f"CPU {p.cpu_alone_gbps:.1f} alone, {p.cpu_gbps:.1f} beside, +{p.cpu_fixed_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
