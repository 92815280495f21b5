"""Cleanup rules: constant folding, identity elimination, data-movement chains, affine folding.

Each is exact (run always) unless marked otherwise. "Exact" is judged against TFLite's reference
kernels; where an optimized kernel associates differently, the rule's docstring says so.
"""

from __future__ import annotations

import numpy as np

from tflite_tools.model.ir import Operator, Tensor

from .base import Rewrite, all_bits, all_float, const, is_float, keeps_shape, no_activation, other_input, powers_of_two, rule
from .fold import fold, foldable
from .graph import GraphView

REORGANIZE = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS")


@rule("constant_folding", exact=True, family="cleanup")
def constant_folding(g: GraphView, op: Operator) -> Rewrite | None:
    """An op whose inputs are all constants becomes a constant (run once by LiteRT's reference kernels)."""
    if not foldable(op) or any(id(t) in g.outputs for t in op.outputs):
        return None

    def apply() -> bool:
        if not fold(op, g.outputs):
            return False
        g.remove_op(op)
        return True

    return Rewrite(sum(t.num_elements for t in op.outputs), apply)


def _identity(g: GraphView, op: Operator, x: Tensor) -> Rewrite:
    return Rewrite(op.outputs[0].num_elements, lambda: g.bypass(op, x, op.outputs[0]))


def _binary_identity(g: GraphView, op: Operator, names: tuple[str, ...], value: float, commutes: bool) -> Rewrite | None:
    if op.name not in names or len(op.inputs) != 2 or not all_float(op) or not no_activation(op):
        return None
    candidates = [(op.inputs[0], op.inputs[1])] + ([(op.inputs[1], op.inputs[0])] if commutes else [])
    for x, c in candidates:
        if all_bits(const(c), value) and keeps_shape(op, x):
            return _identity(g, op, x)
    return None


@rule("mul_by_one", exact=True, family="cleanup")
def mul_by_one(g: GraphView, op: Operator) -> Rewrite | None:
    """x * 1 -> x."""
    return _binary_identity(g, op, ("MUL",), 1.0, commutes=True)


@rule("div_by_one", exact=True, family="cleanup")
def div_by_one(g: GraphView, op: Operator) -> Rewrite | None:
    """x / 1 -> x."""
    return _binary_identity(g, op, ("DIV",), 1.0, commutes=False)


@rule("add_negative_zero", exact=True, family="cleanup")
def add_negative_zero(g: GraphView, op: Operator) -> Rewrite | None:
    """x + (-0.0) -> x and x - 0.0 -> x (bit-exact, signed zeros included)."""
    return _binary_identity(g, op, ("ADD",), -0.0, commutes=True) or _binary_identity(g, op, ("SUB",), 0.0, commutes=False)


@rule("add_positive_zero", exact=False, family="cleanup")
def add_positive_zero(g: GraphView, op: Operator) -> Rewrite | None:
    """x + 0.0 -> x (fast-math: -0.0 + 0.0 is +0.0, so only the sign of a zero can change)."""
    return _binary_identity(g, op, ("ADD",), 0.0, commutes=True)


def _same_type(a: Tensor, b: Tensor) -> bool:
    qa, qb = a.quantization, b.quantization
    same_q = (qa is None and qb is None) or (
        qa is not None and qb is not None and np.array_equal(qa.scale, qb.scale) and np.array_equal(qa.zero_point, qb.zero_point)
    )
    return a.dtype == b.dtype and same_q


@rule("reorganize_chain", exact=True, family="cleanup")
def reorganize_chain(g: GraphView, op: Operator) -> Rewrite | None:
    """RESHAPE / SQUEEZE / EXPAND_DIMS chains become one RESHAPE, or nothing if the shape comes back."""
    if op.name not in REORGANIZE or not op.inputs or op.inputs[0] is None:
        return None
    y = op.outputs[0]
    inner = g.produced_by(op.inputs[0], *REORGANIZE)
    if inner is not None and g.single_use(op.inputs[0]) and inner.inputs[0] is not None:
        x = inner.inputs[0]
    elif tuple(op.inputs[0].shape) == tuple(y.shape):
        x, inner = op.inputs[0], None
    else:
        return None
    if not _same_type(x, y):
        return None

    def apply() -> bool:
        if tuple(x.shape) == tuple(y.shape):
            if not g.bypass(op, x, y):
                return False
        else:
            g.insert_before(op, _reshape(g, x, y))
            g.remove_op(op)
        if inner is not None and inner in g.sg.operators:
            g.remove_op(inner)
        return True

    return Rewrite(y.num_elements, apply)


