"""Halide's autoschedulers as a schedule source, next to the hand-written templates.

The wheel ships Adams2019, Mullapudi2016, Li2018 (CPU) and Anderson2021 (GPU). Shapes are static,
so the estimates every autoscheduler needs are exact. Timed per block on the x86 host, the
templates were faster on nearly every block (Adams2019 won only on LayerNorm, and not reproducibly);
`halide_gen.profile.choose_schedule` times the candidates per block where the target's kernels run
here (the CPU, or the OpenCL / Vulkan device for host GPU targets) and keeps the fastest.
"""

from __future__ import annotations

import functools
import os

import halide as hl

from ..block import BlockKernel

CPU_AUTOSCHEDULERS = ("Adams2019", "Mullapudi2016", "Li2018")
GPU_AUTOSCHEDULERS = ("Anderson2021", "Li2018")


@functools.cache
def _load_plugins() -> None:
    libdir = os.path.join(os.path.dirname(hl.__file__), "lib64")
    for name in ("adams2019", "mullapudi2016", "li2018", "anderson2021"):
        hl.load_plugin(os.path.join(libdir, f"libautoschedule_{name}.so"))


def schedule_auto(kernel: BlockKernel, autoscheduler: str, target: hl.Target | None = None) -> None:
    """Schedules `kernel` with one of Halide's autoschedulers, in place."""
    _load_plugins()
    for arg in kernel.arguments:
        arg.param.set_estimates([(0, int(e)) for e in reversed(arg.shape)])
    for tensor, value in kernel.outputs:
        value.func.set_estimates([(0, int(e)) for e in reversed(tensor.shape)])
    params = hl.AutoschedulerParams(autoscheduler, {})
    kernel.pipeline().apply_autoscheduler(target or hl.get_jit_target_from_environment(), params)
