"""Data movement as index arithmetic: nothing here copies when inlined into a consumer.

RESHAPE is div/mod on the row-major offset of each run of axes, TRANSPOSE a permutation of indices,
SLICE an offset, CONCATENATION a select over ranges (DNNFusion §4.4's "loop joint"), PAD a bounds
test, GATHER an indirect index (checked: an index out of range fails the invoke, as it does in TFLite, and never
reads out of bounds — in the kernel on a CPU, on the host before the kernel runs on a GPU:
LoweringOptions.device_code).
"""

from __future__ import annotations

import dataclasses
import itertools

import halide as hl
import numpy as np

from ..values import Value, flat_index, read_broadcast, unflatten
from .elementwise import activation, round_half_away
from .registry import LoweringError, OpContext, register


def axis_groups(a, b) -> list[tuple[slice, slice]] | None:
    """The runs of axes of shapes `a` and `b` (same element count) that a reshape maps onto each
    other, in order: each pair of runs holds the same number of elements, as few axes as can be
    (trailing ones join the last run). None where an axis is empty or either shape a scalar."""
    if not a or not b or 0 in a or 0 in b:
        return None
    groups, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start = (i, j)
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        groups.append((slice(start[0], i), slice(start[1], j)))
    last_a, last_b = groups[-1]
    groups[-1] = (slice(last_a.start, len(a)), slice(last_b.start, len(b)))
    return groups


@register("RESHAPE", "SQUEEZE", "EXPAND_DIMS", shape_inputs=(1,))
def lower_reshape(ctx: OpContext) -> list[Value]:
    """Same elements, new shape: out[i] = in[unflatten(flatten(i))], run by run of axes that hold
    the same elements (axis_groups), so an axis both shapes keep is indexed as it is: a reshape of
    [1, 16, 16, 160] to [1, 256, 160] keeps its rows' 160 elements a dense vector, where the
    row-major offset of the whole index made every vector a gather."""
    x, out = ctx.value(0), ctx.out_shape()
    if tuple(x.shape) == out:
        return [ctx.define(ctx.func_name(), out, lambda *i: x(*i))]
    groups = axis_groups(tuple(x.shape), out)
    if groups is None:
        return [ctx.define(ctx.func_name(), out, lambda *i: x.at(unflatten(x.shape, flat_index(out, i))))]

    def body(*i):
        index: list[hl.Expr] = []
        for src, dst in groups:
            flat = flat_index(out[dst], i[dst])
            index += [flat] if src.stop - src.start == 1 else unflatten(x.shape[src], flat)
        return x.at(index)

    return [ctx.define(ctx.func_name(), out, body)]


@register("TRANSPOSE", compile_time=(1,))
def lower_transpose(ctx: OpContext) -> list[Value]:
    """out[i0..ik] = in[j] with j[perm[a]] = i[a]."""
    x = ctx.value(0)
    perm = [int(p) % x.rank for p in ctx.const(1)]
    tile = ctx.define(ctx.func_name("tile"), x.shape, lambda *i: x.at(list(i)))

    def body(*i):
        src: list[hl.Expr] = [hl.Expr(0)] * x.rank
        for a, p in enumerate(perm):
            src[p] = i[a]
        return tile.at(src)

    return [dataclasses.replace(ctx.define(ctx.func_name(), ctx.out_shape(), body), perm=tuple(perm),
                                tile_source=tile.func)]


def _joined(ctx: OpContext) -> tuple[tuple[int, ...], int, list[Value]]:
    """Output shape, the (non-negative) axis option, and every input of a joining op."""
    out = ctx.out_shape()
    return out, int(ctx.option("axis", 0)) % len(out), [ctx.value(k) for k in range(len(ctx.op.inputs))]


@register("CONCATENATION")
def lower_concatenation(ctx: OpContext) -> list[Value]:
    """A select chain over the inputs' ranges along the axis."""
    out, axis, parts = _joined(ctx)
    offsets = [0, *itertools.accumulate(p.shape[axis] for p in parts[:-1])]

    def body(*i):
        expr = None
        for p, off in zip(parts, offsets):
            idx = list(i)
            idx[axis] = hl.clamp(i[axis] - off, 0, p.shape[axis] - 1)
            expr = p.at(idx) if expr is None else hl.select(i[axis] >= off, p.at(idx), expr)
        return activation(expr, ctx.op.fused_activation, ctx.options.native_minmax, clamps_none=False)

    joined = ctx.define(ctx.func_name(), out, body)
    if axis == len(out) - 1:
        joined.joins = tuple(offsets[1:])
    return [joined]


