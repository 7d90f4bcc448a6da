"""`ft list`, `show`, `rm`, `cp` and `verify`: the commands that read and manage the local store
(cli.py adds them to `ft`). As everywhere in the CLI, only these print; errors are raised for
cli.py's `main` to report.
"""

from __future__ import annotations

import contextlib
import json
import sys

import click

from ftw import FTWError
from registry import BadBlob, InvalidNameError, RegistryError, Store, parse_name
from runtime.loading.registered import open_model

from . import show as show_mod
from .modelfile import ModelfileError
from .progress import ProgressPrinter
from .resolve import ResolveError, resolve
from .verify_model import verify_model


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List local models."""
    store = Store.default()
    store.cleanup_stale()  # what killed processes left (a half-written manifest's temp file, ...)
    entries, skipped = store.scan_models()
    rows = [show_mod.list_row(store, e) for e in entries]
    if as_json:
        click.echo(json.dumps({"models": rows, "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped]}, indent=1))
        return
    click.echo(show_mod.format_table(rows))
    for s in skipped:
        click.echo(f"warning: skipped unreadable manifest {s.path}: {s.reason}", err=True)


@click.command("show")
@click.argument("name")
@click.option("--modelfile", is_flag=True, help="Print the Modelfile the model was built from.")
@click.option("--parameters", is_flag=True, help="Print the default parameters.")
@click.option("--template", is_flag=True, help="Print the chat template.")
@click.option("--license", "license_", is_flag=True, help="Print the license.")
@click.option("--system", is_flag=True, help="Print the system message.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show_cmd(name: str, modelfile: bool, parameters: bool, template: bool, license_: bool, system: bool,
             as_json: bool) -> None:
    """Show a model's architecture, size, template and recipe."""
    info = show_mod.describe(Store.default(), name)
    if as_json:
        click.echo(json.dumps(info, indent=1))
    elif modelfile:
        click.echo(info["modelfile"], nl=False)
    elif parameters:
        # as Ollama prints them: one line per value (a list, such as stop, is several), strings quoted
        click.echo("\n".join(f"{k:<30} {json.dumps(v, ensure_ascii=False) if isinstance(v, str) else v}"
                             for k, values in info["parameters"].items()
                             for v in (values if isinstance(values, list) else [values])))
    elif template:
        click.echo(info["template"] or "(no chat template)")
    elif license_:
        click.echo(info["license"] or "(no license recorded)")
    elif system:
        click.echo(info["system"] or "(no system message)")
    else:
        click.echo(show_mod.format_show(info))


UNLOAD_TIMEOUT_S = 10.0  # (a server that hangs does not hold up ft rm for long)


def _unload_from_server(names: tuple[str, ...]) -> None:
    """A running `ft serve` lets go of the models it holds among `names` before they are removed,
    as `ollama rm` frees them (its memory was otherwise held until the keep-alive ran out). Best
    effort, in a few seconds: the removal goes on whatever the server, or FT_HOST, says."""
    import http.client

    from . import client as client_mod  # (not serve.py: it brings torch, 2-3 s of `ft rm`)

    try:
        client = client_mod.Client(timeout_s=UNLOAD_TIMEOUT_S)
        if not client.running():
            return
        loaded = {m.get("name") for m in client.get("/api/ps").get("models", [])}
        for name in names:
            with contextlib.suppress(InvalidNameError):
                if parse_name(name).display in loaded:
                    client.post("/api/generate", {"model": name, "keep_alive": 0})
    except (client_mod.NoServer, client_mod.ServerReplyError, client_mod.ServerAddressError, http.client.HTTPException,
            OSError, ValueError, AttributeError) as e:
        click.echo(f"could not ask the running server to unload: {e}", err=True)


@click.command("rm")
@click.argument("names", nargs=-1, required=True)
def rm_cmd(names: tuple[str, ...]) -> None:
    """Remove models (and blobs no other model uses)."""
    store = Store.default()
    store.cleanup_stale()  # (a dead writer's temp file would also keep the model's directory from being pruned)
    _unload_from_server(names)
    held: set[str] = set()  # the removed models' blobs: what their removal should free
    for name in names:
        with contextlib.suppress(RegistryError):  # a damaged manifest is removed all the same
            held |= store.read_manifest(name).digests
        removed = store.remove(name)
        click.echo(f"deleted '{name}'" + (f" ({len(removed)} blobs freed)" if removed else ""))
    if pending := store.unreferenced_bytes(among=held):  # gc skips while a pull adds blobs
        click.echo(f"{show_mod.human_bytes(pending)} of data no model uses is freed when the pull in progress "
                   "ends (or by the next ft pull or ft rm)")


@click.command("cp")
@click.argument("src")
@click.argument("dst")
def cp_cmd(src: str, dst: str) -> None:
    """Copy a model to a new name (no data is duplicated)."""
    Store.default().copy(src, dst)
    click.echo(f"copied '{src}' to '{dst}'")


def refetch_hint(store: Store, name: str) -> str:
    """How to get a damaged model's files again: pull it by its name where a name pulls it,
    from its checkpoint where it came from a local one, else rebuild it as it was made."""
    try:
        source = open_model(store, name).config.get("source")
    except (RegistryError, FTWError, OSError, ValueError):  # the config itself may be the damaged file
        source = None
    local = isinstance(source, str) and source.startswith("/")
    if local and name.startswith("local/"):
        return f"run `ft rm {name}` and `ft pull {source}` (its checkpoint) again"
    try:
        pullable = not local and resolve(name) is not None
    except (ResolveError, InvalidNameError, ModelfileError):  # (a shipped model's name with a tag it lacks)
        pullable = False
    if pullable:
        return f"run `ft rm {name}` and `ft pull {name}` again"
    return (f"run `ft rm {name}` and make it again as it was made (`ft create {name} -f Modelfile`"
            + (f" from {source}" if local else "") + ", or `ft cp` from a model pulled again)")


@click.command("verify")
@click.argument("names", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify_cmd(names: tuple[str, ...], as_json: bool) -> None:
    """Re-hash every file of a model; names any missing, truncated or corrupt one, and any shard
    the FTW index and the manifest disagree about."""
    store = Store.default()
    report, failed = {}, False
    for name in names:
        with ProgressPrinter() as printer:
            bad = verify_model(store, name, progress=printer.bytes_callback(f"verifying {name}"))
        report[name] = [{"file": b.title, "problem": b.problem, "path": str(getattr(b, "path", "")), "detail": str(b)}
                        for b in bad]
        failed |= bool(bad)
        if not as_json:
            if bad:
                for b in bad:
                    click.echo(f"{name}: {b.title}: {b.problem} ({b.path})" if isinstance(b, BadBlob)
                               else f"{name}: {b}", err=True)
                click.echo(f"{name}: {len(bad)} bad file(s); {refetch_hint(store, name)}", err=True)
            else:
                click.echo(f"{name}: ok")
    if as_json:
        click.echo(json.dumps(report, indent=1))
    if failed:
        sys.exit(1)


COMMANDS = (list_cmd, show_cmd, rm_cmd, cp_cmd, verify_cmd)
