"""Int8 lowerings: TFLite's integer kernels, step for step.

TFLite computes a quantized op in integers: each int8 operand minus its zero point, an int32 sum,
then a fixed-point requantization — the real multiplier (say in_scale * w_scale / out_scale) held
as a Q31 mantissa and a power-of-two exponent (`quantize_multiplier`, TFLite's QuantizeMultiplier)
and applied with gemmlowp's rounding (SaturatingRoundingDoublingHighMul, then RoundingDivideByPOT)
— then the output zero point, clamped to the fused activation's quantized range. CONV_2D,
DEPTHWISE_CONV_2D, TRANSPOSE_CONV, FULLY_CONNECTED, ADD, SUB, MUL, MEAN, the pools, QUANTIZE between
scales, LEAKY_RELU and PRELU do exactly those integer steps, so they match LiteRT's reference kernels bit for bit, as
does RESIZE_BILINEAR's fixed-point interpolation.
HARD_SWISH, GELU, ELU, EXP, LOG, ABS, NEG, the RELUs, LOGISTIC and TANH index a 256-entry table
(tables.py), so they equal LiteRT by construction. The fixed-point arithmetic is fixed_point.py's.
SOFTMAX differs between TFLite's reference and optimized kernels (lookup tables, fixed point); here it is computed in float32 and rounded once, within one
quantization step (1 LSB) of LiteRT — the bound the tests hold every int8 output to.

Where the weights are constant and the reduction runs over a multiple of 4 input channels, CONV_2D
and FULLY_CONNECTED sum raw int8 products instead, 4 per lane (one `sdot` on ARMv8.2, VectorReduce in
Halide): sum (x - zp) * w = sum x * w - zp * sum w, the last term a per-channel constant folded into
the bias from the packed weight sums ("channel_sums"), the padding filled with zp so that padded taps
still contribute nothing. On x86 (VNNI multiplies unsigned by signed bytes) the input is read as
x + 128 in uint8 and the offset folded is zp + 128 (x86's forms, below). DEPTHWISE_CONV_2D folds
the zero point the same way ("tap_sums") and adds two taps' raw products in int16 before widening
them into the int32 sum (`paired_taps_hold`; ARM: smull, smlal, saddw — half the widening adds).
Integer sums are exact in any order, so this is bit for bit the same.

x86's forms (LoweringOptions.x86_integer): VNNI's VPDPBUSD multiplies unsigned by signed bytes, so a
dot-product sum reads its int8 input copied shifted by 128 (x + 128 as uint8, XNNPACK's trick), the
shift joining the zero point in the folded bias; and requantization is one 64-bit product and one
shift (fixed_point.rounded_twice_in_64_bits), as x86 has a 32 x 32 -> 64-bit multiply (VPMULDQ) but
no 32-bit high multiply like ARM's SQRDMULH. Both are exact: the same integers as ARM's forms.

Rounding (LoweringOptions.int8_rounding): "reference" requantizes CONV_2D, DEPTHWISE_CONV_2D and
FULLY_CONNECTED in fixed point as above, bit for bit LiteRT's reference kernels. "xnnpack" does what
XNNPACK's QS8/QC8 kernels (LiteRT's default CPU path for int8) do instead: the int32 sum converted to
float32, multiplied by the float32 scale in_scale * w_scale / out_scale, clamped to the activation's
range less the zero point, rounded to nearest even, offset by the zero point. That is within 1 LSB of
the reference (both round the same real number; they part only near a half) and the same integers
as XNNPACK's (tests/test_lowering_int8.py). x86 has no 32-bit high multiply, so the fixed-point form
costs ~20 instructions per 16 outputs there against 4 for this one.

The multipliers are compile-time constants of the kernel (per output channel where the weights
are per-channel), so a kernel is specific to its tensors' scales and zero points: both the block
signature and the model fingerprint include them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import halide as hl
import numpy as np

from ..pack import DOT_DEPTH
from ..values import Value, read_broadcast
from .elementwise import round_half_away
from .fixed_point import (INT8_MAX, INT8_MIN, activation_range, float_requantize, int8_weight_scales,
                          multiply_by_quantized_multiplier, multiply_shifted, multiply_single_rounding,
                          quantize_multiplier, requantization_multipliers, requantize, rounded_twice_in_64_bits,
                          rounding_divide_by_pot, scale_zp, to_int8, wide_terms, xnnpack_float_scales)
from .movement import resize_inputs
from .nn import (Arithmetic, batch_matmul, channel_bias, conv2d, conv2d_sums_in_dots, depthwise, fully_connected,
                 pool_window, transpose_conv, transpose_conv_geometry)
from .reduce import reduction_axes, reduction_domain, row_reduce
from .registry import LoweringError, OpContext, register

ADD_LEFT_SHIFT = 20  # TFLite's headroom shift for int8 ADD (add.cc)

def _as_unsigned(ctx: OpContext, x: Value) -> Value:
    """int8 x as uint8 x + 128 (the sign bit flipped), read inline by the op's terms."""
    return ctx.define(ctx.func_name("u8"), x.shape,
                      lambda *i: hl.cast(hl.UInt(8), hl.cast(hl.Int(16), x(*i)) + hl.i16(128)))


