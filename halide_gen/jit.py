"""Running a block kernel in-process (Halide's JIT): for tests and for the host profiler."""

from __future__ import annotations

from typing import Sequence

import halide as hl
import numpy as np

from .block import BlockKernel
from .schedule import schedule_cpu

# What the delegate gives a kernel: TFLite's arena and its own packed weights start on 64 bytes.
BUFFER_ALIGNMENT = 64


def aligned_copy(array: np.ndarray, alignment: int = BUFFER_ALIGNMENT) -> np.ndarray:
    """A C-contiguous, writable copy of `array` whose data starts on an `alignment`-byte boundary
    (numpy aligns to 16 at most: an AVX-512 load from there spans two cache lines)."""
    raw = np.empty(array.nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def as_buffer(array: np.ndarray, type_name: str) -> hl.Buffer:
    """A Halide buffer over a copy of a numpy array in TFLite order (bools as uint8 storage),
    aligned as the delegate aligns what it passes kernels, so that timings here are the delegate's."""
    return hl.Buffer(aligned_copy(np.asarray(array, np.uint8 if type_name == "BOOL" else None)))


class JitKernel:
    """A compiled block kernel that runs on numpy arrays (TFLite axis order in and out)."""

    def __init__(self, kernel: BlockKernel, target: hl.Target | None = None, schedule=schedule_cpu):
        self.kernel = kernel
        schedule(kernel)
        self.pipeline = kernel.pipeline()
        self.target = target or hl.get_jit_target_from_environment()
        self.pipeline.compile_jit(self.target)

    def bind(self, inputs: Sequence[np.ndarray], shared: Sequence[tuple[int, int]] = (),
             fill: float | None = None) -> None:
        """Binds one array per kernel argument (in `kernel.arguments` order) and allocates outputs.
        `shared`: (argument, output) pairs whose output is the argument's own buffer, as a caller
        passes a KV cache in and out (BlockKernel.updates_in_place); `fill`: the value the other
        outputs start as (what a kernel leaves unwritten then shows)."""
        if len(inputs) != len(self.kernel.arguments):
            raise ValueError(f"{self.kernel.name}: {len(inputs)} inputs for {len(self.kernel.arguments)} arguments")
        self._inputs = []
        for arg, array in zip(self.kernel.arguments, inputs):
            buf = as_buffer(np.asarray(array), arg.tensor.type_name)
            self._inputs.append(buf)  # the parameter does not keep the buffer alive
            arg.param.set(buf)
        self._outputs = [hl.Buffer(value.type, list(reversed(tensor.shape))) for tensor, value in self.kernel.outputs]
        if fill is not None:
            for buf in self._outputs:
                np.asarray(buf)[...] = fill
        for argument, output in shared:
            self._outputs[output] = self._inputs[argument]

    def run(self) -> None:
        """Runs on the bound buffers (what a timing loop calls)."""
        self.pipeline.realize(self._outputs)

    def results(self) -> list[np.ndarray]:
        """Copies of the outputs of the last run, in TFLite order."""
        results = []
        for (tensor, _), buf in zip(self.kernel.outputs, self._outputs):
            arr = np.asarray(buf).copy().reshape(tensor.shape)
            results.append(arr.astype(np.bool_) if tensor.type_name == "BOOL" else arr)
        return results

    def __call__(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Runs with one array per kernel argument and returns the outputs."""
        self.bind(inputs)
        self.run()
        return self.results()

    def inputs_from(self, feeds: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Argument arrays from a map of id(tensor) -> array; constants supply their own (packed)
        data."""
        return argument_arrays(self.kernel, feeds)


def argument_arrays(kernel: BlockKernel, feeds: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The arrays to pass for `kernel`'s arguments, in order, from a map of id(tensor) -> array;
    constants supply their own (packed) data. Any kernel of the same identity takes them: that is
    how a bundle runs one kernel for every block it serves."""
    return [arg.data_from(arg.tensor.values if arg.tensor.is_constant else feeds[id(arg.tensor)])
            for arg in kernel.arguments]