def _flags(op: Operator, name: str) -> int:
    return int(getattr(op.options, name, 0) or 0)


def _known(g: GraphView, t: Tensor | None, depth: int = 0) -> list[int | None] | None:
    """The elements of an integer tensor of rank 0 or 1 computed from shapes, each the value it
    always has or None where it varies: SHAPE of a tensor (a dimension its shape signature leaves
    open varies, the others are fixed by the model's own declaration), and slices, gathers,
    products, packs, concatenations and casts of those. None when `t` is not built so."""
    if t is None or len(t.shape) > 1 or depth > 16:
        return None
    if t.is_constant:
        return [int(v) for v in np.asarray(t.data).reshape(-1)]
    op = g.producer_of(t)
    if op is None or not op.inputs:
        return None
    if op.name == "SHAPE":
        x = op.inputs[0]
        signature = x.shape_signature if x.shape_signature is not None else x.shape
        return [None if d < 0 else int(d) for d in signature]
    if op.name in ("PACK", "CONCATENATION") and _flags(op, "axis") == 0:
        parts = [_known(g, part, depth + 1) for part in op.inputs]
        return None if any(p is None for p in parts) else [e for p in parts for e in p]
    if op.name not in ("CAST", "GATHER", "STRIDED_SLICE", "REDUCE_PROD"):
        return None
    first = _known(g, op.inputs[0], depth + 1)
    if op.name == "CAST":
        return first
    if op.name == "GATHER" and first is not None and _flags(op, "axis") == 0:
        indices = const(op.inputs[1])
        return None if indices is None else [first[int(i)] for i in np.asarray(indices).reshape(-1)]
    if op.name == "STRIDED_SLICE" and first is not None and len(op.inputs[0].shape) == 1:
        begin, end, strides = (const(u) for u in op.inputs[1:4])
        if begin is None or end is None or strides is None or _flags(op, "ellipsisMask") or _flags(op, "newAxisMask"):
            return None
        b = None if _flags(op, "beginMask") & 1 else int(np.asarray(begin).reshape(-1)[0])
        if _flags(op, "shrinkAxisMask") & 1:  # one element: the one at begin
            return first[b:][:1] if b is not None else first[:1]
        e = None if _flags(op, "endMask") & 1 else int(np.asarray(end).reshape(-1)[0])
        return first[slice(b, e, int(np.asarray(strides).reshape(-1)[0]))]
    if op.name == "REDUCE_PROD" and first is not None:
        return [None if None in first else int(np.prod(first, dtype=np.int64))]
    return None


@rule("reshape_to_inferred_dim", exact=True, family="cleanup")
def reshape_to_inferred_dim(g: GraphView, op: Operator) -> Rewrite | None:
    """RESHAPE to a shape computed from shapes with at most one element that varies (a batch read off
    SHAPE, as Keras models with an open batch convert) -> RESHAPE to a constant shape, -1 there.

    Exact: a reshape keeps the element count, so the one element that varies is the count over the
    product of the others, which is what -1 asks for; the others are fixed (_known). LiteRT then
    sizes the output when it prepares the model rather than as it runs, and a kernel may take it
    (fusion/ecg.py)."""
    if op.name != "RESHAPE" or len(op.inputs) < 2 or op.inputs[0] is None or op.inputs[1] is None:
        return None
    elements = None if op.inputs[1].is_constant else _known(g, op.inputs[1])
    if (elements is None or len(elements) != len(op.outputs[0].shape) or elements.count(None) > 1
            or any(e is not None and e < 0 for e in elements)):
        return None
    shape = [-1 if e is None else e for e in elements]

    def apply() -> bool:
        operand = g.constant(op.outputs[0].name + "/shape", np.array(shape, op.inputs[1].numpy_dtype))
        # The shape in the input alone, as _reshape writes it (no option that differs by length).
        g.insert_before(op, g.make_op("RESHAPE", [op.inputs[0], operand], list(op.outputs)))
        g.remove_op(op)
        return True

    return Rewrite(op.outputs[0].num_elements, apply)


