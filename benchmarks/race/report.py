"""The race's results: one JSON list of measurements (benchmarks/results/vs_llamacpp.json), the
table printed from it, and the table BENCHMARKS.md opens with.

A row is one measurement of one engine: `setting` is the llama.cpp `-ncmoe` whose VRAM both
engines got, `vram_mib` that engine's own measured whole-process peak. The ratios pair ft's
"random" rows (the same kind of input llama-bench feeds) with llama.cpp's of the same shape,
layers, threads, setting, kind and tokens; ft's "trace" rows are shown beside them, unpaired.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

KEY = ("shape", "dtype", "layers", "threads", "setting", "engine", "kind", "input", "tokens")


@dataclass(frozen=True)
class Row:
    shape: str
    dtype: str
    layers: int
    threads: int
    setting: int  # llama.cpp's -ncmoe whose VRAM both engines got
    vram_mib: int | None  # this engine's whole-process peak
    engine: str  # "ft" | "llama.cpp"
    kind: str  # "decode" | "prompt"
    input: str  # "random" | "trace"
    tokens: int  # decoded tokens, or the prompt's length
    tok_s: float
    date: str
    commit: str
    samples: list[float] = field(default_factory=list)  # each repetition's tok/s
    detail: dict[str, Any] = field(default_factory=dict)  # ft: budget, mode, cache slots, hit rate

    def key(self) -> tuple:
        return tuple(getattr(self, k) for k in KEY)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Row:
        names = {f.name for f in fields(Row)}
        return Row(**{k: v for k, v in d.items() if k in names})

    @property
    def spread(self) -> float:
        """(max - min) / median of the repetitions (0 with one, or with nothing measured)."""
        if len(self.samples) < 2:
            return 0.0
        s = sorted(self.samples)
        return (s[-1] - s[0]) / s[len(s) // 2] if s[len(s) // 2] > 0 else 0.0


def load(path: Path) -> list[Row]:
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path} is not a JSON list of measurements")
    return [Row.from_dict(d) for d in data]


def merge(old: Iterable[Row], new: Iterable[Row]) -> list[Row]:
    """`old` with every row of `new` in place of an old one of the same key."""
    rows = {r.key(): r for r in old}
    rows.update({r.key(): r for r in new})
    return sorted(rows.values(), key=lambda r: (r.shape, r.layers, r.threads, -r.setting, r.kind, r.tokens,
                                                r.engine != "llama.cpp", r.input))


def pool(rounds: list[list[Row]]) -> list[Row]:
    """One row a measurement from several rounds of it: every round's repetitions in `samples`, tok_s
    their median (a round's own figure where there was one round), the VRAM peak the highest, the
    detail the last round's with the rounds counted."""
    if len(rounds) == 1:
        return rounds[0]
    by_key: dict[tuple, list[Row]] = {}
    for row in (r for measured in rounds for r in measured):
        by_key.setdefault(row.key(), []).append(row)
    pooled = []
    for same in by_key.values():
        samples = [s for r in same for s in (r.samples or [r.tok_s])]
        peaks = [r.vram_mib for r in same if r.vram_mib is not None]
        pooled.append(replace(same[-1], tok_s=statistics.median(samples), samples=samples,
                              vram_mib=max(peaks) if peaks else None, detail={**same[-1].detail, "rounds": len(same)}))
    return pooled


def save(path: Path, rows: list[Row]) -> None:
    """Crash-safe: temp file, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    tmp.replace(path)


@dataclass(frozen=True)
class Pair:
    """llama.cpp's row and ft's of the same key but the engine, and ft's trace row where there is one."""

    llama: Row
    ft: Row | None
    ft_trace: Row | None

    @property
    def ratio(self) -> float | None:
        return self.ft.tok_s / self.llama.tok_s if self.ft and self.llama.tok_s > 0 else None


def pairs(rows: Iterable[Row]) -> list[Pair]:
    rows = list(rows)
    by_key = {r.key(): r for r in rows}
    out = []
    for r in rows:
        if r.engine != "llama.cpp":
            continue
        base = dict(zip(KEY, r.key(), strict=True))
        ft = by_key.get(tuple({**base, "engine": "ft", "input": "random"}[k] for k in KEY))
        trace = by_key.get(tuple({**base, "engine": "ft", "input": "trace"}[k] for k in KEY))
        out.append(Pair(r, ft, trace))
    return out


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _ts(r: Row | None) -> str:
    if r is None:
        return "-"
    spread = f" ±{50 * r.spread:.0f}%" if r.spread >= 0.02 else ""
    return f"{r.tok_s:,.1f}{spread}"


def table(rows: Iterable[Row], markdown: bool = False) -> str:
    """One line per paired measurement: setting, kind, tokens, VRAM of each, tok/s of each, ratio, and
    when (the date and ft's commit: a pair is measured in one call, so its rows share them)."""
    head = ["shape", "weights", "layers", "threads", "-ncmoe", "test", "VRAM MiB llama.cpp / ft", "llama.cpp tok/s",
            "ft tok/s", "ft / llama.cpp", "ft, trace routing", "measured"]
    lines = []
    # one file's rows together, from every expert in RAM (the largest -ncmoe) to the most in VRAM
    order = sorted(pairs(rows), key=lambda p: (p.llama.shape, p.llama.dtype, p.llama.layers, p.llama.threads,
                                                -p.llama.setting, p.llama.kind != "decode", p.llama.tokens))
    for p in order:
        r = p.llama
        test = ("tg" if r.kind == "decode" else "pp") + str(r.tokens)
        ratio = "-" if p.ratio is None else f"{p.ratio:.2f}x"
        lines.append([r.shape, r.dtype, str(r.layers), str(r.threads), str(r.setting), test,
                      f"{_mib(r.vram_mib)} / {_mib(p.ft.vram_mib if p.ft else None)}", _ts(r), _ts(p.ft), ratio,
                      _ts(p.ft_trace), f"{r.date} {p.ft.commit}" if p.ft else r.date])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)] if lines else [len(h) for h in head]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*line) for line in lines)])


