"""Elementwise lowerings: arithmetic, activations, math functions, comparisons, logic, casts.

Binary ops broadcast as TFLite does (NumPy rules); a fused activation is applied to the result.
Formulas follow TFLite's reference kernels so results agree to float32 rounding.
"""

from __future__ import annotations

import math

import halide as hl

from ..values import FLOAT16_MAX, Value, narrow, read_broadcast
from . import half_math, ieee
from .half_math import half
from .registry import LoweringError, OpContext, register

SQRT1_2 = 1.0 / math.sqrt(2.0)


# A fused activation as the clamp range TFLite's float kernels apply (CalculateActivationRange).
ACTIVATION_RANGES = {"NONE": (-ieee.FLT_MAX, ieee.FLT_MAX), "RELU": (0.0, ieee.FLT_MAX), "RELU6": (0.0, 6.0),
                     "RELU_N1_TO_1": (-1.0, 1.0)}


def activation(expr: hl.Expr, name: str | None, native_minmax: bool, clamps_none: bool = True) -> hl.Expr:
    """A TFLite fused activation (`RELU`, `RELU6`, `RELU_N1_TO_1`) on `expr`, in the target's clamp
    form (`native_minmax`: LoweringOptions).

    Float kernels clamp every result to the activation's range with std::min / std::max, NONE
    included (to +-FLT_MAX): NaN passes, +-inf becomes the bound (halide_gen.lower.ieee). Ops whose
    kernels apply no clamp for NONE say `clamps_none=False`.

    TANH and SIGN_BIT exist in the schema, but TFLite's float kernels turn a fused activation into
    a clamp range and silently ignore those two; rather than copy that, such ops are not claimed.
    """
    name = name or "NONE"
    if name not in ACTIVATION_RANGES:
        raise LoweringError(f"fused activation {name} (TFLite kernels ignore it)")
    if name == "NONE" and (not clamps_none or not expr.type().is_float()):
        return expr
    lo, hi = ACTIVATION_RANGES[name]
    if expr.type().is_float():
        return ieee.clamp(expr, lo, hi, native_minmax=native_minmax)
    if name == "RELU":
        return hl.max(expr, hl.cast(expr.type(), 0))
    return hl.clamp(expr, hl.cast(expr.type(), lo), hl.cast(expr.type(), hi))


def activation_in_half(expr: hl.Expr, name: str | None) -> hl.Expr:
    """A fused activation on a half-precision result, computed in it: a clamp to bounds fp16 holds
    exactly (TFLite's +-FLT_MAX become fp16's +-65504, which storing saturates to anyway), so the
    same values as widened to float32, clamped and rounded back, without the two conversions."""
    if (name or "NONE") not in ACTIVATION_RANGES:
        return activation(expr, name, native_minmax=True)  # refused there, with the reason
    lo, hi = ACTIVATION_RANGES[name or "NONE"]
    return hl.clamp(expr, hl.cast(expr.type(), max(lo, -FLOAT16_MAX)), hl.cast(expr.type(), min(hi, FLOAT16_MAX)))


def as_bool(expr: hl.Expr) -> hl.Expr:
    """A stored BOOL (uint8 0/1) or any number as a Halide condition."""
    return expr if expr.type().is_bool() else expr != hl.cast(expr.type(), 0)


def store_bool(cond: hl.Expr) -> hl.Expr:
    """A condition as TFLite's BOOL storage (uint8 0/1)."""
    return hl.cast(hl.UInt(8), cond)


