"""Reductions and normalisations: MEAN, SUM, REDUCE_*, SOFTMAX, LOG_SOFTMAX, L2_NORMALIZATION, ARG_*.

Softmax and log-softmax subtract the row maximum first (numerically stable, as TFLite does).
"""

from __future__ import annotations

import halide as hl
import numpy as np

from ..values import Value, dim_vars, narrow
from . import half_math, ieee
from .elementwise import half_at
from .registry import (AccumulatorKind, LoweringError, OpContext, ReductionDomain, RowReduction, accumulate, read,
                       register)


def reduction_axes(ctx: OpContext, index: int, rank: int) -> list[int]:
    """The constant axes of input `index`, non-negative and sorted."""
    axes = sorted({int(a) % rank for a in np.atleast_1d(ctx.const(index))})
    return axes


def reduction_domain(ctx: OpContext, x: Value, axes: list[int], name: str):
    """An RDom over `axes` and a function mapping an output index to the input index."""
    r = ReductionDomain([x.shape[a] for a in axes], name)
    out_rank = len(ctx.out_shape())
    keep = out_rank == x.rank

    def source(i):
        idx, k, j = [], 0, 0
        for a in range(x.rank):
            if a in axes:
                idx.append(r[k])
                k += 1
                if keep:
                    j += 1
            else:
                idx.append(i[j])
                j += 1
        return idx

    return r, source


def _max_skipping_nan(e: hl.Expr) -> hl.Expr:
    """TFLite's REDUCE_MAX: `in > current ? in : current` from the lowest float (NaNs skipped)."""
    return ieee.lowest_floor(hl.maximum(ieee.skip_nan_for_max(e)))


def _min_skipping_nan(e: hl.Expr) -> hl.Expr:
    """TFLite's REDUCE_MIN: `in < current ? in : current` from the largest float."""
    return ieee.highest_ceiling(hl.minimum(ieee.skip_nan_for_min(e)))


REDUCERS = {
    "SUM": hl.sum,
    "MEAN": hl.sum,
    "REDUCE_MAX": _max_skipping_nan,
    "REDUCE_MIN": _min_skipping_nan,
    "REDUCE_PROD": hl.product,
}


# Innermost-axis reductions of at least two vectors run as PARTIAL-wide partial results first:
# lane k folds elements k, k+16, k+32, ... (vectorizable), then the 16 lanes and the row's last
# depth % 16 elements fold into one: a row folded one element at a time is a serial chain of adds
# that no vector shortens (a ViT's softmax over 197 tokens, TinyBERT's LayerNorm over 312).
PARTIAL = 16


# Reducers that fold in a tree of pairs: a row's last stages take log2(terms) dependent
# operations, not one per term (a [128, 576] RMSNorm's rows each waited on 16 dependent adds), and
# the row's whole vectors past its last step fold as vectors.
PAIRWISE = {hl.sum: lambda a, b: a + b, hl.maximum: hl.max, hl.minimum: hl.min, hl.product: lambda a, b: a * b}


def partial_groups(depth: int, most: int, pairwise: bool = True) -> int:
    """How many PARTIAL-wide partials a float row reduction over `depth` keeps apart (up to `most`,
    LoweringOptions.row_partials): each is a chain of its own, two vectors long at least. A reducer
    that does not fold in pairs also keeps the row's tail under PARTIAL elements (it folds them one
    at a time: 312 = 19 x 16 + 8 keeps one partial, where 4 would leave 56)."""
    return next((g for g in (4, 2) if g <= most and depth // (PARTIAL * g) >= 2
                 and (pairwise or depth % (PARTIAL * g) == depth % PARTIAL)), 1)


def pairwise(terms: list[hl.Expr], combine) -> hl.Expr:
    """`terms` folded by `combine` in pairs, level by level."""
    while len(terms) > 1:
        paired = [combine(a, b) for a, b in zip(terms[::2], terms[1::2])]
        terms = paired + terms[len(paired) * 2:]
    return terms[0]


