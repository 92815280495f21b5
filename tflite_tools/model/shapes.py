"""Which tensors LiteRT can size only while the model runs ("dynamic" tensors).

LiteRT sizes every tensor when it prepares a model, except where a shape depends on values it does
not have then: a RESHAPE to a computed shape, a RANGE to a computed limit, WHERE's selection, and
whatever is computed from such a tensor. A delegate must declare that it accepts graphs holding
dynamic tensors (kTfLiteDelegateFlagsAllowDynamicTensors) or LiteRT refuses to apply it, and no
kernel compiled for one shape can read or write them.

The rule here over-approximates LiteRT's: it takes no value computed in the graph as known before
the model runs, though LiteRT computes a few when it prepares (SHAPE). A dynamic tensor it missed
would make the delegate unloadable; one it adds only leaves its ops to TFLite.
"""

from __future__ import annotations

from typing import Sequence

from .ir import Operator

# Inputs whose values (not shapes) decide an op's output shape.
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "RESHAPE": (1,), "RANGE": (0, 1, 2), "TILE": (1,), "BROADCAST_TO": (1,), "BROADCAST_ARGS": (0, 1), "FILL": (0,),
    "SLICE": (1, 2), "STRIDED_SLICE": (1, 2, 3), "PAD": (1,), "PADV2": (1,), "MIRROR_PAD": (1,),
    "RESIZE_BILINEAR": (1,), "RESIZE_NEAREST_NEIGHBOR": (1,), "TRANSPOSE": (1,), "SPLIT": (0,), "SPLIT_V": (1, 2),
    "MEAN": (1,), "SUM": (1,), "REDUCE_MAX": (1,), "REDUCE_MIN": (1,), "REDUCE_PROD": (1,), "REDUCE_ANY": (1,),
    "REDUCE_ALL": (1,), "EXPAND_DIMS": (1,), "ARG_MAX": (1,), "ARG_MIN": (1,), "TRANSPOSE_CONV": (0,),
    "CONV_3D_TRANSPOSE": (0,), "ONE_HOT": (1,), "SPACE_TO_BATCH_ND": (1, 2), "BATCH_TO_SPACE_ND": (1, 2),
    "SEGMENT_SUM": (1,), "UNSORTED_SEGMENT_SUM": (2,), "UNSORTED_SEGMENT_MAX": (2,), "UNSORTED_SEGMENT_MIN": (2,),
    "UNSORTED_SEGMENT_PROD": (2,), "SCATTER_ND": (2,), "SPARSE_TO_DENSE": (1,), "TOPK_V2": (1,), "RFFT2D": (1,),
}
# Ops whose output shapes depend on their inputs' values whatever those are, or on a subgraph's run.
ALWAYS_DYNAMIC = frozenset({"WHERE", "UNIQUE", "NON_MAX_SUPPRESSION_V4", "NON_MAX_SUPPRESSION_V5", "WHILE", "IF"})


def sized_at_run_time(operators: Sequence[Operator]) -> set[int]:
    """id() of the tensors the `operators` (in execution order) produce that LiteRT may size only
    while the model runs: string tensors (LiteRT allocates those as they are written), outputs of
    ops that compute their shape from a non-constant value, and everything computed from those
    (SHAPE aside: its shape is its input's rank)."""
    dynamic: set[int] = set()
    for op in operators:
        computed = any(t is not None and not t.is_constant and (id(t) in dynamic or i in SHAPE_OPERANDS.get(op.name, ()))
                       for i, t in enumerate(op.inputs))
        for t in op.outputs:
            if t.type_name == "STRING" or ((computed or op.name in ALWAYS_DYNAMIC) and op.name != "SHAPE"):
                dynamic.add(id(t))
    return dynamic
