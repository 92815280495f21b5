"""Schedules: where each Func of a block kernel is computed, and how its loops run.

`schedule_for` picks the schedule family for a target: CPU (x86 or ARM NEON, by vector width) or
GPU (OpenCL / Vulkan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cpu import NEON, X86, CpuParams, schedule_cpu
from .gpu import schedule_gpu

if TYPE_CHECKING:  # pragma: no cover
    from ..aot import TargetSpec
    from ..block import BlockKernel


def schedule_for(kernel: "BlockKernel", spec: "TargetSpec") -> None:
    """Applies the schedule family of `spec` to `kernel` in place."""
    if spec.family == "gpu":
        schedule_gpu(kernel)
    else:
        schedule_cpu(kernel, X86 if spec.family == "x86" else NEON)


__all__ = ["NEON", "X86", "CpuParams", "schedule_cpu", "schedule_for", "schedule_gpu"]
