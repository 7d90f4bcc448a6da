"""CPU decode of a K-quant GGUF against its bf16 twin: the same synthetic qwen3moe model (the race's
writer, benchmarks/race/synth_gguf.py) once with bf16 experts and once with the experts
requantized to Q4_K (or Q4_K_M: Q4_K gate and up, Q6_K down; or Q6_K), every other tensor the
same bf16 bytes. Both are pulled into a scratch store, loaded the way `ft run --device cpu` loads
them, and decode random ids (as llama-bench feeds), so the difference is the expert kernel's:
bf16 rows streamed as floats, or K-quant rows multiplied in place with Q8_K activations.

Prints tok/s of each and their ratio, the time per token spent in the routed experts (the
executor's calls) and the GB/s that makes of the expert bytes a token reads, and what a token
reads in all (expert and dense bytes), whose ratio is what a purely bandwidth-bound decode gains.
`--dense` adds a third file: the twin with its attention and output head quantized as
llama-quantize's Q4_K_M does (q, k, o Q4_K; v and the head Q6_K), which ft keeps as blocks and
multiplies in place (runtime/layers/block_weight.py) where it used to widen them to bf16.

    PYTHONPATH=. python benchmarks/bench_gguf_decode.py --threads 1,2
    PYTHONPATH=. python benchmarks/bench_gguf_decode.py --quant q4_k_m --layers 8 --experts 128
    PYTHONPATH=. python benchmarks/bench_gguf_decode.py --quant q4_k_m --dense --threads 1,2
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from benchmarks.race.synth_gguf import RaceShape, write_race_gguf
from ftpull.pull import pull
from ftpull.run import load_for_chat
from registry import Store
from runtime.experts.synthetic import quantize_kquant

Q = gguf.GGMLQuantizationType
QUANTS = {"q4_k": (Q.Q4_K, Q.Q4_K, Q.Q4_K), "q4_k_m": (Q.Q4_K, Q.Q4_K, Q.Q6_K),
          "q6_k": (Q.Q6_K, Q.Q6_K, Q.Q6_K)}
EXPERT_TENSOR = re.compile(r"blk\.\d+\.ffn_(gate|up|down)_exps\.weight")
Q4_K_M_DENSE = {"attn_q": Q.Q4_K, "attn_k": Q.Q4_K, "attn_output": Q.Q4_K, "attn_v": Q.Q6_K}  # and output: Q6_K
DENSE_TENSOR = re.compile(r"blk\.\d+\.(attn_q|attn_k|attn_v|attn_output)\.weight|output\.weight")


def requantized(src: Path, out: Path, types: tuple[Q, Q, Q], dense: bool = False) -> Path:
    """`src` with its bf16 expert tensors as (gate, up, down) K-quants, and with `dense` its
    attention projections and output head as Q4_K_M's; metadata and every other tensor copied
    as they are."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(out, str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
    for t in reader.tensors:
        match, dense_match = EXPERT_TENSOR.fullmatch(t.name), DENSE_TENSOR.fullmatch(t.name) if dense else None
        if match is None and dense_match is None:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        if dense_match is not None:
            qtype = Q4_K_M_DENSE.get(dense_match.group(1) or "", Q.Q6_K)
        else:
            qtype = types[("gate", "up", "down").index(match.group(1))]
        values = torch.from_numpy(np.array(t.data)).view(torch.bfloat16).float().numpy()  # [E, rows, cols]
        blocks = quantize_kquant(values.reshape(-1, values.shape[-1]), qtype.name.lower())
        writer.add_tensor(t.name, blocks.reshape(*values.shape[:-1], -1), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def token_bytes(shape: RaceShape, layers: int, types: tuple[Q, Q, Q] | None,
                dense_quantized: bool = False) -> tuple[float, float]:
    """(expert, dense) MB one decode token reads: top-k experts per layer; attention, router and head."""
    h, i = shape.hidden, shape.moe_inter

    def matrix(rows: int, qtype: Q | None) -> float:  # bytes of a [rows, h] weight
        return rows * h * 2 if qtype is None else rows * h / 256 * gguf.constants.GGML_QUANT_SIZES[qtype][1]

    if types is None:
        expert = 3 * h * i * 2
    else:
        expert = sum(h * i // 256 * gguf.constants.GGML_QUANT_SIZES[q][1] for q in types)
    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    quant = Q4_K_M_DENSE if dense_quantized else {}
    attention = (matrix(q_rows, quant.get("attn_q")) + matrix(kv_rows, quant.get("attn_k"))
                 + matrix(kv_rows, quant.get("attn_v")) + matrix(q_rows, quant.get("attn_output")))
    dense = layers * (attention + shape.num_experts * h * 4) + matrix(shape.vocab, Q.Q6_K if dense_quantized else None)
    return layers * shape.top_k * expert / 1e6, dense / 1e6


def decode(store: Path, name: str, threads: int, tokens: int, reps: int) -> tuple[list[float], list[float]]:
    """(seconds per token, of which in the routed experts) for each repetition: `tokens` random
    ids decoded after a one-token prompt, greedy picks taken and thrown away."""
    loaded, chat, _ = load_for_chat(Store(store), name, dtype=None, num_ctx=tokens + 16, overrides={},
                                    threads=threads, device="cpu", vram_gib=None, mode="auto")
    session = chat.session
    model = session.model
    in_experts = [0.0]

    def timed(inner: Any) -> Any:
        def call(layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
            start = time.perf_counter()
            out = inner(layer, x, ids, weights)
            in_experts[0] += time.perf_counter() - start
            return out
        return call

    for block in model.blocks:
        if hasattr(block.ffn, "executor"):
            block.ffn.executor = timed(block.ffn.executor)
    gen = torch.Generator().manual_seed(0)
    per_token, experts = [], []
    with torch.inference_mode():
        for rep in range(reps + 1):  # the first: a warm-up
            session.reset()
            model.forward(torch.tensor([1]), session.state)
            ids = torch.randint(0, loaded.config.vocab_size, (tokens,), generator=gen).tolist()
            in_experts[0] = 0.0
            start = time.perf_counter()
            for token in ids:
                model.forward(torch.tensor([token]), session.state)[-1].float().argmax()
            if rep:
                per_token.append((time.perf_counter() - start) / tokens)
                experts.append(in_experts[0] / tokens)
    return per_token, experts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quant", default="q4_k", choices=sorted(QUANTS), help="the twin's expert types")
    parser.add_argument("--threads", default="1,2", help="CPU threads, comma separated")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--moe-inter", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=64, help="decode tokens per repetition")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--work", type=Path, default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--dense", action="store_true",
                        help="also a twin with Q4_K_M's attention and head (kept as blocks by ft)")
    args = parser.parse_args(argv)

    shape = RaceShape(f"bench-{args.hidden}", args.layers, args.hidden, 8, 2, 128, args.experts, args.top_k,
                      args.moe_inter, args.vocab, 4096)
    types = QUANTS[args.quant]
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        work = Path(tmp)
        bf16 = write_race_gguf(work / "bench-bf16.gguf", shape, args.layers)
        files = [("bf16", bf16), (args.quant, requantized(bf16, work / f"bench-{args.quant}.gguf", types))]
        if args.dense:
            files.append((f"{args.quant}+dense", requantized(bf16, work / f"bench-{args.quant}-dense.gguf", types, True)))
        store = Store(work / "ft")
        names = {label: str(pull(str(path), store).name) for label, path in files}
        print(f"# qwen3moe {args.layers} layers, H={shape.hidden}, {shape.num_experts} experts of I={shape.moe_inter}, "
              f"top-{shape.top_k}, vocab {shape.vocab}; dense tensors bf16 but in +dense; {args.tokens} tokens x {args.reps}")
        expert_mb = {}
        for label, _ in files:
            expert_mb[label], dense_mb = token_bytes(shape, args.layers, None if label == "bf16" else types,
                                                     dense_quantized=label.endswith("+dense"))
            print(f"# {label}: a token reads {expert_mb[label]:.1f} MB of experts and {dense_mb:.1f} MB of dense weights")
        print("# tok/s median (best); experts: ms per token in the routed experts, median, and GB/s of their bytes")
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            tok_s, expert_ms = {}, {}
            for label, name in names.items():
                per_token, experts = decode(work / "ft", name, threads, args.tokens, args.reps)
                tok_s[label] = (1 / statistics.median(per_token), 1 / min(per_token))
                expert_ms[label] = statistics.median(experts) * 1e3
            line = [f"{threads} thread(s):"]
            for label in names:
                gbps = expert_mb[label] / expert_ms[label]
                line.append(f"{label} {tok_s[label][0]:6.1f} tok/s ({tok_s[label][1]:.1f}), experts "
                            f"{expert_ms[label]:5.2f} ms ({gbps:4.1f} GB/s);")
            (b, b_best), (q, q_best) = tok_s["bf16"], tok_s[args.quant]
            line.append(f"{q / b:.2f}x ({q_best / b_best:.2f}x), experts {expert_ms['bf16'] / expert_ms[args.quant]:.2f}x")
            if args.dense:
                d, d_best = tok_s[f"{args.quant}+dense"]
                line.append(f"+dense {d / q:.2f}x ({d_best / q_best:.2f}x) the experts-only twin's")
            print(" ".join(line))


if __name__ == "__main__":
    main()
