"""A copy stream and events that degrade to synchronous no-ops off CUDA.

The mechanism (cache fills, bank streaming) is written once against this class, so CI runs it
on CPU tensors: there every copy has finished when it returns and every event is already done.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class DeviceStreams:
    """The device's compute stream (torch's current stream) and one copy stream beside it."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.is_cuda else None

    @contextmanager
    def copying(self) -> Iterator[None]:
        """Issue the copies of the block on the copy stream, ordered after all work queued so far
        on the compute stream: a slot or buffer being overwritten may still be read by it."""
        if self.copy_stream is None:
            yield
            return
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            yield

    def record(self) -> torch.cuda.Event | None:
        """An event after the copies issued so far (inside `copying`: on the copy stream)."""
        if not self.is_cuda:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Make the compute stream wait for `event` (the host does not wait)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    def wait_for_copies(self) -> None:
        """Make the compute stream wait for every copy queued so far on the copy stream (the host
        does not wait)."""
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)

    def upload(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device with no host wait: staged through pinned memory (a copy
        from pageable memory would first wait for everything queued on the stream)."""
        if not self.is_cuda or t.device.type != "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def download(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Device tensors on the host (pinned) after one wait for the compute stream."""
        if not self.is_cuda:
            return list(tensors)
        host = [t.to("cpu", non_blocking=True) for t in tensors]
        torch.cuda.current_stream(self.device).synchronize()
        return host

    def synchronize(self) -> None:
        """The host waits for both streams: a safe point (resize, clear)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