def _rounded_twice_per_channel(ctx: OpContext, mults: Sequence[int], shifts: Sequence[int]):
    """rounded_twice_in_64_bits with per-channel multipliers and shifts (tables, or constants)."""
    m = ctx.table(mults, "mult")
    terms = [wide_terms(s) for s in shifts]
    half, negative, total = (ctx.table(column, name, hl.Int(64))
                             for column, name in zip(zip(*terms), ("half", "negative", "total")))
    return lambda acc, oc: rounded_twice_in_64_bits(acc, m(oc), half(oc), negative(oc), total(oc))


def centred(ctx: OpContext, x: Value, zp: int) -> Value:
    """x - zero_point as int16 (an int8 minus an int8 fits), read inline by the op's terms."""
    return ctx.define(ctx.func_name("centred"), x.shape,
                      lambda *i: hl.cast(hl.Int(16), x(*i)) - hl.cast(hl.Int(16), zp))


def _fixed_point_scaling(ctx: OpContext, in_scale: float, w_scales: Sequence[float], out_scale: float,
                         per_tensor_float_product: bool):
    """TFLite's reference requantization of an int32 sum in output channel `oc`, as a function
    (acc, oc) -> the rescaled int32, in each target's cheapest exact form."""
    mults, shifts = requantization_multipliers(in_scale, w_scales, out_scale, per_tensor_float_product)

    # LiteRT's reference kernels round once for a per-channel FULLY_CONNECTED, twice elsewhere.
    if per_tensor_float_product and len(w_scales) > 1:
        if not ctx.options.wide_integers and max(shifts) > 0:
            raise LoweringError("a per-channel int8 FULLY_CONNECTED with a multiplier over 1 rounds a 64-bit product "
                                "once: no 64-bit integers here")
        m, shift = ctx.table(mults, "mult"), ctx.table(shifts, "shift")
        return lambda acc, oc: multiply_single_rounding(acc, m(oc), shift(oc), ctx.options)
    if ctx.options.x86_integer and all(s <= 0 for s in shifts):
        return _rounded_twice_per_channel(ctx, mults, shifts)
    m = ctx.table(mults, "mult")
    up = ctx.table([1 << max(s, 0) for s in shifts], "up")
    down = ctx.table([max(-s, 0) for s in shifts], "down")
    down_positive = all(s < 0 for s in shifts)  # multipliers under 1/2: the usual case
    return lambda acc, oc: multiply_shifted(acc, m(oc), up(oc), down(oc), ctx.options, down_positive)


