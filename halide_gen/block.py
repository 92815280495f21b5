"""One Halide pipeline per planned block: block inputs become kernel arguments, ops are lowered
in order (each reading its producers' Funcs directly, so nothing in between is materialised unless
a schedule says so), and the block's outputs are the pipeline's outputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import halide as hl
import numpy as np

from fusion.mapping import ELEMENTWISE, MappingType, op_mapping
from tflite_tools.model.fingerprint import block_identity
from tflite_tools.model.ir import Operator, Tensor

from .lower import AccumulatorKind, LoweringError, OpContext, ReductionDomain, RowReduction, RowStatistics, lower
from .lowering_options import LoweringOptions
from .pack import PACKERS, half_saturated, pack
from .values import DIM_NAMES, Value, halide_type


_BUILDS = itertools.count()


def _ident(text: str) -> str:
    """A C identifier from a tensor or block name (Halide names Funcs and arguments with them)."""
    name = re.sub(r"[^0-9A-Za-z_]", "_", text)
    return name if name and not name[0].isdigit() else f"t_{name}"


@dataclass
class Argument:
    """A kernel input: the tensor it comes from, its Halide parameter, and how a constant is
    packed before it is passed (halide_gen.pack; None = as TFLite stores it)."""

    tensor: Tensor
    param: hl.ImageParam
    pack: str | None = None
    # A float32 constant passed in half precision, converted once after packing (weights of
    # kernels that compute in it: LoweringOptions.half_arithmetic).
    half: bool = False
    # Indices a device kernel reads unchecked: the bound of each innermost position (cyclically)
    # and the op's name, for the host check before the kernel runs (lower.movement.index_operand).
    index_bounds: tuple[int, ...] = ()
    index_op: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape the kernel sees (TFLite order), after packing."""
        return PACKERS[self.pack].shape(tuple(self.tensor.shape)) if self.pack else tuple(self.tensor.shape)

    @property
    def type_name(self) -> str:
        """The element type the kernel sees (TFLite's name), after packing."""
        return _packed_type(self.tensor, self.pack, self.half)

    def data_from(self, value: np.ndarray) -> np.ndarray:
        """The array to pass for this argument, given the tensor's TFLite data."""
        packed = pack(self.pack, value)
        return half_saturated(packed) if self.half else packed


def _packed_type(t: Tensor, packing: str | None, half: bool = False) -> str:
    """The element type of `t` as a kernel argument packed by `packing` (TFLite's name), in half
    precision where `half`."""
    if half:
        if t.type_name != "FLOAT32":
            raise LoweringError(f"{t.name!r}: only float32 constants are passed in half precision")
        return "FLOAT16"
    # INT4 weights reach kernels unpacked into int8 (Tensor.values; the delegate unpacks them too).
    return (PACKERS[packing].dtype if packing else None) or ("INT8" if t.type_name == "INT4" else t.type_name)


def _edge_clamped(arg: Argument) -> hl.Func:
    """A block input read with every axis but the innermost clamped to its extent.

    Halide may evaluate a producer over more rows than any output needs: a sliding window over a
    streamed strip warms up by rewinding its loop into rows before the strip (rows -4..-1 of the
    first strip for a padded 5x5 depthwise whose input is streamed). A padded convolution reads its
    own input through a clamp (nn._zero_outside), but an elementwise op fused in front of it that
    also reads a block input (a residual ADD) then indexed that input out of bounds. Clamping at the input is
    Halide's own idiom (a boundary condition on every input): the values read out there are never
    used, and no schedule can make a kernel read outside what TFLite passes it. The innermost axis
    stays exact (it is the vectorized one, and no schedule computes past its extent).
    """
    f = hl.Func(f"{arg.param.name()}_clamped")
    shape = arg.shape
    vars_ = [hl.Var(n) for n in DIM_NAMES[: len(shape)]]
    index = [vars_[0]] + [hl.clamp(hl.likely(v), 0, int(extent) - 1) for v, extent in zip(vars_[1:], reversed(shape[:-1]))]
    f[vars_] = arg.param[index]
    return f


