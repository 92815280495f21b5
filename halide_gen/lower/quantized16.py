"""16x8 lowerings: int16 activations with int8 weights, as TFLite's int16 kernels compute them.

The converter emits these for `EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8` (audio,
super-resolution: where int8 activations lose too much). Activations are symmetric (zero point 0,
which TFLite requires), weights int8 per channel, biases int64. A convolution or matrix product sums
int16 x int8 products in 64 bits from the int64 bias and rescales with TFLite's 64-bit
MultiplyByQuantizedMultiplier: the Q31 multiplier reduced to 16 bits (rounded), one product, one
rounding shift (`multiply_rounded_once`; FULLY_CONNECTED's reference keeps the whole multiplier).
An int32 bias is refused (LiteRT's 16x8 kernels saturate every output with one). TRANSPOSE_CONV sums
as a convolution does; BATCH_MATMUL of two int16 activations sums in 64 bits with the reduced
multiplier too. ADD and SUB take the general-scale path (left shift 15, pot_scale_int16 false, as the
converter writes them); MUL rescales the int32 product once. MAX_POOL_2D and data movement keep the
bytes; AVERAGE_POOL_2D, MEAN and RESIZE_BILINEAR compute as the int8 ones do (RESIZE_BILINEAR's
weighted sums in int64, as ResizeBilinearInteger takes them); QUANTIZE between int16 and int8 or
int16 scales is TFLite's Requantize (quantized.lower_requantize, registered for both). Functions of
one input (LOGISTIC, TANH, GELU, ...) read a 65536-entry table LiteRT fills (litert_tables). SOFTMAX
is TFLite's SoftmaxInt16 in its integers: two 513-entry interpolated tables (exp on [-10, 0],
1 / (1 + x) on [0, 1]) filled as its Prepare fills them, a Q31 rescale of each difference from the
row's largest value, a sum of Q0.15 exponentials normalised by its leading zeros. All exact: bit for bit LiteRT's reference kernels
(tests/test_lowering_int8.py). Other int16 ops stay with TFLite.
"""

from __future__ import annotations

import math

import halide as hl
import numpy as np

from ..values import Value, read_broadcast
from .nn import (Arithmetic, batch_matmul, channel_bias, conv2d, depthwise, fully_connected, transpose_conv,
                 transpose_conv_geometry)
from .fixed_point import (activation_range, int8_weight_scales, multiply_by_quantized_multiplier, quantize_multiplier,
                          requantization_multipliers, scale_zp, tflite_round)
from .quantized import quantized_average_pool, quantized_max_pool, quantized_mean, quantized_resize_bilinear
from .reduce import row_reduce
from .registry import LoweringError, OpContext, register
from .tables import constant_buffer, unary_by_litert_table

INT16_MIN, INT16_MAX = -32768, 32767
INT16_ADD_LEFT_SHIFT = 15  # add.cc's headroom shift for int16 with general scales


def reduced_multiplier(m: int) -> int:
    """TFLite's 16-bit rounding of a Q31 multiplier for 64-bit sums (common.cc)."""
    return (m + (1 << 15)) >> 16 if m < 0x7FFF0000 else 0x7FFF


def multiply_rounded_once(acc: hl.Expr, m: hl.Expr, total_shift: hl.Expr) -> hl.Expr:
    """(acc * m + 2^(total - 1)) >> total in 64 bits, as int32: TFLite's MultiplyByQuantizedMultiplier
    for an int64 sum, with m the reduced multiplier and total 15 - shift (common.cc), or with the
    whole Q31 multiplier and total 31 - shift."""
    rounding = hl.cast(hl.Int(64), 1) << (total_shift - 1)
    return hl.cast(hl.Int(32), (acc * hl.cast(hl.Int(64), m) + rounding) >> total_shift)


def to_int16(v: hl.Expr, lo: int = INT16_MIN, hi: int = INT16_MAX) -> hl.Expr:
    """A rescaled int32 as the int16 output, clamped to [lo, hi] (the fused activation's range)."""
    return hl.cast(hl.Int(16), hl.clamp(v, lo, hi))


