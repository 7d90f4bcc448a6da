"""`ft` and `ftpull`: the command line. A thin layer: parse, call the library, print.

Only this module and cli_store.py (the store commands) print; everything below them raises typed
errors whose messages say what went wrong and how to fix it, and `main` turns those into one line
on stderr and exit status 1.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from ftw import FTWError
from registry import RegistryError, Store
from runtime.config import ContextOverflowError, UnsupportedFamilyError
from runtime.planner.plan import PlanOverrides
from runtime.planner.resources import NoGPUError, gib_to_bytes
from runtime.text.chat_template import ChatTemplateError
from runtime.text.errors import InvalidParameterError
from runtime.text.tokenizer import TokenizerError

from . import cli_store
from . import fit as fit_mod
from . import launch as launch_mod
from . import show as show_mod
from .client import Client, NoServer, ServerAddressError, ServerReplyError
from .events import PullEvent, Report, is_up_to_date
from .hub import HubError
from .modelfile import ModelfileError
from .preflight import FitError
from .progress import ProgressPrinter
from .pull import PullError, create, pull
from .resolve import ResolveError

USER_ERRORS = (RegistryError, FTWError, HubError, FitError, PullError, ResolveError, ModelfileError,
               ChatTemplateError, TokenizerError, InvalidParameterError, ContextOverflowError, UnsupportedFamilyError,
               NoServer, ServerReplyError, ServerAddressError, NoGPUError, launch_mod.LaunchError)


FIRST_USE_LOGGERS = ("runtime.experts.cpu_kernels",)  # (their INFO lines: one-time builds, shown by default)


def _store() -> Store:
    return Store.default()


class GiB(click.ParamType):
    """A size in GiB: a finite number, > 0 (or >= 0 where 0 means "none"), at most a PiB."""

    name = "GIB"

    def __init__(self, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok

    def convert(self, value, param, ctx) -> float:
        try:
            gib = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of GiB", param, ctx)
        try:
            gib_to_bytes(gib, "the size", zero_ok=self.zero_ok)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return gib


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """`ft --version`: the installed package's version (looked up only when asked: it costs every
    command ~20 ms); a checkout run without installing has none."""
    if not value or ctx.resilient_parsing:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        click.echo(f"ft version {version('ft')}")
    except PackageNotFoundError:
        click.echo("ft version unknown (not installed: pip install -e .)")
    ctx.exit()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_show_version,
              help="Show the version and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Log what happens underneath.")
def cli(verbose: bool) -> None:
    """ft: pull, convert and run Mixture-of-Experts models on one PC."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # one-time work a user waits for is said without -v: the CPU kernel's compile for this CPU
    # (seconds, at a machine's first load) was a silent wait before the first answer
    for name in FIRST_USE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)


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
              default="Modelfile", show_default=True,
              help="The Modelfile to build from (its FROM may be a local checkpoint directory).")
@click.option("--tag", "recipe_tag", default=None, help="Which TAG section of the Modelfile to use.")
def create_cmd(name: str, modelfile: Path, recipe_tag: str | None) -> None:
    """Create model NAME from a Modelfile."""
    with ProgressPrinter() as printer:
        result = create(name, modelfile, _store(), tag=recipe_tag, report=printer)
    click.echo(f"created {result.name.display} ({show_mod.human_bytes(result.size_bytes)})")


@cli.command("fit")
@click.argument("name")
@click.option("--vram-gib", type=GiB(zero_ok=True), default=None, help="Cap the VRAM ft may use (0: CPU only).")
@click.option("--ram-gib", type=GiB(), default=None, help="Cap the host RAM ft may use.")
@click.option("--num-ctx", type=click.IntRange(min=1), default=None, help="Context length to plan for.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for expert kernels.")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True,
              help="gpu refuses a plan that would fall back to the CPU or thrash the expert cache.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def fit_cmd(name: str, vram_gib: float | None, ram_gib: float | None, num_ctx: int | None, threads: int | None,
            device: str, as_json: bool) -> None:
    """What this machine can do with NAME: where experts live, cache slots, context, threads. Exit 1 if it cannot run.

    A model not in the store is planned from its metadata only (no weights are downloaded)."""
    overrides = PlanOverrides(
        vram_budget_bytes=None if vram_gib is None else gib_to_bytes(vram_gib, zero_ok=True),
        ram_budget_bytes=None if ram_gib is None else gib_to_bytes(ram_gib, "a RAM budget"),
        num_ctx=num_ctx, num_threads=threads, device=device)
    report = fit_mod.fit(name, _store(), overrides)
    click.echo(json.dumps(fit_mod.report_dict(report), indent=1) if as_json else fit_mod.format_report(report))
    if not report.plan.fits:
        sys.exit(1)


