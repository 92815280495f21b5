"""Which blocks run once per item of a batch larger than the one they were compiled for.

A kernel is compiled at the model's batch (converters write 1). Resized to a batch of B, a block
whose every op maps item b of its inputs to item b of its outputs, and whose tensors carry the
batch as their leading axis, computes B items as B runs of the same kernel, each on its item's
slice of the tensors that carry the batch (row-major: one contiguous run of bytes each) and on the
whole of those that do not (weights, a mask shared by every item). The delegate does that where a
model is resized along its batch, so the resize keeps the model claimed.

Which tensors carry the batch is LiteRT's answer, not ours: the subgraph is sized by LiteRT with
every input's leading dimension doubled (runtime.tensor_shapes), and a tensor carries the batch
when its leading dimension doubled with the rest unchanged. Which ops keep items apart is a rule
per op (`_keeps_items_apart`): elementwise ops, and the others where no axis they act along is the
leading one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fusion.mapping import ELEMENTWISE

from .model.errors import ModelError
from .model.ir import Model, Operator, Tensor
from .runtime import tensor_shapes

# Ops that act on each item of their first input alone, whatever their other (unbatched) inputs.
_PER_IMAGE = {"CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", "CONV_3D_TRANSPOSE", "AVERAGE_POOL_2D", "MAX_POOL_2D",
              "L2_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "DEPTH_TO_SPACE", "SPACE_TO_DEPTH",
              "FULLY_CONNECTED", "SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION",
              "RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
# Ops with an axis (option `axis`, or the constant input named): kept apart unless it is the leading one.
_AXIS_OPTION = {"CONCATENATION", "PACK", "UNPACK", "CUMSUM"}
_AXIS_INPUT = {"SPLIT": 0, "SPLIT_V": 2, "REVERSE_V2": 1, "ARG_MAX": 1, "ARG_MIN": 1}
_REDUCERS = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL"}


def batch_carriers(model: Model, content: bytes, index: int) -> dict[int, bool] | None:
    """Per tensor of subgraph `index` (by id): True where its leading axis carries the batch, False
    where its shape does not depend on it; tensors whose shape changes otherwise are left out. None
    where LiteRT cannot run the subgraph at twice its inputs' batch. `content`: the model's bytes
    (its tensors indexed as `model`'s)."""
    sg = model.subgraphs[index]
    positions = {id(t): k for k, t in enumerate(sg.tensors)}
    inputs = {positions[id(t)]: (2 * t.shape[0],) + tuple(t.shape[1:]) for t in sg.inputs if len(t.shape)}
    if not inputs or any(t.shape and t.shape[0] < 1 for t in sg.inputs):
        return None
    try:
        doubled = tensor_shapes(content, index, inputs)
    except ModelError:
        return None
    carriers: dict[int, bool] = {}
    for t, shape in zip(sg.tensors, doubled):
        own = tuple(t.shape)
        if shape is None:
            continue
        if tuple(shape) == own:
            carriers[id(t)] = False
        elif own and len(shape) == len(own) and shape[0] == 2 * own[0] and tuple(shape[1:]) == own[1:]:
            carriers[id(t)] = True
    return carriers


def per_item_arguments(ops: Sequence[Operator], arguments: Sequence[Tensor], outputs: Sequence[Tensor],
                       carriers: dict[int, bool] | None) -> frozenset[int] | None:
    """The ids of the arguments a block's kernel takes cut per item when it runs once per item of a
    larger batch (those carrying the batch; the others whole), or None when it cannot run so:
    an output that does not carry the batch, a tensor whose shape changes otherwise, or an op
    acting across items. `carriers`: batch_carriers' answer for the block's subgraph."""
    if carriers is None or not outputs:
        return None
    if not all(carriers.get(id(t)) for t in outputs):
        return None
    tensors = {id(t): t for op in ops for t in (*op.inputs, *op.outputs) if t is not None and not t.is_constant}
    if any(id(t) not in carriers for t in tensors.values()):
        return None
    if not all(_keeps_items_apart(op, carriers) for op in ops):
        return None
    return frozenset(id(t) for t in arguments if not t.is_constant and carriers.get(id(t)))


def _keeps_items_apart(op: Operator, carriers: dict[int, bool]) -> bool:
    """Whether `op` maps item b of its batch-carrying inputs to item b of its outputs alone."""
    carried = [k for k, t in enumerate(op.inputs) if t is not None and carriers.get(id(t))]
    if not carried:
        return not any(carriers.get(id(t)) for t in op.outputs)  # nothing carried in, nothing out
    name = op.name
    if name in ELEMENTWISE:
        return True
    if name in _PER_IMAGE:
        return carried == [0] and _axis_is_not_leading(op, -1)  # a rank-1 input's one axis is the batch
    if name == "GATHER":  # rows of a whole table for each item's indices, or each item's own rows
        return carried == [1] or (carried == [0] and _axis_is_not_leading(op, _option(op, "axis", 0)))
    if name == "BATCH_MATMUL":
        # Items are rows of a rank-2 left operand or the batch of either: a right operand of rank 2
        # that carries them would be summed across them.
        rhs = op.inputs[1]
        return not (1 in carried and len(rhs.shape) < 3)
    if name == "TRANSPOSE":
        perm = _constant(op, 1)
        return perm is not None and int(perm.reshape(-1)[0]) % len(op.inputs[0].shape) == 0
    if name in _AXIS_OPTION:
        return _axis_is_not_leading(op, _option(op, "axis", 0))
    if name in _AXIS_INPUT:
        axis = _constant(op, _AXIS_INPUT[name])
        return axis is not None and axis.size == 1 and _axis_is_not_leading(op, int(axis.reshape(-1)[0]))
    if name in _REDUCERS:
        axes = _constant(op, 1)
        return axes is not None and all(_axis_is_not_leading(op, int(a)) for a in axes.reshape(-1))
    if name in ("PAD", "PADV2", "MIRROR_PAD"):
        pads = _constant(op, 1)
        return pads is not None and not np.any(pads.reshape(-1, 2)[0])
    if name in ("SLICE", "STRIDED_SLICE"):
        begin = _constant(op, 1)
        strides = _constant(op, 3) if name == "STRIDED_SLICE" else None
        return (begin is not None and int(begin.reshape(-1)[0]) == 0
                and (strides is None or int(strides.reshape(-1)[0]) == 1))
    return False


def _axis_is_not_leading(op: Operator, axis: int) -> bool:
    rank = len(op.inputs[0].shape)
    return rank > 0 and axis % rank != 0


def _option(op: Operator, name: str, default: int) -> int:
    return int(getattr(op.options, name, default)) if op.options is not None else default


def _constant(op: Operator, k: int) -> np.ndarray | None:
    t = op.inputs[k] if k < len(op.inputs) else None
    return None if t is None or not t.is_constant else np.asarray(t.values)
