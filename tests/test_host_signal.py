"""HostFlag: the 32-bit counter a device stream waits on (the CPU share's hand-back)."""

from __future__ import annotations

import torch

from runtime.gpu.host_signal import HostFlag, StreamWaiter


def test_the_flag_stores_all_32_bits() -> None:
    flag = HostFlag(pinned=False)
    for value in (1, 2**31 - 1, 2**31, 2**32 - 1):
        flag.set(value)
        assert flag.value == value
        assert int(flag._tensor.view(torch.uint8).numpy().view("<u4")[0]) == value  # what the device compares


def test_no_stream_waiter_off_cuda() -> None:
    assert StreamWaiter.load(torch.device("cpu")) is None
