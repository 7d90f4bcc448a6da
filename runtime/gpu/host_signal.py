"""Flags in pinned host memory that a device stream writes and waits on: how the GPU and the CPU
share's worker hand a decode layer call to each other with no host sync, inside CUDA graphs too.

The stream writes a flag when the call's inputs have reached pinned memory (cuStreamWriteValue32)
and the worker, which was handed the call beforehand, waits for it on the host (`HostFlag.wait`,
a spin in the compiled kernel library with the GIL released); the worker writes its result
into pinned memory and sets a second flag, which the stream was told to wait for
(cuStreamWaitValue32) before it copies the result up. Both are stream memory operations of the
driver API: the launching thread queues them with everything else, and a CUDA graph captures
them (`StreamFlags.capturable`, probed once), so a decode call with a CPU share is replayed like
any other. Where the driver refuses them (or off CUDA), `StreamFlags.load` is None and the
executor waits on the host instead.

x86 stores reach memory in program order, so the result bytes are visible before the flag.
"""

from __future__ import annotations

import ctypes
import logging
import time

import torch

from ..experts.cpu_kernels import native_kernel

log = logging.getLogger(__name__)

CU_STREAM_WAIT_VALUE_GEQ = 0x0  # (int32)(*flag - value) >= 0: later values release earlier waits too
CU_STREAM_WAIT_VALUE_EQ = 0x1
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0  # with a memory barrier: earlier work's writes land first


class HostFlag:
    """One 32-bit value in host memory: pinned (page-locked, mapped) when `pinned`."""

    def __init__(self, pinned: bool = True) -> None:
        self._tensor = torch.zeros(1, dtype=torch.int32, device="cpu", pin_memory=pinned)
        self._view = self._tensor.numpy()  # the same memory: a store without a torch dispatch
        self.address = self._tensor.data_ptr()  # under unified addressing also the device address

    def set(self, value: int) -> None:
        """Store `value` (0 .. 2**32 - 1: the stream compares the 32 bits)."""
        self._view[0] = value - (1 << 32) if value >= 1 << 31 else value

    def read(self) -> int:
        return int(self._view[0]) & 0xFFFFFFFF

    def wait(self, value: int, timeout_s: float) -> bool:
        """Wait until the flag holds `value` (set by the device or another thread), without the
        GIL where the kernel library is built; False after `timeout_s`."""
        kernel = native_kernel()
        if kernel is not None:
            return kernel.wait_u32(self.address, value, timeout_s)
        deadline = time.perf_counter() + timeout_s
        while self.read() != value:  # no compiled library: look, giving the GIL up between looks
            if time.perf_counter() > deadline:
                return False
            time.sleep(0)
        return True


class StreamFlags:
    """Enqueues "write value to flag" and "wait until flag == value" on the current CUDA stream."""

    def __init__(self, wait_fn, write_fn) -> None:
        self._wait, self._write = wait_fn, write_fn
        self.capturable = False  # whether a CUDA graph may capture them (probed in `load`)

    @staticmethod
    def load(device: torch.device) -> StreamFlags | None:
        """The driver's stream memory operations, probed once on `device`; None where unsupported."""
        if device.type != "cuda":
            return None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            log.info("no libcuda (%s): the CPU share is awaited on the host", e)
            return None
        fns = []
        for names in (("cuStreamWaitValue32_v2", "cuStreamWaitValue32"),
                      ("cuStreamWriteValue32_v2", "cuStreamWriteValue32")):
            fn = next((getattr(lib, name) for name in names if hasattr(lib, name)), None)
            if fn is None:
                return None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
            fn.restype = ctypes.c_int
            fns.append(fn)
        flags = StreamFlags(*fns)
        probe = HostFlag()
        with torch.cuda.device(device):
            err = flags._enqueue_write(probe, 1) or flags._enqueue_wait(probe, 1)
            torch.cuda.synchronize(device)
        if err != 0 or probe.read() != 1:
            log.info("stream memory operations refused (CUresult %d): the CPU share is awaited on the host", err)
            return None
        flags.capturable = flags._probe_capture(device, probe)
        return flags

    def _probe_capture(self, device: torch.device, probe: HostFlag) -> bool:
        """Whether a CUDA graph captures a write and a wait, and its replay runs them."""
        try:
            with torch.cuda.device(device):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    self.write(probe, 2)
                    self.wait(probe, 2)
                probe.set(0)
                graph.replay()
                torch.cuda.synchronize(device)
                return probe.read() == 2
        except RuntimeError as e:
            log.info("CUDA graphs do not capture stream memory operations here (%s): decode calls with a CPU "
                     "share run uncaptured", e)
            return False

    def _stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def _enqueue_wait(self, flag: HostFlag, value: int, how: int = CU_STREAM_WAIT_VALUE_EQ) -> int:
        return self._wait(self._stream(), ctypes.c_uint64(flag.address), ctypes.c_uint32(value), how)

    def _enqueue_write(self, flag: HostFlag, value: int) -> int:
        return self._write(self._stream(), ctypes.c_uint64(flag.address), ctypes.c_uint32(value),
                           CU_STREAM_WRITE_VALUE_DEFAULT)

    def wait(self, flag: HostFlag, value: int) -> None:
        """The current stream's later work waits until `flag` holds `value`."""
        err = self._enqueue_wait(flag, value)
        if err != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed (CUresult {err})")

    def wait_at_least(self, flag: HostFlag, value: int) -> None:
        """The current stream's later work waits until `flag` holds `value` or a later one."""
        err = self._enqueue_wait(flag, value, CU_STREAM_WAIT_VALUE_GEQ)
        if err != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed (CUresult {err})")

    def write(self, flag: HostFlag, value: int) -> None:
        """The current stream writes `value` into `flag` once its earlier work is done."""
        err = self._enqueue_write(flag, value)
        if err != 0:
            raise RuntimeError(f"cuStreamWriteValue32 failed (CUresult {err})")


class Doorbell:
    """Work queued on a stream and held on the device until the host rings for it: a decode step's
    launches made while the step before still runs, released the moment the host has what it
    needed from that step (its token). The host's launch work then overlaps the device's, and the
    device waits only for the ring (a store into pinned memory the stream polls), not for the
    launches: on the H200 a 48-layer step graph went from 1.467 to 1.287 ms a step, its device
    time 1.276 (benchmarks/bench_decode_layer.py).

    Nothing may wait for the stream's end (a device synchronize, a capture) between a `hold` and
    its `ring`: the stream cannot get there before the ring."""

    def __init__(self, flags: StreamFlags, flag: HostFlag | None = None) -> None:
        self.flags, self.flag, self.count, self.rung = flags, flag or HostFlag(), 0, 0

    @property
    def holding(self) -> bool:
        """Whether work is held that no ring has released yet."""
        return self.rung < self.count

    def hold(self) -> int:
        """The current stream's later work waits for `ring(n)`; returns n."""
        self.count += 1
        self.flags.wait_at_least(self.flag, self.count)
        return self.count

    def ring(self, n: int) -> None:
        """Release the work held by `hold` n (and any before it)."""
        self.rung = max(self.rung, n)
        self.flag.set(n)

    def check_released(self, what: str) -> None:
        """Raise where `what` would wait for the device while work is held (it would never end)."""
        if self.holding:
            raise RuntimeError(f"{what} while a queued decode step is held on the device: start or cancel it first "
                               "(waiting for the device now would wait for ever)")