def logistic(x: hl.Expr, native_minmax: bool) -> hl.Expr:
    """1 / (1 + e^-x), with TFLite's reference kernel's cut-off below -9 (e^x there; NaN stays NaN).

    One exponential, of -|x| (in (0, 1]: it cannot overflow), serves both signs: 1 / (1 + t) for
    x >= 0 and t / (1 + t) = e^x / (1 + e^x) below, the reference's 1 / (1 + e^-x) rewritten
    (a rounding apart). A select evaluates every branch in vector code, so the reference's form
    cost two exponentials. The reference's other cut-off, 1 above 16.619047, needs no test: there
    1 / (1 + t) is 1 or the float below it (t < 6.1e-8)."""
    one = hl.f32(1)
    t = ieee.exp_nonpositive(-hl.abs(x), native_minmax=native_minmax)
    # NaN: t is NaN (ieee.exp_nonpositive), both comparisons false, t / (1 + t) NaN.
    return hl.select(x < hl.f32(-9), t, hl.select(x >= 0, one, t) / (one + t))


# erf(x) = x P(x^2) / Q(x^2) on |x| <= 3.92 (erf is 1 in float beyond): coefficients constant term
# first, fitted here by iterated weighted least squares; 8.3e-7 absolute in float32 (measured).
_ERF_P = (1.1283784, 0.36864498, 0.07283643, 0.01041831, 0.00026450827, -1.5147338e-06)
_ERF_Q = (1.0, 0.6600245, 0.18461128, 0.02847492, 0.0024554112)
_ERF_EDGE = 3.92


def erf(x: hl.Expr, scale: float, native_minmax: bool) -> hl.Expr:
    """erf(scale * x) as a rational function: 10 multiply-adds and a division, where hl.erf
    spent about twice that (bert_small's GELU blocks). `scale` is folded into the coefficients
    (no multiply), and both polynomials are divided by Q's leading one (its first step an add).
    NaN stays NaN (ieee.clamp), so a caller needs no NaN test of its own."""
    edge = _ERF_EDGE / scale
    lead = _ERF_Q[-1] * scale ** (2 * len(_ERF_Q) - 2)
    p = [c * scale ** (2 * k + 1) / lead for k, c in enumerate(_ERF_P)]
    q = [c * scale ** (2 * k) / lead for k, c in enumerate(_ERF_Q)]
    z = ieee.clamp(x, -edge, edge, native_minmax=native_minmax)
    s = z * z
    return z * ieee.polynomial(p, s) / ieee.polynomial(q, s)


def gelu(x: hl.Expr, approximate: bool, native_minmax: bool) -> hl.Expr:
    """GELU: the erf form, or the tanh approximation when `approximate`."""
    if approximate:
        return _gelu_tanh(x, native_minmax)
    # NaN carries through erf and the products: no test of x (3 instructions a vector on NEON).
    return hl.f32(0.5) * x * (hl.f32(1) + erf(x, SQRT1_2, native_minmax))


def _gelu_tanh(x: hl.Expr, native_minmax: bool) -> hl.Expr:
    """The reference's 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), as x / (1 + e^-2u):
    one exponential and one division, where the reference's form adds tanh's sign and sums (an
    epilogue's cost after a matrix product: bench/RESULTS.md, "What an activation after a matrix
    product costs"). More accurate where 1 + tanh(u) cancels.

    e^-2u is (e^-u)^2, e^-u kept finite and normal (-u in [-43, 45]): the square is +inf where
    e^-2u overflows, so x = -inf gives NaN (-inf / +inf) and a large negative x -0, as the
    reference's, without a select; 2^128 as the exponential's scale (+inf) would give NaN for finite
    x once LLVM distributes 2^n (1 + t q) into 2^n + 2^n t q. Near +inf the square stays normal: 1 + it
    is 1, and x / 1 is x, +inf included."""
    a = math.sqrt(2.0 / math.pi)
    minus_u = x * (hl.f32(-a) + hl.f32(-a * 0.044715) * x * x)
    e = ieee.exp_between(minus_u, -43.0, 45.0, native_minmax=native_minmax)
    return x / (hl.f32(1) + e * e)


