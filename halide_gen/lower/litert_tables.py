"""Int8 lookup tables filled by LiteRT's own kernels.

An int8 op with one input and one output whose answer depends on nothing else (HARD_SWISH, GELU,
EXP, LOG, ABS, NEG, the RELUs, ELU, SQRT, RSQRT) is a function of 256 values. Rather than restate TFLite's
fixed-point algorithm for each (HARD_SWISH alone chains two int16 rescales and a "reluish"
multiplier), the compiler asks LiteRT: the op is cut out with a [1, 256] input of the same
quantization, run once on every int8 value by the reference kernels (the builtin ones where the
reference resolver lacks the op), and the answers become a table compiled into the kernel. The
kernel is then LiteRT's op, bit for bit, by construction — for the quantization and options it was
built for, which the block signature holds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tflite_tools.model.ir import Model, Operator, Subgraph, Tensor

from .registry import LoweringError

INT8_VALUES = np.arange(-128, 128, dtype=np.int8)


def _single_op_model(op: Operator) -> Model:
    """`op` alone, reading and writing [1, 256] int8 tensors quantized as its own."""
    x = Tensor("x", (1, len(INT8_VALUES)), op.inputs[0].dtype, quantization=op.inputs[0].quantization)
    y = Tensor("y", (1, len(INT8_VALUES)), op.outputs[0].dtype, quantization=op.outputs[0].quantization)
    single = dataclasses.replace(op, inputs=[x], outputs=[y], intermediates=[], debug_metadata_index=-1)
    return Model(subgraphs=[Subgraph(tensors=[x, y], operators=[single], inputs=[x], outputs=[y])],
                 description="dnnfusion int8 table")


def litert_int8_table(op: Operator, lowest: int = -128) -> np.ndarray:
    """LiteRT's int8 output of `op` for each int8 input value, -128 first; inputs under `lowest`
    take the entry of `lowest` (for ops LiteRT refuses to run below it). Raises LoweringError when
    LiteRT has no kernel for it (or refuses its quantization)."""
    from tflite_tools import runtime, serialize

    data = serialize(_single_op_model(op))
    inputs = np.maximum(INT8_VALUES, np.int8(lowest)).reshape(1, -1)
    problems = []
    for resolver in ("reference", "builtin"):
        try:
            interp = runtime.make_interpreter(data, resolver=resolver)
            (out,) = runtime.run(interp, [inputs])
            return np.asarray(out, np.int8).reshape(-1)
        except (RuntimeError, ValueError) as exc:
            problems.append(f"{resolver}: {str(exc).splitlines()[0]}")
    raise LoweringError(f"int8 {op.name}: LiteRT cannot run it to fill a table ({'; '.join(problems)})")