@dataclass
class Accumulator:
    """A reduction's accumulator Func and the op output Value that reads it (for schedules)."""

    op_index: int
    acc: hl.Func
    value: Value
    kind: AccumulatorKind
    rdom: ReductionDomain
    source: hl.Func | None = None  # the activation the reduction walks, read at consecutive indices
    dot: int = 0  # terms per dot-product lane along the innermost reduction axis (0: no dot product)
    narrow: bool = False  # terms are 8-bit products widened into the sum (lower.registry.accumulate)
    # Bytes between the source values that neighbouring pixels of a register tile (a matrix
    # product's rows) read: the schedule keeps a tile's pixels out of one L1 set (0: unknown).
    source_stride: int = 0
    # BLOCKWISE: each block's int32 sum, computed at every step of `rdom`, and its own domain.
    inner: hl.Func | None = None
    inner_rdom: ReductionDomain | None = None

    @property
    def extents(self) -> list[int]:
        """The reduction domain's extents, innermost dimension last (constants: shapes are static)."""
        return list(self.rdom.extents)


@dataclass
class BlockKernel:
    """A block lowered to Halide, before scheduling: what the lowerings produced and what the
    schedule templates (halide_gen.schedule) need to know about it.

    - name, ops, arguments, outputs: the kernel's interface (arguments in order of first use;
      outputs pair each block output tensor with the Value that computes it).
    - values, op_values: every tensor's Value (keyed by id(tensor)), and
      per op its output Values in op order.
    - materialize, op_helpers: helper Values a lowering asked not to inline (a padded input, a row
      statistic), all of them and per op; padded: the zero-padded inputs among them, each paired
      with the Value it pads.
    - accumulators: explicit reductions, each tagged with its AccumulatorKind; a template per kind
      tiles it (schedule/cpu.py TEMPLATES).
    - row_reductions: innermost-axis reductions in two stages (lower.registry.RowReduction).
    - row_statistics: per-row results and the reductions behind them (lower.registry.RowStatistics).
    - constants: lookup tables compiled into the kernel (int8 per-channel parameters).
    - read_in_block: id() of the op-result Funcs a later op of the block reads (they cannot be
      computed inside an output's copy).
    - copied_from: id(output Func) -> the op result Func it copies (an output read in-block is copied).
    - scratch: materialised Funcs a GPU schedule (schedule/gpu.py) makes extra outputs of the AOT
      kernel, after the real ones: their memory is the caller's, allocated once, not a device
      allocation on every call.
    - updates_in_place: (argument position, output index) of each DYNAMIC_UPDATE_SLICE whose output
      may be written into its operand's memory (a KV cache the caller passes in and out as one
      buffer): the kernel's in-place form then writes just the update (build_block's `in_place`).
    """

    name: str
    ops: list[Operator]
    arguments: list[Argument]  # kernel inputs in order of first use
    outputs: list[tuple[Tensor, Value]]
    values: dict[int, Value] = field(default_factory=dict)  # id(tensor) -> Value, every tensor
    op_values: list[list[Value]] = field(default_factory=list)  # per op, its output Values
    materialize: list[Value] = field(default_factory=list)  # helper Values that must not be inlined
    padded: list[tuple[Value, Value | None]] = field(default_factory=list)  # of those, (padded input, its source)
    accumulators: list[Accumulator] = field(default_factory=list)
    row_reductions: list[RowReduction] = field(default_factory=list)  # see OpContext
    row_statistics: list[RowStatistics] = field(default_factory=list)  # see OpContext
    constants: list[hl.Buffer] = field(default_factory=list)  # tables compiled into the kernel
    op_helpers: list[list[Value]] = field(default_factory=list)  # per op, the helpers it materialises
    read_in_block: set[int] = field(default_factory=set)  # id() of op results later ops read
    copied_from: dict[int, hl.Func] = field(default_factory=dict)  # id(output Func) -> the Func it copies
    scratch: list[Value] = field(default_factory=list)  # extra AOT outputs the caller allocates (GPU)
    # (op position, input index) -> what the lowering read of that constant while building the
    # kernel (lower.registry.OpContext.const): the part of the identity only lowering can know.
    bound: dict[tuple[int, int], str] = field(default_factory=dict)
    updates_in_place: list[tuple[int, int]] = field(default_factory=list)

    @property
    def identity(self) -> str:
        """What the kernel was built from (tflite_tools.model.fingerprint.block_identity): its ops,
        outputs and every constant value it bakes in. Kernels are named, shared and cached by it."""
        return block_identity(self.ops, [t for t, _ in self.outputs], self.bound)

    def is_output(self, f: hl.Func) -> bool:
        """True for an output Func or the Func it copies."""
        return any(f is src for src in self.copied_from.values()) or any(f is v.func for _, v in self.outputs)

    def inline_into_output(self, f: hl.Func) -> bool:
        """True when `f` can be computed inside its output's copy: an output no op of the block reads."""
        return self.is_output(f) and id(f) not in self.read_in_block

    def padding_read_in_place(self) -> set[int]:
        """id() of the zero-padded inputs whose source is in memory anyway: a block input, or a
        convolution's or matrix product's result (every schedule realises those). Inlined into the
        taps, such padding costs a test on the border tiles only (nn._zero_outside), where a copy
        with a zero border is a pass over the whole map. Padding of anything else (an activation
        between two convolutions, an
        int8 input converted for VNNI) stays a copy: inlined, it would be recomputed at every tap."""
        realised = {id(a.value.func) for a in self.accumulators}
        realised |= {id(v.func) for a in self.arguments if (v := self.values.get(id(a.tensor))) is not None}
        return {id(padded.func) for padded, source in self.padded if source is not None and id(source.func) in realised}

    def broadcast_sources(self) -> list[Value]:
        """Op results a later op of the block reads broadcast into an output at least 4x larger.
        Inlined, they would be recomputed for every element of the larger output (a squeeze-excite
        gate's sigmoid once per pixel), so schedules compute
        them once, at the root; they are small by construction."""
        produced = {id(t): v for op, values in zip(self.ops, self.op_values) for t, v in zip(op.outputs, values)}
        sources: dict[int, Value] = {}
        for op in self.ops:
            size = int(np.prod(op.outputs[0].shape))
            for t in op.inputs:
                if t is not None and id(t) in produced and 4 * int(np.prod(t.shape)) <= size:
                    sources[id(t)] = produced[id(t)]
        return list(sources.values())

    def output_funcs(self) -> list[hl.Func]:
        """The pipeline's output Funcs, in block-output order."""
        return [v.func for _, v in self.outputs]

    def pipeline(self) -> hl.Pipeline:
        """The Halide pipeline computing every block output."""
        return hl.Pipeline(self.output_funcs())

    def aot_pipeline(self) -> hl.Pipeline:
        """The pipeline an AOT kernel is compiled from: the block outputs, then the scratch Funcs
        (dense, over their tensor shapes: what the kernel's other stages read of them)."""
        for v in self.scratch:
            _declare_dense(v.func.output_buffer(), v.shape)
        return hl.Pipeline(self.output_funcs() + [v.func for v in self.scratch])


