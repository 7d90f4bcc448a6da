"""ft against llama.cpp on the same GGUF file, the same VRAM, the same threads and the same kind of
tokens, side by side in one call on the GPU machine (issue: beat llama.cpp at every budget).

    # on the GPU machine, with .lcpp (../shared/device/llamacpp) and .whl sent along, and
    # FT_COMMIT=<this checkout's `git rev-parse --short HEAD`> set in the command:
    python3 benchmarks/vs_llamacpp.py all --work /tmp/race --settings 16,12,8 --threads 6,8 \\
        --trace .traces/qwen3-30b-a3b.npz --out $OUT/vs_llamacpp.json
    python3 benchmarks/vs_llamacpp.py report benchmarks/results/vs_llamacpp.json [--markdown]

Steps (each can be run alone; what exists is reused, so a warm machine resumes):
- `gguf`: a synthetic qwen3moe GGUF at a real model's shapes (race/synth_gguf.py), bf16, with as
  many layers as `--layers` or the disk allows;
- `quantize` (with `--quant Q4_K_M` or another llama-quantize type): that file quantized by
  llama.cpp's own llama-quantize, the file its users download; `pull` and `race` then use it;
- `pull`: `ft pull` of that file into `--work`/ft (FTW, verified, registered);
- `race`: for each llama.cpp `-ncmoe` setting and thread count: llama-bench's decode and 512-token
  prompt, its VRAM peak sampled; then ft in its own process at the same whole-process VRAM (the
  budget given to `ft run --vram-gib` is that peak less ft's own CUDA context, measured once),
  fed random ids (and, with --trace, a real trace's routing); long prompts (4k, 16k) likewise,
  at the first thread count, against llama-bench at `-b 16384 -ub 4096`;
- `report`: the table, the targets checked, and the Markdown table for BENCHMARKS.md.

`--device cpu` races without a GPU (a machine that has none, a user who runs none): llama-bench at
`-ngl 0` against `ft run --device cpu`, each at the same threads, the rows' setting 0; keep them in
their own `--out` file. On a machine whose speed drifts from minute to minute (the 2-core dev VM:
one engine's tg128 moved 15% between races a minute apart), `--rounds 5` alternates the engines
five times and pools each one's repetitions, so a drift reaches both.

Results go to `--out` (a JSON list, one object per measurement; race/report.py), merged with
what is there, so runs over several calls build one file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.race import report  # noqa: E402
from benchmarks.race.report import Row  # noqa: E402
from benchmarks.race.synth_gguf import SHAPES, layers_that_fit, write_race_gguf  # noqa: E402
from benchmarks.race.vram import VramPeak  # noqa: E402


def commit() -> str:
    """FT_COMMIT where the caller sets it (the GPU machine's copy of the tree has no history of its
    own to ask), else this checkout's HEAD, "+" where it has changes."""
    if os.environ.get("FT_COMMIT"):
        return os.environ["FT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() + ("+" if _dirty() else "")
    except (subprocess.SubprocessError, OSError):
        return os.environ.get("FT_COMMIT", "unknown")


def _dirty() -> bool:
    out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                         text=True).stdout
    return bool(out.strip())


def gguf_path(work: Path, shape: str, layers: int, dtype: str = "bf16") -> Path:
    return work / f"{shape}-{layers}l-{dtype.lower()}.gguf"


def file_dtype(gguf: Path) -> str:
    """The weight type a race file's name says (`{shape}-{layers}l-{dtype}.gguf`)."""
    return gguf.stem.rsplit("-", 1)[1]


def file_layers(gguf: Path) -> int:
    return int(gguf.stem.rsplit("-", 2)[1].rstrip("l"))


def step_quantize(args: argparse.Namespace, source: Path) -> Path:
    """The bf16 race file quantized by llama.cpp's llama-quantize (built first where it is not;
    neither where the quantized file exists)."""
    from benchmarks.race import llama

    dest = gguf_path(args.work, args.shape, file_layers(source), args.quant)
    if not dest.exists():
        binary = llama.build(Path(args.llama_build))
        start = time.perf_counter()
        llama.quantize(binary, source, dest, args.quant.upper(), threads=os.cpu_count() or 8)
        print(f"quantized {source.name} to {dest.name} ({dest.stat().st_size / 2**30:.1f} GiB) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return dest


def step_gguf(args: argparse.Namespace) -> Path:
    shape = SHAPES[args.shape]
    args.work.mkdir(parents=True, exist_ok=True)
    layers = args.layers or layers_that_fit(shape, shutil.disk_usage(args.work).free + _existing(args.work))
    path = gguf_path(args.work, args.shape, layers)
    if not path.exists():
        start = time.perf_counter()
        write_race_gguf(path, shape, layers, seed=args.seed)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.1f} GiB, {layers} layers) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
    return path


def _existing(work: Path) -> int:
    return sum(p.stat().st_size for p in work.glob("*.gguf"))


def model_name(gguf: Path) -> str:
    return f"local/{gguf.stem.lower()}"


