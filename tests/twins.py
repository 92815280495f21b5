"""Twin operators: the same op with the same shapes and another value of a constant its kernel bakes
in, for the kernel-identity tests (tests/test_kernel_identity.py) and the block fuzzer's twinned
graphs (tests/test_fuzz_blocks.py).

`twin_constants(op, rng)` gives new values for the compile-time inputs of `op` (those its lowering
declares: halide_gen.lower.registry.COMPILE_TIME_INPUTS) such that every output keeps its shape:
another begin of a SLICE, the paddings of a PAD swapped, another permutation of equal extents,
other reduced axes of the same extents. Where no value with another meaning keeps the shapes (the
axis of a SPLIT), another encoding of the same value (a negative axis) still tells the kernels
apart. `with_twins(model, rng)` adds a copy of every op of a model, reading the same graph inputs,
with twin constants and other weights, so a model repeats each block shape with differing
constants.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np

from tflite_tools.model.ir import Model, Operator, Tensor

REDUCERS = ("SUM", "MEAN", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD")
INT8_MIN = -128


def _other_encoding(axes: np.ndarray, rank: int) -> np.ndarray:
    """The same axes written the other way round (negative for non-negative ones and back)."""
    return np.where(axes >= 0, axes - rank, axes + rank).astype(axes.dtype)


def _permutation(op: Operator, rng: np.random.Generator) -> np.ndarray:
    perm = np.asarray(op.inputs[1].data)
    shape = op.inputs[0].shape
    rank = len(shape)
    same = [p for p in itertools.permutations(range(rank))
            if [shape[a] for a in p] == list(op.outputs[0].shape) and list(p) != list(perm % rank)]
    return np.asarray(same[rng.integers(len(same))], perm.dtype) if same else _other_encoding(perm, rank)


def _reduced_shape(shape, axes, keep: bool) -> list[int]:
    axes = {int(a) % len(shape) for a in axes}
    return [1 if a in axes else d for a, d in enumerate(shape) if keep or a not in axes]


def _axes(op: Operator, rng: np.random.Generator, keep: bool) -> np.ndarray:
    """Other reduced axes (as many) whose result has the same shape, else the same axes re-encoded."""
    axes = np.atleast_1d(np.asarray(op.inputs[1].data))
    shape = op.inputs[0].shape
    mine = sorted({int(a) % len(shape) for a in axes})
    same = [c for c in itertools.combinations(range(len(shape)), len(mine))
            if list(c) != mine and _reduced_shape(shape, c, keep) == list(op.outputs[0].shape)]
    value = np.asarray(same[rng.integers(len(same))], axes.dtype) if same else _other_encoding(axes, len(shape))
    return value.reshape(np.asarray(op.inputs[1].data).shape)


def _slice_begin(op: Operator, rng: np.random.Generator) -> np.ndarray | None:
    begin = np.asarray(op.inputs[1].data)
    room = [d - s for d, s in zip(op.inputs[0].shape, op.outputs[0].shape)]
    if not any(room):
        return None
    while True:
        other = np.asarray([rng.integers(r + 1) for r in room], begin.dtype)
        if not np.array_equal(other, begin):
            return other


def _strided_slice(op: Operator, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Begin and end moved together along an axis the masks leave alone (same count, stride 1 or
    more), or, where none can move, the strides of an axis of one element re-chosen."""
    begin, end, strides = (np.asarray(op.inputs[k].data).copy() for k in (1, 2, 3))
    o = op.options
    masked = o.beginMask | o.endMask | o.shrinkAxisMask | o.ellipsisMask | o.newAxisMask
    shape = op.inputs[0].shape
    for a in rng.permutation(len(shape)):
        if masked & (1 << int(a)) or strides[a] <= 0 or begin[a] < 0 or end[a] < 0 or end[a] > shape[a]:
            continue
        shifts = [s for s in range(-int(begin[a]), int(shape[a] - end[a]) + 1) if s]
        if shifts:
            s = shifts[rng.integers(len(shifts))]
            begin[a] += s
            end[a] += s
            return {1: begin, 2: end}
    for a in range(len(shape)):
        if not masked & (1 << a) and strides[a] > 0 and end[a] - begin[a] == 1:
            strides[a] += 1  # one element either way
            return {3: strides}
    return {}


def _paddings(op: Operator) -> np.ndarray | None:
    pads = np.asarray(op.inputs[1].data)
    if not np.any(pads[:, 0] != pads[:, 1]):
        return None
    return pads[:, ::-1].copy()