def row_reduce(ctx: OpContext, name: str, rows: tuple[int, ...], depth: int, element, reducer) -> Value:
    """reducer over k < depth of element(row_index, k), for every row; shape `rows + (1,)`.

    `element(row, k)` gives the k-th value of a row (row: TFLite-order index without the last axis).
    A float row may keep several partials apart (partial_groups), folded into PARTIAL lanes before
    the lanes fold: one vector's chain of adds waits on its own latency, each step (a [128, 576]
    RMSNorm took 1.4x XNNPACK's time on x86). Sums, maxima, minima and products fold their last
    stages in pairs (PAIRWISE); other reducers (REDUCE_MAX's NaN-skipping one) one term at a time.
    """
    shape = tuple(rows) + (1,)
    combine = PAIRWISE.get(reducer)
    if depth < 2 * PARTIAL and combine is not None:
        terms = lambda row: [element(row, hl.Expr(k)) for k in range(depth)]  # noqa: E731
        return ctx.define(ctx.func_name(name), shape, lambda *i: pairwise(terms(list(i[:-1])), combine), exact=True)
    if depth < 2 * PARTIAL:
        r = ReductionDomain([depth], ctx.func_name(name + "_r"))
        return ctx.define(ctx.func_name(name), shape, lambda *i: reducer(element(list(i[:-1]), r[0])), exact=True)
    floats = element([hl.Expr(0)] * len(rows), hl.Expr(0)).type().is_float()
    groups = partial_groups(depth, ctx.options.row_partials, combine is not None) if floats else 1
    width = PARTIAL * groups
    steps = depth // width
    vectors, tail = divmod(depth - steps * width, PARTIAL)  # past the last step: whole vectors, then single elements
    outer = ReductionDomain([steps], ctx.func_name(name + "_ro"))
    partial = ctx.define(ctx.func_name(name + "_partial"), tuple(rows) + (width,),
                         lambda *i: reducer(element(list(i[:-1]), outer[0] * width + i[-1])), exact=True)
    ctx.materialize.append(partial)
    wide = partial
    if combine is not None and groups + vectors > 1:
        def lane(*i):
            row, k = list(i[:-1]), i[-1]
            return pairwise([wide.at(row + [g * PARTIAL + k]) for g in range(groups)]
                            + [element(row, steps * width + v * PARTIAL + k) for v in range(vectors)], combine)

        partial = ctx.define(ctx.func_name(name + "_lanes"), tuple(rows) + (PARTIAL,), lane, exact=True)
        ctx.materialize.append(partial)
    elif groups > 1:
        group = ReductionDomain([groups], ctx.func_name(name + "_rg"))
        partial = ctx.define(ctx.func_name(name + "_lanes"), tuple(rows) + (PARTIAL,),
                             lambda *i: reducer(partial.at(list(i[:-1]) + [group[0] * PARTIAL + i[-1]])), exact=True)
        ctx.materialize.append(partial)
    lanes = ReductionDomain([PARTIAL + tail], ctx.func_name(name + "_rl"))
    first = steps * width + vectors * PARTIAL  # the row's single elements start here

    def fold(*i):
        row, k = list(i[:-1]), lanes[0]
        if combine is not None:
            return pairwise([partial.at(row + [j]) for j in range(PARTIAL)]
                            + [element(row, hl.Expr(first + j)) for j in range(tail)], combine)
        if not tail:
            return reducer(partial.at(row + [k]))
        # The lanes, then the tail's elements; both sides clamped in range (a select reads both).
        last = element(row, first + hl.max(k - PARTIAL, 0))
        return reducer(hl.select(k < PARTIAL, partial.at(row + [hl.min(k, PARTIAL - 1)]), last))

    total = ctx.define(ctx.func_name(name), shape, fold, exact=True)
    # The wide partials, for the schedules to compute as one vector: one loop keeping `groups`
    # chains apart, not a loop per group.
    ctx.row_reductions.append(RowReduction(wide, total, steps))
    return total


