"""Convolutions, matrix products and pooling.

Each sums in float32 like TFLite's reference kernels (accumulate, then add the bias, then the
fused activation); the order of the sum may differ, so results agree to float32 rounding, not bit
for bit. Padding follows TFLite's ComputePaddingHeightWidth. The int8 forms of CONV_2D,
DEPTHWISE_CONV_2D and FULLY_CONNECTED share these loops with another `Arithmetic`
(lower/quantized.py): integer terms, an int32 sum, TFLite's fixed-point requantization.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import halide as hl

from ..pack import CHANNEL_TILE, DOT_DEPTH, padded
from ..values import Value, flat_index, unflatten
from . import ieee
from .elementwise import activation, activation_in_half
from .registry import AccumulatorKind, LoweringError, OpContext, ReductionDomain, accumulate, read, register


def same_padding(in_size: int, out_size: int, stride: int, dilation: int, kernel: int) -> int:
    """TFLite's leading pad for SAME padding (the trailing side gets any odd extra)."""
    effective = (kernel - 1) * dilation + 1
    return max(0, ((out_size - 1) * stride + effective - in_size) // 2)


def _padding(ctx: OpContext, in_hw, out_hw, strides, dilations, kernel) -> tuple[int, int]:
    mode = ctx.option("padding", 0)
    if mode == 1:  # VALID
        return (0,) * len(kernel)
    return tuple(same_padding(i, o, s, d, k) for i, o, s, d, k in zip(in_hw, out_hw, strides, dilations, kernel))


# What a padded read gives outside the map: a constant, or a function of the batch index.
Fill = int | Callable[[hl.Expr], hl.Expr]


@dataclass
class Arithmetic:
    """How a convolution or matrix product turns its operands into a sum and the sum into its
    output element: float32 here (`float_arithmetic`), int8 in quantized.py."""

    source: Callable[[Value], Value]  # the data input as its terms read it
    term: Callable[[hl.Expr, hl.Expr], hl.Expr]  # (input element, weight) -> the summed product
    init: Callable[[hl.Expr], hl.Expr]  # the sum's start for output channel oc (the bias)
    # (sum, output index in TFLite order: the channel last) -> output element. The whole index, as
    # a dynamic-range sum is rescaled per row (lower/hybrid.py).
    finish: Callable[[hl.Expr, tuple], hl.Expr]
    # Nonzero: the sum is taken over groups of this many consecutive input channels, one
    # dot-product lane each (int8 on ARM's sdot: quantized.py); the weights come packed for it
    # ("dot4") and the source, read as stored, is `fill` outside the map: a constant, or a function of
    # the batch index where the source is quantized per image at run time (lower/hybrid.py).
    dot: int = 0
    fill: Fill = 0
    # True: `term` gives a narrow product (int8 x int8 -> int16) and a depthwise sum adds two taps'
    # products in that type before widening them into the accumulator (quantized.py).
    paired_taps: bool = False
    # True: `source` is a conversion worth one pass into a buffer (x86's uint8 view of an int8 input),
    # not a recomputation at every term that reads it.
    copy_source: bool = False


def float_arithmetic(ctx: OpContext, bias_index: int) -> Arithmetic:
    """In the target's float arithmetic (LoweringOptions.float_arithmetic): the bias first, the
    fused activation last. Float32: operands as they are. Half precision: products and sums in it,
    as XNNPACK's fp16 kernels take them; a block input is converted once (in_half)."""
    bias, act, native = channel_bias(ctx, bias_index), ctx.op.fused_activation, ctx.options.native_minmax
    kind = ctx.options.float_arithmetic
    if kind == hl.Float(32):
        return Arithmetic(lambda x: x, lambda v, w: v * w, bias, lambda acc, i: activation(acc, act, native))
    if not native:
        raise LoweringError("half-precision arithmetic needs min / max with TFLite's NaN answers (ARM's)")
    return Arithmetic(lambda x: in_half(ctx, x), lambda v, w: hl.cast(kind, v) * hl.cast(kind, w),
                      lambda oc: hl.cast(kind, bias(oc)), lambda acc, i: activation_in_half(acc, act))


def in_half(ctx: OpContext, x: Value) -> Value:
    """`x` stored in half precision: itself where it is (a tensor the block computes), else a copy
    converted once (a block input), which the schedule realises before the op that reads it."""
    if x.type == hl.Float(16):
        return x
    half = ctx.define(ctx.func_name("half"), x.shape, lambda *i: x.at(i))
    half.readable_channels, half.joins = x.readable_channels, x.joins
    ctx.materialize.append(half)
    return half


def _zero_outside(x: Value, name: str, fill: Fill = 0) -> Value:
    """`x` read with zeros (or `fill`) outside its spatial extent (the conv's implicit padding):
    every axis between the batch and the channels (H and W; D, H and W for a 3-D conv).

    The bounds test is marked `likely`, so where a schedule inlines this into the convolution's
    taps, Halide's loop partitioning splits each row and column loop into border iterations that
    keep the test and interior ones that read `x` directly: no zero-padded copy, no test inside.
    """
    spatial = x.shape[1:-1]
    # The channel clamp lets a schedule round channel loops up past the last channel; where `x`
    # can be read past it (Value.readable_channels), only as far as that, which no tile reaches:
    # Halide then drops the clamp, which would otherwise make every tap's vector load a gather.
    channels = max(x.shape[-1], x.readable_channels)
    b, ch = hl.Var("n"), hl.Var("c")
    zero = _fill_value(x, fill, b)
    stored = x.type if x.type.is_float() else zero.type()  # half precision stays half
    at = [hl.Var(v) for v in ("z", "y", "x")[-len(spatial):]]
    inside = (at[0] >= 0) & (at[0] < spatial[0])
    for v, extent in zip(at[1:], spatial[1:]):
        inside = inside & (v >= 0) & (v < extent)
    value = x(b, *(hl.clamp(hl.likely(v), 0, extent - 1) for v, extent in zip(at, spatial)), hl.clamp(ch, 0, channels - 1))
    f = hl.Func(name)
    f[[ch, *reversed(at), b]] = hl.cast(stored, hl.select(hl.likely(inside), value, zero))
    return Value(f, tuple(x.shape), f.type(), x.readable_channels, x.joins)


def _fill_value(x: Value, fill: Fill, batch: hl.Expr) -> hl.Expr:
    """What a padded read of `x` gives outside the map in batch element `batch` (Arithmetic.fill)."""
    return hl.cast(x.read_type, fill(batch) if callable(fill) else fill)


def _conv_geometry(ctx: OpContext, x: Value, kh: int, kw: int):
    out = ctx.out_shape()
    strides = (int(ctx.option("strideH", 1)), int(ctx.option("strideW", 1)))
    dilations = (int(ctx.option("dilationHFactor", 1)), int(ctx.option("dilationWFactor", 1)))
    pads = _padding(ctx, x.shape[1:3], out[1:3], strides, dilations, (kh, kw))
    return out, strides, dilations, pads


def channel_bias(ctx: OpContext, index: int, zero: hl.Expr | None = None):
    """The bias as a function of the output channel (packed: padded with zeros), or `zero`
    (float32 0 unless given) when the op has none."""
    if not ctx.has_input(index):
        return lambda oc: hl.f32(0) if zero is None else zero
    bias = ctx.packed(index, "pad_channels") or ctx.value(index)
    return lambda oc: bias(oc)


# Weights are tile-blocked ("o_blocked": each tile of output channels holds all its weights
# contiguously, in the order the register tile consumes them), for every map size and row count.
# Inside a model they are read cold (the other blocks evict them), and a channel-innermost layout
# makes a tile gather 128-byte pieces a whole output-channel count apart. (A block timed alone, its
# weights in cache, cannot see the difference: it shows inside the model.)


# The smallest register tile of output channels any CPU template takes (NEON: 2 vectors of 4).
_SMALLEST_TILE = 8


def _within_tile(o):
    """o % CHANNEL_TILE, written as (o % 8) + 8 * ((o / 8) % 2) + 16 * ((o / 16) % 2): the same
    number for every o >= 0, in a form Halide simplifies for a register tile of 8, 16 or 32
    channels. A NEON tile starts at 16 * t (or 8 * t), and `(16 * t + 4) % 32` does not simplify,
    so each of its weight vectors got an address of its own (one `ldr` each, where contiguous vectors
    take an `ldp` per pair); here the tile's vectors share one base."""
    within, size = o % _SMALLEST_TILE, _SMALLEST_TILE
    while size < CHANNEL_TILE:
        within += size * ((o / size) % 2)
        size *= 2
    return within


def packed_weights(ctx: OpContext, index: int, dot: int = 0, blocked_dot: bool = False):
    """weight(o, *rest) for TFLite weights [O, *rest]: tile-blocked (pack.py, "o_blocked"), or
    4-deep for dot products (`dot`: "dot4", and "dot4_blocked" where `blocked_dot`), or as TFLite
    stores them when they are not constant."""
    if dot:
        assert dot == DOT_DEPTH
        if blocked_dot:
            w = ctx.packed(index, "dot4_blocked")
            return lambda o, *rest: w(o / CHANNEL_TILE, *rest[:-1], rest[-1] / dot, _within_tile(o), rest[-1] % dot)
        # A convolution's weights take one layout for every pixel count, unblocked: indexed modulo
        # the block, its channels were gathered a byte at a time where the tile did not divide the
        # block.
        w = ctx.packed(index, "dot4")
        return lambda o, *rest: w(*rest[:-1], rest[-1] / dot, o, rest[-1] % dot)
    return _tile_blocked(ctx, index, "o_blocked", lambda w, o, *rest: w(o, *rest))


def channel_tiles(blocked: Value):
    """reader(o, *rest) of a constant [O, *rest] packed into tiles of output channels
    ([O_padded / CHANNEL_TILE, *rest, CHANNEL_TILE]: pack.py's "o_blocked" and its kin)."""
    return lambda o, *rest: blocked(o / CHANNEL_TILE, *rest, _within_tile(o))


def _tile_blocked(ctx: OpContext, index: int, packer: str, as_stored):
    """weight(o, *rest) for a filter whose constant form is packed by `packer` into
    [O_padded / CHANNEL_TILE, *rest, CHANNEL_TILE] (pack.py: "o_blocked", "o_last_blocked",
    "o_before_last_blocked"); a filter that is not constant is read by as_stored(w, o, *rest)."""
    blocked = ctx.packed(index, packer)
    if blocked is not None:
        return channel_tiles(blocked)
    w = ctx.value(index)
    return lambda o, *rest: as_stored(w, o, *rest)


@register("CONV_2D")
def lower_conv2d(ctx: OpContext) -> list[Value]:
    """out[n,y,x,o] = act(bias[o] + sum_{ky,kx,i} in[n, y*s-p+ky*d, x*s-p+kx*d, g*Cin+i] * w[o,ky,kx,i])."""
    return _readable_past_last_channel(ctx, conv2d(ctx, float_arithmetic(ctx, 2)))


def conv2d(ctx: OpContext, arith: Arithmetic) -> list[Value]:
    """CONV_2D's loops under an arithmetic (float32 or int8)."""
    x = arith.source(ctx.value(0))
    cout, kh, kw, cin = ctx.op.inputs[1].shape
    out, (sh, sw), (dh, dw), (ph, pw) = _conv_geometry(ctx, x, kh, kw)
    if arith.dot and cin % arith.dot:
        return _conv2d_rows(ctx, arith, x, out, (sh, sw), dh, (ph, pw))
    weight = packed_weights(ctx, 1, dot=arith.dot)
    groups = x.shape[3] // cin
    per_group = cout // groups
    pointwise = (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0)
    if pointwise:
        src = x
        if arith.copy_source:
            ctx.materialize.append(src)
    else:
        src = _zero_outside(x, ctx.func_name("padded"), arith.fill)
        ctx.materialize.append(src)
        ctx.padded.append((src, x))
    r = ReductionDomain([kh, kw, cin], ctx.func_name("r"))

    def update(n, y, xx, o):
        channel = (o / per_group) * cin + r[2] if groups > 1 else r[2]
        pixel = src(n, y * sh - ph + r[0] * dh, xx * sw - pw + r[1] * dw, channel)
        return arith.term(pixel, weight(o, r[0], r[1], r[2]))

    acc = accumulate(ctx, out, lambda n, y, xx, o: arith.init(o), update, AccumulatorKind.CONV, r,
                     source=src.func, dot=arith.dot, source_stride=x.shape[3] * sw * x.type.bytes())
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


def conv2d_sums_in_dots(ctx: OpContext) -> bool:
    """Whether an integer CONV_2D sums in dot-product groups: of DOT_DEPTH input channels, or, where
    its input channels do not come in such groups, along its filter rows (_conv2d_rows)."""
    cin = ctx.op.inputs[1].shape[3]
    groups = ctx.op.inputs[0].shape[3] // cin
    return cin % DOT_DEPTH == 0 or (groups == 1 and int(ctx.option("dilationWFactor", 1)) == 1)


def _conv2d_rows(ctx: OpContext, arith: Arithmetic, x: Value, out, strides, dh: int, pads) -> list[Value]:
    """A dot-product CONV_2D over few input channels (an RGB stem: 3).

    In NHWC a filter row's kw x cin taps are kw * cin consecutive values of an input row, so the
    input is read as rows of w * cin values (`fill` outside the map) and each filter row sums its
    run 4 at a time, with zero weights past kw * cin ("dot4_rows"): MobileNetV2's stem (3x3, 3 input
    channels) sums 3 groups a row instead of 27 single products.
    """
    cout, kh, kw, cin = ctx.op.inputs[1].shape
    n, h, w, c = x.shape
    (sh, sw), (ph, pw) = strides, pads
    weight = ctx.packed(1, "dot4_rows")
    groups = -(-kw * cin // arith.dot)
    rows = hl.Func(ctx.func_name("rows"))
    b, y, k = hl.Var("n"), hl.Var("y"), hl.Var("k")
    fill = _fill_value(x, arith.fill, b)
    inside = (y >= 0) & (y < h) & (k >= 0) & (k < w * cin)
    column = hl.clamp(k, 0, w * cin - 1)
    rows[k, y, b] = hl.select(inside, x(b, hl.clamp(y, 0, h - 1), column / cin, column % cin), fill)
    src = Value(rows, (n, h, w * cin), rows.type())
    ctx.materialize.append(src)
    # No source: more than padding (each byte's pixel and channel take a division by cin), so
    # worth its copy on a CPU (BlockKernel.padding_read_in_place).
    ctx.padded.append((src, None))
    r = ReductionDomain([kh, groups * arith.dot], ctx.func_name("r"))

    def update(n_, y_, xx, o):
        pixel = src(n_, y_ * sh - ph + r[0] * dh, (xx * sw - pw) * cin + r[1])
        return arith.term(pixel, weight(r[0], r[1] / arith.dot, o, r[1] % arith.dot))

    acc = accumulate(ctx, out, lambda n_, y_, xx, o: arith.init(o), update, AccumulatorKind.CONV, r, dot=arith.dot)
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


@register("CONV_3D")
def lower_conv3d(ctx: OpContext) -> list[Value]:
    """out[n,z,y,x,o] = act(bias[o] + sum_{kz,ky,kx,i} in[n, z*s-p+kz*d, y*s-p+ky*d, x*s-p+kx*d, i] * w[kz,ky,kx,i,o]).

    TFLite's filter is [kd, kh, kw, Cin, Cout]; a constant one is tile-blocked as CONV_2D's
    ("o_last_blocked": each tile of output channels holds its weights in one run). The accumulator
    is CONV_2D's with one more spatial axis and one more tap loop, and takes the same register-tile
    template."""
    arith = float_arithmetic(ctx, 2)
    x = ctx.value(0)
    kd, kh, kw, cin, _ = ctx.op.inputs[1].shape
    if x.shape[4] != cin:
        raise LoweringError("CONV_3D with groups")
    out = ctx.out_shape()
    strides = tuple(int(ctx.option(f"stride{a}", 1)) for a in "DHW")
    dilations = tuple(int(ctx.option(f"dilation{a}Factor", 1)) for a in "DHW")
    pads = _padding(ctx, x.shape[1:4], out[1:4], strides, dilations, (kd, kh, kw))
    weight = _tile_blocked(ctx, 1, "o_last_blocked", lambda w, o, *rest: w(*rest, o))
    src = _zero_outside(x, ctx.func_name("padded"), arith.fill)
    ctx.materialize.append(src)
    ctx.padded.append((src, x))
    r = ReductionDomain([kd, kh, kw, cin], ctx.func_name("r"))

    def update(n, *at):
        *spatial, o = at
        pixel = src(n, *(i * s - p + r[k] * d for k, (i, s, p, d) in enumerate(zip(spatial, strides, pads, dilations))),
                    r[3])
        return arith.term(pixel, weight(o, r[0], r[1], r[2], r[3]))

    acc = accumulate(ctx, out, lambda *i: arith.init(i[-1]), update, AccumulatorKind.CONV, r, source=src.func,
                     source_stride=cin * strides[2] * x.type.bytes())
    conv = ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))
    return _readable_past_last_channel(ctx, [conv])