def summary(rows: Iterable[Row]) -> dict[str, Any]:
    """The targets, checked: decode >= 2x and prompt >= 1.5x (512) / 3x (16k) llama.cpp; ft's decode
    never slower at more VRAM (3% noise) for one shape, layers and threads; repetitions within 5%."""
    rows = list(rows)
    ps = [p for p in pairs(rows) if p.ratio is not None]
    decode = [p.ratio for p in ps if p.llama.kind == "decode"]
    checks: dict[str, Any] = {
        "min_decode_ratio": min(decode) if decode else None,
        "min_prompt_ratio": {t: min(p.ratio for p in ps if p.llama.kind == "prompt" and p.llama.tokens == t)
                             for t in sorted({p.llama.tokens for p in ps if p.llama.kind == "prompt"})},
    }
    unsteady = [f"{r.shape} t{r.threads} ncmoe{r.setting} {r.kind}{r.tokens} {r.input}: ±{50 * r.spread:.0f}%"
                for r in rows if r.engine == "ft" and r.spread > 0.05]
    slower = []
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.engine == "ft" and r.kind == "decode":
            groups.setdefault((r.shape, r.dtype, r.layers, r.threads, r.input), []).append(r)
    for key, group in groups.items():
        group.sort(key=lambda r: r.vram_mib or 0)
        for smaller, larger in zip(group, group[1:], strict=False):
            if larger.tok_s < 0.97 * smaller.tok_s:
                slower.append(f"{key}: {larger.vram_mib} MiB {larger.tok_s:.1f} < {smaller.vram_mib} MiB "
                              f"{smaller.tok_s:.1f} tok/s")
    checks.update(unsteady=unsteady, slower_with_more_vram=slower)
    return checks
