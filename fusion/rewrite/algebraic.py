"""The paper's associative / distributive / commutative family (DNNFusion §4.2, Table 4 and kin).

Chosen greedily by FLOP reduction within sub-graphs split at ops that have none of the three
properties (see engine.py). Rules that change floating-point rounding are fast-math only; the
exact ones are bit-identical under TFLite's reference kernels.
"""

from __future__ import annotations

import numpy as np

from tflite_tools.model.ir import Operator, Tensor

from .base import Rewrite, all_bits, all_float, const, is_float, no_activation, other_input, powers_of_two, rule
from .graph import GraphView

# Elementwise work relative to one add or multiply, for FLOP accounting of divisions and
# transcendentals (the same weights the roofline cost uses).
DIV_COST = 8
EXP_COST = 8


def _binary(op: Operator, name: str) -> bool:
    return op.name == name and len(op.inputs) == 2 and all_float(op)


def _replace(g: GraphView, old: list[Operator], new: list[Operator]) -> bool:
    """Inserts `new` (in order) where the last of `old` ran, then removes `old`."""
    anchor = old[-1]
    for op in new:
        g.insert_before(anchor, op)
    for op in old:
        if op in g.sg.operators:
            g.remove_op(op)
    return True


def _out_shape(*tensors: Tensor) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*(tuple(t.shape) for t in tensors)))


@rule("mul_self_to_square", exact=True, family="algebraic")
def mul_self_to_square(g: GraphView, op: Operator) -> Rewrite | None:
    """x * x -> SQUARE(x) (the same product; x is read once)."""
    if not _binary(op, "MUL") or op.inputs[0] is not op.inputs[1] or not no_activation(op):
        return None
    return Rewrite(0, lambda: _replace(g, [op], [g.make_op("SQUARE", [op.inputs[0]], op.outputs)]))


@rule("mul_minus_one_to_neg", exact=True, family="algebraic")
def mul_minus_one_to_neg(g: GraphView, op: Operator) -> Rewrite | None:
    """x * -1 -> NEG(x)."""
    if not _binary(op, "MUL") or not no_activation(op):
        return None
    for x in op.inputs:
        if all_bits(const(other_input(op, x)), -1.0) and tuple(x.shape) == tuple(op.outputs[0].shape):
            return Rewrite(0, lambda x=x: _replace(g, [op], [g.make_op("NEG", [x], op.outputs)]))
    return None


def _reciprocal_mul(g: GraphView, op: Operator, exact: bool) -> Rewrite | None:
    if not _binary(op, "DIV"):
        return None
    x, c = op.inputs
    value = const(c)
    if value is None or (exact and not powers_of_two(value)) or np.any(value == 0):
        return None
    act = op.fused_activation or "NONE"

    def apply() -> bool:
        recip = g.constant(c.name + "/reciprocal", (np.float32(1) / value).astype(np.float32))
        return _replace(g, [op], [g.make_op("MUL", [x, recip], op.outputs, fused_activation_function=act)])

    return Rewrite((DIV_COST - 1) * op.outputs[0].num_elements, apply)


@rule("div_by_power_of_two", exact=True, family="algebraic")
def div_by_power_of_two(g: GraphView, op: Operator) -> Rewrite | None:
    """x / 2^k -> x * 2^-k (the reciprocal of a power of two is exact)."""
    return _reciprocal_mul(g, op, exact=True)


@rule("div_by_constant", exact=False, family="algebraic")
def div_by_constant(g: GraphView, op: Operator) -> Rewrite | None:
    """x / c -> x * (1/c) (fast-math: 1/c is rounded)."""
    return _reciprocal_mul(g, op, exact=False)


@rule("abs_of_product", exact=True, family="algebraic")
def abs_of_product(g: GraphView, op: Operator) -> Rewrite | None:
    """ABS(a) * ABS(b) -> ABS(a * b) (|a||b| = |ab| bit for bit: only the sign differs)."""
    if not _binary(op, "MUL") or not no_activation(op):
        return None
    a_op, b_op = (g.produced_by(t, "ABS") for t in op.inputs)
    if a_op is None or b_op is None or a_op is b_op or not all(g.single_use(t) for t in op.inputs):
        return None

    def apply() -> bool:
        product = g.like(op.outputs[0], op.outputs[0].name + "/product")
        return _replace(g, [a_op, b_op, op], [
            g.make_op("MUL", [a_op.inputs[0], b_op.inputs[0]], [product]),
            g.make_op("ABS", [product], op.outputs),
        ])

    return Rewrite(op.outputs[0].num_elements, apply)


