"""TFLite's fixed-point arithmetic for quantized ops, as Halide expressions: Q31 multipliers
(`quantize_multiplier`), gemmlowp's roundings (`srdhm`, `rounding_divide_by_pot`), requantization to
int8 in the reference kernels' fixed point or XNNPACK's float32, and the quantization parameters they
start from. The int8 (quantized.py), int16 (quantized16.py) and dynamic-range (hybrid.py) lowerings
all build on these.

Each form is exact: the same integers as TFLite's kernels. Where a target lacks an instruction the
form is written another way with the same result (LoweringOptions: 32-bit pieces without 64-bit
integers, one 64-bit product on x86), chosen by the LoweringOptions the caller passes.
"""

from __future__ import annotations

import math
from typing import Sequence

import halide as hl
import numpy as np

from tflite_tools.model.ir import Tensor

from ..lowering_options import LoweringOptions
from .registry import LoweringError, OpContext

INT8_MIN, INT8_MAX = -128, 127


def tflite_round(value: float) -> int:
    """std::round of a Python float (TfLiteRound)."""
    return int(math.floor(value + 0.5)) if value >= 0 else -int(math.floor(-value + 0.5))


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: `real` = m * 2^(shift - 31), m a Q31 integer in [2^30, 2^31)."""
    if real == 0:
        return 0, 0
    mantissa, shift = math.frexp(real)
    m = tflite_round(mantissa * (1 << 31))
    if m == 1 << 31:
        m //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:
        return (1 << 31) - 1, 30
    return m, shift


def srdhm(a: hl.Expr, b: hl.Expr, options: LoweringOptions) -> hl.Expr:
    """gemmlowp's SaturatingRoundingDoublingHighMul as one Halide intrinsic.

    gemmlowp adds a nudge of 2^30 (1 - 2^30 when a * b < 0) and truncates toward zero; for either
    sign that equals floor((a * b + 2^30) / 2^31), and its one overflow (a = b = INT32_MIN) gives
    INT32_MAX: exactly rounding_mul_shift_right(a, b, 31), which saturates. Halide lowers it to
    each target's best form (ARM: SQRDMULH); on Vulkan that form needs 64-bit integers, so there
    (LoweringOptions.wide_integers False) it is computed in 32-bit pieces instead (b >= 0, as every
    requantizing multiplier is).
    """
    if not options.wide_integers:
        return srdhm_in_32_bits(hl.cast(hl.Int(32), a), hl.cast(hl.Int(32), b))
    return hl.rounding_mul_shift_right(hl.cast(hl.Int(32), a), hl.cast(hl.Int(32), b), 31)


def srdhm_in_32_bits(a: hl.Expr, b: hl.Expr) -> hl.Expr:
    """floor((a * b + 2^30) / 2^31) for int32 a and b >= 0, in 32-bit arithmetic only
    (`high_product_in_32_bits` with the nudge). Equal to the 64-bit form on 2.2M random and edge pairs."""
    return high_product_in_32_bits(a, b, nudged=True)


def high_product_in_32_bits(a: hl.Expr, b: hl.Expr, nudged: bool) -> hl.Expr:
    """floor((a * b + (2^30 if `nudged` else 0)) / 2^31) for int32 a and b >= 0, in 32-bit arithmetic.

    With a = ah 2^16 + al and b = bh 2^16 + bl (al, bl the unsigned low halves), a * b + 2^30 is
    hh 2^32 + (t + m2) 2^16 + r, where hh = ah bh, m1 = ah bl, m2 = al bh, t = m1 + (al bl >> 16)
    + 2^14 and r < 2^16; so the result is 2 hh + floor((t + m2) / 2^15), t and m2 each within
    int32, their sum taken as quotients and remainders by 2^15. The last additions wrap in uint32
    (the true result fits int32). Without the nudge t has no 2^14."""
    u32, i32 = hl.UInt(32), hl.Int(32)
    al, ah = a & 0xFFFF, a >> 16
    bl, bh = b & 0xFFFF, b >> 16
    low = hl.cast(u32, al) * hl.cast(u32, bl)
    m2 = al * bh
    t = ah * bl + hl.cast(i32, low >> 16) + ((1 << 14) if nudged else 0)
    carry = ((t & 0x7FFF) + (m2 & 0x7FFF)) >> 15
    total = hl.cast(u32, 2 * (ah * bh)) + hl.cast(u32, t >> 15) + hl.cast(u32, m2 >> 15) + hl.cast(u32, carry)
    return hl.reinterpret(i32, total)


def rounded_once_in_32_bits(x: hl.Expr, m: hl.Expr, down: hl.Expr) -> hl.Expr:
    """floor((x * m + 2^(30 + down)) / 2^(31 + down)) for int32 x, m >= 0 and down >= 0: TFLite's
    single-rounding multiply (shift = -down) in 32-bit arithmetic. With H = floor(x m / 2^31) the
    result is H / 2^down rounded halves up — (H >> down) plus bit down - 1 of H, since the rounding
    term 2^(30 + down) is a whole multiple of 2^31 when down > 0 — and srdhm when down = 0."""
    high = high_product_in_32_bits(x, m, nudged=False)
    halves = shift_right_signed(high, hl.max(down - 1, 0)) & 1
    return hl.select(down == 0, srdhm_in_32_bits(x, m), shift_right_signed(high, down) + halves)


def rounding_divide_by_pot(x: hl.Expr, exponent, options: LoweringOptions, positive: bool = False) -> hl.Expr:
    """gemmlowp's RoundingDivideByPOT: x / 2^exponent (exponent >= 0), halves rounded away from zero.

    As TFLite's NEON kernels compute it: a rounding shift (halves up) of x, less 1 where x < 0 and
    the exponent is positive (x & -exponent has the sign bit then), the subtraction saturating so
    INT32_MIN stays itself. ARM: and, sshr, sqadd, srshl — gemmlowp's remainder-and-threshold form
    took over 20 instructions a vector with per-channel exponents (equal on 2^20 random and edge
    cases, every exponent 0-31). `positive`: the exponent is known to be over 0 (the fixup is then
    just x's sign).
    """
    exponent = hl.cast(hl.Int(32), exponent)
    negative_fixup = x >> 31 if positive else (x & -exponent) >> 31
    fixed = hl.saturating_add(x, negative_fixup)
    if not options.wide_integers:
        half = hl.select(exponent > 0, shift_right_signed(fixed, hl.max(exponent - 1, 0)) & 1, 0)
        return shift_right_signed(fixed, exponent) + half
    return hl.rounding_shift_right(fixed, exponent)


def shift_right_signed(x: hl.Expr, amount: hl.Expr) -> hl.Expr:
    """x >> amount, arithmetic, for int32 x, written so that Halide 21's Vulkan backend keeps it
    arithmetic: it shifts a signed value by a non-constant amount logically (-64 >> 1 came out
    2147483616, and inside rounding_shift_right -64 / 2^6 came out 67108863). A negative x is
    complemented, shifted (a logical shift of a non-negative value is arithmetic) and complemented
    back: the same integers on every target."""
    return hl.select(x < 0, ~(~x >> amount), x >> amount)


def multiply_by_quantized_multiplier(x: hl.Expr, m: int, shift: int, options: LoweringOptions) -> hl.Expr:
    """TFLite's MultiplyByQuantizedMultiplier: x * m * 2^(shift - 31), rounded as gemmlowp does, for
    a compile-time multiplier (its shifts become immediates, and shifts by 0 disappear)."""
    if options.x86_integer and shift <= 0 and m > 0:
        return rounded_twice_in_64_bits(x, hl.i32(m), *(hl.i64(t) for t in wide_terms(shift)))
    scaled = srdhm(x * (1 << shift) if shift > 0 else x, hl.i32(m), options)
    return rounding_divide_by_pot(scaled, -shift, options, positive=True) if shift < 0 else scaled


def multiply_shifted(x: hl.Expr, m, up, down, options: LoweringOptions, down_positive: bool = False) -> hl.Expr:
    """MultiplyByQuantizedMultiplier with its shift given as a left multiplier `up` (2^max(shift, 0))
    and a right exponent `down` (max(-shift, 0); `down_positive` where every channel's is over 0):
    per-channel tables of each fold to constants where all channels agree (no left shift at all,
    commonly)."""
    return rounding_divide_by_pot(srdhm(x * up, m, options), down, options, down_positive)


def wide_terms(shift: int) -> tuple[int, int, int]:
    """The constants of `rounded_twice_in_64_bits` for a shift <= 0: the half step of the second
    rounding (in units of the 64-bit product), its correction for negative values, the total shift."""
    return (1 << (30 - shift) if shift < 0 else 0), (-(1 << 31) if shift < 0 else 0), 31 - shift


def rounded_twice_in_64_bits(a: hl.Expr, m: hl.Expr, half: hl.Expr, negative: hl.Expr, total: hl.Expr) -> hl.Expr:
    """MultiplyByQuantizedMultiplier (shift <= 0, m > 0) as one 64-bit product and one shift.

    With x = a * m + 2^30 and e = -shift, gemmlowp's two roundings — floor(x / 2^31), then halves
    away from zero by 2^e — are floor((x + 2^(e+30) - 2^31 [x < 0]) / 2^(31+e)) (for e = 0 just
    floor(x / 2^31)): exact, as floor((floor(y) + k) / n) = floor((y + k) / n) for integer k. A
    positive m never saturates. The other arguments are `wide_terms` (int64). For x86, which has a
    32 x 32 -> 64-bit multiply (VPMULDQ) but no high multiply: Halide's general
    rounding_mul_shift_right took ~40 instructions per 16 lanes.
    """
    x = hl.widening_mul(hl.cast(hl.Int(32), a), m) + hl.i64(1 << 30)
    return hl.cast(hl.Int(32), (x + half + ((x >> 63) & negative)) >> total)


def scale_zp(t: Tensor) -> tuple[float, int]:
    """A per-tensor quantized tensor's scale and zero point. A scale that is not a positive finite
    number (a converter's output for a tensor that is always zero) is refused: TFLite's kernels
    refuse it too (no_integer_overflow_from_quantization), and every rescale would divide by it."""
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        raise LoweringError(f"{t.name!r}: expected one scale (per-tensor quantization)")
    scale = float(q.scale[0])
    if not (math.isfinite(scale) and scale > 0):
        raise LoweringError(f"{t.name!r}: quantization scale {scale}")
    return scale, int(q.zero_point[0]) if q.zero_point is not None else 0


def activation_range(act: str | None, scale: float, zp: int, qmin: int = INT8_MIN, qmax: int = INT8_MAX
                     ) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for an output of range [qmin, qmax] (int8's unless given)."""
    def q(v: float) -> int:
        with np.errstate(over="ignore"):
            steps = float(np.float32(v) / np.float32(scale))
        if not abs(steps) <= 2**31 - 1:  # TFLite's prepare refuses it (no_integer_overflow_from_quantization)
            raise LoweringError(f"activation bound {v} is {steps} steps of scale {scale}")
        return zp + tflite_round(steps)

    if act is None:
        return qmin, qmax
    if act == "RELU":
        return max(qmin, q(0)), qmax
    if act == "RELU6":
        return max(qmin, q(0)), min(qmax, q(6))
    if act == "RELU_N1_TO_1":
        return max(qmin, q(-1)), min(qmax, q(1))
    raise LoweringError(f"quantized fused activation {act}")


def multiply_single_rounding(x: hl.Expr, m, shift, options: LoweringOptions) -> hl.Expr:
    """x * m * 2^(shift - 31) rounded once, halves up: the 64-bit product shifted right with
    rounding (TFLite's single-rounding MultiplyByQuantizedMultiplier, which its reference per-channel
    FULLY_CONNECTED uses: the double-rounding form differed from it on 8 of 6,144 sums). Without
    64-bit integers (shift <= 0 only): `rounded_once_in_32_bits`."""
    shift = hl.cast(hl.Int(32), shift)
    if not options.wide_integers:
        return rounded_once_in_32_bits(hl.cast(hl.Int(32), x), hl.cast(hl.Int(32), m), -shift)
    return hl.rounding_mul_shift_right(x, hl.cast(hl.Int(32), m), hl.cast(hl.UInt(32), 31 - shift))


def xnnpack_float_scales(in_scale: float, w_scales: Sequence[float], out_scale: float) -> list[float]:
    """XNNPACK's float32 requantization scales, one per weight scale: in_scale * w_scale / out_scale
    in float32, multiplied first (the order sets the last bit)."""
    f32 = np.float32
    return [float(f32(f32(in_scale) * f32(w)) / f32(out_scale)) for w in w_scales]


def float_requantize(acc: hl.Expr, scale: hl.Expr, zp: int, lo: int, hi: int) -> hl.Expr:
    """An int32 sum as the int8 output the way XNNPACK's fp32 requantization computes it: float32
    sum times float32 scale, clamped to [lo - zp, hi - zp], rounded to nearest even, plus zp. The
    clamp comes first so the conversion never overflows (a float too large for int32 has no
    defined conversion); after it the value fits int16, where zp is added."""
    scaled = hl.clamp(hl.cast(hl.Float(32), acc) * scale, hl.f32(lo - zp), hl.f32(hi - zp))
    return hl.cast(hl.Int(8), hl.cast(hl.Int(16), hl.round(scaled)) + hl.i16(zp))


def to_int8(scaled: hl.Expr, zp: int, lo: int, hi: int) -> hl.Expr:
    """A rescaled int32 as the int8 output: offset by the zero point, clamped to [lo, hi].

    Narrowed first, as TFLite's NEON kernels do (saturating to int16, adding the zero point there,
    saturating to int8, clamping 16 lanes at once): the same value, since whatever saturates lies
    beyond [lo, hi] either way, in half the instructions of an int32 clamp per vector."""
    narrow = hl.saturating_add(hl.saturating_cast(hl.Int(16), scaled), hl.i16(zp))
    return hl.clamp(hl.saturating_cast(hl.Int(8), narrow), hl.i8(lo), hl.i8(hi))


def requantize(acc: hl.Expr, m: int, shift: int, zp: int, lo: int, hi: int, options: LoweringOptions) -> hl.Expr:
    """An int32 sum as the int8 output: scaled as gemmlowp rounds, offset by the zero point, clamped."""
    return to_int8(multiply_by_quantized_multiplier(acc, m, shift, options), zp, lo, hi)


def requantization_multipliers(in_scale: float, w_scales: Sequence[float], out_scale: float,
                               per_tensor_float_product: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """TFLite's Q31 multipliers and shifts (one per weight scale) for a sum of input x weight
    products: in_scale * w_scale / out_scale in double, except that a FULLY_CONNECTED (or
    BATCH_MATMUL) with one weight scale forms in_scale * w_scale in float32 first
    (GetQuantizedConvolutionMultipler), where `per_tensor_float_product`. The last bit depends on it."""
    if per_tensor_float_product and len(w_scales) == 1:
        reals = [float(np.float32(in_scale) * np.float32(w_scales[0])) / out_scale]
    else:
        reals = [in_scale * s / out_scale for s in w_scales]
    mults, shifts = zip(*(quantize_multiplier(r) for r in reals))
    return mults, shifts


def int8_weight_scales(ctx: OpContext, weights: Tensor) -> list[float]:
    """The scales of an op's int8 weights, which TFLite's integer kernels require symmetric (zero
    points 0); LoweringError for anything else."""
    wq = weights.quantization
    if wq is not None and wq.blockwise is not None:
        raise LoweringError(f"{ctx.op.name}: weights quantized per block of {wq.blockwise.block_size} input channels")
    if wq is None or wq.scale is None or weights.type_name not in ("INT8", "INT4"):
        raise LoweringError(f"{ctx.op.name}: quantized data needs int8 weights")
    if wq.zero_point is not None and np.any(np.asarray(wq.zero_point) != 0):
        raise LoweringError(f"{ctx.op.name}: weights with a nonzero zero point")
    if wq.details is not None or len(wq.scale) == 0:  # custom quantization, say
        raise LoweringError(f"{ctx.op.name}: weights quantized otherwise than per tensor or per channel")
    return [float(s) for s in wq.scale]