@register("SLICE", compile_time=(1,), shape_inputs=(2,))
def lower_slice(ctx: OpContext) -> list[Value]:
    """out[i] = in[i + begin]."""
    x = ctx.value(0)
    begin = [int(b) for b in ctx.const(1)]
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: x.at([a + b for a, b in zip(i, begin)]))]


def _strided_slice_starts(ctx: OpContext, shape) -> tuple[list[int], list[int]]:
    """Per input axis, the first index read and the stride (TFLite's StartForAxis)."""
    begin, end, strides = (list(map(int, ctx.const(k))) for k in (1, 2, 3))
    begin_mask = int(ctx.option("beginMask", 0))
    starts = []
    for a, d in enumerate(shape):
        s, st = begin[a], strides[a]
        if begin_mask & (1 << a):
            s = 0 if st > 0 else d - 1
        elif s < 0:
            s += d
        s = max(0, min(s, d - 1)) if st < 0 else max(0, min(s, d))
        starts.append(s)
    return starts, strides


@register("STRIDED_SLICE", compile_time=(1, 2, 3))
def lower_strided_slice(ctx: OpContext) -> list[Value]:
    """in[start + i * stride] per axis; shrink-axis dimensions are fixed at their start."""
    x = ctx.value(0)
    if int(ctx.option("ellipsisMask", 0)) or int(ctx.option("newAxisMask", 0)) or bool(ctx.option("offset", False)):
        raise LoweringError("STRIDED_SLICE with ellipsis / new-axis masks or offset")
    starts, strides = _strided_slice_starts(ctx, x.shape)
    shrink = int(ctx.option("shrinkAxisMask", 0))

    def body(*i):
        src, j = [], 0
        for a in range(x.rank):
            if shrink & (1 << a):
                src.append(hl.Expr(starts[a]))
            else:
                src.append(starts[a] + i[j] * strides[a])
                j += 1
        return x.at(src)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


def _split(ctx: OpContext, x: Value, axis: int, sizes: list[int]) -> list[Value]:
    outs, off = [], 0
    for k, size in enumerate(sizes):
        def body(*i, off=off):
            idx = list(i)
            idx[axis] = i[axis] + off
            return x.at(idx)

        outs.append(ctx.define(ctx.func_name(str(k)), ctx.out_shape(k), body))
        off += size
    return outs


@register("SPLIT", compile_time=(0,))
def lower_split(ctx: OpContext) -> list[Value]:
    """Equal parts along the axis (input 0 is the axis, input 1 the tensor)."""
    x = ctx.value(1)
    axis = int(np.asarray(ctx.const(0)).reshape(-1)[0]) % x.rank
    return _split(ctx, x, axis, [o.shape[axis] for o in ctx.op.outputs])


@register("SPLIT_V", compile_time=(2,), shape_inputs=(1,))
def lower_split_v(ctx: OpContext) -> list[Value]:
    """Parts of the given sizes along the axis (inputs: tensor, sizes, axis)."""
    x = ctx.value(0)
    axis = int(np.asarray(ctx.const(2)).reshape(-1)[0]) % x.rank
    return _split(ctx, x, axis, [o.shape[axis] for o in ctx.op.outputs])


@register("PACK")
def lower_pack(ctx: OpContext) -> list[Value]:
    """Stack along a new axis: the new index picks the input."""
    out, axis, parts = _joined(ctx)

    def body(*i):
        idx = list(i[:axis]) + list(i[axis + 1:])
        expr = parts[-1].at(idx)
        for k in range(len(parts) - 2, -1, -1):
            expr = hl.select(i[axis] == k, parts[k].at(idx), expr)
        return expr

    return [ctx.define(ctx.func_name(), out, body)]


@register("UNPACK")
def lower_unpack(ctx: OpContext) -> list[Value]:
    """One output per index along the axis, which disappears."""
    x = ctx.value(0)
    axis = int(ctx.option("axis", 0)) % x.rank
    return [ctx.define(ctx.func_name(str(k)), ctx.out_shape(k),
                       lambda *i, k=k: x.at(list(i[:axis]) + [hl.Expr(k)] + list(i[axis:])))
            for k in range(len(ctx.op.outputs))]


