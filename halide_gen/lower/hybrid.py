"""Dynamic-range ("hybrid") FULLY_CONNECTED, BATCH_MATMUL, CONV_2D and DEPTHWISE_CONV_2D: int8
constant weights beside a float activation, as TFLite's hybrid kernels compute them.

The activation is quantized when the kernel runs, per row (FULLY_CONNECTED: its innermost axis;
BATCH_MATMUL: each row of its left operand) or per image (the convolutions: a batch element):

- symmetric (FULLY_CONNECTED and BATCH_MATMUL by default; a convolution with one weight scale): in
  steps of max|row| / 127, each element rounded half away from zero and clamped to [-127, 127]
  (tensor_utils::SymmetricQuantizeFloats);
- asymmetric (their `asymmetric_quantize_inputs`, which converters set; a convolution with a scale
  per channel): in steps of (max(row, 0) - min(row, 0)) / 255 about a zero point nudged onto
  [-128, 127], formed in double as TFLite forms them (AsymmetricQuantizeFloats), which keeps them
  off the GPU targets.

The int8 products are summed in int32 — FULLY_CONNECTED and CONV_2D with the int8 path's
dot-product loops (VNNI on x86, SDOT on ARM) and DEPTHWISE_CONV_2D with its paired int16 taps, the
zero point's share (zero point x the weights' sum) taken off after, a convolution's padding read
as its image's zero point; BATCH_MATMUL, and convolutions neither form fits, centred on the zero
point in int16 (a convolution's padding then adds nothing) — and each sum is rescaled to float as
bias + sum * (row step * weight scale), then activated. The quantization is TFLite's to the bit; how
far two implementations that round it differently may drift is the dynamic-range rule of `run
--compare` (tflite_tools/model/hybrid.py).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import halide as hl
import numpy as np

from ..pack import DOT_DEPTH, WEIGHT_BLOCKS, block_sums_packer
from ..values import Value, dim_vars, flat_index, unflatten
from .elementwise import activation, round_half_away
from .nn import (Arithmetic, batch_matmul, channel_bias, channel_tiles, conv2d, conv2d_sums_in_dots, depthwise,
                 fully_connected, packed_weights)
from .fixed_point import INT8_MAX, INT8_MIN, int8_weight_scales
from .quantized import paired_taps_hold
from .reduce import row_reduce
from .registry import (AccumulatorKind, LoweringError, OpContext, ReductionDomain, RowStatistics, accumulate, read,
                       register)

Row = Callable[[list[hl.Expr]], hl.Expr]  # a per-row quantity as a function of the row's index
Element = Callable[[list[hl.Expr], hl.Expr], hl.Expr]  # (row, k) -> the row's k-th value


class RowQuantization(NamedTuple):
    """How each row of an input is quantized: its step, the step's inverse, its zero point."""

    step: Row
    inverse: Row
    zero_point: Row
    lowest: int  # the smallest quantized value: -127 symmetric, -128 asymmetric


def _per_row(ctx: OpContext, name: str, rows: tuple[int, ...], body: Row) -> Value:
    """A per-row quantity computed once per row into a buffer (not once per element reading it)."""
    value = ctx.define(ctx.func_name(name), tuple(rows) + (1,), lambda *i: body(list(i[:-1])))
    ctx.materialize.append(value)
    return value


def _at_row(value: Value) -> Row:
    return lambda row: value.at(list(row) + [hl.Expr(0)])


Transform = Callable[[hl.Expr], hl.Expr]
# (name, transform, reducer) -> each row's reducer over transform(its elements): how an input's
# rows are reduced, by its layout (_rows_of, _images_of).
RowReducer = Callable[[str, Transform, object], Row]


def _rows_of(ctx: OpContext, rows: tuple[int, ...], depth: int, element: Element) -> RowReducer:
    """Rows of `depth` elements along an innermost axis (element(row, k)), each reduced along it."""
    def reduce(name: str, transform: Transform, reducer) -> Row:
        total = row_reduce(ctx, name, rows, depth, lambda row, k: transform(element(row, k)), reducer)
        ctx.materialize.append(total)
        return _at_row(total)
    return reduce


