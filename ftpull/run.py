"""`ft run`: load a model and answer one prompt, or chat in a REPL, streaming the answer.

Only presentation lives here; the conversation state is a `runtime.engine.Session`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from registry import Store
from runtime.engine import Generation, Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import LoadedModel, load_registered
from runtime.models import ContextOverflowError
from runtime.planner.plan import FitError, ModelFootprint, Plan, PlanOverrides, plan
from runtime.planner.resources import Machine, NoGPUError, gib_to_bytes
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer

from . import line_input
from .repl_models import MODEL_ERRORS, ModelLoader, history_lines, load_model, save_model

log = logging.getLogger(__name__)

DEFAULT_NUM_CTX = 4096
LOAD_OPTIONS = ("num_ctx", "num_thread")  # options that size the load, not the sampler (as the server's)
HELP = """Available commands:
  /set parameter NAME VALUE   set a sampling parameter (temperature, top_k, top_p, min_p,
                              repeat_penalty, repeat_last_n, seed, num_predict, stop), or
                              num_ctx (the context: planned as asked, or refused with the numbers)
  /set system TEXT            set the system prompt
  /set vram GIB               change the VRAM budget of a --device gpu run (the expert cache
                              grows or shrinks before the next token; nothing is reloaded)
  /set verbose, /set quiet    show (or stop showing) each answer's timings
  /show info                  show the model's details
  /show modelfile             show the Modelfile it was made from
  /show parameters            show the current parameters
  /show system                show the system message
  /show template              show the chat template
  /show license               show the license
  /load MODEL                 load another stored model (or this one again): the conversation
                              starts over, the parameters you set are kept
  /save MODEL                 save this chat (system message, parameters, messages so far) as a
                              new model, its weights shared: `ft run MODEL` starts from it
  /clear                      forget the conversation
  /bye                        exit
  /?, /help                   this help
Use \"\"\" to begin and end a multi-line message."""


class TurnRefused(ValueError):
    """A server refused this message before any output (it does not fit the context, its template
    fails): the conversation stays as it was, and the chat goes on (serve.RemoteChat raises it;
    a local chat's ContextOverflowError is taken the same way)."""


@dataclass
class Chat:
    """One `ft run` conversation: messages so far, options, and the session that runs them."""

    session: Session
    tokenizer: Tokenizer
    options: dict[str, Any]
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    experts: Any = None  # the GPU runtime's HybridExpertExecutor (--device gpu): its elastic VRAM budget
    fit: Plan | None = None  # the load's plan
    replan: Callable[[int], Plan] | None = None  # the load's plan for another num_ctx of the user's (FitError)
    num_ctx: int | None = None  # the user's (--num-ctx, /set parameter num_ctx); None: the recipe's or the default
    about: Callable[[], dict[str, Any]] | None = None  # the model as `ft show` describes it (ftpull/show.py)
    model_name: str | None = None  # the stored model's name (/save makes a model FROM it)
    model_options: dict[str, Any] = field(default_factory=dict)  # the model's own parameters (/load keeps the rest)
    first_messages: list[dict[str, str]] = field(default_factory=list)  # its MESSAGEs: the history /clear goes back to
    loader: ModelLoader | None = None  # loads another model as this one was (/load), and the store /save writes to
    loaded: LoadedModel | None = None  # the weights, held as long as the chat runs them

    def params(self) -> SamplingParams:
        return SamplingParams.from_options(self.options)

    def shown_parameters(self) -> dict[str, Any]:
        """What /show parameters prints: the model's defaults with this chat's settings over them,
        and the context it runs with (asked for, or planned)."""
        return {**self.options, "num_ctx": self.num_ctx if self.num_ctx is not None else self.session.context_length}

    def model_sections(self) -> dict[str, str]:
        """What /show info, modelfile, template, license and system print (empty: none)."""
        from .show import format_show

        info = self.about() if self.about is not None else {}
        return {"info": format_show(info) if info else "", "modelfile": info.get("modelfile") or "",
                "template": info.get("template") or "", "license": info.get("license") or "",
                "system": self.system or ""}

    def set_num_ctx(self, num_ctx: int) -> str:
        """The context the user asks for, from the next message: planned exactly (lowered only to
        the model's own maximum, which the answer says), or FitError/ValueError with the numbers.
        On the GPU the KV cache was sized at load beside the expert cache: a context within it
        runs there; a larger one needs a new load."""
        if self.replan is None or self.fit is None:
            raise ValueError("/set parameter num_ctx needs a model this process loaded (ft run --num-ctx N)")
        fitted = self.replan(num_ctx)
        context, loaded = fitted.context_length, self.fit.context_length
        if self.fit.device == "gpu" and context > loaded:
            raise ValueError(f"this model was loaded on the GPU with KV for {loaded} tokens beside its expert cache; "
                             f"num_ctx {num_ctx} needs a new load: ft run {self.fit.model} --num-ctx {num_ctx}")
        model = self.session.model
        self.session = None  # type: ignore[assignment]  # its KV cache goes before the new one is made
        self.session = Session(model, self.tokenizer, context)
        self.num_ctx = num_ctx
        lowered = f" (the model's most: {context} tokens)" if context < num_ctx else ""
        return f"Set parameter 'num_ctx' to '{num_ctx}'{lowered}: the conversation is read again with the next message"

    def set_vram(self, gib: float) -> str:
        """A new VRAM budget for the loaded model (applied before the next token). Raises
        ValueError with the numbers when it cannot hold one token's experts."""
        governor = getattr(self.experts, "elastic", None)
        if governor is None:
            raise ValueError("/set vram needs a model running on the GPU (the CPU runtime uses no VRAM)")
        slots = governor.set_budget(gib_to_bytes(gib))
        return f"Set VRAM budget to {gib:g} GiB: the expert cache becomes {slots} slots before the next token"

    def ask(self, text: str, on_text: Callable[[str], None]) -> Generation:
        history = ([{"role": "system", "content": self.system}] if self.system else []) + self.messages
        conversation = history + [{"role": "user", "content": text}]
        prompt = self.tokenizer.encode_chat(conversation, add_generation_prompt=True)
        result = self.session.generate(prompt, self.params(), on_text)
        self.messages += [{"role": "user", "content": text}, {"role": "assistant", "content": result.text}]
        return result

    def clear(self) -> None:
        self.messages = list(self.first_messages)  # as Ollama, a model's own MESSAGEs stay
        self.session.reset()

    def interrupted(self) -> None:
        """An answer stopped midway (Ctrl-C): its turn is not kept, and the state, which may hold
        part of it, starts over (the next turn prefills the conversation again)."""
        self.session.reset()