def _symmetric(ctx: OpContext, index: int) -> float:
    """The scale of an int16 activation, which TFLite requires to be symmetric."""
    scale, zp = scale_zp(ctx.op.inputs[index] if index >= 0 else ctx.op.outputs[0])
    if zp != 0:
        raise LoweringError(f"{ctx.op.name}: an int16 tensor with zero point {zp}")
    return scale


def _arithmetic_16x8(ctx: OpContext, per_tensor_float_product: bool, reduced: bool,
                     operands: tuple[int, int, int] = (0, 1, 2)) -> Arithmetic:
    """int16 x int8 terms summed in 64 bits from the int64 bias, rescaled per output channel —
    with the 16-bit reduced multiplier where `reduced` (convolutions), else with the whole Q31
    multiplier and one rounding (FULLY_CONNECTED, as LiteRT's reference computes it: the reduced
    form differed on 14 of 480 outputs) — and clamped to the fused activation's int16 range."""
    data, weights, bias_index = operands
    in_scale, out_scale = _symmetric(ctx, data), _symmetric(ctx, -1)
    w_scales = int8_weight_scales(ctx, ctx.op.inputs[weights])
    if ctx.has_input(bias_index) and ctx.op.inputs[bias_index].type_name != "INT64":
        # The converter writes int64; LiteRT 2.3's 16x8 kernels saturate every output with int32.
        raise LoweringError(f"{ctx.op.name}: 16x8 with a {ctx.op.inputs[bias_index].type_name} bias")
    lo, hi = activation_range(ctx.op.fused_activation, out_scale, 0, INT16_MIN, INT16_MAX)
    mults, shifts = requantization_multipliers(in_scale, w_scales, out_scale, per_tensor_float_product)
    if reduced:
        m = ctx.table([reduced_multiplier(m) for m in mults], "reduced")
        total = ctx.table([15 - s for s in shifts], "total", hl.Int(64))
    else:
        m = ctx.table(mults, "mult")
        total = ctx.table([31 - s for s in shifts], "total", hl.Int(64))

    def finish(acc: hl.Expr, i) -> hl.Expr:
        return to_int16(multiply_rounded_once(acc, m(i[-1]), total(i[-1])), lo, hi)

    return Arithmetic(
        source=lambda x: x,
        # int16 x int16 -> int32 (one widening multiply), then into the 64-bit sum.
        term=lambda v, w: hl.cast(hl.Int(64), hl.widening_mul(v, hl.cast(hl.Int(16), w))),
        init=channel_bias(ctx, bias_index, zero=hl.i64(0)),
        finish=finish,
    )


@register("CONV_2D", int16=True)
def lower_conv2d_16x8(ctx: OpContext) -> list[Value]:
    """CONV_2D on int16 activations (TFLite's 16x8 ConvPerChannel)."""
    return conv2d(ctx, _arithmetic_16x8(ctx, per_tensor_float_product=False, reduced=True))


@register("DEPTHWISE_CONV_2D", int16=True)
def lower_depthwise_16x8(ctx: OpContext) -> list[Value]:
    """DEPTHWISE_CONV_2D on int16 activations (TFLite's 16x8 DepthwiseConvPerChannel)."""
    return depthwise(ctx, _arithmetic_16x8(ctx, per_tensor_float_product=False, reduced=True))


@register("TRANSPOSE_CONV", int16=True, shape_inputs=(0,))
def lower_transpose_conv_16x8(ctx: OpContext) -> list[Value]:
    """TRANSPOSE_CONV on int16 activations (TFLite's 16x8 TransposeConv: int64 sums, the reduced
    multiplier per output channel)."""
    return transpose_conv(ctx, 2, 1, transpose_conv_geometry(ctx),
                          _arithmetic_16x8(ctx, per_tensor_float_product=False, reduced=True, operands=(2, 1, 3)))


@register("FULLY_CONNECTED", int16=True)
def lower_fully_connected_16x8(ctx: OpContext) -> list[Value]:
    """FULLY_CONNECTED on int16 activations (TFLite's 16x8 FullyConnected, per tensor or channel)."""
    return fully_connected(ctx, _arithmetic_16x8(ctx, per_tensor_float_product=True, reduced=False))