def _images_of(ctx: OpContext, x: Value) -> RowReducer:
    """Each image (batch element) of an NHWC `x`, reduced along the pixels of each of its rows first,
    a vector of channels a step (the rows split among threads), then along its rows, then its
    channels: read at a flat index into the image, every vector of it was a gather of elements
    whose positions took a division each (EfficientNet's 1x1 convolutions: 2.5-3x XNNPACK's time)."""
    n, height, width, channels = x.shape

    def reduce(name: str, transform: Transform, reducer) -> Row:
        along_w = ReductionDomain([width], ctx.func_name(name + "_rw"))
        along_h = ReductionDomain([height], ctx.func_name(name + "_rh"))
        rows = ctx.define(ctx.func_name(name + "_rows"), (n, height, channels),
                          lambda b, y, c: reducer(transform(x.at([b, y, along_w[0], c]))), exact=True)
        image = ctx.define(ctx.func_name(name + "_channels"), (n, channels),
                           lambda b, c: reducer(rows.at([b, along_h[0], c])), exact=True)
        ctx.materialize += [rows, image]
        return _rows_of(ctx, (n,), channels, lambda b, c: image.at(b + [c]))(name, lambda v: v, reducer)
    return reduce


def _statistics(ctx: OpContext, first: int, results: list[Value], depth: int) -> list[Row]:
    """Records the per-row `results` and the helpers materialised for them since `first` as one
    RowStatistics (those of one row's worth, rows + (k,), inner; larger ones, as an image's
    per-row partial results, roots); returns a reader of each result."""
    ids = {id(v.func) for v in results}
    rank = len(results[0].shape)
    helpers = [v for v in ctx.materialize[first:] if id(v.func) not in ids]
    ctx.row_statistics.append(RowStatistics(results, [v for v in helpers if len(v.shape) <= rank],
                                            [v for v in helpers if len(v.shape) > rank], depth))
    return [_at_row(v) for v in results]


def symmetric(ctx: OpContext, rows: tuple[int, ...], depth: int, reduce: RowReducer) -> RowQuantization:
    """Steps of max|row| / 127 and no zero point, as SymmetricQuantizeFloats (a row of zeros: step 1)."""
    first = len(ctx.materialize)
    peak = reduce("absmax", hl.abs, hl.maximum)
    step = _per_row(ctx, "step", rows, lambda row: hl.select(peak(row) == 0, hl.f32(1), peak(row) / hl.f32(INT8_MAX)))
    inverse = _per_row(ctx, "inverse", rows,
                       lambda row: hl.select(peak(row) == 0, hl.f32(0), hl.f32(INT8_MAX) / peak(row)))
    step_at, inverse_at = _statistics(ctx, first, [step, inverse], depth)
    return RowQuantization(step_at, inverse_at, lambda row: hl.i32(0), -INT8_MAX)


