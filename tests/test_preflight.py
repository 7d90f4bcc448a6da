"""The fit check is a pure function of sizes: test it with real-looking numbers, no downloads."""

from __future__ import annotations

from ftpull.preflight import RAM_RESERVE_BYTES, Footprint, Resources, check_fit, footprint
from ftw.families import FAMILIES

GiB = 1 << 30


def qwen3_30b_tensors() -> dict[str, tuple[str, int]]:
    """Qwen3-30B-A3B's table in miniature: 48 layers x 128 experts x 3 projections of 2048x768 bf16."""
    tensors = {"model.embed_tokens.weight": ("bf16", 151936 * 2048 * 2), "lm_head.weight": ("bf16", 151936 * 2048 * 2)}
    for layer in range(48):
        tensors[f"model.layers.{layer}.self_attn.q_proj.weight"] = ("bf16", 4096 * 2048 * 2)
        for e in range(128):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                tensors[f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight"] = ("bf16", 768 * 2048 * 2)
    return tensors


def test_footprint_splits_experts_and_dense() -> None:
    fp = footprint(FAMILIES["qwen3_moe"], 48, qwen3_30b_tensors(), download_bytes=61 * GiB)
    assert fp.expert_bytes == 48 * 128 * 3 * 768 * 2048 * 2  # 58 GB of experts
    assert fp.dense_bytes == 2 * 151936 * 2048 * 2 + 48 * 4096 * 2048 * 2
    as_f32 = footprint(FAMILIES["qwen3_moe"], 48, qwen3_30b_tensors(), 0, target_dtype="f32")
    assert as_f32.expert_bytes == 2 * fp.expert_bytes


def test_footprint_drops_what_is_not_converted() -> None:
    tensors = {"model.layers.61.mlp.experts.0.up_proj.weight": ("f8_e4m3", 10**9),  # DeepSeek's MTP layer
               "model.layers.0.mlp.experts.0.up_proj.weight": ("f8_e4m3", 10**6)}
    fp = footprint(FAMILIES["deepseek_v3"], 61, tensors, 0)
    assert fp.expert_bytes == 10**6


def test_fits_on_a_workstation() -> None:
    fp = Footprint(download_bytes=61 * GiB, expert_bytes=57 * GiB, dense_bytes=3 * GiB)
    box = Resources(disk_free_bytes=500 * GiB, ram_total_bytes=96 * GiB, ram_available_bytes=90 * GiB, has_gpu=True)
    assert check_fit(fp, box) == []


def test_refusals_carry_the_numbers() -> None:
    fp = Footprint(download_bytes=61 * GiB, expert_bytes=57 * GiB, dense_bytes=3 * GiB)
    laptop = Resources(disk_free_bytes=100 * GiB, ram_total_bytes=32 * GiB, ram_available_bytes=20 * GiB, has_gpu=True)
    disk, ram = check_fit(fp, laptop)
    assert "disk: needs 122.2 GiB (61.0 GiB still to download + 61.2 GiB converted), 100.0 GiB free" in disk
    assert f"RAM: needs {57 + RAM_RESERVE_BYTES / GiB:.1f} GiB" in ram and "32.0 GiB" in ram and ":fp8" in ram


def test_without_gpu_the_dense_weights_need_ram_too() -> None:
    fp = Footprint(download_bytes=0, expert_bytes=20 * GiB, dense_bytes=12 * GiB)
    cpu_box = Resources(disk_free_bytes=10**13, ram_total_bytes=32 * GiB, ram_available_bytes=30 * GiB, has_gpu=False)
    gpu_box = Resources(disk_free_bytes=10**13, ram_total_bytes=32 * GiB, ram_available_bytes=30 * GiB, has_gpu=True)
    assert check_fit(fp, gpu_box) == []
    (problem,) = check_fit(fp, cpu_box)
    assert "no GPU found" in problem
