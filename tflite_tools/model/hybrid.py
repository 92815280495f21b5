"""Dynamically quantized ("hybrid") operators: what TFLite's converter makes of a model under
dynamic-range quantization (int8 weights, float activations).

FULLY_CONNECTED, CONV_2D, DEPTHWISE_CONV_2D and BATCH_MATMUL then read an int8 constant directly
beside a float activation: the kernel quantizes the activation per row at run time (in steps of
1/127 of the row's largest magnitude, or 1/255 of its range when asymmetric), multiplies in int8
and rescales the int32 sums to float. Two correct implementations may round an element of that
quantization either way, so an answer's precision depends on how many of these ops it passed
through (`hybrid_depths`).
"""

from __future__ import annotations

from .ir import Operator, Subgraph
from .schema import fb

# Weight types of dynamic-range ops: int8, and int4 (two a byte), which TFLite unpacks to int8.
WEIGHT_TYPES = (fb.TensorType.INT8, fb.TensorType.INT4)
# op -> the inputs that may hold the int8 weights (BATCH_MATMUL: either operand).
WEIGHT_INPUTS = {"FULLY_CONNECTED": (1,), "CONV_2D": (1,), "DEPTHWISE_CONV_2D": (1,), "BATCH_MATMUL": (0, 1)}


def is_hybrid(op: Operator) -> bool:
    """True for an op that quantizes a float activation at run time against int8 constant weights."""
    weights = [op.inputs[k] for k in WEIGHT_INPUTS.get(op.name, ()) if k < len(op.inputs)]
    activations = [t for t in op.inputs[:2] if t is not None and not t.is_constant]
    return (any(t is not None and t.is_constant and t.dtype in WEIGHT_TYPES for t in weights)
            and any(t.dtype == fb.TensorType.FLOAT32 for t in activations))


def hybrid_depths(sg: Subgraph) -> list[int]:
    """Per output of the subgraph: the most hybrid ops on any path from the inputs to it (0 for an
    output no dynamic quantization reaches)."""
    depth: dict[int, int] = {}
    for op in sg.operators:  # in execution order: every input is written before it is read
        reached = max((depth.get(id(t), 0) for t in op.inputs if t is not None), default=0)
        reached += 1 if is_hybrid(op) else 0
        for t in op.outputs:
            depth[id(t)] = reached
    return [depth.get(id(t), 0) for t in sg.outputs]