for _command in cli_store.COMMANDS:
    cli.add_command(_command)
cli.add_command(cli_store.list_cmd, "ls")


@cli.command("run")
@click.argument("name")
@click.argument("prompt", nargs=-1)
@click.option("--verbose", is_flag=True, help="Print load time, prompt and eval tokens/s.")
@click.option("--num-ctx", type=click.IntRange(min=16), default=None, help="Context length in tokens.")
@click.option("--dtype", type=click.Choice(["f32", "bf16", "f16"]), default=None, help="Compute dtype.")
@click.option("--temperature", type=float, default=None)
@click.option("--seed", type=int, default=None)
@click.option("--num-predict", type=int, default=None, help="Most tokens to generate.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads (default: planned).")
@click.option("--local", is_flag=True, help="Load the model in this process even when an `ft serve` is running.")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True,
              help="gpu: the hybrid GPU runtime (experts cached in VRAM, misses split PCIe/CPU); auto: the GPU "
                   "when there is one and the model's plan fits it, else the CPU.")
@click.option("--vram-gib", type=GiB(), default=None,
              help="On the GPU: cap the VRAM ft uses (weights + KV + expert cache).")
@click.option("--mode", type=click.Choice(["auto", "offload", "cpu", "static", "prefill_placement"]), default="auto",
              show_default=True, help="On the GPU: how expert-cache misses are served.")
def run_cmd(name: str, prompt: tuple[str, ...], verbose: bool, num_ctx: int | None, dtype: str | None,
            temperature: float | None, seed: int | None, num_predict: int | None, threads: int | None,
            local: bool, device: str, vram_gib: float | None, mode: str) -> None:
    """Chat with a model (pulled first if missing), or answer PROMPT (or stdin) and exit.

    When an `ft serve` answers at FT_HOST, the model is pulled, loaded and run by that server
    (no second copy in memory); --local, --dtype or --device gpu/cpu load it here instead."""
    from . import run as run_mod
    from . import serve as serve_mod

    if not local and dtype is None and device == "auto":
        client = serve_mod.Client()
        if client.running():
            options = {k: v for k, v in (("temperature", temperature), ("seed", seed), ("num_predict", num_predict),
                                         ("num_ctx", num_ctx), ("num_thread", threads)) if v is not None}
            if vram_gib is not None or mode != "auto":  # (load options a chat request cannot carry)
                click.echo("note: --vram-gib and --mode apply to a model this process loads; the running ft serve "
                           f"keeps its own (`ft vram {name} GIB` changes its budget; --local runs here)", err=True)
            _run_on_server(client, name, " ".join(prompt), options, verbose)
            return
    store = _store()
    with ProgressPrinter() as printer:
        pulled = pull(name, store, report=_unless_up_to_date(printer))
    overrides = {k: v for k, v in (("temperature", temperature), ("seed", seed), ("num_predict", num_predict))
                 if v is not None}
    # the name the pull registered (a path or hf:// address is not itself a model name)
    # (the chat holds the weights: a /load lets them go)
    with _nothing_to_resume():
        chat, load_seconds = run_mod.load_for_chat(store, str(pulled.name), dtype=dtype, num_ctx=num_ctx,
                                                   overrides=overrides, threads=threads, device=device,
                                                   vram_gib=vram_gib, mode=mode)[1:]
    _answer_or_chat(chat, " ".join(prompt), verbose, load_seconds)


@contextlib.contextmanager
def _nothing_to_resume() -> Iterator[None]:
    """Ctrl-C after the pull (while the model loads): the model is stored, so no "a download
    resumes" (`_interrupted`'s hint for a run that may still be downloading)."""
    try:
        yield
    except KeyboardInterrupt:
        click.echo("\ninterrupted (the model is stored: `ft run` loads it again)", err=True)
        sys.exit(130)


def _unless_up_to_date(report: Report) -> Report:
    """`ft run`'s pull report: a stored, whole model is run without a word about it (as `ollama
    run` does; "is up to date" on every run read as if something had been checked online)."""
    return lambda event: None if is_up_to_date(event) else report(event)


