"""The model manager behind `ft serve`: loads models on first use, keeps them for keep_alive,
unloads them under memory pressure, and runs each model's generations on its worker threads
(torch on the CPU would block the event loop; one a session, runner.py: several at once on the
CPU, one on the GPU), with a bounded queue in front.

Each loaded model is a `Runner` (runner.py): its sessions, its worker threads, its parser. This
module decides: which models are loaded, when they go (room.py: which go to make room for a
load), who waits, who gets 503.

A request's own num_ctx is planned exactly or refused (400, with the numbers); the recipe's or
the default is lowered to fit (fit planner, runtime/planner/plan.py).

Environment: FT_KEEP_ALIVE (default "5m"; 0 unloads after each request, negative keeps models
forever), FT_MAX_QUEUE (requests that may wait, default 16), FT_CONTEXT_LENGTH (default context
when neither the request nor the recipe gives num_ctx).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import torch

from registry import Store
from runtime.loading.registered import RegisteredModel
from runtime.loading.runnable import load_registered
from runtime.models import UnsupportedFamilyError
from runtime.planner.plan import FitError, ModelFootprint, Plan, PlanOverrides, plan
from runtime.planner.resources import Machine, gib_to_bytes
from runtime.text.tokenizer import Tokenizer, TokenizerError

from . import models, prompts
from .protocol import (
    BadRequest,
    ChatRequest,
    Done,
    Event,
    GenerateRequest,
    ModelInfo,
    ServerError,
    Started,
)
from .room import make_gpu_room, make_room
from .runner import LoadedStatus, Runner, compute_dtype
from .scheduler import (
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_MAX_QUEUE,
    MAX_KEEP_ALIVE_S,
    Admission,
    Job,
    parse_keep_alive,
)

log = logging.getLogger(__name__)

DEFAULT_NUM_CTX = 4096  # Ollama's default context, as `ft run` uses


class ModelTooLarge(ServerError):
    """The model cannot be loaded on this machine at all (the planner's numbers say why)."""

    status = 507


class ModelManager:
    """The Backend of `ft serve` (see protocol.Backend), plus what the Ollama API needs on top:
    load/unload, ps, show, delete, copy. Call its coroutines from one event loop."""

    def __init__(self, store: Store, *, keep_alive_s: float | None = None, max_queue: int | None = None,
                 default_num_ctx: int | None = None, ram_budget_bytes: int | None = None,
                 machine: Callable[[], Machine] = Machine.probe, device: str = "cpu",
                 vram_budget_bytes: int | None = None, gpu_mode: str = "auto",
                 gpu_options: dict[str, Any] | None = None) -> None:
        """device "gpu": models load into the hybrid GPU runtime (runtime.gpu) within
        `vram_budget_bytes` (default: the free VRAM), misses split by `gpu_mode`; `gpu_options`
        go to runtime.gpu.load_gpu as they are (tests run the hybrid runtime on CPU tensors).
        "auto": each model where its plan puts it, the GPU when the machine has one and it fits."""
        if device not in ("auto", "cpu", "gpu"):
            raise ValueError(f"device is auto, cpu or gpu, not {device!r}")
        self.store = store
        self.device, self.vram_budget_bytes, self.gpu_mode = device, vram_budget_bytes, gpu_mode
        self.gpu_options = dict(gpu_options or {})
        try:
            self.default_keep_alive_s = keep_alive_s if keep_alive_s is not None else parse_keep_alive(
                os.environ.get("FT_KEEP_ALIVE", DEFAULT_KEEP_ALIVE_S))
            self.admission = Admission(max_queue if max_queue is not None
                                       else int(os.environ.get("FT_MAX_QUEUE", DEFAULT_MAX_QUEUE)))
            self.default_num_ctx = default_num_ctx or int(os.environ.get("FT_CONTEXT_LENGTH", DEFAULT_NUM_CTX))
        except ValueError as e:
            raise ValueError(f"FT_KEEP_ALIVE, FT_MAX_QUEUE or FT_CONTEXT_LENGTH is invalid: {e}") from None
        self.ram_budget_bytes = ram_budget_bytes
        self.machine = machine
        self.runners: dict[str, Runner] = {}
        self._load_lock: asyncio.Lock | None = None
        self._tokenizers: dict[str, Tokenizer] = {}
        self._tokenizer_lock = threading.Lock()

    # ---- Backend ---------------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> AsyncIterator[Event]:
        started = time.perf_counter()
        registered = models.lookup(self.store, request.model)
        options = models.request_options(registered, request.options)
        recipe = prompts.chat_recipe(registered, request)
        async for event in self._generate(registered, options, recipe, request.keep_alive, started):
            yield event

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Event]:
        started = time.perf_counter()
        registered = models.lookup(self.store, request.model)
        options = models.request_options(registered, request.options)
        if request.default_max_tokens is not None and not models.sets_max_tokens(registered, request.options):
            options = replace(options, sampling=replace(options.sampling, max_tokens=request.default_max_tokens))
        recipe = prompts.generate_recipe(registered, request)
        async for event in self._generate(registered, options, recipe, request.keep_alive, started):
            yield event

    def count_tokens(self, request: ChatRequest) -> int:
        registered = models.lookup(self.store, request.model)
        return prompts.count_chat_tokens(registered, request, self._tokenizer(registered))

    def list_models(self) -> list[ModelInfo]:
        return models.list_models(self.store)

    # ---- model management ------------------------------------------------------------------------

    async def load(self, name: str, keep_alive: float | None = None) -> float:
        """Load `name` if it is not loaded (returns the seconds spent loading) and reset its keep-alive."""
        registered = models.lookup(self.store, name)
        ticket = self.admission.admit()
        try:
            runner, load_seconds = await self._runner(registered, None, None)
        finally:
            ticket.release()
        runner.keep_alive_s = self._keep_alive(keep_alive)
        if runner.active == 0:
            self._idle(runner)
        return load_seconds

    async def unload(self, name: str) -> bool:
        """Unload `name` now if idle, else as soon as its running and queued requests finish.
        False when it was not loaded."""
        registered = models.lookup(self.store, name)
        runner = self.runners.get(str(registered.name))
        if runner is None:
            return False
        runner.keep_alive_s = 0.0
        if runner.active == 0:
            self._unload(runner)
        return True

    def set_vram(self, name: str, vram_gib: float) -> dict[str, Any]:
        """A new VRAM budget for the loaded model `name`: its expert cache is resized before its
        next token, no weight reloaded (runtime/gpu/elastic.py)."""
        registered = models.lookup(self.store, name)
        runner = self.runners.get(str(registered.name))
        if runner is None:
            raise BadRequest(f"{registered.name.display} is not loaded; send it a request first (or ft run it)")
        governor = getattr(runner.loaded.experts, "elastic", None)
        if governor is None:
            raise BadRequest(f"{registered.name.display} runs on the CPU, which has no VRAM budget; start the "
                             "server with `ft serve --device gpu`")
        try:
            slots = governor.set_budget(gib_to_bytes(vram_gib))
        except ValueError as e:
            raise BadRequest(str(e)) from None
        return {"model": registered.name.display, "vram_budget_bytes": governor.budget_bytes, "cache_slots": slots,
                "cache_bytes": slots * governor.slot_bytes}

    def ps(self) -> list[LoadedStatus]:
        now = time.time()
        return [runner.status(now) for runner in self.runners.values()]

    def show(self, name: str) -> dict[str, Any]:
        return models.show(self.store, name)

    async def delete(self, name: str) -> None:
        registered = models.lookup(self.store, name)
        runner = self.runners.get(str(registered.name))
        if runner is not None:
            runner.keep_alive_s = 0.0
            if runner.active == 0:
                self._unload(runner)
        await asyncio.to_thread(models.delete, self.store, name)

    async def copy(self, source: str, destination: str) -> None:
        await asyncio.to_thread(models.copy, self.store, source, destination)

    def close(self) -> None:
        """Unload everything, stopping running generations (the server shuts down)."""
        for runner in list(self.runners.values()):
            self._unload(runner, cancel=True)

    # ---- generation ------------------------------------------------------------------------------

    async def _generate(self, registered: RegisteredModel, options: models.RequestOptions,
                        recipe: prompts.PromptRecipe, keep_alive: float | None, started: float) -> AsyncIterator[Event]:
        """One generation of the prompt `recipe` renders (prompts.py: a forced tool call's opening
        ends it; a raw prompt or a prefilled reply is continued, not answered)."""
        keep = self._keep_alive(keep_alive)
        ticket = self.admission.admit()
        runner: Runner | None = None
        job: Job | None = None
        try:
            asked = self._asked_ctx(registered, options.num_ctx)  # a request without num_ctx asks the default
            runner, load_seconds = await self._runner(registered, options.num_ctx, options.num_thread)
            runner.active += 1  # from here on the model stays loaded for this request
            loaded = runner

            def prepare() -> tuple[list[int], str, int, int]:  # off the event loop: templates, planning
                return (*prompts.prompt_tokens(recipe, loaded.tokenizer, loaded.family),
                        self._context_for(loaded, asked, exact=options.num_ctx is not None))

            prompt, opening, opened, context = await asyncio.to_thread(prepare)
            if len(prompt) > context:
                most = runner.plan.model_context_length
                raise BadRequest(f"the prompt is {len(prompt)} tokens, the context is {context}" + (
                    ", this model's most; shorten it" if most and context >= most else "; shorten it or raise num_ctx"))
            job = Job(asyncio.get_running_loop(), ticket, prompt=prompt, params=options.sampling, tools=recipe.tools,
                      num_ctx=context, load_seconds=load_seconds, started=started, opening=opening,
                      opening_tokens=opened, continues_text=recipe.continues_text or bool(opening))
            self._submit(runner, job, keep)
            yield Started(prompt_tokens=len(prompt) - opened)
            while True:
                item = await job.queue.get()
                if isinstance(item, ServerError):
                    raise item
                yield item
                if isinstance(item, Done):
                    return
        finally:  # runs on cancellation too: no awaiting here
            ticket.release()
            if job is not None:
                job.cancel()
            elif runner is not None:  # it never reached the worker
                self._job_finished(runner)

    def _submit(self, runner: Runner, job: Job, keep_alive_s: float) -> None:
        """Queue `job` on the runner's worker; `runner.active` already counts it."""
        runner.keep_alive_s = keep_alive_s
        runner.expires_at = None
        future = runner.executor.submit(runner.run, job)
        loop = job.loop

        def finished(_: Future[None]) -> None:
            try:
                loop.call_soon_threadsafe(self._job_finished, runner)
            except RuntimeError:  # the loop is closed (server shut down)
                pass

        future.add_done_callback(finished)

    def _job_finished(self, runner: Runner) -> None:
        runner.active -= 1
        runner.last_used = time.monotonic()
        if runner.active == 0:
            self._idle(runner)

    # ---- keep-alive and unloading ----------------------------------------------------------------

    def _keep_alive(self, keep_alive: float | None) -> float:
        seconds = self.default_keep_alive_s if keep_alive is None else float(keep_alive)
        return -1.0 if seconds > MAX_KEEP_ALIVE_S else seconds

    def _idle(self, runner: Runner) -> None:
        """`runner` has nothing to do: unload it now (keep_alive 0) or when its keep-alive ends."""
        if self.runners.get(runner.key) is not runner:  # unloaded while it worked: finish the job
            runner.close()
            runner.release()
            return
        if runner.keep_alive_s == 0:
            self._unload(runner)
        elif runner.keep_alive_s > 0:
            runner.expires_at = time.time() + runner.keep_alive_s
            if runner.expiry is not None:
                runner.expiry.cancel()
            runner.expiry = asyncio.get_running_loop().call_later(runner.keep_alive_s, self._expire, runner)
        else:
            runner.expires_at = None

    def _expire(self, runner: Runner) -> None:
        runner.expiry = None
        if self.runners.get(runner.key) is not runner:  # unloaded already (ft stop, or room for another)
            return
        if runner.active == 0 and runner.expires_at is not None and time.time() >= runner.expires_at - 0.01:
            self._unload(runner)

    def _unload(self, runner: Runner, cancel: bool = False) -> None:
        """Forget `runner`; its memory goes now, or when its last request is done (`_idle`)."""
        runner.expires_at = None
        if runner.expiry is not None:  # its keep-alive timer would find it gone (and hold it until then)
            runner.expiry.cancel()
            runner.expiry = None
        if self.runners.get(runner.key) is runner:
            del self.runners[runner.key]
            log.info("unloaded %s", runner.registered.name.display)
        if runner.active == 0 or cancel:
            runner.close(cancel)
            if runner.active == 0:
                runner.release()
            gc.collect()  # the weights are large: return their memory now, not at the next collection
            if runner.plan.device == "gpu" and torch.cuda.is_available():
                torch.cuda.empty_cache()  # and their VRAM to the driver: other programs may want it

    # ---- loading ---------------------------------------------------------------------------------

    def _tokenizer(self, registered: RegisteredModel) -> Tokenizer:
        digest = models.digest_of(registered)
        with self._tokenizer_lock:
            tokenizer = self._tokenizers.get(digest)
        if tokenizer is None:
            try:
                tokenizer = Tokenizer.from_model(registered)
            except TokenizerError as e:
                raise ServerError(str(e)) from None
            with self._tokenizer_lock:
                self._tokenizers[digest] = tokenizer
        return tokenizer

    def _asked_ctx(self, registered: RegisteredModel, num_ctx: int | None) -> int:
        """The context a load plans for: the request's num_ctx, else the recipe's, else the default."""
        return num_ctx or (registered.config.get("parameters") or {}).get("num_ctx") or self.default_num_ctx

    def _plan(self, registered: RegisteredModel, num_ctx: int | None, num_thread: int | None,
              machine: Machine | None = None) -> Plan:
        """The plan of a load: a request's own `num_ctx` exactly (or BadRequest with the numbers,
        where the model fits with less; ModelTooLarge where it fits with none), else the recipe's
        or the default context, lowered to fit."""
        with registered.open_ftw() as reader:
            footprint = ModelFootprint.from_index(reader.index, name=registered.name.display,
                                                  context_length=registered.context_length)
        machine = machine or self.machine()
        if num_thread is None:
            # Leave one core to the HTTP side: measured on 2 cores (docs/benchmark-history.md), compute threads
            # spinning on every core starve the event loop and streaming lost more than compute gained.
            num_thread = max(1, machine.num_physical_cores - 1)
        overrides = PlanOverrides(num_ctx=num_ctx, default_num_ctx=self._asked_ctx(registered, None),
                                  num_threads=num_thread, device=self.device, ram_budget_bytes=self.ram_budget_bytes,
                                  vram_budget_bytes=self.vram_budget_bytes)
        try:
            fitted = plan(footprint, machine, overrides)
        except FitError as e:
            if num_ctx is not None and plan(footprint, machine, replace(overrides, num_ctx=1, force=True)).fits:
                raise BadRequest(str(e)) from None  # this request's num_ctx, not the model, does not fit
            raise ModelTooLarge(str(e)) from None
        for warning in fitted.warnings:
            log.warning("%s: %s", registered.name.display, warning)
        return fitted

    def _context_for(self, runner: Runner, num_ctx: int, exact: bool = False) -> int:
        """The context a request asking for `num_ctx` (`_asked_ctx`: its own, `exact`, else the
        default) runs with, for this request only (one small num_ctx must not shrink the requests
        after it). Its own: exactly that (lowered only to the model's most), or BadRequest with
        the numbers. The default: the load's where its load asked the same, else as the planner
        lowers it. On the GPU the KV cache was sized at load inside the VRAM budget, beside the
        expert cache that fills the rest: a request runs within it (a larger num_ctx of its own
        reloaded the model first, `_outgrown`); planning again would see that VRAM as taken."""
        loaded, most = runner.plan.context_length, runner.plan.model_context_length or num_ctx
        if runner.plan.device == "gpu":
            context = min(num_ctx, most, loaded)
            if exact and context < min(num_ctx, most):  # (a reload for it is planned exactly, or refused)
                raise BadRequest(f"num_ctx {num_ctx}: {runner.registered.name.display} is loaded with a context of "
                                 f"{loaded} tokens; retry once its requests are done, or ask for at most {loaded}")
            return context
        if num_ctx == loaded or (not exact and num_ctx == runner.asked_ctx):
            return loaded
        return self._plan(runner.registered, num_ctx if exact else None, None).context_length

    @staticmethod
    def _outgrown(runner: Runner, num_ctx: int | None) -> bool:
        """A GPU model asked, by a request's own num_ctx, for more context than its load holds
        (Ollama reloads a model for a new num_ctx): load it again, planned for exactly that."""
        if runner.plan.device != "gpu" or num_ctx is None:
            return False
        return runner.plan.context_length < min(num_ctx, runner.plan.model_context_length or num_ctx)

    def _once_unloaded(self) -> Machine:
        """This machine as a load will see it once the GPU's model (one at a time: make_gpu_room)
        is unloaded: what this process's allocator holds is free again."""
        machine = self.machine()
        if machine.gpu is None or not torch.cuda.is_available():
            return machine
        free = min(machine.gpu.vram_free_bytes + torch.cuda.memory_reserved(), machine.gpu.vram_total_bytes)
        return replace(machine, gpu=replace(machine.gpu, vram_free_bytes=free))

    async def _runner(self, registered: RegisteredModel, num_ctx: int | None,
                      num_thread: int | None) -> tuple[Runner, float]:
        """The loaded model for `registered` (loading it once however many requests ask)."""
        key = str(registered.name)
        digest = models.digest_of(registered)
        runner = self.runners.get(key)
        if runner is not None and runner.digest == digest and not runner.draining \
                and not self._outgrown(runner, num_ctx):
            return runner, 0.0
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:  # one load at a time: memory decisions see every loaded model
            runner = self.runners.get(key)
            if runner is not None and runner.digest == digest and not self._outgrown(runner, num_ctx):
                runner.draining = False  # (the load that waited for it failed, or was for another GPU)
                return runner, 0.0
            if runner is not None and runner.digest == digest:  # more context than its load holds: where even
                # its VRAM cannot hold it, refused with the numbers before the model is unloaded
                await asyncio.to_thread(lambda: self._plan(registered, num_ctx, num_thread, self._once_unloaded()))
            if runner is not None:  # the name points at another model (re-pulled, re-created), or more context
                self._unload(runner)
            if self.device != "cpu":  # first: the plan sizes its cache from the VRAM left free
                await make_gpu_room(self.runners, registered, self._unload)
            fitted = await asyncio.to_thread(self._plan, registered, num_ctx, num_thread)
            await make_room(self.runners, fitted, self._unload)
            load = asyncio.ensure_future(asyncio.to_thread(self._load, registered, fitted))
            try:
                runner = await asyncio.shield(load)
            except asyncio.CancelledError:
                # the requester left while the model loads: the load ends under the lock (a second
                # one beside it would size its memory from the same free VRAM), and the model is
                # kept, idle, for its keep-alive (not dropped with its executor never closed)
                while not load.done():
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.shield(load)
                if load.exception() is None:
                    self._register(load.result(), registered, num_ctx)
                    self._idle(load.result())
                raise
            self._register(runner, registered, num_ctx)
            return runner, runner.load_seconds

    def _register(self, runner: Runner, registered: RegisteredModel, num_ctx: int | None) -> None:
        runner.asked_ctx = self._asked_ctx(registered, num_ctx)
        self.runners[runner.key] = runner

    def _load(self, registered: RegisteredModel, fitted: Plan) -> Runner:
        torch.set_num_threads(fitted.num_threads)
        start = time.perf_counter()
        refused: tuple[type[Exception], ...] = (UnsupportedFamilyError,)
        if fitted.device == "gpu":
            from runtime.gpu import CacheTooSmallError, UnsupportedOnDevice

            refused += (CacheTooSmallError, UnsupportedOnDevice)  # this server's budget or mode: not a damaged model
        try:
            gpu = {"backend": "gpu", "fit": fitted, "mode": self.gpu_mode, **self.gpu_options} if fitted.device == "gpu" else {}
            loaded = load_registered(registered, compute_dtype(registered.config), **gpu)
        except refused as e:
            raise BadRequest(str(e)) from None
        except Exception as e:  # a damaged model on disk: name it, keep serving the others
            log.exception("loading %s failed", registered.name.display)
            raise ServerError(f"cannot load {registered.name.display}: {e}; `ft verify` it, or pull it again") from None
        tokenizer = self._tokenizer(registered)
        seconds = time.perf_counter() - start
        log.info("loaded %s in %.2fs (context %d, %d threads)", registered.name.display, seconds,
                 fitted.context_length, fitted.num_threads)
        return Runner(registered, loaded, tokenizer, fitted, seconds)