def round_half_away(x: hl.Expr) -> hl.Expr:
    """std::round (TfLiteRound): halves away from zero, unlike Halide's round-half-even. From the
    exact fraction x - trunc(x): floor(x + 0.5) rounds 0.49999997 up, as the sum rounds to 1."""
    whole = hl.trunc(x)
    half = hl.cast(x.type(), 0.5)
    away = hl.select(x < 0, hl.cast(x.type(), -1), hl.cast(x.type(), 1))
    return hl.select(hl.abs(x - whole) >= half, whole + away, whole)


UNARY = {
    "ABS": hl.abs,
    "NEG": lambda x: -x,
    "EXP": ieee.exp,
    "LOG": ieee.log,
    "SQRT": hl.sqrt,
    "RSQRT": lambda x: hl.f32(1) / hl.sqrt(x),
    "SQUARE": lambda x: x * x,
    "SIN": hl.sin,
    "COS": hl.cos,
    "FLOOR": hl.floor,
    "CEIL": hl.ceil,
    "ROUND": hl.round,  # TFLite ROUND rounds half to even, as Halide does
    # In TFLite's order: x * 6 overflows to inf before the scaling for huge x. Scaled by 1/6 as
    # TFLite's NEON kernel does (its scalar loop divides; the two differ by at most an ulp): a
    # division is a 16-cycle instruction per AVX-512 vector.
    "HARD_SWISH": lambda x: hl.strict_float(x * hl.clamp(x + hl.f32(3), hl.f32(0), hl.f32(6)) * hl.f32(1.0 / 6.0)),
}

# The unary ops that clamp, in the target's clamp form: functions of x and native_minmax.
CLAMPING_UNARY = {
    "LOGISTIC": logistic,
    "TANH": lambda x, native_minmax: ieee.tanh(x, native_minmax=native_minmax),
    # TFLite: x < 0 ? expm1(x) : x (NaN and -0 pass).
    "ELU": lambda x, native_minmax: hl.select(x < 0, ieee.expm1_nonpositive(x, native_minmax=native_minmax), x),
    # No upper bound: +inf stays +inf, as in TFLite.
    "RELU": lambda x, native_minmax: ieee.at_least(x, 0, native_minmax=native_minmax),
    "RELU6": lambda x, native_minmax: ieee.clamp(x, 0, 6, native_minmax=native_minmax),
    "RELU_N1_TO_1": lambda x, native_minmax: ieee.clamp(x, -1, 1, native_minmax=native_minmax),
}


# Ops computed in half precision where the target computes in it (LoweringOptions.half_arithmetic),
# on 8 lanes a NEON register as XNNPACK's fp16 kernels compute them. +, -, * and / round to fp16 as
# the float32 result rounded to fp16 would (from float32's 24 significant bits, 2 x 11 + 2, double
# rounding is innocuous), clamps and sign changes are exact; HARD_SWISH and SQUARED_DIFFERENCE round
# up to four times. Each result saturates at +-65504, as storing a float32 one does (values.narrow).
# LOGISTIC has an fp16 polynomial of its own (half_math); the other transcendental ops compute in
# float32 on widened values, rounded once when stored.
HALF_BINARY = frozenset({"ADD", "SUB", "MUL", "DIV", "SQUARED_DIFFERENCE"})
HALF_UNARY = {
    "ABS": hl.abs,
    "NEG": lambda x: -x,
    "SQUARE": lambda x: activation_in_half(x * x, None),
    # x / 6 first, as XNNPACK's fp16 kernel takes it: x * 6 overflows fp16 from x = 10923.
    "HARD_SWISH": lambda x: activation_in_half(hl.strict_float(
        x * half(1.0 / 6.0) * hl.clamp(x + half(3), half(0), half(6))), None),
    "RELU": lambda x: activation_in_half(x, "RELU"),
    "RELU6": lambda x: activation_in_half(x, "RELU6"),
    "RELU_N1_TO_1": lambda x: activation_in_half(x, "RELU_N1_TO_1"),
    "LOGISTIC": half_math.logistic,
}

