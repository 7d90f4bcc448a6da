"""llama.cpp's side of the race: build llama-bench from ../shared/device/llamacpp and run it.

llama-bench feeds uniformly random token ids: `pp` tests prefill a prompt of that many, `tg`
tests decode that many tokens from an empty context (after a warm-up run). `-ncmoe N` keeps the
first N layers' experts in host memory, computed on the CPU: the static split its users tune.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .vram import VramPeak

SOURCE = Path(__file__).resolve().parents[3] / "shared" / "device" / "llamacpp"


def build(dest: Path, source: Path | None = None) -> Path:
    """Build llama-bench into `dest` (kept: a second call returns at once); its path."""
    binary = dest / "llama.cpp" / "build" / "bin" / "llama-bench"
    if binary.exists():
        return binary
    candidates = [source] if source else []
    candidates += [Path.cwd() / ".lcpp", SOURCE]
    script = next((c / "build.sh" for c in candidates if c and (c / "build.sh").exists()), None)
    if script is None:
        raise FileNotFoundError(f"no llama.cpp build.sh in {', '.join(map(str, candidates))}: copy "
                                "../shared/device/llamacpp to .lcpp and send it along")
    subprocess.run(["bash", str(script), str(dest)], check=True)
    if not binary.exists():
        raise FileNotFoundError(f"the build did not make {binary}")
    return binary


def quantize(binary: Path, source: Path, dest: Path, kind: str, threads: int, timeout_s: int = 900) -> Path:
    """`source` (a bf16 GGUF) quantized to `kind` (llama-quantize's name: Q4_K_M, Q8_0, ...) by the
    llama-quantize built beside `binary`, written to `dest` through a temp name (a killed run
    leaves no file that looks finished); kept where it exists."""
    if dest.exists():
        return dest
    tool = binary.parent / "llama-quantize"
    if not tool.exists():
        raise FileNotFoundError(f"no {tool}: the llama.cpp build script makes it beside llama-bench")
    tmp = dest.with_name(f".{dest.name}.part")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    done = subprocess.run([str(tool), str(source), str(tmp), kind, str(threads)], capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize {kind} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    os.replace(tmp, dest)
    return dest


@dataclass(frozen=True)
class LlamaResult:
    kind: str  # "decode" | "prompt"
    tokens: int
    tok_s: float
    samples: tuple[float, ...]


def parse_jsonl(text: str) -> list[LlamaResult]:
    """llama-bench's `-o jsonl` lines as results (a test is pp when n_gen is 0, else tg)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        decode = int(row.get("n_gen", 0)) > 0
        out.append(LlamaResult("decode" if decode else "prompt", int(row["n_gen"] if decode else row["n_prompt"]),
                               float(row["avg_ts"]), tuple(float(s) for s in row.get("samples_ts") or ())))
    return out


def bench(binary: Path, model: Path, *, ncmoe: int | None, threads: int, prompt: list[int], decode: int, reps: int,
          batch: int | None = None, ubatch: int | None = None, timeout_s: int = 600) -> tuple[list[LlamaResult], int | None]:
    """One llama-bench run (all its tests) under a VRAM sampler: (results, whole-process peak MiB).
    `ncmoe` None: no GPU at all (-ngl 0), the CPU-only race."""
    place = ["-ngl", "0"] if ncmoe is None else ["-ngl", "99", "-ncmoe", str(ncmoe)]
    cmd = [str(binary), "-m", str(model), *place, "-t", str(threads),
           "-p", ",".join(map(str, prompt)) if prompt else "0", "-n", str(decode), "-r", str(reps), "-o", "jsonl"]
    if batch:
        cmd += ["-b", str(batch)]
    if ubatch:
        cmd += ["-ub", str(ubatch)]
    env = {**os.environ, "LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    with VramPeak() as vram:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return [r for r in parse_jsonl(done.stdout) if r.tokens > 0], vram.peak_mib