def asymmetric(ctx: OpContext, rows: tuple[int, ...], depth: int, reduce: RowReducer) -> RowQuantization:
    """Steps of (max(row, 0) - min(row, 0)) / 255 about a nudged zero point, formed in double as
    AsymmetricQuantizeFloats forms them (a row of zeros: step 1, zero point 0)."""
    if ctx.options.device_code:
        raise LoweringError(f"dynamic-range {ctx.op.name} with asymmetric input quantization: its steps are formed "
                            "in double, which GPU targets lack")
    first = len(ctx.materialize)
    low = reduce("min", lambda v: v, hl.minimum)
    high = reduce("max", lambda v: v, hl.maximum)
    qmin, qmax = hl.f64(INT8_MIN), hl.f64(INT8_MAX)

    def rmin(row):
        return hl.cast(hl.Float(64), hl.min(hl.f32(0), low(row)))

    def rmax(row):
        return hl.cast(hl.Float(64), hl.max(hl.f32(0), high(row)))

    def scale(row):
        return (rmax(row) - rmin(row)) / (qmax - qmin)

    def step(row):
        return hl.select(rmin(row) == rmax(row), hl.f32(1), hl.cast(hl.Float(32), scale(row)))

    def zero_point(row):
        below, above = rmin(row) / scale(row), rmax(row) / scale(row)
        # The zero point from whichever end loses less to rounding, nudged onto the int8 range.
        chosen = hl.select(hl.abs(qmin) + hl.abs(below) < hl.abs(qmax) + hl.abs(above), qmin - below, qmax - above)
        nudged = hl.select(chosen <= qmin, qmin, chosen >= qmax, qmax, round_half_away(chosen))
        return hl.select(rmin(row) == rmax(row), hl.i32(0), hl.cast(hl.Int(32), nudged))

    # Each result from the row's extremes, none from another: one loop computes them side by side.
    results = [_per_row(ctx, "step", rows, step), _per_row(ctx, "inverse", rows, lambda row: hl.f32(1) / step(row)),
               _per_row(ctx, "zero_point", rows, zero_point)]
    return RowQuantization(*_statistics(ctx, first, results, depth), INT8_MIN)


# The float just below one half: x + copysign(BELOW_HALF, x), truncated, is x rounded half away
# from zero for every |x| < 2^22 (a half lifts the sum to the next integer, anything less stays
# below it, 0.49999997 too, where adding 0.5 rounds up to 1). NaN stays NaN.
BELOW_HALF = float(np.nextafter(np.float32(0.5), np.float32(0)))


def quantized(quantization: RowQuantization, value: hl.Expr, row: list[hl.Expr]) -> hl.Expr:
    """One element as TFLite quantizes it in its row: round(zero point + value / step), rounded half
    away from zero (TfLiteRound), clamped to the int8 range; int32. The scaled value lies within
    the int8 range but for rounding, so it rounds as one add and a truncation (BELOW_HALF): this
    is most of a quantizing pass, which round_half_away's selects made half again as long."""
    q = quantization
    scaled = hl.cast(hl.Float(32), q.zero_point(row)) + value * q.inverse(row)
    sign = hl.reinterpret(hl.UInt(32), scaled) & hl.u32(0x80000000)
    below_half = hl.reinterpret(hl.Float(32), sign | hl.u32(int(np.float32(BELOW_HALF).view(np.uint32))))
    return hl.clamp(hl.cast(hl.Int(32), scaled + below_half), q.lowest, INT8_MAX)


def _weights_scale(ctx: OpContext, i: int) -> Callable[[hl.Expr], hl.Expr]:
    """The int8 constant weights' scale per output channel; LoweringError for weights a hybrid
    kernel cannot take."""
    t = ctx.op.inputs[i]
    if not t.is_constant:
        raise LoweringError(f"dynamic-range {ctx.op.name} with weights computed at run time")
    _check_float_bias(ctx)
    return ctx.table(int8_weight_scales(ctx, t), "w_scale", hl.Float(32))


def _check_float_bias(ctx: OpContext) -> None:
    """LoweringError for a dynamic-range op whose bias (input 2) is not float32."""
    bias = ctx.op.inputs[2] if len(ctx.op.inputs) > 2 else None
    if bias is not None and bias.type_name != "FLOAT32":
        raise LoweringError(f"dynamic-range {ctx.op.name} with a {bias.type_name} bias")


def _input_row(rows: tuple[int, ...], out_rows: tuple[int, ...], i) -> list[hl.Expr]:
    """The input row a FULLY_CONNECTED output row (its leading index `i`) reads: the same index, or
    the flattened one where keep_num_dims=False merged the input's leading axes."""
    return list(i) if tuple(out_rows) == tuple(rows) else unflatten(rows, flat_index(out_rows, i))