@rule("transpose_chain", exact=True, family="cleanup")
def transpose_chain(g: GraphView, op: Operator) -> Rewrite | None:
    """TRANSPOSE(TRANSPOSE(x, p), q) -> TRANSPOSE(x, p[q]), or x when the permutations cancel."""
    if op.name != "TRANSPOSE":
        return None
    inner = g.produced_by(op.inputs[0], "TRANSPOSE")
    q, p = const(op.inputs[1]), None if inner is None else const(inner.inputs[1])
    if inner is None or p is None or q is None or not g.single_use(op.inputs[0]):
        return None
    x, y = inner.inputs[0], op.outputs[0]
    perm = p.astype(np.int64)[q.astype(np.int64)]

    def apply() -> bool:
        if np.array_equal(perm, np.arange(len(perm))):
            if not g.bypass(op, x, y):
                return False
        else:
            merged = g.make_op("TRANSPOSE", [x, g.constant(y.name + "/perm", perm.astype(np.int32))], [y])
            g.insert_before(op, merged)
            g.remove_op(op)
        g.remove_op(inner)
        return True

    return Rewrite(2 * y.num_elements, apply)


@rule("noop_cast", exact=True, family="cleanup")
def noop_cast(g: GraphView, op: Operator) -> Rewrite | None:
    """CAST to the type the tensor already has -> nothing."""
    if op.name != "CAST" or op.inputs[0] is None or not _same_type(op.inputs[0], op.outputs[0]):
        return None
    return _identity(g, op, op.inputs[0])


@rule("negation_into_add_sub", exact=True, family="cleanup")
def negation_into_add_sub(g: GraphView, op: Operator) -> Rewrite | None:
    """ADD(NEG(a), b) -> SUB(b, a); ADD(a, NEG(b)) -> SUB(a, b); SUB(a, NEG(b)) -> ADD(a, b).

    Exact: IEEE subtraction is addition of the negation, and addition commutes.
    """
    if op.name not in ("ADD", "SUB") or len(op.inputs) != 2 or not all_float(op):
        return None
    a, b = op.inputs
    neg_b = g.produced_by(b, "NEG")
    neg_a = g.produced_by(a, "NEG") if op.name == "ADD" else None
    act = op.fused_activation or "NONE"
    if neg_b is not None:
        new_name, new_inputs = ("SUB" if op.name == "ADD" else "ADD"), [a, neg_b.inputs[0]]
    elif neg_a is not None:
        new_name, new_inputs = "SUB", [b, neg_a.inputs[0]]
    else:
        return None

    def apply() -> bool:
        g.insert_before(op, g.make_op(new_name, new_inputs, op.outputs, fused_activation_function=act))
        g.remove_op(op)
        return True

    return Rewrite(op.outputs[0].num_elements, apply)


@rule("double_negation", exact=True, family="cleanup")
def double_negation(g: GraphView, op: Operator) -> Rewrite | None:
    """NEG(NEG(x)) -> x."""
    inner = g.produced_by(op.inputs[0], "NEG") if op.name == "NEG" else None
    if inner is None or not all_float(op):
        return None
    return _identity(g, op, inner.inputs[0])


# Scales for which dequantizing and quantizing again is exact: (q - zp) * scale stays a normal
# float32 (|q - zp| <= 65535 for int16) with room to spare.
_EXACT_SCALES = (2.0 ** -100, 2.0 ** 100)


@rule("quantize_of_dequantize", exact=True, family="cleanup")
def quantize_of_dequantize(g: GraphView, op: Operator) -> Rewrite | None:
    """QUANTIZE(DEQUANTIZE(q)) -> q, where the QUANTIZE gives back q's own type and quantization.

    Exact: (q - zp) * scale rounded to float32, divided by the same scale and rounded again, is
    within 2^-22 relative of the integer q - zp (|q - zp| < 2^16), far inside rounding's 1/2.
    """
    inner = g.produced_by(op.inputs[0], "DEQUANTIZE") if op.name == "QUANTIZE" and op.inputs else None
    if inner is None or inner.inputs[0] is None:
        return None
    q, y = inner.inputs[0], op.outputs[0]
    quant = q.quantization
    if (not _same_type(q, y) or quant is None or quant.scale is None or len(quant.scale) == 0
            or not all(_EXACT_SCALES[0] <= abs(float(sc)) <= _EXACT_SCALES[1] for sc in quant.scale)):
        return None
    single = g.single_use(op.inputs[0])

    def apply() -> bool:
        if not g.bypass(op, q, y):
            return False
        if single and inner in g.sg.operators:
            g.remove_op(inner)
        return True

    return Rewrite(2 * y.num_elements, apply)


