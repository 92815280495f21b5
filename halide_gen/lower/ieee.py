"""NaN and infinity as TFLite's reference kernels treat them, for every float lowering.

Halide's float min / max / clamp leave the NaN case to the instruction the target picks (x86's
maxps drops a NaN first operand, ARM's fmax keeps it), its simplifier assumes NaN-free math (a
`select(x > 0, x, a * x)` becomes a max), and its exp polynomial wraps around past float range
(exp(inf) came out 0). TFLite's kernels are plain C++ over IEEE floats, so each construct here says
which C++ expression it stands for and gives its answer for NaN and +-inf:

- an activation clamp is `std::min(std::max(x, lo), hi)`: NaN stays NaN, +-inf becomes the bound,
  and ops with a fused activation clamp even with NONE, to +-FLT_MAX (ActivationFunctionWithMinMax);
- a max / min reduction (MAX_POOL_2D, REDUCE_MAX, softmax's row max) starts at the lowest float and
  keeps the running value when the comparison with a NaN fails: NaNs are skipped;
- exp and log follow std::exp / std::log at the edges (overflow to inf, log of a negative is NaN).

Integer expressions pass through unchanged: only floats have NaN.

Where the target's float min / max instructions already give TFLite's answer, the explicit tests
cost instructions for nothing: ARM's `fmax` / `fmin` return NaN when either operand is NaN and
clamp +-inf like any other value, exactly `std::min(std::max(x, lo), hi)`. A build for such a target
lowers with LoweringOptions.native_minmax, which the functions that clamp take as their
`native_minmax` argument: clamps are then plain min / max, where the tests would cost a few
instructions each (tests/test_special_values.py checks the ARM kernels under qemu).
"""

from __future__ import annotations

from typing import Sequence

import halide as hl
import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)
# The largest float whose expf is finite: std::exp overflows to +inf above it.
EXP_OVERFLOW = float(np.nextafter(np.float32(np.log(FLT_MAX)), np.float32(0)))


def _is_float(e: hl.Expr) -> bool:
    return e.type().is_float()


def is_nan(x: hl.Expr) -> hl.Expr:
    """x != x, tested on the bits: Halide compiles float math with LLVM's no-NaNs flag, under which
    LLVM may fold a float NaN test of a computed value to false. An integer test of the bits it
    cannot see through, and the hardware did carry the NaN."""
    return (hl.reinterpret(hl.UInt(32), x) & hl.u32(0x7FFFFFFF)) > hl.u32(0x7F800000)


def is_inf(x: hl.Expr) -> hl.Expr:
    """+-inf, tested on the bits (as is_nan)."""
    return (hl.reinterpret(hl.UInt(32), x) & hl.u32(0x7FFFFFFF)) == hl.u32(0x7F800000)


def keep_nan(x: hl.Expr, value: hl.Expr) -> hl.Expr:
    """`value`, except NaN where x is NaN (what C++ arithmetic would have carried through)."""
    return hl.select(is_nan(x), x, value) if _is_float(x) else value


def clamp(x: hl.Expr, lo: float, hi: float, *, native_minmax: bool) -> hl.Expr:
    """std::min(std::max(x, lo), hi) with finite bounds: NaN stays NaN, +-inf becomes a bound.

    Written as the C++ is, `(x < lo) ? lo : x`, then `(hi < m) ? hi : m`, in strict float: without
    LLVM's no-NaNs and no-infs flags the two selects keep their operand order and become x86's
    maxps(lo, x) and minps(hi, m), which return their second operand on a NaN: two instructions,
    exact (NaN and infinity tests on the bits took nine, and LLVM may fold such tests of a computed
    value away under those flags)."""
    if native_minmax or not _is_float(x):
        return hl.clamp(x, hl.f32(lo), hl.f32(hi))
    at_lo = hl.select(x < hl.f32(lo), hl.f32(lo), x)
    return hl.strict_float(hl.select(at_lo > hl.f32(hi), hl.f32(hi), at_lo))