# The most |result| of HALF_UNARY ops can be, where it is small (Value.magnitude).
HALF_MAGNITUDES = {"LOGISTIC": 1.0}


def float_result_in_half(ctx: OpContext) -> bool:
    """Whether the target computes in half precision and the op's result is a float one it may
    compute so (not one that stays float32: OpContext.float32_results)."""
    return ctx.options.half_arithmetic and ctx.op.outputs[0].type_name == "FLOAT32" and not ctx.float32_results


def computes_in_half(ctx: OpContext) -> bool:
    """Whether the op's float result is computed in half precision (HALF_BINARY, HALF_UNARY)."""
    return float_result_in_half(ctx) and (ctx.op.name in HALF_BINARY or ctx.op.name in HALF_UNARY)


def half_operand(ctx: OpContext, i: int) -> Value:
    """Input `i` as an op computing in half precision reads it (read it with `half_at`): a float32
    constant is passed in fp16; what the block computes is fp16 already; a float32 block input is
    converted where it is read."""
    t = ctx.op.inputs[i]
    if t is not None and t.is_constant and t.type_name == "FLOAT32":
        return ctx.value_of(t, None, half=True)
    return ctx.value(i)


def half_at(value: Value, shape, index) -> hl.Expr:
    """`value` (a half_operand) at an output index of `shape`, broadcast, in half precision."""
    v = read_broadcast(value, shape, index, stored=True)
    return v if v.type() == hl.Float(16) else narrow(v, hl.Float(16))


@register(*UNARY, *CLAMPING_UNARY)
def lower_unary(ctx: OpContext) -> list[Value]:
    """One input, one output of the same shape."""
    if computes_in_half(ctx):
        x, shape, fn = half_operand(ctx, 0), ctx.out_shape(), HALF_UNARY[ctx.op.name]
        result = ctx.define(ctx.func_name(), shape, lambda *i: fn(half_at(x, shape, i)))
        result.magnitude = HALF_MAGNITUDES.get(ctx.op.name)
        return [result]
    x = ctx.value(0)
    if ctx.op.name in CLAMPING_UNARY:
        clamping, native_minmax = CLAMPING_UNARY[ctx.op.name], ctx.options.native_minmax
        fn = lambda v: clamping(v, native_minmax)  # noqa: E731
    elif ctx.op.name == "ABS" and x.type.is_int():
        fn = lambda v: hl.cast(v.type(), hl.abs(v))  # noqa: E731 - Halide's abs of int is unsigned
    else:
        fn = UNARY[ctx.op.name]
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: fn(x(*i)))]


@register("GELU")
def lower_gelu(ctx: OpContext) -> list[Value]:
    """GELU with its `approximate` option; the tanh form in half precision where the target computes
    in it (half_math.gelu_tanh). The erf form stays float32: 1 + erf(x / sqrt 2) cancels for x < 0,
    where an fp16 erf's error would be the result's."""
    approximate = bool(ctx.option("approximate", False))
    if approximate and float_result_in_half(ctx):
        x, shape = half_operand(ctx, 0), ctx.out_shape()
        return [ctx.define(ctx.func_name(), shape, lambda *i: half_math.gelu_tanh(half_at(x, shape, i)))]
    x = ctx.value(0)
    native = ctx.options.native_minmax
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: gelu(x(*i), approximate, native))]


@register("LEAKY_RELU")
def lower_leaky_relu(ctx: OpContext) -> list[Value]:
    """x if x > 0 else alpha * x."""
    x = ctx.value(0)
    alpha = hl.f32(float(ctx.option("alpha", 0.2)))
    # NaN fails x > 0 and alpha * NaN is NaN (strict: never folded), so no NaN test is needed.
    return [ctx.define(ctx.func_name(), ctx.out_shape(),
                       lambda *i: hl.select(x(*i) > 0, x(*i), hl.strict_float(alpha * x(*i))))]


