"""Which blocks keep their kernels when a model is resized along its batch or its sequence.

A kernel is compiled at the model's shapes (a batch of 1, a sequence of the length converted).
Resized along a direction (the batch: every input's axis 0; the sequence: every input's axis 1),
a block whose every op maps step s along that direction of its inputs to step s of its outputs
alone computes any number of steps as runs of the same kernel on windows of the compiled number of
steps: each window a contiguous slice of the tensors that carry the direction (their axes before it
are all 1), the other tensors (weights, a mask shared by every step) whole. More steps than compiled
take windows side by side, the last shifted back to end at the last step (the steps it shares with
the one before are computed twice, to the same values); fewer take one run on a copy padded to the
compiled steps. The delegate does that, so a resize keeps the block claimed.

Which tensors carry a direction is LiteRT's answer, not ours: the subgraph is sized by LiteRT with
every input's axis of that direction doubled (runtime.tensor_shapes), and a tensor carries it along
the one axis whose extent doubled. Which ops keep steps apart is a rule per op (`_keeps_steps_apart`):
none may act along the carried axis, and a reshape or a product that flattens it must keep the steps
outermost, so step s stays one contiguous run of elements.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from fusion.mapping import ELEMENTWISE

from .model.errors import ModelError
from .model.ir import Operator, Subgraph, Tensor
from .runtime import tensor_shapes

# The directions a model may be resized along: direction d doubles every input's axis d.
DIRECTIONS = ("batch", "sequence")

# Ops acting on each image of their first input alone (along axis 0), whatever their other inputs.
_PER_IMAGE = {"CONV_2D", "DEPTHWISE_CONV_2D", "CONV_3D", "CONV_3D_TRANSPOSE", "TRANSPOSE_CONV", "AVERAGE_POOL_2D",
              "MAX_POOL_2D", "L2_POOL_2D", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "DEPTH_TO_SPACE",
              "SPACE_TO_DEPTH"}
# Ops acting along the last axis of their first input alone.
_LAST_AXIS = {"SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION"}
_RESHAPES = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS"}
# Ops with an axis (option `axis`, or the constant input named): steps kept apart unless it is the carried one.
_AXIS_OPTION = {"CONCATENATION", "CUMSUM"}
_AXIS_INPUT = {"SPLIT": 0, "SPLIT_V": 2, "REVERSE_V2": 1, "ARG_MAX": 1, "ARG_MIN": 1}
_REDUCERS = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD", "REDUCE_ANY", "REDUCE_ALL"}

Carriers = dict[int, int]  # tensor id -> the axis carrying the direction, -1 where its shape does not depend on it


def carriers(sg: Subgraph, content: bytes, index: int, direction: int) -> Carriers | None:
    """Per tensor of `sg`, subgraph `index` of the model `content` (by id): the axis along which it
    carries `direction` (an index of DIRECTIONS), -1 where its shape does not depend on it; tensors
    whose shape changes otherwise are left out. None where no input has that axis or LiteRT cannot
    prepare the subgraph with it doubled from `sg`'s shapes (the model's own, or a copy's at other
    shapes: model.variants.with_shapes)."""
    positions = {id(t): k for k, t in enumerate(sg.tensors)}
    resized = [t for t in sg.inputs if len(t.shape) > direction]
    if not resized or any(t.shape[direction] < 1 for t in resized):
        return None
    inputs = {positions[id(t)]: tuple(2 * d if a == direction else d for a, d in enumerate(t.shape)) for t in resized}
    try:
        doubled = tensor_shapes(content, index, inputs)
    except ModelError:
        return None
    found: Carriers = {}
    for t, shape in zip(sg.tensors, doubled):
        own = tuple(t.shape)
        if shape is None or len(shape) != len(own):
            continue
        changed = [a for a, (new, old) in enumerate(zip(shape, own)) if new != old]
        if not changed:
            found[id(t)] = -1
        elif len(changed) == 1 and shape[changed[0]] == 2 * own[changed[0]]:
            found[id(t)] = changed[0]
    return found


def window_arguments(ops: Sequence[Operator], arguments: Sequence[Tensor], outputs: Sequence[Tensor],
                     found: Carriers | None) -> frozenset[int] | None:
    """The ids of the arguments a block's kernel takes in windows when its direction is resized
    (those carrying it; the others whole), or None when the block cannot run so: an output that
    does not carry it, a tensor whose shape changes otherwise, an op acting along it, or a tensor
    the kernel takes in windows whose axes before the carried one are not all 1, or whose steps are
    not a whole number of the block's. `found`: carriers' answer for the block's subgraph."""
    if found is None or not outputs:
        return None
    if not all(found.get(id(t), -1) >= 0 for t in outputs):
        return None
    tensors = {id(t): t for op in ops for t in (*op.inputs, *op.outputs) if t is not None and not t.is_constant}
    if any(id(t) not in found for t in tensors.values()):
        return None
    if not all(_keeps_steps_apart(op, found) for op in ops):
        return None
    cut = [t for t in arguments if not t.is_constant and found.get(id(t), -1) >= 0]
    windowed = [*cut, *outputs]
    extents = [t.shape[found[id(t)]] for t in windowed]
    if any(_outer(t, found[id(t)]) != 1 for t in windowed) or any(e % min(extents) for e in extents):
        return None
    return frozenset(id(t) for t in cut)