def at_least(x: hl.Expr, lo: float, *, native_minmax: bool) -> hl.Expr:
    """`x < lo ? lo : x` (TFLite's RELU): NaN stays NaN, in one maxps(lo, x) (see clamp)."""
    if native_minmax or not _is_float(x):
        return hl.max(x, hl.f32(lo))
    return hl.strict_float(hl.select(x < hl.f32(lo), hl.f32(lo), x))


def greater_of(a: hl.Expr, b: hl.Expr) -> hl.Expr:
    """`a > b ? a : b` (TFLite's MAXIMUM): a NaN on either side gives b."""
    if not _is_float(a):
        return hl.max(a, b)
    return hl.select(is_nan(a) | is_nan(b), b, hl.max(a, b))


def lesser_of(a: hl.Expr, b: hl.Expr) -> hl.Expr:
    """`a < b ? a : b` (TFLite's MINIMUM): a NaN on either side gives b."""
    if not _is_float(a):
        return hl.min(a, b)
    return hl.select(is_nan(a) | is_nan(b), b, hl.min(a, b))


def skip_nan_for_max(v: hl.Expr) -> hl.Expr:
    """A reduction element for a max that skips NaNs (std::max(running, v) keeps `running`)."""
    return hl.select(is_nan(v), hl.f32(-FLT_MAX), v) if _is_float(v) else v


def running_max(running: hl.Expr, v: hl.Expr, inside: hl.Expr | None = None) -> hl.Expr:
    """std::max(running, v) for floats = `(running < v) ? v : running` (NaNs skipped, the earlier
    of equal values kept), taking `v` only where `inside` holds; in strict float, so LLVM does not
    fold it into a max instruction that propagates NaN (see clamp). Two instructions a vector,
    where a NaN test of each value and a max took four."""
    take = running < v if inside is None else inside & (running < v)
    return hl.strict_float(hl.select(take, v, running))


def skip_nan_for_min(v: hl.Expr) -> hl.Expr:
    """A reduction element for a min that skips NaNs."""
    return hl.select(is_nan(v), hl.f32(FLT_MAX), v) if _is_float(v) else v


def lowest_floor(m: hl.Expr) -> hl.Expr:
    """A max reduction's result as TFLite's, which starts from the lowest float, not -inf."""
    return hl.max(m, hl.f32(-FLT_MAX)) if _is_float(m) else m


def highest_ceiling(m: hl.Expr) -> hl.Expr:
    """A min reduction's result as TFLite's, which starts from the largest float, not +inf."""
    return hl.min(m, hl.f32(FLT_MAX)) if _is_float(m) else m


def exp(x: hl.Expr) -> hl.Expr:
    """std::exp: +inf above the overflow point (Halide's polynomial wraps around there), NaN for NaN."""
    inf = hl.f32(float("inf"))
    return keep_nan(x, hl.select(x > hl.f32(EXP_OVERFLOW), inf, hl.exp(hl.min(x, hl.f32(EXP_OVERFLOW)))))


# e^t = 1 + t q(t) on |t| <= ln2 / 2: q's coefficients (constant term first), a least-squares fit of
# the relative error at 2,000 Chebyshev nodes (tests/test_special_values.py checks the result).
_EXP_Q = (0.9999995, 0.49999142, 0.16668114, 0.04189873, 0.00826153)
# (e^t - 1) / t = q(t) on |t| <= ln2 / 2, its constant term 1 exactly (so that expm1 is exact to
# first order near 0): the rest fitted as _EXP_Q, 1.7e-8 relative.
_EXPM1_Q = (1.0, 0.49999997, 0.16666543, 0.041667200, 0.0083665159, 0.0013882496)
# ln 2 in two parts: n * _LN2_HI is exact for |n| <= 126, so t keeps its accuracy without an FMA.
_LN2_HI, _LN2_LO = 0.693145751953125, 1.4286068e-06
# Clamped here, n is -127 and 2^n's bits are all zero: e^x below -87.68 (under half the smallest
# normal float) comes out exactly 0, as std::exp's underflow gives for a masked attention score
# (-1e9), rather than a tiny value whose products downstream are subnormal (a microcode assist per
# instruction on x86: a causal attention's probability x value product took 50x its time).
_EXP_FLOOR = -88.0
# 1.5 * 2^23 + 127: adding it rounds a float in [-126, 0] to an integer n and leaves n + 127 in the
# low bits of the sum (halide_gen.lower.ieee.exp_nonpositive).
_EXP_MAGIC = 12583039.0
_EXP_MAGIC_BITS = int(np.float32(_EXP_MAGIC).view(np.int32))


