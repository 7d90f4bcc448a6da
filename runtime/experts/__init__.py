"""Expert memory and execution: host banks in the FTW layout, and executors that run experts.

Model code calls an `ExpertExecutor` with (layer, tokens, expert ids, routing weights); whether
the experts run on the CPU from the host bank or on the GPU from a cache is the executor's
business, so the same family code serves the CPU runtime and the GPU runtime.
"""

from .bank import HostExpertBank
from .executor import CPUExpertExecutor, ExpertExecutor

__all__ = ["CPUExpertExecutor", "ExpertExecutor", "HostExpertBank"]
