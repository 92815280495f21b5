"""Running a block kernel in-process (Halide's JIT): for tests and for the host profiler."""

from __future__ import annotations

from typing import Sequence

import halide as hl
import numpy as np

from .block import BlockKernel
from .schedule import schedule_basic
from .values import as_buffer


class JitKernel:
    """A compiled block kernel that runs on numpy arrays (TFLite axis order in and out)."""

    def __init__(self, kernel: BlockKernel, target: hl.Target | None = None, schedule=schedule_basic):
        self.kernel = kernel
        schedule(kernel)
        self.pipeline = kernel.pipeline()
        self.target = target or hl.get_jit_target_from_environment()
        self.pipeline.compile_jit(self.target)

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs with one array per kernel argument (in `kernel.arguments` order)."""
        if len(inputs) != len(self.kernel.arguments):
            raise ValueError(f"{self.kernel.name}: {len(inputs)} inputs for {len(self.kernel.arguments)} arguments")
        keep = []
        for (tensor, param), array in zip(self.kernel.arguments, inputs):
            buf = as_buffer(np.asarray(array), tensor.type_name)
            keep.append(buf)
            param.set(buf)
        outs = []
        for tensor, value in self.kernel.outputs:
            outs.append(hl.Buffer(value.type, list(reversed(tensor.shape))))
        self.pipeline.realize(outs)
        results = []
        for (tensor, _), buf in zip(self.kernel.outputs, outs):
            arr = np.asarray(buf).copy().reshape(tensor.shape)
            results.append(arr.astype(np.bool_) if tensor.type_name == "BOOL" else arr)
        return results

    def inputs_from(self, feeds: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Argument arrays from a map of id(tensor) -> array; constants supply their own data."""
        arrays = []
        for tensor, _ in self.kernel.arguments:
            if tensor.is_constant:
                arrays.append(np.asarray(tensor.data))
            else:
                arrays.append(feeds[id(tensor)])
        return arrays