@register("PRELU")
def lower_prelu(ctx: OpContext) -> list[Value]:
    """x if x >= 0 else alpha * x, alpha broadcast against x."""
    x, alpha = ctx.value(0), ctx.value(1)
    shape = ctx.out_shape()

    def body(*i):
        v = read_broadcast(x, shape, i)
        # strict: a zero alpha times -inf is NaN in TFLite, not the 0 Halide's simplifier folds it to;
        # and NaN fails v >= 0, then alpha * NaN is NaN: no NaN test of v is needed.
        return hl.select(v >= 0, v, hl.strict_float(read_broadcast(alpha, shape, i) * v))

    return [ctx.define(ctx.func_name(), shape, body)]


def _divide(a: hl.Expr, b: hl.Expr) -> hl.Expr:
    if a.type().is_float():
        return a / b
    raise LoweringError("integer DIV")


BINARY = {
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
    "MUL": lambda a, b: a * b,
    "DIV": _divide,
    "MAXIMUM": ieee.greater_of,
    "MINIMUM": ieee.lesser_of,
    "POW": ieee.pow,
    "SQUARED_DIFFERENCE": lambda a, b: (a - b) * (a - b),
}

# The binary ops whose TFLite kernels clamp to the activation range (+-FLT_MAX for NONE).
CLAMPED_BINARY = frozenset({"ADD", "SUB", "MUL", "DIV"})

COMPARE = {
    "LESS": lambda a, b: a < b,
    "LESS_EQUAL": lambda a, b: a <= b,
    "GREATER": lambda a, b: a > b,
    "GREATER_EQUAL": lambda a, b: a >= b,
    "EQUAL": lambda a, b: a == b,
    "NOT_EQUAL": lambda a, b: a != b,
}

LOGICAL = {
    "LOGICAL_AND": lambda a, b: a & b,
    "LOGICAL_OR": lambda a, b: a | b,
}


@register(*BINARY)
def lower_binary(ctx: OpContext) -> list[Value]:
    """Broadcasting arithmetic with the fused activation applied."""
    shape, fn, act = ctx.out_shape(), BINARY[ctx.op.name], ctx.op.fused_activation
    if computes_in_half(ctx):
        a, b = half_operand(ctx, 0), half_operand(ctx, 1)
        # A product with a factor of at most 1 (swish's sigmoid) stays within fp16's range.
        bounded = ctx.op.name == "MUL" and (act or "NONE") == "NONE" and min(
            v.magnitude if v.magnitude is not None else math.inf for v in (a, b)) <= 1
        finish = (lambda r: r) if bounded else (lambda r: activation_in_half(r, act))
        return [ctx.define(ctx.func_name(), shape, lambda *i: finish(fn(half_at(a, shape, i), half_at(b, shape, i))))]
    a, b = ctx.value(0), ctx.value(1)
    clamps = ctx.op.name in CLAMPED_BINARY
    return [ctx.define(ctx.func_name(), shape, lambda *i: activation(
        fn(read_broadcast(a, shape, i), read_broadcast(b, shape, i)), act, ctx.options.native_minmax,
        clamps_none=clamps))]


@register(*COMPARE)
def lower_compare(ctx: OpContext) -> list[Value]:
    """Broadcasting comparisons, stored as BOOL."""
    a, b = ctx.value(0), ctx.value(1)
    shape, fn = ctx.out_shape(), COMPARE[ctx.op.name]
    return [ctx.define(ctx.func_name(), shape,
                       lambda *i: store_bool(fn(read_broadcast(a, shape, i), read_broadcast(b, shape, i))))]


@register(*LOGICAL)
def lower_logical(ctx: OpContext) -> list[Value]:
    """Broadcasting AND / OR of BOOL tensors."""
    a, b = ctx.value(0), ctx.value(1)
    shape, fn = ctx.out_shape(), LOGICAL[ctx.op.name]
    return [ctx.define(ctx.func_name(), shape, lambda *i: store_bool(
        fn(as_bool(read_broadcast(a, shape, i)), as_bool(read_broadcast(b, shape, i)))))]


