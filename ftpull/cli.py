"""`ft` and `ftpull`: the command line. A thin layer: parse, call the library, print.

Only this module prints; everything below it raises typed errors whose messages say what went
wrong and how to fix it, and `main` turns those into one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from ftw import FTWError
from registry import RegistryError, Store

from . import show as show_mod
from .hub import HubError
from .modelfile import ModelfileError
from .preflight import FitError
from .progress import ProgressPrinter
from .pull import PullError, create, pull
from .resolve import ResolveError

USER_ERRORS = (RegistryError, FTWError, HubError, FitError, PullError, ResolveError, ModelfileError)


def _store() -> Store:
    return Store.default()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log what happens underneath.")
def cli(verbose: bool) -> None:
    """ft: pull, convert and run Mixture-of-Experts models on one PC."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


@cli.command("pull")
@click.argument("names", nargs=-1, required=True)
@click.option("--force", is_flag=True, help="Pull even if the fit check says it will not fit.")
def pull_cmd(names: tuple[str, ...], force: bool) -> None:
    """Pull models: a shipped name (qwen3.6-35b:fp8), hf://org/repo[@rev], or a local checkpoint dir."""
    store = _store()
    for name in names:
        with ProgressPrinter() as printer:
            result = pull(name, store, force=force, report=printer)
        if not result.already_present:
            click.echo(f"pulled {result.name.display} ({show_mod.human_bytes(result.size_bytes)})")


@cli.command("create")
@click.argument("name")
@click.option("-f", "--file", "modelfile", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              required=True, help="The Modelfile to build from (its FROM may be a local checkpoint directory).")
@click.option("--tag", "recipe_tag", default=None, help="Which TAG section of the Modelfile to use.")
def create_cmd(name: str, modelfile: Path, recipe_tag: str | None) -> None:
    """Create model NAME from a Modelfile."""
    with ProgressPrinter() as printer:
        result = create(name, modelfile, _store(), tag=recipe_tag, report=printer)
    click.echo(f"created {result.name.display} ({show_mod.human_bytes(result.size_bytes)})")


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_cmd(as_json: bool) -> None:
    """List local models."""
    store = _store()
    entries, skipped = store.scan_models()
    rows = [show_mod.list_row(store, e) for e in entries]
    if as_json:
        click.echo(json.dumps({"models": rows, "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped]}, indent=1))
        return
    click.echo(show_mod.format_table(rows))
    for s in skipped:
        click.echo(f"warning: skipped unreadable manifest {s.path}: {s.reason}", err=True)


cli.add_command(list_cmd, "ls")


@cli.command("show")
@click.argument("name")
@click.option("--modelfile", is_flag=True, help="Print the Modelfile the model was built from.")
@click.option("--parameters", is_flag=True, help="Print the default parameters.")
@click.option("--template", is_flag=True, help="Print the chat template.")
@click.option("--license", "license_", is_flag=True, help="Print the license.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def show_cmd(name: str, modelfile: bool, parameters: bool, template: bool, license_: bool, as_json: bool) -> None:
    """Show a model's architecture, size, template and recipe."""
    info = show_mod.describe(_store(), name)
    if as_json:
        click.echo(json.dumps(info, indent=1))
    elif modelfile:
        click.echo(info["modelfile"], nl=False)
    elif parameters:
        click.echo("\n".join(f"{k} {v}" for k, v in info["parameters"].items()))
    elif template:
        click.echo(info["template"] or "(no chat template)")
    elif license_:
        click.echo(info["license"] or "(no license recorded)")
    else:
        click.echo(show_mod.format_show(info))


@cli.command("rm")
@click.argument("names", nargs=-1, required=True)
def rm_cmd(names: tuple[str, ...]) -> None:
    """Remove models (and blobs no other model uses)."""
    store = _store()
    for name in names:
        removed = store.remove(name)
        click.echo(f"deleted '{name}'" + (f" ({len(removed)} blobs freed)" if removed else ""))


@cli.command("cp")
@click.argument("src")
@click.argument("dst")
def cp_cmd(src: str, dst: str) -> None:
    """Copy a model to a new name (no data is duplicated)."""
    _store().copy(src, dst)
    click.echo(f"copied '{src}' to '{dst}'")


@cli.command("verify")
@click.argument("names", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify_cmd(names: tuple[str, ...], as_json: bool) -> None:
    """Re-hash every file of a model; names any missing, truncated or corrupt one."""
    store = _store()
    report, failed = {}, False
    for name in names:
        with ProgressPrinter() as printer:
            bad = store.verify(name, progress=printer.bytes_callback(f"verifying {name}"))
        report[name] = [{"file": b.title, "problem": b.problem, "path": str(b.path), "detail": str(b)} for b in bad]
        failed |= bool(bad)
        if not as_json:
            if bad:
                for b in bad:
                    click.echo(f"{name}: {b.title}: {b.problem} ({b.path})", err=True)
                click.echo(f"{name}: {len(bad)} bad file(s); run `ft rm {name}` and pull it again", err=True)
            else:
                click.echo(f"{name}: ok")
    if as_json:
        click.echo(json.dumps(report, indent=1))
    if failed:
        sys.exit(1)


def _run(args: list[str] | None = None) -> None:
    try:
        cli.main(args=args, prog_name="ft", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("\ninterrupted; run the same command again to resume", err=True)
        sys.exit(130)
    except USER_ERRORS as e:
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)
    except OSError as e:  # disk full, permissions: the message names the file
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)


def main() -> None:
    """Entry point of `ft`."""
    _run()


def pull_main() -> None:
    """Entry point of `ftpull`: `ftpull X` is `ft pull X`."""
    _run(["pull", *sys.argv[1:]])