def exp_nonpositive(x: hl.Expr, *, native_minmax: bool) -> hl.Expr:
    """std::exp for x <= 0 (softmax's shifted values, logistic's -|x|), where it cannot overflow:
    2^n e^t with n = round(x / ln 2) and a degree-5 polynomial for e^t, within 3.8e-7 relative
    over [-87, 0] (measured; hl.exp's range checks and Halide's fast_exp, 1.7e-6, cost more
    instructions: efficientnet_b0's swish is mostly this). Arguments below -87.68 give exactly 0
    (e^x is subnormal there), those between it and -87.34 a subnormal near e^x. NaN gives NaN: the
    floor is `at_least` (NaN stays NaN on x86 too), and the rest is arithmetic on it, so callers
    need no NaN test of their own (efficientnet_b0's swish took 3 instructions a vector for one).

    n is rounded by adding a magic number, 1.5 * 2^23 + 127: float addition rounds to the nearest
    integer (ties to even, as hl.round), the sum's low bits then hold n + 127, and shifted left by
    23 they are 2^n's bits. hl.round and a conversion cost 7 instructions a vector on AVX-512
    (LLVM rounds a 512-bit vector in two 256-bit halves), the magic number an integer subtraction
    and a conversion."""
    return _exp_of_reduced(*_exp_reduced(x, native_minmax))


def exp_between(x: hl.Expr, lo: float, hi: float, *, native_minmax: bool) -> hl.Expr:
    """e^x with x clamped to [lo, hi] (within [-87.3, 88], where e^x is a normal float), as
    exp_nonpositive computes it: within 4e-7 relative; NaN gives NaN."""
    return _exp_of_reduced(*_exp_reduced(x, native_minmax, lo=lo, hi=hi))


def expm1_nonpositive(x: hl.Expr, *, native_minmax: bool) -> hl.Expr:
    """std::expm1 for x <= 0 (ELU's negative side, tanh's e^(-2|x|) - 1): with e^t - 1 = t q(t),
    that alone where n = 0 (|x| <= ln 2 / 2: no subtraction cancels digits there), else
    2^n (1 + t q(t)) - 1, at most -0.29, so the subtraction loses at most two bits. One polynomial
    where a series near 0 beside e^x - 1 elsewhere evaluated both (a select runs every branch in
    vector code). The select, not 2^n (e^t - 1) + (2^n - 1): LLVM reassociates that sum into the
    second form, which near 0 is 0. -inf gives -1, NaN gives NaN, -0 gives +0 (callers keep the
    sign where it matters)."""
    one = hl.f32(1)
    scale, t = _exp_reduced(x, native_minmax)
    em = t * polynomial(_EXPM1_Q, t)
    return hl.select(scale == one, em, scale * (em + one) - one)


def _exp_reduced(x: hl.Expr, native_minmax: bool, lo: float = _EXP_FLOOR,
                 hi: float | None = None) -> tuple[hl.Expr, hl.Expr]:
    """x as 2^n and t = x - n ln 2 (|t| <= ln 2 / 2), n = round(x / ln 2), x raised to `lo` (see
    exp_nonpositive) and lowered to `hi` where one is given (else x <= 0)."""
    f = hl.f32
    if hi is None:
        z = at_least(x, lo, native_minmax=native_minmax)
    else:
        z = clamp(x, lo, hi, native_minmax=native_minmax)
    shifted = z * f(1 / np.log(2)) + f(_EXP_MAGIC)
    bits = hl.reinterpret(hl.Int(32), shifted)
    # n from the bits (a float subtraction of the magic number the simplifier would cancel).
    n = hl.cast(hl.Float(32), bits - hl.i32(_EXP_MAGIC_BITS))
    t = (z - n * f(_LN2_HI)) - n * f(_LN2_LO)
    return hl.reinterpret(hl.Float(32), bits << 23), t