def _pad_value(ctx: OpContext) -> hl.Expr:
    """PADV2's constant, else zero: a real zero, which for an int8 tensor is its zero point (TFLite's
    pad.cc)."""
    t = ctx.out_type()
    if ctx.op.name == "PADV2" and ctx.has_input(2):
        return hl.cast(t, float(np.asarray(ctx.const(2)).reshape(-1)[0]))
    q = ctx.op.outputs[0].quantization
    if ctx.op.outputs[0].type_name == "INT8" and q is not None and q.zero_point is not None and len(q.zero_point):
        return hl.cast(t, int(np.asarray(q.zero_point).reshape(-1)[0]))
    return hl.cast(t, 0)


@register("PAD", "PADV2", compile_time=(1, 2))
def lower_pad(ctx: OpContext) -> list[Value]:
    """in[i - before] inside the original extent, the pad value outside."""
    x = ctx.value(0)
    before = [int(p[0]) for p in np.asarray(ctx.const(1)).reshape(-1, 2)]
    fill = _pad_value(ctx)

    def body(*i):
        src = [a - b for a, b in zip(i, before)]
        inside = hl.Expr(True)
        for s, d in zip(src, x.shape):
            inside = inside & (s >= 0) & (s < d)
        return hl.select(inside, x.at([hl.clamp(s, 0, d - 1) for s, d in zip(src, x.shape)]), fill)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("MIRROR_PAD", compile_time=(1,))
def lower_mirror_pad(ctx: OpContext) -> list[Value]:
    """Reflect (edge excluded) or symmetric (edge included) padding."""
    x = ctx.value(0)
    before = [int(p[0]) for p in np.asarray(ctx.const(1)).reshape(-1, 2)]
    symmetric = int(ctx.option("mode", 0)) == 1
    shift = 1 if symmetric else 0

    def reflect(s: hl.Expr, d: int) -> hl.Expr:
        low = hl.select(s < 0, -s - shift, s)
        # The clamp changes nothing for valid paddings; it lets bounds inference see the range.
        return hl.clamp(hl.select(low >= d, 2 * d - 2 - low + shift, low), 0, d - 1)

    return [ctx.define(ctx.func_name(), ctx.out_shape(),
                       lambda *i: x.at([reflect(a - b, d) for a, b, d in zip(i, before, x.shape)]))]


@register("TILE", shape_inputs=(1,))
def lower_tile(ctx: OpContext) -> list[Value]:
    """out[i] = in[i mod shape]."""
    x = ctx.value(0)
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: x.at([a % d for a, d in zip(i, x.shape)]))]


@register("BROADCAST_TO", shape_inputs=(1,))
def lower_broadcast_to(ctx: OpContext) -> list[Value]:
    """NumPy broadcasting to the output shape."""
    x, out = ctx.value(0), ctx.out_shape()
    return [ctx.define(ctx.func_name(), out, lambda *i: read_broadcast(x, out, i))]


def checked_index(index: hl.Expr, size: int, op: str, device_code: bool) -> hl.Expr:
    """An index read from data, as TFLite treats it: one outside [0, size) fails the invoke
    ("<op> index out of bounds", as LiteRT's kernels say) instead of reading a made-up row. The
    clamp after the check tells bounds inference the range; it never changes a valid index. For
    `device_code` (LoweringOptions.device_code) only the clamp: the caller has had the host check it
    (`index_operand`)."""
    index = hl.cast(hl.Int(32), index)
    if device_code:
        return hl.clamp(index, 0, size - 1)
    valid = hl.require((index >= 0) & (index < size), index, hl.Expr(f"{op} index out of bounds: got"), index,
                       hl.Expr(f"for a dimension of {size}"))
    return hl.clamp(valid, 0, size - 1)


