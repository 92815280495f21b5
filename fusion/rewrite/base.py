"""What a rewrite rule is, the registry of rules, and small helpers for writing matchers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tflite_tools.model.ir import Operator, Tensor

from .graph import GraphView


@dataclass
class Rewrite:
    """A matched rewrite: how many FLOPs it saves, and how to apply it (True when applied)."""

    saved_flops: int
    apply: Callable[[], bool]


Matcher = Callable[[GraphView, Operator], "Rewrite | None"]


@dataclass(frozen=True)
class Rule:
    """A named rewrite rule.

    `exact` rules never change a result bit under TFLite's reference kernels and always run;
    the others change floating-point rounding and run only with fast-math. `family` is
    "cleanup" (constant folding, identities, data movement: run to a fixpoint) or "algebraic"
    (the paper's associative / distributive / commutative family: chosen greedily by FLOPs).
    """

    name: str
    exact: bool
    family: str
    match: Matcher
    doc: str


RULES: list[Rule] = []


def rule(name: str, *, exact: bool, family: str) -> Callable[[Matcher], Matcher]:
    """Registers a matcher as a rule; its docstring is the rule's one-line contract."""

    def register(match: Matcher) -> Matcher:
        RULES.append(Rule(name, exact, family, match, (match.__doc__ or "").strip().splitlines()[0]))
        return match

    return register


# -- matcher helpers ---------------------------------------------------------------------------


def is_float(t: Tensor | None) -> bool:
    """True for an unquantized float32 tensor (the only type the algebraic rules touch)."""
    return t is not None and t.type_name == "FLOAT32" and (t.quantization is None or t.quantization.scale is None)


def all_float(op: Operator) -> bool:
    """True when every present input and output of `op` is plain float32."""
    return all(is_float(t) for t in (*op.inputs, *op.outputs) if t is not None)


def const(t: Tensor | None) -> np.ndarray | None:
    """The constant value of `t`, or None."""
    return None if t is None or not t.is_constant else t.data


def all_bits(value: np.ndarray | None, scalar: float) -> bool:
    """True when every element of `value` has exactly the bits of `scalar` (so -0.0 != 0.0)."""
    if value is None or value.size == 0:
        return False
    flat = np.ascontiguousarray(value).reshape(-1)
    target = np.asarray([scalar], dtype=value.dtype)
    return bool(np.all(flat.view(np.uint8).reshape(flat.size, -1) == target.view(np.uint8)))


def powers_of_two(value: np.ndarray | None) -> bool:
    """True when every element is a normal (non-subnormal) +/- power of two."""
    if value is None or value.dtype != np.float32 or value.size == 0:
        return False
    mantissa, exponent = np.frexp(value.astype(np.float64))
    return bool(np.all(np.abs(mantissa) == 0.5) and np.all(exponent > -125) and np.all(exponent < 127))


def no_activation(op: Operator) -> bool:
    """True when the op has no fused activation."""
    return op.fused_activation is None


def other_input(op: Operator, t: Tensor) -> Tensor | None:
    """The other operand of a binary op."""
    a, b = op.inputs[0], op.inputs[1]
    return b if a is t else a


def elements(t: Tensor) -> int:
    """Element count (the unit of elementwise FLOPs)."""
    return t.num_elements


def keeps_shape(op: Operator, x: Tensor) -> bool:
    """True when the op's output has `x`'s shape (a broadcast operand did not enlarge it)."""
    return tuple(op.outputs[0].shape) == tuple(x.shape)