def _stored_quantized(ctx: OpContext, q: RowQuantization, x: Value, unsigned: bool,
                      row_of: Callable[[tuple], list[hl.Expr]] = lambda i: list(i[:-1])) -> tuple[Value, int]:
    """`x` quantized as the dot-product loops read it (each element in its row, `row_of` its index:
    by default the leading axes), and the shift stored with it: int8, or on x86 (`unsigned`) q + 128
    as uint8, since VNNI multiplies unsigned activations."""
    shift = 128 if unsigned else 0
    read_as = hl.UInt(8) if unsigned else hl.Int(8)
    return ctx.define(ctx.func_name("quantized"), x.shape,
                      lambda *i: hl.cast(read_as, quantized(q, x(*i), row_of(i)) + shift)), shift


def _rescaled(ctx: OpContext, step: Row, w_scale, row_of: Callable[[tuple], list[hl.Expr]],
              correction: Callable[[list[hl.Expr], hl.Expr], hl.Expr] | None = None):
    """`finish` of a hybrid sum: bias + (sum - correction) * (row step * weight scale), activated."""
    bias, act = channel_bias(ctx, 2), ctx.op.fused_activation

    def finish(acc: hl.Expr, i) -> hl.Expr:
        row, oc = row_of(i), i[-1]
        total = acc - correction(row, oc) if correction is not None else acc
        return activation(bias(oc) + hl.cast(hl.Float(32), total) * (step(row) * w_scale(oc)), act,
                          ctx.options.native_minmax)

    return finish


@register("FULLY_CONNECTED", hybrid=True)
def lower_fully_connected_hybrid(ctx: OpContext) -> list[Value]:
    """FULLY_CONNECTED of a float input and int8 constant weights (per tensor or per channel), as
    TFLite's hybrid kernel: each input row quantized (asymmetric_quantize_inputs says how), the
    sums in the int8 path's dot-product loops, the zero point's share (zero point x the weights'
    row sum) taken off. Weights quantized per block: `_fully_connected_blockwise`."""
    q = ctx.op.inputs[1].quantization
    if q is not None and q.blockwise is not None:
        return _fully_connected_blockwise(ctx)
    w_scale = _weights_scale(ctx, 1)
    units, depth = ctx.op.inputs[1].shape
    x = ctx.value(0)
    if x.shape[-1] != depth:
        raise LoweringError("dynamic-range FULLY_CONNECTED whose input rows are not its innermost axis")
    form = asymmetric if bool(ctx.option("asymmetricQuantizeInputs", False)) else symmetric
    rows = x.shape[:-1]
    q = form(ctx, rows, depth, _rows_of(ctx, rows, depth, lambda row, k: x.at(row + [k])))
    dot = depth % DOT_DEPTH == 0
    source, shift = _stored_quantized(ctx, q, x, dot and ctx.options.x86_integer)
    sums = ctx.packed(1, "channel_sums")
    out = ctx.out_shape()

    def row_of(i) -> list[hl.Expr]:
        return _input_row(rows, out[:-1], i[:-1])

    finish = _rescaled(ctx, q.step, w_scale, row_of,
                       (lambda row, oc: q.zero_point(row) * sums(oc)) if form is asymmetric else None)
    if dot:
        arith = Arithmetic(source=lambda _: source, term=lambda v, w: hl.cast(hl.Int(32), hl.widening_mul(v, w)),
                           init=lambda oc: -hl.i32(shift) * sums(oc), finish=finish, dot=DOT_DEPTH, fill=shift,
                           copy_source=True)
    else:
        arith = Arithmetic(source=lambda _: source,
                           term=lambda v, w: hl.widening_mul(hl.cast(hl.Int(16), v), hl.cast(hl.Int(16), w)),
                           init=lambda oc: hl.i32(0), finish=finish, copy_source=True)
    return fully_connected(ctx, arith)