def step_pull(args: argparse.Namespace, gguf: Path) -> str:
    store = args.work / "ft"
    env = {**os.environ, "FT_HOME": str(store)}
    name = model_name(gguf)
    listed = subprocess.run([sys.executable, "-m", "ftpull", "list"], env=env, capture_output=True, text=True).stdout
    if name.split("/", 1)[1] not in listed:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ftpull", "pull", str(gguf), "--force"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        print(f"pulled {name} in {time.perf_counter() - start:.0f} s", flush=True)
    return name


def cuda_context_mib() -> int:
    """What ft's process holds on the GPU before it plans anything: the CUDA context torch makes."""
    probe = "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize(); import time; time.sleep(0.5)"
    with VramPeak(every_s=0.05) as v:
        subprocess.run([sys.executable, "-c", probe], check=True)
    return v.peak_mib or 0


def run_ft(args: argparse.Namespace, name: str, *, vram_mib: int | None, threads: int, num_ctx: int,
           prompts: list[int], decode: int, trace: Path | None) -> tuple[list[dict], dict, int | None]:
    """ft's measurements in a child process (its VRAM peak its own): (measured, info, peak MiB)."""
    spec = {"store": str(args.work / "ft"), "model": name, "device": args.device, "vram_mib": vram_mib,
            "threads": threads, "num_ctx": num_ctx, "prompt_lengths": prompts, "decode_tokens": decode,
            "decode_prompt": 1, "reps": args.reps, "mode": args.mode, "trace": str(trace) if trace else None}
    with VramPeak() as v:
        try:
            done = subprocess.run([sys.executable, __file__, "ft-one", json.dumps(spec)], capture_output=True,
                                  text=True, timeout=args.ft_timeout)
        except subprocess.TimeoutExpired as e:  # what it said (its stacks, with --tracebacks-every) is kept
            said = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
            print(f"ft timed out after {args.ft_timeout} s at {vram_mib} MiB, {threads} threads:\n{said[-6000:]}",
                  flush=True)
            return [], {"error": f"timed out after {args.ft_timeout} s", "stderr_tail": said[-600:]}, v.peak_mib
    if done.returncode != 0:
        print(f"ft failed at {vram_mib} MiB, {threads} threads:\n{done.stderr[-3000:]}", flush=True)
        return [], {"error": done.stderr[-600:]}, v.peak_mib
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # what ft warned of (a step refused its graph, a plan short of VRAM) stays with its figures
    said = [line for line in done.stderr.splitlines() if line.strip() and "%|" not in line]
    if said:
        result["info"]["stderr_tail"] = said[-12:]
    return result["measured"], result["info"], v.peak_mib


def ft_one(spec_json: str) -> None:
    from benchmarks.race.ft_side import FtRun, measure

    if every := float(os.environ.get("FT_RACE_TRACEBACKS_S", "0")):  # a hang hunt: every thread's stack, on stderr
        import faulthandler

        faulthandler.dump_traceback_later(every, repeat=True)

    spec = json.loads(spec_json)
    spec["store"] = Path(spec["store"])
    spec["trace"] = Path(spec["trace"]) if spec.get("trace") else None
    measured, info = measure(FtRun(**spec))
    print(json.dumps({"measured": [asdict(m) for m in measured], "info": info}))