def _int8_arithmetic(ctx: OpContext, per_tensor_float_product: bool, dot: bool = False,
                     paired: bool = False, operands: tuple[int, int, int] = (0, 1, 2)) -> Arithmetic:
    """Integer terms, an int32 sum started at the int32 bias, requantized as LoweringOptions.int8_rounding says.

    `per_tensor_float_product`: see requantization_multipliers.
    `dot`: the loops can sum in dot-product groups (taken where the weights are constant).
    `paired`: a depthwise sum may add two taps' raw int8 products in int16 (`paired_taps`).
    `operands`: the indices of the data, the weights and the bias among the op's inputs.
    """
    data, weights, bias_index = operands
    x_t, w_t, out_t = ctx.op.inputs[data], ctx.op.inputs[weights], ctx.op.outputs[0]
    in_scale, in_zp = scale_zp(x_t)
    out_scale, out_zp = scale_zp(out_t)
    w_scales = int8_weight_scales(ctx, w_t)
    lo, hi = activation_range(ctx.op.fused_activation, out_scale, out_zp)
    if ctx.has_input(bias_index) and ctx.op.inputs[bias_index].type_name != "INT32":
        raise LoweringError(f"{ctx.op.name}: int8 with a {ctx.op.inputs[bias_index].type_name} bias")

    if ctx.options.int8_rounding == "xnnpack":
        float_scale = ctx.table(xnnpack_float_scales(in_scale, w_scales, out_scale), "scale",
                                hl.Float(32))

        def finish(acc: hl.Expr, i) -> hl.Expr:
            return float_requantize(acc, float_scale(i[-1]), out_zp, lo, hi)
    else:
        scaled = _fixed_point_scaling(ctx, in_scale, w_scales, out_scale, per_tensor_float_product)

        def finish(acc: hl.Expr, i) -> hl.Expr:
            return to_int8(scaled(acc, i[-1]), out_zp, lo, hi)

    bias = channel_bias(ctx, bias_index, zero=hl.i32(0))
    # (Not without 64-bit integers: for Vulkan, Halide widened the paired sum through int64.)
    if paired and ctx.options.wide_integers and paired_taps_hold(ctx, weights):
        # Raw int8 products with the zero point folded into the bias as for dot products, two taps
        # summed in int16 before widening: exact, as |x * w| <= 128 * 127 makes two fit in int16.
        sums = ctx.packed(weights, "tap_sums")
        return Arithmetic(source=lambda x: x, term=hl.widening_mul,
                          init=lambda oc: bias(oc) - hl.i32(in_zp) * sums(oc),
                          finish=finish, fill=in_zp, paired_taps=True)
    if dot and w_t.is_constant:
        sums = ctx.packed(weights, "channel_sums")
        unsigned = ctx.options.x86_integer
        offset = in_zp + (128 if unsigned else 0)  # what the input is read as, less its real value
        return Arithmetic(
            source=(lambda x: _as_unsigned(ctx, x)) if unsigned else (lambda x: x),
            term=lambda v, w: hl.cast(hl.Int(32), hl.widening_mul(v, w)),
            init=lambda oc: bias(oc) - hl.i32(offset) * sums(oc),
            finish=finish, dot=DOT_DEPTH, fill=offset,
            # Shifted once into a uint8 copy: then a pixel's 4 bytes are one broadcast load in the
            # VNNI tile (not a load, an XOR and a shuffle).
            copy_source=unsigned,
        )
    return Arithmetic(
        source=lambda x: centred(ctx, x, in_zp),
        # int16 x int16 -> int32: one widening multiply (x86 VPMADDWD / ARM SMLAL), not an int32 one.
        term=lambda v, w: hl.widening_mul(v, hl.cast(hl.Int(16), w)),
        init=bias,
        finish=finish,
    )


@register("CONV_2D", quantized=True)
def lower_conv2d_int8(ctx: OpContext) -> list[Value]:
    """CONV_2D on int8 (per-channel weights), as TFLite's ConvPerChannel."""
    return conv2d(ctx, _int8_arithmetic(ctx, per_tensor_float_product=False, dot=conv2d_sums_in_dots(ctx)))


def paired_taps_hold(ctx: OpContext, i: int) -> bool:
    """Whether two int8 products with the op's constant weights (input `i`) always fit in int16: no
    weight is -128 (TFLite's symmetric int8 weights lie in [-127, 127]). The answer joins the
    kernel's identity (weights with a -128 get the unpaired kernel), and the "tap_sums" packer
    refuses others, so a kernel built for one model never runs on weights it cannot sum."""
    t = ctx.op.inputs[i]
    return (t.is_constant and t.type_name == "INT8"
            and ctx.const_property(i, "int8 weights above -128", lambda w: int(np.min(w)) > INT8_MIN))