def _fully_connected_blockwise(ctx: OpContext) -> list[Value]:
    """FULLY_CONNECTED of a float input and int4 weights with a half-precision scale per output
    channel and block of input channels (ai-edge-quantizer's blockwise recipe), as LiteRT computes
    it: each input row quantized asymmetrically (whatever asymmetric_quantize_inputs says), each
    block's products summed in int32 (the int8 path's dot products, the zero point's share, zero
    point x the block's weight sum, taken off), scaled by the block's scale in float, the blocks
    summed, times the row's step, plus the bias, then the activation. (LiteRT 2.3's optimized
    kernel skips that activation; XNNPACK and the op's definition apply it.)"""
    weights = ctx.op.inputs[1]
    blockwise = weights.quantization.blockwise
    units, depth = weights.shape
    size, scales = blockwise.block_size, blockwise.scales
    if not weights.is_constant or weights.type_name != "INT4":  # the one type LiteRT's kernels take per block
        raise LoweringError("FULLY_CONNECTED quantized per block with weights other than int4 constants")
    if blockwise.zero_points is not None or blockwise.block_shape:
        raise LoweringError("FULLY_CONNECTED weights quantized per block with zero points or a block shape")
    blocks = depth // size if depth % size == 0 else 0
    if (size not in WEIGHT_BLOCKS or not blocks or tuple(scales.shape) != (units, blocks)
            or scales.type_name != "FLOAT16"):
        raise LoweringError(f"FULLY_CONNECTED weights [{units}, {depth}] in blocks of {size} with scales "
                            f"{scales.type_name}{list(scales.shape)}")
    _check_float_bias(ctx)
    x = ctx.value(0)
    if x.shape[-1] != depth:
        raise LoweringError("dynamic-range FULLY_CONNECTED whose input rows are not its innermost axis")
    rows, out = x.shape[:-1], ctx.out_shape()
    q = asymmetric(ctx, rows, depth, _rows_of(ctx, rows, depth, lambda row, k: x.at(row + [k])))

    def row_of(i) -> list[hl.Expr]:  # the input row of an output row's leading index
        return _input_row(rows, out[:-1], i)

    source, shift = _stored_quantized(ctx, q, x, ctx.options.x86_integer)
    ctx.materialize.append(source)
    weight = packed_weights(ctx, 1, dot=DOT_DEPTH, blocked_dot=True)
    block_sums = channel_tiles(ctx.packed(1, block_sums_packer(size)))
    scale = channel_tiles(ctx.value_of(scales, "o_blocked_widened"))  # [units, blocks] in float32
    step = ReductionDomain([size], ctx.func_name("r"))
    over_blocks = ReductionDomain([blocks], ctx.func_name("rb"))

    # inner(oc, row..., b): block b's products, summed as stored (x86: q + 128).
    inner = hl.Func(ctx.func_name("block"))
    *row, oc = dim_vars(len(out))
    block = hl.Var("b")
    at = [oc, *reversed(row), block]  # Halide order: the output's dimensions, then the block
    inner[at] = hl.i32(0)
    k = block * size + step[0]
    inner[at] = inner[at] + hl.cast(hl.Int(32), hl.widening_mul(source.at(row_of(row) + [k]), weight(oc, k)))

    def update(*i):
        r, b = row_of(i[:-1]), over_blocks[0]
        exact = inner[[i[-1], *reversed(i[:-1]), b]] - (q.zero_point(r) + shift) * block_sums(i[-1], b)
        return hl.cast(hl.Float(32), exact) * scale(i[-1], b)

    acc = accumulate(ctx, out, lambda *i: hl.f32(0), update, AccumulatorKind.BLOCKWISE, over_blocks,
                     dot=DOT_DEPTH, inner=inner, inner_rdom=step)
    bias_of, act = channel_bias(ctx, 2), ctx.op.fused_activation
    return [ctx.define(ctx.func_name(), out, lambda *i: activation(
        bias_of(i[-1]) + q.step(row_of(i[:-1])) * read(acc, i), act, ctx.options.native_minmax))]