def _answer_or_chat(chat: Any, text: str, verbose: bool, load_seconds: float) -> None:
    """Answer `text` (or stdin when piped) and return, or open the REPL when there is no prompt.
    `chat` is a local ftpull.run.Chat or a serve.RemoteChat: the same surface."""
    from . import run as run_mod

    if not text.strip() and sys.stdin.isatty():  # no prompt, "" or "   " alike: the REPL
        text = ""
    if not text and not sys.stdin.isatty():
        text = sys.stdin.read()
    elif text:
        piped = _piped_stdin()
        text = f"{piped} {text}" if piped.strip() else text  # as Ollama: what was piped, then the prompt
    if not text:
        run_mod.repl(chat, verbose, load_seconds, history=_store().root / "history")
        return
    if not text.strip():
        raise click.UsageError("the prompt is empty")
    try:
        result = chat.ask(text, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    except KeyboardInterrupt:  # Ctrl-C during the answer: it stops (the model was pulled: nothing to resume)
        click.echo("\n(stopped)", err=True)
        sys.exit(130)
    sys.stdout.write("\n")
    if verbose:
        click.echo("\n".join(run_mod.stats_lines(result, load_seconds)), err=True)


def _piped_stdin() -> str:
    """What a pipe or file on stdin holds, where there is one and it has something now: beside a
    prompt, stdin is read only if that cannot wait (a terminal, or an open pipe that sends
    nothing, as a CI runner's may be, would hang `ft run MODEL "prompt"`)."""
    try:
        if sys.stdin.isatty():
            return ""
        ready, _, _ = select.select([sys.stdin], [], [], 0)
    except (OSError, ValueError):  # no file descriptor (a test's stdin): nothing piped
        return ""
    return sys.stdin.read() if ready else ""


def _run_on_server(client: Client, name: str, text: str, options: dict[str, object], verbose: bool) -> None:
    """`ft run` through a running server: pull and load there, then chat over /api/chat."""
    import time

    from . import serve as serve_mod

    with ProgressPrinter() as printer:
        report = _unless_up_to_date(printer)
        for event in client.stream("/api/pull", {"model": name, "stream": True}):
            report(PullEvent(event.get("status", ""), event.get("total"), event.get("completed")))
    start = time.perf_counter()
    with _nothing_to_resume():
        client.post("/api/generate", {"model": name})  # an empty prompt loads the model (Ollama's way)
    load_seconds = time.perf_counter() - start
    _answer_or_chat(serve_mod.RemoteChat(client, name, options), text, verbose, load_seconds)


@cli.command("serve")
@click.option("--host", default=None, help="Address to listen on (default: FT_HOST's, else 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default: FT_HOST's, else 11435).")
@click.option("--api-key", envvar="FT_API_KEY", default=None,
              help="Require this key from clients (Authorization: Bearer KEY or x-api-key: KEY); env FT_API_KEY.")
@click.option("--device", type=click.Choice(["auto", "gpu", "cpu"]), default="auto", show_default=True,
              help="gpu: the hybrid GPU runtime (its VRAM budget changes with `ft vram`); auto: each model on the GPU "
                   "when there is one and its plan fits, else on the CPU.")
@click.option("--vram-gib", type=GiB(), default=None, help="VRAM budget per model on the GPU (default: free VRAM).")
@click.option("--mode", type=click.Choice(["auto", "offload", "cpu", "static", "prefill_placement"]), default="auto",
              show_default=True, help="How expert-cache misses are served on the GPU.")
def serve_cmd(host: str | None, port: int | None, api_key: str | None, device: str, vram_gib: float | None,
              mode: str) -> None:
    """Serve the Ollama API (and OpenAI/Anthropic ones) for the local models.

    Models load on first use and unload after FT_KEEP_ALIVE (default 5m) idle; at most
    FT_MAX_QUEUE requests wait (default 16), more get 503."""
    from runtime.planner.resources import probe_gpu

    from . import serve as serve_mod

    gpu = probe_gpu() if device != "cpu" else None
    if device == "gpu" and gpu is None:
        raise NoGPUError("--device gpu needs a CUDA GPU and none was found; serve with --device cpu")
    if vram_gib is not None and gpu is None:  # (as ft run and ft fit say it)
        click.echo(f"note: --vram-gib {vram_gib:g} has no effect: "
                   + ("--device cpu uses no GPU" if device == "cpu" else "no GPU was found, so models run on the CPU"),
                   err=True)
    where = ("on the CPU" if gpu is None else f"on the {gpu.name} (the hybrid runtime)" if device == "gpu"
             else f"on the {gpu.name} where their plan fits (the hybrid runtime), else on the CPU")

    try:
        default_host, default_port = serve_mod.parse_host(os.environ.get("FT_HOST"))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    host = host or default_host
    port = default_port if port is None else port
    try:
        app = serve_mod.build_app(_store(), api_key=api_key, device=device, gpu_mode=mode,
                                  vram_budget_bytes=None if vram_gib is None else gib_to_bytes(vram_gib))
    except ValueError as e:  # FT_KEEP_ALIVE, FT_MAX_QUEUE, ...
        raise click.UsageError(str(e)) from None
    sock = serve_mod.bind(host, port)
    click.echo(f"ft serve: listening on {serve_mod.server_url(f'{host}:{port}')}; models run {where} (Ctrl-C stops)",
               err=True)
    serve_mod.serve(app, sock)


@cli.command("vram")
@click.argument("name")
@click.argument("gib", type=GiB())
def vram_cmd(name: str, gib: float) -> None:
    """Change the VRAM budget of a model a running `ft serve --device gpu` holds: its expert cache
    grows or shrinks before the next token, nothing is reloaded."""
    reply = Client().post("/api/ft/vram", {"model": name, "vram_gib": gib})
    click.echo(f"{reply['model']}: VRAM budget {gib:g} GiB, expert cache {reply['cache_slots']} slots "
               f"({reply['cache_bytes'] / 2**30:.2f} GiB) from the next token")


@cli.command("ps")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the server's /api/ps).")
def ps_cmd(as_json: bool) -> None:
    """List the models a running `ft serve` has loaded."""
    from .client import format_ps

    reply = Client().get("/api/ps")
    click.echo(json.dumps(reply, indent=1) if as_json else format_ps(reply.get("models", [])))


@cli.command("launch")
@click.argument("agent", type=click.Choice(launch_mod.AGENTS))
@click.argument("name")
@click.option("--write", is_flag=True, help="opencode: write ./opencode.json (never over an existing one).")
def launch_cmd(agent: str, name: str, write: bool) -> None:
    """Print the configuration that points coding agent AGENT at `ft serve` with local model NAME:
    Claude Code's environment variables, opencode's opencode.json, Codex's config.toml lines."""
    from registry import parse_name

    _store().read_manifest(name)  # a model that is not here is refused, with the names nearest it
    click.echo(launch_mod.launch_text(agent, parse_name(name).display,
                                      write_to=Path("opencode.json") if write else None))


@cli.command("stop")
@click.argument("name")
def stop_cmd(name: str) -> None:
    """Unload model NAME from a running `ft serve` (after its current requests)."""
    from registry import parse_name

    display = parse_name(name).display  # a bad name is refused before any server is asked
    client = Client()
    loaded = {m["name"] for m in client.get("/api/ps").get("models", [])}
    if display not in loaded:
        raise click.ClickException(f"model '{name}' is not running" + (f" (running: {', '.join(sorted(loaded))})"
                                                                     if loaded else ""))
    client.post("/api/generate", {"model": name, "keep_alive": 0})


def _interrupted(args: list[str] | None) -> str:
    """What Ctrl-C leaves: a command that may download says that the download resumes."""
    command = next((a for a in (sys.argv[1:] if args is None else args) if not a.startswith("-")), None)
    if command in ("pull", "run"):
        return "interrupted; run the same command again: a download resumes where it stopped"
    return "interrupted"


def _run(args: list[str] | None = None) -> None:
    try:
        cli.main(args=args, prog_name="ft", standalone_mode=False)
    except click.exceptions.Abort as e:  # click turns Ctrl-C inside a command into Abort
        interrupted = isinstance(e.__cause__ or e.__context__, KeyboardInterrupt)
        click.echo(_interrupted(args) if interrupted else "aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("\n" + _interrupted(args), err=True)
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


@cli.command("bench")
@click.option("--shape", default="qwen3-30b-a3b", show_default=True,
              help="qwen3-30b-a3b, qwen3.6-35b-a3b, glm-4.5-air, or tiny (CI).")
@click.option("--budget-gib", type=float, default=8.0, show_default=True, help="VRAM budget (8: laptop, 32: desktop).")
@click.option("--threads", type=int, default=None, help="CPU threads (6: laptop, 8: desktop).")
@click.option("--policies", default="auto,offload,cpu,static,prefill_placement", show_default=True)
@click.option("--routing", type=click.Choice(["synthetic", "trace"]), default="synthetic", show_default=True)
@click.option("--tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Decode tokens (the trace has 128).")
@click.option("--prompt-tokens", type=click.IntRange(min=0), default=128, show_default=True,
              help="Warm prompt (synthetic routing).")
@click.option("--prefill", default="1024,4096,16384", show_default=True, help="Prefill lengths; '' for none.")
@click.option("--device", default="cuda", show_default=True, help="cuda or cpu.")
@click.option("--layers", type=int, default=None, help="Build only this many MoE layers (a reduced run).")
@click.option("--host-banks", type=int, default=None,
              help="Build this many host banks and share them among the layers: full depth in less RAM.")
@click.option("--pcie-repeat", type=int, default=1, show_default=True,
              help="Make every PCIe copy N times: emulates a link 1/N as fast (2: a laptop's x8 Gen5 link).")
@click.option("--num-ctx", type=int, default=4096, show_default=True, help="Context whose KV the planner reserves.")
@click.option("--cache-slots", type=int, default=None, help="Override the planner's cache size.")
@click.option("--profile", "profile_path", default=None, help="A bandwidth-profile JSON to use for 'auto'.")
@click.option("--reps", type=click.IntRange(min=1), default=1, show_default=True, help="Rounds of decode runs, each policy once per round (median).")
@click.option("--trace", "trace_path", default=None,
              help="The routing trace .npz for --routing trace (default: shared/traces/bigmoeonedge/qwen3-30b-a3b.npz).")
@click.option("--profile-tokens", type=int, default=0, show_default=True,
              help="Profile this many more decode tokens per policy (torch.profiler: where host and device time go).")
@click.option("--profile-dir", default=None, help="Write each policy's Chrome trace here (with --profile-tokens).")
@click.option("--cuda-graphs/--no-cuda-graphs", default=True, show_default=True,
              help="Replay decode calls as CUDA graphs (--no-cuda-graphs: every call uncaptured).")
@click.option("--step-graphs/--no-step-graphs", default=True, show_default=True,
              help="Replay each whole decode step as one CUDA graph, CPU shares included where the "
                   "driver's stream flags can be captured (--no-step-graphs: one graph per layer call).")
@click.option("--queue-ahead/--no-queue-ahead", default=True, show_default=True,
              help="Queue each decode step while the one before runs, held on the device until the host has "
                   "seen that one end, as `ft run` does (--no-queue-ahead: launch each step after it).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def bench_cmd(shape: str, budget_gib: float, threads: int | None, policies: str, routing: str, tokens: int,
              prompt_tokens: int, prefill: str, device: str, layers: int | None, host_banks: int | None,
              pcie_repeat: int, num_ctx: int, cache_slots: int | None,
              profile_path: str | None, reps: int, trace_path: str | None, profile_tokens: int, profile_dir: str | None,
              cuda_graphs: bool, step_graphs: bool, queue_ahead: bool, seed: int, as_json: bool) -> None:
    """Benchmark the MoE expert path of decode and prefill for every cache policy on identical routing."""
    from runtime.bench.moe import BenchConfig, format_report, json_ready, run_bench

    try:
        lengths = tuple(int(n) for n in prefill.split(",") if n.strip())
    except ValueError:
        raise click.BadParameter(f"{prefill!r} is not a list of token counts (e.g. 1024,4096)",
                                 param_hint="--prefill") from None
    if any(n < 1 for n in lengths):
        raise click.BadParameter(f"{prefill!r}: token counts are 1 or more", param_hint="--prefill")
    cfg = BenchConfig(shape=shape, budget_gib=budget_gib, threads=threads,
                      policies=tuple(p.strip() for p in policies.split(",") if p.strip()), routing=routing,
                      tokens=tokens, prompt_tokens=prompt_tokens,
                      prefill=lengths, device=device, layers=layers,
                      host_banks=host_banks, pcie_repeat=pcie_repeat,
                      num_ctx=num_ctx, cache_slots=cache_slots, profile=profile_path, reps=reps, seed=seed, trace=trace_path,
                      profile_tokens=profile_tokens, profile_dir=profile_dir, cuda_graphs=cuda_graphs,
                      step_graphs=step_graphs, queue_ahead=queue_ahead,
                      profile_seconds=0.05 if device == "cpu" else 0.4)
    try:
        report = run_bench(cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(json.dumps(json_ready(report), indent=2) if as_json else format_report(report))
    check = report.get("policy_check")
    if check and not check["ok"]:  # a failed check is a failed benchmark run (CI and scripts look at the status)
        raise SystemExit(1)
