"""`ft bench`: the MoE expert-path benchmark of the hybrid runtime (DESIGN.md §5, §9)."""

from .moe import POLICIES, BenchConfig, format_report, run_bench
from .shapes import SHAPES, BenchShape

__all__ = ["POLICIES", "SHAPES", "BenchConfig", "BenchShape", "format_report", "run_bench"]