# -- affine folding into convolutions and fully-connected layers ---------------------------

_WEIGHT_AXIS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}


def _channel_vector(c: np.ndarray, channels: int) -> np.ndarray | None:
    """`c` as one value per output channel, if it broadcasts only along the last axis."""
    if c.size == 1:
        return np.full(channels, c.reshape(-1)[0], np.float32)
    if c.shape[-1] == channels and c.size == channels:
        return c.reshape(channels).astype(np.float32)
    return None


def _affine_match(g: GraphView, op: Operator, exact: bool) -> Rewrite | None:
    if op.name not in ("MUL", "ADD") or len(op.inputs) != 2 or not all_float(op):
        return None
    for y in op.inputs:
        c = const(other_input(op, y))
        conv = g.produced_by(y, *_WEIGHT_AXIS)
        if c is None or conv is None or not g.single_use(y) or not no_activation(conv):
            continue
        w = conv.inputs[1]
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        if not is_float(w) or const(w) is None or (bias is not None and const(bias) is None) or not keeps_shape(op, y):
            continue
        channels = y.shape[-1]
        vec = _channel_vector(c, channels)
        if vec is None:
            continue
        if exact and op.name == "MUL" and not powers_of_two(vec):
            continue
        if exact and op.name == "ADD" and bias is not None and np.any(const(bias) != 0):
            continue
        return Rewrite(op.outputs[0].num_elements, lambda: _fold_affine(g, op, conv, y, vec))
    return None


def _fold_affine(g: GraphView, op: Operator, conv: Operator, y: Tensor, vec: np.ndarray) -> bool:
    w = conv.inputs[1]
    bias = conv.inputs[2] if len(conv.inputs) > 2 else None
    channels = y.shape[-1]
    b = np.zeros(channels, np.float32) if bias is None else const(bias).astype(np.float32)
    if op.name == "MUL":
        shape = [1] * w.data.ndim
        shape[_WEIGHT_AXIS[conv.name]] = channels
        new_w = g.constant(w.name + "/scaled", (w.data * vec.reshape(shape)).astype(np.float32))
        new_b = b * vec
    else:
        new_w, new_b = w, b + vec
    conv.inputs = [conv.inputs[0], new_w, g.constant((bias.name if bias is not None else w.name) + "/bias", new_b)]
    conv.outputs = [op.outputs[0]]
    if op.fused_activation:
        conv.options.fusedActivationFunction = op.options.fusedActivationFunction
    g.remove_op(op)
    return True


@rule("affine_into_conv", exact=True, family="cleanup")
def affine_into_conv(g: GraphView, op: Operator) -> Rewrite | None:
    """Per-channel MUL by powers of two, or ADD into a missing / zero bias, after CONV_2D,
    DEPTHWISE_CONV_2D or FULLY_CONNECTED -> folded into weights and bias.

    Exact: scaling by 2^k commutes with every rounding step; adding into a zero bias matches the
    reference kernels, which accumulate first and add the bias last (XNNPACK starts from the bias
    instead, so there the last bit can differ).
    """
    return _affine_match(g, op, exact=True)


@rule("affine_into_conv_any", exact=False, family="cleanup")
def affine_into_conv_any(g: GraphView, op: Operator) -> Rewrite | None:
    """Any per-channel constant MUL / ADD after CONV_2D, DEPTHWISE_CONV_2D or FULLY_CONNECTED ->
    folded into weights and bias (fast-math: w*s rounds differently from (x.w)*s)."""
    return _affine_match(g, op, exact=False)


# Elementwise ops that commute with any permutation of their operand's elements when the other
# operand is one value: a row permutation after them equals one before them.
_SCALAR_ELEMENTWISE = ("MUL", "ADD", "SUB", "DIV")


