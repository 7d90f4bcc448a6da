"""Will it fit? Disk and host RAM checks made from the config and safetensors headers alone.

Runs before a single weight byte is downloaded. The numbers come from the tensor table, so a
refusal can say exactly what is needed, what the machine has, and what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from ftw.families import Family, parse_expert_name

CAST_BYTES = {"auto": None, "bf16": 2, "f16": 2, "f32": 4, "fp8": None}
FLOAT_BYTES = {"f32": 4, "f16": 2, "bf16": 2}
RAM_RESERVE_BYTES = 2 << 30  # the OS, the runtime's own code, activations and KV on the CPU path
DISK_SLACK = 1.02  # alignment padding, index, tokenizer files


class FitError(Exception):
    """The model does not fit this machine; the message has the numbers and the way out."""


@dataclass(frozen=True)
class Footprint:
    """Sizes of a checkpoint as ft will store and load it."""

    download_bytes: int  # still to download (what is already on disk is not counted)
    expert_bytes: int  # routed experts, as stored in FTW
    dense_bytes: int  # everything else, as stored in FTW

    @property
    def ftw_bytes(self) -> int:
        return int((self.expert_bytes + self.dense_bytes) * DISK_SLACK)


@dataclass(frozen=True)
class Resources:
    disk_free_bytes: int
    ram_total_bytes: int
    ram_available_bytes: int
    has_gpu: bool

    @staticmethod
    def probe(disk_free_bytes: int) -> Resources:
        vm = psutil.virtual_memory()
        try:
            import torch

            has_gpu = bool(torch.cuda.is_available())
        except Exception:  # a broken CUDA install must not stop a pull
            has_gpu = False
        return Resources(disk_free_bytes, vm.total, vm.available, has_gpu)


def footprint(
    family: Family,
    num_layers: int,
    tensors: dict[str, tuple[str, int]],
    download_bytes: int,
    target_dtype: str = "auto",
) -> Footprint:
    """Expert and dense bytes after conversion, from (FTW dtype, nbytes) per source tensor."""
    cast = CAST_BYTES.get(target_dtype)
    expert = dense = 0
    for name, (dtype, nbytes) in tensors.items():
        if not family.keeps(name, num_layers):
            continue
        stored = nbytes
        if cast and dtype in FLOAT_BYTES and not name.endswith("_scale_inv"):
            stored = nbytes // FLOAT_BYTES[dtype] * cast
        if parse_expert_name(name) is not None:
            expert += stored
        else:
            dense += stored
    return Footprint(download_bytes=download_bytes, expert_bytes=expert, dense_bytes=dense)


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_fit(fp: Footprint, res: Resources) -> list[str]:
    """Every reason the model cannot be pulled and run here (empty when it fits)."""
    problems = []
    disk_needed = fp.download_bytes + fp.ftw_bytes
    if disk_needed > res.disk_free_bytes:
        problems.append(
            f"disk: needs {gib(disk_needed)} ({gib(fp.download_bytes)} still to download + "
            f"{gib(fp.ftw_bytes)} converted), {gib(res.disk_free_bytes)} free; free space or set FT_HOME to a larger disk"
        )
    # All experts live in host RAM; without a GPU the dense weights do too.
    ram_needed = fp.expert_bytes + (0 if res.has_gpu else fp.dense_bytes) + RAM_RESERVE_BYTES
    if ram_needed > res.ram_total_bytes:
        where = "experts" if res.has_gpu else "experts + dense weights (no GPU found)"
        problems.append(
            f"RAM: needs {gib(ram_needed)} ({where} + {gib(RAM_RESERVE_BYTES)} reserve), the machine has "
            f"{gib(res.ram_total_bytes)}; choose a smaller or more quantized variant (e.g. an :fp8 tag)"
        )
    return problems


def refuse_unless_fits(model: str, fp: Footprint, res: Resources, *, force: bool) -> None:
    problems = check_fit(fp, res)
    if problems and not force:
        raise FitError(f"{model} does not fit this machine:\n  - " + "\n  - ".join(problems) + "\n(--force pulls anyway)")
