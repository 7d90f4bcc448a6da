"""A flag in pinned host memory that a device stream waits on: how the GPU waits for the CPU's
share of a layer without the launching thread waiting.

The CPU worker writes its result into pinned memory, then bumps the flag; the stream was told
(cuStreamWaitValue32, a stream memory operation of the driver API) to hold its later work until
the flag reaches the value, so the copy of the result and everything after it are queued by
the main thread long before the CPU finishes. Where the driver refuses stream memory operations
(or off CUDA), `StreamWaiter` is None and the executor waits on the host instead.

x86 stores reach memory in program order, so the result bytes are visible before the flag.
"""

from __future__ import annotations

import ctypes
import logging

import torch

log = logging.getLogger(__name__)

CU_STREAM_WAIT_VALUE_EQ = 0x1


class HostFlag:
    """One 32-bit counter in host memory: pinned (page-locked, mapped) when `pinned`."""

    def __init__(self, pinned: bool = True) -> None:
        self._tensor = torch.zeros(1, dtype=torch.int32, device="cpu", pin_memory=pinned)
        self._view = self._tensor.numpy()  # the same memory: a store without a torch dispatch
        self.address = self._tensor.data_ptr()  # under unified addressing also the device address
        self.value = 0  # the last value set; 0 at the start

    def set(self, value: int) -> None:
        """Store `value` (1 .. 2**32 - 1: the stream compares the 32 bits)."""
        self._view[0] = value - (1 << 32) if value >= 1 << 31 else value
        self.value = value


class StreamWaiter:
    """Enqueues "wait until flag == value" on a CUDA stream (cuStreamWaitValue32)."""

    def __init__(self, fn) -> None:
        self._fn = fn

    @staticmethod
    def load(device: torch.device) -> StreamWaiter | None:
        """The driver's wait-value entry point, probed once on `device`; None where unsupported."""
        if device.type != "cuda":
            return None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            log.info("no libcuda (%s): the CPU share is awaited on the host", e)
            return None
        fn = None
        for name in ("cuStreamWaitValue32_v2", "cuStreamWaitValue32"):
            fn = getattr(lib, name, None)
            if fn is not None:
                break
        if fn is None:
            return None
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
        waiter = StreamWaiter(fn)
        probe = HostFlag()
        probe.set(1)
        with torch.cuda.device(device):
            err = waiter._enqueue(probe, 1)
            torch.cuda.synchronize(device)
        if err != 0:
            log.info("cuStreamWaitValue32 refused (CUresult %d): the CPU share is awaited on the host", err)
            return None
        return waiter

    def _enqueue(self, flag: HostFlag, value: int) -> int:
        stream = torch.cuda.current_stream().cuda_stream
        return self._fn(ctypes.c_void_p(stream), ctypes.c_uint64(flag.address), ctypes.c_uint32(value),
                        CU_STREAM_WAIT_VALUE_EQ)

    def wait(self, flag: HostFlag, value: int) -> None:
        """The current stream's later work waits until `flag` holds `value`."""
        err = self._enqueue(flag, value)
        if err != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed (CUresult {err})")
