"""The output cast kernel against torch's cast (its twin), element for element.

Without CUDA the kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/kernels.py), whose
float32 -> bfloat16 truncates instead of rounding and mishandles subnormals: there a bf16 element
may be one unit in the last place below torch's, and subnormals are not compared. With CUDA compiled, bit for bit, and the `gpu` test casts inside a PDL
scope, as a step graph's capture does.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels import DEVICE, HAS_CUDA, import_kernel, needs

cast_out = import_kernel("cast_out", "cast_out")
needs_triton = needs(cast_out)


def awkward_values(n: int) -> torch.Tensor:
    """float32 values whose rounding to 16 bits is easy to get wrong: halfway cases (ties to
    even), values past the 16-bit range, subnormals, signed zeros, infinities and NaN."""
    gen = torch.Generator().manual_seed(n)
    halfway = (torch.arange(1, 65, dtype=torch.float32) + 0.5) * 2.0 ** -7  # bf16 ties
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, -1e-40, 3e38, 7e4, 65520.0])
    values = torch.cat([special, halfway, torch.randn(n, generator=gen) * torch.logspace(-6, 6, n)])
    return values[:n]


def assert_same_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    """Bit for bit; under the interpreter a bf16 element may be truncated (one unit below in
    magnitude), and its subnormals are left out."""
    got_bits, want_bits = got.view(torch.int16).to(torch.int32), want.view(torch.int16).to(torch.int32)
    if HAS_CUDA or want.dtype != torch.bfloat16:
        assert torch.equal(got_bits, want_bits)
        return
    normal = (want.abs() >= torch.finfo(torch.bfloat16).tiny) | (want == 0)
    assert int((got_bits - want_bits)[normal].abs().max()) <= 1


@needs_triton
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the interpreter's numpy: 3e38 -> inf
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 2048), (3, 1000), (1, 7)])
def test_cast_matches_torch(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """Every element rounds as torch rounds it (round to nearest even, overflow to inf), for
    rows shorter and longer than one program's block."""
    src = awkward_values(shape[0] * shape[1]).reshape(shape).to(DEVICE)
    got, want = cast_out(src, dtype), src.to(dtype)
    assert got.dtype == dtype and got.shape == src.shape
    assert_same_rounding(got, want)
    src[0, -1] = float("nan")
    assert torch.isnan(cast_out(src, dtype)[0, -1])


@needs_triton
def test_cast_of_a_strided_view_and_to_its_own_dtype() -> None:
    """A column slice is cast as torch casts it; a tensor already in the dtype is returned."""
    src = awkward_values(64 * 3).reshape(64, 3).to(DEVICE)
    assert_same_rounding(cast_out(src[:, 1], torch.bfloat16), src[:, 1].to(torch.bfloat16))
    same = src.to(torch.bfloat16)
    assert cast_out(same, torch.bfloat16) is same


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA or cast_out is None, reason="needs CUDA and triton")
def test_gpu_cast_in_a_pdl_chain_sees_the_kernel_before() -> None:
    """In a step graph's PDL scope the cast starts while the kernel before it runs and must wait
    for its writes: a captured chain of a long write and the cast gives the written values."""
    from runtime.gpu.kernels import dependent_launch

    src = torch.zeros(1, 8192, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), dependent_launch.for_step_graph():
        cast_out(src, torch.bfloat16)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            src.copy_(torch.arange(8192, device="cuda", dtype=torch.float32).reshape(1, -1) * 0.25)
            out = cast_out(src, torch.bfloat16)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, (torch.arange(8192, dtype=torch.float32) * 0.25).reshape(1, -1).to(torch.bfloat16).cuda())