@rule("reassociate_constants", exact=False, family="algebraic")
def reassociate_constants(g: GraphView, op: Operator) -> Rewrite | None:
    """(x * c1) * c2 -> x * (c1 * c2), and the same for ADD (fast-math: regrouping rounds differently)."""
    if op.name not in ("MUL", "ADD") or not _binary(op, op.name):
        return None
    for y in op.inputs:
        c2 = const(other_input(op, y))
        inner = g.produced_by(y, op.name)
        if c2 is None or inner is None or not g.single_use(y) or not no_activation(inner) or not all_float(inner):
            continue
        for x in inner.inputs:
            c1 = const(other_input(inner, x))
            if c1 is None or x.is_constant:
                continue
            combined = (c1 * c2) if op.name == "MUL" else (c1 + c2)
            if _out_shape(x, Tensor("c", combined.shape)) != tuple(op.outputs[0].shape):
                continue
            act = op.fused_activation or "NONE"

            def apply(x=x, combined=combined, inner=inner) -> bool:
                c = g.constant(op.outputs[0].name + "/folded", combined.astype(np.float32))
                return _replace(g, [inner, op], [g.make_op(op.name, [x, c], op.outputs, fused_activation_function=act)])

            return Rewrite(op.outputs[0].num_elements, apply)
    return None


@rule("factor_common_operand", exact=False, family="algebraic")
def factor_common_operand(g: GraphView, op: Operator) -> Rewrite | None:
    """A*B + A*C -> A*(B + C) (Table 4 distributive; fast-math). With B, C constant, B + C folds."""
    if not _binary(op, "ADD"):
        return None
    left, right = (g.produced_by(t, "MUL") for t in op.inputs)
    if left is None or right is None or left is right or not all(g.single_use(t) for t in op.inputs):
        return None
    if not (no_activation(left) and no_activation(right) and all_float(left) and all_float(right)):
        return None
    for a in left.inputs:
        if not any(a is t for t in right.inputs):
            continue
        b, c = other_input(left, a), other_input(right, a)
        if _out_shape(a, b, c) != tuple(op.outputs[0].shape):
            continue
        act = op.fused_activation or "NONE"

        def apply(a=a, b=b, c=c) -> bool:
            total = g.like(op.outputs[0], op.outputs[0].name + "/sum", shape=_out_shape(b, c))
            return _replace(g, [left, right, op], [
                g.make_op("ADD", [b, c], [total]),
                g.make_op("MUL", [a, total], op.outputs, fused_activation_function=act),
            ])

        saved = op.outputs[0].num_elements - (0 if b.is_constant and c.is_constant else 0)
        return Rewrite(saved, apply)
    return None


@rule("add_scaled_self", exact=False, family="algebraic")
def add_scaled_self(g: GraphView, op: Operator) -> Rewrite | None:
    """A + A*B -> A*(B + 1) for constant B (Table 4 distributive; fast-math). B + 1 folds."""
    if not _binary(op, "ADD"):
        return None
    for a in op.inputs:
        mul = g.produced_by(other_input(op, a), "MUL")
        if mul is None or not g.single_use(other_input(op, a)) or not no_activation(mul) or not all_float(mul):
            continue
        if not any(a is t for t in mul.inputs):
            continue
        b = other_input(mul, a)
        if const(b) is None or tuple(a.shape) != tuple(op.outputs[0].shape):
            continue
        act = op.fused_activation or "NONE"

        def apply(a=a, b=b, mul=mul) -> bool:
            plus_one = g.constant(b.name + "/plus_one", (const(b) + np.float32(1)).astype(np.float32))
            return _replace(g, [mul, op], [g.make_op("MUL", [a, plus_one], op.outputs, fused_activation_function=act)])

        return Rewrite(op.outputs[0].num_elements, apply)
    return None


