"""Schedules: where each Func of a block kernel is computed, and how its loops run.

`schedule_for` picks the schedule family for a target: CPU (x86 or ARM NEON, by vector width) or
GPU (OpenCL / Vulkan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cpu import NEON, X86, CpuParams, schedule_cpu
from .gpu import schedule_gpu

if TYPE_CHECKING:  # pragma: no cover
    from ..targets import TargetSpec
    from ..block import BlockKernel


# The CPU template parameters of each CPU family a TargetSpec may name.
CPU_PARAMS = {"x86": X86, "arm": NEON}


def schedule_for(kernel: "BlockKernel", spec: "TargetSpec") -> None:
    """Applies the schedule family of `spec` to `kernel` in place; a family without templates is
    an error, never another family's parameters."""
    if spec.family == "gpu":
        schedule_gpu(kernel)
    elif spec.family in CPU_PARAMS:
        schedule_cpu(kernel, CPU_PARAMS[spec.family])
    else:
        raise ValueError(f"{spec.name}: no schedule templates for the {spec.family!r} family")


__all__ = ["CPU_PARAMS", "NEON", "X86", "CpuParams", "schedule_cpu", "schedule_for", "schedule_gpu"]
