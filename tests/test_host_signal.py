"""HostFlag and StreamFlags: the 32-bit flags through which the device and the CPU share's worker
hand a decode call to each other."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from runtime.gpu import host_signal
from runtime.gpu.host_signal import HostFlag, StreamFlags


def test_the_flag_stores_all_32_bits() -> None:
    flag = HostFlag(pinned=False)
    for value in (1, 2**31 - 1, 2**31, 2**32 - 1):
        flag.set(value)
        assert flag.read() == value
        assert int(flag._tensor.view(torch.uint8).numpy().view("<u4")[0]) == value  # what the device compares


def test_no_stream_flags_off_cuda() -> None:
    assert StreamFlags.load(torch.device("cpu")) is None


@pytest.mark.parametrize("native", [True, False], ids=["kernel-library", "python"])
def test_wait_returns_when_another_thread_sets_the_flag_and_times_out_otherwise(native: bool, monkeypatch) -> None:
    if not native:  # no compiled library: the Python loop that gives the GIL up between looks
        monkeypatch.setattr(host_signal, "native_kernel", lambda: None)
    elif host_signal.native_kernel() is None:
        pytest.skip("the kernel library cannot be built here")
    flag = HostFlag(pinned=False)
    assert not flag.wait(1, 0.02)  # nobody sets it: a timeout, not a hang
    setter = threading.Timer(0.05, flag.set, (1,))
    start = time.perf_counter()
    setter.start()
    assert flag.wait(1, 5.0)
    assert 0.04 < time.perf_counter() - start < 2.0  # waited for the store, and saw it soon after
    flag.set(2**32 - 1)
    assert flag.wait(2**32 - 1, 0.1)  # the whole 32 bits are compared
    setter.join()
