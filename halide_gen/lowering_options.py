"""How a block is lowered for a target: one LoweringOptions, given to build_block.

A target's kernels differ in a few forms that every lowering of its blocks must take alike: how
float tensors are stored between ops, whether float min / max already give TFLite's NaN answers,
x86's or ARM's integer forms, how int8 sums are requantized, whether 64-bit integers exist and
whether the code runs on a device that cannot fail an invoke. They travel together in one frozen
object (`TargetSpec.lowering_options()` makes a target's), which `build_block` gives every op's
lowering as `ctx.options`; the expression helpers below them (values.define, lower.ieee, the
fixed-point arithmetic) take what they need of it as arguments, so nothing is read from global state.
"""

from __future__ import annotations

from dataclasses import dataclass

import halide as hl

from .targets import INT8_ROUNDINGS

# Float storage type per precision: "fp16" holds every tensor a block computes in half precision
# (rounded when defined, widened when read: TFLite's GPU delegate calls this F32_F16); block inputs
# and outputs keep their TFLite types.
PRECISIONS = {"fp32": hl.Float(32), "fp16": hl.Float(16)}


@dataclass(frozen=True)
class LoweringOptions:
    """The forms a target's kernels take; the defaults are the plain ones (float32, ARM's integer
    forms with IEEE-exact min / max tests, reference rounding, host code)."""

    precision: str = "fp32"  # one of PRECISIONS
    # Convolutions and matrix products multiply and sum in half precision (fp16 storage only:
    # ARMv8.2's FP16, 8 lanes an FMA, as XNNPACK's fp16 kernels), from weights passed in it
    # (OpContext.packed); elementwise arithmetic, clamps, the sigmoid, GELU's tanh form and softmax's
    # exponentials compute in it too (lower.elementwise.HALF_BINARY, HALF_UNARY, lower.half_math),
    # the other ops on widened values, rounded when stored.
    half_arithmetic: bool = False
    # The CPU's float min / max give TFLite's NaN and inf answers themselves (ARM): lower.ieee
    # then emits plain min / max.
    native_minmax: bool = False
    # int8 ops in x86's forms: unsigned activations for VNNI's dot products, requantization by one
    # 64-bit product (lower.quantized's docstring). The same integers as ARM's forms.
    x86_integer: bool = False
    int8_rounding: str = "reference"  # how int8 sums are requantized: one of INT8_ROUNDINGS
    # 64-bit integers exist (not on Vulkan): requantization's doubling high multiply otherwise
    # takes 32-bit pieces (lower.fixed_point.srdhm_in_32_bits), the same integers.
    wide_integers: bool = True
    # Device code (GPU), which cannot fail an invoke: indices read from data are checked by the
    # delegate on the host before the kernel runs, and the kernel only clamps them.
    device_code: bool = False
    # PARTIAL-wide partials a float row reduction may keep apart (lower.reduce.partial_groups): x86
    # takes 4, each its own chain of adds; NEON's 16 lanes are already 4 registers.
    row_partials: int = 1

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is none of {tuple(PRECISIONS)}")
        if self.half_arithmetic and self.precision != "fp16":
            raise ValueError("half-precision arithmetic needs fp16 storage")
        if self.int8_rounding not in INT8_ROUNDINGS:
            raise ValueError(f"int8 rounding {self.int8_rounding!r} is none of {INT8_ROUNDINGS}")

    @property
    def float_arithmetic(self) -> hl.Type:
        """The type convolutions and matrix products multiply and sum in."""
        return hl.Float(16) if self.half_arithmetic else hl.Float(32)

    @property
    def float_storage(self) -> hl.Type:
        """The type float tensors are stored in between ops."""
        return PRECISIONS[self.precision]
