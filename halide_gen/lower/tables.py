"""Quantized functions of one input by lookup table: a table over every input value (256 for
int8, 65536 for int16) compiled into the kernel and indexed by the input. The tables are LiteRT's
own where its kernels use one (filled by running LiteRT's kernel on every value: litert_tables.py),
so these lowerings equal LiteRT by construction; LOGISTIC and TANH fill theirs as TFLite's
LUTPopulate does."""

from __future__ import annotations

from typing import Sequence

import halide as hl
import numpy as np

from ..values import Value
from .fixed_point import INT8_MAX, INT8_MIN, scale_zp, tflite_round
from .litert_tables import litert_table
from .registry import LoweringError, OpContext, register


def lookup_table(ctx: OpContext, transform) -> list[Value]:
    """An int8 -> int8 function as TFLite's optimized kernels compute it: a 256-entry table filled as
    LUTPopulate does (dequantize in float32, `transform`, divide by the output scale, std::round, add
    the zero point, clamp), then indexed by the input. Exact to LiteRT's builtin kernels, whose int8
    LOGISTIC and TANH read such a table (its reference kernels compute in fixed point instead and may
    differ by 1 LSB); `transform` maps float32 arrays (numpy) as the float op does."""
    in_scale, in_zp = scale_zp(ctx.op.inputs[0])
    out_scale, out_zp = scale_zp(ctx.op.outputs[0])
    values = np.arange(INT8_MIN, INT8_MAX + 1)
    dequantized = np.float32(in_scale) * (values - in_zp).astype(np.float32)
    with np.errstate(over="ignore"):
        transformed = transform(dequantized).astype(np.float32)
    # std::round of each float32 product, exactly (in float32, v + 0.5 itself rounds: 0.49999997 -> 1).
    rescaled = [tflite_round(float(v)) for v in transformed * (np.float32(1) / np.float32(out_scale))]
    return indexed_by_input(ctx, np.clip(np.array(rescaled) + out_zp, INT8_MIN, INT8_MAX))


def constant_buffer(ctx: OpContext, suffix: str, element: hl.Type, values: Sequence[int]) -> hl.Buffer:
    """`values` as a one-dimensional buffer of `element` compiled into the kernel (kept alive with
    the op's constants), read at data-dependent indices (lookup tables)."""
    table = hl.Buffer(element, [len(values)], ctx.func_name(suffix))
    np.asarray(table)[:] = np.asarray(values)
    ctx.constants.append(table)
    return table


def indexed_by_input(ctx: OpContext, table_values: Sequence[int]) -> list[Value]:
    """The op's output as table_values[x - lowest] for each input x of an integer type whose lowest
    value is `lowest` (int8: a 256-entry table; int16: 65536), compiled into the kernel."""
    out_type, in_type = ctx.out_type(), ctx.value(0).type
    table = constant_buffer(ctx, "table", out_type, table_values)
    x, lowest = ctx.value(0), -(1 << (in_type.bits() - 1))  # int8 or int16
    return [ctx.define(ctx.func_name(), ctx.out_shape(), lambda *i: table[hl.cast(hl.Int(32), x(*i)) - lowest])]


# LiteRT's int8 SQRT and RSQRT fail the invoke on a negative input ("only defined for positive
# values"); their tables answer one as they answer zero (SQRT 0, RSQRT int8's largest step), as
# the converter's LayerNorm (a variance, zero point -128) never gives them one.
NONNEGATIVE_DOMAIN = {"SQRT", "RSQRT"}


@register("HARD_SWISH", "GELU", "ELU", "EXP", "LOG", "ABS", "NEG", "RELU", "RELU6", "RELU_N1_TO_1", "SQRT", "RSQRT",
          quantized=True)
def lower_unary_by_litert_table(ctx: OpContext) -> list[Value]:
    """An int8 function of one int8 input, through the table LiteRT's own kernel fills for this
    op, quantization and options (litert_tables): exact to LiteRT by construction (on the inputs
    LiteRT accepts: NONNEGATIVE_DOMAIN)."""
    return unary_by_litert_table(ctx, "INT8")


def unary_by_litert_table(ctx: OpContext, type_name: str) -> list[Value]:
    """A function of one input of `type_name` (INT8 or INT16) into the same type, as the table
    LiteRT fills for the op; inputs under the zero point of an op in NONNEGATIVE_DOMAIN are
    answered as the zero point is."""
    if len(ctx.op.inputs) != 1 or ctx.op.inputs[0].type_name != type_name or ctx.op.outputs[0].type_name != type_name:
        kind = type_name.lower()
        raise LoweringError(f"{kind} {ctx.op.name} with other than one {kind} input and output")
    _, in_zp = scale_zp(ctx.op.inputs[0])
    scale_zp(ctx.op.outputs[0])  # per-tensor quantization, or refused
    return indexed_by_input(ctx, litert_table(ctx.op, in_zp if ctx.op.name in NONNEGATIVE_DOMAIN else None))


@register("LOGISTIC", quantized=True)
def lower_logistic_int8(ctx: OpContext) -> list[Value]:
    """1 / (1 + e^-x) on int8, through TFLite's lookup table."""
    return lookup_table(ctx, lambda v: np.float32(1) / (np.float32(1) + np.exp(-v)))


@register("TANH", quantized=True)
def lower_tanh_int8(ctx: OpContext) -> list[Value]:
    """tanh on int8, through TFLite's lookup table."""
    return lookup_table(ctx, np.tanh)
