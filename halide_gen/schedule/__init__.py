"""Schedules: where each Func of a block kernel is computed, and how its loops run.

`schedule_for` picks the schedule family for a target: CPU (x86 or ARM NEON) or GPU (OpenCL /
Vulkan), and within a CPU family the templates' parameters for the target's vector extension
(AVX-512, AVX2 or SSE on x86: each sub-target of a multitarget build is scheduled for its own
registers) or a named variant of them (TEMPLATE_VARIANTS).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Hashable

from .auto import schedule_auto
from .cpu import schedule_cpu
from .gpu import schedule_gpu
from .params import CPU_PARAMS, NEON, NEON_FP16, TEMPLATE_VARIANTS, X86, X86_AVX2, X86_SSE, CpuParams, cpu_params

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


def template_params(spec: "TargetSpec", source: str, target: "hl.Target") -> CpuParams:
    """The CPU template parameters `source` names for one of `spec`'s Halide targets: its family's
    table for the target's vector extension (params.cpu_params), with the variant's changes; a
    family without templates, or a variant of another family, is an error, never another family's
    parameters."""
    variants = TEMPLATE_VARIANTS.get(spec.family, {})
    if source != "template" and source not in variants:
        raise ValueError(f"{spec.name}: no template variant {source!r} for the {spec.family!r} family")
    if spec.family not in CPU_PARAMS:
        raise ValueError(f"{spec.name}: no CPU schedule templates for the {spec.family!r} family")
    params = NEON_FP16 if spec.half_arithmetic else cpu_params(spec.family, str(target).split("-")[3:])
    return dataclasses.replace(params, **variants[source]) if source != "template" else params


def schedule_for(kernel: "BlockKernel", spec: "TargetSpec", source: str = "template",
                 target: "hl.Target | None" = None) -> None:
    """Applies the schedule family of `spec` to `kernel` in place, with the template parameters
    `source` names for `target` (template_params; default: spec's first target)."""
    if spec.family == "gpu" and source == "template":
        schedule_gpu(kernel)
    else:
        schedule_cpu(kernel, template_params(spec, source, target or spec.targets()[0]))


def schedule_from(kernel: "BlockKernel", spec: "TargetSpec", source: str, target: "hl.Target") -> None:
    """Schedules `kernel` in place for `target` from any schedule source: the templates or a variant
    of them (schedule_for), or one of Halide's autoschedulers planning for `target`."""
    if is_template(source):
        schedule_for(kernel, spec, source, target)
    else:
        schedule_auto(kernel, source, target)


def schedule_variant(spec: "TargetSpec", source: str, target: "hl.Target") -> Hashable:
    """What decides the schedule `schedule_from` gives a kernel for `target`: the targets of a
    multitarget build with equal variants compile one scheduled kernel (AVX-512's three builds share
    one, AVX2 and the baseline each have their own register tiles)."""
    if not is_template(source):
        return str(target)  # an autoscheduler plans for the target itself
    return spec.family if spec.family == "gpu" else template_params(spec, source, target)


__all__ = ["CPU_PARAMS", "NEON", "TEMPLATE_VARIANTS", "X86", "X86_AVX2", "X86_SSE", "CpuParams", "cpu_params", "is_template",
           "schedule_cpu", "schedule_for", "schedule_from", "schedule_gpu", "schedule_variant", "template_params",
           "template_sources"]