@register("DEPTHWISE_CONV_2D", quantized=True, compile_time=(1,))
def lower_depthwise_int8(ctx: OpContext) -> list[Value]:
    """DEPTHWISE_CONV_2D on int8, as TFLite's DepthwiseConvPerChannel."""
    return depthwise(ctx, _int8_arithmetic(ctx, per_tensor_float_product=False, paired=True))


@register("TRANSPOSE_CONV", quantized=True, shape_inputs=(0,))
def lower_transpose_conv_int8(ctx: OpContext) -> list[Value]:
    """TRANSPOSE_CONV on int8 (per-channel weights), as TFLite's integer TransposeConv: int32 sums
    of (x - zp) * w, the bias, one per-channel requantization."""
    return transpose_conv(ctx, 2, 1, transpose_conv_geometry(ctx),
                          _int8_arithmetic(ctx, per_tensor_float_product=False, operands=(2, 1, 3)))


@register("FULLY_CONNECTED", quantized=True)
def lower_fully_connected_int8(ctx: OpContext) -> list[Value]:
    """FULLY_CONNECTED on int8, as TFLite's integer FullyConnected (per-tensor or per-channel)."""
    dot = ctx.op.inputs[1].shape[1] % DOT_DEPTH == 0
    return fully_connected(ctx, _int8_arithmetic(ctx, per_tensor_float_product=True, dot=dot))


@register("BATCH_MATMUL", quantized=True)
def lower_batch_matmul_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 BATCH_MATMUL (reference_ops::BatchMatMul): int32 sums of (a - zp_a) * (b - zp_b),
    each operand centred in int16, rescaled by s_a * s_b / s_out (the product of scales in float32,
    as GetQuantizedConvolutionMultipler forms it; rounded twice), plus zp_out, clamped. Exact."""
    if any(t.type_name != "INT8" for t in (*ctx.op.inputs, *ctx.op.outputs)):
        raise LoweringError("BATCH_MATMUL mixing int8 with other types (hybrid)")
    (s_a, zp_a), (s_b, zp_b) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.inputs[1])
    s_out, zp_out = scale_zp(ctx.op.outputs[0])
    (m,), (shift,) = requantization_multipliers(s_a, [s_b], s_out, per_tensor_float_product=True)
    return batch_matmul(ctx, centred(ctx, ctx.value(0), zp_a), centred(ctx, ctx.value(1), zp_b), hl.widening_mul,
                        hl.i32(0), lambda acc, _: requantize(acc, m, shift, zp_out, INT8_MIN, INT8_MAX, ctx.options))


def shifted_left(v: hl.Expr, zp: int, bits: int) -> hl.Expr:
    """(v - zp) * 2^bits in int32 for int8 v, 16 <= bits <= 22: centred and shifted in int16, then
    widened by a shift of 16 (ARM: ssubl, shl, shll — 4 instructions per 8 values, not 7)."""
    narrow = hl.widening_sub(v, hl.i8(zp)) << (bits - 16)
    return hl.widening_shift_left(narrow, hl.u16(16))


@register("ADD", "SUB", quantized=True)
def lower_add_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 ADD and SUB: both inputs shifted left by 20, rescaled to twice the larger input
    scale, added or subtracted, rescaled to the output (add.cc / sub.cc, reference_integer_ops::Add),
    with broadcasting."""
    (s1, zp1), (s2, zp2) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.inputs[1])
    s_out, zp_out = scale_zp(ctx.op.outputs[0])
    twice_max = 2 * max(s1, s2)
    m1, sh1 = quantize_multiplier(s1 / twice_max)
    m2, sh2 = quantize_multiplier(s2 / twice_max)
    m_out, sh_out = quantize_multiplier(twice_max / ((1 << ADD_LEFT_SHIFT) * s_out))
    lo, hi = activation_range(ctx.op.fused_activation, s_out, zp_out)
    a, b = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()
    sign = -1 if ctx.op.name == "SUB" else 1

    def scaled(v: hl.Expr, zp: int, m: int, sh: int) -> hl.Expr:
        if m == 1 << 30 and sh <= 0:
            # The larger-scale input's multiplier (half of twice its scale; quantize_multiplier's
            # only power of two): the doubling high multiply of x * 2^20 by 2^30 is x * 2^19 exactly.
            exact = shifted_left(v, zp, ADD_LEFT_SHIFT - 1)
            return rounding_divide_by_pot(exact, -sh, ctx.options, positive=True) if sh < 0 else exact
        return multiply_by_quantized_multiplier(shifted_left(v, zp, ADD_LEFT_SHIFT), m, sh, ctx.options)

    def body(*i):
        first, second = scaled(read_broadcast(a, out, i), zp1, m1, sh1), scaled(read_broadcast(b, out, i), zp2, m2, sh2)
        return requantize(first + second if sign > 0 else first - second, m_out, sh_out, zp_out, lo, hi, ctx.options)

    return [ctx.define(ctx.func_name(), out, body)]