@register("ADD", "SUB", int16=True)
def lower_add_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's int16 ADD and SUB with general scales: both inputs shifted left by 15, rescaled to
    twice the larger input scale, added or subtracted, rescaled to the output (add.cc's general
    int16 path; the power-of-two path of old models is refused)."""
    if bool(getattr(ctx.op.options, "potScaleInt16", True)) and ctx.op.name == "ADD":
        raise LoweringError("int16 ADD with pot_scale_int16 (the power-of-two scale path)")
    s1, s2, s_out = _symmetric(ctx, 0), _symmetric(ctx, 1), _symmetric(ctx, -1)
    twice_max = 2 * max(s1, s2)
    m1, sh1 = quantize_multiplier(s1 / twice_max)
    m2, sh2 = quantize_multiplier(s2 / twice_max)
    m_out, sh_out = quantize_multiplier(twice_max / ((1 << INT16_ADD_LEFT_SHIFT) * s_out))
    lo, hi = activation_range(ctx.op.fused_activation, s_out, 0, INT16_MIN, INT16_MAX)
    a, b = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()
    sign = -1 if ctx.op.name == "SUB" else 1

    def scaled(v: hl.Expr, m: int, sh: int) -> hl.Expr:
        return multiply_by_quantized_multiplier(hl.cast(hl.Int(32), v) << INT16_ADD_LEFT_SHIFT, m, sh, ctx.options)

    def body(*i):
        first, second = scaled(read_broadcast(a, out, i), m1, sh1), scaled(read_broadcast(b, out, i), m2, sh2)
        total = multiply_by_quantized_multiplier(first + second if sign > 0 else first - second, m_out, sh_out,
                                                 ctx.options)
        return to_int16(total, lo, hi)

    return [ctx.define(ctx.func_name(), out, body)]


def _pool_range(ctx: OpContext) -> tuple[int, int]:
    """A pool's clamp: the fused activation's int16 range at the scale its input and output share
    (TFLite requires them equal)."""
    scale = _symmetric(ctx, 0)
    if _symmetric(ctx, -1) != scale:
        raise LoweringError(f"{ctx.op.name}: int16 input and output quantized differently")
    return activation_range(ctx.op.fused_activation, scale, 0, INT16_MIN, INT16_MAX)


@register("MAX_POOL_2D", int16=True)
def lower_max_pool_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's int16 MaxPool: the largest in-bounds value, clamped to the activation's range. Exact."""
    return quantized_max_pool(ctx, *_pool_range(ctx))


@register("AVERAGE_POOL_2D", int16=True)
def lower_average_pool_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's int16 AveragePool (reference_integer_ops): the int32 sum of the in-bounds values
    divided by their count, halves away from zero, clamped to the activation's range. Exact."""
    return quantized_average_pool(ctx, *_pool_range(ctx))


@register("RESIZE_BILINEAR", int16=True, shape_inputs=(1,))
def lower_resize_bilinear_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's int16 ResizeBilinear: ResizeBilinearInteger's int64 sums (`quantized_resize_bilinear`).
    Exact."""
    return quantized_resize_bilinear(ctx)


@register("MUL", int16=True)
def lower_mul_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's int16 MUL (reference_integer_ops::Mul on int16): x1 * x2 in int32 (at most 2^30),
    rescaled by s1 * s2 / s_out (in double, as mul.cc forms it), clamped to the activation's range,
    with broadcasting. Exact."""
    s1, s2, s_out = _symmetric(ctx, 0), _symmetric(ctx, 1), _symmetric(ctx, -1)
    m, shift = quantize_multiplier(s1 * s2 / s_out)
    lo, hi = activation_range(ctx.op.fused_activation, s_out, 0, INT16_MIN, INT16_MAX)
    a, b = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()

    def body(*i):
        product = hl.cast(hl.Int(32), read_broadcast(a, out, i)) * hl.cast(hl.Int(32), read_broadcast(b, out, i))
        return to_int16(multiply_by_quantized_multiplier(product, m, shift, ctx.options), lo, hi)

    return [ctx.define(ctx.func_name(), out, body)]


