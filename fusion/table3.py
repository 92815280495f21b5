"""DNNFusion's fusion-opportunity table (paper §3.2, Table 3): what fusing two mapping types gives.

Rows are the first (producer) type, columns the second (consumer). Each cell gives the fused
type and a colour: GREEN fuses without further analysis, YELLOW asks a cost source, RED never
fuses. The cells' types and the two red cells are certain; the colours are rebuilt from the
paper's prose (DNNFusion, PLDI 2021, §3.2 and Table 3). The two cells the text leaves open are
decided here:

* One-to-Many -> One-to-Many is YELLOW: legal, and the safe choice is to measure.
* Reorganize / Shuffle combined with each other are GREEN: the prose only asks for profiling
  when One-to-Many or Many-to-Many is involved, and both are pure index arithmetic in Halide.

Reorganize with Shuffle gives Reorganize in either order (the table's one exception to the
impedance rule).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from .mapping import REORG, SHUFFLE, MappingType, MtM, OtM, OtO, edge_type


class Color(enum.Enum):
    """Whether a pair fuses: always, after asking a cost source, or never."""

    GREEN = "green"
    YELLOW = "yellow"
    RED = "red"


@dataclass(frozen=True)
class Cell:
    """One cell: the fused type (None for red cells) and the colour."""

    fused: MappingType | None
    color: Color


G, Y, R = Color.GREEN, Color.YELLOW, Color.RED

TABLE3: dict[tuple[MappingType, MappingType], Cell] = {
    # first = One-to-One: fusing with anything is profitable (Add and GEMM "in either order")
    (OtO, OtO): Cell(OtO, G), (OtO, OtM): Cell(OtM, G), (OtO, MtM): Cell(MtM, G),
    (OtO, REORG): Cell(REORG, G), (OtO, SHUFFLE): Cell(SHUFFLE, G),
    # first = One-to-Many: a scattered input to a compute-heavy op (Expand then Conv) is red
    (OtM, OtO): Cell(OtM, G), (OtM, OtM): Cell(OtM, Y), (OtM, MtM): Cell(None, R),
    (OtM, REORG): Cell(OtM, Y), (OtM, SHUFFLE): Cell(OtM, Y),
    # first = Many-to-Many: Conv then Conv is red; Conv then Expand / Resize must be measured
    (MtM, OtO): Cell(MtM, G), (MtM, OtM): Cell(MtM, Y), (MtM, MtM): Cell(None, R),
    (MtM, REORG): Cell(MtM, Y), (MtM, SHUFFLE): Cell(MtM, Y),
    # first = Reorganize
    (REORG, OtO): Cell(REORG, G), (REORG, OtM): Cell(OtM, Y), (REORG, MtM): Cell(MtM, Y),
    (REORG, REORG): Cell(REORG, G), (REORG, SHUFFLE): Cell(REORG, G),
    # first = Shuffle
    (SHUFFLE, OtO): Cell(SHUFFLE, G), (SHUFFLE, OtM): Cell(OtM, Y), (SHUFFLE, MtM): Cell(MtM, Y),
    (SHUFFLE, REORG): Cell(REORG, G), (SHUFFLE, SHUFFLE): Cell(SHUFFLE, G),
}


def cell(first: MappingType, second: MappingType) -> Cell:
    """The Table 3 cell for a producer of type `first` fused with a consumer of type `second`."""
    return TABLE3[(first, second)]


# -- the one measured exception ----------------------------------------------------------------
#
# Many-to-Many -> Many-to-Many is red in the paper ("too complex, bad for registers and cache").
# Measured, the whole MobileNetV2 inverted-residual block — 1x1 expand conv, 3x3 depthwise, 1x1
# project conv, residual add — ran faster as one Halide pipeline than as three kernels: the depthwise
# reads the expanded rows from a small ring buffer instead of a 56x56x144 tensor. So that one chain
# is yellow (the cost source still decides), not red.


def _pointwise(op) -> bool:
    """A 1x1, stride-1, undilated CONV_2D (a per-pixel matrix product)."""
    w = op.inputs[1] if len(op.inputs) > 1 else None
    o = op.options
    return (
        op.name == "CONV_2D" and w is not None and len(w.shape) == 4 and tuple(w.shape[1:3]) == (1, 1)
        and getattr(o, "strideH", 1) == 1 and getattr(o, "strideW", 1) == 1
        and getattr(o, "dilationHFactor", 1) == 1 and getattr(o, "dilationWFactor", 1) == 1
    )


def conv_chain_allowed(ecg, block: frozenset[int] | set[int], candidate: int) -> bool:
    """True when adding `candidate` keeps the block an inverted-residual chain: its Many-to-Many
    ops are at most one DEPTHWISE_CONV_2D and two pointwise CONV_2Ds, and the candidate is joined
    to a conv of the other kind directly or through One-to-One ops of the block (an activation
    such as swish between them)."""
    members = set(block) | {candidate}
    mtm = [ecg.nodes[i].op for i in members if ecg.nodes[i].mapping is MtM]
    depthwise = sum(op.name == "DEPTHWISE_CONV_2D" for op in mtm)
    pointwise = sum(_pointwise(op) for op in mtm)
    if depthwise > 1 or pointwise > 2 or depthwise + pointwise != len(mtm):
        return False
    cand = ecg.nodes[candidate].op
    if not (_pointwise(cand) or cand.name == "DEPTHWISE_CONV_2D"):
        return False
    wanted = "DEPTHWISE_CONV_2D" if _pointwise(cand) else "CONV_2D"
    for step in (ecg.predecessors, ecg.successors):
        frontier, seen = [candidate], {candidate}
        while frontier:
            for n in step(frontier.pop()):
                if n in seen or n not in block:
                    continue
                seen.add(n)
                node = ecg.nodes[n]
                if node.mapping is MtM:
                    if node.op.name == wanted:
                        return True
                elif node.mapping is OtO:
                    frontier.append(n)
    return False


# -- reductions over the same rows --------------------------------------------------------------
#
# Past the paper's red cell, where one Halide kernel holds both: reductions along the innermost axis
# of the same rows (LayerNorm as converters emit it: the mean, then the mean of the squared
# differences from it) are each a pass over a row that the next pass reads again while it is still
# in cache, so a kernel can compute both per row. Apart, LayerNorm took two blocks and wrote the
# squared differences to memory between them; in one kernel it is faster than in two. Yellow, not
# green: the cost source decides.

# Reductions whose lowering (halide_gen.lower.reduce.row_reduce) sums a row in vector partials.
ROW_REDUCTIONS = frozenset({"MEAN", "SUM"})


def _row_reduction(op) -> tuple[tuple[int, ...], bool] | None:
    """(input shape, keep_dims) of a MEAN / SUM over the innermost axis alone, else None."""
    if op.name not in ROW_REDUCTIONS or len(op.inputs) < 2 or op.inputs[1] is None or op.inputs[1].data is None:
        return None
    shape = tuple(op.inputs[0].shape)
    axes = {int(a) % len(shape) for a in np.atleast_1d(op.inputs[1].data)} if shape else set()
    if axes != {len(shape) - 1}:
        return None
    return shape, bool(getattr(op.options, "keepDims", False))


def _elementwise_on(op, shape: tuple[int, ...]) -> bool:
    """True when `op` produces `shape` from inputs that broadcast to it (a value per row, per
    column, a scalar): a row-by-row kernel reads each in place."""
    if not op.outputs or tuple(op.outputs[0].shape) != shape:
        return False
    for t in op.inputs:
        if t is None:
            continue
        dims = tuple(t.shape)
        if len(dims) > len(shape) or any(d not in (1, s) for d, s in zip(reversed(dims), reversed(shape))):
            return False
    return True


def row_reductions_allowed(ecg, block: frozenset[int] | set[int], candidate: int) -> bool:
    """True when, with `candidate` added, the block's Many-to-Many ops all reduce the innermost axis
    of rows of one shape (ROW_REDUCTIONS) and its One-to-Many ops are broadcasts onto that shape
    (x - mean, x * gamma): one kernel then computes them all row by row."""
    members = set(block) | {candidate}
    mtm = [ecg.nodes[i].op for i in members if ecg.nodes[i].mapping is MtM]
    kinds = {_row_reduction(op) for op in mtm}
    if len(kinds) != 1 or None in kinds:
        return False
    ((shape, _),) = kinds
    return all(_elementwise_on(ecg.nodes[i].op, shape) for i in members if ecg.nodes[i].mapping is OtM)


# -- the attention core -------------------------------------------------------------------------
#
# Past the red cell a third time, where one Halide kernel holds the whole chain: scaled dot-product
# attention as converters emit it — a BATCH_MATMUL of queries by keys, elementwise scale and mask, a
# SOFTMAX over the keys, a BATCH_MATMUL of those weights by the values. Apart it took three kernels
# (scores | scale + softmax | weights x values), and the [heads, queries, keys] matrix went to memory
# three times over (scores, exponentials, weights). In one kernel the CPU schedule computes the
# scores and their softmax for a tile of query rows right where the second product reads them
# (halide_gen.schedule.attention): the matrix never exists whole, a few KB per tile
# stay in L1 whatever the sequence length. Yellow, not green: the cost source decides.

ATTENTION_OPS = frozenset({"BATCH_MATMUL", "SOFTMAX"})


def _through_elementwise(ecg, block: set[int], start: int, goal: int) -> bool:
    """True when node `goal` reads node `start`'s result directly or through elementwise ops of
    `block` (a scale, a mask) that keep its shape: the path's edges are One-to-One, whatever an
    op's other operand (a padding mask input [1, 1, 1, keys] broadcast over the scores makes the
    ADD One-to-Many, not its scores edge)."""
    frontier, seen = [start], {start}
    while frontier:
        here = frontier.pop()
        for n in ecg.successors(here):
            if n == goal:
                return True
            if n in block and n not in seen and _one_to_one_from(ecg, here, n):
                seen.add(n)
                frontier.append(n)
    return False


def _one_to_one_from(ecg, producer: int, consumer: int) -> bool:
    """True when every edge from node `producer`'s results into node `consumer` is One-to-One."""
    made = {id(t) for t in ecg.nodes[producer].op.outputs}
    op = ecg.nodes[consumer].op
    edges = [edge_type(op, k) for k, t in enumerate(op.inputs) if t is not None and id(t) in made]
    return bool(edges) and all(e is OtO for e in edges)