# The largest buffer a kernel may touch: Halide's limit without the large_buffers feature.
MAX_BUFFER_BYTES = 2**31 - 1


def _declare_dense(buffer, shape) -> None:
    """Tells Halide a kernel buffer's whole layout: shapes are static and TFLite tensors (and packed
    constants) dense, so every loop bound and every stride is a constant. Unrollable loops, no
    runtime bounds arithmetic, and addresses LLVM folds into immediate offsets (paired NEON loads
    instead of a register per row); the kernel checks the buffers the caller passes."""
    stride = 1
    for k, extent in enumerate(reversed(shape)):
        buffer.dim(k).set_bounds(0, int(extent)).set_stride(stride)
        stride *= int(extent)


def build_block_for(spec, name: str, ops: Sequence[Operator], outputs: Sequence[Tensor],
                    in_place: bool = False) -> BlockKernel:
    """build_block in the forms a target's kernels take (a halide_gen.targets.TargetSpec's
    lowering_options). Every lowering of a block for a target goes through here, so the kernel
    compiled and the interface checked against it are the same."""
    return build_block(name, ops, outputs, spec.lowering_options(), in_place=in_place)


def _check_addressable(ops: Sequence[Operator]) -> None:
    """Halide indexes a buffer with 32-bit integers and, without its large_buffers feature, refuses
    one over 2^31 - 1 bytes at run time: a block touching such a tensor would compile into a kernel
    that can only fail (Halide says "guaranteed to fail an assertion"), so it is no kernel."""
    for op in ops:
        for t in (*op.inputs, *op.outputs):
            if t is None:
                continue
            if t.nbytes > MAX_BUFFER_BYTES:
                raise LoweringError(f"{t.name!r} is {t.nbytes} bytes, over what a Halide buffer can address "
                                    f"({MAX_BUFFER_BYTES})")


