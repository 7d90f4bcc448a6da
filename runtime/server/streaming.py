"""Helpers every API flavour needs around a backend's event stream.

- `start(events, request)`: wait for the first event before answering, so that errors raised
  before generation starts (unknown model, bad option, queue full) become the response's status
  code instead of an in-band error; gives up as soon as the client disconnects.
- `collect(events, request)`: every event, for `stream: false`; stops (cancelling the
  generation) when the client disconnects.

While a response streams, Starlette cancels the body iterator when the client goes away, and
the backend's generator cancels its generation from its `finally`; nothing here is needed then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from starlette.requests import Request

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


async def start(events: AsyncIterator[T], request: Request) -> tuple[T, AsyncIterator[T]] | None:
    """(first event, the rest); None when the client left. Errors of the stream propagate."""
    it = events.__aiter__()
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
    it = events.__aiter__()
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


async def _close(it: Any) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()
