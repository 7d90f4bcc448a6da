"""Every Triton kernel compiles for the CUDA cards ft targets, on a machine with no GPU
(tests/compile_kernels.py, in its own process: the other kernel tests run triton's interpreter,
which never types or lowers a kernel)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from tests.compile_kernels import variants  # noqa: E402 - only where triton is installed

ROOT = Path(__file__).resolve().parents[1]
SKIP = 77  # compile_kernels.py: this triton has no CUDA backend


@pytest.mark.parametrize("sm", [86, 89, 90])  # RTX 30xx, RTX 40xx, H100/H200
def test_every_kernel_compiles_for_the_target(sm: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "compile_kernels.py"), str(sm)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    if run.returncode == SKIP:
        pytest.skip(run.stdout.strip())
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.count(f"sm_{sm} ") == len(variants(sm))  # every variant compiled