def _exp_of_reduced(scale: hl.Expr, t: hl.Expr) -> hl.Expr:
    """2^n e^t from _exp_reduced's 2^n and t."""
    return scale + (scale * t) * polynomial(_EXP_Q, t)


def polynomial(coefficients: Sequence[float], s: hl.Expr) -> hl.Expr:
    """Horner's rule, constant term first; a leading coefficient of 1 costs no multiply (NEON's
    multiply-add overwrites its addend, so every other step is a copy of the constant and an fmla)."""
    *rest, lead = coefficients
    value = s + hl.f32(rest[-1]) if lead == 1 else hl.f32(lead) * s + hl.f32(rest[-1])
    for c in reversed(rest[:-1]):
        value = value * s + hl.f32(c)
    return value


def tanh(x: hl.Expr, *, native_minmax: bool) -> hl.Expr:
    """std::tanh in vector code (hl.tanh is a call of the C library's tanhf per lane): with
    e = expm1(-2|x|), tanh |x| = -e / (2 + e), which loses no digits near 0, and x's sign put back
    bitwise. +-inf gives +-1, +-0 gives +-0, NaN gives NaN."""
    e = expm1_nonpositive(hl.f32(-2) * hl.abs(x), native_minmax=native_minmax)
    magnitude = hl.reinterpret(hl.UInt(32), -e / (hl.f32(2) + e)) & hl.u32(0x7FFFFFFF)
    sign = hl.reinterpret(hl.UInt(32), x) & hl.u32(0x80000000)
    return hl.reinterpret(hl.Float(32), magnitude | sign)


def log(x: hl.Expr) -> hl.Expr:
    """std::log: NaN below 0 and for NaN, -inf at 0, +inf at +inf, and right for subnormals, which
    Halide's polynomial (it reads the exponent field) takes for 2^-126."""
    inf = hl.f32(float("inf"))
    subnormal = x < hl.f32(np.finfo(np.float32).tiny)
    scaled = hl.log(hl.select(subnormal, x * hl.f32(2.0**24), x)) - hl.select(subnormal, hl.f32(24 * np.log(2)), 0)
    return keep_nan(x, hl.select(x < 0, hl.f32(float("nan")), x == 0, -inf, is_inf(x), inf, scaled))


def pow(x: hl.Expr, y: hl.Expr) -> hl.Expr:  # noqa: A001 - it is std::pow
    """std::pow with C's special cases (C11 Annex F.10.4.4): pow(x, +-0) and pow(1, y) are 1 even
    for NaN, a negative base needs an integer exponent (its parity gives the sign), zero and
    infinite operands give 0 or inf by the sign of the exponent and |x| against 1, and a result
    past float range is inf or 0 (Halide's exp2 of the log wraps around there)."""
    f = hl.f32
    inf, nan = f(float("inf")), f(float("nan"))
    ax = hl.abs(x)
    integer = hl.floor(y) == y
    odd = integer & (hl.abs(y) < f(2.0**24)) & (hl.floor(y * f(0.5)) * f(2) != y)
    sign = hl.select(odd & (x < 0), f(-1), f(1))
    log_result = y * log(ax)
    subnormal = ax < f(np.finfo(np.float32).tiny)  # Halide's pow reads the exponent field, as its log does
    magnitude = hl.select(log_result > f(EXP_OVERFLOW), inf, log_result < f(-104), f(0),
                          subnormal, exp(log_result), hl.pow(ax, y))
    return hl.strict_float(hl.select(
        y == 0, f(1),
        x == 1, f(1),
        is_nan(x) | is_nan(y), nan,
        is_inf(y), hl.select(ax == 1, f(1), (ax < 1) == (y < 0), inf, f(0)),
        x == 0, sign * hl.select(y < 0, inf, f(0)),
        is_inf(x), sign * hl.select(y < 0, f(0), inf),
        (x < 0) & ~integer, nan,
        sign * magnitude))
