"""Schedules: where each Func of a block kernel is computed, and how its loops run.

`schedule_for` picks the schedule family for a target: CPU (x86 or ARM NEON, by vector width) or
GPU (OpenCL / Vulkan), and within a CPU family the templates' default parameters or a named
variant of them (TEMPLATE_VARIANTS).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .auto import schedule_auto
from .cpu import schedule_cpu
from .gpu import schedule_gpu
from .params import CPU_PARAMS, NEON, NEON_FP16, TEMPLATE_VARIANTS, X86, CpuParams

if TYPE_CHECKING:  # pragma: no cover
    import halide as hl

    from ..targets import TargetSpec
    from ..block import BlockKernel


def template_sources(family: str) -> tuple[str, ...]:
    """The template schedule sources of a target family: "template" (the defaults), then its variants."""
    return ("template",) + tuple(TEMPLATE_VARIANTS.get(family, {}))


def is_template(source: str) -> bool:
    """Whether a schedule source names the templates (defaults or a variant), not an autoscheduler."""
    return source == "template" or any(source in variants for variants in TEMPLATE_VARIANTS.values())


def schedule_for(kernel: "BlockKernel", spec: "TargetSpec", source: str = "template") -> None:
    """Applies the schedule family of `spec` to `kernel` in place, with the template parameters
    `source` names (TEMPLATE_VARIANTS); a family without templates, or a variant of another
    family, is an error, never another family's parameters."""
    variants = TEMPLATE_VARIANTS.get(spec.family, {})
    if source != "template" and source not in variants:
        raise ValueError(f"{spec.name}: no template variant {source!r} for the {spec.family!r} family")
    if spec.family == "gpu":
        schedule_gpu(kernel)
    elif spec.family in CPU_PARAMS:
        params = NEON_FP16 if spec.half_arithmetic else CPU_PARAMS[spec.family]
        schedule_cpu(kernel, dataclasses.replace(params, **variants[source]) if source != "template" else params)
    else:
        raise ValueError(f"{spec.name}: no schedule templates for the {spec.family!r} family")


def schedule_from(kernel: "BlockKernel", spec: "TargetSpec", source: str, target: "hl.Target") -> None:
    """Schedules `kernel` in place from any schedule source: the templates or a variant of them
    (schedule_for), or one of Halide's autoschedulers planning for `target`."""
    if is_template(source):
        schedule_for(kernel, spec, source)
    else:
        schedule_auto(kernel, source, target)


__all__ = ["CPU_PARAMS", "NEON", "TEMPLATE_VARIANTS", "X86", "CpuParams", "is_template", "schedule_cpu", "schedule_for",
           "schedule_from", "schedule_gpu", "template_sources"]