@rule("sqrt_times_sqrt", exact=False, family="algebraic")
def sqrt_times_sqrt(g: GraphView, op: Operator) -> Rewrite | None:
    """(A*sqrt(B)) * (sqrt(B)*C) -> (A*B)*C, and sqrt(B)*sqrt(B) -> B (Table 4 associative; fast-math)."""
    if not _binary(op, "MUL") or not no_activation(op):
        return None
    x, y = op.inputs
    root = g.produced_by(x, "SQRT")
    if x is y and root is not None and tuple(root.inputs[0].shape) == tuple(op.outputs[0].shape):
        return Rewrite(2 * op.outputs[0].num_elements, lambda: g.bypass(op, root.inputs[0], op.outputs[0]))
    left, right = g.produced_by(x, "MUL"), g.produced_by(y, "MUL")
    if left is None or right is None or left is right or not (g.single_use(x) and g.single_use(y)):
        return None
    if not (no_activation(left) and no_activation(right)):
        return None
    shared = [t for t in left.inputs if g.produced_by(t, "SQRT") is not None and any(t is u for u in right.inputs)]
    if not shared:
        return None
    s = shared[0]
    a, c, b = other_input(left, s), other_input(right, s), g.producer_of(s).inputs[0]
    if _out_shape(a, b, c) != tuple(op.outputs[0].shape):
        return None

    def apply() -> bool:
        ab = g.like(op.outputs[0], op.outputs[0].name + "/ab", shape=_out_shape(a, b))
        return _replace(g, [left, right, op], [
            g.make_op("MUL", [a, b], [ab]),
            g.make_op("MUL", [ab, c], op.outputs),
        ])

    return Rewrite(3 * op.outputs[0].num_elements, apply)


@rule("square_minus_product", exact=False, family="algebraic")
def square_minus_product(g: GraphView, op: Operator) -> Rewrite | None:
    """SQUARE(S) - S*C -> S*(S - C) (Table 4 distributive; fast-math)."""
    if not _binary(op, "SUB") or not no_activation(op):
        return None
    sq, mul = g.produced_by(op.inputs[0], "SQUARE"), g.produced_by(op.inputs[1], "MUL")
    if sq is None or mul is None or not (g.single_use(op.inputs[0]) and g.single_use(op.inputs[1])):
        return None
    s = sq.inputs[0]
    if not any(s is t for t in mul.inputs) or not no_activation(mul):
        return None
    c = other_input(mul, s)
    if _out_shape(s, c) != tuple(op.outputs[0].shape) or tuple(s.shape) != tuple(op.outputs[0].shape):
        return None

    def apply() -> bool:
        diff = g.like(op.outputs[0], op.outputs[0].name + "/diff")
        return _replace(g, [sq, mul, op], [
            g.make_op("SUB", [s, c], [diff]),
            g.make_op("MUL", [s, diff], op.outputs),
        ])

    return Rewrite(op.outputs[0].num_elements, apply)


@rule("exp_reduce_prod", exact=False, family="algebraic")
def exp_reduce_prod(g: GraphView, op: Operator) -> Rewrite | None:
    """REDUCE_PROD(EXP(A)) -> EXP(SUM(A)) (Table 4; fast-math). EXP then runs on the reduced tensor."""
    if op.name != "REDUCE_PROD" or not (is_float(op.inputs[0]) and is_float(op.outputs[0])):
        return None
    exp = g.produced_by(op.inputs[0], "EXP")
    if exp is None or not g.single_use(op.inputs[0]):
        return None
    out = op.outputs[0]
    saved = EXP_COST * (exp.outputs[0].num_elements - out.num_elements)

    def apply() -> bool:
        total = g.like(out, out.name + "/sum")
        keep = bool(getattr(op.options, "keepDims", False))
        return _replace(g, [exp, op], [
            g.make_op("SUM", [exp.inputs[0], op.inputs[1]], [total], keep_dims=keep),
            g.make_op("EXP", [total], [out]),
        ])

    return Rewrite(saved, apply)