@register("DEPTHWISE_CONV_2D")
def lower_depthwise(ctx: OpContext) -> list[Value]:
    """out[n,y,x,o] = act(bias[o] + sum_{ky,kx} in[n, y*s-p+ky*d, x*s-p+kx*d, o / mult] * w[0,ky,kx,o])."""
    return _readable_past_last_channel(ctx, depthwise(ctx, float_arithmetic(ctx, 2)))


def _readable_past_last_channel(ctx: OpContext, results: list[Value]) -> list[Value]:
    """A float convolution's result, marked readable up to its packed channel count
    (Value.readable_channels) where its weights and bias are constants: those are packed with the
    channels padded with zeros, so every channel up to there reads only memory that exists."""
    if ctx.op.inputs[1].is_constant and (not ctx.has_input(2) or ctx.op.inputs[2].is_constant):
        results[0].readable_channels = padded(results[0].shape[-1])
    return results


def depthwise(ctx: OpContext, arith: Arithmetic) -> list[Value]:
    """DEPTHWISE_CONV_2D's loops under an arithmetic (float32 or int8)."""
    x = arith.source(ctx.value(0))
    _, kh, kw, cout = ctx.op.inputs[1].shape
    w = ctx.packed(1, "pad_channels") or ctx.value(1)
    mult = cout // x.shape[3]
    out, (sh, sw), (dh, dw), (ph, pw) = _conv_geometry(ctx, x, kh, kw)
    padded = _zero_outside(x, ctx.func_name("padded"), arith.fill)
    ctx.materialize.append(padded)
    ctx.padded.append((padded, x))

    def tap(n, y, xx, o, ky, kx):
        channel = o / mult if mult > 1 else o
        return arith.term(padded(n, y * sh - ph + ky * dh, xx * sw - pw + kx * dw, channel), w(0, ky, kx, o))

    if arith.paired_taps:
        # Taps two at a time (row-major over the filter), their narrow products added before one
        # widening add into the int32 sum: half the widening adds (ARM: smull, smlal, saddw). The
        # loop is unrolled, so the odd last tap's select and each tap's (ky, kx) fold to constants.
        taps = kh * kw
        r = ReductionDomain([-(-taps // 2)], ctx.func_name("r"))

        def update(n, y, xx, o):
            first, second = 2 * r.x, hl.min(2 * r.x + 1, taps - 1)
            product = tap(n, y, xx, o, first / kw, first % kw)
            other = hl.select(2 * r.x + 1 < taps, tap(n, y, xx, o, second / kw, second % kw),
                              hl.cast(product.type(), 0))
            return hl.cast(hl.Int(32), product + other)
    else:
        r = ReductionDomain([kh, kw], ctx.func_name("r"))

        def update(n, y, xx, o):
            return tap(n, y, xx, o, r[0], r[1])

    acc = accumulate(ctx, out, lambda n, y, xx, o: arith.init(o), update, AccumulatorKind.DEPTHWISE, r,
                     narrow=arith.paired_taps)
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


@register("TRANSPOSE_CONV", shape_inputs=(0,))
def lower_transpose_conv(ctx: OpContext) -> list[Value]:
    """TFLite's TRANSPOSE_CONV. Inputs: output shape, weights [O,kh,kw,I], input, bias."""
    return transpose_conv(ctx, 2, 1, transpose_conv_geometry(ctx), float_arithmetic(ctx, 3))


def transpose_conv_geometry(ctx: OpContext) -> tuple[tuple[int, int], tuple[int, int]]:
    """TFLite's TRANSPOSE_CONV strides and leading padding, computed as if the output were the input
    of a forward conv."""
    _, kh, kw, _ = ctx.op.inputs[1].shape
    out, in_shape = ctx.out_shape(), ctx.op.inputs[2].shape
    strides = int(ctx.option("strideH", 1)), int(ctx.option("strideW", 1))
    return strides, _padding(ctx, out[1:3], in_shape[1:3], strides, (1, 1), (kh, kw))


def transpose_conv(ctx: OpContext, data: int, weights: int, geometry: tuple[tuple[int, int], tuple[int, int]],
                   arith: Arithmetic) -> list[Value]:
    """The gather form of a transpose convolution's scatter: each output pixel sums the input
    pixels whose stride-spaced kernel footprint covers it; `geometry` is the strides and the
    output's leading (top, left) padding, inputs are given by index (TFLite's op and MediaPipe's
    order them apart), the arithmetic float32 or int8."""
    x = arith.source(ctx.value(data))
    cout, kh, kw, cin = ctx.op.inputs[weights].shape
    weight = packed_weights(ctx, weights)
    out = ctx.out_shape()
    (sh, sw), (ph, pw) = geometry
    _, h, wd, _ = x.shape
    # Only taps with ky = (y + pad) mod stride (+ multiples of the stride) reach output row y, so
    # the reduction walks those alone: ceil(k / s) taps per axis instead of k (a 2x2 stride-2
    # kernel: one tap instead of four, three of them empty).
    r = ReductionDomain([-(-kh // sh), -(-kw // sw), cin], ctx.func_name("r"))

    def update(n, y, xx, o):
        ky, kx = (y + ph) % sh + r[0] * sh, (xx + pw) % sw + r[1] * sw
        iy, ix = (y + ph - ky) / sh, (xx + pw - kx) / sw  # exact: the numerators are multiples
        valid = (ky < kh) & (kx < kw) & (iy >= 0) & (ix >= 0) & (iy < h) & (ix < wd)
        term = arith.term(x(n, hl.clamp(iy, 0, h - 1), hl.clamp(ix, 0, wd - 1), r[2]),
                          weight(o, hl.min(ky, kh - 1), hl.min(kx, kw - 1), r[2]))
        return hl.select(valid, term, hl.cast(term.type(), 0))

    acc = accumulate(ctx, out, lambda n, y, xx, o: arith.init(o), update, AccumulatorKind.CONV, r)
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


@register("CONV_3D_TRANSPOSE", shape_inputs=(0,))
def lower_conv3d_transpose(ctx: OpContext) -> list[Value]:
    """TFLite's CONV_3D_TRANSPOSE (inputs: output shape, weights [kd, kh, kw, O, I], input, bias),
    in TRANSPOSE_CONV's gather form over three spatial axes: each output voxel sums the input voxels
    whose stride-spaced footprint covers it, ceil(k / s) taps per axis."""
    arith = float_arithmetic(ctx, 3)
    x = ctx.value(2)
    kd, kh, kw, cout, cin = ctx.op.inputs[1].shape
    if any(int(ctx.option(f"dilation{a}Factor", 1)) != 1 for a in "DHW"):
        raise LoweringError("CONV_3D_TRANSPOSE with dilation")
    out, kernel, sizes = ctx.out_shape(), (kd, kh, kw), x.shape[1:4]
    strides = tuple(int(ctx.option(f"stride{a}", 1)) for a in "DHW")
    # The padding of the forward conv whose input is this op's output.
    pads = _padding(ctx, out[1:4], sizes, strides, (1, 1, 1), kernel)
    # Packed, a register tile's rounded-up channels read the padding's zeros; as stored, they are clamped.
    weight = _tile_blocked(ctx, 1, "o_before_last_blocked",
                           lambda w, o, kz, ky, kx, i: w(kz, ky, kx, hl.min(o, cout - 1), i))
    r = ReductionDomain([-(-k // s) for k, s in zip(kernel, strides)] + [cin], ctx.func_name("r"))

    def update(n, *at):
        *pos, o = at
        taps = [(p + pad) % s + r[k] * s for k, (p, pad, s) in enumerate(zip(pos, pads, strides))]
        src = [(p + pad - t) / s for p, pad, t, s in zip(pos, pads, taps, strides)]  # exact: multiples
        valid = hl.Expr(True)
        for t, k, i, size in zip(taps, kernel, src, sizes):
            valid = valid & (t < k) & (i >= 0) & (i < size)
        term = arith.term(x(n, *(hl.clamp(i, 0, size - 1) for i, size in zip(src, sizes)), r[3]),
                          weight(o, *(hl.min(t, k - 1) for t, k in zip(taps, kernel)), r[3]))
        return hl.select(valid, term, hl.cast(term.type(), 0))

    acc = accumulate(ctx, out, lambda *i: arith.init(i[-1]), update, AccumulatorKind.CONV, r)
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


@register("FULLY_CONNECTED")
def lower_fully_connected(ctx: OpContext) -> list[Value]:
    """out[b,u] = act(bias[u] + sum_k in_flat[b, k] * w[u, k]); the input is read as [batch, in]."""
    return fully_connected(ctx, float_arithmetic(ctx, 2))


def fully_connected(ctx: OpContext, arith: Arithmetic) -> list[Value]:
    """FULLY_CONNECTED's loops under an arithmetic (float32 or int8)."""
    if int(ctx.option("weightsFormat", 0)) != 0:
        raise LoweringError("FULLY_CONNECTED with shuffled weights")
    x = arith.source(ctx.value(0))
    if arith.copy_source:
        ctx.materialize.append(x)
    units, depth = ctx.op.inputs[1].shape
    out = ctx.out_shape()
    # Dot-product weights blocked as the float ones are: a matrix-vector product (a decoder's every
    # FC) streams them in order, where "dot4" made each channel tile a strided gather.
    weight = packed_weights(ctx, 1, dot=arith.dot, blocked_dot=True)
    r = ReductionDomain([depth], ctx.func_name("r"))

    # The usual input has the output's leading shape and `depth` innermost: read it at the output's
    # own leading indices (consecutive along the reduction, so a schedule may load it in vectors).
    direct = tuple(x.shape[:-1]) == tuple(out[:-1]) and x.shape[-1] == depth

    def update(*i):
        if direct:
            return arith.term(x.at([*i[:-1], r[0]]), weight(i[-1], r[0]))
        row = flat_index(out[:-1], i[:-1]) if len(out) > 1 else hl.Expr(0)
        src = unflatten(x.shape, row * depth + r[0]) if x.rank != 2 or x.shape[1] != depth else [row, r[0]]
        return arith.term(x.at(src), weight(i[-1], r[0]))

    acc = accumulate(ctx, out, lambda *i: arith.init(i[-1]), update, AccumulatorKind.MATMUL, r,
                     source=x.func if direct else None, dot=arith.dot, source_stride=depth * x.type.bytes())
    return [ctx.define(ctx.func_name(), out, lambda *i: arith.finish(read(acc, i), i))]


@register("BATCH_MATMUL")
def lower_batch_matmul(ctx: OpContext) -> list[Value]:
    """out[..., m, n] = sum_k A[..., m, k] * B[..., k, n], with adj_x / adj_y and batch broadcasting."""
    kind = ctx.options.float_arithmetic  # float32, or half precision (LoweringOptions.half_arithmetic)
    return batch_matmul(ctx, ctx.value(0), ctx.value(1), lambda lhs, rhs: hl.cast(kind, lhs) * hl.cast(kind, rhs),
                        hl.cast(kind, 0), lambda acc, i: acc)


def batch_matmul(ctx: OpContext, a: Value, b: Value, term: Callable[[hl.Expr, hl.Expr], hl.Expr], init: hl.Expr,
                 finish: Callable[[hl.Expr, tuple], hl.Expr]) -> list[Value]:
    """BATCH_MATMUL's loops over operands `a` and `b` as the terms read them: the sum of
    term(a element, b element) from `init`, each output `finish`(sum, its index) (float32 here,
    int8 and int16 in quantized.py and quantized16.py, dynamic-range in hybrid.py)."""
    adj_x, adj_y = bool(ctx.option("adjX", False)), bool(ctx.option("adjY", False))
    out = ctx.out_shape()
    depth = a.shape[-2] if adj_x else a.shape[-1]
    r = ReductionDomain([depth], ctx.func_name("r"))

    def operand(v: Value, batch, row, col):
        lead = len(out) - 2 - (v.rank - 2)
        idx = [hl.Expr(0) if v.shape[k] == 1 else batch[lead + k] for k in range(v.rank - 2)]
        return v.at(idx + [row, col])

    def update(*i):
        batch, m, n = i[:-2], i[-2], i[-1]
        lhs = operand(a, batch, r[0], m) if adj_x else operand(a, batch, m, r[0])
        rhs = operand(b, batch, n, r[0]) if adj_y else operand(b, batch, r[0], n)
        return term(lhs, rhs)

    # A's rows at the output's own leading indices, consecutive along the reduction (as a fully
    # connected layer's input): a schedule may load 4 steps of a row in one vector.
    direct = not adj_x and tuple(a.shape[:-1]) == tuple(out[:-1])
    acc = accumulate(ctx, out, lambda *i: init, update, AccumulatorKind.MATMUL, r,
                     source=a.func if direct else None, source_stride=depth * a.type.bytes() if direct else 0)
    return [ctx.define(ctx.func_name(), out, lambda *i: finish(read(acc, i), i))]


# Windows of at most this many taps are unrolled into one expression per output (a U-Net's 2x2
# max pool, a 3x3 one): as an inline reduction each output vector had its own loop nest over the
# window.
UNROLLED_WINDOW = 16


@dataclass
class PoolWindow:
    """A pooling op's window of `size` (rows, columns): `tap(n, y, x, c, ky, kx)` gives (inside,
    value) for one tap, `count(y, x)` the taps inside the input (TFLite averages over those only);
    `padded` says whether any tap of any output falls outside the input."""

    r: hl.RDom
    size: tuple[int, int]
    tap: Callable[..., tuple[hl.Expr, hl.Expr]]
    count: Callable[[hl.Expr, hl.Expr], hl.Expr]
    padded: bool

    def taps(self, n, y, x, c) -> tuple[hl.Expr, hl.Expr]:
        """(inside, value) of the tap at the RDom `r`."""
        return self.tap(n, y, x, c, self.r[0], self.r[1])

    def unrolled_taps(self, n, y, x, c) -> list[tuple[hl.Expr | None, hl.Expr]] | None:
        """Every tap in TFLite's order (rows, then columns), `inside` None where no tap can fall
        outside the input; None when the window is larger than UNROLLED_WINDOW."""
        rows, cols = self.size
        if rows * cols > UNROLLED_WINDOW:
            return None
        taps = [self.tap(n, y, x, c, ky, kx) for ky in range(rows) for kx in range(cols)]
        return [(inside if self.padded else None, v) for inside, v in taps]


def pool_window(ctx: OpContext) -> PoolWindow:
    """The window of AVERAGE_POOL_2D / MAX_POOL_2D (float32 here, int8 in quantized.py)."""
    x = ctx.value(0)
    out = ctx.out_shape()
    fh, fw = int(ctx.option("filterHeight", 1)), int(ctx.option("filterWidth", 1))
    sh, sw = int(ctx.option("strideH", 1)), int(ctx.option("strideW", 1))
    ph, pw = _padding(ctx, x.shape[1:3], out[1:3], (sh, sw), (1, 1), (fh, fw))
    _, h, w, _ = x.shape
    r = ReductionDomain([fh, fw], ctx.func_name("r"))

    def tap(n, y, xx, c, ky, kx):
        iy, ix = y * sh - ph + ky, xx * sw - pw + kx
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        return inside, x(n, hl.clamp(iy, 0, h - 1), hl.clamp(ix, 0, w - 1), c)

    def count(y, xx):
        y0, x0 = y * sh - ph, xx * sw - pw
        return (hl.min(y0 + fh, h) - hl.max(y0, 0)) * (hl.min(x0 + fw, w) - hl.max(x0, 0))

    padded = ph > 0 or pw > 0 or (out[1] - 1) * sh - ph + fh > h or (out[2] - 1) * sw - pw + fw > w
    return PoolWindow(r, (fh, fw), tap, count, padded)


def _pool(ctx: OpContext, kind: str) -> list[Value]:
    window = pool_window(ctx)
    act, native = ctx.op.fused_activation, ctx.options.native_minmax

    def body(n, y, xx, c):
        unrolled = window.unrolled_taps(n, y, xx, c) if kind == "max" else None
        if unrolled is not None:
            running = hl.f32(-ieee.FLT_MAX)  # std::max from the lowest float, tap by tap
            for inside, v in unrolled:
                running = ieee.running_max(running, v, inside)
            return activation(running, act, native)
        inside, v = window.taps(n, y, xx, c)
        if kind == "max":
            # std::max from the lowest float: NaNs are skipped (halide_gen.lower.ieee).
            return activation(hl.maximum(hl.select(inside, ieee.skip_nan_for_max(v), hl.f32(-ieee.FLT_MAX))), act,
                              native)
        total = hl.sum(hl.select(inside, v, hl.f32(0)))
        return activation(total / hl.cast(hl.Float(32), window.count(y, xx)), act, native)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("AVERAGE_POOL_2D")
def lower_average_pool(ctx: OpContext) -> list[Value]:
    """Mean over the in-bounds part of each window."""
    return _pool(ctx, "average")


@register("MAX_POOL_2D")
def lower_max_pool(ctx: OpContext) -> list[Value]:
    """Max over the in-bounds part of each window."""
    return _pool(ctx, "max")