def _indices(op: Operator, rng: np.random.Generator, bounds: list[int]) -> np.ndarray:
    idx = np.asarray(op.inputs[1].data)
    depth = len(bounds)
    while True:
        other = np.stack([rng.integers(b, size=idx.size // depth) for b in bounds], axis=-1)
        other = other.reshape(idx.shape).astype(idx.dtype)
        if not np.array_equal(other, idx) or max(bounds) == 1:
            return other


def _depthwise_int8(op: Operator) -> np.ndarray:
    """Int8 weights with a -128 where they have none (and none where they have): the kernel adds
    two taps in int16 only without one (halide_gen.lower.quantized.paired_taps_hold)."""
    w = np.asarray(op.inputs[1].data).copy()
    flat = w.reshape(-1)
    if np.any(flat == INT8_MIN):
        flat[flat == INT8_MIN] = INT8_MIN + 1
    else:
        flat[0] = INT8_MIN
    return w


def twin_constants(op: Operator, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """New values for compile-time inputs of `op` that keep every output's shape ({} where the op
    has none, or none can differ)."""
    name = op.name
    constant = [i for i, t in enumerate(op.inputs) if t is not None and t.is_constant]
    twins: dict[int, np.ndarray | None] = {}
    if name == "TRANSPOSE" and 1 in constant:
        twins[1] = _permutation(op, rng)
    elif name in REDUCERS and 1 in constant:
        twins[1] = _axes(op, rng, bool(getattr(op.options, "keepDims", False)))
    elif name in ("ARG_MAX", "ARG_MIN") and 1 in constant:
        twins[1] = _axes(op, rng, keep=False)
    elif name == "SLICE" and 1 in constant:
        twins[1] = _slice_begin(op, rng)
    elif name == "STRIDED_SLICE" and {1, 2, 3} <= set(constant):
        twins.update(_strided_slice(op, rng))
    elif name == "SPLIT" and 0 in constant:
        twins[0] = _other_encoding(np.asarray(op.inputs[0].data), len(op.inputs[1].shape))
    elif name == "SPLIT_V" and 2 in constant:
        twins[2] = _other_encoding(np.asarray(op.inputs[2].data), len(op.inputs[0].shape))
    elif name in ("PAD", "PADV2", "MIRROR_PAD") and 1 in constant:
        twins[1] = _paddings(op)
        if name == "PADV2" and 2 in constant:
            twins[2] = (np.asarray(op.inputs[2].data) + 1).astype(op.inputs[2].data.dtype)
    elif name == "GATHER" and 1 in constant:
        twins[1] = _indices(op, rng, [op.inputs[0].shape[int(getattr(op.options, "axis", 0)) % len(op.inputs[0].shape)]])
    elif name == "GATHER_ND" and 1 in constant:
        twins[1] = _indices(op, rng, list(op.inputs[0].shape[: op.inputs[1].shape[-1]]))
    elif name == "DEPTHWISE_CONV_2D" and 1 in constant and op.inputs[1].type_name == "INT8":
        twins[1] = _depthwise_int8(op)
    return {i: v for i, v in twins.items() if v is not None}


def _other_weights(t: Tensor, rng: np.random.Generator) -> np.ndarray | None:
    """Other weights of the same kind (kernels take them as arguments), or None to keep `t`'s
    value (shape operands and the like)."""
    data = np.asarray(t.data)
    if data.dtype.kind == "f":
        return (data * rng.uniform(0.5, 1.5, data.shape)).astype(data.dtype)
    if data.dtype == np.int8 and data.size > 1:
        return np.clip(data.astype(np.int32) + rng.integers(-3, 4, data.shape), -127, 127).astype(np.int8)
    return None


def with_twins(model: Model, rng: np.random.Generator) -> Model:
    """`model` with a copy of every op appended, reading the same graph inputs, with twin
    constants (twin_constants) and other float and int8 weights; the copies' results are graph
    outputs too. Tensors the ops share stay shared in the copy."""
    model = copy.deepcopy(model)
    sg = model.main
    copies: dict[int, Tensor] = {id(t): t for t in sg.inputs}

    def copied(t: Tensor | None, value: np.ndarray | None = None) -> Tensor | None:
        if t is None:
            return None
        if id(t) in copies and value is None:
            return copies[id(t)]
        if t.is_constant and value is None and (value := _other_weights(t, rng)) is None:
            return t
        twin = copy.copy(t)
        twin.name = f"{t.name}_twin"
        if value is not None:
            twin.data = value
        sg.tensors.append(twin)
        if not t.is_constant:
            copies[id(t)] = twin
        return twin

    for op in list(sg.operators):
        values = twin_constants(op, rng)
        twin = copy.copy(op)
        twin.inputs = [copied(t, values.get(i)) for i, t in enumerate(op.inputs)]
        twin.outputs = [copied(t) for t in op.outputs]
        sg.operators.append(twin)
    sg.outputs = sg.outputs + [copies[id(t)] for t in sg.outputs]
    model.signatures = []
    return model
