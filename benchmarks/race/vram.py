"""The GPU's used memory sampled while a command runs: the whole process's peak, as a user's
nvidia-smi shows it (CUDA context, allocator slack and all), which is what both engines are
given the same of. One process at a time uses the GPU in the race, so the device's used memory
minus what was used before the run is that process's."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time


def gpu_used_mib() -> int | None:
    """The device's used memory now (MiB), or None without nvidia-smi or a GPU."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return int(out.strip().splitlines()[0])
    except (subprocess.SubprocessError, ValueError, IndexError, OSError):
        return None


class VramPeak:
    """`with VramPeak() as v: ...` then `v.peak_mib`: the most memory used above the baseline
    (None where the GPU cannot be read). Samples every `every_s` from a thread."""

    def __init__(self, every_s: float = 0.1) -> None:
        self.every_s = every_s
        self.baseline_mib = gpu_used_mib()
        self._max: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            used = gpu_used_mib()
            if used is not None:
                self._max = used if self._max is None else max(self._max, used)
            self._stop.wait(self.every_s)

    def __enter__(self) -> VramPeak:
        if self.baseline_mib is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.baseline_mib is not None:
            time.sleep(self.every_s)  # one more sample after the end
            self._stop.set()
            self._thread.join()

    @property
    def peak_mib(self) -> int | None:
        if self.baseline_mib is None or self._max is None:
            return None
        return max(0, self._max - self.baseline_mib)