@register("LOGICAL_NOT")
def lower_logical_not(ctx: OpContext) -> list[Value]:
    """NOT of a BOOL tensor."""
    x = ctx.value(0)
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: store_bool(~as_bool(x(*i))))]


@register("SELECT", "SELECT_V2")
def lower_select(ctx: OpContext) -> list[Value]:
    """cond ? x : y with broadcasting (SELECT_V2; SELECT's rank-1 condition picks whole rows)."""
    cond, x, y = ctx.value(0), ctx.value(1), ctx.value(2)
    shape = ctx.out_shape()

    def pick(*i):
        if ctx.op.name == "SELECT" and cond.rank == 1 and len(shape) > 1:
            c = cond(i[0])  # TF1 select: a vector condition chooses along the first axis
        else:
            c = read_broadcast(cond, shape, i)
        return hl.select(as_bool(c), read_broadcast(x, shape, i), read_broadcast(y, shape, i))

    return [ctx.define(ctx.func_name(), shape, pick)]


@register("CAST")
def lower_cast(ctx: OpContext) -> list[Value]:
    """Type conversion: float to int truncates toward zero; to BOOL is `!= 0`."""
    x = ctx.value(0)
    target, out = ctx.out_type(), ctx.op.outputs[0]

    def convert(*i):
        v = x(*i)
        if out.type_name == "BOOL":
            return store_bool(as_bool(v))
        return hl.cast(target, v)

    return [ctx.define(ctx.func_name(), ctx.out_shape(), convert)]


def _per_axis(ctx: OpContext, t_index: int, field_name: str):
    """Scale or zero point of a tensor's quantization as a function of an output index."""
    t = ctx.op.inputs[t_index] if field_name == "in" else ctx.op.outputs[0]
    q = t.quantization
    if q is None or q.scale is None or not len(q.scale):
        raise LoweringError(f"{ctx.op.name}: {t.name!r} has no quantization")
    scales = [float(s) for s in q.scale]
    zps = [int(z) for z in (q.zero_point if q.zero_point is not None else [0] * len(scales))]
    if len(scales) == 1:
        return (lambda i: hl.f32(scales[0])), (lambda i: hl.i32(zps[0]))
    axis = q.quantized_dimension

    def table(values, make):
        def at(i):
            expr = make(values[-1])
            for k in range(len(values) - 2, -1, -1):
                expr = hl.select(i[axis] == k, make(values[k]), expr)
            return expr
        return at

    return table(scales, hl.f32), table(zps, hl.i32)


@register("DEQUANTIZE")
def lower_dequantize(ctx: OpContext) -> list[Value]:
    """(q - zero_point) * scale, per tensor or per channel; FLOAT16 inputs are widened."""
    x = ctx.value(0)
    if ctx.op.inputs[0].type_name == "FLOAT16":
        return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: hl.cast(hl.Float(32), x(*i)))]
    scale, zp = _per_axis(ctx, 0, "in")
    return [ctx.define(ctx.func_name(), ctx.out_shape(),
                       lambda *i: hl.cast(hl.Float(32), hl.cast(hl.Int(32), x(*i)) - zp(i)) * scale(i))]


@register("QUANTIZE")
def lower_quantize(ctx: OpContext) -> list[Value]:
    """round(x / scale) + zero_point, clamped to the output type (TFLite rounds halves away from 0)."""
    if not ctx.op.inputs[0].type_name == "FLOAT32":
        raise LoweringError("QUANTIZE from an integer type (requantize)")
    x = ctx.value(0)
    scale, zp = _per_axis(ctx, 0, "out")
    target = ctx.out_type()

    def body(*i):
        q = hl.cast(hl.Int(32), round_half_away(x(*i) / scale(i))) + zp(i)
        return hl.cast(target, hl.clamp(q, target.min(), target.max()))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]