@register("BATCH_MATMUL", int16=True)
def lower_batch_matmul_16x16(ctx: OpContext) -> list[Value]:
    """TFLite's int16 BATCH_MATMUL (reference_ops::BatchMatMul<int16, int64>): int16 x int16 products
    summed in 64 bits, rescaled by s_a * s_b / s_out (the scales' product in float32) with the 16-bit
    reduced multiplier and one rounding shift (MultiplyByQuantizedMultiplier for int64), clamped.
    Exact."""
    if any(t.type_name != "INT16" for t in (*ctx.op.inputs, *ctx.op.outputs)):
        raise LoweringError("BATCH_MATMUL mixing int16 with other types")
    s_a, s_b, s_out = _symmetric(ctx, 0), _symmetric(ctx, 1), _symmetric(ctx, -1)
    (m,), (shift,) = requantization_multipliers(s_a, [s_b], s_out, per_tensor_float_product=True)
    reduced, total = hl.i32(reduced_multiplier(m)), hl.i32(15 - shift)

    def term(x: hl.Expr, y: hl.Expr) -> hl.Expr:
        return hl.cast(hl.Int(64), hl.widening_mul(x, y))

    return batch_matmul(ctx, ctx.value(0), ctx.value(1), term, hl.i64(0),
                        lambda acc, _: to_int16(multiply_rounded_once(acc, reduced, total)))


# The int16 functions of one input LiteRT 2.3 has kernels for (not HARD_SWISH, ELU, RELU_N1_TO_1).
@register("LOGISTIC", "TANH", "GELU", "EXP", "LOG", "ABS", "NEG", "RELU", "RELU6", "LEAKY_RELU", "SQRT", "RSQRT",
          int16=True)
def lower_unary_16x8_by_litert_table(ctx: OpContext) -> list[Value]:
    """An int16 function of one int16 input, through the 65536-entry table LiteRT's own kernel
    fills for this op and quantization (litert_tables): exact to LiteRT by construction."""
    return unary_by_litert_table(ctx, "INT16")


@register("MEAN", int16=True, compile_time=(1,))
def lower_mean_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's reference int16 MEAN (QuantizedMeanOrSum, as for int8: an int32 sum, 1/N folded into
    the multiplier), narrowed to int16. Exact."""
    def finish(total: hl.Expr, m: int, shift: int, zp: int) -> hl.Expr:
        return to_int16(multiply_by_quantized_multiplier(total, m, shift, ctx.options) + zp)

    return quantized_mean(ctx, finish)


# SoftmaxInt16's tables (softmax.cc's Prepare, gen_lut in common.h): 512 steps of a function plus
# the end point, in Q0.15 (32768 per unit), each step's sample biased by half its midpoint's
# interpolation error. Computed in double, as there; equal to LiteRT's on every row the tests try.
INTERPOLATED_STEPS = 512


def interpolated_table(func, lo: float, hi: float) -> np.ndarray:
    """TFLite's gen_lut: `func` on [lo, hi] as INTERPOLATED_STEPS + 1 int16 entries for
    `interpolated_lookup`, each step's value less half the error of interpolating its midpoint."""
    step = (hi - lo) / INTERPOLATED_STEPS
    q015 = lambda v: tflite_round(v * 32768.0)
    table = []
    for i in range(INTERPOLATED_STEPS):
        here, there = func(lo + i * step), func(lo + (i + 1) * step)
        midpoint_error = tflite_round((there * 32768.0 + q015(here)) / 2.0) - q015(func(lo + i * step + step / 2))
        table.append(q015(here) - tflite_round(midpoint_error / 2.0))
    table.append(q015(func(hi)))
    return np.clip(table, INT16_MIN, INT16_MAX).astype(np.int16)


EXP_TABLE = interpolated_table(math.exp, -10.0, 0.0)
ONE_OVER_ONE_PLUS_X_TABLE = interpolated_table(lambda v: 1.0 / (1.0 + v), 0.0, 1.0)