def compute_dtype(config: dict[str, Any], requested: str | None) -> torch.dtype:
    """f32 models compute in f32; everything else in bf16 unless the user says otherwise."""
    names = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    if requested:
        return names[requested]
    return torch.float32 if config.get("dtype") == "f32" else torch.bfloat16


def load_for_chat(store: Store, name: str, *, dtype: str | None, num_ctx: int | None,
                  overrides: dict[str, Any], threads: int | None = None, device: str = "auto",
                  vram_gib: float | None = None, mode: str = "auto") -> tuple[LoadedModel, Chat, float]:
    """Plan (placement, context, threads) with the fit planner, load the weights, open a chat.

    device "gpu" is the hybrid runtime: dense weights and KV on the GPU, experts in pinned host
    RAM behind a VRAM expert cache, misses split by `mode` (auto/offload/cpu/static/
    prefill_placement). "cpu" computes everything on the CPU. "auto" (the default) takes the GPU
    when there is one and the plan fits it, else the CPU, and says why."""
    registered = open_model(store, name)
    options = {**(registered.config.get("parameters") or {}), **overrides}
    recipe_ctx = options.pop("num_ctx", None)
    with registered.open_ftw() as reader:
        footprint = ModelFootprint.from_index(reader.index, name=registered.name.display,
                                              context_length=registered.context_length)
    machine = Machine.probe()
    if device == "gpu" and machine.gpu is None:
        raise NoGPUError("--device gpu needs a CUDA GPU and none was found; run with --device cpu")
    if vram_gib is not None and machine.gpu is None:
        log.warning("--vram-gib %g has no effect: no GPU was found, so the model runs on the CPU", vram_gib)
    # the user's num_ctx is planned exactly or refused with the numbers; the recipe's or the
    # default is lowered to fit
    wanted = PlanOverrides(num_ctx=num_ctx, default_num_ctx=recipe_ctx or DEFAULT_NUM_CTX, num_threads=threads,
                           device=device, vram_budget_bytes=None if vram_gib is None else gib_to_bytes(vram_gib))
    fitted = plan(footprint, machine, wanted)
    for warning in fitted.warnings:
        log.warning("%s", warning)
    for note in fitted.notes:
        log.info("%s", note)
    torch.set_num_threads(fitted.num_threads)
    start = time.perf_counter()
    if device == "auto" and machine.gpu is not None and fitted.device == "cpu":
        log.warning("running %s on the CPU: %s", registered.name.display, fitted.device_reason)
    gpu_options: dict[str, Any] = {"backend": "gpu", "fit": fitted, "mode": mode} if fitted.device == "gpu" else {}
    loaded = load_registered(registered, compute_dtype(registered.config, dtype), **gpu_options)
    tokenizer = Tokenizer.from_model(registered)
    load_seconds = time.perf_counter() - start
    session = Session(loaded.model, tokenizer, fitted.context_length)  # type: ignore[arg-type]
    first = [{"role": str(m["role"]), "content": str(m["content"])} for m in registered.config.get("messages") or ()]

    def load_another(other: str, changed: dict[str, Any]) -> Chat:  # /load: as this one was loaded
        return load_for_chat(store, other, dtype=dtype, num_ctx=num_ctx, overrides=changed, threads=threads,
                             device=device, vram_gib=vram_gib, mode=mode)[1]

    chat = Chat(session, tokenizer, options, registered.config.get("system"), messages=list(first),
                experts=loaded.experts, fit=fitted,
                replan=lambda n: plan(footprint, machine, replace(wanted, num_ctx=n, device=fitted.device)),
                num_ctx=num_ctx, about=lambda: _describe(store, name), model_name=registered.name.display,
                model_options={k: v for k, v in (registered.config.get("parameters") or {}).items() if k != "num_ctx"},
                first_messages=first, loader=ModelLoader(store, load_another), loaded=loaded)
    return loaded, chat, load_seconds


