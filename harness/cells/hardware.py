"""What a machine can run, as plain data: its SM (or `cpu`), device kind, GPU name and count.

Detecting it needs torch and lives in `harness.runtime.device`; the matrix decides from this record alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    sm: str  # "cpu", "sm90", or an AMD target such as "gfx942"
    device: str  # "cpu" or "cuda" (ROCm GPUs are "cuda" devices to torch)
    gpu: str  # GPU name, or the CPU's
    device_count: int  # GPUs, or 0
    cpu_count: int

    @property
    def has_cuda(self) -> bool:
        return self.device == "cuda"
