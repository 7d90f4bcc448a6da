"""What `ft list` and `ft show` print: plain data first (also the --json output), then text."""

from __future__ import annotations

import time
from typing import Any

from registry import Store
from registry.listing import ModelEntry
from runtime.loading.registered import MEDIA_FTW_SHARD, MEDIA_TEMPLATE, open_model

from .modelfile import parse_modelfile


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def human_count(n: int | None) -> str:
    if not n:
        return "?"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return str(n)


def human_age(seconds_ago: float) -> str:
    for div, unit in ((86400 * 365, "year"), (86400 * 30, "month"), (86400 * 7, "week"), (86400, "day"),
                      (3600, "hour"), (60, "minute")):
        if seconds_ago >= div:
            k = int(seconds_ago // div)
            return f"{k} {unit}{'s' if k > 1 else ''} ago"
    return "just now"


def list_row(store: Store, entry: ModelEntry) -> dict[str, Any]:
    config = open_model(store, entry.name).config
    return {
        "name": entry.name.display,
        "id": entry.manifest.digest_hex[:12],  # Ollama's ID: the manifest digest's first 12 hex digits
        "size": entry.manifest.total_size,
        "family": config.get("family"),
        "dtype": config.get("dtype"),
        "parameters": config.get("num_params_total"),
        "modified": entry.modified_time,
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("NAME", "ID", "SIZE", "FAMILY", "DTYPE", "MODIFIED")
    now = time.time()
    table = [header] + [
        (r["name"], r["id"], human_bytes(r["size"]), r["family"] or "?", r["dtype"] or "?", human_age(now - r["modified"]))
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    return "\n".join("    ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)


def describe(store: Store, name: str) -> dict[str, Any]:
    """Everything `ft show` knows about a model, as plain data."""
    model = open_model(store, name)
    c = model.config
    template = model.text("template.jinja")
    if template is None and model.file("tokenizer_config.json"):
        import json

        try:
            tok = json.loads(model.text("tokenizer_config.json") or "{}")
        except (ValueError, RecursionError):
            tok = None  # not ours to judge here: loading the model says what is wrong
        template = tok.get("chat_template") if isinstance(tok, dict) and isinstance(tok.get("chat_template"), str) else None
    if template is None:
        template = model.text("chat_template.jinja")
    return {
        "name": model.name.display,
        "family": c.get("family"),
        "model_type": c.get("model_type"),
        "parameters_total": c.get("num_params_total"),
        "parameters_active": c.get("num_params_active"),
        "num_experts": c.get("num_experts"),
        "num_experts_per_tok": c.get("num_experts_per_tok"),
        "num_shared_experts": c.get("num_shared_experts"),
        "num_layers": c.get("num_layers"),
        "hidden_size": c.get("hidden_size"),
        "context_length": c.get("context_length"),
        "dtype": c.get("dtype"),
        "source": c.get("source"),
        "revision": c.get("revision"),
        "description": c.get("description"),
        "size": model.manifest.total_size,
        "num_shards": sum(1 for d in model.manifest.layers if d.media_type == MEDIA_FTW_SHARD),
        "custom_template": any(d.media_type == MEDIA_TEMPLATE for d in model.manifest.layers),
        "template": template,
        "parameters": c.get("parameters") or {},
        "system": c.get("system"),
        "license": c.get("license") or model.text("LICENSE") or _license_from_modelfile(model.text("Modelfile") or ""),
        "modelfile": model.text("Modelfile") or "",
    }


def _license_from_modelfile(text: str) -> str | None:
    """The LICENSE of a stored Modelfile (models pulled before the summary kept it), as the
    Modelfile parser reads it: quoted and \"\"\" blocks, and only the LICENSE instruction."""
    try:
        return parse_modelfile(text, name="stored").recipe().license
    except ValueError:  # (ModelfileError among them)
        return None


def format_show(info: dict[str, Any]) -> str:
    experts = f"{info['num_experts']} routed, {info['num_experts_per_tok']} active"
    if info["num_shared_experts"]:
        experts += f", {info['num_shared_experts']} shared"
    rows = [
        ("architecture", f"{info['family']} ({info['model_type']})"),
        ("parameters", f"{human_count(info['parameters_total'])} total, {human_count(info['parameters_active'])} active"),
        ("experts", experts),
        ("layers", str(info["num_layers"])),
        ("embedding length", str(info["hidden_size"])),
        ("context length", str(info["context_length"])),
        ("dtype", str(info["dtype"])),
        ("size", f"{human_bytes(info['size'])} in {info['num_shards']} shard(s)"),
        ("source", str(info["source"]) + (f" @ {info['revision'][:12]}" if info.get("revision") else "")),
    ]
    out = [f"  {info['name']}"] + ([f"    {info['description']}"] if info.get("description") else []) + ["", "  Model"]
    out += [f"    {k:<20}{v}" for k, v in rows]
    if info["parameters"]:
        out += ["", "  Parameters"]
        for k, v in info["parameters"].items():
            for value in v if isinstance(v, list) else [v]:
                out.append(f"    {k:<20}{value!r}" if isinstance(value, str) else f"    {k:<20}{value}")
    if info.get("system"):
        out += ["", "  System"] + [f"    {line}" for line in info["system"].strip().splitlines()]
    template = info["template"]
    out += ["", "  Template", "    " + ("custom (ft show --template)" if info["custom_template"]
                                     else "from the checkpoint's tokenizer_config.json" if template else "none")]
    if info["license"]:
        first = info["license"].strip().splitlines()[0]
        out += ["", "  License", f"    {first}"]
    return "\n".join(out)