def _image_quantization(ctx: OpContext, per_channel_form: bool) -> tuple[Value, RowQuantization]:
    """A hybrid convolution's input quantized per image (a batch element), as TFLite's
    EvalHybridPerChannel (asymmetric) or EvalHybrid (per-tensor weights: symmetric) quantizes it."""
    x = ctx.value(0)
    image = tuple(x.shape[1:])
    form = asymmetric if per_channel_form else symmetric
    return x, form(ctx, x.shape[:1], int(np.prod(image)), _images_of(ctx, x))


def _image_arithmetic(ctx: OpContext, per_channel_form: bool) -> Arithmetic:
    """A hybrid convolution's arithmetic without dot products: each quantized value centred on its
    image's zero point in int16 (padding adds nothing), rescaled per image and channel."""
    w_scale = _weights_scale(ctx, 1)
    x, q = _image_quantization(ctx, per_channel_form)
    centred = ctx.define(ctx.func_name("centred"), x.shape,
                         lambda *i: hl.cast(hl.Int(16), quantized(q, x(*i), [i[0]]) - q.zero_point([i[0]])))
    return Arithmetic(source=lambda _: centred,
                      term=lambda v, w: hl.widening_mul(v, hl.cast(hl.Int(16), w)),
                      init=lambda oc: hl.i32(0), finish=_rescaled(ctx, q.step, w_scale, lambda i: [i[0]]),
                      copy_source=True)


def _image_rescaled(ctx: OpContext, w_scale, q: RowQuantization, sums):
    """`finish` of a hybrid convolution that sums its quantized values as stored (its padding their
    image's zero point): the zero point's share, zero point x the channel's weight sum, taken off."""
    return _rescaled(ctx, q.step, w_scale, lambda i: [i[0]], lambda row, oc: q.zero_point(row) * sums(oc))


def _image_dot_arithmetic(ctx: OpContext, per_channel_form: bool) -> Arithmetic:
    """A hybrid CONV_2D's arithmetic in the int8 path's dot products (VNNI, SDOT): the quantized
    values as stored (x86: plus 128, as uint8), each image's zero point outside the map, so that
    sum((q - zero point) * w) = sum(q * w) - zero point x the channel's weight sum, taken off in
    the rescale."""
    w_scale = _weights_scale(ctx, 1)
    x, q = _image_quantization(ctx, per_channel_form)
    source, shift = _stored_quantized(ctx, q, x, ctx.options.x86_integer, lambda i: [i[0]])
    sums = ctx.packed(1, "channel_sums")
    return Arithmetic(source=lambda _: source, term=lambda v, w: hl.cast(hl.Int(32), hl.widening_mul(v, w)),
                      init=lambda oc: -hl.i32(shift) * sums(oc), finish=_image_rescaled(ctx, w_scale, q, sums),
                      dot=DOT_DEPTH, fill=lambda n: q.zero_point([n]) + shift, copy_source=True)


def _image_paired_arithmetic(ctx: OpContext) -> Arithmetic:
    """A hybrid DEPTHWISE_CONV_2D's arithmetic as the int8 path's: the quantized values as stored,
    two taps' int8 products added in int16 before widening (exact: no weight is -128), each image's
    zero point outside the map and its share (zero point x the channel's tap sum) taken off in the
    rescale."""
    w_scale = _weights_scale(ctx, 1)
    x, q = _image_quantization(ctx, True)
    source = ctx.define(ctx.func_name("quantized"), x.shape,
                        lambda *i: hl.cast(hl.Int(8), quantized(q, x(*i), [i[0]])))
    sums = ctx.packed(1, "tap_sums")
    return Arithmetic(source=lambda _: source, term=hl.widening_mul, init=lambda oc: hl.i32(0),
                      finish=_image_rescaled(ctx, w_scale, q, sums), fill=lambda n: q.zero_point([n]),
                      paired_taps=True)


def _per_channel(ctx: OpContext) -> bool:
    q = ctx.op.inputs[1].quantization
    return q is not None and q.scale is not None and len(q.scale) > 1