@register(*REDUCERS, compile_time=(1,))
def lower_reduce(ctx: OpContext) -> list[Value]:
    """Reduce over the constant axes (negative allowed), keep_dims or not; MEAN divides the sum."""
    x = ctx.value(0)
    axes = reduction_axes(ctx, 1, x.rank)
    reducer = REDUCERS[ctx.op.name]
    count = int(np.prod([x.shape[a] for a in axes]))
    out = ctx.out_shape()

    def finish(total: hl.Expr) -> hl.Expr:
        if ctx.op.name == "MEAN":
            return total / hl.cast(total.type(), count) if total.type().is_float() else total / count
        return total

    if axes == [x.rank - 1] and x.rank > 1:
        total = row_reduce(ctx, "total", x.shape[:-1], x.shape[-1], lambda row, k: x.at(row + [k]), reducer)
        ctx.materialize.append(total)
        keep = len(out) == x.rank
        return [ctx.define(ctx.func_name(), out,
                           lambda *i: finish(total.at((list(i[:-1]) if keep else list(i)) + [hl.Expr(0)])))]
    r, source = reduction_domain(ctx, x, axes, ctx.func_name("r"))
    if ctx.op.name in ("SUM", "MEAN") and x.rank - 1 not in axes and x.type.is_float():
        # Over outer axes (global average pooling): an explicit accumulator a schedule vectorizes
        # along the innermost, untouched axis.
        acc = accumulate(ctx, out, lambda *i: hl.f32(0), lambda *i: x.at(source(i)), AccumulatorKind.REDUCE, r)
        return [ctx.define(ctx.func_name(), out, lambda *i: finish(read(acc, i)))]
    return [ctx.define(ctx.func_name(), out, lambda *i: finish(reducer(x.at(source(i)))))]


def _row_max(ctx: OpContext, x: Value) -> Value:
    """The max over the last axis, for subtracting before exp. TFLite's skips NaNs; here a NaN
    may win or not, and either way the row comes out NaN as the reference's does: a NaN in the
    max makes every shifted value NaN, and a NaN the max skipped reaches the row's sum through exp
    (as does +inf, through inf - inf). So a plain max, without the per-element NaN test."""
    row_max = row_reduce(ctx, "max", x.shape[:-1], x.shape[-1], lambda row, k: x.at(row + [k]), hl.maximum)
    ctx.materialize.append(row_max)
    return row_max


def _shifted_exp(beta: float, native_minmax: bool):
    """exp(beta * (v - max)): at most 1 for beta >= 0 (the converter's softmax), so the cheaper
    non-positive exponential serves; any other beta takes the full one. NaN stays NaN."""
    if beta >= 0:
        return lambda v: ieee.exp_nonpositive(v, native_minmax=native_minmax)
    return ieee.exp


@register("SOFTMAX")
def lower_softmax(ctx: OpContext) -> list[Value]:
    """exp(beta * (x - max)) / sum over the last axis; each exponential computed once, kept for the
    sum and the scaling (as XNNPACK does), not computed again for the output. Scaled by 1 / sum, as
    LiteRT's optimized kernel does (its reference one divides: they differ by an ulp or two): one
    division per row instead of one per element, a 16-cycle instruction per AVX-512 vector."""
    x = ctx.value(0)
    beta = float(ctx.option("beta", 1.0))
    row_max = _row_max(ctx, x)
    if ctx.options.half_arithmetic and beta >= 0:
        exps = _half_shifted_exps(ctx, x, row_max, beta)
    else:
        exp = _shifted_exp(beta, ctx.options.native_minmax)
        # (A strict float multiply by the converter's beta of 1 would stay in every vector.)
        scaled = (lambda v: v) if beta == 1.0 else (lambda v: v * hl.f32(beta))
        exps = ctx.define(ctx.func_name("exp"), x.shape,
                          lambda *i: exp(scaled(x(*i) - row_max.at(list(i[:-1]) + [hl.Expr(0)]))))
        exps.unrollable = beta >= 0  # (the full exponential's selects spill unrolled)
    ctx.materialize.append(exps)
    row_sum = row_reduce(ctx, "sum", x.shape[:-1], x.shape[-1], lambda row, k: exps.at(row + [k]), hl.sum)
    ctx.materialize.append(row_sum)
    result = ctx.define(ctx.func_name(), ctx.out_shape(),
                        lambda *i: exps(*i) * (hl.f32(1) / row_sum.at(list(i[:-1]) + [hl.Expr(0)])))
    result.unrollable = True
    return [result]


