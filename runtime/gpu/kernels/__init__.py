"""GPU kernels of the hybrid runtime, each with a plain-torch reference twin (`*_ref`).

The references import only torch and are exported here; import a Triton kernel from its own
module (`from runtime.gpu.kernels.route_plan import route_plan`), so that installs without
triton can still use the references and the plan types.
"""

from .route_plan_ref import CPU, HIT, MAX_KERNEL_PAIRS, NUM_UNIQUE, PCIE, RoutePlan, route_plan_ref

__all__ = ["CPU", "HIT", "MAX_KERNEL_PAIRS", "NUM_UNIQUE", "PCIE", "RoutePlan", "route_plan_ref"]