@register("QUANTIZE", quantized=True)
@register("QUANTIZE", int16=True)
def lower_requantize(ctx: OpContext) -> list[Value]:
    """QUANTIZE between integer quantizations (int8 or int16, in and out: another scale or zero
    point), as TFLite's Requantize: (x - zp_in) rescaled by in_scale / out_scale (one Q31 multiplier,
    possibly a left shift), plus zp_out, clamped to the output type. Exact."""
    (s_in, zp_in), (s_out, zp_out) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.outputs[0])
    m, shift = quantize_multiplier(s_in / s_out)
    element = ctx.out_type()
    x = ctx.value(0)

    def body(*i):
        centred_input = hl.cast(hl.Int(32), x(*i)) - zp_in
        if element.bits() == 8:
            return requantize(centred_input, m, shift, zp_out, INT8_MIN, INT8_MAX, ctx.options)
        lo, hi = -(1 << (element.bits() - 1)), (1 << (element.bits() - 1)) - 1
        scaled = multiply_by_quantized_multiplier(centred_input, m, shift, ctx.options)
        return hl.cast(element, hl.clamp(scaled + zp_out, lo, hi))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("LEAKY_RELU", quantized=True)
def lower_leaky_relu_int8(ctx: OpContext) -> list[Value]:
    """TFLite's QuantizeLeakyRelu: x - zp_in rescaled by in_scale / out_scale where it is >= 0, by
    in_scale * alpha / out_scale where negative (both multipliers formed in float32, as leaky_relu.cc's
    float expressions are, then made Q31), plus zp_out, clamped. Exact."""
    (s_in, zp_in), (s_out, zp_out) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.outputs[0])
    alpha = np.float32(ctx.option("alpha", 0.2))
    if alpha < 0:
        raise LoweringError("int8 LEAKY_RELU with a negative alpha")
    identity = quantize_multiplier(float(np.float32(s_in) / np.float32(s_out)))
    negative = quantize_multiplier(float(np.float32(s_in) * alpha / np.float32(s_out)))
    x = ctx.value(0)

    def body(*i):
        v = hl.cast(hl.Int(32), x(*i)) - zp_in
        return hl.select(v >= 0, requantize(v, *identity, zp_out, INT8_MIN, INT8_MAX, ctx.options),
                         requantize(v, *negative, zp_out, INT8_MIN, INT8_MAX, ctx.options))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("PRELU", quantized=True)
def lower_prelu_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 PRELU: x - zp_in rescaled by in_scale / out_scale where it is >= 0, else times
    (alpha - zp_alpha) and rescaled by in_scale * alpha_scale / out_scale (both formed in float32,
    as prelu.cc's expressions are), plus zp_out, clamped; alpha broadcast. Exact."""
    (s_in, zp_in), (s_alpha, zp_alpha) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.inputs[1])
    s_out, zp_out = scale_zp(ctx.op.outputs[0])
    identity = quantize_multiplier(float(np.float32(s_in) / np.float32(s_out)))
    negative = quantize_multiplier(float(np.float32(s_in) * np.float32(s_alpha) / np.float32(s_out)))
    x, alpha = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()

    def body(*i):
        v = hl.cast(hl.Int(32), read_broadcast(x, out, i)) - zp_in
        slope = hl.cast(hl.Int(32), read_broadcast(alpha, out, i)) - zp_alpha
        return hl.select(v >= 0, requantize(v, *identity, zp_out, INT8_MIN, INT8_MAX, ctx.options),
                         requantize(v * slope, *negative, zp_out, INT8_MIN, INT8_MAX, ctx.options))

    return [ctx.define(ctx.func_name(), out, body)]


