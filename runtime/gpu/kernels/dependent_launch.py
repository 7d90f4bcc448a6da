"""Programmatic dependent launch (PDL) for the decode kernels: a kernel launched with it may start
while the kernel before it on the stream is still running, and waits (`griddepcontrol.wait`)
before touching memory until that kernel has finished and its writes are visible. A decode layer
is a chain of short launches (route plan, gate pass, down pass), each a few microseconds on a GPU
that idles between them; PDL overlaps each launch's start with the tail of the one before.

Used only for whole decode steps captured as one graph (step_graphs.py), where it measured 1.02x
decode side by side on the H200. With PDL everywhere, the whole-model benchmark's per-call graphs
ran at 7.47 tok/s against 13.37 without, on another machine (not side by side, docs/benchmark-history.md):
calls outside step graphs launch as before until that is measured.
Hopper and later only (sm_90+: H100/H200, RTX 50xx); never under triton's interpreter. `FT_PDL=0`
turns it off (A/B benchmarks).

Each kernel takes a `PDL` constexpr and, when set, first waits for the kernel before it
(`gdc_wait`), before any load, store or early return (a program that returned without waiting
could let the kernel after it run before the one before it has finished), then lets the next
one start launching (`gdc_launch_dependents`: its programs wait likewise, so at most one
kernel's programs wait ahead of the running one).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch

_step_graph_scopes = 0  # open `for_step_graph` scopes (nested: a count)


@contextlib.contextmanager
def for_step_graph() -> Iterator[None]:
    """A whole decode step's kernels for its graph: its capture, and its first, uncaptured run
    (which compiles the PDL variants, so that the capture compiles nothing). Inside, kernels
    launch with PDL where `enabled`."""
    global _step_graph_scopes
    _step_graph_scopes += 1
    try:
        yield
    finally:
        _step_graph_scopes -= 1


def enabled(device: torch.device) -> bool:
    """Whether a launch on `device` now uses PDL: for a step graph, on CUDA sm_90+, compiled
    (not interpreted), FT_PDL not 0 (the environment is read once per process and device). A
    kernel takes it twice: as its PDL constexpr and as `launch_pdl` (which triton's interpreter
    ignores)."""
    return _step_graph_scopes > 0 and device.type == "cuda" and _enabled_on(device.index)


@functools.cache
def _enabled_on(index: int | None) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("FT_PDL") == "0":
        return False
    return torch.cuda.get_device_capability(index)[0] >= 9
