"""The llama.cpp race's harness (benchmarks/vs_llamacpp.py) on the CPU: the synthetic GGUF ft pulls,
ft's side measured on a tiny one, llama-bench's output parsed, the trace routing, and the report's
JSON, pairing, ratios and target checks. The race itself runs only on the GPU machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.race import llama, report
from benchmarks.race.ft_side import FtRun, TraceRouting, measure, trace_table
from benchmarks.race.report import Row
from benchmarks.race.synth_gguf import SHAPES, RaceShape, layers_that_fit, write_race_gguf
from benchmarks.race.vram import VramPeak
from ftpull.pull import pull
from registry import Store

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "bigmoeonedge" / "qwen3-30b-a3b.npz"
TINY = RaceShape("tiny-race", 4, 256, 4, 2, 64, 16, 4, 128, 1024, 4096)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("race")
    path = write_race_gguf(root / "tiny-race-2l-bf16.gguf", TINY, 2)
    store = Store(root / "ft")
    result = pull(str(path), store)
    return root / "ft", result.name.display


def test_the_synthetic_gguf_reads_as_its_shape(tmp_path: Path) -> None:
    import gguf

    path = write_race_gguf(tmp_path / "m.gguf", TINY, 2)
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["blk.1.ffn_gate_exps.weight"].shape.tolist() == [TINY.hidden, TINY.moe_inter, TINY.num_experts]
    assert tensors["blk.0.ffn_gate_exps.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert "blk.2.attn_q.weight" not in tensors
    assert abs(path.stat().st_size - TINY.file_bytes(2)) < 0.01 * TINY.file_bytes(2)
    tokens = [bytes(reader.fields["tokenizer.ggml.tokens"].parts[i]).decode()
              for i in reader.fields["tokenizer.ggml.tokens"].data]
    assert len(tokens) == TINY.vocab and tokens[-1] == "<|im_end|>"  # specials last: ids agree in both engines


def test_layers_that_fit_keeps_two_copies_on_the_disk() -> None:
    shape = SHAPES["qwen3-30b-a3b"]
    layers = layers_that_fit(shape, 64 << 30)
    assert 2 * shape.file_bytes(layers) <= 64 << 30 < 2 * shape.file_bytes(layers + 1)
    assert layers_that_fit(shape, 1 << 50) == shape.num_layers


def test_ft_side_measures_random_ids_on_the_cpu(pulled: tuple[Path, str]) -> None:
    store, name = pulled
    measured, info = measure(FtRun(store=store, model=name, device="cpu", vram_mib=None, threads=1, num_ctx=512,
                                   prompt_lengths=[32, 128, 4096], decode_tokens=8, decode_prompt=1, reps=2))
    kinds = [(m.kind, m.input, m.tokens) for m in measured]
    assert kinds == [("prompt", "random", 32), ("prompt", "random", 128), ("decode", "random", 8)]  # 4096 > num_ctx
    assert all(len(m.samples) == 2 and m.tok_s > 0 for m in measured)
    assert info["context"] == 512
    # the long prompts' run decodes nothing: no decode row (it had one of 0 tok/s)
    measured, _ = measure(FtRun(store=store, model=name, device="cpu", vram_mib=None, threads=1, num_ctx=512,
                                prompt_lengths=[64], decode_tokens=0, decode_prompt=1, reps=1))
    assert [(m.kind, m.tokens) for m in measured] == [("prompt", 64)]


def test_trace_routing_replays_the_trace_at_the_device_position() -> None:
    if not TRACE.exists():
        pytest.skip("no traces checkout beside this one")
    table = trace_table(TRACE, [0, 1, 2], 128, torch.device("cpu"))
    recorded = np.load(TRACE)["experts"]
    assert table.shape == (3, recorded.shape[0], recorded.shape[2])
    last = recorded.shape[1] - 1
    whole = next(t for t in range(1, len(recorded)) if (recorded[t, last] >= 0).all())
    assert table[2, whole].tolist() == recorded[whole, last].tolist()  # layers spread to the last
    assert int(table.min()) >= 0  # the recording's missing picks (-1) are filled
    seen = []

    def inner(layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        seen.append((layer, ids.tolist(), float(weights.sum())))
        return x

    position = torch.tensor([recorded.shape[0] + 5])  # past the end: the trace cycles
    routed = TraceRouting(inner, table, [0, 1, 2], position)
    routed(1, torch.zeros(1, 4), torch.zeros(1, 8, dtype=torch.long), torch.full((1, 8), 0.125))
    assert seen == [(1, [table[1, 5].tolist()], pytest.approx(1.0))]
    routed(1, torch.zeros(3, 4), torch.zeros(3, 8, dtype=torch.long), torch.full((3, 8), 0.125))  # prefill: as routed
    assert seen[-1][1] == [[0] * 8] * 3


def test_llama_bench_jsonl_is_parsed() -> None:
    lines = "\n".join([
        "main: some log line",
        json.dumps({"n_prompt": 512, "n_gen": 0, "avg_ts": 795.2, "samples_ts": [790.1, 800.3], "n_cpu_moe": 12}),
        json.dumps({"n_prompt": 0, "n_gen": 256, "avg_ts": 51.0, "samples_ts": [50.5, 51.5]}),
    ])
    assert llama.parse_jsonl(lines) == [llama.LlamaResult("prompt", 512, 795.2, (790.1, 800.3)),
                                        llama.LlamaResult("decode", 256, 51.0, (50.5, 51.5))]


def test_vram_peak_without_a_gpu_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("benchmarks.race.vram.shutil.which", lambda _: None)
    with VramPeak() as v:
        pass
    assert v.peak_mib is None


def _row(engine: str, setting: int, tok_s: float, *, kind: str = "decode", tokens: int = 256, input: str = "random",
         vram: int = 4000, samples: list[float] | None = None) -> Row:
    return Row("qwen3-30b-a3b", "bf16", 16, 6, setting, vram, engine, kind, input, tokens, tok_s, "2026-12-01", "abc",
               samples or [tok_s])


def test_report_pairs_ft_with_llamacpp_and_checks_the_targets(tmp_path: Path) -> None:
    rows = [
        _row("llama.cpp", 16, 40.0, vram=2375), _row("ft", 16, 100.0, vram=2370, samples=[95.0, 105.0]),
        _row("ft", 16, 150.0, input="trace", vram=2370),
        _row("llama.cpp", 8, 60.0, vram=11589), _row("ft", 8, 90.0, vram=11500),  # slower with more VRAM, 1.5x
        _row("llama.cpp", 8, 900.0, kind="prompt", tokens=512), _row("ft", 8, 1800.0, kind="prompt", tokens=512),
        _row("llama.cpp", 12, 50.0),  # ft failed there: unpaired
    ]
    path = tmp_path / "results" / "vs.json"
    report.save(path, report.merge([], rows))
    back = report.load(path)
    assert sorted(r.key() for r in back) == sorted(r.key() for r in rows)
    ratios = {(p.llama.setting, p.llama.kind): p.ratio for p in report.pairs(back)}
    assert ratios == {(16, "decode"): 2.5, (8, "decode"): 1.5, (8, "prompt"): 2.0, (12, "decode"): None}
    trace = next(p.ft_trace for p in report.pairs(back) if p.llama.setting == 16)
    assert trace is not None and trace.tok_s == 150.0
    checks = report.summary(back)
    assert checks["min_decode_ratio"] == 1.5 and checks["min_prompt_ratio"] == {512: 2.0}
    assert len(checks["unsteady"]) == 1 and "ncmoe16" in checks["unsteady"][0]  # ±5% is past 5% spread
    assert len(checks["slower_with_more_vram"]) == 1 and "11500 MiB 90.0 < 2370 MiB 100.0" in \
        checks["slower_with_more_vram"][0]
    text = report.table(back)
    assert "2.50x" in text and "2,375 / 2,370" in text
    md = report.table(back, markdown=True).splitlines()
    assert md[0].startswith("| shape |") and md[0].endswith("| measured |") and len(md) == 2 + 4
    assert all(line.count("|") == md[0].count("|") for line in md)


def test_a_measurement_of_nothing_has_no_spread() -> None:
    """Repetitions that all measured 0 tok/s (a run that failed its decode) are no division by 0."""
    row = _row("ft", 16, 0.0, samples=[0.0, 0.0])
    assert row.spread == 0.0 and report.summary([row])["unsteady"] == []


def test_merge_replaces_a_measurement_of_the_same_key() -> None:
    first = [_row("llama.cpp", 16, 40.0), _row("ft", 16, 100.0)]
    again = [_row("ft", 16, 120.0)]
    merged = report.merge(first, again)
    assert [r.tok_s for r in merged if r.engine == "ft"] == [120.0] and len(merged) == 2


def test_rounds_pool_each_measurements_repetitions() -> None:
    """--rounds: a measurement's repetitions from every round in one row, its figure their median,
    the highest VRAM peak kept; one round is left as it was."""
    first = [_row("llama.cpp", 16, 40.0, samples=[39.0, 41.0]), _row("ft", 16, 50.0, samples=[48.0, 52.0])]
    second = [_row("llama.cpp", 16, 44.0, samples=[43.0, 45.0]), _row("ft", 16, 30.0, vram=99999, samples=[29.0, 31.0])]
    pooled = {r.engine: r for r in report.pool([first, second])}
    assert pooled["llama.cpp"].samples == [39.0, 41.0, 43.0, 45.0] and pooled["llama.cpp"].tok_s == 42.0
    assert pooled["ft"].tok_s == 39.5 and pooled["ft"].vram_mib == 99999 and pooled["ft"].detail["rounds"] == 2
    assert report.pool([first]) == first


def test_the_synthetic_weights_route_random_ids_like_a_real_model(tmp_path: Path) -> None:
    """Plain Gaussian weights send every random id to nearly the same experts (the attention output
    swamps the embedding), which flatters a cache; the race's file is scaled to route as the real
    Qwen3-30B-A3B trace does (DESIGN.md §9)."""
    from benchmarks.race.ft_side import record_routing, routing_statistics
    from ftpull.run import load_for_chat

    shape = RaceShape("calib", 16, 2048, 32, 4, 128, 128, 8, 32, 2048)  # Qwen3-30B-A3B's attention and router; small experts
    measured = {}
    for label, scales in {"plain": {"embedding_scale": 1.0, "attention_scale": 1.0}, "race": {}}.items():
        path = write_race_gguf(tmp_path / f"{label}.gguf", shape, 16, **scales)  # 1.4 GB: one on disk at a time
        store = Store(tmp_path / label)
        name = pull(str(path), store).name.display
        path.unlink()
        _, chat, _ = load_for_chat(store, name, dtype=None, num_ctx=512, overrides={}, threads=1, device="cpu")
        routes = record_routing(chat.session.model, 16, 60, shape.vocab)
        measured[label] = routing_statistics(routes, shape.num_experts)
        del chat
        shutil.rmtree(tmp_path / label)
    real = routing_statistics(np.load(TRACE)["experts"].astype(int), 128) if TRACE.exists() else (0.37, 0.51)
    assert measured["plain"][0] > real[0] + 0.25  # collapsed
    assert abs(measured["race"][0] - real[0]) < 0.15 and abs(measured["race"][1] - real[1]) < 0.2, (measured, real)


def test_a_race_file_names_its_weights_and_layers(tmp_path: Path) -> None:
    from benchmarks.vs_llamacpp import file_dtype, file_layers, gguf_path

    bf16, quant = gguf_path(tmp_path, "qwen3-30b-a3b", 16), gguf_path(tmp_path, "qwen3-30b-a3b", 16, "Q4_K_M")
    assert (bf16.name, quant.name) == ("qwen3-30b-a3b-16l-bf16.gguf", "qwen3-30b-a3b-16l-q4_k_m.gguf")
    assert [(file_dtype(p), file_layers(p)) for p in (bf16, quant)] == [("bf16", 16), ("q4_k_m", 16)]


def test_quantize_leaves_no_file_that_looks_finished(tmp_path: Path) -> None:
    """llama-quantize writes through a temp name: a failed run leaves neither the file nor its part."""
    bench = tmp_path / "bin" / "llama-bench"
    bench.parent.mkdir()
    source, dest = tmp_path / "m-2l-bf16.gguf", tmp_path / "m-2l-q4_k_m.gguf"
    source.write_bytes(b"GGUF")
    with pytest.raises(FileNotFoundError, match="llama-quantize"):
        llama.quantize(bench, source, dest, "Q4_K_M", threads=2)
    tool = bench.parent / "llama-quantize"
    tool.write_text('#!/bin/sh\necho "$@" > "$2"\nexit 3\n')  # writes its output, then fails
    tool.chmod(0o755)
    with pytest.raises(RuntimeError, match="Q4_K_M failed"):
        llama.quantize(bench, source, dest, "Q4_K_M", threads=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", source.name]
    tool.write_text('#!/bin/sh\necho "$@" > "$2"\n')
    assert llama.quantize(bench, source, dest, "Q4_K_M", threads=2) == dest
    assert dest.read_text().split()[2:] == ["Q4_K_M", "2"] and not dest.with_name(f".{dest.name}.part").exists()


def test_llama_bench_runs_on_the_cpu_alone_without_a_setting(tmp_path: Path) -> None:
    """The CPU-only race gives llama-bench no GPU layers (-ngl 0, no -ncmoe); a GPU race its -ncmoe."""
    bench = tmp_path / "llama-bench"
    said = tmp_path / "args"
    line = ('{"n_prompt": 0, "n_gen": 8, "avg_ts": 10.0, "stddev_ts": 0.5, "samples_ts": [10.0]}')
    bench.write_text(f"#!/bin/sh\necho \"$@\" > {said}\necho '{line}'\n")
    bench.chmod(0o755)
    results, _ = llama.bench(bench, tmp_path / "m.gguf", ncmoe=None, threads=2, prompt=[], decode=8, reps=1)
    assert [(r.kind, r.tokens, r.tok_s) for r in results] == [("decode", 8, 10.0)]
    args = said.read_text().split()
    assert args[args.index("-ngl") + 1] == "0" and "-ncmoe" not in args
    llama.bench(bench, tmp_path / "m.gguf", ncmoe=16, threads=2, prompt=[512], decode=8, reps=1)
    args = said.read_text().split()
    assert (args[args.index("-ngl") + 1], args[args.index("-ncmoe") + 1]) == ("99", "16")
