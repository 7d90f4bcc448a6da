"""Rendering an `ft bench` report: the text table and the JSON-safe form."""

from __future__ import annotations

import math
import statistics
from typing import Any

from ..planner.plan import size


def format_report(report: dict[str, Any]) -> str:
    sh, m, c, rt, pr = report["shape"], report["machine"], report["cache"], report["routing"], report["profile"]
    lines = [
        f"ft bench: {sh['name']} ({sh['moe_layers_built']} MoE layers built of {len(sh['moe_layers']) if 'moe_layers' in sh else sh['num_layers']}, "
        f"{sh['num_experts']} experts, top-{sh['top_k_used']}, hidden {sh['hidden']}, moe_inter {sh['moe_inter']}, "
        f"{sh['dtype']}, {size(sh['expert_bytes'])}/expert); {m['accelerator']} ({m['device']}), {m['threads']} CPU threads",
        f"cache: {c['cache_slots']} slots ({c['source']}) = {size(c['cache_slots'] * c['slot_bytes'])}; one token needs "
        f"{c['min_slots']}; pool {size(c['pool_bytes'])}",
    ]
    if c.get("host_banks", sh["moe_layers_built"]) < sh["moe_layers_built"]:
        lines[-1] += (f" ({size(c['host_bytes'])} in host RAM: {c['host_banks']} banks shared by the "
                      f"{sh['moe_layers_built']} layers)")
    if c.get("source") == "fit planner":
        lines.append(f"  budget {size(c['budget_bytes'])} = dense {size(c['dense_bytes'])} + workspace "
                     f"{size(c['workspace_bytes'])} + KV {size(c['kv_bytes'])} ({c['context']} tokens) + cache "
                     f"{size(c['cache_bytes'])} ({c['planned_slots']} slots for the whole model)")
        lines += [f"  planner: {p}" for p in c.get("problems", [])]
    stat = (f"reuse {100 * rt['reuse']:.1f}%, top-10% share {100 * rt['top_share']:.1f}%" if "reuse" in rt else "")
    lines.append(f"routing: {rt['source']}; {rt['tokens']} decode tokens; {stat}")
    lines.append(f"profile: PCIe {pr['pcie_gbps']:.1f} GB/s (alone {pr['pcie_alone_gbps']:.1f}), CPU {pr['cpu_gbps']:.1f} "
                 f"GB/s (alone {pr['cpu_alone_gbps']:.1f}), fixed {pr['pcie_fixed_ms']:.3f}/{pr['cpu_fixed_ms']:.3f} ms "
                 f"[{pr['source']}]; device memory {report['hbm_gbps']:.0f} GB/s")
    ce = report["ceilings"]
    lines.append(f"ceilings (the roofline's): PCIe {ce['pcie_gbps']:.1f} GB/s (pinned copies of expert records), "
                 f"host memory read {ce['host_read_gbps']:.1f} GB/s; 'runtime' = the roofline of the profile's rates")
    repeat = report["config"].get("pcie_repeat", 1)
    if repeat > 1:
        lines.append(f"link: emulated at 1/{repeat} of this host's PCIe (every copy over it made {repeat} times; the "
                     "profile and roofline above are of the emulated link)")
    lines.append(f"scope: {report['scope']}")
    lines.append("")
    lines.append(f"{'policy':<18} {'tok/s':>8} {'roofline':>9} {'frac':>6} {'runtime':>8} {'serial':>8} {'hit':>6} {'miss':>6} "
                 f"{'PCIe MB/t':>10} {'CPU MB/t':>9}  resident")
    for policy, r in report["policies"].items():
        if "error" in r:
            lines.append(f"{policy:<18} refused: {r['error']}")
            continue
        roof = f"{r['roofline_tok_s']:.1f}" if r["roofline_tok_s"] else "inf"
        frac = f"{r['fraction_of_roofline']:.2f}" if r["fraction_of_roofline"] else "-"
        runtime = f"{r['fraction_of_runtime_roofline']:.2f}" if r.get("fraction_of_runtime_roofline") else "-"
        serial = f"{r['serial_roofline_tok_s']:.1f}" if r.get("serial_roofline_tok_s") else "inf"
        lines.append(f"{policy:<18} {r['decode_tok_s']:>8.2f} {roof:>9} {frac:>6} {runtime:>8} {serial:>8} "
                     f"{100 * r['hit_rate']:>5.1f}% "
                     f"{100 * r['miss_rate']:>5.1f}% {r['pcie_mb_per_token']:>10.1f} {r['cpu_mb_per_token']:>9.1f}  "
                     f"{r['resident_layers'] or ''}")
    steps = {policy: r for policy, r in report["policies"].items() if r.get("steps_ms") and r.get("host_queue_ms")}
    if steps:  # a step's wall time, and the host's part before the device can start it
        lines.append("median step ms (host's part), per run: " + "; ".join(
            f"{policy} " + ", ".join(f"{statistics.median(ms):.2f} ({host:.2f})"
                                     for ms, host in zip(r["steps_ms"], r["host_queue_ms"], strict=True))
            for policy, r in steps.items()))
    for policy, r in report["policies"].items():
        if r.get("guard"):
            lines.append(f"{policy}'s guard, per run: " + "; ".join(_guard_run(g) for g in r["guard"]))
    if report["prefill"]:
        lines.append("")
        lines.append(f"{'prefill tokens':<15} {'buffers':>7} {'tok/s':>10} {'GB/s streamed':>14} {'TTFT est. s':>12}")
        for p in report["prefill"]:
            if "error" in p:
                lines.append(f"{p['tokens']:<15} {p['buffers']:>7} failed: {p['error'][:100]}")
                continue
            ttft = f"{p['ttft_s_estimate']:.3f}" if "ttft_s_estimate" in p else "-"
            lines.append(f"{p['tokens']:<15} {p['buffers']:>7} {p['tok_s']:>10.1f} {p['streamed_gb_s']:>14.1f} {ttft:>12}")
    for policy, r in report["policies"].items():
        if r.get("host_profile"):
            lines.append("")
            lines.append(f"{policy}: host profile per layer call ({'op':<40} count   host us  device us)")
            for row in r["host_profile"]:
                lines.append(f"  {row['op'][:58]:<58} {row['count_per_call']:>5.1f} {row['host_us_per_call']:>9.1f} "
                             f"{row['device_us_per_call']:>10.1f}")
    check = report.get("policy_check")
    if not check and not report["machine"]["device"].startswith("cuda") and len(report["policies"]) > 1:
        lines.append("")
        lines.append("policy check: only with --device cuda (on the CPU the cache's PCIe fills are memory copies)")
    if check:
        verdict = "OK" if check["ok"] else "FAIL"
        lines.append("")
        lines.append(f"policy check: {verdict}: auto {check['auto_tok_s']:.2f} tok/s vs best fixed {check['best_fixed']} "
                     f"{check['best_fixed_tok_s']:.2f} (noise {100 * check['noise']:.0f}%)")
    return "\n".join(lines)


def _guard_run(g: dict[str, Any]) -> str:
    steps = g["steps"]
    medians = ", ".join(f"{arm} {ms:.2f}" for arm, ms in g["median_ms"].items())
    idle = ", model arm idle" if g.get("model_idle") else ""
    totals = ", ".join(f"{arm} {ms:.0f}" for arm, ms in g.get("total_ms", {}).items())
    slowest = ", ".join(f"#{x['step']} {x['arm']} {x['ms']:.1f}" for x in g.get("slowest", []))
    spent = f"; total ms: {totals}; slowest steps: {slowest}" if totals else ""
    return (f"model arm {steps['model']}/{sum(steps.values())} steps, picks {g['best']} (median ms: {medians}"
            f"{idle}{spent})")


def json_ready(report: dict[str, Any]) -> dict[str, Any]:
    return replace_inf(report)


def replace_inf(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: replace_inf(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [replace_inf(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x




def main(argv: list[str] | None = None) -> int:
    """The text report of saved `ft bench --json` runs (benchmarks/gpu_batch.sh calls it)."""
    import json
    import sys

    paths = sys.argv[1:] if argv is None else argv
    for path in paths:
        with open(path, encoding="utf-8") as f:
            print(format_report(json.load(f)))
    return 0