def step_race(args: argparse.Namespace, gguf: Path, name: str) -> None:
    from benchmarks.race import llama

    binary = llama.build(Path(args.llama_build))
    shape, layers = args.shape, file_layers(gguf)
    base = {"shape": shape, "dtype": file_dtype(gguf), "layers": layers, "date": time.strftime("%Y-%m-%d"), "commit": commit()}
    gpu = args.device == "gpu"  # else the CPU-only race: llama-bench -ngl 0 against ft --device cpu (setting 0)
    context = cuda_context_mib() if gpu else 0
    print(f"ft's CUDA context: {context} MiB", flush=True)
    rows: list[Row] = []

    def keep(new: list[Row]) -> None:
        rows.extend(new)
        report.save(args.out, report.merge(report.load(args.out), new))

    def ft_rows(measured: list[dict], info: dict, peak: int | None, threads: int, setting: int,
                budget: int | None) -> list[Row]:
        return [Row(**base, threads=threads, setting=setting, vram_mib=peak, engine="ft", kind=m["kind"],
                    input=m["input"], tokens=m["tokens"], tok_s=m["tok_s"], samples=m["samples"],
                    detail={"budget_mib": budget, **info, "hit_rate": m["stats"].get("hit_rate"),
                            "cpu_experts": m["stats"].get("cpu_experts"),
                            "pcie_experts": m["stats"].get("pcie_experts"),
                            **{k: m["stats"][k] for k in ("step_graphs", "guard") if k in m["stats"]}})
                for m in measured]

    long_prompts = [p for p in args.prompts if p > 512]
    done = {(r.setting, r.threads, r.engine) for r in report.load(args.out)
            if (r.shape, r.dtype, r.layers, r.kind, r.tokens) == (shape, base["dtype"], layers, "decode", args.decode)}
    for setting in args.settings:
        for i, threads in enumerate(args.threads):
            if {(setting, threads, "ft"), (setting, threads, "llama.cpp")} <= done:  # a resumed race
                print(f"-ncmoe {setting}, {threads} threads: measured already ({args.out})", flush=True)
                continue
            rounds: list[list[Row]] = []
            for _ in range(args.rounds):  # each round both engines, one after the other: a drift reaches both
                results, peak = llama.bench(binary, gguf, ncmoe=setting if gpu else None, threads=threads,
                                            prompt=[512], decode=args.decode, reps=args.reps)
                budget = (peak or 0) - context if gpu else None
                measured, info, ft_peak = run_ft(args, name, vram_mib=budget, threads=threads, num_ctx=1024,
                                                 prompts=[512], decode=args.decode, trace=args.trace)
                rounds.append([Row(**base, threads=threads, setting=setting, vram_mib=peak, engine="llama.cpp",
                                   kind=r.kind, input="random", tokens=r.tokens, tok_s=r.tok_s, samples=list(r.samples))
                               for r in results] + ft_rows(measured, info, ft_peak, threads, setting, budget))
            keep(report.pool(rounds))
            print(report.table(rows), flush=True)
            if i == 0 and long_prompts:
                results, peak = llama.bench(binary, gguf, ncmoe=setting if gpu else None, threads=threads, prompt=long_prompts,
                                            decode=0, reps=1, batch=max(long_prompts), ubatch=4096)
                keep([Row(**base, threads=threads, setting=setting, vram_mib=peak, engine="llama.cpp",
                          kind=r.kind, input="random", tokens=r.tokens, tok_s=r.tok_s, samples=list(r.samples))
                      for r in results])
                budget = (peak or 0) - context if gpu else None
                measured, info, ft_peak = run_ft(args, name, vram_mib=budget, threads=threads,
                                                 num_ctx=max(long_prompts) + 64, prompts=long_prompts, decode=0,
                                                 trace=None)
                keep(ft_rows(measured, info, ft_peak, threads, setting, budget))
    print(report.table(rows), flush=True)
    print(json.dumps(report.summary(rows), indent=1), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["gguf", "quantize", "pull", "race", "all", "report", "ft-one"])
    parser.add_argument("arg", nargs="?", help="report: the results file; ft-one: its JSON spec")
    parser.add_argument("--work", type=Path, default=Path("/tmp/race"))
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=0, help="0: as many as the disk holds twice")
    parser.add_argument("--settings", default="16,12,8", help="llama.cpp -ncmoe values")
    parser.add_argument("--threads", default="6,8")
    parser.add_argument("--decode", type=int, default=256)
    parser.add_argument("--prompts", default="512,4096,16384")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1,
                        help="decode and 512-token prompt: this many rounds of llama.cpp then ft, their repetitions "
                             "pooled (each figure the median of all): on a machine whose speed drifts (a shared VM)")
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"),
                        help="cpu: the CPU-only race (llama-bench -ngl 0, ft --device cpu; --settings 0)")
    parser.add_argument("--trace", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tracebacks-every", type=float, default=0,
                        help="seconds: ft's side prints every thread's stack this often (a hang hunt)")
    parser.add_argument("--fill-pricing", choices=("hit_rate", "worth"),
                        help="what ft's auto charges a CPU-served miss (FT_FILL_PRICING; default: ft's own)")
    parser.add_argument("--quant", help="race llama-quantize's file of this type (Q4_K_M, Q8_0, ...), not the bf16 one")
    parser.add_argument("--llama-build", default="/tmp/lcpp")
    parser.add_argument("--ft-timeout", type=int, default=400)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_llamacpp.json")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.step == "ft-one":
        return ft_one(args.arg)
    if args.step == "report":
        rows = report.load(Path(args.arg) if args.arg else args.out)
        print(report.table(rows, markdown=args.markdown))
        print(json.dumps(report.summary(rows), indent=1))
        return
    if args.fill_pricing:  # ft's side runs in child processes, which read it from the environment
        os.environ["FT_FILL_PRICING"] = args.fill_pricing
    if args.tracebacks_every:
        os.environ["FT_RACE_TRACEBACKS_S"] = str(args.tracebacks_every)
    args.settings = [int(s) for s in args.settings.split(",")]
    args.threads = [int(t) for t in args.threads.split(",")]
    args.prompts = [int(p) for p in args.prompts.split(",")]
    if args.trace is not None:  # ft's side runs in a child process: hand it a path that cannot depend on the cwd
        if not args.trace.is_file():
            parser.error(f"--trace {args.trace}: no such file (on the GPU machine, carry the traces along)")
        args.trace = args.trace.resolve()
    gguf = step_gguf(args)
    if args.step == "gguf":
        return
    if args.quant:
        gguf = step_quantize(args, gguf)
    if args.step == "quantize":
        return
    name = step_pull(args, gguf)
    if args.step in ("race", "all"):
        step_race(args, gguf, name)


if __name__ == "__main__":
    main()
