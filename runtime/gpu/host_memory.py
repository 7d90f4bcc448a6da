"""Pinning the expert banks in place (cudaHostRegister), after FTW has read them.

Why not `torch.empty(pin_memory=True)`: torch's pinned allocator rounds every block up to a power
of two (a 1.2 GB bank takes 2 GB of page-locked memory) and keeps freed blocks cached. The banks
are read with O_DIRECT into page-aligned anonymous memory (`page_aligned_empty`), then that
memory is registered with CUDA: no copy, no rounding ("pin after fill", DESIGN §5). Pageable
banks still work (copies run ~8x slower and stop overlapping), so a refusal or a cap only warns.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

from ..experts import HostExpertBank

log = logging.getLogger(__name__)

# address -> how many HostPinners hold its registration: two executors over the same banks must
# not unpin them under each other
_registrations: dict[int, int] = {}


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@functools.cache
def _cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process has loaded (torch's), or None: another copy would
    keep an error state of its own."""
    try:
        with open("/proc/self/maps") as maps:
            loaded = sorted({line.split()[-1] for line in maps if "/libcudart.so" in line})
        return ctypes.CDLL(loaded[0]) if loaded else None
    except (OSError, IndexError):
        return None


def clear_cuda_error() -> None:
    """A refused cudaHostRegister is also the CUDA runtime's last error, which torch's next
    kernel-launch check would raise as that kernel's own: read it away (cudaGetLastError is not
    among torch's cudart bindings). Where the runtime cannot be found, nothing is done."""
    lib = _cudart()
    if lib is not None:
        lib.cudaGetLastError()


class HostPinner:
    """Registers host tensors with CUDA, up to `max_pinned_bytes`; unregisters them on `close`."""

    def __init__(self, max_pinned_bytes: int | None = None) -> None:
        self.max_pinned_bytes = max_pinned_bytes
        self.pinned_bytes = 0
        self.pageable_bytes = 0
        self._registered: list[tuple[int, torch.Tensor]] = []
        self._warned = False

    def pin(self, data: torch.Tensor) -> bool:
        """Page-lock `data` (contiguous CPU) in place; False (with one warning) when refused or capped."""
        nbytes = data.numel() * data.element_size()
        ptr = data.data_ptr()
        if ptr in _registrations:
            _registrations[ptr] += 1
            self._registered.append((ptr, data))
            self.pinned_bytes += nbytes
            return True
        if nbytes == 0 or data.is_pinned():  # torch's own pinned memory
            return True
        if self.max_pinned_bytes is not None and self.pinned_bytes + nbytes > self.max_pinned_bytes:
            return self._refused(nbytes, f"the pinning cap of {_size(self.max_pinned_bytes)} is reached")
        if not torch.cuda.is_available():
            return self._refused(nbytes, "CUDA is not available")
        err = torch.cuda.cudart().cudaHostRegister(data.data_ptr(), nbytes, 0)
        if int(err) != 0:
            clear_cuda_error()
            return self._refused(nbytes, f"cudaHostRegister refused {_size(nbytes)} (error {int(err)})")
        _registrations[ptr] = 1
        self._registered.append((ptr, data))  # the tensor keeps the memory alive while registered
        self.pinned_bytes += nbytes
        return True

    def pin_banks(self, banks: dict[int, HostExpertBank]) -> None:
        for layer in sorted(banks):
            self.pin(banks[layer].data)
        if self.pageable_bytes:
            log.warning("expert banks: %s pinned, %s pageable", _size(self.pinned_bytes), _size(self.pageable_bytes))

    def _refused(self, nbytes: int, why: str) -> bool:
        self.pageable_bytes += nbytes
        if not self._warned:
            log.warning("expert banks stay in pageable memory (%s): cache fills from them run ~8x slower and "
                        "block the host; raise the limit (ulimit -l, max_pinned_bytes) or free RAM", why)
            self._warned = True
        return False

    def close(self) -> None:
        """Unregister everything (before the memory is freed)."""
        for ptr, _ in self._registered:
            _registrations[ptr] -= 1
            if not _registrations[ptr]:
                del _registrations[ptr]
                torch.cuda.cudart().cudaHostUnregister(ptr)
        self._registered.clear()
        self.pinned_bytes = 0

    def __del__(self) -> None:
        if self._registered:
            try:
                self.close()
            except Exception:  # interpreter shutdown: the process frees everything anyway
                pass