def attention_allowed(ecg, block: frozenset[int] | set[int], candidate: int) -> bool:
    """True when, with `candidate` added, the block's Many-to-Many ops are (part of) one float32
    attention core: a SOFTMAX (over the keys: TFLite's is always over the last axis), at most one
    BATCH_MATMUL reaching it through One-to-One ops of the block (the scores), at most one
    BATCH_MATMUL reading its weights as its left operand, untransposed (weights x values: its rows
    are the softmax's rows)."""
    members = set(block) | {candidate}
    mtm = [i for i in members if ecg.nodes[i].mapping is MtM]
    ops = {i: ecg.nodes[i].op for i in mtm}
    if any(op.name not in ATTENTION_OPS for op in ops.values()):
        return False
    softmax = [i for i, op in ops.items() if op.name == "SOFTMAX"]
    products = [i for i, op in ops.items() if op.name == "BATCH_MATMUL"]
    if len(softmax) != 1 or not products or len(products) > 2:
        return False
    (s,) = softmax
    if any(t.type_name != "FLOAT32" for i in mtm for t in (*ops[i].inputs, *ops[i].outputs) if t is not None):
        return False
    scores = [p for p in products if _through_elementwise(ecg, members, p, s)]
    weights = [p for p in products if ops[p].inputs[0] is ops[s].outputs[0]
               and not getattr(ops[p].options, "adjX", False)]
    return len(scores) <= 1 and len(weights) <= 1 and len(scores) + len(weights) == len(products)