def _half_shifted_exps(ctx: OpContext, x: Value, row_max: Value, beta: float) -> Value:
    """e^(beta (x - max)) in half precision, where the target computes in it (as XNNPACK's fp16
    softmax): the row's max is one of its fp16 values, max - x >= 0 is rounded once, and e^-d
    (half_math.exp_negated) is within 2 steps of its exact value or 0 past e^-9.7, the row's largest
    term being 1. The sums and the scaling stay float32."""
    def body(*i):
        peak = narrow(row_max.at(list(i[:-1]) + [hl.Expr(0)]), hl.Float(16))
        d = peak - half_at(x, x.shape, list(i))
        return half_math.exp_negated(d if beta == 1.0 else d * half_math.half(beta))

    return ctx.define(ctx.func_name("exp"), x.shape, body)


@register("LOG_SOFTMAX")
def lower_log_softmax(ctx: OpContext) -> list[Value]:
    """x - max - log(sum exp(x - max)) over the last axis."""
    x = ctx.value(0)
    row_max = _row_max(ctx, x)
    exp = _shifted_exp(1.0, ctx.options.native_minmax)
    row_sum = row_reduce(ctx, "sum", x.shape[:-1], x.shape[-1],
                         lambda row, k: exp(x.at(row + [k]) - row_max.at(row + [hl.Expr(0)])), hl.sum)
    ctx.materialize.append(row_sum)

    def body(*i):
        row = list(i[:-1]) + [hl.Expr(0)]
        return x(*i) - row_max.at(row) - ieee.log(row_sum.at(row))

    return [ctx.define(ctx.func_name(), ctx.out_shape(), body)]


@register("L2_NORMALIZATION")
def lower_l2_normalization(ctx: OpContext) -> list[Value]:
    """x / max(sqrt(sum x^2), 1e-6) over the last axis (TFLite's epsilon)."""
    x = ctx.value(0)
    squares = row_reduce(ctx, "sumsq", x.shape[:-1], x.shape[-1], lambda row, k: x.at(row + [k]) * x.at(row + [k]),
                         hl.sum)
    norm = ctx.define(ctx.func_name("norm"), squares.shape,
                      lambda *i: ieee.keep_nan(squares(*i), hl.max(hl.sqrt(squares(*i)), hl.f32(1e-6))))
    ctx.materialize.append(norm)
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: x(*i) / norm.at(list(i[:-1]) + [hl.Expr(0)]))]


@register("ARG_MAX", "ARG_MIN", compile_time=(1,))
def lower_arg(ctx: OpContext) -> list[Value]:
    """Index of the first maximum (minimum) along the constant axis."""
    x = ctx.value(0)
    axis = int(np.asarray(ctx.const(1)).reshape(-1)[0]) % x.rank
    if ctx.op.outputs[0].type_name not in ("INT32", "INT64"):
        raise LoweringError(f"{ctx.op.name} to {ctx.op.outputs[0].type_name}")
    r = ReductionDomain([x.shape[axis]], ctx.func_name("r"))
    better = (lambda a, b: a > b) if ctx.op.name == "ARG_MAX" else (lambda a, b: a < b)
    out, target = ctx.out_shape(), ctx.out_type()
    idx = dim_vars(len(out))
    at = list(reversed(idx))
    # A (value, index) tuple reduction; a strict comparison keeps the first index on ties.
    best = hl.Func(ctx.func_name("best"))
    best[at] = hl.Tuple([x.at(idx[:axis] + [hl.Expr(0)] + idx[axis:]), hl.i32(0)])
    candidate = x.at(idx[:axis] + [r[0]] + idx[axis:])
    take = better(candidate, best[at][0])
    best[at] = hl.Tuple([hl.select(take, candidate, best[at][0]), hl.select(take, r[0], best[at][1])])
    ctx.materialize.append(Value(best, out, hl.Int(32)))
    result = hl.Func(ctx.func_name())
    result[at] = hl.cast(target, best[at][1])
    return [Value(result, out, target)]
