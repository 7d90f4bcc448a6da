"""Memory for a model about to load (backend.py): which loaded models go to make room for it.

Loaded models are unloaded least recently used first, idle ones only. A model still generating
is waited for briefly (host RAM) or until it finishes (the GPU, which GPU-runtime models take
one at a time: each one's expert cache fills the VRAM its budget leaves).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from runtime.loading.registered import RegisteredModel
from runtime.planner.plan import Plan

from .protocol import Busy
from .runner import Runner

log = logging.getLogger(__name__)

ROOM_WAIT_S = 1.0  # how long a load waits for a busy model to free its memory before answering Busy

Unload = Callable[[Runner], None]


async def make_room(runners: Mapping[str, Runner], fitted: Plan, unload: Unload) -> None:
    """Unload idle models, least recently used first, until `fitted` fits beside the rest
    (`unload` takes a runner out of `runners`). A model still busy is waited for up to
    ROOM_WAIT_S: a client that sends its next request as soon as it has the last one's end gets
    there before the worker thread has handed the finished request back (the two meet on the
    event loop in either order)."""
    def resident() -> int:
        return sum(r.resident_bytes for r in runners.values())

    deadline = time.monotonic() + ROOM_WAIT_S
    while True:
        for runner in sorted(runners.values(), key=lambda r: r.last_used):
            if resident() + fitted.ram_needed_bytes <= fitted.ram_budget_bytes:
                return
            if runner.active == 0:
                log.info("unloading %s to make room for %s", runner.registered.name.display, fitted.model)
                unload(runner)
        if not runners or resident() + fitted.ram_needed_bytes <= fitted.ram_budget_bytes \
                or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.02)
    if runners and resident() + fitted.ram_needed_bytes > fitted.ram_budget_bytes:
        busy = ", ".join(r.registered.name.display for r in runners.values())
        raise Busy(f"not enough memory to load {fitted.model} while {busy} is generating "
                   f"(needs {fitted.ram_needed_bytes >> 20} MiB, {resident() >> 20} MiB in use of "
                   f"{fitted.ram_budget_bytes >> 20} MiB); retry when it is done")


async def make_gpu_room(runners: Mapping[str, Runner], registered: RegisteredModel, unload: Unload) -> None:
    """Unload the idle GPU-runtime models, and wait for a busy one to finish its requests."""
    waited = False
    while True:
        on_gpu = [runner for runner in runners.values() if runner.plan.device == "gpu"]
        for runner in on_gpu:
            if runner.active == 0:
                log.info("unloading %s to give the GPU to %s", runner.registered.name.display,
                         registered.name.display)
                unload(runner)
        busy = [runner for runner in on_gpu if runner.active]
        if not busy:
            return
        for runner in busy:  # its new requests queue behind this load: it goes idle (no starving)
            runner.draining = True
        if not waited:
            log.info("%s waits for the GPU: %s is generating", registered.name.display,
                     ", ".join(r.registered.name.display for r in busy))
            waited = True
        await asyncio.sleep(0.02)
