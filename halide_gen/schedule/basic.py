"""The fallback schedule every block gets unless a tuned template applies.

Correct for any block: Funcs a lowering marked (padded inputs, softmax row statistics, tuple
reductions) are computed at the root so nothing is recomputed per element; outputs are vectorized
along TFLite's innermost axis and parallel over their outermost one. The per-kind templates in this
package replace it where they measure faster.
"""

from __future__ import annotations

import halide as hl

from fusion.mapping import MtM, op_mapping

from ..block import BlockKernel

# Lanes per vector for float32 on the x86 host (AVX2 baseline) and on NEON (128-bit).
HOST_LANES = 8


def _vectorize(f: hl.Func, extent: int, lanes: int) -> None:
    args = f.args()
    if not args or extent < lanes:
        return
    f.vectorize(hl.Var(args[0].name()), lanes, hl.TailStrategy.GuardWithIf)


def schedule_basic(kernel: BlockKernel, lanes: int = HOST_LANES, parallel: bool = True) -> None:
    """Applies the fallback schedule in place.

    Many-to-Many results inside the block are computed at the root too: inlined, a convolution
    feeding a depthwise convolution would be recomputed for every tap.
    """
    for v in kernel.materialize:
        v.func.compute_root()
    for op, values in zip(kernel.ops, kernel.op_values):
        if op_mapping(op) == MtM:
            for v in values:
                if not kernel.is_output(v.func):
                    v.func.compute_root()
                    _vectorize(v.func, v.shape[-1] if v.shape else 0, lanes)
    for tensor, value in kernel.outputs:
        f = value.func
        shape = tensor.shape
        _vectorize(f, shape[-1] if shape else 0, lanes)
        if parallel and len(shape) >= 2 and shape[0] > 1:
            f.parallel(hl.Var(f.args()[-1].name()))