def _scalar_elementwise(op: Operator, x: Tensor) -> bool:
    """True when `op` computes elementwise on `x` alone: its other operand a one-element constant."""
    if op.name not in _SCALAR_ELEMENTWISE or len(op.inputs) != 2 or not keeps_shape(op, x):
        return False
    other = other_input(op, x)
    return other is not x and other is not None and other.is_constant and other.num_elements == 1


def _row_groups(product: tuple[int, ...], split: tuple[int, ...]) -> int | None:
    """How many axes of `split` the rows of a product of shape `product` ([*batch, rows, columns])
    were split into, where `split` keeps the batch axes and the columns: [*batch, r1, .., rk,
    columns] with r1 x .. x rk = rows. None for any other reshape."""
    batch = product[:-2]
    if split[: len(batch)] != batch or split[-1] != product[-1] or len(split) < len(product):
        return None
    rows = split[len(batch):-1]
    return len(rows) if int(np.prod(rows)) == product[-2] else None


def _permutable_axes(product: Operator, reshape: Operator | None) -> set[int] | None:
    """The axes of the product's result (after `reshape`, where it splits the rows) that a permutation
    may exchange with the product computing the same rows: the axes the rows were split into, or
    without a reshape, the rows and the batch axes the right operand is broadcast along. None where
    the reshape does more than split the rows."""
    out, right = tuple(product.outputs[0].shape), product.inputs[1]
    if reshape is not None:
        split = tuple(reshape.outputs[0].shape)
        groups = _row_groups(out, split)
        return None if groups is None else set(range(len(out) - 2, len(out) - 2 + groups))
    shifted = (1,) * (len(out) - len(right.shape)) + tuple(right.shape)
    return {len(out) - 2} | {i for i in range(len(out) - 2) if shifted[i] == 1}


@rule("row_permutation_before_product", exact=True, family="cleanup")
def row_permutation_before_product(g: GraphView, op: Operator) -> Rewrite | None:
    """TRANSPOSE of a BATCH_MATMUL's rows (or of its rows and the batch axes its right operand is
    broadcast along; through a RESHAPE splitting the rows, and ops with one-value operands) -> the same
    permutation of its left operand's rows, before the product. Each row of a product is computed on
    its own, so the result is the same; the permutation moves `depth` values a row instead of
    `columns` (grouped-query attention regroups each query row's heads between its scores and their
    softmax: [t, g] -> [g, t] rows of 1024 scores, where the product's rows are 64 queries), and the
    attention stages then read each other's rows in order."""
    if op.name != "TRANSPOSE" or const(op.inputs[1]) is None:
        return None
    perm = [int(p) for p in const(op.inputs[1])]
    chain, x, reshape = [], op.inputs[0], None
    while True:
        producer = g.producer_of(x)
        if producer is None or not g.single_use(x) or not all_float(producer) and producer.name != "RESHAPE":
            return None
        if producer.name == "BATCH_MATMUL":
            break
        operand = next((t for t in producer.inputs if _scalar_elementwise(producer, t)), None)
        if producer.name in REORGANIZE and reshape is None and producer.inputs[0] is not None:
            reshape = producer
            x = producer.inputs[0]
        elif operand is not None:
            chain.append((producer, operand))
            x = operand
        else:
            return None
    product = producer
    if getattr(product.options, "adjX", False) or not all_float(product) or product.inputs[1] is None:
        return None
    out, left = tuple(product.outputs[0].shape), product.inputs[0]
    split = tuple(reshape.outputs[0].shape) if reshape is not None else out
    axes = _permutable_axes(product, reshape)
    moved_axes = {i for i, p in enumerate(perm) if p != i}
    if axes is None or not moved_axes or not moved_axes <= axes or perm[-1] != len(split) - 1:
        return None
    depth = left.shape[-1]
    if tuple(left.shape[:-1]) != out[:-1] or depth > out[-1]:  # a left operand broadcast; more to move
        return None
    # The elementwise ops in the order they ran (they were met walking back).
    chain.reverse()

    def apply() -> bool:
        y = op.outputs[0]
        perm_constant = g.constant(y.name + "/perm", np.array(perm, np.int32))
        new: list[Operator] = []
        if reshape is not None:
            rows = g.like(left, left.name + "/rows", shape=split[:-1] + (depth,))
            moved = g.like(left, left.name + "/rows_moved", shape=tuple(rows.shape[p] for p in perm))
            permuted = g.like(left, left.name + "/permuted", shape=left.shape)
            new += [_reshape(g, left, rows), g.make_op("TRANSPOSE", [rows, perm_constant], [moved]),
                    _reshape(g, moved, permuted)]
            result = g.like(product.outputs[0], product.outputs[0].name + "/permuted")
        else:
            permuted = g.like(left, left.name + "/permuted", shape=tuple(left.shape[p] for p in perm))
            new.append(g.make_op("TRANSPOSE", [left, perm_constant], [permuted]))
            result = y if not chain else g.like(y, y.name + "/permuted")
        new.append(Operator(product.opcode, [permuted, *product.inputs[1:]], [result], product.options_type,
                            product.options, product.options2_type, product.options2))
        current = result
        if reshape is not None:
            current = y if not chain else g.like(y, y.name + "/regrouped")
            new.append(_reshape(g, result, current))
        # Then the elementwise ops in their own order, on the permuted rows: one value per element
        # each, whatever the order, so the same bits.
        for k, (step, operand) in enumerate(chain):
            target = y if k == len(chain) - 1 else g.like(y, step.outputs[0].name + "/permuted")
            new.append(Operator(step.opcode, [current if t is operand else t for t in step.inputs], [target],
                                step.options_type, step.options, step.options2_type, step.options2))
            current = target
        for n in new:
            g.insert_before(op, n)
        for old in [product, *([reshape] if reshape is not None else []), *(step for step, _ in chain), op]:
            g.remove_op(old)
        return True

    return Rewrite(int(np.prod(out[:-1])) * (out[-1] - depth), apply)


