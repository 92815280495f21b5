"""The registry of lowerings: one Halide definition per TFLite builtin, keyed by op name.

A lowering takes the op's context (its input Values, compile-time constants, output shapes and
types) and returns one Value per output. Registration happens at import of the lowering modules;
`fusion.mapping.OPS` and this registry are checked against each other by a test.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import halide as hl
import numpy as np

from tflite_tools.model.fingerprint import constant_text
from tflite_tools.model.hybrid import is_hybrid
from tflite_tools.model.ir import Operator, Tensor

from ..lowering_options import LoweringOptions
from ..values import Value, define, dim_vars, halide_type


class LoweringError(NotImplementedError):
    """An op (or an option of it) this code generator does not handle; the block is not claimed."""


class RowReduction(NamedTuple):
    """An innermost-axis reduction in stages (reduce.row_reduce): partials 16 lanes wide or a
    multiple (row_partials), each the fold of `terms` elements of its row, then the row totals
    (through a 16-lane stage where the partials are wider: never on a GPU, whose partials are 16)."""

    partial: Value
    total: Value
    terms: int


class RowStatistics(NamedTuple):
    """Quantities of each row that other stages read (a dynamic-range op's row steps, their inverses,
    its zero points: `results`, each of shape rows + (1,), none reading another) and the stages of
    the reductions behind them: `inner`, one row's worth each (rows + (k,)), read by `results`
    only, and `roots`, larger partial results (an image's, per row of its pixels) that `inner`
    reads. A CPU schedule computes the roots first, then the rest in one loop over the rows.
    `depth`: elements per row."""

    results: list[Value]
    inner: list[Value]
    roots: list[Value]
    depth: int


class ReductionDomain(hl.RDom):
    """An RDom over [0, extent) in each dimension that keeps its extents as integers (Halide's
    Python bindings expose no accessor for a constant Expr): what schedules size tiles from."""

    def __init__(self, extents: Sequence[int], name: str):
        super().__init__([(0, e) for e in extents], name)
        self.extents = tuple(int(e) for e in extents)


class AccumulatorRecord(NamedTuple):
    """An explicit reduction as `accumulate` records it (block.Accumulator, once its op's output is
    known)."""

    func: hl.Func
    kind: AccumulatorKind
    rdom: ReductionDomain
    source: hl.Func | None  # the activation the reduction walks, read at consecutive indices
    dot: int  # terms per dot-product lane along the innermost reduction axis (0: none)
    narrow: bool  # terms are 8-bit products widened into the sum
    source_stride: int  # bytes between the source values neighbouring tile pixels read (0: unknown)
    # BLOCKWISE: the sum of one block (an int32 Func of the output index and the block), computed at
    # each step of `rdom` (the blocks) over its own domain.
    inner: hl.Func | None = None
    inner_rdom: ReductionDomain | None = None


# Tables hold a multiple of this many int32 entries. Halide embeds a constant buffer in the kernel
# aligned to its size up to 64 bytes, but AVX-512 code loads 16 entries at a time with aligned
# instructions: an 8-entry (32-byte) table segfaulted. 64-byte multiples are 64-byte aligned.
TABLE_ENTRIES = 16


@dataclass
class OpContext:
    """What a lowering sees of one op."""

    op: Operator
    name: str  # a unique prefix for the Funcs this op defines
    # Creates (on first use) the Value of a tensor: a block input becomes a kernel argument (packed
    # when a packer is named), an in-block tensor is its producer's Func.
    value_of: Callable[..., Value]
    options: LoweringOptions = LoweringOptions()  # the forms the target's kernels take
    materialize: list[Value] = field(default_factory=list)  # helper Values a schedule must not inline
    # Of those, zero-padded inputs (nn._zero_outside), each with the Value it pads (None: more
    # than padding, a copy worth making): a GPU schedule inlines them (their realised region
    # exceeds their tensor's), a CPU one where what they pad is realised anyway
    # (BlockKernel.padding_read_in_place).
    padded: list[tuple[Value, Value | None]] = field(default_factory=list)
    # Explicit reductions (accumulate).
    accumulators: list[AccumulatorRecord] = field(default_factory=list)
    constants: list[hl.Buffer] = field(default_factory=list)  # tables the op's Funcs read (kept alive)
    # Two-stage innermost-axis reductions (reduce.row_reduce).
    row_reductions: list[RowReduction] = field(default_factory=list)
    # Per-row results and the reductions behind them, all among `materialize` (RowStatistics).
    row_statistics: list[RowStatistics] = field(default_factory=list)
    # id() of the tensors the block's own ops write (the others are kernel arguments).
    computed_in_block: frozenset[int] = frozenset()
    # Block inputs of indices the host checks before a device kernel runs (movement.index_operand):
    # the tensor, the bound of each innermost position (cyclically), the op's name for the message.
    index_checks: list[tuple[Tensor, tuple[int, ...], str]] = field(default_factory=list)
    # Inputs the chosen lowering declared it reads at compile time (register(compile_time=...)), and
    # what it read of them: input index -> the value's text (or a property's), which the kernel's
    # identity includes (tflite_tools.model.fingerprint). Reading any other constant is refused.
    compile_time_inputs: tuple[int, ...] = ()
    bound: dict[int, str] = field(default_factory=dict)
    # The op's float results stay float32 under fp16 storage, computed in it: they reach a periodic
    # function's argument (halide_gen.block.PERIODIC), where their absolute error is the result's.
    float32_results: bool = False
    # A DYNAMIC_UPDATE_SLICE's update and its clamped start per axis (TFLite order): where its
    # output's memory is its operand's, the block's in-place form writes just the update (block.build_block).
    slice_update: tuple[Value, list[hl.Expr]] | None = None

    def value(self, i: int) -> Value:
        """Input `i` as a Value (a runtime tensor: data, weights, bias)."""
        t = self.op.inputs[i] if i < len(self.op.inputs) else None
        if t is None:
            raise LoweringError(f"{self.op.name}: input {i} is missing")
        return self.value_of(t)

    def packed(self, i: int, packer: str) -> Value | None:
        """Constant input `i` as a kernel argument packed by `packer` (halide_gen.pack), or None
        when the input is not a constant (the lowering then reads it as TFLite lays it out). A
        float32 one comes in half precision where the target computes in it (its weights and bias)."""
        t = self.op.inputs[i] if i < len(self.op.inputs) else None
        if t is None or not t.is_constant:
            return None
        return self.value_of(t, packer, half=self.options.half_arithmetic and t.type_name == "FLOAT32")

    def is_computed_in_block(self, t: Tensor) -> bool:
        """True when one of the block's ops writes `t` (it is no kernel argument)."""
        return id(t) in self.computed_in_block

    def has_input(self, i: int) -> bool:
        """True when input `i` is present (not an omitted optional input)."""
        return i < len(self.op.inputs) and self.op.inputs[i] is not None

    def const(self, i: int) -> np.ndarray:
        """Input `i` as a compile-time constant (axes, permutations, paddings), baked into the
        kernel: its value joins the kernel's identity, so blocks that differ in it never share one."""
        value = self._compile_time(i)
        self._bind(i, constant_text(value))
        return value

    def const_property(self, i: int, what: str, test: Callable[[np.ndarray], bool]) -> bool:
        """Whether constant input `i` has a property (`test` of its value) that the kernel is built
        on while the value itself stays a kernel argument (int8 weights that never reach -128):
        the answer joins the kernel's identity, so weights without the property get another kernel."""
        answer = bool(test(self._compile_time(i)))
        self._bind(i, f"{what}={answer}")
        return answer

    def _compile_time(self, i: int) -> np.ndarray:
        if i not in self.compile_time_inputs:
            raise LoweringError(f"{self.op.name}: its lowering reads input {i} at compile time without declaring it "
                                "(register(..., compile_time=...)), so kernels could not tell two values apart")
        t = self.op.inputs[i] if i < len(self.op.inputs) else None
        if t is None or t.data is None:
            raise LoweringError(f"{self.op.name}: input {i} must be a constant")
        return np.asarray(t.values)

    def _bind(self, i: int, text: str) -> None:
        self.bound[i] = text if self.bound.get(i, text) == text else f"{self.bound[i]};{text}"

    def out_shape(self, k: int = 0) -> tuple[int, ...]:
        """TFLite shape of output `k`."""
        return tuple(self.op.outputs[k].shape)

    def out_type(self, k: int = 0) -> hl.Type:
        """Halide storage type of output `k`."""
        return halide_type(self.op.outputs[k].type_name)

    def option(self, field_name: str, default=None):
        """A field of the op's options object (the schema's camelCase name)."""
        return getattr(self.op.options, field_name, default) if self.op.options is not None else default

    def define(self, name: str, shape: Sequence[int], body: Callable[..., hl.Expr], exact: bool = False) -> Value:
        """values.define in the target's float storage (LoweringOptions.float_storage), or float32
        where `exact` (a reduction's partial results stay float32, so every sum is a float32 sum
        under fp16 storage too) or where the op's results must (float32_results)."""
        exact = exact or self.float32_results
        return define(name, shape, body, storage=hl.Float(32) if exact else self.options.float_storage)

    def func_name(self, suffix: str = "") -> str:
        """A Func name unique to this op."""
        return f"{self.name}_{suffix}" if suffix else self.name

    def table(self, values: Sequence[int | float], suffix: str,
              element: hl.Type = hl.Int(32)) -> Callable[[hl.Expr], hl.Expr]:
        """A function of an index (an output channel, row or column) giving values[index] (a
        constant when all agree), read from a table of `element` entries compiled into the kernel.
        The index is clamped: schedules may round loops up past the last entry."""
        values = [float(v) if element.is_float() else int(v) for v in values]
        if len(set(values)) == 1:
            return lambda i: hl.cast(element, values[0])
        size = -(-len(values) // TABLE_ENTRIES) * TABLE_ENTRIES
        table = hl.Buffer(element, [size], self.func_name(suffix))
        for k in range(size):
            table[k] = values[min(k, len(values) - 1)]
        self.constants.append(table)
        last = len(values) - 1
        return lambda i: table[hl.clamp(i, 0, last)]


class AccumulatorKind(enum.Enum):
    """What an explicit accumulator computes: it decides which schedule template tiles it
    (halide_gen.schedule.cpu.TEMPLATES; a kind without one is an error there)."""

    CONV = "conv"  # CONV_2D, TRANSPOSE_CONV: reduction over taps and input channels
    DEPTHWISE = "depthwise"  # DEPTHWISE_CONV_2D: reduction over taps only
    MATMUL = "matmul"  # FULLY_CONNECTED, BATCH_MATMUL
    # A matrix product whose weights are scaled per block of its depth: float sums over the blocks,
    # each of an int32 sum over the block's steps (FULLY_CONNECTED with weights quantized per block).
    BLOCKWISE = "blockwise"
    REDUCE = "reduce"  # sums over outer axes (global average pooling)


def accumulate(ctx: OpContext, out_shape, init, update, kind: AccumulatorKind, r: ReductionDomain,
               source: hl.Func | None = None, dot: int = 0, narrow: bool = False, source_stride: int = 0,
               inner: hl.Func | None = None, inner_rdom: ReductionDomain | None = None) -> hl.Func:
    """An explicit reduction Func over the output index: `init(*idx)`, then `+= update(*idx)`.

    Explicit (not an inline hl.sum) so a schedule can compute it at a register tile of its
    consumer and order the reduction loops outside the tile. `dot`: the innermost reduction axis
    sums groups of this many terms in one dot-product lane (a multiple of its extent). `narrow`: the
    terms are narrow products (int8 x int8 -> int16) widened into the sum (schedules load whole
    registers of their inputs). `source_stride`: bytes between the source values that neighbouring
    outputs along the tiled pixel axis (a matrix product's rows) read first; 0 where unknown
    (schedules keep such pixels out of one L1 cache set). `inner`, `inner_rdom`: a BLOCKWISE
    product's per-block sums (AccumulatorRecord).
    """
    acc = hl.Func(ctx.func_name("acc"))
    idx = dim_vars(len(out_shape))
    at = list(reversed(idx))
    acc[at] = init(*idx)
    acc[at] = acc[at] + update(*idx)
    ctx.accumulators.append(AccumulatorRecord(acc, kind, r, source, dot, narrow, source_stride, inner, inner_rdom))
    return acc


def read(acc: hl.Func, idx) -> hl.Expr:
    """An accumulator's element at a TFLite-order index."""
    return hl.Expr(acc[list(reversed(idx))])


Lowering = Callable[[OpContext], list[Value]]
LOWERINGS: dict[str, Lowering] = {}
# Ops on quantized int8 tensors have lowerings of their own (quantized.py): TFLite's integer
# arithmetic is not its float arithmetic. So do ops on int16 activations with int8 weights
# ("16x8", quantized16.py), whose kernels sum and rescale in 64 bits.
QUANTIZED_LOWERINGS: dict[str, Lowering] = {}
QUANTIZED16_LOWERINGS: dict[str, Lowering] = {}
# Float ops reading int8 constant weights (dynamic-range quantization, hybrid.py) quantize their
# input as they run: neither arithmetic above.
HYBRID_LOWERINGS: dict[str, Lowering] = {}
TABLES = {"float": LOWERINGS, "int8": QUANTIZED_LOWERINGS, "int16": QUANTIZED16_LOWERINGS, "hybrid": HYBRID_LOWERINGS}
# (table kind, op name) -> the inputs its lowering reads at compile time (OpContext.const): the
# kinds are "float", "int8", "int16" and "hybrid", as lower() chooses a table.
COMPILE_TIME_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {}
# The same keys -> the constant inputs whose values the output shapes already fix (a RESHAPE's new
# shape): neither read nor passed. Every other constant input is a kernel argument.
SHAPE_INPUTS: dict[tuple[str, str], tuple[int, ...]] = {}

# Ops that only move elements: on quantized tensors they are the float lowering unchanged, as long
# as input and output share one scale and zero point (TFLite requires it of these ops).
# CONCATENATION too (TFLite's int8 kernel requires every input quantized as the output) and PAD (its
# fill, a real zero, is the zero point: movement.py), and RESIZE_NEAREST_NEIGHBOR (each output is its
# nearest input's byte; the index arithmetic is the float op's), TILE, BROADCAST_TO and
# DYNAMIC_UPDATE_SLICE (copies).
MOVEMENT = {"RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "SLICE", "STRIDED_SLICE", "GATHER", "CONCATENATION",
            "PAD", "PADV2", "RESIZE_NEAREST_NEIGHBOR", "TILE", "BROADCAST_TO", "DYNAMIC_UPDATE_SLICE"}


def register(*names: str, quantized: bool = False, int16: bool = False, hybrid: bool = False,
             compile_time: tuple[int, ...] = (), shape_inputs: tuple[int, ...] = ()) -> Callable[[Lowering], Lowering]:
    """Registers a lowering for one or more TFLite builtins (on int8 tensors if `quantized`, on
    int16 activations if `int16`, on a float input with int8 constant weights if `hybrid`). `compile_time` names the inputs it may read while it builds the
    kernel (OpContext.const, const_property), `shape_inputs` those the output shapes fix; every other
    constant reaches the kernel as an argument (tests/test_kernel_identity.py checks all three)."""
    kind = "hybrid" if hybrid else "int16" if int16 else "int8" if quantized else "float"
    table = TABLES[kind]

    def add(fn: Lowering) -> Lowering:
        for name in names:
            if name in table:
                raise ValueError(f"two lowerings for {name}")
            table[name] = fn
            COMPILE_TIME_INPUTS[(kind, name)] = tuple(compile_time)
            SHAPE_INPUTS[(kind, name)] = tuple(shape_inputs)
        return fn

    return add


def quantized_tensors(ctx: OpContext) -> list:
    """The op's inputs and outputs that hold quantized integers (int8 / uint8 / int16 with a scale)."""
    return [t for t in (*ctx.op.inputs, *ctx.op.outputs)
            if t is not None and t.type_name in ("INT8", "UINT8", "INT16") and t.quantization is not None
            and t.quantization.scale is not None and len(t.quantization.scale)]


def _same_quantization(tensors) -> bool:
    params = {(tuple(np.asarray(t.quantization.scale).tolist()), tuple(np.asarray(t.quantization.zero_point).tolist()))
              for t in tensors}
    return len(params) == 1


def lower(ctx: OpContext) -> list[Value]:
    """Lowers one op, or raises LoweringError naming what is unsupported."""
    # DEQUANTIZE and QUANTIZE from float cross the model's float / int8 edge (elementwise.py); a
    # QUANTIZE between int8 scales requantizes (quantized.py), one to or from int16 too (quantized16.py).
    edge = ctx.op.name == "DEQUANTIZE" or (ctx.op.name == "QUANTIZE" and ctx.op.inputs[0].type_name not in ("INT8", "INT16"))
    quantized = [] if edge else quantized_tensors(ctx)
    if is_hybrid(ctx.op):
        fn, kind = HYBRID_LOWERINGS.get(ctx.op.name), "hybrid"
        if fn is None:
            raise LoweringError(f"no Halide lowering for a dynamic-range (hybrid) {ctx.op.name}")
    elif quantized:
        types = {t.type_name for t in quantized}
        # int16 activations with int8 weights, or a requantization between int8 and int16.
        mixed_16x8 = ctx.op.name == "QUANTIZE" or any(t.type_name == "INT16" for t in quantized if not t.is_constant)
        if types == {"INT16"} or types == {"INT16", "INT8"} and mixed_16x8:
            kind = "int16"
        elif types == {"INT8"}:
            kind = "int8"
        else:
            raise LoweringError(f"{ctx.op.name}: only int8 and 16x8 (int16 activations, int8 weights) quantized "
                                "kernels are generated")
        fn = TABLES[kind].get(ctx.op.name)
        if fn is None and ctx.op.name in MOVEMENT and _same_quantization(quantized) and not ctx.op.fused_activation:
            fn, kind = LOWERINGS[ctx.op.name], "float"
        if fn is None:
            raise LoweringError(f"no {kind} Halide lowering for {ctx.op.name}")
    else:
        fn, kind = LOWERINGS.get(ctx.op.name), "float"
        if fn is None:
            raise LoweringError(f"no Halide lowering for {ctx.op.name}")
    ctx.compile_time_inputs = COMPILE_TIME_INPUTS[(kind, ctx.op.name)]
    return fn(ctx)