def _describe(store: Store, name: str) -> dict[str, Any]:
    from .show import describe

    return describe(store, name)


def stats_lines(result: Generation, load_seconds: float | None) -> list[str]:
    s = result.stats
    lines = []
    if load_seconds is not None:
        lines.append(f"load duration:        {load_seconds:.3f}s")
    lines += [
        f"prompt eval count:    {s.prompt_tokens} token(s)" + (f" (+{s.cached_tokens} cached)" if s.cached_tokens else ""),
        f"prompt eval duration: {s.prompt_seconds:.3f}s",
        f"prompt eval rate:     {s.prompt_tokens_per_second:.2f} tokens/s",
        f"eval count:           {s.eval_tokens} token(s)",
        f"eval duration:        {s.eval_seconds:.3f}s",
        f"eval rate:            {s.eval_tokens_per_second:.2f} tokens/s",
    ]
    return lines


class Command(str):
    """A line that starts with "/" (a block between \"\"\" never is one, whatever it starts with)."""


def read_message(lines: Iterable[str], prompt: Callable[[str], None]) -> str | None:
    """One user message from `lines`: a line (a Command where it starts with "/"), or a
    \"\"\"-delimited block. None at end of input."""
    prompt(">>> ")
    for line in lines:
        line = line.rstrip("\n")
        if not line.startswith('"""'):
            return Command(line) if line.startswith("/") else line
        block = [line[3:]]
        if block[0].endswith('"""') and len(block[0]) >= 3:
            return block[0][:-3]
        prompt("... ")
        for more in lines:
            more = more.rstrip("\n")
            if more.endswith('"""'):
                block.append(more[:-3])
                return "\n".join(block).strip("\n")
            block.append(more)
            prompt("... ")
        return "\n".join(block).strip("\n")
    return None


@dataclass
class ReplSettings:
    """What the REPL's own /set commands change (the chat's are its options and system)."""

    verbose: bool = False


SHOWN_SECTIONS = ("info", "modelfile", "system", "template", "license")
NOTHING_TO_SHOW = {"info": "No details were found for this model.",
                   "modelfile": "No Modelfile was kept with this model.",
                   "system": "No system message was specified for this model.",
                   "template": "No prompt template was specified for this model.",
                   "license": "No license was specified for this model."}