@register("MUL", quantized=True)
def lower_mul_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 MUL: (x1 - zp1) * (x2 - zp2) in int32, rescaled by s1 * s2 / s_out (one Q31
    multiplier, the product of scales in double as mul.cc forms it), with broadcasting. Exact."""
    (s1, zp1), (s2, zp2) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.inputs[1])
    s_out, zp_out = scale_zp(ctx.op.outputs[0])
    m, shift = quantize_multiplier(s1 * s2 / s_out)
    lo, hi = activation_range(ctx.op.fused_activation, s_out, zp_out)
    a, b = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()

    def body(*i):
        x1 = hl.cast(hl.Int(32), read_broadcast(a, out, i)) - zp1
        x2 = hl.cast(hl.Int(32), read_broadcast(b, out, i)) - zp2
        return requantize(x1 * x2, m, shift, zp_out, lo, hi, ctx.options)

    return [ctx.define(ctx.func_name(), out, body)]


SQUARED_DIFFERENCE_LEFT_SHIFT = 7  # squared_difference.cc's headroom shift for int8


@register("SQUARED_DIFFERENCE", quantized=True)
def lower_squared_difference_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 SQUARED_DIFFERENCE (squared_difference.cc): both inputs centred, shifted left by
    7, rescaled to twice the larger input scale (multipliers under one), subtracted; the difference
    squared in int32 (at most 255^2 * 2^14) and rescaled to the output. With broadcasting. Exact."""
    (s1, zp1), (s2, zp2) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.inputs[1])
    s_out, zp_out = scale_zp(ctx.op.outputs[0])
    twice_max = 2 * max(s1, s2)
    m1, sh1 = quantize_multiplier(s1 / twice_max)
    m2, sh2 = quantize_multiplier(s2 / twice_max)
    m_out, sh_out = quantize_multiplier(twice_max * twice_max / ((1 << 2 * SQUARED_DIFFERENCE_LEFT_SHIFT) * s_out))
    if max(sh1, sh2, sh_out) > 0:
        # TFLite forms all three with QuantizeMultiplierSmallerThanOneExp, which has no left shift.
        raise LoweringError("int8 SQUARED_DIFFERENCE with an output multiplier of one or more")
    a, b = ctx.value(0), ctx.value(1)
    out = ctx.out_shape()

    def scaled(v: hl.Expr, zp: int, m: int, sh: int) -> hl.Expr:
        centred = (hl.cast(hl.Int(32), v) - zp) << SQUARED_DIFFERENCE_LEFT_SHIFT
        return multiply_by_quantized_multiplier(centred, m, sh, ctx.options)

    def body(*i):
        diff = scaled(read_broadcast(a, out, i), zp1, m1, sh1) - scaled(read_broadcast(b, out, i), zp2, m2, sh2)
        return requantize(diff * diff, m_out, sh_out, zp_out, INT8_MIN, INT8_MAX, ctx.options)

    return [ctx.define(ctx.func_name(), out, body)]


def _same_scale(ctx: OpContext) -> tuple[float, int]:
    """The scale and zero point an op's int8 input and output share (TFLite requires it of pools)."""
    q_in, q_out = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.outputs[0])
    if q_in != q_out:
        raise LoweringError(f"{ctx.op.name}: int8 input and output quantized differently")
    return q_out


@register("MAX_POOL_2D", quantized=True)
def lower_max_pool_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 MaxPool: the largest in-bounds value, clamped to the activation's range. Exact."""
    return quantized_max_pool(ctx, *activation_range(ctx.op.fused_activation, *_same_scale(ctx)))