# Ops whose result's error is their argument's absolute error: sin(x) of an x off by d is off by up to d.
PERIODIC = frozenset({"SIN", "COS"})
# What computes or moves values element by element, so that its result's rounding is its consumer's.
_ELEMENT_BY_ELEMENT = frozenset({MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY, MappingType.REORGANIZE,
                                 MappingType.SHUFFLE})


def _arguments_of_periodic_functions(ops: Sequence[Operator]) -> set[int]:
    """id() of the float tensors the block computes that reach a SIN or COS through ops computing or
    moving them element by element: under fp16 storage they stay float32, computed in it. A rotary
    embedding's angle, position times frequency, is 511.7 at position 512, where fp16's step is 0.25
    (a decoder's keys 0.14 of their range off under --cpu-precision fp16, prefilling 512 tokens)."""
    producer = {id(t): op for op in ops for t in op.outputs}
    exact: set[int] = set()
    pending = [t for op in ops if op.name in PERIODIC for t in op.inputs if t is not None]
    while pending:
        t = pending.pop()
        op = producer.get(id(t))
        if op is None or id(t) in exact or t.type_name != "FLOAT32":
            continue
        exact.add(id(t))
        if op_mapping(op) in _ELEMENT_BY_ELEMENT:
            pending.extend(x for x in op.inputs if x is not None)
    return exact