def handle_command(chat: Chat, text: str, say: Callable[[str], None], settings: ReplSettings | None = None) -> bool:
    """Run a /command; False when the user wants to leave."""
    parts = text.split(maxsplit=3)
    command = parts[0].lower()
    if command in ("/bye", "/exit"):
        return False
    if command in ("/?", "/help"):
        say(HELP)
    elif command == "/set" and len(parts) == 2 and parts[1] in ("verbose", "quiet") and settings is not None:
        settings.verbose = parts[1] == "verbose"
        say("Set 'verbose' mode." if settings.verbose else "Set 'quiet' mode.")
    elif command == "/show" and len(parts) == 2 and parts[1] in SHOWN_SECTIONS:
        try:
            shown = chat.model_sections()[parts[1]]
        except (ValueError, OSError) as e:  # a server that went away, a model removed meanwhile
            say(f"Error: {e}")
            return True
        say(shown.rstrip("\n") or NOTHING_TO_SHOW[parts[1]])
    elif command in ("/load", "/save") and len(parts) != 2:
        say(f"Usage:\n  {command} <model>")
    elif command in ("/load", "/save"):
        if command == "/load":
            say(f"Loading model '{parts[1]}'")
        try:
            say((load_model if command == "/load" else save_model)(chat, parts[1]))  # type: ignore[arg-type]
        except MODEL_ERRORS as e:
            say(f"Error: {e}")
    elif command == "/clear":
        chat.clear()
        say("Cleared session context")
    elif command == "/set" and len(parts) >= 3 and parts[1] == "system":
        chat.system = text.split(maxsplit=2)[2]
        say("Set system message.")
    elif command == "/set" and len(parts) == 4 and parts[1] == "parameter" and parts[2] == "num_ctx":
        say(_set_num_ctx(chat, parts[3]))
    elif command == "/set" and len(parts) == 4 and parts[1] == "parameter":
        key, value = parts[2], parts[3]
        candidate = dict(chat.options)
        candidate[key] = [*candidate.get("stop", []), value] if key == "stop" else _number(value)
        try:
            SamplingParams.from_options({k: v for k, v in candidate.items() if k not in LOAD_OPTIONS})
        except ValueError as e:
            say(f"Error: {e}")
            return True
        chat.options = candidate
        say(f"Set parameter '{key}' to '{value}'")
    elif command == "/set" and len(parts) == 3 and parts[1] == "vram":
        set_vram = getattr(chat, "set_vram", None)
        try:
            gib = float(parts[2])
        except ValueError:
            say(f"Error: /set vram takes a size in GiB, e.g. '/set vram 6', not '{parts[2]}'")
            return True
        try:
            if set_vram is None:
                raise ValueError("/set vram works on a model this process runs, not through `ft serve`")
            say(set_vram(gib))
        except ValueError as e:
            say(f"Error: {e}")
    elif command == "/show" and len(parts) >= 2 and parts[1] == "parameters":
        say("\n".join(f"{k:<16}{v}" for k, v in sorted(chat.shown_parameters().items())) or "(defaults)")
    else:
        say(f"Unknown command '{text}'. Type /? for help")
    return True


def _set_num_ctx(chat: Chat, value: str) -> str:
    """/set parameter num_ctx: a local chat plans it now (Chat.set_num_ctx); a server's chat sends
    it with the next message, and the server plans it (or refuses it, with the numbers)."""
    num_ctx = _number(value)
    if not isinstance(num_ctx, int) or num_ctx < 1:
        return f"Error: num_ctx is a number of tokens, at least 1, not '{value}'"
    set_num_ctx = getattr(chat, "set_num_ctx", None)
    if set_num_ctx is None:
        chat.options = {**chat.options, "num_ctx": num_ctx}
        return f"Set parameter 'num_ctx' to '{num_ctx}'"
    try:
        return set_num_ctx(num_ctx)
    except (FitError, ValueError) as e:
        return f"Error: {e}"


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def repl(chat: Chat, verbose: bool, load_seconds: float, history: Path | None = None) -> None:
    """The chat REPL: line editing and `history` (a file kept across runs) on a terminal
    (line_input.py), /commands, \"\"\" blocks."""
    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    lines = line_input.reader(history)
    settings = ReplSettings(verbose)
    show_load: float | None = load_seconds
    if chat.messages:  # a model's MESSAGEs (a /save's chat): shown, as Ollama shows them
        write("\n".join(history_lines(chat.messages)) + "\n")
    while True:
        try:
            message = read_message(lines, lines.prompt)
        except KeyboardInterrupt:  # Ctrl-C at the prompt: a new prompt, as Ollama does
            write("\nUse Ctrl-D or /bye to exit.\n")
            continue
        if message is None:
            write("\n")
            return
        if not message.strip():
            continue
        if isinstance(message, Command):
            if not handle_command(chat, message.strip(), lambda s: write(s + "\n"), settings):
                return
            continue
        try:
            result = chat.ask(message, write)
        except KeyboardInterrupt:  # Ctrl-C during an answer: it stops, the conversation goes on
            getattr(chat, "interrupted", lambda: None)()
            write("\n(stopped)\n\n")
            continue
        except (ContextOverflowError, TurnRefused) as e:  # the conversation is kept: /clear, or a shorter message
            write(f"Error: {e}\n(the conversation is as it was: /clear to start over)\n\n")
            continue
        write("\n\n")
        if result.stop_reason == "context":
            write("(the context is full: /clear to start over, or run with a larger --num-ctx)\n\n")
        if settings.verbose:
            sys.stderr.write("\n".join(stats_lines(result, show_load)) + "\n\n")
            show_load = None
