"""Programmatic dependent launch (PDL) for the decode kernels: a kernel launched with it may start
while the kernel before it on the stream is still running, and waits (`griddepcontrol.wait`)
before touching memory until that kernel has finished and its writes are visible. A decode layer
is a chain of short launches (route plan, gate pass, down pass), each a few microseconds on a GPU
that idles between them; PDL overlaps each launch's start with the tail of the one before.

Hopper and later only (sm_90+: H100/H200, RTX 50xx); never under triton's interpreter. `FT_PDL=0`
turns it off (A/B benchmarks).

Each kernel takes a `PDL` constexpr and, when set, calls `wait_for_previous` first, before any
load, store or early return: a program that returned without waiting could let the kernel after
it run before the one before it has finished.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


def enabled(device: torch.device) -> bool:
    """Whether launches on `device` use PDL: CUDA sm_90+, compiled (not interpreted), FT_PDL not 0
    (the environment is read once per process and device). A kernel takes it twice: as its PDL
    constexpr and as `launch_pdl` (which triton's interpreter ignores)."""
    return device.type == "cuda" and _enabled_on(device.index)


@functools.cache
def _enabled_on(index: int | None) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("FT_PDL") == "0":
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9


@triton.jit
def wait_for_previous():
    """The first statement of a PDL kernel: wait for the previous kernel on the stream to finish (its
    writes visible), then let the next one start launching (its programs wait likewise, so at
    most one kernel's programs wait ahead of the running one)."""
    gdc_wait()
    gdc_launch_dependents()