def index_operand(ctx: OpContext, i: int, bounds: tuple[int, ...], op: str) -> Value:
    """Input `i` of indices, each innermost position k bounded by bounds[k % len(bounds)]. For device
    code the check moves to the host: a constant is checked here (LoweringError if TFLite would fail
    on it), a block input by the delegate before each invoke (ctx.index_checks); indices computed in
    the block are on the device, where nothing can check them, so the block stays with TFLite."""
    if ctx.options.device_code:
        t = ctx.op.inputs[i]
        if t.is_constant:
            values = ctx.const(i).reshape(-1, len(bounds)).astype(np.int64)
            if np.any((values < 0) | (values >= np.asarray(bounds))):
                raise LoweringError(f"{op} index out of bounds in a constant")
        elif ctx.is_computed_in_block(t):
            raise LoweringError(f"{op} indices computed in the block: device code cannot check them")
        else:
            ctx.index_checks.append((t, bounds, op))
    return ctx.value(i)


@register("GATHER", compile_time=(1,))
def lower_gather(ctx: OpContext) -> list[Value]:
    """out[outer, idx..., inner] = params[outer, indices[idx...], inner] (batch_dims 0)."""
    params = ctx.value(0)
    if int(ctx.option("batchDims", 0)) != 0:
        raise LoweringError("GATHER with batch_dims")
    axis = int(ctx.option("axis", 0)) % params.rank
    indices = index_operand(ctx, 1, (params.shape[axis],), "gather")
    k = indices.rank

    def body(*i):
        pos = checked_index(indices.at(list(i[axis:axis + k])), params.shape[axis], "gather", ctx.options.device_code)
        return params.at(list(i[:axis]) + [pos] + list(i[axis + k:]))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("GATHER_ND", compile_time=(1,))
def lower_gather_nd(ctx: OpContext) -> list[Value]:
    """out[b..., inner...] = params[indices[b..., :], inner...]."""
    params = ctx.value(0)
    depth = int(ctx.op.inputs[1].shape[-1])
    indices = index_operand(ctx, 1, tuple(params.shape[:depth]), "gather_nd")
    lead = indices.rank - 1

    def body(*i):
        coords = [checked_index(indices.at(list(i[:lead]) + [hl.Expr(d)]), params.shape[d], "gather_nd",
                                ctx.options.device_code)
                  for d in range(depth)]
        return params.at(coords + list(i[lead:]))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("DYNAMIC_UPDATE_SLICE")
def lower_dynamic_update_slice(ctx: OpContext) -> list[Value]:
    """out = operand with `update` written at `start` (a run-time index per axis), each start
    clamped to [0, operand - update] as TFLite's kernel clamps it: a KV cache's update at the
    current position."""
    operand, update, start = ctx.value(0), ctx.value(1), ctx.value(2)
    shape = ctx.out_shape()
    starts = [hl.clamp(hl.cast(hl.Int(32), start.at([hl.Expr(d)])), 0, shape[d] - update.shape[d])
              for d in range(len(shape))]

    def body(*i):
        inside = None
        for d, (x, s) in enumerate(zip(i, starts)):
            here = (x >= s) & (x < s + update.shape[d])
            inside = here if inside is None else inside & here
        written = update.at([hl.clamp(x - s, 0, n - 1) for x, s, n in zip(i, starts, update.shape)])
        return operand.at(list(i)) if inside is None else hl.select(inside, written, operand.at(list(i)))

    ctx.slice_update = (update, starts)
    return [ctx.define(ctx.func_name(), shape, body)]


def _resize_scale(in_size: int, out_size: int, align_corners: bool) -> float:
    if align_corners and out_size > 1:
        return (in_size - 1) / (out_size - 1)
    return in_size / out_size


def resize_inputs(ctx: OpContext) -> tuple[Value, tuple[int, ...], bool, bool]:
    """The image, the output shape and the align_corners / half_pixel_centers options."""
    align, half = bool(ctx.option("alignCorners", False)), bool(ctx.option("halfPixelCenters", False))
    return ctx.value(0), ctx.out_shape(), align, half


def _bilinear_taps(in_size: int, out_size: int, align: bool, half: bool) -> tuple[np.ndarray, ...]:
    """Per output row (or column): the lower and upper source pixel, the upper one's weight and
    the lower one's, in float32 as TFLite's reference kernel computes them."""
    scale = np.float32(_resize_scale(in_size, out_size, align))
    i = np.arange(out_size, dtype=np.float32)
    pos = (i + np.float32(0.5)) * scale - np.float32(0.5) if half else i * scale
    lo = np.maximum(np.floor(pos).astype(np.int32), 0)
    hi = np.minimum(np.ceil(pos).astype(np.int32), in_size - 1)
    frac = (pos - lo.astype(np.float32)).astype(np.float32)
    return lo, hi, frac, (np.float32(1) - frac).astype(np.float32)


