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
# Past this (n = -14), e^-a is no normal fp16: 0, as XNNPACK's fp16 sigmoid flushes it. A sigmoid
# of x below -9.7 is then 0 where the exact one is under 6.1e-5.
_EXP_CUTOFF = 14 * math.log(2)
# ln 2 in two parts: n * _LN2_HI is exact in fp16 for |n| <= 14 (4 significant bits by 4).
_LN2_HI = 0.6875
_LN2_LO = math.log(2) - _LN2_HI
# 1.5 * 2^10 + 15: adding it rounds -a / ln 2 in [-14, 0] to an integer n and leaves n + 15 in the
# low bits of the sum's fp16 significand, which shifted left by 10 are 2^n's bits.
_EXP_MAGIC = 1551.0
_EXP_MAGIC_BITS = int(np.float16(_EXP_MAGIC).view(np.uint16))
_CUTOFF_BITS = int(np.float16(_EXP_CUTOFF).view(np.uint16))  # a past these bits: e^-a is 0
_INF_BITS = 0x7C00


def half(value: float) -> hl.Expr:
    """A constant in half precision (rounded once, from the double)."""
    return hl.cast(HALF, hl.f64(value))


def exp_negated(a: hl.Expr) -> hl.Expr:
    """e^-a for an fp16 a >= 0: 2^n e^t with n = round(-a / ln 2) and a degree-3 polynomial for e^t;
    within 2 fp16 steps where e^-a is a normal fp16, 0 past e^-9.7. Written in a, so that -a costs
    no negation: t = -t' with t' = a + n ln 2, the polynomial's odd coefficients negated."""
    bits = hl.reinterpret(hl.UInt(16), a * half(-1 / math.log(2)) + half(_EXP_MAGIC))
    # n from the bits: a float subtraction of the magic number the simplifier would cancel.
    n = hl.cast(HALF, hl.reinterpret(hl.Int(16), bits - hl.u16(_EXP_MAGIC_BITS)))
    # Strict: with the two parts of ln 2 summed into one (reassociated), t lost 3 of its bits.
    t_negated = hl.strict_float((a + n * half(_LN2_HI)) + n * half(_LN2_LO))
    c1, c2, c3 = (half(c) for c in _EXP_C)
    e = hl.reinterpret(HALF, bits << 10) * (half(1) - t_negated * (c1 - t_negated * (c2 - t_negated * c3)))
    # 0 where the cut-off < a <= inf, tested on the bits: one unsigned compare of a's bits past the
    # cut-off's (LLVM compares fp16 vectors a lane at a time: 3 instructions a lane). Past the cut-off
    # n and 2^n are whatever (no clamp of a: it cost an instruction and a register); a NaN's bits lie
    # past inf's, so NaN stays.
    past = hl.reinterpret(hl.UInt(16), a) - hl.u16(_CUTOFF_BITS + 1) < hl.u16(_INF_BITS - _CUTOFF_BITS)
    return hl.select(past, half(0), e)


def logistic(x: hl.Expr) -> hl.Expr:
    """1 / (1 + e^-x) for an fp16 x: one exponential, of -|x|, for both signs (as ieee.logistic) and
    one division; within 2 fp16 steps of the exact value rounded where that is a normal fp16, and 0
    for x below -9.7 (exactly there: under 6.1e-5)."""
    e = exp_negated(hl.abs(x))
    one = half(1)
    # x's sign bit rather than x >= 0 (see exp_negated); -0 gives e / (1 + e) = 1 / 2 all the same.
    return hl.select(hl.reinterpret(hl.Int(16), x) < hl.i16(0), e, one) / (one + e)


def gelu_tanh(x: hl.Expr) -> hl.Expr:
    """GELU's tanh form, 0.5 x (1 + tanh(u)) with u = sqrt(2 / pi) (x + 0.044715 x^3), as x * sigmoid(2u)
    for an fp16 x (as ieee's float32 form, without a cancellation in 1 + tanh). Past |x| = 256 x^3 is
    inf and the sigmoid 0 or 1: -0 or x, and NaN for -inf, as the reference's."""
    a = 2 * math.sqrt(2.0 / math.pi)
    return x * logistic(x * (half(a) + half(a * 0.044715) * (x * x)))
