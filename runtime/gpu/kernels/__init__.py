"""GPU kernels of the hybrid runtime, each with a plain-torch reference twin (`*_ref`).

The references import only torch (and the pure policy module) and are exported here; import a Triton kernel from its own
module (`from runtime.gpu.kernels.route_plan import route_plan`), so that installs without
triton can still use the references and the plan types, or ask `triton_module` for one.
"""

import functools
import importlib
from types import ModuleType

from .route_plan_ref import (
    CPU,
    HIT,
    MAX_KERNEL_PAIRS,
    NUM_COUNTS,
    NUM_UNIQUE,
    PCIE,
    PINNED_TIME,
    RANKED,
    TAIL,
    RoutePlan,
    route_plan_ref,
)

__all__ = ["CPU", "HIT", "MAX_KERNEL_PAIRS", "NUM_COUNTS", "NUM_UNIQUE", "PCIE", "PINNED_TIME", "RANKED", "TAIL",
           "RoutePlan", "route_plan_ref", "triton_module"]


@functools.cache
def triton_module(name: str) -> ModuleType | None:
    """Kernel module `name` of this package, imported on first use (its callers are on CUDA, and
    tests choose triton's interpreter before it loads) and kept: a decode layer call asks several
    times. None without triton (the caller's torch path serves)."""
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ImportError:  # pragma: no cover - depends on the install
        return None