@register("RESIZE_BILINEAR", shape_inputs=(1,))
def lower_resize_bilinear(ctx: OpContext) -> list[Value]:
    """TFLite's reference interpolation, including its half-pixel and align-corners variants.
    Source pixels and weights depend on the row or the column alone: they are tables of the
    output's rows and columns, computed here, not per output pixel."""
    x, out, align, half = resize_inputs(ctx)
    _, h, w, _ = x.shape
    f32 = hl.Float(32)
    def taps(axis: str, in_size: int, out_size: int):
        lo, hi, frac, rest = _bilinear_taps(in_size, out_size, align, half)
        lower, upper = ctx.table(lo, axis + "0"), ctx.table(hi, axis + "1")
        # The clamps change no entry; they tell bounds inference which pixels are read.
        return (lambda i: hl.clamp(lower(i), 0, in_size - 1), lambda i: hl.clamp(upper(i), 0, in_size - 1),
                ctx.table(frac, axis + "_frac", f32), ctx.table(rest, axis + "_rest", f32))

    y0, y1, dy, ry = taps("y", h, out[1])
    x0, x1, dx, rx = taps("x", w, out[2])

    def body(n, y, xx, c):
        # Strict: in TFLite's order, so that an inf meets a zero weight (NaN) exactly where it does there.
        return hl.strict_float(x(n, y0(y), x0(xx), c) * ry(y) * rx(xx) + x(n, y1(y), x0(xx), c) * dy(y) * rx(xx)
                               + x(n, y0(y), x1(xx), c) * ry(y) * dx(xx) + x(n, y1(y), x1(xx), c) * dy(y) * dx(xx))

    return [ctx.define(ctx.func_name(), out, body)]


@register("RESIZE_NEAREST_NEIGHBOR", shape_inputs=(1,))
def lower_resize_nearest(ctx: OpContext) -> list[Value]:
    """TFLite's reference nearest-neighbour sampling."""
    x, out, align, half = resize_inputs(ctx)
    _, h, w, _ = x.shape
    offset = hl.f32(0.5) if half else hl.f32(0)

    def source(i: hl.Expr, in_size: int, out_size: int) -> hl.Expr:
        scale = hl.f32(np.float32(_resize_scale(in_size, out_size, align)))
        pos = (hl.cast(hl.Float(32), i) + offset) * scale
        idx = hl.cast(hl.Int(32), round_half_away(pos) if align else hl.floor(pos))
        # Never below 0 (i >= 0), but bounds inference cannot see that through the rounding: a
        # producer realised before the resize would be read "in an unbounded way" without it.
        return hl.clamp(idx, 0, in_size - 1)

    return [ctx.define(ctx.func_name(), out, lambda n, y, xx, c: x(n, source(y, h, out[1]), source(xx, w, out[2]), c))]


@register("DEPTH_TO_SPACE")
def lower_depth_to_space(ctx: OpContext) -> list[Value]:
    """out[n, y, x, c] = in[n, y / b, x / b, ((y % b) * b + x % b) * C + c]."""
    x = ctx.value(0)
    bs = int(ctx.option("blockSize", 1))
    cout = ctx.out_shape()[3]
    return [ctx.define(ctx.func_name(), ctx.out_shape(),
                       lambda n, y, xx, c: x(n, y / bs, xx / bs, ((y % bs) * bs + xx % bs) * cout + c))]


@register("SPACE_TO_DEPTH")
def lower_space_to_depth(ctx: OpContext) -> list[Value]:
    """out[n, y, x, c] = in[n, y * b + (c / C) / b, x * b + (c / C) % b, c % C]."""
    x = ctx.value(0)
    bs = int(ctx.option("blockSize", 1))
    cin = x.shape[3]
    return [ctx.define(ctx.func_name(), ctx.out_shape(),
                       lambda n, y, xx, c: x(n, y * bs + (c / cin) / bs, xx * bs + (c / cin) % bs, c % cin))]
