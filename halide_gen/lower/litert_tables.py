"""Int8 and int16 lookup tables filled by LiteRT's own kernels.

An int8 op with one input and one output whose answer depends on nothing else (HARD_SWISH, GELU,
EXP, LOG, ABS, NEG, the RELUs, ELU, SQRT, RSQRT) is a function of 256 values; an int16 one (16x8
LOGISTIC, TANH) of 65536. Rather than restate TFLite's fixed-point algorithm for each (HARD_SWISH
alone chains two int16 rescales and a "reluish" multiplier), the compiler asks LiteRT: the op is cut
out with a [1, 256] (or [1, 65536]) input of the same quantization, run once on every value by the
reference kernels (the builtin ones where the reference resolver lacks the op), and the answers
become a table compiled into the kernel (128 KiB for int16). The kernel is then LiteRT's op, bit for
bit, by construction — for the quantization and options it was built for, which the block signature
holds.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tflite_tools.model.ir import Model, Operator, Subgraph, Tensor

from .registry import LoweringError

def every_value(dtype: np.dtype) -> np.ndarray:
    """Every value of an integer type, the lowest first (256 for int8, 65536 for int16)."""
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1).astype(dtype)


def _single_op_model(op: Operator, count: int) -> Model:
    """`op` alone, reading and writing [1, count] tensors typed and quantized as its own."""
    x = Tensor("x", (1, count), op.inputs[0].dtype, quantization=op.inputs[0].quantization)
    y = Tensor("y", (1, count), op.outputs[0].dtype, quantization=op.outputs[0].quantization)
    single = dataclasses.replace(op, inputs=[x], outputs=[y], intermediates=[], debug_metadata_index=-1)
    return Model(subgraphs=[Subgraph(tensors=[x, y], operators=[single], inputs=[x], outputs=[y])],
                 description="dnnfusion lookup table")


def litert_table(op: Operator, lowest: int | None = None) -> np.ndarray:
    """LiteRT's output of `op` (int8 or int16 in and out) for each value of its input type, the
    lowest first; inputs under `lowest` take the entry of `lowest` (for ops LiteRT refuses to run
    below it). Raises LoweringError when LiteRT has no kernel for it (or refuses its quantization)."""
    from tflite_tools import runtime, serialize

    dtype = np.dtype(op.inputs[0].numpy_dtype)
    values = every_value(dtype)
    data = serialize(_single_op_model(op, len(values)))
    inputs = (values if lowest is None else np.maximum(values, dtype.type(lowest))).reshape(1, -1)
    problems = []
    for resolver in ("reference", "builtin"):
        try:
            interp = runtime.make_interpreter(data, resolver=resolver)
            (out,) = runtime.run(interp, [inputs])
            return np.asarray(out).reshape(-1)
        except (RuntimeError, ValueError) as exc:
            problems.append(f"{resolver}: {str(exc).splitlines()[0]}")
    raise LoweringError(f"{dtype} {op.name}: LiteRT cannot run it to fill a table ({'; '.join(problems)})")
