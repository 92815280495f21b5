"""Math functions in half precision, for ops that compute in it (LoweringOptions.half_arithmetic).

XNNPACK's fp16 kernels evaluate the sigmoid on 8 lanes a NEON register with a short polynomial for
fp16's 11 significant bits; the float32 forms of halide_gen.lower.ieee take 4 lanes, two conversions
and twice the polynomial. Each function here says its accuracy over every fp16 input
(tests/test_half_arithmetic.py), and NaN gives NaN.
"""

from __future__ import annotations

import math

import halide as hl
import numpy as np

HALF = hl.Float(16)

# e^t = 1 + t (c1 + t (c2 + t c3)) on |t| <= ln 2 / 2, fitted for relative error and rounded to fp16:
# 1.0e-4 (a fifth of fp16's unit roundoff); degree 2 is 2e-3, four units.
_EXP_C = (1.0, 0.50390625, 0.1651611328125)
# Past this (n = -14), e^-a is no normal fp16: exp_negated gives 0, as XNNPACK's fp16 kernels flush it.
_EXP_CUTOFF = 14 * math.log(2)
# ln 2 in two parts: n * _LN2_HI is exact in fp16 for |n| <= 16 (4 significant bits by 5).
_LN2_HI = 0.6875
_LN2_LO = math.log(2) - _LN2_HI
# 1.5 * 2^10 + 15: adding it rounds -a / ln 2 in [-15, 16] to an integer n and leaves n + 15 in the
# low bits of the sum's fp16 significand, which shifted left by 10 are 2^n's bits.
_EXP_MAGIC = 1551.0
_EXP_MAGIC_BITS = int(np.float16(_EXP_MAGIC).view(np.uint16))
_CUTOFF_BITS = int(np.float16(_EXP_CUTOFF).view(np.uint16))  # a past these bits: e^-a is 0
_INF_BITS = 0x7C00
# The sigmoid's argument range for the exponential (times_sigmoid): n = round(-z / ln 2) in [-14, 16],
# and e^-z is inf past -11.09.
_SIGMOID_LOW, _SIGMOID_HIGH = -11.25, 10.0


def half(value: float) -> hl.Expr:
    """A constant in half precision (rounded once, from the double)."""
    return hl.cast(HALF, hl.f64(value))


def _shared(a: hl.Expr) -> hl.Expr:
    """`a` as strict float, for an exponential that reads it in a strict sum (t) and elsewhere: the
    simplifier rewrites only non-strict copies (a clamp of a merged into its producer's clamp), and
    two copies that differ are computed twice."""
    return hl.strict_float(a)


def _exp_negated_in_range(a: hl.Expr, halved: bool = False) -> hl.Expr:
    """e^-a for an fp16 a in [-10.7, 10.7] (n = round(-a / ln 2) in [-15, 15]): 2^n e^t with a degree-3
    polynomial for e^t, within 2 fp16 steps where e^-a is a normal fp16; a subnormal or 0 at n = -15
    (2^n's exponent field 0). Written in a, so that -a costs no negation: t = -t' with
    t' = a + n ln 2, the polynomial's odd coefficients negated.

    `halved`: as 2^(n-1) times 2 e^t, for a in [-11.4, 10] (n in [-14, 16]), where e^-a past 65504 is
    the product's overflow to inf. (2^16 as such is inf, and LLVM may distribute inf (1 + q) into
    inf + inf q: NaN for q < 0.)"""
    shift = 1 if halved else 0
    # Strict as t below is, whose n reads the bits: the shift then reads the same expression.
    bits = hl.reinterpret(hl.UInt(16), hl.strict_float(a * half(-1 / math.log(2)) + half(_EXP_MAGIC - shift)))
    # n from the bits: a float subtraction of the magic number the simplifier would cancel.
    n = hl.cast(HALF, hl.reinterpret(hl.Int(16), bits - hl.u16(_EXP_MAGIC_BITS - shift)))
    # Strict: with the two parts of ln 2 summed into one (reassociated), t lost 3 of its bits.
    t_negated = hl.strict_float((a + n * half(_LN2_HI)) + n * half(_LN2_LO))
    c0, c1, c2, c3 = (half(c * 2 ** shift) for c in (1.0, *_EXP_C))
    return hl.reinterpret(HALF, bits << 10) * (c0 - t_negated * (c1 - t_negated * (c2 - t_negated * c3)))


def exp_negated(a: hl.Expr) -> hl.Expr:
    """e^-a for an fp16 a >= 0: within 2 fp16 steps where e^-a is a normal fp16, 0 past e^-9.7."""
    # 0 where the cut-off < a <= inf, tested on the bits: one unsigned compare of a's bits past the
    # cut-off's (LLVM compares fp16 vectors a lane at a time: 3 instructions a lane). Past the cut-off
    # n and 2^n are whatever (no clamp of a: it cost an instruction and a register); a NaN's bits lie
    # past inf's, so NaN stays.
    a = _shared(a)
    past = hl.reinterpret(hl.UInt(16), a) - hl.u16(_CUTOFF_BITS + 1) < hl.u16(_INF_BITS - _CUTOFF_BITS)
    return hl.select(past, half(0), _exp_negated_in_range(a))


def times_sigmoid(x: hl.Expr, z: hl.Expr) -> hl.Expr:
    """x * sigmoid(z) = x / (1 + e^-z) for fp16 x and z, one exponential and one division for either
    sign of z. z is clamped to [-11.25, 10] for the exponential: from 10, 1 + e^-z rounds to 1 in
    fp16 (x exactly); below -11.09 e^-z is inf, and the result x's signed 0 where the exact one is
    under 1.6e-5 |x|. Two clamps in place of a sign select on e^-|z| and a cut-off test (4
    instructions a vector).
    NaN gives NaN (in x, or through the exponential), and -inf * sigmoid(-inf) NaN, as 0 * -inf is."""
    e = _exp_negated_in_range(_shared(hl.clamp(z, half(_SIGMOID_LOW), half(_SIGMOID_HIGH))), halved=True)
    return x / (half(1) + e)


def logistic(x: hl.Expr) -> hl.Expr:
    """1 / (1 + e^-x) for an fp16 x: within 2 fp16 steps of the exact value rounded where that is a
    normal fp16 (e^-x's error and three roundings), and within fp16's smallest normal below that."""
    return times_sigmoid(half(1), x)


def gelu_tanh(x: hl.Expr) -> hl.Expr:
    """GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), as x * sigmoid(2u)
    for an fp16 x (as ieee's float32 form, without a cancellation in 1 + tanh). Past |x| = 256 x^3 is
    inf and the sigmoid 0 or 1: -0 or x, and NaN for -inf, as the reference's."""
    a = 2 * math.sqrt(2.0 / math.pi)
    return times_sigmoid(x, x * (half(a) + half(a * 0.044715) * (x * x)))