def quantized_max_pool(ctx: OpContext, lo: int, hi: int) -> list[Value]:
    """MaxPool on an integer tensor (int8 or int16): the largest in-bounds value, clamped to [lo, hi]."""
    window = pool_window(ctx)
    element = ctx.out_type()

    def body(n, y, xx, c):
        inside, v = window.taps(n, y, xx, c)
        low = hl.cast(element, -(1 << (element.bits() - 1)))
        return hl.clamp(hl.maximum(hl.select(inside, v, low)), hl.cast(element, lo), hl.cast(element, hi))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("AVERAGE_POOL_2D", quantized=True)
def lower_average_pool_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 AveragePool: the int32 sum of the in-bounds values divided by their count,
    halves rounded away from zero (C++'s truncating division of sum +- count / 2), clamped. Exact."""
    return quantized_average_pool(ctx, *activation_range(ctx.op.fused_activation, *_same_scale(ctx)))


def quantized_average_pool(ctx: OpContext, lo: int, hi: int) -> list[Value]:
    """AveragePool on an integer tensor (int8 or int16), as TFLite's reference integer kernels: the
    int32 sum of the in-bounds values divided by their count, halves rounded away from zero,
    clamped to [lo, hi]."""
    window = pool_window(ctx)
    element = ctx.out_type()

    def body(n, y, xx, c):
        inside, v = window.taps(n, y, xx, c)
        total = hl.sum(hl.select(inside, hl.cast(hl.Int(32), v), hl.i32(0)))
        count = window.count(y, xx)
        half = count / 2
        # Halide divides rounding down; C++ truncates: a negative numerator divides as its negation.
        mean = hl.select(total > 0, (total + half) / count, -((half - total) / count))
        return hl.cast(element, hl.clamp(mean, hl.i32(lo), hl.i32(hi)))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


def _round_to_int8(steps: hl.Expr, zp: int) -> hl.Expr:
    """A float32 count of output quantization steps rounded (halves away from zero, as TfLiteRound),
    offset by the zero point and clamped to int8."""
    q = hl.cast(hl.Int(32), round_half_away(steps)) + zp
    return hl.cast(hl.Int(8), hl.clamp(q, INT8_MIN, INT8_MAX))


@register("MEAN", quantized=True, compile_time=(1,))
def lower_mean_int8(ctx: OpContext) -> list[Value]:
    """TFLite's reference int8 MEAN (reference_ops::QuantizedMeanOrSum), bit for bit: the int32 sum
    of the raw values minus in_zp * N, requantized by in_scale / out_scale with 1/N folded into the
    Q31 multiplier (shifted up by floor(log2 N), then divided by N, truncating), plus out_zp,
    clamped. LiteRT's optimized kernel for 4-D means over H and W rounds in float instead and may
    differ by 1 LSB."""
    return quantized_mean(ctx, lambda total, m, shift, zp: requantize(total, m, shift, zp, INT8_MIN, INT8_MAX,
                                                                      ctx.options))


def quantized_mean(ctx: OpContext, finish: Callable[[hl.Expr, int, int, int], hl.Expr]) -> list[Value]:
    """QuantizedMeanOrSum's loops for an int8 or int16 MEAN: `finish`(int32 sum less in_zp * N,
    multiplier, shift, out_zp) rescales it and narrows to the output type."""
    x = ctx.value(0)
    (in_scale, in_zp), (out_scale, out_zp) = scale_zp(ctx.op.inputs[0]), scale_zp(ctx.op.outputs[0])
    axes = reduction_axes(ctx, 1, x.rank)
    count = int(np.prod([x.shape[a] for a in axes]))
    r, source = reduction_domain(ctx, x, axes, ctx.func_name("r"))
    multiplier, shift = quantize_multiplier(in_scale / out_scale)
    up = max(0, min(count.bit_length() - 1, 32, 31 + shift))
    multiplier, shift = (multiplier << up) // count, shift - up

    def body(*i):
        total = hl.sum(hl.cast(hl.Int(32), x.at(source(i)))) - hl.i32(in_zp * count)
        return finish(total, multiplier, shift, out_zp)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("SOFTMAX", quantized=True)
def lower_softmax_int8(ctx: OpContext) -> list[Value]:
    """exp(beta * in_scale * (x - max)) / sum in float32 over the last axis, rounded to the output
    step once (TFLite's int8 kernels use lookup tables or fixed point; within 1 LSB of both)."""
    x = ctx.value(0)
    in_scale, _ = scale_zp(ctx.op.inputs[0])
    out_scale, out_zp = scale_zp(ctx.op.outputs[0])
    factor = hl.f32(float(ctx.option("beta", 1.0)) * in_scale)
    rows, depth = x.shape[:-1], x.shape[-1]
    row_max = row_reduce(ctx, "max", rows, depth, lambda row, k: hl.cast(hl.Int(32), x.at(row + [k])), hl.maximum)

    def exp_term(row, k):
        return hl.exp(hl.cast(hl.Float(32), hl.cast(hl.Int(32), x.at(row + [k])) - row_max.at(row + [hl.Expr(0)])) * factor)

    row_sum = row_reduce(ctx, "sum", rows, depth, exp_term, hl.sum)
    ctx.materialize.extend([row_max, row_sum])

    def body(*i):
        row = list(i[:-1])
        p = exp_term(row, i[-1]) / row_sum.at(row + [hl.Expr(0)])
        return _round_to_int8(p * hl.f32(1.0 / out_scale), out_zp)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("RESIZE_BILINEAR", quantized=True, shape_inputs=(1,))
def lower_resize_bilinear_int8(ctx: OpContext) -> list[Value]:
    """TFLite's int8 ResizeBilinear (`quantized_resize_bilinear`)."""
    return quantized_resize_bilinear(ctx)


def quantized_resize_bilinear(ctx: OpContext) -> list[Value]:
    """TFLite's ResizeBilinearInteger (int8 or int16), in its integers: source positions in 1/1024
    steps (the scale rounded to them), the four taps weighted (a half-pixel tap before the first
    pixel gets a negative weight, as there) and summed — in int32 for int8, whose sums stay under
    2^28, in int64 for int16 as there — divided by 2^20 with halves away from zero, then truncated
    to the output type (wrapping, as static_cast). LiteRT's builtin kernel is this reference one:
    exact."""
    element = ctx.out_type()
    wide = hl.Int(32) if element.bits() == 8 else hl.Int(64)
    x, out, align, half = resize_inputs(ctx)
    _, h, w, _ = x.shape
    one = 1 << 10

    def scale_10(in_size: int, out_size: int) -> int:
        if align and out_size > 1:
            return (one * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
        return (one * in_size + out_size // 2) // out_size

    def source(i: hl.Expr, scale: int, size: int):
        """The position in 1/1024 steps, its lower and upper pixel, and its offset from the lower."""
        pos = i * scale + (scale // 2 - (1 << 9) if half else 0)
        # C divides toward zero: for the half-pixel start (-512 < pos < 0) that is 0, as max(floor, 0).
        lo = hl.max(pos >> 10, 0)
        hi = hl.min((pos + one - 1) >> 10, size - 1)
        return pos - lo * one, lo, hi

    scales = scale_10(h, out[1]), scale_10(w, out[2])

    def body(n, y, xx, c):
        fy, y0, y1 = source(y, scales[0], h)
        fx, x0, x1 = source(xx, scales[1], w)

        def tap(yy, xq):
            return hl.cast(wide, x(n, yy, xq, c))

        wy0, wy1, wx0, wx1 = (hl.cast(wide, v) for v in (one - fy, fy, one - fx, fx))
        total = tap(y0, x0) * wy0 * wx0 + tap(y1, x0) * wy1 * wx0 + tap(y0, x1) * wy0 * wx1 + tap(y1, x1) * wy1 * wx1
        half_step = hl.cast(wide, 1 << 19)
        rounded = hl.select(total > 0, (total + half_step) >> 20, -((half_step - total) >> 20))
        return hl.cast(element, rounded)

    return [ctx.define(ctx.func_name(), out, body)]