def interpolated_lookup(table: hl.Buffer, v: hl.Expr) -> hl.Expr:
    """TFLite's generic_int16_table_lookup of an int16 value: the entry its top 9 bits select,
    plus the slope to the next times its low 7 bits, rounded (an int32 of int16 range)."""
    v = hl.cast(hl.Int(32), v)
    index = (v >> 7) + INTERPOLATED_STEPS // 2
    base = hl.cast(hl.Int(32), table[index])
    slope = hl.cast(hl.Int(32), table[index + 1]) - base
    return base + ((slope * (v & 0x7F) + 64) >> 7)


def leading_zeros(v: hl.Expr) -> hl.Expr:
    """The leading zero bits of a nonzero uint32, as an int32, by halving steps: Halide's OpenCL
    backend emits count_leading_zeros as a call it never defines."""
    count = hl.i32(0)
    for bits in (16, 8, 4, 2, 1):
        short = v < (hl.u32(1) << (32 - bits))
        count = count + hl.select(short, bits, 0)
        v = hl.select(short, v << bits, v)
    return count


@register("SOFTMAX", int16=True)
def lower_softmax_16x8(ctx: OpContext) -> list[Value]:
    """TFLite's SoftmaxInt16 over the last axis, in its integers. Each x - max is rescaled so that
    [-10, 0] spans 65535 steps and looked up in the exp table (Q0.15); the row's int32 sum, shifted
    left by its headroom, selects 1 / sum from the 1 / (1 + x) table, and each exponential times it
    is shifted back with rounding into [0, 32767]. Everything fits 32 bits (no int64: Vulkan runs it
    too). Exact."""
    if ctx.op.inputs[0].type_name != "INT16":
        raise LoweringError(f"SOFTMAX from {ctx.op.inputs[0].type_name} to int16")
    in_scale, out_scale = _symmetric(ctx, 0), _symmetric(ctx, -1)
    if abs(out_scale - 1 / 32768) > 0.001 / 32768:
        raise LoweringError(f"int16 SOFTMAX with output scale {out_scale} (TFLite requires 1/32768)")
    x = ctx.value(0)
    rows, depth = x.shape[:-1], x.shape[-1]
    if depth > 65536:
        raise LoweringError(f"int16 SOFTMAX over {depth} values (TFLite's int32 sum of them overflows)")
    # softmax.cc multiplies the float scale and beta in float, then divides in double.
    beta = float(np.float32(in_scale) * np.float32(ctx.option("beta", 1.0)))
    m, shift = quantize_multiplier(beta / (10.0 / 65535.0))
    exp_table = constant_buffer(ctx, "exp_table", hl.Int(16), EXP_TABLE)
    reciprocal_table = constant_buffer(ctx, "reciprocal_table", hl.Int(16), ONE_OVER_ONE_PLUS_X_TABLE)
    row_max = row_reduce(ctx, "max", rows, depth, lambda row, k: hl.cast(hl.Int(32), x.at(row + [k])), hl.maximum)

    def exp_q015(row, k):
        diff = hl.cast(hl.Int(32), x.at(row + [k])) - row_max.at(row + [hl.Expr(0)])
        scaled = multiply_by_quantized_multiplier(diff, m, shift, ctx.options)
        return interpolated_lookup(exp_table, hl.clamp(scaled + 32767, INT16_MIN, INT16_MAX))

    row_sum = row_reduce(ctx, "sum", rows, depth, exp_q015, hl.sum)
    ctx.materialize.extend([row_max, row_sum])

    def body(*i):
        row = list(i[:-1])
        total = hl.cast(hl.UInt(32), row_sum.at(row + [hl.Expr(0)]))
        headroom_plus_one = leading_zeros(total)
        # The sum shifted to bit 30 and rounded to 17 bits: x = sum - 1 recentred on int16's range.
        shifted = hl.cast(hl.Int(32), ((total << hl.cast(hl.UInt(32), headroom_plus_one - 1)) + (1 << 13)) >> 14)
        reciprocal = interpolated_lookup(reciprocal_table, hl.clamp(shifted - ((1 << 15) + (1 << 16)),
                                                                    INT16_MIN, INT16_MAX))
        right_shift = 31 - headroom_plus_one
        scaled = (exp_q015(row, i[-1]) * reciprocal + (hl.i32(1) << (right_shift - 1))) >> right_shift
        return to_int16(scaled, 0, INT16_MAX)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]