def _reshape(g: GraphView, x: Tensor, y: Tensor) -> Operator:
    """RESHAPE x -> y, the shape in its input alone: no option differs between two signatures'
    copies of one block at other lengths (prefill_128, prefill_512), so they share a kernel and the
    delegate tells their nodes apart (halide_gen.bundle.indistinguishable)."""
    shape = g.constant(y.name + "/shape", np.array(y.shape, np.int32))
    return g.make_op("RESHAPE", [x, shape], [y])


# TFLite's BATCH_MATMUL takes operands of at most five dimensions.
_PRODUCT_RANK = 5


@rule("merged_rows_as_batch", exact=True, family="cleanup")
def merged_rows_as_batch(g: GraphView, op: Operator) -> Rewrite | None:
    """BATCH_MATMUL(RESHAPE(x: [.., a, rows, depth] -> [.., a x rows, depth]), y) -> the product of x
    itself, y broadcast along a new unit axis, reshaped after. The same dot products, but the rows
    keep the axes they came with (grouped-query attention merges a head's query groups into one row
    axis for each product and splits it again between them), so what reads the product by those axes,
    and the product by what they index, need no reshape between them."""
    if op.name != "BATCH_MATMUL" or getattr(op.options, "adjX", False) or not all_float(op):
        return None
    merge = g.produced_by(op.inputs[0], "RESHAPE")
    right, out = op.inputs[1], op.outputs[0]
    if merge is None or merge.inputs[0] is None or not g.single_use(op.inputs[0]) or right is None:
        return None
    x, merged = merge.inputs[0], tuple(op.inputs[0].shape)
    batch = merged[:-2]
    if (len(x.shape) != len(merged) + 1 or len(x.shape) > _PRODUCT_RANK or tuple(x.shape[: len(batch)]) != batch
            or tuple(x.shape[-1:]) != merged[-1:] or x.shape[-3] * x.shape[-2] != merged[-2]
            or tuple(right.shape[:-2]) != batch or not _same_type(x, op.inputs[0])):
        return None

    def apply() -> bool:
        spread = g.like(right, right.name + "/spread", shape=batch + (1,) + tuple(right.shape[-2:]))
        product = g.like(out, out.name + "/rows", shape=tuple(x.shape[:-1]) + (out.shape[-1],))
        for n in [_reshape(g, right, spread),
                  Operator(op.opcode, [x, spread], [product], op.options_type, op.options, op.options2_type,
                           op.options2),
                  _reshape(g, product, out)]:
            g.insert_before(op, n)
        g.remove_op(op)
        g.remove_op(merge)
        return True

    return Rewrite(out.num_elements, apply)