@register("CONV_2D", hybrid=True)
def lower_conv2d_hybrid(ctx: OpContext) -> list[Value]:
    """CONV_2D of a float input and int8 constant weights: the module docstring."""
    if conv2d_sums_in_dots(ctx):
        return conv2d(ctx, _image_dot_arithmetic(ctx, _per_channel(ctx)))
    return conv2d(ctx, _image_arithmetic(ctx, _per_channel(ctx)))


@register("DEPTHWISE_CONV_2D", hybrid=True, compile_time=(1,))
def lower_depthwise_hybrid(ctx: OpContext) -> list[Value]:
    """DEPTHWISE_CONV_2D of a float input and int8 constant weights: the module docstring."""
    if not _per_channel(ctx):
        raise LoweringError("dynamic-range DEPTHWISE_CONV_2D with one weight scale (TFLite takes one per channel)")
    if ctx.options.wide_integers and paired_taps_hold(ctx, 1):
        return depthwise(ctx, _image_paired_arithmetic(ctx))
    return depthwise(ctx, _image_arithmetic(ctx, True))


@register("BATCH_MATMUL", hybrid=True)
def lower_batch_matmul_hybrid(ctx: OpContext) -> list[Value]:
    """BATCH_MATMUL of a float left operand and int8 constant right one (one scale, or one per output
    column), as TFLite's EvalHybrid: each row of the left operand (after adj_x) quantized as
    `asymmetric_quantize_inputs` says, the products summed centred on its zero point, each sum
    rescaled by row step x column scale. No bias, no activation."""
    lhs, rhs = ctx.op.inputs[0], ctx.op.inputs[1]
    if lhs.type_name != "FLOAT32" or rhs.type_name != "INT8":
        raise LoweringError("dynamic-range BATCH_MATMUL other than a float left operand by int8 weights")
    adj_x, adj_y = bool(ctx.option("adjX", False)), bool(ctx.option("adjY", False))
    q = rhs.quantization
    if q is not None and q.per_channel and q.quantized_dimension != len(rhs.shape) - (2 if adj_y else 1):
        raise LoweringError("dynamic-range BATCH_MATMUL with a weight scale per row rather than per output column")
    if sum(d > 1 for d in lhs.shape[:-2]) > 1:
        # TFLite's reference kernel offsets each row's scaling factor by (batch index x rows) per
        # batch axis, which for two varying axes reads other rows' factors: no kernel can agree.
        raise LoweringError("dynamic-range BATCH_MATMUL whose left operand varies along two batch axes")
    w_scale = _weights_scale(ctx, 1)
    a = ctx.value(0)
    depth, rows = (a.shape[-2], a.shape[:-2] + (a.shape[-1],)) if adj_x else (a.shape[-1], a.shape[:-1])

    def element(row: list[hl.Expr], k: hl.Expr) -> hl.Expr:
        return a.at(row[:-1] + ([k, row[-1]] if adj_x else [row[-1], k]))

    form = asymmetric if bool(ctx.option("asymmetricQuantizeInputs", False)) else symmetric
    quantization = form(ctx, rows, depth, _rows_of(ctx, rows, depth, element))

    def row_of_a(i) -> list[hl.Expr]:  # the row a left-operand element belongs to
        return list(i[:-2]) + [i[-1] if adj_x else i[-2]]

    centred = ctx.define(ctx.func_name("centred"), a.shape, lambda *i: hl.cast(
        hl.Int(16), quantized(quantization, a(*i), row_of_a(i)) - quantization.zero_point(row_of_a(i))))
    ctx.materialize.append(centred)
    out = ctx.out_shape()

    def finish(acc: hl.Expr, i) -> hl.Expr:
        lead = len(out) - a.rank
        batch = [hl.Expr(0) if a.shape[k] == 1 else i[lead + k] for k in range(a.rank - 2)]
        return hl.cast(hl.Float(32), acc) * (quantization.step(batch + [i[-2]]) * w_scale(i[-1]))

    return batch_matmul(ctx, centred, ctx.value(1), lambda v, w: hl.widening_mul(v, hl.cast(hl.Int(16), w)),
                        hl.i32(0), finish)