def build_block(name: str, ops: Sequence[Operator], outputs: Sequence[Tensor],
                options: LoweringOptions = LoweringOptions(), in_place: bool = False) -> BlockKernel:
    """Lowers `ops` (in execution order) into one pipeline producing `outputs`, in the forms
    `options` names (halide_gen.lowering_options; the defaults: float32, ARM's integer forms, the
    reference int8 rounding, host code).

    `in_place` builds the kernel's in-place form: each output in `updates_in_place` is written only
    where its DYNAMIC_UPDATE_SLICE writes, the rest of its memory (the operand's, which the caller
    passes as the same buffer) left as it is. Everything else, the arguments included, is as in
    the plain form, so the two share one interface.

    Raises LoweringError when an op or option has no lowering; the block is then left to TFLite.
    """
    _check_addressable(ops)
    kernel = BlockKernel(_ident(name), list(ops), [], [])
    produced = {id(t) for op in ops for t in op.outputs}
    params: dict[tuple[int, str | None, bool], Value] = {}

    def value_of(t: Tensor, packing: str | None = None, half: bool = False) -> Value:
        if packing is None and not half and id(t) in kernel.values:
            if id(t) in produced:
                kernel.read_in_block.add(id(kernel.values[id(t)].func))
            return kernel.values[id(t)]
        if id(t) in produced:
            raise LoweringError(f"{t.name!r} is read before the op that writes it")
        key = (id(t), packing, half)
        if key not in params:
            rank = len(PACKERS[packing].shape(tuple(t.shape))) if packing else len(t.shape)
            param = hl.ImageParam(halide_type(_packed_type(t, packing, half)), rank, f"{kernel.name}_in{len(params)}")
            arg = Argument(t, param, packing, half)
            _declare_dense(arg.param, arg.shape)
            kernel.arguments.append(arg)
            # Packed constants are weights, read only at indices a reduction walks.
            func = hl.Func(arg.param) if packing or len(arg.shape) < 2 else _edge_clamped(arg)
            params[key] = Value(func, arg.shape, arg.param.type())
            if packing is None and not half:
                kernel.values[id(t)] = params[key]
        return params[key]

    output_index = {id(t): k for k, t in enumerate(outputs)}
    readers = Counter(id(t) for op in ops for t in op.inputs if t is not None)  # id(tensor) -> ops reading it
    updates: dict[int, tuple[Value, list[hl.Expr]]] = {}  # output index -> what its in-place form writes
    exact = _arguments_of_periodic_functions(ops) if options.float_storage != hl.Float(32) else set()
    wrappers: dict[int, hl.Func] = {}  # output index -> its Func, made when an op's result is lowered
    for k, op in enumerate(ops):
        ctx = OpContext(op, f"{kernel.name}_op{k}_{op.name.lower()}", value_of, options=options,
                        computed_in_block=frozenset(produced),
                        float32_results=any(id(t) in exact for t in op.outputs))
        results = lower(ctx)
        if len(results) != len(op.outputs):
            raise LoweringError(f"{op.name}: lowering made {len(results)} outputs, the op has {len(op.outputs)}")
        if ctx.slice_update is not None and _updatable_in_place(op, output_index, readers, produced):
            position = next(p for p, a in enumerate(kernel.arguments) if a.tensor is op.inputs[0] and a.pack is None)
            kernel.updates_in_place.append((position, output_index[id(op.outputs[0])]))
            if in_place:
                updates[output_index[id(op.outputs[0])]] = ctx.slice_update
        for t, v in zip(op.outputs, results):
            if tuple(v.shape) != tuple(t.shape):
                raise LoweringError(f"{op.name}: lowered shape {list(v.shape)} != {list(t.shape)}")
            if not v.joins and op.name in ELEMENTWISE:
                v.joins = _joins_through(op, t, kernel.values)
            kernel.values[id(t)] = v
            if id(t) in output_index and id(t) in readers:
                # A block output that later ops read too (HARD_SWISH then the MEAN of a squeeze-
                # excite): they read the output buffer, which the op's result is computed into,
                # instead of a copy of it computed first (a pass over the tensor more, and 2x
                # XNNPACK's time for MobileNetV3's 14x14x240 HARD_SWISH MEAN). Halide reads it
                # with aligned vector loads, as memory of its own: the delegate hands every kernel
                # 64-byte-aligned outputs (delegate/src/memory_plan.h, kBufferAlignment).
                # The buffer holds the tensor's channels and no more: not readable past the last
                # one (Value.readable_channels), as the convolution's own result was.
                index = output_index[id(t)]
                wrappers[index] = _output_func(kernel, index, t, v, updates.get(index))
                kernel.values[id(t)] = dataclasses.replace(v, func=wrappers[index], type=wrappers[index].type(),
                                                           readable_channels=0)
        kernel.op_values.append(results)
        kernel.materialize.extend(ctx.materialize)
        kernel.padded.extend(ctx.padded)
        kernel.op_helpers.append(list(ctx.materialize))
        kernel.row_reductions.extend(ctx.row_reductions)
        kernel.row_statistics.extend(ctx.row_statistics)
        kernel.constants.extend(ctx.constants)
        kernel.bound.update({(k, i): text for i, text in ctx.bound.items()})
        for t, bounds, name in ctx.index_checks:
            _check_on_host(kernel, t, bounds, name)
        kernel.accumulators.extend(Accumulator(k, acc, results[0], kind, r, *rest)
                                   for acc, kind, r, *rest in ctx.accumulators)

    for k, t in enumerate(outputs):
        if id(t) not in produced or id(t) not in kernel.values:
            raise LoweringError(f"block output {t.name!r} is not computed by the block")
        wrapper = wrappers.get(k) or _output_func(kernel, k, t, kernel.values[id(t)], updates.get(k))
        v = kernel.values[id(t)]
        # The joins too: the output's schedule cuts its channel loop where a concatenation's sources
        # meet (DenseNet's block outputs are concatenations: a gather from each source per vector).
        kernel.outputs.append((t, dataclasses.replace(v, func=wrapper, type=wrapper.type())))
    return kernel


