"""Helpers every API flavour needs around a backend's event stream.

- `start(events, request)`: wait for the first event before answering, so that errors raised
  before generation starts (unknown model, bad option, queue full) become the response's status
  code instead of an in-band error; gives up as soon as the client disconnects.
- `collect(events, request)`: every event, for `stream: false`; stops (cancelling the
  generation) when the client disconnects.

Both take the backend's `Started` (the prompt's token count) out of the stream: it is not output,
and waiting for the first event means waiting for the first output. `start` hands it to
`on_started` (the Anthropic flavour's message_start reports the prompt's tokens).

While a response streams, Starlette cancels the body iterator when the client goes away, and
the backend's generator cancels its generation from its `finally`; nothing here is needed then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.requests import Request

from .protocol import Started

T = TypeVar("T")

DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _next(it: AsyncIterator[T], request: Request) -> T:
    """The next item of `it`; StopAsyncIteration at its end, ClientGone if the client leaves first."""
    task = asyncio.ensure_future(it.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def start(events: AsyncIterator[T], request: Request,
                on_started: Callable[[Started], object] | None = None) -> tuple[T, AsyncIterator[T]] | None:
    """(first event, the rest), without Started events (each given to `on_started`); None when
    the client left. Errors of the stream propagate."""
    it = _without_started(events.__aiter__(), on_started)
    try:
        first = await _next(it, request)
    except ClientGone:
        await _close(it)
        return None
    except BaseException:
        await _close(it)
        raise
    return first, it


async def collect(events: AsyncIterator[T], request: Request) -> list[T] | None:
    """Every event; None when the client left. Errors of the stream propagate."""
    it = _without_started(events.__aiter__(), None)
    out: list[T] = []
    try:
        while True:
            out.append(await _next(it, request))
    except StopAsyncIteration:
        return out
    except ClientGone:
        return None
    finally:
        await _close(it)


async def _without_started(events: AsyncIterator[T], on_started: Callable[[Started], object] | None) -> AsyncIterator[T]:
    try:
        async for event in events:
            if isinstance(event, Started):
                if on_started is not None:
                    on_started(event)
                continue
            yield event
    finally:  # closing this closes the backend's stream (its generation is cancelled)
        await _close(events)


async def _close(it: Any) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