def _keeps_steps_apart(op: Operator, found: Carriers) -> bool:
    """Whether `op` maps step s of its carrying inputs to step s of its outputs alone."""
    axes = {k: found[id(t)] for k, t in enumerate(op.inputs) if t is not None and found.get(id(t), -1) >= 0}
    outs = [t for t in op.outputs if t is not None]
    if not axes:
        return not any(found.get(id(t), -1) >= 0 for t in outs)  # nothing carried in, nothing out
    if not all(found.get(id(t), -1) >= 0 for t in outs):
        return False  # a slice or a reduction of the steps
    out = found[id(outs[0])]
    name = op.name
    if name in ELEMENTWISE:  # broadcasting aligns the trailing axes
        rank = len(outs[0].shape)
        return all(a + rank - len(op.inputs[k].shape) == out for k, a in axes.items()) and all(
            _broadcasts_along(t, out - (rank - len(t.shape)))
            for k, t in enumerate(op.inputs) if t is not None and k not in axes)
    first = axes.get(0, -1)
    if list(axes) != [0] and name not in ("GATHER", "BATCH_MATMUL", "CONCATENATION"):
        return False
    rank = len(op.inputs[0].shape)
    if name in _PER_IMAGE:
        return first == 0 and out == 0
    if name in _LAST_AXIS:
        return first != rank - 1 and out == first
    if name == "FULLY_CONNECTED":  # rows are every axis but the last, flattened: the steps outermost
        return first != rank - 1 and _outer(op.inputs[0], first) == 1 and _outer(outs[0], out) == 1
    if name in _RESHAPES:
        return _outer(op.inputs[0], first) == 1 and _outer(outs[0], out) == 1
    if name == "TRANSPOSE":
        perm = _constant(op, 1)
        return perm is not None and int(perm.reshape(-1)[out]) % rank == first
    if name == "GATHER":  # a whole table's rows for the carried ids, or each step's own rows
        axis = _option(op, "axis", 0) % rank
        if _option(op, "batch_dims", 0):
            return False
        if list(axes) == [1]:
            return out == axis + axes[1]
        return list(axes) == [0] and first < axis and out == first
    if name == "BATCH_MATMUL":
        return _product_keeps_steps_apart(op, axes, out)
    if name in _AXIS_OPTION:
        axis = _option(op, "axis", 0) % rank
        return axis != first and all(a == first for a in axes.values()) and out == first
    if name in _AXIS_INPUT:
        axis = _constant(op, _AXIS_INPUT[name])
        return axis is not None and axis.size == 1 and int(axis.reshape(-1)[0]) % rank != first
    if name in _REDUCERS:
        reduced = _constant(op, 1)
        return reduced is not None and all(int(a) % rank != first for a in reduced.reshape(-1))
    if name in ("PAD", "PADV2", "MIRROR_PAD"):
        pads = _constant(op, 1)
        return pads is not None and not np.any(pads.reshape(-1, 2)[first]) and out == first
    if name in ("SLICE", "STRIDED_SLICE"):
        begin = _constant(op, 1)
        strides = _constant(op, 3) if name == "STRIDED_SLICE" else None
        return (begin is not None and int(begin.reshape(-1)[first]) == 0 and out == first
                and (strides is None or int(strides.reshape(-1)[first]) == 1))
    return False


def _product_keeps_steps_apart(op: Operator, axes: dict[int, int], out: int) -> bool:
    """BATCH_MATMUL: the steps are a batch axis of either operand, or the rows of the left one; a
    carried reduction axis (or the right operand's columns) would be summed across them."""
    lhs, rhs = op.inputs[0], op.inputs[1]
    rank = max(len(lhs.shape), len(rhs.shape))
    rows = len(lhs.shape) - (1 if _option(op, "adj_x", 0) else 2)
    for k, a in axes.items():
        t = (lhs, rhs)[k]
        if k == 0 and a == rows:
            if out != rank - 2:
                return False
        elif a >= len(t.shape) - 2 or a + rank - len(t.shape) != out:
            return False
    return True


def _broadcasts_along(t: Tensor, axis: int) -> bool:
    """Whether a tensor that does not carry the steps is broadcast along output axis `axis` (its
    own axis there, after aligning trailing axes, is 1 or absent)."""
    return axis < 0 or t.shape[axis] == 1


def _outer(t: Tensor, axis: int) -> int:
    """The number of elements of `t` before `axis`: 1 where the steps are outermost."""
    return math.prod(t.shape[:axis])


def _option(op: Operator, name: str, default: int) -> int:
    return int(getattr(op.options, name, default)) if op.options is not None else default


def _constant(op: Operator, k: int) -> np.ndarray | None:
    t = op.inputs[k] if k < len(op.inputs) else None
    return None if t is None or not t.is_constant else np.asarray(t.values)