def _check_on_host(kernel: BlockKernel, t: Tensor, bounds: tuple[int, ...], op: str) -> None:
    """Marks the argument of `t` for the host's index check (the tightest bounds where two ops
    read it; GATHER_ND's per-coordinate bounds must agree in number)."""
    (arg,) = [a for a in kernel.arguments if a.tensor is t and a.pack is None]
    if arg.index_bounds and len(arg.index_bounds) != len(bounds):
        raise LoweringError(f"{t.name!r} is read as indices of two different depths")
    arg.index_bounds = tuple(min(pair) for pair in zip(arg.index_bounds, bounds)) if arg.index_bounds else bounds
    arg.index_op = arg.index_op or op


def _joins_through(op: Operator, t: Tensor, values: dict[int, Value]) -> tuple[int, ...]:
    """Where the concatenations an elementwise op reads at its own shape join their sources: its
    result, read along the same channels, is cut at the same places (DenseNet's BatchNorm MUL of
    each concatenation, materialised for its 1x1 conv: a gather from each source per vector)."""
    joins: set[int] = set()
    for source in op.inputs:
        if source is not None and tuple(source.shape) == tuple(t.shape) and id(source) in values:
            joins.update(values[id(source)].joins)
    return tuple(sorted(joins))


def _updatable_in_place(op: Operator, output_index: dict[int, int], readers: Counter, produced: set[int]) -> bool:
    """True when a DYNAMIC_UPDATE_SLICE may write its update into its operand's memory: its
    result is a block output of the operand's type and its operand a block input that no other op
    of the block reads (the in-place form changes that memory while the kernel runs)."""
    operand, result = op.inputs[0], op.outputs[0]
    return (id(result) in output_index and id(operand) not in produced and not operand.is_constant
            and operand.decoded_from is None and readers[id(operand)] == 1 and operand.type_name == result.type_name)


def _output_func(kernel: BlockKernel, index: int, t: Tensor, v: Value,
                 update: tuple[Value, list[hl.Expr]] | None = None) -> hl.Func:
    """The Func of block output `index` (tensor `t`): `v` cast to `t`'s type, bounded to its shape.
    With `update` (a slice update's value and clamped starts), the in-place form: only the update
    is written, at its starts, and the rest of the output's memory is left as the caller passed it
    (Halide skips stores of undef; ops of the block that read the output read that memory).

    Each output gets its own Func named after the kernel (two outputs may share a value). The build
    counter keeps the name unique in this process (Halide would append "$n" itself)."""
    wrapper = hl.Func(f"{kernel.name}_{next(_BUILDS)}" if index == 0 else f"{kernel.name}_out{index}")
    vars_ = [hl.Var(a.name()) for a in v.func.args()]
    out_type = halide_type(t.type_name)
    if update is None:
        wrapper[vars_] = hl.cast(out_type, v.func[vars_])
        kernel.copied_from[id(wrapper)] = v.func
    else:
        values, starts = update
        r = hl.RDom([hl.Range(0, int(n)) for n in reversed(values.shape)])
        at = [r[len(values.shape) - 1 - d] for d in range(len(values.shape))]  # TFLite order
        wrapper[vars_] = hl.undef(out_type)
        wrapper[[s + x for s, x in reversed(list(zip(starts, at)))]] = hl.cast(out_type, values.at(at))
    for var, extent in zip(vars_, reversed(v.shape)):
        wrapper.bound(var, 0, int(extent))
    _declare_dense(wrapper.output_buffer(), v.shape)
    return wrapper
